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
//! - **Partial inbound frames** ([`FrameBudget`], [`Budgeted`]): the frame codec reserves room
//!   for a whole frame as soon as its 4-byte length prefix is read, so a peer that announces a
//!   large frame and sends it slowly (or never) holds that much of the master's memory. A frame
//!   of at most `limits.max_handshake_frame_bytes` (the small allowance every connection has,
//!   authenticated or not) is read freely; a larger one is read only once its whole length is
//!   reserved from one budget shared by all connections ([`PARTIAL_FRAME_BUDGET_BYTES`], at
//!   least one `master.max_frame_bytes` frame), and the reservation is given back when its last
//!   byte has been read. A connection whose frame does not fit waits, unread (the bytes stay in
//!   the kernel's socket buffer), until earlier large frames complete. So per connection the
//!   master holds at most one partial frame (at most `master.max_frame_bytes`), and in total at
//!   most the budget plus one allowance per open connection, registered or not.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch, AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
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

/// The bytes all connections together may hold in partial frames larger than the per-connection
/// allowance (`limits.max_handshake_frame_bytes`): 64 MiB, sixteen 4 MiB frames; raised to one
/// `master.max_frame_bytes` frame where that is larger, so any allowed frame can be read.
pub(crate) const PARTIAL_FRAME_BUDGET_BYTES: usize = 64 * 1024 * 1024;

/// A frame that holds a reservation must be complete this long after its length prefix, else
/// its connection is closed and the reservation given back: a peer that announces a large
/// frame and sends it slowly (or never) cannot keep others' large frames waiting. 30 s is a
/// 4 MiB frame at 140 KB/s.
pub(crate) const RESERVED_FRAME_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// What a [`FrameBudget`] is holding and how many connections wait for room, for observers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BudgetUse {
    /// Bytes reserved for large frames being read.
    pub held: usize,
    /// Connections whose next large frame waits for room.
    pub waiting: usize,
}

/// One budget of bytes for large partial inbound frames, shared by every connection of a
/// listener (see the module docs). Cloning shares it.
#[derive(Debug, Clone)]
pub(crate) struct FrameBudget {
    shared: Arc<BudgetShared>,
}

#[derive(Debug)]
struct BudgetShared {
    slots: Arc<Semaphore>,
    total: usize,
    /// Frames up to this size need no reservation.
    allowance: usize,
    /// Bytes reserved by frames being read (the semaphore's free permits also lack those
    /// handed, in part, to the first waiter).
    reserved: AtomicUsize,
    usage: watch::Sender<BudgetUse>,
}

impl FrameBudget {
    /// A budget of `total` bytes (at least `max_frame`, so every allowed frame fits) for frames
    /// larger than `allowance`.
    pub fn new(total: usize, allowance: usize, max_frame: usize) -> Self {
        let total = total
            .max(max_frame)
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        FrameBudget {
            shared: Arc::new(BudgetShared {
                slots: Arc::new(Semaphore::new(total)),
                total,
                allowance,
                reserved: AtomicUsize::new(0),
                usage: watch::Sender::new(BudgetUse::default()),
            }),
        }
    }

