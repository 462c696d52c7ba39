//! How a task's main process ended ([`ExitOutcome`]): what the process watcher reports and
//! the agent's state turns into a task status.

/// How a task's main process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitOutcome {
    /// Exited with this status.
    Code(i32),
    /// Terminated by this signal.
    Signal(i32),
    /// Waiting for the process failed; it is not known how it ended.
    WaitFailed(String),
    /// The command never ran: the launch gate closed before the agent started the task (it
    /// stopped in between), as its supervisor recorded ([`crate::supervisor`]).
    NotStarted,
    /// The kernel killed a process of the task for exceeding the task's memory limit (its
    /// cgroup counted an OOM kill); the task then ended as `then` says.
    MemoryLimit(Box<ExitOutcome>),
}
