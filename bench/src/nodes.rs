//! One-node benchmarks through the real HTTP API of an in-process node: durable register,
//! heartbeat (with the disk-write counter), discover.
//!
//! Datasets that a step only reads (the leases of `heartbeat`, the services of `discover`)
//! are seeded through `Registry::register`, the same durable, group-committed write path
//! the HTTP handler calls, minus HTTP: the seeding is not what is measured.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tandem::node::Node;
use tandem::registry::RegisterRequest;
use tandem::store::{CommitStats, GROUP_SIZE_BUCKETS};

use crate::httpfloor;
use crate::load::{closed_loop, ms, open_loop, rate, OpResult, Run};
use crate::{bench_config, cpu_now, Ctx};

/// A registration of instance `id` of `service` (ephemeral unless `persistent`).
pub fn register_request(service: String, id: String, persistent: bool) -> RegisterRequest {
    RegisterRequest {
        namespace: None,
        service,
        instance_id: Some(id),
        address: "10.20.30.40".into(),
        port: 8080,
        zone: Some("zone-a".into()),
        weight: None,
        version: Some("1.4.2".into()),
        tags: None,
        metadata: None,
        ttl_ms: None,
        persistent: Some(persistent),
        status: None,
    }
}

/// Registers `count` instances through the registry (not HTTP), `conc` at a time.
pub async fn seed(
    ctx: &Ctx,
    node: &Node,
    count: u64,
    persistent: bool,
    name: impl Fn(u64) -> (String, String) + Send + Sync + 'static,
) -> anyhow::Result<Run> {
    let registry = node.shared.registry.clone();
    let name = Arc::new(name);
    let run = ctx
        .on_load(closed_loop(256, Duration::from_secs(600), count, cpu_now, move |i| {
            let (registry, name) = (registry.clone(), name.clone());
            async move {
                let (svc, id) = name(i);
                registry
                    .register(register_request(svc, id, persistent))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        }))
        .await?;
    anyhow::ensure!(run.ok == count, "seeding registered {} of {count}: {:?}", run.ok, run.first_error);
    settle().await;
    Ok(run)
}

/// The server side's idle share a seeded node must reach before a step measures it.
const SETTLED_CORES: f64 = 0.05;

/// Waits (at most 15 s) until the server's threads use at most [`SETTLED_CORES`] of a core
/// over a quarter of a second: what seeding left behind (RocksDB's memtable flushes and
/// compactions, the committer's last rounds) would otherwise be counted as the first step's
/// CPU. Returns the time waited (also printed to stderr).
pub async fn settle() -> Duration {
    let (start, window) = (std::time::Instant::now(), Duration::from_millis(250));
    while start.elapsed() < Duration::from_secs(15) {
        let c0 = cpu_now();
        tokio::time::sleep(window).await;
        if cpu_now().since(c0).server.as_secs_f64() <= SETTLED_CORES * window.as_secs_f64() {
            break;
        }
    }
    eprintln!("settled: the server's threads idle {:.2} s after seeding", start.elapsed().as_secs_f64());
    start.elapsed()
}

/// The body of `register`'s (and `cluster`'s) `POST /v1/register`: a new ephemeral
/// instance per request; `tag` keeps the ids of steps apart.
pub fn register_body(tag: &str, i: u64) -> serde_json::Value {
    json!({
        "service": format!("svc-{}", i % 1000),
        "instance_id": format!("{tag}-i{i}"),
        "address": "10.20.30.40", "port": 8080, "zone": "zone-a", "version": "1.4.2",
    })
}

pub async fn check(resp: Result<reqwest::Response, reqwest::Error>) -> OpResult {
    let resp = resp.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
    }
}

