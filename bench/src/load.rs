//! Load loops (closed and open), latency records and the report.
//!
//! Every loop is bounded: by a deadline, by an operation count where one is given, and (open
//! loop) by a cap on requests in flight; requests that would exceed the cap are counted as
//! dropped, never queued without bound.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::sys::{CpuSplit, LOAD_THREAD, PROFILE};

/// Latencies of one run, in nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Lat {
    ns: Vec<u64>,
}

impl Lat {
    pub fn push(&mut self, d: Duration) {
        self.ns.push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }
    pub fn extend(&mut self, other: Lat) {
        self.ns.extend(other.ns);
    }
    pub fn count(&self) -> usize {
        self.ns.len()
    }
    fn sorted(&mut self) {
        self.ns.sort_unstable();
    }
    /// The q-quantile (nearest rank), ms; 0 when empty. Call [`Lat::finish`] first.
    pub fn q_ms(&self, q: f64) -> f64 {
        if self.ns.is_empty() {
            return 0.0;
        }
        let rank = ((self.ns.len() as f64 * q).ceil() as usize).clamp(1, self.ns.len());
        self.ns[rank - 1] as f64 / 1e6
    }
    pub fn max_ms(&self) -> f64 {
        self.ns.last().map_or(0.0, |v| *v as f64 / 1e6)
    }
    pub fn finish(mut self) -> Lat {
        self.sorted();
        self
    }
    /// `p50 / p99 / p999 / max` in ms.
    pub fn summary(&self) -> String {
        format!(
            "{} / {} / {} / {}",
            ms(self.q_ms(0.5)),
            ms(self.q_ms(0.99)),
            ms(self.q_ms(0.999)),
            ms(self.max_ms())
        )
    }
}

