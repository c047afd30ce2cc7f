//! The client-facing HTTP API (JSON under /v1, Prometheus text at /metrics).
//!
//! Every handler validates its input and answers errors as
//! `{"error":{"code":"...","message":"..."}}`; bodies are size-limited before parsing.
//! This module holds no state of its own: it translates HTTP to [`Registry`](crate::registry::Registry) calls.
//! `listener` accepts connections within the node's limits (and, with `[http.tls]`, runs
//! the TLS handshake of `tls`); `limits` refuses what a request may not do (wrong Host,
//! unmarked or too frequent admin calls, too slow).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use tandem_client::api::{
    HeartbeatBatch, RegisterBatch, RegisterBatchAnswer, RegisterRequest, ServiceList, ServiceSummary,
    StatusChange, WriteAnswer,
};

use axum::body::Bytes;

use crate::acl::{Need, Principal};
use crate::error::ApiError;
use crate::registry::DcFilter;
use crate::shared::{AnswerRef, NodeShared};

pub mod admin;
pub mod audit;
pub mod auth;
pub mod backup;
pub mod forward;
pub mod limits;
pub mod listener;
pub mod members;
pub mod rate;
pub mod stack;
pub mod tls;

pub use admin::TRANSFER_LEADER_PATH;

/// Largest accepted request body (the contract's constant: the SDK sizes its batches by it).
pub const REQUEST_BODY_BYTES_MAX: usize = tandem_client::api::REQUEST_BODY_BYTES_MAX;
/// Blocking queries wait this long when `wait` is absent.
pub const WAIT_DEFAULT: Duration = Duration::from_secs(30);
/// And never longer than this.
pub const WAIT_MAX: Duration = Duration::from_secs(300);

/// The node's HTTP application: the checks of [`stack`] around the routes.
pub fn app(node: Arc<NodeShared>) -> stack::App {
    stack::App::new(node.clone(), routes(node))
}

fn routes(node: Arc<NodeShared>) -> Router {
    Router::new()
        .route("/v1/register", post(register))
        .route("/v1/registrations", post(register_batch))
        .route("/v1/heartbeat/{namespace}/{service}/{instance_id}", put(heartbeat))
        .route("/v1/heartbeats", post(heartbeat_batch))
        .route("/v1/instances/{namespace}/{service}/{instance_id}", delete(deregister))
        .route("/v1/instances/{namespace}/{service}/{instance_id}/status", put(set_status))
        .route("/v1/services/{namespace}/{service}", get(discover))
        .route("/v1/services", get(list_services))
        .route("/v1/status", get(status))
        .route("/v1/ready", get(ready))
        .route("/v1/admin/reload", post(admin::reload))
        .route("/v1/admin/retire-dc", post(admin::retire_dc))
        .route("/v1/admin/unretire-dc", post(admin::unretire_dc))
        .route(TRANSFER_LEADER_PATH, post(admin::transfer_leader))
        .route(members::MEMBERS_PATH, post(members::add))
        .route(&format!("{}/{{id}}", members::MEMBERS_PATH), delete(members::remove))
        .route(&format!("{}/{{id}}/replace", members::MEMBERS_PATH), post(members::replace))
        .route(crate::backup::BACKUP_PATH, get(backup::backup))
        .route("/metrics", get(metrics))
        .merge(crate::compat::routes(node.clone()))
        .merge(crate::ui::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(DefaultBodyLimit::max(REQUEST_BODY_BYTES_MAX))
        .with_state(node)
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    match body {
        Ok(Json(v)) => Ok(v),
        Err(rej) => {
            let status = rej.status();
            let code = if status == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "invalid_body" };
            let status =
                if status == StatusCode::PAYLOAD_TOO_LARGE { status } else { StatusCode::BAD_REQUEST };
            Err(ApiError::new(status, code, rej.body_text()))
        }
    }
}

