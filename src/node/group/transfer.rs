//! Handing the lead to another member (`tandem cluster transfer-leader`,
//! `POST /v1/admin/cluster/transfer-leader`; docs/cluster.md, "What an operator does").
//!
//! openraft 0.9 has no leadership transfer, and its leader lease (the election timeout's
//! maximum) makes every member refuse votes while it hears from a leader. So the leader:
//! 1. stops serving writes (503 `no_leader`, `Retry-After: 1`: clients retry) and runs the
//!    node's `on_follow` (gateway, lease checks), as a leader that lost its quorum does;
//! 2. asks every other member but the target not to campaign for a while
//!    ([`crate::cluster::hold_elections_at`]), so that the target's candidacy is the only one;
//! 3. waits until the target holds the leader's last log entry;
//! 4. stops its heartbeats and waits out the lease (the election timeout's maximum);
//! 5. asks the target to campaign ([`crate::cluster::ask_to_elect`]): the others grant it;
//! 6. waits until the target leads, then turns its heartbeats on again.
//!
//! Any step that fails or runs out of [`TRANSFER_TIMEOUT`] (or the forward timeout, if
//! shorter) ends the transfer: heartbeats on, the hold lapses by itself, and if this node
//! still leads it takes over again as after any lead change (every lease from its record's
//! health with a full TTL). A transfer never loses an acknowledged write: it only moves who
//! proposes; the target's vote needs its log to be at least the quorum's.

use std::time::Instant;

use super::*;

/// Longest a transfer may take, from the request to the target leading.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past the lease the leader waits before the target campaigns (clock steps
/// between members, the last heartbeat in flight).
const LEASE_MARGIN: Duration = Duration::from_millis(100);

/// Longest the target may take to hold the leader's last entry (writes are refused
/// meanwhile).
const CATCH_UP_MAX: Duration = Duration::from_secs(2);

/// A transfer that happened.
#[derive(Clone, Debug, Serialize)]
pub struct Transferred {
    /// The member that leads now.
    pub leader: NodeId,
    pub term: u64,
    /// From the request to the target leading (it serves writes once it took over: a
    /// read-index round later).
    pub took_ms: u64,
}

/// Why a transfer did not happen. This node keeps (or takes back) the lead.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("this node does not serve writes now: send the request to the leader")]
    NotServing,
    #[error("node {0} is not a voting member of this group")]
    UnknownMember(NodeId),
    #[error("a transfer is already under way")]
    Busy,
    #[error("the transfer to node {to} failed: {why}")]
    Failed { to: NodeId, why: String },
    #[error("this node emulates the previous release, which had no leadership transfer")]
    NotInThisRelease,
}

impl Group {
    /// Hands the lead to member `to` (see the module's steps). `to` being this node, which
    /// serves writes, is done at once.
    pub async fn transfer_lead(&self, to: NodeId) -> Result<Transferred, TransferError> {
        let started = Instant::now();
        if self.section.emulate_previous_release {
            return Err(TransferError::NotInThisRelease);
        }
        let members = self.members();
        if !members.iter().any(|m| m.id == to && m.voter) {
            return Err(TransferError::UnknownMember(to));
        }
        if !self.serving() {
            return Err(TransferError::NotServing);
        }
        let term = self.raft.metrics().borrow().current_term;
        if to == self.id {
            return Ok(Transferred { leader: to, term, took_ms: 0 });
        }
        let claimed = self.transferring.send_if_modified(|t| match t {
            None => {
                *t = Some(to);
                true
            }
            Some(_) => false,
        });
        if !claimed {
            return Err(TransferError::Busy);
        }
        // The target must answer, and know this node as its leader, before writes stop here
        // (a hold of no time: served only from the leader it knows, as `Elect` is).
        if let Err(e) = crate::cluster::hold_elections_at(&self.link, to, 0, Duration::from_secs(1)).await {
            self.transferring.send_replace(None);
            return Err(TransferError::Failed { to, why: format!("it does not answer: {e}") });
        }
        tracing::info!(node = self.id, to, term, "handing the lead over");
        let result = self.hand_over(to, term, started).await;
        self.raft.runtime_config().heartbeat(true);
        self.transferring.send_replace(None);
        match &result {
            Ok(t) => {
                tracing::info!(node = self.id, to, term = t.term, took_ms = t.took_ms, "lead handed over")
            }
            Err(e) => tracing::warn!(node = self.id, to, error = %e, "lead not handed over; taking it back"),
        }
        result
    }

    async fn hand_over(&self, to: NodeId, term: u64, started: Instant) -> Result<Transferred, TransferError> {
        let failed = |why: String| TransferError::Failed { to, why };
        let deadline = started + TRANSFER_TIMEOUT.min(self.forward_timeout());
        let left = || deadline.saturating_duration_since(Instant::now());
        let lease = Duration::from_millis(self.section.election_timeout_max_ms);
        // Long enough for the steps below; the target campaigns within it.
        let hold_ms = (lease * 4 + LEASE_MARGIN).as_millis() as u64;
        for m in self.members().iter().filter(|m| m.voter && m.id != self.id && m.id != to) {
            // A member that does not answer may be down: it cannot campaign either.
            if let Err(e) = crate::cluster::hold_elections_at(&self.link, m.id, hold_ms, left()).await {
                tracing::warn!(member = m.id, error = %e, "a member did not agree to hold its elections");
            }
        }
        let mut metrics = self.raft.metrics();
        let caught_up = tokio::time::timeout(
            left().min(CATCH_UP_MAX),
            metrics.wait_for(|m| {
                let matched =
                    m.replication.as_ref().and_then(|r| r.get(&to)).and_then(|l| l.map(|l| l.index));
                m.current_term != term || matched >= m.last_log_index
            }),
        )
        .await;
        match caught_up.map(|r| r.map(|m| m.current_term)) {
            Ok(Ok(now)) if now == term => {}
            Ok(Ok(now)) => return Err(failed(format!("the term changed to {now} meanwhile"))),
            _ => return Err(failed("it did not catch up with the leader's log in time".into())),
        }
        self.raft.runtime_config().heartbeat(false);
        tokio::time::sleep((lease + LEASE_MARGIN).min(left())).await;
        crate::cluster::ask_to_elect(&self.link, to, left()).await.map_err(failed)?;
        let won = tokio::time::timeout(
            left(),
            metrics.wait_for(|m| m.current_term > term && m.current_leader.is_some()),
        )
        .await;
        match won {
            Ok(Ok(m)) if m.current_leader == Some(to) => Ok(Transferred {
                leader: to,
                term: m.current_term,
                took_ms: started.elapsed().as_millis() as u64,
            }),
            Ok(Ok(m)) => Err(failed(format!("node {:?} won the election instead", m.current_leader))),
            _ => Err(failed("no member won an election in time".into())),
        }
    }
}
