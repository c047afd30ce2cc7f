//! Existing clients, unchanged: Consul's HTTP API (`consul`, `catalog`, its TTL checks in
//! `checks`, its `filter` expressions in `filter`), Nacos's naming Open API v1 (`nacos`)
//! and Prometheus's HTTP service discovery (`prom`), served on the node's HTTP port beside
//! tandem's own API and behind the same layers (authentication, limits, forwarding of
//! writes to the DC's leader). docs/compat.md says, endpoint by endpoint, what is
//! supported and what differs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;

use crate::shared::NodeShared;

pub mod catalog;
pub mod checks;
pub mod consul;
pub mod filter;
pub mod nacos;
pub mod prom;
pub mod query;

/// How often the serving node looks for lapsed TTL checks.
pub const TTL_TICK: Duration = Duration::from_millis(250);

/// What the front ends keep besides the registry.
#[derive(Default)]
pub struct Compat {
    /// The Consul TTL checks this node times (when it serves the DC's writes).
    pub ttl: checks::TtlTable,
    pub counters: Counters,
}

/// What the front ends count (shown in /metrics).
#[derive(Default)]
pub struct Counters {
    /// Check passes that changed nothing (nothing written).
    pub passes: AtomicU64,
    /// TTL checks that lapsed.
    pub lapses: AtomicU64,
    /// Services deregistered after `DeregisterCriticalServiceAfter`.
    pub reaped: AtomicU64,
    /// Refusals by limit.
    pub refused_checks: AtomicU64,
    pub refused_agent_services: AtomicU64,
    pub refused_sd_targets: AtomicU64,
    pub refused_filter: AtomicU64,
}

/// Adds one to a counter.
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The routes of the three front ends.
pub fn routes(node: Arc<NodeShared>) -> Router<Arc<NodeShared>> {
    let consul = Router::new()
        .route("/v1/agent/service/register", put(consul::register))
        .route("/v1/agent/service/deregister/{id}", put(consul::deregister))
        .route("/v1/agent/service/maintenance/{id}", put(consul::maintenance))
        .route("/v1/agent/check/{verb}/{check_id}", put(consul::check_update))
        .route("/v1/agent/services", get(consul::agent_services))
        .route("/v1/agent/checks", get(consul::agent_checks))
        .route("/v1/agent/self", get(consul::agent_self))
        .route("/v1/status/leader", get(consul::status_leader))
        .route("/v1/status/peers", get(consul::status_peers))
        .route("/v1/health/service/{name}", get(catalog::health_service))
        .route("/v1/catalog/service/{name}", get(catalog::catalog_service))
        .route("/v1/catalog/services", get(catalog::catalog_services))
        .route("/v1/catalog/datacenters", get(catalog::catalog_datacenters))
        .route("/v1/query", post(query::create).get(query::list))
        .route("/v1/query/{id}", get(query::one).put(query::one).delete(query::one))
        .route("/v1/query/{id}/{verb}", get(query::execute))
        // Consul's clients read X-Consul-Index from every answer, errors included.
        .layer(axum::middleware::map_response_with_state(node, consul_index));
    Router::new()
        .merge(consul)
        .route(
            "/nacos/v1/ns/instance",
            get(nacos::instance).post(nacos::instance).put(nacos::instance).delete(nacos::instance),
        )
        .route("/nacos/v1/ns/instance/beat", put(nacos::beat))
        .route("/nacos/v1/ns/instance/list", get(nacos::list))
        .route("/nacos/v1/ns/service/list", get(nacos::service_list))
        .route("/nacos/v1/ns/operator/metrics", get(nacos::metrics))
        .route("/v1/sd/prometheus", get(prom::targets))
}

/// Adds `X-Consul-Index` (the view's index) to a Consul answer that has none.
async fn consul_index(State(node): State<Arc<NodeShared>>, mut resp: Response) -> Response {
    if !resp.headers().contains_key("x-consul-index") {
        let index = node.registry.view().index().max(1);
        resp.headers_mut().insert("x-consul-index", HeaderValue::from(index));
    }
    resp
}

/// The TTL timer of the node serving the DC's writes: lapsed checks turn critical (one
/// event each) and services critical for their `DeregisterCriticalServiceAfter` go. On a
/// node that does not serve, the table is kept empty.
pub async fn run_ttl(node: Arc<NodeShared>, mut shut: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TTL_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shut.changed() => return,
        }
        let ttl = &node.compat.ttl;
        if !node.group.as_ref().is_none_or(|g| g.serving()) {
            ttl.forget_all();
            continue;
        }
        let reg = &node.registry;
        ttl.load(reg, reg.now_ms());
        for due in ttl.due(reg.now_ms()) {
            let by = crate::registry::Writer::anonymous();
            let (result, instance, lapsed) = match due {
                checks::Due::Lapse { check, service, instance, was } => {
                    let edit = checks::set_status(check.clone(), checks::CheckStatus::Critical);
                    let r = reg.edit_as(checks::NAMESPACE, &service, &instance, edit, &by).await.map(drop);
                    (r, instance, Some((check, was)))
                }
                checks::Due::Reap { service, instance } => (
                    reg.deregister_as(checks::NAMESPACE, &service, &instance, &by).await.map(drop),
                    instance,
                    None,
                ),
            };
            match (result, lapsed) {
                (Ok(()), Some(_)) => bump(&node.compat.counters.lapses),
                (Ok(()), None) => bump(&node.compat.counters.reaped),
                (Err(e), _) if e.status == axum::http::StatusCode::NOT_FOUND => ttl.gone(&instance),
                (Err(e), lapsed) => {
                    if let Some((check, was)) = lapsed {
                        ttl.lapse_failed(&check, was);
                    }
                    tracing::warn!(instance, error = %e.message, "a Consul TTL check's change was not written; retried")
                }
            }
        }
    }
}
