//! [`RocksLog`] as an [`EventLog`]: the replication contract (own events out, remote events
//! and snapshots in, purges, reads of state) over the write path and readers of `mod.rs`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use rocksdb::{IteratorMode, ReadOptions, WriteBatch};
use tandem_replicator::log::{
    mark_event_id, ApplyReport, ChunkOutcome, EventLog, LogError, Rescope, SnapshotReader, StateChange,
};
use tandem_replicator::merge::{self, Held};
use tandem_replicator::scope::Scope;
use tandem_schemas::{
    validate_event, validate_key, validate_record, ChangeEvent, InstanceKey, InstanceRecord, Mark, Snapshot,
    SnapshotChunk, SnapshotInstance, StagedSnapshot, Tombstone,
};

use super::deletes::{Repeated, Stored};
use super::{
    check_stored_key, decode_instance, decode_tombstone, meta_name, storage, RocksLog, CF_INSTANCES, CF_LOG,
    CF_META, CF_TOMBSTONES, META_EPOCH, META_FLOOR_ID, META_MARK_ID_PREFIX, META_MARK_PREFIX,
    META_PURGE_FLOOR,
};
use crate::store::keys::{decode_key, decode_u64, encode_key, encode_mark, seq_key};

impl EventLog for RocksLog {
    fn local_dc(&self) -> &str {
        &self.dc
    }
    fn own_mark(&self) -> Mark {
        self.own
    }
    fn mark_of(&self, origin: &str) -> Option<Mark> {
        self.marks.get(origin).copied()
    }
    fn marks(&self) -> BTreeMap<String, Mark> {
        self.marks.clone()
    }
    fn purge_floor(&self) -> u64 {
        self.floor
    }
    fn mark_event_id(&self, origin: &str) -> Option<uuid::Uuid> {
        self.mark_ids.get(origin).copied()
    }
    fn own_event_id(&self, seq: u64) -> Result<Option<uuid::Uuid>, LogError> {
        if seq == 0 || seq > self.own.seq {
            return Ok(None);
        }
        if seq == self.floor {
            return Ok(self.floor_id);
        }
        self.logged_event_id(seq)
    }
    fn begin_epoch(&mut self, epoch: u64) -> Result<(), LogError> {
        self.check_writable()?;
        if epoch <= self.own.epoch {
            return Err(LogError::EpochNotAbove { current: self.own.epoch, requested: epoch });
        }
        let log_cf = self.cf(CF_LOG)?;
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(log_cf, seq_key(0), seq_key(u64::MAX));
        batch.delete_cf(log_cf, seq_key(u64::MAX));
        batch.put_cf(meta, META_EPOCH, epoch.to_be_bytes());
        batch.put_cf(meta, META_PURGE_FLOOR, self.own.seq.to_be_bytes());
        batch.delete_cf(meta, META_FLOOR_ID);
        self.commit(batch)?;
        tracing::warn!(dc = %self.dc, from = self.own.epoch, to = epoch, seq = self.own.seq, "event log: new epoch");
        self.own.epoch = epoch;
        self.floor = self.own.seq;
        self.floor_id = None;
        Ok(())
    }

    fn append_local(&mut self, events: &[ChangeEvent]) -> Result<(), LogError> {
        self.append_local_with_changes(events).map(drop)
    }

    fn read_own(&self, after_seq: u64, max: usize) -> Result<Vec<ChangeEvent>, LogError> {
        if after_seq < self.floor {
            return Err(LogError::Purged { floor: self.floor });
        }
        let Some(first) = after_seq.checked_add(1) else {
            return Ok(Vec::new());
        };
        let want = usize::try_from(self.own.seq.saturating_sub(after_seq)).unwrap_or(usize::MAX).min(max);
        let mut out = Vec::with_capacity(want.min(4096));
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(seq_key(first).to_vec());
        for item in self.db()?.iterator_cf_opt(self.cf(CF_LOG)?, ro, IteratorMode::Start).take(want) {
            let (k, v) = item.map_err(storage)?;
            let seq = decode_u64("log key", &k)?;
            let expected = first + out.len() as u64;
            if seq != expected {
                return Err(LogError::Corrupt(format!("log is missing seq {expected} (next stored: {seq})")));
            }
            let ev = self.decode_logged(seq, &v)?;
            // A peer refuses an invalid event, and would be sent it again forever.
            if let Err(e) = validate_event(&ev) {
                let what = format!("own log entry {seq} ({:?}): {e}", ev.op.key());
                self.invalid.note(what.clone());
                return Err(LogError::Invalid(what));
            }
            out.push(ev);
        }
        if out.len() != want {
            return Err(LogError::Corrupt(format!(
                "log ends at seq {} but the own seq is {}",
                after_seq + out.len() as u64,
                self.own.seq
            )));
        }
        Ok(out)
    }

