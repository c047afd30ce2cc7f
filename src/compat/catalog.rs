//! Consul's reads: `/v1/health/service/{name}`, `/v1/catalog/service/{name}`,
//! `/v1/catalog/services`, `/v1/catalog/datacenters`, with blocking queries (`index`,
//! `wait`) and the `X-Consul-*` headers.
//!
//! `?dc=` names whose instances to read: this DC's own (the default), or a peer DC's
//! replicated copies held here. Consul has no failover in these reads; its prepared
//! queries do, and tandem's own discovery does with its policy.

// Errors here are finished responses, answered at once: their size does not matter.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tandem_client::api::Instance;
use tandem_schemas::InstanceRecord;

use super::checks::NAMESPACE;
use super::consul::{plain, query_flag, query_get, query_pairs, text};
use super::filter::Filter;
use crate::http::limits;
use crate::registry::DcFilter;
use crate::shared::NodeShared;

/// A blocking query waits this long when `wait` is absent (Consul's default).
pub const CONSUL_WAIT_DEFAULT: Duration = Duration::from_secs(300);
/// And never longer than this (Consul's limit).
pub const CONSUL_WAIT_MAX: Duration = Duration::from_secs(600);

/// The paths of blocking Consul reads.
fn is_blocking_path(path: &str) -> bool {
    path.starts_with("/v1/health/service/") || path.starts_with("/v1/catalog/service")
}

/// How long a Consul blocking read may wait (for the request time budget), `None` for any
/// other request.
pub fn blocking_budget(path: &str, query: &str) -> Option<Duration> {
    if !is_blocking_path(path) {
        return None;
    }
    let pairs = query_pairs(&Some(query.to_owned()));
    query_get(&pairs, "index").filter(|i| !i.is_empty() && *i != "0")?;
    Some(wait_of(&pairs).unwrap_or(CONSUL_WAIT_MAX) + wait_of(&pairs).unwrap_or(CONSUL_WAIT_MAX) / 16)
}

/// `wait`: a Go duration, at most [`CONSUL_WAIT_MAX`] (longer ones are cut to it, as
/// Consul does).
fn wait_of(pairs: &[(String, String)]) -> Result<Duration, Response> {
    match query_get(pairs, "wait") {
        None | Some("") => Ok(CONSUL_WAIT_DEFAULT),
        Some(w) => super::checks::parse_go_duration(w)
            .map(|ms| Duration::from_millis(ms).min(CONSUL_WAIT_MAX))
            .ok_or_else(|| text(StatusCode::BAD_REQUEST, format!("Invalid wait time {w:?}"))),
    }
}

/// The DC a read is about: this one unless `dc` names a peer. An unknown DC is Consul's
/// 500 "No path to datacenter".
pub fn dc_of(node: &NodeShared, pairs: &[(String, String)]) -> Result<String, Response> {
    let cfg = node.registry.config();
    match query_get(pairs, "dc") {
        None | Some("") => Ok(cfg.dc.clone()),
        Some(dc) if dc == cfg.dc => Ok(dc.to_owned()),
        Some(dc) if peer_dcs(node).iter().any(|p| p == dc) => Ok(dc.to_owned()),
        Some(_) => Err(text(StatusCode::INTERNAL_SERVER_ERROR, "No path to datacenter")),
    }
}

/// The peer DCs of this one's configuration.
pub fn peer_dcs(node: &NodeShared) -> Vec<String> {
    let cfg = node.registry.config();
    let mut v: Vec<String> =
        cfg.replication.as_ref().map(|r| r.peers.iter().map(|p| p.dc.clone()).collect()).unwrap_or_default();
    v.sort();
    v
}

