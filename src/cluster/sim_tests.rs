//! The group under faults (issue 17's simulation of a 3-node origin): three members, each
//! on its own `RaftLogStore` and `RegistryStateMachine` (RocksDB in a tempdir), joined by
//! an in-process network that can cut any directed link, and a seeded schedule of faults
//! while a writer proposes rounds (local writes, and a peer DC's batches) to whoever
//! leads: the leader cut off while it keeps
//! running (a deposed leader), a minority cut off, one direction of a link cut (requests
//! or only their answers lost: the request took effect), a member killed and started again
//! from its disk; everything healed at the end.
//!
//! The oracle:
//! - at every step, across every member's applied log (a deposed leader's included), each
//!   seq of the own origin names one event id: no member ever applied another event at a
//!   seq;
//! - at the end, every member holds the same bytes, the own log is seqs 1..=n with no gap,
//!   each event id appears once, and every write whose round was acknowledged is in the
//!   log at the seq it was answered with.
//!
//! The schedule is seeded (`TANDEM_CLUSTER_SIM_SEEDS`, default `1,2`; seeds 1..5 are the
//! run of record); timing is the machine's, so a seed fixes the faults, not the
//! interleaving.

// openraft's RPC error types are large, and its network trait fixes them.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft, RaftNetwork, RaftNetworkFactory};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_replicator::log::EventLog;
use tempfile::TempDir;
use uuid::Uuid;

use super::sm_tests::{dump, export, peer_event, write_of};
use super::tests::{open_sm, open_store, WITHIN};
use super::*;

const MEMBERS: u64 = 3;
/// Fault steps per seed, and how long each lasts.
const STEPS: usize = 14;
const STEP_MS: std::ops::Range<u64> = 120..320;

/// The in-process network: every running member, and the directed links cut.
#[derive(Default)]
struct Wires {
    members: RwLock<BTreeMap<NodeId, Raft<TypeConfig>>>,
    cut: RwLock<BTreeSet<(NodeId, NodeId)>>,
    lost_answers: AtomicU64,
}

impl Wires {
    fn reaches(&self, from: NodeId, to: NodeId) -> bool {
        !self.cut.read().contains(&(from, to))
    }
}

/// One member's end of the network (openraft makes one factory per member).
#[derive(Clone)]
struct Factory {
    from: NodeId,
    wires: Arc<Wires>,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Link {
        Link { from: self.from, target, wires: self.wires.clone() }
    }
}

struct Link {
    from: NodeId,
    target: NodeId,
    wires: Arc<Wires>,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

fn unreachable<E: std::error::Error>(what: &str) -> RpcErr<E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(what.to_owned())))
}

impl Link {
    /// The target's Raft, if the request gets there.
    fn send<E: std::error::Error>(&self) -> Result<Raft<TypeConfig>, RpcErr<E>> {
        if !self.wires.reaches(self.from, self.target) {
            return Err(unreachable("link cut"));
        }
        self.wires.members.read().get(&self.target).cloned().ok_or_else(|| unreachable("member down"))
    }

    /// The answer, if it gets back (the request took effect either way).
    fn answer<T, E: std::error::Error>(&self, res: Result<T, RaftError<NodeId, E>>) -> Result<T, RpcErr<E>> {
        if !self.wires.reaches(self.target, self.from) {
            self.wires.lost_answers.fetch_add(1, Ordering::Relaxed);
            return Err(unreachable("answer lost"));
        }
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let res = self.send()?.append_entries(rpc).await;
        self.answer(res)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        let res = self.send()?.install_snapshot(rpc).await;
        self.answer(res)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        let res = self.send()?.vote(rpc).await;
        self.answer(res)
    }
}

struct Member {
    raft: Raft<TypeConfig>,
    sm: RegistryStateMachine,
}

fn config() -> Arc<openraft::Config> {
    let config = openraft::Config {
        heartbeat_interval: 40,
        election_timeout_min: 150,
        election_timeout_max: 300,
        // Snapshots and purges happen during the run, so a member back from a kill may
        // need one.
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(40),
        max_in_snapshot_log_to_keep: 5,
        ..Default::default()
    };
    Arc::new(config.validate().unwrap())
}

