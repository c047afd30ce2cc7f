//! Instance selection and outlier ejection, on the consumer's side.
//!
//! Pure: the instance list, the time (`now_ms`, any monotonic origin) and the random
//! source are passed in. No I/O, no clock.
//!
//! Selection, in order of preference (the first non-empty tier wins):
//! 1. status `up`, health healthy or suspect, not ejected;
//! 2. status `up`, not ejected (the registry's protect threshold listed unhealthy ones);
//! 3. status `up`, ejected or not (every candidate is ejected: better a doubtful instance
//!    than none).
//!
//! Draining, out-of-service and unknown-status instances are never picked.
//!
//! Outlier ejection (after Envoy's consecutive-5xx detector): after `consecutive_failures`
//! failures in a row reported for an instance, it is ejected for `base * n` (capped at
//! `max`), n counting its ejections; n starts again from zero once the instance has stayed
//! back for `max` without a new ejection. An ejection is refused (the instance stays in)
//! when it would leave more than `max_ejected_pct` percent of the `up` instances ejected,
//! or none of them in. Ejection is local to this consumer: one caller's failures never
//! remove an instance from the registry.

use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;

use super::model::{Health, Instance, Status};

/// How [`Balancer::pick`] chooses among the preferred tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Random, proportional to each instance's weight (remote instances carry the weight
    /// the registry's `remote_weight_pct` gave them). All weights zero: uniform.
    #[default]
    WeightedRandom,
    /// In turn, in the view's order (owner DC, instance id), ignoring weights.
    RoundRobin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionConfig {
    /// Failures in a row that eject an instance (at least 1).
    pub consecutive_failures: u32,
    /// First ejection time; the n-th lasts `base * n`.
    pub base: Duration,
    /// Longest ejection time.
    pub max: Duration,
    /// At most this share of the `up` instances is ejected at once (0..=100).
    pub max_ejected_pct: u32,
}

impl Default for EjectionConfig {
    fn default() -> Self {
        EjectionConfig {
            consecutive_failures: 5,
            base: Duration::from_secs(30),
            max: Duration::from_secs(300),
            max_ejected_pct: 50,
        }
    }
}

impl EjectionConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.consecutive_failures == 0 {
            return Err("ejection.consecutive_failures must be at least 1".into());
        }
        if self.base.is_zero() || self.max < self.base {
            return Err("ejection: need 0 < base <= max".into());
        }
        if self.max_ejected_pct > 100 {
            return Err("ejection.max_ejected_pct must be 0..=100".into());
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Outlier {
    failures: u32,
    ejections: u32,
    ejected_until_ms: Option<u64>,
    /// When the last ejection ended (None: never ejected or still ejected).
    back_since_ms: Option<u64>,
}

/// What one failure report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// Counted; below the threshold.
    Counted { failures: u32 },
    /// The instance is now ejected until `until_ms`.
    Ejected { until_ms: u64 },
    /// At or above the threshold, but ejecting it would pass `max_ejected_pct` or leave
    /// no instance in.
    EjectionRefused { failures: u32 },
    /// Already ejected; nothing changed.
    AlreadyEjected,
    /// Not in the current view (gone meanwhile); nothing recorded.
    NotInView,
}

/// Selection state of one service: the round-robin position and per-instance outlier state.
#[derive(Clone, Debug)]
pub struct Balancer {
    strategy: Strategy,
    cfg: EjectionConfig,
    next_rr: usize,
    hosts: HashMap<(String, String), Outlier>,
}

impl Balancer {
    pub fn new(strategy: Strategy, cfg: EjectionConfig) -> Balancer {
        Balancer { strategy, cfg, next_rr: 0, hosts: HashMap::new() }
    }

