//! `scale` (issue 21): the sizes the seeds name. One node (a separate process,
//! `serve-scale-probe`, pinned to CPU 0) holding `--scale-leases` ephemeral leases renewed
//! the way `--scale-clients` client processes would: each client registers its instances
//! together (`POST /v1/registrations`) over its own connection, then sends one `POST /v1/heartbeats` with all of them per
//! heartbeat interval, its phase spread evenly over the interval. The clients are tasks of
//! one load generator on CPU 1, each on its own raw HTTP/1.1 connection bound to a source
//! address in 127.0.0.2.. (`--scale-per-address` connections per address), so the node's
//! default connection caps admit them. Measured over three intervals once every client
//! renews: heartbeat CPU per instance, RSS per instance, the lease checker's cost per tick
//! (`tandem_lease_check_microseconds_total` / `tandem_lease_checks_total`), and the latency
//! of registrations made meanwhile. Then discovery of one service with `--scale-instances`
//! instances and the list of `--scale-services` services, on an in-process node.
//!
//! Bounded: clients and connections by the flags (at most 60,000 clients; the open-files
//! limit is raised to fit and checked), the seeding by `--scale-seed-secs`, every request by
//! a timeout, the measurement by three intervals, every task stops at the end.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;
use tandem::config::Config;

use crate::load::{closed_loop, ms, open_loop, rate, Lat};
use crate::nodes::{check, seed};
use crate::probe::spawn_probe_with;
use crate::raw::RawConn;
use crate::sys::{process_cpu, rss_bytes};
use crate::{bench_config, cpu_now, Ctx};

/// Clients whose instances share one service (10 clients x 100 instances: 1,000 services
/// of 1,000 instances at the default sizes).
const CLIENTS_PER_SERVICE: u64 = 10;
/// Clients registering at once while the dataset is seeded (the register step's largest
/// concurrency).
const SEEDING_CLIENTS: usize = 256;
/// Most clients `scale` simulates.
const CLIENTS_MAX: u64 = 60_000;
/// Seeding stops after this many failed requests (the node cannot keep up: report what it
/// reached).
const ERRORS_MAX: u64 = 1_000;

/// What `scale` measured, for the targets table.
#[derive(Clone, Debug, Default)]
pub struct ScaleFigures {
    pub leases: u64,
    pub seeded_all: bool,
    pub rss_bytes: u64,
    pub server_us_per_heartbeat: f64,
    pub check_us_mean: f64,
    pub check_us_max: f64,
    pub register_p99_ms: f64,
    pub heartbeat_p99_ms: f64,
    /// Discovery of the big service: (instances, queries/s, p99 ms, server CPU ms per query, bytes).
    pub big: Option<(u64, f64, f64, f64, usize)>,
    /// The list: (services, p50 ms, p99 ms, bytes).
    pub list: Option<(u64, f64, f64, usize)>,
}

/// The node of `scale`: the defaults (health timings, `[http]` connection caps 16,384 and
/// 1,024 per address) except where the sizes need more: the namespace's instance cap
/// (default 1,000,000) raised to the leases plus the registrations made while measuring, and
/// the HTTP/1.1 header read timeout (which also ends idle keep-alive) to at least three
/// heartbeat intervals. Another interval than the default 5 s scales the health timings.
pub fn scale_config(dir: &std::path::Path, leases: u64, interval_ms: u64) -> Config {
    let mut c = Config::single("dc-a", dir.join("dc-a"), "127.0.0.1:0".parse().expect("constant address"));
    c.limits.namespace_instances_max = c.limits.namespace_instances_max.max(leases + 100_000);
    c.http.header_read_timeout_ms = c.http.header_read_timeout_ms.max(3 * interval_ms);
    if interval_ms != c.health.heartbeat_interval_ms {
        c.health.heartbeat_interval_ms = interval_ms;
        c.health.suspect_after_ms = interval_ms * 3 / 2;
        c.health.unhealthy_after_ms = interval_ms * 3;
        c.health.expire_after_ms = interval_ms * 6;
        c.protection.self_preservation_window_ms =
            c.protection.self_preservation_window_ms.max(20 * interval_ms);
    }
    c
}

