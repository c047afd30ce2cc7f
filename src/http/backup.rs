//! `GET /v1/admin/backup`: the DC's whole state as a backup (`tandem backup`; see
//! [`crate::backup`]). An admin call, served by the node that serves the DC's writes (a
//! group's leader, or a single node): a follower answers 503 `not_leader` naming the
//! leader's HTTP address (the `tandem` client then asks the next address it was given).
//! The body is the export (`application/octet-stream`, at most [`BACKUP_BYTES_MAX`]),
//! its meta is in the [`BACKUP_META_HEADER`] (JSON). A state too large for one export
//! answers 507 `too_large`. Counted in [`BackupStats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::backup::{meta_of, BACKUP_BYTES_MAX, BACKUP_META_HEADER};
use crate::error::{ApiError, NOT_LEADER};
use crate::node::committer::NodeCommitter;
use crate::shared::NodeShared;
use crate::store::RocksLog;
use tandem_replicator::log::EventLog as _;

/// Backups served, refused (a follower's, a state too large, a storage error) and bytes
/// sent.
#[derive(Debug, Default)]
pub struct BackupStats {
    pub served: AtomicU64,
    pub refused: AtomicU64,
    pub bytes: AtomicU64,
}

pub async fn backup(State(node): State<Arc<NodeShared>>) -> Result<Response, ApiError> {
    let stats = &node.http.backups;
    let taken = take(&node).await;
    let (export, meta) = match taken {
        Ok(v) => v,
        Err(e) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
    };
    stats.served.fetch_add(1, Ordering::Relaxed);
    stats.bytes.fetch_add(export.len() as u64, Ordering::Relaxed);
    tracing::info!(
        dc = %meta.dc,
        bytes = meta.state_bytes,
        applied_index = meta.applied_index,
        own_seq = meta.own_seq,
        "backup served"
    );
    let meta_json = serde_json::to_string(&meta).map_err(|e| ApiError::unavailable(e.to_string()))?;
    let mut resp = (StatusCode::OK, export).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(
        BACKUP_META_HEADER,
        HeaderValue::from_str(&meta_json).map_err(|e| ApiError::unavailable(e.to_string()))?,
    );
    Ok(resp)
}

/// The export and its meta, from the group's state machine or the single node's log.
async fn take(node: &NodeShared) -> Result<(Vec<u8>, crate::backup::BackupMeta), ApiError> {
    let dc = node.registry.config().dc.clone();
    let refused = |e: tandem_replicator::log::LogError| {
        let text = e.to_string();
        if text.contains("cannot be exported") {
            ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "too_large",
                format!("{text} (at most {BACKUP_BYTES_MAX})"),
            )
        } else {
            ApiError::unavailable(format!("cannot take the backup: {text}"))
        }
    };
    if let Some(group) = &node.group {
        if !group.serving() {
            let leader = group.leader().filter(|l| *l != group.id);
            let at = leader
                .and_then(|l| group.members().into_iter().find(|m| m.id == l))
                .and_then(|m| m.http_addr)
                .map_or_else(String::new, |a| format!(" at {a}"));
            let who =
                leader.map_or_else(|| "no leader is known".to_owned(), |l| format!("node {l}{at} leads"));
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                NOT_LEADER,
                format!("a backup is taken from the member that serves the DC's writes; this one does not ({who})"),
            ));
        }
        let (export, index, own) = group.sm.backup().await.map_err(refused)?;
        let meta = meta_of(&dc, Some(group.id), index, (own.epoch, own.seq), &export);
        return Ok((export, meta));
    }
    let NodeCommitter::Single(c) = &node.committer else {
        return Err(ApiError::unavailable("a group's committer without a group"));
    };
    let (export, own) = c
        .with_log(|log: &mut RocksLog| {
            log.export_state(BACKUP_BYTES_MAX).map(|export| (export, log.own_mark()))
        })
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot take the backup: {e:?}")))?
        .map_err(refused)?;
    let meta = meta_of(&dc, None, 0, (own.epoch, own.seq), &export);
    Ok((export, meta))
}
