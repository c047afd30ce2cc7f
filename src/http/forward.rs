//! Writes on a DC group's followers (docs/cluster.md, "Writes on followers"): a write a
//! follower receives goes to the leader over the member link (QUIC, mutual TLS between
//! members), which serves it like its own client's; the follower answers once its own
//! apply reached the leader's answer, so a client reads its write on the node it wrote to.
//! The client never needs to know who leads.
//!
//! Rules:
//! - A write is any request but GET, HEAD and OPTIONS, except `POST /v1/admin/reload`
//!   (each node reloads its own file).
//! - The follower authenticates the request first (this layer runs inside `auth`,
//!   `rate`, `audit` and `limits`); the leader authenticates it again from the same
//!   credentials (token header, or the client certificate's name the follower verified).
//! - A write is forwarded once: a node that receives a forwarded write and does not lead
//!   answers 503 `not_leader`, never forwards it on.
//! - No leader known, or the leader has not taken over the leases yet: 503 `no_leader`.
//!   No answer from the leader within `[cluster] forward_timeout_ms`: 503
//!   `leader_unreachable` (the write may or may not have been made). Each with
//!   `Retry-After: 1`.
//! - Counted in [`ForwardStats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_bytes::ByteBuf;

use crate::cluster::{ForwardAnswer, Forwarded};
use crate::error::{ApiError, LEADER_UNREACHABLE, NOT_LEADER, NO_LEADER};
use crate::node::group::{Group, WriteRoute};
use crate::shared::NodeShared;

use super::limits::ClientAddr;
use super::tls::ClientCert;

/// The request headers a forwarded write carries (what the leader's handling reads).
pub const FORWARDED_HEADERS: [&str; 5] =
    ["authorization", "content-type", "host", crate::acl::TOKEN_HEADER, super::limits::ADMIN_HEADER];

/// Largest answer the leader sends back for a forwarded write (write answers are small).
pub const FORWARD_ANSWER_BYTES_MAX: usize = 1 << 20;

/// Marks a request that arrived forwarded from another member.
#[derive(Clone, Copy, Debug)]
pub struct ForwardedWrite;

/// What forwarding did, and the group's read refusals, for metrics.
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Writes this node forwarded to the leader, and those that got no answer.
    pub forwarded: AtomicU64,
    pub failed: AtomicU64,
    /// Forwarded writes answered before this node's apply reached them (the wait timed
    /// out; the answer says what the leader did).
    pub apply_wait_timeouts: AtomicU64,
    /// Writes refused for want of a leader (`no_leader`, `not_leader`).
    pub no_leader: AtomicU64,
    /// Writes other members forwarded to this node.
    pub served: AtomicU64,
    /// Blocking queries refused because this member had not applied their index when their
    /// wait ran out (`behind`).
    pub reads_behind: AtomicU64,
    /// Discovery refused because this follower's policy digest differs from its leader's
    /// (`policy_mismatch`).
    pub reads_policy_mismatch: AtomicU64,
}

fn is_write(method: &Method, path: &str) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) && path != "/v1/admin/reload"
}

/// A single lease renewal (`PUT /v1/heartbeat/...`): forwarded in batches.
fn is_heartbeat(method: &Method, path: &str) -> bool {
    *method == Method::PUT && path.starts_with("/v1/heartbeat/")
}

/// A lease renewal, single or a client's batch (`POST /v1/heartbeats`): answered without
/// waiting for the own apply (it writes nothing).
fn is_renewal(method: &Method, path: &str) -> bool {
    is_heartbeat(method, path) || (*method == Method::POST && path == "/v1/heartbeats")
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The layer: serves a write here when this node leads, forwards it when another does.
pub async fn writes(node: &NodeShared, req: Request, routes: &Router) -> Response {
    let Some(group) = node.group.clone() else {
        return super::stack::route(node, routes, req).await;
    };
    if !is_write(req.method(), req.uri().path()) {
        return super::stack::route(node, routes, req).await;
    }
    let stats = &node.forward_stats;
    let forwarded = req.extensions().get::<ForwardedWrite>().is_some();
    match group.route() {
        WriteRoute::Here => super::stack::route(node, routes, req).await,
        WriteRoute::Leader(_) if forwarded => {
            bump(&stats.no_leader);
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                NOT_LEADER,
                "this node no longer leads its DC's group",
            )
            .into_response()
        }
        WriteRoute::NoLeader => {
            bump(&stats.no_leader);
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                NO_LEADER,
                "the DC's group has no leader this node can reach; nothing was written, retry",
            )
            .into_response()
        }
        WriteRoute::Leader(leader) => forward(&group, stats, leader, req).await,
    }
}