/// Waits as a blocking query asks (`index` given and not 0), holding a blocking-query
/// place for it (the node's caps apply). `index_of` reads the index to wait past.
async fn block(
    node: &NodeShared,
    pairs: &[(String, String)],
    client: Option<std::net::IpAddr>,
    service: Option<&str>,
) -> Result<(), Response> {
    let Some(index) = query_get(pairs, "index").filter(|i| !i.is_empty()) else { return Ok(()) };
    let index: u64 =
        index.parse().map_err(|_| text(StatusCode::BAD_REQUEST, format!("Invalid index {index:?}")))?;
    let wait = wait_of(pairs)?;
    if index == 0 {
        return Ok(());
    }
    // Consul adds up to a sixteenth of the wait, so that clients spread out.
    let jitter = Duration::from_millis(rand::Rng::gen_range(
        &mut rand::thread_rng(),
        0..=wait.as_millis() as u64 / 16,
    ));
    let _place = limits::take_slot(node, client, false)?;
    match service {
        Some(svc) => node.registry.wait_for(NAMESPACE, svc, index, wait + jitter).await,
        None => node.registry.wait_for_any(index, wait + jitter).await,
    }
    Ok(())
}

/// The headers every Consul read carries.
fn headers(node: &NodeShared, index: u64) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-consul-index", HeaderValue::from(index.max(1)));
    let (known, contact) = match &node.group {
        None => (true, 0),
        Some(g) => (g.knows_leader(), g.last_contact_ms().unwrap_or(0)),
    };
    h.insert("x-consul-knownleader", HeaderValue::from_static(if known { "true" } else { "false" }));
    h.insert("x-consul-lastcontact", HeaderValue::from(contact));
    h.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h
}

pub fn json_reply(node: &NodeShared, index: u64, v: &Value) -> Response {
    (headers(node, index), Bytes::from(serde_json::to_vec(v).unwrap_or_default())).into_response()
}

/// The selectors a health entry can be filtered on.
fn health_selector_known(sel: &str) -> bool {
    matches!(
        sel,
        "Service.ID"
            | "Service.Service"
            | "Service.Tags"
            | "Service.Address"
            | "Service.Port"
            | "Checks.Status"
            | "Checks.CheckID"
            | "Checks.Name"
            | "Node.Node"
            | "Node.Datacenter"
    ) || sel.strip_prefix("Service.Meta.").is_some_and(|k| !k.is_empty())
}

/// The selectors an agent service (or a catalog entry) can be filtered on.
pub fn agent_selector_known(sel: &str) -> bool {
    matches!(
        sel,
        "ID" | "Service" | "Tags" | "Address" | "Port" | "ServiceID" | "ServiceName" | "ServiceTags"
    ) || ["Meta.", "ServiceMeta."].iter().any(|p| sel.strip_prefix(p).is_some_and(|k| !k.is_empty()))
}

