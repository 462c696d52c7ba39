//! The "trustworthy master" issue: one agent cannot stop allocation, ended tasks neither leak
//! nor vanish before their framework acknowledged them, agent updates are never acknowledged
//! unapplied, and removed agents and frameworks are remembered within bounds.

use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    AgentHeartbeat, ErrorCode, Message, StatusAck, StatusUpdate, Subscribe, TaskState, TaskStatus,
};
use tokio::time::Duration;

use super::super::harness::{error, register, Fw, Harness};
use super::super::ConnId;
use super::running;

/// The largest amount there is: `u64::MAX` thousandths of a cpu.
const HUGE_CPUS: &str = "cpus:18446744073709551.615;mem:1024";

fn heartbeat(h: &mut Harness, agent: ConnId) {
    h.send(agent, Message::AgentHeartbeat(AgentHeartbeat::default()));
}

#[test]
fn a_huge_agent_coming_and_going_does_not_stop_offers_to_the_others() {
    // No per-agent limit: only the cluster sums stand between this agent and the others.
    let mut h = Harness::configured(|c| c.master.max_agent_resources = Resources::new());
    let a1 = h.agent("a1", "cpus:4;mem:1024");
    h.advance(Duration::from_secs(10));
    let huge = h.agent("huge", HUGE_CPUS);
    assert_eq!(h.snapshot().total, "cpus:18446744073709551.615;mem:2048");
    // The huge agent goes silent and is lost; a1 keeps heartbeating.
    h.disconnect(huge);
    h.advance(Duration::from_secs(10));
    heartbeat(&mut h, a1);
    h.advance_and_tick(Duration::from_secs(6));
    assert!(h.state.agents["huge"].lost && !h.state.agents["a1"].lost);
    assert_eq!(h.snapshot().total, "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    assert_eq!(offer.agent_id, "a1");
    // And it keeps flowing: launch, then another demand is offered the rest.
    h.demand(&fw, "cpus:1;mem:128", 0);
    h.accept(
        &fw,
        &offer.offer_id,
        vec![super::super::harness::task("t1", "cpus:1;mem:128")],
    );
    h.sent(fw.conn);
    let next = h.offer_for(&fw, "cpus:1;mem:128");
    assert_eq!(next.agent_id, "a1");
}

#[test]
fn an_agent_above_max_agent_resources_is_refused_naming_the_resource_and_limit() {
    let mut h = Harness::new();
    let conn = h.connect(Message::RegisterAgent(register("huge", HUGE_CPUS)));
    assert_eq!(
        h.expect_closed(conn),
        error(
            ErrorCode::AgentRefused,
            "RegisterAgent: `cpus` 18446744073709551.615 is above the limit 4096 of master.max_agent_resources"
        )
    );
    assert!(h.state.agents.is_empty());
    assert_eq!(h.snapshot().total, "");
    // At the limit is fine; a configured limit is honoured.
    h.agent("big", "cpus:4096;mem:1024");
    let mut h = Harness::configured(|c| {
        c.master.max_agent_resources = Resources::parse("mem:512").unwrap()
    });
    let conn = h.connect(Message::RegisterAgent(register(
        "a1",
        "cpus:100000;mem:1024",
    )));
    assert_eq!(
        h.expect_closed(conn),
        error(
            ErrorCode::AgentRefused,
            "RegisterAgent: `mem` 1024 is above the limit 512 of master.max_agent_resources"
        )
    );
}

/// Runs `task_id` on `agent`, then the agent reports it FINISHED; returns the terminal update
/// the framework received (not acknowledged).
fn finished(h: &mut Harness, fw: &Fw, agent: ConnId, task_id: &str) -> TaskStatus {
    running(h, fw, agent, task_id, "cpus:1;mem:16");
    h.status(agent, fw, task_id, TaskState::TaskFinished);
    h.sent(agent);
    let update = h.expect_update(fw);
    assert_eq!(update.state(), TaskState::TaskFinished, "{update:?}");
    update
}

#[test]
fn an_unacknowledged_terminal_task_is_kept_and_resent_until_acknowledged() {
    let mut h = Harness::configured(|c| c.master.max_completed_tasks_per_framework = 2);
    let agent = h.agent("a1", "cpus:64;mem:4096");
    let fw = h.framework("web");
    let t0 = finished(&mut h, &fw, agent, "t0");
    // Many more tasks end and are acknowledged: t0 is not pushed out.
    for i in 1..=4 {
        let done = finished(&mut h, &fw, agent, &format!("t{i}"));
        h.ack(&fw, &done);
    }
    assert_eq!(h.task_state(&fw, "t0"), Some(TaskState::TaskFinished));
    assert!(h.state.tasks[&crate::master::state::make_task_key(&fw.id, "t0")].terminal_unacked);
    // Still re-sent on the retry timer...
    h.advance_and_tick(Duration::from_secs(2));
    assert_eq!(h.expect_update(&fw), t0);
    // ...and after the framework reconnects.
    h.disconnect(fw.conn);
    let conn = h.connect(Message::Subscribe(Subscribe {
        framework_id: fw.id.clone(),
        ..super::super::harness::subscribe("web")
    }));
    match h.messages(conn).as_slice() {
        [Message::Subscribed(_), Message::Update(u)] => assert_eq!(u.status.as_ref(), Some(&t0)),
        other => panic!("Subscribed and the update expected: {other:?}"),
    }
    let fw = Fw { conn, id: fw.id };
    // Acknowledged: it joins the completed list, whose oldest member (t3) is forgotten.
    h.ack(&fw, &t0);
    assert_eq!(h.task_state(&fw, "t0"), Some(TaskState::TaskFinished));
    assert_eq!(h.task_state(&fw, "t3"), None);
    assert_eq!(h.task_state(&fw, "t4"), Some(TaskState::TaskFinished));
    let list: Vec<&str> = h.state.finished[&fw.id]
        .iter()
        .map(|id| id.as_str())
        .collect();
    assert_eq!(list, ["t4", "t0"]);
    h.advance_and_tick(Duration::from_secs(10));
    h.expect_nothing(fw.conn);
}

#[test]
fn completed_tasks_are_bounded_per_framework() {
    let mut h = Harness::configured(|c| c.master.max_completed_tasks_per_framework = 3);
    let agent = h.agent("a1", "cpus:64;mem:4096");
    let web = h.framework("web");
    let batch = h.framework("batch");
    for i in 0..5 {
        let done = finished(&mut h, &web, agent, &format!("w{i}"));
        h.ack(&web, &done);
    }
    let done = finished(&mut h, &batch, agent, "b0");
    h.ack(&batch, &done);
    let known = |h: &Harness, fw: &Fw, id: &str| h.task_state(fw, id).is_some();
    assert!(!known(&h, &web, "w0") && !known(&h, &web, "w1"));
    assert!(known(&h, &web, "w2") && known(&h, &web, "w3") && known(&h, &web, "w4"));
    // Another framework's list is its own.
    assert!(known(&h, &batch, "b0"));
    assert_eq!(h.state.finished[&web.id].len(), 3);
    assert_eq!(h.state.tasks.len(), 4);
}

#[test]
fn a_status_update_without_framework_id_is_resolved_from_the_task_id() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    h.send(
        agent,
        Message::StatusUpdate(StatusUpdate {
            status: Some(TaskStatus {
                task_id: "t1".into(),
                state: TaskState::TaskFinished as i32,
                update_id: "u-1".into(),
                ..Default::default()
            }),
        }),
    );
    assert_eq!(
        h.messages(agent),
        vec![Message::StatusAck(StatusAck {
            task_id: "t1".into(),
            update_id: "u-1".into(),
        })]
    );
    assert_eq!(h.expect_update(&fw).state(), TaskState::TaskFinished);
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskFinished));
}

