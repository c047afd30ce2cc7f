//! A group of three members in one process on the registry's state machine: each member a
//! `RaftLogStore` and a `RegistryStateMachine` (RocksLog) in its own tempdir, connected by
//! the in-process network of `tests.rs` or by the real member link (QUIC with mutual TLS on
//! loopback, node certificates from the dev PKI): the same scenario runs on both. Rounds of registrations, changes and deregistrations through
//! `client_write` give every member byte-identical state with gapless seqs; a leader
//! killed mid-stream and another elected, the seqs continue with no gap and no reuse; the
//! survivors snapshot and purge their logs; the killed member, started again from its disk,
//! catches up through openraft's snapshot install and the log, and applies nothing twice.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{BasicNode, Raft};
use tandem_replicator::gateway::{Admission, SourceRule};
use tandem_replicator::member::{MemberConfig, MemberLink};
use tandem_replicator::tls::{self, ReloadableTls, TlsPaths};
use tempfile::TempDir;

use super::sm_tests::{dump, export, write_of, DC};
use super::tests::{open_sm, open_store, Router, WITHIN};
use super::*;
use crate::registry::{ViewCell, ViewIndex};
use crate::store::CommitNotice;
use tandem_replicator::log::EventLog;
use tandem_schemas::InstanceKey;

struct Member {
    raft: Raft<TypeConfig>,
    sm: RegistryStateMachine,
    /// The member's in-memory view, loaded from its state at start and fed by its applies
    /// (as the node's view is fed by the committer).
    view: Arc<ViewCell>,
    /// The member's link, on the QUIC network.
    link: Option<MemberLink>,
}

/// How the members reach each other.
enum Net {
    InProcess(Router),
    /// Node certificates and a fixed loopback address per member.
    Quic {
        _pki: TempDir,
        certs: BTreeMap<NodeId, TlsPaths>,
        addrs: BTreeMap<NodeId, SocketAddr>,
    },
}

impl Net {
    fn quic(members: u64) -> Net {
        let pki = TempDir::new().unwrap();
        tls::generate_dev_pki(pki.path(), &[DC], false).unwrap();
        let ids: Vec<NodeId> = (1..=members).collect();
        let certs = tls::generate_dev_node_certs(pki.path(), DC, &ids, false)
            .unwrap()
            .into_iter()
            .map(|(node, paths)| (node.id, paths))
            .collect();
        let addrs = ids
            .iter()
            .map(|id| {
                (
                    *id,
                    std::net::SocketAddr::from((
                        [127, 0, 0, 1],
                        tandem_chaos::ports::free_port(true).unwrap(),
                    )),
                )
            })
            .collect();
        Net::Quic { _pki: pki, certs, addrs }
    }

    /// Takes a stopped member off the network.
    async fn stop(&self, id: NodeId, member: Member) {
        if let Net::InProcess(router) = self {
            router.members.write().remove(&id);
        }
        member.raft.shutdown().await.unwrap();
        if let Some(link) = member.link {
            link.shutdown().await;
        }
    }
}

fn config() -> Arc<openraft::Config> {
    let config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        // Purge the log right behind a snapshot: a member that was away then needs one.
        max_in_snapshot_log_to_keep: 0,
        ..Default::default()
    };
    Arc::new(config.validate().unwrap())
}

