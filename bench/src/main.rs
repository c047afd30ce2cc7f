//! `tandem-bench`: tandem's benchmarks, bounded in time, with the machine's floors and
//! (with `compare`) etcd and r-nacos measured in the same run.
//!
//! Layout of a run: the server side (tandem nodes, their committer and RocksDB threads)
//! runs on its own tokio runtime, pinned to CPU 0; the load generator runs on another,
//! pinned to CPU 1 (when the machine has two cores or more). CPU time is accounted per
//! thread group from /proc, so "server CPU-seconds per 1k operations" excludes the load
//! generator. Every output line names the build profile; the header names the machine, the
//! commit and the durability setting. See docs/benchmarks.md.
//!
//! Architecture invariants: every load loop is bounded (deadline, operation count,
//! in-flight cap); every server listens on loopback only; nothing here changes tandem's
//! behaviour (nodes are started through the public `Node::start` with a `Config`).

mod acl;
mod cluster;
mod floors;
mod httpfloor;
mod load;
mod nodes;
mod peers;
mod probe;
mod raft;
mod raw;
mod repl;
mod restart;
mod roll;
mod scale;
mod sys;
mod watch;
mod writefloor;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use tandem::config::Config;
use tandem::node::Node;

use crate::load::Report;
use crate::sys::{CpuSplit, LOAD_THREAD, PROFILE, SERVER_THREAD};

#[derive(Parser)]
#[command(
    name = "tandem-bench",
    about = "tandem benchmarks: register, heartbeat, discover, acl, watch, detect, replicate, floors, peers, raft, cluster, roll, restart"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    /// Every benchmark below, in order (floors first); peers when installed.
    All,
    /// Durable registrations over HTTP at several concurrencies, with registrations per fsync.
    Register,
    /// Heartbeats over HTTP on many leases, with the disk-write counter.
    Heartbeat,
    /// Discovery requests over HTTP on many services.
    Discover,
    /// The cost of token checks: register and discover with ACLs off and on, same run.
    Acl,
    /// Two DCs over QUIC + mutual TLS on loopback: throughput and lag, beside one raw quinn stream.
    Replicate,
    /// The machine's floors: fsync of the data disk, RocksDB synced batched writes, one quinn stream.
    Fsync,
    /// The same operations against etcd and r-nacos (when installed; see bench/peers.sh).
    Compare,
    /// Memory: RSS of a separate tandem node process before and after loading instances.
    Memory,
    /// Watch fan-out (M4): blocking queries on one service with background churn.
    Watch,
    /// Failure detection (M5): a provider with a short TTL stops; watchers see it go.
    Detect,
    /// The HTTP floor: a no-op handler on tandem's listener (HTTP/1.1 and HTTP/2), and
    /// GET /v1/ready of a node (register, heartbeat and discover run it first).
    HttpFloor,
    /// The seeds' sizes: 1,000,000 leases renewed by 10,000 clients over 10,000 connections
    /// (separate node process), discovery of a 5,000-instance service, the list of 100,000
    /// services. Not part of `all`; --scale-* flags for smaller runs.
    Scale,
    /// The per-DC Raft spike (issue 17, docs/cluster.md): three openraft members in this
    /// process on the Raft log store, entries of one committer round; with the disk floors.
    /// Not part of `all`.
    Raft,
    /// Durable register on a DC of three tandem nodes (a Raft group) against a 3-member
    /// etcd 3.4 cluster, all six processes pinned to CPU 0 (issue 17): registrations per
    /// Raft entry, fsyncs per node. Not part of `all`.
    Cluster,
    /// A rolling restart (SIGTERM, restart, catch-up; the leader last, after a hand-over)
    /// of a 3-node tandem DC and of a 3-member etcd 3.4, each under 32 clients of closed-loop
    /// writes: errors, retries, the longest gap without an acknowledged write, the roll's
    /// time. Not part of `all`.
    Roll,
    /// A restart on the data dir a busy spell left: `--restart-registrations` made, the node
    /// stopped before its idle flush, then started twice: the WAL each start found, the
    /// time to start and to the first ready answer. Not part of `all`.
    Restart,
    /// Internal: one member of `cluster`'s group in this process (prints its address,
    /// answers `stats` on stdin, stops on stdin EOF).
    #[command(hide = true)]
    ServeMember,
    /// Internal: runs one node in this process for `memory` (prints its address, stops on
    /// stdin EOF).
    #[command(hide = true)]
    ServeProbe,
    /// Internal: the node of `scale` (same protocol as serve-probe).
    #[command(hide = true)]
    ServeScaleProbe,
    /// Internal: the per-watcher write floor's writer (see writefloor.rs).
    #[command(hide = true)]
    ServeWriteFloor,
}

