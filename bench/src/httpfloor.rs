//! The HTTP floor (issue 21): a no-op handler served by tandem's own listener
//! (`tandem::http::listener::serve`: the node's accept loop, connection caps, hyper HTTP/1.1
//! and HTTP/2 builder with the node's limits and per-connection tracking) with a router of
//! one route, measured with the same load generator, pinning and connection counts as
//! `register`, `heartbeat` and `discover`; then `GET /v1/ready` of a real node (the node's
//! whole middleware stack around a trivial handler). Those rows are then reported as a
//! percentage of the floor, and register at 256 as a percentage of the synced-batch floor
//! (RocksDB batches of 64 puts per second x 64).

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tandem::http::limits::HttpState;
use tandem::http::listener::{open_files_limit, serve, ListenerLimits};

use crate::load::{closed_loop, ms, rate, Run};
use crate::nodes::check;
use crate::{bench_config, cpu_now, Ctx};

/// Concurrencies of the HTTP/1.1 floor: discover's (32), heartbeat's (64) and register's
/// largest steps (64, 256).
pub const FLOOR_CONCURRENCY: [usize; 3] = [32, 64, 256];

/// One floor figure: (protocol, concurrency, requests/s, requests per server CPU-s).
pub type FloorFigure = (&'static str, usize, f64, f64);

fn per_cpu(run: &Run) -> f64 {
    run.ok as f64 / run.cpu.server.as_secs_f64().max(1e-9)
}

/// Measures the floor once per run (a later call is a no-op).
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    if !ctx.floors.noop.is_empty() {
        return Ok(());
    }
    let noop = Noop::start(ctx, None).await?;
    ctx.report.table(
        "floor: a no-op handler on tandem's HTTP listener (same accept loop, hyper builder and limits as the node), closed loop",
        &[
            "handler",
            "protocol, concurrency",
            "requests/s",
            "latency ms p50 / p99 / p999 / max",
            "requests per server CPU-s",
            "server CPU us per request",
            "CPU cores server / load",
            "errors",
        ],
    );
    let url = noop.url.clone();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let mut steps: Vec<(&'static str, usize, reqwest::Client)> =
        FLOOR_CONCURRENCY.iter().map(|c| ("HTTP/1.1", *c, ctx.http.clone())).collect();
    steps.push(("HTTP/2", 64, h2));
    for (proto, conc, http) in steps {
        let u = url.clone();
        let run = ctx
            .on_load(closed_loop(conc, ctx.step(), u64::MAX, cpu_now, move |_| {
                let (http, u) = (http.clone(), u.clone());
                async move { check(http.get(u.as_str()).send().await).await }
            }))
            .await?;
        let label = if proto == "HTTP/2" {
            format!("{proto}, {conc} streams on one connection")
        } else {
            format!("{proto} keep-alive, {conc} connections")
        };
        row(ctx, "no-op (GET /noop, {\"ok\":true})", label, &run);
        ctx.floors.noop.push((proto, conc, run.per_sec(), per_cpu(&run)));
    }
    let dir = noop.stop().await;
    // The node's own stack: every middleware (auth, audit, rate, guard) around a trivial
    // handler.
    let node = ctx.start_node(bench_config(dir.path(), "dc-a")).await?;
    let (http, u) = (ctx.http.clone(), Arc::new(format!("http://{}/v1/ready", node.http_addr())));
    let run = ctx
        .on_load(closed_loop(64, ctx.step(), u64::MAX, cpu_now, move |_| {
            let (http, u) = (http.clone(), u.clone());
            async move { check(http.get(u.as_str()).send().await).await }
        }))
        .await?;
    row(
        ctx,
        "tandem node, GET /v1/ready (the node's middleware, trivial handler)",
        "HTTP/1.1 keep-alive, 64 connections".into(),
        &run,
    );
    ctx.floors.ready_at_64 = Some((run.per_sec(), per_cpu(&run)));
    ctx.stop_node(node).await;
    ctx.report.note(
        "the floor is the node's listener (tandem::http::listener::serve, with the bench nodes' [http] settings) \
         and axum routing with no middleware: what every request pays before tandem's own work; /v1/ready adds \
         the node's middleware (auth, audit, rate limits, Host and timeout guard) around a handler that reads \
         two flags. Same reqwest client, pinning and connection counts as register, heartbeat and discover"
            .into(),
    );
    Ok(())
}

/// The no-op floor's server: tandem's listener with the bench nodes' `[http]` settings and a
/// router of one route, on the server runtime.
pub struct Noop {
    pub url: Arc<String>,
    shut: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl Noop {
    /// `answer_bytes`: the route answers that many static bytes instead of `{"ok":true}` (a
    /// floor that sends what the row sends).
    pub async fn start(ctx: &Ctx, answer_bytes: Option<usize>) -> anyhow::Result<Noop> {
        let dir = ctx.tempdir("tandem-bench-httpfloor")?;
        // The bench nodes' HTTP settings (bench_config), so caps and timeouts match theirs.
        let cfg = bench_config(dir.path(), "dc-a");
        let limits = ListenerLimits::new(&cfg, open_files_limit())?;
        let state = Arc::new(HttpState::default());
        let (shut, shut_rx) = tokio::sync::watch::channel(false);
        let listener = ctx.srv.spawn(tokio::net::TcpListener::bind("127.0.0.1:0")).await??;
        let addr = listener.local_addr()?;
        // The heartbeat's answer (or as many bytes as the row's), from a handler that does
        // nothing else.
        let body = match answer_bytes {
            Some(n) => bytes::Bytes::from(vec![b' '; n]),
            None => bytes::Bytes::from_static(b"{\"ok\":true}"),
        };
        let app = Router::new().route(
            "/noop",
            get(move || {
                let body = body.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) }
            }),
        );
        let server = ctx.srv.spawn(serve(listener, app, state, limits, None, shut_rx));
        Ok(Noop { url: Arc::new(format!("http://{addr}/noop")), shut, server, dir })
    }

    /// Stops the server; its temp dir is handed back for reuse.
    pub async fn stop(self) -> tempfile::TempDir {
        let _ = self.shut.send(true);
        let _ = self.server.await;
        self.dir
    }
}

