//! The benchmarks' separate node process (`serve-probe`, started by [`spawn_probe`] and
//! stopped when its [`Child`] drops), and the `memory` step that reads its RSS.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::load::{closed_loop, rate};
use crate::nodes::{check, hb_name, svc_name};
use crate::sys::rss_bytes;
use crate::{bench_config, cpu_now, Ctx};

/// `serve-probe`: one node in this process, for `memory`, `watch` and `detect`. Prints `http=ADDR`, then serves
/// until stdin closes (the parent's guard), at most 10 minutes.
pub fn serve_probe(base: std::path::PathBuf) -> anyhow::Result<()> {
    let rt = tandem::node_runtime().worker_threads(1).build()?;
    rt.block_on(async {
        let dir = tempfile::Builder::new().prefix("tandem-bench-memory").tempdir_in(&base)?;
        let node = tandem::node::Node::start(bench_config(dir.path(), "dc-a"), None).await?;
        serve_until_stdin_closes(node, Duration::from_secs(600)).await;
        anyhow::Ok(())
    })
}

/// The probe protocol's server side: prints `http=ADDR`, serves until stdin closes (the
/// parent's guard) or `limit` passes, then stops the node.
pub async fn serve_until_stdin_closes(node: tandem::node::Node, limit: Duration) {
    println!("http={}", node.http_addr());
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    let _ = tokio::time::timeout(limit, stdin_closed).await;
    node.shutdown().await;
}

/// A child process killed on drop.
pub struct Child(std::process::Child);

impl Child {
    pub fn new(c: std::process::Child) -> Child {
        Child(c)
    }
    pub fn id(&self) -> u32 {
        self.0.id()
    }
    pub fn stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.0.stdin.take()
    }
    pub fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.0.stdout.take()
    }
}