/// Options shared by every benchmark.
#[derive(Args, Clone, Debug)]
pub struct Opts {
    /// Seconds of load per step.
    #[arg(long, global = true, default_value_t = 5.0)]
    secs: f64,
    /// Directory for data dirs (RocksDB, fsync probe, peers' data); must be on the disk to measure.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Do not pin the server and the load generator to different cores.
    #[arg(long, global = true)]
    no_pin: bool,
    /// Skip the floors `register`, `heartbeat` and `discover` run first, and the floor slices
    /// `heartbeat` and `discover` alternate with their own (for a profile of the step alone:
    /// `perf record -- tandem-bench register --no-floors`); their "% of the floor" verdicts
    /// then read "not measured".
    #[arg(long, global = true)]
    no_floors: bool,
    /// Concurrency steps of `register` (closed loop).
    #[arg(long, global = true, value_delimiter = ',', default_value = "1,8,64,256")]
    concurrency: Vec<usize>,
    /// Leases held during `heartbeat` (M2's size).
    #[arg(long, global = true, default_value_t = 100_000)]
    leases: u64,
    /// Services and instances per service during `discover` (M3's size).
    #[arg(long, global = true, default_value_t = 10_000)]
    services: u64,
    #[arg(long, global = true, default_value_t = 10)]
    per_service: u64,
    /// Offered rates of `replicate`, events per second.
    #[arg(long, global = true, value_delimiter = ',', default_value = "1000,5000,10000")]
    rates: Vec<u64>,
    /// How long `replicate`'s catch-up step cuts the link (M7's 60 s).
    #[arg(long, global = true, default_value_t = 60.0)]
    partition_secs: f64,
    /// Watchers of `watch` (of one service), at most 10,000 (M4's size).
    #[arg(long, global = true, default_value_t = 10_000)]
    watchers: usize,
    /// Milliseconds between two changes of the watched service in `watch`.
    #[arg(long, global = true, default_value_t = 500)]
    churn_ms: u64,
    /// `raft`: writes (registrations) per entry, one row group each.
    #[arg(long, global = true, value_delimiter = ',', default_value = "41,1")]
    raft_writes: Vec<usize>,
    /// `raft`: bytes per write.
    #[arg(long, global = true, default_value_t = 200)]
    raft_write_bytes: usize,
    /// `raft`: concurrency steps (closed loop of client writes to the leader).
    #[arg(long, global = true, value_delimiter = ',', default_value = "1,8,64")]
    raft_concurrency: Vec<usize>,
    /// Also write the tables as markdown to this file.
    #[arg(long, global = true)]
    markdown: Option<PathBuf>,
    /// `scale`: ephemeral leases held (the seeds' 1,000,000).
    #[arg(long, global = true, default_value_t = 1_000_000)]
    scale_leases: u64,
    /// `scale`: simulated client processes, one connection and one batch per interval each
    /// (at most 60,000).
    #[arg(long, global = true, default_value_t = 10_000)]
    scale_clients: u64,
    /// `scale`: heartbeat interval of the clients, ms (the node's default 5,000; another
    /// value scales the node's health timings with it).
    #[arg(long, global = true, default_value_t = 5_000)]
    scale_interval_ms: u64,
    /// `scale`: client connections per source address (127.0.0.2 onwards).
    #[arg(long, global = true, default_value_t = 100)]
    scale_per_address: u64,
    /// `scale`: most instances a client registers per `POST /v1/registrations` (1 to 256).
    #[arg(long, global = true, default_value_t = 256)]
    scale_register_batch: usize,
    /// `scale`: registrations per second made while the leases are renewed (latency).
    #[arg(long, global = true, default_value_t = 50.0)]
    scale_register_rate: f64,
    /// `scale`: longest the clients may take to register everything, s.
    #[arg(long, global = true, default_value_t = 900.0)]
    scale_seed_secs: f64,
    /// `scale`: instances of the one large service discovered.
    #[arg(long, global = true, default_value_t = 5_000)]
    scale_instances: u64,
    /// `scale`: services listed by GET /v1/services.
    #[arg(long, global = true, default_value_t = 100_000)]
    scale_services: u64,
    /// `restart`: registrations made before the node is stopped and started again.
    #[arg(long, global = true, default_value_t = 400_000)]
    restart_registrations: u64,
    /// `restart`: instances the registrations are spread over (at most 1,000,000); past
    /// that many, each registration changes the port of an instance already held.
    #[arg(long, global = true, default_value_t = 100_000)]
    restart_instances: u64,
    /// `restart`: drop the page cache before each start (root only).
    #[arg(long, global = true)]
    restart_cold: bool,
    /// Internal (`serve-member`): this member's id.
    #[arg(long, global = true, hide = true, default_value_t = 0)]
    member_id: u64,
    /// Internal (`serve-member`): every member as `id=raft_addr=http_addr`, comma-separated.
    #[arg(long, global = true, hide = true, default_value = "")]
    members: String,
}

