//! The framework conversation: subscribe, refusals, failover, removal, teardown.

use ringmaster_proto::{
    Demand, ErrorCode, KillTask, Message, Ping, Pong, Rescind, RunTasks, Subscribe, Subscribed,
    TaskState, Teardown,
};
use tokio::time::Duration;

use super::super::harness::{error, subscribe, Fw, Harness, Out};
use super::{running, status, update};

fn subscribed(id: &str) -> Out {
    Out::Msg(Message::Subscribed(Subscribed {
        framework_id: id.into(),
        heartbeat_interval_ms: 1000,
    }))
}

/// Subscribes again with `fw`'s id on a new connection.
fn resubscribe(h: &mut Harness, fw: &Fw, failover_secs: f64) -> u64 {
    h.connect(Message::Subscribe(Subscribe {
        framework_id: fw.id.clone(),
        failover_timeout_secs: failover_secs,
        ..subscribe("web")
    }))
}

#[test]
fn subscribe_assigns_an_id_and_the_heartbeat_interval() {
    let mut h = Harness::new();
    let conn = h.connect(Message::Subscribe(subscribe("web")));
    assert_eq!(h.sent(conn), vec![subscribed("0-F1")]);
    let snap = h.snapshot();
    let f = &snap.frameworks[0];
    assert_eq!(
        (
            f.id.as_str(),
            f.name.as_str(),
            f.user.as_str(),
            f.weight,
            f.connected
        ),
        ("0-F1", "web", "web", 1.0, true)
    );
}

#[test]
fn subscribe_with_bad_fields_is_refused_and_closed() {
    let cases = [
        (
            Subscribe {
                name: " ".into(),
                ..subscribe("web")
            },
            "Subscribe: name is empty",
        ),
        (
            Subscribe {
                weight: -1.0,
                ..subscribe("web")
            },
            "Subscribe: weight must be a positive number, got -1",
        ),
        (
            Subscribe {
                failover_timeout_secs: 1e9,
                ..subscribe("web")
            },
            "Subscribe: failover_timeout_secs must be within 0..=604800, got 1000000000",
        ),
        (
            Subscribe {
                partition: "g p u".into(),
                ..subscribe("web")
            },
            "Subscribe: partition \"g p u\" has spaces or control characters",
        ),
    ];
    for (bad, why) in cases {
        let mut h = Harness::new();
        let conn = h.connect(Message::Subscribe(bad));
        assert_eq!(
            h.sent(conn),
            vec![Out::Close(error(ErrorCode::InvalidRequest, why))]
        );
        assert!(h.snapshot().frameworks.is_empty(), "{why}");
    }
}

#[test]
fn resubscribing_within_the_failover_timeout_takes_over_and_resends_unacknowledged_updates() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    // FINISHED goes out at 1 s and is never acknowledged.
    h.advance(Duration::from_secs(1));
    h.status(agent, &fw, "t1", TaskState::TaskFinished);
    let finished = h.expect_update(&fw);
    h.disconnect(fw.conn);
    h.advance_and_tick(Duration::from_secs(59));
    let conn = resubscribe(&mut h, &fw, 60.0);
    assert_eq!(
        h.sent(conn),
        vec![subscribed(&fw.id), update(finished.clone())]
    );
    assert_eq!(finished.update_id, "0-U3");
    assert_eq!(finished.state(), TaskState::TaskFinished);
    let f = &h.snapshot().frameworks[0];
    assert!(f.connected);
    assert_eq!(h.snapshot().counters.frameworks_removed, 0);
}

#[test]
fn a_second_connection_for_a_connected_framework_is_refused() {
    let mut h = Harness::new();
    let fw = h.framework("web");
    let conn = resubscribe(&mut h, &fw, 60.0);
    assert_eq!(
        h.sent(conn),
        vec![Out::Close(error(
            ErrorCode::FrameworkConflict,
            "framework 0-F1 is connected on another connection"
        ))]
    );
    // The first connection still holds the framework.
    h.send(fw.conn, Message::Ping(Ping { nonce: 3 }));
    assert_eq!(h.messages(fw.conn), vec![Message::Pong(Pong { nonce: 3 })]);
}

