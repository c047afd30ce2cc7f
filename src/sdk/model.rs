//! The SDK's typed view of a discovery answer (`GET /v1/services/{ns}/{svc}`).
//!
//! Parse, don't validate: an answer becomes an [`Answer`] at the boundary or is refused with
//! a reason, and nothing past this module looks at JSON. Unknown fields are ignored and
//! unknown health or status names become `Unknown`, so a newer server does not break an
//! older SDK; missing required fields, wrong types, another service's answer or too many
//! instances are errors, and the caller keeps its cache.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One instance as discovery lists it. Serialized only into the SDK's own snapshot file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub instance_id: String,
    pub owner_dc: String,
    pub address: String,
    pub port: u16,
    #[serde(default)]
    pub zone: String,
    #[serde(default = "default_weight")]
    pub weight: u32,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub health: Health,
    #[serde(default)]
    pub status: Status,
    /// A remote copy whose replication link has been silent too long.
    #[serde(default)]
    pub stale: bool,
    #[serde(default)]
    pub persistent: bool,
    #[serde(default)]
    pub damped: bool,
    /// Seq of the owner DC's event that produced this state.
    #[serde(default)]
    pub seq: u64,
}

fn default_weight() -> u32 {
    100
}

impl Instance {
    /// The identity of an instance: (owner DC, instance id).
    pub fn key(&self) -> (String, String) {
        (self.owner_dc.clone(), self.instance_id.clone())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Healthy,
    Suspect,
    Unhealthy,
    /// A name this SDK does not know (or none): never preferred.
    #[default]
    #[serde(other)]
    Unknown,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Up,
    Draining,
    OutOfService,
    /// A name this SDK does not know (or none): never picked.
    #[default]
    #[serde(other)]
    Unknown,
}

impl Status {
    /// The name the HTTP API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "up",
            Status::Draining => "draining",
            Status::OutOfService => "out_of_service",
            Status::Unknown => "unknown",
        }
    }
}

/// The `failover` object of an answer: whether remote DCs' instances are in it and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FailoverInfo {
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub local_healthy: u32,
    #[serde(default)]
    pub local_total: u32,
    /// Remote DCs whose instances are in the answer.
    #[serde(default)]
    pub dcs: Vec<String>,
}

/// A parsed discovery answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub index: u64,
    /// Sorted by (owner DC, instance id), without duplicates.
    pub instances: Vec<Instance>,
    pub failover: Option<FailoverInfo>,
    pub protected: bool,
}

#[derive(Deserialize)]
struct RawAnswer {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    service: Option<String>,
    index: u64,
    instances: Vec<Value>,
    #[serde(default)]
    failover: Option<FailoverInfo>,
    #[serde(default)]
    protected: bool,
}

impl Answer {
    /// Parses the JSON answer for `namespace/service`, refusing answers that list more than
    /// `instances_max` instances, name another service, or hold a malformed instance.
    pub fn parse(v: Value, namespace: &str, service: &str, instances_max: usize) -> Result<Answer, String> {
        // Refuse before converting: the count is known without touching the elements.
        let count = v.get("instances").and_then(Value::as_array).map_or(0, Vec::len);
        if count > instances_max {
            return Err(format!("answer lists {count} instances, more than instances_max {instances_max}"));
        }
        let raw: RawAnswer = serde_json::from_value(v).map_err(|e| format!("malformed answer: {e}"))?;
        if raw.namespace.as_deref().is_some_and(|n| n != namespace)
            || raw.service.as_deref().is_some_and(|s| s != service)
        {
            return Err(format!(
                "answer is for {}/{}, not {namespace}/{service}",
                raw.namespace.unwrap_or_default(),
                raw.service.unwrap_or_default()
            ));
        }
        let mut instances = Vec::with_capacity(raw.instances.len());
        for (i, iv) in raw.instances.into_iter().enumerate() {
            let inst: Instance =
                serde_json::from_value(iv).map_err(|e| format!("malformed instance #{i}: {e}"))?;
            if inst.instance_id.is_empty() || inst.owner_dc.is_empty() || inst.address.is_empty() {
                return Err(format!("instance #{i} lacks an id, an owner DC or an address"));
            }
            instances.push(inst);
        }
        Ok(Answer {
            index: raw.index,
            instances: normalize(instances),
            failover: raw.failover,
            protected: raw.protected,
        })
    }
}

