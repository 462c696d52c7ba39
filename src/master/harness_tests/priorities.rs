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
    h.state.tasks[&crate::master::state::make_task_key(&fw.id, task_id)].priority
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
            leader_term: 0,
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
    assert_eq!(h.held_for("a1"), None);
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
            leader_term: 0,
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

/// Priorities on GPUs: a whole-GPU demand above base on an agent whose two GPUs each hold a
/// base-priority slice (`gpu_milli:500`). The summed counters still say "gpu_milli 1000 free"
/// (and no task holds a `gpus` scalar), so only the device book can tell that no GPU is free and
/// which victim frees one. The plan evicts exactly one slice (the one started last) and the
/// demand stays in /state's pending list, with its reason, until it is placed.
#[test]
fn a_whole_gpu_demand_preempts_the_slices_that_free_a_device() {
    let mut h = Harness::from_yaml(
        "priorities:\n  users:\n    alice: { default: { priority: 10, quota: \"gpus:2\" } }\nmaster:\n  agent_timeout: 1h\n",
    );
    let (total, devices) =
        ringmaster_proto::devices::parse_agent_resources("cpus:8;mem:4096;gpus:2x16384").unwrap();
    let agent = h.agent_with(ringmaster_proto::RegisterAgent {
        devices: devices.iter().map(Into::into).collect(),
        ..super::super::harness::register("g1", &total.to_string())
    });
    let bob = h.framework("bob");
    // least-used (the default selection) spreads the slices: one per GPU.
    running(&mut h, &bob, agent, "s1", "cpus:1;mem:128;gpu_milli:500");
    running(&mut h, &bob, agent, "s2", "cpus:1;mem:128;gpu_milli:500");
    let bound: Vec<String> = ["s1", "s2"]
        .iter()
        .map(|t| {
            h.state.tasks[&crate::master::state::make_task_key(&bob.id, t)]
                .devices
                .to_string()
        })
        .collect();
    assert_eq!(bound, ["gpu:0:500:0", "gpu:1:500:0"]);
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:1;mem:128;gpus:1", 1);
    h.settle();
    assert_eq!(
        h.messages(agent),
        vec![Message::KillTask(KillTask {
            leader_term: 0,
            task_id: "s2".into(),
            framework_id: bob.id.clone(),
            reason: "preempted".into(),
        })]
    );
    h.expect_nothing(alice.conn);
    let pending = h.snapshot().pending;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].framework, alice.id);
    assert!(
        pending[0]
            .why
            .ends_with("waiting for preempted tasks to end on agent g1"),
        "{}",
        pending[0].why
    );
    // Still pending on later runs while the victim ends.
    h.advance_and_tick(Duration::from_secs(1));
    h.settle();
    h.expect_nothing(agent);
    assert_eq!(h.snapshot().pending.len(), 1);
    // The victim ends: its device comes back and the held agent is offered to alice.
    h.status(agent, &bob, "s2", TaskState::TaskKilled);
    h.sent(bob.conn);
    h.settle();
    let offers = h.expect_offers(&alice);
    assert_eq!(offers[0].agent_id, "g1");
    assert!(h.snapshot().pending.is_empty());
    assert_eq!(
        h.task_state(&bob, "s1"),
        Some(TaskState::TaskRunning),
        "one victim was enough"
    );
}

/// Without lower-priority slices to evict, a whole-GPU demand above base that no device can
/// hold stays pending with its reason across allocation runs.
#[test]
fn an_unplaceable_gpu_demand_stays_pending_with_its_reason() {
    let mut h = Harness::from_yaml(
        "priorities:\n  users:\n    alice: { default: { priority: 10, quota: \"gpus:2\" } }\n    carol: { default: { priority: 20, quota: \"gpus:2\" } }\nmaster:\n  agent_timeout: 1h\n",
    );
    let (total, devices) =
        ringmaster_proto::devices::parse_agent_resources("cpus:8;mem:4096;gpus:2x16384").unwrap();
    let agent = h.agent_with(ringmaster_proto::RegisterAgent {
        devices: devices.iter().map(Into::into).collect(),
        ..super::super::harness::register("g1", &total.to_string())
    });
    let carol = h.framework("carol");
    running(&mut h, &carol, agent, "c1", "cpus:1;mem:128;gpu_milli:500");
    running(&mut h, &carol, agent, "c2", "cpus:1;mem:128;gpu_milli:500");
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:1;mem:128;gpus:1", 1);
    for _ in 0..3 {
        h.settle();
        h.expect_nothing(agent);
        h.expect_nothing(alice.conn);
        let pending = h.snapshot().pending;
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].framework, alice.id);
        assert!(
            pending[0]
                .why
                .ends_with("no lower-priority victims on any agent"),
            "{}",
            pending[0].why
        );
        h.advance_and_tick(Duration::from_secs(1));
    }
}

