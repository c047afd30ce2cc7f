//! [`LeaseTable`]: a registry's leases with a due-time queue, so a lease check touches only
//! the leases whose deadline came.

use super::due::DueQueue;
use super::*;
use crate::hashed::Hash32;

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
///
/// The leases live in a slab (a vector of slots, reused through a free list), each slot
/// holding its key, and a hash table holds only slot numbers with 32 bits of their key's
/// hash: a queue entry names its slot, so the check reaches a lease without hashing its
/// key, and a million leases cost one slot each plus eight bytes of index per bucket, not
/// a hash map bucket of a whole slot at twice the count (a hash table doubles past seven
/// eighths full: 2^21 buckets for 1,000,000 leases) nor a second, shared copy of every key.
/// The hash kept in the index is what lets the table double without reading a slot: the
/// doubling rehashes every entry under the table's lock, and hashing each slot's key again
/// (four names behind pointers, at random places in the slab) held every renewal and
/// registration for 11 ms at 114,688 leases and 30 ms at 229,376.
///
/// The table also keeps the [`SelfPreservation`] accounting of its leases, grouped by
/// [`LeaseGroup::group`] (the namespace): it sees every renewal, every lease added and
/// removed, and every lease that parks or expires, which is what the expectation follows.
pub struct LeaseTable<K: Eq + std::hash::Hash + Clone + LeaseGroup> {
    /// Each key's slot in `slots`, with [`Hash32`] of the slot's key by `hasher`.
    index: hashbrown::HashTable<Entry>,
    hasher: foldhash::fast::RandomState,
    slots: Vec<Option<Slot<K>>>,
    /// Empty slots, reused first.
    free: Vec<u32>,
    /// Entries name slots.
    due: DueQueue<u32>,
    /// Leases past their expiry while expiry was paused: (slot, generation).
    parked: Vec<(u32, u64)>,
    /// Entries taken from `due` by a check done in parts, not yet looked at.
    pending: std::collections::VecDeque<(u64, u64, u32)>,
    generation: u64,
    preservation: SelfPreservation,
    /// Latest time a call brought (removals carry none).
    now_ms: u64,
}

/// What self-preservation groups leases by: the namespace of an instance.
pub trait LeaseGroup {
    fn group(&self) -> &str;
}

struct Slot<K> {
    key: K,
    lease: Lease,
    /// Generation of the queue entry that stands for this lease.
    generation: u64,
    /// Time of that entry.
    due_ms: u64,
    /// Renewed since its registration.
    renewed: bool,
    /// Parked or expired: out of the self-preservation expectation.
    out: bool,
    /// Counted and found silent past its suspect time (see [`SelfPreservation`]).
    overdue: bool,
}

/// An index entry: a slot, and 32 bits of its key's hash.
#[derive(Clone, Copy)]
struct Entry {
    slot: u32,
    hash: u32,
}

/// Whether an index entry names the slot that holds `key` (of hash `h`).
fn holds<'a, K: Eq>(slots: &'a [Option<Slot<K>>], key: &'a K, h: Hash32) -> impl Fn(&Entry) -> bool + 'a {
    move |e| e.hash == h.0 && slots[e.slot as usize].as_ref().is_some_and(|s| s.key == *key)
}

fn rehash(e: &Entry) -> u64 {
    Hash32(e.hash).wide()
}

impl<K> Slot<K> {
    /// In the self-preservation expectation.
    fn counted(&self) -> bool {
        self.renewed && !self.out
    }
}

impl<K: Eq + std::hash::Hash + Ord + Clone + LeaseGroup> Default for LeaseTable<K> {
    fn default() -> Self {
        LeaseTable::new(SelfPreservation::default())
    }
}