async fn register(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Extension(note): Extension<audit::AuditNote>,
    body: Result<Json<RegisterRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = json_body(body)?;
    let namespace = req.namespace.clone().unwrap_or_else(|| "default".to_owned());
    let id = req.instance_id.clone().unwrap_or_else(|| "(new)".into());
    let service = req.service.clone();
    note.target(format!("{namespace}/{service}/{id}"));
    auth::check(&node, &principal, &Need::Write { namespace: namespace.clone(), service: service.clone() })?;
    let resp = auth::owned(&node, node.registry.register_as(req, &principal.writer()).await)?;
    note.target(format!("{namespace}/{}/{}", service, resp.instance_id));
    Ok((StatusCode::OK, Json(resp)).into_response())
}

async fn register_batch(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Extension(note): Extension<audit::AuditNote>,
    body: Result<Json<RegisterBatch>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(body)?;
    let audited = node.audit.enabled();
    if let (true, Some(r)) = (audited, b.instances.first()) {
        let id = r.instance_id.as_deref().unwrap_or("(new)");
        note.target(format!("{}/{}/{id} and {} more", r.namespace(), r.service, b.instances.len() - 1));
    }
    // Every entry in a service the caller may write, and each named instance the caller's
    // or unowned: one that is not refuses the batch.
    may_write_all(&node, &principal, b.instances.iter().map(|r| (r.namespace(), r.service.as_str())))?;
    let writer = principal.writer();
    for (i, r) in b.instances.iter().enumerate() {
        if let Some(id) = &r.instance_id {
            let owner = node.registry.check_owner(r.namespace(), &r.service, id, &writer);
            auth::owned(&node, owner.map_err(|e| e.at(&format!("instances[{i}]"))))?;
        }
    }
    // The audit lines name each entry's service; the answers name the ids.
    let services: Vec<String> = match audited {
        true => b.instances.iter().map(|r| format!("{}/{}", r.namespace(), r.service)).collect(),
        false => Vec::new(),
    };
    let answers = auth::owned(&node, node.registry.register_batch_as(b.instances, &writer).await)?;
    note.targets(services.iter().zip(&answers).map(|(svc, a)| format!("{svc}/{}", a.instance_id)));
    Ok(Json(RegisterBatchAnswer { instances: answers }).into_response())
}

/// Whether `principal` may write every (namespace, service) of a batch's entries; the
/// first it may not refuses the batch (403). A client's batch names few services, mostly in
/// runs: each run is checked once.
fn may_write_all<'a>(
    node: &NodeShared,
    principal: &Principal,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(), ApiError> {
    let mut checked: Option<(&str, &str)> = None;
    for (namespace, service) in entries {
        if checked != Some((namespace, service)) {
            let need = Need::Write { namespace: namespace.to_owned(), service: service.to_owned() };
            auth::check(node, principal, &need)?;
            checked = Some((namespace, service));
        }
    }
    Ok(())
}

