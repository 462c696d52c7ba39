//! Per-connection limits, so one misbehaving client cannot starve the others.
//!
//! (Two limits are not per connection and live elsewhere: the cap on connections open at once,
//! `limits.max_connections`, in [`super::listener`]; the small frame limit before a connection
//! registers, `limits.max_handshake_frame_bytes`, in [`super::task`].)
//!
//! - **Message rate**: a token bucket per connection ([`TokenBucket`], `limits.messages_per_sec`
//!   and `limits.burst`). A client that sends faster gets `RATE_LIMITED` and is closed.
//! - **Outstanding outbound messages**: the actor never blocks on a connection, so what it sends
//!   is queued; [`outbound_queue`] bounds that queue in messages (`limits.outbound_queue`) and
//!   in encoded bytes (`limits.outbound_queue_bytes`), so one connection's backlog cannot grow
//!   the master's memory past that, whatever it subscribed to. A client that
//!   stops reading fills its socket, then its queue, and is disconnected with `SLOW_CONSUMER`
//!   instead of growing the master's memory. The connection task is woken even while it is
//!   stuck writing, so the close does not wait on the peer.
//! - **Inbound work**: each connection task hands the actor one message at a time and waits for
//!   room in the shared event channel, so a connection never has more than one message queued
//!   to the actor beyond that channel; the rate limit keeps a flooder from filling it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::config::LimitsConfig;

/// What the actor asks a connection task to do.
#[derive(Debug)]
pub(crate) enum Outbound {
    Send(ringmaster_proto::Message),
    /// Send this error, then close the connection.
    Close(ringmaster_proto::Error),
}

/// A token bucket: `rate` tokens per second, at most `burst` saved up; one token per message.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(limits: &LimitsConfig, now: Instant) -> Self {
        let burst = limits.burst.max(1) as f64;
        TokenBucket {
            rate: limits.messages_per_sec.max(1) as f64,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token; false when the bucket is empty (the message is over the limit).
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A queued message and its encoded size. Boxed: the channel allocates its slots in blocks of
/// 32 per connection, and a `Message` inline would make each idle connection's block about
/// 7 KB (10,000 agents: 67 MB) instead of 256 bytes.
type Queued = Box<(Outbound, usize)>;

/// Shared between the actor's sender and the connection task's receiver.
#[derive(Debug)]
struct QueueShared {
    /// Messages sent by the actor and not yet taken by the connection task.
    queued: AtomicUsize,
    /// Their encoded size.
    queued_bytes: AtomicUsize,
    /// Set once when the queue overflowed: the connection is being closed.
    overflowed: AtomicBool,
    wake: Notify,
}

/// The actor's end of one connection's outbound queue.
#[derive(Debug, Clone)]
pub(crate) struct OutboundSender {
    tx: mpsc::UnboundedSender<Queued>,
    shared: Arc<QueueShared>,
    capacity: usize,
    capacity_bytes: usize,
}

/// The connection task's end.
#[derive(Debug)]
pub(crate) struct OutboundReceiver {
    rx: mpsc::UnboundedReceiver<Queued>,
    shared: Arc<QueueShared>,
    capacity: usize,
    capacity_bytes: usize,
}

/// Resolves when a queue overflows; see [`OutboundReceiver::overflow_signal`].
pub(crate) struct OverflowSignal {
    shared: Arc<QueueShared>,
}

impl OverflowSignal {
    /// Resolves once the queue has overflowed (at once if it already has).
    pub async fn wait(&self) {
        loop {
            let notified = self.shared.wake.notified();
            if self.shared.overflowed.load(Ordering::Relaxed) {
                return;
            }
            notified.await;
        }
    }
}

/// Why [`OutboundSender::send`] did not queue a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendRefused {
    /// This message overflowed the queue: the connection task has been told to close.
    Overflowed,
    /// The queue overflowed earlier (or the connection is gone); the message is dropped.
    Closing,
}

/// A queue of at most `capacity` unread messages of at most `capacity_bytes` encoded bytes in
/// all (a message is always let into an empty queue, and a `Close` is always let through).
pub(crate) fn outbound_queue(
    capacity: usize,
    capacity_bytes: usize,
) -> (OutboundSender, OutboundReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(QueueShared {
        queued: AtomicUsize::new(0),
        queued_bytes: AtomicUsize::new(0),
        overflowed: AtomicBool::new(false),
        wake: Notify::new(),
    });
    let capacity = capacity.max(1);
    (
        OutboundSender {
            tx,
            shared: shared.clone(),
            capacity,
            capacity_bytes,
        },
        OutboundReceiver {
            rx,
            shared,
            capacity,
            capacity_bytes,
        },
    )
}

