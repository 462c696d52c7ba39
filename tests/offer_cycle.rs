//! The offer cycle through the master over real TCP: offers, best fit, DRF, accept
//! validation, decline filters, offer timeouts, kill, reconciliation.

mod common;

use common::*;
use ringmaster_proto::{ErrorCode, Kill, Message, Reconcile, TaskState};

#[tokio::test]
async fn full_cycle_offer_accept_running_finished() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "", "cpus:4;mem:8192").await;
    let mut fw = Client::framework(master.addr(), "cycle").await;
    fw.demand("cpus:1;mem:512", 1).await;
    let offers = fw.expect_offers().await;
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent_id, agent.id);
    assert_eq!(offered(&offers[0]).to_string(), "cpus:4;mem:8192");
    fw.accept(
        &offers[0].offer_id,
        vec![task("t1", "cpus:1;mem:512", "true")],
    )
    .await;
    let run = agent.expect_run().await;
    assert_eq!(run.len(), 1);
    assert_eq!(run[0].framework_id, fw.id);
    assert_eq!(run[0].agent_id, agent.id);
    fw.expect_state("t1", TaskState::TaskStaging).await;
    agent.report(&run[0], TaskState::TaskRunning, "u1").await;
    fw.expect_state("t1", TaskState::TaskRunning).await;
    agent.report(&run[0], TaskState::TaskFinished, "u2").await;
    let done = fw.expect_state("t1", TaskState::TaskFinished).await;
    assert_eq!(done.agent_id, agent.id);
    // The agent's resources are whole again.
    wait_for_state(&master, "resources returned", |s| {
        s.agents[0].free == "cpus:4;mem:8192"
    })
    .await;
}

/// SPEC seed 001: an agent with 4 CPU and 8 GB runs (2 CPU, 1 GB) and (2 CPU, 2 GB) from one
/// offer and is left with 0 CPU and 5 GB.
#[tokio::test]
async fn seed_001_example_through_the_master() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "", "cpus:4;mem:8192").await;
    let mut fw = Client::framework(master.addr(), "seed").await;
    fw.demand("cpus:2;mem:1024", 2).await;
    let offers = fw.expect_offers().await;
    fw.accept(
        &offers[0].offer_id,
        vec![
            task("a", "cpus:2;mem:1024", "true"),
            task("b", "cpus:2;mem:2048", "true"),
        ],
    )
    .await;
    assert_eq!(agent.expect_run().await.len(), 2);
    let s = wait_for_state(&master, "tasks launched", |s| s.tasks.len() == 2).await;
    assert_eq!(s.agents[0].free, "mem:5120");
}

#[tokio::test]
async fn the_best_fit_agent_is_offered() {
    let master = start_master(test_config("")).await;
    let _big = Client::agent(master.addr(), "big", "cpus:16;mem:32768").await;
    let _small = Client::agent(master.addr(), "small", "cpus:2;mem:2048").await;
    let _medium = Client::agent(master.addr(), "medium", "cpus:4;mem:8192").await;
    let _tiny = Client::agent(master.addr(), "tiny", "cpus:1;mem:512").await;
    let mut fw = Client::framework(master.addr(), "fit").await;
    fw.demand("cpus:2;mem:1024", 1).await;
    let offers = fw.expect_offers().await;
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent_id, "small", "{offers:?}");
    let placement = offers[0].placement.as_ref().unwrap();
    assert_eq!(placement.placer, "ring");
    assert_eq!(placement.phase, "bucket");
}

#[tokio::test]
async fn drf_alternates_between_two_frameworks() {
    let master = start_master(test_config("")).await;
    // Both frameworks state their demand before any agent exists, so the outcome does not
    // depend on how allocation runs are batched.
    let mut a = Client::framework(master.addr(), "A").await;
    let mut b = Client::framework(master.addr(), "B").await;
    a.demand("cpus:2;mem:2048", 4).await;
    b.demand("cpus:2;mem:2048", 4).await;
    wait_for_state(&master, "demands recorded", |s| {
        s.frameworks.iter().all(|f| f.demand_count == 4)
    })
    .await;
    let mut agents = Vec::new();
    for i in 0..4 {
        agents.push(Client::agent(master.addr(), &format!("a{i}"), "cpus:2;mem:2048").await);
    }
    let s = wait_for_state(&master, "all agents offered", |s| s.offers.len() == 4).await;
    let of_a = s.offers.iter().filter(|o| o.framework == a.id).count();
    let of_b = s.offers.iter().filter(|o| o.framework == b.id).count();
    assert_eq!((of_a, of_b), (2, 2), "{s:#?}");
    for f in &s.frameworks {
        assert!((f.share - 0.5).abs() < 1e-9, "{s:#?}");
    }
}

