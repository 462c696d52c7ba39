//! `ringmaster-exec --batch FILE`: submit a YAML burst of one-shot, deadline-bound tasks to be
//! matched at once (docs/batch.md), launch what the master suggests, and wait.
//!
//! ```yaml
//! batch_id: burst-1            # optional; default: the --name
//! tasks:
//!   - id: resize-1             # unique in the batch
//!     command: "convert in.png -resize 50% out.png"
//!     resources: "cpus:1;mem:256"
//!     deadline: 5              # seconds, > 0
//!     work: 2                  # seconds on an agent with cpu_speed 1, > 0
//!     price: 3                 # optional, ≥ 0, default 1
//! ```
//!
//! Prints `TASK <id> <STATE> agent=<agent>` per state change like the plain mode, one
//! `UNMATCHED <id> reason=<code> (<text>)` per task the master could not place, and
//! `BATCH <id> matched=<n> unmatched=<n> proposals=<n>` when the result arrives. Stops when the
//! result has arrived and every launched task is terminal; exit code 0 only if every task of the
//! file FINISHED.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use async_trait::async_trait;
use serde::Deserialize;
use tracing::warn;

use ringmaster_sdk::{
    batch_task, task, BatchResult, BatchTask, Driver, ErrorCode, Offer, Resources, Scheduler,
    TaskState, TaskStatus,
};

use crate::report::{exit_code, status_line, Progress, Stopper, TaskBook};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch {
    batch_id: Option<String>,
    tasks: Vec<RawTask>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    id: String,
    command: String,
    resources: String,
    deadline: f64,
    work: f64,
    price: Option<f64>,
}

/// A checked batch file.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchFile {
    /// `None`: use the framework name.
    pub batch_id: Option<String>,
    /// The tasks, in file order.
    pub tasks: Vec<BatchTask>,
}

impl BatchFile {
    /// Reads and checks a batch file; errors name the file and the task.
    pub fn load(path: &Path) -> Result<BatchFile, String> {
        let file = path.display();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{file}: cannot read: {e}"))?;
        BatchFile::parse(&text).map_err(|e| format!("{file}: {e}"))
    }

    /// Parses and checks batch YAML.
    pub fn parse(text: &str) -> Result<BatchFile, String> {
        ringmaster_proto::yaml_depth::check_depth(text, "batch file").map_err(|e| e.to_string())?;
        let raw: RawBatch = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        if raw.tasks.is_empty() {
            return Err("tasks: the batch has no tasks".into());
        }
        let mut seen = HashSet::new();
        let mut tasks = Vec::with_capacity(raw.tasks.len());
        for (i, t) in raw.tasks.iter().enumerate() {
            let at = |field: &str, message: String| format!("tasks[{i}].{field}: {message}");
            if t.id.trim().is_empty() {
                return Err(at("id", "must not be empty".into()));
            }
            if !seen.insert(t.id.as_str()) {
                return Err(at("id", format!("`{}` appears twice", t.id)));
            }
            if t.command.trim().is_empty() {
                return Err(at("command", "must not be empty".into()));
            }
            let resources = match Resources::parse(&t.resources) {
                Ok(r) if r.is_empty() => {
                    return Err(at("resources", "must name at least one resource".into()))
                }
                Ok(r) => r,
                Err(e) => return Err(at("resources", e.to_string())),
            };
            if !(t.deadline.is_finite() && t.deadline > 0.0) {
                return Err(at(
                    "deadline",
                    format!("must be seconds > 0, got {}", t.deadline),
                ));
            }
            if !(t.work.is_finite() && t.work > 0.0) {
                return Err(at("work", format!("must be seconds > 0, got {}", t.work)));
            }
            let price = t.price.unwrap_or(1.0);
            if !(price.is_finite() && price >= 0.0) {
                return Err(at("price", format!("must be a number ≥ 0, got {price}")));
            }
            tasks.push(batch_task(
                task(&t.id, &t.command, &resources),
                t.deadline,
                t.work,
                price,
            ));
        }
        Ok(BatchFile {
            batch_id: raw.batch_id,
            tasks,
        })
    }
}

/// The line printed for an unmatched task.
pub fn unmatched_line(task_id: &str, reason: &str, message: &str) -> String {
    format!("UNMATCHED {task_id} reason={reason} ({message})")
}

/// The scheduler behind `ringmaster-exec --batch`.
pub struct BatchExecScheduler<W> {
    batch_id: String,
    tasks: Vec<BatchTask>,
    index_of: HashMap<String, usize>,
    /// Last state per task; unmatched tasks stay `None`.
    book: TaskBook,
    launched: HashSet<usize>,
    result: Option<BatchResult>,
    submitted: bool,
    stopper: Stopper,
    out: W,
}

impl<W: Write + Send + 'static> BatchExecScheduler<W> {
    /// A scheduler submitting `tasks` as batch `batch_id`, printing its lines to `out`; tasks
    /// LOST with their agent get `lost_grace` to come back (see `--lost-grace`).
    pub fn new(
        batch_id: String,
        tasks: Vec<BatchTask>,
        lost_grace: std::time::Duration,
        out: W,
    ) -> Self {
        let index_of = tasks
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.task.as_ref().map(|info| (info.task_id.clone(), i)))
            .collect();
        BatchExecScheduler {
            batch_id,
            book: TaskBook::new(tasks.len()),
            tasks,
            index_of,
            launched: HashSet::new(),
            result: None,
            submitted: false,
            stopper: Stopper::new(lost_grace),
            out,
        }
    }

    /// 0 iff every task of the batch FINISHED.
    pub fn exit_code(&self) -> i32 {
        exit_code(self.book.states())
    }

    fn print(&mut self, line: &str) {
        if let Err(e) = writeln!(self.out, "{line}").and_then(|()| self.out.flush()) {
            warn!(error = %e, "could not print a line");
        }
    }

    fn record(&mut self, status: &TaskStatus) {
        let Some(&index) = self.index_of.get(&status.task_id) else {
            warn!(task_id = %status.task_id, "status of a task not in the batch ignored");
            return;
        };
        if self.book.record(index, status) {
            self.print(&status_line(status));
        }
    }

    /// Stops when every task ended for good, or after the lost grace (see [`Stopper`]).
    fn stop_when_done(&mut self, driver: &Driver) {
        let progress = if self.result.is_some() {
            self.book.progress(self.launched.iter().copied())
        } else {
            Progress::Open
        };
        self.stopper.update(progress, driver);
    }
}