/// Sorts by (owner DC, instance id) and keeps the first of any duplicates.
pub(crate) fn normalize(mut instances: Vec<Instance>) -> Vec<Instance> {
    instances.sort_by(|a, b| (&a.owner_dc, &a.instance_id).cmp(&(&b.owner_dc, &b.instance_id)));
    let mut seen = BTreeSet::new();
    instances.retain(|i| seen.insert((i.owner_dc.clone(), i.instance_id.clone())));
    instances
}

/// Where the consumer's current view came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewSource {
    /// Nothing yet: no registry answered and no snapshot was found.
    Empty,
    /// A registry answer.
    Registry,
    /// The disk snapshot written at `saved_at_ms` (wall clock, ms since the Unix epoch);
    /// no registry has answered since the start.
    Snapshot { saved_at_ms: u64 },
}

/// One service as a consumer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceView {
    pub namespace: String,
    pub service: String,
    /// Registry index of the answer this view holds (0: none yet).
    pub index: u64,
    /// Sorted by (owner DC, instance id).
    pub instances: Vec<Instance>,
    pub failover: Option<FailoverInfo>,
    /// The registry's protect threshold put unhealthy instances in the answer.
    pub protected: bool,
    pub source: ViewSource,
}

impl ServiceView {
    pub fn empty(namespace: &str, service: &str) -> ServiceView {
        ServiceView {
            namespace: namespace.to_owned(),
            service: service.to_owned(),
            index: 0,
            instances: Vec::new(),
            failover: None,
            protected: false,
            source: ViewSource::Empty,
        }
    }

    /// Whether `other` differs in anything a caller acts on (the instances, whether and
    /// where failover is active, protection, source), ignoring the index and the wording of
    /// the failover reason.
    pub fn differs_materially(&self, other: &ServiceView) -> bool {
        let fo = |v: &ServiceView| v.failover.as_ref().map(|f| (f.active, f.dcs.clone()));
        self.instances != other.instances
            || fo(self) != fo(other)
            || self.protected != other.protected
            || self.source != other.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn inst(id: &str) -> Value {
        json!({"instance_id": id, "owner_dc": "dc-a", "address": "10.0.0.1", "port": 80,
               "health": "healthy", "status": "up", "future_field": [1, 2]})
    }

    #[test]
    fn parses_a_server_answer_and_tolerates_unknown_names() {
        let v = json!({"namespace": "default", "service": "s", "index": 7,
            "instances": [inst("b"), inst("a"), {"instance_id": "c", "owner_dc": "dc-b", "address": "h",
                "port": 1, "health": "zombie", "status": "resting"}],
            "failover": {"active": true, "reason": "r", "mode": "local_first", "local_healthy": 0,
                "local_total": 0, "threshold": {"min_healthy": 1}, "dcs": ["dc-b"]},
            "protected": false});
        let a = Answer::parse(v, "default", "s", 10).unwrap();
        assert_eq!(a.index, 7);
        let ids: Vec<&str> = a.instances.iter().map(|i| i.instance_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(a.instances[2].health, Health::Unknown);
        assert_eq!(a.instances[2].status, Status::Unknown);
        assert_eq!(a.instances[0].weight, 100, "default weight");
        assert!(a.failover.unwrap().active);
    }

    #[test]
    fn refuses_bad_answers_with_a_reason() {
        let cases = [
            ("not an object", json!("oops")),
            ("no index", json!({"instances": []})),
            ("negative index", json!({"index": -1, "instances": []})),
            (
                "port out of range",
                json!({"index": 1, "instances": [{"instance_id": "a", "owner_dc": "d",
                "address": "h", "port": 70000}]}),
            ),
            (
                "missing address",
                json!({"index": 1, "instances": [{"instance_id": "a", "owner_dc": "d", "port": 1}]}),
            ),
            (
                "empty id",
                json!({"index": 1, "instances": [{"instance_id": "", "owner_dc": "d", "address": "h", "port": 1}]}),
            ),
            ("other service", json!({"service": "t", "index": 1, "instances": []})),
            ("too many", json!({"index": 1, "instances": [inst("a"), inst("b"), inst("c")]})),
        ];
        for (what, v) in cases {
            assert!(Answer::parse(v, "default", "s", 2).is_err(), "{what}");
        }
    }

    #[test]
    fn duplicates_are_dropped() {
        let v = json!({"index": 1, "instances": [inst("a"), inst("a")]});
        assert_eq!(Answer::parse(v, "default", "s", 10).unwrap().instances.len(), 1);
    }
}
