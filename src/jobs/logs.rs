//! `ringmaster job logs NAME [--instance N] [--stderr] [--follow]`: prints a job instance's
//! output through the master's `GET /jobs/{name}/logs` (the master reads it from the task's
//! agent, docs/jobs.md). Without `--follow` it prints the file as it is now and exits; with
//! it, it polls from where it stopped until the task has ended and everything is printed,
//! following the instance to a new task when the instance is replaced.

use std::io::Write as _;
use std::time::{Duration, Instant};

use super::cli::{agent, base, failure, CliError};

/// How often `--follow` asks for more.
const FOLLOW_POLL: Duration = Duration::from_millis(300);
/// How long `--follow` keeps retrying while the output cannot be read (the agent reconnecting,
/// the task still being launched) before it gives up.
const FOLLOW_PATIENCE: Duration = Duration::from_secs(30);

/// One window as the master answers it.
#[derive(Debug, PartialEq)]
struct Window {
    data: String,
    next_offset: u64,
    size: u64,
    task_state: String,
    task_id: String,
}

/// Why a request gave no window.
#[derive(Debug)]
enum Failed {
    /// The master answered with this status and message.
    Status(u16, String),
    /// The master could not be reached or answered something else than JSON.
    Unreachable(String),
}

/// What to do after a window.
#[derive(Debug, PartialEq)]
enum Next {
    /// Ask again at once (more is there).
    More,
    /// Wait, then ask again.
    Wait,
    /// Everything is printed.
    Done,
}

/// The terminal task states, as the master names them.
fn terminal(state: &str) -> bool {
    matches!(state, "FINISHED" | "FAILED" | "KILLED" | "LOST")
}

/// After printing `window`: more now, later, or done.
fn next(window: &Window, follow: bool) -> Next {
    if window.next_offset < window.size {
        Next::More
    } else if !follow || terminal(&window.task_state) {
        Next::Done
    } else {
        Next::Wait
    }
}

fn fetch(
    master: &str,
    name: &str,
    instance: u32,
    file: &str,
    offset: u64,
) -> Result<Window, Failed> {
    let url = format!(
        "{}/jobs/{name}/logs?instance={instance}&file={file}&offset={offset}",
        base(master)
    );
    let mut response = agent().get(&url).call().map_err(|e| {
        Failed::Unreachable(format!(
            "cannot reach the master at {url}: {e}\n(--master or RINGMASTER_MASTER: the \
             master's --listen address, which serves HTTP unless it runs with --http none)"
        ))
    })?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| Failed::Unreachable(format!("reading the answer of {url}: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|_| Failed::Status(status, text.trim_end().to_string()))?;
    if !(200..300).contains(&status) {
        let message = value["error"]
            .as_str()
            .unwrap_or(text.trim_end())
            .to_string();
        return Err(Failed::Status(status, message));
    }
    let field = |key: &str| value[key].as_u64().unwrap_or(0);
    Ok(Window {
        data: value["data"].as_str().unwrap_or("").to_string(),
        next_offset: field("next_offset"),
        size: field("size"),
        task_state: value["task_state"].as_str().unwrap_or("").to_string(),
        task_id: value["task_id"].as_str().unwrap_or("").to_string(),
    })
}

/// `job logs`: see the module docs.
pub fn logs(
    master: &str,
    name: &str,
    instance: u32,
    stderr: bool,
    follow: bool,
) -> Result<(), CliError> {
    let file = if stderr { "stderr" } else { "stdout" };
    let mut out = std::io::stdout().lock();
    let mut task: Option<String> = None;
    let mut offset = 0;
    // While --follow cannot read, since when.
    let mut failing_since: Option<Instant> = None;
    loop {
        let window = match fetch(master, name, instance, file, offset) {
            Ok(window) => window,
            Err(Failed::Unreachable(message)) => return Err(failure(message)),
            Err(Failed::Status(status, message)) => {
                // Unknown job or instance, bad request: nothing to wait for.
                let lasting = status == 400
                    || (status == 404 && !message.contains("has not run a task yet"))
                    || status == 503 && message.contains("no jobs framework");
                if !follow || lasting {
                    return Err(failure(message));
                }
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= FOLLOW_PATIENCE {
                    return Err(failure(format!(
                        "{message} (still, after {} s)",
                        FOLLOW_PATIENCE.as_secs()
                    )));
                }
                std::thread::sleep(FOLLOW_POLL);
                continue;
            }
        };
        failing_since = None;
        if task.as_deref() != Some(window.task_id.as_str()) {
            if let Some(old) = &task {
                // The instance runs a new task: its output starts from the beginning.
                eprintln!(
                    "ringmaster job logs: instance {instance} of {name} moved from task {old} to {}",
                    window.task_id
                );
                task = Some(window.task_id.clone());
                if offset != 0 {
                    offset = 0;
                    continue;
                }
            }
            task = Some(window.task_id.clone());
        }
        out.write_all(window.data.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| failure(format!("writing the output: {e}")))?;
        offset = window.next_offset;
        match next(&window, follow) {
            Next::More => {}
            Next::Done => return Ok(()),
            Next::Wait => std::thread::sleep(FOLLOW_POLL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(next_offset: u64, size: u64, state: &str) -> Window {
        Window {
            data: String::new(),
            next_offset,
            size,
            task_state: state.into(),
            task_id: "t".into(),
        }
    }

    #[test]
    fn reads_on_until_the_end_and_follows_until_the_task_ended() {
        assert_eq!(next(&window(10, 20, "RUNNING"), false), Next::More);
        assert_eq!(next(&window(20, 20, "RUNNING"), false), Next::Done);
        assert_eq!(next(&window(20, 20, "RUNNING"), true), Next::Wait);
        assert_eq!(next(&window(20, 20, "STAGING"), true), Next::Wait);
        assert_eq!(next(&window(10, 20, "FINISHED"), true), Next::More);
        for state in ["FINISHED", "FAILED", "KILLED", "LOST"] {
            assert_eq!(next(&window(20, 20, state), true), Next::Done);
        }
    }
}