    fn apply_remote(&mut self, channel_dc: &str, events: &[ChangeEvent]) -> Result<ApplyReport, LogError> {
        self.check_writable()?;
        if channel_dc == self.dc {
            return Err(self.wrong_own_channel(channel_dc));
        }
        let mark = self.mark_of(channel_dc);
        let scope = self.scope_of(channel_dc);
        // plan_batch cannot see errors; the first one is kept and the plan discarded.
        let failure: RefCell<Option<LogError>> = RefCell::new(None);
        let plan = merge::plan_batch(
            channel_dc,
            mark,
            &scope,
            |k| {
                self.try_held(k).unwrap_or_else(|e| {
                    failure.borrow_mut().get_or_insert(e);
                    Held::Absent
                })
            },
            events,
        );
        if let Some(e) = failure.into_inner() {
            return Err(e);
        }
        let mut report = ApplyReport {
            applied: plan.changes.len(),
            superseded: plan.superseded,
            duplicates: plan.duplicates,
            out_of_scope: plan.out_of_scope,
            out_of_scope_namespace: plan.out_of_scope_namespace.map(str::to_owned),
            mark: plan.new_mark.or(mark),
            refusal: plan.refusal.clone(),
            changes: Vec::with_capacity(plan.changes.len()),
        };
        let mut batch = WriteBatch::default();
        let repeated = Repeated::of(plan.changes.iter().map(|c| c.event.op.key()));
        let mut buf = Vec::new();
        for change in &plan.changes {
            // A key only this change touches was read to plan it: `before` is what is stored
            // (`Absent` read both column families; `Live` says nothing of a tombstone).
            let tombstone = match (repeated.stored(change.event.op.key()), change.before) {
                (Stored::Read, Held::Absent) => Stored::No,
                (Stored::Read, Held::Tombstone { .. }) => Stored::Yes,
                (stored, _) => stored,
            };
            report.changes.push(self.stage_effect(
                &mut batch,
                change.event,
                change.effect,
                tombstone,
                &mut buf,
            )?);
        }
        let mark_id = plan.new_mark.and_then(|m| mark_event_id(events, m));
        if let Some(m) = plan.new_mark {
            let meta = self.cf(CF_META)?;
            batch.put_cf(meta, meta_name(META_MARK_PREFIX, channel_dc), encode_mark(m));
            match mark_id {
                Some(id) => batch.put_cf(meta, meta_name(META_MARK_ID_PREFIX, channel_dc), id.as_bytes()),
                None => batch.delete_cf(meta, meta_name(META_MARK_ID_PREFIX, channel_dc)),
            }
        }
        self.commit(batch)?;
        if let Some(m) = plan.new_mark {
            self.marks.insert(channel_dc.to_owned(), m);
            match mark_id {
                Some(id) => self.mark_ids.insert(channel_dc.to_owned(), id),
                None => self.mark_ids.remove(channel_dc),
            };
        }
        Ok(report)
    }

    fn install_snapshot(&mut self, channel_dc: &str, snap: &Snapshot) -> Result<ApplyReport, LogError> {
        self.check_writable()?;
        if channel_dc == self.dc {
            return Err(self.wrong_own_channel(channel_dc));
        }
        let mut batch = WriteBatch::default();
        let report = self.stage_install(&mut batch, channel_dc, snap)?;
        let mark = report.mark.unwrap_or(snap.mark);
        self.commit(batch)?;
        self.marks.insert(channel_dc.to_owned(), mark);
        self.mark_ids.remove(channel_dc);
        Ok(report)
    }