impl Drop for Child {
    /// Closes the child's stdin (it then stops its node and removes its data dir), waits up
    /// to 10 s for it, and kills it only if it is still running.
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve-probe` (one tandem node in a separate process of this binary, pinned to
/// the server's core like the in-process nodes) and returns it with its HTTP address.
pub async fn spawn_probe(ctx: &Ctx) -> anyhow::Result<(Child, String)> {
    spawn_probe_with(ctx, "serve-probe", &[]).await
}

/// [`spawn_probe`] with another hidden subcommand (`serve-scale-probe`) and extra arguments.
pub async fn spawn_probe_with(ctx: &Ctx, sub: &str, extra: &[String]) -> anyhow::Result<(Child, String)> {
    use std::io::BufRead as _;
    let exe = std::env::current_exe()?;
    // TANDEM_BENCH_PROBE_WRAP runs the probe under a profiler, e.g. "heaptrack -o /tmp/ht"
    // or "perf record -g -o /tmp/perf.data" (split on spaces).
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if ctx.pin {
        argv.extend(["taskset", "-c", "0"].map(Into::into));
    }
    if let Ok(wrap) = std::env::var("TANDEM_BENCH_PROBE_WRAP") {
        argv.extend(wrap.split_whitespace().map(Into::into));
    }
    argv.push(exe.into_os_string());
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.arg(sub)
        .args(extra)
        .arg("--data-dir")
        .arg(&ctx.base_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = Child(cmd.spawn()?);
    let stdout = child.0.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let line = tokio::task::spawn_blocking(move || {
        // A profiler wrapping the probe may print lines of its own first.
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        for _ in 0..16 {
            line.clear();
            if reader.read_line(&mut line)? == 0 || line.starts_with("http=") {
                break;
            }
        }
        std::io::Result::Ok(line)
    });
    let line = tokio::time::timeout(Duration::from_secs(30), line).await???;
    let addr = line
        .trim()
        .strip_prefix("http=")
        .ok_or_else(|| anyhow::anyhow!("serve-probe said {line:?}"))?
        .to_owned();
    Ok((child, addr))
}

/// `memory`: RSS of a separate tandem node process, empty and with `leases` ephemeral plus
/// `services x per_service` persistent instances (the same instance count the peers hold
/// in `compare`), loaded over HTTP in two halves. RSS is read empty, after each half, and
/// the second half's growth per instance is reported beside the whole growth per instance:
/// the cost of one more instance, without what any load costs once (code paged in for the
/// first time, per-thread allocator arenas, memtables' first blocks).
pub async fn memory(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (child, addr) = spawn_probe(ctx).await?;
    let pid = child.0.id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_bytes(pid).unwrap_or(0);
    let (leases, services, per) =
        (ctx.opts.leases.max(1), ctx.opts.services.max(1), ctx.opts.per_service.max(1));
    let total = leases + services * per;
    let url = Arc::new(format!("http://{addr}/v1/register"));
    let half = total / 2;
    let mut mid = before;
    for (from, count) in [(0, half), (half, total - half)] {
        load_memory_step(ctx, &url, from, count, leases, per).await?;
        if from == 0 {
            mid = rss_bytes(pid).unwrap_or(0);
        }
    }
    let after = rss_bytes(pid).unwrap_or(0);
    drop(child);
    let second = total - half;
    ctx.report.table(
        "memory: RSS of a separate tandem node process (same binary, serve-probe)",
        &[
            "instances",
            "RSS empty MiB",
            "RSS loaded MiB",
            "growth per instance B",
            "second half's growth per instance B",
            "whole RSS per instance B",
        ],
    );
    ctx.report.row(vec![
        format!(
            "{} ({} ephemeral + {} persistent)",
            rate(total as f64),
            rate(leases as f64),
            rate((services * per) as f64)
        ),
        format!("{:.1}", before as f64 / 1048576.0),
        format!("{:.1}", after as f64 / 1048576.0),
        format!("{:.0}", after.saturating_sub(before) as f64 / total as f64),
        format!("{:.0}", after.saturating_sub(mid) as f64 / second.max(1) as f64),
        format!("{:.0}", after as f64 / total as f64),
    ]);
    ctx.report.note(format!(
        "growth includes the in-memory view, leases, RocksDB memtables (the log, instance and index writes of \
         every registration; at most [store] write_buffer_mib per column family) and allocator slack; the data \
         is loaded in two halves, each by 256 connections that are closed before the RSS is read (the same for \
         r-nacos, loaded at once); the second half's growth leaves out what the first load cost once; {} build",
        crate::sys::PROFILE
    ));
    ctx.floors.tandem_rss = Some((before, after, total));
    ctx.floors.tandem_rss_second_half = Some(after.saturating_sub(mid) as f64 / second.max(1) as f64);
    Ok(())
}

/// Registers instances `from..from + count` of the `memory` step over 256 connections of
/// their own, closes them and waits for the node to settle before RSS is read.
async fn load_memory_step(
    ctx: &Ctx,
    url: &Arc<String>,
    from: u64,
    count: u64,
    leases: u64,
    per: u64,
) -> anyhow::Result<()> {
    let seed_http = crate::http_client()?;
    let (http, url) = (seed_http.clone(), url.clone());
    let run = ctx
        .on_load(closed_loop(256, Duration::from_secs(300), count, cpu_now, move |i| {
            let (http, url) = (http.clone(), url.clone());
            let i = from + i;
            async move {
                let body = if i < leases {
                    let (svc, id) = hb_name(i);
                    json!({"service": svc, "instance_id": id, "address": "10.20.30.40", "port": 8080,
                           "zone": "zone-a", "version": "1.4.2"})
                } else {
                    let (svc, id) = svc_name(per)(i - leases);
                    json!({"service": svc, "instance_id": id, "address": "10.20.30.40", "port": 8080,
                           "zone": "zone-a", "version": "1.4.2", "persistent": true})
                };
                check(http.post(url.as_str()).json(&body).send().await).await
            }
        }))
        .await?;
    anyhow::ensure!(run.ok == count, "memory: registered {} of {count}: {:?}", run.ok, run.first_error);
    // The seeding client's connections close first: their buffers are per connection.
    drop(seed_http);
    tokio::time::sleep(crate::sys::SETTLE_BEFORE_RSS).await;
    Ok(())
}
