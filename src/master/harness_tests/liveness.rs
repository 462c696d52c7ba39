//! A pause of the master itself (SIGSTOP, a frozen disk) never declares its agents lost; an
//! agent still silent after the pause is lost a full `agent_timeout` later.

use std::time::Duration;

use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{AgentHeartbeat, Message};

use super::super::harness::{res, Harness};
use super::super::liveness::PauseDetector;
use super::running;

fn heartbeat(agent_id: &str) -> Message {
    Message::AgentHeartbeat(AgentHeartbeat {
        agent_id: agent_id.into(),
        free: Some(res("cpus:3;mem:896").to_wire()),
        ..Default::default()
    })
}

/// The actor running normally for `span`: its ticker fires every `tick_interval`.
fn ticking(h: &mut Harness, ticks: &mut PauseDetector, span: Duration) {
    let every = h.state.tick_interval();
    let mut waited = Duration::ZERO;
    while waited < span {
        let step = every.min(span - waited);
        h.advance(step);
        waited += step;
        h.timer_fired(ticks);
    }
}

#[test]
fn a_pause_of_the_master_longer_than_agent_timeout_loses_no_agent() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    let mut ticks = PauseDetector::new(h.state.tick_interval());
    h.timer_fired(&mut ticks);
    // Stopped for 20 s (agent_timeout is 15 s): no tick ran, no heartbeat was read. The first
    // tick after it comes before the heartbeats waiting in the socket.
    h.advance(Duration::from_secs(20));
    h.timer_fired(&mut ticks);
    h.expect_nothing(fw.conn);
    h.expect_nothing(agent);
    assert_eq!(h.snapshot().agents[0].state, "connected");
    assert_eq!(h.snapshot().counters.agents_lost, 0);
    // Then the heartbeat is read, and the agent lives on.
    h.send(agent, heartbeat("a1"));
    h.run_for(Duration::from_secs(10));
    h.expect_nothing(fw.conn);
    assert_eq!(h.snapshot().agents[0].state, "connected");
}

#[test]
fn an_agent_silent_after_the_pause_is_lost_a_full_timeout_after_its_last_heartbeat() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    let mut ticks = PauseDetector::new(h.state.tick_interval());
    h.timer_fired(&mut ticks);
    // Last heard 5 s before a 20 s pause.
    ticking(&mut h, &mut ticks, Duration::from_secs(5));
    h.advance(Duration::from_secs(20));
    h.timer_fired(&mut ticks);
    assert_eq!(h.snapshot().agents[0].state, "connected");
    // 15 s of running master in all: 5 before the pause and the one tick interval the pause
    // was due to take anyway, so 10 s less that interval after it.
    let after = Duration::from_secs(10) - h.state.tick_interval();
    ticking(&mut h, &mut ticks, after - Duration::from_millis(1));
    h.expect_nothing(fw.conn);
    ticking(&mut h, &mut ticks, Duration::from_millis(1));
    let lost = h.sent(fw.conn);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(h.snapshot().agents[0].state, "lost");
}
