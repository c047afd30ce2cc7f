//! The Raft group's network: openraft's three RPCs (append entries, vote, install a
//! snapshot chunk) over the member link (`tandem_replicator::member`: QUIC, mutual TLS with
//! node certificates, one stream per request).
//!
//! The link carries bytes; this module gives them meaning: a [`Request`] and its
//! [`Answer`], encoded with postcard. The link's ALPN (`tandem-member/1`) versions the
//! encoding: a member speaking another version fails the handshake.
//!
//! Rules:
//! - A request names the vote it is sent under, and the vote names its node: a request is
//!   served only if that node is the member the link authenticated, so one member cannot
//!   speak for another.
//! - An append that would not fit the link's frame asks openraft to send fewer entries
//!   (`PayloadTooLarge`); one entry always fits (`ENTRY_BYTES_MAX` leaves room).
//! - A write a follower received is forwarded to the leader as a [`Forwarded`] request
//!   (the client's HTTP request, the identity its follower authenticated); the leader
//!   serves it like its own client's and answers a [`ForwardAnswer`]. Only members send
//!   them (the link authenticates every member), so the leader trusts the client identity
//!   the follower vouches for.
//! - Until this node's Raft exists (it is made after the link it needs), requests are
//!   answered `Unavailable`, which the caller's openraft retries like a network error.

// openraft's RPC error types are large, and its network trait fixes them.
#![allow(clippy::result_large_err)]

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft, RaftNetwork, RaftNetworkFactory, Vote};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use tandem_replicator::member::{CallError, Handler, MemberLink, FRAME_BYTES_MAX};

use super::{NodeId, TypeConfig};

/// One RPC from a member, as the member link carries it.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// A client's write a follower forwards to the leader.
    Forward(Forwarded),
    /// A follower of an earlier version asks the leader which remote origins are stale
    /// (the leader runs the gateway that sees their links). Answered, not asked, now:
    /// [`Request::Progress`] replaced it.
    Staleness,
    /// A follower asks the leader for its `/v1/status` (for the parts only the leader
    /// knows: its gateway's peer links, its lease checks' self-preservation); the answer
    /// is that status as JSON.
    LeaderStatus,
    /// A follower asks the leader how long ago its gateway saw each remote origin
    /// progress.
    Progress,
    /// A follower asks the leader for a read index (`?consistent=true`): the leader
    /// confirms with a quorum that it still leads and answers the index the read must see.
    ReadIndex,
    /// Several clients' writes a follower forwards to the leader in one request
    /// (heartbeats: [`FORWARDS_PER_REQUEST_MAX`] at most); each is served as a
    /// [`Request::Forward`] would be, and answered in order. A leader of an earlier
    /// version cannot decode it and answers `Unavailable`; the follower then sends them one
    /// by one.
    ForwardMany(Vec<Forwarded>),
    /// The leader hands its leadership to this member (`tandem cluster transfer-leader`):
    /// having stopped its heartbeats and let the other members' leader lease run out, it
    /// asks this member to campaign now. Served only from the member this node knows as
    /// its leader.
    Elect,
    /// The leader hands its leadership to another member: this member does not campaign
    /// for this many ms (so that the member asked to campaign wins), then as before.
    /// Served only from the member this node knows as its leader; at most
    /// [`HOLD_ELECTIONS_MS_MAX`].
    HoldElections(u64),
    /// A follower asks this member (its leader) for the digest of its `[failover]` and
    /// `[protection]` (`Config::policy_digest`): cheap, once a second.
    PolicyDigest,
    /// A member that starts with an empty Raft log asks the others how far their logs
    /// reach (the answer: the last log index). Entries beyond the first mean the group
    /// formed already and the member lost its disk: it does not form the group again, and
    /// grants no vote until its own log reaches the highest of them
    /// ([`RaftService::hold_votes_until`]).
    LogState,
}

/// Longest [`Request::HoldElections`] a member honours.
pub const HOLD_ELECTIONS_MS_MAX: u64 = 10_000;

/// Most writes in one [`Request::ForwardMany`].
pub const FORWARDS_PER_REQUEST_MAX: usize = 256;