    /// The budget for a listener with these settings: [`PARTIAL_FRAME_BUDGET_BYTES`], the
    /// allowance `limits.max_handshake_frame_bytes`.
    pub fn for_config(config: &crate::config::Config) -> Self {
        let max_frame = config.master.max_frame_bytes;
        let allowance = config.limits.max_handshake_frame_bytes.min(max_frame);
        FrameBudget::new(PARTIAL_FRAME_BUDGET_BYTES, allowance, max_frame)
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn total(&self) -> usize {
        self.shared.total
    }

    /// Bytes reserved now.
    pub fn held(&self) -> usize {
        self.shared.reserved.load(Ordering::Relaxed)
    }

    #[cfg_attr(not(test), allow(dead_code))]
    /// Watches what the budget holds (changes on every reservation, release and wait).
    pub fn watch(&self) -> watch::Receiver<BudgetUse> {
        self.shared.usage.subscribe()
    }

    /// Whether a frame of `len` bytes needs a reservation.
    fn needs_reservation(&self, len: usize) -> bool {
        len > self.shared.allowance
    }

    fn publish(&self, waiting: isize) {
        let held = self.held();
        self.shared.usage.send_modify(|u| {
            u.held = held;
            u.waiting = u.waiting.saturating_add_signed(waiting);
        });
    }

    /// Reserves `len` bytes now, if there is room.
    fn try_reserve(&self, len: usize) -> Option<Reservation> {
        let permit = self
            .shared
            .slots
            .clone()
            .try_acquire_many_owned(len as u32)
            .ok()?;
        Some(Reservation::new(permit, self.clone()))
    }

    /// Waits for room for `len` bytes (in turn: the semaphore is fair).
    fn reserve(&self, len: usize) -> Waiting {
        self.publish(1);
        Waiting {
            acquire: Box::pin(self.shared.slots.clone().acquire_many_owned(len as u32)),
            budget: self.clone(),
        }
    }

    /// Wraps a connection's byte stream so its large frames are read only within this budget.
    /// `frame_limit`: the connection's current frame limit (see [`Budgeted::set_frame_limit`]).
    pub fn guard<S>(&self, stream: S, frame_limit: usize) -> Budgeted<S> {
        Budgeted {
            inner: stream,
            scan: FrameScan {
                budget: self.clone(),
                frame_limit: AtomicUsize::new(frame_limit),
                header: [0; 4],
                have: 0,
                remaining: None,
                held: None,
                waiting: None,
            },
            stash: Vec::new(),
            stash_at: 0,
            deadline: None,
        }
    }
}

/// Bytes reserved for one frame; given back when dropped.
#[derive(Debug)]
struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    budget: FrameBudget,
}

impl Reservation {
    fn new(permit: OwnedSemaphorePermit, budget: FrameBudget) -> Self {
        let bytes = permit.num_permits();
        budget.shared.reserved.fetch_add(bytes, Ordering::Relaxed);
        budget.publish(0);
        Reservation {
            permit: Some(permit),
            budget,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            let bytes = permit.num_permits();
            drop(permit);
            self.budget
                .shared
                .reserved
                .fetch_sub(bytes, Ordering::Relaxed);
        }
        self.budget.publish(0);
    }
}

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// A connection waiting for room in the budget.
struct Waiting {
    acquire: Acquire,
    budget: FrameBudget,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.budget.publish(-1);
    }
}

/// Follows the frames passing through a [`Budgeted`] stream: where each length prefix ends and
/// how much of the current frame is still to come.
struct FrameScan {
    budget: FrameBudget,
    /// Frames announced larger than this are refused by the codec at their prefix, unread:
    /// they need no reservation.
    frame_limit: AtomicUsize,
    header: [u8; 4],
    /// Bytes of the current length prefix seen.
    have: usize,
    /// Bytes of the current frame's body still to come (`None`: reading a length prefix).
    remaining: Option<usize>,
    /// The current frame's reservation.
    held: Option<Reservation>,
    waiting: Option<Waiting>,
}

