//! `tandem-bench raft`: the spike of issue 17 (docs/cluster.md). Three openraft members in
//! this process, each on its own [`RaftLogStore`] (its own RocksDB under the data dir) with
//! the counting state machine, joined by an in-process network that postcard-encodes every
//! RPC and its answer (the QUIC transport comes later). Client writes go to the leader, one
//! [`Round`] per write (a committer round: 41 registrations of ~200 B by default), closed
//! loop at each concurrency. Reported per row: entries/s, registrations/s, commit latency
//! (`client_write` until applied on the leader), synced writes (fsyncs) per entry on the
//! leader and on the followers, entries per follower append, and server CPU per entry;
//! beside the synced-batch floor of the same run.
//!
//! Layout: the three members (their Raft cores, replication tasks and blocking write
//! threads) run on the server runtime, pinned to CPU 0 with one disk for all three; the
//! clients on the load runtime. Bounded: each step runs for the step's seconds, at most
//! [`OPS_MAX`] writes, and waits at most [`SETTLE`] for the followers.

// The helpers return what openraft's traits return: its `StorageError` and `RPCError` are
// hundreds of bytes, and the traits fix them.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft, RaftNetwork, RaftNetworkFactory};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tandem::cluster::{CountingStateMachine, NodeId, Round, TypeConfig};
use tandem::store::{RaftLogCounters, RaftLogStore};

use crate::load::{closed_loop, ms, rate};
use crate::Ctx;

/// Most writes one step makes.
const OPS_MAX: u64 = 1_000_000;
/// Longest wait for a leader, and for the followers to apply what the leader acked.
const SETTLE: Duration = Duration::from_secs(10);
/// Members of the spike's group.
const MEMBERS: u64 = 3;

/// The in-process network: every member's handle, and the bytes the RPCs would carry.
#[derive(Clone, Default)]
struct Router {
    members: Arc<RwLock<BTreeMap<NodeId, Raft<TypeConfig>>>>,
    bytes: Arc<AtomicU64>,
}

impl RaftNetworkFactory<TypeConfig> for Router {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Link {
        Link { target, router: self.clone() }
    }
}

/// One member's link to another.
struct Link {
    target: NodeId,
    router: Router,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// An error the target member answered.
fn remote<E: std::error::Error>(target: NodeId, e: RaftError<NodeId, E>) -> RpcErr<E> {
    RPCError::RemoteError(RemoteError::<NodeId, BasicNode, _>::new(target, e))
}

impl Link {
    fn target<E: std::error::Error>(&self) -> Result<Raft<TypeConfig>, RpcErr<E>> {
        self.router.members.read().get(&self.target).cloned().ok_or_else(|| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
                "no member {}",
                self.target
            ))))
        })
    }

    /// What crossing a real link costs in encoding: postcard out, postcard back in.
    fn hop<T: Serialize + DeserializeOwned, E: std::error::Error>(&self, value: &T) -> Result<T, RpcErr<E>> {
        let net =
            |e: postcard::Error| RPCError::Network(NetworkError::new(&std::io::Error::other(e.to_string())));
        let bytes = postcard::to_allocvec(value).map_err(net)?;
        self.router.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        postcard::from_bytes(&bytes).map_err(net)
    }
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let rpc = self.hop(&rpc)?;
        let resp = self.target()?.append_entries(rpc).await.map_err(|e| remote(self.target, e))?;
        self.hop(&resp)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        let rpc = self.hop(&rpc)?;
        let resp = self.target()?.install_snapshot(rpc).await.map_err(|e| remote(self.target, e))?;
        self.hop(&resp)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        let rpc = self.hop(&rpc)?;
        let resp = self.target()?.vote(rpc).await.map_err(|e| remote(self.target, e))?;
        self.hop(&resp)
    }
}

/// One member: its Raft handle, its state machine and its log store's counters.
struct Member {
    id: NodeId,
    raft: Raft<TypeConfig>,
    sm: CountingStateMachine,
    log: Arc<RaftLogCounters>,
}

/// The counters of one member at one instant: (synced writes, appends, entries appended).
fn snap(c: &RaftLogCounters) -> (u64, u64, u64) {
    (
        c.synced_writes.load(Ordering::Relaxed),
        c.appends.load(Ordering::Relaxed),
        c.entries_appended.load(Ordering::Relaxed),
    )
}

async fn start(ctx: &Ctx, dir: &std::path::Path, router: &Router) -> anyhow::Result<Vec<Member>> {
    let config = openraft::Config {
        cluster_name: "tandem-bench".into(),
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        ..Default::default()
    }
    .validate()
    .context("raft config")?;
    let config = Arc::new(config);
    let mut members = Vec::new();
    for id in 1..=MEMBERS {
        let store = RaftLogStore::open(&dir.join(format!("member-{id}"))).context("open the raft log")?;
        let log = store.counters();
        let sm = CountingStateMachine::default();
        let (c, r, s) = (config.clone(), router.clone(), sm.clone());
        // On the server runtime: the member's Raft core and tasks are spawned there.
        let raft = ctx.srv.spawn(async move { Raft::new(id, c, r, store, s).await }).await??;
        router.members.write().insert(id, raft.clone());
        members.push(Member { id, raft, sm, log });
    }
    let nodes: BTreeMap<NodeId, BasicNode> =
        (1..=MEMBERS).map(|id| (id, BasicNode::new(format!("in-process-{id}")))).collect();
    members[0].raft.initialize(nodes).await.context("initialize")?;
    Ok(members)
}

