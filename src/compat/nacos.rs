//! Nacos's naming Open API, version 1: instances (register, modify, deregister, beat,
//! list, detail) and the service list.
//!
//! Names: Nacos's `public` namespace (or none) is tandem's `default`, any other keeps its
//! name. A Nacos service `group@@name` is the tandem service `name` in `DEFAULT_GROUP`
//! and `group::name` in any other group; a tandem service `a::b` reads in Nacos as
//! service `b` of group `a`. Nacos names holding `::` or `@` are refused, so the rule is
//! reversible. An instance's id is Nacos's own, `ip#port#cluster#group@@name`; its
//! cluster is tandem's zone (`DEFAULT` when empty).
//!
//! An ephemeral instance (Nacos's default) has a tandem lease: its beats renew it, and it
//! turns unhealthy after 15 s and goes after 30 s of silence, Nacos's defaults (or after
//! its `preserved.ip.delete.timeout` metadata). A persistent one has none. A list answers
//! as tandem's discovery does with its policy (the protect threshold is Nacos's
//! `protectThreshold`, reported as `reachProtectionThreshold`, and failover may add a
//! peer DC's instances).

// Errors here are finished responses, answered at once: their size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tandem_client::api::{Health, Instance, RegisterRequest, Status, StatusName};

use super::consul::text;
use crate::acl::{Need, Principal};
use crate::error::ApiError;
use crate::http::auth;
use crate::registry::DcFilter;
use crate::shared::NodeShared;

/// Nacos's default group.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";
/// Nacos's default cluster.
pub const DEFAULT_CLUSTER: &str = "DEFAULT";
/// An ephemeral instance's lease when its metadata names none (Nacos's delete timeout).
pub const NACOS_TTL_MS: u64 = 30_000;
/// The beat interval tandem asks Nacos clients for.
pub const BEAT_INTERVAL_MS: u64 = 5_000;
/// Largest `pageSize` of the service list.
pub const PAGE_SIZE_MAX: usize = 1_000;

/// The request's parameters: the query's, then a form body's.
struct Params(Vec<(String, String)>);

impl Params {
    fn of(q: &Option<String>, headers: &HeaderMap, body: &[u8]) -> Params {
        let mut v: Vec<(String, String)> =
            form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()).into_owned().collect();
        let form = headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .is_none_or(|c| c.starts_with("application/x-www-form-urlencoded"));
        if form {
            v.extend(form_urlencoded::parse(body).into_owned());
        }
        Params(v)
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    fn need(&self, key: &str) -> Result<&str, Response> {
        self.get(key).ok_or_else(|| bad(format!("Param '{key}' is required.")))
    }

    fn flag(&self, key: &str, default: bool) -> bool {
        self.get(key).map_or(default, |v| v.eq_ignore_ascii_case("true"))
    }
}

fn bad(message: impl Into<String>) -> Response {
    text(StatusCode::BAD_REQUEST, format!("caused: {}", message.into()))
}

fn err(e: ApiError) -> Response {
    let status = if e.status == StatusCode::NOT_FOUND { StatusCode::BAD_REQUEST } else { e.status };
    text(status, format!("caused: {}", e.message))
}

/// Nacos's namespace as tandem's.
fn namespace(p: &Params) -> String {
    match p.get("namespaceId") {
        None | Some("public") => "default".to_owned(),
        Some(ns) => ns.to_owned(),
    }
}

/// (group, service) of a request: `serviceName` may carry its group as `group@@name`.
fn group_and_name(p: &Params) -> Result<(String, String), Response> {
    let full = p.need("serviceName")?;
    let (group, name) = match full.split_once("@@") {
        Some((g, n)) => (g.to_owned(), n.to_owned()),
        None => (p.get("groupName").unwrap_or(DEFAULT_GROUP).to_owned(), full.to_owned()),
    };
    for (what, v) in [("groupName", &group), ("serviceName", &name)] {
        if v.contains("::") || v.contains('@') || v.is_empty() {
            return Err(bad(format!("{what} {v:?}: tandem refuses '::' and '@' in Nacos names")));
        }
    }
    Ok((group, name))
}