/// What every benchmark gets: the two runtimes, the options, the report, an HTTP client.
pub struct Ctx {
    pub srv: tokio::runtime::Handle,
    pub load: tokio::runtime::Handle,
    pub opts: Opts,
    pub report: Report,
    pub http: reqwest::Client,
    pub base_dir: PathBuf,
    /// Server and load generator are pinned to different cores (peers follow the server).
    pub pin: bool,
    /// Figures earlier steps measured, for the conditions and ratios of later ones.
    pub floors: Figures,
}

/// Figures kept across benchmarks of one run.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub fsync_p50_ms: Option<f64>,
    pub fsync_p99_ms: Option<f64>,
    pub quinn_frames_per_s: Option<f64>,
    pub register_best_per_s: Option<f64>,
    /// (concurrency, registrations/s, server CPU-s per 1k).
    pub register_by_conc: Vec<(usize, f64, f64)>,
    /// Batched registrations, 256 in flight: (registrations/s, entries per request).
    pub register_batched_256: Option<(f64, usize)>,
    pub heartbeats_per_server_cpu_s: Option<f64>,
    pub heartbeats_per_s: Option<f64>,
    /// Batched heartbeats (POST /v1/heartbeats): (per server CPU-s, per s, p99 ms of a
    /// request, entries per request, disk writes).
    pub heartbeats_batched: Option<(f64, f64, f64, usize, u64)>,
    pub discover_per_server_cpu_s: Option<f64>,
    pub discover_per_s: Option<f64>,
    /// Heartbeat and discover with the no-op floor alternated in their own step.
    pub heartbeat_paired: Option<crate::httpfloor::Paired>,
    pub discover_paired: Option<crate::httpfloor::Paired>,
    /// Discover against a floor answering as many bytes: (bytes, the paired figure).
    pub discover_paired_sized: Option<(usize, crate::httpfloor::Paired)>,
    pub repl_lag_p99_ms_at_10k: Option<f64>,
    pub register_half_p99_ms: Option<f64>,
    /// The committer's synced writes during that step: (p50, p99) ms.
    pub register_half_sync_ms: Option<(f64, f64)>,
    pub heartbeat_disk_writes: Option<u64>,
    pub heartbeat_p99_ms: Option<f64>,
    /// A separate tandem node process: (RSS before, RSS after, instances loaded).
    pub tandem_rss: Option<(u64, u64, u64)>,
    /// Its growth per instance over the second half of the load, B.
    pub tandem_rss_second_half: Option<f64>,
    /// Registrations per fsync: best over HTTP, and in-process (no HTTP).
    pub register_per_fsync_http: Option<f64>,
    pub register_per_fsync_direct: Option<f64>,
    /// (partition s, ingest /s, drain /s, reconnect s) of replicate's catch-up step.
    pub catch_up: Option<(f64, f64, f64, f64)>,
    /// `watch`, tandem's streaming watch: (watchers, change to last delivery p99 ms, max
    /// ms, changes).
    pub watch: Option<(usize, f64, f64, usize)>,
    /// `watch`, tandem's streaming watch over HTTP/2, watchers multiplexed.
    pub watch_h2: Option<(usize, f64, f64, usize)>,
    /// `watch` against etcd: change to last delivery p99 ms.
    pub etcd_watch_p99_ms: Option<f64>,
    /// `detect`: (TTL ms, max ms to leave the default answer, max ms to leave dc=all, missed, seen).
    pub detect: Option<(u64, f64, f64, u64, u64)>,
    /// RocksDB synced batches of 64 puts: puts per second (batches/s x 64).
    pub rocksdb_batch64_puts_per_s: Option<f64>,
    /// The no-op HTTP floor of this run.
    pub noop: Vec<httpfloor::FloorFigure>,
    /// GET /v1/ready at 64 connections: (requests/s, per server CPU-s).
    pub ready_at_64: Option<(f64, f64)>,
    /// The per-watcher write floor: (connections, change to last delivery p99 ms, CPU-s per change).
    pub write_floor: Option<(usize, f64, f64)>,
    /// `scale`.
    pub scale: Option<scale::ScaleFigures>,
}

