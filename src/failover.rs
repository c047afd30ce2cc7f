//! Failover-to-remote policy: when a service's local instances are not enough, which
//! remote DCs' instances join the answer, and when traffic fails back.
//!
//! Pure: the caller passes `now_ms` and the service's local counts; the policy state per
//! service is a small value the caller keeps. No clock reads, no I/O.

use serde::Deserialize;

/// Where a service's answer may come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Only this DC's instances, whatever happens.
    LocalOnly,
    /// This DC's instances; remote ones join when the local side falls below the trigger.
    LocalFirst,
    /// Every DC's instances, always.
    Global,
}

impl From<Mode> for tandem_client::api::FailoverMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::LocalOnly => Self::LocalOnly,
            Mode::LocalFirst => Self::LocalFirst,
            Mode::Global => Self::Global,
        }
    }
}

/// One effective policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub mode: Mode,
    /// Failover when fewer healthy local instances than this (0 disables this trigger).
    pub min_healthy: u32,
    /// Failover when the healthy share of local instances is below this (0..=1; 0 disables).
    pub min_healthy_pct: f64,
    /// Remote DCs in priority order; empty means every remote DC, by name.
    pub remote_dcs: Vec<String>,
    /// Whether copies from a DC whose link is stale may be offered.
    pub offer_stale: bool,
    /// Failback only after the local side stayed above the trigger this long.
    pub failback_hold_ms: u64,
    /// Least time between two switches.
    pub cooldown_ms: u64,
    /// Weight of remote instances, as a percentage of their own weight (partial spill).
    pub remote_weight_pct: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::LocalFirst,
            min_healthy: 1,
            min_healthy_pct: 0.0,
            remote_dcs: vec![],
            offer_stale: true,
            failback_hold_ms: 30_000,
            cooldown_ms: 5_000,
            remote_weight_pct: 100,
        }
    }
}

/// Policy as written in TOML: every field optional, layered default < namespace < service.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyFields {
    pub mode: Option<Mode>,
    pub min_healthy: Option<u32>,
    pub min_healthy_pct: Option<f64>,
    pub remote_dcs: Option<Vec<String>>,
    pub offer_stale: Option<bool>,
    pub failback_hold_ms: Option<u64>,
    pub cooldown_ms: Option<u64>,
    pub remote_weight_pct: Option<u32>,
}

/// A namespace- or service-level override.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverride {
    pub namespace: String,
    /// Absent: the override applies to the whole namespace.
    pub service: Option<String>,
    #[serde(flatten)]
    pub fields: PolicyFields,
}

/// The `[failover]` table: defaults plus `[[failover.overrides]]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(flatten)]
    pub default: PolicyFields,
    #[serde(default)]
    pub overrides: Vec<PolicyOverride>,
}

impl PolicyFields {
    fn apply(&self, p: &mut Policy) {
        if let Some(v) = self.mode {
            p.mode = v;
        }
        if let Some(v) = self.min_healthy {
            p.min_healthy = v;
        }
        if let Some(v) = self.min_healthy_pct {
            p.min_healthy_pct = v;
        }
        if let Some(v) = &self.remote_dcs {
            p.remote_dcs = v.clone();
        }
        if let Some(v) = self.offer_stale {
            p.offer_stale = v;
        }
        if let Some(v) = self.failback_hold_ms {
            p.failback_hold_ms = v;
        }
        if let Some(v) = self.cooldown_ms {
            p.cooldown_ms = v;
        }
        if let Some(v) = self.remote_weight_pct {
            p.remote_weight_pct = v;
        }
    }

    fn validate(&self, at: &str) -> Result<(), PolicyError> {
        let err = |field: &str, reason: String| PolicyError { key: format!("{at}{field}"), reason };
        if let Some(v) = self.min_healthy_pct {
            if !(0.0..=1.0).contains(&v) {
                return Err(err("min_healthy_pct", format!("must be within 0..=1, got {v}")));
            }
        }
        if let Some(v) = self.remote_weight_pct {
            if v > 100 {
                return Err(err("remote_weight_pct", format!("must be 0..=100, got {v}")));
            }
        }
        if let Some(dcs) = &self.remote_dcs {
            for dc in dcs {
                tandem_schemas::validate_dc("remote_dcs", dc)
                    .map_err(|e| err("remote_dcs", e.to_string()))?;
            }
        }
        Ok(())
    }
}

