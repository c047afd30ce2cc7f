//! Prometheus's HTTP service discovery (`http_sd_configs`): `GET /v1/sd/prometheus` lists
//! every instance this node holds, of every DC (or `?dc=`, `?namespace=`, `?service=`),
//! one target group each, with its labels under `__meta_tandem_`.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::consul::{query_get, query_pairs, text};
use crate::shared::NodeShared;

/// Largest answer, in targets: past it the call is refused (narrow it with `namespace`,
/// `service` or `dc`).
pub const SD_TARGETS_MAX: usize = 50_000;

/// A metadata key as a Prometheus label name's tail: every character outside
/// `[a-zA-Z0-9_]` becomes `_`.
pub fn label_safe(key: &str) -> String {
    key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// `GET /v1/sd/prometheus`.
pub async fn targets(State(node): State<Arc<NodeShared>>, RawQuery(q): RawQuery) -> Response {
    let pairs = query_pairs(&q);
    let (dc, ns, svc) =
        (query_get(&pairs, "dc"), query_get(&pairs, "namespace"), query_get(&pairs, "service"));
    let namespaces = match ns {
        Some(n) => vec![n.to_owned()],
        None => node.registry.namespaces(),
    };
    let reg = &node.registry;
    let mut out: Vec<Value> = Vec::new();
    let mut too_many = false;
    for ns in &namespaces {
        reg.each_instance(ns, |name, _, r| {
            if too_many || svc.is_some_and(|s| s != name) || dc.is_some_and(|d| d != &*r.key.owner_dc) {
                return;
            }
            if out.len() >= SD_TARGETS_MAX {
                too_many = true;
                return;
            }
            let owner = &*r.key.owner_dc;
            let stale = owner != &*reg.dc && reg.origin_stale(owner);
            let mut labels = Map::new();
            let mut put = |k: &str, v: String| {
                labels.insert(format!("__meta_tandem_{k}"), Value::String(v));
            };
            put("namespace", ns.clone());
            put("service", name.to_owned());
            put("instance_id", r.key.instance_id.to_string());
            put("dc", owner.to_owned());
            put("zone", r.zone.to_string());
            put("health", tandem_client::api::Health::from(r.health).as_str().to_owned());
            put("status", tandem_client::api::Status::from(r.status).as_str().to_owned());
            put("stale", stale.to_string());
            put("version", r.app_version.to_string());
            put("tags", if r.tags.is_empty() { String::new() } else { format!(",{},", r.tags.join(",")) });
            for (k, v) in &r.metadata {
                if k != super::checks::CHECKS_META_KEY {
                    put(&format!("metadata_{}", label_safe(k)), v.clone());
                }
            }
            let host =
                if r.address.contains(':') { format!("[{}]", r.address) } else { r.address.to_string() };
            out.push(json!({"targets": [format!("{host}:{}", r.port)], "labels": labels}));
        });
    }
    if too_many {
        super::bump(&node.compat.counters.refused_sd_targets);
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("more than {SD_TARGETS_MAX} targets: narrow the call with namespace, service or dc"),
        );
    }
    axum::Json(Value::Array(out)).into_response()
}
