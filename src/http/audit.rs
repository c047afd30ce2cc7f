//! The HTTP side of the audit log (see [`crate::audit`]): a middleware inside the
//! authentication layer that records every state change and admin call with its outcome,
//! and every refused request (401, 403, 429), sampled. Handlers that learn their target
//! from the body (register, retire) or have a detail to add (status, reload) write it into
//! the request's [`AuditNote`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use parking_lot::Mutex;

use super::limits::ClientAddr;
use crate::acl::Principal;
use crate::audit::Record;
use crate::error::ErrorCode;
use crate::shared::NodeShared;

/// Longest target or detail kept (names are validated later; a refused body may be long).
pub const NOTE_CHARS_MAX: usize = 300;

/// What a handler adds to its request's audit line: the target, a detail.
#[derive(Clone, Debug, Default)]
pub struct AuditNote(Arc<Mutex<(Option<String>, Option<String>)>>);

impl AuditNote {
    /// The target (at most [`NOTE_CHARS_MAX`] characters are kept).
    pub fn target(&self, t: impl Into<String>) {
        self.0.lock().0 = Some(t.into().chars().take(NOTE_CHARS_MAX).collect());
    }
    pub fn detail(&self, d: impl Into<String>) {
        self.0.lock().1 = Some(d.into().chars().take(NOTE_CHARS_MAX).collect());
    }
}

/// The audited action of a request and its target as the path says, if it is one.
fn action(method: &Method, segs: &[&str]) -> Option<(&'static str, Option<String>)> {
    Some(match (method, segs) {
        (&Method::POST, ["v1", "register"]) => ("register", None),
        (&Method::DELETE, ["v1", "instances", ns, svc, id]) => {
            ("deregister", Some(format!("{ns}/{svc}/{id}")))
        }
        (&Method::PUT, ["v1", "instances", ns, svc, id, "status"]) => {
            ("status", Some(format!("{ns}/{svc}/{id}")))
        }
        (&Method::POST, ["v1", "admin", "reload"]) => ("reload", None),
        (&Method::POST, ["v1", "admin", "retire-dc"]) => ("retire_dc", None),
        (&Method::POST, ["v1", "admin", "unretire-dc"]) => ("unretire_dc", None),
        (&Method::GET, ["v1", "admin", "backup"]) => ("backup", None),
        (_, ["v1", "admin", ..]) => ("admin", None),
        _ => return None,
    })
}

/// Whether a status is a refusal (audited sampled).
pub fn refused(status: StatusCode) -> bool {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS)
}

/// The line of one request.
pub fn line(
    req_method: &Method,
    path: &str,
    principal: &str,
    client: Option<ClientAddr>,
    resp: &Response,
) -> Record {
    let status = resp.status();
    Record {
        principal: principal.to_owned(),
        client: client.map_or_else(|| "-".to_owned(), |c| c.0.to_string()),
        action: "request".into(),
        target: format!("{req_method} {path}"),
        outcome: if status.is_success() {
            "ok"
        } else if refused(status) {
            "refused"
        } else {
            "failed"
        }
        .into(),
        status: status.as_u16(),
        code: resp.extensions().get::<ErrorCode>().map(|c| c.0.to_owned()),
        ..Record::default()
    }
}

/// The middleware.
pub async fn record(State(node): State<Arc<NodeShared>>, mut req: Request, next: Next) -> Response {
    let note = AuditNote::default();
    req.extensions_mut().insert(note.clone());
    if !node.audit.enabled() {
        return next.run(req).await;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let decoded: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned())
        .collect();
    let segs: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let audited = action(&method, &segs);
    let principal = req.extensions().get::<Principal>().map_or_else(|| "-".into(), |p| p.id.to_string());
    let client = req.extensions().get::<ClientAddr>().copied();
    let resp = next.run(req).await;
    let is_refused = refused(resp.status());
    if audited.is_none() && !is_refused {
        return resp;
    }
    let mut rec = line(&method, &path, &principal, client, &resp);
    let (target, detail) = std::mem::take(&mut *note.0.lock());
    if let Some((action, path_target)) = audited {
        rec.action = action.into();
        if let Some(t) = target.or(path_target) {
            rec.target = t;
        }
    }
    rec.detail = detail;
    if is_refused {
        node.audit.refusal(rec);
    } else {
        node.audit.record(rec);
    }
    resp
}