async fn forward(group: &Group, stats: &ForwardStats, leader: u64, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, super::REQUEST_BODY_BYTES_MAX).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("a request body is at most {} bytes", super::REQUEST_BODY_BYTES_MAX),
            )
            .into_response()
        }
    };
    let write = Forwarded {
        method: parts.method.to_string(),
        uri: parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.to_string()),
        headers: parts
            .headers
            .iter()
            .filter(|(n, _)| FORWARDED_HEADERS.contains(&n.as_str()))
            .map(|(n, v)| (n.as_str().to_owned(), ByteBuf::from(v.as_bytes().to_vec())))
            .collect(),
        client_cert: parts.extensions.get::<ClientCert>().map(|c| c.0.to_string()),
        client_addr: parts.extensions.get::<ClientAddr>().map(|a| a.0),
        body: ByteBuf::from(body.to_vec()),
    };
    bump(&stats.forwarded);
    let (heartbeat, renewal) =
        (is_heartbeat(&parts.method, parts.uri.path()), is_renewal(&parts.method, parts.uri.path()));
    let answer = if heartbeat {
        group.forward_heartbeat(leader, write).await
    } else if parts.uri.path() == super::TRANSFER_LEADER_PATH {
        // The leader it goes to stops leading by design: wait for its answer.
        group.forward_transfer(leader, write).await
    } else if parts.uri.path().starts_with(super::members::MEMBERS_PATH) {
        // A new member's catch-up takes as long as its snapshot does.
        group.forward_within(leader, write, crate::node::group::CATCH_UP_TIMEOUT * 2).await
    } else {
        group.forward(leader, write).await
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            bump(&stats.failed);
            tracing::warn!(leader, error = %e, "a forwarded write got no answer from the leader");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                LEADER_UNREACHABLE,
                format!(
                    "the leader (node {leader}) did not answer; the write may or may not have been made: {e}"
                ),
            )
            .into_response();
        }
    };
    // Read-your-write on this node: its view is fed by its own applies. A renewal wrote
    // nothing.
    if !renewal && !group.applied(answer.applied, group.forward_timeout()).await {
        bump(&stats.apply_wait_timeouts);
    }
    response_of(answer)
}

fn response_of(answer: ForwardAnswer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut r = Response::new(Body::from(answer.body.into_vec()));
    *r.status_mut() = status;
    for (name, value) in answer.headers {
        if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::from_bytes(&value)) {
            r.headers_mut().append(n, v);
        }
    }
    r
}

/// Serves a write another member forwarded: through this node's whole API (`app`), as
/// its own client's, then answers with the index this node had applied.
pub async fn serve(mut app: super::stack::App, node: Arc<NodeShared>, write: Forwarded) -> ForwardAnswer {
    bump(&node.forward_stats.served);
    let mut builder = axum::http::Request::builder().method(write.method.as_str()).uri(write.uri.as_str());
    for (name, value) in &write.headers {
        builder = builder.header(name.as_str(), value.as_slice());
    }
    let mut req = match builder.body(Body::from(write.body.into_vec())) {
        Ok(r) => r,
        Err(e) => {
            return answer_of(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()), 0)
                .await
        }
    };
    req.extensions_mut().insert(ForwardedWrite);
    if let Some(ip) = write.client_addr {
        req.extensions_mut().insert(ClientAddr(ip));
    }
    if let Some(name) = write.client_cert {
        req.extensions_mut().insert(ClientCert(name.into()));
    }
    let resp = match tower_service::Service::call(&mut app, req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    answer_of(resp, node.group.as_ref().map_or(0, |g| g.sm.applied_index())).await
}

async fn answer_of(resp: impl IntoResponse, applied: u64) -> ForwardAnswer {
    let (parts, body) = resp.into_response().into_parts();
    let body = axum::body::to_bytes(body, FORWARD_ANSWER_BYTES_MAX).await.unwrap_or_default();
    ForwardAnswer {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .filter(|(n, _)| !matches!(n.as_str(), "content-length" | "transfer-encoding" | "connection"))
            .map(|(n, v)| (n.as_str().to_owned(), ByteBuf::from(v.as_bytes().to_vec())))
            .collect(),
        body: ByteBuf::from(body.to_vec()),
        applied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_are_told_apart_from_writes() {
        assert!(is_heartbeat(&Method::PUT, "/v1/heartbeat/ns/svc/i-1"));
        assert!(!is_heartbeat(&Method::POST, "/v1/heartbeats"));
        assert!(is_renewal(&Method::POST, "/v1/heartbeats"));
        assert!(is_renewal(&Method::PUT, "/v1/heartbeat/ns/svc/i-1"));
        assert!(!is_renewal(&Method::PUT, "/v1/instances/ns/svc/i-1/status"));
        assert!(!is_renewal(&Method::POST, "/v1/register"));
    }
}