fn stats_delta(a: &CommitStats, b: &CommitStats) -> (u64, u64, u64, [u64; GROUP_SIZE_BUCKETS]) {
    let mut h = [0; GROUP_SIZE_BUCKETS];
    for (i, slot) in h.iter_mut().enumerate() {
        *slot = b.local_group_requests[i] - a.local_group_requests[i];
    }
    (b.local_fsyncs - a.local_fsyncs, b.local_requests - a.local_requests, b.local_events - a.local_events, h)
}

/// One row of the register table from a step's run and the committer's stats before and
/// after it; returns the registrations per fsync.
fn register_row(ctx: &mut Ctx, label: String, run: &Run, before: &CommitStats, after: &CommitStats) -> f64 {
    let (fsyncs, requests, _, hist) = stats_delta(before, after);
    let per_fsync = requests as f64 / fsyncs.max(1) as f64;
    ctx.report.row(vec![
        label,
        rate(run.per_sec()),
        run.lat.summary(),
        format!("{per_fsync:.1} ({requests} / {fsyncs})"),
        largest_group(&hist),
        sync_summary(before, after),
        format!("{:.3}", run.server_cpu_s_per_kop()),
        cores(run),
        errors(run),
    ]);
    per_fsync
}

/// The committer's synced writes during a step (p50 / p99 ms, from its histogram: within
/// a power of two, interpolated).
pub fn sync_quantiles_ms(before: &CommitStats, after: &CommitStats) -> Option<(f64, f64)> {
    let d = after.sync_durations.since(&before.sync_durations);
    Some((d.quantile_us(0.5)? / 1e3, d.quantile_us(0.99)? / 1e3))
}

/// `p50 / p99` of `d` in ms, or `-` when empty.
fn quantiles_ms(d: &tandem::store::Durations) -> String {
    match (d.quantile_us(0.5), d.quantile_us(0.99)) {
        (Some(p50), Some(p99)) => format!("{} / {}", ms(p50 / 1e3), ms(p99 / 1e3)),
        _ => "-".into(),
    }
}

/// The durations in `d` over 4.1 ms, by bucket: "3 up to 8.19 ms, 1 longer", or "none".
fn over_4ms(d: &tandem::store::Durations) -> String {
    let mut slow: Vec<String> = tandem::store::DURATION_BUCKETS_US
        .iter()
        .zip(d.buckets)
        .filter(|(bound, n)| **bound > 4096 && *n > 0)
        .map(|(bound, n)| format!("{n} up to {} ms", ms(*bound as f64 / 1e3)))
        .collect();
    let longer = d.buckets[tandem::store::DURATION_BUCKETS_US.len()];
    if longer > 0 {
        slow.push(format!("{longer} longer"));
    }
    if slow.is_empty() {
        "none".into()
    } else {
        slow.join(", ")
    }
}

/// A registration's time inside the node during a step, from the committer's histograms:
/// its wait for its round's synced write, that write, and its wait after it for its answer
/// (p50 / p99 ms each). The rest of a client's latency is the HTTP request.
fn stages_summary(before: &CommitStats, after: &CommitStats) -> String {
    let q = |d: tandem::store::Durations| quantiles_ms(&d);
    let parts = after.sync_parts.since(&before.sync_parts);
    format!(
        "the wait before its round's synced write (queue, round in progress, linger) p50 / p99 {} ms; \
         the synced write {} ms (its parts: staged {} ms, WAL append with fsync {} ms, memtable \
         inserts {} ms); the wait after it until the answer (the view's apply, the answers \
         before) {} ms; the rest of the latency is the HTTP request",
        q(after.local_queued.since(&before.local_queued)),
        q(after.sync_durations.since(&before.sync_durations)),
        q(parts.staged),
        q(parts.wal),
        q(parts.memtable),
        q(after.local_answered.since(&before.local_answered)),
    )
}

