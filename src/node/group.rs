//! The node's member of its DC's Raft group (`[cluster]`, docs/cluster.md): its Raft log
//! and state on disk, its member link, its Raft, and what the rest of the node asks of it
//! (who leads, whether this node may serve writes, forwarding a write to the leader).
//!
//! On disk, a member's data dir holds `raft/` (the Raft log, [`RaftLogStore`]) and
//! `state/` (the state machine's RocksLog: event log, instances, tombstones, marks). A data
//! dir that holds a single node's log is refused: a single-node DC does not become a
//! group by a change of its file (docs/cluster.md, "What an operator does").
//!
//! Forming: a member whose Raft log is empty initializes the group with the configured
//! members. Every member does so with the same list, which openraft allows (the vote
//! elects one leader); a member with any log or vote never does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use openraft::{BasicNode, Raft, ServerState};
use serde::Serialize;
use tandem_replicator::gateway::Admission;
use tandem_replicator::member::{MemberConfig, MemberLink};
use tandem_replicator::tls::{ReloadableTls, TlsPaths};
use tokio::sync::watch;

use crate::cluster::{
    ForwardAnswer, ForwardFn, Forwarded, MemberNetwork, NodeId, RaftService, RegistryStateMachine,
    StalenessFn, StatusFn, TypeConfig,
};
use crate::config::{ClusterSection, Config};
use crate::store::RaftLogStore;

mod membership;
mod progress;
mod transfer;
pub use membership::{
    members_of, Change, Changed, Member, MembershipError, CATCH_UP_TIMEOUT, CAUGHT_UP_ENTRIES_MAX,
};
pub use progress::RemoteProgress;
pub use transfer::{TransferError, Transferred, TRANSFER_TIMEOUT};

/// The data dir's subdirectory of the Raft log.
pub const RAFT_DIR: &str = "raft";
/// The data dir's subdirectory of the state machine's RocksLog.
pub const STATE_DIR: &str = "state";

/// The epoch of a group's fresh state: the same on every member (each member's state
/// must mint the same events) and provisional (generation 0), so that the group takes an
/// epoch above whatever its peers hold of this DC at its first handshake, through the
/// log, as a single node does (docs/replication.md, "Epochs").
pub const GROUP_FIRST_EPOCH: NonZeroU64 = NonZeroU64::MIN;

/// Handshakes on the member link at once.
pub const MEMBER_HANDSHAKES_MAX: usize = 16;

/// A member's role, as status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

impl From<ServerState> for Role {
    fn from(s: ServerState) -> Role {
        match s {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        }
    }
}

/// Where a write received here goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteRoute {
    /// This node leads and took over the leases: serve it here.
    Here,
    /// Forward it to this member, the leader.
    Leader(NodeId),
    /// No leader is known, or this node leads but has not taken over yet: 503
    /// `no_leader`, retry.
    NoLeader,
}

/// This node's member of the group.
pub struct Group {
    pub id: NodeId,
    pub raft: Raft<TypeConfig>,
    pub sm: RegistryStateMachine,
    /// The member's Raft log (a clone of Raft's: they share the database).
    pub store: RaftLogStore,
    link: MemberLink,
    service: RaftService,
    section: ClusterSection,
    /// The term in which this node leads and took over the leases (set by [`lead`]).
    serving: watch::Sender<Option<u64>>,
    /// The member this node hands its lead to, while it does (`transfer.rs`): it serves
    /// no writes meanwhile.
    transferring: watch::Sender<Option<NodeId>>,
    /// When each remote origin last progressed, as far as this member knows: its own
    /// applies of their batches, and what the leader's gateway saw.
    progress: Arc<RemoteProgress>,
    /// Heartbeats forwarded to the leader in batches.
    heartbeats: super::forward_batch::HeartbeatForwarder,
    /// This member's `[failover]`/`[protection]` digest and its leader's, as last heard
    /// (`follow_leader`).
    policy: parking_lot::Mutex<PolicyDigests>,
    /// Held while a membership change runs (`membership.rs`): one at a time.
    changing: tokio::sync::Mutex<()>,
}

