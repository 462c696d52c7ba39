//! Tests of the master's conversations, driven through [`super::harness::Harness`]: each
//! asserts the exact messages the master sends and the state it ends in.

mod agents;
mod batch;
mod files;
mod frameworks;
mod full_disk;
mod health;
mod jobs_store;
mod liveness;
mod offers;
mod priorities;
mod robust;
mod task_users;
mod tasks;
mod usage;

use ringmaster_proto::{Message, TaskState, TaskStatus, Update};

use super::harness::{Fw, Harness, Out};
use super::ConnId;

/// The agent registered on `agent` runs `task_id` for `fw`: launched, reported RUNNING by the
/// agent, every update acknowledged and every message read.
fn running(h: &mut Harness, fw: &Fw, agent: ConnId, task_id: &str, resources: &str) {
    h.launch(fw, task_id, resources);
    h.status(agent, fw, task_id, TaskState::TaskRunning);
    let update = h.expect_update(fw);
    assert_eq!(update.state(), TaskState::TaskRunning, "{update:?}");
    h.ack(fw, &update);
    h.sent(agent);
}

/// The status the master tells a framework: no exit code, no devices, stamped now.
#[allow(clippy::too_many_arguments)]
fn status(
    h: &Harness,
    fw: &Fw,
    task_id: &str,
    agent: &str,
    state: TaskState,
    reason: &str,
    message: &str,
    update_id: &str,
) -> TaskStatus {
    TaskStatus {
        task_id: task_id.into(),
        framework_id: fw.id.clone(),
        agent_id: agent.into(),
        state: state as i32,
        reason: reason.into(),
        message: message.into(),
        exit_code: None,
        update_id: update_id.into(),
        timestamp_ms: h.unix_ms(),
        devices: Vec::new(),
        health: 0,
    }
}

/// `Out` of an `Update` carrying `status`.
fn update(status: TaskStatus) -> Out {
    Out::Msg(Message::Update(Update {
        status: Some(status),
    }))
}