/// Each server thread name's CPU over a step, the busiest first: microseconds per
/// registration and per synced write.
fn threads_cpu_summary(
    before: &std::collections::BTreeMap<String, Duration>,
    after: &std::collections::BTreeMap<String, Duration>,
    ok: u64,
    fsyncs: u64,
) -> String {
    let mut used: Vec<(&String, Duration)> = after
        .iter()
        .map(|(name, t)| (name, t.saturating_sub(before.get(name).copied().unwrap_or_default())))
        .filter(|(_, t)| !t.is_zero())
        .collect();
    used.sort_by_key(|u| std::cmp::Reverse(u.1));
    let per = |t: Duration, n: u64| t.as_secs_f64() * 1e6 / n.max(1) as f64;
    let parts: Vec<String> =
        used.iter().map(|(name, t)| format!("{name} {:.1} ({:.0})", per(*t, ok), per(*t, fsyncs))).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn sync_summary(before: &CommitStats, after: &CommitStats) -> String {
    sync_quantiles_ms(before, after)
        .map_or_else(|| "-".into(), |(p50, p99)| format!("{} / {}", ms(p50), ms(p99)))
}

/// `2^i..2^(i+1)-1` of the largest non-empty bucket.
fn largest_group(h: &[u64; GROUP_SIZE_BUCKETS]) -> String {
    match h.iter().rposition(|n| *n > 0) {
        None => "-".into(),
        Some(i) if i + 1 == GROUP_SIZE_BUCKETS => format!(">= {}", 1u64 << i),
        Some(i) => format!("{}-{}", 1u64 << i, (1u64 << (i + 1)) - 1),
    }
}

fn cores(run: &Run) -> String {
    format!("{:.2} / {:.2}", run.server_cores(), run.load_cores())
}

fn errors(run: &Run) -> String {
    let mut s = run.errors.to_string();
    if run.dropped > 0 {
        s.push_str(&format!(" (+{} dropped)", run.dropped));
    }
    if let Some(e) = &run.first_error {
        s.push_str(&format!(" first: {}", e.chars().take(80).collect::<String>()));
    }
    s
}

/// `register`: durable registrations at each concurrency, then an open-loop step at half
/// of the best throughput (M1's p99 condition).
pub async fn register(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-register")?;
    let node = ctx.start_node(bench_config(dir.path(), "dc-a")).await?;
    let url = Arc::new(format!("http://{}/v1/register", node.http_addr()));
    ctx.report.table(
        "register: durable registrations, POST /v1/register (and batched: POST /v1/registrations), closed loop",
        &[
            "concurrency",
            "registrations/s",
            "latency ms p50 / p99 / p999 / max",
            "registrations per fsync",
            "largest group",
            "synced write ms p50 / p99 (committer)",
            "server CPU-s per 1k",
            "CPU cores server / load",
            "errors",
        ],
    );
    let mut best = 0.0f64;
    let concs = ctx.opts.concurrency.clone();
    for (step, &c) in concs.iter().enumerate() {
        let s0 = node.shared.committer.stats();
        let (http, url) = (ctx.http.clone(), url.clone());
        let run = ctx
            .on_load(closed_loop(c.max(1), ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    let body = register_body(&format!("s{step}"), i);
                    check(http.post(url.as_str()).json(&body).send().await).await
                }
            }))
            .await?;
        best = best.max(run.per_sec());
        let per_fsync = register_row(ctx, c.to_string(), &run, &s0, &node.shared.committer.stats());
        ctx.floors.register_per_fsync_http =
            Some(ctx.floors.register_per_fsync_http.unwrap_or(0.0).max(per_fsync));
        ctx.floors.register_by_conc.push((c, run.per_sec(), run.server_cpu_s_per_kop()));
    }
    // Half of saturation, open loop over a fixed set of connections: latency from the
    // intended send time. Before the in-process step, whose burst of writes would leave
    // RocksDB compacting (on the server's core) during this one.
    // Then a quarter of saturation, to show the latency when the server core is not the
    // queue.
    for (divisor, label) in [(2.0, "half"), (4.0, "a quarter")] {
        if best <= 0.0 {
            break;
        }
        let r = (best / divisor).max(1.0);
        let s0 = node.shared.committer.stats();
        let late0 = node.shared.runtime_lateness.stats();
        let steal0 = crate::sys::steal_ms();
        let threads0 = crate::sys::server_threads_cpu();
        let h0 = tandem::heap::stats();
        // Raw keep-alive connections (crate::raw): reqwest would cost the load core about
        // 0.1 ms per request and saturate it at this rate, so the step would measure the
        // client's queue.
        let conns = Arc::new(
            crate::raw::open_on(&ctx.load, &node.http_addr().to_string(), OPEN_LOOP_CONNECTIONS)
                .await
                .context("open-loop connections")?,
        );
        let run = ctx
            .on_load(open_loop(r, ctx.step(), OPEN_LOOP_CONNECTIONS, 4096, cpu_now, move |worker, i| {
                let conns = conns.clone();
                async move {
                    let body = json!({
                        "service": format!("svc-{}", i % 1000),
                        "instance_id": format!("half-i{i}"),
                        "address": "10.20.30.40", "port": 8080, "zone": "zone-a", "version": "1.4.2",
                    })
                    .to_string();
                    conns[worker].lock().await.post_json("/v1/register", body.as_bytes()).await
                }
            }))
            .await?;
        let label = format!(
            "open loop at {}/s ({label} of best), {OPEN_LOOP_CONNECTIONS} raw HTTP/1.1 connections",
            rate(r)
        );
        let s1 = node.shared.committer.stats();
        let late = node.shared.runtime_lateness.stats().wakes.since(&late0.wakes);
        let steal: Vec<String> = crate::sys::steal_ms()
            .iter()
            .zip(&steal0)
            .map(|(a, b)| format!("{} ms", a.saturating_sub(*b)))
            .collect();
        register_row(ctx, label, &run, &s0, &s1);
        let h1 = tandem::heap::stats();
        let trims: u64 = h1.trims.iter().zip(h0.trims).map(|(a, b)| a - b).sum();
        ctx.report.note(format!(
            "stalls in this step: the committer's synced writes over 4.1 ms: {}; the node's runtime, \
             its 10 ms timer woken over 4.1 ms late: {} (p50 / p99 of its wakes {}); the process's heap \
             trims (tandem::heap; each holds an allocator arena while it walks it): {trims}, {} ms in all",
            over_4ms(&s1.sync_durations.since(&s0.sync_durations)),
            over_4ms(&late),
            quantiles_ms(&late),
            ms((h1.seconds - h0.seconds) * 1000.0)
        ));
        ctx.report.note(format!("inside the node in this step: {}", stages_summary(&s0, &s1)));
        ctx.report.note(format!(
            "the node's CPU in this step by thread, us per registration (per synced write): {}",
            threads_cpu_summary(&threads0, &crate::sys::server_threads_cpu(), run.ok, s1.fsyncs - s0.fsyncs)
        ));
        if !steal.is_empty() {
            ctx.report.note(format!(
                "the host's steal time in this step (the hypervisor ran something else while a CPU of \
                 this machine had work; 10 ms accounting), per CPU: {}",
                steal.join(" / ")
            ));
        }
        if let (Some(w), Some(d)) = (run.wait.as_ref(), run.dispatch_late.as_ref()) {
            let q = |l: &crate::load::Lat| {
                format!("{} / {} / {}", ms(l.q_ms(0.5)), ms(l.q_ms(0.99)), ms(l.max_ms()))
            };
            ctx.report.note(format!(
                "in the load generator in this step (counted in the latency above), p50 / p99 / max: each \
                 request's wait from its due time to its send {} ms (every connection busy while the \
                 server stalls shows here too); of which the dispatcher's own lateness {} ms",
                q(w),
                q(d)
            ));
        }
        if divisor != 2.0 {
            continue;
        }
        ctx.floors.register_half_p99_ms = Some(run.lat.q_ms(0.99));
        ctx.floors.register_half_sync_ms = sync_quantiles_ms(&s0, &s1);
        if let Some(f99) = ctx.floors.fsync_p99_ms {
            let bound = f99 + 2.0;
            let p99 = run.lat.q_ms(0.99);
            ctx.report.note(format!(
                "M1 latency condition: p99 at half of saturation {} ms vs fsync p99 + 2 ms = {} ms: {}{}",
                ms(p99),
                ms(bound),
                if p99 <= bound { "met" } else { "not met" },
                ctx.floors.register_half_sync_ms.map_or_else(String::new, |(p50, p99)| format!(
                    " (the committer's synced writes in this step: p50 {} ms, p99 {} ms; the isolated probe's \
                     p99 {} ms)",
                    ms(p50),
                    ms(p99),
                    ms(f99)
                ))
            ));
        }
        ctx.floors.register_best_per_s = Some(best);
    }
    // The committer alone: 256 writers through Registry::register, no HTTP. Shows how far
    // group commit goes when arrivals are not throttled by the HTTP stack.
    {
        let s0 = node.shared.committer.stats();
        let registry = node.shared.registry.clone();
        let run = ctx
            .on_load(closed_loop(256, ctx.step(), u64::MAX, cpu_now, move |i| {
                let registry = registry.clone();
                async move {
                    let req = register_request(format!("svc-{}", i % 1000), format!("direct-i{i}"), false);
                    registry.register(req).await.map(|_| ()).map_err(|e| e.to_string())
                }
            }))
            .await?;
        let label = "256, in-process Registry::register (no HTTP)".to_string();
        let per_fsync = register_row(ctx, label, &run, &s0, &node.shared.committer.stats());
        ctx.floors.register_per_fsync_direct = Some(per_fsync);
    }
    // Batched: POST /v1/registrations with REGISTER_BATCH entries per request, as many
    // requests in flight as make 256 registrations (the 256 row's), then twice as many.
    for conc in [256 / REGISTER_BATCH, 512 / REGISTER_BATCH] {
        let s0 = node.shared.committer.stats();
        let (http, url) =
            (ctx.http.clone(), Arc::new(format!("http://{}/v1/registrations", node.http_addr())));
        let run = ctx
            .on_load(closed_loop(conc, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    let first = i * REGISTER_BATCH as u64;
                    let entries: Vec<_> = (first..first + REGISTER_BATCH as u64)
                        .map(|j| register_body(&format!("b{conc}"), j))
                        .collect();
                    check(http.post(url.as_str()).json(&json!({ "instances": entries })).send().await).await
                }
            }))
            .await?;
        let s1 = node.shared.committer.stats();
        let (fsyncs, requests, events, hist) = stats_delta(&s0, &s1);
        let per_s = run.per_sec() * REGISTER_BATCH as f64;
        ctx.report.row(vec![
            format!(
                "{} in flight: {conc} x {REGISTER_BATCH} per POST /v1/registrations (latency per request)",
                conc * REGISTER_BATCH
            ),
            rate(per_s),
            run.lat.summary(),
            format!("{:.1} ({events} / {fsyncs}; {requests} requests)", events as f64 / fsyncs.max(1) as f64),
            largest_group(&hist),
            sync_summary(&s0, &s1),
            format!("{:.3}", run.server_cpu_s_per_kop() / REGISTER_BATCH as f64),
            cores(&run),
            errors(&run),
        ]);
        if conc * REGISTER_BATCH == 256 {
            ctx.floors.register_batched_256 = Some((per_s, REGISTER_BATCH));
        }
    }
    ctx.report.note(
        "registrations per fsync = committer local_requests / local_fsyncs over the step (group commit: \
         one synced WriteBatch carries the registrations waiting when the previous write finished, plus those \
         that arrive while the committer lingers: only when two or more writes wait, until the group is as large \
         as the previous one ended up (at most 64), at most 2 ms)"
            .into(),
    );
    ctx.stop_node(node).await;
    Ok(())
}

