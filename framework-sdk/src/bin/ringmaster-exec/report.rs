//! What `ringmaster-exec` prints and returns, shared by the plain mode ([`crate::exec`]) and the
//! batch mode ([`crate::batch`]): the exit codes and the per-task state line.

use std::time::Duration;

use ringmaster_sdk::{Driver, TaskState, TaskStatus};
use tokio::task::AbortHandle;

/// Exit code when every task finished.
pub const EXIT_SUCCESS: i32 = 0;
/// Exit code when a task did not finish, or the framework could not run.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code for a bad command line.
pub const EXIT_USAGE: i32 = 2;

/// The process exit code for the tasks' final states (`None`: never reported): 0 iff every task
/// FINISHED.
pub fn exit_code<'a>(states: impl IntoIterator<Item = &'a Option<TaskState>>) -> i32 {
    let all_finished = states
        .into_iter()
        .all(|state| *state == Some(TaskState::TaskFinished));
    if all_finished {
        EXIT_SUCCESS
    } else {
        EXIT_FAILURE
    }
}

/// The line printed for a state change: `TASK <id> <STATE> agent=<agent>[ reason=<reason>]`,
/// and for a task that ended other than FINISHED also how it ended: ` exit_code=<n>` (or
/// ` signal=<SIGNAME>` when the message names the signal that killed it) and
/// ` message=<first line of the status message>`; further lines of the message (the agent
/// appends the last lines of the task's stderr) follow on lines of their own, each indented
/// with `    | `.
pub fn status_line(status: &TaskStatus) -> String {
    let mut line = format!(
        "TASK {} {} agent={}",
        status.task_id,
        status.state().short_name(),
        status.agent_id
    );
    if !status.reason.is_empty() {
        line.push_str(" reason=");
        line.push_str(&status.reason);
    }
    let state = status.state();
    if !state.is_terminal() || state == TaskState::TaskFinished {
        return line;
    }
    match status.exit_code {
        Some(code) => line.push_str(&format!(" exit_code={code}")),
        None => {
            if let Some(signal) = signal_in(&status.message) {
                line.push_str(" signal=");
                line.push_str(signal);
            }
        }
    }
    let mut message = status
        .message
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty());
    if let Some(first) = message.next() {
        line.push_str(" message=");
        line.push_str(first.trim_start());
    }
    for more in message {
        line.push_str("\n    | ");
        line.push_str(more);
    }
    line
}

/// The signal name (`SIGKILL`, `SIGSEGV`, ...) in an agent's message such as
/// "killed by SIGKILL (9)".
fn signal_in(message: &str) -> Option<&str> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric()))
        .find(|word| {
            word.len() > 3
                && word.starts_with("SIG")
                && word[3..]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        })
}

/// Each task's last state as exec sees it, by index.
///
/// Terminal states are final, except a `TASK_LOST` with reason `agent_lost`: the agent may come
/// back with the task, and the master then reports `TASK_RUNNING` (docs/protocol.md), so such a
/// task is only *provisionally* ended until another update or the lost grace says otherwise.
#[derive(Debug, Clone)]
pub struct TaskBook {
    states: Vec<Option<TaskState>>,
    provisional: Vec<bool>,
}

/// Where a set of tasks stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Some task has not ended.
    Open,
    /// Every task ended, some only provisionally (LOST, awaiting recovery).
    AwaitingRecovery,
    /// Every task ended for good.
    Done,
}

impl TaskBook {
    /// `n` tasks, none reported.
    pub fn new(n: usize) -> Self {
        TaskBook {
            states: vec![None; n],
            provisional: vec![false; n],
        }
    }

    /// The last states, for the exit code.
    pub fn states(&self) -> &[Option<TaskState>] {
        &self.states
    }

    /// Records `status` for task `index`; true when its state changed (print a line).
    pub fn record(&mut self, index: usize, status: &TaskStatus) -> bool {
        let state = status.state();
        let previous = self.states[index];
        let ended_for_good =
            previous.is_some_and(TaskState::is_terminal) && !self.provisional[index];
        if ended_for_good {
            return false;
        }
        self.provisional[index] = state.is_terminal() && !status.is_final();
        if previous == Some(state) {
            return false;
        }
        self.states[index] = Some(state);
        true
    }