/// `serve-scale-probe`: one node with [`scale_config`] in this process; prints
/// `http=ADDR`, serves until stdin closes, at most an hour.
pub fn serve_probe(base: std::path::PathBuf, leases: u64, interval_ms: u64) -> anyhow::Result<()> {
    let rt = tandem::node_runtime().worker_threads(1).build()?;
    rt.block_on(async {
        let dir = tempfile::Builder::new().prefix("tandem-bench-scale").tempdir_in(&base)?;
        let node = tandem::node::Node::start(scale_config(dir.path(), leases, interval_ms), None).await?;
        crate::probe::serve_until_stdin_closes(node, Duration::from_secs(3600)).await;
        anyhow::Ok(())
    })
}

/// Raises the open-files limit (soft to the hard limit, and both to `want` when allowed);
/// returns the soft limit in force.
#[allow(unsafe_code, clippy::unnecessary_cast)]
pub fn raise_open_files(want: u64) -> u64 {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write only the struct on this stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        let both = libc::rlimit { rlim_cur: want as libc::rlim_t, rlim_max: want as libc::rlim_t };
        if (rl.rlim_max as u64) < want && libc::setrlimit(libc::RLIMIT_NOFILE, &both) == 0 {
            return want;
        }
        let soft = libc::rlimit { rlim_cur: rl.rlim_max, rlim_max: rl.rlim_max };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft) == 0 {
            return rl.rlim_max as u64;
        }
        rl.rlim_cur as u64
    }
}

/// Source address of client `c`: 127.0.0.2 onwards, `per_address` clients each.
fn source_of(c: u64, per_address: u64) -> IpAddr {
    let base = u32::from(Ipv4Addr::new(127, 0, 0, 2));
    IpAddr::V4(Ipv4Addr::from(base + (c / per_address.max(1)) as u32))
}

