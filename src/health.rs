//! Leases and health of ephemeral instances: a pure state machine, flap damping, and
//! cluster-wide self-preservation.
//!
//! Architecture invariant: this module does no I/O and never reads a clock. Every input
//! carries `now_ms`, a monotonic millisecond clock supplied by the caller, and every output
//! is a returned value. The registry drives it: [`Lease::heartbeat`] for each renewal,
//! [`Lease::tick`] from the periodic lease check, and each returned [`Transition`] becomes
//! exactly one change event. A call returns at most one transition; when much time has
//! passed it returns the final state directly (Healthy -> Unhealthy in one step), never a
//! burst of intermediate ones.
//!
//! # The lease state machine
//!
//! *Silence* is the time since the last renewal, `now_ms - last_renew_ms`; creating the
//! lease counts as a renewal. A lease has an *actual* health, driven by the rules below,
//! and a *published* health ([`Lease::health`]), which equals the actual one except while
//! the lease is damped (next section).
//!
//! Silence only ever makes health worse:
//!
//! - silence `>= suspect_after_ms`: at least Suspect;
//! - silence `>= unhealthy_after_ms`: Unhealthy;
//! - silence `>= expire_after_ms`: `tick` returns [`Transition::Expire`] unless expiry is
//!   paused, in which case the lease stays Unhealthy.
//!
//! `tick` applies these rules. `heartbeat` applies them too (never expiring: the heartbeat
//! proves the instance is alive) before it applies the renewal, so the health after a
//! heartbeat does not depend on whether a tick happened to run in the silence before it. A
//! heartbeat that ends a silence of 20 s with no tick in between therefore reports
//! Unhealthy, exactly as if the lease checker had seen the silence.
//!
//! A heartbeat is *consecutive* when the silence before it was shorter than
//! `suspect_after_ms`, i.e. short enough to have kept a healthy instance healthy. The
//! *streak* counts consecutive heartbeats; a heartbeat after a longer silence starts a new
//! streak of 1. After the silence rules, a heartbeat moves the actual health at most one
//! step up, and the way back from Unhealthy is slow (slow to kill, slow to revive):
//!
//! - Healthy stays Healthy;
//! - Suspect that has not been Unhealthy since it was last Healthy becomes Healthy (one
//!   heartbeat is enough);
//! - Unhealthy becomes Suspect once the streak reaches `recovery_heartbeats`, and the streak
//!   restarts at 0;
//! - Suspect reached on the way back from Unhealthy becomes Healthy once the streak reaches
//!   `recovery_heartbeats` again.
//!
//! With the default `recovery_heartbeats = 2`, an Unhealthy instance needs four consecutive
//! heartbeats to be Healthy again: Unhealthy, Suspect (2nd), Suspect, Healthy (4th). Health
//! never moves from Unhealthy to Healthy in one call, published or actual.
//!
//! After [`Transition::Expire`] the lease is finished: every later call returns `None`. The
//! caller removes the instance; a later heartbeat for it is a heartbeat for an unknown
//! instance, which the client answers by registering again.
//!
//! # Flap damping
//!
//! A *flip* is a change of the actual health. While a lease is not damped, each flip is
//! published as `Transition::Health { to, damped: false }` and its time is recorded; a
//! record is forgotten once it is `flap_window_ms` old. The flip that would make more than
//! `flap_transitions_max` records in the window is not published: instead the lease
//! becomes damped and returns [`Transition::Damped(true)`](Transition::Damped). A damped
//! lease holds the health it published before that flip (the current one, not an older
//! "stable" one, so engaging damping never changes the published health).
//!
//! While damped, flips are not published (the call returns `None`), and each flip restarts
//! the quiet period. Expiry is not damped: an instance that stops heartbeating altogether
//! still expires. The first call that finds `flap_window_ms` without a flip before it
//! releases the lease and publishes the actual health: `Transition::Health { to, damped:
//! false }` when it differs from the held one, `Transition::Damped(false)` otherwise. If
//! that call flips as well, the flip is folded into the same transition and recorded as the
//! first flip of the new window. One exception keeps the published path through Suspect:
//! when the held health is Unhealthy and the actual one is Healthy, the actual health is
//! set back to Suspect on the way back from Unhealthy (the streak restarts), and Suspect is
//! published.
//!
//! Consequence: within any window of `flap_window_ms`, a lease emits at most
//! `flap_transitions_max + 1` health transitions (the release plus one undamped run).
//!
//! # Self-preservation
//!
//! [`SelfPreservation`] pauses expiry for the whole registry when renewals collapse, as
//! Eureka does: a mass heartbeat loss is more likely a network or client problem than the
//! death of most instances, and expiring them all would collapse discovery. The caller
//! records every heartbeat and every registration, and before each lease check asks
//! [`SelfPreservation::evaluate`], whose answer is the `expiry_paused` argument of
//! [`Lease::tick`]. Expiry is paused, in this order of precedence:
//!
//! 1. never when `self_preservation_enabled` is false;
//! 2. never when fewer than `self_preservation_min_leases` leases exist (with a threshold of
//!    0.85, losing one lease out of six or fewer would otherwise pause expiry for good);
//! 3. always during the first `self_preservation_window_ms` after the counter starts, or
//!    after it adopts a new window (warm-up: after a restart the window has not seen a full
//!    round of heartbeats yet, and a restart must not expire the whole population);
//! 4. otherwise when `renewals < threshold * expected`, where renewals are counted in the
//!    last window and `expected = leases * window / heartbeat_interval_ms`.
//!
//! Health transitions (Suspect, Unhealthy) are not paused: only removal is.

use std::collections::VecDeque;

use tandem_schemas::Health;

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
    /// Below this many leases, self-preservation never pauses expiry.
    pub self_preservation_min_leases: usize,
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

/// Every lease of a node, with a due-time queue so that a lease check looks only at the
/// leases whose next deadline has come, not at all of them.
///
/// A heartbeat only updates its lease (O(1) amortized): it never touches the queue unless
/// it moved the lease's deadline earlier. Each queued entry carries a generation; an entry
/// whose generation is not its lease's current one is stale (the lease was rescheduled or
/// removed) and is dropped when it comes up. A lease is looked at about once per deadline
/// (for a healthy lease: once per suspect time), so a check's work is proportional to the
/// leases that are due, whatever the total.
///
/// Checking a lease early is harmless ([`Lease::tick`] returns `None`), so a deadline that
/// a heartbeat postponed costs one extra look, never a missed transition: the queue holds,
/// for every lease, an entry at or before its next deadline.
pub struct LeaseTable<K: Eq + std::hash::Hash + Clone> {
    map: std::collections::HashMap<std::sync::Arc<K>, Slot, foldhash::fast::RandomState>,
    due: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, std::sync::Arc<K>)>>,
    /// Leases past their expiry while expiry was paused, with their generation.
    parked: Vec<(std::sync::Arc<K>, u64)>,
    generation: u64,
}

