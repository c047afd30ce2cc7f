//! `compare`: the same operations against etcd and r-nacos, as separate processes on
//! loopback, pinned to the server's core like tandem's server side; then the targets of
//! issue 6 (M1-M8) judged from the figures of this run.
//!
//! Equivalent operations (issue 6):
//! - etcd 3.4, spoken to through its gRPC-gateway JSON API (`/v3/...`) over HTTP/1.1, the
//!   same transport as tandem's API (etcd's native gRPC would be cheaper per call):
//!   register = lease grant + put with that lease (one lease per instance, as a client
//!   session holds); heartbeat = lease keep-alive; discover = serializable prefix range.
//! - r-nacos, Nacos HTTP API v1: register = POST /nacos/v1/ns/instance (persistent, the
//!   raft path, and ephemeral, memory only); heartbeat = PUT .../instance/beat;
//!   discover = GET .../instance/list.
//!
//! A peer that is not installed is reported as such and skipped (bench/peers.sh installs
//! them). Every process started here is killed when its guard drops.
//!
//! The runs against each peer are in `etcd` and `rnacos`; this file holds what they share
//! (processes, readiness, response checks, the table rows) and the targets' verdicts.

mod etcd;
mod rnacos;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};

use crate::load::{ms, rate, OpResult, Run};
use crate::sys::process_cpu;
use crate::Ctx;

use etcd::etcd;
pub(crate) use etcd::{
    group_ports as etcd_ports, member_args as etcd_member_args, register_once as etcd_register_once,
    start_etcd,
};
use rnacos::rnacos;

/// What a peer measured, for ratios.
#[derive(Clone, Debug, Default)]
pub struct PeerFigures {
    pub register_best_per_s: Option<f64>,
    pub keepalive_per_cpu_s: Option<f64>,
    pub discover_per_cpu_s: Option<f64>,
    pub rss_bytes_empty: Option<u64>,
    pub rss_bytes_with_dataset: Option<u64>,
    pub instances_in_dataset: u64,
}

/// A child process killed on drop.
pub(crate) struct Proc {
    child: Child,
    name: &'static str,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
    pub(crate) fn cpu(&self) -> Duration {
        process_cpu(self.pid()).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        println!("# stopped {} (pid {})", self.name, self.child.id());
    }
}

pub(crate) fn find_bin(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(extra.iter().cloned()).map(|d| d.join(name)).find(|p| p.is_file())
}

pub(crate) fn free_tcp() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn spawn(
    ctx: &Ctx,
    name: &'static str,
    bin: &Path,
    args: &[String],
    env: &[(&str, String)],
    log: &Path,
) -> anyhow::Result<Proc> {
    let mut cmd = if ctx.pin {
        let mut c = Command::new("taskset");
        c.arg("-c").arg("0").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let out = std::fs::File::create(log)?;
    cmd.args(args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().with_context(|| format!("cannot start {}", bin.display()))?;
    println!("# started {name} (pid {}), log {}", child.id(), log.display());
    Ok(Proc { child, name })
}

pub(crate) async fn wait_ready(http: &reqwest::Client, url: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = http.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{url} not ready within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn ok_json(resp: Result<reqwest::Response, reqwest::Error>) -> Result<Value, String> {
    let resp = resp.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body).chars().take(200).collect::<String>()
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("bad JSON: {e}"))
}

async fn ok_text(resp: Result<reqwest::Response, reqwest::Error>) -> OpResult {
    let resp = resp.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body).chars().take(200).collect::<String>()))
    }
}

/// Standard base64 (etcd's JSON API carries keys and values as bytes).
pub(crate) fn b64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 { T[(n >> 6) as usize & 63] as char } else { '=' });
        out.push(if c.len() > 2 { T[n as usize & 63] as char } else { '=' });
    }
    out
}

/// The value stored per instance at the peers: the same fields tandem holds.
fn instance_value(svc: &str, id: &str) -> String {
    json!({"service": svc, "instance_id": id, "address": "10.20.30.40", "port": 8080, "zone": "zone-a",
           "version": "1.4.2", "weight": 100, "status": "up"})
    .to_string()
}

/// Server-side CPU of a peer process across a load run.
async fn measured<Fut: std::future::Future<Output = anyhow::Result<Run>>>(
    p: &Proc,
    f: Fut,
) -> anyhow::Result<(Run, Duration)> {
    let c0 = p.cpu();
    let run = f.await?;
    Ok((run, p.cpu().saturating_sub(c0)))
}