impl Request {
    /// Added since the previous release: a member that emulates that release
    /// (`[cluster] emulate_previous_release`, docs/operations.md, "Testing an upgrade")
    /// answers these as it would (undecodable) and sends none. Each release that adds a
    /// request names it here, and drops what the release before added.
    pub fn added_since_previous_release(&self) -> bool {
        matches!(
            self,
            Request::ForwardMany(_)
                | Request::Elect
                | Request::HoldElections(_)
                | Request::PolicyDigest
                | Request::LogState
        )
    }

    /// The vote a Raft RPC is sent under (none for a forwarded write).
    fn vote(&self) -> Option<&Vote<NodeId>> {
        match self {
            Request::Append(rpc) => Some(&rpc.vote),
            Request::Vote(rpc) => Some(&rpc.vote),
            Request::Snapshot(rpc) => Some(&rpc.vote),
            Request::Forward(_)
            | Request::Staleness
            | Request::LeaderStatus
            | Request::Progress
            | Request::ReadIndex
            | Request::ForwardMany(_)
            | Request::Elect
            | Request::HoldElections(_)
            | Request::PolicyDigest
            | Request::LogState => None,
        }
    }
}

/// A client's HTTP request as the follower that received it forwards it to the leader:
/// what the leader needs to serve it as its own (the identity the follower authenticated
/// travels as the same credentials: the token header, or the client certificate's name).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Forwarded {
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// The headers the leader's handling reads (authorization, content type, host), as
    /// received.
    pub headers: Vec<(String, ByteBuf)>,
    /// The name of the client certificate the follower verified (HTTPS with client
    /// certificates).
    pub client_cert: Option<String>,
    /// The client's address as the follower saw it (rate limits, audit).
    pub client_addr: Option<IpAddr>,
    pub body: ByteBuf,
}

/// The leader's answer to a [`Forwarded`] write: its HTTP answer, and the Raft index it
/// had applied when it answered (the follower answers once its own apply reached it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ForwardAnswer {
    pub status: u16,
    pub headers: Vec<(String, ByteBuf)>,
    pub body: ByteBuf,
    pub applied: u64,
}

/// Serves forwarded writes on this node (the HTTP API, set once it exists).
pub type ForwardFn = Arc<dyn Fn(Forwarded) -> BoxFuture<'static, ForwardAnswer> + Send + Sync>;

/// Which remote origins are stale, as this node sees them (origin -> stale): the answer to
/// [`Request::Staleness`].
pub type Staleness = std::collections::BTreeMap<String, bool>;

/// How long ago each remote origin progressed, as this node's gateway saw it (origin ->
/// ms, `None`: never since it started): the answer to [`Request::Progress`].
pub type Progress = std::collections::BTreeMap<String, Option<u64>>;

/// How one remote origin's copies stand on this node's gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginProgress {
    /// Ms since they last progressed (`None`: never since the gateway started).
    pub age_ms: Option<u64>,
    pub stale: bool,
}

/// Answers [`Request::Progress`] and [`Request::Staleness`] on this node.
pub type StalenessFn = Arc<dyn Fn() -> std::collections::BTreeMap<String, OriginProgress> + Send + Sync>;

/// Answers [`Request::LeaderStatus`] on this node: its `/v1/status` as JSON.
pub type StatusFn = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// The answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Answer<T, E> {
    /// The RPC ran: openraft's response.
    Done(T),
    /// The RPC ran and openraft refused it (the caller sees a remote error).
    Refused(RaftError<NodeId, E>),
    /// The RPC did not run: no Raft here yet, an undecodable request, or a request that
    /// speaks for another node. The caller sees a network error and retries.
    Unavailable(String),
}

type AppendAnswer = Answer<AppendEntriesResponse<NodeId>, openraft::error::Infallible>;
type VoteAnswer = Answer<VoteResponse<NodeId>, openraft::error::Infallible>;
type SnapshotAnswer = Answer<InstallSnapshotResponse<NodeId>, InstallSnapshotError>;

