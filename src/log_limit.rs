//! A log filter for openraft's repeated complaints: while a master of the group is down, its
//! peers' openraft logs an ERROR for every heartbeat, vote and read confirmation that cannot
//! reach it (five lines a second at the default `election_timeout`). [`RepeatLimit`] lets one
//! line per peer and call site through every [`RAFT_REPEAT_EVERY`] and drops the rest; other
//! events pass untouched.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// One line per peer and call site this often.
pub const RAFT_REPEAT_EVERY: Duration = Duration::from_secs(30);

/// Call sites and peers remembered at most; older entries are dropped first when full.
const REMEMBERED: usize = 1024;

/// See the module doc.
pub struct RepeatLimit {
    shown: Mutex<Shown<(Identifier, String)>>,
}

impl RepeatLimit {
    pub fn new(every: Duration) -> Self {
        RepeatLimit {
            shown: Mutex::new(Shown::new(every)),
        }
    }
}

/// When each key was last let through.
struct Shown<K> {
    every: Duration,
    at: HashMap<K, Instant>,
}

impl<K: std::hash::Hash + Eq> Shown<K> {
    fn new(every: Duration) -> Self {
        Shown {
            every,
            at: HashMap::new(),
        }
    }

    /// Whether `key` is let through at `now`: not within `every` of the last time it was.
    fn show(&mut self, key: K, now: Instant) -> bool {
        let every = self.every;
        if self
            .at
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < every)
        {
            return false;
        }
        if self.at.len() >= REMEMBERED {
            self.at.retain(|_, at| now.duration_since(*at) < every);
            if self.at.len() >= REMEMBERED {
                self.at.clear();
            }
        }
        self.at.insert(key, now);
        true
    }
}

/// The `target` field openraft gives the peer a line is about (empty when none).
#[derive(Default)]
struct Peer(String);

impl Visit for Peer {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "target" {
            self.0 = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "target" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S> Filter<S> for RepeatLimit {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        // Levels order by verbosity: anything above WARN (INFO, DEBUG, TRACE) passes.
        if !meta.target().starts_with("openraft") || *meta.level() > Level::WARN {
            return true;
        }
        let mut peer = Peer::default();
        event.record(&mut peer);
        self.shown
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .show((meta.callsite(), peer.0), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::Layer;

    /// Counts the events that reach it.
    struct Count(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Count {
        fn on_event(&self, _event: &Event<'_>, _cx: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn one_line_per_peer_and_call_site_passes_and_other_events_all_do() {
        let seen = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry()
            .with(Count(seen.clone()).with_filter(RepeatLimit::new(Duration::from_secs(3600))));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..5 {
                tracing::error!(target: "openraft::core", { target = tracing::field::display(3u64) }, "unreachable");
            }
            tracing::error!(target: "openraft::core", { target = tracing::field::display(2u64) }, "unreachable");
            for _ in 0..3 {
                tracing::info!(target: "openraft::core", { target = tracing::field::display(3u64) }, "noisy but info");
                tracing::error!(target: "ringmaster::master", "our own errors all pass");
            }
        });
        // peer 3 once, peer 2 once, three infos, three of ours.
        assert_eq!(seen.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn a_line_passes_again_after_the_interval() {
        let mut shown = Shown::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert!(shown.show("3", t0));
        assert!(shown.show("2", t0));
        assert!(!shown.show("3", t0 + Duration::from_secs(29)));
        assert!(shown.show("3", t0 + Duration::from_secs(30)));
    }
}
