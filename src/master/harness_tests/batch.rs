//! Batches (docs/batch.md): SubmitBatch → one offer per matched agent with `suggested` tasks,
//! then BatchResult.

use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{
    Attribute, BatchResult, BatchTask, ErrorCode, Message, Offer, Offers, Placement, Rescind,
    RunTasks, SubmitBatch, TaskInfo, UnmatchedTask,
};
use tokio::time::Duration;

use super::super::harness::{error, register, res, task, Fw, Harness, Out};
use ringmaster_proto::RegisterAgent;

fn batch_task(id: &str, resources: &str, deadline_secs: f64, work: f64) -> BatchTask {
    BatchTask {
        task: Some(task(id, resources)),
        deadline_secs,
        work,
        price: 1.0,
    }
}

fn submit(h: &mut Harness, fw: &Fw, batch_id: &str, tasks: Vec<BatchTask>) {
    h.send(
        fw.conn,
        Message::SubmitBatch(SubmitBatch {
            batch_id: batch_id.into(),
            tasks,
        }),
    );
}

fn offer_msg(offers: Vec<Offer>) -> Out {
    Out::Msg(Message::Offers(Offers { offers }))
}

/// The offer a batch makes on `agent` for `suggested` tasks (each `cpus:1;mem:128`).
fn batch_offer(fw: &Fw, offer_id: &str, agent: &str, batch: &str, suggested: &[&str]) -> Offer {
    let n = suggested.len();
    Offer {
        offer_id: offer_id.into(),
        framework_id: fw.id.clone(),
        agent_id: agent.into(),
        hostname: agent.into(),
        resources: Some(res(&format!("cpus:{n};mem:{}", 128 * n)).to_wire()),
        placement: Some(Placement {
            placer: "matching".into(),
            ..Placement::default()
        }),
        suggested: suggested
            .iter()
            .map(|id| TaskInfo {
                agent_id: agent.into(),
                ..task(id, "cpus:1;mem:128")
            })
            .collect(),
        batch_id: batch.into(),
        ..Offer::default()
    }
}

#[test]
fn a_batch_gets_one_offer_per_matched_agent_then_its_result() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    h.agent("a2", "cpus:4;mem:1024");
    let fw = h.framework("burst");
    submit(
        &mut h,
        &fw,
        "b1",
        vec![
            batch_task("x1", "cpus:1;mem:128", 10.0, 1.0),
            batch_task("x2", "cpus:1;mem:128", 10.0, 1.0),
        ],
    );
    assert_eq!(
        h.sent(fw.conn),
        vec![
            offer_msg(vec![batch_offer(&fw, "0-O2", "a1", "b1", &["x1", "x2"])]),
            Out::Msg(Message::BatchResult(BatchResult {
                batch_id: "b1".into(),
                unmatched: vec![],
                proposals: 2,
                matched: 2,
                offer_ids: vec!["0-O2".into()],
            })),
        ]
    );
    let snap = h.snapshot();
    assert_eq!(snap.offered, "cpus:2;mem:256");
    assert_eq!(snap.offers.len(), 1);
}

#[test]
fn tasks_that_fit_nowhere_or_cannot_meet_their_deadline_are_unmatched() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("burst");
    submit(
        &mut h,
        &fw,
        "b1",
        vec![
            batch_task("big", "cpus:16", 10.0, 1.0),
            batch_task("slow", "cpus:1", 1.0, 100.0),
        ],
    );
    assert_eq!(
        h.sent(fw.conn),
        vec![Out::Msg(Message::BatchResult(BatchResult {
            batch_id: "b1".into(),
            unmatched: vec![
                UnmatchedTask {
                    task_id: "big".into(),
                    reason: "no_agent_fits".into(),
                    message: "no agent fits".into(),
                },
                UnmatchedTask {
                    task_id: "slow".into(),
                    reason: "deadline_impossible".into(),
                    message: "deadline impossible on every agent".into(),
                },
            ],
            proposals: 0,
            matched: 0,
            offer_ids: vec![],
        }))]
    );
    assert!(h.snapshot().offers.is_empty());
}

#[test]
fn a_tight_deadline_goes_to_the_fast_agent() {
    let mut h = Harness::new();
    h.agent("slow", "cpus:4;mem:1024");
    let mut fast = register("fast", "cpus:4;mem:1024");
    fast.attributes = vec![Attribute {
        key: "cpu_speed".into(),
        value: "4".into(),
    }];
    h.agent_with(fast);
    let fw = h.framework("burst");
    // 2 s of work by 1 s: only at cpu_speed 4 (0.5 s).
    submit(
        &mut h,
        &fw,
        "b1",
        vec![batch_task("urgent", "cpus:1;mem:128", 1.0, 2.0)],
    );
    let sent = h.sent(fw.conn);
    let Out::Msg(Message::Offers(offers)) = &sent[0] else {
        panic!("offers expected: {sent:?}")
    };
    assert_eq!(offers.offers.len(), 1);
    assert_eq!(offers.offers[0].agent_id, "fast");
    assert_eq!(offers.offers[0].suggested[0].task_id, "urgent");
}