/// A renewal's answer: [`HeartbeatAnswer`](tandem_client::api::HeartbeatAnswer)
/// `{ok: true}` as JSON, written once (a test checks it against the type).
const HEARTBEAT_OK: ([(axum::http::HeaderName, &str); 1], &str) =
    ([(axum::http::header::CONTENT_TYPE, "application/json")], r#"{"ok":true}"#);

async fn heartbeat(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Path((ns, svc, id)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    renew(&node, &ns, &svc, &id, &principal).await
}

/// A single renewal's steps, for its route and for [`plain`].
async fn renew(
    node: &NodeShared,
    ns: &str,
    svc: &str,
    id: &str,
    principal: &Principal,
) -> Result<Response, ApiError> {
    auth::owned(node, node.registry.heartbeat_as(ns, svc, id, &principal.writer()).await)?;
    Ok(HEARTBEAT_OK.into_response())
}

async fn heartbeat_batch(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    body: Result<Json<HeartbeatBatch>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(body)?;
    // Every entry must be the caller's to renew; one that is not refuses the batch.
    may_write_all(&node, &principal, b.instances.iter().map(|i| (i.namespace(), i.service.as_str())))?;
    // And every entry the caller's (or unowned): another principal's instance refuses it too.
    let writer = principal.writer();
    for item in &b.instances {
        auth::owned(
            &node,
            node.registry.check_owner(item.namespace(), &item.service, &item.instance_id, &writer),
        )?;
    }
    let answer = node.registry.heartbeat_batch(&b.instances).await?;
    Ok(Json(answer).into_response())
}

async fn deregister(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Path((ns, svc, id)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let version = auth::owned(&node, node.registry.deregister_as(&ns, &svc, &id, &principal.writer()).await)?;
    Ok(Json(WriteAnswer { version }).into_response())
}

async fn set_status(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Extension(note): Extension<audit::AuditNote>,
    Path((ns, svc, id)): Path<(String, String, String)>,
    body: Result<Json<StatusChange>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(body)?;
    note.detail(format!("to {:?}", b.status));
    let by = principal.writer();
    let version =
        auth::owned(&node, node.registry.set_status_as(&ns, &svc, &id, b.status.into(), &by).await)?;
    Ok(Json(WriteAnswer { version }).into_response())
}

#[derive(Deserialize, Default)]
struct DiscoverQuery {
    index: Option<String>,
    wait: Option<String>,
    dc: Option<String>,
    explain: Option<String>,
    stream: Option<String>,
    consistent: Option<String>,
}

/// A streaming watch writes a bare newline after this long without a change, so that
/// both ends notice a dead connection.
pub const STREAM_KEEPALIVE: Duration = Duration::from_secs(15);

/// Parses `wait`: `250ms`, `10s`, `5m`, or a bare number of seconds.
pub fn parse_wait(s: &str) -> Result<Duration, ApiError> {
    let bad = || ApiError::invalid_field("wait", "use a duration such as 250ms, 30s or 5m (at most 5m)");
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if d > WAIT_MAX {
        return Err(bad());
    }
    Ok(d)
}

fn parse_bool(field: &str, v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("false") | Some("0") => Ok(false),
        Some("") | Some("true") | Some("1") => Ok(true),
        Some(_) => Err(ApiError::invalid_field(field, "must be true or false")),
    }
}

#[allow(clippy::result_large_err)] // errors carry headers (Retry-After); answered at once
async fn discover(
    State(node): State<Arc<NodeShared>>,
    Path((ns, svc)): Path<(String, String)>,
    client: Option<Extension<limits::ClientAddr>>,
    query: Result<Query<DiscoverQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Response> {
    let client = client.map(|Extension(a)| a.0);
    let Query(q) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", e.body_text()))?;
    let filter = match q.dc.as_deref() {
        None | Some("") => DcFilter::Policy,
        Some("all") => DcFilter::All,
        Some(dc) => DcFilter::Only(dc.to_owned()),
    };
    let explain = parse_bool("explain", q.explain.as_deref())?;
    let consistent = parse_bool("consistent", q.consistent.as_deref())?;
    // Validate before blocking, so a bad request fails at once.
    readable(&node, &ns, &svc, &filter)?;
    // A node of a group answers from what it applied; `consistent` first makes sure that
    // is every write acknowledged before the read (a single node always answers so).
    if let (true, Some(g)) = (consistent, &node.group) {
        g.read_barrier().await.map_err(read_barrier_error)?;
    }
    let index: Option<u64> = match q.index.as_deref() {
        None => None,
        Some(i) => {
            Some(i.parse().map_err(|_| ApiError::invalid_field("index", "must be an unsigned integer"))?)
        }
    };
    if parse_bool("stream", q.stream.as_deref())? {
        if explain || q.wait.is_some() {
            return Err(ApiError::invalid_field("stream", "cannot be combined with explain or wait").into());
        }
        let open = limits::take_slot(&node, client, true)?;
        return Ok(stream_answers(node, ns, svc, filter, index, open));
    }
    if let Some(idx) = index {
        let wait = match q.wait.as_deref() {
            Some(w) => parse_wait(w)?,
            None => WAIT_DEFAULT,
        };
        let _waiting = limits::take_slot(&node, client, false)?;
        node.registry.wait_for(&ns, &svc, idx, wait).await;
        if let Some(g) = &node.group {
            behind(node.registry.view().index(), idx, g.cut_off(), g.last_contact_ms()).inspect_err(
                |_| {
                    node.forward_stats.reads_behind.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                },
            )?;
        }
    } else if q.wait.is_some() {
        return Err(ApiError::invalid_field("wait", "needs index").into());
    }
    let (index, body) = if explain {
        let answer = node.registry.discover(&ns, &svc, &filter, true)?;
        (answer.index, Bytes::from(serde_json::to_vec(&answer).unwrap_or_default()))
    } else {
        answer_bytes(&node, &ns, &svc, &filter)?
    };
    Ok(discover_answer(&node, index, body))
}

/// The two requests every client repeats, answered without the router (`stack::route`):
/// a plain discovery (`GET /v1/services/{namespace}/{service}`) and a single renewal
/// (`PUT /v1/heartbeat/{namespace}/{service}/{instance_id}`), each without a query string.
/// Each takes the steps its route takes, in the same order, on the path's segments decoded
/// as the router decodes them, so the answer is the route's (tests/api.rs compares them).
/// Anything else about the request (a query, an empty segment, one that is not UTF-8 once
/// decoded, another method or shape) is `None`, for the route.
pub(crate) async fn plain(node: &NodeShared, req: &axum::http::request::Parts) -> Option<Response> {
    if req.uri.query().is_some() {
        return None;
    }
    let path = req.uri.path();
    let method = &req.method;
    let answer = if method == axum::http::Method::GET {
        let [ns, svc] = segments(path.strip_prefix("/v1/services/")?)?;
        plain_discover(node, &ns, &svc)
    } else if method == axum::http::Method::PUT {
        let [ns, svc, id] = segments(path.strip_prefix("/v1/heartbeat/")?)?;
        renew(node, &ns, &svc, &id, req.extensions.get::<Principal>()?).await
    } else {
        return None;
    };
    Some(answer.unwrap_or_else(IntoResponse::into_response))
}

/// Exactly `N` non-empty segments, each percent-decoded (borrowed when it has no `%`).
fn segments<const N: usize>(rest: &str) -> Option<[std::borrow::Cow<'_, str>; N]> {
    let mut parts = rest.split('/');
    let mut out: [std::borrow::Cow<'_, str>; N] = std::array::from_fn(|_| std::borrow::Cow::Borrowed(""));
    for slot in &mut out {
        let part = parts.next().filter(|p| !p.is_empty())?;
        *slot = percent_encoding::percent_decode_str(part).decode_utf8().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// The discover route's steps for a request with no query.
fn plain_discover(node: &NodeShared, ns: &str, svc: &str) -> Result<Response, ApiError> {
    let filter = DcFilter::Policy;
    readable(node, ns, svc, &filter)?;
    let (index, body) = answer_bytes(node, ns, svc, &filter)?;
    Ok(discover_answer(node, index, body))
}

/// A discovery's first steps: valid names, and on a group's member the leader's policy.
fn readable(node: &NodeShared, ns: &str, svc: &str, filter: &DcFilter) -> Result<(), ApiError> {
    crate::registry::validate_query(ns, svc, filter)?;
    if let Some(g) = &node.group {
        policy_agrees(g).inspect_err(|_| {
            node.forward_stats.reads_policy_mismatch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })?;
    }
    Ok(())
}

/// A discovery answer: its JSON and its index, with a group's headers on a group's node.
fn discover_answer(node: &NodeShared, index: u64, body: Bytes) -> Response {
    // Into the response's own header map (no second map merged into it).
    let mut resp = body.into_response();
    let headers = resp.headers_mut();
    headers.insert(X_TANDEM_INDEX, HeaderValue::from(index));
    headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(g) = &node.group {
        group_headers(headers, g);
    }
    resp
}

/// The answer's index, for a later blocking query.
const X_TANDEM_INDEX: axum::http::HeaderName = axum::http::HeaderName::from_static("x-tandem-index");

/// A follower whose `[failover]`/`[protection]` differ from its leader's (a reload on some
/// members only) refuses discovery rather than answer other than the rest of its DC.
fn policy_agrees(group: &crate::node::group::Group) -> Result<(), ApiError> {
    match group.policy_differs() {
        None => Ok(()),
        Some(theirs) => Err(policy_mismatch(&group.policy_digests().0, &theirs)),
    }
}

fn policy_mismatch(own: &str, theirs: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::error::POLICY_MISMATCH,
        format!(
            "this member's [failover]/[protection] (digest {own}) differ from its leader's ({theirs}): \
             reload the same file on every member; read another member meanwhile"
        ),
    )
}

/// A member of a group whose view stands below a blocking query's `index` once the wait
/// is over refuses (`behind`): the client saw that index on another member, and an answer
/// from here would take it back. Cut off from its leader, it says since when; in contact,
/// it is catching up (a member that just rejoined). (`cut_off` and `last_contact_ms` as
/// `Group::cut_off` and `Group::last_contact_ms` say.) A single node answers at its index
/// whatever the query's (an index from another history, such as a restored one).
fn behind(applied: u64, index: u64, cut_off: bool, last_contact_ms: Option<u64>) -> Result<(), ApiError> {
    if applied >= index {
        return Ok(());
    }
    let contact = match (cut_off, last_contact_ms) {
        (false, _) => "it is catching up with its leader".to_owned(),
        (true, Some(ms)) => format!("it last heard from a leader {ms}ms ago"),
        (true, None) => "it has not heard from a leader since it started".to_owned(),
    };
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::error::BEHIND,
        format!(
            "this member has applied up to index {applied}, behind the query's index {index}, and {contact}; \
             read another member, or query without index to start over"
        ),
    ))
}

/// On a node of a group: whether it knows a leader, and how long ago it last heard from
/// one (0 on the leader; also while no leader is known), so a client can tell a cut-off
/// member's answer.
fn group_headers(headers: &mut HeaderMap, group: &crate::node::group::Group) {
    headers.insert(
        "x-tandem-known-leader",
        HeaderValue::from_static(if group.knows_leader() { "true" } else { "false" }),
    );
    if let Some(ms) = group.last_contact_ms() {
        if let Ok(v) = HeaderValue::from_str(&ms.to_string()) {
            headers.insert("x-tandem-last-contact", v);
        }
    }
}

fn read_barrier_error(e: crate::node::group::ReadBarrierError) -> ApiError {
    use crate::node::group::ReadBarrierError;
    match e {
        ReadBarrierError::NoLeader => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            crate::error::NO_LEADER,
            "consistent: the DC's group has no leader this node can reach; retry, or read without consistent",
        ),
        ReadBarrierError::Unreachable(why) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            crate::error::LEADER_UNREACHABLE,
            format!("consistent: the leader did not confirm this read: {why}"),
        ),
    }
}

/// GET /v1/services/{ns}/{svc}?stream=true: a watch as one long response, newline-
/// delimited JSON. The first line is the current answer (or, with `index=N`, the first
/// answer past N); then one line per change of the answer, each the whole answer with its
/// `index`, exactly as a blocking query would return it. Every watcher woken by a change
/// gets the same encoded bytes (see [`answer_bytes`]), so a change costs one write per
/// watcher and no new request. A watcher that falls behind skips to the latest answer.
/// The stream ends when the node shuts down or the client goes away.
fn stream_answers(
    node: Arc<NodeShared>,
    ns: String,
    svc: String,
    filter: DcFilter,
    after: Option<u64>,
    open: limits::Slot,
) -> Response {
    use futures::StreamExt as _;
    let mut closing = node.closing.clone();
    let state = StreamState { node, ns, svc, filter, last: after, rx: None, _open: open };
    let lines = futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.rx.is_none() {
                st.rx = st.node.registry.subscribe(&st.ns, &st.svc);
            }
            if let Some(l) = st.last {
                let changed = match st.rx.as_mut() {
                    // Known service: wait on its own index, subscribed once.
                    Some(rx) => {
                        if *rx.borrow_and_update() > l {
                            true
                        } else {
                            match tokio::time::timeout(STREAM_KEEPALIVE, rx.changed()).await {
                                Ok(Ok(())) => true,
                                // The service was dropped (emptied): watch its absence.
                                Ok(Err(_)) => {
                                    st.rx = None;
                                    continue;
                                }
                                Err(_) => false,
                            }
                        }
                    }
                    // Not (yet) in the view: wait on its absence bucket, then look again.
                    None => {
                        st.node.registry.wait_for(&st.ns, &st.svc, l, STREAM_KEEPALIVE).await;
                        st.node.registry.service_index(&st.ns, &st.svc) > l
                    }
                };
                if !changed {
                    return Some((Ok::<_, std::convert::Infallible>(Bytes::from_static(b"\n")), st));
                }
            }
            let (idx, bytes) = match answer_bytes(&st.node, &st.ns, &st.svc, &st.filter) {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e.message, "streaming watch ended");
                    return None;
                }
            };
            if st.last.is_some_and(|l| idx <= l) {
                // Woken for another service of its bucket: wait again.
                continue;
            }
            st.node.registry.counters.watch_wakeups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            st.last = Some(idx);
            return Some((Ok(bytes), st));
        }
    })
    // Ends with the node: one waiter for the stream's whole life.
    .take_until(async move {
        let _ = closing.wait_for(|c| *c).await;
    });
    let mut headers = HeaderMap::new();
    headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    headers.insert(axum::http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (headers, axum::body::Body::from_stream(lines)).into_response()
}