/// Serves the other members' RPCs to this node's Raft, once [`RaftService::attach`] gave
/// it one. The member link's [`Handler`].
#[derive(Clone, Default)]
pub struct RaftService {
    raft: Arc<OnceLock<Raft<TypeConfig>>>,
    forward: Arc<OnceLock<ForwardFn>>,
    staleness: Arc<OnceLock<StalenessFn>>,
    status: Arc<OnceLock<StatusFn>>,
    /// When a leader's append (entries or heartbeat) in its current term last reached
    /// this node.
    last_append: Arc<parking_lot::Mutex<Option<std::time::Instant>>>,
    /// Election holds asked of this member (the last one turns the timer on again).
    holds: Arc<std::sync::atomic::AtomicU64>,
    /// This member's policy digest, as [`Request::PolicyDigest`] answers it (empty: not
    /// set yet).
    policy_digest: Arc<parking_lot::Mutex<String>>,
    /// This member emulates the previous release on the link
    /// ([`Request::added_since_previous_release`]).
    previous_release: Arc<std::sync::atomic::AtomicBool>,
    /// This member started empty in a group that had formed: it grants no vote until its
    /// log reaches this index (0: it votes).
    vote_floor: Arc<std::sync::atomic::AtomicU64>,
}

type StatusAnswer = Answer<ByteBuf, openraft::error::Infallible>;
type ForwardAnswerOf = Answer<ForwardAnswer, openraft::error::Infallible>;
type StalenessAnswer = Answer<Staleness, openraft::error::Infallible>;
type ProgressAnswer = Answer<Progress, openraft::error::Infallible>;
type ReadIndexAnswer = Answer<u64, openraft::error::Infallible>;
type ForwardManyAnswer = Answer<Vec<ForwardAnswer>, openraft::error::Infallible>;
type ElectAnswer = Answer<(), openraft::error::Infallible>;

impl RaftService {
    /// Serves requests to `raft` from now on (once: a later call changes nothing).
    pub fn attach(&self, raft: Raft<TypeConfig>) {
        let _ = self.raft.set(raft);
    }

    /// Serves forwarded writes with `serve` from now on (once).
    pub fn serve_forwarded(&self, serve: ForwardFn) {
        let _ = self.forward.set(serve);
    }

    /// Answers staleness questions with `answer` from now on (once).
    pub fn serve_staleness(&self, answer: StalenessFn) {
        let _ = self.staleness.set(answer);
    }

    /// Answers status questions with `answer` from now on (once).
    pub fn serve_status(&self, answer: StatusFn) {
        let _ = self.status.set(answer);
    }

    /// Answers [`Request::PolicyDigest`] with `digest` from now on.
    pub fn set_policy_digest(&self, digest: String) {
        *self.policy_digest.lock() = digest;
    }

    /// Answers as the previous release did from now on (`[cluster]
    /// emulate_previous_release`): the requests added since are undecodable.
    pub fn emulate_previous_release(&self, on: bool) {
        self.previous_release.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Grants no vote until this member's log reaches `index` (a member back from a disk
    /// loss: it forgot what it acknowledged, and a vote it gives before it holds it again
    /// could elect a member that lacks an acknowledged write).
    pub fn hold_votes_until(&self, index: u64) {
        self.vote_floor.store(index, std::sync::atomic::Ordering::Relaxed);
    }

    /// The index this member holds its votes until, while it does.
    pub fn votes_held_until(&self) -> Option<u64> {
        let floor = self.vote_floor.load(std::sync::atomic::Ordering::Relaxed);
        let last = self.raft.get().and_then(|r| r.metrics().borrow().last_log_index).unwrap_or(0);
        if floor == 0 || last >= floor {
            return None;
        }
        Some(floor)
    }

    /// When a leader's append last reached this node (`None`: never since it started).
    pub fn last_append(&self) -> Option<std::time::Instant> {
        *self.last_append.lock()
    }

    /// Turns `raft`'s election timer off for `ms`, then on again (a later hold extends
    /// it: each turns it on only if it is the last one asked).
    fn hold_elections(&self, raft: &Raft<TypeConfig>, ms: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let this = self.holds.fetch_add(1, SeqCst) + 1;
        raft.runtime_config().elect(false);
        let (raft, holds) = (raft.clone(), self.holds.clone());
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            if holds.load(SeqCst) == this {
                raft.runtime_config().elect(true);
            }
        });
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // postcard fails only on types it cannot encode, which these are not.
    postcard::to_allocvec(value).unwrap_or_default()
}