#[test]
fn an_invalid_batch_is_refused_whole() {
    let cases: Vec<(Vec<BatchTask>, &str)> = vec![
        (vec![], "the batch has no tasks"),
        (
            vec![batch_task("x", "cpus:1", 0.0, 1.0)],
            "task x: deadline_secs must be a number > 0, got 0",
        ),
        (
            vec![batch_task("x", "cpus:1", 1.0, -1.0)],
            "task x: work must be a number > 0, got -1",
        ),
        (
            vec![BatchTask {
                price: -2.0,
                ..batch_task("x", "cpus:1", 1.0, 1.0)
            }],
            "task x: price must be a number ≥ 0, got -2",
        ),
        (
            vec![
                batch_task("x", "cpus:1", 1.0, 1.0),
                batch_task("x", "cpus:1", 1.0, 1.0),
            ],
            "task #1: task id x appears twice",
        ),
        (
            vec![BatchTask {
                task: None,
                ..batch_task("x", "cpus:1", 1.0, 1.0)
            }],
            "task #0 has no TaskInfo",
        ),
    ];
    for (tasks, why) in cases {
        let mut h = Harness::new();
        h.agent("a1", "cpus:4;mem:1024");
        let fw = h.framework("burst");
        submit(&mut h, &fw, "b1", tasks);
        assert_eq!(
            h.sent(fw.conn),
            vec![Out::Msg(Message::Error(error(
                ErrorCode::InvalidRequest,
                &format!("SubmitBatch \"b1\": {why}; nothing matched")
            )))]
        );
        assert!(h.snapshot().offers.is_empty(), "{why}");
    }
}

#[test]
fn agents_under_an_outstanding_offer_are_not_used() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    h.agent("a2", "cpus:4;mem:1024");
    let other = h.framework("other");
    let held = h.offer_for(&other, "cpus:4;mem:1024");
    let fw = h.framework("burst");
    submit(
        &mut h,
        &fw,
        "b1",
        vec![batch_task("x1", "cpus:1;mem:128", 10.0, 1.0)],
    );
    let free = if held.agent_id == "a1" { "a2" } else { "a1" };
    let offers = h.sent(fw.conn);
    assert_eq!(
        offers[0],
        offer_msg(vec![batch_offer(&fw, "0-O4", free, "b1", &["x1"])])
    );
}

#[test]
fn accepting_a_batch_offer_with_its_suggested_tasks_launches_them() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("burst");
    submit(
        &mut h,
        &fw,
        "b1",
        vec![
            batch_task("x1", "cpus:1;mem:128", 10.0, 1.0),
            batch_task("x2", "cpus:1;mem:128", 10.0, 1.0),
        ],
    );
    let sent = h.sent(fw.conn);
    let Out::Msg(Message::Offers(offers)) = &sent[0] else {
        panic!("offers expected: {sent:?}")
    };
    let offer = offers.offers[0].clone();
    h.accept(&fw, &offer.offer_id, offer.suggested.clone());
    let launched: Vec<TaskInfo> = offer
        .suggested
        .iter()
        .map(|t| TaskInfo {
            framework_id: fw.id.clone(),
            ..t.clone()
        })
        .collect();
    assert_eq!(
        h.messages(agent),
        vec![Message::RunTasks(RunTasks {
            tasks: launched,
            leader_term: 0,
        })]
    );
    assert_eq!(h.expect_updates(&fw).len(), 2);
    assert_eq!(h.snapshot().used, "cpus:2;mem:256");
}

#[test]
fn an_unanswered_batch_offer_times_out_like_any_offer() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("burst");
    submit(
        &mut h,
        &fw,
        "b1",
        vec![batch_task("x1", "cpus:1;mem:128", 10.0, 1.0)],
    );
    h.sent(fw.conn);
    h.advance_and_tick(Duration::from_secs(10));
    assert_eq!(
        h.sent(fw.conn),
        vec![Out::Msg(Message::Rescind(Rescind {
            offer_id: "0-O2".into(),
            reason: "offer_timeout".into(),
        }))]
    );
    assert_eq!(h.snapshot().free, "cpus:4;mem:1024");
}

/// Issue 44: a batch goes through the same feasibility rules as the allocation cycle
/// (`feasible::check`): an agent of another partition, one held for another framework after a
/// preemption, and one the framework declined are not used; the one left is.
#[test]
fn a_batch_keeps_the_partition_hold_and_decline_rules() {
    let mut h = Harness::new();
    h.agent_with(RegisterAgent {
        attributes: vec![Attribute {
            key: "partition".into(),
            value: "gpu".into(),
        }],
        ..register("gpu1", "cpus:4;mem:1024")
    });
    h.agent("held", "cpus:4;mem:1024");
    h.agent("declined", "cpus:4;mem:1024");
    h.agent("ok", "cpus:4;mem:1024");
    let fw = h.framework("burst");
    let other = h.framework("other");
    let until = h.now() + Duration::from_secs(60);
    h.hold("held", &other.id, until);
    h.state
        .frameworks
        .get_mut(&fw.id)
        .unwrap()
        .filters
        .insert("declined".into(), until);
    submit(
        &mut h,
        &fw,
        "b1",
        vec![batch_task("x1", "cpus:1;mem:128", 10.0, 1.0)],
    );
    let sent = h.sent(fw.conn);
    let Out::Msg(Message::Offers(Offers { offers })) = &sent[0] else {
        panic!("{sent:?}");
    };
    let agents: Vec<&str> = offers.iter().map(|o| o.agent_id.as_str()).collect();
    assert_eq!(agents, ["ok"]);
}
