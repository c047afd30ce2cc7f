//! `failover-leases`: many leases beating through the followers of a DC whose leader dies
//! again and again. Before the drill's clock starts, [`register`] makes [`BULK_LEASES`]
//! ephemeral instances of one service (no workload uses it) at the first DC and
//! [`settle`] renews them until all read healthy; then [`beat`] renews them all every heartbeat interval in batches (`POST /v1/heartbeats`,
//! [`BATCH`] per request) at the member the drill's clients use (never the leader a kill
//! is about to take: the clients move off it first), and [`watch`] reads the service there
//! every second. Not one lease may expire or turn unhealthy: a new leader starts every
//! lease from its record's published health with a full TTL (docs/cluster.md, "Leases on
//! the leader"). Every request is bounded by a timeout; the loops stop with the drill.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{Ctx, HB_TIMEOUT, OP_TIMEOUT, POLL_TIMEOUT};
use crate::api::Api;
use crate::checker::{Outcome, ViewScope};
use crate::report::Expectation;

/// Leases the drill keeps beating.
pub const BULK_LEASES: usize = 10_000;
/// Their service.
pub const BULK_SERVICE: &str = "bulk-leases";
/// Leases renewed per request (the API's limit is 512).
const BATCH: usize = 500;
/// Registrations in flight at once.
const REGISTER_CONCURRENCY: usize = 32;
/// Attempts per registration, 300 ms apart (an election under way refuses them).
const REGISTER_ATTEMPTS: usize = 30;
/// Pause between two reads of the service.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// Most problems kept for the report (the counts stay exact).
const DETAILS_MAX: usize = 5;

/// What the lease load saw.
#[derive(Clone, Debug, Default)]
pub struct LeaseStats {
    pub registered: usize,
    pub register_ms: u64,
    /// From the last registration until every lease read healthy.
    pub settle_ms: u64,
    pub rounds: u64,
    pub batches_failed: u64,
    pub renewed: u64,
    /// Leases a renewal did not find (expired, or never made).
    pub unknown: u64,
    pub reads: u64,
    pub reads_failed: u64,
    /// The fewest instances, and healthy ones, a read showed.
    pub min_present: Option<usize>,
    pub min_healthy: Option<usize>,
    /// What the other DC showed at the end: (instances, healthy).
    pub peer_end: Option<(usize, usize)>,
    pub details: Vec<String>,
}

impl LeaseStats {
    /// One round of renewals, done at `at_ms`.
    fn record(&mut self, r: &Renewal, at_ms: u64) {
        self.rounds += 1;
        self.renewed += r.renewed;
        self.batches_failed += r.failed.len() as u64;
        if r.unknown > 0 {
            self.unknown += r.unknown;
            self.note(format!("{} leases unknown to a renewal at {at_ms}ms", r.unknown));
        }
    }

    fn note(&mut self, s: String) {
        if self.details.len() < DETAILS_MAX {
            self.details.push(s);
        }
    }
}

