//! The offer cycle: demand, offers, accept (and its validation), decline with refuse filters,
//! rescinds, offer timeout, suppress and revive.

use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{
    Decline, ErrorCode, Message, Offer, Placement, Rescind, Revive, RunTasks, Suppress, TaskInfo,
    TaskState,
};
use tokio::time::Duration;

use super::super::harness::{error, res, task, Harness, Out};
use super::{status, update};

#[test]
fn a_demand_gets_an_offer_of_the_agents_whole_free_resources() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.demand(&fw, "cpus:1;mem:128", 1);
    // Batched: nothing before allocation_interval.
    h.expect_nothing(fw.conn);
    assert_eq!(h.settle(), 1);
    assert_eq!(h.elapsed(), Duration::from_millis(20));
    assert_eq!(
        h.expect_offers(&fw),
        vec![Offer {
            offer_id: "0-O2".into(),
            framework_id: fw.id.clone(),
            agent_id: "a1".into(),
            hostname: "a1".into(),
            resources: Some(res("cpus:4;mem:1024").to_wire()),
            placement: Some(Placement {
                placer: "ring".into(),
                phase: "down".into(),
                bucket: 4,
                dimension: "cpus".into(),
            }),
            ..Offer::default()
        }]
    );
    let snap = h.snapshot();
    assert_eq!(
        (snap.offered.as_str(), snap.free.as_str()),
        ("cpus:4;mem:1024", "")
    );
    assert_eq!(snap.counters.offers_made, 1);
}

#[test]
fn no_demand_no_offer() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.settle();
    h.expect_nothing(fw.conn);
    assert!(h.snapshot().offers.is_empty());
}

#[test]
fn the_offer_is_on_an_agent_the_demand_fits() {
    let mut h = Harness::new();
    h.agent("small", "cpus:1;mem:256");
    h.agent("big", "cpus:8;mem:4096");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:4;mem:512");
    assert_eq!(offer.agent_id, "big");
    assert_eq!(offer.resources, Some(res("cpus:8;mem:4096").to_wire()));
}

#[test]
fn a_demand_that_fits_no_agent_is_pending_with_why() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:2;mem:1024");
    let fw = h.framework("web");
    h.demand(&fw, "cpus:4;mem:128", 1);
    h.settle();
    h.expect_nothing(fw.conn);
    let pending = h.snapshot().pending;
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (
            pending[0].framework.as_str(),
            pending[0].count,
            pending[0].unserved_last_run
        ),
        (fw.id.as_str(), 1, true)
    );
    assert_eq!(
        pending[0].why,
        "no agent fits cpus:4;mem:128: 1 agent short of cpus"
    );
}

#[test]
fn accept_sends_the_task_to_the_agent_and_staging_to_the_framework() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.accept(&fw, &offer.offer_id, vec![task("t1", "cpus:1;mem:128")]);
    assert_eq!(
        h.messages(agent),
        vec![Message::RunTasks(RunTasks {
            leader_term: 0,
            tasks: vec![TaskInfo {
                framework_id: fw.id.clone(),
                agent_id: "a1".into(),
                ..task("t1", "cpus:1;mem:128")
            }],
        })]
    );
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskStaging,
            "",
            "",
            "0-U1"
        ))]
    );
    let snap = h.snapshot();
    assert_eq!(snap.used, "cpus:1;mem:128");
    assert!(snap.offers.is_empty());
    assert_eq!(
        (snap.counters.offers_accepted, snap.counters.tasks_launched),
        (1, 1)
    );
    // What the task leaves returns at once: the demand (still 1) is offered the rest.
    h.settle();
    let again = h.expect_offers(&fw);
    assert_eq!(again[0].resources, Some(res("cpus:3;mem:896").to_wire()));
}

#[test]
fn accepting_an_unknown_offer_is_invalid_offer() {
    let mut h = Harness::new();
    let fw = h.framework("web");
    h.accept(&fw, "nope", vec![task("t1", "cpus:1")]);
    assert_eq!(
        h.expect_error(fw.conn),
        error(
            ErrorCode::InvalidOffer,
            "Accept: unknown or expired offer nope; nothing launched"
        )
    );
}