#[tokio::test]
async fn decline_filters_the_agent_for_refuse_seconds() {
    let master = start_master(test_config("")).await;
    let _a = Client::agent(master.addr(), "a", "cpus:2;mem:2048").await;
    let mut fw = Client::framework(master.addr(), "picky").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let first = fw.expect_offers().await;
    assert_eq!(first[0].agent_id, "a");
    fw.decline(&first[0].offer_id, 3600.0).await;
    // A second agent arrives: it is offered; the declined one is not.
    let _b = Client::agent(master.addr(), "b", "cpus:4;mem:4096").await;
    let second = fw.expect_offers().await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].agent_id, "b");
    // A short refusal expires and the agent comes back.
    fw.decline(&second[0].offer_id, 0.2).await;
    let third = fw.expect_offers().await;
    assert_eq!(third[0].agent_id, "b");
    let s = master.snapshot().await.unwrap();
    assert_eq!(s.counters.offers_declined, 2);
}

#[tokio::test]
async fn revive_clears_decline_filters() {
    let master = start_master(test_config("")).await;
    let _a = Client::agent(master.addr(), "a", "cpus:2;mem:2048").await;
    let mut fw = Client::framework(master.addr(), "reviver").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let first = fw.expect_offers().await;
    fw.decline(&first[0].offer_id, 3600.0).await;
    fw.send(Message::Revive(ringmaster_proto::Revive {})).await;
    let again = fw.expect_offers().await;
    assert_eq!(again[0].agent_id, "a");
}

#[tokio::test]
async fn unanswered_offers_time_out_and_are_rescinded() {
    let master = start_master(test_config("  offer_timeout: 200ms\n")).await;
    let _a = Client::agent(master.addr(), "a", "cpus:2;mem:2048").await;
    let mut fw = Client::framework(master.addr(), "slow").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    let rescinded = fw
        .expect("Rescind", |m| match m {
            Message::Rescind(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(rescinded.offer_id, offer.offer_id);
    assert_eq!(rescinded.reason, "offer_timeout");
    // Accepting the stale offer now is refused and launches nothing.
    fw.accept(
        &offer.offer_id,
        vec![task("late", "cpus:1;mem:128", "true")],
    )
    .await;
    let error = fw.expect_error().await;
    assert_eq!(error.code, ErrorCode::InvalidOffer as i32);
    assert!(
        error.message.contains("unknown or expired"),
        "{}",
        error.message
    );
    // The agent is offered again.
    let again = fw.expect_offers().await;
    assert_eq!(again[0].agent_id, "a");
    assert!(master.snapshot().await.unwrap().tasks.is_empty());
}

/// Every invalid Accept gets an error naming the problem, launches nothing and returns the
/// offer's resources.
#[tokio::test]
async fn invalid_accepts_launch_nothing() {
    let master = start_master(test_config("")).await;
    let _agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "careless").await;
    let mut other = Client::framework(master.addr(), "other").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let cases: Vec<(Vec<ringmaster_proto::TaskInfo>, &str)> = vec![
        (vec![task("big", "cpus:3;mem:128", "true")], "short of cpus"),
        (
            vec![
                task("d", "cpus:0.5;mem:128", "true"),
                task("d", "cpus:0.5;mem:128", "true"),
            ],
            "appears twice",
        ),
        (vec![task("e", "cpus:1;mem:128", "  ")], "empty command"),
        (vec![task("", "cpus:1;mem:128", "true")], "empty task_id"),
        (vec![task("n", "", "true")], "asks for no resources"),
        (vec![task("x/y", "cpus:1", "true")], "not allowed"),
    ];
    for (tasks, expected) in cases {
        let offer = fw.expect_offers().await.remove(0);
        fw.accept(&offer.offer_id, tasks).await;
        let error = fw.expect_error().await;
        assert_eq!(
            error.code,
            ErrorCode::InvalidTask as i32,
            "{}",
            error.message
        );
        assert!(
            error.message.contains(expected),
            "{expected}: {}",
            error.message
        );
        assert!(error.message.contains("nothing launched"));
    }
    // Another framework may not use this framework's offer.
    let offer = fw.expect_offers().await.remove(0);
    other
        .accept(
            &offer.offer_id,
            vec![task("steal", "cpus:1;mem:128", "true")],
        )
        .await;
    let error = other.expect_error().await;
    assert_eq!(error.code, ErrorCode::InvalidOffer as i32);
    assert!(
        error.message.contains("another framework"),
        "{}",
        error.message
    );
    // Unknown offer.
    fw.accept("no-such-offer", vec![task("z", "cpus:1;mem:128", "true")])
        .await;
    let error = fw.expect_error().await;
    assert_eq!(error.code, ErrorCode::InvalidOffer as i32);
    let s = master.snapshot().await.unwrap();
    assert!(s.tasks.is_empty(), "{s:#?}");
    assert_eq!(s.counters.tasks_launched, 0);
}

#[tokio::test]
async fn leftover_of_an_accepted_offer_returns_at_once() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:4;mem:4096").await;
    let mut first = Client::framework(master.addr(), "first").await;
    first.demand("cpus:1;mem:1024", 1).await;
    let offer = first.expect_offers().await.remove(0);
    first.demand("cpus:1;mem:1024", 0).await;
    first
        .accept(
            &offer.offer_id,
            vec![task("t", "cpus:1;mem:1024", "sleep 100")],
        )
        .await;
    agent.expect_run().await;
    // The rest of the agent is offered to a second framework.
    let mut second = Client::framework(master.addr(), "second").await;
    second.demand("cpus:1;mem:1024", 1).await;
    let offer = second.expect_offers().await.remove(0);
    assert_eq!(offered(&offer).to_string(), "cpus:3;mem:3072");
}

#[tokio::test]
async fn kill_reaches_the_agent_and_the_framework_hears_killed() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "killer").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.accept(
        &offer.offer_id,
        vec![task("victim", "cpus:1;mem:128", "sleep 100")],
    )
    .await;
    let run = agent.expect_run().await;
    agent.report(&run[0], TaskState::TaskRunning, "u1").await;
    fw.expect_state("victim", TaskState::TaskRunning).await;
    fw.send(Message::Kill(Kill {
        task_id: "victim".into(),
    }))
    .await;
    let kill = agent
        .expect("KillTask", |m| match m {
            Message::KillTask(k) => Some(k.clone()),
            _ => None,
        })
        .await;
    assert_eq!(kill.task_id, "victim");
    assert_eq!(kill.reason, "killed_by_framework");
    agent.report(&run[0], TaskState::TaskKilled, "u2").await;
    fw.expect_state("victim", TaskState::TaskKilled).await;
    // Killing an unknown task answers LOST.
    fw.send(Message::Kill(Kill {
        task_id: "ghost".into(),
    }))
    .await;
    let ghost = fw.expect_update("ghost").await;
    assert_eq!(ghost.state, TaskState::TaskLost as i32);
    assert_eq!(ghost.reason, "unknown_task");
}

