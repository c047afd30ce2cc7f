//! Handing freed heap back to the OS. glibc's malloc keeps what a thread frees in that
//! thread's arena for reuse, and gives pages back only from the top of an arena: a burst of
//! client connections (each with hyper's read and write buffers, its request bodies and
//! answers) leaves megabytes resident after the connections are gone, interleaved with the
//! view's and the memtables' live records. `malloc_trim(0)` returns every whole free page of
//! every arena (madvise), which is what this module calls, from one thread per process (the
//! nodes of a process share its heap):
//! - when a burst has ended: [`BURST_CONNECTIONS`] fewer client connections open than at
//!   their most since the last trim, and fewer than [`CLOSING_CONNECTIONS`] closed during
//!   the last [`TICK`] (the burst's closes are over: a trim in the middle of them would
//!   leave the rest's buffers behind; a steady trickle of closes does not hold it off);
//! - every [`PERIOD`] whatever happened (memory freed by a catch-up, a snapshot, a reload);
//! - and when asked, once the memtables of a quiet log were flushed ([`Reason::Memtables`],
//!   `node/idle.rs`).
//!
//! Each trim is counted in `/metrics` with the bytes of RSS it gave back and its time
//! (`tandem_heap_trims_total`, `tandem_heap_trim_released_bytes_total`,
//! `tandem_heap_trim_seconds_total`). Elsewhere than on glibc nothing is trimmed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// How often the trimming thread looks at the connection counts.
pub const TICK: Duration = Duration::from_millis(500);
/// A trim at least this often (when no burst asked for one sooner).
pub const PERIOD: Duration = Duration::from_secs(60);
/// A burst has ended when this many fewer client connections are open than at their most
/// since the last trim.
pub const BURST_CONNECTIONS: u64 = 64;
/// A burst is still closing while this many connections closed in the last tick.
pub const CLOSING_CONNECTIONS: u64 = 16;

/// Why a trim ran (the label of its counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Client connections closed after a burst.
    Connections,
    /// [`PERIOD`] passed.
    Period,
    /// The memtables of a quiet log were flushed.
    Memtables,
}

/// The process's trims so far, per [`Reason`] (index 0: connections, 1: period, 2:
/// memtables).
#[derive(Debug, Default)]
pub struct HeapStats {
    pub trims: [u64; 3],
    /// RSS given back (RSS before the trim minus after, when it fell).
    pub released_bytes: u64,
    /// Time spent in `malloc_trim`.
    pub seconds: f64,
    /// RSS of the process now (0 where `/proc/self/statm` cannot be read).
    pub rss_bytes: u64,
}

static OPEN: AtomicU64 = AtomicU64::new(0);
static CLOSED: AtomicU64 = AtomicU64::new(0);
static MOST: AtomicU64 = AtomicU64::new(0);
static TRIMS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static RELEASED: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);

/// A client connection was admitted (any node of this process).
pub(crate) fn connection_opened() {
    let open = OPEN.fetch_add(1, Ordering::Relaxed) + 1;
    MOST.fetch_max(open, Ordering::Relaxed);
}

/// A client connection closed.
pub(crate) fn connection_closed() {
    OPEN.fetch_sub(1, Ordering::Relaxed);
    CLOSED.fetch_add(1, Ordering::Relaxed);
}