#[test]
fn accepting_another_frameworks_offer_is_invalid_offer_and_keeps_the_offer() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let owner = h.framework("web");
    let thief = h.framework("thief");
    let offer = h.offer_for(&owner, "cpus:1;mem:128");
    h.accept(&thief, &offer.offer_id, vec![task("t1", "cpus:1")]);
    assert_eq!(
        h.expect_error(thief.conn),
        error(
            ErrorCode::InvalidOffer,
            &format!(
                "Accept: offer {} belongs to another framework; nothing launched",
                offer.offer_id
            )
        )
    );
    assert_eq!(h.snapshot().offers.len(), 1);
}

#[test]
fn accept_validation_refuses_the_whole_accept_and_returns_the_offer() {
    let dup = || vec![task("t1", "cpus:1"), task("t1", "cpus:1")];
    let cases: Vec<(Vec<TaskInfo>, String)> =
        vec![
        (vec![task("", "cpus:1")], "a task has an empty task_id".into()),
        (
            vec![task("a/b", "cpus:1")],
            "task id \"a/b\" is not allowed (at most 256 characters, no `/` or control characters)"
                .into(),
        ),
        (dup(), "task id t1 appears twice".into()),
        (
            vec![TaskInfo {
                command: " ".into(),
                ..task("t1", "cpus:1")
            }],
            "task t1 has an empty command".into(),
        ),
        (
            vec![TaskInfo {
                resources: None,
                ..task("t1", "cpus:1")
            }],
            "task t1 asks for no resources".into(),
        ),
        (
            vec![TaskInfo {
                priority_class: "gold".into(),
                ..task("t1", "cpus:1")
            }],
            "task t1 has priority_class \"gold\" (expected \"user\", \"base\" or empty)".into(),
        ),
        (
            vec![task("t1", "cpus:3"), task("t2", "cpus:2")],
            "tasks need cpus:5 but the offer has cpus:4;mem:1024 (short of cpus)".into(),
        ),
    ];
    for (tasks, why) in cases {
        let mut h = Harness::new();
        let agent = h.agent("a1", "cpus:4;mem:1024");
        let fw = h.framework("web");
        let offer = h.offer_for(&fw, "cpus:1;mem:128");
        h.accept(&fw, &offer.offer_id, tasks);
        assert_eq!(
            h.expect_error(fw.conn),
            error(
                ErrorCode::InvalidTask,
                &format!(
                    "Accept of offer {}: {why}; nothing launched",
                    offer.offer_id
                )
            )
        );
        h.expect_nothing(agent);
        let snap = h.snapshot();
        assert!(snap.tasks.is_empty() && snap.offers.is_empty(), "{why}");
        assert_eq!(snap.free, "cpus:4;mem:1024", "{why}");
    }
}

#[test]
fn a_task_id_in_use_is_refused() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.accept(&fw, &offer.offer_id, vec![task("t1", "cpus:1;mem:128")]);
    assert_eq!(
        h.expect_error(fw.conn),
        error(
            ErrorCode::InvalidTask,
            &format!(
                "Accept of offer {}: task id t1 is already in use by this framework; nothing launched",
                offer.offer_id
            )
        )
    );
    h.expect_nothing(agent);
}

#[test]
fn a_declined_agent_is_not_offered_again_before_the_default_refuse() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.decline(&fw, &offer.offer_id, 0.0);
    let declined_at = h.now();
    h.settle();
    h.expect_nothing(fw.conn);
    assert_eq!(h.snapshot().counters.offers_declined, 1);
    assert_eq!(h.snapshot().pending[0].not_eligible, 1);
    // default_refuse is 5 s; the filter ends on the tick at that instant.
    h.advance(declined_at + Duration::from_secs(5) - h.now() - Duration::from_millis(1));
    h.tick();
    h.settle();
    h.expect_nothing(fw.conn);
    h.advance_and_tick(Duration::from_millis(1));
    h.settle();
    assert_eq!(h.expect_offers(&fw)[0].agent_id, "a1");
}

#[test]
fn a_decline_with_refuse_seconds_filters_the_agent_until_it_expires() {
    // The agent sends no heartbeats here: keep it from being lost meanwhile.
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(3600));
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.decline(&fw, &offer.offer_id, 30.0);
    h.run_for(Duration::from_secs(29));
    h.expect_nothing(fw.conn);
    // Ticks come every 250 ms here: the filter (until 30.02 s) ends on the 30.25 s tick and
    // the allocation runs 20 ms later.
    h.run_for(Duration::from_millis(1230));
    h.expect_nothing(fw.conn);
    h.run_for(Duration::from_millis(20));
    let offers = h.expect_offers(&fw);
    assert_eq!((offers.len(), offers[0].agent_id.as_str()), (1, "a1"));
}

