//! Reading a task's output through its agent: `Event::ReadFile` → `ReadFile` to the agent →
//! its `FileData` → the answer; and every way that ends without the agent's answer.

use ringmaster_proto::{FileData, FileKind, Message, ReadFile, TaskState};
use tokio::sync::oneshot::error::TryRecvError;
use tokio::time::Duration;

use super::running;
use crate::master::files::{FileReadError, FileWindow, MAX_PENDING_READS, READ_TIMEOUT};
use crate::master::harness::{Fw, Harness};
use crate::master::ConnId;

/// A master with agent `a1` running task `t1` of a framework.
fn setup() -> (Harness, ConnId, Fw) {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    (h, agent, fw)
}

/// The one `ReadFile` the agent was sent.
fn expect_read(h: &mut Harness, agent: ConnId) -> ReadFile {
    match h.expect_one(agent) {
        Message::ReadFile(read) => read,
        other => panic!("ReadFile expected: {other:?}"),
    }
}

fn data(request_id: u64, bytes: &[u8], offset: u64, size: u64) -> Message {
    Message::FileData(FileData {
        request_id,
        data: bytes.to_vec(),
        offset,
        size,
        error: String::new(),
    })
}

#[test]
fn the_agent_answers_the_read() {
    let (mut h, agent, fw) = setup();
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stderr, 5, 100);
    let read = expect_read(&mut h, agent);
    assert_eq!(
        read,
        ReadFile {
            request_id: read.request_id,
            framework_id: fw.id.clone(),
            task_id: "t1".into(),
            file: FileKind::Stderr as i32,
            offset: 5,
            length: 100,
        }
    );
    assert_eq!(answer.try_recv(), Err(TryRecvError::Empty));
    h.send(agent, data(read.request_id, b"world", 5, 10));
    assert_eq!(
        answer.try_recv().unwrap(),
        Ok(FileWindow {
            data: b"world".to_vec(),
            offset: 5,
            size: 10,
            task_state: "RUNNING".into(),
            agent_id: "a1".into(),
        })
    );
    assert_eq!(h.state.reads.len(), 0);
    h.expect_nothing(agent);
}

#[test]
fn an_agent_error_is_the_answer() {
    let (mut h, agent, fw) = setup();
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    let read = expect_read(&mut h, agent);
    h.send(
        agent,
        Message::FileData(FileData {
            request_id: read.request_id,
            error: "not a regular file".into(),
            ..Default::default()
        }),
    );
    assert_eq!(
        answer.try_recv().unwrap(),
        Err(FileReadError::Agent("not a regular file".into()))
    );
}

#[test]
fn an_ended_task_is_read_with_its_final_state() {
    let (mut h, agent, fw) = setup();
    h.status(agent, &fw, "t1", TaskState::TaskFinished);
    let update = h.expect_update(&fw);
    h.ack(&fw, &update);
    h.sent(agent);
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    let read = expect_read(&mut h, agent);
    h.send(agent, data(read.request_id, b"done\n", 0, 5));
    let window = answer.try_recv().unwrap().unwrap();
    assert_eq!(window.task_state, "FINISHED");
}

#[test]
fn an_unknown_task_is_answered_at_once() {
    let (mut h, agent, fw) = setup();
    let mut answer = h.read_file(&fw.id, "nope", FileKind::Stdout, 0, 10);
    assert_eq!(answer.try_recv().unwrap(), Err(FileReadError::UnknownTask));
    let mut other = h.read_file("other-framework", "t1", FileKind::Stdout, 0, 10);
    assert_eq!(other.try_recv().unwrap(), Err(FileReadError::UnknownTask));
    h.expect_nothing(agent);
}

#[test]
fn a_disconnected_agent_is_not_asked() {
    let (mut h, agent, fw) = setup();
    h.disconnect(agent);
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    assert_eq!(
        answer.try_recv().unwrap(),
        Err(FileReadError::AgentGone("a1".into()))
    );
    assert_eq!(h.state.reads.len(), 0);
}

#[test]
fn a_disconnect_fails_the_reads_in_flight() {
    let (mut h, agent, fw) = setup();
    let mut first = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    let mut second = h.read_file(&fw.id, "t1", FileKind::Stderr, 0, 10);
    assert_eq!(h.messages(agent).len(), 2);
    h.disconnect(agent);
    for answer in [&mut first, &mut second] {
        assert_eq!(
            answer.try_recv().unwrap(),
            Err(FileReadError::AgentGone("a1".into()))
        );
    }
    assert_eq!(h.state.reads.len(), 0);
}

