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
}

/// Longest [`Request::HoldElections`] a member honours.
pub const HOLD_ELECTIONS_MS_MAX: u64 = 10_000;

/// Most writes in one [`Request::ForwardMany`].
pub const FORWARDS_PER_REQUEST_MAX: usize = 256;

impl Request {
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
            | Request::PolicyDigest => None,
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
            | Request::PolicyDigest => unavailable("served above".into()),
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

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> MemberRpc {
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
mod tests {
    use openraft::error::{Fatal, SnapshotMismatch};
    use openraft::{LeaderId, LogId, SnapshotSegmentId};

    use super::*;

    fn answer<T: serde::de::DeserializeOwned, E: serde::de::DeserializeOwned>(bytes: &[u8]) -> Answer<T, E> {
        postcard::from_bytes(bytes).unwrap()
    }

    #[test]
    fn unavailable_reads_the_same_as_every_answer_type() {
        let bytes = unavailable("why".into());
        assert!(
            matches!(answer::<AppendEntriesResponse<NodeId>, openraft::error::Infallible>(&bytes), Answer::Unavailable(w) if w == "why")
        );
        assert!(
            matches!(answer::<InstallSnapshotResponse<NodeId>, InstallSnapshotError>(&bytes), Answer::Unavailable(w) if w == "why")
        );
    }

    #[test]
    fn refusals_the_caller_acts_on_survive_the_wire() {
        let mismatch = SnapshotAnswer::Refused(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
            SnapshotMismatch {
                expect: SnapshotSegmentId { id: "a".into(), offset: 0 },
                got: SnapshotSegmentId { id: "b".into(), offset: 7 },
            },
        )));
        let read = answer::<InstallSnapshotResponse<NodeId>, InstallSnapshotError>(&encode(&mismatch));
        assert!(matches!(
            read,
            Answer::Refused(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(_)))
        ));
        let stopped = AppendAnswer::Refused(RaftError::Fatal(Fatal::Stopped));
        let read = answer::<AppendEntriesResponse<NodeId>, openraft::error::Infallible>(&encode(&stopped));
        assert!(matches!(read, Answer::Refused(RaftError::Fatal(Fatal::Stopped))));
        let higher = VoteAnswer::Done(VoteResponse {
            vote: Vote::new(3, 2),
            vote_granted: false,
            last_log_id: Some(LogId::new(LeaderId::new(2, 1), 40)),
        });
        let read = answer::<VoteResponse<NodeId>, openraft::error::Infallible>(&encode(&higher));
        assert!(matches!(read, Answer::Done(r) if r.vote == Vote::new(3, 2) && !r.vote_granted));
    }

    #[tokio::test]
    async fn a_member_cannot_speak_for_another() {
        let service = RaftService::default();
        let request = encode(&Request::Vote(VoteRequest { vote: Vote::new(5, 1), last_log_id: None }));
        // Node 2 sends node 1's candidacy: not served, whether a Raft runs here or not.
        let read =
            answer::<VoteResponse<NodeId>, openraft::error::Infallible>(&service.handle(2, request).await);
        assert!(matches!(read, Answer::Unavailable(w) if w.contains("node 2") && w.contains("Some(1)")));
        let read = answer::<VoteResponse<NodeId>, openraft::error::Infallible>(
            &service.handle(1, vec![0xff; 3]).await,
        );
        assert!(matches!(read, Answer::Unavailable(w) if w.contains("undecodable")));
    }

    #[tokio::test]
    async fn followers_of_either_version_read_the_leaders_progress() {
        // A follower of this version asks for ages (`Progress`), one of the version
        // before for booleans (`Staleness`): one served function answers both, and the
        // variants before them keep their indexes.
        let service = RaftService::default();
        service.serve_staleness(Arc::new(|| {
            [
                ("dc-b".to_owned(), OriginProgress { age_ms: Some(40), stale: false }),
                ("dc-c".to_owned(), OriginProgress { age_ms: None, stale: true }),
            ]
            .into()
        }));
        let read = answer::<Progress, openraft::error::Infallible>(
            &service.handle(2, encode(&Request::Progress)).await,
        );
        assert!(
            matches!(read, Answer::Done(p) if p == [("dc-b".to_owned(), Some(40)), ("dc-c".to_owned(), None)].into())
        );
        let read = answer::<Staleness, openraft::error::Infallible>(
            &service.handle(2, encode(&Request::Staleness)).await,
        );
        assert!(
            matches!(read, Answer::Done(s) if s == [("dc-b".to_owned(), false), ("dc-c".to_owned(), true)].into())
        );
        assert_eq!(encode(&Request::Staleness), [4]);
        assert_eq!(encode(&Request::LeaderStatus), [5]);
        assert_eq!(encode(&Request::Progress), [6]);
        assert_eq!(encode(&Request::ReadIndex), [7]);
        assert_eq!(encode(&Request::ForwardMany(Vec::new())), [8, 0]);
        assert_eq!(encode(&Request::Elect), [9]);
        assert_eq!(encode(&Request::HoldElections(5)), [10, 5]);
        assert_eq!(encode(&Request::PolicyDigest), [11]);
    }

    #[tokio::test]
    async fn forwarded_writes_in_one_request_are_answered_in_order_and_bounded() {
        let service = RaftService::default();
        service.serve_forwarded(Arc::new(|w: Forwarded| {
            Box::pin(async move {
                ForwardAnswer {
                    status: 200,
                    headers: Vec::new(),
                    body: ByteBuf::from(w.uri.into_bytes()),
                    applied: 1,
                }
            })
        }));
        let writes: Vec<Forwarded> = (0..5)
            .map(|i| Forwarded { uri: format!("/v1/heartbeat/ns/s/{i}"), ..Default::default() })
            .collect();
        let read = answer::<Vec<ForwardAnswer>, openraft::error::Infallible>(
            &service.handle(2, encode(&Request::ForwardMany(writes))).await,
        );
        let Answer::Done(answers) = read else { panic!("not served") };
        let uris: Vec<String> =
            answers.into_iter().map(|a| String::from_utf8(a.body.into_vec()).unwrap()).collect();
        assert_eq!(uris, (0..5).map(|i| format!("/v1/heartbeat/ns/s/{i}")).collect::<Vec<_>>());
        let too_many = vec![Forwarded::default(); FORWARDS_PER_REQUEST_MAX + 1];
        let read = answer::<Vec<ForwardAnswer>, openraft::error::Infallible>(
            &service.handle(2, encode(&Request::ForwardMany(too_many))).await,
        );
        assert!(matches!(read, Answer::Unavailable(w) if w.contains("at most")), "over the bound is refused");
    }

    #[tokio::test]
    async fn only_the_known_leader_may_ask_a_member_to_campaign() {
        // No Raft here: not served. (With one, a request from anyone but the leader it
        // knows is refused: the group tests cover it with a running group.)
        let service = RaftService::default();
        let read =
            answer::<(), openraft::error::Infallible>(&service.handle(2, encode(&Request::Elect)).await);
        assert!(matches!(read, Answer::Unavailable(w) if w.contains("not running")));
    }

    #[test]
    fn a_snapshot_chunk_fits_the_link() {
        // openraft's chunk size by default, with room for the request around it.
        let chunk = openraft::Config::default().snapshot_max_chunk_size as usize;
        assert!(chunk + 64 * 1024 <= FRAME_BYTES_MAX, "{chunk}");
    }
}
