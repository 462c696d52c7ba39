//! The framework side of the protocol against a scripted fake master over real TCP.

mod support;

use ringmaster_proto::convert::ResourcesWire;
use std::sync::Arc;
use std::time::Duration;

use ringmaster_proto::{Message, Offers, Rescind, Subscribed, Update};
use ringmaster_sdk::{
    run, task, DriverStopped, ErrorCode, Offer, ProtoError, Resources, SdkError, TaskState,
    TaskStatus,
};
use support::*;
use tokio::sync::Notify;
use tokio::time::timeout;

fn offer(id: &str, resources: &str) -> Offer {
    Offer {
        offer_id: id.into(),
        framework_id: "fw-1".into(),
        agent_id: "agent-1".into(),
        hostname: "host-1".into(),
        resources: Some(Resources::parse(resources).unwrap().to_wire()),
        ..Offer::default()
    }
}

fn update(task_id: &str, state: TaskState, update_id: &str) -> Message {
    Message::Update(Update {
        status: Some(TaskStatus {
            task_id: task_id.into(),
            framework_id: "fw-1".into(),
            agent_id: "agent-1".into(),
            state: state as i32,
            update_id: update_id.into(),
            ..TaskStatus::default()
        }),
    })
}

fn expect_status(event: Event) -> TaskStatus {
    match event {
        Event::Status(status) => status,
        other => panic!("expected a status update, got {other:?}"),
    }
}

async fn expect_ack(side: &mut MasterSide, task_id: &str, update_id: &str) {
    match side.recv().await {
        Message::StatusAck(ack) => {
            assert_eq!(
                (ack.task_id.as_str(), ack.update_id.as_str()),
                (task_id, update_id)
            );
        }
        other => panic!("expected StatusAck {update_id}, got {other:?}"),
    }
}

#[tokio::test]
async fn subscribes_and_reports_the_assigned_id() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let running = tokio::spawn(run(master.config("sleepy"), scheduler));

    let (_side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(
        subscribe.framework_id, "",
        "a first subscription asks for a new id"
    );
    assert_eq!(subscribe.name, "sleepy");
    assert_eq!(subscribe.user, "tester");
    assert_eq!(subscribe.weight, 2.0);
    assert_eq!(subscribe.failover_timeout_secs, 30.0);

    let (id, driver) = registered(&mut events).await;
    assert_eq!(id, "fw-1");
    assert_eq!(driver.framework_id().as_deref(), Some("fw-1"));
    running.abort();
}

#[tokio::test]
async fn request_sends_a_demand() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    let (_, driver) = registered(&mut events).await;

    let unit = Resources::parse("cpus:1;mem:128").unwrap();
    driver.request(&unit, 3).unwrap();
    match side.recv().await {
        Message::Demand(demand) => {
            assert_eq!(demand.count, 3);
            assert_eq!(
                Resources::from_wire(demand.resources.as_ref()).unwrap(),
                unit
            );
        }
        other => panic!("expected Demand, got {other:?}"),
    }
}

#[tokio::test]
async fn offers_are_delivered_and_accepted_with_the_tasks() {
    let master = FakeMaster::bind().await;
    let (mut scheduler, mut events) = RecordingScheduler::new();
    let unit = Resources::parse("cpus:1;mem:128").unwrap();
    let tasks = vec![task("t-0", "echo hi", &unit), task("t-1", "echo ho", &unit)];
    scheduler.accept_with = Some(tasks.clone());
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    registered(&mut events).await;

    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "cpus:4;mem:1024")],
    }))
    .await;
    match next_event(&mut events).await {
        Event::Offers(offers) => {
            assert_eq!(offers.len(), 1);
            assert_eq!(offers[0].offer_id, "o-1");
            assert_eq!(offers[0].agent_id, "agent-1");
        }
        other => panic!("expected offers, got {other:?}"),
    }
    match side.recv().await {
        Message::Accept(accept) => {
            assert_eq!(accept.offer_id, "o-1");
            assert_eq!(accept.tasks, tasks);
        }
        other => panic!("expected Accept, got {other:?}"),
    }
}

