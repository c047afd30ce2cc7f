//! Consul's TTL checks on tandem records.
//!
//! A service registered through the Consul API is a persistent tandem instance (no tandem
//! lease) whose checks travel in its metadata under [`CHECKS_META_KEY`]: id, name, TTL,
//! `DeregisterCriticalServiceAfter` and status of each. The record's health is the checks'
//! aggregate (any critical: unhealthy; else any warning: suspect; else healthy), so
//! tandem's own discovery, the other DC and every node of the group see the same state.
//!
//! A status change (`warn`, `fail`, a `pass` after either, a TTL lapse) is one event, an
//! edit judged on the committer against the record's latest state. A `pass` that changes
//! nothing only moves the check's deadline in [`TtlTable`], in memory, and never touches
//! the disk: the heartbeat of a Consul client.
//!
//! [`TtlTable`] lives on the node that serves the DC's writes (Consul writes are forwarded
//! there). It is emptied when the node stops serving and rebuilt from the view when it
//! serves again, every deadline one TTL from then: a leader change restarts every TTL, as
//! it restarts every tandem lease.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tandem_schemas::{Health, InstanceRecord};

use crate::registry::Registry;

/// The metadata key that holds a Consul service's checks.
pub const CHECKS_META_KEY: &str = "consul-checks";
/// The namespace Consul's API reads and writes.
pub const NAMESPACE: &str = "default";
/// Checks one service may have (their definitions share one 1 KiB metadata value).
pub const CHECKS_PER_SERVICE_MAX: usize = 8;
/// Shortest TTL (and `DeregisterCriticalServiceAfter`) accepted.
pub const CHECK_TTL_MS_MIN: u64 = 1_000;
/// Longest TTL (and `DeregisterCriticalServiceAfter`) accepted: a day.
pub const CHECK_TTL_MS_MAX: u64 = 24 * 3_600_000;
/// Longest check id and name.
pub const CHECK_NAME_BYTES_MAX: usize = 64;

/// A check's status, as Consul names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Passing,
    Warning,
    Critical,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Passing => "passing",
            CheckStatus::Warning => "warning",
            CheckStatus::Critical => "critical",
        }
    }

    pub fn parse(s: &str) -> Option<CheckStatus> {
        match s {
            "passing" => Some(CheckStatus::Passing),
            "warning" => Some(CheckStatus::Warning),
            "critical" => Some(CheckStatus::Critical),
            _ => None,
        }
    }

    /// The status a tandem record's health and status read as (an instance registered
    /// through tandem's own API has no Consul checks).
    pub fn of_health(h: Health) -> CheckStatus {
        match h {
            Health::Healthy => CheckStatus::Passing,
            Health::Suspect => CheckStatus::Warning,
            Health::Unhealthy => CheckStatus::Critical,
        }
    }
}

/// One check of a service, as stored in its metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckDef {
    pub id: String,
    pub name: String,
    pub ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dca_ms: Option<u64>,
    pub status: CheckStatus,
}

/// The checks a record carries (none: not registered through the Consul API, or a value
/// that does not parse, which is then shown as no checks).
pub fn checks_of(r: &InstanceRecord) -> Vec<CheckDef> {
    r.metadata.get(CHECKS_META_KEY).and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default()
}

/// The health that `checks` add up to.
pub fn aggregate(checks: &[CheckDef]) -> Health {
    if checks.iter().any(|c| c.status == CheckStatus::Critical) {
        Health::Unhealthy
    } else if checks.iter().any(|c| c.status == CheckStatus::Warning) {
        Health::Suspect
    } else {
        Health::Healthy
    }
}

/// Writes `checks` into the record's metadata.
pub fn store_checks(metadata: &mut std::collections::BTreeMap<String, String>, checks: &[CheckDef]) {
    if checks.is_empty() {
        metadata.remove(CHECKS_META_KEY);
    } else {
        metadata.insert(CHECKS_META_KEY.to_owned(), serde_json::to_string(checks).unwrap_or_default());
    }
}

/// The edit that sets check `id` to `status` and the record's health to the aggregate;
/// false (nothing written) when it already is, or the record has no such check.
pub fn set_status(id: String, status: CheckStatus) -> impl Fn(&mut InstanceRecord) -> bool + Send + Sync {
    move |r: &mut InstanceRecord| {
        let mut checks = checks_of(r);
        let Some(c) = checks.iter_mut().find(|c| c.id == id) else { return false };
        if c.status == status {
            return false;
        }
        c.status = status;
        store_checks(&mut r.metadata, &checks);
        r.health = aggregate(&checks);
        true
    }
}

