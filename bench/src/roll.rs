//! `roll`: a rolling restart of a DC's 3-member tandem group against one of a 3-member etcd
//! 3.4 cluster, under the same closed-loop write load (issue 18).
//!
//! Both systems run as in `cluster` (three `serve-member` processes of this binary; three
//! `etcd` processes with a static `--initial-cluster`; with pinning, all under
//! `taskset -c 0`, the load generator on CPU 1), one system at a time. The load: 32 clients
//! in a closed loop, each write a registration of a fresh instance (tandem: `POST
//! /v1/register`; etcd: a lease grant and a put with that lease, as `compare` and `cluster`
//! send them), sent round-robin to the members that are live and not being restarted
//! (whichever leads: a follower forwards). A member is taken out of the rotation before it
//! is stopped (its requests in flight may finish, up to 5 s) and put back once caught up.
//! A failed write (a non-2xx answer or a transport error) is retried once, 50 ms later, at
//! the next live member; a write whose retry fails too is a client-visible error.
//!
//! Procedure, both systems alike: 3 s of load; then each member in turn, followers first
//! and the leader last (the leader at that moment: a member that became leader meanwhile
//! goes last): the leader first hands its lead to a restarted member (tandem `POST
//! /v1/admin/cluster/transfer-leader`; etcd its gateway's `/v3/maintenance/transfer-
//! leadership`, what `etcdctl move-leader` sends) and the bench waits until that member
//! leads; then SIGTERM (SIGKILL after 30 s, reported), a restart on the same data dir with
//! the same flags, and a wait until the member is caught up: it follows the serving leader
//! and its applied index is within 100 entries of the leader's (tandem: `/v1/status`
//! `cluster.leader` and `applied_index`, and the leader's `matched_index` for it within 100
//! of its `last_log_index`; etcd: `/health` true, and `/v3/maintenance/status` `leader`
//! and `raftAppliedIndex`). Then 3 s more load.
//!
//! Measured: writes acknowledged (by phase), retries, client-visible errors, the longest
//! time without any acknowledged write (completion to completion, over the whole load), and
//! the roll's time from the first SIGTERM to the last member caught up; a write's latency
//! runs from its first attempt to its acknowledgement (its retry included).
//!
//! Every wait is bounded; every process started here is killed when its guard drops.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};
use tandem::config::MemberSection;

use crate::cluster::{group_members, members_arg};
use crate::load::{ms, rate, Lat, OpResult};
use crate::nodes::{check, register_body};
use crate::peers::{etcd_member_args, etcd_ports, etcd_register_once, find_bin, ok_json};
use crate::sys::{terminate, PROFILE};
use crate::Ctx;

/// Members of each group.
const MEMBERS: usize = 3;
/// Clients of the closed loop.
const CLIENTS: usize = 32;
/// Load before the first stop and after the last member caught up.
const SETTLE: Duration = Duration::from_secs(3);
/// The delay before a failed write's one retry.
const RETRY_AFTER: Duration = Duration::from_millis(50);
/// Longest wait for a withdrawn member's requests in flight before it is stopped.
const DRAIN_WAIT: Duration = Duration::from_secs(5);
/// Longest a member may take to exit on SIGTERM before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(30);
/// Longest a restarted member may take to be caught up.
const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// Longest wait for a leader (at the start, and after a hand-over).
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How far behind the leader's applied index a member counts as caught up (tandem's
/// `CAUGHT_UP_ENTRIES_MAX`, the brief's etcd figure).
const CAUGHT_UP: u64 = 100;
/// Longest the load runs whatever happens.
const LOAD_MAX: Duration = Duration::from_secs(600);
/// Timeout of one status probe.
const PROBE: Duration = Duration::from_secs(2);

/// A server process that can be stopped gracefully and started again with the same flags
/// (its data dir among them); killed on drop.
struct Server {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    pin: bool,
    /// Keep a pipe on its stdin (a `serve-member` stops when its stdin closes).
    stdin: bool,
    child: Option<std::process::Child>,
}

