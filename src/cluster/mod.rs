//! The per-DC Raft group (issue 17, docs/cluster.md): its openraft type configuration, the
//! application data of one Raft entry ([`Round`]: the writes of one committer round) and
//! the limits on it.
//!
//! What is here: the types, the Raft log on RocksDB
//! ([`RaftLogStore`](crate::store::RaftLogStore), in `src/store/raft_log/`, because only
//! `src/store` knows RocksDB), the write a round carries ([`LocalWrite`], `write.rs`), the
//! registry's state machine on RocksLog ([`RegistryStateMachine`], `state_machine.rs`: the
//! origin seq assigned at apply), the committer's log while this node leads
//! ([`GroupLog`]), the RPCs between members over the member link (`network.rs`) and a
//! small in-memory state machine for the storage suite and the `tandem-bench raft` spike
//! ([`CountingStateMachine`]). The node's member of the group (forming it, leading,
//! forwarding, transferring the lead) is `crate::node::group`.
//!
//! Architecture invariants:
//! - openraft is pinned exactly (`=0.9.25`, features `serde` and `storage-v2`): a Raft
//!   upgrade changes what is on disk and on the wire, so it is a decision, never a
//!   `cargo update`.
//! - One committer round is one Raft entry: the committer stays the batcher, so a synced
//!   Raft append carries a whole round (today ~41 registrations under load), not one
//!   registration.
//! - Every entry is bounded ([`ENTRY_BYTES_MAX`], [`ROUND_WRITES_MAX`]) before it is
//!   proposed ([`Round::check`]) and again when the log store writes or reads it.

mod counting;
mod group_log;
mod network;
mod state_machine;
mod write;

use std::io::Cursor;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

pub use counting::{CountingStateMachine, COUNTING_SNAPSHOT_BYTES_MAX};
pub use group_log::{GroupLog, PROPOSE_TIMEOUT};
pub use network::{
    ask_to_elect, forward, forward_many, hold_elections_at, leader_status, log_state, policy_digest,
    progress, read_index, Answer, ForwardAnswer, ForwardFn, Forwarded, MemberNetwork, MemberRpc,
    OriginProgress, Progress, RaftService, Request, Staleness, StalenessFn, StatusFn,
    FORWARDS_PER_REQUEST_MAX, HOLD_ELECTIONS_MS_MAX,
};
pub use state_machine::{
    RegistryStateMachine, StateMachineCounters, APPLIED_FORMAT_V1, APPLY_EVENTS_PER_BATCH_MAX,
    SNAPSHOT_BYTES_MAX,
};
pub use write::{Change, GroupWrite, LocalWrite, Write, GROUP_WRITE_FORMAT_V1, WRITE_FORMAT_V1};

/// A member of a DC's Raft group.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The openraft type configuration of a DC's Raft group.
    pub TypeConfig:
        D = Round,
        R = Applied,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The membership node of a member: its Raft and HTTP addresses, as `"<raft> <http>"`.
pub fn node_of(raft: std::net::SocketAddr, http: std::net::SocketAddr) -> openraft::BasicNode {
    openraft::BasicNode::new(format!("{raft} {http}"))
}

/// A membership node's addresses. A group formed by a release before membership changes
/// carries the Raft address alone (the HTTP address then comes from the file).
pub fn addrs_of(node: &openraft::BasicNode) -> Option<(std::net::SocketAddr, Option<std::net::SocketAddr>)> {
    let mut parts = node.addr.split_whitespace();
    let raft = parts.next()?.parse().ok()?;
    let http = parts.next().and_then(|h| h.parse().ok());
    Some((raft, http))
}

/// Whether member `id` leads with a quorum behind it: openraft says it leads, and a quorum
/// of the members acknowledged it (heartbeats count) within `quorum_lost_after_ms`.
///
/// openraft 0.9 keeps a leader cut off from every other member in the leader state until
/// it hears of a higher term, which a minority never does; such a node must not serve
/// writes, run the lease checker or ship replication (docs/cluster.md, "Failure modes").
/// The bound is the election timeout's maximum: by then the majority may have elected
/// another leader. A leader that has not heard from a quorum yet in its term (`None`)
/// counts as leading: its take-over starts with a read index, which needs a quorum.
pub fn leads_with_quorum(
    metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    id: NodeId,
    quorum_lost_after_ms: u64,
) -> bool {
    metrics.state == openraft::ServerState::Leader
        && metrics.current_leader == Some(id)
        && metrics.millis_since_quorum_ack.is_none_or(|ms| ms <= quorum_lost_after_ms)
}

/// One stored Raft entry of this group.
pub type RaftEntry = openraft::Entry<TypeConfig>;

/// Largest stored Raft entry, encoded: one replication frame, so that an entry always fits
/// the DC transport's frame (`tandem_schemas::FRAME_BYTES_MAX`, 8 MiB). A committer round
/// of 4,096 registrations of ~200 bytes is about 1 MiB.
pub const ENTRY_BYTES_MAX: usize = tandem_schemas::FRAME_BYTES_MAX;