/// One `name{...} value` or `name value` sample of a Prometheus text page.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `"renewed":N` of a heartbeat batch answer.
fn renewed(answer: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(answer, b"\"renewed\":")? + 10;
    let digits: Vec<u8> = answer[at..].iter().copied().take_while(u8::is_ascii_digit).collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

#[derive(Default)]
struct Errors {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Errors {
    fn add(&self, e: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.first.lock().get_or_insert(e);
    }
}

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    leases(ctx).await?;
    discovery(ctx).await
}

/// One simulated client: registers its `per` instances, then renews them with one batch
/// per interval until `stop`. Returns (sent at, ns since `base`; latency) of each heartbeat.
#[allow(clippy::too_many_arguments)]
async fn client(
    c: u64,
    clients: u64,
    per: u64,
    addr: Arc<String>,
    per_address: u64,
    interval: Duration,
    base: Instant,
    seeding: Arc<tokio::sync::Semaphore>,
    seeded: Arc<AtomicU64>,
    errors: Arc<Errors>,
    chunk: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(u64, u32)> {
    let mut conn = RawConn::bound(&addr, source_of(c, per_address), 512);
    let svc = format!("scale-{}", c / CLIENTS_PER_SERVICE);
    let offset = interval.mul_f64(c as f64 / clients as f64);
    let item = |j: u64| json!({"service": svc, "instance_id": format!("c{c}-i{j}")});
    {
        let Ok(_permit) = seeding.acquire().await else { return Vec::new() };
        // A client registers its instances together (`POST /v1/registrations`, `chunk` at a
        // time), and between chunks renews what it has registered so far whenever its slot
        // comes (a slow registration must not let the first expire).
        let mut next_beat = Instant::now() + interval;
        for first in (0..per).step_by(chunk as usize) {
            let last = (first + chunk).min(per) - 1;
            let entries: Vec<_> = (first..=last)
                .map(|j| {
                    json!({"service": svc, "instance_id": format!("c{c}-i{j}"), "address": "10.20.30.40",
                           "port": 8080, "zone": "zone-a", "version": "1.4.2"})
                })
                .collect();
            let body = json!({ "instances": entries }).to_string();
            if let Err(e) = conn.post_json("/v1/registrations", body.as_bytes()).await {
                errors.add(format!("register: {e}"));
                return Vec::new();
            }
            if *stop.borrow() {
                return Vec::new();
            }
            if Instant::now() >= next_beat && last + 1 < per {
                next_beat = Instant::now() + interval;
                let partial = json!({ "instances": (0..=last).map(item).collect::<Vec<_>>() }).to_string();
                if let Err(e) = conn.post_json("/v1/heartbeats", partial.as_bytes()).await {
                    errors.add(format!("heartbeat while registering: {e}"));
                }
            }
        }
    }
    conn.shrink(512);
    seeded.fetch_add(1, Ordering::Relaxed);
    let body = json!({ "instances": (0..per).map(item).collect::<Vec<_>>() }).to_string().into_bytes();
    let mut out = Vec::new();
    loop {
        let t = Instant::now();
        match tokio::time::timeout(Duration::from_secs(30), conn.post_json("/v1/heartbeats", &body)).await {
            Ok(Ok(())) => match renewed(conn.answer()) {
                Some(n) if n == per => out.push((
                    u64::try_from(t.duration_since(base).as_nanos()).unwrap_or(u64::MAX),
                    u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX),
                )),
                n => errors.add(format!("renewed {n:?} of {per}")),
            },
            Ok(Err(e)) => errors.add(format!("heartbeat: {e}")),
            Err(_) => errors.add("heartbeat: no answer within 30 s".into()),
        }
        // The next slot of this client's phase after now.
        let since = base.elapsed().saturating_sub(offset);
        let k = since.as_nanos() / interval.as_nanos().max(1) + 1;
        let next = base + offset + interval * u32::try_from(k).unwrap_or(u32::MAX);
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        if *stop.borrow() {
            break;
        }
    }
    out
}

/// The lease part of `scale`.
async fn leases(ctx: &mut Ctx) -> anyhow::Result<()> {
    let o = ctx.opts.clone();
    let clients = o.scale_clients.clamp(1, CLIENTS_MAX);
    let per = o.scale_leases.div_ceil(clients).clamp(1, tandem::registry::HEARTBEAT_BATCH_MAX as u64);
    let leases = per * clients;
    let interval = Duration::from_millis(o.scale_interval_ms.clamp(500, 60_000));
    let per_address = o.scale_per_address.clamp(1, 1_024);
    let nofile = raise_open_files(clients + 4_096);
    anyhow::ensure!(
        nofile >= clients + 1_024,
        "scale: {clients} clients need an open-files limit of at least {} (have {nofile}; raise ulimit -n)",
        clients + 1_024
    );
    let extra = vec![
        "--scale-leases".to_string(),
        leases.to_string(),
        "--scale-interval-ms".into(),
        interval.as_millis().to_string(),
    ];
    let (child, addr) = spawn_probe_with(ctx, "serve-scale-probe", &extra).await?;
    let pid = child.id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_empty = rss_bytes(pid).unwrap_or(0);
    let metrics_url = format!("http://{addr}/metrics");
    let http = ctx.http.clone();
    let metrics = move || {
        let (http, url) = (http.clone(), metrics_url.clone());
        async move { http.get(url).send().await?.error_for_status()?.text().await }
    };
    let addr = Arc::new(addr);
    let base = Instant::now();
    let seeding = Arc::new(tokio::sync::Semaphore::new(SEEDING_CLIENTS));
    let chunk = o.scale_register_batch.clamp(1, tandem::registry::REGISTER_BATCH_MAX) as u64;
    let seeded = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Errors::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::with_capacity(clients as usize);
    for c in 0..clients {
        tasks.push(ctx.load.spawn(client(
            c,
            clients,
            per,
            addr.clone(),
            per_address,
            interval,
            base,
            seeding.clone(),
            seeded.clone(),
            errors.clone(),
            chunk,
            stop_rx.clone(),
        )));
    }
    // Seeding: bounded by --scale-seed-secs; stops early when registrations fail.
    let seed_deadline = base + Duration::from_secs_f64(o.scale_seed_secs.clamp(10.0, 3_600.0));
    let mut said = Instant::now();
    while seeded.load(Ordering::Relaxed) < clients && Instant::now() < seed_deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            println!(
                "# scale: {} of {clients} clients registered after {:.0} s (node RSS {:.0} MiB)",
                seeded.load(Ordering::Relaxed),
                base.elapsed().as_secs_f64(),
                rss_bytes(pid).unwrap_or(0) as f64 / 1048576.0
            );
        }
        if errors.count.load(Ordering::Relaxed) > ERRORS_MAX {
            break;
        }
    }
    let stopped = if seeded.load(Ordering::Relaxed) >= clients {
        String::new()
    } else if errors.count.load(Ordering::Relaxed) > ERRORS_MAX {
        format!(" (seeding stopped after more than {ERRORS_MAX} errors)")
    } else {
        format!(" (seeding stopped at --scale-seed-secs {})", o.scale_seed_secs)
    };
    let seed_s = base.elapsed().as_secs_f64();
    let seeded_n = seeded.load(Ordering::Relaxed);
    // One interval so that every client has renewed at least once on its phase.
    tokio::time::sleep(interval).await;
    let m0 = metrics().await?;
    let cpu0 = process_cpu(pid).unwrap_or_default();
    let lg0 = crate::sys::CpuSplit::now();
    let w0 = base.elapsed();
    let window = (interval * 3).max(ctx.step());
    // Registrations meanwhile: open loop at --scale-register-rate over 8 raw connections
    // from 127.0.0.1, ephemeral with a TTL that outlives the run (they never heartbeat).
    let rconns: Arc<Vec<tokio::sync::Mutex<RawConn>>> =
        Arc::new((0..8).map(|_| tokio::sync::Mutex::new(RawConn::new(&addr))).collect());
    let reg_rate = o.scale_register_rate.clamp(1.0, 5_000.0);
    let reg = ctx
        .on_load(open_loop(reg_rate, window, 8, 1_024, cpu_now, move |w, i| {
            let rconns = rconns.clone();
            async move {
                let body = json!({"service": "scale-probe", "instance_id": format!("r{i}"), "address": "10.20.30.40",
                                  "port": 8080, "zone": "zone-a", "version": "1.4.2", "ttl_ms": 3_600_000})
                .to_string();
                rconns[w].lock().await.post_json("/v1/register", body.as_bytes()).await
            }
        }))
        .await?;
    let w1 = base.elapsed();
    let cpu1 = process_cpu(pid).unwrap_or_default();
    let lg = crate::sys::CpuSplit::now().since(lg0);
    let m1 = metrics().await?;
    let rss = rss_bytes(pid).unwrap_or(0);
    let own_rss = rss_bytes(std::process::id()).unwrap_or(0);
    let _ = stop_tx.send(true);
    let mut beats = Lat::default();
    let mut sent_in_window = 0u64;
    let join_deadline = Instant::now() + Duration::from_secs(60);
    for t in tasks {
        let left = join_deadline.saturating_duration_since(Instant::now());
        if let Ok(Ok(v)) = tokio::time::timeout(left, t).await {
            for (at, us) in v {
                let at = Duration::from_nanos(at);
                if at >= w0 && at < w1 {
                    sent_in_window += 1;
                    beats.push(Duration::from_micros(u64::from(us)));
                }
            }
        }
    }
    let beats = beats.finish();
    drop(child);
    let d = |name: &str| sample(&m1, name) - sample(&m0, name);
    let secs = (w1 - w0).as_secs_f64();
    let renewed_n = d("tandem_heartbeats_total");
    let server = (cpu1.saturating_sub(cpu0)).as_secs_f64();
    let us_per_hb = 1e6 * server / renewed_n.max(1.0);
    let checks = d("tandem_lease_checks_total");
    let check_mean = d("tandem_lease_check_microseconds_total") / checks.max(1.0);
    let check_max = sample(&m1, "tandem_lease_check_microseconds_max");
    ctx.report.table(
        "scale: ephemeral leases renewed by many clients, one POST /v1/heartbeats per client per interval (separate node process)",
        &[
            "leases (clients x instances)",
            "connections (source addresses)",
            "heartbeats/s (requests/s)",
            "request latency ms p50 / p99 / p999 / max",
            "server CPU us per heartbeat (per request)",
            "CPU cores server / load",
            "RSS MiB (B per lease)",
            "lease check us per tick: mean / max",
            "register latency ms p50 / p99 / max (rate)",
            "errors",
        ],
    );
    ctx.report.row(vec![
        format!(
            "{} ({} x {per}){}",
            rate(leases as f64),
            rate(clients as f64),
            if seeded_n < clients {
                format!(", only {} clients registered{stopped}", rate(seeded_n as f64))
            } else {
                String::new()
            }
        ),
        format!("{} ({} addresses from 127.0.0.2)", rate(clients as f64), clients.div_ceil(per_address)),
        format!("{} ({})", rate(renewed_n / secs), rate(sent_in_window as f64 / secs)),
        beats.summary(),
        format!("{us_per_hb:.2} ({:.0})", 1e6 * server / (sent_in_window.max(1) as f64)),
        format!("{:.2} / {:.2}", server / secs, lg.load.as_secs_f64() / secs),
        format!("{:.0} ({:.0})", rss as f64 / 1048576.0, rss as f64 / leases as f64),
        format!("{check_mean:.0} / {check_max:.0}"),
        format!(
            "{} / {} / {} ({}/s)",
            ms(reg.lat.q_ms(0.5)),
            ms(reg.lat.q_ms(0.99)),
            ms(reg.lat.max_ms()),
            rate(reg_rate)
        ),
        format!(
            "{}{}",
            errors.count.load(Ordering::Relaxed) + reg.errors,
            errors
                .first
                .lock()
                .as_ref()
                .or(reg.first_error.as_ref())
                .map(|e| format!(" first: {}", e.chars().take(80).collect::<String>()))
                .unwrap_or_default()
        ),
    ]);
    ctx.report.note(format!(
        "seeding: each client registered its {per} instances over its own connection, {chunk} per POST \
         /v1/registrations ({SEEDING_CLIENTS} clients at a time; a client renews what it has registered so far when its slot comes), then renewed them all every {} \
         ms on its own phase; {} of the clients registered after {seed_s:.0} s; measured over \
         {secs:.1} s starting one interval later; {} lease checks in the window ({} ms apart), the max is since the \
         node started (seeding included); {} expirations, {} health events, {} disk writes in the window (the \
         registrations made meanwhile are durable writes)",
        interval.as_millis(),
        rate(seeded_n as f64),
        rate(checks),
        200,
        d("tandem_lease_expirations_total"),
        d("tandem_health_events_total"),
        d("tandem_disk_writes_total"),
    ));
    let trims = sample(&m1, "tandem_heap_trims_total");
    ctx.report.note(format!(
        "heap trims by the node (freed heap handed back to the OS: after a burst of closed connections, and every \
         minute): {} in the window, {} since the node started, {:.1} MiB of RSS given back in all, {:.1} ms per trim \
         on average",
        d("tandem_heap_trims_total"),
        trims,
        sample(&m1, "tandem_heap_trim_released_bytes_total") / 1048576.0,
        1e3 * sample(&m1, "tandem_heap_trim_seconds_total") / trims.max(1.0),
    ));
    ctx.report.note(format!(
        "node: RSS {:.1} MiB empty; its config = the defaults (health timings; [http] connections_max 16,384 and \
         connections_per_address_max 1,024, which admit {} connections at {per_address} per address) except \
         [limits] namespace_instances_max raised past the leases and [http] header_read_timeout_ms (it also ends idle \
         keep-alive) at least three intervals; server CPU = the node process's CPU time; the load generator (one \
         core, raw HTTP/1.1 clients) held {:.0} MiB of RSS with {} connections and {} tasks",
        rss_empty as f64 / 1048576.0,
        rate(clients as f64),
        own_rss as f64 / 1048576.0,
        rate(clients as f64),
        rate(clients as f64)
    ));
    ctx.floors.scale = Some(ScaleFigures {
        leases,
        seeded_all: seeded_n == clients,
        rss_bytes: rss,
        server_us_per_heartbeat: us_per_hb,
        check_us_mean: check_mean,
        check_us_max: check_max,
        register_p99_ms: reg.lat.q_ms(0.99),
        heartbeat_p99_ms: beats.q_ms(0.99),
        big: None,
        list: None,
    });
    Ok(())
}

