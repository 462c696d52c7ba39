//! The agent conversation: registration, re-registration, refusals, heartbeats, disconnection
//! and loss.

use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    AgentHeartbeat, AgentRegistered, Demand, ErrorCode, KillTask, Message, Ping, Pong, Rescind,
    TaskState, TaskStatus,
};
use tokio::time::Duration;

use super::super::harness::{error, register, res, Harness, Out};
use super::{running, status, update};

fn registered(id: &str) -> Out {
    Out::Msg(Message::AgentRegistered(AgentRegistered {
        agent_id: id.into(),
        heartbeat_interval_ms: 1000,
    }))
}

#[test]
fn agent_registers_and_is_told_its_id_and_heartbeat_interval() {
    let mut h = Harness::new();
    let conn = h.connect(Message::RegisterAgent(register("a1", "cpus:4;mem:1024")));
    assert_eq!(h.sent(conn), vec![registered("a1")]);
    let snap = h.snapshot();
    assert_eq!(snap.agents.len(), 1);
    let a = &snap.agents[0];
    assert_eq!(
        (a.id.as_str(), a.hostname.as_str(), a.state.as_str()),
        ("a1", "a1", "connected")
    );
    assert_eq!(
        (a.total.as_str(), a.free.as_str()),
        ("cpus:4;mem:1024", "cpus:4;mem:1024")
    );
    assert_eq!(snap.total, "cpus:4;mem:1024");
    // Registration asks for an allocation run within allocation_interval.
    assert_eq!(
        h.allocation_due(),
        Some(h.now() + Duration::from_millis(20))
    );
}

#[test]
fn agent_without_an_id_gets_a_minted_one() {
    let mut h = Harness::new();
    let conn = h.connect(Message::RegisterAgent(register("", "cpus:1;mem:64")));
    assert_eq!(h.sent(conn), vec![registered("0-A1")]);
    assert_eq!(h.snapshot().agents[0].id, "0-A1");
}

#[test]
fn registration_with_empty_resources_is_refused_and_closed() {
    let mut h = Harness::new();
    let mut empty = register("a1", "cpus:1");
    empty.total = None;
    let conn = h.connect(Message::RegisterAgent(empty));
    assert_eq!(
        h.sent(conn),
        vec![Out::Close(error(
            ErrorCode::AgentRefused,
            "RegisterAgent: total resources are empty"
        ))]
    );
    assert!(h.snapshot().agents.is_empty());
    // Whatever it sends afterwards is ignored.
    h.send(conn, Message::Ping(Ping { nonce: 1 }));
    h.expect_nothing(conn);
}

#[test]
fn registration_with_bad_resource_names_is_refused_and_closed() {
    let mut h = Harness::new();
    let mut bad = register("a1", "cpus:1");
    bad.total.as_mut().unwrap().scalars[0].name = "9cpus".into();
    let conn = h.connect(Message::RegisterAgent(bad));
    let why = Resources::from_milli([("9cpus", 1000)]).unwrap_err();
    assert_eq!(
        h.sent(conn),
        vec![Out::Close(error(
            ErrorCode::AgentRefused,
            &format!("RegisterAgent: bad total resources: {why}")
        ))]
    );
    assert!(h.snapshot().agents.is_empty());
}

#[test]
fn a_first_message_other_than_register_or_subscribe_is_refused() {
    let mut h = Harness::new();
    let conn = h.connect(Message::Demand(Demand::default()));
    assert_eq!(
        h.sent(conn),
        vec![Out::Close(error(
            ErrorCode::NotRegistered,
            "Demand before RegisterAgent or Subscribe"
        ))]
    );
}

#[test]
fn a_second_live_connection_for_an_agent_id_is_refused() {
    let mut h = Harness::new();
    let first = h.agent("a1", "cpus:4;mem:1024");
    let second = h.connect(Message::RegisterAgent(register("a1", "cpus:8;mem:1024")));
    assert_eq!(
        h.sent(second),
        vec![Out::Close(error(
            ErrorCode::FrameworkConflict,
            "agent id a1 is already registered on a live connection"
        ))]
    );
    // The first registration stands, unchanged.
    let snap = h.snapshot();
    assert_eq!(snap.agents[0].total, "cpus:4;mem:1024");
    assert!(snap.agents[0].connected);
    h.send(first, Message::Ping(Ping { nonce: 7 }));
    assert_eq!(h.messages(first), vec![Message::Pong(Pong { nonce: 7 })]);
    assert_eq!(
        h.history(first),
        vec![registered("a1"), Out::Msg(Message::Pong(Pong { nonce: 7 }))]
    );
}

#[test]
fn an_agent_sending_a_framework_message_is_closed() {
    let mut h = Harness::new();
    let conn = h.agent("a1", "cpus:1;mem:64");
    h.send(conn, Message::Demand(Demand::default()));
    assert_eq!(
        h.sent(conn),
        vec![Out::Close(error(
            ErrorCode::UnexpectedMessage,
            "Demand is not valid from an agent"
        ))]
    );
}