/// The policy digests a follower compares ([`Group::policy_differs`]).
#[derive(Debug, Default)]
struct PolicyDigests {
    own: String,
    /// The leader it was heard from, and its digest.
    leader: Option<(NodeId, String)>,
}

/// Refuses a data dir that holds a single node's log, then opens (or creates) the
/// member's state machine.
pub fn open_state(cfg: &Config) -> anyhow::Result<RegistryStateMachine> {
    if cfg.data_dir.join("CURRENT").exists() {
        anyhow::bail!(
            "data_dir {} holds a single node's event log; a [cluster] member keeps its state in {STATE_DIR}/ \
             and its Raft log in {RAFT_DIR}/ (docs/cluster.md: a single-node DC does not become a group by \
             editing its file)",
            cfg.data_dir.display()
        );
    }
    let dir = cfg.data_dir.join(STATE_DIR);
    RegistryStateMachine::open(&dir, &cfg.dc, GROUP_FIRST_EPOCH)
        .with_context(|| format!("cannot open the group's state in {}", dir.display()))
}

/// How long a member that starts with an empty Raft log waits for the others to say how
/// far their logs reach.
pub const LOG_STATE_TIMEOUT: Duration = Duration::from_secs(2);

/// The highest last log index the other members report (asked at once, each within
/// [`LOG_STATE_TIMEOUT`]): 0 when none answers or none holds more than the entry that
/// formed the group (index 0), as at the group's first start.
async fn formed_log_reach(link: &MemberLink, section: &ClusterSection) -> u64 {
    let asks = section
        .members
        .iter()
        .filter(|m| m.id != section.node_id)
        .map(|m| crate::cluster::log_state(link, m.id, LOG_STATE_TIMEOUT));
    futures::future::join_all(asks).await.into_iter().filter_map(Result::ok).max().unwrap_or(0)
}

fn raft_config(section: &ClusterSection) -> anyhow::Result<Arc<openraft::Config>> {
    let config = openraft::Config {
        cluster_name: "tandem".into(),
        heartbeat_interval: section.heartbeat_interval_ms,
        election_timeout_min: section.election_timeout_min_ms,
        election_timeout_max: section.election_timeout_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(section.snapshot_every_entries),
        max_in_snapshot_log_to_keep: section.snapshot_every_entries.min(crate::config::SNAPSHOT_LOG_KEPT_MAX),
        ..Default::default()
    };
    Ok(Arc::new(config.validate().context("invalid [cluster] timing")?))
}