/// Discovery of one service with `--scale-instances` instances and the list of
/// `--scale-services` services, on an in-process node (like `discover`).
async fn discovery(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (big, services) = (ctx.opts.scale_instances.max(1), ctx.opts.scale_services.max(2));
    let dir = ctx.tempdir("tandem-bench-scale-discover")?;
    let mut cfg = bench_config(dir.path(), "dc-a");
    cfg.limits.services_max = cfg.limits.services_max.max(services);
    cfg.limits.namespace_services_max = cfg.limits.namespace_services_max.max(services);
    cfg.limits.namespace_instances_max = cfg.limits.namespace_instances_max.max(big + services);
    let node = ctx.start_node(cfg).await?;
    // The seeding's own time (each seeding then waits for the node to go idle).
    let a = seed(ctx, &node, big, true, |i| ("big".into(), format!("inst-{i}"))).await?;
    let b = seed(ctx, &node, services - 1, true, |i| (format!("list-{i}"), "inst-0".into())).await?;
    let seeded_s = (a.elapsed + b.elapsed).as_secs_f64();
    let base = format!("http://{}/v1", node.http_addr());
    let one = ctx
        .http
        .get(format!("{base}/services/default/big"))
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&one)?;
    let got = v["instances"].as_array().map_or(0, |a| a.len()) as u64;
    anyhow::ensure!(got == big, "discover answered {got} instances, expected {big}");
    let list = ctx.http.get(format!("{base}/services")).send().await?.error_for_status()?.bytes().await?;
    let v: serde_json::Value = serde_json::from_slice(&list)?;
    let listed = v["services"].as_array().map_or(0, |a| a.len()) as u64;
    anyhow::ensure!(listed == services, "the list holds {listed} services, expected {services}");
    ctx.report.table(
        "scale: discovery of one large service, and the list of every service, closed loop (in-process node)",
        &[
            "request",
            "concurrency",
            "queries/s",
            "latency ms p50 / p99 / p999 / max",
            "server CPU ms per query",
            "answer bytes",
            "CPU cores server / load",
            "errors",
        ],
    );
    let mut figs = Vec::new();
    for (label, url, conc, ops, bytes) in [
        (
            format!("GET /v1/services/default/big ({} instances)", rate(big as f64)),
            format!("{base}/services/default/big"),
            8usize,
            u64::MAX,
            one.len(),
        ),
        (
            format!("GET /v1/services ({} services)", rate(services as f64)),
            format!("{base}/services"),
            1,
            200,
            list.len(),
        ),
    ] {
        let (http, url) = (ctx.http.clone(), Arc::new(url));
        let run = ctx
            .on_load(closed_loop(conc, ctx.step(), ops, cpu_now, move |_| {
                let (http, url) = (http.clone(), url.clone());
                async move { check(http.get(url.as_str()).send().await).await }
            }))
            .await?;
        let cpu_ms = 1e3 * run.cpu.server.as_secs_f64() / run.ok.max(1) as f64;
        ctx.report.row(vec![
            label,
            conc.to_string(),
            rate(run.per_sec()),
            run.lat.summary(),
            format!("{cpu_ms:.2}"),
            rate(bytes as f64),
            format!("{:.2} / {:.2}", run.server_cores(), run.load_cores()),
            run.errors.to_string(),
        ]);
        figs.push((run.per_sec(), run.lat.q_ms(0.5), run.lat.q_ms(0.99), cpu_ms, bytes));
    }
    ctx.report.note(format!(
        "{} persistent instances seeded in {seeded_s:.1} s through Registry::register: one service of {} and {} \
         services of one; [limits] services_max, namespace_services_max and namespace_instances_max raised to fit \
         when the flags ask for more than the defaults (100,000 services); reqwest, HTTP/1.1 keep-alive",
        rate((big + services - 1) as f64),
        rate(big as f64),
        rate((services - 1) as f64)
    ));
    ctx.stop_node(node).await;
    let s = ctx.floors.scale.get_or_insert_with(Default::default);
    s.big = Some((big, figs[0].0, figs[0].2, figs[0].3, figs[0].4));
    s.list = Some((services, figs[1].1, figs[1].2, figs[1].4));
    Ok(())
}

