//! The one middleware every route runs, in this order: authentication and authorization
//! ([`auth`]), the audit line around the rest ([`audit`]), the request rates ([`rate`]),
//! the Host and admin checks and the time budget ([`limits`]), then, on a DC group's
//! follower, a write goes to the leader ([`forward`]).
//!
//! One layer rather than one per check: each axum `from_fn` layer boxes a future and a
//! service and clones the stack below it for every request, a cost the read paths paid five
//! times (docs/benchmarks.md, issue 21).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::{audit, auth, forward, limits, rate};
use crate::shared::NodeShared;

/// The middleware.
pub async fn checks(State(node): State<Arc<NodeShared>>, req: Request, next: Next) -> Response {
    // Outermost: a request without a valid token is refused before it can use any shared
    // budget (the admin call rate among them).
    let mut req = match auth::authorize(&node, req).await {
        Ok(req) => req,
        Err(refused) => return refused,
    };
    // Inside authentication (it knows the principal): state changes, admin calls and
    // refusals to the audit log.
    let pending = audit::begin(&node, &mut req);
    let resp = admitted(&node, req, next).await;
    audit::finish(&node, pending, &resp);
    resp
}

async fn admitted(node: &NodeShared, req: Request, next: Next) -> Response {
    if let Some(refused) = rate::refusal(node, &req) {
        return refused;
    }
    let limit = match limits::admit(node, &req) {
        Ok(limit) => limit,
        Err(refused) => return *refused,
    };
    // Innermost: on a DC group's follower, a write goes to the leader (every check around
    // it ran here first).
    match tokio::time::timeout(limit, forward::writes(node, req, next)).await {
        Ok(resp) => resp,
        Err(_) => limits::timed_out(node, limit),
    }
}