struct Slot {
    lease: Lease,
    /// Generation of the queue entry that stands for this lease.
    generation: u64,
    /// Time of that entry.
    due_ms: u64,
}

impl<K: Eq + std::hash::Hash + Ord + Clone> Default for LeaseTable<K> {
    fn default() -> Self {
        LeaseTable { map: Default::default(), due: Default::default(), parked: Vec::new(), generation: 0 }
    }
}

impl<K: Eq + std::hash::Hash + Ord + Clone> LeaseTable<K> {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, key: &K) -> Option<&Lease> {
        self.map.get(key).map(|s| &s.lease)
    }

    /// Every key that has a lease, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys().map(|k| &**k)
    }

    /// Adds or replaces the lease of `key`.
    pub fn insert(&mut self, key: K, lease: Lease) {
        let key = std::sync::Arc::new(key);
        let (generation, due_ms) = self.schedule(&key, &lease);
        self.map.insert(key, Slot { lease, generation, due_ms });
    }

    pub fn remove(&mut self, key: &K) -> Option<Lease> {
        self.map.remove(key).map(|s| s.lease)
    }

    /// Renews the lease of `key` if there is one: `None` when there is none, else what
    /// [`Lease::heartbeat`] returned.
    pub fn heartbeat(&mut self, key: &K, now_ms: u64) -> Option<Option<Transition>> {
        let slot = self.map.get_mut(key)?;
        let t = slot.lease.heartbeat(now_ms);
        if slot.lease.next_deadline_ms().is_some_and(|d| d < slot.due_ms) {
            self.reschedule(key);
        }
        Some(t)
    }

    /// The lease check at `now_ms`: ticks every lease whose deadline has come and returns
    /// the transitions, in deadline order. A lease past its expiry while expiry is paused
    /// is parked, and queued again at the first check with expiry resumed.
    pub fn check(&mut self, now_ms: u64, expiry_paused: bool) -> Vec<(K, Transition)> {
        let mut out = Vec::new();
        if !expiry_paused {
            for (key, generation) in std::mem::take(&mut self.parked) {
                if let Some(slot) = self.map.get_mut(&key).filter(|s| s.generation == generation) {
                    self.generation += 1;
                    slot.generation = self.generation;
                    slot.due_ms = now_ms;
                    self.due.push(std::cmp::Reverse((now_ms, self.generation, key)));
                }
            }
        }
        while let Some(std::cmp::Reverse((due_ms, _, _))) = self.due.peek() {
            if *due_ms > now_ms {
                break;
            }
            let Some(std::cmp::Reverse((_, generation, key))) = self.due.pop() else { break };
            let Some(slot) = self.map.get_mut(&key) else { continue };
            if slot.generation != generation {
                continue;
            }
            if let Some(t) = slot.lease.tick(now_ms, expiry_paused) {
                out.push(((*key).clone(), t));
            }
            // Every entry pushed here lies after `now_ms`, so this loop ends.
            self.generation += 1;
            slot.generation = self.generation;
            slot.due_ms = u64::MAX;
            match slot.lease.next_deadline_ms() {
                None => {}
                Some(next_ms) if next_ms > now_ms => {
                    slot.due_ms = next_ms;
                    self.due.push(std::cmp::Reverse((next_ms, self.generation, key)));
                }
                Some(_) => {
                    // Past its expiry with expiry paused: nothing changes until expiry
                    // resumes (then it is parked back in the queue), except a damping
                    // release, which keeps its own entry.
                    if let Some(release_ms) = slot.lease.release_deadline_ms().filter(|r| *r > now_ms) {
                        slot.due_ms = release_ms;
                        self.due.push(std::cmp::Reverse((release_ms, self.generation, key.clone())));
                    }
                    self.parked.push((key, self.generation));
                }
            }
        }
        out
    }

    /// Queued entries, stale ones included (for tests and metrics).
    pub fn queued(&self) -> usize {
        self.due.len()
    }

    fn schedule(&mut self, key: &std::sync::Arc<K>, lease: &Lease) -> (u64, u64) {
        self.generation += 1;
        let Some(d) = lease.next_deadline_ms() else { return (self.generation, u64::MAX) };
        self.due.push(std::cmp::Reverse((d, self.generation, key.clone())));
        self.compact();
        (self.generation, d)
    }

    fn reschedule(&mut self, key: &K) {
        let Some((arc, _)) = self.map.get_key_value(key) else { return };
        let arc = arc.clone();
        self.generation += 1;
        let generation = self.generation;
        if let Some(slot) = self.map.get_mut(key) {
            if let Some(d) = slot.lease.next_deadline_ms() {
                slot.generation = generation;
                slot.due_ms = d;
                self.due.push(std::cmp::Reverse((d, generation, arc)));
            }
        }
        self.compact();
    }

    /// Drops stale entries when they outnumber the live ones, so that churn (leases
    /// removed and added again) cannot grow the queue without bound.
    fn compact(&mut self) {
        if self.due.len() > 64 && self.due.len() > 2 * self.map.len() {
            let map = &self.map;
            self.due.retain(|std::cmp::Reverse((_, g, k))| map.get(k).is_some_and(|s| s.generation == *g));
        }
    }
}

/// What a call on a [`Lease`] changed; each one becomes one change event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// The published health changed. `damped` is the lease's damping flag afterwards, to be
    /// copied into the record; health changes are only published by undamped leases, so it
    /// is `false` under the current rules.
    Health { to: Health, damped: bool },
    /// Damping engaged (`true`) or was released (`false`) without a change of published
    /// health.
    Damped(bool),
    /// Silence reached `expire_after_ms` with expiry not paused: deregister the instance.
    Expire,
}

/// The lease of one ephemeral instance. See the module docs for the rules.
#[derive(Clone, Debug)]
pub struct Lease {
    times: LeaseTimes,
    // Copies of the config's flap and recovery settings, narrowed: a node holds one lease
    // per ephemeral instance, so every byte here counts (docs/benchmarks.md, memory).
    recovery_heartbeats: u8,
    flap_transitions_max: u8,
    flap_window_ms: u32,

    last_renew_ms: u64,
    /// Actual health, driven by silence and heartbeats.
    actual: Health,
    /// Whether `actual` has been Unhealthy since it was last Healthy.
    recovering: bool,
    /// Consecutive heartbeats counted towards the next recovery step.
    streak: u32,
    /// Health as seen by everyone else; equals `actual` unless damped.
    published: Health,
    damped: bool,
    /// Flap history, allocated at the first flip (most leases never flip).
    flaps: Option<Box<Flaps>>,
    expired: bool,
    /// The registration this lease belongs to (the registry's version of it; 0: none).
    registration: u64,
}