impl<K: Eq + std::hash::Hash + Ord + Clone + LeaseGroup> LeaseTable<K> {
    /// An empty table with this self-preservation accounting.
    pub fn new(preservation: SelfPreservation) -> Self {
        LeaseTable {
            index: Default::default(),
            hasher: Default::default(),
            slots: Vec::new(),
            free: Vec::new(),
            due: Default::default(),
            parked: Vec::new(),
            pending: Default::default(),
            generation: 0,
            preservation,
            now_ms: 0,
        }
    }

    /// The self-preservation accounting of these leases.
    pub fn preservation(&self) -> &SelfPreservation {
        &self.preservation
    }

    /// Decides which namespaces have expiry paused at `now_ms` (see [`SelfPreservation`]);
    /// [`LeaseTable::check`] follows the decision.
    pub fn evaluate_preservation(&mut self, now_ms: u64, cfg: &HealthConfig) -> Vec<PreservationChange> {
        self.now_ms = self.now_ms.max(now_ms);
        self.preservation.evaluate(now_ms, cfg)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn get(&self, key: &K) -> Option<&Lease> {
        let i = self.slot_of(key)?;
        self.slots[i as usize].as_ref().map(|s| &s.lease)
    }

    /// Every key that has a lease, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.slots.iter().flatten().map(|s| &s.key)
    }

    /// The slot holding `key`'s lease.
    fn slot_of(&self, key: &K) -> Option<u32> {
        let h = Hash32::of(&self.hasher, key);
        self.index.find(h.wide(), holds(&self.slots, key, h)).map(|e| e.slot)
    }