struct StreamState {
    node: Arc<NodeShared>,
    ns: String,
    svc: String,
    filter: DcFilter,
    last: Option<u64>,
    rx: Option<tokio::sync::watch::Receiver<u64>>,
    /// Its place among the streaming watches (`tandem_watch_streams`), for its whole life.
    _open: limits::Slot,
}

/// Most discovery answers kept encoded (see [`answer_bytes`]).
const ANSWER_CACHE_ENTRIES_MAX: usize = 16_384;

/// The encoded answer for (service, filter) at the service's current index, newline-
/// terminated.
///
/// An answer (without `explain`) is a function of the service's index and of its remote
/// owners' stale flags: every event and failover switch moves the index, but a remote origin
/// turning stale or fresh moves it only at the lease checker's next pass. So an answer is
/// kept with both and served again while both hold; a read that finds the flags changed
/// moves the index itself ([`crate::registry::Registry::staleness_moved`]). When thousands
/// of watchers wake for one change, the answer is computed and encoded once and the same
/// bytes go to all of them.
fn answer_bytes(node: &NodeShared, ns: &str, svc: &str, filter: &DcFilter) -> Result<(u64, Bytes), ApiError> {
    let (current, flags) = node.registry.answer_state(ns, svc);
    let kept = node.answers.lock().get(&AnswerRef(ns, svc, filter_key(filter))).cloned();
    if let Some((idx, kept_flags, bytes)) = kept.filter(|k| k.0 == current) {
        if Some(kept_flags) == flags {
            node.registry.counters.discover_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok((idx, bytes));
        }
        node.registry.staleness_moved(ns, svc, idx);
    }
    let answer = node.registry.discover(ns, svc, filter, false)?;
    // Ends with a newline: a streaming watch sends these bytes as one line as they are.
    let mut encoded = serde_json::to_vec(&answer).unwrap_or_default();
    encoded.push(b'\n');
    let bytes = Bytes::from(encoded);
    // An absent service's answer is cheap and not kept: reads of made-up names store nothing.
    // Nor is one whose flags are not packed (more than `STALE_FLAGS_MAX` remote owners).
    let Some(flags) = flags else {
        return Ok((answer.index, bytes));
    };
    let mut cache = node.answers.lock();
    if cache.len() >= ANSWER_CACHE_ENTRIES_MAX {
        cache.clear();
    }
    let key = (ns.to_owned(), svc.to_owned(), filter_key(filter).to_owned());
    cache.insert(key, (answer.index, flags, bytes.clone()));
    Ok((answer.index, bytes))
}