#[derive(Clone, Debug, Default)]
struct Flaps {
    /// Times of undamped flips within the flap window; never more than
    /// `flap_transitions_max` entries between calls.
    flips_ms: VecDeque<u64>,
    last_flip_ms: Option<u64>,
}

impl Lease {
    /// A new lease, Healthy and just renewed. `times` should be valid
    /// ([`LeaseTimes::validate`]); `recovery_heartbeats`, `flap_window_ms` and
    /// `flap_transitions_max` are copied from `cfg` (its silence thresholds are not used:
    /// those come from `times`).
    pub fn new(now_ms: u64, times: LeaseTimes, cfg: &HealthConfig) -> Lease {
        debug_assert!(times.validate().is_ok(), "invalid lease times {times:?}");
        let narrow = |v: u32, limit: u32| u8::try_from(v.clamp(1, limit.min(255))).unwrap_or(u8::MAX);
        Lease {
            times,
            recovery_heartbeats: narrow(cfg.recovery_heartbeats, RECOVERY_HEARTBEATS_LIMIT),
            flap_transitions_max: narrow(cfg.flap_transitions_max, FLAP_TRANSITIONS_MAX_LIMIT),
            // A window longer than 49 days is held as 49 days.
            flap_window_ms: u32::try_from(cfg.flap_window_ms.max(1)).unwrap_or(u32::MAX),
            last_renew_ms: now_ms,
            actual: Health::Healthy,
            recovering: false,
            streak: 0,
            published: Health::Healthy,
            damped: false,
            flaps: None,
            expired: false,
            registration: 0,
        }
    }

    /// A lease recreated for an instance whose published health is known (a restart, a
    /// failover, a failed write): it starts just renewed (a full TTL of grace before it can
    /// expire), at that health, and keeps the slow way back: an instance not Healthy needs
    /// `recovery_heartbeats` consecutive heartbeats per step up. A damped record stays
    /// damped until a flap window passes without a flip. With `Healthy` and not damped this
    /// is [`Lease::new`].
    pub fn resume(
        now_ms: u64,
        times: LeaseTimes,
        cfg: &HealthConfig,
        published: Health,
        damped: bool,
    ) -> Lease {
        let mut lease = Lease::new(now_ms, times, cfg);
        lease.actual = published;
        lease.published = published;
        lease.recovering = published != Health::Healthy;
        if damped {
            lease.damped = true;
            lease.flaps_mut().last_flip_ms = Some(now_ms);
        }
        lease
    }

    /// This lease, belonging to registration `version`.
    pub fn with_registration(mut self, version: u64) -> Lease {
        self.registration = version;
        self
    }

    /// The registration this lease belongs to.
    pub fn registration(&self) -> u64 {
        self.registration
    }

    /// A renewal at `now_ms`. Never expires the lease; returns `None` once it has expired.
    #[must_use = "each transition must become a change event"]
    pub fn heartbeat(&mut self, now_ms: u64) -> Option<Transition> {
        if self.expired {
            return None;
        }
        let release_due = self.release_due(now_ms);
        let before = self.actual;
        let silence_ms = self.silence_ms(now_ms);
        self.apply_silence(silence_ms);
        self.streak =
            if silence_ms < self.times.suspect_after_ms { self.streak.saturating_add(1) } else { 1 };
        match (self.actual, self.recovering) {
            (Health::Healthy, _) => self.streak = 0,
            (Health::Suspect, false) => self.become_healthy(),
            (Health::Unhealthy, _) => {
                if self.streak >= u32::from(self.recovery_heartbeats) {
                    self.actual = Health::Suspect;
                    self.streak = 0;
                }
            }
            (Health::Suspect, true) => {
                if self.streak >= u32::from(self.recovery_heartbeats) {
                    self.become_healthy();
                }
            }
        }
        self.last_renew_ms = self.last_renew_ms.max(now_ms);
        self.publish(now_ms, before, release_due)
    }

    /// The lease check at `now_ms`. While `expiry_paused`, a lease past `expire_after_ms`
    /// stays Unhealthy instead of expiring.
    #[must_use = "each transition must become a change event"]
    pub fn tick(&mut self, now_ms: u64, expiry_paused: bool) -> Option<Transition> {
        if self.expired {
            return None;
        }
        let silence_ms = self.silence_ms(now_ms);
        if silence_ms >= self.times.expire_after_ms && !expiry_paused {
            self.expired = true;
            return Some(Transition::Expire);
        }
        let release_due = self.release_due(now_ms);
        let before = self.actual;
        self.apply_silence(silence_ms);
        self.publish(now_ms, before, release_due)
    }

    /// The published health.
    pub fn health(&self) -> Health {
        self.published
    }

    /// The health the rules give, which a damped lease does not publish (for explain output).
    pub fn undamped_health(&self) -> Health {
        self.actual
    }

    pub fn damped(&self) -> bool {
        self.damped
    }

    pub fn expired(&self) -> bool {
        self.expired
    }

    pub fn last_renew_ms(&self) -> u64 {
        self.last_renew_ms
    }

    pub fn times(&self) -> LeaseTimes {
        self.times
    }

