//! Priorities, priority quotas and preemption (docs/priorities.md).

use ringmaster_proto::{KillTask, Message, TaskInfo, TaskState};
use tokio::time::Duration;

use super::super::harness::{task, Fw, Harness};
use super::{running, status, update};

/// alice has priority 10 with quota `cpus:4` and dave priority 10 with quota `cpus:8` in the
/// default partition; everyone else runs at base (0). Agents send no heartbeats in these tests:
/// agent_timeout is long.
fn harness() -> Harness {
    let h = Harness::from_yaml(
        "priorities:\n  users:\n    alice: { default: { priority: 10, quota: \"cpus:4\" } }\n    dave: { default: { priority: 10, quota: \"cpus:8\" } }\nmaster:\n  agent_timeout: 1h\n",
    );
    assert_eq!(h.config().priorities.base(), 0);
    h
}

fn priority_of(h: &Harness, fw: &Fw, task_id: &str) -> i64 {
    h.state.tasks[&(fw.id.clone(), task_id.to_string())].priority
}

#[test]
fn a_task_gets_its_users_priority_while_it_fits_the_quota() {
    let mut h = harness();
    h.agent("a1", "cpus:16;mem:4096");
    let alice = h.framework("alice");
    let offer = h.offer_for(&alice, "cpus:1;mem:64");
    h.accept(
        &alice,
        &offer.offer_id,
        vec![
            task("t1", "cpus:3;mem:64"),
            // 3 of 4 used: another 3 does not fit → base.
            task("t2", "cpus:3;mem:64"),
            TaskInfo {
                priority_class: "base".into(),
                ..task("t3", "cpus:1;mem:64")
            },
            // Still 1 left of the quota (t3 did not use it).
            task("t4", "cpus:1;mem:64"),
        ],
    );
    let got: Vec<i64> = ["t1", "t2", "t3", "t4"]
        .iter()
        .map(|t| priority_of(&h, &alice, t))
        .collect();
    assert_eq!(got, vec![10, 0, 0, 10]);
    let views: Vec<Option<i64>> = h.snapshot().tasks.iter().map(|t| t.priority).collect();
    assert_eq!(views, vec![Some(10), Some(0), Some(0), Some(10)]);
}

#[test]
fn a_higher_priority_demand_is_served_first() {
    let mut h = harness();
    h.agent("a1", "cpus:4;mem:1024");
    let bob = h.framework("bob");
    let alice = h.framework("alice");
    h.demand(&bob, "cpus:4;mem:128", 1);
    h.demand(&alice, "cpus:4;mem:128", 1);
    h.settle();
    assert_eq!(h.expect_offers(&alice)[0].agent_id, "a1");
    h.expect_nothing(bob.conn);
}

#[test]
fn a_higher_priority_demand_that_fits_nowhere_preempts_a_lower_priority_task() {
    let mut h = harness();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let bob = h.framework("bob");
    running(&mut h, &bob, agent, "t1", "cpus:4;mem:1024");
    assert_eq!(priority_of(&h, &bob, "t1"), 0);
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:2;mem:256", 1);
    h.settle();
    assert_eq!(
        h.messages(agent),
        vec![Message::KillTask(KillTask {
            task_id: "t1".into(),
            framework_id: bob.id.clone(),
            reason: "preempted".into(),
        })]
    );
    h.expect_nothing(alice.conn);
    let snap = h.snapshot();
    assert_eq!(snap.counters.preemptions, 1);
    assert_eq!(
        snap.pending[0].why,
        "no agent fits cpus:2;mem:256: 1 agent short of cpus, 1 short of mem; waiting for preempted tasks to end on agent a1"
    );
    // Another run does not preempt again while the victim ends.
    h.demand(&alice, "cpus:2;mem:256", 1);
    h.settle();
    h.expect_nothing(agent);
}

#[test]
fn a_preempted_task_ends_killed_preempted_whatever_the_agent_reports_and_the_room_is_offered() {
    let mut h = harness();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let bob = h.framework("bob");
    running(&mut h, &bob, agent, "t1", "cpus:4;mem:1024");
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:2;mem:256", 1);
    h.settle();
    h.sent(agent);
    // The process dies of the signal: the agent says FAILED.
    h.status(agent, &bob, "t1", TaskState::TaskFailed);
    assert_eq!(
        h.sent(bob.conn),
        vec![update(status(
            &h,
            &bob,
            "t1",
            "a1",
            TaskState::TaskKilled,
            "preempted",
            "",
            "0-U3"
        ))]
    );
    h.settle();
    let offers = h.expect_offers(&alice);
    assert_eq!(offers[0].agent_id, "a1");
    assert!(h.state.agents["a1"].held_for.is_none());
}

#[test]
fn only_strictly_lower_priority_tasks_are_victims() {
    let mut h = harness();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let alice = h.framework("alice");
    running(&mut h, &alice, agent, "a-task", "cpus:2;mem:128");
    let bob = h.framework("bob");
    running(&mut h, &bob, agent, "b-task", "cpus:2;mem:128");
    let dave = h.framework("dave");
    h.demand(&dave, "cpus:2;mem:128", 1);
    h.settle();
    assert_eq!(
        h.messages(agent),
        vec![Message::KillTask(KillTask {
            task_id: "b-task".into(),
            framework_id: bob.id.clone(),
            reason: "preempted".into(),
        })]
    );
    // With only equal-priority tasks left, nothing more is preempted.
    h.status(agent, &bob, "b-task", TaskState::TaskKilled);
    h.settle();
    h.sent(agent);
    h.expect_offers(&dave);
    h.demand(&dave, "cpus:4;mem:128", 1);
    h.advance_and_tick(Duration::from_secs(11));
    h.settle();
    h.expect_nothing(agent);
}

#[test]
fn a_base_priority_demand_never_preempts() {
    let mut h = harness();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let bob = h.framework("bob");
    running(&mut h, &bob, agent, "t1", "cpus:4;mem:1024");
    // cpus:5 is over alice's quota of cpus:4: base priority.
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:5;mem:128", 1);
    h.settle();
    h.expect_nothing(agent);
    h.expect_nothing(alice.conn);
    assert_eq!(h.snapshot().counters.preemptions, 0);
    assert_eq!(
        h.snapshot().pending[0].why,
        "no agent fits cpus:5;mem:128: 1 agent short of cpus, 1 short of mem; over priority quota in partition default: running nothing of cpus:4, task needs cpus:5 → base priority; base-priority demands never preempt"
    );
}

#[test]
fn the_freed_agent_is_held_for_the_preemptor_for_offer_timeout_only() {
    let mut h = harness();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let bob = h.framework("bob");
    running(&mut h, &bob, agent, "t1", "cpus:4;mem:1024");
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:2;mem:256", 1);
    h.settle();
    h.sent(agent);
    // alice changes her mind; carol (base) wants the room.
    h.demand(&alice, "cpus:2;mem:256", 0);
    let carol = h.framework("carol");
    h.demand(&carol, "cpus:1;mem:128", 1);
    h.status(agent, &bob, "t1", TaskState::TaskKilled);
    h.settle();
    h.expect_nothing(carol.conn);
    // The hold lasts offer_timeout (10 s) from the preemption; the actor keeps ticking.
    h.run_for(Duration::from_secs(10) - Duration::from_millis(100));
    assert!(h.allocation_due().is_none());
    h.expect_nothing(carol.conn);
    // The tick that ends the hold asks for the allocation run that offers the room.
    h.run_for(Duration::from_secs(1));
    let offers = h.expect_offers(&carol);
    assert_eq!(offers[0].agent_id, "a1");
}