/// Slices of a paired measurement, `true` for the row: the floor (F) and the row (R)
/// alternate as F R R F, four times, so a drift of the machine during the step weighs on both
/// sides alike.
pub const PAIRED_ORDER: [bool; 16] = {
    let mut order = [false; 16];
    let mut i = 0;
    while i < 16 {
        order[i] = i % 4 == 1 || i % 4 == 2;
        i += 1;
    }
    order
};

/// A row and the no-op floor measured in one step, alternating (see [`PAIRED_ORDER`]).
#[derive(Clone, Debug)]
pub struct Paired {
    /// The median over pairs of adjacent slices (F R, R F, ...) of the row's requests per
    /// server CPU-second as a percentage of the floor's: one slice the machine disturbed
    /// moves it less than it moves the pooled figure.
    pub pct: f64,
    /// The row's requests per server CPU-second over all its slices, as a percentage of the
    /// floor's over all of its slices.
    pub pooled: f64,
    /// Per pair of adjacent slices (F R, R F, ...): the same percentage, lowest and highest.
    pub pair_min: f64,
    pub pair_max: f64,
    pub row_per_cpu: f64,
    pub floor_per_cpu: f64,
}

/// Measures `op` (the row, on the step's node) and the no-op floor at `conc` connections in
/// alternating slices of half a step each, after a short unreported warm-up of the floor's
/// connections; a table of the slices and a note of the percentage. The ratio the verdicts
/// use: the floor separately measured moved by a third between runs minutes apart.
/// With `answer_bytes`, the floor answers as many static bytes as the row does.
pub async fn paired<F, Fut>(
    ctx: &mut Ctx,
    what: &str,
    conc: usize,
    answer_bytes: Option<usize>,
    op: F,
) -> anyhow::Result<Paired>
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = crate::load::OpResult> + Send + 'static,
{
    let noop = Noop::start(ctx, answer_bytes).await?;
    let floor = match answer_bytes {
        Some(n) => format!("a floor answering {n} static bytes"),
        None => "the no-op floor".to_owned(),
    };
    let slice = (ctx.step() / 2).max(std::time::Duration::from_millis(500));
    let floor_op = {
        let (http, url) = (ctx.http.clone(), noop.url.clone());
        move |_| {
            let (http, url) = (http.clone(), url.clone());
            async move { check(http.get(url.as_str()).send().await).await }
        }
    };
    // The floor's connections are opened before the first slice, as the row's already are.
    ctx.on_load(closed_loop(conc, slice / 4, u64::MAX, cpu_now, floor_op.clone())).await?;
    ctx.report.table(
        &format!(
            "paired: {what} and {floor} alternated in one step ({conc} connections, slices of {:.1} s, \
             order F R R F, four times)",
            slice.as_secs_f64()
        ),
        &["slice", "handler", "requests/s", "requests per server CPU-s", "CPU cores server / load", "errors"],
    );
    let mut slices = Vec::with_capacity(PAIRED_ORDER.len());
    for (k, is_row) in PAIRED_ORDER.iter().enumerate() {
        let run = if *is_row {
            ctx.on_load(closed_loop(conc, slice, u64::MAX, cpu_now, op.clone())).await?
        } else {
            ctx.on_load(closed_loop(conc, slice, u64::MAX, cpu_now, floor_op.clone())).await?
        };
        ctx.report.row(vec![
            (k + 1).to_string(),
            if *is_row { what.to_string() } else { floor.clone() },
            rate(run.per_sec()),
            rate(per_cpu(&run)),
            format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
            run.errors.to_string(),
        ]);
        slices.push((*is_row, run.ok as f64, run.cpu.server.as_secs_f64()));
    }
    noop.stop().await;
    let pooled = |row: bool| {
        let (ok, cpu) =
            slices.iter().filter(|s| s.0 == row).fold((0.0, 0.0), |(ok, cpu), s| (ok + s.1, cpu + s.2));
        ok / cpu.max(1e-9)
    };
    let (row_per_cpu, floor_per_cpu) = (pooled(true), pooled(false));
    let mut pairs: Vec<f64> = slices
        .chunks(2)
        .map(|p| {
            let (r, f) = if p[0].0 { (&p[0], &p[1]) } else { (&p[1], &p[0]) };
            100.0 * (r.1 / r.2.max(1e-9)) / (f.1 / f.2.max(1e-9)).max(1e-9)
        })
        .collect();
    pairs.sort_by(f64::total_cmp);
    let median = (pairs[(pairs.len() - 1) / 2] + pairs[pairs.len() / 2]) / 2.0;
    let paired = Paired {
        pct: median,
        pooled: 100.0 * row_per_cpu / floor_per_cpu.max(1e-9),
        pair_min: pairs[0],
        pair_max: pairs[pairs.len() - 1],
        row_per_cpu,
        floor_per_cpu,
    };
    ctx.report.note(format!(
        "paired, {what} at {conc} against {floor}: per pair of adjacent slices, {:.1}% of the floor's requests \
         per server CPU-s (median; lowest {:.0}%, highest {:.0}%); over all slices {} against the floor's {} = {:.1}%",
        paired.pct,
        paired.pair_min,
        paired.pair_max,
        rate(paired.row_per_cpu),
        rate(paired.floor_per_cpu),
        paired.pooled
    ));
    Ok(paired)
}

