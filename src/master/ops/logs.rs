//! Task output over HTTP: `GET /files/read` (any task, by framework and task id, after Mesos'
//! `/files/read`) and `GET /jobs/{name}/logs` (a job instance's current or last task). Each
//! asks the actor with `Event::ReadFile` (the actor asks the task's agent over its protocol
//! connection) and waits for the answer here, in the shell, with a deadline.
//!
//! Answers are JSON: `{"data", "offset", "length", "next_offset", "size", "task_state",
//! "agent_id"}` (plus `"task_id"` and `"instance"` for a job), or `{"error": "..."}` with 400
//! (bad parameters), 404 (unknown task, job or instance), 502 (the agent is not connected or
//! could not read the file), 503 (too many reads in flight, or the master is stopping) or 504
//! (the agent did not answer in time).

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ringmaster_proto::FileKind;
use serde_json::json;
use tokio::sync::oneshot;

use super::shared::{HttpState, ACTOR_TIMEOUT};
use crate::jobs::runner::LogsLookup;
use crate::master::events::Event;
use crate::master::files::{FileReadError, FileRequest, FileWindow, READ_TIMEOUT};

/// The most bytes one request returns (the agent's own limit per read).
pub const MAX_LENGTH: u32 = 64 * 1024;

/// How long a request waits for the read beyond the actor's own timeout of it.
const SLACK: Duration = Duration::from_secs(2);

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        Json(json!({ "error": message.into() })),
    )
        .into_response()
}

/// The window parameters of a query: `file` (stdout, the default, or stderr), `offset`
/// (default 0) and `length` (default and at most [`MAX_LENGTH`]).
fn window(query: &HashMap<String, String>) -> Result<(FileKind, u64, u32), String> {
    let file = match query.get("file").map(String::as_str) {
        None | Some("stdout") => FileKind::Stdout,
        Some("stderr") => FileKind::Stderr,
        Some(other) => return Err(format!("file must be stdout or stderr, not {other:?}")),
    };
    let offset = match query.get("offset") {
        None => 0,
        Some(text) => text
            .parse::<u64>()
            .map_err(|_| format!("offset must be a byte count, not {text:?}"))?,
    };
    let length = match query.get("length") {
        None => MAX_LENGTH,
        Some(text) => text
            .parse::<u64>()
            .map_err(|_| format!("length must be a byte count, not {text:?}"))?
            .min(u64::from(MAX_LENGTH)) as u32,
    };
    Ok((file, offset, length))
}

/// Asks the actor for the read and waits for its answer.
async fn read(http: &HttpState, request: FileRequest) -> Result<FileWindow, Box<Response>> {
    let (reply, answer) = oneshot::channel();
    let stopping = || {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the master is stopping",
        ))
    };
    match tokio::time::timeout(
        ACTOR_TIMEOUT,
        http.events.send(Event::ReadFile { request, reply }),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(stopping()),
        Err(_) => {
            return Err(Box::new(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the master did not take the request within 5 s",
            )))
        }
    }
    let result = match tokio::time::timeout(READ_TIMEOUT + SLACK, answer).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => return Err(stopping()),
        Err(_) => {
            return Err(Box::new(error(
                StatusCode::GATEWAY_TIMEOUT,
                "the master did not answer in time",
            )))
        }
    };
    result.map_err(|e| {
        let status = match &e {
            FileReadError::UnknownTask => StatusCode::NOT_FOUND,
            FileReadError::NotOwner(_) => StatusCode::FORBIDDEN,
            FileReadError::AgentGone(_) | FileReadError::Agent(_) => StatusCode::BAD_GATEWAY,
            FileReadError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            FileReadError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        };
        Box::new(error(status, e.to_string()))
    })
}

/// The JSON of a window. Invalid UTF-8 becomes U+FFFD, except an incomplete character at the
/// end of a window that has whole characters before it: it is left for the next read
/// (`length` and `next_offset` stop before it), so following a file never splits one.
fn body(window: FileWindow) -> serde_json::Value {
    let keep = whole_characters(&window.data);
    let data = String::from_utf8_lossy(&window.data[..keep]);
    json!({
        "data": data,
        "offset": window.offset,
        "length": keep,
        "next_offset": window.offset + keep as u64,
        "size": window.size,
        "task_state": window.task_state,
        "agent_id": window.agent_id,
    })
}

/// How many bytes of `data` to return: all of them, or all but an incomplete UTF-8
/// character at the end when something comes before it.
fn whole_characters(data: &[u8]) -> usize {
    let len = data.len();
    let Some(lead) = (len.saturating_sub(3)..len)
        .rev()
        .find(|&i| data[i] >= 0xC0)
    else {
        return len;
    };
    let width = match data[lead] {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => return len,
    };
    let continued = data[lead + 1..].iter().all(|b| (0x80..0xC0).contains(b));
    if lead > 0 && lead + width > len && continued {
        lead
    } else {
        len
    }
}

