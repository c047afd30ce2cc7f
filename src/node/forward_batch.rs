//! Heartbeats a follower forwards to its leader, in batches (docs/cluster.md, "Leases on
//! the leader"): clients renew single leases (`PUT /v1/heartbeat/...`) at whichever member
//! they use; a follower sends them on to the leader several to a member-link request
//! ([`crate::cluster::forward_many`]) instead of one request each.
//!
//! Rules:
//! - A heartbeat goes out at once when a request slot is free
//!   ([`HEARTBEAT_FORWARDS_IN_FLIGHT_MAX`]): batching adds no wait at low load. While every
//!   slot is busy, heartbeats queue and the next free slot takes up to
//!   [`FORWARDS_PER_REQUEST_MAX`] of them.
//! - Each heartbeat keeps its own credentials and answer: the leader serves each as it would
//!   serve it forwarded alone (one client's refusal is not another's).
//! - The queue is bounded ([`HEARTBEATS_QUEUED_MAX`]); a heartbeat that finds it full is
//!   answered `leader_unreachable` at once (the client retries), never held.
//! - A leader of an earlier version cannot decode a batch: the heartbeats of that batch go
//!   one request each, as before.
//! - The follower does not wait for its own apply before answering a renewal (single, or
//!   a client's `POST /v1/heartbeats`, which goes on its own): it writes nothing (a health
//!   transition it causes is the leader's later write), so there is no write of the
//!   client's to read back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::Raft;
use tandem_replicator::member::MemberLink;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::group::while_leading;
use crate::cluster::{ForwardAnswer, Forwarded, NodeId, TypeConfig, FORWARDS_PER_REQUEST_MAX};

/// Batches of heartbeats in flight to the leader at once.
pub const HEARTBEAT_FORWARDS_IN_FLIGHT_MAX: usize = 4;

/// Heartbeats waiting for a free request slot; more are refused at once.
pub const HEARTBEATS_QUEUED_MAX: usize = 16 * FORWARDS_PER_REQUEST_MAX;

/// What batching heartbeats did, for metrics.
#[derive(Debug, Default)]
pub struct HeartbeatBatchStats {
    /// Member-link requests that carried forwarded heartbeats, and the heartbeats in them.
    pub requests: AtomicU64,
    pub heartbeats: AtomicU64,
    /// Heartbeats refused because the queue was full.
    pub queue_full: AtomicU64,
    /// Batches the leader could not decode (an earlier version), sent again one by one.
    pub fallbacks: AtomicU64,
}

struct Pending {
    to: NodeId,
    write: Forwarded,
    answer: oneshot::Sender<Result<ForwardAnswer, String>>,
}

/// The follower's heartbeat queue and the task that sends it.
pub struct HeartbeatForwarder {
    queue: mpsc::Sender<Pending>,
    pub stats: Arc<HeartbeatBatchStats>,
}

impl HeartbeatForwarder {
    /// Starts the task that sends queued heartbeats over `link`, each request bounded by
    /// `timeout` and given up when the leader it was sent to stops leading. Stops when the
    /// forwarder is dropped.
    pub fn start(link: MemberLink, raft: Raft<TypeConfig>, timeout: Duration) -> HeartbeatForwarder {
        let (queue, rx) = mpsc::channel(HEARTBEATS_QUEUED_MAX);
        let stats = Arc::new(HeartbeatBatchStats::default());
        tokio::spawn(run(rx, Sender { link, raft, timeout, stats: stats.clone() }));
        HeartbeatForwarder { queue, stats }
    }

    /// Forwards one heartbeat to member `to` (the leader) with others queued meanwhile, and
    /// returns the leader's answer to it.
    pub async fn forward(&self, to: NodeId, write: Forwarded) -> Result<ForwardAnswer, String> {
        let (answer, answered) = oneshot::channel();
        if let Err(e) = self.queue.try_send(Pending { to, write, answer }) {
            self.stats.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => {
                    format!("{HEARTBEATS_QUEUED_MAX} heartbeats already wait to be forwarded")
                }
                mpsc::error::TrySendError::Closed(_) => "this node is shutting down".into(),
            });
        }
        answered.await.unwrap_or_else(|_| Err("this node is shutting down".into()))
    }
}

#[derive(Clone)]
struct Sender {
    link: MemberLink,
    raft: Raft<TypeConfig>,
    timeout: Duration,
    stats: Arc<HeartbeatBatchStats>,
}

async fn run(mut rx: mpsc::Receiver<Pending>, sender: Sender) {
    let slots = Arc::new(Semaphore::new(HEARTBEAT_FORWARDS_IN_FLIGHT_MAX));
    while let Some(first) = rx.recv().await {
        // Wait for a slot before taking more: the queue fills meanwhile.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        while batch.len() < FORWARDS_PER_REQUEST_MAX {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let sender = sender.clone();
        tokio::spawn(async move {
            // Nearly always one leader; a batch taken across a leader change splits.
            let mut by_leader: Vec<(NodeId, Vec<Pending>)> = Vec::new();
            for p in batch {
                match by_leader.iter_mut().find(|(to, _)| *to == p.to) {
                    Some((_, v)) => v.push(p),
                    None => by_leader.push((p.to, vec![p])),
                }
            }
            for (to, pending) in by_leader {
                sender.send(to, pending).await;
            }
            drop(slot);
        });
    }
}

impl Sender {
    async fn send(&self, to: NodeId, pending: Vec<Pending>) {
        let (writes, answers): (Vec<Forwarded>, Vec<_>) =
            pending.into_iter().map(|p| (p.write, p.answer)).unzip();
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        self.stats.heartbeats.fetch_add(writes.len() as u64, Ordering::Relaxed);
        let backup = writes.clone();
        let batch = crate::cluster::forward_many(&self.link, to, writes, self.timeout);
        match while_leading(&self.raft, to, batch).await {
            Ok(got) => {
                for (answer, got) in answers.into_iter().zip(got) {
                    let _ = answer.send(Ok(got));
                }
            }
            Err(e) if e.contains("undecodable request") => {
                self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                for (answer, write) in answers.into_iter().zip(backup) {
                    let one = crate::cluster::forward(&self.link, to, write, self.timeout);
                    let _ = answer.send(while_leading(&self.raft, to, one).await);
                }
            }
            Err(e) => {
                for answer in answers {
                    let _ = answer.send(Err(e.clone()));
                }
            }
        }
    }
}
