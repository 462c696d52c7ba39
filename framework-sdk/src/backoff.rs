//! Reconnect delays: exponential from 100 ms, doubling, capped.
//!
//! Kept apart from the session so the schedule is a pure, tested function.

use std::time::Duration;

/// The first delay after a lost connection or failed attempt.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// Delays between reconnect attempts: 100 ms, 200 ms, 400 ms, ... up to `max`.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Self {
        Backoff {
            next: INITIAL_BACKOFF.min(max),
            max,
        }
    }

    /// The delay to wait now; the following one is twice as long (capped).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the first delay, after a successful subscription.
    pub(crate) fn reset(&mut self) {
        self.next = INITIAL_BACKOFF.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(500));
        let delays: Vec<u64> = (0..5)
            .map(|_| backoff.next_delay().as_millis() as u64)
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 500, 500]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn a_cap_below_the_first_delay_wins() {
        let mut backoff = Backoff::new(Duration::from_millis(30));
        assert_eq!(backoff.next_delay(), Duration::from_millis(30));
        assert_eq!(backoff.next_delay(), Duration::from_millis(30));
    }
}