/// A latency in ms with sensible precision.
pub fn ms(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

/// An integer-ish rate with thousands separators.
pub fn rate(v: f64) -> String {
    let n = v.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The outcome of one load loop.
#[derive(Debug)]
pub struct Run {
    pub ok: u64,
    pub errors: u64,
    /// Open loop: requests not sent because the in-flight cap was reached.
    pub dropped: u64,
    pub elapsed: Duration,
    pub lat: Lat,
    /// Open loop: each answered request's wait from its due time until a worker sent it
    /// (the dispatcher's own lateness, a free worker, the load core): the part of `lat`
    /// spent in the load generator before the request left it. Every connection busy
    /// (a server that stalls for longer than the connections cover) shows here too.
    pub wait: Option<Lat>,
    /// Open loop: the dispatcher's own lateness, from each request's due time to its hand-off
    /// to the workers: the load generator's share of `wait` that no server causes.
    pub dispatch_late: Option<Lat>,
    pub cpu: CpuSplit,
    pub first_error: Option<String>,
}

impl Run {
    pub fn per_sec(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Server CPU-seconds per thousand successful operations.
    pub fn server_cpu_s_per_kop(&self) -> f64 {
        self.cpu.server.as_secs_f64() / (self.ok.max(1) as f64 / 1000.0)
    }
    /// Share of one core the server side used.
    pub fn server_cores(&self) -> f64 {
        self.cpu.server.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
    pub fn load_cores(&self) -> f64 {
        self.cpu.load.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What a request returned: Ok, or an error text (the first one is kept for the report).
pub type OpResult = Result<(), String>;

struct Shared {
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn error(&self, e: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut f = self.first_error.lock();
        if f.is_none() {
            *f = Some(e);
        }
    }
}

/// Closed loop: `conc` workers each issue `op(i)` back to back until `dur` passes or
/// `ops_max` operations were started. Must run on the load runtime.
pub async fn closed_loop<F, Fut>(
    conc: usize,
    dur: Duration,
    ops_max: u64,
    cpu: impl Fn() -> CpuSplit,
    op: F,
) -> Run
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = OpResult> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(Shared { errors: AtomicU64::new(0), first_error: Mutex::new(None) });
    let cpu0 = cpu();
    let start = Instant::now();
    let deadline = start + dur;
    let mut workers = Vec::with_capacity(conc);
    for _ in 0..conc {
        let (op, next, shared) = (op.clone(), next.clone(), shared.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Lat::default();
            let mut ok = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops_max || Instant::now() >= deadline {
                    break;
                }
                let t = Instant::now();
                match op(i).await {
                    Ok(()) => {
                        lat.push(t.elapsed());
                        ok += 1;
                    }
                    Err(e) => shared.error(e),
                }
            }
            (ok, lat)
        }));
    }
    let mut lat = Lat::default();
    let mut ok = 0;
    for w in workers {
        if let Ok((n, l)) = w.await {
            ok += n;
            lat.extend(l);
        }
    }
    let elapsed = start.elapsed();
    let cpu = cpu().since(cpu0);
    let first_error = shared.first_error.lock().take();
    Run {
        ok,
        errors: shared.errors.load(Ordering::Relaxed),
        dropped: 0,
        elapsed,
        lat: lat.finish(),
        wait: None,
        dispatch_late: None,
        cpu,
        first_error,
    }
}

/// Open loop: `op(worker, i)` is due at `start + i / rate`, whether or not earlier ones have
/// finished, for `dur`, and is carried out by one of `workers` tasks (a fixed set of
/// connections, as wrk2 does: a slow server does not make the client open more). A due
/// request waits for a free worker; its latency counts from the time it was due, so that
/// waiting counts (no coordinated omission). At most `inflight_max` requests are due and
/// unfinished; beyond that a request is dropped and counted. Waits for the outstanding
/// ones (at most `drain_max`) before returning.
pub async fn open_loop<F, Fut>(
    rate_per_s: f64,
    dur: Duration,
    workers: usize,
    inflight_max: u64,
    cpu: impl Fn() -> CpuSplit,
    op: F,
) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = OpResult> + Send + 'static,
{
    let drain_max = Duration::from_secs(10);
    let op = Arc::new(op);
    let shared = Arc::new(Shared { errors: AtomicU64::new(0), first_error: Mutex::new(None) });
    let inflight = Arc::new(AtomicU64::new(0));
    let lats = Arc::new(Mutex::new((Lat::default(), Lat::default())));
    let ok = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu();
    let start = tokio::time::Instant::now();
    let total = (rate_per_s * dur.as_secs_f64()).round() as u64;
    let (tx, rx) = tokio::sync::mpsc::channel::<(u64, Instant)>(inflight_max.max(1) as usize);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut pool = Vec::with_capacity(workers);
    for worker in 0..workers.max(1) {
        let (op, shared, inflight, lats, ok, rx) =
            (op.clone(), shared.clone(), inflight.clone(), lats.clone(), ok.clone(), rx.clone());
        pool.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some((i, intended)) = next else { break };
                let waited = intended.elapsed();
                match op(worker, i).await {
                    Ok(()) => {
                        let mut l = lats.lock();
                        l.0.push(intended.elapsed());
                        l.1.push(waited);
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => shared.error(e),
                }
                inflight.fetch_sub(1, Ordering::Relaxed);
            }
        }));
    }
    // The schedule runs on an OS thread of its own: tokio's timer ticks in whole
    // milliseconds, which would release requests in bursts and add up to 1 ms of the
    // generator's own lateness to every latency; a thread sleep is precise to tens of us.
    let start_std = start.into_std();
    let dispatch_inflight = inflight.clone();
    // It runs on the load core (a thread inherits its creator's pinning) and hands back its
    // own CPU time with its count of dropped requests: it has exited by the step's last CPU
    // reading, which would otherwise count that time as the server's.
    let dispatcher = std::thread::Builder::new().name(format!("{LOAD_THREAD}-open")).spawn(move || {
        let mut dropped = 0u64;
        let mut late = Lat::default();
        for i in 0..total {
            let at = start_std + Duration::from_secs_f64(i as f64 / rate_per_s);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            late.push(at.elapsed());
            if dispatch_inflight.load(Ordering::Relaxed) >= inflight_max {
                dropped += 1;
                continue;
            }
            dispatch_inflight.fetch_add(1, Ordering::Relaxed);
            if tx.try_send((i, at)).is_err() {
                dispatch_inflight.fetch_sub(1, Ordering::Relaxed);
                dropped += 1;
            }
        }
        (dropped, late, crate::sys::this_thread_cpu())
    });
    let (dropped, dispatch_late, dispatcher_cpu) = match dispatcher {
        Ok(handle) => tokio::task::spawn_blocking(move || handle.join().ok())
            .await
            .ok()
            .flatten()
            .unwrap_or((0, Lat::default(), Duration::ZERO)),
        Err(_) => (total, Lat::default(), Duration::ZERO),
    };
    let sent_until = start.elapsed();
    let drain_deadline = Instant::now() + drain_max;
    while inflight.load(Ordering::Relaxed) > 0 && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for w in pool {
        w.abort();
    }
    let elapsed = start.elapsed().max(sent_until);
    let mut cpu = cpu().since(cpu0);
    cpu.server = cpu.server.saturating_sub(dispatcher_cpu);
    cpu.load += dispatcher_cpu;
    let (lat, wait) = std::mem::take(&mut *lats.lock());
    let first_error = shared.first_error.lock().take();
    Run {
        ok: ok.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed) + inflight.load(Ordering::Relaxed),
        dropped,
        elapsed,
        lat: lat.finish(),
        wait: Some(wait.finish()),
        dispatch_late: Some(dispatch_late.finish()),
        cpu,
        first_error,
    }
}