impl Server {
    fn start(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "{} runs already", self.name);
        let mut cmd = if self.pin {
            let mut c = Command::new("taskset");
            c.args(["-c", "0"]).arg(&self.program);
            c
        } else {
            Command::new(&self.program)
        };
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        cmd.args(&self.args)
            .stdin(if self.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn().with_context(|| format!("cannot start {}", self.name))?;
        println!("# started {} (pid {}), log {}", self.name, child.id(), self.log.display());
        self.child = Some(child);
        Ok(())
    }

    /// Fails when the process exited by itself.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait()? {
                anyhow::bail!("{} exited ({st}); its log: {}", self.name, self.log.display());
            }
        }
        Ok(())
    }

    /// SIGTERM, then a wait for the exit; SIGKILL after [`STOP_WAIT`]. Returns how long it
    /// took and whether the process exited by itself.
    async fn stop(&mut self) -> anyhow::Result<(Duration, bool)> {
        let mut child = self.child.take().with_context(|| format!("{} does not run", self.name))?;
        let t = Instant::now();
        terminate(child.id());
        loop {
            if child.try_wait()?.is_some() {
                return Ok((t.elapsed(), true));
            }
            if t.elapsed() > STOP_WAIT {
                let _ = child.kill();
                let _ = child.wait();
                return Ok((t.elapsed(), false));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            println!("# stopped {} (pid {})", self.name, c.id());
        }
    }
}