    fn open_snapshot(&self, chunk_bytes_max: usize) -> Result<Box<dyn SnapshotReader>, LogError> {
        self.open_snapshot_reader(chunk_bytes_max)
    }

    fn staged_snapshot(&self, origin: &str) -> Result<Option<StagedSnapshot>, LogError> {
        self.staged_of(origin).map(|s| s.map(|(staged, _)| staged))
    }

    fn stage_snapshot_chunk(
        &mut self,
        channel_dc: &str,
        chunk: &SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError> {
        self.stage_chunk(channel_dc, chunk)
    }

    fn snapshot_own(&self) -> Result<Snapshot, LogError> {
        let mut instances = Vec::new();
        for item in self.scan_owner(CF_INSTANCES, &self.dc)? {
            let (k, v) = item?;
            let (seq, record) = decode_instance(&v)?;
            check_stored_key(&k, &record.key)?;
            if self.valid_record(&record) {
                instances.push(SnapshotInstance { seq, record });
            }
        }
        let mut tombstones = Vec::new();
        for item in self.scan_owner(CF_TOMBSTONES, &self.dc)? {
            let (k, v) = item?;
            let (seq, reason) = decode_tombstone(&v)?;
            let key = decode_key(&k)?;
            if self.valid_key(&key) {
                tombstones.push(Tombstone { key, seq, reason });
            }
        }
        Ok(Snapshot { origin_dc: self.dc.clone(), mark: self.own, instances, tombstones })
    }

    fn purge_own(&mut self, upto_seq: u64) -> Result<(), LogError> {
        self.purge_own_reporting(upto_seq).map(drop)
    }

    fn purge_remote_tombstones(&mut self, origin: &str, upto_seq: u64) -> Result<(), LogError> {
        self.purge_remote_tombstones_reporting(origin, upto_seq).map(drop)
    }

    fn scope_of(&self, origin: &str) -> Scope {
        self.recorded_scope(origin)
    }

    fn rescope(&mut self, origin: &str, scope: &Scope) -> Result<Rescope, LogError> {
        self.record_scope(origin, scope)
    }

    /// A storage or decode error cannot be reported here: it is logged and the key reads
    /// as absent. The merge paths of this log use [`RocksLog::try_held`] and fail instead.
    fn held(&self, key: &InstanceKey) -> Held {
        self.try_held(key).unwrap_or_else(|e| {
            tracing::error!(?key, error = %e, "event log: cannot read the state of a key");
            Held::Absent
        })
    }

    fn instances(&self) -> Result<Vec<(u64, InstanceRecord)>, LogError> {
        self.instance_records()?.collect()
    }

    fn tombstones(&self) -> Result<Vec<Tombstone>, LogError> {
        let mut out = Vec::new();
        for item in self.scan_all(CF_TOMBSTONES)? {
            let (k, v) = item?;
            let (seq, reason) = decode_tombstone(&v)?;
            let key = decode_key(&k)?;
            if self.valid_key(&key) {
                out.push(Tombstone { key, seq, reason });
            }
        }
        Ok(out)
    }
}

impl RocksLog {
    /// The live instance records with their seqs, read one at a time in key order (what
    /// [`EventLog::instances`] collects): a start streams them into the view instead of
    /// holding every record twice. A record that cannot be read ends the walk with its
    /// error; one that breaks the schema's rules is skipped (logged and counted, as by
    /// the other reads).
    pub fn instance_records(
        &self,
    ) -> Result<impl Iterator<Item = Result<(u64, InstanceRecord), LogError>> + '_, LogError> {
        Ok(self.scan_all(CF_INSTANCES)?.filter_map(|item| {
            let read = item.and_then(|(k, v)| {
                let (seq, record) = decode_instance(&v)
                    .map_err(|e| LogError::Corrupt(format!("{e} (stored under {:?})", decode_key(&k))))?;
                check_stored_key(&k, &record.key)?;
                Ok((seq, record))
            });
            match read {
                Ok((_, ref record)) if !self.valid_record(record) => None,
                read => Some(read),
            }
        }))
    }