#[test]
fn a_status_update_without_framework_id_for_an_unknown_task_is_refused_not_acked() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let web = h.framework("web");
    let batch = h.framework("batch");
    // The same task id in two frameworks on this agent: ambiguous.
    running(&mut h, &web, agent, "t1", "cpus:1;mem:128");
    running(&mut h, &batch, agent, "t1", "cpus:1;mem:128");
    for task_id in ["nope", "t1"] {
        h.send(
            agent,
            Message::StatusUpdate(StatusUpdate {
                status: Some(TaskStatus {
                    task_id: task_id.into(),
                    state: TaskState::TaskFinished as i32,
                    update_id: "u-1".into(),
                    ..Default::default()
                }),
            }),
        );
        let e = h.expect_error(agent);
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert!(
            e.message.contains("has no framework_id") && e.message.contains("not acknowledged"),
            "{e:?}"
        );
    }
    assert_eq!(h.task_state(&web, "t1"), Some(TaskState::TaskRunning));
    assert_eq!(h.task_state(&batch, "t1"), Some(TaskState::TaskRunning));
    h.expect_nothing(web.conn);
}

#[test]
fn lost_agents_are_remembered_up_to_max_removed_agents() {
    let mut h = Harness::configured(|c| c.master.max_removed_agents = 1);
    let a1 = h.agent("a1", "cpus:1;mem:64");
    h.advance(Duration::from_secs(5));
    let a2 = h.agent("a2", "cpus:1;mem:64");
    h.advance(Duration::from_secs(5));
    let a3 = h.agent("a3", "cpus:1;mem:64");
    h.disconnect(a1);
    h.disconnect(a2);
    h.advance_and_tick(Duration::from_secs(5)); // a1 lost
    assert!(h.state.agents["a1"].lost);
    h.advance_and_tick(Duration::from_secs(5)); // a2 lost: a1 forgotten
    assert!(h.state.agents["a2"].lost);
    assert!(!h.state.agents.contains_key("a1"));
    heartbeat(&mut h, a3);
    h.advance_and_tick(Duration::from_secs(5));
    assert!(!h.state.agents["a3"].lost);
    // A forgotten agent may come back: it registers as new.
    h.agent("a1", "cpus:1;mem:64");
    assert!(!h.state.agents["a1"].lost);
    assert_eq!(h.state.agents.len(), 3);
}

