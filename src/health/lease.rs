//! [`Lease`]: the lease state machine of one ephemeral instance, with flap damping (the
//! rules are in the module docs of `health`).

use std::collections::VecDeque;

use tandem_schemas::Health;

use super::*;

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