    /// Whether task `index` has ended (provisionally or for good).
    pub fn ended(&self, index: usize) -> bool {
        self.states[index].is_some_and(TaskState::is_terminal)
    }

    /// Where the tasks `indices` stand.
    pub fn progress(&self, indices: impl IntoIterator<Item = usize>) -> Progress {
        let mut awaiting = false;
        for i in indices {
            if !self.ended(i) {
                return Progress::Open;
            }
            awaiting |= self.provisional[i];
        }
        if awaiting {
            Progress::AwaitingRecovery
        } else {
            Progress::Done
        }
    }
}

/// When to stop the framework: once every task ended for good, or once the lost grace runs out
/// while the only open tasks are LOST with their agent.
#[derive(Debug)]
pub struct Stopper {
    stopping: bool,
    lost_grace: Duration,
    /// Armed while every task has ended but some are LOST with their agent.
    lost_timer: Option<AbortHandle>,
}

impl Stopper {
    /// A stopper that gives LOST tasks `lost_grace` to come back (0: none).
    pub fn new(lost_grace: Duration) -> Self {
        Stopper {
            stopping: false,
            lost_grace,
            lost_timer: None,
        }
    }

    /// Acts on where the tasks stand now.
    pub fn update(&mut self, progress: Progress, driver: &Driver) {
        if self.stopping {
            return;
        }
        match progress {
            Progress::AwaitingRecovery if !self.lost_grace.is_zero() => {
                if self.lost_timer.is_none() {
                    self.lost_timer = Some(stop_after(driver, self.lost_grace));
                }
                return;
            }
            Progress::Open => {}
            Progress::AwaitingRecovery | Progress::Done => {
                self.stopping = true;
                let _ = driver.stop();
            }
        }
        if let Some(timer) = self.lost_timer.take() {
            timer.abort();
        }
    }
}