#[test]
fn removed_frameworks_are_remembered_up_to_max_removed_frameworks() {
    let mut h = Harness::configured(|c| {
        c.master.max_removed_frameworks = 1;
        c.master.max_completed_tasks_per_framework = 10;
    });
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let f1 = h.framework("one");
    let done = finished(&mut h, &f1, agent, "t1");
    h.ack(&f1, &done);
    h.send(f1.conn, Message::Teardown(Default::default()));
    assert!(h.state.removed_frameworks.contains(&f1.id));
    assert!(
        h.task_state(&f1, "t1").is_some(),
        "kept with the removed framework"
    );
    // The second removal (by failover timeout) pushes the first out, with its tasks.
    let f2 = h.framework("two");
    h.disconnect(f2.conn);
    heartbeat(&mut h, agent);
    h.advance_and_tick(Duration::from_secs(61));
    assert!(!h.state.frameworks.contains_key(&f2.id));
    assert!(h.state.removed_frameworks.contains(&f2.id));
    assert!(!h.state.removed_frameworks.contains(&f1.id));
    assert_eq!(h.task_state(&f1, "t1"), None);
    assert!(!h.state.finished.contains_key(&f1.id));
}

fn one_completed(c: &mut crate::config::Config) {
    c.master.max_completed_tasks_per_framework = 1;
}