impl Ctx {
    pub fn step(&self) -> Duration {
        Duration::from_secs_f64(self.opts.secs.clamp(0.5, 120.0))
    }

    /// Starts a node on the server runtime (so its committer and RocksDB threads inherit
    /// the server's CPU pinning).
    pub async fn start_node(&self, cfg: Config) -> anyhow::Result<Node> {
        self.srv.spawn(Node::start(cfg, None)).await.context("node start task")?
    }

    pub async fn stop_node(&self, node: Node) {
        let _ = self.srv.spawn(node.shutdown()).await;
    }

    /// Runs a future on the load runtime.
    pub async fn on_load<F>(&self, f: F) -> anyhow::Result<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.load.spawn(f).await.context("load task")
    }

    pub fn tempdir(&self, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&self.base_dir)
            .with_context(|| format!("cannot create a temp dir in {}", self.base_dir.display()))
    }
}

/// A node config for benchmarks: loopback, data on the bench disk, default durability.
///
/// Leases are long (suspect after 120 s, expiry after 300 s) so that a step's registrations
/// neither go suspect nor expire while the load runs: health events would add fsyncs that
/// are not the operation under test. Heartbeat handling is the same whatever the timings.
/// The load generator's HTTP client (HTTP/1.1 keep-alive, one connection per concurrent
/// request). Steps that measure a server's memory seed it through a client of their own
/// and drop it first, so that the server's per-connection buffers are not counted as
/// memory per instance.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the HTTP client")
}