fn cores(run: &Run, server: Duration) -> String {
    format!("{:.2} / {:.2}", server.as_secs_f64() / run.elapsed.as_secs_f64().max(1e-9), run.load_cores())
}

fn errs(run: &Run) -> String {
    match &run.first_error {
        Some(e) => format!("{} first: {}", run.errors, e.chars().take(80).collect::<String>()),
        None => run.errors.to_string(),
    }
}

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    ctx.report.table(
        "peers: same operations, same dataset sizes, servers pinned to CPU 0 like tandem's",
        &[
            "peer",
            "operation",
            "concurrency",
            "ops/s",
            "latency ms p50 / p99 / p999 / max",
            "ops per server CPU-s",
            "CPU cores server / load",
            "errors",
        ],
    );
    let etcd = match find_bin("etcd", &[]) {
        None => {
            ctx.report.note(
                "etcd: not installed (bench/peers.sh installs etcd-server from Debian); skipped".into(),
            );
            None
        }
        Some(bin) => match etcd(ctx, &bin).await {
            Ok(f) => Some(f),
            Err(e) => {
                ctx.report.note(format!("etcd: failed: {e:#}"));
                None
            }
        },
    };
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let rnacos = match find_bin("rnacos", &[home.join(".cache/rnacos-install/bin"), home.join(".cargo/bin")])
    {
        None => {
            ctx.report
                .note("r-nacos: not installed (bench/peers.sh runs cargo install rnacos); skipped".into());
            None
        }
        Some(bin) => match rnacos(ctx, &bin).await {
            Ok(f) => Some(f),
            Err(e) => {
                ctx.report.note(format!("r-nacos: failed: {e:#}"));
                None
            }
        },
    };
    targets(ctx, etcd.as_ref(), rnacos.as_ref());
    Ok(())
}
fn row(ctx: &mut Ctx, peer: &str, op: &str, conc: usize, run: &Run, cpu: Duration) {
    ctx.report.row(vec![
        peer.into(),
        op.into(),
        conc.to_string(),
        rate(run.per_sec()),
        run.lat.summary(),
        rate(run.ok as f64 / cpu.as_secs_f64().max(1e-9)),
        cores(run, cpu),
        errs(run),
    ]);
}
fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "not met"
    }
}