/// The tandem service of a Nacos (group, service).
pub fn tandem_service(group: &str, name: &str) -> String {
    if group == DEFAULT_GROUP {
        name.to_owned()
    } else {
        format!("{group}::{name}")
    }
}

/// The Nacos (group, service) of a tandem service.
pub fn nacos_service(service: &str) -> (&str, &str) {
    service.split_once("::").unwrap_or((DEFAULT_GROUP, service))
}

/// The instance id Nacos gives `ip:port` in `cluster` of `group@@name`.
fn instance_id(ip: &str, port: &str, cluster: &str, group: &str, name: &str) -> String {
    format!("{ip}#{port}#{cluster}#{group}@@{name}")
}

/// The instance a request names: ip, port and cluster from the parameters, or from the
/// `beat` JSON of a beat.
struct Target {
    ns: String,
    group: String,
    name: String,
    service: String,
    ip: String,
    port: String,
    cluster: String,
}

impl Target {
    fn of(p: &Params, beat: Option<&Value>) -> Result<Target, Response> {
        let from_beat = |k: &str| {
            beat.and_then(|b| b.get(k)).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
        };
        let ip = p
            .get("ip")
            .map(str::to_owned)
            .or_else(|| from_beat("ip"))
            .ok_or_else(|| bad("Param 'ip' is required."))?;
        let port = p
            .get("port")
            .map(str::to_owned)
            .or_else(|| from_beat("port"))
            .ok_or_else(|| bad("Param 'port' is required."))?;
        let cluster = p
            .get("clusterName")
            .or(p.get("cluster"))
            .map(str::to_owned)
            .or_else(|| from_beat("cluster"))
            // nacos-sdk-python sends its None as "None" (JSON null in a beat).
            .filter(|c| c != "None" && c != "null")
            .unwrap_or_else(|| DEFAULT_CLUSTER.to_owned());
        let (group, name) = group_and_name(p)?;
        Ok(Target {
            ns: namespace(p),
            service: tandem_service(&group, &name),
            group,
            name,
            ip,
            port,
            cluster,
        })
    }

    fn id(&self) -> String {
        instance_id(&self.ip, &self.port, &self.cluster, &self.group, &self.name)
    }
}

/// `POST` (register) and `PUT` (modify: the same, replacing the instance) and `DELETE`
/// `/nacos/v1/ns/instance`; `GET` is the detail of one instance.
pub async fn instance(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let p = Params::of(&q, &headers, &body);
    let t = match Target::of(&p, None) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if method == Method::GET {
        return detail(&node, &p, &t);
    }
    if let Err(e) =
        auth::check(&node, &principal, &Need::Write { namespace: t.ns.clone(), service: t.service.clone() })
    {
        return err(e);
    }
    let by = principal.writer();
    if method == Method::DELETE {
        return match auth::owned(&node, node.registry.deregister_as(&t.ns, &t.service, &t.id(), &by).await) {
            Ok(_) => "ok".into_response(),
            // Nacos answers ok for an instance that is already gone.
            Err(e) if e.status == StatusCode::NOT_FOUND => "ok".into_response(),
            Err(e) => err(e),
        };
    }
    let req = match registration(&p, &t) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match auth::owned(&node, node.registry.register_as(req, &by).await) {
        Ok(_) => "ok".into_response(),
        Err(e) => err(e),
    }
}