fn unavailable(why: String) -> Vec<u8> {
    // Every answer type encodes `Unavailable` alike: the variant index, then the text.
    encode(&VoteAnswer::Unavailable(why))
}

impl Handler for RaftService {
    async fn handle(&self, from: u64, request: Vec<u8>) -> Vec<u8> {
        let request: Request = match postcard::from_bytes(&request) {
            Ok(request) => request,
            Err(e) => return unavailable(format!("undecodable request: {e}")),
        };
        if request.added_since_previous_release()
            && self.previous_release.load(std::sync::atomic::Ordering::Relaxed)
        {
            return unavailable(
                "undecodable request: not in this release (emulating the previous one)".into(),
            );
        }
        if let Request::Forward(write) = request {
            let Some(serve) = self.forward.get() else {
                return unavailable("this node's API is not running yet".into());
            };
            return encode(&ForwardAnswerOf::Done(serve(write).await));
        }
        if let Request::ForwardMany(writes) = request {
            let Some(serve) = self.forward.get() else {
                return unavailable("this node's API is not running yet".into());
            };
            if writes.len() > FORWARDS_PER_REQUEST_MAX {
                return unavailable(format!(
                    "{} forwarded writes in one request, at most {FORWARDS_PER_REQUEST_MAX}",
                    writes.len()
                ));
            }
            let answers = futures::future::join_all(writes.into_iter().map(|w| serve(w))).await;
            return encode(&ForwardManyAnswer::Done(answers));
        }
        if let Request::Elect | Request::HoldElections(_) = request {
            let Some(raft) = self.raft.get() else {
                return unavailable("this node's Raft is not running yet".into());
            };
            let leader = raft.metrics().borrow().current_leader;
            if leader != Some(from) {
                return unavailable(format!(
                    "node {from} asked for a leadership transfer, but the leader this node knows is {leader:?}"
                ));
            }
            if let Request::HoldElections(ms) = request {
                self.hold_elections(raft, ms.min(HOLD_ELECTIONS_MS_MAX));
                return encode(&ElectAnswer::Done(()));
            }
            return match raft.trigger().elect().await {
                Ok(()) => encode(&ElectAnswer::Done(())),
                Err(e) => unavailable(format!("cannot campaign: {e}")),
            };
        }
        if let Request::Staleness | Request::Progress = request {
            let Some(answer) = self.staleness.get() else {
                return unavailable("this node's registry is not running yet".into());
            };
            let seen = answer();
            return match request {
                Request::Staleness => encode(&StalenessAnswer::Done(
                    seen.into_iter().map(|(origin, p)| (origin, p.stale)).collect(),
                )),
                _ => encode(&ProgressAnswer::Done(
                    seen.into_iter().map(|(origin, p)| (origin, p.age_ms)).collect(),
                )),
            };
        }
        if let Request::PolicyDigest = request {
            let digest = self.policy_digest.lock().clone();
            if digest.is_empty() {
                return unavailable("this node's configuration is not loaded yet".into());
            }
            return encode(&Answer::<String, openraft::error::Infallible>::Done(digest));
        }
        if let Request::LogState = request {
            let Some(raft) = self.raft.get() else {
                return unavailable("this node's Raft is not running yet".into());
            };
            let last = raft.metrics().borrow().last_log_index.unwrap_or(0);
            return encode(&Answer::<u64, openraft::error::Infallible>::Done(last));
        }
        if let Request::LeaderStatus = request {
            let Some(answer) = self.status.get() else {
                return unavailable("this node's API is not running yet".into());
            };
            return encode(&StatusAnswer::Done(ByteBuf::from(answer())));
        }
        if let Request::ReadIndex = request {
            let Some(raft) = self.raft.get() else {
                return unavailable("this node's Raft is not running yet".into());
            };
            return match raft.ensure_linearizable().await {
                Ok(read) => encode(&ReadIndexAnswer::Done(read.map_or(0, |l| l.index))),
                Err(e) => unavailable(format!("no read index here: {e}")),
            };
        }
        let claimed = request.vote().and_then(|v| v.leader_id().voted_for());
        if claimed != Some(from) {
            return unavailable(format!("a request from node {from} under the vote of {claimed:?}"));
        }
        let Some(raft) = self.raft.get() else {
            return unavailable("this node's Raft is not running yet".into());
        };
        if let (Request::Vote(_), Some(floor)) = (&request, self.votes_held_until()) {
            return unavailable(format!(
                "this member started empty in a formed group and votes once its log reaches index {floor}"
            ));
        }
        match request {
            Request::Append(rpc) => encode(&match raft.append_entries(rpc).await {
                Ok(resp) => {
                    if !matches!(resp, AppendEntriesResponse::HigherVote(_)) {
                        *self.last_append.lock() = Some(std::time::Instant::now());
                    }
                    AppendAnswer::Done(resp)
                }
                Err(e) => AppendAnswer::Refused(e),
            }),
            Request::Vote(rpc) => encode(&match raft.vote(rpc).await {
                Ok(resp) => VoteAnswer::Done(resp),
                Err(e) => VoteAnswer::Refused(e),
            }),
            Request::Snapshot(rpc) => encode(&match raft.install_snapshot(rpc).await {
                Ok(resp) => SnapshotAnswer::Done(resp),
                Err(e) => SnapshotAnswer::Refused(e),
            }),
            Request::Forward(_)
            | Request::Staleness
            | Request::LeaderStatus
            | Request::Progress
            | Request::ReadIndex
            | Request::ForwardMany(_)
            | Request::Elect
            | Request::HoldElections(_)
            | Request::PolicyDigest
            | Request::LogState => unavailable("served above".into()),
        }
    }
}