/// The leader's index in `members`, once one is known to every member.
async fn leader(members: &[Member]) -> anyhow::Result<usize> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let seen: Vec<Option<NodeId>> =
            members.iter().map(|m| m.raft.metrics().borrow().current_leader).collect();
        if let Some(Some(id)) = seen.first() {
            if seen.iter().all(|s| *s == Some(*id)) {
                if let Some(i) = members.iter().position(|m| m.id == *id) {
                    return Ok(i);
                }
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no leader within {SETTLE:?}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let dir = ctx.tempdir("tandem-bench-raft")?;
    let router = Router::default();
    let members = start(ctx, dir.path(), &router).await?;
    let li = leader(&members).await?;
    let leader_raft = members[li].raft.clone();
    // A few writes first: the group's first entries (blank, membership) are behind us.
    for _ in 0..20 {
        leader_raft.client_write(Round::default()).await.context("warm-up write")?;
    }
    let floor_batches = ctx.floors.rocksdb_batch64_puts_per_s.map(|p| p / 64.0);
    ctx.report.table(
        "raft spike (issue 17): 3 openraft 0.9.25 members in one process on RocksDB (RaftLogStore), in-process network; one entry = one committer round",
        &[
            "writes x bytes per entry",
            "concurrency",
            "entries/s",
            "registrations/s",
            "commit latency ms p50 / p99",
            "synced writes per entry: leader / each follower",
            "entries per follower append",
            "server CPU-ms per entry",
            "errors",
        ],
    );
    let step = ctx.step();
    let mut total_ok = 20u64;
    for &writes in &ctx.opts.raft_writes.clone() {
        let round = Round::new(vec![vec![0x5au8; ctx.opts.raft_write_bytes]; writes]);
        round.check().context("the spike's round")?;
        for &conc in &ctx.opts.raft_concurrency.clone() {
            let before: Vec<_> = members.iter().map(|m| snap(&m.log)).collect();
            let (raft, r) = (leader_raft.clone(), round.clone());
            let run = ctx
                .on_load(closed_loop(conc.clamp(1, 1024), step, OPS_MAX, crate::cpu_now, move |_| {
                    let (raft, round) = (raft.clone(), r.clone());
                    async move { raft.client_write(round).await.map(|_| ()).map_err(|e| e.to_string()) }
                }))
                .await?;
            total_ok += run.ok;
            let after: Vec<_> = members.iter().map(|m| snap(&m.log)).collect();
            let entries = run.ok.max(1) as f64;
            let synced = |i: usize| (after[i].0 - before[i].0) as f64 / entries;
            let followers: Vec<usize> = (0..members.len()).filter(|i| *i != li).collect();
            let per_follower: Vec<String> = followers.iter().map(|&i| format!("{:.2}", synced(i))).collect();
            let batch: Vec<String> = followers
                .iter()
                .map(|&i| {
                    let appends = (after[i].1 - before[i].1).max(1) as f64;
                    format!("{:.1}", (after[i].2 - before[i].2) as f64 / appends)
                })
                .collect();
            ctx.report.row(vec![
                format!("{writes} x {}", ctx.opts.raft_write_bytes),
                conc.to_string(),
                rate(run.per_sec()),
                rate(run.per_sec() * writes as f64),
                format!("{} / {}", ms(run.lat.q_ms(0.5)), ms(run.lat.q_ms(0.99))),
                format!("{:.2} / {}", synced(li), per_follower.join(", ")),
                batch.join(", "),
                format!("{:.3}", run.cpu.server.as_secs_f64() * 1e3 / entries),
                match &run.first_error {
                    Some(e) => format!("{} ({e})", run.errors),
                    None => run.errors.to_string(),
                },
            ]);
        }
    }
    // Every member applied every acknowledged round (the counting machine's check).
    let deadline = Instant::now() + SETTLE;
    let applied = loop {
        let applied: Vec<u64> = members.iter().map(|m| m.sm.applied().0).collect();
        if applied.iter().all(|a| *a >= total_ok) || Instant::now() >= deadline {
            break applied;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ctx.report.note(format!(
        "rounds applied per member {applied:?}, acknowledged {total_ok} (20 warm-up); RPC bytes through the in-process network {} MB",
        router.bytes.load(Ordering::Relaxed) / 1_000_000
    ));
    if let Some(f) = floor_batches {
        ctx.report.note(format!(
            "floor of this run (measured before the spike, same disk): {} synced RocksDB batches/s of 64 puts, one \
             writer. The leader of openraft 0.9 writes each entry as its own synced batch and waits for it before the \
             next (synced writes per entry 1.00 at every concurrency), so its entries/s follows the disk's synced-batch \
             rate, not the writes in flight; followers write what one append_entries carries in one batch",
            rate(f)
        ));
    }
    ctx.report.note(
        "three members share CPU 0 and one disk (a real group has three machines): their fsyncs queue on one device \
         and their CPU adds up; commit latency is client_write until the entry is applied on the leader"
            .into(),
    );
    for m in &members {
        let _ = m.raft.shutdown().await;
    }
    router.members.write().clear();
    anyhow::ensure!(
        applied.iter().all(|a| *a >= total_ok),
        "members applied {applied:?} of {total_ok} rounds"
    );
    Ok(())
}
