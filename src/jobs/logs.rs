//! `ringmaster job logs NAME [--instance N] [--stderr] [--follow]`: prints a job instance's
//! output through the master's `GET /jobs/{name}/logs` (the master reads it from the task's
//! agent, docs/jobs.md). Without `--follow` it prints the file as it is now and exits; with
//! it, it polls from where it stopped until the task has ended and everything is printed,
//! following the instance to a new task when the instance is replaced.

use std::io::Write;
use std::time::{Duration, Instant};

use ringmaster_proto::masters::Asked;

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

/// One window of the instance's output. With several masters (`a:5050,b:5050`) they are
/// asked in turn and the leader is followed ([`crate::leader_http`]).
fn fetch(
    master: &str,
    name: &str,
    instance: u32,
    file: &str,
    offset: u64,
) -> Result<Window, Failed> {
    crate::leader_http::with_leader(master, |address| {
        fetch_from(address, name, instance, file, offset)
    })
    .map_err(Failed::Unreachable)
    .and_then(|answer| answer)
}

fn fetch_from(
    master: &str,
    name: &str,
    instance: u32,
    file: &str,
    offset: u64,
) -> Asked<Result<Window, Failed>> {
    let url = format!(
        "{}/jobs/{name}/logs?instance={instance}&file={file}&offset={offset}",
        base(master)
    );
    let mut response = match agent().get(&url).call() {
        Ok(response) => response,
        Err(e) => {
            return Asked::Unreachable(format!(
                "cannot reach the master at {url}: {e}\n(--master or RINGMASTER_MASTER: the \
                 master's --listen address, or a list of them, which serve HTTP unless run \
                 with --http none)"
            ))
        }
    };
    let status = response.status().as_u16();
    let text = match response.body_mut().read_to_string() {
        Ok(text) => text,
        Err(e) => return Asked::Unreachable(format!("reading the answer of {url}: {e}")),
    };
    if let Some((leader, message)) = crate::leader_http::not_leader(status, &text) {
        return Asked::NotLeader { leader, message };
    }
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(_) => return Asked::Answer(Err(Failed::Status(status, text.trim_end().to_string()))),
    };
    if !(200..300).contains(&status) {
        let message = value["error"]
            .as_str()
            .unwrap_or(text.trim_end())
            .to_string();
        return Asked::Answer(Err(Failed::Status(status, message)));
    }
    let field = |key: &str| value[key].as_u64().unwrap_or(0);
    Asked::Answer(Ok(Window {
        data: value["data"].as_str().unwrap_or("").to_string(),
        next_offset: field("next_offset"),
        size: field("size"),
        task_state: value["task_state"].as_str().unwrap_or("").to_string(),
        task_id: value["task_id"].as_str().unwrap_or("").to_string(),
    }))
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
    let reader = Reader {
        follow,
        patience: FOLLOW_PATIENCE,
        poll: FOLLOW_POLL,
    };
    reader.run(
        |offset| fetch(master, name, instance, file, offset),
        &mut out,
        |old, new| {
            eprintln!(
                "ringmaster job logs: instance {instance} of {name} moved from task {old} to {new}"
            )
        },
    )
}

/// The loop of `job logs`, apart from HTTP and the terminal (tested with fakes).
struct Reader {
    follow: bool,
    /// How long `follow` retries while the output cannot be read.
    patience: Duration,
    poll: Duration,
}