/// Verdict rows of `scale` (issue 21) for the targets table.
pub fn target_rows(ctx: &mut Ctx) {
    let Some(s) = ctx.floors.scale.clone() else {
        ctx.report.row(vec![
            "issue 21: scale (1,000,000 leases, 10,000 clients)".into(),
            "-".into(),
            "not measured: run tandem-bench scale".into(),
        ]);
        return;
    };
    if s.leases > 0 {
        let gib = s.rss_bytes as f64 / (1u64 << 30) as f64;
        ctx.report.row(vec![
            format!("issue 21: {} ephemeral leases in <= 1 GiB of RSS", rate(s.leases as f64)),
            format!(
                "{:.2} GiB = {:.0} B per lease{}",
                gib,
                s.rss_bytes as f64 / s.leases as f64,
                if s.seeded_all { "" } else { " (not every client registered: see the scale table)" }
            ),
            format!(
                "{}{}",
                if s.seeded_all && gib <= 1.0 { "met" } else { "not met" },
                if s.leases < 1_000_000 {
                    " (fewer leases than the seeds' 1,000,000: --scale-leases 1000000)"
                } else {
                    ""
                }
            ),
        ]);
        ctx.report.row(vec![
            "issue 21: heartbeat CPU per instance, lease-check cost per tick, register latency at that scale".into(),
            format!(
                "{:.2} us of server CPU per renewed lease (batch request p99 {} ms); lease check {:.0} us per tick on \
                 average (longest {:.0} us); register p99 {} ms meanwhile",
                s.server_us_per_heartbeat,
                ms(s.heartbeat_p99_ms),
                s.check_us_mean,
                s.check_us_max,
                ms(s.register_p99_ms)
            ),
            "measured (no goal in issue 21)".into(),
        ]);
    }
    if let (Some((n, qps, p99, cpu, bytes)), Some((ln, lp50, lp99, lbytes))) = (s.big, s.list) {
        ctx.report.row(vec![
            "issue 21: discovery of one service with 5,000 instances; the list of 100,000 services".into(),
            format!(
                "{} instances: {} queries/s, p99 {} ms, {cpu:.2} ms of server CPU and {} bytes per answer; {} services \
                 listed in {} ms (p99 {} ms), {} bytes",
                rate(n as f64),
                rate(qps),
                ms(p99),
                rate(bytes as f64),
                rate(ln as f64),
                ms(lp50),
                ms(lp99),
                rate(lbytes as f64)
            ),
            "measured (no goal in issue 21)".into(),
        ]);
    }
}
