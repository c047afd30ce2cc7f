//! [`LocalWrite`]: one write of a [`Round`](super::Round), the committer's intent for one
//! local change, as the Raft log carries it.
//!
//! A write names what should change, not the event: no seq and no epoch. The state machine
//! mints the event at apply ([`RegistryStateMachine`](super::RegistryStateMachine)) against
//! the state as applied so far, with the registry's own rules
//! ([`Patch::apply`](crate::registry::Patch)): the seq is the state machine's next own seq
//! (gapless; never the Raft index, which blank and membership entries use too), the epoch
//! its own epoch. Everything else an event carries comes from the write, so from the
//! leader that proposed it: the event id and the commit time (the leader's clock at
//! propose). Every member applying the same entries in the same order mints the same
//! events, byte for byte.
//!
//! What the leader judges before it proposes, and the write does not repeat: ACL
//! ownership (the write names the owner a registration records), and leases (a health
//! change or an expiry is proposed only for the registration whose lease decided it).
//!
//! Encoding: a format byte ([`WRITE_FORMAT_V1`]) and postcard. A write that does not
//! decode was accepted by a leader and is the same bytes on every member, so it is
//! corruption or a version skew, never bad input: applying it fails the member
//! (openraft's `StorageError`), it is never skipped.

use serde::{Deserialize, Serialize};
use tandem_schemas::{
    ChangeEvent, DeregisterReason, Health, InstanceKey, InstanceRecord, Mark, Snapshot, SnapshotChunk, Status,
};
use uuid::Uuid;

use super::{Round, RoundError, ENTRY_BYTES_MAX};
use crate::registry::Patch;

/// The format byte of an encoded [`LocalWrite`] of this version.
pub const WRITE_FORMAT_V1: u8 = 1;

/// One local change, as proposed by the leader's committer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalWrite {
    /// The id of the event it mints.
    pub event_id: Uuid,
    /// The event's commit time: the leader's wall clock when it proposed the write.
    pub time_ms: u64,
    pub change: Change,
}

/// What a [`LocalWrite`] changes: the registry's patches, minted at apply against the
/// state as applied so far (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// Register or replace the whole record (a registration if the key is not live, else
    /// an update); `owner`: the principal recorded as the instance's owner.
    Register { record: InstanceRecord, owner: Option<String> },
    /// Set the status of a live instance (no event if it already has it).
    Status { key: InstanceKey, status: Status },
    /// Set the health and damping of a live instance.
    Health { key: InstanceKey, health: Health, damped: bool },
    /// Set the damping of a live instance.
    Damped { key: InstanceKey, damped: bool },
    /// Remove a live instance (a tombstone); nothing if it is not live.
    Deregister { key: InstanceKey, reason: DeregisterReason },
}

impl LocalWrite {
    /// `[WRITE_FORMAT_V1] ++ postcard(self)`.
    pub fn encode(&self) -> Vec<u8> {
        // Postcard fails only on types it cannot represent, and these are plain data.
        postcard::to_extend(self, vec![WRITE_FORMAT_V1]).unwrap_or_default()
    }

    /// Decodes one write: this build's format, at most an entry's bytes, nothing after it.
    pub fn decode(bytes: &[u8]) -> Result<LocalWrite, String> {
        let (&format, body) = bytes.split_first().ok_or("an empty write")?;
        if format != WRITE_FORMAT_V1 {
            return Err(format!("a write of format {format}, this build reads {WRITE_FORMAT_V1}"));
        }
        if body.len() > ENTRY_BYTES_MAX {
            return Err(format!("a write of {} bytes, at most {ENTRY_BYTES_MAX}", body.len()));
        }
        let (write, rest) = postcard::take_from_bytes(body).map_err(|e| format!("a write: {e}"))?;
        if !rest.is_empty() {
            return Err(format!("{} bytes after a write", rest.len()));
        }
        Ok(write)
    }

    /// The instance it changes, the registry's patch for it and the owner a registration
    /// records.
    pub(crate) fn into_patch(self) -> (InstanceKey, Patch, Option<String>) {
        // A judged patch names the registration its lease decision was made on; the
        // leader judged it before proposing (the module docs), so the version here is
        // only a placeholder that the apply passes as the current one.
        match self.change {
            Change::Register { record, owner } => {
                (record.key.clone(), Patch::Register(Box::new(record)), owner)
            }
            Change::Status { key, status } => (key, Patch::Status(status), None),
            Change::Health { key, health, damped } => {
                (key, Patch::Health { health, damped, version: 0 }, None)
            }
            Change::Damped { key, damped } => (key, Patch::Damped(damped, 0), None),
            Change::Deregister { key, reason } => (key, Patch::Deregister(reason, None), None),
        }
    }
}

