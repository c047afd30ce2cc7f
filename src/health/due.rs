//! [`DueQueue`]: the lease table's due-time queue, a timing wheel of coarse buckets.
//!
//! A node with a million leases re-queues about a million entries per suspect time (every
//! healthy lease is looked at once per deadline). A binary heap pays two sift passes over a
//! million-entry array per look, each a chain of cache misses; here a push is an append to
//! the bucket of its time and a check drains the buckets whose time came, so a look costs
//! the lease's own lookup and little more (docs/benchmarks.md, scale).

use std::collections::BTreeMap;

/// Width of a bucket: 2^6 = 64 ms. Finer than the lease check's period, so a check drains
/// whole buckets, plus the part of the current one that is due.
const BUCKET_SHIFT: u32 = 6;

/// Entries `(due_ms, generation, key)` (the key: a lease's slot) grouped by `due_ms >> BUCKET_SHIFT`. Entries come out
/// in `(due_ms, generation)` order, as from a min-heap of the same entries.
pub(super) struct DueQueue<K> {
    buckets: BTreeMap<u64, Vec<(u64, u64, K)>>,
    len: usize,
}

impl<K> Default for DueQueue<K> {
    fn default() -> Self {
        DueQueue { buckets: BTreeMap::new(), len: 0 }
    }
}

impl<K> DueQueue<K> {
    /// Entries queued, stale ones included.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn push(&mut self, due_ms: u64, generation: u64, key: K) {
        self.buckets.entry(due_ms >> BUCKET_SHIFT).or_default().push((due_ms, generation, key));
        self.len += 1;
    }

    /// Removes and returns every entry due at `now_ms` (`due_ms <= now_ms`), in
    /// `(due_ms, generation)` order.
    pub(super) fn take_due(&mut self, now_ms: u64) -> Vec<(u64, u64, K)> {
        let now_bucket = now_ms >> BUCKET_SHIFT;
        let mut due = Vec::new();
        while let Some(entry) = self.buckets.first_entry() {
            let bucket = *entry.key();
            if bucket > now_bucket {
                break;
            }
            if bucket < now_bucket {
                due.append(&mut entry.remove());
                continue;
            }
            // The bucket of `now_ms`: only its due part.
            let entries = entry.into_mut();
            let (ready, later): (Vec<_>, Vec<_>) = entries.drain(..).partition(|(d, _, _)| *d <= now_ms);
            due.extend(ready);
            if later.is_empty() {
                self.buckets.remove(&bucket);
            } else if let Some(b) = self.buckets.get_mut(&bucket) {
                *b = later;
            }
            break;
        }
        self.len -= due.len();
        due.sort_unstable_by_key(|(d, g, _)| (*d, *g));
        due
    }

    /// Keeps only the entries `keep` says are live.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(u64, &K) -> bool) {
        self.buckets.retain(|_, entries| {
            entries.retain(|(_, g, k)| keep(*g, k));
            entries.shrink_to_fit();
            !entries.is_empty()
        });
        self.len = self.buckets.values().map(Vec::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The queue gives what a min-heap of the same entries gives: every entry due at the
        /// check, in (due, generation) order, and nothing early.
        #[test]
        fn drains_like_a_min_heap(ops in proptest::collection::vec((0u64..2_000, any::<bool>()), 1..300)) {
            let mut q = DueQueue::default();
            let mut heap = std::collections::BinaryHeap::new();
            let (mut now, mut generation) = (0u64, 0u64);
            for (delta, is_push) in ops {
                if is_push {
                    generation += 1;
                    q.push(now + delta, generation, generation);
                    heap.push(std::cmp::Reverse((now + delta, generation)));
                } else {
                    now += delta / 4;
                    let got: Vec<(u64, u64)> = q.take_due(now).into_iter().map(|(d, g, _)| (d, g)).collect();
                    let mut want = Vec::new();
                    while heap.peek().is_some_and(|std::cmp::Reverse((d, _))| *d <= now) {
                        let Some(std::cmp::Reverse(e)) = heap.pop() else { break };
                        want.push(e);
                    }
                    prop_assert_eq!(got, want);
                }
                prop_assert_eq!(q.len(), heap.len());
            }
        }
    }
}
