//! `cluster`: durable register on a DC of three tandem nodes (a Raft group, docs/cluster.md)
//! against a 3-member etcd 3.4 cluster on the same machine, pinned alike (issue 17).
//!
//! Layout: the three tandem nodes are three processes of this binary (`serve-member`: one
//! node each, started through the public `Node::start` on a one-worker runtime, with the
//! `[cluster]` table `tandem certs --nodes 3` and `tandem dev` make), the three etcd
//! members three `etcd` processes with a static `--initial-cluster` on loopback. With
//! pinning (the default) all six start under `taskset -c 0`; one group runs at a time. The
//! load generator is this process's load runtime on CPU 1, with the same HTTP client and
//! the same requests as `register` and `compare`: tandem `POST /v1/register`, etcd a lease
//! grant and a put with that lease, both to the leader; one tandem row sends to a follower,
//! which forwards each write to the leader.
//!
//! Counted over each step:
//! - registrations per Raft entry: the leader's committer (one round of local writes is
//!   one Raft entry: `local_requests / local_fsyncs`, the `tandem_group_commit_*` counters);
//!   for etcd, registrations per proposal its leader committed (its `/metrics`);
//! - Raft entries applied per node and the synced state batches of each node's state
//!   machine (`StateMachineCounters`), read from each member over its stdin and stdout;
//!   for etcd, each member's WAL fsyncs by its own count (`/metrics`);
//! - fsyncs per node: `fsync` and `fdatasync` calls of each process, counted by `perf stat`
//!   on the syscall tracepoints (no ptrace; the tandem node's Raft log is not in its
//!   metrics), when perf is installed and allowed; otherwise the column says so.
//!
//! Every process started here is stopped when its guard drops; every loop is bounded.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use tandem::config::{ClusterSection, MemberSection};

use crate::load::{closed_loop, rate, Run};
use crate::nodes::{check, register_body};
use crate::peers::{
    etcd_member_args, etcd_ports, etcd_register_once, find_bin, free_tcp, ok_json, spawn, wait_ready, Proc,
};
use crate::probe::Child;
use crate::sys::{process_cpu, PROFILE};
use crate::{cpu_now, Ctx};

/// The DC of the tandem group.
pub(crate) const DC: &str = "dc-a";
/// Members of each group.
const MEMBERS: u64 = 3;
/// Concurrencies of the leader rows (those of `compare`'s etcd rows), and of the follower row.
const CONCURRENCY: [usize; 2] = [64, 256];
const FOLLOWER_CONCURRENCY: usize = 64;
/// Longest wait for a group to elect a leader that serves writes.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// Longest a member child serves: it stops by itself after this even if nobody closes its
/// stdin.
const MEMBER_LIFETIME: Duration = Duration::from_secs(1800);
/// Longest wait for a member's answer on its stdout.
const MEMBER_ANSWER: Duration = Duration::from_secs(10);
/// Time perf gets to attach before a step's counters are read.
const PERF_ATTACH: Duration = Duration::from_millis(300);

/// What a member child says of itself (`stats`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct MemberStats {
    pub serving: bool,
    pub leader: Option<u64>,
    /// The state machine: Raft entries applied and the synced batches that wrote them.
    pub entries_applied: u64,
    pub batches: u64,
    /// The committer: local appends made durable and the rounds (entries) that carried them.
    pub local_requests: u64,
    pub local_fsyncs: u64,
    /// Writes this node forwarded to the leader.
    pub forwarded: u64,
}