async fn start(id: NodeId, dir: &Path, wires: &Arc<Wires>) -> Member {
    let store = open_store(&dir.join("raft")).await;
    let sm = open_sm(&dir.join("sm")).await;
    let factory = Factory { from: id, wires: wires.clone() };
    let raft = Raft::new(id, config(), factory, store, sm.clone()).await.unwrap();
    wires.members.write().insert(id, raft.clone());
    Member { raft, sm }
}

/// What the writer saw acknowledged: event id -> seq.
type Acked = Arc<Mutex<BTreeMap<Uuid, u64>>>;

/// Proposes rounds of one to three writes to whichever member says it leads (else any),
/// until `stop`; records the writes answered with a seq.
async fn writer(
    group: Arc<RwLock<BTreeMap<NodeId, Raft<TypeConfig>>>>,
    acked: Acked,
    stop: Arc<AtomicU64>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let (mut n, mut peer_seq) = (0u64, 0u64);
    while stop.load(Ordering::Relaxed) == 0 {
        let members: Vec<Raft<TypeConfig>> = group.read().values().cloned().collect();
        let Some(any) = members.first().cloned() else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let leader = members
            .iter()
            .find(|r| {
                let m = r.metrics().borrow().clone();
                m.current_leader == Some(m.id)
            })
            .cloned()
            .unwrap_or(any);
        if rng.gen_ratio(1, 5) {
            // A peer DC's batch through the log, as its sender ships it: from the mark the
            // last answer gave, so an unanswered batch is sent again (applied twice, it is
            // a duplicate the merge skips).
            let k = (peer_seq % 4) as u8;
            let write = GroupWrite::Remote {
                channel_dc: "dc2".into(),
                events: vec![peer_event(peer_seq + 1, k, peer_seq % 3 == 2)],
            };
            let round = Round::of_group_write(&write).unwrap();
            if let Ok(Ok(answer)) =
                tokio::time::timeout(Duration::from_secs(1), leader.client_write(round)).await
            {
                if let [WriteOutcome::Group(GroupOutcome::Merged(report))] = &answer.data.outcomes[..] {
                    if let Some(mark) = report.mark {
                        peer_seq = mark.seq;
                    }
                }
            }
            continue;
        }
        let writes: Vec<LocalWrite> = (0..rng.gen_range(1..=3))
            .map(|_| {
                n += 1;
                // Unique ids across seeds' runs too: the seed in the high bits.
                let mut w = write_of(n, rng.gen(), rng.gen_range(0..6), rng.gen());
                w.event_id = Uuid::from_u64_pair(seed, n);
                w
            })
            .collect();
        let round = Round::of_writes(&writes).unwrap();
        if let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(1), leader.client_write(round)).await
        {
            let mut acked = acked.lock();
            for (w, outcome) in writes.iter().zip(answer.data.outcomes) {
                if let WriteOutcome::Written { seq } = outcome {
                    acked.insert(w.event_id, seq);
                }
            }
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Adds every member's applied own log to `seen` (seq -> event id), failing on a seq
/// that names two events.
fn observe(members: &BTreeMap<NodeId, Member>, seen: &mut BTreeMap<u64, (Uuid, NodeId)>) {
    for (id, m) in members {
        for event in m.sm.with_log(dump).events {
            match seen.get(&event.seq) {
                Some((other, by)) if *other != event.event_id => panic!(
                    "seq {} is event {} on member {id} and event {other} on member {by}",
                    event.seq, event.event_id
                ),
                Some(_) => {}
                None => {
                    seen.insert(event.seq, (event.event_id, *id));
                }
            }
        }
    }
}

fn seeds() -> Vec<u64> {
    let spec = std::env::var("TANDEM_CLUSTER_SIM_SEEDS").unwrap_or_else(|_| "1,2".into());
    spec.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

#[test]
fn a_group_under_partitions_kills_and_lost_answers_keeps_every_acknowledged_write_once() {
    for seed in seeds() {
        let started = Instant::now();
        let report = run(seed);
        eprintln!("cluster sim seed {seed}: {report} in {:?}", started.elapsed());
    }
}

fn run(seed: u64) -> String {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let dirs: BTreeMap<NodeId, TempDir> = (1..=MEMBERS).map(|id| (id, TempDir::new().unwrap())).collect();
        let wires = Arc::new(Wires::default());
        let mut members = BTreeMap::new();
        for (id, dir) in &dirs {
            members.insert(*id, start(*id, dir.path(), &wires).await);
        }
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=MEMBERS).map(|id| (id, BasicNode::new(id))).collect();
        members[&1].raft.initialize(nodes).await.unwrap();

        // The writer reaches the running members through this map (kills take them out).
        let reachable: Arc<RwLock<BTreeMap<NodeId, Raft<TypeConfig>>>> =
            Arc::new(RwLock::new(members.iter().map(|(id, m)| (*id, m.raft.clone())).collect()));
        let acked: Acked = Arc::default();
        let stop = Arc::new(AtomicU64::new(0));
        let writing = tokio::spawn(writer(reachable.clone(), acked.clone(), stop.clone(), seed));

        let mut seen = BTreeMap::new();
        let mut faults = Vec::new();
        let mut down: Option<NodeId> = None;
        for _ in 0..STEPS {
            let leader = members.values().find_map(|m| {
                let metrics = m.raft.metrics().borrow().clone();
                (metrics.current_leader == Some(metrics.id)).then_some(metrics.id)
            });
            let pick = rng.gen_range(1..=MEMBERS);
            let fault = rng.gen_range(0..6);
            // The links cut during this step (none: healed); set once the step is chosen.
            let mut cut = BTreeSet::new();
            let what = match fault {
                0 => "healed".to_owned(),
                1 | 2 => {
                    // The leader (else any member) cut off both ways: it keeps running.
                    let victim = if fault == 1 { leader.unwrap_or(pick) } else { pick };
                    for other in 1..=MEMBERS {
                        cut.insert((victim, other));
                        cut.insert((other, victim));
                    }
                    format!("{victim} isolated")
                }
                3 => {
                    let other = pick % MEMBERS + 1;
                    cut.insert((pick, other));
                    format!("{pick}->{other} cut")
                }
                4 => {
                    // Answers from the leader's followers lost: appends land, acks do not.
                    let from = leader.unwrap_or(pick);
                    for other in (1..=MEMBERS).filter(|o| *o != from) {
                        cut.insert((other, from));
                    }
                    format!("answers to {from} lost")
                }
                _ => match down.take() {
                    Some(id) => {
                        let member = start(id, dirs[&id].path(), &wires).await;
                        reachable.write().insert(id, member.raft.clone());
                        members.insert(id, member);
                        format!("{id} restarted")
                    }
                    None => {
                        let id = pick;
                        let member = members.remove(&id).unwrap();
                        reachable.write().remove(&id);
                        wires.members.write().remove(&id);
                        member.raft.shutdown().await.unwrap();
                        down = Some(id);
                        format!("{id} killed")
                    }
                },
            };
            // Never held across an await: the network reads it from the runtime's workers.
            *wires.cut.write() = cut;
            faults.push(what);
            tokio::time::sleep(Duration::from_millis(rng.gen_range(STEP_MS))).await;
            observe(&members, &mut seen);
        }

        // Heal everything, start the member that is down, stop writing, converge.
        wires.cut.write().clear();
        if let Some(id) = down.take() {
            let member = start(id, dirs[&id].path(), &wires).await;
            reachable.write().insert(id, member.raft.clone());
            members.insert(id, member);
        }
        stop.store(1, Ordering::Relaxed);
        writing.await.unwrap();
        let deadline = Instant::now() + WITHIN;
        loop {
            let metrics: Vec<_> = members.values().map(|m| m.raft.metrics().borrow().clone()).collect();
            let leader = metrics.iter().find(|m| m.current_leader == Some(m.id));
            if let Some(leader) = leader {
                let want = leader.last_log_index;
                if metrics.iter().all(|m| m.last_applied.map(|l| l.index) == want) {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "seed {seed}: no convergence within {WITHIN:?} after {faults:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        observe(&members, &mut seen);

        // Every member holds the same bytes; the own log is gapless; each event once;
        // every acknowledged write at its answered seq.
        let mut exports = members.values().map(|m| export(&m.sm));
        let first = exports.next().unwrap();
        assert!(exports.all(|e| e == first), "seed {seed}: members' states differ after {faults:?}");
        let state = members[&1].sm.with_log(dump);
        let seqs: Vec<u64> = state.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=state.own.seq).collect::<Vec<_>>(), "seed {seed}: a gap after {faults:?}");
        let ids: BTreeSet<Uuid> = state.events.iter().map(|e| e.event_id).collect();
        assert_eq!(ids.len(), state.events.len(), "seed {seed}: an event applied twice");
        let acked = acked.lock().clone();
        for (id, seq) in &acked {
            let at = state.events.iter().find(|e| e.seq == *seq).map(|e| e.event_id);
            assert_eq!(at, Some(*id), "seed {seed}: acknowledged write {id} is not at seq {seq} after {faults:?}");
        }
        assert!(!acked.is_empty(), "seed {seed}: nothing was acknowledged");
        let peer_mark = members[&1].sm.with_log(|log| log.mark_of("dc2")).map_or(0, |m| m.seq);
        let snapshots: u64 =
            members.values().map(|m| m.sm.counters().snapshots_installed.load(Ordering::Relaxed)).sum();
        for (_, m) in members {
            m.raft.shutdown().await.unwrap();
        }
        format!(
            "{} acknowledged of {} events, the peer's mark at {peer_mark}, {} answers lost, {snapshots} snapshots installed; faults {faults:?}",
            acked.len(),
            state.events.len(),
            wires.lost_answers.load(Ordering::Relaxed)
        )
    })
}

/// Starts a member in each of `dirs` over `wires` and forms the group (member 1 asks).
async fn formed_group(dirs: &BTreeMap<NodeId, TempDir>, wires: &Arc<Wires>) -> BTreeMap<NodeId, Member> {
    let mut members = BTreeMap::new();
    for (id, dir) in dirs {
        members.insert(*id, start(*id, dir.path(), wires).await);
    }
    let nodes: BTreeMap<NodeId, BasicNode> = (1..=MEMBERS).map(|id| (id, BasicNode::new(id))).collect();
    members[&1].raft.initialize(nodes).await.unwrap();
    members
}

/// A local write whose entry the leader appended but never committed (it was cut off, and
/// the new leader's entries took its index and its seqs) is answered as not written once
/// the old leader leads again and settles it, never as written: settled by its event id,
/// not by its seq.
#[test]
fn a_write_lost_with_its_leader_is_not_acknowledged_when_that_node_leads_again() {
    use super::sm_tests::builder;
    use crate::store::{CommitError, CommitNotice, Committer, CommitterLimits, Request};

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dirs: BTreeMap<NodeId, TempDir> = (1..=MEMBERS).map(|id| (id, TempDir::new().unwrap())).collect();
    let wires = Arc::new(Wires::default());
    let members = rt.block_on(formed_group(&dirs, &wires));
    let leader_of = |members: &BTreeMap<NodeId, Member>| {
        members.values().find_map(|m| {
            let metrics = m.raft.metrics().borrow().clone();
            (metrics.current_leader == Some(metrics.id)).then_some(metrics.id)
        })
    };
    let wait = |what: &str, mut done: Box<dyn FnMut() -> bool + '_>| {
        let deadline = Instant::now() + WITHIN;
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within {WITHIN:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait("a leader", Box::new(|| leader_of(&members).is_some()));
    let a = leader_of(&members).unwrap();
    let sm = members[&a].sm.clone();
    let log = GroupLog::new(members[&a].raft.clone(), sm.clone(), rt.handle().clone())
        .with_timeout(Duration::from_millis(400));
    let limits = CommitterLimits {
        recovery_backoff_initial: Duration::from_millis(50),
        recovery_backoff_max: Duration::from_millis(200),
        ..CommitterLimits::default()
    };
    let handle = Committer::spawn_with_limits(log, Box::new(|_: &CommitNotice| {}), limits).unwrap();
    let append = |n: u64, k: u8| {
        let state = sm.clone();
        let base = move |key: &tandem_schemas::InstanceKey| {
            state.with_log(|l| l.instance(key).unwrap()).map(|(_, r)| r)
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let build = builder(vec![write_of(n, 0, k, 1)], base);
        rt.block_on(handle.send(Request::local_append(build, None, reply))).unwrap();
        answer
    };
    let first = rt.block_on(append(1, 0)).unwrap().unwrap();
    assert_eq!(first[0].seq, 1);

    // Cut the leader off; its next write is appended there only, and its outcome unknown.
    for other in (1..=MEMBERS).filter(|o| *o != a) {
        wires.cut.write().extend([(a, other), (other, a)]);
    }
    let lost = append(2, 1);
    // The others elect a leader and write: their entries take the lost one's index, and
    // its seq.
    wait(
        "a new leader",
        Box::new(|| {
            members.iter().any(|(id, m)| *id != a && m.raft.metrics().borrow().current_leader == Some(*id))
        }),
    );
    let b = *members
        .keys()
        .find(|id| **id != a && members[id].raft.metrics().borrow().current_leader == Some(**id))
        .unwrap();
    let taken = Round::of_writes(&[write_of(3, 0, 2, 1)]).unwrap();
    let answer = rt.block_on(members[&b].raft.client_write(taken)).unwrap();
    assert_eq!(answer.data.outcomes, vec![WriteOutcome::Written { seq: 2 }]);

    // Heal; the old leader leads again (it is told to stand, once every member agrees on
    // who leads), recovers and settles.
    wires.cut.write().clear();
    let agreed = |members: &BTreeMap<NodeId, Member>| {
        let seen: BTreeSet<Option<NodeId>> =
            members.values().map(|m| m.raft.metrics().borrow().current_leader).collect();
        (seen.len() == 1).then(|| seen.into_iter().next().flatten()).flatten()
    };
    wait("the old leader steps down", Box::new(|| agreed(&members).is_some_and(|l| l != a)));
    // Its log must first take the new leader's entries (its own stray one is cut), or no
    // member votes for it: a candidate's log must be as up to date as the voter's.
    let caught_up = |members: &BTreeMap<NodeId, Member>| {
        let applied: BTreeSet<Option<u64>> =
            members.values().map(|m| m.raft.metrics().borrow().last_applied.map(|l| l.index)).collect();
        applied.len() == 1
    };
    wait("the old leader catches up", Box::new(|| agreed(&members).is_some() && caught_up(&members)));
    // Hand it the lead as `tandem cluster transfer-leader` does: no other member campaigns,
    // the leader goes quiet until its lease is out (members refuse votes while they hear
    // from a leader), then it campaigns. Merely asking it to campaign while the leader
    // still spoke lost, now and then, to whichever member's election timer fired first.
    let others: Vec<&Member> = members.iter().filter(|(id, _)| **id != a).map(|(_, m)| m).collect();
    for m in &others {
        m.raft.runtime_config().elect(false);
        m.raft.runtime_config().heartbeat(false);
    }
    std::thread::sleep(Duration::from_millis(config().election_timeout_max + 100));
    rt.block_on(members[&a].raft.trigger().elect()).unwrap();
    wait("the old leader leads again", Box::new(|| agreed(&members) == Some(a)));
    for m in &others {
        m.raft.runtime_config().elect(true);
        m.raft.runtime_config().heartbeat(true);
    }
    let settled =
        rt.block_on(async { tokio::time::timeout(WITHIN, lost).await }).expect("the lost write was settled");
    match settled.unwrap() {
        Err(CommitError::Unwritable { .. }) => {}
        other => panic!("a write that never committed was answered {other:?}"),
    }
    let events = sm.with_log(dump).events;
    assert!(
        events.iter().all(|e| e.event_id != write_of(2, 0, 1, 1).event_id),
        "the lost write is in the log"
    );
    rt.block_on(async {
        handle.shutdown().await;
        for (_, m) in members {
            m.raft.shutdown().await.unwrap();
        }
    });
}

/// A take-over's write that failed (the node did not lead when it proposed) leaves the log
/// unwritable; the next take-over's write must recover it once the node leads. Found by
/// `tandem chaos partition-heal --nodes 3 --seed 1`: a new leader retried its take-over
/// for 30 s, every attempt refused with "the group's log is not writable here".
#[test]
fn a_take_over_write_recovers_a_log_an_interrupted_one_left_unwritable() {
    use crate::store::CommitLog;
    use tandem_replicator::scope::Scope;

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dirs: BTreeMap<NodeId, TempDir> = (1..=MEMBERS).map(|id| (id, TempDir::new().unwrap())).collect();
    let wires = Arc::new(Wires::default());
    let members = rt.block_on(formed_group(&dirs, &wires));
    let leader = || members.values().find_map(|m| m.raft.metrics().borrow().current_leader);
    let deadline = Instant::now() + WITHIN;
    while leader().is_none() {
        assert!(Instant::now() < deadline, "no leader within {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A member that does not lead: its take-over write fails, and the log turns unwritable.
    let f = (1..=MEMBERS).find(|id| Some(*id) != leader()).unwrap();
    let mut log = GroupLog::new(members[&f].raft.clone(), members[&f].sm.clone(), rt.handle().clone())
        .with_timeout(Duration::from_millis(400));
    let scope = Scope::from_config(None);
    assert!(log.take_over_write(|l| l.rescope("dc-b", &scope)).is_err());
    assert!(!log.writable());
    // It leads now: the plain write is still refused, the take-over write recovers first.
    let deadline = Instant::now() + WITHIN;
    while members[&f].raft.metrics().borrow().current_leader != Some(f) {
        assert!(Instant::now() < deadline, "node {f} did not lead within {WITHIN:?}");
        let _ = rt.block_on(members[&f].raft.trigger().elect());
        std::thread::sleep(Duration::from_millis(100));
    }
    let refused = log.rescope("dc-b", &scope).unwrap_err();
    assert!(refused.to_string().contains("not writable"), "{refused}");
    log.take_over_write(|l| l.rescope("dc-b", &scope)).expect("the take-over write recovers the log");
    assert!(log.writable());
}

/// A leader cut off from every other member stays a leader in openraft's eyes (0.9 has no
/// check-quorum: a minority never hears of the higher term), so the node must tell for
/// itself: it stops counting as leading once no quorum acknowledged it within the
/// election timeout's maximum, and a healthy leader never does. Found by `tandem chaos
/// leader-isolated`: the isolated node kept `serving_writes`, its lease checker and its
/// replication gateway running.
#[test]
fn a_leader_cut_off_from_its_quorum_stops_leading_within_the_election_timeout() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dirs: BTreeMap<NodeId, TempDir> = (1..=MEMBERS).map(|id| (id, TempDir::new().unwrap())).collect();
    let wires = Arc::new(Wires::default());
    let members = rt.block_on(formed_group(&dirs, &wires));
    let bound = config().election_timeout_max;
    let leads = |id: NodeId| leads_with_quorum(&members[&id].raft.metrics().borrow(), id, bound);
    let leader =
        || members.keys().copied().find(|id| members[id].raft.metrics().borrow().current_leader == Some(*id));
    let deadline = Instant::now() + WITHIN;
    while leader().is_none_or(|a| !leads(a)) {
        assert!(Instant::now() < deadline, "no leader within {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let a = leader().unwrap();
    // Healthy: it keeps leading with its quorum (sampled over several election timeouts).
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(bound / 10));
        assert!(leads(a), "a healthy leader lost its quorum: {:?}", members[&a].raft.metrics().borrow());
    }
    for other in (1..=MEMBERS).filter(|o| *o != a) {
        wires.cut.write().extend([(a, other), (other, a)]);
    }
    let cut_at = Instant::now();
    while leads(a) {
        assert!(
            cut_at.elapsed() < WITHIN,
            "node {a} still leads with a quorum {WITHIN:?} after it was cut off"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = members[&a].raft.metrics().borrow().clone();
    assert_eq!(
        (m.state, m.current_leader),
        (openraft::ServerState::Leader, Some(a)),
        "openraft alone still calls the cut-off node the leader"
    );
    // The others elect one of themselves, which leads with its quorum.
    let deadline = Instant::now() + WITHIN;
    while !members.keys().any(|id| *id != a && leads(*id)) {
        assert!(Instant::now() < deadline, "the majority elected no leader within {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!leads(a));
    wires.cut.write().clear();
    rt.block_on(async {
        for (_, m) in members {
            m.raft.shutdown().await.unwrap();
        }
    });
}
