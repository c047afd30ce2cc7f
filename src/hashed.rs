//! Hash tables that double without hashing a key again. A hash table doubles past seven
//! eighths full by reinserting every entry, in one call, under whatever lock guards it; a
//! table that keeps only keys hashes each one again there, and an `InstanceKey` is four
//! names behind pointers: the lease table held every renewal and registration for 11 ms at
//! 114,688 leases that way (docs/benchmarks.md, "Issue 21, fifteenth round"). The tables
//! here keep 32 bits of each key's hash beside it ([`Hash32`]), and find and double by a
//! 64-bit hash made of them, so a doubling reads only its own entries.
//! [`HashedMap`] is such a map; the lease table keeps [`Hash32`] in its index.

use std::hash::Hash;

/// 32 bits of a key's hash, as a table entry keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hash32(pub u32);

impl Hash32 {
    pub fn of(hasher: &foldhash::fast::RandomState, q: &(impl Hash + ?Sized)) -> Hash32 {
        let h = std::hash::BuildHasher::hash_one(hasher, q);
        Hash32((h ^ (h >> 32)) as u32)
    }

    /// The table's hash: spread over 64 bits (a table takes its bucket from the low bits
    /// and a tag from the top seven) by a multiply with an odd constant (2^64 / the golden
    /// ratio).
    pub fn wide(self) -> u64 {
        u64::from(self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// A map whose doubling hashes no key (see the module).
pub struct HashedMap<K, V> {
    table: hashbrown::HashTable<(Hash32, K, V)>,
    hasher: foldhash::fast::RandomState,
}

impl<K, V> Default for HashedMap<K, V> {
    fn default() -> Self {
        HashedMap { table: hashbrown::HashTable::new(), hasher: Default::default() }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for HashedMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.table.iter().map(|(_, k, v)| (k, v))).finish()
    }
}

fn wide<K, V>(e: &(Hash32, K, V)) -> u64 {
    e.0.wide()
}

impl<K: Hash + Eq, V> HashedMap<K, V> {
    pub fn get(&self, key: &K) -> Option<&V> {
        let h = Hash32::of(&self.hasher, key);
        self.table.find(h.wide(), |e| e.0 == h && e.1 == *key).map(|e| &e.2)
    }

    /// Sets `key`'s value; returns the one it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let h = Hash32::of(&self.hasher, &key);
        match self.table.find_mut(h.wide(), |e| e.0 == h && e.1 == key) {
            Some(e) => Some(std::mem::replace(&mut e.2, value)),
            None => {
                self.table.insert_unique(h.wide(), (h, key, value), wide);
                None
            }
        }
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        let h = Hash32::of(&self.hasher, key);
        let found = self.table.find_entry(h.wide(), |e| e.0 == h && e.1 == *key).ok()?;
        Some(found.remove().0 .2)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn clear(&mut self) {
        self.table.clear();
    }
}

impl<K: Hash + Eq, V> FromIterator<(K, V)> for HashedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = HashedMap::default();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

/// A key that counts how often it is hashed, for the tests of the tables that keep
/// [`Hash32`] (here and the lease table's).
#[cfg(test)]
pub(crate) mod counted {
    use std::cell::Cell;

    thread_local! {
        static HASHED: Cell<u64> = const { Cell::new(0) };
    }

    #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
    pub(crate) struct Counted(pub u32);

    impl std::hash::Hash for Counted {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            HASHED.with(|n| n.set(n.get() + 1));
            self.0.hash(state);
        }
    }

    /// Times a [`Counted`] was hashed on this thread since the last call.
    pub(crate) fn hashed() -> u64 {
        HASHED.with(|n| n.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::counted::{hashed, Counted};
    use super::*;

    /// 100,000 inserts (ten doublings), a lookup each, replacements and removals: each
    /// call hashes its key once, and a doubling none.
    #[test]
    fn a_map_doubles_without_hashing_its_keys_again() {
        hashed();
        let mut m: HashedMap<Counted, u32> = (0..100_000).map(|k| (Counted(k), k)).collect();
        assert_eq!(hashed(), 100_000);
        assert!((0..100_000).all(|k| m.get(&Counted(k)) == Some(&k)));
        assert_eq!(m.insert(Counted(7), 70), Some(7));
        assert_eq!(m.remove(&Counted(8)), Some(8));
        assert_eq!(m.remove(&Counted(8)), None);
        assert_eq!(m.get(&Counted(100_000)), None);
        assert_eq!(hashed(), 100_004);
        assert_eq!((m.len(), m.get(&Counted(7))), (99_999, Some(&70)));
        m.clear();
        assert!(m.is_empty());
    }
}