/// `serve-member`: one member of the group in this process. Prints `http=ADDR` once the
/// node runs, then answers each `stats` line on stdin with one JSON line; stops its node when
/// stdin closes (the parent's guard), on SIGTERM, or after [`MEMBER_LIFETIME`].
pub fn serve_member(dir: PathBuf, id: u64, members: &str) -> anyhow::Result<()> {
    let members = parse_members(members)?;
    let me = members.iter().find(|m| m.id == id).with_context(|| format!("member {id} is not listed"))?;
    let certs = dir.join("certs");
    let node = tandem_replicator::tls::NodeName::new(DC, id)?;
    let paths = tandem_replicator::tls::node_cert_paths(&certs, &node);
    let mut cfg = crate::bench_config(&dir.join(format!("n{id}")), DC);
    cfg.http_addr = me.http_addr;
    cfg.cluster = Some(ClusterSection::with_defaults(id, members.clone(), paths));
    let rt = tandem::node_runtime().worker_threads(1).build()?;
    rt.block_on(async {
        let node = tandem::node::Node::start(cfg, None).await?;
        println!("http={}", node.http_addr());
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(16);
        std::thread::Builder::new().name("member-stdin".into()).spawn(move || {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
                if tx.blocking_send(std::mem::take(&mut line)).is_err() {
                    break;
                }
            }
        })?;
        let deadline = tokio::time::Instant::now() + MEMBER_LIFETIME;
        // SIGTERM stops the node gracefully too (`roll` restarts members that way).
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        while let Ok(Some(cmd)) = tokio::select! {
            c = tokio::time::timeout_at(deadline, rx.recv()) => c,
            _ = term.recv() => Ok(None),
        } {
            if cmd.trim() != "stats" {
                continue;
            }
            let (group, shared) = (node.shared.group.clone(), &node.shared);
            let Some(group) = group else { anyhow::bail!("the node runs no group") };
            let (st, sm, cs) = (group.status(), group.sm.counters(), shared.committer.stats());
            let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            println!(
                "{}",
                json!({
                    "serving": st.serving_writes, "leader": st.leader,
                    "entries_applied": get(&sm.entries_applied), "batches": get(&sm.batches),
                    "local_requests": cs.local_requests, "local_fsyncs": cs.local_fsyncs,
                    "forwarded": get(&shared.forward_stats.forwarded),
                })
            );
        }
        node.shutdown().await;
        anyhow::Ok(())
    })
}

/// `id=raft_addr=http_addr,...`, as [`members_arg`] writes it.
pub fn parse_members(s: &str) -> anyhow::Result<Vec<MemberSection>> {
    s.split(',')
        .filter(|m| !m.is_empty())
        .map(|m| {
            let mut parts = m.split('=');
            let (Some(id), Some(raft), Some(http), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                anyhow::bail!("member {m:?} is not id=raft_addr=http_addr");
            };
            Ok(MemberSection { id: id.parse()?, raft_addr: raft.parse()?, http_addr: http.parse()? })
        })
        .collect()
}

/// The `--members` argument of `serve-member`.
pub fn members_arg(members: &[MemberSection]) -> String {
    members.iter().map(|m| format!("{}={}={}", m.id, m.raft_addr, m.http_addr)).collect::<Vec<_>>().join(",")
}

/// A member child and its pipes. The pipes drop first (fields drop in order): the child
/// sees its stdin close, stops its node and exits; [`Child`] kills it if it does not.
struct Member {
    id: u64,
    http: SocketAddr,
    io: Arc<Mutex<(ChildStdin, BufReader<ChildStdout>)>>,
    child: Child,
}

impl Member {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn stats(&self) -> anyhow::Result<MemberStats> {
        let io = self.io.clone();
        let line = tokio::task::spawn_blocking(move || {
            let mut io = io.lock();
            writeln!(io.0, "stats")?;
            io.0.flush()?;
            let mut line = String::new();
            io.1.read_line(&mut line)?;
            std::io::Result::Ok(line)
        });
        let line = tokio::time::timeout(MEMBER_ANSWER, line).await.context("member did not answer")???;
        serde_json::from_str(&line).with_context(|| format!("member {} said {line:?}", self.id))
    }
}

/// The members of a bench's tandem group on loopback, with their certificates in
/// `dir/certs` (as `tandem certs --nodes 3` makes them).
pub(crate) fn group_members(dir: &Path) -> anyhow::Result<Vec<MemberSection>> {
    let certs = dir.join("certs");
    tandem_replicator::tls::generate_dev_pki(&certs, &[DC], false).context("cannot create the CA")?;
    let ids: Vec<u64> = (1..=MEMBERS).collect();
    tandem_replicator::tls::generate_dev_node_certs(&certs, DC, &ids, false)
        .context("cannot create the node certificates")?;
    ids.iter()
        .map(|id| {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
            let http = SocketAddr::from(([127, 0, 0, 1], free_tcp()?));
            anyhow::Ok(MemberSection { id: *id, raft_addr: udp, http_addr: http })
        })
        .collect()
}

