//! Health: a RUNNING update whose health changed is recorded, passed on and shown in /state.

use ringmaster_proto::{
    Message, Reconcile, StatusUpdate, TaskHealth, TaskState, TaskStatus, Update,
};

use super::super::harness::{register, Harness};
use super::running;

fn health_update(h: &mut Harness, agent: super::ConnId, fw_id: &str, health: TaskHealth, n: u32) {
    h.send(
        agent,
        Message::StatusUpdate(StatusUpdate {
            status: Some(TaskStatus {
                task_id: "t1".into(),
                framework_id: fw_id.into(),
                state: TaskState::TaskRunning as i32,
                message: if health == TaskHealth::Unhealthy {
                    "health check failed 3 times: no such file".into()
                } else {
                    String::new()
                },
                update_id: format!("health-{n}"),
                health: health as i32,
                ..Default::default()
            }),
        }),
    );
}

#[test]
fn a_running_update_with_a_new_health_is_recorded_and_shown() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    assert_eq!(h.snapshot().tasks[0].healthy, None);
    let json = serde_json::to_value(h.snapshot()).unwrap();
    assert!(json["tasks"][0].get("healthy").is_none(), "{json}");

    health_update(&mut h, agent, &fw.id, TaskHealth::Healthy, 1);
    let update = h.expect_update(&fw);
    assert_eq!(update.state(), TaskState::TaskRunning);
    assert_eq!(update.health(), TaskHealth::Healthy);
    h.ack(&fw, &update);
    assert_eq!(h.snapshot().tasks[0].healthy, Some(true));

    // The same health again is not news: nothing goes to the framework.
    health_update(&mut h, agent, &fw.id, TaskHealth::Healthy, 2);
    h.sent(agent);
    h.expect_nothing(fw.conn);

    health_update(&mut h, agent, &fw.id, TaskHealth::Unhealthy, 3);
    let update = h.expect_update(&fw);
    assert_eq!(update.state(), TaskState::TaskRunning);
    assert_eq!(update.health(), TaskHealth::Unhealthy);
    assert!(update.message.starts_with("health check failed 3 times"));
    h.ack(&fw, &update);
    let snapshot = h.snapshot();
    assert_eq!(snapshot.tasks[0].healthy, Some(false));
    let json = serde_json::to_value(&snapshot).unwrap();
    assert_eq!(json["tasks"][0]["healthy"], false, "{json}");
}

#[test]
fn a_reregistering_agent_tells_the_health_and_reconciliation_carries_it() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, old, "t1", "cpus:1;mem:128");
    h.disconnect(old);
    let mut again = register("a1", "cpus:4;mem:1024");
    again.tasks = vec![TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        state: TaskState::TaskRunning as i32,
        health: TaskHealth::Healthy as i32,
        ..Default::default()
    }];
    let new = h.connect(Message::RegisterAgent(again));
    h.sent(new);
    assert_eq!(h.snapshot().tasks[0].healthy, Some(true));
    h.sent(fw.conn);
    h.send(fw.conn, Message::Reconcile(Reconcile { task_ids: vec![] }));
    let answers = h.messages(fw.conn);
    match answers.as_slice() {
        [Message::Update(Update {
            status: Some(status),
        })] => assert_eq!(status.health(), TaskHealth::Healthy),
        other => panic!("one reconciliation answer expected: {other:?}"),
    }
}

/// A master that restarted (or a new leader) does not know its tasks' health (it is not in the
/// registry): a framework that reconciled before the agent came back heard "unknown". When the
/// agent re-registers with the health, the framework is told (before, the health was recorded
/// silently and the jobs framework showed HEALTH `–` for good).
#[test]
fn a_health_learned_from_a_reregistering_agent_is_passed_on() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, old, "t1", "cpus:1;mem:128");
    h.disconnect(old);
    h.sent(fw.conn);
    let mut again = register("a1", "cpus:4;mem:1024");
    again.tasks = vec![TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        state: TaskState::TaskRunning as i32,
        health: TaskHealth::Healthy as i32,
        ..Default::default()
    }];
    let new = h.connect(Message::RegisterAgent(again));
    h.sent(new);
    let updates: Vec<TaskStatus> = h
        .messages(fw.conn)
        .into_iter()
        .filter_map(|m| match m {
            Message::Update(Update { status }) => status,
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].task_id, "t1");
    assert_eq!(updates[0].state(), TaskState::TaskRunning);
    assert_eq!(updates[0].health(), TaskHealth::Healthy);
}