/// Starts member `id` from what its dir holds, waiting (bounded) for a stopped member's
/// last handles to let go of its RocksDBs.
async fn start(id: NodeId, dir: &Path, net: &Net) -> Member {
    let store = open_store(&dir.join("raft")).await;
    let sm = open_sm(&dir.join("sm")).await;
    let view = ViewCell::new(DC, sm.applied_index(), Arc::default());
    view.load(sm.with_log(|log| log.instances()).unwrap());
    let fed = view.clone();
    sm.on_apply(Box::new(move |notice: &CommitNotice| match notice.changes() {
        [] => fed.advance(notice.index),
        changes => fed.apply(notice.index, changes),
    }));
    match net {
        Net::InProcess(router) => {
            let raft = Raft::new(id, config(), router.clone(), store, sm.clone()).await.unwrap();
            router.members.write().insert(id, raft.clone());
            Member { raft, sm, view, link: None }
        }
        Net::Quic { certs, addrs, .. } => {
            let tls = Arc::new(ReloadableTls::load(certs[&id].clone()).unwrap());
            let members: Vec<_> = addrs.iter().map(|(id, addr)| (*id, *addr)).collect();
            let cfg = MemberConfig {
                listen: addrs[&id],
                members,
                reset_secret: [id as u8; 32],
                admission: Admission::new(&SourceRule::defaults(), addrs.values().copied(), 16),
            };
            let service = RaftService::default();
            let link = MemberLink::start(cfg, tls, service.clone()).unwrap();
            let network = MemberNetwork::new(link.clone());
            let raft = Raft::new(id, config(), network, store, sm.clone()).await.unwrap();
            service.attach(raft.clone());
            Member { raft, sm, view, link: Some(link) }
        }
    }
}

/// Starts members 1 to 3 in `dirs`, initializes the group and returns it with its leader.
async fn start_group(dirs: &[TempDir], net: &Net) -> (BTreeMap<NodeId, Member>, NodeId) {
    let mut group = BTreeMap::new();
    for (id, dir) in (1..=3).zip(dirs) {
        group.insert(id, start(id, dir.path(), net).await);
    }
    let nodes: BTreeMap<NodeId, BasicNode> = (1..=3).map(|id| (id, BasicNode::new(id))).collect();
    group[&1].raft.initialize(nodes).await.unwrap();
    let leader = agreed_leader(&group).await;
    (group, leader)
}