#[async_trait]
impl<W: Write + Send + 'static> Scheduler for BatchExecScheduler<W> {
    async fn registered(&mut self, driver: &Driver, _framework_id: &str) {
        if self.submitted {
            // A new framework id after a reconnect: the old framework expired with its tasks.
            warn!("the framework expired while disconnected; its batch is lost");
            self.result.get_or_insert_with(BatchResult::default);
            for index in self.launched.clone() {
                let id = self.tasks[index]
                    .task
                    .as_ref()
                    .map(|t| t.task_id.clone())
                    .unwrap_or_default();
                self.record(&TaskStatus {
                    task_id: id,
                    state: TaskState::TaskLost as i32,
                    reason: "framework_expired".into(),
                    ..TaskStatus::default()
                });
            }
            self.stop_when_done(driver);
            return;
        }
        self.submitted = true;
        let _ = driver.submit_batch(&self.batch_id, self.tasks.clone());
    }

    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        let ids: Vec<String> = offers.into_iter().map(|o| o.offer_id).collect();
        let _ = driver.decline(&ids, std::time::Duration::ZERO);
    }

    async fn batch_offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        for offer in &offers {
            for info in &offer.suggested {
                if let Some(&i) = self.index_of.get(&info.task_id) {
                    self.launched.insert(i);
                }
            }
            let _ = ringmaster_sdk::accept_suggested(driver, offer);
        }
    }

    async fn batch_result(&mut self, driver: &Driver, result: BatchResult) {
        for u in &result.unmatched {
            self.print(&unmatched_line(&u.task_id, &u.reason, &u.message));
        }
        self.print(&format!(
            "BATCH {} matched={} unmatched={} proposals={}",
            result.batch_id,
            result.matched,
            result.unmatched.len(),
            result.proposals
        ));
        self.result = Some(result);
        self.stop_when_done(driver);
    }

    async fn status_update(&mut self, driver: &Driver, status: TaskStatus) {
        self.record(&status);
        self.stop_when_done(driver);
    }

    async fn error(&mut self, driver: &Driver, code: ErrorCode, message: &str) {
        if code == ErrorCode::InvalidRequest && message.starts_with("SubmitBatch") {
            eprintln!("ringmaster-exec: the master refused the batch: {message}");
            self.result.get_or_insert_with(BatchResult::default);
            self.stop_when_done(driver);
        } else {
            warn!(code = code.as_str_name(), %message, "the master reported an error");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::convert::ResourcesWire;

    #[test]
    fn parses_a_batch_with_defaults() {
        let file = BatchFile::parse(
            "tasks:\n  - { id: a, command: 'echo a', resources: 'cpus:1', deadline: 5, work: 2 }\n  - { id: b, command: 'echo b', resources: 'cpus:0.5;mem:64', deadline: 1.5, work: 1, price: 4 }\n",
        )
        .unwrap();
        assert_eq!(file.batch_id, None);
        assert_eq!(file.tasks.len(), 2);
        assert_eq!(file.tasks[0].price, 1.0);
        assert_eq!(file.tasks[1].deadline_secs, 1.5);
        let info = file.tasks[1].task.as_ref().unwrap();
        assert_eq!(info.task_id, "b");
        assert_eq!(
            Resources::from_wire(info.resources.as_ref()).unwrap(),
            Resources::parse("cpus:0.5;mem:64").unwrap()
        );
    }

    #[test]
    fn bad_batches_name_the_task_and_field() {
        let t = |extra: &str| {
            format!("tasks:\n  - {{ id: a, command: 'x', resources: 'cpus:1', {extra} }}\n")
        };
        let cases = [
            (t("deadline: 0, work: 1"), "tasks[0].deadline: must be seconds > 0"),
            (t("deadline: 1, work: -1"), "tasks[0].work: must be seconds > 0"),
            (t("deadline: 1, work: 1, price: -2"), "tasks[0].price"),
            (t("deadline: 1"), "missing field `work`"),
            (t("deadline: 1, work: 1, speed: 2"), "unknown field `speed`"),
            ("tasks: []\n".to_string(), "tasks: the batch has no tasks"),
            (
                "tasks:\n  - { id: a, command: x, resources: 'cpus:1', deadline: 1, work: 1 }\n  - { id: a, command: x, resources: 'cpus:1', deadline: 1, work: 1 }\n".to_string(),
                "tasks[1].id: `a` appears twice",
            ),
            (
                "tasks:\n  - { id: a, command: x, resources: 'cpus:x', deadline: 1, work: 1 }\n".to_string(),
                "tasks[0].resources:",
            ),
        ];
        for (text, want) in cases {
            let err = BatchFile::parse(&text).unwrap_err();
            assert!(err.contains(want), "{text}\n got: {err}\nwant: {want}");
        }
    }
}
