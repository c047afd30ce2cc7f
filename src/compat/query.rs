//! Consul's prepared queries (`/v1/query`): a stored service query with failover to other
//! DCs, executed by id or name.
//!
//! A query is kept as a persistent record of the reserved namespace [`QUERIES_NS`]
//! (service [`QUERIES_SERVICE`], instance id the query's id, its definition in metadata
//! [`DEFINITION_KEY`]). So it is durable, written through the DC's group like every other
//! change, in backups, and survives restarts and leader changes; the peer DCs hold a copy
//! as they hold every record, and execute only their own queries.
//!
//! Execution maps onto tandem's discovery: the DC's own instances first (never one with a
//! critical check; with `OnlyPassing` never one with a warning either), and when none
//! remains, the failover DCs in order: `Failover.NearestN` takes the first N of tandem's
//! failover policy's `remote_dcs` for the service (every peer, by name, when the policy
//! names none), then `Failover.Datacenters`. A peer whose link is stale is skipped unless
//! the policy's `offer_stale` allows it. `TandemExplain` says what each DC offered.

// Errors here are finished responses, answered at once: their size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tandem_client::api::{RegisterRequest, StatusName};

use super::catalog::{health_entries, json_reply, peer_dcs};
use super::checks::NAMESPACE;
use super::consul::{plain, query_get, query_pairs, text};
use crate::acl::{Need, Principal};
use crate::http::auth;
use crate::shared::NodeShared;

/// The namespace prepared queries are kept in.
pub const QUERIES_NS: &str = "consul-queries";
/// Their service.
pub const QUERIES_SERVICE: &str = "queries";
/// The metadata key of a query's definition.
pub const DEFINITION_KEY: &str = "query";

/// A prepared query's definition, in Consul's field names.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Definition {
    #[serde(default, rename = "ID")]
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub service: ServiceQuery,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceQuery {
    pub service: String,
    #[serde(default)]
    pub failover: FailoverSpec,
    #[serde(default)]
    pub only_passing: bool,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct FailoverSpec {
    #[serde(default, rename = "NearestN")]
    pub nearest_n: usize,
    #[serde(default)]
    pub datacenters: Vec<String>,
}

/// Parses a body as a definition: keys case-insensitive, as Consul's decoder reads them.
fn definition(body: &[u8]) -> Result<Definition, Response> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| text(StatusCode::BAD_REQUEST, format!("Request decode failed: {e}")))?;
    let d: Definition = serde_json::from_value(pascal(v))
        .map_err(|e| text(StatusCode::BAD_REQUEST, format!("Request decode failed: {e}")))?;
    if d.service.service.is_empty() {
        return Err(text(StatusCode::BAD_REQUEST, "Must provide a Service name to query"));
    }
    tandem_schemas::validate_name("service", &d.service.service)
        .map_err(|e| text(StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(d)
}

/// Renames every object key to the definition's spelling (case-insensitive; `_` ignored).
fn pascal(v: Value) -> Value {
    const KEYS: [&str; 9] =
        ["ID", "Name", "Service", "Failover", "OnlyPassing", "Tags", "NearestN", "Datacenters", "Token"];
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let flat = k.replace('_', "");
                    let key =
                        KEYS.iter().find(|c| c.eq_ignore_ascii_case(&flat)).map_or(k, |c| (*c).to_owned());
                    (key, pascal(v))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(pascal).collect()),
        other => other,
    }
}

/// Every query this DC owns.
fn own_queries(node: &NodeShared) -> Vec<Definition> {
    let mut out = Vec::new();
    node.registry.each_instance(QUERIES_NS, |svc, _, r| {
        if svc == QUERIES_SERVICE && *r.key.owner_dc == *node.registry.dc {
            if let Some(d) = r.metadata.get(DEFINITION_KEY).and_then(|d| serde_json::from_str(d).ok()) {
                out.push(d);
            }
        }
    });
    out
}

/// The query with this id, or else this name.
fn find(node: &NodeShared, id_or_name: &str) -> Option<Definition> {
    let all = own_queries(node);
    let by_id = all.iter().position(|d| d.id == id_or_name);
    let at = by_id.or_else(|| all.iter().position(|d| !d.name.is_empty() && d.name == id_or_name))?;
    all.into_iter().nth(at)
}

fn not_found(id: &str) -> Response {
    text(StatusCode::NOT_FOUND, format!("Query not found: {id}"))
}

/// Stores `d` (a new query or a new version of one).
async fn store(node: &NodeShared, principal: &Principal, d: &Definition) -> Result<(), Response> {
    auth::check(
        node,
        principal,
        &Need::Write { namespace: NAMESPACE.into(), service: d.service.service.clone() },
    )
    .map_err(plain)?;
    if !d.name.is_empty() && own_queries(node).iter().any(|o| o.name == d.name && o.id != d.id) {
        return Err(text(
            StatusCode::BAD_REQUEST,
            format!("name {:?} aliases an existing query name", d.name),
        ));
    }
    let req = RegisterRequest {
        namespace: Some(QUERIES_NS.into()),
        service: QUERIES_SERVICE.into(),
        instance_id: Some(d.id.clone()),
        address: "127.0.0.1".into(),
        port: 1,
        zone: None,
        weight: Some(0),
        version: None,
        tags: None,
        metadata: Some(BTreeMap::from([(
            DEFINITION_KEY.to_owned(),
            serde_json::to_string(d).unwrap_or_default(),
        )])),
        ttl_ms: None,
        persistent: Some(true),
        status: Some(StatusName::OutOfService),
    };
    auth::owned(node, node.registry.register_as(req, &principal.writer()).await).map(drop).map_err(plain)
}