/// A number of a JSON answer (etcd's gateway writes 64-bit integers as strings).
fn num(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

async fn probe(req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    ok_json(req.timeout(PROBE).send().await).await.map_err(anyhow::Error::msg)
}

/// What the roll needs of a group, whatever the system.
trait Group {
    fn servers(&mut self) -> &mut [Server];
    fn label(&self, k: usize) -> String;
    /// The base URL writes to member `k` go to.
    fn base(&self, k: usize) -> Arc<String>;
    /// The member that leads and serves writes, as every member that answers sees it.
    async fn leader_now(&self) -> Option<usize>;
    /// Asks leader `from` to hand its lead to `to`, and waits until `to` leads.
    async fn hand_over(&self, from: usize, to: usize) -> anyhow::Result<()>;
    /// Member `k` follows the serving leader and is within [`CAUGHT_UP`] of it.
    async fn caught_up(&self, k: usize) -> anyhow::Result<bool>;

    async fn leader(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            if let Some(k) = self.leader_now().await {
                return Ok(k);
            }
            anyhow::ensure!(Instant::now() < deadline, "no leader within {LEADER_WAIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The tandem group: three `serve-member` processes.
struct TandemGroup {
    servers: Vec<Server>,
    members: Vec<MemberSection>,
    http: reqwest::Client,
}

impl TandemGroup {
    async fn start(ctx: &Ctx, dir: &Path) -> anyhow::Result<TandemGroup> {
        let members = group_members(dir)?;
        let arg = members_arg(&members);
        let exe = std::env::current_exe()?;
        let mut servers = Vec::new();
        for m in &members {
            let args =
                ["serve-member", "--data-dir", &dir.to_string_lossy(), "--member-id", &m.id.to_string()];
            let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            args.extend(["--members".to_owned(), arg.clone()]);
            let mut s = Server {
                name: format!("tandem member n{}", m.id),
                program: exe.clone(),
                args,
                log: dir.join(format!("member-{}.log", m.id)),
                pin: ctx.pin,
                stdin: true,
                child: None,
            };
            s.start()?;
            servers.push(s);
        }
        Ok(TandemGroup { servers, members, http: ctx.http.clone() })
    }

    async fn status(&self, k: usize) -> anyhow::Result<Value> {
        let v = probe(self.http.get(format!("http://{}/v1/status", self.members[k].http_addr))).await?;
        Ok(v["cluster"].clone())
    }
}

impl Group for TandemGroup {
    fn servers(&mut self) -> &mut [Server] {
        &mut self.servers
    }
    fn label(&self, k: usize) -> String {
        format!("n{}", self.members[k].id)
    }
    fn base(&self, k: usize) -> Arc<String> {
        Arc::new(format!("http://{}", self.members[k].http_addr))
    }
    async fn leader_now(&self) -> Option<usize> {
        let mut seen = Vec::new();
        for k in 0..self.members.len() {
            seen.push(self.status(k).await.ok());
        }
        let k = seen.iter().position(|s| s.as_ref().is_some_and(|s| s["serving_writes"] == true))?;
        let id = self.members[k].id;
        seen.iter().flatten().all(|s| num(&s["leader"]) == Some(id)).then_some(k)
    }
    async fn hand_over(&self, from: usize, to: usize) -> anyhow::Result<()> {
        let url = format!("http://{}{}", self.members[from].http_addr, "/v1/admin/cluster/transfer-leader");
        let to_id = self.members[to].id;
        let req = self.http.post(url).json(&json!({ "to": to_id })).timeout(Duration::from_secs(15));
        ok_json(req.send().await).await.map_err(anyhow::Error::msg)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.status(to).await.is_ok_and(|s| s["serving_writes"] == true) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "n{to_id} did not serve writes within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    async fn caught_up(&self, k: usize) -> anyhow::Result<bool> {
        let me = self.status(k).await?;
        let Some(lid) = num(&me["leader"]) else { return Ok(false) };
        let Some(l) = self.members.iter().position(|m| m.id == lid) else { return Ok(false) };
        if l == k {
            return Ok(me["serving_writes"] == true);
        }
        let lead = self.status(l).await?;
        let applied = |s: &Value| num(&s["applied_index"]).unwrap_or(0);
        let matched = lead["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| num(&m["id"]) == Some(self.members[k].id)))
            .and_then(|m| num(&m["matched_index"]));
        let last = num(&lead["last_log_index"]).unwrap_or(0);
        Ok(lead["serving_writes"] == true
            && num(&lead["leader"]) == Some(lid)
            && applied(&lead).saturating_sub(applied(&me)) <= CAUGHT_UP
            && matched.is_some_and(|m| last.saturating_sub(m) <= CAUGHT_UP))
    }
}

/// The etcd cluster: three `etcd` processes, flags as `cluster` starts them.
struct EtcdGroup {
    servers: Vec<Server>,
    clients: Vec<String>,
    /// Each member's id, as its gateway writes it.
    ids: Vec<String>,
    http: reqwest::Client,
}

impl EtcdGroup {
    async fn start(ctx: &Ctx, bin: &Path, dir: &Path) -> anyhow::Result<EtcdGroup> {
        let ports = etcd_ports()?;
        let (mut servers, mut clients) = (Vec::new(), Vec::new());
        for k in 0..ports.len() {
            let name = format!("m{}", k + 1);
            let token = format!("tandem-bench-roll-{}", std::process::id());
            let (client, args) = etcd_member_args(&ports, k, dir, &token);
            let mut s = Server {
                name: format!("etcd member {name}"),
                program: bin.to_owned(),
                args,
                log: dir.join(format!("{name}.log")),
                pin: ctx.pin,
                stdin: false,
                child: None,
            };
            s.start()?;
            servers.push(s);
            clients.push(client);
        }
        let mut g = EtcdGroup { servers, clients, ids: Vec::new(), http: ctx.http.clone() };
        let deadline = Instant::now() + LEADER_WAIT;
        for k in 0..MEMBERS {
            let id = loop {
                if let Ok(s) = g.status(k).await {
                    break s["header"]["member_id"].as_str().unwrap_or_default().to_owned();
                }
                anyhow::ensure!(Instant::now() < deadline, "etcd m{} did not answer", k + 1);
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            g.ids.push(id);
        }
        Ok(g)
    }

    async fn status(&self, k: usize) -> anyhow::Result<Value> {
        probe(self.http.post(format!("{}/v3/maintenance/status", self.clients[k])).json(&json!({}))).await
    }

    async fn healthy(&self, k: usize) -> bool {
        let v = probe(self.http.get(format!("{}/health", self.clients[k]))).await;
        v.is_ok_and(|v| v["health"] == "true")
    }

    fn index_of(&self, id: &Value) -> Option<usize> {
        self.ids.iter().position(|i| id.as_str() == Some(i.as_str()))
    }
}

impl Group for EtcdGroup {
    fn servers(&mut self) -> &mut [Server] {
        &mut self.servers
    }
    fn label(&self, k: usize) -> String {
        format!("m{}", k + 1)
    }
    fn base(&self, k: usize) -> Arc<String> {
        Arc::new(self.clients[k].clone())
    }
    async fn leader_now(&self) -> Option<usize> {
        let mut seen = Vec::new();
        for k in 0..self.clients.len() {
            seen.push(self.status(k).await.ok());
        }
        let k = self.index_of(&seen.iter().flatten().next()?["leader"])?;
        let agree = seen.iter().flatten().all(|s| self.index_of(&s["leader"]) == Some(k));
        (agree && seen[k].is_some() && self.healthy(k).await).then_some(k)
    }
    async fn hand_over(&self, from: usize, to: usize) -> anyhow::Result<()> {
        let url = format!("{}/v3/maintenance/transfer-leadership", self.clients[from]);
        let req =
            self.http.post(url).json(&json!({ "targetID": self.ids[to] })).timeout(Duration::from_secs(15));
        ok_json(req.send().await).await.map_err(anyhow::Error::msg)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let leads = self.status(to).await.is_ok_and(|s| self.index_of(&s["leader"]) == Some(to));
            if leads && self.healthy(to).await {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "m{} did not lead within 10 s", to + 1);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    async fn caught_up(&self, k: usize) -> anyhow::Result<bool> {
        if !self.healthy(k).await {
            return Ok(false);
        }
        let me = self.status(k).await?;
        let Some(l) = self.index_of(&me["leader"]) else { return Ok(false) };
        let lead = if l == k { me.clone() } else { self.status(l).await? };
        let applied = |s: &Value| num(&s["raftAppliedIndex"]).or_else(|| num(&s["raftIndex"])).unwrap_or(0);
        Ok(self.index_of(&lead["leader"]) == Some(l)
            && applied(&lead).saturating_sub(applied(&me)) <= CAUGHT_UP)
    }
}

/// One write at a member's base URL.
type Op = Arc<dyn Fn(Arc<String>, u64) -> Pin<Box<dyn Future<Output = OpResult> + Send>> + Send + Sync>;

/// The longest time without an acknowledged write: (longest, from, last ack), since the
/// load's start.
#[derive(Default)]
struct Gap {
    longest: Duration,
    from: Duration,
    last: Duration,
}

/// The closed loop's shared state: the members in rotation and what the clients saw.
struct Load {
    start: Instant,
    /// Members in rotation: index and base URL.
    targets: RwLock<Vec<(usize, Arc<String>)>>,
    inflight: Vec<AtomicU64>,
    stop: AtomicBool,
    next: AtomicU64,
    ok: AtomicU64,
    retries: AtomicU64,
    retried_ok: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    first_retried: Mutex<Option<String>>,
    gap: Mutex<Gap>,
}

impl Load {
    fn acked(&self) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        // Writes that return after the load stopped count as writes, not for the gap (the
        // gap then ends with the load: see `roll`).
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        let now = self.start.elapsed();
        let mut g = self.gap.lock();
        if now > g.last {
            if now - g.last > g.longest {
                g.longest = now - g.last;
                g.from = g.last;
            }
            g.last = now;
        }
    }

    /// Prints what the roll did, with the time since the load's start.
    fn event(&self, system: &str, text: String) {
        println!("# roll {system} t={:.2} s: {text}", self.start.elapsed().as_secs_f64());
    }

    async fn attempt(&self, op: &Op, i: u64, shift: usize) -> OpResult {
        let (k, base) = {
            let t = self.targets.read();
            if t.is_empty() {
                return Err("no member in rotation".into());
            }
            t[(i as usize + shift) % t.len()].clone()
        };
        self.inflight[k].fetch_add(1, Ordering::Relaxed);
        let r = op(base, i).await;
        self.inflight[k].fetch_sub(1, Ordering::Relaxed);
        r
    }

    async fn client(self: Arc<Self>, op: Op) -> Lat {
        let mut lat = Lat::default();
        let deadline = self.start + LOAD_MAX;
        while !self.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let t = Instant::now();
            let mut r = self.attempt(&op, i, 0).await;
            if let Err(e) = r {
                self.retries.fetch_add(1, Ordering::Relaxed);
                self.first_retried.lock().get_or_insert(e);
                tokio::time::sleep(RETRY_AFTER).await;
                r = self.attempt(&op, i, 1).await;
                if r.is_ok() {
                    self.retried_ok.fetch_add(1, Ordering::Relaxed);
                }
            }
            match r {
                Ok(()) => {
                    lat.push(t.elapsed());
                    self.acked();
                }
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    self.first_error.lock().get_or_insert(e);
                }
            }
        }
        lat
    }

    fn withdraw(&self, k: usize) {
        self.targets.write().retain(|(j, _)| *j != k);
    }

    fn restore(&self, k: usize, base: Arc<String>) {
        let mut t = self.targets.write();
        t.push((k, base));
        t.sort_by_key(|(j, _)| *j);
    }
}

/// What one member's turn took.
struct Turn {
    label: String,
    leader: bool,
    /// The hand-over's time, or why it failed (then the leader was stopped anyway).
    hand_over: Option<Result<Duration, String>>,
    stop: Duration,
    graceful: bool,
    back: Duration,
}

/// The outcome of one system's roll: the load's counters (its gap closed at its end).
struct Rolled {
    load: Arc<Load>,
    /// Acknowledged writes per second before, during and after the roll.
    rates: [f64; 3],
    roll: Duration,
    lat: Lat,
    turns: Vec<Turn>,
}

/// Runs the load on the load runtime, rolls the group under it, and stops the load.
async fn roll<G: Group>(ctx: &Ctx, system: &str, g: &mut G, op: Op) -> anyhow::Result<Rolled> {
    let n = g.servers().len();
    g.leader().await?;
    for k in 0..n {
        wait_caught_up(g, k).await?;
    }
    let load = Arc::new(Load {
        start: Instant::now(),
        targets: RwLock::new((0..n).map(|k| (k, g.base(k))).collect()),
        inflight: (0..n).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
        next: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        retried_ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
        first_retried: Mutex::new(None),
        gap: Mutex::new(Gap::default()),
    });
    let clients: Vec<_> = (0..CLIENTS).map(|_| ctx.load.spawn(load.clone().client(op.clone()))).collect();
    let rolled = roll_members(system, g, &load).await;
    if rolled.is_ok() {
        tokio::time::sleep(SETTLE).await;
    }
    let stopped = load.start.elapsed();
    load.stop.store(true, Ordering::Relaxed);
    let ok_stopped = load.ok.load(Ordering::Relaxed);
    let mut lat = Lat::default();
    for c in clients {
        lat.extend(c.await.context("load client")?);
    }
    let m = rolled?;
    {
        let mut gap = load.gap.lock();
        if stopped.saturating_sub(gap.last) > gap.longest {
            gap.longest = stopped - gap.last;
            gap.from = gap.last;
        }
    }
    let per_s = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    Ok(Rolled {
        rates: [
            per_s(m.ok_first, m.first),
            per_s(m.ok_last - m.ok_first, m.last - m.first),
            per_s(ok_stopped - m.ok_last, stopped.saturating_sub(m.last)),
        ],
        load,
        roll: m.last - m.first,
        lat: lat.finish(),
        turns: m.turns,
    })
}

/// Waits until member `k` is caught up (its process alive), within [`CATCH_UP_WAIT`].
async fn wait_caught_up<G: Group>(g: &mut G, k: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + CATCH_UP_WAIT;
    loop {
        g.servers()[k].check_alive()?;
        if g.caught_up(k).await.unwrap_or(false) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{} not caught up within {CATCH_UP_WAIT:?}", g.label(k));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The roll's marks, times since the load's start: the first SIGTERM and the last member
/// caught up, with the writes acknowledged by then; and each member's turn.
struct Marks {
    first: Duration,
    ok_first: u64,
    last: Duration,
    ok_last: u64,
    turns: Vec<Turn>,
}

/// The roll itself, under load.
async fn roll_members<G: Group>(system: &str, g: &mut G, load: &Load) -> anyhow::Result<Marks> {
    tokio::time::sleep(SETTLE).await;
    let n = g.servers().len();
    let mut done: Vec<usize> = Vec::new();
    let mut first: Option<(Duration, u64)> = None;
    let mut turns = Vec::new();
    for _ in 0..n {
        let leader = g.leader().await?;
        let k = (0..n).find(|k| !done.contains(k) && *k != leader).unwrap_or(leader);
        anyhow::ensure!(!done.contains(&k), "{} was restarted already and leads again", g.label(k));
        let label = g.label(k);
        let mut hand_over = None;
        if k == leader {
            let to = done.first().copied().unwrap_or((k + 1) % n);
            load.event(system, format!("{label} (leader) hands its lead to {}", g.label(to)));
            let t = Instant::now();
            let r = g.hand_over(k, to).await.map(|()| t.elapsed()).map_err(|e| format!("{e:#}"));
            load.event(system, format!("hand-over: {r:?}"));
            hand_over = Some(r);
        }
        load.withdraw(k);
        let drain = Instant::now() + DRAIN_WAIT;
        while load.inflight[k].load(Ordering::Relaxed) > 0 && Instant::now() < drain {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if first.is_none() {
            first = Some((load.start.elapsed(), load.ok.load(Ordering::Relaxed)));
        }
        load.event(system, format!("SIGTERM to {label}"));
        let (stop, graceful) = g.servers()[k].stop().await?;
        load.event(
            system,
            format!(
                "{label} exited after {} ms{}",
                stop.as_millis(),
                if graceful { "" } else { " (killed)" }
            ),
        );
        let t = Instant::now();
        g.servers()[k].start()?;
        wait_caught_up(g, k).await?;
        let back = t.elapsed();
        load.event(system, format!("{label} restarted and caught up in {} ms", back.as_millis()));
        load.restore(k, g.base(k));
        turns.push(Turn { label, leader: k == leader, hand_over, stop, graceful, back });
        done.push(k);
    }
    let (first, ok_first) = first.unwrap_or_default();
    Ok(Marks { first, ok_first, last: load.start.elapsed(), ok_last: load.ok.load(Ordering::Relaxed), turns })
}

const COLUMNS: [&str; 9] = [
    "system",
    "writes sent to",
    "writes ok",
    "writes/s before / during / after the roll",
    "client-visible errors",
    "retries (first failed attempts)",
    "longest gap without an acknowledged write",
    "roll: first SIGTERM to last member caught up",
    "latency ms p50 / p99 / p999 / max",
];

fn report(ctx: &mut Ctx, system: &str, write: &str, r: &Rolled) {
    let (l, gap, get) = (&r.load, r.load.gap.lock(), |c: &AtomicU64| c.load(Ordering::Relaxed));
    let with_first = |n: &AtomicU64, e: &Mutex<Option<String>>| match &*e.lock() {
        Some(e) => format!("{}, first: {}", get(n), e.chars().take(110).collect::<String>()),
        None => get(n).to_string(),
    };
    ctx.report.row(vec![
        system.into(),
        format!("{CLIENTS} clients, round-robin over live members ({write})"),
        get(&l.ok).to_string(),
        format!("{} / {} / {}", rate(r.rates[0]), rate(r.rates[1]), rate(r.rates[2])),
        with_first(&l.errors, &l.first_error),
        format!("{} ({} ok on retry)", with_first(&l.retries, &l.first_retried), get(&l.retried_ok)),
        format!("{} ms (from t={:.2} s)", ms(gap.longest.as_secs_f64() * 1e3), gap.from.as_secs_f64()),
        format!("{:.2} s", r.roll.as_secs_f64()),
        r.lat.summary(),
    ]);
    let turns: Vec<String> = r
        .turns
        .iter()
        .map(|t| {
            let hand = match &t.hand_over {
                Some(Ok(d)) => format!(", handed its lead over in {} ms", d.as_millis()),
                Some(Err(e)) => format!(", hand-over failed ({e}): plain SIGTERM"),
                None => String::new(),
            };
            format!(
                "{}{}{hand}: exited {} ms after SIGTERM{}, restarted and caught up in {} ms",
                t.label,
                if t.leader { " (leader)" } else { "" },
                t.stop.as_millis(),
                if t.graceful { "" } else { " (killed after 30 s)" },
                t.back.as_millis()
            )
        })
        .collect();
    ctx.report.note(format!("{system}: {}", turns.join("; ")));
}

/// `roll`: the tandem group's roll, then etcd's.
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    ctx.report.table(
        "roll: rolling restart of a 3-member tandem group vs a 3-member etcd under closed-loop writes",
        &COLUMNS,
    );
    let tandem = {
        let dir = ctx.tempdir("tandem-bench-roll")?;
        let mut g = TandemGroup::start(ctx, dir.path()).await?;
        let http = ctx.http.clone();
        let op: Op = Arc::new(move |base: Arc<String>, i| {
            let (http, body) = (http.clone(), register_body("roll", i));
            Box::pin(
                async move { check(http.post(format!("{base}/v1/register")).json(&body).send().await).await },
            )
        });
        let r = roll(ctx, "tandem", &mut g, op).await;
        drop(g);
        r?
    };
    report(ctx, "tandem", "POST /v1/register", &tandem);
    match find_bin("etcd", &[]) {
        None => ctx
            .report
            .note("etcd: not installed (bench/peers.sh installs etcd-server from Debian); skipped".into()),
        Some(bin) => {
            let dir = ctx.tempdir("tandem-bench-roll-etcd")?;
            let r = async {
                let mut g = EtcdGroup::start(ctx, &bin, dir.path()).await?;
                let http = ctx.http.clone();
                let op: Op = Arc::new(move |base: Arc<String>, i| {
                    Box::pin(etcd_register_once(http.clone(), base, "roll".into(), i))
                });
                roll(ctx, "etcd", &mut g, op).await
            }
            .await;
            match r {
                Ok(r) => report(ctx, "etcd", "lease grant + put with the lease", &r),
                Err(e) => ctx.report.note(format!("etcd: failed: {e:#}")),
            }
        }
    }
    ctx.report.note(format!(
        "procedure: {} s of load, then each member in turn (followers first, the leader last after handing \
         its lead to a restarted member: tandem POST /v1/admin/cluster/transfer-leader, etcd \
         /v3/maintenance/transfer-leadership): withdrawn from the rotation, SIGTERM, restarted on its data \
         dir, back in rotation once caught up (follows the leader, applied index within {CAUGHT_UP} of \
         the leader's); then {} s more. A failed write is retried once after {} ms at the next live member; \
         client-visible = both attempts failed. Gap = longest time between two acknowledged writes; {PROFILE} \
         build of tandem, etcd a release build",
        SETTLE.as_secs(),
        SETTLE.as_secs(),
        RETRY_AFTER.as_millis()
    ));
    Ok(())
}