#[test]
fn a_decline_filter_is_the_declining_frameworks_only() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let picky = h.framework("picky");
    let offer = h.offer_for(&picky, "cpus:1;mem:128");
    h.decline(&picky, &offer.offer_id, 60.0);
    let other = h.framework("other");
    let offer = h.offer_for(&other, "cpus:1;mem:128");
    assert_eq!(offer.agent_id, "a1");
    h.expect_nothing(picky.conn);
}

#[test]
fn declining_an_unknown_offer_is_an_error() {
    let mut h = Harness::new();
    let fw = h.framework("web");
    h.send(
        fw.conn,
        Message::Decline(Decline {
            offer_ids: vec!["gone".into()],
            refuse_seconds: 1.0,
        }),
    );
    assert_eq!(
        h.expect_error(fw.conn),
        error(
            ErrorCode::InvalidOffer,
            "Decline: unknown or expired offer gone"
        )
    );
}

#[test]
fn an_unanswered_offer_is_rescinded_after_offer_timeout_and_made_again() {
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(60));
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.advance_and_tick(Duration::from_secs(10) - Duration::from_millis(1));
    h.expect_nothing(fw.conn);
    h.advance_and_tick(Duration::from_millis(1));
    assert_eq!(
        h.sent(fw.conn),
        vec![Out::Msg(Message::Rescind(Rescind {
            offer_id: offer.offer_id.clone(),
            reason: "offer_timeout".into(),
        }))]
    );
    assert_eq!(h.snapshot().counters.offers_rescinded, 1);
    // The demand is still there: a new offer follows.
    h.settle();
    let again = h.expect_offers(&fw);
    assert_eq!(again[0].offer_id, "0-O3");
    // Accepting the rescinded one launches nothing.
    h.accept(&fw, &offer.offer_id, vec![task("t1", "cpus:1")]);
    assert_eq!(h.expect_error(fw.conn).code, ErrorCode::InvalidOffer as i32);
}

#[test]
fn suppress_stops_offers_and_revive_resumes_them() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.send(fw.conn, Message::Suppress(Suppress {}));
    h.demand(&fw, "cpus:1;mem:128", 1);
    h.settle();
    h.expect_nothing(fw.conn);
    assert!(h.snapshot().frameworks[0].suppressed);
    assert!(h.snapshot().pending.is_empty());
    h.send(fw.conn, Message::Revive(Revive {}));
    h.settle();
    assert_eq!(h.expect_offers(&fw)[0].agent_id, "a1");
}

#[test]
fn revive_clears_decline_filters() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.decline(&fw, &offer.offer_id, 3600.0);
    h.settle();
    h.expect_nothing(fw.conn);
    h.send(fw.conn, Message::Revive(Revive {}));
    h.settle();
    assert_eq!(h.expect_offers(&fw)[0].agent_id, "a1");
}

#[test]
fn outstanding_offers_cover_the_demand_count() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    h.agent("a2", "cpus:4;mem:1024");
    let fw = h.framework("web");
    // One whole agent holds 4 copies of cpus:1: a count of 4 needs one offer, 5 needs two.
    h.demand(&fw, "cpus:1;mem:128", 4);
    h.settle();
    assert_eq!(h.expect_offers(&fw).len(), 1);
    h.demand(&fw, "cpus:1;mem:128", 5);
    h.settle();
    assert_eq!(h.expect_offers(&fw).len(), 1);
    assert_eq!(h.snapshot().offers.len(), 2);
}

#[test]
fn a_plan_places_instances_on_a_copy_of_the_cluster_and_explains_the_rest() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    h.agent("a2", "cpus:2;mem:1024");
    let demand: ringmaster_proto::resources::Resources = "cpus:2;mem:100".parse().unwrap();
    let plan = h.state.plan(&demand, 4, &Default::default(), h.now());
    let mut placed = plan.placed.clone();
    placed.sort();
    assert_eq!(placed, ["a1", "a1", "a2"], "{plan:?}");
    assert_eq!(plan.unplaced, 1);
    assert!(plan.why.as_deref().unwrap().contains("cpus"), "{plan:?}");
    // Nothing was taken for real.
    assert_eq!(h.snapshot().free, "cpus:6;mem:2048");
    let plan = h.state.plan(&demand, 2, &Default::default(), h.now());
    assert_eq!((plan.placed.len(), plan.unplaced, plan.why), (2, 0, None));
}

