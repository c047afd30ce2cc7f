//! The web console at `/ui/`: one page of plain HTML, CSS and JavaScript embedded in the
//! binary (`assets/`), served by every node, and the few JSON calls it needs besides the
//! public API (`/v1/ui/*`): every service of a namespace with its counts per DC, one
//! aggregated event stream per page, and the reports of `tandem chaos` runs.
//!
//! The page reads only what its token may read: every call it makes goes through the
//! same authentication and scopes as any other client's, and the token travels in a
//! header (the event stream is read with `fetch`, not `EventSource`, for that reason).
//! The static files need no token: they hold no data.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tandem_schemas::{Health, Status};

use crate::acl::{Need, Principal};
use crate::error::ApiError;
use crate::http::limits;
use crate::shared::NodeShared;

/// `[ui]`: the console's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UiSection {
    /// A folder of `tandem chaos` runs (each holding `report.json` and `timeline.svg`,
    /// or sub-folders that do) shown on the console's Drills page.
    #[serde(default)]
    pub drills_dir: Option<PathBuf>,
}

/// The event stream sends a tick this often without a change (the page then refreshes
/// what changes without an event: link states, lag, staleness).
pub const UI_TICK: Duration = Duration::from_secs(2);
/// And coalesces a burst of changes into one event per this long.
pub const UI_COALESCE: Duration = Duration::from_millis(250);
/// Most drill runs the Drills page lists.
pub const DRILL_RUNS_MAX: usize = 200;
/// Largest drill file served.
pub const DRILL_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Only the node's own scripts, styles and images; no frames, no forms elsewhere.
const CSP: &str = "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; \
                   connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// Whether a path is one of the console's static files (served without a token).
pub fn is_static(path: &str) -> bool {
    matches!(path, "/ui" | "/ui/" | "/ui/index.html" | "/ui/app.js" | "/ui/app.css")
}