/// An invalid failover policy: `key` names the setting as written under `[failover]`
/// (`overrides[2].min_healthy_pct`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct PolicyError {
    pub key: String,
    pub reason: String,
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.default.validate("")?;
        for (i, o) in self.overrides.iter().enumerate() {
            let at = format!("overrides[{i}].");
            let err = |field: &str, e: tandem_schemas::ValidationError| PolicyError {
                key: format!("{at}{field}"),
                reason: e.to_string(),
            };
            tandem_schemas::validate_name("namespace", &o.namespace).map_err(|e| err("namespace", e))?;
            if let Some(s) = &o.service {
                tandem_schemas::validate_name("service", s).map_err(|e| err("service", e))?;
            }
            o.fields.validate(&at)?;
        }
        Ok(())
    }

    /// The effective policy of one service.
    pub fn policy_for(&self, namespace: &str, service: &str) -> Policy {
        let mut p = Policy::default();
        self.default.apply(&mut p);
        for o in self.overrides.iter().filter(|o| o.namespace == namespace && o.service.is_none()) {
            o.fields.apply(&mut p);
        }
        for o in self
            .overrides
            .iter()
            .filter(|o| o.namespace == namespace && o.service.as_deref() == Some(service))
        {
            o.fields.apply(&mut p);
        }
        p
    }
}

/// Per-service failover state kept between evaluations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailoverState {
    pub active: bool,
    /// When the last switch happened (None: never).
    pub last_switch_ms: Option<u64>,
    /// While active: since when the local side has been above the trigger.
    pub local_ok_since_ms: Option<u64>,
}

/// The local side of a service as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalCounts {
    pub healthy: u32,
    pub total: u32,
}

/// What the policy decided, and why (shown to users).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub active: bool,
    pub reason: String,
}

fn triggered(p: &Policy, local: LocalCounts) -> Option<String> {
    if p.min_healthy > 0 && local.healthy < p.min_healthy {
        return Some(format!(
            "{} healthy local instances, below min_healthy {}",
            local.healthy, p.min_healthy
        ));
    }
    if p.min_healthy_pct > 0.0 {
        let pct = if local.total == 0 { 0.0 } else { f64::from(local.healthy) / f64::from(local.total) };
        if pct < p.min_healthy_pct {
            return Some(format!(
                "healthy local share {:.0}% below min_healthy_pct {:.0}%",
                pct * 100.0,
                p.min_healthy_pct * 100.0
            ));
        }
    }
    None
}