/// The targets of issue 6 judged from this run's figures.
fn targets(ctx: &mut Ctx, etcd: Option<&PeerFigures>, rnacos: Option<&PeerFigures>) {
    let f = ctx.floors.clone();
    ctx.report
        .table("targets of issue 6, judged from this run", &["target", "figure in this run", "verdict"]);
    let nm = |why: &str| format!("not measured: {why}");
    // M1
    match (f.register_best_per_s, etcd.and_then(|e| e.register_best_per_s)) {
        (Some(t), Some(e)) => ctx.report.row(vec![
            "M1 register >= 2x etcd put-with-lease".into(),
            format!("{} vs {} /s = {:.2}x", rate(t), rate(e), t / e),
            verdict(t >= 2.0 * e).into(),
        ]),
        _ => ctx.report.row(vec![
            "M1 register >= 2x etcd".into(),
            "-".into(),
            nm("needs register and etcd in one run"),
        ]),
    }
    match (f.register_per_fsync_http, f.register_per_fsync_direct) {
        (Some(h), d) => {
            let d = d.unwrap_or(0.0);
            ctx.report.row(vec![
                "M1 >= 32 registrations per fsync under concurrency".into(),
                format!("{h:.1} over HTTP (best step); {d:.1} with 256 in-process writers"),
                if h >= 32.0 {
                    "met".into()
                } else if d >= 32.0 {
                    "not met over HTTP (arrivals throttled by the HTTP stack); met in-process".into()
                } else {
                    "not met".into()
                },
            ]);
        }
        _ => ctx.report.row(vec!["M1 >= 32 per fsync".into(), "-".into(), nm("register not run")]),
    }
    match (f.register_half_p99_ms, f.fsync_p99_ms) {
        (Some(p), Some(fs)) => ctx.report.row(vec![
            "M1 p99 <= fsync p99 + 2 ms at half of saturation".into(),
            format!(
                "{} ms vs {} ms{}",
                ms(p),
                ms(fs + 2.0),
                f.register_half_sync_ms.map_or_else(String::new, |(_, s99)| format!(
                    " (the committer's synced writes in that step: p99 {} ms)",
                    ms(s99)
                ))
            ),
            verdict(p <= fs + 2.0).into(),
        ]),
        _ => ctx.report.row(vec!["M1 p99 condition".into(), "-".into(), nm("needs fsync and register")]),
    }
    // M2
    if let Some(h) = f.heartbeats_per_server_cpu_s {
        ctx.report.row(vec![
            "M2 >= 100,000 heartbeats/s on one server core, one per request".into(),
            format!("{} per server CPU-s ({} leases)", rate(h), rate(ctx.opts.leases as f64)),
            match crate::httpfloor::floor_at(ctx, 64) {
                // The stack's own floor is below the target: no handler can reach it.
                Some((_, fc)) if h < 100_000.0 && fc < 100_000.0 => format!(
                    "not met: floor (a no-op request on the same HTTP stack is {} per server CPU-s, \
                     {:.0}% of the target; heartbeat = {:.0}% of it)",
                    rate(fc),
                    100.0 * fc / 100_000.0,
                    100.0 * h / fc.max(1e-9)
                ),
                _ => verdict(h >= 100_000.0).into(),
            },
        ]);
        ctx.report.row(vec![
            "M2 zero disk writes per heartbeat".into(),
            format!("{} disk writes during the step", f.heartbeat_disk_writes.unwrap_or(u64::MAX)),
            verdict(f.heartbeat_disk_writes == Some(0)).into(),
        ]);
        ctx.report.row(vec![
            "M2 heartbeat p99 < 5 ms".into(),
            format!("{} ms", ms(f.heartbeat_p99_ms.unwrap_or(f64::NAN))),
            verdict(f.heartbeat_p99_ms.is_some_and(|p| p < 5.0)).into(),
        ]);
        if let Some((b, _, p99, per, writes)) = f.heartbeats_batched {
            ctx.report.row(vec![
                "M2 >= 100,000 heartbeats/s on one server core, batched".into(),
                format!(
                    "{} per server CPU-s, {per} per POST /v1/heartbeats (request p99 {} ms, {writes} disk writes)",
                    rate(b),
                    ms(p99)
                ),
                verdict(b >= 100_000.0 && writes == 0 && p99 < 5.0).into(),
            ]);
        }
        match etcd.and_then(|e| e.keepalive_per_cpu_s) {
            Some(e) => ctx.report.row(vec![
                "M2 >= 3x etcd keep-alives per CPU-s".into(),
                format!("{} vs {} = {:.2}x (one lease per request)", rate(h), rate(e), h / e),
                verdict(h >= 3.0 * e).into(),
            ]),
            None => ctx.report.row(vec!["M2 vs etcd".into(), "-".into(), nm("etcd not measured")]),
        }
    } else {
        ctx.report.row(vec!["M2 heartbeats".into(), "-".into(), nm("heartbeat not run")]);
    }
    // M3
    if let Some(d) = f.discover_per_server_cpu_s {
        for (peer, fig, factor) in [("etcd serializable range", etcd, 2.0), ("r-nacos list", rnacos, 1.5)] {
            match fig.and_then(|p| p.discover_per_cpu_s) {
                Some(p) => ctx.report.row(vec![
                    format!("M3 discover >= {factor}x {peer} per CPU-s"),
                    format!(
                        "{} vs {} = {:.2}x ({} services x {})",
                        rate(d),
                        rate(p),
                        d / p,
                        rate(ctx.opts.services as f64),
                        ctx.opts.per_service
                    ),
                    verdict(d >= factor * p).into(),
                ]),
                None => ctx.report.row(vec![format!("M3 vs {peer}"), "-".into(), nm("peer not measured")]),
            }
        }
    } else {
        ctx.report.row(vec!["M3 discover".into(), "-".into(), nm("discover not run")]);
    }
    match f.watch {
        Some((n, p99, max, changes)) => {
            ctx.report.row(vec![
                "M4 watch fan-out: change to last delivery p99 <= 100 ms (10,000 watchers, churn)".into(),
                format!(
                    "streaming watch: p99 {} ms, max {} ms with {} watchers ({changes} changes)",
                    ms(p99),
                    ms(max),
                    rate(n as f64)
                ),
                format!(
                    "{}{}",
                    verdict(p99 <= 100.0),
                    if n < 10_000 { " (fewer watchers than M4's 10,000: --watchers 10000)" } else { "" }
                ),
            ]);
            match f.etcd_watch_p99_ms {
                Some(e) => ctx.report.row(vec![
                    "M4 watch p99 <= half of etcd's".into(),
                    format!("{} ms vs etcd {} ms = {:.2}x", ms(p99), ms(e), p99 / e.max(1e-9)),
                    verdict(p99 <= e / 2.0).into(),
                ]),
                None => {
                    ctx.report.row(vec!["M4 vs etcd".into(), "-".into(), nm("etcd's watch not measured")])
                }
            }
        }
        None => ctx.report.row(vec!["M4 watch fan-out".into(), "-".into(), nm("watch not run")]),
    }
    match f.detect {
        Some((ttl, policy_max, all_max, missed, seen)) => ctx.report.row(vec![
            "M5 failure detection within TTL + 1 s".into(),
            format!(
                "ttl {ttl} ms: gone from dc=all answers (expired) at most {} ms, from default answers (unhealthy) at \
                 most {} ms after the last heartbeat; {missed} of {} watchers missed it",
                ms(all_max),
                ms(policy_max),
                seen + missed
            ),
            verdict(missed == 0 && all_max <= (ttl + 1_000) as f64).into(),
        ]),
        None => ctx.report.row(vec!["M5 failure detection".into(), "-".into(), nm("detect not run")]),
    }
    match (f.repl_lag_p99_ms_at_10k, f.fsync_p99_ms) {
        (Some(l), Some(fs)) => ctx.report.row(vec![
            "M6 cross-DC lag p99 at 10,000 events/s <= delay (0 here) + fsync p99 + 10 ms".into(),
            format!("{} ms vs {} ms", ms(l), ms(fs + 10.0)),
            verdict(l <= fs + 10.0).into(),
        ]),
        _ => ctx.report.row(vec![
            "M6 cross-DC lag".into(),
            "-".into(),
            nm("needs replicate at 10000/s and fsync"),
        ]),
    }
    match f.catch_up {
        Some((cut, ingest, drain, reconnect)) => ctx.report.row(vec![
            "M7 catch-up after a 60 s partition at >= 10x ingest".into(),
            format!(
                "{cut:.0} s cut: drained at {} /s = {:.1}x the {} /s ingest (after {reconnect:.1} s to reconnect)",
                rate(drain),
                drain / ingest,
                rate(ingest)
            ),
            format!("{}{}", verdict(drain >= 10.0 * ingest), if cut < 60.0 { " (shorter cut than M7's 60 s)" } else { "" }),
        ]),
        None => ctx.report.row(vec!["M7 catch-up".into(), "-".into(), nm("replicate not run")]),
    }
    match f.tandem_rss {
        Some((before, after, n)) => {
            let growth = after.saturating_sub(before) as f64 / n.max(1) as f64;
            ctx.report.row(vec![
                "M8 <= 1 KiB per instance".into(),
                format!(
                    "{growth:.0} B of RSS growth per instance ({} instances, separate node process){}",
                    rate(n as f64),
                    f.tandem_rss_second_half.map_or_else(String::new, |b| format!(
                        "; {b:.0} B per instance of the load's second half"
                    ))
                ),
                verdict(growth <= 1024.0).into(),
            ]);
            match rnacos.and_then(|r| Some((r.rss_bytes_empty?, r.rss_bytes_with_dataset?, r.instances_in_dataset))) {
                Some((rb, ra, rn)) => ctx.report.row(vec![
                    "M8 RSS <= r-nacos's on the same data".into(),
                    format!(
                        "tandem {:.1} MiB vs r-nacos {:.1} MiB with {} instances each (empty: {:.1} vs {:.1} MiB)",
                        after as f64 / 1048576.0,
                        ra as f64 / 1048576.0,
                        rate(rn as f64),
                        before as f64 / 1048576.0,
                        rb as f64 / 1048576.0
                    ),
                    verdict(after <= ra).into(),
                ]),
                None => ctx.report.row(vec!["M8 vs r-nacos".into(), "-".into(), nm("r-nacos not measured")]),
            }
        }
        None => ctx.report.row(vec!["M8 memory".into(), "-".into(), nm("memory not run")]),
    }
    crate::limit_rows(ctx);
    ctx.report.note(format!(
        "every tandem figure here comes from the {} build ({}); etcd and r-nacos are release builds",
        crate::sys::PROFILE,
        crate::sys::BUILD
    ));
}
