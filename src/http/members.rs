//! Changing a DC group's members over the admin API (`tandem cluster add|remove|replace`;
//! docs/operations.md, "Adding, removing and replacing a member"). Each is an admin call;
//! on a follower it is forwarded to the leader like any write, and waited for as long as
//! a new member's catch-up may take (`forward.rs`).
//!
//! - `POST /v1/admin/cluster/members` `{"id", "raft_addr", "http_addr", "learner"?}`: add a
//!   node (started with `[cluster] join = true`) as a learner, and promote it once caught
//!   up unless `learner` is true.
//! - `DELETE /v1/admin/cluster/members/{id}`: remove a member.
//! - `POST /v1/admin/cluster/members/{id}/replace` `{"id", "raft_addr", "http_addr"}`: add
//!   the new node, and swap it for member `{id}` once caught up.
//!
//! Each answers `{"voters", "learners", "took_ms"}` once the change is committed. Refused,
//! with nothing changed: 409 `would_lose_quorum` (the voters after the change would not
//! include a quorum that answers now), 409 `membership_refused` (removing the leader, an
//! id or address already in the group), 400 `invalid_argument`, 404 `not_found`; 503
//! `membership_change_failed` when a change is under way, the new node did not catch up in
//! time (it stays a learner) or Raft failed; 503 `not_leader` when the leader changed.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{audit, json_body};
use crate::error::{ApiError, CHANGE_FAILED, MEMBERSHIP_REFUSED, NOT_LEADER, WOULD_LOSE_QUORUM};
use crate::node::group::{Change, MembershipError};
use crate::shared::NodeShared;

/// Where members are added (and, with `/{id}`, removed and replaced).
pub const MEMBERS_PATH: &str = "/v1/admin/cluster/members";

/// A node to add, or to put in a member's place.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewMember {
    id: u64,
    raft_addr: SocketAddr,
    http_addr: SocketAddr,
    /// Leave it a learner (it catches up and follows, and votes for no one).
    #[serde(default)]
    learner: bool,
}

pub async fn add(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
    body: Result<Json<NewMember>, JsonRejection>,
) -> Result<Response, ApiError> {
    let m = json_body(body)?;
    note.target(format!("node {}", m.id));
    let change = Change::Add { id: m.id, raft_addr: m.raft_addr, http_addr: m.http_addr, voter: !m.learner };
    run(&node, change).await
}

pub async fn remove(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
    Path(id): Path<u64>,
) -> Result<Response, ApiError> {
    note.target(format!("node {id}"));
    run(&node, Change::Remove { id }).await
}

pub async fn replace(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
    Path(old): Path<u64>,
    body: Result<Json<NewMember>, JsonRejection>,
) -> Result<Response, ApiError> {
    let m = json_body(body)?;
    note.target(format!("node {old} by node {}", m.id));
    if m.learner {
        return Err(ApiError::invalid_field("learner", "a replacement becomes a voter"));
    }
    run(&node, Change::Replace { old, id: m.id, raft_addr: m.raft_addr, http_addr: m.http_addr }).await
}

async fn run(node: &NodeShared, change: Change) -> Result<Response, ApiError> {
    let Some(group) = node.group.as_ref() else {
        return Err(ApiError::not_found("this node is not a member of a DC group ([cluster])"));
    };
    let refused = |code, e: MembershipError| ApiError::new(StatusCode::CONFLICT, code, e.to_string());
    match group.change_members(change).await {
        Ok(done) => Ok(Json(done).into_response()),
        Err(e @ MembershipError::NotServing) => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, NOT_LEADER, e.to_string()))
        }
        Err(e @ MembershipError::Invalid(_)) => Err(ApiError::invalid_field("id", e)),
        Err(e @ (MembershipError::Unknown(_) | MembershipError::NotInThisRelease)) => {
            Err(ApiError::not_found(e.to_string()))
        }
        Err(e @ MembershipError::WouldLoseQuorum { .. }) => Err(refused(WOULD_LOSE_QUORUM, e)),
        Err(e @ (MembershipError::Exists(_) | MembershipError::IsLeader(_))) => {
            Err(refused(MEMBERSHIP_REFUSED, e))
        }
        Err(
            e @ (MembershipError::Busy | MembershipError::NotCaughtUp { .. } | MembershipError::Failed(_)),
        ) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, CHANGE_FAILED, e.to_string())),
    }
}