    /// A lower bound on the next time `tick` can return a transition, if no heartbeat comes
    /// first; `None` once expired. Ticking earlier is harmless and returns `None`.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        if self.expired {
            return None;
        }
        let threshold_ms = match self.actual {
            Health::Healthy => self.times.suspect_after_ms,
            Health::Suspect => self.times.unhealthy_after_ms,
            Health::Unhealthy => self.times.expire_after_ms,
        };
        let silence_deadline_ms = self.last_renew_ms.saturating_add(threshold_ms);
        Some(silence_deadline_ms.min(self.release_deadline_ms().unwrap_or(u64::MAX)))
    }

    /// When damping may be released (`None` while not damped).
    pub fn release_deadline_ms(&self) -> Option<u64> {
        match (self.damped, self.last_flip_ms()) {
            (true, Some(flip_ms)) if !self.expired => Some(flip_ms.saturating_add(self.flap_window_ms())),
            _ => None,
        }
    }

    fn flap_window_ms(&self) -> u64 {
        u64::from(self.flap_window_ms)
    }

    fn last_flip_ms(&self) -> Option<u64> {
        self.flaps.as_ref().and_then(|f| f.last_flip_ms)
    }

    fn flip_count(&self) -> usize {
        self.flaps.as_ref().map_or(0, |f| f.flips_ms.len())
    }

    fn flaps_mut(&mut self) -> &mut Flaps {
        self.flaps.get_or_insert_with(Default::default)
    }

    fn silence_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.last_renew_ms)
    }

    /// The silence rules, without expiry: health only gets worse.
    fn apply_silence(&mut self, silence_ms: u64) {
        if silence_ms >= self.times.unhealthy_after_ms {
            self.actual = Health::Unhealthy;
            self.recovering = true;
            self.streak = 0;
        } else if silence_ms >= self.times.suspect_after_ms && self.actual == Health::Healthy {
            self.actual = Health::Suspect;
        }
    }

    fn become_healthy(&mut self) {
        self.actual = Health::Healthy;
        self.recovering = false;
        self.streak = 0;
    }

    /// Whether a damped lease has been quiet for a whole window before this call.
    fn release_due(&self, now_ms: u64) -> bool {
        let quiet_ms = self.last_flip_ms().map_or(u64::MAX, |flip_ms| now_ms.saturating_sub(flip_ms));
        self.damped && quiet_ms >= self.flap_window_ms()
    }

    /// Turns the change of actual health in this call into at most one transition.
    fn publish(&mut self, now_ms: u64, before: Health, release_due: bool) -> Option<Transition> {
        if self.damped && !release_due {
            if self.actual != before {
                self.flaps_mut().last_flip_ms = Some(now_ms);
            }
            return None;
        }
        if self.damped {
            self.damped = false;
            debug_assert_eq!(self.flip_count(), 0);
            if self.published == Health::Unhealthy && self.actual == Health::Healthy {
                // Published path must pass through Suspect.
                self.actual = Health::Suspect;
                self.recovering = true;
                self.streak = 0;
            }
            if self.actual != before {
                self.record_flip(now_ms);
            }
            let held = self.published;
            self.published = self.actual;
            return Some(if held == self.actual {
                Transition::Damped(false)
            } else {
                Transition::Health { to: self.actual, damped: false }
            });
        }
        debug_assert_eq!(self.published, before);
        if self.actual == before {
            return None;
        }
        self.record_flip(now_ms);
        if self.flip_count() > usize::from(self.flap_transitions_max) {
            self.flaps_mut().flips_ms.clear();
            self.damped = true;
            return Some(Transition::Damped(true));
        }
        self.published = self.actual;
        Some(Transition::Health { to: self.actual, damped: false })
    }

    fn record_flip(&mut self, now_ms: u64) {
        let (window_ms, max) = (self.flap_window_ms(), usize::from(self.flap_transitions_max));
        let flaps = self.flaps_mut();
        while let Some(&oldest_ms) = flaps.flips_ms.front() {
            if now_ms.saturating_sub(oldest_ms) < window_ms {
                break;
            }
            flaps.flips_ms.pop_front();
        }
        flaps.flips_ms.push_back(now_ms);
        flaps.last_flip_ms = Some(now_ms);
        debug_assert!(flaps.flips_ms.len() <= max + 1);
    }
}

/// Cluster-wide renewal accounting that decides whether expiry is paused. Fixed memory:
/// [`SELF_PRESERVATION_BUCKETS`] counters.
#[derive(Clone, Debug)]
pub struct SelfPreservation {
    started_ms: u64,
    window_ms: u64,
    bucket_ms: u64,
    /// `now_ms / bucket_ms` of the newest bucket.
    head_bucket: u64,
    renewals: [u64; SELF_PRESERVATION_BUCKETS],
    renewals_last_window: u64,
    expected_last_window: u64,
    paused: bool,
}

impl SelfPreservation {
    /// Starts the warm-up, with the window of `cfg`.
    pub fn new(now_ms: u64, cfg: &HealthConfig) -> SelfPreservation {
        let window_ms = cfg.self_preservation_window_ms.max(1);
        let bucket_ms = window_ms.div_ceil(SELF_PRESERVATION_BUCKETS as u64);
        SelfPreservation {
            started_ms: now_ms,
            window_ms,
            bucket_ms,
            head_bucket: now_ms / bucket_ms,
            renewals: [0; SELF_PRESERVATION_BUCKETS],
            renewals_last_window: 0,
            expected_last_window: 0,
            paused: false,
        }
    }

    /// Counts one heartbeat (or registration). Renewals older than the window are dropped.
    pub fn record_renewal(&mut self, now_ms: u64) {
        self.record_renewals(now_ms, 1);
    }

    /// Counts `count` heartbeats at once (a batch).
    pub fn record_renewals(&mut self, now_ms: u64, count: u64) {
        let bucket = now_ms / self.bucket_ms;
        self.advance(bucket);
        if self.head_bucket - bucket < SELF_PRESERVATION_BUCKETS as u64 {
            let slot = (bucket % SELF_PRESERVATION_BUCKETS as u64) as usize;
            self.renewals[slot] = self.renewals[slot].saturating_add(count);
        }
    }

    /// Whether expiry is paused at `now_ms` for `lease_count` leases; see the module docs
    /// for the rules. If `cfg` has a different window than this counter, the counter starts
    /// over with the new window, warm-up included (counts in buckets of another size cannot
    /// be carried over, and pausing while they are missing is the safe side).
    pub fn evaluate(&mut self, now_ms: u64, lease_count: usize, cfg: &HealthConfig) -> bool {
        if cfg.self_preservation_window_ms.max(1) != self.window_ms {
            *self = SelfPreservation::new(now_ms, cfg);
        }
        self.advance(now_ms / self.bucket_ms);
        let oldest_bucket = self.head_bucket.saturating_sub(SELF_PRESERVATION_BUCKETS as u64 - 1);
        let span_start_ms = (oldest_bucket * self.bucket_ms).max(self.started_ms);
        let span_ms = now_ms.saturating_sub(span_start_ms);
        let expected =
            lease_count as u128 * u128::from(span_ms) / u128::from(cfg.heartbeat_interval_ms.max(1));
        self.expected_last_window = u64::try_from(expected).unwrap_or(u64::MAX);
        self.renewals_last_window = self.renewals.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
        self.paused = if !cfg.self_preservation_enabled || lease_count < cfg.self_preservation_min_leases {
            false
        } else if now_ms.saturating_sub(self.started_ms) < self.window_ms {
            true
        } else {
            (self.renewals_last_window as f64)
                < cfg.self_preservation_threshold * self.expected_last_window as f64
        };
        self.paused
    }

    /// Renewals counted in the window, as of the last [`SelfPreservation::evaluate`].
    pub fn renewals_last_window(&self) -> u64 {
        self.renewals_last_window
    }

    /// Renewals expected in the window, as of the last [`SelfPreservation::evaluate`]. The
    /// window is measured from the start of its oldest bucket to `now_ms`, so it is between
    /// 59 and 60 buckets long.
    pub fn expected_last_window(&self) -> u64 {
        self.expected_last_window
    }

    /// The answer of the last [`SelfPreservation::evaluate`].
    pub fn paused(&self) -> bool {
        self.paused
    }

    fn advance(&mut self, bucket: u64) {
        if bucket <= self.head_bucket {
            return;
        }
        if bucket - self.head_bucket >= SELF_PRESERVATION_BUCKETS as u64 {
            self.renewals = [0; SELF_PRESERVATION_BUCKETS];
        } else {
            for b in self.head_bucket + 1..=bucket {
                self.renewals[(b % SELF_PRESERVATION_BUCKETS as u64) as usize] = 0;
            }
        }
        self.head_bucket = bucket;
    }
}