/// Starts the three members (certificates as `tandem certs --nodes 3` makes them) and
/// waits for each to serve HTTP.
async fn start_group(ctx: &Ctx, dir: &Path) -> anyhow::Result<Vec<Member>> {
    let members = group_members(dir)?;
    let arg = members_arg(&members);
    let exe = std::env::current_exe()?;
    let mut started = Vec::new();
    for m in &members {
        let mut cmd = if ctx.pin {
            let mut c = Command::new("taskset");
            c.args(["-c", "0"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let log = std::fs::File::create(dir.join(format!("member-{}.log", m.id)))?;
        cmd.arg("serve-member")
            .arg("--data-dir")
            .arg(dir)
            .arg("--member-id")
            .arg(m.id.to_string())
            .arg("--members")
            .arg(&arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = Child::new(cmd.spawn().context("cannot start a member")?);
        let (stdin, stdout) = (child.stdin(), child.stdout());
        println!("# started tandem member {} (pid {}), data in {}", m.id, child.id(), dir.display());
        started.push((m.id, m.http_addr, child, stdin, stdout));
    }
    let mut out = Vec::new();
    for (id, http, child, stdin, stdout) in started {
        let (stdin, stdout) = (stdin.context("no stdin")?, stdout.context("no stdout")?);
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            reader.read_line(&mut line)?;
            std::io::Result::Ok((reader, line))
        });
        let (reader, line) = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .with_context(|| format!("member {id} did not start within 60 s"))???;
        anyhow::ensure!(
            line.trim() == format!("http={http}"),
            "member {id} said {line:?} (its log: {})",
            dir.join(format!("member-{id}.log")).display()
        );
        out.push(Member { id, http, io: Arc::new(Mutex::new((stdin, reader))), child });
    }
    Ok(out)
}

/// Waits until one member serves writes and every member follows it; returns its index.
async fn wait_leader(members: &[Member]) -> anyhow::Result<usize> {
    let deadline = Instant::now() + LEADER_WAIT;
    loop {
        let mut stats = Vec::new();
        for m in members {
            stats.push(m.stats().await?);
        }
        if let Some(i) = stats.iter().position(|s| s.serving) {
            let id = members[i].id;
            if stats.iter().all(|s| s.leader == Some(id)) {
                return Ok(i);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no member served writes within {LEADER_WAIT:?}: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `perf stat` counting one process's `fsync` and `fdatasync` calls (every thread, those
/// started later included) until [`PerfCount::finish`]; killed on drop.
struct PerfCount {
    child: Option<std::process::Child>,
    out: PathBuf,
}

impl PerfCount {
    const EVENTS: &'static str = "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync";

    /// Whether perf can count the syscall tracepoints here (installed, allowed).
    fn usable(perf: &Path, dir: &Path) -> bool {
        let out = dir.join("perf-probe.csv");
        let ok = Command::new(perf)
            .args(["stat", "-x,", "-o"])
            .arg(&out)
            .args(["-e", Self::EVENTS, "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok && parse_perf(&std::fs::read_to_string(&out).unwrap_or_default()).is_some()
    }

    fn start(perf: &Path, pid: u32, out: PathBuf) -> anyhow::Result<PerfCount> {
        let child = Command::new(perf)
            .args(["stat", "-x,", "-o"])
            .arg(&out)
            .args(["-e", Self::EVENTS, "-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start perf")?;
        Ok(PerfCount { child: Some(child), out })
    }

    /// Stops counting (SIGINT: perf writes its counts) and returns the calls counted.
    fn finish(mut self) -> Option<u64> {
        let mut child = self.child.take()?;
        crate::sys::interrupt(child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return parse_perf(&std::fs::read_to_string(&self.out).ok()?);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for PerfCount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The sum of the counts of `perf stat -x,` output (None when an event was not counted).
pub fn parse_perf(text: &str) -> Option<u64> {
    let mut sum = 0u64;
    let mut events = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let count = line.split(',').next()?;
        sum += count.trim().parse::<u64>().ok()?;
        events += 1;
    }
    (events > 0).then_some(sum)
}

/// One node's counters at one moment, whatever the system.
#[derive(Clone, Debug, Default)]
struct NodeCounters {
    leader: bool,
    /// Raft entries applied (tandem) or proposals committed (etcd).
    entries: u64,
    /// Synced state batches (tandem) or WAL fsyncs (etcd), by the node's own count.
    own_syncs: u64,
    /// tandem's leader: registrations made durable and the entries that carried them.
    requests: u64,
    rounds: u64,
    forwarded: u64,
}

/// A 3-member etcd cluster: its processes (killed on drop) and client URLs.
struct EtcdCluster {
    procs: Vec<Proc>,
    clients: Vec<String>,
    _dir: tempfile::TempDir,
}

/// Starts three etcd members on loopback (static initial cluster, WAL fsync on, default
/// settings otherwise), pinned like tandem's members, and waits until each is healthy.
async fn start_etcd_cluster(ctx: &Ctx, bin: &Path) -> anyhow::Result<EtcdCluster> {
    let dir = ctx.tempdir("tandem-bench-etcd-cluster")?;
    let ports = etcd_ports()?;
    let (mut procs, mut clients) = (Vec::new(), Vec::new());
    for k in 0..ports.len() {
        let token = format!("tandem-bench-{}", std::process::id());
        let (client, args) = etcd_member_args(&ports, k, dir.path(), &token);
        let log = dir.path().join(format!("m{}.log", k + 1));
        procs.push(spawn(ctx, "etcd member", bin, &args, &[], &log)?);
        clients.push(client);
    }
    for c in &clients {
        wait_ready(&ctx.http, &format!("{c}/health"), Duration::from_secs(30)).await?;
    }
    Ok(EtcdCluster { procs, clients, _dir: dir })
}

/// A number of etcd's Prometheus text (a metric without labels).
fn prom_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl EtcdCluster {
    /// Whether member `k` leads (`/v3/maintenance/status`: its id is the leader's).
    async fn leads(&self, http: &reqwest::Client, k: usize) -> anyhow::Result<bool> {
        let url = format!("{}/v3/maintenance/status", self.clients[k]);
        let v = ok_json(http.post(url).json(&json!({})).send().await).await.map_err(anyhow::Error::msg)?;
        let (me, leader) = (&v["header"]["member_id"], &v["leader"]);
        Ok(!leader.is_null() && me == leader)
    }

    async fn leader(&self, http: &reqwest::Client) -> anyhow::Result<usize> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            for k in 0..self.clients.len() {
                if self.leads(http, k).await? {
                    return Ok(k);
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "etcd elected no leader within {LEADER_WAIT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn counters(&self, http: &reqwest::Client, leader: usize) -> anyhow::Result<Vec<NodeCounters>> {
        let mut out = Vec::new();
        for (k, c) in self.clients.iter().enumerate() {
            let text = http.get(format!("{c}/metrics")).send().await?.error_for_status()?.text().await?;
            let get = |name: &str| prom_value(&text, name).map_or(0, |v| v as u64);
            out.push(NodeCounters {
                leader: k == leader,
                entries: get("etcd_server_proposals_committed_total"),
                own_syncs: get("etcd_disk_wal_fsync_duration_seconds_count"),
                ..Default::default()
            });
        }
        Ok(out)
    }
}

async fn tandem_counters(members: &[Member]) -> anyhow::Result<Vec<NodeCounters>> {
    let mut out = Vec::new();
    for m in members {
        let s = m.stats().await?;
        out.push(NodeCounters {
            leader: s.serving,
            entries: s.entries_applied,
            own_syncs: s.batches,
            requests: s.local_requests,
            rounds: s.local_fsyncs,
            forwarded: s.forwarded,
        });
    }
    Ok(out)
}

/// What one step measured.
struct Step {
    run: Run,
    /// CPU of the three server processes together.
    server_cpu: Duration,
    /// Per node (the leader first): counter deltas over the step, and its fsync calls.
    nodes: Vec<(NodeCounters, Option<u64>)>,
}

/// One closed-loop step against one group: perf attached to every member, the counters
/// and CPU read just before and just after the load.
async fn step<F, Fut, C, CFut>(
    ctx: &Ctx,
    pids: &[u32],
    perf: Option<&Path>,
    conc: usize,
    op: F,
    counters: C,
) -> anyhow::Result<Step>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = crate::load::OpResult> + Send + 'static,
    C: Fn() -> CFut,
    CFut: std::future::Future<Output = anyhow::Result<Vec<NodeCounters>>>,
{
    let perfs = match perf {
        Some(perf) => {
            let dir = ctx.tempdir("tandem-bench-perf")?;
            let perfs = pids
                .iter()
                .map(|pid| PerfCount::start(perf, *pid, dir.path().join(format!("{pid}.csv"))))
                .collect::<anyhow::Result<Vec<_>>>()?;
            tokio::time::sleep(PERF_ATTACH).await;
            Some((perfs, dir))
        }
        None => None,
    };
    let c0 = counters().await?;
    let cpu0: Vec<Duration> = pids.iter().map(|p| process_cpu(*p).unwrap_or_default()).collect();
    let run = ctx.on_load(closed_loop(conc, ctx.step(), u64::MAX, cpu_now, op)).await?;
    let cpu1: Vec<Duration> = pids.iter().map(|p| process_cpu(*p).unwrap_or_default()).collect();
    let c1 = counters().await?;
    let fsyncs: Vec<Option<u64>> = match perfs {
        Some((perfs, _dir)) => perfs.into_iter().map(PerfCount::finish).collect(),
        None => vec![None; pids.len()],
    };
    let server_cpu = cpu1.iter().zip(&cpu0).map(|(a, b)| a.saturating_sub(*b)).sum();
    let mut nodes: Vec<(NodeCounters, Option<u64>)> = c1
        .iter()
        .zip(&c0)
        .zip(fsyncs)
        .map(|((a, b), f)| {
            let d = NodeCounters {
                leader: a.leader,
                entries: a.entries.saturating_sub(b.entries),
                own_syncs: a.own_syncs.saturating_sub(b.own_syncs),
                requests: a.requests.saturating_sub(b.requests),
                rounds: a.rounds.saturating_sub(b.rounds),
                forwarded: a.forwarded.saturating_sub(b.forwarded),
            };
            (d, f)
        })
        .collect();
    nodes.sort_by_key(|(n, _)| !n.leader);
    Ok(Step { run, server_cpu, nodes })
}

const COLUMNS: [&str; 12] = [
    "system",
    "writes sent to",
    "concurrency",
    "registrations/s",
    "latency ms p50 / p99 / p999 / max",
    "registrations per Raft entry",
    "Raft entries/s (leader)",
    "fsyncs/s per node, leader / followers (perf)",
    "fsyncs per Raft entry per node, leader / followers",
    "own sync counter/s per node, leader / followers",
    "CPU cores 3 servers / load",
    "errors",
];

fn per_node(
    nodes: &[(NodeCounters, Option<u64>)],
    f: impl Fn(&NodeCounters, Option<u64>) -> Option<String>,
) -> String {
    let cells: Vec<String> = nodes.iter().map(|(n, c)| f(n, *c).unwrap_or_else(|| "-".into())).collect();
    match cells.split_first() {
        Some((l, rest)) => format!("{l} / {}", rest.join(", ")),
        None => "-".into(),
    }
}

fn step_row(ctx: &mut Ctx, system: &str, target: &str, conc: usize, s: &Step, per_entry: String) {
    let secs = s.run.elapsed.as_secs_f64().max(1e-9);
    let leader_entries = s.nodes.first().map_or(0, |(n, _)| n.entries);
    let mut errors = s.run.errors.to_string();
    if let Some(e) = &s.run.first_error {
        errors.push_str(&format!(" first: {}", e.chars().take(80).collect::<String>()));
    }
    ctx.report.row(vec![
        system.into(),
        target.into(),
        conc.to_string(),
        rate(s.run.per_sec()),
        s.run.lat.summary(),
        per_entry,
        rate(leader_entries as f64 / secs),
        per_node(&s.nodes, |_, f| f.map(|f| rate(f as f64 / secs))),
        per_node(&s.nodes, |n, f| f.map(|f| format!("{:.2}", f as f64 / n.entries.max(1) as f64))),
        per_node(&s.nodes, |n, _| Some(rate(n.own_syncs as f64 / secs))),
        format!("{:.2} / {:.2}", s.server_cpu.as_secs_f64() / secs, s.run.load_cores()),
        errors,
    ]);
}

/// `cluster`: the tandem group's rows, then etcd's, then the verdict.
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    ctx.report.table(
        "cluster: durable register on a DC of 3 tandem nodes vs a 3-member etcd, all six servers pinned to CPU 0",
        &COLUMNS,
    );
    let perf = find_bin("perf", &[]).filter(|p| PerfCount::usable(p, &ctx.base_dir));
    let mut tandem_best = 0.0f64;
    {
        let dir = ctx.tempdir("tandem-bench-cluster")?;
        let members = start_group(ctx, dir.path()).await?;
        let leader = wait_leader(&members).await?;
        let follower = (leader + 1) % members.len();
        let pids: Vec<u32> = members.iter().map(Member::pid).collect();
        let members = Arc::new(members);
        let mut steps: Vec<(usize, usize, String)> =
            CONCURRENCY.iter().map(|c| (leader, *c, "leader".to_owned())).collect();
        steps.push((follower, FOLLOWER_CONCURRENCY, "a follower (forwards to the leader)".into()));
        for (n, (target, conc, label)) in steps.into_iter().enumerate() {
            let url = Arc::new(format!("http://{}/v1/register", members[target].http));
            let http = ctx.http.clone();
            let tag = format!("k{n}");
            let op = move |i: u64| {
                let (http, url, body) = (http.clone(), url.clone(), register_body(&tag, i));
                async move { check(http.post(url.as_str()).json(&body).send().await).await }
            };
            let m = members.clone();
            let s = step(ctx, &pids, perf.as_deref(), conc, op, || tandem_counters(&m)).await?;
            let lead = s.nodes.first().map(|(n, _)| n.clone()).unwrap_or_default();
            anyhow::ensure!(lead.leader, "the leader changed during the step: {:?}", s.nodes);
            let per_entry = format!(
                "{:.1} ({} / {})",
                lead.requests as f64 / lead.rounds.max(1) as f64,
                lead.requests,
                lead.rounds
            );
            if target == leader {
                tandem_best = tandem_best.max(s.run.per_sec());
            } else {
                let fwd: u64 = s.nodes.iter().map(|(n, _)| n.forwarded).sum();
                ctx.report.note(format!(
                    "follower row: {} writes forwarded to the leader for {} acknowledged",
                    rate(fwd as f64),
                    rate(s.run.ok as f64)
                ));
            }
            step_row(ctx, "tandem", &label, conc, &s, per_entry);
        }
        let ids: Vec<String> = members.iter().map(|m| format!("{} (pid {})", m.id, m.pid())).collect();
        ctx.report.note(format!(
            "tandem: 3 processes of this binary (serve-member: Node::start on a 1-worker runtime, [cluster] with \
             default Raft timings, ACLs off on loopback), members {}; node {} led",
            ids.join(", "),
            members[leader].id
        ));
        drop(members);
    }
    let etcd_best = match find_bin("etcd", &[]) {
        None => {
            ctx.report.note(
                "etcd: not installed (bench/peers.sh installs etcd-server from Debian); skipped".into(),
            );
            None
        }
        Some(bin) => match etcd_rows(ctx, &bin, perf.as_deref()).await {
            Ok(best) => Some(best),
            Err(e) => {
                ctx.report.note(format!("etcd: failed: {e:#}"));
                None
            }
        },
    };
    ctx.report.note(match &perf {
        Some(_) => "fsyncs = fsync + fdatasync calls of each server process over the step (perf stat -p on the \
                    syscall tracepoints: WAL and Raft-log syncs, table-file syncs of flushes and compactions); \
                    own sync counter = tandem: the state machine's synced RocksDB batches (the rest of its fsyncs \
                    are its Raft log's, which no metric shows), etcd: its WAL fsyncs (etcd_disk_wal_fsync_duration_seconds_count)"
            .to_owned(),
        None => "fsyncs per node: not measured (perf not installed or not allowed to count syscall tracepoints); \
                 own sync counter = tandem: the state machine's synced RocksDB batches, etcd: its WAL fsyncs"
            .to_owned(),
    });
    ctx.report.note(format!(
        "registrations per Raft entry: tandem = the leader committer's registrations / rounds (one round is one \
         entry); etcd = registrations / proposals its leader committed (a lease grant and a put are one each); \
         Raft entries/s = entries applied by (tandem) or proposals committed at (etcd) the leader; {PROFILE} build \
         of tandem, etcd a release build"
    ));
    ctx.report.table("issue 17's target, judged from this run", &["target", "figure in this run", "verdict"]);
    let line = match etcd_best {
        Some(e) => {
            let ratio = tandem_best / e.max(1e-9);
            let verdict = if tandem_best >= 2.0 * e { "met" } else { "not met" };
            ctx.report.row(vec![
                "register on a 3-node DC >= 2x 3-member etcd (best of 64 and 256 clients, to the leader)"
                    .into(),
                format!("{} vs {} /s = {ratio:.2}x", rate(tandem_best), rate(e)),
                verdict.into(),
            ]);
            format!(
                "register on a 3-node DC >= 2x 3-member etcd: {} vs {} = {ratio:.2}x {verdict}",
                rate(tandem_best),
                rate(e)
            )
        }
        None => {
            ctx.report.row(vec![
                "register on a 3-node DC >= 2x 3-member etcd".into(),
                rate(tandem_best),
                "not measured: etcd did not run".into(),
            ]);
            "register on a 3-node DC >= 2x 3-member etcd: not measured (etcd did not run)".into()
        }
    };
    println!("\n{line}");
    ctx.report.note(line);
    Ok(())
}

/// etcd's rows: register against its leader at each concurrency; returns the best rate.
async fn etcd_rows(ctx: &mut Ctx, bin: &Path, perf: Option<&Path>) -> anyhow::Result<f64> {
    let cluster = start_etcd_cluster(ctx, bin).await?;
    let leader = cluster.leader(&ctx.http).await?;
    let version = ctx
        .http
        .get(format!("{}/version", cluster.clients[leader]))
        .send()
        .await?
        .text()
        .await
        .unwrap_or_default();
    let pids: Vec<u32> = cluster.procs.iter().map(Proc::pid).collect();
    let base = Arc::new(cluster.clients[leader].clone());
    let cluster = Arc::new(cluster);
    let mut best = 0.0f64;
    for conc in CONCURRENCY {
        let (http, base) = (ctx.http.clone(), base.clone());
        let op = move |i: u64| etcd_register_once(http.clone(), base.clone(), format!("k{conc}"), i);
        let (c, http) = (cluster.clone(), ctx.http.clone());
        let s = step(ctx, &pids, perf, conc, op, || {
            let (c, http) = (c.clone(), http.clone());
            async move { c.counters(&http, leader).await }
        })
        .await?;
        anyhow::ensure!(cluster.leads(&ctx.http, leader).await?, "etcd's leader changed during the step");
        let lead = s.nodes.first().map(|(n, _)| n.clone()).unwrap_or_default();
        let per_entry =
            format!("{:.2} ({} / {})", s.run.ok as f64 / lead.entries.max(1) as f64, s.run.ok, lead.entries);
        best = best.max(s.run.per_sec());
        step_row(ctx, "etcd", "leader (lease grant + put with lease)", conc, &s, per_entry);
    }
    ctx.report.note(format!(
        "etcd {} (3 members, static --initial-cluster on loopback, WAL fsync on, default settings otherwise), \
         JSON gateway of the leader (member {}), pids {:?}",
        version.trim(),
        leader + 1,
        pids
    ));
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_through_their_argument() {
        let members = vec![
            MemberSection {
                id: 1,
                raft_addr: "127.0.0.1:7001".parse().unwrap(),
                http_addr: "127.0.0.1:8001".parse().unwrap(),
            },
            MemberSection {
                id: 2,
                raft_addr: "127.0.0.1:7002".parse().unwrap(),
                http_addr: "127.0.0.1:8002".parse().unwrap(),
            },
        ];
        assert_eq!(parse_members(&members_arg(&members)).unwrap(), members);
        assert!(parse_members("1=127.0.0.1:1").is_err());
        assert!(parse_members("1=127.0.0.1:1=127.0.0.1:2=x").is_err());
    }

    #[test]
    fn perf_counts_are_summed_and_uncounted_events_are_none() {
        let out = "# started on Wed Dec  2 11:20:42 2026\n\n0,,syscalls:sys_enter_fsync,15005359,100.00,,\n\
                   57,,syscalls:sys_enter_fdatasync,15005359,100.00,,\n";
        assert_eq!(parse_perf(out), Some(57));
        assert_eq!(parse_perf("<not counted>,,syscalls:sys_enter_fsync,0,100.00,,\n"), None);
        assert_eq!(parse_perf("# started\n"), None);
    }

    #[test]
    fn prometheus_values_are_read_without_labels() {
        let text = "# HELP x\netcd_server_proposals_committed_total 1234\netcd_disk_wal_fsync_duration_seconds_count 99\n\
                    etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 3\n";
        assert_eq!(prom_value(text, "etcd_server_proposals_committed_total"), Some(1234.0));
        assert_eq!(prom_value(text, "etcd_disk_wal_fsync_duration_seconds_count"), Some(99.0));
        assert_eq!(prom_value(text, "etcd_disk_wal_fsync_duration_seconds"), None);
    }
}
