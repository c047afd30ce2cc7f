//! Consul's agent API: register and deregister services with TTL checks, the checks'
//! `pass`/`warn`/`fail`, maintenance, and what the agent holds (`/v1/agent/services`,
//! `/v1/agent/checks`, `/v1/agent/self`, `/v1/status/*`). The reads of the catalog and
//! of health are in `catalog`.
//!
//! A Consul agent is a DC here: a service registered on any node of a DC is registered in
//! that DC, and its check ids are the DC's. Errors are plain text with Consul's status
//! codes, which its clients branch on.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tandem_client::api::{RegisterRequest, StatusName};
use tandem_schemas::{InstanceRecord, Status};

use super::checks::{self, CheckDef, CheckStatus, NAMESPACE};
use crate::acl::{Need, Principal};
use crate::error::ApiError;
use crate::http::{auth, limits};
use crate::shared::NodeShared;

/// The most services `/v1/agent/services` (and checks `/v1/agent/checks`) answers with;
/// past it the call is refused and the catalog is the way.
pub const AGENT_SERVICES_MAX: usize = 10_000;

/// A Consul error: plain text.
pub fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], message.into())
        .into_response()
}

/// A tandem error as Consul answers it.
pub fn plain(e: ApiError) -> Response {
    text(e.status, e.message)
}

/// The query's pairs, in order (a key may repeat: `tag`).
pub fn query_pairs(q: &Option<String>) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()).into_owned().collect()
}

/// The value of `key` in the query, `Some("")` for a bare `?key`.
pub fn query_get<'q>(pairs: &'q [(String, String)], key: &str) -> Option<&'q str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// A Consul boolean flag: present and not `false`/`0`.
pub fn query_flag(pairs: &[(String, String)], key: &str) -> bool {
    query_get(pairs, key).is_some_and(|v| !v.eq_ignore_ascii_case("false") && v != "0" && v != "f")
}

/// Looks a key up in a JSON object as Go's decoder does: case-insensitively, and (as
/// Consul translates them) with snake_case spelled the same.
fn field<'v>(obj: &'v Map<String, Value>, name: &str) -> Option<&'v Value> {
    let want: String = name.chars().filter(|c| *c != '_').collect();
    obj.iter()
        .find(|(k, _)| k.len() >= want.len() && k.replace('_', "").eq_ignore_ascii_case(&want))
        .map(|(_, v)| v)
        .filter(|v| !v.is_null())
}

fn str_field(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{name} must be a string")),
    }
}

/// A duration field: a Go duration string, or a number of nanoseconds.
fn duration_field(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, String> {
    let ms = match field(obj, name) {
        None => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => checks::parse_go_duration(s)
            .ok_or_else(|| format!("{name}: {s:?} is not a duration such as 10s"))?,
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| format!("{name} must be a duration"))? / 1_000_000,
        Some(_) => return Err(format!("{name} must be a duration such as \"10s\"")),
    };
    if ms == 0 {
        return Ok(None);
    }
    if !(checks::CHECK_TTL_MS_MIN..=checks::CHECK_TTL_MS_MAX).contains(&ms) {
        return Err(format!(
            "{name} must be from {}s to {}h",
            checks::CHECK_TTL_MS_MIN / 1000,
            checks::CHECK_TTL_MS_MAX / 3_600_000
        ));
    }
    Ok(Some(ms))
}

/// The kinds of check a Consul agent runs itself; tandem runs none.
const RUN_CHECK_FIELDS: [&str; 9] =
    ["HTTP", "TCP", "Args", "ScriptArgs", "GRPC", "DockerContainerID", "H2PING", "AliasService", "UDP"];