    /// Picks one instance, or `None` when no instance is `up`.
    pub fn pick<'a, R: Rng + ?Sized>(
        &mut self,
        instances: &'a [Instance],
        now_ms: u64,
        rng: &mut R,
    ) -> Option<&'a Instance> {
        self.expire(now_ms);
        let up: Vec<&Instance> = instances.iter().filter(|i| i.status == Status::Up).collect();
        let tier1: Vec<&Instance> = up
            .iter()
            .copied()
            .filter(|i| matches!(i.health, Health::Healthy | Health::Suspect) && !self.is_ejected(i, now_ms))
            .collect();
        let tier = if !tier1.is_empty() {
            tier1
        } else {
            let tier2: Vec<&Instance> = up.iter().copied().filter(|i| !self.is_ejected(i, now_ms)).collect();
            if tier2.is_empty() {
                up
            } else {
                tier2
            }
        };
        if tier.is_empty() {
            return None;
        }
        match self.strategy {
            Strategy::RoundRobin => {
                let i = self.next_rr % tier.len();
                self.next_rr = self.next_rr.wrapping_add(1);
                Some(tier[i])
            }
            Strategy::WeightedRandom => {
                let total: u64 = tier.iter().map(|i| u64::from(i.weight)).sum();
                if total == 0 {
                    return Some(tier[rng.gen_range(0..tier.len())]);
                }
                let mut r = rng.gen_range(0..total);
                for i in &tier {
                    let w = u64::from(i.weight);
                    if r < w {
                        return Some(i);
                    }
                    r -= w;
                }
                tier.last().copied()
            }
        }
    }

    /// Whether `inst` is ejected at `now_ms`.
    pub fn is_ejected(&self, inst: &Instance, now_ms: u64) -> bool {
        self.hosts.get(&inst.key()).and_then(|o| o.ejected_until_ms).is_some_and(|until| now_ms < until)
    }

    /// Keys of the instances ejected at `now_ms`.
    pub fn ejected(&self, now_ms: u64) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .hosts
            .iter()
            .filter(|(_, o)| o.ejected_until_ms.is_some_and(|u| now_ms < u))
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// A call to `inst` failed. `instances` is the current view (for the ejection cap).
    pub fn report_failure(&mut self, inst: &Instance, instances: &[Instance], now_ms: u64) -> Reported {
        self.expire(now_ms);
        if !instances.iter().any(|i| i.owner_dc == inst.owner_dc && i.instance_id == inst.instance_id) {
            return Reported::NotInView;
        }
        if self.is_ejected(inst, now_ms) {
            return Reported::AlreadyEjected;
        }
        let up: Vec<&Instance> = instances.iter().filter(|i| i.status == Status::Up).collect();
        let ejected_now = up.iter().filter(|i| self.is_ejected(i, now_ms)).count();
        let cfg = self.cfg;
        let o = self.hosts.entry(inst.key()).or_default();
        o.failures = o.failures.saturating_add(1);
        if o.failures < cfg.consecutive_failures {
            return Reported::Counted { failures: o.failures };
        }
        let after = ejected_now + 1;
        let within_pct = after * 100 <= cfg.max_ejected_pct as usize * up.len();
        if !within_pct || after >= up.len() {
            return Reported::EjectionRefused { failures: o.failures };
        }
        if o.back_since_ms.is_some_and(|b| now_ms.saturating_sub(b) >= cfg.max.as_millis() as u64) {
            o.ejections = 0;
        }
        o.ejections = o.ejections.saturating_add(1);
        let span = (cfg.base.saturating_mul(o.ejections)).min(cfg.max);
        let until_ms = now_ms.saturating_add(span.as_millis() as u64);
        o.ejected_until_ms = Some(until_ms);
        o.back_since_ms = None;
        o.failures = 0;
        Reported::Ejected { until_ms }
    }

    /// A call to `inst` succeeded: its failure run ends.
    pub fn report_success(&mut self, inst: &Instance) {
        if let Some(o) = self.hosts.get_mut(&inst.key()) {
            o.failures = 0;
        }
    }

    /// Forgets the outlier state of instances no longer in the view (bounds the state).
    pub fn retain(&mut self, instances: &[Instance]) {
        let keys: std::collections::HashSet<(String, String)> = instances.iter().map(Instance::key).collect();
        self.hosts.retain(|k, _| keys.contains(k));
    }

    /// Ends ejections whose time is up.
    fn expire(&mut self, now_ms: u64) {
        for o in self.hosts.values_mut() {
            if let Some(until) = o.ejected_until_ms {
                if now_ms >= until {
                    o.ejected_until_ms = None;
                    o.back_since_ms = Some(until);
                    o.failures = 0;
                }
            }
        }
    }
}
