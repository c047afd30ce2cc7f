//! Sending copies of datagrams, at once or through the bounded timer queue (a min-heap
//! keyed by deadline, run by the scheduler task), so a delayed datagram never blocks the
//! ones behind it.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::shared::{Shared, Way};
use super::stats::bump;
use super::{RelayLimits, Verdict};

/// Where a copy goes.
pub(super) enum Target {
    /// To upstream, through a mapping's connected socket.
    Upstream(Arc<UdpSocket>),
    /// To a client, through the listen socket.
    Client { listen: Arc<UdpSocket>, client: SocketAddr },
}

impl Target {
    fn try_send(&self, payload: &[u8]) -> io::Result<usize> {
        match self {
            Target::Upstream(socket) => socket.try_send(payload),
            Target::Client { listen, client } => listen.try_send_to(payload, *client),
        }
    }
}

pub(super) fn send_now(way: Way, target: &Target, payload: &[u8], shared: &Shared) {
    let counters = shared.counters(way);
    match target.try_send(payload) {
        Ok(_) => bump(&counters.forwarded),
        Err(error) => {
            tracing::trace!(?way, %error, "relay send failed");
            bump(&counters.dropped_send_failed);
        }
    }
}

/// Everything a receiving task needs to dispatch a verdict.
#[derive(Clone)]
pub(super) struct Io {
    pub(super) shared: Arc<Shared>,
    pub(super) listen: Arc<UdpSocket>,
    pub(super) queue_tx: mpsc::Sender<Pending>,
    pub(super) budget: Arc<QueueBudget>,
}

impl Io {
    /// Decides and dispatches one received datagram.
    pub(super) fn relay(&self, way: Way, payload: &[u8], target: impl Fn() -> Target) {
        let now = Instant::now();
        match self.shared.decide(way) {
            Verdict::Drop(_) => {}
            Verdict::Deliver { delay, held_back: _, duplicate } => {
                self.dispatch(way, now, delay, payload, target());
                if let Some(delay) = duplicate {
                    self.dispatch(way, now, delay, payload, target());
                }
            }
        }
    }

    fn dispatch(&self, way: Way, now: Instant, delay: Duration, payload: &[u8], target: Target) {
        if delay.is_zero() {
            send_now(way, &target, payload, &self.shared);
            return;
        }
        let counters = self.shared.counters(way);
        if !self.budget.try_reserve(payload.len()) {
            bump(&counters.dropped_queue_full);
            return;
        }
        let pending = Pending { deadline: now + delay, order: 0, way, target, payload: payload.to_vec() };
        match self.queue_tx.try_send(pending) {
            Ok(()) => bump(&counters.delayed),
            // Full cannot happen within the budget; closed means the relay is stopping.
            Err(_) => {
                self.budget.release(payload.len());
                bump(&counters.dropped_queue_full);
            }
        }
    }
}

/// What the timer queue holds, in datagrams and bytes; reserved before a copy is queued and
/// released once it is sent, so the limits hold across all producers.
pub(super) struct QueueBudget {
    datagrams: AtomicUsize,
    bytes: AtomicUsize,
    datagrams_max: usize,
    bytes_max: usize,
}

impl QueueBudget {
    pub(super) fn new(limits: RelayLimits) -> QueueBudget {
        QueueBudget {
            datagrams: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            datagrams_max: limits.delay_queue_datagrams_max.get(),
            bytes_max: limits.delay_queue_bytes_max.get(),
        }
    }

    fn try_reserve(&self, len: usize) -> bool {
        let datagrams = self.datagrams.fetch_add(1, Ordering::AcqRel) + 1;
        let bytes = self.bytes.fetch_add(len, Ordering::AcqRel).saturating_add(len);
        if datagrams > self.datagrams_max || bytes > self.bytes_max {
            self.release(len);
            return false;
        }
        true
    }

    fn release(&self, len: usize) {
        self.datagrams.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(len, Ordering::AcqRel);
    }
}

/// A copy waiting in the timer queue.
pub(super) struct Pending {
    deadline: Instant,
    /// Arrival order at the scheduler: equal deadlines leave in arrival order.
    order: u64,
    way: Way,
    target: Target,
    payload: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest deadline first.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.deadline, other.order).cmp(&(self.deadline, self.order))
    }
}

/// Sends queued copies when their deadline passes. Holds what the budget admitted, no more.
pub(super) async fn run_scheduler(
    mut queue_rx: mpsc::Receiver<Pending>,
    shared: Arc<Shared>,
    budget: Arc<QueueBudget>,
) {
    let mut heap: BinaryHeap<Pending> = BinaryHeap::new();
    let mut order: u64 = 0;
    loop {
        let next_deadline = heap.peek().map(|pending| pending.deadline);
        tokio::select! {
            received = queue_rx.recv() => {
                let Some(mut pending) = received else { return };
                pending.order = order;
                order = order.wrapping_add(1);
                heap.push(pending);
            }
            () = sleep_until(next_deadline) => {
                let now = Instant::now();
                while heap.peek().is_some_and(|pending| pending.deadline <= now) {
                    let Some(pending) = heap.pop() else { break };
                    send_now(pending.way, &pending.target, &pending.payload, &shared);
                    budget.release(pending.payload.len());
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
