//! [`Instances`]: the instances a service holds, in key order, each stored once.
//!
//! A map from key to record would copy every key (four names, 64 bytes) into its tree
//! beside the record that already holds it. Here the tree's entries are the held records
//! themselves (a sequence number and a shared pointer: 16 bytes), ordered by the key inside
//! their record, and looked up by a key through [`Borrow`]; a node with a million leases
//! saves about a hundred bytes of tree per instance (docs/benchmarks.md, memory).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;

use tandem_schemas::InstanceKey;

use super::Held;

/// A [`Held`] record ordered, compared and looked up by its record's key.
struct ByKey(Held);

impl ByKey {
    fn key(&self) -> &InstanceKey {
        &self.0.record.key
    }
}

impl Borrow<InstanceKey> for ByKey {
    fn borrow(&self) -> &InstanceKey {
        self.key()
    }
}

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(other.key())
    }
}

/// One service's instances by key (see the module docs).
#[derive(Default)]
pub struct Instances(BTreeSet<ByKey>);

impl Instances {
    pub fn get(&self, key: &InstanceKey) -> Option<&Held> {
        self.0.get(key).map(|e| &e.0)
    }

    /// Holds `held` under its record's key, replacing (and returning) what was held there.
    pub fn insert(&mut self, held: Held) -> Option<Held> {
        self.0.replace(ByKey(held)).map(|e| e.0)
    }

    pub fn remove(&mut self, key: &InstanceKey) -> Option<Held> {
        self.0.take(key).map(|e| e.0)
    }

    /// The held records in key order.
    pub fn values(&self) -> impl Iterator<Item = &Held> {
        self.0.iter().map(|e| &e.0)
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &InstanceKey> {
        self.0.iter().map(ByKey::key)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use proptest::prelude::*;
    use tandem_schemas::InstanceRecord;

    use super::*;

    fn record(owner: &str, id: &str, port: u16) -> InstanceRecord {
        let mut r = tandem_replicator::log::conformance::record(owner, id);
        r.port = port;
        r
    }

    proptest! {
        /// Inserts, replacements and removals leave exactly what a map by key would hold,
        /// in the same order, and lookups find what the map finds.
        #[test]
        fn holds_what_a_map_by_key_holds(
            ops in proptest::collection::vec((0u8..3, 0u8..2, 0u8..12, any::<u16>()), 1..200)
        ) {
            let mut set = Instances::default();
            let mut map: BTreeMap<InstanceKey, (u64, u16)> = BTreeMap::new();
            for (seq, (op, owner, id, port)) in ops.into_iter().enumerate() {
                let r = record(["dc-a", "dc-b"][owner as usize], &format!("i-{id}"), port);
                let key = r.key.clone();
                if op < 2 {
                    let old = set.insert(Held { seq: seq as u64, record: Arc::new(r) });
                    let want = map.insert(key.clone(), (seq as u64, port));
                    prop_assert_eq!(old.map(|h| (h.seq, h.record.port)), want);
                } else {
                    let got = set.remove(&key);
                    prop_assert_eq!(got.map(|h| (h.seq, h.record.port)), map.remove(&key));
                }
                prop_assert_eq!(set.len(), map.len());
                let got: Vec<_> = set.values().map(|h| (h.record.key.clone(), (h.seq, h.record.port))).collect();
                let want: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
                prop_assert_eq!(got, want);
                prop_assert!(set.keys().eq(map.keys()));
                prop_assert_eq!(set.get(&key).map(|h| h.seq), map.get(&key).map(|v| v.0));
            }
        }
    }
}
