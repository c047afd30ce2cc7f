//! The HTTP side of the audit log (see [`crate::audit`]): run by the one middleware
//! ([`super::stack`]) after authentication, it records every state change and admin call
//! with its outcome, and every refused request (401, 403, 429), sampled. Handlers that
//! learn their target from the body (register, retire) or have a detail to add (status,
//! reload) write it into the request's [`AuditNote`].

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use parking_lot::Mutex;

use super::limits::ClientAddr;
use crate::acl::Principal;
use crate::audit::Record;
use crate::error::ErrorCode;
use crate::shared::NodeShared;

/// Longest target or detail kept (names are validated later; a refused body may be long).
pub const NOTE_CHARS_MAX: usize = 300;

/// What a handler adds to its request's audit line: the target, a detail; or the targets
/// of a batch, each of which gets a line of its own.
#[derive(Clone, Debug, Default)]
pub struct AuditNote(Arc<Mutex<Noted>>);

#[derive(Debug, Default)]
struct Noted {
    target: Option<String>,
    detail: Option<String>,
    /// A batch's targets (a line each); when set, `target` is not used.
    targets: Vec<String>,
}

fn kept(s: String) -> String {
    if s.len() <= NOTE_CHARS_MAX {
        return s;
    }
    s.chars().take(NOTE_CHARS_MAX).collect()
}

impl AuditNote {
    /// The target (at most [`NOTE_CHARS_MAX`] characters are kept).
    pub fn target(&self, t: impl Into<String>) {
        self.0.lock().target = Some(kept(t.into()));
    }
    pub fn detail(&self, d: impl Into<String>) {
        self.0.lock().detail = Some(kept(d.into()));
    }
    /// The targets of a batch that was written: one line each, instead of one for the
    /// request (a batch that failed keeps its single line, with [`target`](Self::target)).
    pub fn targets(&self, ts: impl Iterator<Item = String>) {
        self.0.lock().targets = ts.map(kept).collect();
    }
}

/// The audited action of a request and its target as the path says, if it is one.
fn action(method: &Method, segs: &[&str]) -> Option<(&'static str, Option<String>)> {
    Some(match (method, segs) {
        (&Method::POST, ["v1", "register" | "registrations"]) => ("register", None),
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

/// What [`finish`] needs of a request once its answer is known.
pub struct Pending {
    note: AuditNote,
    method: Method,
    uri: Uri,
    /// The audited action and the target its path names (`None`: only a refusal is logged).
    audited: Option<(&'static str, Option<String>)>,
    principal: Option<Arc<str>>,
    client: Option<ClientAddr>,
}

/// Before the request runs: gives it its [`AuditNote`], and notes what [`finish`] logs.
/// A GET names an audited action only under `/v1/admin`: any other GET path is not looked
/// at, so a read costs no allocation here beyond the note. A path without a `%` decodes to
/// itself: its segments are borrowed, not decoded (one allocation for a heartbeat's).
pub fn begin(node: &NodeShared, req: &mut Request) -> Option<Pending> {
    let note = AuditNote::default();
    req.extensions_mut().insert(note.clone());
    if !node.audit.enabled() {
        return None;
    }
    let path = req.uri().path().trim_start_matches('/');
    let audited = if path.contains('%') {
        let decoded: Vec<String> = path
            .split('/')
            .map(|s| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned())
            .collect();
        let segs: Vec<&str> = decoded.iter().map(String::as_str).collect();
        action(req.method(), &segs)
    } else if req.method() == Method::GET && !path.starts_with("v1/admin") {
        None
    } else {
        action(req.method(), &path.split('/').collect::<Vec<&str>>())
    };
    Some(Pending {
        note,
        method: req.method().clone(),
        uri: req.uri().clone(),
        audited,
        principal: req.extensions().get::<Principal>().map(|p| p.id.clone()),
        client: req.extensions().get::<ClientAddr>().copied(),
    })
}

/// After it ran: its line, when it changed state, was an admin call or was refused.
pub fn finish(node: &NodeShared, pending: Option<Pending>, resp: &Response) {
    let Some(p) = pending else { return };
    let is_refused = refused(resp.status());
    if p.audited.is_none() && !is_refused {
        return;
    }
    let mut rec = line(&p.method, p.uri.path(), p.principal.as_deref().unwrap_or("-"), p.client, resp);
    let Noted { target, detail, targets } = std::mem::take(&mut *p.note.0.lock());
    if let Some((action, path_target)) = p.audited {
        rec.action = action.into();
        if let Some(t) = target.or(path_target) {
            rec.target = t;
        }
    }
    rec.detail = detail;
    if is_refused {
        node.audit.refusal(rec);
    } else if targets.is_empty() {
        node.audit.record(rec);
    } else {
        for t in targets {
            node.audit.record(Record { target: t, ..rec.clone() });
        }
    }
}