/// openraft's network factory over the member link.
#[derive(Clone)]
pub struct MemberNetwork {
    link: MemberLink,
}

impl MemberNetwork {
    pub fn new(link: MemberLink) -> MemberNetwork {
        MemberNetwork { link }
    }
}

impl RaftNetworkFactory<TypeConfig> for MemberNetwork {
    type Network = MemberRpc;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> MemberRpc {
        // A member just added (a learner): reached from now on, before this member's
        // watch of the membership catches up with the change (`group/membership.rs`).
        if !self.link.is_member(target) {
            if let Some((raft, _)) = super::addrs_of(node) {
                let mut members = self.link.members();
                members.push((target, raft));
                self.link.set_members(&members);
            }
        }
        MemberRpc { link: self.link.clone(), target }
    }
}

/// The RPCs to one member.
pub struct MemberRpc {
    link: MemberLink,
    target: NodeId,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl MemberRpc {
    async fn call<T, E>(&self, action: RPCTypes, request: &[u8], option: &RPCOption) -> Result<T, RpcErr<E>>
    where
        T: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let timeout = option.hard_ttl();
        let answer = self.link.call(self.target, request, timeout).await.map_err(|e| match e {
            CallError::Timeout { .. } => {
                RPCError::Timeout(Timeout { action, id: self.link.me().id, target: self.target, timeout })
            }
            e @ (CallError::Unreachable { .. } | CallError::UnknownMember { .. }) => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            e @ (CallError::Failed { .. } | CallError::TooLarge { .. }) => {
                RPCError::Network(NetworkError::new(&e))
            }
        })?;
        match postcard::from_bytes::<Answer<T, E>>(&answer) {
            Ok(Answer::Done(resp)) => Ok(resp),
            Ok(Answer::Refused(e)) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(Answer::Unavailable(why)) => Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(format!("node {}: {why}", self.target)),
            ))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for MemberRpc {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let entries = rpc.entries.len() as u64;
        let request = encode(&Request::Append(rpc));
        if request.len() > FRAME_BYTES_MAX {
            // Fewer entries per request; one always fits.
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((entries / 2).max(1))));
        }
        self.call(RPCTypes::AppendEntries, &request, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        let request = encode(&Request::Snapshot(rpc));
        self.call(RPCTypes::InstallSnapshot, &request, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        let request = encode(&Request::Vote(rpc));
        self.call(RPCTypes::Vote, &request, &option).await
    }
}