impl FrameScan {
    /// Lets through as much of `bytes` (the next bytes of the stream) as the budget allows:
    /// `Ready(n)`, n >= 1, for the first `n`; `Pending` (the task woken when there is room)
    /// when not even the first may pass: it completes a large frame's length prefix.
    fn admit(&mut self, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<std::io::Result<usize>> {
        let mut at = 0;
        while at < bytes.len() {
            if let Some(remaining) = self.remaining {
                let take = remaining.min(bytes.len() - at);
                at += take;
                self.end_of_body(remaining - take);
                continue;
            }
            if self.have < 3 {
                self.header[self.have] = bytes[at];
                self.have += 1;
                at += 1;
                continue;
            }
            // This byte completes a length prefix: the codec will reserve the whole frame.
            let mut header = self.header;
            header[3] = bytes[at];
            let len = u32::from_be_bytes(header) as usize;
            let limit = self.frame_limit.load(Ordering::Relaxed);
            if self.held.is_none() && self.budget.needs_reservation(len) && len <= limit {
                if self.waiting.is_none() {
                    if let Some(reservation) = self.budget.try_reserve(len) {
                        self.held = Some(reservation);
                    } else if at > 0 {
                        // Deliver what came before; the prefix waits for the next read.
                        return Poll::Ready(Ok(at));
                    } else {
                        self.waiting = Some(self.budget.reserve(len));
                    }
                }
                if let Some(waiting) = &mut self.waiting {
                    match waiting.acquire.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(_)) => {
                            return Poll::Ready(Err(std::io::Error::other(
                                "the frame budget is closed",
                            )))
                        }
                        Poll::Ready(Ok(permit)) => {
                            let budget = waiting.budget.clone();
                            self.waiting = None;
                            self.held = Some(Reservation::new(permit, budget));
                        }
                    }
                }
            }
            self.have = 0;
            at += 1;
            self.end_of_body(len);
        }
        Poll::Ready(Ok(at))
    }

    /// `remaining` bytes of the current frame's body are still to come; at 0 the frame is
    /// complete and its reservation is given back.
    fn end_of_body(&mut self, remaining: usize) {
        if remaining == 0 {
            self.remaining = None;
            self.held = None;
        } else {
            self.remaining = Some(remaining);
        }
    }
}

/// A byte stream whose inbound frames larger than the allowance are let through only within a
/// [`FrameBudget`] (see the module docs). Writes pass straight through.
pub(crate) struct Budgeted<S> {
    inner: S,
    scan: FrameScan,
    /// Bytes read from `inner` but not yet let through (they complete a large frame's length
    /// prefix that waits for room), from `stash_at`.
    stash: Vec<u8>,
    stash_at: usize,
    /// While a reservation is held: when its frame must be complete
    /// ([`RESERVED_FRAME_DEADLINE`]).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Budgeted<S> {
    /// The frame limit the codec now applies (raise it with the codec's).
    pub fn set_frame_limit(&self, limit: usize) {
        self.scan.frame_limit.store(limit, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Budgeted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let result = this.read_within_budget(cx, buf);
        // A reservation gets its deadline when taken, and loses it with the reservation.
        match (this.scan.held.is_some(), &mut this.deadline) {
            (true, None) => {
                let mut sleep = Box::pin(tokio::time::sleep(RESERVED_FRAME_DEADLINE));
                // Registers the waker: the deadline wakes a reader that waits on its peer.
                let _ = sleep.as_mut().poll(cx);
                this.deadline = Some(sleep);
            }
            (false, Some(_)) => this.deadline = None,
            _ => {}
        }
        // Checked whether bytes came or not: a frame dripped byte by byte ends too.
        if let Some(deadline) = &mut this.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                this.scan.held = None;
                this.deadline = None;
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "a large frame was not completed within {} s of its length prefix",
                        RESERVED_FRAME_DEADLINE.as_secs()
                    ),
                )));
            }
        }
        result
    }
}