fn registration(p: &Params, t: &Target) -> Result<RegisterRequest, Response> {
    let port: u32 = t.port.parse().map_err(|_| bad("Param 'port' must be a number."))?;
    let weight = match p.get("weight") {
        None => 100,
        Some(w) => {
            let w: f64 = w.parse().map_err(|_| bad("Param 'weight' must be a number."))?;
            if !(0.0..=100.0).contains(&w) {
                return Err(bad("Param 'weight' must be from 0 to 100 (tandem's weight is 100 times it)."));
            }
            (w * 100.0).round() as u32
        }
    };
    let metadata: BTreeMap<String, String> = match p.get("metadata") {
        None => BTreeMap::new(),
        Some(m) => {
            let v: BTreeMap<String, Value> = serde_json::from_str(m)
                .map_err(|e| bad(format!("Param 'metadata' is not a JSON object: {e}")))?;
            v.into_iter().map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_owned))).collect()
        }
    };
    let ephemeral = p.flag("ephemeral", true);
    let ttl_ms = if ephemeral {
        let ttl = match metadata.get("preserved.ip.delete.timeout") {
            Some(v) => v.parse().map_err(|_| bad("metadata preserved.ip.delete.timeout must be ms"))?,
            None => NACOS_TTL_MS,
        };
        Some(ttl)
    } else {
        None
    };
    Ok(RegisterRequest {
        namespace: Some(t.ns.clone()),
        service: t.service.clone(),
        instance_id: Some(t.id()),
        address: t.ip.clone(),
        port,
        zone: Some(t.cluster.clone()),
        weight: Some(weight),
        version: None,
        tags: None,
        metadata: Some(metadata),
        ttl_ms,
        persistent: Some(!ephemeral),
        status: Some(if p.flag("enabled", true) { StatusName::Up } else { StatusName::OutOfService }),
    })
}

/// `PUT /nacos/v1/ns/instance/beat`: renews an ephemeral instance's lease (nothing
/// written unless its health changes). An unknown instance answers code 20404, on which
/// Nacos clients register again.
pub async fn beat(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let p = Params::of(&q, &headers, &body);
    let beat: Option<Value> = match p.get("beat") {
        None => None,
        Some(b) => match serde_json::from_str(b) {
            Ok(v) => Some(v),
            Err(e) => return bad(format!("Param 'beat' is not JSON: {e}")),
        },
    };
    let t = match Target::of(&p, beat.as_ref()) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let id = t.id();
    let need = Need::Write { namespace: t.ns.clone(), service: t.service.clone() };
    if let Err(e) = auth::check(&node, &principal, &need) {
        return err(e);
    }
    // The owner check and the renewal look the instance up once (as PUT /v1/heartbeat).
    let code = match auth::owned(
        &node,
        node.registry.heartbeat_as(&t.ns, &t.service, &id, &principal.writer()).await,
    ) {
        Ok(()) => 10200,
        Err(e) if e.status == StatusCode::NOT_FOUND => 20404,
        Err(e) => return err(e),
    };
    axum::Json(json!({"clientBeatInterval": BEAT_INTERVAL_MS, "code": code, "lightBeatEnabled": true}))
        .into_response()
}

/// One instance as Nacos shows it.
fn host(i: &Instance, group: &str, name: &str) -> Value {
    let cluster = if i.zone.is_empty() { DEFAULT_CLUSTER } else { &*i.zone };
    json!({
        "instanceId": &*i.instance_id, "ip": &*i.address, "port": i.port,
        "weight": f64::from(i.weight) / 100.0,
        "healthy": i.health != Health::Unhealthy, "enabled": i.status == Status::Up,
        "ephemeral": !i.persistent, "clusterName": cluster,
        "serviceName": format!("{group}@@{name}"), "metadata": &i.metadata, "marked": false,
        "instanceHeartBeatInterval": BEAT_INTERVAL_MS, "instanceHeartBeatTimeOut": NACOS_TTL_MS / 2,
        "ipDeleteTimeout": NACOS_TTL_MS,
    })
}