impl Group {
    /// Starts the member: its Raft log, its link and its Raft over `sm` (whose apply hook
    /// the caller set), and forms the group if this member's log is empty.
    pub async fn start(
        cfg: &Config,
        section: &ClusterSection,
        sm: RegistryStateMachine,
        reset_secret: [u8; 32],
        progress: Arc<RemoteProgress>,
    ) -> anyhow::Result<Group> {
        let raft_dir = cfg.data_dir.join(RAFT_DIR);
        let store = RaftLogStore::open(&raft_dir)
            .with_context(|| format!("cannot open the Raft log in {}", raft_dir.display()))?;
        let tls = ReloadableTls::load(TlsPaths {
            ca_cert: section.ca_cert.clone(),
            cert: section.cert.clone(),
            key: section.key.clone(),
        })
        .context("cannot load the [cluster] node certificate")?;
        let members: Vec<(u64, SocketAddr)> = section.members.iter().map(|m| (m.id, m.raft_addr)).collect();
        let link_cfg = MemberConfig {
            listen: section.me().raft_addr,
            members: members.clone(),
            reset_secret,
            admission: Admission::new(
                &section.accept_from,
                members.iter().map(|(_, a)| *a),
                MEMBER_HANDSHAKES_MAX,
            ),
        };
        let service = RaftService::default();
        let link = MemberLink::start(link_cfg, Arc::new(tls), service.clone())
            .context("cannot start the member link")?;
        let id = section.node_id;
        let raft =
            Raft::new(id, raft_config(section)?, MemberNetwork::new(link.clone()), store.clone(), sm.clone())
                .await
                .context("cannot start Raft")?;
        service.attach(raft.clone());
        membership::follow_membership(&raft, link.clone(), section.clone());
        if !raft.is_initialized().await.context("cannot read the Raft state")? {
            let floor = if section.join { 0 } else { formed_log_reach(&link, section).await };
            if section.join {
                tracing::info!(node = id, "joining a formed group: waiting for its leader to add this node");
            } else if floor > 0 {
                // The group formed without this member's log (a late first start, a lost disk).
                service.hold_votes_until(floor);
                tracing::info!(
                    node = id,
                    floor,
                    "this member's Raft log is empty and the group's reaches index {floor} (it started after \
                     the others formed the group, or lost its disk): it follows the leader and votes once its \
                     log reaches {floor}"
                );
            } else {
                let nodes: BTreeMap<NodeId, BasicNode> = section
                    .members
                    .iter()
                    .map(|m| (m.id, crate::cluster::node_of(m.raft_addr, m.http_addr)))
                    .collect();
                match raft.initialize(nodes).await {
                    Ok(()) => tracing::info!(node = id, members = section.members.len(), "formed the group"),
                    // Another member formed it first and reached this one: nothing to do.
                    Err(e) => tracing::info!(node = id, error = %e, "the group was not formed here"),
                }
            }
        }
        let (serving, _) = watch::channel(None);
        let heartbeats = super::forward_batch::HeartbeatForwarder::start(
            link.clone(),
            raft.clone(),
            Duration::from_millis(section.forward_timeout_ms),
        );
        tracing::info!(node = id, raft = %section.me().raft_addr, "group member started");
        let (transferring, _) = watch::channel(None);
        service.set_policy_digest(cfg.policy_digest());
        service.emulate_previous_release(section.emulate_previous_release);
        if section.emulate_previous_release {
            tracing::warn!(node = id, "emulating the previous release on the member link (a test setting)");
        }
        Ok(Group {
            id,
            raft,
            sm,
            store,
            link,
            service,
            section: section.clone(),
            serving,
            transferring,
            progress,
            heartbeats,
            policy: parking_lot::Mutex::new(PolicyDigests { own: cfg.policy_digest(), leader: None }),
            changing: tokio::sync::Mutex::new(()),
        })
    }

    /// Serves the other members' forwarded writes with `serve` from now on.
    pub fn serve_forwarded(&self, serve: ForwardFn) {
        self.service.serve_forwarded(serve);
    }

    /// Answers the other members' staleness questions with `answer` from now on.
    pub fn serve_staleness(&self, answer: StalenessFn) {
        self.service.serve_staleness(answer);
    }

    /// Answers the other members' status questions with `answer` from now on.
    pub fn serve_status(&self, answer: StatusFn) {
        self.service.serve_status(answer);
    }

    /// The leader's `/v1/status` (JSON) when another member leads: `Ok(None)` when this
    /// node serves writes (its own status is the leader's), an error when no leader is
    /// known or it did not answer within [`LEADER_STATUS_TIMEOUT`].
    pub async fn leader_status(&self) -> Result<Option<(NodeId, Vec<u8>)>, String> {
        if self.serving() {
            return Ok(None);
        }
        let Some(leader) = self.leader() else { return Err("no leader is known".into()) };
        if leader == self.id {
            return Err("this node leads but has not taken over yet".into());
        }
        let json = crate::cluster::leader_status(&self.link, leader, LEADER_STATUS_TIMEOUT).await?;
        Ok(Some((leader, json)))
    }

    /// Whether remote origin `origin` is stale on this follower (None on the serving
    /// leader: its own gateway tells): no progress within `stale_after_ms` by its own
    /// applies or by what the leader last said. A follower cut off from the leader turns
    /// stale once `stale_after_ms` passed without either.
    pub fn remote_stale(&self, origin: &str, stale_after_ms: u64) -> Option<bool> {
        if self.serving() {
            return None;
        }
        Some(self.progress.stale(origin, stale_after_ms))
    }

    /// No progress of remote origin `origin` within `stale_after_ms` that this member
    /// saw itself (its applies of that origin's batches, as follower or leader, and what
    /// a leader told it). A new leader's gateway has seen nothing yet: what the member
    /// applied before keeps its copies fresh meanwhile.
    pub fn progress_stale(&self, origin: &str, stale_after_ms: u64) -> bool {
        self.progress.stale(origin, stale_after_ms)
    }