/// The format byte of an encoded [`GroupWrite`] of this version.
pub const GROUP_WRITE_FORMAT_V1: u8 = 2;

/// One write of the DC's other kinds, as the Raft log carries it: what the committer
/// serves besides local appends, each applied by the same RocksLog operation on every
/// member (the replication merge, purges, peer acknowledgements, retirements are
/// deterministic given the state), with the applied id in the operation's own synced
/// batch (`RocksLog::with_applied`). A group write is alone in its round: a round that
/// mixes it with others is refused whole, the same way on every member.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GroupWrite {
    /// A peer DC's batch, received over the channel of `channel_dc`
    /// (`EventLog::apply_remote`).
    Remote { channel_dc: String, events: Vec<ChangeEvent> },
    /// A peer DC's snapshot in one piece (`EventLog::install_snapshot`).
    RemoteSnapshot { channel_dc: String, snapshot: Snapshot },
    /// One chunk of a peer DC's snapshot (`EventLog::stage_snapshot_chunk`); the last
    /// installs it.
    StageChunk { channel_dc: String, chunk: SnapshotChunk },
    /// Purge the own log up to `upto_seq` (the purge rule decided it on the leader).
    PurgeOwn { upto_seq: u64 },
    /// Purge a remote origin's tombstones up to `upto_seq`.
    PurgeRemoteTombstones { origin: String, upto_seq: u64 },
    /// `peer` durably holds the own origin up to `mark`.
    PeerAck { peer: String, mark: Mark },
    /// Retire DC `dc` (its copies go) at the leader's wall-clock `at_ms`.
    Retire { dc: String, at_ms: u64 },
    /// Lift a retirement.
    Unretire { dc: String },
    /// Start a new history of the own origin unless the own epoch is already above
    /// `above`: the epoch after the higher of `above` and the own one, with `tiebreak`
    /// (`epoch::above`), as the gateway asks when a peer holds a newer history of ours.
    BeginEpoch { above: u64, tiebreak: u64 },
    /// Record the replication scope of peer `origin` (`EventLog::rescope`): copies outside
    /// it go; a wider one resets the peer's mark so it resyncs.
    Rescope { origin: String, scope: tandem_replicator::scope::Scope },
}

impl GroupWrite {
    /// `[GROUP_WRITE_FORMAT_V1] ++ postcard(self)`.
    pub fn encode(&self) -> Vec<u8> {
        // Plain data: postcard does not fail on it.
        postcard::to_extend(self, vec![GROUP_WRITE_FORMAT_V1]).unwrap_or_default()
    }
}

/// A decoded write of a round: a local change or one of the group's other writes.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Local(LocalWrite),
    Group(GroupWrite),
}

impl Write {
    /// Decodes one write by its format byte: [`WRITE_FORMAT_V1`] is a [`LocalWrite`],
    /// [`GROUP_WRITE_FORMAT_V1`] a [`GroupWrite`]; at most an entry's bytes, nothing after.
    pub fn decode(bytes: &[u8]) -> Result<Write, String> {
        match bytes.first() {
            Some(&GROUP_WRITE_FORMAT_V1) => {
                let body = &bytes[1..];
                if body.len() > ENTRY_BYTES_MAX {
                    return Err(format!("a write of {} bytes, at most {ENTRY_BYTES_MAX}", body.len()));
                }
                let (write, rest) =
                    postcard::take_from_bytes(body).map_err(|e| format!("a group write: {e}"))?;
                if !rest.is_empty() {
                    return Err(format!("{} bytes after a group write", rest.len()));
                }
                Ok(Write::Group(write))
            }
            _ => LocalWrite::decode(bytes).map(Write::Local),
        }
    }
}

impl Round {
    /// A round of one group write, checked against the limits.
    pub fn of_group_write(write: &GroupWrite) -> Result<Round, RoundError> {
        let round = Round::new([write.encode()]);
        round.check()?;
        Ok(round)
    }

    /// A round of these writes, checked against the limits ([`Round::check`]).
    pub fn of_writes<'a>(writes: impl IntoIterator<Item = &'a LocalWrite>) -> Result<Round, RoundError> {
        let round = Round::new(writes.into_iter().map(LocalWrite::encode));
        round.check()?;
        Ok(round)
    }
}