#[test]
fn failover_timeout_expiry_kills_the_tasks_and_removes_the_framework() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework_with(Subscribe {
        failover_timeout_secs: 10.0,
        ..subscribe("web")
    });
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    h.disconnect(fw.conn);
    h.advance_and_tick(Duration::from_secs(10) - Duration::from_millis(1));
    h.expect_nothing(agent);
    assert_eq!(h.snapshot().frameworks.len(), 1);
    h.advance_and_tick(Duration::from_millis(1));
    assert_eq!(
        h.messages(agent),
        vec![Message::KillTask(KillTask {
            leader_term: 0,
            task_id: "t1".into(),
            framework_id: fw.id.clone(),
            reason: "framework_failover_timeout".into(),
        })]
    );
    let snap = h.snapshot();
    assert!(snap.frameworks.is_empty());
    assert_eq!(snap.counters.frameworks_removed, 1);
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskKilled));
    assert_eq!(snap.agents[0].free, "cpus:4;mem:1024");
}

#[test]
fn a_removed_framework_cannot_subscribe_again() {
    let mut h = Harness::new();
    let fw = h.framework_with(Subscribe {
        failover_timeout_secs: 1.0,
        ..subscribe("web")
    });
    h.disconnect(fw.conn);
    h.advance_and_tick(Duration::from_secs(1));
    let conn = resubscribe(&mut h, &fw, 1.0);
    assert_eq!(
        h.sent(conn),
        vec![Out::Close(error(
            ErrorCode::InvalidRequest,
            "framework 0-F1 was removed (torn down or failover timeout expired); subscribe without an id"
        ))]
    );
}

#[test]
fn framework_disconnect_returns_its_offers_to_the_pool() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.offer_for(&fw, "cpus:1;mem:128");
    assert_eq!(h.snapshot().offered, "cpus:4;mem:1024");
    h.disconnect(fw.conn);
    let snap = h.snapshot();
    assert!(snap.offers.is_empty());
    assert_eq!(snap.free, "cpus:4;mem:1024");
    assert_eq!(snap.counters.offers_rescinded, 1);
    // Another framework gets the agent.
    let other = h.framework("batch");
    let offer = h.offer_for(&other, "cpus:1;mem:128");
    assert_eq!(offer.agent_id, "a1");
}

#[test]
fn teardown_kills_the_tasks_rescinds_the_offers_and_removes_the_framework() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.send(fw.conn, Message::Teardown(Teardown {}));
    assert_eq!(
        h.messages(agent),
        vec![Message::KillTask(KillTask {
            leader_term: 0,
            task_id: "t1".into(),
            framework_id: fw.id.clone(),
            reason: "framework_teardown".into(),
        })]
    );
    assert_eq!(
        h.sent(fw.conn),
        vec![
            Out::Msg(Message::Rescind(Rescind {
                offer_id: offer.offer_id,
                reason: "framework_teardown".into(),
            })),
            update(status(
                &h,
                &fw,
                "t1",
                "a1",
                TaskState::TaskKilled,
                "framework_teardown",
                "the framework was removed",
                "0-U3",
            )),
        ]
    );
    let snap = h.snapshot();
    assert!(snap.frameworks.is_empty());
    assert_eq!(snap.free, "cpus:4;mem:1024");
    // The connection no longer speaks for the framework.
    h.send(fw.conn, Message::Ping(Ping { nonce: 1 }));
    h.expect_nothing(fw.conn);
}

#[test]
fn a_demand_with_empty_resources_is_an_error_that_keeps_the_connection() {
    let mut h = Harness::new();
    let fw = h.framework("web");
    h.send(
        fw.conn,
        Message::Demand(Demand {
            resources: None,
            count: 2,
        }),
    );
    assert_eq!(
        h.expect_error(fw.conn),
        error(ErrorCode::InvalidRequest, "Demand: resources are empty")
    );
    h.send(fw.conn, Message::Ping(Ping { nonce: 9 }));
    assert_eq!(h.messages(fw.conn), vec![Message::Pong(Pong { nonce: 9 })]);
}

#[test]
fn a_framework_sending_an_agent_message_is_closed() {
    let mut h = Harness::new();
    let fw = h.framework("web");
    h.send(fw.conn, Message::RunTasks(RunTasks::default()));
    assert_eq!(
        h.sent(fw.conn),
        vec![Out::Close(error(
            ErrorCode::UnexpectedMessage,
            "RunTasks is not valid from a framework"
        ))]
    );
}