/// Stops `driver` after `grace` unless aborted first: the tasks still LOST by then are taken
/// as lost for good.
fn stop_after(driver: &Driver, grace: Duration) -> AbortHandle {
    let driver = driver.clone();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        eprintln!(
            "ringmaster-exec: tasks still LOST after --lost-grace {}s; giving up",
            grace.as_secs_f64()
        );
        let _ = driver.stop();
    })
    .abort_handle()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_is_zero_only_when_every_task_finished() {
        use TaskState::*;
        assert_eq!(exit_code(&[Some(TaskFinished), Some(TaskFinished)]), 0);
        assert_eq!(exit_code(&[Some(TaskFinished), Some(TaskFailed)]), 1);
        assert_eq!(exit_code(&[Some(TaskKilled)]), 1);
        assert_eq!(exit_code(&[Some(TaskLost)]), 1);
        assert_eq!(exit_code(&[Some(TaskFinished), None]), 1);
        assert_eq!(exit_code(&[Some(TaskRunning)]), 1);
    }

    #[test]
    fn status_line_has_state_agent_and_optional_reason() {
        let mut status = TaskStatus {
            task_id: "job-0".into(),
            agent_id: "a1".into(),
            state: TaskState::TaskRunning as i32,
            ..TaskStatus::default()
        };
        assert_eq!(status_line(&status), "TASK job-0 RUNNING agent=a1");
        status.state = TaskState::TaskKilled as i32;
        status.reason = "preempted".into();
        assert_eq!(
            status_line(&status),
            "TASK job-0 KILLED agent=a1 reason=preempted"
        );
    }

    fn failed(reason: &str, exit_code: Option<i32>, message: &str) -> TaskStatus {
        TaskStatus {
            task_id: "job-0".into(),
            agent_id: "a1".into(),
            state: TaskState::TaskFailed as i32,
            reason: reason.into(),
            exit_code,
            message: message.into(),
            ..TaskStatus::default()
        }
    }

    #[test]
    fn a_failed_line_says_how_the_task_ended() {
        assert_eq!(
            status_line(&failed("exit_status", Some(3), "exited with status 3")),
            "TASK job-0 FAILED agent=a1 reason=exit_status exit_code=3 message=exited with status 3"
        );
        assert_eq!(
            status_line(&failed("signal", None, "killed by SIGSEGV (11)")),
            "TASK job-0 FAILED agent=a1 reason=signal signal=SIGSEGV message=killed by SIGSEGV (11)"
        );
        assert_eq!(
            status_line(&failed(
                "memory_limit",
                None,
                "memory limit 32 MiB exceeded (killed by SIGKILL (9))"
            )),
            "TASK job-0 FAILED agent=a1 reason=memory_limit signal=SIGKILL \
             message=memory limit 32 MiB exceeded (killed by SIGKILL (9))"
        );
        // The last lines of stderr the agent appends: one indented line each.
        assert_eq!(
            status_line(&failed(
                "exit_status",
                Some(1),
                "exited with status 1\nlast stderr lines:\n  Traceback\nValueError: x\n\n"
            )),
            "TASK job-0 FAILED agent=a1 reason=exit_status exit_code=1 message=exited with status 1\n\
             \x20   | last stderr lines:\n\
             \x20   |   Traceback\n\
             \x20   | ValueError: x"
        );
        // Without a message or code: as before.
        assert_eq!(
            status_line(&failed("exit_status", None, "")),
            "TASK job-0 FAILED agent=a1 reason=exit_status"
        );
        // Killed and lost tasks say why too; FINISHED and RUNNING lines stay short.
        let mut status = failed("killed_by_framework", None, "killed by SIGTERM (15)");
        status.state = TaskState::TaskKilled as i32;
        assert!(status_line(&status).ends_with(" signal=SIGTERM message=killed by SIGTERM (15)"));
        status.state = TaskState::TaskFinished as i32;
        status.reason.clear();
        status.exit_code = Some(0);
        assert_eq!(status_line(&status), "TASK job-0 FINISHED agent=a1");
        status.state = TaskState::TaskRunning as i32;
        assert_eq!(status_line(&status), "TASK job-0 RUNNING agent=a1");
    }

    #[test]
    fn signal_names_are_found_only_as_whole_words() {
        assert_eq!(signal_in("killed by SIGKILL (9)"), Some("SIGKILL"));
        assert_eq!(signal_in("SIGRTMIN1"), Some("SIGRTMIN1"));
        assert_eq!(signal_in("SIG alone"), None);
        assert_eq!(signal_in("a SIGterm"), None);
        assert_eq!(signal_in(""), None);
    }

    fn lost(reason: &str) -> TaskStatus {
        TaskStatus {
            state: TaskState::TaskLost as i32,
            reason: reason.into(),
            ..TaskStatus::default()
        }
    }

    fn with(state: TaskState) -> TaskStatus {
        TaskStatus {
            state: state as i32,
            ..TaskStatus::default()
        }
    }

    #[test]
    fn a_task_lost_with_its_agent_may_recover_and_finish() {
        let mut book = TaskBook::new(1);
        assert!(book.record(0, &with(TaskState::TaskRunning)));
        assert!(book.record(0, &lost("agent_lost")));
        assert_eq!(book.progress([0]), Progress::AwaitingRecovery);
        assert!(book.record(0, &with(TaskState::TaskRunning)));
        assert_eq!(book.progress([0]), Progress::Open);
        assert!(book.record(0, &with(TaskState::TaskFinished)));
        assert_eq!(book.progress([0]), Progress::Done);
        assert_eq!(exit_code(book.states()), EXIT_SUCCESS);
        // Final means final.
        assert!(!book.record(0, &with(TaskState::TaskRunning)));
    }

    #[test]
    fn other_terminal_states_and_other_losses_are_final() {
        let mut book = TaskBook::new(3);
        book.record(0, &with(TaskState::TaskFailed));
        book.record(1, &lost("agent_reregistered"));
        book.record(2, &lost("agent_lost"));
        // The same state again with a final reason: no line, but no longer provisional.
        assert!(!book.record(2, &lost("reconciliation")));
        assert_eq!(book.progress([0, 1, 2]), Progress::Done);
        for i in 0..3 {
            assert!(!book.record(i, &with(TaskState::TaskRunning)), "task {i}");
        }
        assert_eq!(exit_code(book.states()), EXIT_FAILURE);
    }
}
