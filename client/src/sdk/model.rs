//! The SDK's typed view of a discovery answer (`GET /v1/services/{ns}/{svc}`).
//!
//! Parse, don't validate: an answer becomes an [`Answer`] at the boundary or is refused with
//! a reason, and nothing past this module looks at JSON. Unknown fields are ignored and
//! unknown health or status names become `Unknown`, so a newer server does not break an
//! older SDK; missing required fields, wrong types, another service's answer or too many
//! instances are errors, and the caller keeps its cache.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::api::DiscoverAnswer;
pub use crate::api::{Failover as FailoverInfo, Health, Instance, Status};

/// A parsed discovery answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub index: u64,
    /// Sorted by (owner DC, instance id), without duplicates.
    pub instances: Vec<Instance>,
    pub failover: Option<FailoverInfo>,
    pub protected: bool,
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
        let raw: DiscoverAnswer = serde_json::from_value(v).map_err(|e| format!("malformed answer: {e}"))?;
        if (!raw.namespace.is_empty() && raw.namespace != namespace)
            || (!raw.service.is_empty() && raw.service != service)
        {
            return Err(format!(
                "answer is for {}/{}, not {namespace}/{service}",
                raw.namespace, raw.service
            ));
        }
        if let Some(i) = raw
            .instances
            .iter()
            .position(|i| i.instance_id.is_empty() || i.owner_dc.is_empty() || i.address.is_empty())
        {
            return Err(format!("instance #{i} lacks an id, an owner DC or an address"));
        }
        let instances = raw.instances;
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
        let ids: Vec<&str> = a.instances.iter().map(|i| &*i.instance_id).collect();
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