/// Registers `n` ephemeral instances of [`BULK_SERVICE`] at `base` with a TTL of `ttl_ms`;
/// their ids, or why not.
pub async fn register(api: &Api, base: &str, ns: &str, n: usize, ttl_ms: u64) -> anyhow::Result<Vec<String>> {
    let ids: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("lease-{i:05}")).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..REGISTER_CONCURRENCY {
        let (api, base, ns, ids, next) =
            (api.clone(), base.to_owned(), ns.to_owned(), ids.clone(), next.clone());
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { return Ok(()) };
                let mut last = String::new();
                let mut done = false;
                for _ in 0..REGISTER_ATTEMPTS {
                    match api
                        .register(&base, &ns, BULK_SERVICE, id, "10.8.0.1", 8080, false, ttl_ms, OP_TIMEOUT)
                        .await
                    {
                        Outcome::Acked { .. } => {
                            done = true;
                            break;
                        }
                        other => last = format!("{other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                if !done {
                    bail!("registering {id} failed {REGISTER_ATTEMPTS} times; last: {last}");
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(Arc::try_unwrap(ids).unwrap_or_else(|a| (*a).clone()))
}

/// Longest [`settle`] beats before the drill starts.
const SETTLE_MAX: Duration = Duration::from_secs(30);

/// One renewal of every lease: what the batches' answers said.
#[derive(Default)]
struct Renewal {
    renewed: u64,
    unknown: u64,
    /// Why batches were refused or lost (a leader change, mostly).
    failed: Vec<String>,
}

/// Renews every lease of `ids` at `base`, all batches at once.
async fn renew_all(api: &Api, base: &str, ns: &str, ids: &[String]) -> Renewal {
    let mut set = tokio::task::JoinSet::new();
    for chunk in ids.chunks(BATCH) {
        let (api, base, ns, chunk) = (api.clone(), base.to_owned(), ns.to_owned(), chunk.to_vec());
        set.spawn(async move { api.heartbeats(&base, &ns, BULK_SERVICE, &chunk, HB_TIMEOUT * 2).await });
    }
    let mut r = Renewal::default();
    while let Some(done) = set.join_next().await {
        match done {
            Ok(Ok(a)) => {
                (r.renewed, r.unknown) = (r.renewed + a.renewed as u64, r.unknown + a.unknown.len() as u64)
            }
            Ok(Err(e)) => r.failed.push(e),
            Err(e) => r.failed.push(e.to_string()),
        }
    }
    r
}

/// Beats every lease at `base` every `interval` until a read there shows all of them
/// healthy (the first ones registered went without renewals while the rest were
/// registered); how long it took, or why not within [`SETTLE_MAX`].
pub async fn settle(
    api: &Api,
    base: &str,
    ns: &str,
    ids: &[String],
    interval: Duration,
) -> anyhow::Result<u64> {
    let t = Instant::now();
    loop {
        let round = Instant::now();
        let mut r = renew_all(api, base, ns, ids).await;
        if let Ok(v) = api.view(base, ns, BULK_SERVICE, ViewScope::All, POLL_TIMEOUT).await {
            let healthy = v.instances.iter().filter(|i| i.health == "healthy").count();
            if healthy == ids.len() {
                return Ok(t.elapsed().as_millis() as u64);
            }
            if t.elapsed() > SETTLE_MAX {
                r.failed.truncate(3);
                bail!(
                    "{healthy} of {} leases healthy after {SETTLE_MAX:?} of renewals (the last round: {} renewed, {} unknown, failed batches: {:?})",
                    ids.len(),
                    r.renewed,
                    r.unknown,
                    r.failed
                );
            }
        }
        tokio::time::sleep_until(round + interval).await;
    }
}

/// Renews every lease of `ids` at the first DC's current base, every heartbeat interval,
/// until the drill stops its heartbeats. A refused or lost batch (no leader for a moment)
/// is retried the next round.
pub async fn beat(ctx: Arc<Ctx>, ids: Arc<Vec<String>>, stats: Arc<Mutex<LeaseStats>>) {
    while !ctx.stop_heartbeats.load(Ordering::Relaxed) {
        let round = Instant::now();
        let r = renew_all(&ctx.api, &ctx.base(0), &ctx.ns, &ids).await;
        stats.lock().record(&r, ctx.now());
        tokio::time::sleep_until(round + ctx.heartbeat_interval).await;
    }
}

/// Reads [`BULK_SERVICE`] at the first DC's current base every second until the drill
/// stops its heartbeats, keeping the fewest instances (and healthy ones) seen.
pub async fn watch(ctx: Arc<Ctx>, stats: Arc<Mutex<LeaseStats>>) {
    while !ctx.stop_heartbeats.load(Ordering::Relaxed) {
        let view = ctx.api.view(&ctx.base(0), &ctx.ns, BULK_SERVICE, ViewScope::All, POLL_TIMEOUT).await;
        {
            let mut s = stats.lock();
            match view {
                Ok(v) => {
                    s.reads += 1;
                    let present = v.instances.len();
                    let healthy = v.instances.iter().filter(|i| i.health == "healthy").count();
                    if present < s.registered || healthy < s.registered {
                        let at = ctx.now();
                        s.note(format!("{present} instances, {healthy} healthy at {at}ms"));
                    }
                    s.min_present = Some(s.min_present.map_or(present, |m| m.min(present)));
                    s.min_healthy = Some(s.min_healthy.map_or(healthy, |m| m.min(healthy)));
                }
                Err(_) => s.reads_failed += 1,
            }
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

/// What the other DC shows of the leases at the end.
pub async fn peer_end(ctx: &Ctx, stats: &Mutex<LeaseStats>) {
    if let Ok(v) = ctx.api.view(&ctx.base(1), &ctx.ns, BULK_SERVICE, ViewScope::All, POLL_TIMEOUT).await {
        let healthy = v.instances.iter().filter(|i| i.health == "healthy").count();
        stats.lock().peer_end = Some((v.instances.len(), healthy));
    }
}

/// The expectation: every lease present and healthy in every read, none unknown to a
/// renewal, all of them at the other DC at the end.
pub fn expectation(s: &LeaseStats, kills: usize, names: &[String; 2]) -> Expectation {
    let n = s.registered;
    let passed = n == BULK_LEASES
        && kills > 0
        && s.reads > 0
        && s.min_present == Some(n)
        && s.min_healthy == Some(n)
        && s.unknown == 0
        && s.peer_end == Some((n, n));
    Expectation {
        name: "no-lease-expired".into(),
        passed,
        detail: format!(
            "{n} leases registered at {a} in {}ms, all healthy {}ms later, beaten in batches of {BATCH} through the followers across {kills} leader kills: \
             {} rounds, {} renewals, {} batches refused or lost, {} leases unknown to a renewal; \
             {} reads of {a}: fewest instances {}, fewest healthy {}; {b} at the end: {}{}",
            s.register_ms,
            s.settle_ms,
            s.rounds,
            s.renewed,
            s.batches_failed,
            s.unknown,
            s.reads,
            s.min_present.map_or("-".into(), |m| m.to_string()),
            s.min_healthy.map_or("-".into(), |m| m.to_string()),
            s.peer_end.map_or("not read".into(), |(p, h)| format!("{p} instances, {h} healthy")),
            if s.details.is_empty() { String::new() } else { format!(" ({})", s.details.join("; ")) },
            a = names[0],
            b = names[1],
        ),
    }
}