#[test]
fn reregistering_on_a_new_connection_adopts_the_running_task_silently() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, old, "t1", "cpus:1;mem:128");
    h.disconnect(old);
    h.advance_and_tick(Duration::from_secs(5));
    let mut again = register("a1", "cpus:4;mem:1024");
    again.tasks = vec![TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    }];
    let new = h.connect(Message::RegisterAgent(again));
    assert_eq!(h.sent(new), vec![registered("a1")]);
    // Same state as before: the framework is told nothing.
    h.expect_nothing(fw.conn);
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskRunning));
    let a = &h.snapshot().agents[0];
    assert_eq!((a.state.as_str(), a.tasks), ("connected", 1));
    assert_eq!(a.free, "cpus:3;mem:896");
}

#[test]
fn reregistering_without_a_task_reports_it_lost() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, old, "t1", "cpus:1;mem:128");
    h.disconnect(old);
    let new = h.connect(Message::RegisterAgent(register("a1", "cpus:4;mem:1024")));
    assert_eq!(h.sent(new), vec![registered("a1")]);
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskLost,
            "agent_reregistered",
            "the agent re-registered without this task",
            "0-U3",
        ))]
    );
    assert_eq!(h.snapshot().agents[0].free, "cpus:4;mem:1024");
}

#[test]
fn reregistering_with_an_unknown_task_kills_it() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    h.disconnect(old);
    let mut again = register("a1", "cpus:4;mem:1024");
    again.tasks = vec![TaskStatus {
        task_id: "ghost".into(),
        framework_id: "nobody".into(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    }];
    let new = h.connect(Message::RegisterAgent(again));
    assert_eq!(
        h.sent(new),
        vec![
            registered("a1"),
            Out::Msg(Message::KillTask(KillTask {
                leader_term: 0,
                task_id: "ghost".into(),
                framework_id: "nobody".into(),
                reason: "unknown_task".into(),
            })),
        ]
    );
}

#[test]
fn agent_disconnect_rescinds_its_offers_but_keeps_its_tasks() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.disconnect(agent);
    assert_eq!(
        h.messages(fw.conn),
        vec![Message::Rescind(Rescind {
            offer_id: offer.offer_id,
            reason: "agent_disconnected".into(),
        })]
    );
    // Not lost yet: the task keeps running, nothing is offered on the agent.
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskRunning));
    h.settle();
    h.expect_nothing(fw.conn);
    let snap = h.snapshot();
    assert_eq!(snap.agents[0].state, "disconnected");
    assert!(snap.offers.is_empty());
    assert_eq!(snap.counters.agents_lost, 0);
}

#[test]
fn disconnected_agent_is_lost_after_agent_timeout_not_before() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    // The last sign of life is the RUNNING update.
    h.disconnect(agent);
    h.advance_and_tick(Duration::from_secs(15) - Duration::from_millis(1));
    h.expect_nothing(fw.conn);
    assert_eq!(h.snapshot().agents[0].state, "disconnected");
    h.advance_and_tick(Duration::from_millis(1));
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskLost,
            "agent_lost",
            "the agent stopped sending heartbeats",
            "0-U3",
        ))]
    );
    let snap = h.snapshot();
    assert_eq!(snap.agents[0].state, "lost");
    assert_eq!(snap.counters.agents_lost, 1);
    assert_eq!(snap.total, "");
}

#[test]
fn silent_connected_agent_is_lost_its_offers_rescinded_and_its_connection_closed() {
    let mut h = Harness::configured(|c| c.master.offer_timeout = Duration::from_secs(60));
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let offer = h.offer_for(&fw, "cpus:1;mem:128");
    h.advance_and_tick(Duration::from_secs(15));
    assert_eq!(
        h.messages(fw.conn),
        vec![Message::Rescind(Rescind {
            offer_id: offer.offer_id,
            reason: "agent_lost".into(),
        })]
    );
    assert_eq!(
        h.sent(agent),
        vec![Out::Close(error(
            ErrorCode::NotRegistered,
            "agent a1 was declared lost; re-register"
        ))]
    );
    assert_eq!(h.snapshot().agents[0].state, "lost");
}

#[test]
fn heartbeats_keep_an_agent_alive() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    for _ in 0..6 {
        h.run_for(Duration::from_secs(5));
        h.send(
            agent,
            Message::AgentHeartbeat(AgentHeartbeat {
                agent_id: "a1".into(),
                free: Some(res("cpus:3;mem:1000").to_wire()),
                ..Default::default()
            }),
        );
    }
    h.expect_nothing(agent);
    let a = &h.snapshot().agents[0];
    assert_eq!(a.state, "connected");
    assert_eq!(a.reported_free, "cpus:3;mem:1000");
    assert_eq!(a.last_heartbeat_secs, 0.0);
}

#[test]
fn a_lost_agent_that_comes_back_with_its_task_makes_it_running_again() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, old, "t1", "cpus:1;mem:128");
    h.disconnect(old);
    h.advance_and_tick(Duration::from_secs(15));
    let lost = h.expect_update(&fw);
    assert_eq!(
        (lost.state(), lost.reason.as_str()),
        (TaskState::TaskLost, "agent_lost")
    );
    let mut again = register("a1", "cpus:4;mem:1024");
    again.tasks = vec![TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    }];
    let new = h.connect(Message::RegisterAgent(again));
    assert_eq!(h.sent(new), vec![registered("a1")]);
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskRunning,
            "agent_reregistered",
            "the agent re-registered and still runs the task",
            "0-U4",
        ))]
    );
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.state.as_str(), a.free.as_str()),
        ("connected", "cpus:3;mem:896")
    );
}