/// The values of selector `sel` (a dotted path) in `v`: a list yields each element, a
/// list of objects each element's field.
fn select(v: &Value, sel: &str) -> Option<Vec<String>> {
    let mut cur = vec![v];
    let mut parts = sel.split('.').peekable();
    while let Some(p) = parts.next() {
        let mut next = Vec::new();
        for c in cur {
            match c {
                Value::Object(m) => {
                    // Meta keys may hold dots: the rest of the path is the key.
                    if p == "Meta" || p == "ServiceMeta" {
                        let rest: Vec<&str> = parts.by_ref().collect();
                        return Some(
                            m.get(p)
                                .and_then(|meta| meta.get(rest.join(".")))
                                .map(scalar)
                                .into_iter()
                                .collect(),
                        );
                    }
                    if let Some(x) = m.get(p) {
                        next.push(x);
                    }
                }
                Value::Array(a) => {
                    for x in a {
                        if let Some(y) = x.get(p) {
                            next.push(y);
                        }
                    }
                }
                _ => {}
            }
        }
        cur = next;
    }
    let mut out = Vec::new();
    for c in cur {
        match c {
            Value::Array(a) => out.extend(a.iter().map(scalar)),
            other => out.push(scalar(other)),
        }
    }
    Some(out)
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What an agent service yields for a selector.
pub fn agent_select(v: &Value, sel: &str) -> Option<Vec<String>> {
    select(v, sel)
}

/// The `filter` of a query, parsed (400 with the reason when tandem cannot apply it).
pub fn parse_filter(
    node: &NodeShared,
    pairs: &[(String, String)],
    known: fn(&str) -> bool,
) -> Result<Option<Filter>, Response> {
    match query_get(pairs, "filter") {
        None | Some("") => Ok(None),
        Some(f) => Filter::parse(f, &known).map(Some).map_err(|e| {
            super::bump(&node.compat.counters.refused_filter);
            text(StatusCode::BAD_REQUEST, format!("Failed to create boolean expression evaluator: {e}"))
        }),
    }
}

/// The instances of `service` owned by `dc`, with the service's index.
fn instances(node: &NodeShared, service: &str, dc: &str) -> Result<(u64, Vec<Instance>), Response> {
    let answer =
        node.registry.discover(NAMESPACE, service, &DcFilter::Only(dc.to_owned()), false).map_err(plain)?;
    Ok((answer.index, answer.instances))
}

/// A tandem instance as the record Consul's shapes are built from.
fn record_of(node: &NodeShared, service: &str, i: &Instance) -> Option<Arc<InstanceRecord>> {
    node.registry
        .instance(NAMESPACE, service, &i.instance_id)
        .map(|(_, r)| r)
        .filter(|r| *r.key.owner_dc == *i.owner_dc)
}

fn node_json(r: &InstanceRecord, index: u64) -> Value {
    json!({
        "ID": "", "Node": &*r.address, "Address": &*r.address, "Datacenter": &*r.key.owner_dc,
        "TaggedAddresses": {}, "Meta": {}, "CreateIndex": index, "ModifyIndex": index,
    })
}

/// What a read of one service starts with: the DC it reads, its filter (selectors
/// `known`), the service name checked, and the wait of a blocking query.
async fn service_read(
    node: &NodeShared,
    pairs: &[(String, String)],
    service: &str,
    client: Option<std::net::IpAddr>,
    known: fn(&str) -> bool,
) -> Result<(String, Option<Filter>), Response> {
    let dc = dc_of(node, pairs)?;
    let filter = parse_filter(node, pairs, known)?;
    tandem_schemas::validate_name("service", service)
        .map_err(|e| text(StatusCode::BAD_REQUEST, e.to_string()))?;
    block(node, pairs, client, Some(service)).await?;
    Ok((dc, filter))
}

/// The `tag` values of a query.
fn tags_of(pairs: &[(String, String)]) -> Vec<String> {
    pairs.iter().filter(|(k, _)| k == "tag").map(|(_, t)| t.clone()).collect()
}

/// `GET /v1/health/service/{name}?passing&tag&dc&index&wait&filter`.
pub async fn health_service(
    State(node): State<Arc<NodeShared>>,
    Path(service): Path<String>,
    client: Option<axum::extract::Extension<limits::ClientAddr>>,
    RawQuery(q): RawQuery,
) -> Response {
    let pairs = query_pairs(&q);
    let run = async {
        let client = client.map(|a| a.0 .0);
        let (dc, filter) = service_read(&node, &pairs, &service, client, health_selector_known).await?;
        let passing = query_flag(&pairs, "passing");
        let keep = |e: &Value| {
            let checks = e["Checks"].as_array().map_or(&[][..], Vec::as_slice);
            (!passing || checks.iter().all(|c| c["Status"] == "passing"))
                && filter.as_ref().is_none_or(|f| f.matches(&|sel| select(e, sel)))
        };
        let (index, out) = health_entries(&node, &service, &dc, &tags_of(&pairs), keep)?;
        Ok::<_, Response>(json_reply(&node, index, &Value::Array(out)))
    };
    run.await.unwrap_or_else(|r| r)
}

/// The health entries (`Node`, `Service`, `Checks`) of `service`'s instances owned by
/// `dc` that carry every tag of `tags` and that `keep` keeps, with the service's index.
pub fn health_entries(
    node: &NodeShared,
    service: &str,
    dc: &str,
    tags: &[String],
    keep: impl Fn(&Value) -> bool,
) -> Result<(u64, Vec<Value>), Response> {
    let (index, found) = instances(node, service, dc)?;
    let mut out = Vec::new();
    for i in &found {
        let Some(r) = record_of(node, service, i) else { continue };
        if !tags.iter().all(|t| r.tags.contains(t)) {
            continue;
        }
        let checks = super::consul::checks_json(service, &r, i.seq);
        let mut svc = super::consul::agent_service(service, &r);
        svc["CreateIndex"] = json!(i.seq);
        svc["ModifyIndex"] = json!(i.seq);
        let entry = json!({"Node": node_json(&r, i.seq), "Service": svc, "Checks": checks});
        if keep(&entry) {
            out.push(entry);
        }
    }
    Ok((index, out))
}

/// `GET /v1/catalog/service/{name}?tag&dc&index&wait&filter`.
pub async fn catalog_service(
    State(node): State<Arc<NodeShared>>,
    Path(service): Path<String>,
    client: Option<axum::extract::Extension<limits::ClientAddr>>,
    RawQuery(q): RawQuery,
) -> Response {
    let pairs = query_pairs(&q);
    let run = async {
        let client = client.map(|a| a.0 .0);
        let (dc, filter) = service_read(&node, &pairs, &service, client, agent_selector_known).await?;
        let tags = tags_of(&pairs);
        let (index, found) = instances(&node, &service, &dc)?;
        let mut out = Vec::new();
        for i in &found {
            let Some(r) = record_of(&node, &service, i) else { continue };
            if !tags.iter().all(|t| r.tags.contains(t)) {
                continue;
            }
            let entry = json!({
                "ID": "", "Node": &*r.address, "Address": &*r.address, "Datacenter": &*r.key.owner_dc,
                "TaggedAddresses": {}, "NodeMeta": {}, "ServiceID": &*r.key.instance_id,
                "ServiceName": &service, "ServiceTags": &r.tags, "ServiceAddress": &*r.address,
                "ServicePort": r.port, "ServiceMeta": super::consul::user_meta(&r),
                "ServiceWeights": {"Passing": r.weight, "Warning": 1}, "ServiceEnableTagOverride": false,
                "CreateIndex": i.seq, "ModifyIndex": i.seq,
            });
            if filter.as_ref().is_some_and(|f| !f.matches(&|sel| select(&entry, sel))) {
                continue;
            }
            out.push(entry);
        }
        Ok::<_, Response>(json_reply(&node, index, &Value::Array(out)))
    };
    run.await.unwrap_or_else(|r| r)
}

/// `GET /v1/catalog/services?dc&index&wait`: every service of the DC with the union of
/// its instances' tags.
pub async fn catalog_services(
    State(node): State<Arc<NodeShared>>,
    client: Option<axum::extract::Extension<limits::ClientAddr>>,
    RawQuery(q): RawQuery,
) -> Response {
    let pairs = query_pairs(&q);
    let run = async {
        let dc = dc_of(&node, &pairs)?;
        block(&node, &pairs, client.map(|a| a.0 .0), None).await?;
        let index = node.registry.view().index();
        let mut out: Map<String, Value> = Map::new();
        let mut tags: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        node.registry.each_instance(NAMESPACE, |svc, _, r| {
            if *r.key.owner_dc == *dc {
                tags.entry(svc.to_owned()).or_default().extend(r.tags.iter().cloned());
            }
        });
        for (svc, t) in tags {
            out.insert(svc, json!(t));
        }
        Ok::<_, Response>(json_reply(&node, index, &Value::Object(out)))
    };
    run.await.unwrap_or_else(|r| r)
}

/// `GET /v1/catalog/datacenters`: this DC first, then its peers.
pub async fn catalog_datacenters(State(node): State<Arc<NodeShared>>) -> Response {
    let mut dcs = vec![node.registry.config().dc.clone()];
    dcs.extend(peer_dcs(&node));
    axum::Json(dcs).into_response()
}
