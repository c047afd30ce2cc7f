//! [`LeaseTable`]: a registry's leases with a due-time queue, so a lease check touches only
//! the leases whose deadline came.

use super::*;

/// Every lease of a node, with a due-time queue so that a lease check looks only at the
/// leases whose next deadline has come, not at all of them.
///
/// A heartbeat only updates its lease (O(1) amortized): it never touches the queue unless
/// it moved the lease's deadline earlier. Each queued entry carries a generation; an entry
/// whose generation is not its lease's current one is stale (the lease was rescheduled or
/// removed) and is dropped when it comes up. A lease is looked at about once per deadline
/// (for a healthy lease: once per suspect time), so a check's work is proportional to the
/// leases that are due, whatever the total.
///
/// Checking a lease early is harmless ([`Lease::tick`] returns `None`), so a deadline that
/// a heartbeat postponed costs one extra look, never a missed transition: the queue holds,
/// for every lease, an entry at or before its next deadline.
pub struct LeaseTable<K: Eq + std::hash::Hash + Clone> {
    map: std::collections::HashMap<std::sync::Arc<K>, Slot, foldhash::fast::RandomState>,
    due: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, std::sync::Arc<K>)>>,
    /// Leases past their expiry while expiry was paused, with their generation.
    parked: Vec<(std::sync::Arc<K>, u64)>,
    generation: u64,
}

struct Slot {
    lease: Lease,
    /// Generation of the queue entry that stands for this lease.
    generation: u64,
    /// Time of that entry.
    due_ms: u64,
}

impl<K: Eq + std::hash::Hash + Ord + Clone> Default for LeaseTable<K> {
    fn default() -> Self {
        LeaseTable { map: Default::default(), due: Default::default(), parked: Vec::new(), generation: 0 }
    }
}

impl<K: Eq + std::hash::Hash + Ord + Clone> LeaseTable<K> {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, key: &K) -> Option<&Lease> {
        self.map.get(key).map(|s| &s.lease)
    }

    /// Every key that has a lease, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys().map(|k| &**k)
    }

    /// Adds or replaces the lease of `key`.
    pub fn insert(&mut self, key: K, lease: Lease) {
        let key = std::sync::Arc::new(key);
        let (generation, due_ms) = self.schedule(&key, &lease);
        self.map.insert(key, Slot { lease, generation, due_ms });
    }

    pub fn remove(&mut self, key: &K) -> Option<Lease> {
        self.map.remove(key).map(|s| s.lease)
    }

    /// Renews the lease of `key` if there is one: `None` when there is none, else what
    /// [`Lease::heartbeat`] returned.
    pub fn heartbeat(&mut self, key: &K, now_ms: u64) -> Option<Option<Transition>> {
        let slot = self.map.get_mut(key)?;
        let t = slot.lease.heartbeat(now_ms);
        if slot.lease.next_deadline_ms().is_some_and(|d| d < slot.due_ms) {
            self.reschedule(key);
        }
        Some(t)
    }

    /// The lease check at `now_ms`: ticks every lease whose deadline has come and returns
    /// the transitions, in deadline order. A lease past its expiry while expiry is paused
    /// is parked, and queued again at the first check with expiry resumed.
    pub fn check(&mut self, now_ms: u64, expiry_paused: bool) -> Vec<(K, Transition)> {
        let mut out = Vec::new();
        if !expiry_paused {
            for (key, generation) in std::mem::take(&mut self.parked) {
                if let Some(slot) = self.map.get_mut(&key).filter(|s| s.generation == generation) {
                    self.generation += 1;
                    slot.generation = self.generation;
                    slot.due_ms = now_ms;
                    self.due.push(std::cmp::Reverse((now_ms, self.generation, key)));
                }
            }
        }
        while let Some(std::cmp::Reverse((due_ms, _, _))) = self.due.peek() {
            if *due_ms > now_ms {
                break;
            }
            let Some(std::cmp::Reverse((_, generation, key))) = self.due.pop() else { break };
            let Some(slot) = self.map.get_mut(&key) else { continue };
            if slot.generation != generation {
                continue;
            }
            if let Some(t) = slot.lease.tick(now_ms, expiry_paused) {
                out.push(((*key).clone(), t));
            }
            // Every entry pushed here lies after `now_ms`, so this loop ends.
            self.generation += 1;
            slot.generation = self.generation;
            slot.due_ms = u64::MAX;
            match slot.lease.next_deadline_ms() {
                None => {}
                Some(next_ms) if next_ms > now_ms => {
                    slot.due_ms = next_ms;
                    self.due.push(std::cmp::Reverse((next_ms, self.generation, key)));
                }
                Some(_) => {
                    // Past its expiry with expiry paused: nothing changes until expiry
                    // resumes (then it is parked back in the queue), except a damping
                    // release, which keeps its own entry.
                    if let Some(release_ms) = slot.lease.release_deadline_ms().filter(|r| *r > now_ms) {
                        slot.due_ms = release_ms;
                        self.due.push(std::cmp::Reverse((release_ms, self.generation, key.clone())));
                    }
                    self.parked.push((key, self.generation));
                }
            }
        }
        out
    }

    /// Queued entries, stale ones included (for tests and metrics).
    pub fn queued(&self) -> usize {
        self.due.len()
    }

    fn schedule(&mut self, key: &std::sync::Arc<K>, lease: &Lease) -> (u64, u64) {
        self.generation += 1;
        let Some(d) = lease.next_deadline_ms() else { return (self.generation, u64::MAX) };
        self.due.push(std::cmp::Reverse((d, self.generation, key.clone())));
        self.compact();
        (self.generation, d)
    }

    fn reschedule(&mut self, key: &K) {
        let Some((arc, _)) = self.map.get_key_value(key) else { return };
        let arc = arc.clone();
        self.generation += 1;
        let generation = self.generation;
        if let Some(slot) = self.map.get_mut(key) {
            if let Some(d) = slot.lease.next_deadline_ms() {
                slot.generation = generation;
                slot.due_ms = d;
                self.due.push(std::cmp::Reverse((d, generation, arc)));
            }
        }
        self.compact();
    }

    /// Drops stale entries when they outnumber the live ones, so that churn (leases
    /// removed and added again) cannot grow the queue without bound.
    fn compact(&mut self) {
        if self.due.len() > 64 && self.due.len() > 2 * self.map.len() {
            let map = &self.map;
            self.due.retain(|std::cmp::Reverse((_, g, k))| map.get(k).is_some_and(|s| s.generation == *g));
        }
    }
}