/// The leader every running member agrees on.
async fn agreed_leader(group: &BTreeMap<NodeId, Member>) -> NodeId {
    let deadline = Instant::now() + WITHIN;
    loop {
        let seen: Vec<Option<NodeId>> =
            group.values().map(|m| m.raft.metrics().borrow().current_leader).collect();
        if let Some(Some(id)) = seen.first() {
            if group.contains_key(id) && seen.iter().all(|s| s == &Some(*id)) {
                return *id;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader within {WITHIN:?}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every running member applied the leader's whole log.
async fn converge(group: &BTreeMap<NodeId, Member>, leader: NodeId) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let want = group[&leader].raft.metrics().borrow().last_log_index;
        let applied: Vec<_> =
            group.values().map(|m| m.raft.metrics().borrow().last_applied.map(|l| l.index)).collect();
        if applied.iter().all(|a| *a == want) {
            return;
        }
        assert!(Instant::now() < deadline, "members applied {applied:?}, the leader {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Proposes `rounds` rounds of three writes to `leader`; returns the seqs the writes that
/// minted an event were answered with.
async fn write_rounds(leader: &Raft<TypeConfig>, first: u64, rounds: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    for r in first..first + rounds {
        let k = (r % 5) as u8;
        let writes = [
            write_of(3 * r, 0, k, r as u8),
            write_of(3 * r + 1, 2, (k + 1) % 5, r as u8),
            write_of(3 * r + 2, 1, (k + 2) % 5, 0),
        ];
        let answer = leader.client_write(Round::of_writes(&writes).unwrap()).await.unwrap();
        for outcome in answer.data.outcomes {
            if let WriteOutcome::Written { seq } = outcome {
                seqs.push(seq);
            }
        }
    }
    seqs
}

/// Every running member holds the same bytes, and the own log is seqs 1..=n, n the last
/// seq answered.
fn same_state_everywhere(group: &BTreeMap<NodeId, Member>, answered: &[u64]) {
    let mut exports = group.values().map(|m| export(&m.sm));
    let first = exports.next().unwrap();
    assert!(exports.all(|e| e == first), "members' states differ");
    let state = group.values().next().unwrap().sm.with_log(dump);
    let seqs: Vec<u64> = state.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, answered, "the log holds exactly the answered seqs");
    assert_eq!(seqs, (1..=state.own.seq).collect::<Vec<_>>(), "gapless from 1");
    // Every member's view, fed by its applies (and a snapshot install), holds exactly its
    // state, at the index of the applied Raft index: the same on every member.
    let applied: Vec<u64> = group.values().map(|m| m.sm.applied_index()).collect();
    for (id, m) in group {
        let loaded = ViewCell::new(DC, 0, Arc::default());
        loaded.load(m.sm.with_log(|log| log.instances()).unwrap());
        assert_eq!(m.view.records(), loaded.records(), "member {id}'s view is not its state");
        assert_eq!(m.view.index(), ViewIndex::from_durable(applied[0]).0, "member {id}: applied {applied:?}");
    }
}

#[test]
fn a_group_mints_gapless_seqs_across_a_leader_change_and_a_restart() {
    leader_change_and_restart(Net::InProcess(Router::default()));
}

#[test]
fn the_same_over_the_member_link() {
    leader_change_and_restart(Net::quic(3));
}

fn leader_change_and_restart(net: Net) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
        let (mut group, leader) = start_group(&dirs, &net).await;
        let mut answered = write_rounds(&group[&leader].raft, 0, 12).await;
        converge(&group, leader).await;
        same_state_everywhere(&group, &answered);
        let before_kill = answered.len();

        // Kill the leader; another is elected; the seqs go on from where they were.
        let killed = group.remove(&leader).unwrap();
        net.stop(leader, killed).await;
        let next = agreed_leader(&group).await;
        assert_ne!(next, leader);
        answered.extend(write_rounds(&group[&next].raft, 12, 12).await);
        assert!(answered.len() > before_kill);
        converge(&group, next).await;
        same_state_everywhere(&group, &answered);

        // The survivors snapshot their state and purge their logs behind it.
        for m in group.values() {
            m.raft.trigger().snapshot().await.unwrap();
        }
        let deadline = Instant::now() + WITHIN;
        loop {
            let purged: Vec<_> = group.values().map(|m| m.raft.metrics().borrow().purged).collect();
            let applied = group[&next].raft.metrics().borrow().last_applied;
            if purged.iter().all(|p| p.is_some() && *p == applied) {
                break;
            }
            assert!(Instant::now() < deadline, "purged {purged:?}, applied {applied:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // The killed member starts again from its disk, behind the purged logs: it catches
        // up by a snapshot installed over its old state, then by the log, applying each
        // entry once (a second apply would mint other seqs and differ).
        let dir = dirs[(leader - 1) as usize].path();
        group.insert(leader, start(leader, dir, &net).await);
        // (It may have called an election before the leader reached it: ask again.)
        let last = agreed_leader(&group).await;
        answered.extend(write_rounds(&group[&last].raft, 24, 2).await);
        converge(&group, last).await;
        same_state_everywhere(&group, &answered);
        assert_eq!(group[&leader].sm.counters().snapshots_installed.load(Ordering::Relaxed), 1);

        // Entries that mint nothing (a membership change to the same voters) still move
        // every member's index alike, and wake no service.
        let voters: std::collections::BTreeSet<NodeId> = group.keys().copied().collect();
        group[&last].raft.change_membership(voters, false).await.unwrap();
        converge(&group, last).await;
        same_state_everywhere(&group, &answered);

        for (id, m) in group {
            net.stop(id, m).await;
        }
    });
}

/// The committer over a [`GroupLog`] on the leader of a three-member group serves a
/// history of local rounds and group writes (the peer's batches, acknowledgements, purges,
/// retirements, scopes) with the same outcome as today's committer on one RocksLog: the
/// same state, on every member.
#[test]
fn the_committer_over_the_group_log_serves_like_the_single_node() {
    use super::sm_tests::{builder, group_request, history, reference_steps, Step};
    use crate::store::{Committer, CommitterLimits, Request};
    use rand::{Rng, SeedableRng};

    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let picks: Vec<(u8, u8, u8)> = (0..60).map(|_| (rng.gen_range(0..10), rng.gen(), rng.gen())).collect();
    // A group changes its epoch through the log, not through the committer's log.
    let steps: Vec<Step> = history(&picks)
        .into_iter()
        .filter(|s| !matches!(s, Step::Group(GroupWrite::BeginEpoch { .. })))
        .collect();
    let reference_dir = TempDir::new().unwrap();
    let want = reference_steps(reference_dir.path(), &steps);
    assert!(want.own.seq >= 20, "a history that writes little: own {:?}", want.own);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let net = Net::InProcess(Router::default());
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let (group, leader) = rt.block_on(start_group(&dirs, &net));
    let sm = group[&leader].sm.clone();
    let log = GroupLog::new(group[&leader].raft.clone(), sm.clone(), rt.handle().clone());
    let handle =
        Committer::spawn_with_limits(log, Box::new(|_: &CommitNotice| {}), CommitterLimits::default())
            .unwrap();
    rt.block_on(async {
        for step in &steps {
            match step {
                Step::Local(round) => {
                    let state = sm.clone();
                    let base =
                        move |k: &InstanceKey| state.with_log(|l| l.instance(k).unwrap()).map(|(_, r)| r);
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    let build = builder(round.clone(), base);
                    handle.send(Request::local_append(build, None, reply)).await.unwrap();
                    answer.await.unwrap().unwrap();
                }
                Step::Group(write) => handle.send(group_request(write.clone())).await.unwrap(),
            }
        }
        // Everything sent has been served once this runs.
        handle.with_log(|_| ()).await.unwrap();
        converge(&group, leader).await;
    });
    assert_eq!(sm.with_log(dump), want, "the group's state is not the single node's");
    let exports: Vec<Vec<u8>> = group.values().map(|m| export(&m.sm)).collect();
    assert!(exports.iter().all(|e| *e == exports[0]), "members' states differ");
    rt.block_on(async {
        handle.shutdown().await;
        for (id, m) in group {
            net.stop(id, m).await;
        }
    });
}

/// A peer's acknowledgement that moves nothing, and a purge of its tombstones that removes
/// none, are not proposed: the gateway hears both from each peer now and then while nothing
/// is written, and each would be an entry (a synced write on a quorum) that also keeps the
/// members from ever going quiet (`node/idle.rs`).
#[test]
fn writes_that_change_nothing_are_not_proposed() {
    use crate::store::CommitLog;
    use tandem_replicator::log::conformance::{dereg, reg};
    use tandem_schemas::Mark;

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let net = Net::InProcess(Router::default());
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let (group, leader) = rt.block_on(start_group(&dirs, &net));
    let sm = group[&leader].sm.clone();
    let mut log = GroupLog::new(group[&leader].raft.clone(), sm.clone(), rt.handle().clone());
    let mark = Mark { epoch: 7, seq: 40 };
    log.record_peer_ack("dc-b", mark).unwrap();
    let applied = sm.applied_index();
    for _ in 0..3 {
        log.record_peer_ack("dc-b", mark).unwrap();
    }
    assert_eq!(sm.applied_index(), applied, "an unchanged ack was proposed");
    let next = Mark { seq: 41, ..mark };
    log.record_peer_ack("dc-b", next).unwrap();
    assert_eq!(sm.applied_index(), applied + 1);
    assert_eq!(log.peer_acks().get("dc-b"), Some(&next));

    // dc-b's tombstone of i1 at seq 2: a purge up to 1 removes none, one up to 2 removes it.
    log.apply_remote("dc-b", &[reg("dc-b", 5, 1, "i1"), dereg("dc-b", 5, 2, "i1")]).unwrap();
    let applied = sm.applied_index();
    assert!(log.purge_remote_tombstones_reporting("dc-b", 1).unwrap().is_empty());
    assert_eq!(sm.applied_index(), applied, "a purge that removes nothing was proposed");
    log.purge_remote_tombstones("dc-b", 2).unwrap();
    assert_eq!(sm.applied_index(), applied + 1);
    assert!(log.tombstones().unwrap().is_empty());
    log.purge_remote_tombstones("dc-b", 2).unwrap();
    assert_eq!(sm.applied_index(), applied + 1, "nothing left to purge");
    rt.block_on(async {
        for (id, m) in group {
            net.stop(id, m).await;
        }
    });
}