pub fn bench_config(dir: &std::path::Path, dc: &str) -> Config {
    let mut c = Config::single(dc, dir.join(dc), "127.0.0.1:0".parse().expect("constant address"));
    c.health.heartbeat_interval_ms = 60_000;
    c.health.suspect_after_ms = 120_000;
    c.health.unhealthy_after_ms = 240_000;
    c.health.expire_after_ms = 300_000;
    c.protection.self_preservation_window_ms = 600_000;
    // The load generators open every connection from 127.0.0.1 (up to 10,000 watchers plus
    // the writers), far past the per-address default meant for one client host.
    c.http.connections_max = 65_536;
    c.http.connections_per_address_max = 65_536;
    c.http.watch_streams_per_address_max = c.http.watch_streams_max;
    c.http.blocking_queries_per_address_max = c.http.blocking_queries_max;
    // Blocking watchers wait up to their `wait`; pooled writer connections may sit idle
    // between steps: neither should be cut by the idle limits while a step measures.
    c.http.header_read_timeout_ms = 120_000;
    c.http.idle_timeout_ms = 600_000;
    // For experiments: TANDEM_BENCH_LINGER_US, TANDEM_BENCH_GAP_US and
    // TANDEM_BENCH_WRITE_BUFFER_MIB override the [store] settings of the same names.
    if let Some(us) = std::env::var("TANDEM_BENCH_LINGER_US").ok().and_then(|v| v.parse().ok()) {
        c.store.group_commit_linger_us = us;
        c.store.group_commit_gap_us = c.store.group_commit_gap_us.min(us.max(1));
    }
    if let Some(us) = std::env::var("TANDEM_BENCH_GAP_US").ok().and_then(|v| v.parse().ok()) {
        c.store.group_commit_gap_us = us;
    }
    if let Some(mib) = std::env::var("TANDEM_BENCH_WRITE_BUFFER_MIB").ok().and_then(|v| v.parse().ok()) {
        c.store.write_buffer_mib = mib;
    }
    c
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.cmd == Cmd::ServeProbe {
        return probe::serve_probe(cli.opts.data_dir.clone().unwrap_or_else(std::env::temp_dir));
    }
    if cli.cmd == Cmd::ServeScaleProbe {
        let base = cli.opts.data_dir.clone().unwrap_or_else(std::env::temp_dir);
        return scale::serve_probe(base, cli.opts.scale_leases, cli.opts.scale_interval_ms);
    }
    if cli.cmd == Cmd::ServeMember {
        let dir = cli.opts.data_dir.clone().unwrap_or_else(std::env::temp_dir);
        return cluster::serve_member(dir, cli.opts.member_id, &cli.opts.members);
    }
    if cli.cmd == Cmd::ServeWriteFloor {
        return writefloor::serve(cli.opts.watchers.clamp(1, watch::WATCHERS_MAX));
    }
    // Watchers, the write floor's connections and scale's clients each take a descriptor
    // (and the child processes inherit the limit).
    scale::raise_open_files(65_536);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = !cli.opts.no_pin && cores >= 2;
    // The node's runtime as `tandem` builds it, on one worker.
    let srv = tandem::node_runtime()
        .worker_threads(1)
        .thread_name(SERVER_THREAD)
        .on_thread_start(move || {
            if pin {
                sys::pin_current_thread(0);
            }
        })
        .build()?;
    let load = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(LOAD_THREAD)
        .on_thread_start(move || {
            if pin {
                sys::pin_current_thread(1);
            }
        })
        .enable_all()
        .build()?;
    let main_rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let base_dir = cli.opts.data_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base_dir).with_context(|| format!("cannot create {}", base_dir.display()))?;
    let http = http_client()?;
    let mut ctx = Ctx {
        srv: srv.handle().clone(),
        load: load.handle().clone(),
        opts: cli.opts.clone(),
        report: Report::default(),
        http,
        base_dir: base_dir.clone(),
        pin,
        floors: Figures::default(),
    };
    ctx.report.header(format!("machine: {}", sys::machine_line()));
    ctx.report.header(format!("commit {} | profile {PROFILE} ({})", sys::git_commit(), sys::BUILD));
    ctx.report.header(format!(
        "durability: every acknowledged write is a RocksDB WriteBatch with sync=true (WAL fsync), shared by concurrent writers; data dir on {} ({})",
        base_dir.display(),
        sys::disk_of(&base_dir)
    ));
    ctx.report.header(format!(
        "layout: server runtime 1 worker{}, load generator 1 worker{}; step {} s",
        if pin { " pinned to CPU 0 (with the committer and RocksDB threads)" } else { "" },
        if pin { " pinned to CPU 1" } else { "" },
        ctx.opts.secs
    ));
    let cmd = cli.cmd;
    let result = main_rt.block_on(async {
        // register is judged against the synced-batch floor: it runs the disk floors too.
        let floors = !ctx.opts.no_floors || matches!(cmd, Cmd::Fsync | Cmd::HttpFloor);
        if floors && matches!(cmd, Cmd::All | Cmd::Fsync | Cmd::Register | Cmd::Raft) {
            floors::run(&mut ctx).await?;
        }
        // The HTTP floor, in the same run as the rows it bounds.
        if floors && matches!(cmd, Cmd::All | Cmd::HttpFloor | Cmd::Register | Cmd::Heartbeat | Cmd::Discover)
        {
            httpfloor::run(&mut ctx).await?;
        }
        if matches!(cmd, Cmd::All | Cmd::Register) {
            nodes::register(&mut ctx).await?;
            httpfloor::register_notes(&mut ctx);
        }
        if matches!(cmd, Cmd::All | Cmd::Heartbeat) {
            nodes::heartbeat(&mut ctx).await?;
            httpfloor::heartbeat_notes(&mut ctx);
        }
        if matches!(cmd, Cmd::All | Cmd::Discover) {
            nodes::discover(&mut ctx).await?;
            httpfloor::discover_notes(&mut ctx);
        }
        if matches!(cmd, Cmd::All | Cmd::Acl) {
            acl::run(&mut ctx).await?;
        }
        if matches!(cmd, Cmd::All | Cmd::Memory) {
            probe::memory(&mut ctx).await?;
        }
        if matches!(cmd, Cmd::All | Cmd::Detect) {
            watch::detect(&mut ctx).await?;
        }
        if matches!(cmd, Cmd::All | Cmd::Watch) {
            watch::watch(&mut ctx).await?;
            writefloor::run(&mut ctx).await?;
        }
        if cmd == Cmd::Scale {
            scale::run(&mut ctx).await?;
        }
        if cmd == Cmd::Raft {
            raft::run(&mut ctx).await?;
        }
        if cmd == Cmd::Cluster {
            cluster::run(&mut ctx).await?;
        }
        if cmd == Cmd::Roll {
            roll::run(&mut ctx).await?;
        }
        if cmd == Cmd::Restart {
            restart::run(&mut ctx).await?;
        }
        if matches!(cmd, Cmd::All | Cmd::Replicate) {
            repl::run(&mut ctx).await?;
        }
        if matches!(cmd, Cmd::All | Cmd::Compare) {
            peers::run(&mut ctx).await?;
        } else if matches!(cmd, Cmd::Register | Cmd::Heartbeat | Cmd::Discover | Cmd::Watch | Cmd::Scale) {
            // compare judges everything in one table; a single step judges its own rows.
            ctx.report.table(
                "targets of issue 21, judged from this run",
                &["target", "figure in this run", "verdict"],
            );
            limit_rows(&mut ctx);
        }
        anyhow::Ok(())
    });
    if let Some(path) = &ctx.opts.markdown {
        std::fs::write(path, ctx.report.markdown())
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("\nmarkdown written to {}", path.display());
    }
    srv.shutdown_timeout(Duration::from_secs(5));
    load.shutdown_timeout(Duration::from_secs(5));
    result
}

/// The CPU split as a closure for the load loops.
pub fn cpu_now() -> CpuSplit {
    CpuSplit::now()
}

/// The verdict rows of issue 21 (floors and scale), for a targets table.
pub fn limit_rows(ctx: &mut Ctx) {
    httpfloor::target_rows(ctx);
    scale::target_rows(ctx);
}