/// The task ids the registry holds, sorted.
fn stored_tasks(h: &Harness) -> Vec<String> {
    let registry = h.state.registry().expect("a registry");
    let mut ids: Vec<String> = registry
        .load()
        .unwrap()
        .tasks
        .into_iter()
        .map(|t| t.task_id)
        .collect();
    ids.sort();
    ids
}

#[test]
fn the_registry_forgets_dropped_completed_tasks_and_keeps_unacknowledged_ones_across_a_restart() {
    use super::super::registry::Registry;
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::configured(one_completed);
    h.attach_registry(Registry::open(dir.path()).unwrap());
    let agent = h.agent("a1", "cpus:8;mem:1024");
    let fw = h.framework("web");
    for task_id in ["t1", "t2"] {
        let done = finished(&mut h, &fw, agent, task_id);
        h.ack(&fw, &done);
    }
    let t3 = finished(&mut h, &fw, agent, "t3");
    // t1 was pushed out of the completed list, from memory and from the registry; t3 is kept
    // (unacknowledged) beside t2 (the completed list).
    assert_eq!(stored_tasks(&h), ["t2", "t3"]);
    assert_eq!(h.task_state(&fw, "t1"), None);
    drop(h);

    // A master restarted on the same registry tells the framework again when it comes back.
    let mut h = Harness::configured(one_completed);
    h.attach_registry(Registry::open(dir.path()).unwrap());
    let conn = h.connect(Message::Subscribe(Subscribe {
        framework_id: fw.id.clone(),
        ..super::super::harness::subscribe("web")
    }));
    let retold = match h.messages(conn).as_slice() {
        [Message::Subscribed(_), Message::Update(u)] => u.status.clone().unwrap(),
        other => panic!("Subscribed and the terminal update expected: {other:?}"),
    };
    assert_eq!(
        (retold.task_id.as_str(), retold.state()),
        ("t3", TaskState::TaskFinished)
    );
    assert_eq!(t3.task_id, retold.task_id);
    let fw = Fw { conn, id: fw.id };
    h.ack(&fw, &retold);
    // Acknowledged: t3 is the completed task now, and t2 is gone.
    assert_eq!(stored_tasks(&h), ["t3"]);
    assert_eq!(h.task_state(&fw, "t2"), None);
}

#[test]
fn a_framework_behind_on_acknowledgements_gets_no_offers_until_it_catches_up() {
    let mut h = Harness::configured(|c| c.master.max_unacked_updates = 2);
    let agent = h.agent("a1", "cpus:8;mem:4096");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.launch(&fw, "t2", "cpus:1;mem:128");
    // Two RUNNING updates the framework does not acknowledge.
    h.status(agent, &fw, "t1", TaskState::TaskRunning);
    h.status(agent, &fw, "t2", TaskState::TaskRunning);
    let updates = h.expect_updates(&fw);
    assert_eq!(updates.len(), 2);
    h.demand(&fw, "cpus:1;mem:128", 1);
    h.settle();
    h.expect_nothing(fw.conn);
    let pending = h.state.pending_frameworks(h.now());
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(
        pending[0].why.starts_with(
            "not offered: 2 status updates sent to the framework are not acknowledged"
        ),
        "{}",
        pending[0].why
    );
    // One acknowledgement brings it under the bound: the demand is offered at once.
    h.ack(&fw, &updates[0]);
    h.settle();
    assert_eq!(h.expect_offers(&fw).len(), 1);
}

#[test]
fn max_unacked_updates_zero_means_no_bound() {
    let mut h = Harness::configured(|c| c.master.max_unacked_updates = 0);
    let agent = h.agent("a1", "cpus:8;mem:4096");
    let fw = h.framework("web");
    for i in 0..3 {
        h.launch(&fw, &format!("t{i}"), "cpus:1;mem:128");
    }
    for i in 0..3 {
        h.status(agent, &fw, &format!("t{i}"), TaskState::TaskRunning);
    }
    assert_eq!(h.expect_updates(&fw).len(), 3);
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    assert_eq!(offer.agent_id, "a1");
}