    /// A stored record that breaks the schema's rules is skipped, logged and counted:
    /// served by no read, sent to no peer (see the module docs).
    fn valid_record(&self, r: &InstanceRecord) -> bool {
        match validate_record(r) {
            Ok(()) => true,
            Err(e) => {
                self.invalid.note(format!("instance {:?}: {e}", r.key));
                false
            }
        }
    }

    fn valid_key(&self, k: &InstanceKey) -> bool {
        match validate_key(k) {
            Ok(()) => true,
            Err(e) => {
                self.invalid.note(format!("tombstone {k:?}: {e}"));
                false
            }
        }
    }

    /// Stages the install of a whole snapshot of `channel_dc` into `batch` (state, mark);
    /// the caller commits it. Shared by the single-frame install and the last chunk.
    pub(super) fn stage_install(
        &self,
        batch: &mut WriteBatch,
        channel_dc: &str,
        snap: &Snapshot,
    ) -> Result<ApplyReport, LogError> {
        // Rule 6: only the part in the origin's scope is installed; held copies outside it
        // are not in that part, so they go like anything else the snapshot does not hold.
        let (snap, out_of_scope, out_of_scope_namespace) = self.scope_of(channel_dc).filter_snapshot(snap);
        let snap = &*snap;
        let live = self.owner_keys(CF_INSTANCES, channel_dc)?;
        let tombs = self.owner_keys(CF_TOMBSTONES, channel_dc)?;
        let plan = merge::plan_snapshot(channel_dc, self.mark_of(channel_dc), &live, &tombs, snap)?;
        let (inst_cf, tombs_cf) = (self.cf(CF_INSTANCES)?, self.cf(CF_TOMBSTONES)?);
        let mut report = ApplyReport {
            mark: Some(plan.new_mark),
            out_of_scope,
            out_of_scope_namespace,
            ..Default::default()
        };
        // Which keys are live as the steps below go, so that the reported changes match the
        // model step for step. Keys of other owners (only in a snapshot that failed
        // validation) are looked up on demand.
        let mut live_now: BTreeSet<InstanceKey> = live.into_iter().collect();
        let mut others: BTreeMap<InstanceKey, bool> = BTreeMap::new();
        for k in plan.remove {
            batch.delete_cf(inst_cf, encode_key(&k));
            live_now.remove(&k);
            report.changes.push(StateChange::Remove { key: k });
        }
        for k in &plan.remove_tombstones {
            batch.delete_cf(tombs_cf, encode_key(k));
        }
        for SnapshotInstance { seq, record } in &snap.instances {
            let enc = encode_key(&record.key);
            batch.delete_cf(tombs_cf, &enc);
            batch.put_cf(inst_cf, &enc, tandem_schemas::encode(&(*seq, record)));
            if *record.key.owner_dc == *channel_dc {
                live_now.insert(record.key.clone());
            } else {
                others.insert(record.key.clone(), true);
            }
            report.changes.push(StateChange::Put { seq: *seq, record: record.clone() });
        }
        for t in &snap.tombstones {
            let enc = encode_key(&t.key);
            let was_live = if *t.key.owner_dc == *channel_dc {
                live_now.remove(&t.key)
            } else {
                let held_live = match others.get(&t.key) {
                    Some(live) => *live,
                    None => matches!(self.try_held(&t.key)?, Held::Live { .. }),
                };
                others.insert(t.key.clone(), false);
                held_live
            };
            if was_live {
                batch.delete_cf(inst_cf, &enc);
                report.changes.push(StateChange::Remove { key: t.key.clone() });
            }
            batch.put_cf(tombs_cf, &enc, tandem_schemas::encode(&(t.seq, t.reason)));
        }
        report.applied = snap.instances.len() + snap.tombstones.len();
        batch.put_cf(self.cf(CF_META)?, meta_name(META_MARK_PREFIX, channel_dc), encode_mark(plan.new_mark));
        // A snapshot's mark has no known event id.
        batch.delete_cf(self.cf(CF_META)?, meta_name(META_MARK_ID_PREFIX, channel_dc));
        Ok(report)
    }
}
