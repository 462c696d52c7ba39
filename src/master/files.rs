//! Reads of task output in flight: the master asks an agent for a window of a task's
//! `stdout`/`stderr` (`ReadFile`) on behalf of an HTTP client and keeps the client's reply
//! channel here until the agent's `FileData` comes back.
//!
//! The map is bounded ([`MAX_PENDING_READS`]): an HTTP client cannot make the master hold an
//! unbounded number of replies; a read beyond the bound is refused at once. A read ends exactly
//! once: answered by the agent it was sent to, failed when that agent disconnects, or failed
//! after [`READ_TIMEOUT`] on the actor's tick. A `FileData` with an unknown request id, or from
//! another agent, is ignored.
//!
//! A leaf: plain data and a map, no master state; time is an argument.

use std::collections::HashMap;

use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};

/// At most this many reads wait for an agent at once (the whole master).
pub(crate) const MAX_PENDING_READS: usize = 256;
/// A read the agent has not answered within this is failed.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What an HTTP client asks to read.
#[derive(Clone, Debug)]
pub struct FileRequest {
    pub framework_id: String,
    pub task_id: String,
    /// `Some(principal)`: read only a task of a framework that principal owns (a tenant
    /// reading its own task's output); `None`: any task (an operator, or no authentication).
    pub owner: Option<String>,
    pub file: ringmaster_proto::FileKind,
    pub offset: u64,
    pub length: u32,
}

/// A window of a task's output, as the agent read it.
#[derive(Clone, Debug, PartialEq)]
pub struct FileWindow {
    pub data: Vec<u8>,
    pub offset: u64,
    /// The whole file's size when the agent read it.
    pub size: u64,
    /// The task's state when the read was asked for (`RUNNING`, `FINISHED`, …): a terminal
    /// state here means the file was complete before it was read.
    pub task_state: String,
    pub agent_id: String,
}

/// Why a read gave no window.
#[derive(Clone, Debug, PartialEq)]
pub enum FileReadError {
    /// The master knows no such task (never, or forgotten since).
    UnknownTask,
    /// The task's agent is not connected, or disconnected before it answered.
    AgentGone(String),
    /// The agent did not answer within [`READ_TIMEOUT`].
    Timeout(String),
    /// [`MAX_PENDING_READS`] reads are already waiting.
    Busy,
    /// The agent answered with an error (no sandbox, unsafe file, I/O).
    Agent(String),
    /// The task's framework belongs to another principal than the one asking.
    NotOwner(String),
}

impl std::fmt::Display for FileReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileReadError::UnknownTask => write!(f, "no such task"),
            FileReadError::NotOwner(principal) => write!(
                f,
                "the task's framework does not belong to principal {principal:?} (an operator \
                 reads every task's output)"
            ),
            FileReadError::AgentGone(agent) => {
                write!(f, "agent {agent} is not connected to the master")
            }
            FileReadError::Timeout(agent) => write!(
                f,
                "agent {agent} did not answer within {} s",
                READ_TIMEOUT.as_secs()
            ),
            FileReadError::Busy => write!(
                f,
                "{MAX_PENDING_READS} file reads are already in flight; try again"
            ),
            FileReadError::Agent(why) => write!(f, "the agent could not read it: {why}"),
        }
    }
}

/// The answer to one read.
pub type FileReadResult = Result<FileWindow, FileReadError>;
/// Where the answer to one read goes.
pub type FileReply = oneshot::Sender<FileReadResult>;

struct Pending {
    agent: String,
    task_state: String,
    started: Instant,
    reply: FileReply,
}

/// The reads sent to agents and not answered yet, by request id.
#[derive(Default)]
pub(crate) struct PendingReads {
    next_id: u64,
    reads: HashMap<u64, Pending>,
}

impl PendingReads {
    /// Records a read about to be sent to `agent`; its request id. When the map is full the
    /// read is refused on `reply` at once and `None` comes back (nothing is to be sent).
    pub fn start(
        &mut self,
        agent: &str,
        task_state: &str,
        reply: FileReply,
        now: Instant,
    ) -> Option<u64> {
        if self.reads.len() >= MAX_PENDING_READS {
            let _ = reply.send(Err(FileReadError::Busy));
            return None;
        }
        self.next_id += 1;
        self.reads.insert(
            self.next_id,
            Pending {
                agent: agent.to_string(),
                task_state: task_state.to_string(),
                started: now,
                reply,
            },
        );
        Some(self.next_id)
    }