#[cfg(test)]
mod tests {
    /// The tables below were written for a 5 s suspect time (one heartbeat interval);
    /// they test the rules, not the shipped default.
    fn base() -> HealthConfig {
        HealthConfig { suspect_after_ms: 5_000, ..HealthConfig::default() }
    }

    use super::*;
    use proptest::prelude::*;
    use Health::{Healthy as H, Suspect as S, Unhealthy as U};

    #[derive(Clone, Copy, Debug)]
    enum Call {
        Beat(u64),
        Tick(u64),
        TickPaused(u64),
    }
    use Call::{Beat, Tick, TickPaused};

    fn to(health: Health) -> Option<Transition> {
        Some(Transition::Health { to: health, damped: false })
    }

    fn call(lease: &mut Lease, c: Call) -> Option<Transition> {
        match c {
            Beat(now_ms) => lease.heartbeat(now_ms),
            Tick(now_ms) => lease.tick(now_ms, false),
            TickPaused(now_ms) => lease.tick(now_ms, true),
        }
    }

    /// Runs `steps` in order; each names the call, the transition it must return and the
    /// published health after it.
    fn run(lease: &mut Lease, steps: &[(Call, Option<Transition>, Health)]) {
        for (i, &(c, want, health)) in steps.iter().enumerate() {
            let got = call(lease, c);
            assert_eq!(got, want, "step {i}: {c:?}");
            assert_eq!(lease.health(), health, "step {i}: {c:?} health");
        }
    }

    fn lease_at_zero() -> Lease {
        let cfg = base();
        Lease::new(0, cfg.default_times(), &cfg)
    }

    #[test]
    fn silence_thresholds_apply_at_exact_times() {
        let mut lease = lease_at_zero();
        run(
            &mut lease,
            &[
                (Tick(0), None, H),
                (Tick(4_999), None, H),
                (Tick(5_000), to(S), S),
                (Tick(14_999), None, S),
                (Tick(15_000), to(U), U),
                (Tick(29_999), None, U),
                (Tick(30_000), Some(Transition::Expire), U),
            ],
        );
        assert!(lease.expired());
    }

    #[test]
    fn long_silence_jumps_straight_to_the_final_state() {
        for (now_ms, want) in [
            (15_000, to(U)),
            (29_999, to(U)),
            (30_000, Some(Transition::Expire)),
            (1 << 40, Some(Transition::Expire)),
        ] {
            let mut lease = lease_at_zero();
            assert_eq!(lease.tick(now_ms, false), want, "tick at {now_ms}");
        }
    }

    #[test]
    fn one_heartbeat_heals_suspect_that_was_never_unhealthy() {
        let mut lease = lease_at_zero();
        run(&mut lease, &[(Tick(5_000), to(S), S), (Beat(14_999), to(H), H), (Tick(19_998), None, H)]);
        assert_eq!(lease.last_renew_ms(), 14_999);
    }

    #[test]
    fn recovery_from_unhealthy_passes_through_suspect_after_consecutive_heartbeats() {
        let mut lease = lease_at_zero();
        run(
            &mut lease,
            &[
                (Tick(15_000), to(U), U),
                (Beat(15_000), None, U),
                (Beat(19_999), to(S), S),
                (Beat(24_000), None, S),
                (Beat(28_000), to(H), H),
            ],
        );
    }

    #[test]
    fn single_heartbeat_after_unhealthy_does_not_heal() {
        let mut lease = lease_at_zero();
        run(
            &mut lease,
            &[
                (Tick(15_000), to(U), U),
                (Beat(16_000), None, U),
                (Tick(20_999), None, U),
                (Tick(21_000), None, U),
                // 5 s since the last heartbeat: not consecutive, the streak starts again.
                (Beat(21_000), None, U),
                (Beat(22_000), to(S), S),
            ],
        );
    }

    #[test]
    fn suspect_on_the_way_back_needs_a_new_streak() {
        let mut lease = lease_at_zero();
        run(
            &mut lease,
            &[
                (Tick(15_000), to(U), U),
                (Beat(15_000), None, U),
                (Beat(16_000), to(S), S),
                (Beat(17_000), None, S),
                (Tick(22_000), None, S),
                (Beat(22_000), None, S),
                (Beat(23_000), to(H), H),
            ],
        );
        let mut lease = lease_at_zero();
        run(
            &mut lease,
            &[
                (Tick(15_000), to(U), U),
                (Beat(15_000), None, U),
                (Beat(16_000), to(S), S),
                (Tick(31_000), to(U), U),
            ],
        );
    }

    #[test]
    fn heartbeat_after_unticked_silence_reports_what_the_silence_earned() {
        for (beat_ms, want, health) in
            [(4_999, None, H), (6_000, None, H), (20_000, to(U), U), (40_000, to(U), U)]
        {
            let mut lease = lease_at_zero();
            run(&mut lease, &[(Beat(beat_ms), want, health)]);
            assert!(!lease.expired());
        }
    }

    #[test]
    fn paused_expiry_keeps_unhealthy_until_resumed() {
        let mut lease = lease_at_zero();
        run(
            &mut lease,
            &[
                (TickPaused(15_000), to(U), U),
                (TickPaused(30_000), None, U),
                (TickPaused(1_000_000), None, U),
                (Tick(1_000_000), Some(Transition::Expire), U),
            ],
        );
        let mut lease = lease_at_zero();
        run(&mut lease, &[(TickPaused(30_000), to(U), U)]);
    }

    #[test]
    fn expired_lease_returns_nothing_more() {
        let mut lease = lease_at_zero();
        assert_eq!(lease.tick(30_000, false), Some(Transition::Expire));
        // Expired straight from Healthy: the published health is left as it was.
        run(&mut lease, &[(Beat(30_001), None, H), (Tick(90_000), None, H), (Beat(90_001), None, H)]);
        assert_eq!(lease.next_deadline_ms(), None);
    }

    #[test]
    fn clock_going_backwards_counts_as_no_silence() {
        let cfg = base();
        let mut lease = Lease::new(10_000, cfg.default_times(), &cfg);
        run(&mut lease, &[(Tick(0), None, H), (Beat(5_000), None, H), (Tick(14_999), None, H)]);
        assert_eq!(lease.last_renew_ms(), 10_000);
    }

    #[test]
    fn per_instance_times_come_from_the_ttl() {
        assert_eq!(LeaseTimes::from_ttl(30_000), HealthConfig::default().default_times());
        let shortest = LeaseTimes { suspect_after_ms: 150, unhealthy_after_ms: 300, expire_after_ms: 600 };
        assert_eq!(LeaseTimes::from_ttl(0), shortest);
        assert_eq!(LeaseTimes::from_ttl(1), shortest);
        assert_eq!(LeaseTimes::from_ttl(u64::MAX).expire_after_ms, DURATION_MS_LIMIT);
        let mut lease = Lease::new(0, LeaseTimes::from_ttl(6_000), &base());
        run(
            &mut lease,
            &[
                (Tick(1_499), None, H),
                (Tick(1_500), to(S), S),
                (Tick(3_000), to(U), U),
                (Tick(6_000), Some(Transition::Expire), U),
            ],
        );
    }

