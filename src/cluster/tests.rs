//! Tests of the cluster types and of a Raft group on the log store: `Round`'s encoding and
//! limits; three members in one process on `RaftLogStore` (an in-process network, each
//! member's RocksDB in a tempdir) keep every acknowledged round on a quorum's disk and
//! apply them all again after a restart.

// openraft's RPC error types are large, and its network trait fixes them.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{Infallible, InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, EntryPayload, Raft, RaftLogReader, RaftNetwork, RaftNetworkFactory};
use parking_lot::RwLock;
use tempfile::TempDir;

use super::*;
use crate::store::RaftLogStore;

#[test]
fn encoded_len_matches_postcard() {
    for (n, len) in [(0, 0), (1, 200), (41, 200), (3, 127), (2, 128), (1, 20_000)] {
        let round = Round::new(vec![vec![7u8; len]; n]);
        let bytes = postcard::to_allocvec(&round).unwrap();
        assert_eq!(round.encoded_len(), bytes.len(), "{n} writes of {len}");
        // The same bytes as a list of `Vec<u8>`: serde_bytes changes the speed only.
        let plain: Vec<Vec<u8>> = vec![vec![7u8; len]; n];
        assert_eq!(postcard::to_allocvec(&plain).unwrap(), bytes);
        assert_eq!(postcard::from_bytes::<Round>(&bytes).unwrap(), round);
    }
}

#[test]
fn rounds_past_the_limits_are_refused() {
    assert!(Round::new(vec![vec![0; 200]; 41]).check().is_ok());
    let many = Round::new(vec![Vec::new(); ROUND_WRITES_MAX + 1]);
    assert!(matches!(many.check(), Err(RoundError::TooManyWrites { .. })));
    let large = Round::new(vec![vec![0; ENTRY_BYTES_MAX]]);
    assert!(matches!(large.check(), Err(RoundError::TooLarge { .. })));
}

/// The in-process network of the group test: every member's handle, by id.
#[derive(Clone, Default)]
pub(super) struct Router {
    pub(super) members: Arc<RwLock<BTreeMap<NodeId, Raft<TypeConfig>>>>,
}

impl RaftNetworkFactory<TypeConfig> for Router {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Link {
        Link { target, router: self.clone() }
    }
}

pub(super) struct Link {
    target: NodeId,
    router: Router,
}

type RpcErr<E = Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl Link {
    fn target<E: std::error::Error>(&self) -> Result<Raft<TypeConfig>, RpcErr<E>> {
        let raft = self.router.members.read().get(&self.target).cloned();
        raft.ok_or_else(|| RPCError::Unreachable(Unreachable::new(&std::io::Error::other("member stopped"))))
    }
}

fn remote<E: std::error::Error>(target: NodeId, e: RaftError<NodeId, E>) -> RpcErr<E> {
    RPCError::RemoteError(RemoteError::<NodeId, BasicNode, _>::new(target, e))
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        self.target()?.append_entries(rpc).await.map_err(|e| remote(self.target, e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.target()?.install_snapshot(rpc).await.map_err(|e| remote(self.target, e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        self.target()?.vote(rpc).await.map_err(|e| remote(self.target, e))
    }
}

const MEMBERS: u64 = 3;
const ROUNDS: u64 = 30;
pub(super) const WITHIN: Duration = Duration::from_secs(10);

/// Opens a member's store, waiting (bounded) for a stopped member's last handles to let go
/// of its RocksDB.
pub(super) async fn open_store(dir: &Path) -> RaftLogStore {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        match RaftLogStore::open(dir) {
            Ok(store) => return store,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("reopen {}: {e}", dir.display()),
        }
    }
}

/// Opens a member's registry state machine of the test DC (`sm_tests::DC`, `EPOCH`),
/// waiting (bounded) for a stopped member's last handles to let go of its RocksDB.
pub(super) async fn open_sm(dir: &Path) -> RegistryStateMachine {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        match RegistryStateMachine::open(dir, super::sm_tests::DC, super::sm_tests::EPOCH) {
            Ok(sm) => return sm,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("open the state machine in {}: {e}", dir.display()),
        }
    }
}

async fn start(dirs: &[TempDir], router: &Router) -> Vec<(Raft<TypeConfig>, CountingStateMachine)> {
    let config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        ..Default::default()
    };
    let config = Arc::new(config.validate().unwrap());
    let mut group = Vec::new();
    for (id, dir) in (1..=MEMBERS).zip(dirs) {
        let store = open_store(dir.path()).await;
        let sm = CountingStateMachine::default();
        let raft = Raft::new(id, config.clone(), router.clone(), store, sm.clone()).await.unwrap();
        router.members.write().insert(id, raft.clone());
        group.push((raft, sm));
    }
    group
}

async fn leader_of(group: &[(Raft<TypeConfig>, CountingStateMachine)]) -> Raft<TypeConfig> {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let seen: Vec<Option<NodeId>> =
            group.iter().map(|(r, _)| r.metrics().borrow().current_leader).collect();
        if let Some(Some(id)) = seen.first() {
            if seen.iter().all(|s| *s == Some(*id)) {
                return group[(*id - 1) as usize].0.clone();
            }
        }
        assert!(std::time::Instant::now() < deadline, "no leader within {WITHIN:?}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stop(group: Vec<(Raft<TypeConfig>, CountingStateMachine)>, router: &Router) {
    for (raft, _) in &group {
        raft.shutdown().await.unwrap();
    }
    router.members.write().clear();
}

/// The rounds (their one write) in a member's log, in log order.
async fn rounds_in_log(dir: &Path) -> Vec<Vec<u8>> {
    let mut store = open_store(dir).await;
    let entries = store.try_get_log_entries(..).await.unwrap();
    entries
        .into_iter()
        .filter_map(|e| match e.payload {
            EntryPayload::Normal(round) => Some(round.writes[0].to_vec()),
            _ => None,
        })
        .collect()
}

/// A group of three on RaftLogStore: every round `client_write` acknowledged is, once
/// the members stop, in the logs of at least a quorum, in order; and the group started
/// again from those logs elects a leader and applies every round again on every member.
#[test]
fn acknowledged_rounds_are_on_a_quorum_and_survive_a_restart() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let dirs: Vec<TempDir> = (0..MEMBERS).map(|_| tempfile::tempdir().unwrap()).collect();
        let router = Router::default();
        let group = start(&dirs, &router).await;
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=MEMBERS).map(|id| (id, BasicNode::new(id))).collect();
        group[0].0.initialize(nodes).await.unwrap();
        let leader = leader_of(&group).await;
        let acked: Vec<Vec<u8>> = (0..ROUNDS).map(|i| i.to_be_bytes().to_vec()).collect();
        for w in &acked {
            leader.client_write(Round::new([w.clone()])).await.unwrap();
        }
        drop(leader);
        stop(group, &router).await;

        let mut complete = 0;
        for dir in &dirs {
            if rounds_in_log(dir.path()).await == acked {
                complete += 1;
            }
        }
        assert!(complete >= 2, "only {complete} of {MEMBERS} logs hold every acknowledged round");

        let group = start(&dirs, &router).await;
        let _leader = leader_of(&group).await;
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let applied: Vec<u64> = group.iter().map(|(_, sm)| sm.applied().0).collect();
            if applied.iter().all(|a| *a == ROUNDS) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "applied after the restart: {applied:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop(group, &router).await;
    });
}