pub(crate) fn hb_name(i: u64) -> (String, String) {
    (format!("hb-{}", i % 100), format!("lease-{i}"))
}

/// `heartbeat`: leases seeded, then heartbeats over HTTP; the committer's fsync count must
/// not move.
pub async fn heartbeat(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-heartbeat")?;
    let node = ctx.start_node(bench_config(dir.path(), "dc-a")).await?;
    let n = ctx.opts.leases.max(1);
    let seeded = seed(ctx, &node, n, false, hb_name).await?;
    anyhow::ensure!(node.shared.registry.lease_count() as u64 == n, "expected {n} leases");
    ctx.report.table(
        "heartbeat: PUT /v1/heartbeat (one lease per request) and POST /v1/heartbeats (a batch) on held leases, closed loop",
        &[
            "leases",
            "concurrency",
            "heartbeats/s",
            "latency ms p50 / p99 / p999 / max",
            "disk writes during the step",
            "heartbeats per server CPU-s",
            "CPU cores server / load",
            "errors",
        ],
    );
    let base = Arc::new(format!("http://{}/v1/heartbeat/default", node.http_addr()));
    for conc in [64usize] {
        let w0 = node.shared.committer.stats().fsyncs;
        let (http, base) = (ctx.http.clone(), base.clone());
        let op = move |i: u64| {
            let (http, base) = (http.clone(), base.clone());
            async move {
                // A stride through the leases so consecutive requests touch different ones.
                let (svc, id) = hb_name(i.wrapping_mul(7_919) % n);
                check(http.put(format!("{base}/{svc}/{id}")).send().await).await
            }
        };
        let run = ctx.on_load(closed_loop(conc, ctx.step(), u64::MAX, cpu_now, op.clone())).await?;
        let w1 = node.shared.committer.stats().fsyncs;
        let per_cpu = run.ok as f64 / run.cpu.server.as_secs_f64().max(1e-9);
        ctx.report.row(vec![
            rate(n as f64),
            conc.to_string(),
            rate(run.per_sec()),
            run.lat.summary(),
            (w1 - w0).to_string(),
            rate(per_cpu),
            cores(&run),
            errors(&run),
        ]);
        ctx.floors.heartbeats_per_server_cpu_s = Some(per_cpu);
        ctx.floors.heartbeats_per_s = Some(run.per_sec());
        ctx.floors.heartbeat_disk_writes = Some(w1 - w0);
        ctx.floors.heartbeat_p99_ms = Some(run.lat.q_ms(0.99));
        if !ctx.opts.no_floors {
            ctx.floors.heartbeat_paired = Some(httpfloor::paired(ctx, "heartbeat", conc, None, op).await?);
        }
    }
    // Batched: POST /v1/heartbeats with HEARTBEAT_BATCH leases per request (an agent or
    // SDK renewing the instances it holds), bodies prepared before the step.
    {
        let per = HEARTBEAT_BATCH.min(n as usize).max(1);
        let bodies: Vec<bytes::Bytes> = (0..n.div_ceil(per as u64))
            .map(|b| {
                let items: Vec<serde_json::Value> = (0..per as u64)
                    .map(|j| {
                        let (svc, id) = hb_name((b * per as u64 + j) % n);
                        json!({"service": svc, "instance_id": id})
                    })
                    .collect();
                bytes::Bytes::from(json!({ "instances": items }).to_string())
            })
            .collect();
        let bodies = Arc::new(bodies);
        let url = Arc::new(format!("http://{}/v1/heartbeats", node.http_addr()));
        let w0 = node.shared.committer.stats().fsyncs;
        let (http, url2) = (ctx.http.clone(), url.clone());
        let conc = 8;
        let run = ctx
            .on_load(closed_loop(conc, ctx.step(), u64::MAX, cpu_now, move |i| {
                let (http, url, bodies) = (http.clone(), url2.clone(), bodies.clone());
                async move {
                    let body = bodies[(i.wrapping_mul(7_919) % bodies.len() as u64) as usize].clone();
                    let resp = http
                        .post(url.as_str())
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if !resp.status().is_success() {
                        return Err(format!("status {}", resp.status()));
                    }
                    let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
                    if v["renewed"].as_u64() != Some(per as u64) {
                        return Err(format!("renewed {} of {per}", v["renewed"]));
                    }
                    Ok(())
                }
            }))
            .await?;
        let w1 = node.shared.committer.stats().fsyncs;
        let beats = run.ok as f64 * per as f64;
        let per_cpu = beats / run.cpu.server.as_secs_f64().max(1e-9);
        let per_s = run.per_sec() * per as f64;
        ctx.report.row(vec![
            rate(n as f64),
            format!("{conc}, batched: POST /v1/heartbeats, {per} per request (latency per request)"),
            rate(per_s),
            run.lat.summary(),
            (w1 - w0).to_string(),
            rate(per_cpu),
            cores(&run),
            errors(&run),
        ]);
        ctx.floors.heartbeats_batched = Some((per_cpu, per_s, run.lat.q_ms(0.99), per, w1 - w0));
    }
    {
        let w0 = node.shared.committer.stats().fsyncs;
        let registry = node.shared.registry.clone();
        let run = ctx
            .on_load(closed_loop(8, ctx.step().min(Duration::from_secs(3)), u64::MAX, cpu_now, move |i| {
                let registry = registry.clone();
                async move {
                    let (svc, id) = hb_name(i.wrapping_mul(7_919) % n);
                    registry.heartbeat("default", &svc, &id).await.map_err(|e| e.to_string())?;
                    tokio::task::yield_now().await;
                    Ok(())
                }
            }))
            .await?;
        let w1 = node.shared.committer.stats().fsyncs;
        let cpu = run.cpu.server + run.cpu.load;
        ctx.report.row(vec![
            rate(n as f64),
            "8, in-process Registry::heartbeat (no HTTP)".into(),
            rate(run.per_sec()),
            run.lat.summary(),
            (w1 - w0).to_string(),
            format!("{} (caller's thread included)", rate(run.ok as f64 / cpu.as_secs_f64().max(1e-9))),
            cores(&run),
            errors(&run),
        ]);
    }
    ctx.report.note(format!(
        "{} leases seeded in {:.1} s through the durable write path; disk writes = the committer's synced \
         RocksDB writes (the counter behind tandem_disk_writes_total and /v1/status disk_writes)",
        rate(n as f64),
        seeded.elapsed.as_secs_f64()
    ));
    ctx.stop_node(node).await;
    Ok(())
}