impl<S: AsyncRead + Unpin> Budgeted<S> {
    /// One read: stashed bytes first, else the stream's, let through as the budget allows.
    fn read_within_budget(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self;
        if this.stash_at < this.stash.len() {
            let end = this.stash.len().min(this.stash_at + buf.remaining());
            let n = match this.scan.admit(cx, &this.stash[this.stash_at..end]) {
                Poll::Ready(Ok(n)) => n,
                other => return other.map_ok(|_| ()),
            };
            buf.put_slice(&this.stash[this.stash_at..this.stash_at + n]);
            this.stash_at += n;
            if this.stash_at == this.stash.len() {
                this.stash = Vec::new();
                this.stash_at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = buf.filled().len() - before;
        if read == 0 {
            return Poll::Ready(Ok(()));
        }
        let admitted = this.scan.admit(cx, &buf.filled()[before..]);
        let n = match admitted {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => 0,
        };
        if n < read {
            this.stash = buf.filled()[before + n..].to_vec();
            this.stash_at = 0;
            buf.set_filled(before + n);
        }
        if n == 0 {
            // Nothing may pass yet: the waiting reservation wakes this task.
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Budgeted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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

    fn frame(bytes: usize) -> Vec<u8> {
        let message = Message::Error(ringmaster_proto::Error::new(
            ringmaster_proto::ErrorCode::InvalidOffer,
            "x".repeat(bytes),
        ));
        let body = prost::Message::encode_to_vec(&ringmaster_proto::Envelope::new(message));
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    /// Large frames are read only within the shared budget: a second connection's large frame
    /// waits (its small frame before it, in the same read, still passes) until the first
    /// one's frame is complete; frames within the allowance never wait.
    #[tokio::test]
    async fn large_frames_wait_for_room_in_the_shared_budget() {
        use ringmaster_proto::Connection;
        use tokio::io::AsyncWriteExt as _;
        let wait = Duration::from_secs(10);
        let budget = FrameBudget::new(10_000, 1_000, 10_000);
        let (big, small) = (frame(6_000), frame(100));
        let len = big.len() - 4;
        let (mut a_peer, a) = tokio::io::duplex(64 * 1024);
        let (mut b_peer, b) = tokio::io::duplex(64 * 1024);
        let mut a = Connection::with_max_frame(budget.guard(a, 10_000), 10_000);
        let mut b = Connection::with_max_frame(budget.guard(b, 10_000), 10_000);
        let mut usage = budget.watch();

        // A announces a large frame and sends part of it: reserved.
        a_peer.write_all(&big[..100]).await.unwrap();
        let a_read = tokio::spawn(async move { (a.recv().await.is_ok(), a) });
        tokio::time::timeout(wait, usage.wait_for(|u| u.held == len))
            .await
            .unwrap()
            .unwrap();
        // B sends a small frame and a large one in one write: the small one is read, the large
        // one waits, unread.
        let mut both = small.clone();
        both.extend_from_slice(&big);
        b_peer.write_all(&both).await.unwrap();
        assert!(matches!(b.recv().await, Ok(Some(Message::Error(_)))));
        let b_read = tokio::spawn(async move { b.recv().await.map(|m| m.is_some()) });
        tokio::time::timeout(wait, usage.wait_for(|u| u.waiting == 1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(budget.held(), len, "only A's frame is reserved");
        // A's frame completes: its bytes are given back and B's frame is read.
        a_peer.write_all(&big[100..]).await.unwrap();
        let (read, _a) = a_read.await.unwrap();
        assert!(read);
        assert!(tokio::time::timeout(wait, b_read)
            .await
            .unwrap()
            .unwrap()
            .unwrap());
        tokio::time::timeout(wait, usage.wait_for(|u| u.held == 0 && u.waiting == 0))
            .await
            .unwrap()
            .unwrap();
        assert!(budget.total() >= 10_000);
    }

    /// Before, a peer that announced a large frame and never finished it held its reservation
    /// for good, and other peers' large frames waited on it for ever.
    #[tokio::test(start_paused = true)]
    async fn a_reserved_frame_not_completed_in_time_closes_its_connection_and_frees_the_room() {
        use ringmaster_proto::Connection;
        use tokio::io::AsyncWriteExt as _;
        let budget = FrameBudget::new(10_000, 1_000, 10_000);
        let big = frame(6_000);
        let (mut peer, stream) = tokio::io::duplex(64 * 1024);
        let mut conn = Connection::with_max_frame(budget.guard(stream, 10_000), 10_000);
        peer.write_all(&big[..100]).await.unwrap();
        let read = tokio::spawn(async move { conn.recv().await.map(|m| m.is_some()) });
        let mut usage = budget.watch();
        usage.wait_for(|u| u.held > 0).await.unwrap();
        // Paused time moves on to the deadline while the reader waits on its peer.
        let outcome = tokio::time::timeout(2 * RESERVED_FRAME_DEADLINE, read)
            .await
            .expect("the connection ends at the deadline")
            .unwrap();
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(budget.held(), 0, "the reservation was given back");
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