/// An offer covers only as many copies of a GPU demand as the agent's devices hold: with one
/// of two GPUs free, an offer of the agent covers one `gpus:1` copy even though its summed
/// scalars say `gpus:2`, so the other copy stays in /state's pending list.
#[test]
fn an_offer_covers_only_the_gpu_copies_its_devices_hold() {
    let mut h = Harness::from_yaml(
        "priorities:\n  users:\n    alice: { default: { priority: 10, quota: \"gpus:2\" } }\nmaster:\n  agent_timeout: 1h\n",
    );
    let (total, devices) =
        ringmaster_proto::devices::parse_agent_resources("cpus:8;mem:4096;gpus:2x16384").unwrap();
    let agent = h.agent_with(ringmaster_proto::RegisterAgent {
        devices: devices.iter().map(Into::into).collect(),
        ..super::super::harness::register("g1", &total.to_string())
    });
    let bob = h.framework("bob");
    running(&mut h, &bob, agent, "s1", "cpus:1;mem:128;gpu_milli:500");
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:1;mem:128;gpus:1", 2);
    h.settle();
    let offers = h.expect_offers(&alice);
    assert_eq!(offers.len(), 1);
    let pending = h.snapshot().pending;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (pending[0].framework.as_str(), pending[0].count),
        (alice.id.as_str(), 1)
    );
}

/// Issue 44: a demand is served at the priority its copies run at when they are served. alice
/// (p10, quota `cpus:4`) asks for three `cpus:2` copies, carol (p5) for one, on three agents
/// that each hold one copy. alice's first two copies fill her quota at p10; her third would run
/// at base, so carol's p5 copy comes first: alice is offered two agents, carol the third
/// (before, alice's whole request was served at p10: she got all three, and carol's demand
/// then preempted the task alice ran at base).
#[test]
fn copies_over_the_quota_are_served_after_a_lower_but_above_base_priority() {
    let mut h = Harness::from_yaml(
        "priorities:\n  users:\n    alice: { default: { priority: 10, quota: \"cpus:4\" } }\n    carol: { default: { priority: 5, quota: \"cpus:8\" } }\nmaster:\n  agent_timeout: 1h\n",
    );
    for id in ["a1", "a2", "a3"] {
        h.agent(id, "cpus:2;mem:1024");
    }
    let alice = h.framework("alice");
    let carol = h.framework("carol");
    h.demand(&alice, "cpus:2;mem:64", 3);
    h.demand(&carol, "cpus:2;mem:64", 1);
    h.settle();
    let offered = |offers: Vec<ringmaster_proto::Offer>| {
        let mut agents: Vec<String> = offers.into_iter().map(|o| o.agent_id).collect();
        agents.sort();
        agents
    };
    let to_alice = offered(h.expect_offers(&alice));
    let to_carol = offered(h.expect_offers(&carol));
    assert_eq!(
        (to_alice.len(), to_carol.len()),
        (2, 1),
        "{to_alice:?} {to_carol:?}"
    );
}

/// Issue 44: "why pending" ends with the last allocation cycle's own reason, not a second text
/// the master derives: before a cycle has tried the demand there is none (it used to say "no
/// lower-priority victims on any agent" already), after it the cycle's words.
#[test]
fn why_pending_gives_the_cycles_own_reason() {
    let mut h = harness();
    h.agent("a1", "cpus:4;mem:1024");
    let alice = h.framework("alice");
    h.demand(&alice, "cpus:3;mem:2048", 1);
    let before = h.snapshot().pending[0].why.clone();
    assert_eq!(
        before,
        "no agent fits cpus:3;mem:2048: 1 agent short of mem; within priority quota in partition default: running nothing of cpus:4, task needs cpus:3;mem:2048 → priority 10"
    );
    h.settle();
    let after = h.snapshot().pending[0].why.clone();
    assert_eq!(
        after,
        format!(
            "{before}; {}",
            ringmaster_core::placement::UnservedReason::NoVictims
        )
    );
    assert!(after.ends_with("; no lower-priority victims on any agent"));
}