    #[test]
    fn validate_names_the_broken_setting() {
        let ok = base();
        assert_eq!(ok.validate(), Ok(()));
        let order = |field, value_ms, relation, other, other_ms| HealthConfigError::Order {
            field,
            value_ms,
            relation,
            other,
            other_ms,
        };
        let cases: Vec<(HealthConfig, HealthConfigError)> = vec![
            (
                HealthConfig { heartbeat_interval_ms: 0, ..ok },
                HealthConfigError::Zero { field: "heartbeat_interval_ms" },
            ),
            (
                HealthConfig { suspect_after_ms: 0, ..ok },
                HealthConfigError::Zero { field: "suspect_after_ms" },
            ),
            (
                HealthConfig { suspect_after_ms: 15_000, ..ok },
                order("suspect_after_ms", 15_000, "less than", "unhealthy_after_ms", 15_000),
            ),
            (
                HealthConfig { expire_after_ms: 10_000, ..ok },
                order("unhealthy_after_ms", 15_000, "less than", "expire_after_ms", 10_000),
            ),
            (
                HealthConfig { heartbeat_interval_ms: 6_000, ..ok },
                order("heartbeat_interval_ms", 6_000, "at most", "suspect_after_ms", 5_000),
            ),
            (
                HealthConfig { expire_after_ms: DURATION_MS_LIMIT + 1, ..ok },
                HealthConfigError::AboveLimit {
                    field: "expire_after_ms",
                    value: DURATION_MS_LIMIT + 1,
                    limit: DURATION_MS_LIMIT,
                },
            ),
            (
                HealthConfig { recovery_heartbeats: 0, ..ok },
                HealthConfigError::Zero { field: "recovery_heartbeats" },
            ),
            (HealthConfig { flap_window_ms: 0, ..ok }, HealthConfigError::Zero { field: "flap_window_ms" }),
            (
                HealthConfig { flap_transitions_max: 0, ..ok },
                HealthConfigError::Zero { field: "flap_transitions_max" },
            ),
            (
                HealthConfig { flap_transitions_max: 65, ..ok },
                HealthConfigError::AboveLimit { field: "flap_transitions_max", value: 65, limit: 64 },
            ),
            (
                HealthConfig { self_preservation_threshold: 1.5, ..ok },
                HealthConfigError::Threshold { value: 1.5 },
            ),
            (
                HealthConfig { self_preservation_window_ms: 19_999, ..ok },
                order("self_preservation_window_ms", 19_999, "at least", "4 * heartbeat_interval_ms", 20_000),
            ),
        ];
        for (cfg, want) in cases {
            assert_eq!(cfg.validate(), Err(want.clone()), "{want}");
        }
        let nan = HealthConfig { self_preservation_threshold: f64::NAN, ..ok };
        assert!(matches!(nan.validate(), Err(HealthConfigError::Threshold { .. })));
        assert_eq!(
            HealthConfig { heartbeat_interval_ms: 6_000, ..ok }.validate().unwrap_err().to_string(),
            "heartbeat_interval_ms (6000 ms) must be at most suspect_after_ms (5000 ms)"
        );
    }

    /// Six published flips, Healthy <-> Suspect, every 5 s from 5 s to 15 s; last renewal
    /// at 15 s, published Healthy.
    fn flap_six_times(lease: &mut Lease) {
        run(
            lease,
            &[
                (Tick(5_000), to(S), S),
                (Beat(5_000), to(H), H),
                (Tick(10_000), to(S), S),
                (Beat(10_000), to(H), H),
                (Tick(15_000), to(S), S),
                (Beat(15_000), to(H), H),
            ],
        );
    }

    #[test]
    fn damping_engages_on_the_flip_after_the_limit_and_suppresses_events() {
        let mut lease = lease_at_zero();
        flap_six_times(&mut lease);
        assert!(!lease.damped());
        run(
            &mut lease,
            &[
                (Tick(20_000), Some(Transition::Damped(true)), H),
                (Beat(20_000), None, H),
                (Tick(25_000), None, H),
                (Beat(25_000), None, H),
                (Tick(35_000), None, H),
            ],
        );
        assert!(lease.damped());
        assert_eq!(lease.undamped_health(), S);
    }

    #[test]
    fn flips_older_than_the_window_do_not_count() {
        let mut lease = lease_at_zero();
        flap_six_times(&mut lease);
        // The two flips at 5 s leave the window at 65 s: the seventh flip is then the fifth.
        run(&mut lease, &[(TickPaused(65_000), to(U), U)]);
        assert!(!lease.damped());
    }

    #[test]
    fn damping_releases_after_a_quiet_window() {
        let mut lease = lease_at_zero();
        flap_six_times(&mut lease);
        let _ = lease.tick(20_000, false);
        run(&mut lease, &[(Beat(21_000), None, H)]); // last flip, Suspect -> Healthy, at 21 s
        let mut steps = Vec::new();
        for now_ms in (22_000..81_000).step_by(1_000) {
            steps.push((Beat(now_ms), None, H));
        }
        steps.push((Tick(80_999), None, H));
        steps.push((Tick(81_000), Some(Transition::Damped(false)), H));
        run(&mut lease, &steps);
        assert!(!lease.damped());
        // Undamped again: the next flip is published.
        run(&mut lease, &[(Tick(85_000), to(S), S)]);
    }

    #[test]
    fn release_publishes_the_health_reached_while_damped() {
        let mut lease = lease_at_zero();
        flap_six_times(&mut lease);
        run(
            &mut lease,
            &[
                (TickPaused(20_000), Some(Transition::Damped(true)), H),
                (TickPaused(30_000), None, H), // Unhealthy, not published; quiet period restarts
                (TickPaused(89_999), None, H),
                (TickPaused(90_000), to(U), U),
            ],
        );
        assert!(!lease.damped());
        assert_eq!(lease.next_deadline_ms(), Some(45_000));
    }

    #[test]
    fn damped_instance_that_stops_heartbeating_still_expires() {
        let mut lease = lease_at_zero();
        flap_six_times(&mut lease);
        run(
            &mut lease,
            &[
                (Tick(20_000), Some(Transition::Damped(true)), H),
                (Tick(44_999), None, H),
                (Tick(45_000), Some(Transition::Expire), H),
            ],
        );
    }

