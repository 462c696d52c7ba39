//! Durations on the command line in humantime's notation (`5s`, `500ms`, `1m30s`, `2h`): a sum
//! of integers with units, spaces allowed between them.

use std::time::Duration;

/// Parses `text` as a sum of `<integer><unit>` terms; the error says what was wrong.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("number too large in {text:?}"))?;
        rest = rest[digits..].trim_start();
        let letters = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..letters];
        rest = rest[letters..].trim_start();
        let term = match unit {
            "ns" | "nsec" | "nanos" => Some(Duration::from_nanos(number)),
            "us" | "usec" | "micros" => Some(Duration::from_micros(number)),
            "ms" | "msec" | "millis" => Some(Duration::from_millis(number)),
            "s" | "sec" | "secs" | "second" | "seconds" => Some(Duration::from_secs(number)),
            "m" | "min" | "mins" | "minute" | "minutes" => {
                number.checked_mul(60).map(Duration::from_secs)
            }
            "h" | "hr" | "hrs" | "hour" | "hours" => {
                number.checked_mul(3600).map(Duration::from_secs)
            }
            "d" | "day" | "days" => number.checked_mul(86_400).map(Duration::from_secs),
            "" => return Err(format!("missing unit after {number} (e.g. {number}s)")),
            other => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
        };
        total = term
            .and_then(|term| total.checked_add(term))
            .ok_or_else(|| format!("duration too large: {text:?}"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humantime_forms_parse() {
        let table = [
            ("5s", 5_000),
            ("0s", 0),
            ("500ms", 500),
            ("1m30s", 90_000),
            ("1m 30s", 90_000),
            ("10m", 600_000),
            ("2h", 7_200_000),
            (" 3 sec ", 3_000),
        ];
        for (text, ms) in table {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }

    #[test]
    fn bad_text_is_an_error_not_a_panic() {
        for text in [
            "",
            "5",
            "s",
            "5x",
            "-5s",
            "1.5s",
            "5s3",
            "99999999999999999999s",
            "18446744073709551615h",
            "ß",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?}");
        }
    }
}