/// Issue 44: `job plan` asks the cycle's rules (`feasible::check`): an agent held for a
/// preempting framework is not planned on, as the cycle would not offer it (before, the plan
/// wrote its own rules and missed holds).
#[test]
fn a_plan_keeps_the_cycles_rules_and_skips_a_held_agent() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    h.agent("a2", "cpus:4;mem:1024");
    let preemptor = h.framework("preemptor");
    let until = h.now() + Duration::from_secs(60);
    h.hold("a1", &preemptor.id, until);
    let demand: ringmaster_proto::resources::Resources = "cpus:2;mem:100".parse().unwrap();
    let plan = h.state.plan(&demand, 3, &Default::default(), h.now());
    assert_eq!(plan.placed, ["a2", "a2"], "{plan:?}");
    assert_eq!(plan.unplaced, 1);
    // Once the hold has run out, a1 is planned on again.
    let later = until + Duration::from_secs(1);
    let plan = h.state.plan(&demand, 3, &Default::default(), later);
    assert_eq!(plan.unplaced, 0, "{plan:?}");
}

/// An agent with attributes `key:value;...` (hostname = id).
fn attributed(h: &mut Harness, id: &str, resources: &str, attributes: &[(&str, &str)]) {
    let mut r = super::super::harness::register(id, resources);
    r.attributes = attributes
        .iter()
        .map(|(k, v)| ringmaster_proto::v1::Attribute {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect();
    h.agent_with(r);
}

fn placement(partition: &str, constraints: &str) -> super::super::plan::Placement {
    let text = format!(
        "name: p\ntype: service\ntask:\n  command: x\n  resources: cpus:1\npartition: {partition}\n{constraints}"
    );
    let spec = crate::jobs::spec::parse_job_spec(&text, "p.yaml").unwrap();
    super::super::plan::Placement {
        partition: spec.partition,
        constraints: spec.constraints,
    }
}

#[test]
fn a_plan_honors_constraints_distinct_hosts_and_the_partition_and_says_why_not() {
    let mut h = Harness::new();
    attributed(&mut h, "a1", "cpus:4;mem:1024", &[("rack", "r1")]);
    attributed(&mut h, "a2", "cpus:4;mem:1024", &[("rack", "r2")]);
    attributed(
        &mut h,
        "a3",
        "cpus:4;mem:1024",
        &[("rack", "r1"), ("ssd", "yes")],
    );
    attributed(
        &mut h,
        "g1",
        "cpus:4;mem:1024",
        &[("partition", "gpu"), ("rack", "r1")],
    );
    let demand: ringmaster_proto::resources::Resources = "cpus:2;mem:100".parse().unwrap();
    let sorted = |plan: &super::super::plan::Plan| {
        let mut placed = plan.placed.clone();
        placed.sort();
        placed
    };

    // rack = r1 in the default partition: a1 and a3 (g1 is in partition gpu), 2 each.
    let rack = placement(
        "default",
        "constraints:\n  - {attribute: rack, value: r1}\n",
    );
    let plan = h.state.plan(&demand, 5, &rack, h.now());
    assert_eq!(sorted(&plan), ["a1", "a1", "a3", "a3"], "{plan:?}");
    assert_eq!(plan.unplaced, 1);
    assert!(plan.why.as_deref().unwrap().contains("cpus"), "{plan:?}");

    // Each operator, one instance: where it may go.
    let cases = [
        ("{attribute: rack, operator: \"!=\", value: r1}", vec!["a2"]),
        ("{attribute: ssd, operator: is_set}", vec!["a3"]),
        (
            "{attribute: hostname, operator: regexp, value: \"a[23]\"}",
            vec!["a2", "a3"],
        ),
    ];
    for (constraint, agents) in cases {
        let p = placement("default", &format!("constraints:\n  - {constraint}\n"));
        let plan = h.state.plan(&demand, 1, &p, h.now());
        assert_eq!(plan.unplaced, 0, "{constraint}: {plan:?}");
        assert!(
            agents.contains(&plan.placed[0].as_str()),
            "{constraint}: {plan:?}"
        );
    }

    // No agent satisfies it: said so.
    let r9 = placement(
        "default",
        "constraints:\n  - {attribute: rack, value: r9}\n",
    );
    let plan = h.state.plan(&demand, 2, &r9, h.now());
    assert_eq!((plan.placed.len(), plan.unplaced), (0, 2));
    assert_eq!(plan.why.as_deref(), Some("no agent satisfies rack = r9"));
    let both = placement(
        "default",
        "constraints:\n  - {attribute: rack, value: r2}\n  - {attribute: ssd, operator: is_set}\n",
    );
    let plan = h.state.plan(&demand, 1, &both, h.now());
    assert_eq!(
        plan.why.as_deref(),
        Some("no agent satisfies all of: rack = r2, ssd is_set")
    );

    // distinct_hosts: one per agent.
    let distinct = placement(
        "default",
        "constraints:\n  - {attribute: rack, value: r1}\n  - {operator: distinct_hosts}\n",
    );
    let plan = h.state.plan(&demand, 3, &distinct, h.now());
    assert_eq!(sorted(&plan), ["a1", "a3"], "{plan:?}");
    assert_eq!(plan.unplaced, 1);
    assert!(
        plan.why.as_deref().unwrap().starts_with("distinct_hosts"),
        "{plan:?}"
    );

    // Partition gpu: only g1; a constraint it fails is named.
    let plan = h.state.plan(&demand, 2, &placement("gpu", ""), h.now());
    assert_eq!(sorted(&plan), ["g1", "g1"], "{plan:?}");
    let plan = h.state.plan(
        &demand,
        1,
        &placement("gpu", "constraints:\n  - {attribute: rack, value: r2}\n"),
        h.now(),
    );
    assert_eq!(plan.why.as_deref(), Some("no agent satisfies rack = r2"));
    // Nothing was taken for real.
    assert_eq!(h.snapshot().free, "cpus:16;mem:4096");
}

/// A GPU agent registered with its device list (`gpus:NxMEM`).
fn gpu_agent(h: &mut Harness, id: &str, resources: &str) {
    let (total, devices) = ringmaster_proto::devices::parse_agent_resources(resources).unwrap();
    h.agent_with(ringmaster_proto::RegisterAgent {
        devices: devices.iter().map(Into::into).collect(),
        ..super::super::harness::register(id, &total.to_string())
    });
}

/// Packed devices: an Accept binds a GPU slice where the slices the master expects can still
/// fill what it leaves (the share fill of the cycle that made the offer), not by best fit. The
/// master learns 0.32 and 0.47 (on g2, whose cpu they use up) and 0.65 (on g1: GPUs free
/// [350, 1000]); a 0.23 on the 350 leaves 120 no sum of those sizes fills (+90 unfillable), on
/// the whole GPU 770 = 230 + 470 + 70 (+70): GPU 1, where best fit takes GPU 0.
#[test]
fn a_packed_slice_is_bound_where_the_expected_slices_can_fill_the_rest() {
    let mut h = Harness::configured(|c| {
        c.devices.selection = ringmaster_proto::devices::DeviceSelection::MostUsedThatFits;
    });
    gpu_agent(&mut h, "g2", "cpus:2;mem:1024;gpus:1x16384");
    let fw = h.framework("gpu");
    assert_eq!(h.launch(&fw, "s320", "cpus:1;mem:128;gpu_milli:320"), "g2");
    assert_eq!(h.launch(&fw, "s470", "cpus:1;mem:128;gpu_milli:470"), "g2");
    gpu_agent(&mut h, "g1", "cpus:8;mem:4096;gpus:2x16384");
    assert_eq!(h.launch(&fw, "s650", "cpus:1;mem:128;gpu_milli:650"), "g1");
    assert_eq!(h.launch(&fw, "s230", "cpus:1;mem:128;gpu_milli:230"), "g1");
    let bound = |h: &Harness, t: &str| {
        h.state.tasks[&crate::master::state::make_task_key(&fw.id, t)]
            .devices
            .to_string()
    };
    assert_eq!(bound(&h, "s650"), "gpu:0:650:0");
    assert_eq!(bound(&h, "s230"), "gpu:1:230:0");
}
