//! The HTTP clients (`ringmaster status`, `ringmaster job ...`) against replicated masters.
//!
//! `--master` (or `RINGMASTER_MASTER`) is one address or a comma-separated list,
//! `a:5050,b:5050,c:5050` (each `HOST:PORT` or `http://HOST:PORT`). Each request goes to the
//! masters in turn until one answers; a master that is not the leader answers
//! `503 Service Unavailable` with the JSON body `{"error": "...", "leader": "host:port"}`
//! (`leader` empty when it knows none), and the request goes to that leader next (see
//! docs/protocol.md, "Leaders and terms"). A 503 without a `leader` key is an ordinary error.

use ringmaster_proto::masters::{ask_each, check_master_address, Asked, HTTP_NOT_LEADER_STATUS};

/// The addresses of `--master`, each `HOST:PORT` or `http://HOST:PORT[/]` (kept as given);
/// the error names the flag and the bad entry.
pub fn parse_masters(spec: &str) -> Result<Vec<String>, String> {
    let flag = |m: String| format!("--master `{spec}`: {m}");
    if spec.trim().is_empty() {
        return Err(
            "--master is empty; give the master's address, e.g. 127.0.0.1:5050 (or a list, \
             a:5050,b:5050,c:5050)"
                .into(),
        );
    }
    let mut out: Vec<String> = Vec::new();
    for entry in spec.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(flag(
                "an entry is empty (expected HOST:PORT[,HOST:PORT...])".into(),
            ));
        }
        if let Some(rest) = entry.strip_prefix("https://") {
            return Err(flag(format!(
                "https://{rest}: the master serves plain HTTP; use http://{rest} or {rest}"
            )));
        }
        let bare = entry
            .strip_prefix("http://")
            .unwrap_or(entry)
            .trim_end_matches('/');
        check_master_address(bare).map_err(|m| {
            if spec.contains(',') {
                flag(format!("entry `{entry}`: {m}"))
            } else {
                flag(m)
            }
        })?;
        if !out.iter().any(|e| e == entry) {
            out.push(entry.to_string());
        }
    }
    Ok(out)
}

/// A master's "I am not the leader" answer: status 503 with a JSON body holding a `leader`
/// key. Returns the leader it names (empty when unknown) and its `error` text.
pub fn not_leader(status: u16, body: &str) -> Option<(String, String)> {
    if status != HTTP_NOT_LEADER_STATUS {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let leader = value.get("leader")?;
    let leader = leader.as_str().unwrap_or("").to_string();
    let message = value["error"]
        .as_str()
        .unwrap_or("not the leader")
        .to_string();
    Some((leader, message))
}

/// How long a CLI waits for a group that has no leader (an election under way) before it
/// gives up.
pub const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
/// The pause between two rounds while the group has no leader.
pub const LEADER_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Parses `--master` and asks each master in turn ([`ask_each`]) until one answers. While the
/// masters that answer are followers (the group is electing a leader, or they still name one
/// that died) and none answers as the leader, the round is asked again every [`LEADER_RETRY`]
/// for up to [`LEADER_WAIT`]. When no master answers at all, the error comes at once.
pub fn with_leader<T>(spec: &str, mut ask: impl FnMut(&str) -> Asked<T>) -> Result<T, String> {
    let masters = parse_masters(spec)?;
    let deadline = std::time::Instant::now() + LEADER_WAIT;
    loop {
        let mut electing = false;
        let result = ask_each(&masters, |address| {
            let asked = ask(address);
            electing |= matches!(asked, Asked::NotLeader { .. });
            asked
        });
        match result {
            Err(_) if electing && std::time::Instant::now() + LEADER_RETRY < deadline => {
                std::thread::sleep(LEADER_RETRY);
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_lists_for_the_clis() {
        assert_eq!(parse_masters("m:5050").unwrap(), vec!["m:5050"]);
        assert_eq!(
            parse_masters("a:1, http://b:2/ ,a:1").unwrap(),
            vec!["a:1", "http://b:2/"]
        );
        let err = parse_masters("a:1,b").unwrap_err();
        assert_eq!(err, "--master `a:1,b`: entry `b`: expected HOST:PORT");
        let err = parse_masters("a:1,,b:2").unwrap_err();
        assert!(
            err.starts_with("--master `a:1,,b:2`: an entry is empty"),
            "{err}"
        );
        let err = parse_masters("https://m:1").unwrap_err();
        assert!(err.contains("use http://m:1"), "{err}");
        assert!(parse_masters(" ")
            .unwrap_err()
            .starts_with("--master is empty"));
        assert_eq!(
            parse_masters("m").unwrap_err(),
            "--master `m`: expected HOST:PORT"
        );
    }

    #[test]
    fn a_not_leader_answer_is_a_503_naming_the_leader() {
        let body = r#"{"error": "not the leader", "leader": "b:5050"}"#;
        assert_eq!(
            not_leader(503, body),
            Some(("b:5050".into(), "not the leader".into()))
        );
        assert_eq!(
            not_leader(503, r#"{"error": "election", "leader": ""}"#),
            Some((String::new(), "election".into()))
        );
        // Other 503s (no jobs framework, a proxy's page) and other statuses are not.
        assert_eq!(not_leader(503, r#"{"error": "no jobs framework"}"#), None);
        assert_eq!(not_leader(503, "<html>busy</html>"), None);
        assert_eq!(not_leader(500, body), None);
    }
}