/// One check of a registration, with the id Consul would give it.
fn check_def(obj: &Map<String, Value>, default_id: String, service: &str) -> Result<CheckDef, String> {
    if let Some(kind) = RUN_CHECK_FIELDS.iter().find(|k| field(obj, k).is_some()) {
        return Err(format!(
            "tandem runs no checks of its own ({kind} given): register a TTL check and report its \
             result with /v1/agent/check/pass, warn or fail"
        ));
    }
    let ttl_ms =
        duration_field(obj, "TTL")?.ok_or("a check needs a TTL (tandem supports TTL checks only)")?;
    let id =
        str_field(obj, "CheckID")?.or(str_field(obj, "ID")?).filter(|s| !s.is_empty()).unwrap_or(default_id);
    let name = str_field(obj, "Name")?
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("Service '{service}' check"));
    for (what, v) in [("CheckID", &id), ("Name", &name)] {
        if v.len() > checks::CHECK_NAME_BYTES_MAX || v.chars().any(char::is_control) {
            return Err(format!("a check's {what} must be at most {} bytes", checks::CHECK_NAME_BYTES_MAX));
        }
    }
    let status = match str_field(obj, "Status")?.as_deref() {
        None | Some("") => CheckStatus::Critical,
        Some(s) => {
            CheckStatus::parse(s).ok_or_else(|| format!("Status {s:?}: passing, warning or critical"))?
        }
    };
    let dca_ms = duration_field(obj, "DeregisterCriticalServiceAfter")?;
    Ok(CheckDef { id, name, ttl_ms, dca_ms, status })
}

/// A registration body as tandem's request and its checks.
fn registration(
    body: &[u8],
    client: Option<std::net::IpAddr>,
) -> Result<(RegisterRequest, Vec<CheckDef>), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("Request decode failed: {e}"))?;
    let obj = v.as_object().ok_or("Request decode failed: expected a JSON object")?;
    let name = str_field(obj, "Name")?.filter(|s| !s.is_empty()).ok_or("Missing service name")?;
    let id = str_field(obj, "ID")?.filter(|s| !s.is_empty()).unwrap_or_else(|| name.clone());
    let address = match str_field(obj, "Address")?.filter(|s| !s.is_empty()) {
        Some(a) => a,
        // Consul uses its node's address; tandem has no node: the caller's.
        None => client.map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string()),
    };
    let port = match field(obj, "Port") {
        None => 0,
        Some(p) => p.as_u64().ok_or("Port must be a number")?,
    };
    if port == 0 || port > 65_535 {
        return Err("tandem needs a Port from 1 to 65535 (an instance is an address and a port)".into());
    }
    let tags: Vec<String> = match field(obj, "Tags") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| t.as_str().map(str::to_owned).ok_or("Tags must be strings"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("Tags must be a list of strings".into()),
    };
    let mut metadata: BTreeMap<String, String> = match field(obj, "Meta") {
        None => BTreeMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())).ok_or("Meta values must be strings"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("Meta must be an object of strings".into()),
    };
    if metadata.contains_key(checks::CHECKS_META_KEY) {
        return Err(format!("Meta key {:?} is tandem's own", checks::CHECKS_META_KEY));
    }
    let weight = match field(obj, "Weights").and_then(Value::as_object).and_then(|w| field(w, "Passing")) {
        None => 1,
        Some(p) => {
            p.as_u64().and_then(|p| u32::try_from(p).ok()).ok_or("Weights.Passing must be a number")?
        }
    };
    let mut defs: Vec<Map<String, Value>> = Vec::new();
    if let Some(c) = field(obj, "Check") {
        defs.push(c.as_object().ok_or("Check must be an object")?.clone());
    }
    if let Some(cs) = field(obj, "Checks") {
        for c in cs.as_array().ok_or("Checks must be a list")? {
            defs.push(c.as_object().ok_or("Checks must be objects")?.clone());
        }
    }
    if defs.len() > checks::CHECKS_PER_SERVICE_MAX {
        return Err(format!("at most {} checks per service", checks::CHECKS_PER_SERVICE_MAX));
    }
    let many = defs.len() > 1;
    let mut found: Vec<CheckDef> = Vec::with_capacity(defs.len());
    for (i, d) in defs.iter().enumerate() {
        let default_id = if many { format!("service:{id}:{}", i + 1) } else { format!("service:{id}") };
        let c = check_def(d, default_id, &name)?;
        if found.iter().any(|f| f.id == c.id) {
            return Err(format!("check id {:?} given twice", c.id));
        }
        found.push(c);
    }
    checks::store_checks(&mut metadata, &found);
    let req = RegisterRequest {
        namespace: Some(NAMESPACE.to_owned()),
        service: name,
        instance_id: Some(id),
        address,
        port: u32::try_from(port).unwrap_or(0),
        zone: None,
        weight: Some(weight),
        version: None,
        tags: Some(tags),
        metadata: Some(metadata),
        ttl_ms: None,
        persistent: Some(true),
        status: Some(StatusName::Up),
    };
    Ok((req, found))
}

