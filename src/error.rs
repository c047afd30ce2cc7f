//! Errors of the client-facing API, shaped as `{"error":{"code","message"}}` with stable
//! codes. Every variant leaves the registry unchanged unless it says otherwise.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tandem_client::api::ErrorBody;

/// An API error: an HTTP status, a stable machine-readable code and a message for people.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    /// A field broke a rule (400 `invalid_argument`). Nothing changed.
    pub fn invalid(e: tandem_schemas::ValidationError) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", e.to_string())
    }
    pub fn invalid_field(field: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", format!("{field}: {problem}"))
    }
    /// The same error, its message prefixed with where in the request it was found (an
    /// entry of a batch: `instances[3]`).
    pub fn at(mut self, place: &str) -> Self {
        self.message = format!("{place}: {}", self.message);
        self
    }
    /// Unknown instance (404 `not_found`): the client should re-register. Nothing changed.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    /// Another DC owns the instance (409 `not_owner`). Nothing changed.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "not_owner", message)
    }
    /// The write could not be made durable (503 `unavailable`); retrying is safe.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    /// The event log cannot be written now (503 `log_unwritable`, `Retry-After: 1`): a
    /// write failed and the node retries until the disk takes writes again. Nothing was
    /// written; retrying later is safe.
    pub fn log_unwritable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, LOG_UNWRITABLE, message)
    }
}

/// The stable code of [`ApiError::log_unwritable`].
pub const LOG_UNWRITABLE: &str = "log_unwritable";

/// A DC group has no leader this node knows of (an election is under way, or this node
/// is cut off from a quorum), or its leader has not taken over yet: 503 with
/// `Retry-After: 1`. Nothing was written.
pub const NO_LEADER: &str = "no_leader";

/// A write forwarded to the leader did not get an answer (the leader died or was cut off
/// meanwhile): 503 with `Retry-After: 1`. The write may or may not have been made;
/// registrations and deregistrations are safe to retry.
pub const LEADER_UNREACHABLE: &str = "leader_unreachable";

/// A write forwarded to a node that no longer leads (it is forwarded once, never on):
/// 503 with `Retry-After: 1`. Nothing was written.
pub const NOT_LEADER: &str = "not_leader";

/// A blocking query's `index` is ahead of what this member of a DC group applied when its
/// `wait` ran out (it is cut off from its leader, or catching up): 503 with `Retry-After:
/// 1` rather than an answer at a lower index than the client already saw (read another
/// member, or query without `index` to start over).
pub const BEHIND: &str = "behind";

/// A follower's `[failover]`/`[protection]` differ from its leader's (a reload on some
/// members only): it refuses discovery (503, `Retry-After: 1`) rather than answer other
/// than the rest of its DC; the client reads another member. Reload the same file on
/// every member.
pub const POLICY_MISMATCH: &str = "policy_mismatch";

/// A leadership transfer did not happen (`POST /v1/admin/cluster/transfer-leader`): the
/// target did not answer, catch up or win in time, or another transfer is under way
/// (503). The leader keeps, or takes back, the lead; nothing was lost.
pub const TRANSFER_FAILED: &str = "transfer_failed";

/// A membership change would leave the group's voters without a quorum that answers now
/// (409): nothing changed. Bring the down members back, or remove a dead one first.
pub const WOULD_LOSE_QUORUM: &str = "would_lose_quorum";

/// A membership change that is refused by rule (409): removing the leader (hand the lead
/// over first), a node id or address already in the group. Nothing changed.
pub const MEMBERSHIP_REFUSED: &str = "membership_refused";

/// A membership change did not complete (503): another is under way, the new node did not
/// catch up in time (it stays a learner), or Raft failed.
pub const CHANGE_FAILED: &str = "membership_change_failed";

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.status.as_u16(), self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// So that a handler answering `Result<_, Response>` (an error with headers, such as
/// `Retry-After`) can still use `?` on an `ApiError`.
impl From<ApiError> for Response {
    fn from(e: ApiError) -> Response {
        e.into_response()
    }
}

/// The stable code of an error answer, in its response's extensions (the audit log reads
/// it there rather than parsing the body).
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = matches!(
            self.code,
            LOG_UNWRITABLE | NO_LEADER | LEADER_UNREACHABLE | NOT_LEADER | BEHIND | POLICY_MISMATCH
        );
        let code = self.code;
        let mut r = (self.status, axum::Json(ErrorBody::new(self.code, self.message))).into_response();
        r.extensions_mut().insert(ErrorCode(code));
        if retry {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}
