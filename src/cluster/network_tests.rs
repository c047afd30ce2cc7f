//! The member link's requests and answers (`network.rs`): their encoding, who may send
//! what, and the bounds.

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
    assert!(matches!(read, Answer::Refused(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(_)))));
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
    let read = answer::<VoteResponse<NodeId>, openraft::error::Infallible>(&service.handle(2, request).await);
    assert!(matches!(read, Answer::Unavailable(w) if w.contains("node 2") && w.contains("Some(1)")));
    let read =
        answer::<VoteResponse<NodeId>, openraft::error::Infallible>(&service.handle(1, vec![0xff; 3]).await);
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
    let read =
        answer::<Progress, openraft::error::Infallible>(&service.handle(2, encode(&Request::Progress)).await);
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
    assert_eq!(encode(&Request::LogState), [12]);
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
    let writes: Vec<Forwarded> =
        (0..5).map(|i| Forwarded { uri: format!("/v1/heartbeat/ns/s/{i}"), ..Default::default() }).collect();
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
async fn a_member_emulating_the_previous_release_cannot_read_what_came_since() {
    // The rolling-upgrade drill's old members: a batch of heartbeats and the policy
    // question come back undecodable, so the current members take their fallbacks;
    // a single forwarded write is still served.
    let service = RaftService::default();
    service.serve_forwarded(Arc::new(|_: Forwarded| Box::pin(async { ForwardAnswer::default() })));
    service.set_policy_digest("d".into());
    service.emulate_previous_release(true);
    let read = answer::<Vec<ForwardAnswer>, openraft::error::Infallible>(
        &service.handle(2, encode(&Request::ForwardMany(vec![Forwarded::default()]))).await,
    );
    assert!(matches!(read, Answer::Unavailable(w) if w.starts_with("undecodable request")));
    let read = answer::<String, openraft::error::Infallible>(
        &service.handle(2, encode(&Request::PolicyDigest)).await,
    );
    assert!(matches!(read, Answer::Unavailable(w) if w.starts_with("undecodable request")));
    let read = answer::<ForwardAnswer, openraft::error::Infallible>(
        &service.handle(2, encode(&Request::Forward(Forwarded::default()))).await,
    );
    assert!(matches!(read, Answer::Done(_)));
    service.emulate_previous_release(false);
    let read = answer::<String, openraft::error::Infallible>(
        &service.handle(2, encode(&Request::PolicyDigest)).await,
    );
    assert!(matches!(read, Answer::Done(d) if d == "d"));
}

#[tokio::test]
async fn a_member_back_from_a_disk_loss_holds_its_votes_until_its_log_reaches_the_group() {
    let service = RaftService::default();
    assert_eq!(service.votes_held_until(), None, "a member votes by default");
    service.hold_votes_until(40);
    // No Raft yet: its log reaches nothing, so the hold stands.
    assert_eq!(service.votes_held_until(), Some(40));
    service.hold_votes_until(0);
    assert_eq!(service.votes_held_until(), None);
    // Asked how far its log reaches before its Raft runs: not answered (the asker counts
    // it as unknown, not as an empty log).
    let read =
        answer::<u64, openraft::error::Infallible>(&service.handle(2, encode(&Request::LogState)).await);
    assert!(matches!(read, Answer::Unavailable(w) if w.contains("not running")));
}

#[tokio::test]
async fn only_the_known_leader_may_ask_a_member_to_campaign() {
    // No Raft here: not served. (With one, a request from anyone but the leader it
    // knows is refused: the group tests cover it with a running group.)
    let service = RaftService::default();
    let read = answer::<(), openraft::error::Infallible>(&service.handle(2, encode(&Request::Elect)).await);
    assert!(matches!(read, Answer::Unavailable(w) if w.contains("not running")));
}

#[test]
fn a_snapshot_chunk_fits_the_link() {
    // openraft's chunk size by default, with room for the request around it.
    let chunk = openraft::Config::default().snapshot_max_chunk_size as usize;
    assert!(chunk + 64 * 1024 <= FRAME_BYTES_MAX, "{chunk}");
}