pub(crate) fn svc_name(per: u64) -> impl Fn(u64) -> (String, String) {
    move |i| (format!("svc-{}", i / per), format!("inst-{}", i % per))
}

/// `discover`: services x instances seeded, then discovery requests over HTTP.
pub async fn discover(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-discover")?;
    let node = ctx.start_node(bench_config(dir.path(), "dc-a")).await?;
    let (services, per) = (ctx.opts.services.max(1), ctx.opts.per_service.max(1));
    // `seed` takes a fn pointer; the instance count per service is fixed by the name.
    let seeded = seed_services(ctx, &node, services, per).await?;
    let base = Arc::new(format!("http://{}/v1/services/default", node.http_addr()));
    // On the load runtime: the connection goes back to the pool the step draws from, and
    // one opened on the main thread's runtime would be driven by that thread.
    let (http, first) = (ctx.http.clone(), format!("{base}/svc-0"));
    let raw = ctx
        .on_load(async move { anyhow::Ok(http.get(first).send().await?.error_for_status()?.bytes().await?) })
        .await??;
    let sample: serde_json::Value = serde_json::from_slice(&raw)?;
    let got = sample["instances"].as_array().map_or(0, |a| a.len()) as u64;
    anyhow::ensure!(got == per, "discover answered {got} instances, expected {per}");
    let answer_bytes = serde_json::to_vec(&sample)?.len();
    // The body as sent (the cached answer ends with a newline).
    let body_bytes = raw.len();
    ctx.report.table(
        "discover: GET /v1/services/{ns}/{service}, closed loop",
        &[
            "dataset",
            "concurrency",
            "queries/s",
            "latency ms p50 / p99 / p999 / max",
            "queries per server CPU-s",
            "CPU cores server / load",
            "errors",
        ],
    );
    for conc in [32usize] {
        let (http, base) = (ctx.http.clone(), base.clone());
        let op = move |i: u64| {
            let (http, base) = (http.clone(), base.clone());
            async move {
                let svc = i.wrapping_mul(7_919) % services;
                check(http.get(format!("{base}/svc-{svc}")).send().await).await
            }
        };
        let run = ctx.on_load(closed_loop(conc, ctx.step(), u64::MAX, cpu_now, op.clone())).await?;
        let per_cpu = run.ok as f64 / run.cpu.server.as_secs_f64().max(1e-9);
        ctx.report.row(vec![
            format!("{} services x {per}", rate(services as f64)),
            conc.to_string(),
            rate(run.per_sec()),
            run.lat.summary(),
            rate(per_cpu),
            cores(&run),
            errors(&run),
        ]);
        ctx.floors.discover_per_server_cpu_s = Some(per_cpu);
        ctx.floors.discover_per_s = Some(run.per_sec());
        if !ctx.opts.no_floors {
            ctx.floors.discover_paired =
                Some(httpfloor::paired(ctx, "discover", conc, None, op.clone()).await?);
            // The same against a floor that sends as many bytes: how much of the gap is the
            // answer's size (informative; the goal is against the no-op floor).
            let sized = httpfloor::paired(ctx, "discover", conc, Some(body_bytes), op).await?;
            ctx.floors.discover_paired_sized = Some((body_bytes, sized));
        }
    }
    {
        let registry = node.shared.registry.clone();
        let run = ctx
            .on_load(closed_loop(8, ctx.step().min(Duration::from_secs(3)), u64::MAX, cpu_now, move |i| {
                let registry = registry.clone();
                async move {
                    let svc = format!("svc-{}", i.wrapping_mul(7_919) % services);
                    let answer = registry
                        .discover("default", &svc, &tandem::registry::DcFilter::Policy, false)
                        .map_err(|e| e.to_string())?;
                    let body = serde_json::to_vec(&answer).map_err(|e| e.to_string())?;
                    std::hint::black_box(body);
                    tokio::task::yield_now().await;
                    Ok(())
                }
            }))
            .await?;
        let cpu = run.cpu.server + run.cpu.load;
        ctx.report.row(vec![
            format!("{} services x {per}", rate(services as f64)),
            "8, in-process Registry::discover + JSON encoding (no HTTP)".into(),
            rate(run.per_sec()),
            run.lat.summary(),
            format!("{} (caller's thread included)", rate(run.ok as f64 / cpu.as_secs_f64().max(1e-9))),
            cores(&run),
            errors(&run),
        ]);
    }
    ctx.report.note(format!(
        "{} instances seeded in {:.1} s; one answer is {answer_bytes} bytes of JSON",
        rate((services * per) as f64),
        seeded.elapsed.as_secs_f64()
    ));
    ctx.stop_node(node).await;
    Ok(())
}

async fn seed_services(ctx: &Ctx, node: &Node, services: u64, per: u64) -> anyhow::Result<Run> {
    seed(ctx, node, services * per, true, svc_name(per)).await
}

/// Registrations per request in the batched register rows.
const REGISTER_BATCH: usize = 64;

/// Leases renewed per request in the batched heartbeat row.
const HEARTBEAT_BATCH: usize = 200;

/// Connections of the open-loop register step (a fixed set, like wrk2).
const OPEN_LOOP_CONNECTIONS: usize = 64;