    #[test]
    fn release_from_held_unhealthy_publishes_suspect_not_healthy() {
        let cfg = HealthConfig { flap_transitions_max: 5, ..base() };
        let mut lease = Lease::new(0, cfg.default_times(), &cfg);
        run(
            &mut lease,
            &[
                (Tick(15_000), to(U), U),
                (Beat(15_000), None, U),
                (Beat(16_000), to(S), S),
                (Tick(31_000), to(U), U),
                (Beat(31_000), None, U),
                (Beat(32_000), to(S), S),
                (Tick(47_000), to(U), U),
                (Beat(47_000), None, U),
                (Beat(48_000), Some(Transition::Damped(true)), U),
                (Beat(49_000), None, U),
                (Beat(50_000), None, U), // actually Healthy now, last flip at 50 s
            ],
        );
        assert_eq!(lease.undamped_health(), H);
        let mut steps = Vec::new();
        for now_ms in (51_000..110_000).step_by(1_000) {
            steps.push((Beat(now_ms), None, U));
        }
        steps.push((Tick(110_000), to(S), S));
        steps.push((Beat(110_000), None, S));
        steps.push((Beat(111_000), to(H), H));
        run(&mut lease, &steps);
    }

    #[test]
    fn configured_recovery_heartbeats_apply() {
        let cfg = HealthConfig { recovery_heartbeats: 3, ..base() };
        let mut lease = Lease::new(0, cfg.default_times(), &cfg);
        let mut steps = vec![(Tick(15_000), to(U), U)];
        steps.extend([(Beat(15_000), None, U), (Beat(16_000), None, U), (Beat(17_000), to(S), S)]);
        steps.extend([(Beat(18_000), None, S), (Beat(19_000), None, S), (Beat(20_000), to(H), H)]);
        run(&mut lease, &steps);
        let cfg = HealthConfig { recovery_heartbeats: 1, ..base() };
        let mut lease = Lease::new(0, cfg.default_times(), &cfg);
        run(&mut lease, &[(Tick(15_000), to(U), U), (Beat(15_000), to(S), S), (Beat(16_000), to(H), H)]);
    }

    #[test]
    fn next_deadline_follows_the_next_threshold() {
        let mut lease = lease_at_zero();
        assert_eq!(lease.next_deadline_ms(), Some(5_000));
        let _ = lease.tick(5_000, false);
        assert_eq!(lease.next_deadline_ms(), Some(15_000));
        let _ = lease.tick(15_000, false);
        assert_eq!(lease.next_deadline_ms(), Some(30_000));
        let _ = lease.heartbeat(16_000);
        assert_eq!(lease.next_deadline_ms(), Some(46_000));
    }

    /// `leases` instances heartbeat every interval from `from_ms` (inclusive) to `to_ms`
    /// (inclusive).
    fn renew(sp: &mut SelfPreservation, from_ms: u64, to_ms: u64, leases: usize) {
        for now_ms in (from_ms..=to_ms).step_by(5_000) {
            for _ in 0..leases {
                sp.record_renewal(now_ms);
            }
        }
    }

    #[test]
    fn self_preservation_pauses_during_warm_up() {
        let cfg = base();
        let mut sp = SelfPreservation::new(0, &cfg);
        renew(&mut sp, 0, 55_000, 100);
        assert!(sp.evaluate(59_999, 100, &cfg));
        renew(&mut sp, 60_000, 60_000, 100);
        assert!(!sp.evaluate(60_000, 100, &cfg));
        assert_eq!(sp.renewals_last_window(), 1_200);
        assert_eq!(sp.expected_last_window(), 1_180);
    }

    #[test]
    fn self_preservation_engages_when_half_stop_renewing_and_not_when_five_percent_do() {
        let cfg = base();
        for (still_renewing, want_paused) in [(100, false), (95, false), (50, true), (0, true)] {
            let mut sp = SelfPreservation::new(0, &cfg);
            renew(&mut sp, 0, 120_000, 100);
            assert!(!sp.evaluate(120_000, 100, &cfg));
            renew(&mut sp, 125_000, 180_000, still_renewing);
            assert_eq!(sp.evaluate(180_000, 100, &cfg), want_paused, "{still_renewing} of 100 renewing");
            assert_eq!(sp.paused(), want_paused);
            assert_eq!(sp.renewals_last_window(), 12 * still_renewing as u64);
            assert_eq!(sp.expected_last_window(), 1_180);
        }
    }

    #[test]
    fn self_preservation_stays_off_for_tiny_populations_and_when_disabled() {
        let cfg = base();
        let mut sp = SelfPreservation::new(0, &cfg);
        assert!(!sp.evaluate(1_000, 9, &cfg), "below min_leases even in warm-up");
        assert!(sp.evaluate(1_000, 10, &cfg));
        assert!(!sp.evaluate(200_000, 9, &cfg));
        assert!(sp.evaluate(200_000, 10, &cfg));
        let off = HealthConfig { self_preservation_enabled: false, ..cfg };
        assert!(!sp.evaluate(200_000, 1_000, &off));
        assert!(!sp.evaluate(200_000, 0, &HealthConfig { self_preservation_min_leases: 0, ..cfg }));
    }

    #[test]
    fn self_preservation_adopts_a_new_window_with_a_new_warm_up() {
        let cfg = HealthConfig { self_preservation_window_ms: 120_000, ..base() };
        let mut sp = SelfPreservation::new(0, &base());
        renew(&mut sp, 0, 70_000, 100);
        assert!(sp.evaluate(70_000, 100, &cfg), "warm-up restarts at 70 s");
        renew(&mut sp, 75_000, 185_000, 100);
        assert!(sp.evaluate(189_999, 100, &cfg));
        renew(&mut sp, 190_000, 190_000, 100);
        assert!(!sp.evaluate(190_000, 100, &cfg));
        assert_eq!(sp.renewals_last_window(), 2_400);
        assert_eq!(sp.expected_last_window(), 2_360);
    }