#[test]
fn a_lost_agent_fails_the_reads_in_flight() {
    let (mut h, agent, fw) = setup();
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    expect_read(&mut h, agent);
    // No heartbeat for agent_timeout: the agent is lost (its connection closed by the master).
    let timeout = h.config().master.agent_timeout;
    h.advance_and_tick(timeout);
    assert_eq!(
        answer.try_recv().unwrap(),
        Err(FileReadError::AgentGone("a1".into()))
    );
}

#[test]
fn reads_beyond_the_cap_are_refused() {
    let (mut h, agent, fw) = setup();
    let mut waiting = Vec::new();
    for _ in 0..MAX_PENDING_READS {
        waiting.push(h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10));
    }
    assert_eq!(h.messages(agent).len(), MAX_PENDING_READS);
    let mut refused = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    assert_eq!(refused.try_recv().unwrap(), Err(FileReadError::Busy));
    h.expect_nothing(agent);
    assert_eq!(waiting[0].try_recv(), Err(TryRecvError::Empty));
}

#[test]
fn stale_and_foreign_answers_are_ignored() {
    let mut h = Harness::new();
    let a1 = h.agent("a1", "cpus:4;mem:1024");
    let a2 = h.agent("a2", "cpus:1;mem:64");
    let fw = h.framework("web");
    running(&mut h, &fw, a1, "t1", "cpus:2;mem:512");
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    let read = expect_read(&mut h, a1);
    // Another agent answering this read, and an id no read has, change nothing.
    h.send(a2, data(read.request_id, b"forged", 0, 6));
    h.send(a1, data(read.request_id + 100, b"stale", 0, 5));
    assert_eq!(answer.try_recv(), Err(TryRecvError::Empty));
    h.expect_nothing(a1);
    h.expect_nothing(a2);
    h.send(a1, data(read.request_id, b"real", 0, 4));
    assert_eq!(answer.try_recv().unwrap().unwrap().data, b"real");
    // A late copy of the same answer is ignored too.
    h.send(a1, data(read.request_id, b"again", 0, 5));
    h.expect_nothing(a1);
}

#[test]
fn an_unanswered_read_times_out_on_the_tick() {
    let (mut h, agent, fw) = setup();
    let mut answer = h.read_file(&fw.id, "t1", FileKind::Stdout, 0, 10);
    let read = expect_read(&mut h, agent);
    // Keep the agent alive meanwhile; only the read is late.
    h.advance(READ_TIMEOUT - Duration::from_millis(1));
    h.send(agent, Message::AgentHeartbeat(Default::default()));
    h.tick();
    assert_eq!(answer.try_recv(), Err(TryRecvError::Empty));
    h.advance_and_tick(Duration::from_millis(1));
    assert_eq!(
        answer.try_recv().unwrap(),
        Err(FileReadError::Timeout("a1".into()))
    );
    // The answer that comes after the timeout finds nothing to complete.
    h.send(agent, data(read.request_id, b"late", 0, 4));
    assert_eq!(h.state.reads.len(), 0);
}

/// `GET /files/read` by a framework's principal (not an operator, issue 45): its own
/// framework's task is read through its agent; another principal's framework's task is refused
/// at once (`NotOwner`, 403), and nothing is asked of the agent.
#[test]
fn a_tenant_reads_only_its_own_frameworks_tasks() {
    use crate::security::{AllowedUsers, AuthConfig, PrincipalGrant};
    let grant = || {
        PrincipalGrant::new(
            b"secret".to_vec(),
            [ringmaster_proto::security::AuthRole::Framework].into(),
            AllowedUsers::Any,
        )
    };
    let mut h = Harness::configured(|c| {
        c.auth = AuthConfig {
            required: false,
            principals: [
                ("spark".to_string(), grant()),
                ("other".to_string(), grant()),
            ]
            .into(),
        }
    });
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let subscribe = |name: &str| ringmaster_proto::Subscribe {
        name: name.into(),
        user: "nobody".into(),
        ..Default::default()
    };
    let spark = h.framework_as(subscribe("spark"), Some("spark"));
    let other = h.framework_as(subscribe("other"), Some("other"));
    running(&mut h, &spark, agent, "t1", "cpus:1;mem:128");
    running(&mut h, &other, agent, "t2", "cpus:1;mem:128");

    let mut refused = h.read_file_as(&other.id, "t2", FileKind::Stdout, 0, 10, Some("spark"));
    assert!(matches!(
        refused.try_recv(),
        Ok(Err(FileReadError::NotOwner(p))) if p == "spark"
    ));
    h.expect_nothing(agent);
    let mut own = h.read_file_as(&spark.id, "t1", FileKind::Stdout, 0, 10, Some("spark"));
    let read = expect_read(&mut h, agent);
    assert_eq!(read.task_id, "t1");
    h.send(agent, data(read.request_id, b"out", 0, 3));
    assert!(matches!(own.try_recv(), Ok(Ok(FileWindow { .. }))));
}
