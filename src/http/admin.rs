//! The operator's calls under `/v1/admin` that change the node itself rather than an
//! instance: reload the configuration, retire and unretire a DC, hand a group's lead over.
//! (Members and backups have modules of their own: `members`, `backup`.)

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tandem_client::api::{ReloadAnswer, RetireAnswer, RetireRequest, UnretireAnswer};

use super::{audit, json_body};
use crate::error::ApiError;
use crate::shared::NodeShared;

/// POST /v1/admin/reload. A refusal names the key and rule at fault but never echoes the
/// file's text or paths to the caller: those go to the log.
pub(super) async fn reload(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
) -> Result<Response, ApiError> {
    use crate::config::ConfigError;
    use crate::shared::ReloadError;
    let tokens_before = node.acl.current().tokens();
    let result = node.reload();
    note.detail(match &result {
        Ok(()) => format!("tokens {tokens_before} -> {}", node.acl.current().tokens()),
        Err(e) => format!("refused: {}", e.to_string().chars().take(200).collect::<String>()),
    });
    result.map_err(|e| {
        tracing::warn!(error = %e, "configuration reload refused; the old configuration stays");
        let message = match &e {
            ReloadError::Config(ConfigError::Read { .. }) => {
                "cannot read the config file; the node's log says why".to_owned()
            }
            ReloadError::Config(ConfigError::Parse { .. }) => {
                "the config file does not parse; the node's log names the line".to_owned()
            }
            ReloadError::Acl(_) => "the ACL tokens file did not load; the node's log says why".to_owned(),
            ReloadError::Certificates(_) => {
                "the replication certificates did not load; the node's log says why".to_owned()
            }
            ReloadError::HttpsCertificates(_) => {
                "the [http.tls] certificates did not load; the node's log says why".to_owned()
            }
            other => other.to_string(),
        };
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_config", message)
    })?;
    Ok(Json(ReloadAnswer { reloaded: true }).into_response())
}

/// The body of a retire or unretire call: parsed, its DC noted for the audit line, then
/// validated.
fn dc_request(
    body: Result<Json<RetireRequest>, JsonRejection>,
    note: &audit::AuditNote,
) -> Result<RetireRequest, ApiError> {
    let req = json_body(body)?;
    note.target(req.dc.chars().take(64).collect::<String>());
    tandem_schemas::validate_dc("dc", &req.dc).map_err(ApiError::invalid)?;
    Ok(req)
}

/// POST /v1/admin/retire-dc: forget a lost DC's copies and refuse its frames (see
/// docs/replication.md, "Retiring a DC").
pub(super) async fn retire_dc(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
    body: Result<Json<RetireRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = dc_request(body, &note)?;
    if *req.dc == *node.registry.dc {
        return Err(ApiError::invalid_field("dc", "a node cannot retire its own DC"));
    }
    let r = node
        .committer
        .retire(req.dc.clone(), tandem_replicator::gateway::wall_ms())
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    Ok(Json(RetireAnswer {
        dc: req.dc,
        newly_retired: r.newly,
        retired_at_ms: r.at_ms,
        copies_removed: r.changes.len() as u64,
        tombstones_removed: r.tombstones_removed as u64,
    })
    .into_response())
}

/// POST /v1/admin/unretire-dc: the DC may replicate again, from scratch.
pub(super) async fn unretire_dc(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
    body: Result<Json<RetireRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = dc_request(body, &note)?;
    let unretired =
        node.committer.unretire(req.dc).await.map_err(|e| ApiError::unavailable(e.to_string()))?;
    Ok(Json(UnretireAnswer { unretired }).into_response())
}

/// Where a group's lead is handed over (forwarded from a follower like any write, but
/// waited for across the leader change it makes: `forward.rs`).
pub const TRANSFER_LEADER_PATH: &str = "/v1/admin/cluster/transfer-leader";

/// The body of `POST /v1/admin/cluster/transfer-leader`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TransferRequest {
    to: u64,
}

/// POST /v1/admin/cluster/transfer-leader: the group's leader hands its lead to member
/// `to` (docs/cluster.md, "What an operator does"). Sent to a follower, it is forwarded to
/// the leader like any write.
pub(super) async fn transfer_leader(
    State(node): State<Arc<NodeShared>>,
    Extension(note): Extension<audit::AuditNote>,
    body: Result<Json<TransferRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    use crate::node::group::TransferError;
    let req = json_body(body)?;
    note.target(format!("node {}", req.to));
    let Some(group) = node.group.as_ref() else {
        return Err(ApiError::invalid_field("to", "this node is not a member of a DC group ([cluster])"));
    };
    match group.transfer_lead(req.to).await {
        Ok(done) => Ok(Json(done).into_response()),
        Err(e @ TransferError::UnknownMember(_)) => Err(ApiError::invalid_field("to", e)),
        Err(e @ TransferError::NotServing) => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, crate::error::NOT_LEADER, e.to_string()))
        }
        Err(e @ (TransferError::Busy | TransferError::Failed { .. })) => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, crate::error::TRANSFER_FAILED, e.to_string()))
        }
        Err(e @ TransferError::NotInThisRelease) => Err(ApiError::not_found(e.to_string())),
    }
}