fn row(ctx: &mut Ctx, handler: &str, label: String, run: &Run) {
    let pc = per_cpu(run);
    ctx.report.row(vec![
        handler.into(),
        label,
        rate(run.per_sec()),
        run.lat.summary(),
        rate(pc),
        format!("{:.1}", 1e6 / pc.max(1e-9)),
        format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
        run.errors.to_string(),
    ]);
}

/// The HTTP/1.1 floor at `conc`: (requests/s, requests per server CPU-s).
pub fn floor_at(ctx: &Ctx, conc: usize) -> Option<(f64, f64)> {
    ctx.floors.noop.iter().find(|f| f.0 == "HTTP/1.1" && f.1 == conc).map(|f| (f.2, f.3))
}

/// `what` at `conc` as a percentage of the floor: (% of requests/s, % of per server CPU-s).
pub fn pct(ctx: &Ctx, conc: usize, per_s: f64, per_cpu_s: f64) -> Option<(f64, f64)> {
    let (f, fc) = floor_at(ctx, conc)?;
    Some((100.0 * per_s / f.max(1e-9), 100.0 * per_cpu_s / fc.max(1e-9)))
}

fn pct_line(ctx: &Ctx, what: &str, conc: usize, per_s: f64, per_cpu_s: f64) -> Option<String> {
    let (a, b) = pct(ctx, conc, per_s, per_cpu_s)?;
    let (f, fc) = floor_at(ctx, conc)?;
    Some(format!(
        "{what} at {conc}: {} /s = {a:.0}% of the no-op floor's {} requests/s; {} per server CPU-s = {b:.0}% of the floor's {}",
        rate(per_s),
        rate(f),
        rate(per_cpu_s),
        rate(fc)
    ))
}