    #[test]
    fn self_preservation_forgets_renewals_older_than_the_window() {
        let cfg = base();
        let mut sp = SelfPreservation::new(0, &cfg);
        renew(&mut sp, 0, 120_000, 100);
        assert!(!sp.evaluate(120_000, 100, &cfg));
        assert!(sp.evaluate(150_000, 100, &cfg));
        assert_eq!(sp.renewals_last_window(), 600);
        assert!(sp.evaluate(1 << 40, 100, &cfg));
        assert_eq!(sp.renewals_last_window(), 0);
        sp.record_renewal(0); // older than the window: dropped
        assert!(sp.evaluate(1 << 40, 100, &cfg));
        assert_eq!(sp.renewals_last_window(), 0);
    }

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Beat,
        Tick,
        TickPaused,
    }

    fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
        // Mostly heartbeat-sized gaps, with silences long enough to reach every threshold.
        let delta_ms = prop_oneof![6 => 0u64..3_000, 3 => 3_000u64..7_000, 1 => 7_000u64..40_000];
        let op = prop_oneof![3 => Just(Op::Beat), 2 => Just(Op::Tick), 2 => Just(Op::TickPaused)];
        proptest::collection::vec((delta_ms, op), 0..300)
    }

    fn configs() -> impl Strategy<Value = (HealthConfig, LeaseTimes)> {
        let flap_window_ms = prop_oneof![1_000u64..=20_000, 20_000u64..=60_000];
        (1u32..=8, 1u32..=3, flap_window_ms, prop_oneof![Just(30_000u64), 600u64..60_000]).prop_map(
            |(flap_transitions_max, recovery_heartbeats, flap_window_ms, ttl_ms)| {
                let cfg = HealthConfig {
                    flap_transitions_max,
                    recovery_heartbeats,
                    flap_window_ms,
                    ..Default::default()
                };
                (cfg, LeaseTimes::from_ttl(ttl_ms))
            },
        )
    }

    #[derive(Clone, Copy, Debug)]
    enum TableOp {
        Insert(u8),
        Remove(u8),
        Beat(u8),
        Check { paused: bool },
    }

    fn table_ops() -> impl Strategy<Value = Vec<(u64, TableOp)>> {
        let delta_ms = prop_oneof![6 => 0u64..2_000, 3 => 2_000u64..8_000, 1 => 8_000u64..40_000];
        let op = prop_oneof![
            2 => (0u8..12).prop_map(TableOp::Insert),
            1 => (0u8..12).prop_map(TableOp::Remove),
            5 => (0u8..12).prop_map(TableOp::Beat),
            3 => Just(TableOp::Check { paused: false }),
            1 => Just(TableOp::Check { paused: true }),
        ];
        proptest::collection::vec((delta_ms, op), 0..400)
    }

    proptest! {
        /// The due-time queue of [`LeaseTable`] finds exactly the transitions a scan of every
        /// lease at every check finds, in any history of inserts, removals, heartbeats and
        /// (paused) checks.
        #[test]
        fn lease_table_matches_a_full_scan((cfg, times) in configs(), ops in table_ops()) {
            let mut table: LeaseTable<u8> = LeaseTable::default();
            let mut scan: std::collections::BTreeMap<u8, Lease> = Default::default();
            let mut now_ms = 0;
            for (delta_ms, op) in ops {
                now_ms += delta_ms;
                match op {
                    TableOp::Insert(k) => {
                        table.insert(k, Lease::new(now_ms, times, &cfg));
                        scan.insert(k, Lease::new(now_ms, times, &cfg));
                    }
                    TableOp::Remove(k) => {
                        prop_assert_eq!(table.remove(&k).is_some(), scan.remove(&k).is_some());
                    }
                    TableOp::Beat(k) => {
                        let want = scan.get_mut(&k).map(|l| l.heartbeat(now_ms));
                        prop_assert_eq!(table.heartbeat(&k, now_ms), want);
                    }
                    TableOp::Check { paused } => {
                        let mut got = table.check(now_ms, paused);
                        got.sort_by_key(|(k, _)| *k);
                        let want: Vec<(u8, Transition)> = scan
                            .iter_mut()
                            .filter_map(|(k, l)| l.tick(now_ms, paused).map(|t| (*k, t)))
                            .collect();
                        prop_assert_eq!(got, want, "at {} ms", now_ms);
                        // Expired leases leave both (the registry removes them).
                        scan.retain(|_, l| !l.expired());
                        let expired: Vec<u8> = (0..12).filter(|k| table.get(k).is_some_and(Lease::expired)).collect();
                        for k in expired {
                            table.remove(&k);
                        }
                    }
                }
                prop_assert_eq!(table.len(), scan.len());
                prop_assert!(table.queued() <= 2 * table.len() + 64 + 1);
            }
        }

        #[test]
        fn lease_transitions_are_single_slow_to_revive_and_bounded(
            (cfg, times) in configs(),
            ops in ops(),
        ) {
            let mut lease = Lease::new(0, times, &cfg);
            let mut now_ms = 0;
            let mut health_events_ms: Vec<u64> = Vec::new();
            for (delta_ms, op) in ops {
                now_ms += delta_ms;
                let before = lease.health();
                let actual_before = lease.undamped_health();
                let damped_before = lease.damped();
                let expired_before = lease.expired();
                let deadline_ms = lease.next_deadline_ms();
                let silence_ms = now_ms.saturating_sub(lease.last_renew_ms());
                let got = match op {
                    Op::Beat => lease.heartbeat(now_ms),
                    Op::Tick => lease.tick(now_ms, false),
                    Op::TickPaused => lease.tick(now_ms, true),
                };
                if expired_before {
                    prop_assert_eq!(got, None);
                    continue;
                }
                match got {
                    None => {
                        prop_assert_eq!(lease.health(), before);
                        prop_assert_eq!(lease.damped(), damped_before);
                    }
                    Some(Transition::Health { to, damped }) => {
                        prop_assert_ne!(to, before);
                        prop_assert_eq!(lease.health(), to);
                        prop_assert_eq!(lease.damped(), damped);
                        prop_assert!(!damped);
                        health_events_ms.push(now_ms);
                    }
                    Some(Transition::Damped(on)) => {
                        prop_assert_eq!(lease.health(), before);
                        prop_assert_eq!(lease.damped(), on);
                        prop_assert_ne!(damped_before, on);
                    }
                    Some(Transition::Expire) => {
                        prop_assert!(matches!(op, Op::Tick));
                        prop_assert!(silence_ms >= times.expire_after_ms);
                        prop_assert!(lease.expired());
                    }
                }
                if matches!(op, Op::Tick | Op::TickPaused) && now_ms < deadline_ms.unwrap() {
                    prop_assert_eq!(got, None, "tick before the deadline {:?}", deadline_ms);
                }
                if matches!(op, Op::Tick) && silence_ms >= times.expire_after_ms {
                    prop_assert_eq!(got, Some(Transition::Expire));
                }
                prop_assert!(!(before == Health::Unhealthy && lease.health() == Health::Healthy));
                prop_assert!(
                    !(actual_before == Health::Unhealthy && lease.undamped_health() == Health::Healthy)
                );
                if !lease.damped() {
                    prop_assert_eq!(lease.health(), lease.undamped_health());
                }
            }
            let bound = cfg.flap_transitions_max as usize + 1;
            for (i, &end_ms) in health_events_ms.iter().enumerate() {
                let in_window = health_events_ms[..=i]
                    .iter()
                    .filter(|&&t| end_ms - t < cfg.flap_window_ms)
                    .count();
                prop_assert!(
                    in_window <= bound,
                    "{} health events in a window ending at {}",
                    in_window,
                    end_ms
                );
            }
        }

        #[test]
        fn ttl_times_are_always_valid(ttl_ms in any::<u64>()) {
            prop_assert_eq!(LeaseTimes::from_ttl(ttl_ms).validate(), Ok(()));
        }
    }
}