/// `GET /nacos/v1/ns/instance/list?serviceName&groupName&namespaceId&clusters&healthyOnly`.
pub async fn list(
    State(node): State<Arc<NodeShared>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let p = Params::of(&q, &headers, &[]);
    let (group, name) = match group_and_name(&p) {
        Ok(g) => g,
        Err(r) => return r,
    };
    let (ns, service) = (namespace(&p), tandem_service(&group, &name));
    let policy = match node.registry.discover(&ns, &service, &DcFilter::Policy, false) {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let healthy_only = p.flag("healthyOnly", false);
    let mut found: Vec<Instance> = if healthy_only {
        policy
            .instances
            .iter()
            .filter(|i| i.health != Health::Unhealthy || policy.protected)
            .cloned()
            .collect()
    } else {
        // Every own instance, healthy or not, and what the policy adds from peer DCs.
        let local = node.registry.config().dc.clone();
        let own = match node.registry.discover(&ns, &service, &DcFilter::Only(local.clone()), false) {
            Ok(a) => a.instances,
            Err(e) => return err(e),
        };
        own.into_iter().chain(policy.instances.iter().filter(|i| *i.owner_dc != *local).cloned()).collect()
    };
    let clusters: Vec<&str> = p.get("clusters").map(|c| c.split(',').collect()).unwrap_or_default();
    if !clusters.is_empty() {
        found.retain(|i| clusters.contains(&if i.zone.is_empty() { DEFAULT_CLUSTER } else { &*i.zone }));
    }
    let hosts: Vec<Value> = found.iter().map(|i| host(i, &group, &name)).collect();
    axum::Json(json!({
        "name": format!("{group}@@{name}"), "groupName": &group, "clusters": p.get("clusters").unwrap_or(""),
        "cacheMillis": 10_000, "hosts": hosts, "lastRefTime": node.registry.now_ms(), "checksum": "",
        "allIPs": false, "reachProtectionThreshold": policy.protected, "valid": true,
        "dom": format!("{group}@@{name}"), "env": "", "metadata": {},
    }))
    .into_response()
}

/// `GET /nacos/v1/ns/instance`: one instance.
fn detail(node: &NodeShared, p: &Params, t: &Target) -> Response {
    let answer = match node.registry.discover(&t.ns, &t.service, &DcFilter::All, false) {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let id = t.id();
    match answer.instances.iter().find(|i| *i.instance_id == *id) {
        Some(i) if !(p.flag("healthyOnly", false) && i.health == Health::Unhealthy) => {
            let mut h = host(i, &t.group, &t.name);
            h["service"] = json!(format!("{}@@{}", t.group, t.name));
            h["cluster"] = h["clusterName"].clone();
            axum::Json(h).into_response()
        }
        _ => text(StatusCode::NOT_FOUND, "caused: no ips found for cluster in service"),
    }
}

/// `GET /nacos/v1/ns/operator/metrics`: what a Nacos client's server-status call reads.
pub async fn metrics(State(node): State<Arc<NodeShared>>) -> Response {
    let up = node.group.as_ref().is_none_or(|g| g.knows_leader());
    axum::Json(json!({
        "status": if up { "UP" } else { "DOWN" },
        "serviceCount": node.registry.view().service_count(),
        "instanceCount": node.registry.view().instance_count(),
    }))
    .into_response()
}

/// `GET /nacos/v1/ns/service/list?pageNo&pageSize&groupName&namespaceId`.
pub async fn service_list(
    State(node): State<Arc<NodeShared>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let p = Params::of(&q, &headers, &[]);
    let page: usize = p.get("pageNo").and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let size: usize = p.get("pageSize").and_then(|v| v.parse().ok()).unwrap_or(20).clamp(1, PAGE_SIZE_MAX);
    let group = p.get("groupName").unwrap_or(DEFAULT_GROUP);
    let names = match node.registry.list_services(&namespace(&p)) {
        Ok(n) => n,
        Err(e) => return err(e),
    };
    let doms: Vec<&str> =
        names.iter().map(|(s, _)| nacos_service(s)).filter(|(g, _)| *g == group).map(|(_, n)| n).collect();
    let count = doms.len();
    let doms: Vec<&str> = doms.into_iter().skip((page - 1).saturating_mul(size)).take(size).collect();
    axum::Json(json!({"count": count, "doms": doms})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_map_both_ways() {
        assert_eq!(tandem_service(DEFAULT_GROUP, "orders"), "orders");
        assert_eq!(tandem_service("g1", "orders"), "g1::orders");
        assert_eq!(nacos_service("g1::orders"), ("g1", "orders"));
        assert_eq!(nacos_service("orders"), (DEFAULT_GROUP, "orders"));
        assert_eq!(
            instance_id("10.0.0.1", "80", "DEFAULT", "g1", "orders"),
            "10.0.0.1#80#DEFAULT#g1@@orders"
        );
    }
}