/// Notes under the register table: each step as a percentage of the floor, and register at
/// 256 as a percentage of the synced-batch floor.
pub fn register_notes(ctx: &mut Ctx) {
    let mut lines = Vec::new();
    for &(c, per_s, cpu_per_k) in &ctx.floors.register_by_conc {
        if let Some(l) = pct_line(ctx, "register", c, per_s, 1000.0 / cpu_per_k.max(1e-9)) {
            lines.push(l);
        }
    }
    if let Some(l) = fsync_line(ctx) {
        lines.push(l);
    }
    for l in lines {
        ctx.report.note(l);
    }
}

/// Register at 256 against the synced-batch floor (RocksDB batches of 64 puts/s x 64).
pub fn register_vs_fsync(ctx: &Ctx) -> Option<(f64, f64)> {
    let puts = ctx.floors.rocksdb_batch64_puts_per_s?;
    let (_, r, _) = ctx.floors.register_by_conc.iter().find(|s| s.0 == 256)?;
    Some((*r, puts))
}

fn fsync_line(ctx: &Ctx) -> Option<String> {
    let (r, puts) = register_vs_fsync(ctx)?;
    Some(format!(
        "register at 256: {} /s = {:.0}% of the synced-batch floor ({} RocksDB batches/s of 64 puts x 64 = {} /s, \
         fsync table above){}",
        rate(r),
        100.0 * r / puts.max(1e-9),
        rate(puts / 64.0),
        rate(puts),
        batched(ctx, puts)
    ))
}

/// The batched registrations with 256 in flight against the synced-batch floor `puts`.
fn batched(ctx: &Ctx, puts: f64) -> String {
    ctx.floors.register_batched_256.map_or_else(String::new, |(b, per)| {
        format!(
            "; batched, 256 in flight ({per} per POST /v1/registrations): {} /s = {:.0}%",
            rate(b),
            100.0 * b / puts.max(1e-9)
        )
    })
}

pub fn heartbeat_notes(ctx: &mut Ctx) {
    if let (Some(s), Some(c)) = (ctx.floors.heartbeats_per_s, ctx.floors.heartbeats_per_server_cpu_s) {
        if let Some(l) = pct_line(ctx, "heartbeat (one lease per request)", 64, s, c) {
            ctx.report.note(l);
        }
    }
}

pub fn discover_notes(ctx: &mut Ctx) {
    if let (Some(s), Some(c)) = (ctx.floors.discover_per_s, ctx.floors.discover_per_server_cpu_s) {
        if let Some(l) = pct_line(ctx, "discover", 32, s, c) {
            ctx.report.note(l);
        }
    }
}

