//! `replicate`: two in-process DCs linked by their real QUIC + mutual-TLS gateways on
//! loopback (no relay). Registrations are written at dc-a at fixed offered rates (open loop,
//! through `Registry::register`: the durable, group-committed write path); the bench samples
//! dc-b's applied mark of origin dc-a every millisecond and computes, per event, the time
//! from its acknowledgement at dc-a to the first sample that shows it durably applied at
//! dc-b. dc-a's link to dc-b runs through a pass-through UDP relay (tandem-chaos) so that a
//! last step can cut it and time the catch-up. One raw quinn stream with the same TLS configs is measured in the same run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tandem::config::{PeerSection, ReplicationSection};
use tandem::node::Node;
use tandem_chaos::relay::{Direction, Faults, Relay};

use crate::floors::{quinn_stream, FRAME_BYTES};
use crate::load::{closed_loop, open_loop, rate, Lat, Run};
use crate::nodes::register_request;
use crate::{bench_config, cpu_now, Ctx};

fn free_udp() -> anyhow::Result<SocketAddr> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

fn applied_of(node: &Node, origin: &str) -> u64 {
    node.shared.live.read().remote.get(origin).map_or(0, |m| m.seq)
}

fn links_up(node: &Node, peer: &str) -> bool {
    node.shared
        .gateway_stats
        .as_ref()
        .and_then(|s| s.peers.lock().get(peer).map(|p| p.out_connected && p.in_connected))
        .unwrap_or(false)
}

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-replicate")?;
    let pki = tandem_replicator::tls::generate_dev_pki(&dir.path().join("certs"), &["dc-a", "dc-b"], false)?;
    let (la, lb) = (free_udp()?, free_udp()?);
    let mk = |dc: &str, listen: SocketAddr, peer: &str, peer_addr: SocketAddr| -> anyhow::Result<_> {
        let p = pki.paths(dc).context("pki paths")?;
        let mut c = bench_config(dir.path(), dc);
        c.replication = Some(ReplicationSection {
            listen,
            peers: vec![PeerSection { dc: peer.into(), addr: peer_addr, addrs: vec![], namespaces: None }],
            ca_cert: p.ca_cert.clone(),
            cert: p.cert.clone(),
            key: p.key.clone(),
            batch_events_max: 512,
            window_batches_max: 8,
            frame_bytes_max: tandem_schemas::FRAME_BYTES_MAX,
            backoff_initial_ms: 100,
            backoff_max_ms: 2_000,
            stale_after_ms: 30_000,
            purge_grace_ms: 3_600_000,
            ping_interval_ms: 500,
            schema_version: tandem_schemas::SCHEMA_VERSION,
            accept_from: tandem_replicator::gateway::SourceRule::defaults(),
            handshakes_max: tandem_replicator::gateway::HANDSHAKES_MAX_DEFAULT,
        });
        Ok(c)
    };
    // dc-a dials dc-b through a pass-through UDP relay on the load core, so that the
    // catch-up step can cut the link; dc-b dials dc-a directly.
    let relay = ctx
        .load
        .spawn(Relay::start("127.0.0.1:0".parse().expect("constant"), lb, Faults::NONE, 7))
        .await
        .context("relay task")??;
    let a = ctx.start_node(mk("dc-a", la, "dc-b", relay.local_addr())?).await?;
    let b = ctx.start_node(mk("dc-b", lb, "dc-a", la)?).await?;
    let up_by = Instant::now() + Duration::from_secs(15);
    while !(links_up(&a, "dc-b") && links_up(&b, "dc-a")) {
        anyhow::ensure!(Instant::now() < up_by, "replication links did not come up within 15 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The floor, same run, same TLS material.
    let pa = pki.paths("dc-a").context("pki")?.clone();
    let pb = pki.paths("dc-b").context("pki")?.clone();
    let (mbps, fps) = quinn_stream(ctx, &pa, &pb, ctx.step().min(Duration::from_secs(3))).await?;

    ctx.report.table(
        "replicate: dc-a -> dc-b over QUIC + mutual TLS on loopback, registrations at dc-a (open loop)",
        &[
            "offered events/s",
            "acked at dc-a /s",
            "applied at dc-b /s",
            "lag ms p50 / p99 / p999 / max (commit at dc-a -> durable at dc-b)",
            "gateway lag ms p50 / p99",
            "events per synced write at dc-b",
            "drain after the step s",
            "CPU cores server / load",
            "errors",
        ],
    );
    let registry = a.shared.registry.clone();
    let rates = ctx.opts.rates.clone();
    for (step, &r) in rates.iter().enumerate() {
        let reg = registry.clone();
        let sampler = Sampler::start(&a, &b, ctx.pin);
        let run = ctx
            .on_load(open_loop(r.max(1) as f64, ctx.step(), 256, 8192, cpu_now, move |_, i| {
                let reg = reg.clone();
                async move {
                    let req = register_request(format!("rsvc-{}", i % 1000), format!("r{step}-i{i}"), true);
                    reg.register(req).await.map(|_| ()).map_err(|e| e.to_string())
                }
            }))
            .await?;
        let row = finish_step(&a, &b, sampler, &run).await?;
        ctx.report.row(vec![
            rate(r as f64),
            rate(run.per_sec()),
            row.applied_per_s,
            row.lag.summary(),
            row.gateway_lag,
            row.per_write,
            row.drain,
            format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
            format!(
                "{}{}",
                run.errors,
                if run.dropped > 0 { format!(" (+{} dropped)", run.dropped) } else { String::new() }
            ),
        ]);
        if r == 10_000 {
            ctx.floors.repl_lag_p99_ms_at_10k = Some(row.lag.q_ms(0.99));
        }
    }
    // Saturation: as many writers as the committer groups well, closed loop.
    {
        let reg = registry.clone();
        let sampler = Sampler::start(&a, &b, ctx.pin);
        let run = ctx
            .on_load(closed_loop(256, ctx.step(), u64::MAX, cpu_now, move |i| {
                let reg = reg.clone();
                async move {
                    let req = register_request(format!("rsvc-{}", i % 1000), format!("rmax-i{i}"), true);
                    reg.register(req).await.map(|_| ()).map_err(|e| e.to_string())
                }
            }))
            .await?;
        let row = finish_step(&a, &b, sampler, &run).await?;
        ctx.report.row(vec![
            "saturation: 256 writers, closed loop".into(),
            rate(run.per_sec()),
            row.applied_per_s,
            row.lag.summary(),
            row.gateway_lag,
            row.per_write,
            row.drain,
            format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
            run.errors.to_string(),
        ]);
    }
    catch_up(ctx, &a, &b, &relay).await?;
    ctx.report.note(format!(
        "same run, same TLS configs: one raw quinn bi stream carried {mbps:.1} MB/s = {} frames/s of {FRAME_BYTES} B",
        rate(fps)
    ));
    ctx.report.note(
        "lag is measured by the bench on one monotonic clock: a thread samples dc-a's own last seq and \
         dc-b's applied mark of dc-a every 0.25 ms (figures carry up to ~0.3 ms of sampling error); gateway lag is tandem's own figure (wall-clock commit \
         time to apply, ms resolution, last 4096 events) as /v1/status shows it"
            .into(),
    );
    ctx.stop_node(a).await;
    ctx.stop_node(b).await;
    let _ = ctx.load.spawn(relay.shutdown()).await;
    Ok(())
}

/// M7's shape: cut the dc-a -> dc-b link, keep writing at dc-a, heal, and time the drain.
async fn catch_up(ctx: &mut Ctx, a: &Node, b: &Node, relay: &Relay) -> anyhow::Result<()> {
    let ingest = 1_000.0;
    let cut = Duration::from_secs_f64(ctx.opts.partition_secs.clamp(1.0, 300.0));
    // Settle: everything before the cut is applied.
    let settle_by = Instant::now() + Duration::from_secs(30);
    while applied_of(b, "dc-a") < a.shared.live.read().own.seq && Instant::now() < settle_by {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    relay.handle().partition(Direction::Both);
    let reg = a.shared.registry.clone();
    let run = ctx
        .on_load(open_loop(ingest, cut, 256, 8192, cpu_now, move |_, i| {
            let reg = reg.clone();
            async move {
                let req = register_request(format!("rsvc-{}", i % 1000), format!("cut-i{i}"), true);
                reg.register(req).await.map(|_| ()).map_err(|e| e.to_string())
            }
        }))
        .await?;
    let target = a.shared.live.read().own.seq;
    let at_heal = applied_of(b, "dc-a");
    let backlog = target.saturating_sub(at_heal);
    let counts_at_heal = applied_counts(b);
    relay.handle().heal();
    let healed = Instant::now();
    let by = healed + Duration::from_secs(120);
    let mut first_apply: Option<Instant> = None;
    while applied_of(b, "dc-a") < target && Instant::now() < by {
        if first_apply.is_none() && applied_of(b, "dc-a") > at_heal {
            first_apply = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let done = Instant::now();
    let caught_up = applied_of(b, "dc-a") >= target;
    let total = done.duration_since(healed).as_secs_f64();
    let draining = first_apply.map_or(total, |t| done.duration_since(t).as_secs_f64()).max(1e-3);
    let drain_rate = backlog as f64 / draining;
    let per_write = per_write(counts_at_heal, applied_counts(b));
    ctx.report.row(vec![
        format!("catch-up: link cut {:.0} s at {}/s ingest", cut.as_secs_f64(), rate(ingest)),
        rate(run.per_sec()),
        format!("backlog {} events drained at {}/s", rate(backlog as f64), rate(drain_rate)),
        "-".into(),
        "-".into(),
        per_write,
        if caught_up {
            format!(
                "{total:.2} after heal ({:.2} reconnecting, {draining:.2} draining)",
                total - draining.min(total)
            )
        } else {
            format!("not caught up in {total:.0} s")
        },
        format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
        run.errors.to_string(),
    ]);
    if caught_up && backlog > 0 {
        ctx.floors.catch_up = Some((cut.as_secs_f64(), ingest, drain_rate, total - draining.min(total)));
    }
    Ok(())
}

/// Samples dc-a's own last seq and dc-b's applied mark of dc-a on a dedicated thread,
/// every 250 us, so that the samples do not wait for the (busy) load runtime. Bounded to
/// 10 minutes.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Samples>,
    own_at_start: u64,
    /// dc-b's (events, batches) applied of dc-a when the step began.
    applied_at_start: (u64, u64),
}

#[derive(Default)]
struct Samples {
    /// (time, dc-a's own last seq) whenever it changed.
    source: Vec<(Instant, u64)>,
    /// (time, dc-b's applied seq of dc-a) whenever it changed.
    peer: Vec<(Instant, u64)>,
}

impl Sampler {
    fn start(a: &Node, b: &Node, pin: bool) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (la, lb) = (a.shared.live.clone(), b.shared.live.clone());
        let own_at_start = la.read().own.seq;
        let applied_at_start = applied_counts(b);
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-sampler", crate::sys::LOAD_THREAD))
            .spawn(move || {
                // On the load core: started from the unpinned main thread, it would
                // otherwise wake on the server's core every 250 us.
                if pin {
                    crate::sys::pin_current_thread(1);
                }
                let mut out = Samples::default();
                let deadline = Instant::now() + Duration::from_secs(600);
                let (mut last_a, mut last_b) = (u64::MAX, u64::MAX);
                while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let sa = la.read().own.seq;
                    let sb = lb.read().remote.get("dc-a").map_or(0, |m| m.seq);
                    let now = Instant::now();
                    if sa != last_a {
                        out.source.push((now, sa));
                        last_a = sa;
                    }
                    if sb != last_b {
                        out.peer.push((now, sb));
                        last_b = sb;
                    }
                    std::thread::sleep(Duration::from_micros(250));
                }
                out
            })
            .expect("spawning the sampler thread");
        Sampler { stop, thread, own_at_start, applied_at_start }
    }
}

/// dc-b's gateway counts of dc-a's events and batches applied.
fn applied_counts(b: &Node) -> (u64, u64) {
    b.shared
        .gateway_stats
        .as_ref()
        .and_then(|s| s.peers.lock().get("dc-a").map(|p| (p.events_applied, p.batches_applied)))
        .unwrap_or_default()
}

/// Events per batch dc-b applied between two [`applied_counts`] readings ("-": none).
fn per_write((events_then, batches_then): (u64, u64), (events_now, batches_now): (u64, u64)) -> String {
    let batches = batches_now.saturating_sub(batches_then);
    if batches == 0 {
        return "-".into();
    }
    format!("{:.1}", events_now.saturating_sub(events_then) as f64 / batches as f64)
}

struct StepRow {
    applied_per_s: String,
    lag: Lat,
    gateway_lag: String,
    /// Events per batch dc-b applied in the step (each batch one synced write).
    per_write: String,
    drain: String,
}

/// The first sample at which `seq` was reached.
fn reached(samples: &[(Instant, u64)], seq: u64) -> Option<Instant> {
    let i = samples.partition_point(|(_, s)| *s < seq);
    samples.get(i).map(|(t, _)| *t)
}

/// The seq a series showed at `when`.
fn at(samples: &[(Instant, u64)], when: Instant) -> u64 {
    let i = samples.partition_point(|(t, _)| *t <= when);
    if i == 0 {
        0
    } else {
        samples[i - 1].1
    }
}

async fn finish_step(a: &Node, b: &Node, sampler: Sampler, run: &Run) -> anyhow::Result<StepRow> {
    let sent_end = Instant::now();
    let target = a.shared.live.read().own.seq;
    let drain_by = sent_end + Duration::from_secs(30);
    while applied_of(b, "dc-a") < target && Instant::now() < drain_by {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drained = applied_of(b, "dc-a") >= target;
    let drain_s = sent_end.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(5)).await;
    sampler.stop.store(true, Ordering::Relaxed);
    let first = sampler.own_at_start + 1;
    let per_write = per_write(sampler.applied_at_start, applied_counts(b));
    let samples = tokio::task::spawn_blocking(move || sampler.thread.join())
        .await
        .context("sampler join")?
        .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?;
    // Lag per event: first sample showing it committed at dc-a to first sample showing it
    // durably applied at dc-b, on one clock.
    let mut lat = Lat::default();
    let mut missing = 0u64;
    for seq in first..=target {
        match (reached(&samples.source, seq), reached(&samples.peer, seq)) {
            (Some(c), Some(p)) => lat.push(p.saturating_duration_since(c)),
            _ => missing += 1,
        }
    }
    let lat = lat.finish();
    let window = run.elapsed;
    let started = sent_end.checked_sub(window).unwrap_or(sent_end);
    let applied_in_window =
        at(&samples.peer, sent_end).saturating_sub(at(&samples.peer, started).max(first - 1));
    let gw = b
        .shared
        .gateway_stats
        .as_ref()
        .and_then(|s| {
            s.peers
                .lock()
                .get("dc-a")
                .map(|p| (p.lag_ms_recent.quantile(0.5), p.lag_ms_recent.quantile(0.99)))
        })
        .map_or("-".into(), |(p50, p99)| {
            format!(
                "{} / {}",
                p50.map_or("-".into(), |v| v.to_string()),
                p99.map_or("-".into(), |v| v.to_string())
            )
        });
    Ok(StepRow {
        applied_per_s: format!(
            "{}{}",
            rate(applied_in_window as f64 / window.as_secs_f64().max(1e-9)),
            if missing > 0 { format!(" ({missing} not seen)") } else { String::new() }
        ),
        lag: lat,
        gateway_lag: gw,
        per_write,
        drain: if drained { format!("{drain_s:.2}") } else { format!("not drained in {drain_s:.0} s") },
    })
}
