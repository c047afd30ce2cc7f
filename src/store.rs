//! The durable event log of a DC: [`RocksLog`], the RocksDB implementation of
//! [`tandem_replicator::log::EventLog`], and [`Committer`], the single sequencer that owns
//! a [`CommitLog`] and shares one fsync among concurrent writers (group commit). The
//! committer runs on its own thread in production, or inline on its owner's schedule
//! ([`InlineCommitter`]) over [`MemStore`], the in-memory log of the node simulation.
//!
//! What lives where on disk (one RocksDB per data dir, one data dir per DC):
//! - column family `log`: the own origin's change events, keyed by seq (u64 big-endian).
//!   Remote events are applied to state and never logged here.
//! - `instances`: live state, keyed by an order-preserving encoding of the
//!   [`InstanceKey`](tandem_schemas::InstanceKey) (see `keys.rs`); value
//!   `(seq, InstanceRecord)`.
//! - `tombstones`: same keys; value `(seq, DeregisterReason)`.
//! - `meta`: the DC name, the own epoch and last seq, the purge floor, the watch index, the
//!   per-origin applied marks and the per-peer acked marks.
//! - `raft_log` and `raft_meta`: the Raft log of a DC's group ([`RaftLogStore`], issue 17),
//!   in a RocksDB of its own for now (the node does not run the group yet; see
//!   docs/cluster.md). When RocksLog is a group's state machine, `meta` also holds
//!   `raft_applied` (the applied log id and membership), written in the same batch as the
//!   entries' events (`src/store/rocks/raft_state.rs`).
//!
//! Every mutation of RocksLog is one `WriteBatch` written with `sync = true`: the log, the state and the
//! marks change together or not at all, and a call returns only once the WAL is fsynced.
//!
//! Architecture invariants:
//! - Only this module knows RocksDB. Nothing outside it sees a column family, a key
//!   encoding or a `rocksdb` type.
//! - This module has no merge logic of its own: every verdict comes from
//!   [`tandem_replicator::merge`], exactly as in the reference model
//!   [`MemLog`](tandem_replicator::log::MemLog); the conformance suite checks both.
//! - Stored bytes are untrusted: every decoder is bounded and a bad record is
//!   [`LogError::Corrupt`](tandem_replicator::log::LogError::Corrupt), never a panic.
//! - This module never reads a clock and never decides an ordering: seqs come from the
//!   caller's events, checked against the own mark.

mod commit_log;
mod committer;
mod keys;
mod mem;
mod raft_log;
mod rocks;

pub use commit_log::{CommitLog, Retirement, SyncParts};
pub use committer::{
    AppendLocal, BuildEvents, Built, CommitError, CommitNotice, CommitStats, Committed, Committer,
    CommitterHandle, CommitterLimits, Durations, InlineCommitter, LogHealth, LogHealthReport, OnCommit,
    ReadLogFn, Reply, Request, Settle, Settled, StateMarks, SyncBreakdown, WithLogFn, DURATION_BUCKETS_US,
    GROUP_SIZE_BUCKETS, LINGER_GAP_US_DEFAULT, LINGER_MAX_US_DEFAULT, LINGER_QUIET_GAPS,
    LINGER_TARGET_DEFAULT, RECOVERY_BACKOFF_INITIAL_MS_DEFAULT, RECOVERY_BACKOFF_MAX_MS_DEFAULT,
};
pub use mem::{MemFault, MemStore};
pub use raft_log::{
    RaftLogCounters, RaftLogStore, FORMAT_V1 as RAFT_LOG_FORMAT, META_BYTES_MAX as RAFT_META_BYTES_MAX,
    RAFT_COLUMN_FAMILIES, READ_BYTES_MAX as RAFT_READ_BYTES_MAX,
};
pub use rocks::{
    wal_files, InvalidRecords, OpenError, RocksLog, IDLE_FLUSH_AFTER, IDLE_FLUSH_MIN_BYTES,
    MAX_OPEN_FILES_DEFAULT, RAFT_APPLIED_BYTES_MAX, STATE_FORMAT_V1 as RAFT_STATE_FORMAT,
    WAL_MAX_WRITE_BUFFERS, WRITE_BUFFER_MIB_DEFAULT,
};
