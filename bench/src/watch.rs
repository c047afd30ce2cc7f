//! Blocking-query benchmarks: `watch` (M4, fan-out of one service's changes to many
//! watchers) and `detect` (M5, from a provider's last heartbeat to watchers seeing it go).
//!
//! Both run the node as a separate process (`serve-probe`, pinned to the server's core):
//! 10,000 watchers need 10,000 client sockets and 10,000 server sockets, more than one
//! process may open here, and a separate process gives the server's CPU time directly.
//! Watchers use the real API, `GET /v1/services/{ns}/{svc}?index=N&wait=...`, one
//! HTTP/1.1 connection each, on the load runtime (one core). Every loop is bounded by a
//! deadline; every watcher task is aborted when its step ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::load::{ms, rate, Lat};
use crate::nodes::check;
use crate::peers::b64;
use crate::probe::spawn_probe;
use crate::sys::process_cpu;
use crate::{cpu_now, Ctx};

/// Most watchers a step opens (file descriptors: one socket per watcher in each process).
pub const WATCHERS_MAX: usize = 10_000;

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .timeout(Duration::from_secs(120))
        .build()?)
}

fn index_of(resp: &reqwest::Response) -> Option<u64> {
    resp.headers().get("x-tandem-index")?.to_str().ok()?.parse().ok()
}

async fn register(http: &reqwest::Client, addr: &str, body: Value) -> anyhow::Result<()> {
    check(http.post(format!("http://{addr}/v1/register")).json(&body).send().await)
        .await
        .map_err(|e| anyhow::anyhow!("register: {e}"))
}

/// What one watcher saw: (service index, when the whole answer had been read).
type Seen = Arc<Mutex<Vec<(u64, Instant)>>>;

