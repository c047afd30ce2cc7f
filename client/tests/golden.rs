//! Golden files of the HTTP API's JSON: each request and answer type of `tandem_client::api`
//! is built here in Rust, and its serialization must equal `client/golden/<name>.json`
//! byte for byte, and that file must read back to the same value. Any change of the wire
//! JSON (a field's name, order or optional skipping, an enum's spelling) fails here.
//!
//! After a deliberate change of the contract, rewrite the files with
//! `TANDEM_GOLDEN_WRITE=1 cargo test -p tandem-client --test golden` and review the diff.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tandem_client::api::*;

fn path(name: &str) -> PathBuf {
    manifest_dir().join("golden").join(format!("{name}.json"))
}

/// `text` is what the server (or client) writes; compares it with the golden file.
fn check_text<T: DeserializeOwned + PartialEq + Debug>(name: &str, value: &T, text: String) {
    let p = path(name);
    if std::env::var_os("TANDEM_GOLDEN_WRITE").is_some() {
        std::fs::write(&p, &text).unwrap();
    }
    let golden = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(text, golden, "the JSON of {name} changed (golden file {})", p.display());
    let back: T = serde_json::from_str(&golden).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(&back, value, "{name}: the golden file does not read back to the value");
}

/// Golden files are pretty-printed for review; the wire form is the compact one of the
/// same serializer, so names, order and skipping are the same.
fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: &T) {
    check_text(name, value, serde_json::to_string_pretty(value).unwrap() + "\n");
}

fn instance(id: &str, dc: &str) -> Instance {
    Instance {
        instance_id: id.into(),
        owner_dc: dc.into(),
        address: "10.0.0.7".into(),
        port: 8080,
        zone: "az1".into(),
        weight: 100,
        version: "1.4.2".into(),
        tags: vec!["canary".into()],
        metadata: BTreeMap::from([("team".into(), "pay".into())]),
        health: Health::Healthy,
        status: Status::Up,
        stale: false,
        persistent: false,
        damped: false,
        seq: 42,
    }
}

fn failover(active: bool) -> Failover {
    Failover {
        active,
        reason: if active {
            "1 healthy local of 3, below min_healthy 2".into()
        } else {
            "enough local".into()
        },
        mode: FailoverMode::LocalFirst,
        local_healthy: if active { 1 } else { 3 },
        local_total: 3,
        threshold: Threshold { min_healthy: 2, min_healthy_pct: 0.5 },
        dcs: if active { vec!["dc-b".into()] } else { vec![] },
    }
}

#[test]
fn register_requests() {
    check(
        "register_request",
        &RegisterRequest {
            namespace: Some("default".into()),
            service: "orders".into(),
            instance_id: Some("orders-1".into()),
            address: "10.0.0.7".into(),
            port: 8080,
            zone: Some("az1".into()),
            weight: Some(50),
            version: Some("1.4.2".into()),
            tags: Some(vec!["canary".into()]),
            metadata: Some(BTreeMap::from([("team".into(), "pay".into())])),
            ttl_ms: Some(30_000),
            persistent: None,
            status: Some(StatusName::OutOfService),
        },
    );
    // Every optional field left out.
    check(
        "register_request_minimal",
        &RegisterRequest {
            service: "orders".into(),
            address: "10.0.0.7".into(),
            port: 8080,
            persistent: Some(true),
            ..RegisterRequest::default()
        },
    );
    check(
        "register_answer",
        &RegisterAnswer {
            instance_id: "orders#10.0.0.7:8080#0b5c1e0e-54d4-4a4e-9d7c-8e2a4c6f1b11".into(),
            owner_dc: "dc-a".into(),
            version: 17,
            epoch: 3,
            lease_ttl_ms: 30_000,
        },
    );
}

#[test]
fn heartbeats() {
    check("heartbeat_answer", &HeartbeatAnswer { ok: true });
    check(
        "heartbeat_batch_request",
        &HeartbeatBatch {
            instances: vec![
                HeartbeatItem {
                    namespace: Some("default".into()),
                    service: "orders".into(),
                    instance_id: "orders-1".into(),
                },
                HeartbeatItem { namespace: None, service: "orders".into(), instance_id: "orders-2".into() },
            ],
        },
    );
    check("heartbeat_batch_answer", &HeartbeatBatchAnswer { renewed: 1, unknown: vec![1], conflict: vec![] });
}

