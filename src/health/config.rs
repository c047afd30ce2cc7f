//! Health settings ([`HealthConfig`]), their limits and errors, and the per-lease times
//! ([`LeaseTimes`]).

/// Shortest suspect time [`LeaseTimes::from_ttl`] produces.
pub const LEASE_SUSPECT_MS_MIN: u64 = 100;

/// Shortest client TTL [`LeaseTimes::from_ttl`] honours; shorter ones are raised to it.
pub const LEASE_TTL_MS_MIN: u64 = 6 * LEASE_SUSPECT_MS_MIN;

/// Longest duration any health setting may have (one day, the longest client TTL).
pub const DURATION_MS_LIMIT: u64 = 24 * 3600 * 1000;

/// Largest allowed `recovery_heartbeats`.
pub const RECOVERY_HEARTBEATS_LIMIT: u32 = 100;

/// Largest allowed `flap_transitions_max`. Bounds the per-lease flip record.
pub const FLAP_TRANSITIONS_MAX_LIMIT: u32 = 64;

/// Number of buckets in the self-preservation sliding window (fixed memory).
pub const SELF_PRESERVATION_BUCKETS: usize = 60;

/// Fewest expected renewals per lease in one self-preservation window: with fewer, the
/// count depends more on heartbeat phase than on health.
pub const SELF_PRESERVATION_WINDOW_INTERVALS_MIN: u64 = 4;

/// Timing, recovery, damping and self-preservation settings. Check with
/// [`HealthConfig::validate`] before use.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthConfig {
    /// How often clients are expected to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Silence after which an instance is Suspect (default: one interval).
    pub suspect_after_ms: u64,
    /// Silence after which an instance is Unhealthy.
    pub unhealthy_after_ms: u64,
    /// Silence after which the lease expires (unless expiry is paused).
    pub expire_after_ms: u64,
    /// Consecutive heartbeats needed for each step back (Unhealthy -> Suspect -> Healthy).
    pub recovery_heartbeats: u32,
    /// Window in which flips are counted, and the quiet time that releases damping.
    pub flap_window_ms: u64,
    /// Most flips published within `flap_window_ms`; the next one engages damping.
    pub flap_transitions_max: u32,
    pub self_preservation_enabled: bool,
    /// Expiry pauses when renewals fall below this share of those expected (0 never pauses).
    pub self_preservation_threshold: f64,
    /// Window over which renewals are counted; also the warm-up after start.
    pub self_preservation_window_ms: u64,
    /// Below this many leases in a namespace, self-preservation never pauses its expiry.
    pub self_preservation_min_leases: usize,
    /// Longest a namespace's expiry may stay paused; then expiry resumes there.
    pub self_preservation_max_pause_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            heartbeat_interval_ms: 5_000,
            // One missed beat plus half an interval of tolerance: a client beating on time
            // at the default interval never flaps to Suspect because of jitter.
            suspect_after_ms: 7_500,
            unhealthy_after_ms: 15_000,
            expire_after_ms: 30_000,
            recovery_heartbeats: 2,
            flap_window_ms: 60_000,
            flap_transitions_max: 6,
            self_preservation_enabled: true,
            self_preservation_threshold: 0.85,
            self_preservation_window_ms: 60_000,
            // 1 / (1 - 0.85) < 7: below that, one lost lease would pause expiry.
            self_preservation_min_leases: 10,
            self_preservation_max_pause_ms: 15 * 60_000,
        }
    }
}

impl HealthConfig {
    /// The lease times of instances that did not ask for their own TTL.
    pub fn default_times(&self) -> LeaseTimes {
        LeaseTimes {
            suspect_after_ms: self.suspect_after_ms,
            unhealthy_after_ms: self.unhealthy_after_ms,
            expire_after_ms: self.expire_after_ms,
        }
    }