/// One TTL check as the serving node times it.
#[derive(Clone, Debug)]
struct Timed {
    service: String,
    instance: String,
    ttl_ms: u64,
    dca_ms: Option<u64>,
    /// When the check lapses without a `pass`/`warn`/`fail` (monotonic ms).
    deadline_ms: u64,
    status: CheckStatus,
    critical_since_ms: Option<u64>,
}

#[derive(Default)]
struct Table {
    loaded: bool,
    checks: HashMap<String, Timed>,
    /// Service id -> service name, of the services registered through the Consul API.
    services: HashMap<String, String>,
}

/// What the timer found due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Due {
    /// Check `check` of `service/instance` passed its TTL: it turns critical (from `was`).
    Lapse { check: String, service: String, instance: String, was: CheckStatus },
    /// `service/instance` has had a critical check for its `DeregisterCriticalServiceAfter`.
    Reap { service: String, instance: String },
}

/// The TTLs of the Consul checks this node times (see the module docs).
#[derive(Default)]
pub struct TtlTable {
    table: Mutex<Table>,
}

/// Where a check belongs: (service, instance id).
pub type Owner = (String, String);

impl TtlTable {
    /// Forgets everything (this node stopped serving the DC's writes).
    pub fn forget_all(&self) {
        *self.table.lock() = Table::default();
    }

    /// Fills the table from the view once after the node started serving: every own
    /// record of [`NAMESPACE`] with checks, each deadline one TTL from `now_ms`.
    pub fn load(&self, reg: &Registry, now_ms: u64) {
        if self.table.lock().loaded {
            return;
        }
        let mut found: Vec<(String, String, Vec<CheckDef>)> = Vec::new();
        reg.each_instance(NAMESPACE, |svc, _, r| {
            if *r.key.owner_dc == *reg.dc && r.metadata.contains_key(CHECKS_META_KEY) {
                found.push((svc.to_owned(), r.key.instance_id.to_string(), checks_of(r)));
            }
        });
        let mut t = self.table.lock();
        if t.loaded {
            return;
        }
        t.loaded = true;
        for (svc, id, checks) in found {
            put(&mut t, &svc, &id, &checks, now_ms);
        }
    }

    /// A service was (re-)registered with `checks`: its old checks go, these start now.
    pub fn registered(&self, service: &str, instance: &str, checks: &[CheckDef], now_ms: u64) {
        let mut t = self.table.lock();
        drop_instance(&mut t, instance);
        put(&mut t, service, instance, checks, now_ms);
    }

    /// A service was deregistered: its checks go.
    pub fn deregistered(&self, instance: &str) {
        drop_instance(&mut self.table.lock(), instance);
    }

    /// The service name of a service id registered through the Consul API.
    pub fn service_of(&self, instance: &str) -> Option<String> {
        self.table.lock().services.get(instance).cloned()
    }

    /// Who holds check `id` now, if anyone.
    pub fn holder(&self, id: &str) -> Option<Owner> {
        self.table.lock().checks.get(id).map(|c| (c.service.clone(), c.instance.clone()))
    }

    /// Where check `id` belongs, and whether its status already is `status`.
    pub fn lookup(&self, id: &str, status: CheckStatus) -> Option<(Owner, bool)> {
        let t = self.table.lock();
        t.checks.get(id).map(|c| ((c.service.clone(), c.instance.clone()), c.status == status))
    }

    /// A `pass`/`warn`/`fail` of check `id` (its status now `status`): its TTL restarts.
    pub fn updated(&self, id: &str, status: CheckStatus, now_ms: u64) {
        if let Some(c) = self.table.lock().checks.get_mut(id) {
            c.deadline_ms = now_ms.saturating_add(c.ttl_ms);
            set(c, status, now_ms);
        }
    }

    /// A write the timer asked for did not happen (the record is gone): the instance's
    /// checks go.
    pub fn gone(&self, instance: &str) {
        self.deregistered(instance);
    }

    /// A lapse's write failed (no leader, a log that cannot write): the check is not
    /// critical after all, and lapses again at the next tick.
    pub fn lapse_failed(&self, id: &str, was: CheckStatus) {
        if let Some(c) = self.table.lock().checks.get_mut(id) {
            c.status = was;
            c.critical_since_ms = None;
        }
    }