impl OutboundSender {
    /// Queues `out`, or refuses it when the queue is full (and tells the connection to close).
    pub fn send(&self, out: Outbound) -> Result<(), SendRefused> {
        if self.shared.overflowed.load(Ordering::Relaxed) {
            return Err(SendRefused::Closing);
        }
        let bytes = match &out {
            Outbound::Send(message) => message.encoded_len(),
            Outbound::Close(_) => 0,
        };
        if let Outbound::Send(_) = out {
            let queued = self.shared.queued.load(Ordering::Relaxed);
            let queued_bytes = self.shared.queued_bytes.load(Ordering::Relaxed);
            if queued >= self.capacity
                || (queued > 0 && queued_bytes.saturating_add(bytes) > self.capacity_bytes)
            {
                self.shared.overflowed.store(true, Ordering::Relaxed);
                self.shared.wake.notify_one();
                return Err(SendRefused::Overflowed);
            }
            self.shared.queued.fetch_add(1, Ordering::Relaxed);
            self.shared.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        self.tx
            .send(Box::new((out, bytes)))
            .map_err(|_| SendRefused::Closing)
    }
}

impl OutboundReceiver {
    /// The next queued message; `None` when the actor dropped the sender.
    pub async fn recv(&mut self) -> Option<Outbound> {
        let out = self.rx.recv().await;
        self.taken(out)
    }

    /// A queued message, without waiting.
    pub fn try_recv(&mut self) -> Option<Outbound> {
        let out = self.rx.try_recv().ok();
        self.taken(out)
    }

    fn taken(&self, out: Option<Queued>) -> Option<Outbound> {
        let (out, bytes) = *out?;
        if let Outbound::Send(_) = out {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            self.shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        Some(out)
    }

    /// A handle to wait for the overflow while the receiver itself is borrowed (writing).
    pub fn overflow_signal(&self) -> OverflowSignal {
        OverflowSignal {
            shared: self.shared.clone(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::{Message, Ping};
    use std::time::Duration;

    fn limits(rate: u64, burst: u64) -> LimitsConfig {
        LimitsConfig {
            messages_per_sec: rate,
            burst,
            ..LimitsConfig::default()
        }
    }

    #[test]
    fn bucket_allows_the_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(&limits(10, 5), t0);
        assert!((0..5).all(|_| bucket.take(t0)));
        assert!(!bucket.take(t0));
        // 100 ms at 10/s: one more token.
        let t1 = t0 + Duration::from_millis(100);
        assert!(bucket.take(t1));
        assert!(!bucket.take(t1));
        // A long pause refills only up to the burst.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..100).filter(|_| bucket.take(t2)).count(), 5);
    }

    fn ping() -> Outbound {
        Outbound::Send(Message::Ping(Ping { nonce: 1 }))
    }

    #[tokio::test]
    async fn queue_overflows_once_and_wakes_the_reader() {
        let (tx, mut rx) = outbound_queue(2, 1 << 20);
        tx.send(ping()).unwrap();
        tx.send(ping()).unwrap();
        assert_eq!(tx.send(ping()), Err(SendRefused::Overflowed));
        assert_eq!(tx.send(ping()), Err(SendRefused::Closing));
        tokio::time::timeout(Duration::from_secs(5), rx.overflow_signal().wait())
            .await
            .expect("woken");
        // What was queued before the overflow can still be read.
        assert!(rx.try_recv().is_some());
        assert!(rx.try_recv().is_some());
        assert!(rx.try_recv().is_none());
    }

    fn offer_text(bytes: usize) -> Outbound {
        Outbound::Send(Message::Error(ringmaster_proto::Error::new(
            ringmaster_proto::ErrorCode::InvalidOffer,
            "x".repeat(bytes),
        )))
    }

    #[tokio::test]
    async fn queue_is_bounded_in_bytes_too() {
        let (tx, mut rx) = outbound_queue(1000, 10_000);
        // An empty queue takes a message of any size.
        tx.send(offer_text(50_000)).unwrap();
        assert!(rx.try_recv().is_some());
        for _ in 0..4 {
            tx.send(offer_text(2_000)).unwrap();
        }
        // About 8 KB queued: 2 KB more goes past 10,000 bytes.
        assert_eq!(tx.send(offer_text(2_000)), Err(SendRefused::Overflowed));
        tokio::time::timeout(Duration::from_secs(5), rx.overflow_signal().wait())
            .await
            .expect("woken");
    }

    #[tokio::test]
    async fn taking_messages_frees_their_bytes() {
        let (tx, mut rx) = outbound_queue(1000, 10_000);
        for _ in 0..100 {
            tx.send(offer_text(3_000)).unwrap();
            tx.send(offer_text(3_000)).unwrap();
            assert!(rx.recv().await.is_some());
            assert!(rx.recv().await.is_some());
        }
    }

    #[tokio::test]
    async fn reading_makes_room() {
        let (tx, mut rx) = outbound_queue(1, 1 << 20);
        for _ in 0..10 {
            tx.send(ping()).unwrap();
            assert!(rx.recv().await.is_some());
        }
        // A close is never refused for room.
        tx.send(ping()).unwrap();
        tx.send(Outbound::Close(ringmaster_proto::Error::new(
            ringmaster_proto::ErrorCode::ShuttingDown,
            "bye",
        )))
        .unwrap();
    }
}
