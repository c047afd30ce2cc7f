//! `[limits]`: what the registry holds (services, namespaces; per namespace: own
//! instances, services, metadata bytes) and how fast one principal or one client address
//! may send requests. Every value is reloadable.

use std::collections::BTreeMap;

use serde::Deserialize;

/// What the registry holds, bounded (docs/deploy.md, "Limits"). Checked by local
/// registrations only: records replicated from a peer are always taken (refusing them
/// would break convergence), and each DC caps its own, so the view holds at most the sum
/// of the DCs' caps. Reloadable.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Most services the view holds (local and replicated); a local registration of one
    /// more is refused with 507 `too_many_services`.
    pub services_max: u64,
    /// Most namespaces the view holds; a local registration in one more is refused with
    /// 507 `too_many_namespaces`.
    pub namespaces_max: u64,
    /// Quota of every namespace without its own entry in `namespace`: own instances,
    /// services (local and replicated), metadata bytes of own instances. Past one, a local
    /// registration gets 507 `quota_exceeded`.
    pub namespace_instances_max: u64,
    pub namespace_services_max: u64,
    pub namespace_metadata_bytes_max: u64,
    /// Quotas of named namespaces (`[limits.namespace.team-a] instances_max = 500`); a
    /// value left out is the default above.
    pub namespace: BTreeMap<String, NamespaceQuota>,
    /// Requests a second one principal (a token's principal) may send, sustained; 0: no
    /// limit. Only with ACLs on (with them off, everyone is one principal). Past it: 429
    /// `rate_limited` with `Retry-After`.
    pub requests_per_second_per_principal: u32,
    /// How many requests over the rate a principal may send at once (0: the rate).
    pub requests_burst_per_principal: u32,
    /// Requests a second from one client address (IPv6: one /64), sustained; 0: no limit.
    pub requests_per_second_per_address: u32,
    pub requests_burst_per_address: u32,
}

/// `[limits.namespace.<name>]`: one namespace's quota.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NamespaceQuota {
    pub instances_max: Option<u64>,
    pub services_max: Option<u64>,
    pub metadata_bytes_max: Option<u64>,
}

/// A namespace's quota in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub instances_max: u64,
    pub services_max: u64,
    pub metadata_bytes_max: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            services_max: 100_000,
            namespaces_max: 1_000,
            namespace_instances_max: 1_000_000,
            namespace_services_max: 100_000,
            namespace_metadata_bytes_max: 256 << 20,
            namespace: BTreeMap::new(),
            requests_per_second_per_principal: 0,
            requests_burst_per_principal: 0,
            requests_per_second_per_address: 0,
            requests_burst_per_address: 0,
        }
    }
}

/// Largest request rate or burst accepted.
const RATE_MAX: u32 = 10_000_000;

impl LimitsSection {
    /// The quota of namespace `ns`.
    pub fn quota(&self, ns: &str) -> Quota {
        let o = self.namespace.get(ns);
        Quota {
            instances_max: o.and_then(|q| q.instances_max).unwrap_or(self.namespace_instances_max),
            services_max: o.and_then(|q| q.services_max).unwrap_or(self.namespace_services_max),
            metadata_bytes_max: o
                .and_then(|q| q.metadata_bytes_max)
                .unwrap_or(self.namespace_metadata_bytes_max),
        }
    }

    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, r: &str| Err((format!("[limits] {k}"), r.to_owned()));
        if !(1..=10_000_000).contains(&self.services_max) {
            return bad("services_max", "must be 1..=10000000");
        }
        if !(1..=1_000_000).contains(&self.namespaces_max) {
            return bad("namespaces_max", "must be 1..=1000000");
        }
        for ns in self.namespace.keys() {
            if let Err(e) = tandem_schemas::validate_name("namespace", ns) {
                return Err((format!("[limits.namespace.{ns}]"), e.to_string()));
            }
        }
        // The defaults (a name no namespace has), then every named namespace.
        for q in std::iter::once(self.quota("")).chain(self.namespace.keys().map(|k| self.quota(k))) {
            if !(1..=100_000_000).contains(&q.instances_max) {
                return bad(
                    "namespace_instances_max (or a namespace's instances_max)",
                    "must be 1..=100000000",
                );
            }
            if !(1..=10_000_000).contains(&q.services_max) {
                return bad("namespace_services_max (or a namespace's services_max)", "must be 1..=10000000");
            }
            if !(1..=(1u64 << 40)).contains(&q.metadata_bytes_max) {
                return bad(
                    "namespace_metadata_bytes_max (or a namespace's metadata_bytes_max)",
                    "must be 1..=2^40",
                );
            }
        }
        for (k, v) in [
            ("requests_per_second_per_principal", self.requests_per_second_per_principal),
            ("requests_burst_per_principal", self.requests_burst_per_principal),
            ("requests_per_second_per_address", self.requests_per_second_per_address),
            ("requests_burst_per_address", self.requests_burst_per_address),
        ] {
            if v > RATE_MAX {
                return bad(k, "must be 0..=10000000");
            }
        }
        Ok(())
    }
}