    /// What is due at `now_ms`. A lapse is marked critical here at once, so the next call
    /// does not report it again; a write that fails is retried at the next lapse.
    pub fn due(&self, now_ms: u64) -> Vec<Due> {
        let mut t = self.table.lock();
        let mut out = Vec::new();
        let mut reap: Vec<Owner> = Vec::new();
        for (id, c) in t.checks.iter_mut() {
            if c.status != CheckStatus::Critical && now_ms >= c.deadline_ms {
                let was = c.status;
                set(c, CheckStatus::Critical, now_ms);
                out.push(Due::Lapse {
                    check: id.clone(),
                    service: c.service.clone(),
                    instance: c.instance.clone(),
                    was,
                });
            }
            if let (Some(since), Some(dca)) = (c.critical_since_ms, c.dca_ms) {
                if now_ms.saturating_sub(since) >= dca {
                    let owner = (c.service.clone(), c.instance.clone());
                    if !reap.contains(&owner) {
                        reap.push(owner);
                    }
                }
            }
        }
        for (service, instance) in reap {
            drop_instance(&mut t, &instance);
            out.push(Due::Reap { service, instance });
        }
        out
    }

    /// How many checks the table times.
    pub fn len(&self) -> usize {
        self.table.lock().checks.len()
    }

    /// Whether the table times no check.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn set(c: &mut Timed, status: CheckStatus, now_ms: u64) {
    if status == CheckStatus::Critical {
        c.critical_since_ms.get_or_insert(now_ms);
    } else {
        c.critical_since_ms = None;
    }
    c.status = status;
}

fn put(t: &mut Table, service: &str, instance: &str, checks: &[CheckDef], now_ms: u64) {
    t.services.insert(instance.to_owned(), service.to_owned());
    for c in checks {
        let mut timed = Timed {
            service: service.to_owned(),
            instance: instance.to_owned(),
            ttl_ms: c.ttl_ms,
            dca_ms: c.dca_ms,
            deadline_ms: now_ms.saturating_add(c.ttl_ms),
            status: c.status,
            critical_since_ms: None,
        };
        set(&mut timed, c.status, now_ms);
        t.checks.insert(c.id.clone(), timed);
    }
}

fn drop_instance(t: &mut Table, instance: &str) {
    t.services.remove(instance);
    t.checks.retain(|_, c| c.instance != instance);
}

/// Parses a Go duration (`10s`, `1m30s`, `500ms`, `1.5h`) into ms.
pub fn parse_go_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "0" {
        return Some(0);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_end);
        let n: f64 = num.parse().ok()?;
        let unit_end = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let ms = match unit {
            "ns" => n / 1e6,
            "us" | "µs" => n / 1e3,
            "ms" => n,
            "s" => n * 1e3,
            "m" => n * 60e3,
            "h" => n * 3_600e3,
            _ => return None,
        };
        total += ms;
        rest = next;
    }
    (total.is_finite() && total < 1e15).then_some(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(id: &str, status: CheckStatus) -> CheckDef {
        CheckDef { id: id.into(), name: id.into(), ttl_ms: 2_000, dca_ms: Some(5_000), status }
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("10s"), Some(10_000));
        assert_eq!(parse_go_duration("1m30s"), Some(90_000));
        assert_eq!(parse_go_duration("500ms"), Some(500));
        assert_eq!(parse_go_duration("1.5h"), Some(5_400_000));
        assert_eq!(parse_go_duration("0"), Some(0));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("10x"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    #[test]
    fn the_worst_check_decides_the_health() {
        use CheckStatus::*;
        assert_eq!(aggregate(&[]), Health::Healthy);
        assert_eq!(aggregate(&[def("a", Passing), def("b", Warning)]), Health::Suspect);
        assert_eq!(aggregate(&[def("a", Critical), def("b", Warning)]), Health::Unhealthy);
    }

    #[test]
    fn a_lapse_is_reported_once_and_a_critical_check_reaps_after_its_time() {
        let t = TtlTable::default();
        t.registered("web", "web1", &[def("service:web1", CheckStatus::Passing)], 0);
        assert!(t.due(1_999).is_empty());
        let lapse = Due::Lapse {
            check: "service:web1".into(),
            service: "web".into(),
            instance: "web1".into(),
            was: CheckStatus::Passing,
        };
        assert_eq!(t.due(2_000), vec![lapse]);
        assert!(t.due(2_500).is_empty(), "reported once");
        // A pass revives it and restarts both clocks.
        t.updated("service:web1", CheckStatus::Passing, 3_000);
        assert!(t.due(4_999).is_empty());
        assert_eq!(t.due(5_000).len(), 1);
        assert_eq!(t.due(10_000), vec![Due::Reap { service: "web".into(), instance: "web1".into() }]);
        assert!(t.is_empty(), "a reaped service's checks go");
    }
}
