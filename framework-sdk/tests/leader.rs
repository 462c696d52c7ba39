//! Several masters: the SDK follows `NOT_LEADER` to the leader and moves past masters that do
//! not answer, keeping its framework id, against scripted fake masters over real TCP.

mod support;

use ringmaster_proto::{Message, Subscribed};
use ringmaster_sdk::{run, ErrorCode, ProtoError};
use support::*;

fn not_leader(leader: &str) -> Message {
    let mut error = ProtoError::new(ErrorCode::NotLeader, "this master is a follower");
    error.leader = leader.to_string();
    Message::Error(error)
}

/// An address nothing listens on (bound, then closed).
async fn closed_address() -> String {
    let gone = FakeMaster::bind().await;
    gone.addr.clone()
}

#[tokio::test]
async fn not_leader_sends_the_framework_to_the_named_leader() {
    let follower = FakeMaster::bind().await;
    let leader = FakeMaster::bind().await;
    // Only the follower is configured: the leader it names is followed all the same.
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(follower.config("fw"), scheduler));

    let mut side = follower.accept().await;
    side.handshake().await;
    let subscribe = side.expect_subscribe().await;
    assert_eq!(subscribe.framework_id, "");
    side.send(not_leader(&leader.addr)).await;

    let (_side, subscribe) = leader.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.name, "fw");
    let (id, _driver) = registered(&mut events).await;
    assert_eq!(id, "fw-1");
}

#[tokio::test]
async fn a_deposed_leader_hands_the_framework_over_with_its_id() {
    let first = FakeMaster::bind().await;
    let second = FakeMaster::bind().await;
    let mut config = first.config("fw");
    config.master = format!("{},{}", first.addr, second.addr);
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(config, scheduler));

    let (mut side, _) = first.accept_subscribed("fw-1").await;
    let (_, driver) = registered(&mut events).await;
    // Deposed while serving: NOT_LEADER names the new leader, then the connection closes.
    side.send(not_leader(&second.addr)).await;
    assert!(matches!(
        next_event(&mut events).await,
        Event::Error(ErrorCode::NotLeader, _)
    ));
    assert!(matches!(next_event(&mut events).await, Event::Disconnected));
    driver.kill("t-1").unwrap();
    drop(side);

    let mut side = second.accept().await;
    side.handshake().await;
    let subscribe = side.expect_subscribe().await;
    assert_eq!(subscribe.framework_id, "fw-1", "the framework id is kept");
    side.send(Message::Subscribed(Subscribed {
        framework_id: "fw-1".into(),
        heartbeat_interval_ms: 0,
    }))
    .await;
    // What was asked while switching reaches the new leader.
    assert!(matches!(side.recv().await, Message::Kill(k) if k.task_id == "t-1"));
    assert!(matches!(next_event(&mut events).await, Event::Reregistered(id) if id == "fw-1"));
}

#[tokio::test]
async fn a_refused_connection_and_an_unknown_leader_move_to_the_next_master() {
    let closed = closed_address().await;
    let follower = FakeMaster::bind().await;
    let leader = FakeMaster::bind().await;
    let mut config = leader.config("fw");
    config.master = format!("{closed},{},{}", follower.addr, leader.addr);
    let (scheduler, mut events) = RecordingScheduler::new();
    let _running = tokio::spawn(run(config, scheduler));

    // The first master refuses the connection: the follower is next; it knows no leader.
    let mut side = follower.accept().await;
    side.handshake().await;
    side.expect_subscribe().await;
    side.send(not_leader("")).await;
    // So the third master of the list is tried, and it leads.
    let (_side, _) = leader.accept_subscribed("fw-7").await;
    let (id, _) = registered(&mut events).await;
    assert_eq!(id, "fw-7");
}