    /// An agent's `FileData`: completes the read it answers. False (and nothing happens) when
    /// no read of that id waits for this agent.
    pub fn complete(&mut self, agent: &str, answer: ringmaster_proto::FileData) -> bool {
        match self.reads.get(&answer.request_id) {
            Some(pending) if pending.agent == agent => {}
            _ => return false,
        }
        let Some(pending) = self.reads.remove(&answer.request_id) else {
            return false;
        };
        let result = if answer.error.is_empty() {
            Ok(FileWindow {
                data: answer.data,
                offset: answer.offset,
                size: answer.size,
                task_state: pending.task_state,
                agent_id: pending.agent,
            })
        } else {
            Err(FileReadError::Agent(answer.error))
        };
        let _ = pending.reply.send(result);
        true
    }

    /// The agent's connection ended: its reads fail now. How many there were.
    pub fn agent_gone(&mut self, agent: &str) -> usize {
        let ids: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, p)| p.agent == agent)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(pending) = self.reads.remove(id) {
                let _ = pending
                    .reply
                    .send(Err(FileReadError::AgentGone(pending.agent)));
            }
        }
        ids.len()
    }

    /// Fails the reads started [`READ_TIMEOUT`] or longer before `now`. How many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let ids: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, p)| now.duration_since(p.started) >= READ_TIMEOUT)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(pending) = self.reads.remove(id) {
                let _ = pending
                    .reply
                    .send(Err(FileReadError::Timeout(pending.agent)));
            }
        }
        ids.len()
    }

    /// Reads waiting for an answer.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.reads.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::FileData;

    #[test]
    fn a_read_completes_once_and_only_from_its_agent() {
        let now = Instant::now();
        let mut reads = PendingReads::default();
        let (tx, mut rx) = oneshot::channel();
        let id = reads.start("a1", "RUNNING", tx, now).unwrap();
        let answer = |agent_id: u64| FileData {
            request_id: agent_id,
            data: b"hi".to_vec(),
            offset: 0,
            size: 2,
            error: String::new(),
        };
        assert!(!reads.complete("a2", answer(id)), "another agent");
        assert!(!reads.complete("a1", answer(id + 1)), "unknown id");
        assert!(rx.try_recv().is_err());
        assert!(reads.complete("a1", answer(id)));
        let window = rx.try_recv().unwrap().unwrap();
        assert_eq!(window.data, b"hi");
        assert_eq!(window.task_state, "RUNNING");
        assert!(!reads.complete("a1", answer(id)), "answered once");
        assert_eq!(reads.len(), 0);
    }

    #[test]
    fn the_map_is_bounded() {
        let now = Instant::now();
        let mut reads = PendingReads::default();
        let mut keep = Vec::new();
        for _ in 0..MAX_PENDING_READS {
            let (tx, rx) = oneshot::channel();
            assert!(reads.start("a1", "RUNNING", tx, now).is_some());
            keep.push(rx);
        }
        let (tx, mut rx) = oneshot::channel();
        assert_eq!(reads.start("a1", "RUNNING", tx, now), None);
        assert_eq!(rx.try_recv().unwrap(), Err(FileReadError::Busy));
        assert_eq!(reads.len(), MAX_PENDING_READS);
    }

    #[test]
    fn old_reads_time_out_and_a_gone_agent_fails_its_reads() {
        let now = Instant::now();
        let mut reads = PendingReads::default();
        let (tx1, mut rx1) = oneshot::channel();
        reads.start("a1", "RUNNING", tx1, now);
        let (tx2, mut rx2) = oneshot::channel();
        reads.start("a2", "RUNNING", tx2, now + Duration::from_secs(5));
        assert_eq!(
            reads.expire(now + READ_TIMEOUT - Duration::from_millis(1)),
            0
        );
        assert_eq!(reads.expire(now + READ_TIMEOUT), 1);
        assert_eq!(
            rx1.try_recv().unwrap(),
            Err(FileReadError::Timeout("a1".into()))
        );
        assert_eq!(reads.agent_gone("a2"), 1);
        assert_eq!(
            rx2.try_recv().unwrap(),
            Err(FileReadError::AgentGone("a2".into()))
        );
        assert_eq!(reads.len(), 0);
    }
}