#[test]
fn writes_and_admin() {
    check("status_change", &StatusChange { status: StatusName::Draining });
    check("write_answer", &WriteAnswer { version: 18 });
    check("reload_answer", &ReloadAnswer { reloaded: true });
    check("retire_request", &RetireRequest { dc: "dc-c".into() });
    check(
        "retire_answer",
        &RetireAnswer {
            dc: "dc-c".into(),
            newly_retired: true,
            retired_at_ms: 1_764_547_200_000,
            copies_removed: 12,
            tombstones_removed: 3,
        },
    );
    check("unretire_answer", &UnretireAnswer { unretired: true });
    check(
        "service_list",
        &ServiceList {
            namespace: "default".into(),
            index: 1_048_577,
            services: vec![ServiceSummary { service: "orders".into(), instances: 3 }],
        },
    );
    check(
        "error",
        &ErrorBody::new("not_owner", "instance orders-1 is owned by DC dc-b; only its owner may change it"),
    );
}

#[test]
fn discovery_answer_with_explain() {
    let mut suspect = instance("orders-2", "dc-a");
    suspect.health = Health::Suspect;
    suspect.status = Status::Draining;
    suspect.damped = true;
    suspect.seq = 43;
    let mut remote = instance("orders-9", "dc-b");
    remote.stale = true;
    remote.persistent = true;
    remote.weight = 50;
    remote.seq = 7;
    check(
        "discover_answer_explain",
        &DiscoverAnswer {
            namespace: "default".into(),
            service: "orders".into(),
            index: 2_097_153,
            instances: vec![instance("orders-1", "dc-a"), suspect, remote],
            failover: Some(failover(true)),
            protected: false,
            explain: Some(vec![
                ExplainLine {
                    instance_id: "orders-1".into(),
                    owner_dc: "dc-a".into(),
                    included: true,
                    reason: "healthy and up".into(),
                },
                ExplainLine {
                    instance_id: "orders-3".into(),
                    owner_dc: "dc-a".into(),
                    included: false,
                    reason: "unhealthy".into(),
                },
            ]),
        },
    );
}

/// A streaming watch sends each answer as one compact line (this file is that line).
#[test]
fn watch_stream_line() {
    let mut unhealthy = instance("orders-3", "dc-a");
    unhealthy.health = Health::Unhealthy;
    unhealthy.status = Status::OutOfService;
    let answer = DiscoverAnswer {
        namespace: "default".into(),
        service: "orders".into(),
        index: 2_097_154,
        instances: vec![instance("orders-1", "dc-a"), unhealthy],
        failover: Some(failover(false)),
        protected: true,
        explain: None,
    };
    check_text("watch_stream_line", &answer, serde_json::to_string(&answer).unwrap() + "\n");
}

/// Requests are strict: an unknown field or status name is refused, not ignored.
#[test]
fn requests_refuse_unknown_fields_and_names() {
    let bad_field = r#"{"service": "orders", "address": "h", "port": 1, "colour": "red"}"#;
    assert!(serde_json::from_str::<RegisterRequest>(bad_field).is_err());
    assert!(serde_json::from_str::<StatusChange>(r#"{"status": "resting"}"#).is_err());
    assert!(
        serde_json::from_str::<HeartbeatBatch>(r#"{"instances": [{"service": "s", "id": "i"}]}"#).is_err()
    );
}

/// Answers are lenient: unknown names read as `Unknown`, optional parts default.
#[test]
fn answers_tolerate_unknown_names_and_missing_parts() {
    let v = r#"{"index": 1, "instances": [{"instance_id": "a", "owner_dc": "d", "address": "h", "port": 1,
        "health": "zombie", "status": "resting", "future": true}], "failover": {"mode": "orbital"}}"#;
    let a: DiscoverAnswer = serde_json::from_str(v).unwrap();
    let i = &a.instances[0];
    assert_eq!((i.health, i.status, i.weight, &*i.zone), (Health::Unknown, Status::Unknown, 100, ""));
    assert_eq!(a.failover.unwrap().mode, FailoverMode::Unknown);
    assert_eq!((a.namespace.as_str(), a.explain), ("", None));
}

/// The package's directory, read when the test runs (cargo sets it) rather than when it
/// was compiled: a test binary reused from another checkout's build (one shared target
/// dir) reads this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