    /// Checks every setting; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), HealthConfigError> {
        nonzero_duration("heartbeat_interval_ms", self.heartbeat_interval_ms)?;
        self.default_times().validate()?;
        if self.heartbeat_interval_ms > self.suspect_after_ms {
            return Err(HealthConfigError::Order {
                field: "heartbeat_interval_ms",
                value_ms: self.heartbeat_interval_ms,
                relation: "at most",
                other: "suspect_after_ms",
                other_ms: self.suspect_after_ms,
            });
        }
        bounded_count("recovery_heartbeats", self.recovery_heartbeats, RECOVERY_HEARTBEATS_LIMIT)?;
        nonzero_duration("flap_window_ms", self.flap_window_ms)?;
        bounded_count("flap_transitions_max", self.flap_transitions_max, FLAP_TRANSITIONS_MAX_LIMIT)?;
        let threshold = self.self_preservation_threshold;
        if !(0.0..=1.0).contains(&threshold) {
            return Err(HealthConfigError::Threshold { value: threshold });
        }
        nonzero_duration("self_preservation_window_ms", self.self_preservation_window_ms)?;
        nonzero_duration("self_preservation_max_pause_ms", self.self_preservation_max_pause_ms)?;
        let window_min_ms = SELF_PRESERVATION_WINDOW_INTERVALS_MIN * self.heartbeat_interval_ms;
        if self.self_preservation_window_ms < window_min_ms {
            return Err(HealthConfigError::Order {
                field: "self_preservation_window_ms",
                value_ms: self.self_preservation_window_ms,
                relation: "at least",
                other: "4 * heartbeat_interval_ms",
                other_ms: window_min_ms,
            });
        }
        Ok(())
    }
}

/// A health setting that is out of range or out of order. Validation never changes state.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HealthConfigError {
    #[error("{field} must be greater than zero")]
    Zero { field: &'static str },
    #[error("{field} is {value}, above its limit {limit}")]
    AboveLimit { field: &'static str, value: u64, limit: u64 },
    #[error("{field} ({value_ms} ms) must be {relation} {other} ({other_ms} ms)")]
    Order { field: &'static str, value_ms: u64, relation: &'static str, other: &'static str, other_ms: u64 },
    #[error("self_preservation_threshold must be within 0..=1, got {value}")]
    Threshold { value: f64 },
}

fn nonzero_duration(field: &'static str, value_ms: u64) -> Result<(), HealthConfigError> {
    if value_ms == 0 {
        return Err(HealthConfigError::Zero { field });
    }
    if value_ms > DURATION_MS_LIMIT {
        return Err(HealthConfigError::AboveLimit { field, value: value_ms, limit: DURATION_MS_LIMIT });
    }
    Ok(())
}

fn bounded_count(field: &'static str, value: u32, limit: u32) -> Result<(), HealthConfigError> {
    if value == 0 {
        return Err(HealthConfigError::Zero { field });
    }
    if value > limit {
        return Err(HealthConfigError::AboveLimit { field, value: value.into(), limit: limit.into() });
    }
    Ok(())
}

/// The silence thresholds of one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimes {
    pub suspect_after_ms: u64,
    pub unhealthy_after_ms: u64,
    pub expire_after_ms: u64,
}

impl LeaseTimes {
    /// Times for a client-chosen TTL, in the default proportions: expire at the TTL,
    /// Unhealthy at half of it, Suspect at a quarter. The TTL is first clamped to
    /// `LEASE_TTL_MS_MIN..=DURATION_MS_LIMIT`, so the result is always valid
    /// (Suspect at least [`LEASE_SUSPECT_MS_MIN`]). A TTL of 30 s gives the defaults.
    pub fn from_ttl(ttl_ms: u64) -> LeaseTimes {
        let ttl_ms = ttl_ms.clamp(LEASE_TTL_MS_MIN, DURATION_MS_LIMIT);
        LeaseTimes { suspect_after_ms: ttl_ms / 4, unhealthy_after_ms: ttl_ms / 2, expire_after_ms: ttl_ms }
    }

    /// Checks `0 < suspect < unhealthy < expire <= DURATION_MS_LIMIT`.
    pub fn validate(&self) -> Result<(), HealthConfigError> {
        nonzero_duration("suspect_after_ms", self.suspect_after_ms)?;
        nonzero_duration("unhealthy_after_ms", self.unhealthy_after_ms)?;
        nonzero_duration("expire_after_ms", self.expire_after_ms)?;
        let order = [
            ("suspect_after_ms", self.suspect_after_ms, "unhealthy_after_ms", self.unhealthy_after_ms),
            ("unhealthy_after_ms", self.unhealthy_after_ms, "expire_after_ms", self.expire_after_ms),
        ];
        for (field, value_ms, other, other_ms) in order {
            if value_ms >= other_ms {
                return Err(HealthConfigError::Order {
                    field,
                    value_ms,
                    relation: "less than",
                    other,
                    other_ms,
                });
            }
        }
        Ok(())
    }
}