fn filter_key(f: &DcFilter) -> &str {
    match f {
        DcFilter::Policy => "",
        DcFilter::All => "*all",
        DcFilter::Only(dc) => dc,
    }
}

#[derive(Deserialize)]
struct ListQuery {
    namespace: Option<String>,
}

async fn list_services(
    State(node): State<Arc<NodeShared>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", e.body_text()))?;
    let ns = q.namespace.unwrap_or_else(|| "default".into());
    let list = node.registry.list_services(&ns)?;
    let services: Vec<ServiceSummary> =
        list.into_iter().map(|(service, instances)| ServiceSummary { service, instances }).collect();
    let index = node.registry.view().index();
    Ok(Json(ServiceList { namespace: ns, index, services }).into_response())
}

async fn status(State(node): State<Arc<NodeShared>>) -> Response {
    Json(node.status_answer().await).into_response()
}

/// GET /v1/ready: readiness (for a load balancer or a Kubernetes readiness probe), as
/// opposed to liveness (`/v1/status` answers as long as the process serves HTTP). 200
/// when the node takes writes; 503 `log_unwritable` (with `Retry-After`) while a failed
/// write keeps the event log from taking writes, 503 `shutting_down` once it stops.
async fn ready(State(node): State<Arc<NodeShared>>) -> Response {
    if *node.closing.borrow() {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the node is shutting down")
            .into_response();
    }
    let health = node.committer.log_health();
    if !health.writable {
        let reason = health.reason.unwrap_or_default();
        let for_ms = health.unwritable_for_ms.unwrap_or_default();
        return ApiError::log_unwritable(format!(
            "the event log takes no writes ({reason}) for {for_ms} ms; the node retries by itself"
        ))
        .into_response();
    }
    Json(serde_json::json!({ "ready": true })).into_response()
}