/// Most writes in one [`Round`]: a replication batch's event cap
/// (`tandem_schemas::BATCH_EVENTS_MAX`), so that a round's events always fit one batch.
pub const ROUND_WRITES_MAX: usize = tandem_schemas::BATCH_EVENTS_MAX;

/// The application data of one Raft entry: the encoded writes of one committer round,
/// applied together, in order. Each write is an encoded [`LocalWrite`] for the registry's
/// state machine ([`RegistryStateMachine`]); the spike and the storage suite carry opaque
/// bytes, which the counting machine does not read.
///
/// Each write is a byte string on the wire and on disk (`serde_bytes`): postcard copies it
/// whole, where a `Vec<u8>` would go through serde one byte at a time (the same bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    pub writes: Vec<ByteBuf>,
}

/// Why a [`Round`] may not be proposed. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoundError {
    #[error("a round holds at most {max} writes, this one {writes}")]
    TooManyWrites { writes: usize, max: usize },
    #[error("a round's entry is at most {max} bytes encoded, this one {bytes}")]
    TooLarge { bytes: usize, max: usize },
}

impl Round {
    /// A round of these writes, in order.
    pub fn new(writes: impl IntoIterator<Item = Vec<u8>>) -> Round {
        Round { writes: writes.into_iter().map(ByteBuf::from).collect() }
    }

    /// The bytes this round adds to an encoded entry (postcard: a length prefix per write).
    pub fn encoded_len(&self) -> usize {
        self.writes.iter().map(|w| w.len() + varint_len(w.len())).sum::<usize>()
            + varint_len(self.writes.len())
    }

    /// Checks the round against [`ROUND_WRITES_MAX`] and [`ENTRY_BYTES_MAX`] (with room for
    /// the entry's own header), before it is proposed.
    pub fn check(&self) -> Result<(), RoundError> {
        if self.writes.len() > ROUND_WRITES_MAX {
            return Err(RoundError::TooManyWrites { writes: self.writes.len(), max: ROUND_WRITES_MAX });
        }
        let bytes = self.encoded_len() + ENTRY_HEADER_BYTES_MAX;
        if bytes > ENTRY_BYTES_MAX {
            return Err(RoundError::TooLarge { bytes, max: ENTRY_BYTES_MAX });
        }
        Ok(())
    }
}

/// Most bytes a stored entry adds around its round: the format byte, the log id (leader
/// id and index as varints) and the payload tag.
pub const ENTRY_HEADER_BYTES_MAX: usize = 64;

/// What applying one entry answers: the entry's index, how many writes it carried and,
/// from the registry's state machine, what each write did (in order; empty from the
/// counting machine).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub index: u64,
    pub writes: u64,
    pub outcomes: Vec<WriteOutcome>,
}

/// What applying one [`LocalWrite`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteOutcome {
    /// It minted the event of this seq.
    Written { seq: u64 },
    /// The instance already had that value: no event.
    Unchanged,
    /// The instance is not live: no event.
    Gone,
    /// Its event would break the schema's rules or names another DC's instance (the
    /// leader's checks should have refused it), or it broke a round's rule (a group
    /// write not alone in its round): no event, nothing changed, on every member alike.
    Refused { reason: String },
    /// A [`GroupWrite`] was applied.
    Group(GroupOutcome),
    /// A [`GroupWrite`] was refused by the log's rules (a batch on the own channel, a
    /// retired DC's snapshot, a purged range, ...): the log's error, as the committer
    /// answers it; nothing changed, on every member alike.
    GroupRefused(tandem_replicator::log::LogError),
}

/// What applying a [`GroupWrite`] did: the answer the committer gives for the same
/// request, with the changes to live state left out (every member's view hears of them
/// through the state machine's hook, not through the answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupOutcome {
    /// A remote batch or snapshot merged: the log's report.
    Merged(tandem_replicator::log::ApplyReport),
    /// A snapshot chunk staged, or (the last) installed.
    Chunk(tandem_replicator::log::ChunkOutcome),
    /// The own log purged: the purge floor after it.
    PurgedOwn { floor: u64 },
    /// A retirement (a second one is not `newly` and changes nothing).
    Retired(crate::store::Retirement),
    /// A lifted retirement: whether there was one.
    Unretired { lifted: bool },
    /// The own mark after an epoch request (a new epoch, or the one already above).
    Epoch { own: tandem_schemas::Mark },
    /// A peer's scope recorded (its removals left out).
    Rescoped(tandem_replicator::log::Rescope),
    /// A tombstone purge or a peer acknowledgement.
    Done,
}

fn varint_len(n: usize) -> usize {
    let bits = usize::BITS - n.leading_zeros();
    (bits.max(1) as usize).div_ceil(7)
}

#[cfg(test)]
mod group_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod sm_tests;
#[cfg(test)]
mod tests;
