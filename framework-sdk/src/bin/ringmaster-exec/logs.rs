//! `--logs`: once a task has ended, print its stdout, each line prefixed `[TASK_ID] `. The
//! output is read through the master's `GET /files/read` on the `--master` address (each of
//! a list in turn, following the leader; the
//! protocol port serves HTTP too, docs/operations.md); the master reads it from the task's
//! agent. When that HTTP surface cannot be reached (`--http none`, TLS, a firewall) exec says
//! so once and goes on without logs.

use std::time::Duration;

use ringmaster_proto::masters::{ask_each, Asked, HTTP_NOT_LEADER_STATUS};

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

/// Reads task output from the master at `master` (host:port, or an `http://` URL; with
/// replicated masters a comma-separated list of them, asked in turn, following a follower's
/// `503 {"error", "leader"}` to the leader, docs/protocol.md).
#[derive(Clone, Debug, PartialEq)]
pub struct LogsReader {
    /// One base URL per master.
    bases: Vec<String>,
}

/// `http://host:port` for `host:port`; a URL without its trailing `/`.
fn base_of(master: &str) -> String {
    let master = master.trim();
    if master.starts_with("http://") || master.starts_with("https://") {
        master.trim_end_matches('/').to_string()
    } else {
        format!("http://{master}")
    }
}

/// What one window request to one master gave.
type Window = Result<serde_json::Value, LogsError>;

impl LogsReader {
    pub fn new(master: &str) -> Self {
        let bases = master
            .split(',')
            .filter(|m| !m.trim().is_empty())
            .map(base_of)
            .collect();
        LogsReader { bases }
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
            let query = format!(
                "/files/read?framework_id={}&task_id={}&file=stdout&offset={offset}",
                encode(framework_id),
                encode(task_id)
            );
            let value = ask_each(&self.bases, |master| window(&agent, master, &query))
                .map_err(LogsError::Unreachable)??;
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

/// One window from one master (a base URL, or a leader's `host:port`).
fn window(agent: &ureq::Agent, master: &str, query: &str) -> Asked<Window> {
    let base = base_of(master);
    let url = format!("{base}{query}");
    let mut response = match agent.get(&url).call() {
        Ok(response) => response,
        Err(e) => return Asked::Unreachable(format!("{base}: {e}")),
    };
    let status = response.status();
    let body = match response.body_mut().read_to_string() {
        Ok(body) => body,
        Err(e) => return Asked::Unreachable(format!("{base}: {e}")),
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&body) else {
        // Not the master's JSON: something else answers there, or no HTTP at all.
        return Asked::Unreachable(format!(
            "{base} answered {status} without the master's JSON"
        ));
    };
    if status.as_u16() == HTTP_NOT_LEADER_STATUS {
        if let Some(leader) = value.get("leader") {
            return Asked::NotLeader {
                leader: leader.as_str().unwrap_or("").to_string(),
                message: value["error"]
                    .as_str()
                    .unwrap_or("not the leader")
                    .to_string(),
            };
        }
    }
    if !status.is_success() {
        let why = value["error"].as_str().unwrap_or("refused").to_string();
        return Asked::Answer(Err(LogsError::Refused(why)));
    }
    Asked::Answer(Ok(value))
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
            LogsReader::new("127.0.0.1:5050").bases,
            vec!["http://127.0.0.1:5050"]
        );
        assert_eq!(LogsReader::new("http://h:1/").bases, vec!["http://h:1"]);
        assert_eq!(
            LogsReader::new("a:1, b:2").bases,
            vec!["http://a:1", "http://b:2"]
        );
    }

    /// A one-request HTTP server on an ephemeral port answering `status` with `body`.
    fn fake_http(status: &str, body: &str) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            (&stream).write_all(answer.as_bytes()).unwrap();
            request_line
        });
        (addr, handle)
    }

    #[test]
    fn output_is_read_from_the_leader_a_follower_names() {
        let closed = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            gone.local_addr().unwrap().to_string()
        };
        let (leader, leader_got) =
            fake_http("200 OK", r#"{"data": "hi\n", "next_offset": 3, "size": 3}"#);
        let (follower, follower_got) = fake_http(
            "503 Service Unavailable",
            &format!(r#"{{"error": "not the leader", "leader": "{leader}"}}"#),
        );
        let reader = LogsReader::new(&format!("{closed},{follower}"));
        assert_eq!(reader.stdout("fw", "t-0").unwrap(), "hi\n");
        assert!(follower_got.join().unwrap().starts_with("GET /files/read?"));
        assert!(leader_got
            .join()
            .unwrap()
            .contains("framework_id=fw&task_id=t-0"));
    }
}