/// `POST /v1/query`: creates a query; answers its id.
pub async fn create(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    body: Bytes,
) -> Response {
    let mut d = match definition(&body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    d.id = uuid::Uuid::new_v4().to_string();
    match store(&node, &principal, &d).await {
        Ok(()) => axum::Json(json!({"ID": d.id})).into_response(),
        Err(r) => r,
    }
}

/// `GET /v1/query`: every query of the DC.
pub async fn list(State(node): State<Arc<NodeShared>>) -> Response {
    json_reply(&node, node.registry.view().index(), &json!(own_queries(&node)))
}

/// `GET`, `PUT` (replace) and `DELETE /v1/query/{id}`.
pub async fn one(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    method: axum::http::Method,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let Some(old) = find(&node, &id) else { return not_found(&id) };
    let need = |svc: &str, write: bool| {
        let (namespace, service) = (NAMESPACE.to_owned(), svc.to_owned());
        if write {
            Need::Write { namespace, service }
        } else {
            Need::Read { namespace, service: Some(service) }
        }
    };
    match method {
        axum::http::Method::PUT => {
            let mut d = match definition(&body) {
                Ok(d) => d,
                Err(r) => return r,
            };
            if let Err(e) = auth::check(&node, &principal, &need(&old.service.service, true)) {
                return plain(e);
            }
            d.id = old.id;
            store(&node, &principal, &d).await.map_or_else(|r| r, |()| StatusCode::OK.into_response())
        }
        axum::http::Method::DELETE => {
            if let Err(e) = auth::check(&node, &principal, &need(&old.service.service, true)) {
                return plain(e);
            }
            let gone =
                node.registry.deregister_as(QUERIES_NS, QUERIES_SERVICE, &old.id, &principal.writer()).await;
            auth::owned(&node, gone).map_or_else(plain, |_| StatusCode::OK.into_response())
        }
        _ => match auth::check(&node, &principal, &need(&old.service.service, false)) {
            Err(e) => plain(e),
            Ok(()) => json_reply(&node, node.registry.view().index(), &json!([old])),
        },
    }
}

/// The DCs a query fails over to, in order.
fn failover_dcs(node: &NodeShared, d: &Definition) -> Vec<String> {
    let local = node.registry.config().dc.clone();
    let mut dcs: Vec<String> = Vec::new();
    if d.service.failover.nearest_n > 0 {
        let policy = node.registry.config().failover.policy_for(NAMESPACE, &d.service.service);
        let order = if policy.remote_dcs.is_empty() { peer_dcs(node) } else { policy.remote_dcs };
        dcs.extend(order.into_iter().take(d.service.failover.nearest_n));
    }
    for dc in &d.service.failover.datacenters {
        if !dcs.contains(dc) {
            dcs.push(dc.clone());
        }
    }
    dcs.retain(|dc| *dc != local);
    dcs
}

/// `GET /v1/query/{id or name}/execute` (and `/explain`, which answers the definition and
/// what each DC offered).
pub async fn execute(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Path((id, verb)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Response {
    if verb != "execute" && verb != "explain" {
        return text(StatusCode::NOT_FOUND, format!("no such query action {verb:?}: execute or explain"));
    }
    let Some(d) = find(&node, &id) else { return not_found(&id) };
    let svc = d.service.service.clone();
    if let Err(e) = auth::check(
        &node,
        &principal,
        &Need::Read { namespace: NAMESPACE.into(), service: Some(svc.clone()) },
    ) {
        return plain(e);
    }
    let pairs = query_pairs(&q);
    let limit: usize =
        query_get(&pairs, "limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let only_passing = d.service.only_passing;
    let keep = |e: &Value| {
        e["Checks"].as_array().is_some_and(|cs| {
            cs.iter().all(|c| c["Status"] != "critical" && (!only_passing || c["Status"] == "passing"))
        })
    };
    let local = node.registry.config().dc.clone();
    let policy = node.registry.config().failover.policy_for(NAMESPACE, &svc);
    let mut explain: Vec<String> = Vec::new();
    let mut answer: Option<(String, Vec<Value>, usize, u64)> = None;
    let mut failovers = 0usize;
    for (n, dc) in std::iter::once(local.clone()).chain(failover_dcs(&node, &d)).enumerate() {
        if n > 0 {
            failovers += 1;
            if !peer_dcs(&node).contains(&dc) {
                explain.push(format!("{dc}: not a peer DC of {local}"));
                continue;
            }
            if node.registry.origin_stale(&dc) && !policy.offer_stale {
                explain.push(format!(
                    "{dc}: its copies are stale here and the failover policy does not offer stale ones"
                ));
                continue;
            }
        }
        let (index, found) = match health_entries(&node, &svc, &dc, &d.service.tags, keep) {
            Ok(x) => x,
            Err(r) => return r,
        };
        explain.push(format!(
            "{dc}: {} instance(s) {}",
            found.len(),
            if only_passing { "passing" } else { "not critical" }
        ));
        if !found.is_empty() {
            answer = Some((dc, found, failovers, index));
            break;
        }
    }
    let (dc, nodes, failovers, index) =
        answer.unwrap_or((local, Vec::new(), failovers, node.registry.view().index()));
    let nodes: Vec<Value> = nodes.into_iter().take(limit).collect();
    let body = if verb == "explain" {
        json!({"Query": d, "TandemExplain": explain})
    } else {
        json!({
            "Service": svc, "Nodes": nodes, "DNS": {"TTL": ""}, "Datacenter": dc, "Failovers": failovers,
            "TandemExplain": explain,
        })
    };
    json_reply(&node, index, &body)
}