    /// Asks the leader (when another member leads) how long ago each remote origin
    /// progressed, and keeps it for [`Group::remote_stale`]. The answer's age is counted
    /// from its arrival: a round trip later than the truth at most.
    async fn poll_staleness(&self) {
        let Some(leader) = self.leader().filter(|l| *l != self.id) else { return };
        match crate::cluster::progress(&self.link, leader, STALENESS_POLL * 2).await {
            Ok(said) => {
                let now = std::time::Instant::now();
                for (origin, age_ms) in said {
                    if let Some(at) = age_ms.and_then(|a| now.checked_sub(Duration::from_millis(a))) {
                        self.progress.note(&origin, at);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(leader, error = %e, "the leader did not say how remote origins progress")
            }
        }
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Whether this node serves writes now: it leads, in the term it took over in.
    /// A leader that has not heard from a quorum within the election timeout's maximum
    /// does not serve ([`crate::cluster::leads_with_quorum`]).
    pub fn serving(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        self.leads(&m) && *self.serving.borrow() == Some(m.current_term)
    }

    /// Whether `m` says this node leads with a quorum behind it, and it is not handing
    /// the lead over.
    fn leads(&self, m: &openraft::RaftMetrics<NodeId, BasicNode>) -> bool {
        crate::cluster::leads_with_quorum(m, self.id, self.section.election_timeout_max_ms)
            && self.transferring.borrow().is_none()
    }

    /// Where a write received here goes.
    pub fn route(&self) -> WriteRoute {
        if self.serving() {
            return WriteRoute::Here;
        }
        match self.leader() {
            Some(l) if l != self.id => WriteRoute::Leader(l),
            _ => WriteRoute::NoLeader,
        }
    }

    /// How long a forwarded write may take, then the wait for the own apply.
    pub fn forward_timeout(&self) -> Duration {
        Duration::from_millis(self.section.forward_timeout_ms)
    }

    /// Forwards a client's write to member `to`. Gives up as soon as this node learns
    /// that `to` no longer leads (a dead leader's connection can take seconds to time
    /// out; the election that replaced it takes less).
    pub async fn forward(&self, to: NodeId, write: Forwarded) -> Result<ForwardAnswer, String> {
        self.forward_within(to, write, self.forward_timeout()).await
    }

    /// [`Group::forward`] with its own deadline (a membership change waits for a catch-up).
    pub async fn forward_within(
        &self,
        to: NodeId,
        write: Forwarded,
        timeout: Duration,
    ) -> Result<ForwardAnswer, String> {
        let call = crate::cluster::forward(&self.link, to, write, timeout);
        while_leading(&self.raft, to, call).await
    }

    /// This member's policy digest changed (a reload).
    pub fn set_own_policy(&self, digest: String) {
        self.service.set_policy_digest(digest.clone());
        self.policy.lock().own = digest;
    }

    /// On a follower: the leader's policy digest, when it differs from this member's (the
    /// leader it was heard from still leads). `None` on the serving leader, when they
    /// agree, or when the leader's is not known (cut off: reads go on, flagged).
    pub fn policy_differs(&self) -> Option<String> {
        if self.serving() {
            return None;
        }
        let leader = self.leader();
        let p = self.policy.lock();
        match &p.leader {
            Some((id, theirs)) if Some(*id) == leader && *theirs != p.own => Some(theirs.clone()),
            _ => None,
        }
    }

    /// (own, the leader's as last heard) policy digests, for status.
    pub fn policy_digests(&self) -> (String, Option<String>) {
        let p = self.policy.lock();
        (p.own.clone(), p.leader.as_ref().map(|(_, d)| d.clone()))
    }

    /// Asks the leader (another member) for its policy digest and keeps it.
    async fn poll_policy(&self) {
        if self.section.emulate_previous_release {
            // The previous release did not ask.
            return;
        }
        let Some(leader) = self.leader().filter(|l| *l != self.id) else { return };
        match crate::cluster::policy_digest(&self.link, leader, LEADER_STATUS_TIMEOUT).await {
            Ok(d) => self.policy.lock().leader = Some((leader, d)),
            Err(e) => tracing::debug!(leader, error = %e, "the leader did not say its policy digest"),
        }
    }

    /// Forwards a leadership transfer to member `to` (the leader): as [`Group::forward`],
    /// but not given up when `to` stops leading, which is what the transfer does; bounded
    /// by the forward timeout.
    pub async fn forward_transfer(&self, to: NodeId, write: Forwarded) -> Result<ForwardAnswer, String> {
        crate::cluster::forward(&self.link, to, write, self.forward_timeout()).await
    }

    /// Forwards a client's heartbeat to member `to` (the leader), batched with the others
    /// in flight (`forward_batch`).
    pub async fn forward_heartbeat(&self, to: NodeId, write: Forwarded) -> Result<ForwardAnswer, String> {
        if self.section.emulate_previous_release {
            // The previous release forwarded each on its own.
            return self.forward(to, write).await;
        }
        self.heartbeats.forward(to, write).await
    }

    /// What batching heartbeats did.
    pub fn heartbeat_batch_stats(&self) -> Arc<super::forward_batch::HeartbeatBatchStats> {
        self.heartbeats.stats.clone()
    }

    /// Waits (at most `within`) until this member applied `index`; false on timeout.
    pub async fn applied(&self, index: u64, within: Duration) -> bool {
        let mut m = self.raft.metrics();
        let reached =
            tokio::time::timeout(within, m.wait_for(|m| m.last_applied.is_some_and(|l| l.index >= index)));
        let ok = matches!(reached.await, Ok(Ok(_)));
        ok
    }

    /// A linearizable read's barrier (`?consistent=true`): once it returns, this node has
    /// applied every write acknowledged before it was called. The leader confirms with a
    /// quorum that it still leads (a read index); a follower asks the leader for that
    /// index over the member link and waits for its own apply to reach it. Bounded by
    /// `forward_timeout_ms`.
    pub async fn read_barrier(&self) -> Result<(), ReadBarrierError> {
        let within = self.forward_timeout();
        let index = if self.serving() {
            match tokio::time::timeout(within, self.raft.ensure_linearizable()).await {
                Ok(Ok(read)) => read.map_or(0, |l| l.index),
                Ok(Err(e)) => return Err(ReadBarrierError::Unreachable(format!("not the leader: {e}"))),
                Err(_) => return Err(ReadBarrierError::Unreachable(format!("no quorum within {within:?}"))),
            }
        } else {
            let Some(leader) = self.leader().filter(|l| *l != self.id) else {
                return Err(ReadBarrierError::NoLeader);
            };
            crate::cluster::read_index(&self.link, leader, within)
                .await
                .map_err(|e| ReadBarrierError::Unreachable(format!("node {leader}: {e}")))?
        };
        if self.applied(index, within).await {
            Ok(())
        } else {
            Err(ReadBarrierError::Unreachable(format!(
                "this node did not apply index {index} within {within:?}"
            )))
        }
    }

    /// Ms since this node last heard from a leader of its group: 0 on the serving leader;
    /// on a leader without its quorum, since a quorum last acknowledged it; on any other
    /// member, since a leader's append or heartbeat last reached it, whether or not it
    /// knows a leader now (an election under way, or cut off). `None`: not since it
    /// started.
    pub fn last_contact_ms(&self) -> Option<u64> {
        if self.serving() {
            return Some(0);
        }
        if self.leader() == Some(self.id) {
            return self.raft.metrics().borrow().millis_since_quorum_ack;
        }
        self.service.last_append().map(|t| t.elapsed().as_millis() as u64)
    }

    /// Whether this node knows a leader that can serve: itself serving writes, or another
    /// member (a leader without its quorum knows none).
    pub fn knows_leader(&self) -> bool {
        self.serving() || self.leader().is_some_and(|l| l != self.id)
    }

    /// Whether this member is cut off from its group: no leader known, or none heard from
    /// (a leader: no quorum's acknowledgement) within the election timeout's maximum.
    pub fn cut_off(&self) -> bool {
        !self.knows_leader()
            || self.last_contact_ms().is_none_or(|ms| ms > self.section.election_timeout_max_ms)
    }

    /// What status shows of the group.
    pub fn status(&self) -> GroupStatus {
        let m = self.raft.metrics().borrow().clone();
        let matched = m.replication.clone().unwrap_or_default();
        let (policy_digest, leader_policy_digest) = self.policy_digests();
        GroupStatus {
            node_id: self.id,
            role: m.state.into(),
            serving_writes: self.serving(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            members: members_of(&m, &self.section)
                .into_iter()
                .map(|s| MemberStatus {
                    id: s.id,
                    raft_addr: s.raft_addr,
                    http_addr: s.http_addr,
                    voter: s.voter,
                    matched_index: matched.get(&s.id).map(|l| l.map_or(0, |l| l.index)),
                })
                .collect(),
            policy_digest,
            leader_policy_digest: leader_policy_digest.filter(|_| !self.serving()),
            votes_held_until: self.service.votes_held_until(),
        }
    }

    /// Re-reads the node certificate files (a rotation): new member connections use them.
    pub fn reload_tls(&self) -> Result<(), tandem_replicator::tls::TlsError> {
        self.link.reload_tls()
    }

    /// The member link's counters.
    pub fn link_stats(&self) -> Arc<tandem_replicator::member::MemberStats> {
        self.link.stats()
    }

    /// Stops Raft and the link (the state's RocksDB closes with its last handle).
    pub async fn shutdown(&self) {
        self.serving.send_replace(None);
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "Raft did not stop cleanly");
        }
        self.link.shutdown().await;
    }
}

/// The group as `/v1/status` shows it (`cluster`).
#[derive(Clone, Debug, Serialize)]
pub struct GroupStatus {
    pub node_id: NodeId,
    pub role: Role,
    /// This node leads and took over the leases: writes are served here (on others they
    /// are forwarded here).
    pub serving_writes: bool,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: Option<u64>,
    /// On the leader: how long ago a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// Every member the group's membership names; on the leader, the index each matched.
    pub members: Vec<MemberStatus>,
    /// This member's `[failover]`/`[protection]` digest ([`Config::policy_digest`]).
    pub policy_digest: String,
    /// On a follower: the leader's, as last heard (once a second).
    pub leader_policy_digest: Option<String>,
    /// This member started with an empty log in a formed group (a lost disk): it grants
    /// no vote until its log reaches this index (absent once it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub votes_held_until: Option<u64>,
}

/// One member as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub raft_addr: SocketAddr,
    /// Unknown (null) only for a member a group formed by an earlier release names and
    /// this node's file does not.
    pub http_addr: Option<SocketAddr>,
    /// A voter; a learner (catching up, votes for no one) otherwise.
    pub voter: bool,
    /// On the leader: the last index this member holds (None elsewhere).
    pub matched_index: Option<u64>,
}

/// `call` to member `to`, given up as soon as this node learns that `to` no longer leads (a
/// dead leader's connection can take seconds to time out; the election that replaced it
/// takes less).
pub async fn while_leading<T>(
    raft: &Raft<TypeConfig>,
    to: NodeId,
    call: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let mut metrics = raft.metrics();
    tokio::select! {
        answer = call => answer,
        _ = metrics.wait_for(|m| m.current_leader != Some(to)) => {
            Err(format!("node {to} stopped leading while the write was in flight"))
        }
    }
}

/// How long [`lead`] waits between two looks at the group when nothing changed.
const LEAD_POLL: Duration = Duration::from_millis(500);

/// What the node does besides the leases when it starts leading (before it serves
/// writes; an error retries the take-over) and when it stops.
pub struct LeadHooks {
    pub on_lead: Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>,
    pub on_follow: Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
}

/// The node's leadership task: when this node leads in a term it has not taken over in,
/// it waits until every earlier entry is applied here (a read-index round with a quorum),
/// then takes over the leases and the owners (`Registry::take_lead`: every lease from its
/// record's published health with a full TTL, the restart's code path), runs the node's
/// `on_lead` hook (each peer's scope, the replication gateway) and only then serves
/// writes. When another node leads, or this one lost its quorum (no acknowledgement from
/// a quorum within the election timeout's maximum: it is cut off in a minority), it stops
/// serving at once (`Group::serving` reads the live term and the quorum's last
/// acknowledgement) and runs `on_follow`; regaining the quorum in the same term is a new
/// take-over. Stops with the node.
pub async fn lead(
    group: Arc<Group>,
    registry: Arc<crate::registry::Registry>,
    hooks: LeadHooks,
    mut shut: watch::Receiver<bool>,
) {
    let mut metrics = group.raft.metrics();
    let mut transferring = group.transferring.subscribe();
    loop {
        let (leads, term, quorum_ack_ms) = {
            let m = metrics.borrow_and_update();
            (group.leads(&m), m.current_term, m.millis_since_quorum_ack)
        };
        let served = *group.serving.borrow();
        if leads && served != Some(term) {
            let taken = match take_over(&group, &registry).await {
                Ok(leases) => (hooks.on_lead)().await.map(|()| leases),
                Err(e) => Err(e),
            };
            match taken {
                Ok(leases) => {
                    group.serving.send_replace(Some(term));
                    tracing::info!(node = group.id, term, leases, "leading the DC's group: serving writes");
                }
                Err(e) => {
                    tracing::warn!(
                        node = group.id,
                        term,
                        error = format!("{e:#}"),
                        "cannot take over as leader yet; retrying"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        _ = shut.changed() => return,
                    }
                }
            }
        } else if !leads && served.is_some() {
            group.serving.send_replace(None);
            (hooks.on_follow)().await;
            if group.transferring.borrow().is_some() {
                tracing::info!(node = group.id, term, "handing the lead over: stopped serving writes");
            } else if group.leader() == Some(group.id) {
                tracing::warn!(
                    node = group.id,
                    term,
                    quorum_ack_ms,
                    "no quorum of the group acknowledged this leader lately: stopped serving writes"
                );
            } else {
                tracing::info!(node = group.id, term, leader = ?group.leader(), "no longer leading the DC's group");
            }
        }
        tokio::select! {
            r = metrics.changed() => if r.is_err() { return },
            _ = transferring.changed() => {}
            _ = tokio::time::sleep(LEAD_POLL) => {}
            _ = shut.changed() => return,
        }
    }
}

/// Takes over as leader: see [`lead`]. Answers how many leases it started.
async fn take_over(group: &Group, registry: &Arc<crate::registry::Registry>) -> anyhow::Result<usize> {
    let within = group.forward_timeout();
    match tokio::time::timeout(within, group.raft.ensure_linearizable()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => anyhow::bail!("not the leader: {e}"),
        Err(_) => anyhow::bail!("no quorum within {within:?}"),
    }
    let sm = group.sm.clone();
    registry.take_lead(move || sm.with_log(|log| log.owners())).await
}

/// How often a follower asks the leader how remote origins progress (what only the
/// leader's gateway sees: pings that found this DC caught up).
pub const STALENESS_POLL: Duration = Duration::from_millis(250);

/// How often a follower asks the leader for its policy digest.
pub const POLICY_POLL: Duration = Duration::from_secs(1);

/// Why a consistent read could not be served.
#[derive(Debug)]
pub enum ReadBarrierError {
    /// No leader is known (`no_leader`).
    NoLeader,
    /// The leader did not confirm in time, or this node did not catch up
    /// (`leader_unreachable`).
    Unreachable(String),
}

/// How long a follower's `/v1/status` waits for the leader's.
pub const LEADER_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// What a follower asks its leader for, now and then.
#[derive(Clone, Copy, Debug)]
pub enum LeaderPoll {
    /// How remote origins progressed ([`Group::remote_stale`]), every [`STALENESS_POLL`].
    Staleness,
    /// Its policy digest ([`Group::policy_differs`]), every [`POLICY_POLL`].
    Policy,
}

/// A follower's poll of its leader (nothing while this node serves writes). Stops with the
/// node.
pub async fn follow_leader(group: Arc<Group>, what: LeaderPoll, mut shut: watch::Receiver<bool>) {
    let every = match what {
        LeaderPoll::Staleness => STALENESS_POLL,
        LeaderPoll::Policy => POLICY_POLL,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if !group.serving() {
                    match what {
                        LeaderPoll::Staleness => group.poll_staleness().await,
                        LeaderPoll::Policy => group.poll_policy().await,
                    }
                }
            }
            _ = shut.changed() => return,
        }
    }
}