/// Starts the process's trimming thread, once (later calls do nothing). Where the thread
/// cannot be started, nothing is trimmed (logged).
pub fn start() {
    static STARTED: Once = Once::new();
    if !TRIMS_HEAP {
        return;
    }
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new().name("tandem-heap".into()).spawn(|| {
            let (mut last, mut closed) = (Instant::now(), CLOSED.load(Ordering::Relaxed));
            loop {
                std::thread::sleep(TICK);
                let (open, now_closed) = (OPEN.load(Ordering::Relaxed), CLOSED.load(Ordering::Relaxed));
                let closing = now_closed.wrapping_sub(closed);
                closed = now_closed;
                if let Some(reason) = due(open, MOST.load(Ordering::Relaxed), closing, last.elapsed()) {
                    // A connection admitted meanwhile raises it again (fetch_max).
                    MOST.store(open, Ordering::Relaxed);
                    trim(reason);
                    last = Instant::now();
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the heap-trimming thread: freed heap stays with the process");
        }
    });
}

/// Whether a trim is due with `open` client connections open, `most` at their most since
/// the last trim, `closing` of them closed during the last tick, `since` that trim.
fn due(open: u64, most: u64, closing: u64, since: Duration) -> Option<Reason> {
    if most.saturating_sub(open) >= BURST_CONNECTIONS && closing < CLOSING_CONNECTIONS {
        Some(Reason::Connections)
    } else if since >= PERIOD {
        Some(Reason::Period)
    } else {
        None
    }
}

/// Whether this build trims (glibc only).
pub(crate) const TRIMS_HEAP: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Trims now and counts it; returns the RSS given back.
pub fn trim(reason: Reason) -> u64 {
    let before = rss_bytes();
    let t = Instant::now();
    malloc_trim();
    let nanos = t.elapsed().as_nanos() as u64;
    let released = before.saturating_sub(rss_bytes());
    TRIMS[reason as usize].fetch_add(1, Ordering::Relaxed);
    RELEASED.fetch_add(released, Ordering::Relaxed);
    NANOS.fetch_add(nanos, Ordering::Relaxed);
    tracing::debug!(?reason, released, micros = nanos / 1000, "heap trimmed");
    released
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn malloc_trim() {
    // SAFETY: malloc_trim takes each arena's lock itself and only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn malloc_trim() {}

/// The process's RSS from `/proc/self/statm` (0 where it cannot be read).
#[allow(unsafe_code)]
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf only reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// The trims so far and the RSS now.
pub fn stats() -> HeapStats {
    HeapStats {
        trims: TRIMS.each_ref().map(|t| t.load(Ordering::Relaxed)),
        released_bytes: RELEASED.load(Ordering::Relaxed),
        seconds: NANOS.load(Ordering::Relaxed) as f64 / 1e9,
        rss_bytes: rss_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory freed by another thread, in holes between blocks still held, is given back
    /// by a trim (glibc keeps it otherwise).
    #[test]
    fn a_trim_gives_back_the_holes_another_thread_freed() {
        if !TRIMS_HEAP {
            return;
        }
        const BLOCK: usize = 64 << 10;
        const PAIRS: usize = 2048; // 128 MiB freed, 128 MiB held
        let (held, full) = std::thread::spawn(|| {
            let mut freed = Vec::with_capacity(PAIRS);
            let mut held = Vec::with_capacity(PAIRS);
            for _ in 0..PAIRS {
                freed.push(vec![1u8; BLOCK]);
                held.push(vec![2u8; BLOCK]);
            }
            let full = rss_bytes();
            drop(freed);
            (held, full)
        })
        .join()
        .unwrap();
        let before = stats();
        trim(Reason::Period);
        let (after, rss) = (stats(), rss_bytes());
        // (Another node's trimming thread in this process may have trimmed first.)
        assert!(rss + (64 << 20) <= full, "RSS {rss} B after a trim, {full} B before 128 MiB were freed");
        assert!(after.trims[1] > before.trims[1]);
        assert!(held.iter().all(|b| b[BLOCK - 1] == 2));
    }

    #[test]
    fn a_burst_is_over_when_enough_connections_closed_since_the_most() {
        let quiet = Duration::from_secs(1);
        let (b, c) = (BURST_CONNECTIONS, CLOSING_CONNECTIONS);
        assert_eq!(due(0, 0, 0, quiet), None);
        assert_eq!(due(b, b, 0, quiet), None, "open connections are no reason");
        assert_eq!(due(1, b, 0, quiet), None, "fewer closed than a burst");
        assert_eq!(due(0, b, c, quiet), None, "still closing");
        assert_eq!(due(0, b, c - 1, quiet), Some(Reason::Connections), "a trickle of closes");
        assert_eq!(due(0, b, 0, quiet), Some(Reason::Connections));
        assert_eq!(due(5, 5, c, PERIOD), Some(Reason::Period));
    }
}
