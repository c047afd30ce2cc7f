//! `restart`: how long a node takes to start again on the data dir a busy spell left, and
//! how much WAL that start finds. One in-process node takes `--restart-registrations`
//! ephemeral registrations (through the registry, 256 at a time: the durable write path
//! minus HTTP) of at most `--restart-instances` instances (past that, each registration
//! changes the port of one already held, so the WAL grows and the view does not), after
//! one instance that came and went before the load, as in any running DC: its tombstone
//! is the only write of the tombstones' column family. The node is stopped at once, before
//! its idle flush could run, as a restart under load or a crash would find it, then started
//! again on the same dir (to the first `GET /v1/ready` answered 200), stopped, and started
//! a third time. The second start replays what the load left in the WAL; the third finds
//! the memtables RocksDB wrote out at the second, so their difference is the WAL's share.
//! With `--restart-cold` the page cache is dropped before each start (root only).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use tandem::config::Config;
use tandem::node::Node;

use crate::load::{closed_loop, ms, rate};
use crate::nodes::register_request;
use crate::{bench_config, cpu_now, Ctx};

/// Services the registrations are spread over.
const SERVICES: u64 = 1_000;
/// The most `--restart-instances` may ask for.
const INSTANCES_MAX: u64 = 1_000_000;
/// Longest a start may take before `/v1/ready` answers 200.
const READY_MAX: Duration = Duration::from_secs(120);

/// Starts the node on `cfg` and waits for its `/v1/ready`: (node, to started, to ready).
async fn start_timed(ctx: &Ctx, cfg: Config) -> anyhow::Result<(Node, Duration, Duration)> {
    if ctx.opts.restart_cold {
        std::fs::write("/proc/sys/vm/drop_caches", "3")
            .context("--restart-cold drops the page cache (root only)")?;
    }
    let t0 = Instant::now();
    let node = ctx.start_node(cfg).await?;
    let started = t0.elapsed();
    let url = format!("http://{}/v1/ready", node.http_addr());
    loop {
        if ctx.http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok((node, started, t0.elapsed()));
        }
        anyhow::ensure!(t0.elapsed() < READY_MAX, "the restarted node was not ready in {READY_MAX:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let count = ctx.opts.restart_registrations.max(1);
    let instances = ctx.opts.restart_instances.clamp(1, INSTANCES_MAX);
    let held = count.min(instances);
    let tmp = ctx.tempdir("tandem-bench-restart")?;
    let cfg = bench_config(tmp.path(), "dc-a");
    let data = cfg.data_dir.clone();
    ctx.report.table(
        &format!(
            "restart after {count} registrations of {held} instances, stopped at once{}",
            if ctx.opts.restart_cold { " (page cache dropped before each start)" } else { "" }
        ),
        &["start", "WAL it found", "node started ms", "GET /v1/ready 200 ms", "instances"],
    );
    let node = ctx.start_node(cfg.clone()).await?;
    let registry = node.shared.registry.clone();
    registry.register(register_request("svc-gone".into(), "gone".into(), false)).await?;
    registry.deregister("default", "svc-gone", "gone").await?;
    let run = ctx
        .on_load(closed_loop(256, Duration::from_secs(900), count, cpu_now, move |i| {
            let registry = registry.clone();
            async move {
                let n = i % instances;
                let mut req = register_request(format!("svc-{}", n % SERVICES), format!("r-{n}"), false);
                req.port = 8080 + (i / instances % 2) as u32;
                registry.register(req).await.map(|_| ()).map_err(|e| e.to_string())
            }
        }))
        .await?;
    anyhow::ensure!(run.ok == count, "registered {} of {count}: {:?}", run.ok, run.first_error);
    ctx.stop_node(node).await;
    ctx.report.note(format!(
        "{count} registrations in {:.1} s ({}/s) after one instance came and went, then the node stopped",
        run.elapsed.as_secs_f64(),
        rate(run.per_sec())
    ));
    for label in ["after the load", "again"] {
        let (wal, files) = tandem::store::wal_files(&data);
        let (node, started, ready) = start_timed(ctx, cfg.clone()).await.context("restart")?;
        let found = node.shared.registry.view().instance_count() as u64;
        ctx.stop_node(node).await;
        ctx.report.row(vec![
            label.into(),
            format!("{:.1} MiB in {files} files", wal as f64 / f64::from(1 << 20)),
            ms(started.as_secs_f64() * 1e3),
            ms(ready.as_secs_f64() * 1e3),
            found.to_string(),
        ]);
        anyhow::ensure!(found == held, "the restarted node holds {found} of {held} instances");
    }
    Ok(())
}
