//! What `ringmaster-exec` prints and returns, shared by the plain mode ([`crate::exec`]) and the
//! batch mode ([`crate::batch`]): the exit codes and the per-task state line.

use ringmaster_sdk::{TaskState, TaskStatus};

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

/// The line printed for a state change: `TASK <id> <STATE> agent=<agent>[ reason=<reason>]`.
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
    line
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
}
