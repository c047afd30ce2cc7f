//! The relay's counters: the public snapshots ([`RelayStats`], [`LinkStats`]) and the
//! atomic counters the tasks bump.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a relay, for drill reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Client → upstream.
    pub forward: LinkStats,
    /// Upstream → client.
    pub backward: LinkStats,
    /// Client mappings currently open.
    pub mappings_open: u64,
    /// Mappings removed after being idle for `mapping_idle_ms`.
    pub mappings_expired: u64,
    /// Mappings evicted because the table was full.
    pub mappings_evicted: u64,
}

/// Counters of one direction. Once the timer queue is empty:
/// `received + duplicated == forwarded + dropped()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams received by the relay in this direction.
    pub received: u64,
    /// Copies handed to the kernel for sending (duplicates included).
    pub forwarded: u64,
    /// Datagrams dropped by a partition.
    pub dropped_partition: u64,
    /// Datagrams dropped by random loss.
    pub dropped_loss: u64,
    /// Copies dropped because a relay bound was reached (timer queue datagrams or bytes).
    pub dropped_queue_full: u64,
    /// Copies dropped because sending failed (kernel buffer full, ICMP error, no mapping
    /// socket could be opened).
    pub dropped_send_failed: u64,
    /// Extra copies created by duplication.
    pub duplicated: u64,
    /// Copies that went through the timer queue (any delay, hold or duplicate delay > 0).
    pub delayed: u64,
    /// Datagrams held back by `reorder_hold_ms`.
    pub reordered: u64,
}

impl LinkStats {
    /// All drops, whatever the cause.
    pub fn dropped(&self) -> u64 {
        self.dropped_partition + self.dropped_loss + self.dropped_queue_full + self.dropped_send_failed
    }
}

#[derive(Default)]
pub(super) struct LinkCounters {
    pub(super) received: AtomicU64,
    pub(super) forwarded: AtomicU64,
    pub(super) dropped_partition: AtomicU64,
    pub(super) dropped_loss: AtomicU64,
    pub(super) dropped_queue_full: AtomicU64,
    pub(super) dropped_send_failed: AtomicU64,
    pub(super) duplicated: AtomicU64,
    pub(super) delayed: AtomicU64,
    pub(super) reordered: AtomicU64,
}

impl LinkCounters {
    pub(super) fn snapshot(&self) -> LinkStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkStats {
            received: get(&self.received),
            forwarded: get(&self.forwarded),
            dropped_partition: get(&self.dropped_partition),
            dropped_loss: get(&self.dropped_loss),
            dropped_queue_full: get(&self.dropped_queue_full),
            dropped_send_failed: get(&self.dropped_send_failed),
            duplicated: get(&self.duplicated),
            delayed: get(&self.delayed),
            reordered: get(&self.reordered),
        }
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