/// Evaluates the policy: the new state and the decision. Failover starts as soon as the
/// trigger holds (subject to the cooldown); failback waits until the local side stayed
/// healthy for `failback_hold_ms` (and the cooldown passed), so the answer cannot flap.
pub fn evaluate(
    p: &Policy,
    state: &FailoverState,
    local: LocalCounts,
    now_ms: u64,
) -> (FailoverState, Decision) {
    let mut s = state.clone();
    let cooled =
        |s: &FailoverState| s.last_switch_ms.is_none_or(|t| now_ms.saturating_sub(t) >= p.cooldown_ms);
    match p.mode {
        Mode::LocalOnly => {
            s = FailoverState { active: false, last_switch_ms: s.last_switch_ms, local_ok_since_ms: None };
            (s, Decision { active: false, reason: "mode local_only".into() })
        }
        Mode::Global => {
            s = FailoverState { active: true, last_switch_ms: s.last_switch_ms, local_ok_since_ms: None };
            (s, Decision { active: true, reason: "mode global: every DC is offered".into() })
        }
        Mode::LocalFirst => {
            let trig = triggered(p, local);
            match (s.active, trig) {
                (false, Some(why)) => {
                    if cooled(&s) {
                        s.active = true;
                        s.last_switch_ms = Some(now_ms);
                        s.local_ok_since_ms = None;
                        (s, Decision { active: true, reason: why })
                    } else {
                        (s, Decision { active: false, reason: format!("{why}; held back by cooldown") })
                    }
                }
                (false, None) => (s, Decision { active: false, reason: "local instances suffice".into() }),
                (true, Some(why)) => {
                    s.local_ok_since_ms = None;
                    (s, Decision { active: true, reason: why })
                }
                (true, None) => {
                    let since = *s.local_ok_since_ms.get_or_insert(now_ms);
                    let held = now_ms.saturating_sub(since);
                    if held >= p.failback_hold_ms && cooled(&s) {
                        s.active = false;
                        s.last_switch_ms = Some(now_ms);
                        s.local_ok_since_ms = None;
                        (s, Decision { active: false, reason: "local side recovered; failed back".into() })
                    } else {
                        // Time-free text: an answer is a function of its index (see http.rs).
                        let reason = format!(
                            "local side recovered; failback once it stays healthy for {} ms",
                            p.failback_hold_ms
                        );
                        (s, Decision { active: true, reason })
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lc(healthy: u32, total: u32) -> LocalCounts {
        LocalCounts { healthy, total }
    }

    #[test]
    fn local_first_fails_over_at_zero_and_fails_back_only_after_hold() {
        let p = Policy { failback_hold_ms: 1_000, cooldown_ms: 0, ..Policy::default() };
        let s0 = FailoverState::default();
        let (s1, d) = evaluate(&p, &s0, lc(2, 2), 0);
        assert!(!d.active);
        let (s2, d) = evaluate(&p, &s1, lc(0, 2), 10);
        assert!(d.active, "{}", d.reason);
        let (s3, d) = evaluate(&p, &s2, lc(2, 2), 20);
        assert!(d.active, "failback must wait: {}", d.reason);
        let (s4, d) = evaluate(&p, &s3, lc(2, 2), 1_019);
        assert!(d.active);
        let (_, d) = evaluate(&p, &s4, lc(2, 2), 1_020);
        assert!(!d.active, "{}", d.reason);
    }

    #[test]
    fn a_dip_during_the_hold_restarts_it() {
        let p = Policy { failback_hold_ms: 1_000, cooldown_ms: 0, ..Policy::default() };
        let (s, _) = evaluate(&p, &FailoverState::default(), lc(0, 1), 0);
        let (s, _) = evaluate(&p, &s, lc(1, 1), 100);
        let (s, d) = evaluate(&p, &s, lc(0, 1), 600);
        assert!(d.active);
        let (s, d) = evaluate(&p, &s, lc(1, 1), 700);
        assert!(d.active);
        let (_, d) = evaluate(&p, &s, lc(1, 1), 1_200);
        assert!(d.active, "hold restarted at 700");
        let (_, d) = evaluate(&p, &s, lc(1, 1), 1_700);
        assert!(!d.active);
    }

    #[test]
    fn cooldown_delays_a_new_failover() {
        let p = Policy { failback_hold_ms: 0, cooldown_ms: 500, ..Policy::default() };
        let (s, d) = evaluate(&p, &FailoverState::default(), lc(0, 1), 1_000);
        assert!(d.active);
        let (s, d) = evaluate(&p, &s, lc(1, 1), 1_600);
        assert!(!d.active);
        let (s, d) = evaluate(&p, &s, lc(0, 1), 1_700);
        assert!(!d.active, "cooldown: {}", d.reason);
        let (_, d) = evaluate(&p, &s, lc(0, 1), 2_100);
        assert!(d.active);
    }

    #[test]
    fn percentage_trigger_and_modes() {
        let p = Policy { min_healthy: 0, min_healthy_pct: 0.5, cooldown_ms: 0, ..Policy::default() };
        assert!(!evaluate(&p, &FailoverState::default(), lc(5, 10), 0).1.active);
        assert!(evaluate(&p, &FailoverState::default(), lc(4, 10), 0).1.active);
        let only = Policy { mode: Mode::LocalOnly, ..Policy::default() };
        assert!(!evaluate(&only, &FailoverState::default(), lc(0, 0), 0).1.active);
        let global = Policy { mode: Mode::Global, ..Policy::default() };
        assert!(evaluate(&global, &FailoverState::default(), lc(9, 9), 0).1.active);
    }

    #[test]
    fn overrides_layer_namespace_then_service() {
        let cfg: PolicyConfig = toml::from_str(
            r#"
            mode = "local_first"
            min_healthy = 2
            [[overrides]]
            namespace = "prod"
            min_healthy = 3
            [[overrides]]
            namespace = "prod"
            service = "pay"
            mode = "local_only"
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.policy_for("dev", "x").min_healthy, 2);
        assert_eq!(cfg.policy_for("prod", "x").min_healthy, 3);
        let pay = cfg.policy_for("prod", "pay");
        assert_eq!((pay.mode, pay.min_healthy), (Mode::LocalOnly, 3));
        let bad: PolicyConfig = toml::from_str("min_healthy_pct = 1.5").unwrap();
        assert_eq!(bad.validate().unwrap_err().key, "min_healthy_pct");
    }
}