#[tokio::test]
async fn explicit_and_implicit_reconciliation() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "reconciler").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.accept(
        &offer.offer_id,
        vec![task("t1", "cpus:1;mem:128", "sleep 100")],
    )
    .await;
    let run = agent.expect_run().await;
    agent.report(&run[0], TaskState::TaskRunning, "u1").await;
    fw.expect_state("t1", TaskState::TaskRunning).await;
    fw.send(Message::Reconcile(Reconcile { task_ids: vec![] }))
        .await;
    let implicit = fw.expect_update("t1").await;
    assert_eq!(implicit.state, TaskState::TaskRunning as i32);
    assert!(implicit.update_id.is_empty());
    fw.send(Message::Reconcile(Reconcile {
        task_ids: vec!["t1".into(), "nope".into()],
    }))
    .await;
    assert_eq!(
        fw.expect_update("t1").await.state,
        TaskState::TaskRunning as i32
    );
    let unknown = fw.expect_update("nope").await;
    assert_eq!(unknown.state, TaskState::TaskLost as i32);
    assert_eq!(unknown.reason, "reconciliation");
}

#[tokio::test]
async fn status_updates_are_resent_until_acknowledged() {
    let master = start_master(test_config("  status_retry_interval: 100ms\n")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "forgetful").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.accept(&offer.offer_id, vec![task("t1", "cpus:1;mem:128", "true")])
        .await;
    let run = agent.expect_run().await;
    agent.report(&run[0], TaskState::TaskFinished, "u1").await;
    // Do not acknowledge: the same update comes again.
    let first = fw
        .expect("FINISHED", |m| match m {
            Message::Update(u) => u
                .status
                .clone()
                .filter(|s| s.state == TaskState::TaskFinished as i32),
            _ => None,
        })
        .await;
    let again = fw
        .expect("FINISHED again", |m| match m {
            Message::Update(u) => u
                .status
                .clone()
                .filter(|s| s.state == TaskState::TaskFinished as i32),
            _ => None,
        })
        .await;
    assert_eq!(first.update_id, again.update_id);
    fw.ack(&again).await;
}