    /// Adds or replaces the lease of `key`. A new lease is not counted by
    /// self-preservation until it renews.
    pub fn insert(&mut self, key: K, lease: Lease) {
        self.now_ms = self.now_ms.max(lease.last_renew_ms());
        // One hash of the key for the removal of its old lease and the new entry.
        let h = Hash32::of(&self.hasher, &key);
        self.remove_hashed(&key, h);
        self.preservation.lease_added(key.group(), self.now_ms);
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                // More than 2^32 leases would need more memory than a node has.
                let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 leases");
                self.slots.push(None);
                i
            }
        };
        let (generation, due_ms) = self.schedule(i, &lease);
        let slot = Slot { key, lease, generation, due_ms, renewed: false, out: false, overdue: false };
        self.slots[i as usize] = Some(slot);
        self.index.insert_unique(h.wide(), Entry { slot: i, hash: h.0 }, rehash);
        // Only now: compacting before the lease is in its slot would drop its own entry as
        // stale, and the lease would never be checked again.
        self.compact();
    }

    pub fn remove(&mut self, key: &K) -> Option<Lease> {
        self.remove_hashed(key, Hash32::of(&self.hasher, key))
    }

    /// [`Self::remove`] of a key whose [`Hash32`] is `h`.
    fn remove_hashed(&mut self, key: &K, h: Hash32) -> Option<Lease> {
        let found = self.index.find_entry(h.wide(), holds(&self.slots, key, h));
        let (Entry { slot: i, .. }, _) = found.ok()?.remove();
        let slot = self.slots[i as usize].take()?;
        self.free.push(i);
        if slot.counted() {
            let s = slot.lease.times().suspect_after_ms;
            self.preservation.uncounted(key.group(), self.now_ms, s, slot.overdue);
        }
        self.preservation.lease_removed(key.group());
        Some(slot.lease)
    }

    /// Renews the lease of `key` if there is one: `None` when there is none, else what
    /// [`Lease::heartbeat`] returned.
    pub fn heartbeat(&mut self, key: &K, now_ms: u64) -> Option<Option<Transition>> {
        self.renew(key, now_ms).map(|(t, _)| t)
    }

    /// [`LeaseTable::heartbeat`], with the renewed lease's registration
    /// ([`Lease::registration`]) found by the same lookup.
    pub fn renew(&mut self, key: &K, now_ms: u64) -> Option<(Option<Transition>, u64)> {
        let i = self.slot_of(key)?;
        self.renew_slot(i, now_ms)
    }

    /// [`LeaseTable::renew`] of the lease whose key `is` says is `q`'s, found by `q`'s hash
    /// (which must be the hash of that key: see `InstanceNames`), so that a renewal by name
    /// builds no key; only when `admit` admits that lease (else `None`, nothing renewed).
    /// The key comes back with the transition when there is one.
    pub fn renew_by<Q: std::hash::Hash + ?Sized>(
        &mut self,
        q: &Q,
        is: impl Fn(&K) -> bool,
        admit: impl FnOnce(&Lease) -> bool,
        now_ms: u64,
    ) -> Option<(Option<(Transition, K)>, u64)> {
        let (slots, h) = (&self.slots, Hash32::of(&self.hasher, q));
        let i = self
            .index
            .find(h.wide(), |e| e.hash == h.0 && slots[e.slot as usize].as_ref().is_some_and(|s| is(&s.key)))?
            .slot;
        if !slots[i as usize].as_ref().is_some_and(|s| admit(&s.lease)) {
            return None;
        }
        let (t, registration) = self.renew_slot(i, now_ms)?;
        let t = t.and_then(|t| Some((t, self.slots[i as usize].as_ref()?.key.clone())));
        Some((t, registration))
    }

    fn renew_slot(&mut self, i: u32, now_ms: u64) -> Option<(Option<Transition>, u64)> {
        self.now_ms = self.now_ms.max(now_ms);
        let slot = self.slots[i as usize].as_mut()?;
        let registration = slot.lease.registration();
        let silence_ms = now_ms.saturating_sub(slot.lease.last_renew_ms());
        let alive = !slot.lease.expired();
        let t = slot.lease.heartbeat(now_ms);
        if alive {
            // Renewed: counted from now on (again, for a parked lease), and credited.
            let s = slot.lease.times().suspect_after_ms;
            let counted = slot.counted();
            self.preservation.renewed(slot.key.group(), now_ms, silence_ms, s, counted, slot.overdue);
            (slot.renewed, slot.out, slot.overdue) = (true, false, false);
        }
        if slot.lease.next_deadline_ms().is_some_and(|d| d < slot.due_ms) {
            self.reschedule(i);
        }
        Some((t, registration))
    }

    /// The lease check at `now_ms`: ticks every lease whose deadline has come and returns
    /// the transitions, in deadline order. Expiry is paused for every lease when
    /// `expiry_paused`, else for the leases of namespaces self-preservation pauses (as of
    /// the last [`LeaseTable::evaluate_preservation`]). A lease past its expiry while
    /// expiry is paused is parked (and leaves the self-preservation expectation), and
    /// queued again at the first check with expiry resumed in its namespace.
    pub fn check(&mut self, now_ms: u64, expiry_paused: bool) -> Vec<(K, Transition)> {
        let mut out = Vec::new();
        loop {
            let (mut part, more) = self.check_some(now_ms, expiry_paused, usize::MAX);
            out.append(&mut part);
            if !more {
                return out;
            }
        }
    }

    /// [`LeaseTable::check`] in parts: looks at no more than `budget` due leases and says
    /// whether due leases remain. The caller calls again with the same `now_ms` until none
    /// remain, and may let heartbeats in between (a node with a million leases that all
    /// came due at once, after a restart or a failover, would otherwise hold them off for
    /// the whole check). A lease renewed in between is found renewed when its turn comes.
    pub fn check_some(
        &mut self,
        now_ms: u64,
        expiry_paused: bool,
        budget: usize,
    ) -> (Vec<(K, Transition)>, bool) {
        self.now_ms = self.now_ms.max(now_ms);
        let mut out = Vec::new();
        if self.pending.is_empty() {
            self.take_due(now_ms, expiry_paused);
        }
        let take = budget.max(1).min(self.pending.len());
        let batch: Vec<_> = self.pending.drain(..take).collect();
        for (_, generation, i) in batch {
            let Some(Some(slot)) = self.slots.get_mut(i as usize) else { continue };
            if slot.generation != generation {
                continue;
            }
            let key = &slot.key;
            let paused = expiry_paused || self.preservation.paused(key.group());
            let s = slot.lease.times().suspect_after_ms;
            let silence_ms = now_ms.saturating_sub(slot.lease.last_renew_ms());
            if slot.counted() && !slot.overdue && silence_ms >= s {
                slot.overdue = true;
                self.preservation.overdue(key.group(), now_ms, silence_ms, s);
            }
            if let Some(t) = slot.lease.tick(now_ms, paused) {
                if t == Transition::Expire && slot.counted() {
                    self.preservation.uncounted(key.group(), now_ms, s, slot.overdue);
                    (slot.out, slot.overdue) = (true, false);
                }
                out.push((key.clone(), t));
            }
            // Every entry pushed here lies after `now_ms`: the next check takes it.
            self.generation += 1;
            slot.generation = self.generation;
            slot.due_ms = u64::MAX;
            match slot.lease.next_deadline_ms() {
                None => {}
                Some(next_ms) if next_ms > now_ms => {
                    slot.due_ms = next_ms;
                    self.due.push(next_ms, self.generation, i);
                }
                Some(_) => {
                    // Past its expiry with expiry paused: nothing changes until expiry
                    // resumes (then it is parked back in the queue), except a damping
                    // release, which keeps its own entry.
                    if let Some(release_ms) = slot.lease.release_deadline_ms().filter(|r| *r > now_ms) {
                        slot.due_ms = release_ms;
                        self.due.push(release_ms, self.generation, i);
                    }
                    if slot.counted() {
                        self.preservation.uncounted(key.group(), now_ms, s, slot.overdue);
                        (slot.out, slot.overdue) = (true, false);
                    }
                    self.parked.push((i, self.generation));
                }
            }
        }
        let more = !self.pending.is_empty();
        (out, more)
    }

    /// Moves every lease due at `now_ms` to `pending`, in deadline order: first the parked
    /// leases whose namespace has expiry resumed (queued again at `now_ms`).
    fn take_due(&mut self, now_ms: u64, expiry_paused: bool) {
        for (i, generation) in std::mem::take(&mut self.parked) {
            let Some(Some(slot)) = self.slots.get_mut(i as usize) else { continue };
            if slot.generation != generation {
                continue;
            }
            if expiry_paused || self.preservation.paused(slot.key.group()) {
                self.parked.push((i, generation));
                continue;
            }
            self.generation += 1;
            slot.generation = self.generation;
            slot.due_ms = now_ms;
            self.due.push(now_ms, self.generation, i);
        }
        self.pending = self.due.take_due(now_ms).into();
    }

    /// Queued entries, stale ones included (for tests and metrics).
    pub fn queued(&self) -> usize {
        self.due.len() + self.pending.len()
    }

    fn schedule(&mut self, i: u32, lease: &Lease) -> (u64, u64) {
        self.generation += 1;
        let Some(d) = lease.next_deadline_ms() else { return (self.generation, u64::MAX) };
        self.due.push(d, self.generation, i);
        (self.generation, d)
    }

    fn reschedule(&mut self, i: u32) {
        self.generation += 1;
        let generation = self.generation;
        if let Some(Some(slot)) = self.slots.get_mut(i as usize) {
            if let Some(d) = slot.lease.next_deadline_ms() {
                slot.generation = generation;
                slot.due_ms = d;
                self.due.push(d, generation, i);
            }
        }
        self.compact();
    }

    /// Drops stale entries when they outnumber the live ones, so that churn (leases
    /// removed and added again) cannot grow the queue without bound.
    fn compact(&mut self) {
        if self.due.len() > 64 && self.due.len() > 2 * self.index.len() {
            let slots = &self.slots;
            self.due.retain(|g, i| {
                slots.get(*i as usize).is_some_and(|s| s.as_ref().is_some_and(|s| s.generation == g))
            });
        }
    }
}