/// `PUT /v1/agent/service/register`.
pub async fn register(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    client: Option<Extension<limits::ClientAddr>>,
    body: Bytes,
) -> Response {
    let (req, defs) = match registration(&body, client.map(|Extension(a)| a.0)) {
        Ok(r) => r,
        Err(e) => {
            if e.starts_with("at most") {
                super::bump(&node.compat.counters.refused_checks);
            }
            return text(StatusCode::BAD_REQUEST, e);
        }
    };
    let (service, id) = (req.service.clone(), req.instance_id.clone().unwrap_or_default());
    if let Err(e) =
        auth::check(&node, &principal, &Need::Write { namespace: NAMESPACE.into(), service: service.clone() })
    {
        return plain(e);
    }
    // Check ids and service ids are the DC's, as they are an agent's in Consul: one held by
    // another service is refused, so that no registration takes over another's check.
    let ttl = &node.compat.ttl;
    ttl.load(&node.registry, node.registry.now_ms());
    if let Some(other) = service_of(&node, &id).filter(|s| *s != service) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("service ID {id:?} is registered for service {other:?}: deregister it first"),
        );
    }
    for c in &defs {
        if let Some((svc, inst)) = ttl.holder(&c.id).filter(|(_, inst)| *inst != id) {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "CheckID {:?} is held by service ID {inst:?} of {svc:?}: choose another CheckID",
                    c.id
                ),
            );
        }
    }
    let health = checks::aggregate(&defs);
    match auth::owned(&node, node.registry.register_with(req, &principal.writer(), health).await) {
        Ok(_) => {
            node.compat.ttl.registered(&service, &id, &defs, node.registry.now_ms());
            StatusCode::OK.into_response()
        }
        Err(e) => plain(e),
    }
}

/// The service name of own service id `id` (registered through Consul's API or not).
fn service_of(node: &NodeShared, id: &str) -> Option<String> {
    if let Some(s) = node.compat.ttl.service_of(id) {
        return Some(s);
    }
    let mut found = None;
    node.registry.each_instance(NAMESPACE, |svc, _, r| {
        if found.is_none() && *r.key.instance_id == *id && *r.key.owner_dc == *node.registry.dc {
            found = Some(svc.to_owned());
        }
    });
    found
}

/// `PUT /v1/agent/service/deregister/{id}`.
pub async fn deregister(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    let Some(service) = service_of(&node, &id) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("Unknown service ID {id:?}. Ensure that the service ID is passed, not the service name."),
        );
    };
    if let Err(e) =
        auth::check(&node, &principal, &Need::Write { namespace: NAMESPACE.into(), service: service.clone() })
    {
        return plain(e);
    }
    match auth::owned(&node, node.registry.deregister_as(NAMESPACE, &service, &id, &principal.writer()).await)
    {
        Ok(_) => {
            node.compat.ttl.deregistered(&id);
            StatusCode::OK.into_response()
        }
        Err(e) => plain(e),
    }
}