pub fn routes() -> Router<Arc<NodeShared>> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route("/ui/index.html", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route("/ui/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }))
        .route("/ui/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }))
        .route("/v1/ui/services", get(services))
        .route("/v1/ui/events", get(events))
        .route("/v1/ui/drills", get(drills))
        .route("/v1/ui/drills/{run}/{file}", get(drill_file))
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

#[derive(Deserialize, Default)]
struct NsQuery {
    namespace: Option<String>,
}

/// `GET /v1/ui/services?namespace=`: every service of the namespace with, per DC, its
/// healthy (serving) and total instances and whether that DC's copies are stale here; and
/// the namespaces the caller may read.
async fn services(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Query(q): Query<NsQuery>,
) -> Result<Response, ApiError> {
    let ns = q.namespace.unwrap_or_else(|| "default".to_owned());
    tandem_schemas::validate_name("namespace", &ns).map_err(ApiError::invalid)?;
    let reg = &node.registry;
    let local = reg.dc.to_string();
    let mut dcs = vec![local.clone()];
    dcs.extend(crate::compat::catalog::peer_dcs(&node));
    let mut by_service: BTreeMap<String, BTreeMap<String, (u64, u64)>> = BTreeMap::new();
    reg.each_instance(&ns, |svc, _, r| {
        let c = by_service.entry(svc.to_owned()).or_default().entry(r.key.owner_dc.to_string()).or_default();
        c.1 += 1;
        if matches!(r.health, Health::Healthy | Health::Suspect) && r.status == Status::Up {
            c.0 += 1;
        }
    });
    let stale: BTreeMap<&str, bool> =
        dcs.iter().map(|d| (d.as_str(), *d != local && reg.origin_stale(d))).collect();
    let services: Vec<Value> = by_service
        .into_iter()
        .map(|(svc, per)| {
            let per: serde_json::Map<String, Value> = per
                .into_iter()
                .map(|(dc, (healthy, total))| {
                    let s = stale.get(dc.as_str()).copied().unwrap_or(false);
                    (dc, json!({"healthy": healthy, "total": total, "stale": s}))
                })
                .collect();
            json!({"service": svc, "dcs": per})
        })
        .collect();
    let readable: Vec<String> = reg
        .namespaces()
        .into_iter()
        .filter(|n| principal.check(&Need::Read { namespace: n.clone(), service: None }).is_ok())
        .collect();
    Ok(axum::Json(json!({
        "dc": local, "dcs": dcs, "namespace": ns, "namespaces": readable,
        "index": reg.view().index(), "services": services,
    }))
    .into_response())
}

/// `GET /v1/ui/events`: Server-Sent Events, one stream per page: `data:
/// {"index":N,"kind":"change"|"tick"}` at once, after each change of the node's view
/// (bursts coalesced) and every [`UI_TICK`] without one. It holds a streaming-watch place
/// for its life (`[http] watch_streams_max`, `watch_streams_per_address_max`).
async fn events(
    State(node): State<Arc<NodeShared>>,
    client: Option<Extension<limits::ClientAddr>>,
) -> Result<Response, Response> {
    use futures::StreamExt as _;
    let open = limits::take_slot(&node, client.map(|Extension(a)| a.0), true)?;
    let mut closing = node.closing.clone();
    let first = node.registry.view().index();
    let line =
        |index: u64, kind: &str| Bytes::from(format!("data: {{\"index\":{index},\"kind\":\"{kind}\"}}\n\n"));
    let head = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(line(first, "change")) });
    let rest = futures::stream::unfold((node, first, open), move |(node, last, open)| async move {
        node.registry.wait_for_any(last, UI_TICK).await;
        let now = node.registry.view().index();
        let kind = if now > last {
            tokio::time::sleep(UI_COALESCE).await;
            "change"
        } else {
            "tick"
        };
        let now = node.registry.view().index().max(now);
        Some((Ok(line(now, kind)), (node, now, open)))
    });
    let body = head.chain(rest).take_until(async move {
        let _ = closing.wait_for(|c| *c).await;
    });
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// A run's name as the Drills page names it: `.` (the folder itself) or one sub-folder.
fn run_dir(root: &FsPath, run: &str) -> Option<PathBuf> {
    if run == "." {
        return Some(root.to_path_buf());
    }
    let ok = !run.is_empty()
        && run != ".."
        && run.len() <= 128
        && run.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    ok.then(|| root.join(run))
}

/// `GET /v1/ui/drills`: the runs in `[ui] drills_dir` (the folder itself and its
/// sub-folders holding a `report.json`), each with its drill, seed, mode and result.
async fn drills(State(node): State<Arc<NodeShared>>) -> Response {
    let Some(root) = node.registry.config().ui.drills_dir.clone() else {
        return axum::Json(json!({"dir": null, "runs": []})).into_response();
    };
    let runs = tokio::task::spawn_blocking(move || {
        let mut names = vec![".".to_owned()];
        if let Ok(rd) = std::fs::read_dir(&root) {
            let mut subs: Vec<String> = rd
                .flatten()
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            subs.sort();
            names.extend(subs);
        }
        let mut runs = Vec::new();
        for name in names {
            let Some(dir) = run_dir(&root, &name) else { continue };
            let Ok(text) = std::fs::read_to_string(dir.join("report.json")) else { continue };
            let r: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            runs.push(json!({
                "run": name, "drill": r["drill"], "seed": r["seed"], "mode": r["mode"],
                "result": r["result"], "elapsed_ms": r["elapsed_ms"],
                "timeline": dir.join("timeline.svg").is_file(),
            }));
            if runs.len() >= DRILL_RUNS_MAX {
                break;
            }
        }
        (root, runs)
    })
    .await;
    match runs {
        Ok((root, runs)) => {
            axum::Json(json!({"dir": root.display().to_string(), "runs": runs})).into_response()
        }
        Err(e) => ApiError::unavailable(format!("reading the drills folder failed: {e}")).into_response(),
    }
}

/// `GET /v1/ui/drills/{run}/{report.json|timeline.svg}`.
async fn drill_file(
    State(node): State<Arc<NodeShared>>,
    Path((run, file)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let root = node.registry.config().ui.drills_dir.clone().ok_or_else(|| {
        ApiError::not_found("no drills folder is configured ([ui] drills_dir, or tandem dev --drills)")
    })?;
    let kind = match file.as_str() {
        "report.json" => "application/json",
        "timeline.svg" => "image/svg+xml",
        _ => return Err(ApiError::not_found("a run serves report.json and timeline.svg only")),
    };
    let dir = run_dir(&root, &run).ok_or_else(|| ApiError::invalid_field("run", "a folder name"))?;
    let path = dir.join(&file);
    let bytes = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, ApiError> {
        let len = std::fs::metadata(&path).map_err(|_| ApiError::not_found("no such run or file"))?.len();
        if len > DRILL_FILE_BYTES_MAX {
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "the file is over 16 MiB"));
        }
        std::fs::read(&path).map_err(|e| ApiError::unavailable(format!("reading it failed: {e}")))
    })
    .await
    .map_err(|e| ApiError::unavailable(e.to_string()))??;
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            // An SVG from disk is shown as an image, never run as a document.
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
            ),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        ],
        bytes,
    )
        .into_response())
}
