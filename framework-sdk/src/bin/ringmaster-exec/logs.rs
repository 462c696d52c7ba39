//! `--logs`: once a task has ended, print its stdout, each line prefixed `[TASK_ID] `. The
//! output is read through the master's `GET /files/read` on the `--master` address (the
//! protocol port serves HTTP too, docs/operations.md); the master reads it from the task's
//! agent. When that HTTP surface cannot be reached (`--http none`, TLS, a firewall) exec says
//! so once and goes on without logs.

use std::time::Duration;

/// How long one request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(15);
/// At most this much of one task's stdout is printed.
const MAX_PRINTED: u64 = 16 << 20;

/// Why a task's output could not be printed.
#[derive(Debug)]
pub enum LogsError {
    /// The master's HTTP surface did not answer at all.
    Unreachable(String),
    /// The master answered, with this error (unknown task, agent gone, ...).
    Refused(String),
}

/// Reads task output from the master at `master` (host:port, or an `http://` URL).
#[derive(Clone, Debug, PartialEq)]
pub struct LogsReader {
    base: String,
}

impl LogsReader {
    pub fn new(master: &str) -> Self {
        let base = if master.starts_with("http://") || master.starts_with("https://") {
            master.trim_end_matches('/').to_string()
        } else {
            format!("http://{master}")
        };
        LogsReader { base }
    }

    /// The whole stdout of a task (up to [`MAX_PRINTED`] bytes), read window by window.
    /// Blocking: run it off the async threads.
    pub fn stdout(&self, framework_id: &str, task_id: &str) -> Result<String, LogsError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(HTTP_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        let mut text = String::new();
        let mut offset = 0u64;
        loop {
            let url = format!(
                "{}/files/read?framework_id={}&task_id={}&file=stdout&offset={offset}",
                self.base,
                encode(framework_id),
                encode(task_id)
            );
            let mut response = agent
                .get(&url)
                .call()
                .map_err(|e| LogsError::Unreachable(format!("{}: {e}", self.base)))?;
            let status = response.status();
            let body = response
                .body_mut()
                .read_to_string()
                .map_err(|e| LogsError::Unreachable(format!("{}: {e}", self.base)))?;
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&body) else {
                // Not the master's JSON: something else answers there, or no HTTP at all.
                return Err(LogsError::Unreachable(format!(
                    "{} answered {status} without the master's JSON",
                    self.base
                )));
            };
            if !status.is_success() {
                let why = value["error"].as_str().unwrap_or("refused").to_string();
                return Err(LogsError::Refused(why));
            }
            text.push_str(value["data"].as_str().unwrap_or(""));
            let next = value["next_offset"].as_u64().unwrap_or(offset);
            let size = value["size"].as_u64().unwrap_or(0);
            if next <= offset || next >= size || next >= MAX_PRINTED {
                return Ok(text);
            }
            offset = next;
        }
    }
}

/// Percent-encodes a query value (ids are mostly plain; anything else is escaped).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `text` with every line prefixed `[TASK_ID] ` (a missing final newline is added).
pub fn prefixed(task_id: &str, text: &str) -> String {
    text.lines()
        .map(|line| format!("[{task_id}] {line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prefixed_with_the_task() {
        assert_eq!(prefixed("t-0", "a\nb"), "[t-0] a\n[t-0] b\n");
        assert_eq!(prefixed("t-0", "a\n"), "[t-0] a\n");
        assert_eq!(prefixed("t-0", ""), "");
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("0-F1"), "0-F1");
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(
            LogsReader::new("127.0.0.1:5050").base,
            "http://127.0.0.1:5050"
        );
        assert_eq!(LogsReader::new("http://h:1/").base, "http://h:1");
    }
}