impl Reader {
    /// Asks `fetch` for windows from offset 0 and writes their data to `out` until done (see
    /// [`next`]); `moved` is told when the instance's task changes (then its output is read
    /// from its start).
    fn run(
        &self,
        mut fetch: impl FnMut(u64) -> Result<Window, Failed>,
        out: &mut impl Write,
        mut moved: impl FnMut(&str, &str),
    ) -> Result<(), CliError> {
        let mut task: Option<String> = None;
        let mut offset = 0;
        // While --follow cannot read, since when.
        let mut failing_since: Option<Instant> = None;
        loop {
            let window = match fetch(offset) {
                Ok(window) => window,
                Err(Failed::Unreachable(message)) => return Err(failure(message)),
                Err(Failed::Status(status, message)) => {
                    // Unknown job or instance, bad request: nothing to wait for.
                    let lasting = status == 400
                        || (status == 404 && !message.contains("has not run a task yet"))
                        || (status == 503 && message.contains("no jobs framework"));
                    if !self.follow || lasting {
                        return Err(failure(message));
                    }
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.patience {
                        return Err(failure(format!(
                            "{message} (still, after {} s)",
                            self.patience.as_secs()
                        )));
                    }
                    std::thread::sleep(self.poll);
                    continue;
                }
            };
            failing_since = None;
            if task.as_deref() != Some(window.task_id.as_str()) {
                let previous = task.replace(window.task_id.clone());
                if let Some(old) = previous {
                    // The instance runs a new task: its output starts from the beginning.
                    moved(&old, &window.task_id);
                    if offset != 0 {
                        offset = 0;
                        continue;
                    }
                }
            }
            out.write_all(window.data.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| failure(format!("writing the output: {e}")))?;
            offset = window.next_offset;
            match next(&window, self.follow) {
                Next::More => {}
                Next::Done => return Ok(()),
                Next::Wait => std::thread::sleep(self.poll),
            }
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

    /// The offsets a fake master was asked for.
    type Asked = std::rc::Rc<std::cell::RefCell<Vec<u64>>>;

    /// A fake master: the windows `fetch` answers, in order; records the offsets asked for.
    fn fake(
        answers: Vec<Result<Window, Failed>>,
    ) -> (impl FnMut(u64) -> Result<Window, Failed>, Asked) {
        let asked = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let log = asked.clone();
        let mut answers = answers.into_iter();
        let fetch = move |offset| {
            log.borrow_mut().push(offset);
            answers.next().expect("asked once too often")
        };
        (fetch, asked)
    }

    fn data(task: &str, data: &str, offset: u64, size: u64, state: &str) -> Result<Window, Failed> {
        Ok(Window {
            data: data.into(),
            next_offset: offset + data.len() as u64,
            size,
            task_state: state.into(),
            task_id: task.into(),
        })
    }

    fn reader(follow: bool) -> Reader {
        Reader {
            follow,
            patience: Duration::from_secs(60),
            poll: Duration::ZERO,
        }
    }

    #[test]
    fn prints_the_whole_file_window_by_window() {
        let (fetch, asked) = fake(vec![
            data("t1", "abc", 0, 5, "RUNNING"),
            data("t1", "de", 3, 5, "RUNNING"),
        ]);
        let mut out = Vec::new();
        assert!(reader(false).run(fetch, &mut out, |_, _| panic!()).is_ok());
        assert_eq!(out, b"abcde");
        assert_eq!(*asked.borrow(), vec![0, 3]);
    }

    #[test]
    fn follow_waits_for_more_and_moves_to_the_new_task() {
        let (fetch, asked) = fake(vec![
            // Nothing launched yet, then the first task's output as it grows.
            Err(Failed::Status(
                404,
                "instance 0 of job `w` has not run a task yet".into(),
            )),
            data("t1", "one\n", 0, 4, "RUNNING"),
            data("t1", "", 4, 4, "RUNNING"),
            data("t1", "two\n", 4, 8, "RUNNING"),
            // Replaced: the new task's output from its start.
            data("t2", "xx", 8, 20, "RUNNING"),
            data("t2", "new\n", 0, 4, "FINISHED"),
        ]);
        let mut out = Vec::new();
        let mut moves = Vec::new();
        let result = reader(true).run(fetch, &mut out, |old, new| {
            moves.push(format!("{old}->{new}"))
        });
        assert!(result.is_ok());
        assert_eq!(String::from_utf8(out).unwrap(), "one\ntwo\nnew\n");
        assert_eq!(moves, vec!["t1->t2"]);
        assert_eq!(*asked.borrow(), vec![0, 0, 4, 4, 8, 0]);
    }

    #[test]
    fn lasting_errors_end_at_once_and_others_after_the_patience() {
        for (status, message) in [
            (404, "no job named `x`"),
            (404, "job `x` has no instance 3 (it has 1)"),
            (400, "file must be stdout or stderr"),
        ] {
            let (fetch, _) = fake(vec![Err(Failed::Status(status, message.into()))]);
            let error = reader(true)
                .run(fetch, &mut Vec::new(), |_, _| {})
                .unwrap_err();
            assert_eq!(error.message, message);
        }
        let (fetch, _) = fake(vec![Err(Failed::Unreachable("cannot reach".into()))]);
        assert!(reader(true).run(fetch, &mut Vec::new(), |_, _| {}).is_err());
        // Without --follow, an agent that is away is an error at once.
        let away = || Err(Failed::Status(502, "agent a1 is not connected".into()));
        let (fetch, _) = fake(vec![away()]);
        assert!(reader(false)
            .run(fetch, &mut Vec::new(), |_, _| {})
            .is_err());
        // With it, retried until the patience runs out (none here: the first failure ends it).
        let (fetch, asked) = fake(vec![away(), away(), away()]);
        let impatient = Reader {
            follow: true,
            patience: Duration::ZERO,
            poll: Duration::ZERO,
        };
        let error = impatient
            .run(fetch, &mut Vec::new(), |_, _| {})
            .unwrap_err();
        assert!(error.message.contains("still, after"), "{}", error.message);
        assert_eq!(asked.borrow().len(), 1);
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
