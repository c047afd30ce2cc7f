//! Backups of a DC and restoring one (docs/operations.md, "Backup and restore").
//!
//! A backup is taken from the node that serves the DC's writes (a group's leader, or the
//! DC's single node) while it serves: `GET /v1/admin/backup` answers the whole state as an
//! export (the format of a Raft snapshot: every pair of the state's column families, with
//! the applied Raft index it is consistent with, taken under the state's lock) and its
//! [`BackupMeta`] in the [`BACKUP_META_HEADER`]. `tandem backup --out DIR` writes the two
//! files [`STATE_FILE`] and [`META_FILE`] and checks the export's SHA-256 against the
//! node's.
//!
//! An export rather than a RocksDB checkpoint: it is exactly the DC's state (no table
//! files, WAL or Raft log), it travels over the admin API to wherever the operator runs
//! the command, and restoring it is the install path every Raft snapshot already takes
//! (checked first, then one synced batch).
//!
//! `tandem restore --from DIR --config FILE` seeds a node's empty data dir, offline:
//! - a group member's `state/` becomes the backup's state, applied by a one-member group of
//!   that node at the backup's index (its Raft log starts purged there): the node starts as
//!   its group's only voter, and each other member joins (`[cluster] join = true`, then
//!   `tandem cluster add`) and gets a Raft snapshot of the restored state;
//! - a single node's data dir becomes the backup's state.
//!
//! Either way the state's own epoch is made provisional: a restore is a history that went
//! back, so at its first handshake the DC takes an epoch above every epoch of it its peers
//! have seen; they replace what they hold of it by a snapshot (nothing they saw after the
//! backup comes back), and a process of the old history still running is fenced
//! (docs/replication.md, "Epochs").

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tandem_replicator::log::EventLog as _;

use crate::cluster::RegistryStateMachine;
use crate::config::Config;
use crate::store::RocksLog;

/// The format of a backup this build writes and reads.
pub const BACKUP_FORMAT: u32 = 1;
/// The backup's state, in a backup dir.
pub const STATE_FILE: &str = "state.export";
/// The backup's [`BackupMeta`] (JSON), in a backup dir.
pub const META_FILE: &str = "backup.json";
/// The response header of `GET /v1/admin/backup` that carries the [`BackupMeta`] (JSON).
pub const BACKUP_META_HEADER: &str = "x-tandem-backup";
/// Where a node serves backups.
pub const BACKUP_PATH: &str = "/v1/admin/backup";
/// Largest backup: the largest state a Raft snapshot carries.
pub const BACKUP_BYTES_MAX: usize = crate::cluster::SNAPSHOT_BYTES_MAX;

/// What a backup is of, and how to check it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupMeta {
    pub format: u32,
    pub dc: String,
    /// The node that served it (a group's leader), absent for a single node.
    pub node_id: Option<u64>,
    /// When the node took it (its wall clock, ms since the Unix epoch).
    pub taken_at_ms: u64,
    /// The applied Raft index the state is consistent with (a group's), 0 for a single node.
    pub applied_index: u64,
    /// The DC's own epoch and last own seq in the backup.
    pub epoch: u64,
    pub own_seq: u64,
    /// The export's length and SHA-256 (lowercase hex).
    pub state_bytes: u64,
    pub state_sha256: String,
    /// The release that took it.
    pub version: String,
}