fn ok(value: serde_json::Value) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Json(value)).into_response()
}

/// `GET /files/read?framework_id=F&task_id=T&file=stdout|stderr&offset=N&length=M`.
pub(super) async fn files_read(
    State(http): State<HttpState>,
    principal: Option<axum::Extension<super::auth::Principal>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    // Who may read which task ([`super::auth`]): an operator every task, a framework's
    // principal its own frameworks' tasks (the actor checks the owner).
    let owner = match principal {
        Some(axum::Extension(p)) if p.all_logs => None,
        Some(axum::Extension(p)) => Some(p.name.unwrap_or_default()),
        // Not let in by the middleware: nobody's (fails closed).
        None => Some(String::new()),
    };
    let (Some(framework_id), Some(task_id)) = (query.get("framework_id"), query.get("task_id"))
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "framework_id and task_id are required",
        );
    };
    let (file, offset, length) = match window(&query) {
        Ok(window) => window,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let request = FileRequest {
        framework_id: framework_id.clone(),
        task_id: task_id.clone(),
        owner,
        file,
        offset,
        length,
    };
    match read(&http, request).await {
        Ok(window) => ok(body(window)),
        Err(response) => *response,
    }
}

/// `GET /jobs/{name}/logs?instance=N&file=stdout|stderr&offset=..&length=..`: the output of
/// the instance's current task, else of the one it ran last.
pub(super) async fn job_logs(
    State(http): State<HttpState>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some(jobs) = http.jobs.get() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this master runs no jobs framework (see its log and docs/jobs.md)",
        );
    };
    let index = match query.get("instance") {
        None => 0,
        Some(text) => match text.parse::<u32>() {
            Ok(index) => index,
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("instance must be an instance number, not {text:?}"),
                )
            }
        },
    };
    let (file, offset, length) = match window(&query) {
        Ok(window) => window,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let (framework_id, task_id) = match jobs.instance_task(&name, index) {
        Ok(found) => found,
        Err(LogsLookup::NoJob) => {
            return error(StatusCode::NOT_FOUND, format!("no job named `{name}`"))
        }
        Err(LogsLookup::NoInstance(count)) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("job `{name}` has no instance {index} (it has {count})"),
            )
        }
        Err(LogsLookup::NoTaskYet) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("instance {index} of job `{name}` has not run a task yet"),
            )
        }
    };
    let request = FileRequest {
        framework_id,
        task_id: task_id.clone(),
        // The route needs an operator (a job's tasks are the jobs framework's).
        owner: None,
        file,
        offset,
        length,
    };
    match read(&http, request).await {
        Ok(window) => {
            let mut value = body(window);
            value["task_id"] = json!(task_id);
            value["instance"] = json!(index);
            ok(value)
        }
        Err(response) => *response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_character_at_the_end_waits_for_the_next_read() {
        assert_eq!(whole_characters(b"abc"), 3);
        let e = "é".as_bytes(); // 2 bytes
        assert_eq!(whole_characters(&[b'a', e[0]]), 1);
        assert_eq!(whole_characters(&[e[0]]), 1, "nothing before it: returned");
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(whole_characters(&[b'x', euro[0], euro[1]]), 1);
        assert_eq!(whole_characters(&[0xff, b'x', euro[0]]), 2);
        assert_eq!(
            whole_characters(&[b'x', 0xff]),
            2,
            "invalid, not unfinished"
        );
        let window = FileWindow {
            data: vec![b'h', b'i', e[0]],
            offset: 10,
            size: 20,
            task_state: "RUNNING".into(),
            agent_id: "a1".into(),
        };
        let value = body(window);
        assert_eq!(value["data"], "hi");
        assert_eq!(value["length"], 2);
        assert_eq!(value["next_offset"], 12);
        assert_eq!(value["size"], 20);
    }

    #[test]
    fn window_parameters_are_checked() {
        let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (file, offset, length) = window(&q(&[])).unwrap();
        assert_eq!((file, offset, length), (FileKind::Stdout, 0, MAX_LENGTH));
        let (file, offset, length) = window(&q(&[
            ("file", "stderr"),
            ("offset", "7"),
            ("length", "99999999"),
        ]))
        .unwrap();
        assert_eq!((file, offset, length), (FileKind::Stderr, 7, MAX_LENGTH));
        assert!(window(&q(&[("file", "secret")])).is_err());
        assert!(window(&q(&[("offset", "-1")])).is_err());
        assert!(window(&q(&[("length", "x")])).is_err());
    }
}