#[tokio::test]
async fn accepting_a_rescinded_offer_reports_the_tasks_lost_and_sends_nothing() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    let (_, driver) = registered(&mut events).await;

    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "cpus:4"), offer("o-2", "cpus:4")],
    }))
    .await;
    assert!(matches!(next_event(&mut events).await, Event::Offers(_)));
    side.send(Message::Rescind(Rescind {
        offer_id: "o-1".into(),
        reason: "timeout".into(),
    }))
    .await;
    assert!(matches!(next_event(&mut events).await, Event::Rescinded(id) if id == "o-1"));

    let unit = Resources::parse("cpus:1").unwrap();
    driver
        .accept("o-1", vec![task("t-0", "true", &unit)])
        .unwrap();
    let lost = expect_status(next_event(&mut events).await);
    assert_eq!(lost.task_id, "t-0");
    assert_eq!(lost.state(), TaskState::TaskLost);
    assert_eq!(lost.reason, "launch_dropped");
    assert_eq!(lost.update_id, "", "a local report needs no ack");

    // The stale offer is dropped from a decline; the live one is declined.
    driver
        .decline(
            &["o-1".to_string(), "o-2".to_string()],
            Duration::from_secs(7),
        )
        .unwrap();
    match side.recv().await {
        Message::Decline(decline) => {
            assert_eq!(decline.offer_ids, vec!["o-2".to_string()]);
            assert_eq!(decline.refuse_seconds, 7.0);
        }
        other => panic!("expected Decline, got {other:?}"),
    }
    side.barrier(1).await;
}

#[tokio::test]
async fn a_status_update_is_acknowledged_after_the_callback_returns() {
    let master = FakeMaster::bind().await;
    let (mut scheduler, mut events) = RecordingScheduler::new();
    let gate = Arc::new(Notify::new());
    scheduler.status_gate = Some(gate.clone());
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    registered(&mut events).await;

    side.send(update("t-0", TaskState::TaskRunning, "u-1"))
        .await;
    let status = expect_status(next_event(&mut events).await);
    assert_eq!(status.task_id, "t-0");
    assert_eq!(status.state(), TaskState::TaskRunning);

    // The callback is still running: no ack may have been sent yet.
    let early = timeout(Duration::from_millis(200), side.connection.recv()).await;
    assert!(
        early.is_err(),
        "ack sent before the callback returned: {early:?}"
    );
    gate.notify_one();
    expect_ack(&mut side, "t-0", "u-1").await;
}

#[tokio::test]
async fn a_resent_update_is_acked_again_but_delivered_once() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    registered(&mut events).await;

    side.send(update("t-0", TaskState::TaskFinished, "u-1"))
        .await;
    expect_ack(&mut side, "t-0", "u-1").await;
    side.send(update("t-0", TaskState::TaskFinished, "u-1"))
        .await;
    expect_ack(&mut side, "t-0", "u-1").await;
    side.send(update("t-1", TaskState::TaskRunning, "u-2"))
        .await;
    expect_ack(&mut side, "t-1", "u-2").await;

    let first = expect_status(next_event(&mut events).await);
    assert_eq!(first.update_id, "u-1");
    let second = expect_status(next_event(&mut events).await);
    assert_eq!(
        second.update_id, "u-2",
        "the resent u-1 was delivered twice"
    );
}

#[tokio::test]
async fn reconciliation_answers_are_delivered_without_an_ack() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    let (_, driver) = registered(&mut events).await;

    driver.reconcile(&["t-0".to_string()]).unwrap();
    match side.recv().await {
        Message::Reconcile(reconcile) => assert_eq!(reconcile.task_ids, vec!["t-0".to_string()]),
        other => panic!("expected Reconcile, got {other:?}"),
    }
    side.send(update("t-0", TaskState::TaskLost, "")).await;
    side.send(update("t-0", TaskState::TaskLost, "")).await;
    side.barrier(5).await;
    assert_eq!(
        expect_status(next_event(&mut events).await).state(),
        TaskState::TaskLost
    );
    assert_eq!(
        expect_status(next_event(&mut events).await).state(),
        TaskState::TaskLost
    );
}

#[tokio::test]
async fn a_dropped_connection_is_resumed_with_the_same_id_and_demand() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    let (_, driver) = registered(&mut events).await;

    let unit = Resources::parse("cpus:2;mem:256").unwrap();
    driver.request(&unit, 4).unwrap();
    driver.suppress().unwrap();
    assert!(matches!(side.recv().await, Message::Demand(d) if d.count == 4));
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "cpus:4")],
    }))
    .await;
    assert!(matches!(next_event(&mut events).await, Event::Offers(_)));

    drop(side);
    assert!(matches!(next_event(&mut events).await, Event::Disconnected));
    driver.kill("t-9").unwrap();

    let mut side = master.accept().await;
    side.handshake().await;
    let subscribe = side.expect_subscribe().await;
    assert_eq!(subscribe.framework_id, "fw-1");
    assert_eq!(subscribe.name, "fw");
    side.send(Message::Subscribed(Subscribed {
        framework_id: "fw-1".into(),
        heartbeat_interval_ms: 0,
    }))
    .await;
    match side.recv().await {
        Message::Demand(demand) => {
            assert_eq!(demand.count, 4);
            assert_eq!(
                Resources::from_wire(demand.resources.as_ref()).unwrap(),
                unit
            );
        }
        other => panic!("expected the demand restated, got {other:?}"),
    }
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    assert!(matches!(side.recv().await, Message::Kill(k) if k.task_id == "t-9"));
    assert!(matches!(next_event(&mut events).await, Event::Reregistered(id) if id == "fw-1"));

    // The offer of the old connection is void: accepting it reports the task lost.
    driver
        .accept(
            "o-1",
            vec![task("t-0", "true", &Resources::parse("cpus:1").unwrap())],
        )
        .unwrap();
    let lost = expect_status(next_event(&mut events).await);
    assert_eq!(
        (lost.task_id.as_str(), lost.reason.as_str()),
        ("t-0", "launch_dropped")
    );
    side.barrier(2).await;
}