/// The SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The meta of `export`, taken now.
pub fn meta_of(
    dc: &str,
    node_id: Option<u64>,
    applied_index: u64,
    own: (u64, u64),
    export: &[u8],
) -> BackupMeta {
    BackupMeta {
        format: BACKUP_FORMAT,
        dc: dc.to_owned(),
        node_id,
        taken_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        applied_index,
        epoch: own.0,
        own_seq: own.1,
        state_bytes: export.len() as u64,
        state_sha256: sha256_hex(export),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// A backup read back from its dir and checked (format, length, SHA-256).
pub struct Backup {
    pub meta: BackupMeta,
    pub export: Vec<u8>,
}

/// Reads the backup in `dir` and checks it.
pub fn read(dir: &Path) -> anyhow::Result<Backup> {
    let meta_path = dir.join(META_FILE);
    let meta: BackupMeta = serde_json::from_slice(
        &std::fs::read(&meta_path).with_context(|| format!("cannot read {}", meta_path.display()))?,
    )
    .with_context(|| format!("{} is not a backup's meta", meta_path.display()))?;
    anyhow::ensure!(
        meta.format == BACKUP_FORMAT,
        "{} is a backup of format {}; this build reads format {BACKUP_FORMAT}",
        dir.display(),
        meta.format
    );
    let state_path = dir.join(STATE_FILE);
    let len = std::fs::metadata(&state_path)
        .with_context(|| format!("cannot read {}", state_path.display()))?
        .len();
    anyhow::ensure!(
        len == meta.state_bytes && len <= BACKUP_BYTES_MAX as u64,
        "{} holds {len} bytes, its meta says {} (at most {BACKUP_BYTES_MAX})",
        state_path.display(),
        meta.state_bytes
    );
    let export =
        std::fs::read(&state_path).with_context(|| format!("cannot read {}", state_path.display()))?;
    let sum = sha256_hex(&export);
    anyhow::ensure!(
        sum == meta.state_sha256,
        "{}: SHA-256 {sum}, its meta says {}: the copy is damaged",
        state_path.display(),
        meta.state_sha256
    );
    Ok(Backup { meta, export })
}

/// What a restore did.
#[derive(Debug, Serialize)]
pub struct Restored {
    pub dc: String,
    /// Where the state was written.
    pub state_dir: PathBuf,
    /// The group member it seeded, if the config has a `[cluster]` table.
    pub node_id: Option<u64>,
    /// The provisional epoch the restored history starts in.
    pub epoch: u64,
    pub own_seq: u64,
    pub applied_index: u64,
    pub instances: usize,
}

/// Seeds the data dir of `cfg` (which must hold nothing) from the backup in `from`.
pub fn restore(cfg: &Config, from: &Path) -> anyhow::Result<Restored> {
    let backup = read(from)?;
    anyhow::ensure!(
        backup.meta.dc == cfg.dc,
        "the backup in {} is of DC {}, the config's DC is {}",
        from.display(),
        backup.meta.dc,
        cfg.dc
    );
    let dir = &cfg.data_dir;
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        anyhow::ensure!(
            entries.next().is_none(),
            "data_dir {} is not empty: a restore seeds an empty data dir (move the old one aside)",
            dir.display()
        );
    }
    crate::node::data_dir::prepare(dir)?;
    let epoch = NonZeroU64::new(tandem_replicator::epoch::provisional(rand::random::<u64>()))
        .unwrap_or(NonZeroU64::MIN);
    let (state_dir, node_id, applied_index) = match &cfg.cluster {
        Some(section) => {
            let state_dir = dir.join(crate::node::group::STATE_DIR);
            let me = section.me();
            let node = crate::cluster::node_of(me.raft_addr, me.http_addr);
            let index = backup.meta.applied_index.max(1);
            RegistryStateMachine::restore(&state_dir, &cfg.dc, &backup.export, (me.id, node), index, epoch)
                .map_err(|e| anyhow::anyhow!("cannot restore into {}: {e}", state_dir.display()))?;
            (state_dir, Some(me.id), index)
        }
        None => {
            let mut log = RocksLog::create_with_epoch(dir, &cfg.dc, epoch)
                .with_context(|| format!("cannot create the event log in {}", dir.display()))?;
            log.restore_state(&backup.export, None, epoch)
                .with_context(|| format!("cannot restore into {}", dir.display()))?;
            (dir.clone(), None, 0)
        }
    };
    // Read back what was written: it opens, and holds the backup's instances.
    let log = RocksLog::open(&state_dir, &cfg.dc)
        .with_context(|| format!("cannot open the restored state in {}", state_dir.display()))?;
    let instances = log.instances().context("cannot read the restored instances")?.len();
    Ok(Restored {
        dc: cfg.dc.clone(),
        state_dir,
        node_id,
        epoch: log.own_mark().epoch,
        own_seq: log.own_mark().seq,
        applied_index,
        instances,
    })
}