/// `PUT /v1/agent/check/{pass,warn,fail}/{check_id}`: a `pass` of a passing check only
/// restarts its TTL (the heartbeat: nothing written); a change of status is an event.
pub async fn check_update(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Path((verb, check_id)): Path<(String, String)>,
) -> Response {
    let status = match verb.as_str() {
        "pass" => CheckStatus::Passing,
        "warn" => CheckStatus::Warning,
        "fail" => CheckStatus::Critical,
        _ => {
            return text(StatusCode::NOT_FOUND, format!("no such check action {verb:?}: pass, warn or fail"))
        }
    };
    let ttl = &node.compat.ttl;
    ttl.load(&node.registry, node.registry.now_ms());
    let Some(((service, id), same)) = ttl.lookup(&check_id, status) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("Unknown check ID {check_id:?}. Ensure that the check ID is passed, not the check name."),
        );
    };
    if let Err(e) =
        auth::check(&node, &principal, &Need::Write { namespace: NAMESPACE.into(), service: service.clone() })
    {
        return plain(e);
    }
    if same {
        super::bump(&node.compat.counters.passes);
    } else {
        let edit = checks::set_status(check_id.clone(), status);
        if let Err(e) = auth::owned(
            &node,
            node.registry.edit_as(NAMESPACE, &service, &id, edit, &principal.writer()).await,
        ) {
            if e.status == StatusCode::NOT_FOUND {
                ttl.gone(&id);
            }
            return plain(e);
        }
    }
    ttl.updated(&check_id, status, node.registry.now_ms());
    StatusCode::OK.into_response()
}

/// `PUT /v1/agent/service/maintenance/{id}?enable=true&reason=`: maintenance drains the
/// instance (tandem's `draining`); Consul's view shows its maintenance check critical.
pub async fn maintenance(
    State(node): State<Arc<NodeShared>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    let pairs = query_pairs(&q);
    // As Go's ParseBool reads it.
    let enable = match query_get(&pairs, "enable") {
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
        _ => return text(StatusCode::BAD_REQUEST, "Missing value for enable"),
    };
    let Some(service) = service_of(&node, &id) else {
        return text(StatusCode::NOT_FOUND, format!("Unknown service ID {id:?}"));
    };
    if let Err(e) =
        auth::check(&node, &principal, &Need::Write { namespace: NAMESPACE.into(), service: service.clone() })
    {
        return plain(e);
    }
    let status = if enable { Status::Draining } else { Status::Up };
    match auth::owned(
        &node,
        node.registry.set_status_as(NAMESPACE, &service, &id, status, &principal.writer()).await,
    ) {
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) => plain(e),
    }
}

/// Consul's `AgentService` of a record.
pub fn agent_service(svc: &str, r: &InstanceRecord) -> Value {
    json!({
        "ID": &*r.key.instance_id,
        "Service": svc,
        "Tags": &r.tags,
        "Meta": user_meta(r),
        "Port": r.port,
        "Address": &*r.address,
        "Weights": {"Passing": r.weight, "Warning": 1},
        "EnableTagOverride": false,
        "Datacenter": &*r.key.owner_dc,
    })
}

/// A record's metadata without tandem's own keys.
pub fn user_meta(r: &InstanceRecord) -> BTreeMap<&str, &str> {
    r.metadata
        .iter()
        .filter(|(k, _)| *k != checks::CHECKS_META_KEY)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The Consul checks of a record: its TTL checks, or for an instance registered through
/// tandem's API one check `service:<id>` reading its health; plus the maintenance check
/// while it is not up.
pub fn checks_json(svc: &str, r: &InstanceRecord, index: u64) -> Vec<Value> {
    let node = &*r.address;
    let id = &*r.key.instance_id;
    let one = |check_id: &str, name: &str, status: CheckStatus, notes: &str, output: &str, kind: &str| {
        json!({
            "Node": node, "CheckID": check_id, "Name": name, "Status": status.as_str(), "Notes": notes,
            "Output": output, "ServiceID": id, "ServiceName": svc, "ServiceTags": &r.tags, "Type": kind,
            "Definition": {}, "CreateIndex": index, "ModifyIndex": index,
        })
    };
    let defs = checks::checks_of(r);
    let mut out: Vec<Value> = if defs.is_empty() {
        let status = CheckStatus::of_health(r.health);
        vec![one(
            &format!("service:{id}"),
            "tandem health",
            status,
            "",
            "the instance's health in tandem",
            "tandem",
        )]
    } else {
        defs.iter().map(|c| one(&c.id, &c.name, c.status, "", "", "ttl")).collect()
    };
    if r.status != Status::Up {
        out.push(one(
            &format!("_service_maintenance:{id}"),
            "Service Maintenance Mode",
            CheckStatus::Critical,
            &format!("tandem status {}", tandem_client::api::Status::from(r.status).as_str()),
            "",
            "maintenance",
        ));
    }
    out
}

/// `GET /v1/agent/services`: the DC's own services (of the `default` namespace).
pub async fn agent_services(State(node): State<Arc<NodeShared>>, RawQuery(q): RawQuery) -> Response {
    let pairs = query_pairs(&q);
    let filter = match super::catalog::parse_filter(&node, &pairs, super::catalog::agent_selector_known) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let mut out = Map::new();
    let mut too_many = false;
    node.registry.each_instance(NAMESPACE, |svc, _, r| {
        if *r.key.owner_dc != *node.registry.dc || too_many {
            return;
        }
        let v = agent_service(svc, r);
        if filter.as_ref().is_some_and(|f| !f.matches(&|sel| super::catalog::agent_select(&v, sel))) {
            return;
        }
        too_many = out.len() >= AGENT_SERVICES_MAX;
        out.insert(r.key.instance_id.to_string(), v);
    });
    if too_many {
        super::bump(&node.compat.counters.refused_agent_services);
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "this DC holds more than {AGENT_SERVICES_MAX} services: read them by name from the catalog"
            ),
        );
    }
    axum::Json(Value::Object(out)).into_response()
}