#[tokio::test]
async fn a_version_mismatch_ends_run_without_retrying() {
    let master = FakeMaster::bind().await;
    let (scheduler, _events) = RecordingScheduler::new();
    let running = tokio::spawn(run(master.config("fw"), scheduler));

    let mut side = master.accept().await;
    assert!(matches!(side.recv().await, Message::Hello(_)));
    let mut error = ProtoError::new(ErrorCode::VersionMismatch, "version 1 is not spoken here");
    error.supported_versions = vec![7];
    side.send(Message::Error(error)).await;

    let result = timeout(PATIENCE, running).await.unwrap().unwrap();
    match result {
        Err(SdkError::VersionMismatch(text)) => {
            assert!(
                text.contains("[7]") && text.contains("not spoken"),
                "{text}"
            );
        }
        other => panic!("expected VersionMismatch, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn a_conflicting_framework_id_is_refused() {
    let master = FakeMaster::bind().await;
    let (scheduler, _events) = RecordingScheduler::new();
    let mut config = master.config("fw");
    config.framework_id = Some("fw-taken".into());
    let running = tokio::spawn(run(config, scheduler));

    let mut side = master.accept().await;
    side.handshake().await;
    assert_eq!(side.expect_subscribe().await.framework_id, "fw-taken");
    side.send(Message::Error(ProtoError::new(
        ErrorCode::FrameworkConflict,
        "fw-taken is connected elsewhere",
    )))
    .await;
    let result = timeout(PATIENCE, running).await.unwrap().unwrap();
    assert!(
        matches!(&result, Err(SdkError::Refused(text)) if text.contains("elsewhere")),
        "{:?}",
        result.err()
    );
}

#[tokio::test]
async fn stop_tears_down_and_returns_the_scheduler() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    let (_, driver) = registered(&mut events).await;

    driver.stop().unwrap();
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let scheduler = timeout(PATIENCE, running).await.unwrap().unwrap().unwrap();
    assert!(scheduler.accept_with.is_none());
    assert_eq!(driver.revive(), Err(DriverStopped));
}

#[tokio::test]
async fn a_closing_error_reconnects_after_telling_the_scheduler() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    registered(&mut events).await;

    side.send(Message::Error(ProtoError::new(
        ErrorCode::UnexpectedMessage,
        "not now",
    )))
    .await;
    assert!(matches!(
        next_event(&mut events).await,
        Event::Error(ErrorCode::UnexpectedMessage, text) if text == "not now"
    ));
    assert!(matches!(next_event(&mut events).await, Event::Disconnected));
    let (_side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.framework_id, "fw-1");
    assert!(matches!(
        next_event(&mut events).await,
        Event::Reregistered(_)
    ));
}

#[tokio::test]
async fn a_silent_master_is_detected_by_heartbeats() {
    let master = FakeMaster::bind().await;
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(master.config("fw"), scheduler));
    let mut side = master.accept().await;
    side.handshake().await;
    side.expect_subscribe().await;
    side.send(Message::Subscribed(Subscribed {
        framework_id: "fw-1".into(),
        heartbeat_interval_ms: 50,
    }))
    .await;
    registered(&mut events).await;
    assert!(matches!(side.recv().await, Message::Ping(_)));
    // Never answer: after three silent intervals the SDK gives the connection up.
    assert!(matches!(next_event(&mut events).await, Event::Disconnected));
    let (_side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.framework_id, "fw-1");
}

#[tokio::test]
async fn an_unreachable_master_is_given_up_on_when_configured() {
    let master = FakeMaster::bind().await;
    let mut config = master.config("fw");
    drop(master); // nothing listens on that port any more
    config.give_up_after = Some(Duration::from_millis(300));
    let (scheduler, _events) = RecordingScheduler::new();
    let result = timeout(PATIENCE, run(config, scheduler)).await.unwrap();
    match result {
        Err(SdkError::Connect { reason, .. }) => assert!(reason.contains("gave up"), "{reason}"),
        other => panic!("expected Connect, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn an_invalid_config_is_refused_before_connecting() {
    let master = FakeMaster::bind().await;
    let mut config = master.config("fw");
    config.weight = -1.0;
    let (scheduler, _events) = RecordingScheduler::new();
    let result = run(config, scheduler).await;
    assert!(matches!(result, Err(SdkError::InvalidConfig(text)) if text.contains("weight")));
}
