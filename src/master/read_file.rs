//! `Event::ReadFile`: a window of a task's `stdout`/`stderr`, read by its agent over the
//! agent's protocol connection (`ReadFile` → `FileData`) for the operator HTTP surface
//! (`GET /files/read`, `GET /jobs/NAME/logs`). The reads in flight are kept in
//! [`super::files::PendingReads`]; this is where a request meets the task table and the agent.

use ringmaster_proto::{FileData, Message, ReadFile};
use tokio::time::Instant;

use super::files::{FileReadError, FileReply, FileRequest};
use super::state::{make_task_key, MasterState};

impl MasterState {
    /// Sends the read to the task's agent, or answers at once why it cannot be read.
    pub(crate) fn read_file(&mut self, request: FileRequest, reply: FileReply, now: Instant) {
        if let Some(owner) = &request.owner {
            if self.owners.framework(&request.framework_id) != *owner {
                let _ = reply.send(Err(FileReadError::NotOwner(owner.clone())));
                return;
            }
        }
        let key = make_task_key(&request.framework_id, &request.task_id);
        let Some(task) = self.tasks.get(&key) else {
            let _ = reply.send(Err(FileReadError::UnknownTask));
            return;
        };
        let agent_id = task.agent.to_string();
        let task_state = task.state.short_name();
        let conn = self
            .agents
            .get(&agent_id)
            .filter(|agent| !agent.lost)
            .and_then(|agent| agent.conn);
        let Some(conn) = conn else {
            let _ = reply.send(Err(FileReadError::AgentGone(agent_id)));
            return;
        };
        let Some(request_id) = self.reads.start(&agent_id, task_state, reply, now) else {
            return;
        };
        self.send(
            conn,
            Message::ReadFile(ReadFile {
                request_id,
                framework_id: request.framework_id,
                task_id: request.task_id,
                file: request.file as i32,
                offset: request.offset,
                length: request.length,
            }),
        );
    }

    /// An agent's answer to a read; ignored unless a read of that id waits for this agent.
    pub(crate) fn file_data(&mut self, agent_id: &str, answer: FileData) {
        if !self.reads.complete(agent_id, answer) {
            tracing::debug!(agent = %agent_id, "FileData for no read in flight ignored");
        }
    }
}