async fn metrics(State(node): State<Arc<NodeShared>>) -> Response {
    let body = node.render_metrics();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_parses_units_and_refuses_too_long() {
        assert_eq!(parse_wait("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_wait("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_wait("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_wait("7").unwrap(), Duration::from_secs(7));
        assert!(parse_wait("6m").is_err());
        assert!(parse_wait("1h").is_err());
        assert!(parse_wait("x").is_err());
        assert!(parse_wait("99999999999999999999m").is_err());
    }

    /// A client that saw index 120 on one member asks a member that applied only up to
    /// 100: that member refuses rather than take the client back, cut off or catching up
    /// (just rejoined); caught up, it answers.
    #[test]
    fn a_cut_off_member_behind_the_query_index_refuses_instead_of_going_back() {
        let refused = behind(100, 120, true, Some(2_500)).unwrap_err();
        assert_eq!((refused.status, refused.code), (StatusCode::SERVICE_UNAVAILABLE, crate::error::BEHIND));
        assert!(refused.message.contains("100") && refused.message.contains("2500ms"), "{}", refused.message);
        let resp = refused.into_response();
        assert_eq!(resp.headers().get(axum::http::header::RETRY_AFTER).unwrap(), "1");
        assert!(behind(100, 120, true, None).unwrap_err().message.contains("not heard from a leader"));
        let catching_up = behind(100, 120, false, Some(50)).unwrap_err();
        assert!(catching_up.message.contains("catching up"), "{}", catching_up.message);
        assert!(behind(120, 120, true, Some(2_500)).is_ok(), "caught up with the client: answers");
    }

    /// The renewal's pre-written answer is the JSON of the type the client reads.
    #[test]
    fn the_heartbeat_answer_is_the_types_json() {
        let (headers, body) = HEARTBEAT_OK;
        let typed = tandem_client::api::HeartbeatAnswer { ok: true };
        assert_eq!(body, serde_json::to_string(&typed).unwrap());
        assert_eq!(headers[0].1, "application/json");
    }
}