/// A table of results: printed row by row as they come (every line names the profile),
/// kept for the markdown report.
pub struct Table {
    pub title: String,
    pub cols: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

/// All tables of one run, plus its header lines.
#[derive(Default)]
pub struct Report {
    pub header: Vec<String>,
    pub tables: Vec<Table>,
}

impl Report {
    pub fn header(&mut self, line: String) {
        println!("# {line}");
        self.header.push(line);
    }
    pub fn table(&mut self, title: &str, cols: &[&str]) {
        println!("\n== {title} [profile={PROFILE}]");
        println!("   {}", cols.join(" | "));
        self.tables.push(Table {
            title: title.to_owned(),
            cols: cols.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        });
    }
    pub fn row(&mut self, cells: Vec<String>) {
        println!("[{PROFILE}] {}", cells.join(" | "));
        if let Some(t) = self.tables.last_mut() {
            t.rows.push(cells);
        }
    }
    pub fn note(&mut self, text: String) {
        println!("[{PROFILE}] note: {text}");
        if let Some(t) = self.tables.last_mut() {
            t.notes.push(text);
        }
    }
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        for h in &self.header {
            s.push_str(&format!("- {h}\n"));
        }
        for t in &self.tables {
            s.push_str(&format!("\n#### {} (profile {PROFILE})\n\n", t.title));
            s.push_str(&format!("| {} |\n", t.cols.join(" | ")));
            s.push_str(&format!("|{}\n", "---|".repeat(t.cols.len())));
            for r in &t.rows {
                s.push_str(&format!("| {} |\n", r.join(" | ")));
            }
            if !t.notes.is_empty() {
                s.push('\n');
                for n in &t.notes {
                    s.push_str(&format!("- {n}\n"));
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let mut l = Lat::default();
        for i in 1..=100u64 {
            l.push(Duration::from_millis(i));
        }
        let l = l.finish();
        assert_eq!(l.q_ms(0.5), 50.0);
        assert_eq!(l.q_ms(0.99), 99.0);
        assert_eq!(l.max_ms(), 100.0);
    }

    #[test]
    fn rates_get_thousands_separators() {
        assert_eq!(rate(1234567.4), "1,234,567");
        assert_eq!(rate(999.0), "999");
    }
}