/// One watcher of `watch`: a first plain query, then blocking queries back to back, each
/// from the index of the previous answer. Runs until aborted.
async fn watcher(
    http: reqwest::Client,
    url: Arc<String>,
    seen: Seen,
    ready: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let mut idx: Option<u64> = None;
    loop {
        let req = match idx {
            None => http.get(url.as_str()),
            Some(i) => http.get(format!("{url}?index={i}&wait=60s")),
        };
        let got = match req.send().await {
            Ok(resp) if resp.status().is_success() => {
                let g = index_of(&resp);
                match resp.bytes().await {
                    Ok(_) => g,
                    Err(_) => None,
                }
            }
            _ => None,
        };
        match got {
            Some(g) => {
                let t = Instant::now();
                if idx.is_none() {
                    ready.fetch_add(1, Ordering::Relaxed);
                }
                if idx.is_none_or(|i| g > i) {
                    seen.lock().push((g, t));
                }
                idx = Some(g);
            }
            None => {
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One watcher of `watch` in streaming mode: one `?stream=true` response, read line by
/// line; each line is a whole answer whose `index` is noted when its last byte arrived.
async fn stream_watcher(
    http: reqwest::Client,
    url: Arc<String>,
    seen: Seen,
    ready: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    loop {
        let Ok(mut resp) = http.get(format!("{url}?stream=true")).send().await else {
            errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut first = true;
        let mut buf: Vec<u8> = Vec::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let t = Instant::now();
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let Some(g) = top_level_index(&line) else { continue };
                if first {
                    ready.fetch_add(1, Ordering::Relaxed);
                    first = false;
                }
                let mut l = seen.lock();
                if l.last().is_none_or(|(i, _)| g > *i) {
                    l.push((g, t));
                }
            }
        }
        errors.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A streaming watcher on a raw TCP connection: sends `request` (a complete HTTP/1.1
/// request), then scans the response bytes as they arrive for `marker` followed by a
/// decimal number (tandem's `"index":N`, etcd's `"mod_revision":"N"`), noting each new
/// highest number with the time its read completed. No HTTP parsing beyond that: chunk
/// framing and headers never contain the marker. This keeps the load generator's cost per
/// delivery to one read and a scan, so that the figure is the server's, not the client's
/// HTTP stack's (reqwest costs about as much per delivery as the server). `ready_marker`
/// (seen once) counts the watcher as ready.
async fn raw_stream_watcher(
    addr: Arc<String>,
    request: Arc<Vec<u8>>,
    marker: &'static [u8],
    ready_marker: &'static [u8],
    seen: Seen,
    ready: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    loop {
        let Ok(mut conn) = tokio::net::TcpStream::connect(addr.as_str()).await else {
            errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let _ = conn.set_nodelay(true);
        if conn.write_all(&request).await.is_err() {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut is_ready = false;
        let find = memchr::memmem::Finder::new(marker);
        let find_ready = memchr::memmem::Finder::new(ready_marker);
        // Bytes kept from the previous read, so a marker split across reads is found.
        let keep = marker.len().max(ready_marker.len()) + 24;
        let mut buf = bytes::BytesMut::with_capacity(64 * 1024);
        loop {
            if buf.capacity() - buf.len() < 16 * 1024 {
                buf.reserve(16 * 1024);
            }
            match conn.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let t = Instant::now();
            if !is_ready && find_ready.find(&buf).is_some() {
                is_ready = true;
                ready.fetch_add(1, Ordering::Relaxed);
            }
            let mut best: Option<u64> = None;
            let mut at = 0;
            while let Some(p) = find.find(&buf[at..]) {
                let start = at + p + marker.len();
                let digits = buf[start..].iter().take_while(|b| b.is_ascii_digit()).count();
                if start + digits == buf.len() {
                    // The number may go on in the next read.
                    at += p;
                    break;
                }
                let v = buf[start..start + digits].iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
                best = Some(best.map_or(v, |b| b.max(v)));
                at = start + digits;
            }
            if let Some(g) = best {
                let mut l = seen.lock();
                if l.last().is_none_or(|(i, _)| g > *i) {
                    l.push((g, t));
                }
            }
            let cut = at.max(buf.len().saturating_sub(keep)).min(buf.len());
            let _ = buf.split_to(cut);
        }
        errors.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The answer's `index` (its first field after the names) without parsing the whole line.
fn top_level_index(line: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"index\":";
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits: Vec<u8> = line[at..].iter().copied().take_while(u8::is_ascii_digit).collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Watchers multiplexed on one HTTP/2 connection in the `StreamH2` row.
const H2_WATCHERS_PER_CONNECTION: usize = 100;

const ETCD_PREFIX: &str = "/services/watched/";
const ETCD_PREFIX_END: &str = "/services/watched0";

/// How the watchers of one `watch` row watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// tandem: blocking queries, one request per answer.
    Blocking,
    /// tandem: `?stream=true`, one long response, one HTTP/1.1 connection per watcher.
    Stream,
    /// tandem: `?stream=true` over HTTP/2 (prior knowledge), `H2_WATCHERS_PER_CONNECTION`
    /// watchers multiplexed on each connection, as an SDK multiplexes its watches.
    StreamH2,
    /// etcd 3.4: prefix watch through its JSON gateway.
    Etcd,
}

/// `watch` (M4): `--watchers` watchers of one service, a change to that service every
/// `--churn-ms` for two steps, and for each change the time from sending its write to the
/// last watcher having read it. Three rows: tandem's blocking queries, tandem's streaming
/// watch, and etcd's prefix watch on the same shape of data (when etcd is installed).
pub async fn watch(ctx: &mut Ctx) -> anyhow::Result<()> {
    ctx.report.table(
        "watch: fan-out of one service's changes to many watchers, with churn",
        &[
            "watch",
            "watchers",
            "changes (one every)",
            "change to last delivery ms p50 / p99 / max",
            "change to each delivery ms p50 / p99 / p999 / max",
            "deliveries (missed)",
            "server CPU-s per change",
            "CPU cores server / load",
            "errors",
        ],
    );
    let mut ramps = Vec::new();
    for mode in [Mode::Blocking, Mode::Stream, Mode::StreamH2] {
        let (p99, max, count, ramp) = fan_out(ctx, mode, None).await?;
        ramps.push(ramp);
        if count > 0 {
            let n = ctx.opts.watchers.clamp(1, WATCHERS_MAX);
            match mode {
                Mode::Stream => ctx.floors.watch = Some((n, p99, max, count)),
                Mode::StreamH2 => ctx.floors.watch_h2 = Some((n, p99, max, count)),
                _ => {}
            }
        }
    }
    match crate::peers::find_bin("etcd", &[]) {
        Some(bin) => match fan_out(ctx, Mode::Etcd, Some(&bin)).await {
            Ok((p99, _, count, ramp)) => {
                ramps.push(ramp);
                if count > 0 {
                    ctx.floors.etcd_watch_p99_ms = Some(p99);
                }
            }
            Err(e) => ctx.report.note(format!("etcd watch: failed: {e:#}")),
        },
        None => ctx.report.note("etcd watch: etcd not installed (bench/peers.sh); skipped".into()),
    }
    ctx.report.note(format!(
        "latency runs from sending the change's write (durable at both: tandem POST /v1/register, etcd put; \
         fsync included) to the moment a watcher had read that change: for tandem blocking queries the whole \
         answer at or past the change's index, for tandem streams the answer line at or past it, for etcd the \
         watch event line with that revision (etcd sends the changed key only; tandem sends the whole answer, \
         about 1 KB here). A watcher still busy with an earlier answer gets a later one, which counts. \
         Blocking queries use reqwest; the HTTP/1.1 streams (tandem's and etcd's) are read on raw TCP \
         connections, scanning for the index or revision, so the client's cost per delivery stays small; the \
         HTTP/2 row uses reqwest (HTTP/2 prior knowledge). Watchers ramped up in {} s; each server is a \
         separate process on CPU 0, the watchers share CPU 1",
        ramps.iter().map(|r| format!("{:.1}", r.as_secs_f64())).collect::<Vec<_>>().join(" / ")
    ));
    Ok(())
}

/// One row of `watch`. Returns (change to last delivery p99 ms, max ms, changes counted,
/// ramp-up time).
async fn fan_out(
    ctx: &mut Ctx,
    mode: Mode,
    etcd_bin: Option<&std::path::Path>,
) -> anyhow::Result<(f64, f64, usize, Duration)> {
    let n = ctx.opts.watchers.clamp(1, WATCHERS_MAX);
    let every = Duration::from_millis(ctx.opts.churn_ms.clamp(10, 10_000));
    let dur = ctx.step() * 2;
    let http = client()?;
    // The server: a tandem node process, or etcd.
    let (probe, etcd, base) = match (mode, etcd_bin) {
        (Mode::Etcd, Some(bin)) => {
            let (proc, url, dir) = crate::peers::start_etcd(ctx, bin).await?;
            (None, Some((proc, dir)), url)
        }
        (Mode::Etcd, None) => anyhow::bail!("etcd not installed"),
        _ => {
            let (probe, addr) = spawn_probe(ctx).await?;
            (Some(probe), None, addr)
        }
    };
    let server_pid = match (&probe, &etcd) {
        (Some(p), _) => p.id(),
        (None, Some((e, _))) => e.pid(),
        _ => anyhow::bail!("no server"),
    };
    // The service: four instances; the churn re-writes them with new weights.
    let churn_body = |k: u64| {
        json!({"service": "watched", "instance_id": format!("churn-{}", k % 4), "address": "10.20.30.40",
               "port": 8080, "zone": "zone-a", "version": "1.4.2", "persistent": true, "weight": k % 50 + 2})
    };
    // One write; returns the index (tandem) or revision (etcd) it produced.
    let write = {
        let (http, base) = (http.clone(), base.clone());
        move |k: u64| {
            let (http, base) = (http.clone(), base.clone());
            async move {
                if mode == Mode::Etcd {
                    let body = churn_body(k);
                    let key = format!("{ETCD_PREFIX}churn-{}", k % 4);
                    let put = json!({"key": b64(key.as_bytes()), "value": b64(body.to_string().as_bytes())});
                    let v: Value = http
                        .post(format!("{base}/v3/kv/put"))
                        .json(&put)
                        .send()
                        .await
                        .map_err(|e| anyhow::anyhow!("etcd put: {e}"))?
                        .json()
                        .await?;
                    v["header"]["revision"]
                        .as_str()
                        .and_then(|r| r.parse::<u64>().ok())
                        .ok_or_else(|| anyhow::anyhow!("etcd put without revision: {v}"))
                } else {
                    register(&http, &base, churn_body(k)).await?;
                    // Only this loop changes the service, so the index read now is the change's.
                    let r = http.get(format!("http://{base}/v1/services/default/watched")).send().await?;
                    index_of(&r).ok_or_else(|| anyhow::anyhow!("no index"))
                }
            }
        }
    };
    for k in 0..4 {
        write(k).await?;
    }
    let url = Arc::new(match mode {
        Mode::Etcd => base.clone(),
        _ => format!("http://{base}/v1/services/default/watched"),
    });
    let ready = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let logs: Vec<Seen> = (0..n).map(|_| Seen::default()).collect();
    // Ramp up in batches so that connection setup does not overflow the accept backlog.
    let ramp_start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    // Raw HTTP/1.1 streaming watchers (tandem and etcd): the server's address and the request.
    let raw_addr = Arc::new(base.trim_start_matches("http://").to_owned());
    let raw_request = Arc::new(match mode {
        Mode::Etcd => {
            let body = json!({"create_request": {"key": b64(ETCD_PREFIX.as_bytes()),
                                                 "range_end": b64(ETCD_PREFIX_END.as_bytes())}})
            .to_string();
            format!(
                "POST /v3/watch HTTP/1.1\r\nhost: {raw_addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
        _ => format!("GET /v1/services/default/watched?stream=true HTTP/1.1\r\nhost: {raw_addr}\r\n\r\n")
            .into_bytes(),
    });
    // HTTP/2: one client (one connection) per group of watchers.
    let h2: Vec<reqwest::Client> = if mode == Mode::StreamH2 {
        (0..n.div_ceil(H2_WATCHERS_PER_CONNECTION))
            .map(|_| {
                reqwest::Client::builder().http2_prior_knowledge().timeout(Duration::from_secs(120)).build()
            })
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    for (i, seen) in logs.iter().enumerate() {
        let (http, url, seen, ready, errors) =
            (http.clone(), url.clone(), seen.clone(), ready.clone(), errors.clone());
        tasks.push(match mode {
            Mode::Blocking => ctx.load.spawn(watcher(http, url, seen, ready, errors)),
            Mode::Stream => ctx.load.spawn(raw_stream_watcher(
                raw_addr.clone(),
                raw_request.clone(),
                b"\"index\":",
                b"\"index\":",
                seen,
                ready,
                errors,
            )),
            Mode::StreamH2 => {
                let http = h2[i / H2_WATCHERS_PER_CONNECTION].clone();
                ctx.load.spawn(stream_watcher(http, url, seen, ready, errors))
            }
            Mode::Etcd => ctx.load.spawn(raw_stream_watcher(
                raw_addr.clone(),
                raw_request.clone(),
                b"\"mod_revision\":\"",
                b"\"created\":true",
                seen,
                ready,
                errors,
            )),
        });
        if i % 250 == 249 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let ramp_deadline = Instant::now() + Duration::from_secs(60);
    while (ready.load(Ordering::Relaxed) as usize) < n && Instant::now() < ramp_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ramp = ramp_start.elapsed();
    let ready_n = ready.load(Ordering::Relaxed) as usize;
    // Let every watcher settle (blocking queries sent, streams past their first line).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let errors_before = errors.load(Ordering::Relaxed);
    let cpu0 = (process_cpu(server_pid).unwrap_or_default(), cpu_now());
    let measured_from = Instant::now();
    // Churn, on the load runtime.
    let churn = ctx
        .on_load(async move {
            let mut changes: Vec<(u64, Instant)> = Vec::new();
            let mut failures = 0u64;
            let start = Instant::now();
            let mut k = 4u64;
            while start.elapsed() < dur {
                let t = Instant::now();
                match write(k).await {
                    Ok(i) if changes.last().is_none_or(|(p, _)| i > *p) => changes.push((i, t)),
                    _ => failures += 1,
                }
                k += 1;
                tokio::time::sleep_until(tokio::time::Instant::from_std(start + every * (k - 4) as u32))
                    .await;
            }
            (changes, failures)
        })
        .await?;
    let (changes, churn_failures) = churn;
    // Give the last change up to 10 s to reach everyone, then stop the watchers.
    let last_idx = changes.last().map_or(0, |c| c.0);
    let grace = Instant::now() + Duration::from_secs(10);
    while Instant::now() < grace && !logs.iter().all(|l| l.lock().last().is_some_and(|(i, _)| *i >= last_idx))
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let server_cpu = process_cpu(server_pid).unwrap_or_default().saturating_sub(cpu0.0);
    let cpu = cpu_now().since(cpu0.1);
    let elapsed = measured_from.elapsed().max(Duration::from_millis(1));
    for t in &tasks {
        t.abort();
    }
    drop(probe);
    drop(etcd);
    let watch_errors = errors.load(Ordering::Relaxed) - errors_before;
    // For each change: when each watcher first held an answer at or past its index.
    let mut last = Lat::default();
    let mut each = Lat::default();
    let mut missed = 0u64;
    for (ci, ct) in &changes {
        let mut latest: Option<Duration> = None;
        let mut complete = true;
        for l in &logs {
            let l = l.lock();
            let pos = l.partition_point(|(i, _)| i < ci);
            match l.get(pos) {
                Some((_, t)) => {
                    let d = t.saturating_duration_since(*ct);
                    each.push(d);
                    latest = Some(latest.map_or(d, |x| x.max(d)));
                }
                None => {
                    missed += 1;
                    complete = false;
                }
            }
        }
        if let (true, Some(d)) = (complete, latest) {
            last.push(d);
        }
    }
    let (last, each) = (last.finish(), each.finish());
    ctx.report.row(vec![
        match mode {
            Mode::Blocking => "tandem blocking queries (?index=N&wait=60s)".into(),
            Mode::Stream => "tandem streaming watch (?stream=true), HTTP/1.1, a connection each".into(),
            Mode::StreamH2 => format!(
                "tandem streaming watch (?stream=true), HTTP/2, {H2_WATCHERS_PER_CONNECTION} watchers per connection"
            ),
            Mode::Etcd => "etcd prefix watch (JSON gateway /v3/watch)".into(),
        },
        format!("{} ({} ready)", rate(n as f64), rate(ready_n as f64)),
        format!("{} ({} ms)", changes.len(), every.as_millis()),
        format!("{} / {} / {}", ms(last.q_ms(0.5)), ms(last.q_ms(0.99)), ms(last.max_ms())),
        each.summary(),
        format!("{} ({missed})", rate(each.count() as f64)),
        format!("{:.3}", server_cpu.as_secs_f64() / changes.len().max(1) as f64),
        format!(
            "{:.2} / {:.2}",
            server_cpu.as_secs_f64() / elapsed.as_secs_f64(),
            cpu.load.as_secs_f64() / elapsed.as_secs_f64()
        ),
        format!("{watch_errors} watcher, {churn_failures} churn"),
    ]);
    Ok((last.q_ms(0.99), last.max_ms(), last.count(), ramp))
}

/// The provider TTL of `detect`.
pub const DETECT_TTL_MS: u64 = 3_000;

/// One watcher of `detect`: waits until `victim` is gone from the answer at `url` and
/// returns when it saw that. `Err` when the victim was not there to begin with.
async fn detect_watcher(
    http: reqwest::Client,
    url: String,
    victim: String,
    ready: Arc<AtomicU64>,
) -> Result<Instant, String> {
    let present = |v: &Value| {
        v["instances"].as_array().is_some_and(|a| a.iter().any(|i| i["instance_id"] == victim.as_str()))
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let resp = http.get(&url).send().await.map_err(|e| e.to_string())?;
    let mut idx = index_of(&resp).ok_or("no index")?;
    let v: Value = resp.json().await.map_err(|e| e.to_string())?;
    if !present(&v) {
        return Err("victim not in the first answer".into());
    }
    ready.fetch_add(1, Ordering::Relaxed);
    loop {
        let resp =
            http.get(format!("{url}{sep}index={idx}&wait=10s")).send().await.map_err(|e| e.to_string())?;
        idx = index_of(&resp).ok_or("no index")?;
        let v: Value = resp.json().await.map_err(|e| e.to_string())?;
        if !present(&v) {
            return Ok(Instant::now());
        }
    }
}

/// `detect` (M5): a provider registers with `ttl_ms` 3000, heartbeats every 500 ms, then
/// stops; watchers of the default answer (health policy) and of `dc=all` (every record,
/// whatever its health) measure the time from the last heartbeat to its disappearance.
pub async fn detect(ctx: &mut Ctx) -> anyhow::Result<()> {
    const ROUNDS: u64 = 3;
    const WATCHERS: usize = 50;
    let ttl = DETECT_TTL_MS;
    let (probe, addr) = spawn_probe(ctx).await?;
    let http = client()?;
    // Four persistent instances keep the service's healthy share above the protect
    // threshold, so an unhealthy provider is left out of the default answer.
    for k in 0..4 {
        register(
            &http,
            &addr,
            json!({"service": "detect", "instance_id": format!("stable-{k}"), "address": "10.20.30.40",
                   "port": 8080, "zone": "zone-a", "version": "1.4.2", "persistent": true}),
        )
        .await?;
    }
    let base = format!("http://{addr}/v1/services/default/detect");
    let kinds = [base.clone(), format!("{base}?dc=all")];
    let mut lats = [Lat::default(), Lat::default()];
    let mut missed = [0u64; 2];
    for round in 0..ROUNDS {
        let victim = format!("victim-{round}");
        register(
            &http,
            &addr,
            json!({"service": "detect", "instance_id": victim, "address": "10.20.30.41", "port": 8080,
                   "zone": "zone-a", "version": "1.4.2", "ttl_ms": ttl}),
        )
        .await?;
        let ready = Arc::new(AtomicU64::new(0));
        let mut tasks: Vec<(usize, tokio::task::JoinHandle<Result<Instant, String>>)> = Vec::new();
        for (kind, url) in kinds.iter().enumerate() {
            for _ in 0..WATCHERS {
                let w = detect_watcher(http.clone(), url.clone(), victim.clone(), ready.clone());
                tasks.push((kind, ctx.load.spawn(w)));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while (ready.load(Ordering::Relaxed) as usize) < tasks.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Heartbeats every ttl/6 (twice per suspect period), four of them; the last one's send
        // time starts the clock (the server renews the lease after that: conservative).
        let hb = format!("http://{addr}/v1/heartbeat/default/detect/{victim}");
        let mut last_hb = Instant::now();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(ttl / 6)).await;
            last_hb = Instant::now();
            check(http.put(&hb).send().await).await.map_err(|e| anyhow::anyhow!("heartbeat: {e}"))?;
        }
        let until = last_hb + Duration::from_millis(ttl + 5_000);
        for (kind, task) in tasks {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, task).await {
                Ok(Ok(Ok(t))) => lats[kind].push(t.saturating_duration_since(last_hb)),
                Ok(Ok(Err(_)) | Err(_)) => missed[kind] += 1,
                Err(_) => missed[kind] += 1,
            }
        }
    }
    drop(probe);
    let [policy, all] = lats.map(Lat::finish);
    let bound = (ttl + 1_000) as f64;
    ctx.report.table(
        &format!(
            "detect: a provider with ttl_ms {ttl} heartbeats every {} ms, then stops; blocking-query watchers",
            ttl / 6
        ),
        &[
            "answer watched",
            "watchers x rounds",
            "last heartbeat -> gone from the answer ms p50 / p99 / max",
            "TTL + 1 s ms",
            "missed",
        ],
    );
    for (label, lat, miss) in [
        ("default (health policy: an unhealthy instance is left out)", &policy, missed[0]),
        ("dc=all (every record: gone when the lease expires)", &all, missed[1]),
    ] {
        ctx.report.row(vec![
            label.into(),
            format!("{WATCHERS} x {ROUNDS}"),
            format!("{} / {} / {}", ms(lat.q_ms(0.5)), ms(lat.q_ms(0.99)), ms(lat.max_ms())),
            format!("{bound:.0}"),
            miss.to_string(),
        ]);
    }
    ctx.report.note(format!(
        "lease times from ttl_ms {ttl}: suspect after {} ms, unhealthy after {} ms, expired after {ttl} ms of \
         silence; the node checks leases every 200 ms (health.check_interval_ms); the clock starts when the \
         last heartbeat is sent; 4 persistent instances keep the healthy share above the protect threshold; \
         one lease, so self-preservation (>= 10 leases) never pauses expiry",
        ttl / 4,
        ttl / 2
    ));
    if all.count() > 0 {
        ctx.floors.detect = Some((
            ttl,
            policy.max_ms(),
            all.max_ms(),
            missed[0] + missed[1],
            (all.count() + policy.count()) as u64,
        ));
    }
    Ok(())
}
