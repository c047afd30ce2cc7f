//! The replication scope of each peer DC in the RocksDB log: the scope its mark was
//! acquired under, kept as a meta key `scope/<dc>` (no column family of its own, so an
//! older build still opens the data dir), and the change of it at start
//! (`EventLog::rescope`): copies outside the new scope are removed, and a wider scope
//! resets the mark's seq so that the peer resyncs (docs/replication.md, "Replication scope").

use std::collections::BTreeMap;

use rocksdb::WriteBatch;
use tandem_replicator::log::{widened_mark, LogError, Rescope, StateChange};
use tandem_replicator::scope::Scope;

use super::{
    decode_key, encode_mark, meta_name, prefix_end, RocksLog, CF_INSTANCES, CF_META, CF_TOMBSTONES,
    META_MARK_ID_PREFIX, META_MARK_PREFIX,
};

/// `scope/<dc>` -> the namespaces the DC may replicate here, joined by `\n` (absent: all).
pub(super) const META_SCOPE_PREFIX: &[u8] = b"scope/";

impl RocksLog {
    /// The replication scope of `origin` here, as recorded.
    pub(super) fn recorded_scope(&self, origin: &str) -> Scope {
        self.scopes.get(origin).cloned().unwrap_or_default()
    }

    /// Makes `scope` the replication scope of `origin`, in one synced write: its live
    /// copies and tombstones outside the scope are removed; a scope wider than the recorded
    /// one moves the mark to seq 0 of its epoch, so the origin resends its whole log or a
    /// snapshot on the next stream. The same scope changes nothing.
    pub(super) fn record_scope(&mut self, origin: &str, scope: &Scope) -> Result<Rescope, LogError> {
        self.check_writable()?;
        let was = self.recorded_scope(origin);
        if was == *scope {
            return Ok(Rescope { was, ..Default::default() });
        }
        let (inst_cf, tomb_cf, meta) = (self.cf(CF_INSTANCES)?, self.cf(CF_TOMBSTONES)?, self.cf(CF_META)?);
        let mut batch = WriteBatch::default();
        let mut changes = Vec::new();
        for item in self.scan_owner(CF_INSTANCES, origin)? {
            let (k, _) = item?;
            let key = decode_key(&k)?;
            if !scope.allows(&key.namespace) {
                batch.delete_cf(inst_cf, &k);
                changes.push(StateChange::Remove { key });
            }
        }
        let mut tombstones_removed = 0;
        for item in self.scan_owner(CF_TOMBSTONES, origin)? {
            let (k, _) = item?;
            if !scope.allows(&decode_key(&k)?.namespace) {
                batch.delete_cf(tomb_cf, &k);
                tombstones_removed += 1;
            }
        }
        let reset = if was.covers(scope) { None } else { widened_mark(self.marks.get(origin).copied()) };
        if let Some(m) = reset {
            batch.put_cf(meta, meta_name(META_MARK_PREFIX, origin), encode_mark(m));
            batch.delete_cf(meta, meta_name(META_MARK_ID_PREFIX, origin));
        }
        match scope.to_stored() {
            Some(s) => batch.put_cf(meta, meta_name(META_SCOPE_PREFIX, origin), s.as_bytes()),
            None => batch.delete_cf(meta, meta_name(META_SCOPE_PREFIX, origin)),
        }
        self.commit(batch)?;
        if let Some(m) = reset {
            self.marks.insert(origin.to_owned(), m);
            self.mark_ids.remove(origin);
        }
        match scope {
            Scope::All => self.scopes.remove(origin),
            Scope::Only(_) => self.scopes.insert(origin.to_owned(), scope.clone()),
        };
        tracing::warn!(
            peer = %origin,
            from = %was,
            to = %scope,
            copies_removed = changes.len(),
            tombstones_removed,
            resync = reset.is_some(),
            "replication scope of a peer changed"
        );
        Ok(Rescope { changes, tombstones_removed, mark_reset: reset.is_some(), was })
    }

    /// Reads the recorded scopes (at open).
    pub(super) fn load_scopes(&self) -> Result<BTreeMap<String, Scope>, LogError> {
        let prefix = META_SCOPE_PREFIX;
        let mut out = BTreeMap::new();
        for item in self.scan(CF_META, prefix, prefix_end(prefix))? {
            let (k, v) = item?;
            let name = std::str::from_utf8(&k[prefix.len()..])
                .map_err(|_| LogError::Corrupt("meta scope name is not UTF-8".into()))?;
            let list =
                std::str::from_utf8(&v).map_err(|_| LogError::Corrupt("meta scope is not UTF-8".into()))?;
            out.insert(name.to_owned(), Scope::from_stored(Some(list)));
        }
        Ok(out)
    }
}