/// Sends `request` to member `to` and reads its `Answer<T, _>`: the answer, or why not.
async fn ask<T: serde::de::DeserializeOwned>(
    link: &MemberLink,
    to: NodeId,
    request: &Request,
    timeout: std::time::Duration,
) -> Result<T, String> {
    let answer = link.call(to, &encode(request), timeout).await.map_err(|e| e.to_string())?;
    match postcard::from_bytes::<Answer<T, openraft::error::Infallible>>(&answer) {
        Ok(Answer::Done(answer)) => Ok(answer),
        Ok(Answer::Refused(e)) => Err(e.to_string()),
        Ok(Answer::Unavailable(why)) => Err(format!("node {to}: {why}")),
        Err(e) => Err(format!("node {to}: undecodable answer: {e}")),
    }
}

/// Asks member `to` (the leader) for a read index: the Raft index a linearizable read
/// must see applied.
pub async fn read_index(link: &MemberLink, to: NodeId, timeout: std::time::Duration) -> Result<u64, String> {
    ask(link, to, &Request::ReadIndex, timeout).await
}

/// Asks member `to` (the leader) how long ago each remote origin progressed.
pub async fn progress(
    link: &MemberLink,
    to: NodeId,
    timeout: std::time::Duration,
) -> Result<Progress, String> {
    ask(link, to, &Request::Progress, timeout).await
}

/// Asks member `to` (the leader) for its policy digest.
pub async fn policy_digest(
    link: &MemberLink,
    to: NodeId,
    timeout: std::time::Duration,
) -> Result<String, String> {
    ask(link, to, &Request::PolicyDigest, timeout).await
}

/// Asks member `to` how far its Raft log reaches (its last log index).
pub async fn log_state(link: &MemberLink, to: NodeId, timeout: std::time::Duration) -> Result<u64, String> {
    ask(link, to, &Request::LogState, timeout).await
}

/// Asks member `to` (the leader) for its `/v1/status`, as JSON.
pub async fn leader_status(
    link: &MemberLink,
    to: NodeId,
    timeout: std::time::Duration,
) -> Result<Vec<u8>, String> {
    ask::<ByteBuf>(link, to, &Request::LeaderStatus, timeout).await.map(ByteBuf::into_vec)
}

/// Forwards a client's write to member `to` (the leader) over the link and returns its
/// answer; an error when the leader could not be reached or did not answer in `timeout`
/// (the write may or may not have happened).
pub async fn forward(
    link: &MemberLink,
    to: NodeId,
    write: Forwarded,
    timeout: std::time::Duration,
) -> Result<ForwardAnswer, String> {
    ask(link, to, &Request::Forward(write), timeout).await
}

/// Forwards several clients' writes to member `to` (the leader) in one request; answers in
/// order. An error as for [`forward`], for all of them alike; `Unavailable` text starting
/// with "undecodable request" means the leader is of an earlier version.
pub async fn forward_many(
    link: &MemberLink,
    to: NodeId,
    writes: Vec<Forwarded>,
    timeout: std::time::Duration,
) -> Result<Vec<ForwardAnswer>, String> {
    let sent = writes.len();
    let answers: Vec<ForwardAnswer> = ask(link, to, &Request::ForwardMany(writes), timeout).await?;
    if answers.len() != sent {
        return Err(format!("node {to} answered {} of {sent} forwarded writes", answers.len()));
    }
    Ok(answers)
}

/// Asks member `to` not to campaign for `ms` (see [`Request::HoldElections`]).
pub async fn hold_elections_at(
    link: &MemberLink,
    to: NodeId,
    ms: u64,
    timeout: std::time::Duration,
) -> Result<(), String> {
    ask(link, to, &Request::HoldElections(ms), timeout).await
}

/// Asks member `to` to campaign now (this node leads, stopped its heartbeats and waited out
/// the leader lease: see `tandem cluster transfer-leader`).
pub async fn ask_to_elect(link: &MemberLink, to: NodeId, timeout: std::time::Duration) -> Result<(), String> {
    ask(link, to, &Request::Elect, timeout).await
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