/// `GET /v1/agent/checks`: the checks of the DC's own services.
pub async fn agent_checks(State(node): State<Arc<NodeShared>>) -> Response {
    let mut out = Map::new();
    let mut services = 0usize;
    node.registry.each_instance(NAMESPACE, |svc, seq, r| {
        if *r.key.owner_dc != *node.registry.dc || services > AGENT_SERVICES_MAX {
            return;
        }
        services += 1;
        for c in checks_json(svc, r, seq) {
            let id = c["CheckID"].as_str().unwrap_or_default().to_owned();
            out.insert(id, c);
        }
    });
    if services > AGENT_SERVICES_MAX {
        super::bump(&node.compat.counters.refused_agent_services);
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("this DC holds more than {AGENT_SERVICES_MAX} services"),
        );
    }
    axum::Json(Value::Object(out)).into_response()
}

/// The HTTP address of the member serving the DC's writes (this node's when single).
fn leader_addr(node: &NodeShared) -> Option<String> {
    match &node.group {
        None => Some(node.registry.config().http_addr.to_string()),
        Some(g) => {
            let st = g.status();
            let leader = st.leader?;
            st.members.into_iter().find(|m| m.id == leader).and_then(|m| m.http_addr).map(|a| a.to_string())
        }
    }
}

/// `GET /v1/status/leader`: the address of the member serving the DC's writes, `""` when
/// none is known.
pub async fn status_leader(State(node): State<Arc<NodeShared>>) -> Response {
    axum::Json(leader_addr(&node).unwrap_or_default()).into_response()
}

/// `GET /v1/status/peers`: the DC's members.
pub async fn status_peers(State(node): State<Arc<NodeShared>>) -> Response {
    let peers: Vec<String> = match &node.group {
        None => vec![node.registry.config().http_addr.to_string()],
        Some(g) => {
            g.status().members.into_iter().filter_map(|m| m.http_addr).map(|a| a.to_string()).collect()
        }
    };
    axum::Json(peers).into_response()
}

/// `GET /v1/agent/self`.
pub async fn agent_self(State(node): State<Arc<NodeShared>>) -> Response {
    let cfg = node.registry.config();
    let name = match &node.group {
        Some(g) => format!("{}-{}", cfg.dc, g.id),
        None => cfg.dc.clone(),
    };
    let addr = cfg.http_addr;
    axum::Json(json!({
        "Config": {
            "Datacenter": &cfg.dc, "PrimaryDatacenter": &cfg.dc, "NodeName": &name, "NodeID": "",
            "Server": true, "Revision": "", "Version": concat!(env!("CARGO_PKG_VERSION"), "-tandem"),
        },
        "Member": {
            "Name": &name, "Addr": addr.ip().to_string(), "Port": addr.port(),
            "Tags": {"dc": &cfg.dc, "role": "consul", "build": env!("CARGO_PKG_VERSION")}, "Status": 1,
        },
        "Meta": {"tandem": "true"},
        "DebugConfig": {"Datacenter": &cfg.dc},
    }))
    .into_response()
}