/// Verdict rows of the floors (issue 21) for the targets table.
pub fn target_rows(ctx: &mut Ctx) {
    let v = |ok: bool| if ok { "met" } else { "not met" };
    let f = ctx.floors.clone();
    for (what, conc, s, c, paired) in [
        ("discover", 32, f.discover_per_s, f.discover_per_server_cpu_s, f.discover_paired),
        (
            "heartbeat, one lease per request",
            64,
            f.heartbeats_per_s,
            f.heartbeats_per_server_cpu_s,
            f.heartbeat_paired,
        ),
    ] {
        let target =
            format!("issue 21: {what} >= 80% of the no-op HTTP floor (per server CPU-s, {conc} connections)");
        let gap = ": the gap is tandem's middleware and handler work, see the /v1/ready row";
        match (s.zip(c).and_then(|(s, c)| pct(ctx, conc, s, c)), paired) {
            // The verdict is the paired figure's (floor and row in alternating slices of
            // one step); the separate steps' ratio is shown beside it.
            (separate, Some(p)) => ctx.report.row(vec![
                target,
                format!(
                    "paired: {:.1}% of the floor per server CPU-s (median of pairs {:.0}-{:.0}%; all slices {} vs {} = {:.1}%){}",
                    p.pct,
                    p.pair_min,
                    p.pair_max,
                    rate(p.row_per_cpu),
                    rate(p.floor_per_cpu),
                    p.pooled,
                    separate.map(|(_, b)| format!("; separate steps: {b:.0}%")).unwrap_or_default()
                ),
                format!(
                    "{}{}{}",
                    v(p.pct >= 80.0),
                    if p.pct < 80.0 { gap } else { "" },
                    match (what, &f.discover_paired_sized) {
                        ("discover", Some((n, sized))) => format!(
                            "; against a floor answering as many bytes ({n}): {:.1}% (pairs {:.0}-{:.0}%)",
                            sized.pct, sized.pair_min, sized.pair_max
                        ),
                        _ => String::new(),
                    }
                ),
            ]),
            (Some((a, b)), None) => ctx.report.row(vec![
                target,
                format!("{b:.0}% of the floor per server CPU-s ({a:.0}% of its requests/s)"),
                format!("{}{}", v(b >= 80.0), if b < 80.0 { gap } else { "" }),
            ]),
            (None, None) => ctx.report.row(vec![
                target,
                "-".into(),
                format!("not measured: needs the HTTP floor and {what} in one run"),
            ]),
        }
    }
    let target =
        "issue 21: register at 256 >= 80% of the synced-batch floor (64-put batches/s x 64)".to_string();
    match register_vs_fsync(ctx) {
        Some((r, puts)) => {
            let p = 100.0 * r / puts.max(1e-9);
            // One request per registration: the no-op request rate at the same concurrency
            // bounds register before the disk does when it is the lower of the two.
            let http = floor_at(ctx, 256).map(|(f, _)| f);
            let figure = match http {
                Some(f) => format!(
                    "{} vs {} /s = {p:.0}%; the no-op HTTP floor at 256 connections: {} requests/s \
                     (register = {:.0}% of it)",
                    rate(r),
                    rate(puts),
                    rate(f),
                    100.0 * r / f.max(1e-9)
                ),
                None => format!("{} vs {} /s = {p:.0}%", rate(r), rate(puts)),
            } + &batched(ctx, puts);
            let why = match http {
                _ if p >= 80.0 => String::new(),
                Some(f) if f < 0.8 * puts => format!(
                    ": floor: the HTTP stack alone serves {:.0}% of the disk's capacity on one core; \
                     register's own server CPU per request is the rest (HTTP, committer and RocksDB share CPU 0){}",
                    100.0 * f / puts.max(1e-9),
                    if ctx.floors.register_batched_256.is_some() {
                        "; batched, 64 registrations share a request, and the write path's own CPU per \
                         registration (the in-process row) bounds it"
                    } else {
                        ""
                    }
                ),
                _ => ": the server core (HTTP, committer and RocksDB share CPU 0), not the disk".into(),
            };
            ctx.report.row(vec![target, figure, format!("{}{why}", v(p >= 80.0))]);
        }
        None => ctx.report.row(vec![
            target,
            "-".into(),
            "not measured: needs fsync and register at 256 in one run".into(),
        ]),
    }
    match (f.watch, f.write_floor) {
        (Some((n, p99, _, _)), Some((wn, wp99, wcpu))) => ctx.report.row(vec![
            "issue 21: watch fan-out beside the per-watcher write floor (the bound under M4)".into(),
            format!(
                "streaming watch to the last of {} watchers p99 {} ms; one pre-encoded line written to {} idle TCP \
                 connections: last delivery p99 {} ms, {:.3} CPU-s per change",
                rate(n as f64),
                ms(p99),
                rate(wn as f64),
                ms(wp99),
                wcpu
            ),
            format!("floor (no goal): tandem takes {:.1}x the floor's time", p99 / wp99.max(1e-9)),
        ]),
        _ => ctx.report.row(vec![
            "issue 21: per-watcher write floor".into(),
            "-".into(),
            "not measured: needs watch".into(),
        ]),
    }
}
