//! Telling a pause of the master from a silent agent.
//!
//! An agent is lost when the master has heard nothing from it for `agent_timeout`. But "heard"
//! needs the master to be running: when the master process itself is stopped (SIGSTOP, a frozen
//! disk under the registry, a long GC-like stall of the host), the agents' heartbeats pile up in
//! the sockets, and the first timer tick after the pause would find every deadline passed before
//! a single one of those heartbeats is read. So the actor watches its own timer: the ticker is
//! due every `tick_interval`, and a tick that comes much later than that means the master did
//! not run in between. That stall is not the agents' fault; [`PauseDetector`] measures it and the
//! master moves every agent's deadline back by it (`MasterState::forgive_pause`), so liveness is
//! judged only from time the master was able to listen (Mesos counts missed pings for the same
//! reason).

use std::time::Duration;

use tokio::time::Instant;

use super::state::MasterState;

/// Watches the actor's timer ticks for stalls.
#[derive(Debug, Clone)]
pub(crate) struct PauseDetector {
    /// How often ticks are due.
    every: Duration,
    last: Option<Instant>,
}

impl PauseDetector {
    /// A detector for ticks due every `every`.
    pub fn new(every: Duration) -> Self {
        PauseDetector { every, last: None }
    }

    /// Records a tick at `now`; returns how long the master stalled since the previous tick
    /// beyond the tick interval, when that is more than a tick interval and at least a second
    /// (smaller delays are ordinary scheduling noise).
    pub fn tick(&mut self, now: Instant) -> Option<Duration> {
        let last = self.last.replace(now)?;
        let stalled = now
            .saturating_duration_since(last)
            .saturating_sub(self.every);
        (stalled > self.every && stalled >= Duration::from_secs(1)).then_some(stalled)
    }
}

impl MasterState {
    /// The actor's timer fired at `now`: first forgive any stall of the master itself that
    /// `ticks` saw, then run the timers as usual.
    pub(crate) fn timer_fired(&mut self, ticks: &mut PauseDetector, now: Instant) {
        if let Some(stalled) = ticks.tick(now) {
            self.forgive_pause(stalled, now);
        }
        self.tick(now);
    }

    /// The master itself did not run for `stalled`: that time does not count against any
    /// agent, so every deadline moves back by it (a heartbeat time never past `now`).
    pub(crate) fn forgive_pause(&mut self, stalled: Duration, now: Instant) {
        tracing::warn!(
            stalled_ms = stalled.as_millis() as u64,
            "the master did not run for a while; agent deadlines move back by that much"
        );
        for agent in self.agents.values_mut().filter(|a| !a.lost) {
            agent.last_heartbeat = (agent.last_heartbeat + stalled).min(now);
            if let Some(deadline) = &mut agent.reregister_by {
                *deadline += stalled;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_ticks_and_small_delays_are_no_pause() {
        let start = Instant::now();
        let mut d = PauseDetector::new(Duration::from_millis(500));
        assert_eq!(
            d.tick(start),
            None,
            "the first tick has nothing to compare with"
        );
        let table = [
            (500, None),
            (1_000, None),
            // 900 ms late: more than a tick, under a second.
            (2_400, None),
            // Stopped for 20 s: the stall is what came beyond the due tick.
            (22_400, Some(19_500)),
            (22_900, None),
        ];
        let mut at = 0;
        for (ms, want) in table {
            let got = d.tick(start + Duration::from_millis(ms));
            assert_eq!(
                got,
                want.map(Duration::from_millis),
                "tick at {ms} ms after {at} ms"
            );
            at = ms;
        }
    }

    #[test]
    fn a_slow_tick_interval_needs_a_stall_longer_than_itself() {
        let start = Instant::now();
        let mut d = PauseDetector::new(Duration::from_secs(2));
        d.tick(start);
        assert_eq!(
            d.tick(start + Duration::from_secs(5)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(d.tick(start + Duration::from_secs(8)), None);
    }
}
