//! [`SelfPreservation`]: per-namespace renewal accounting that pauses lease expiry in a
//! namespace whose renewals collapse, for at most `self_preservation_max_pause_ms`.
//!
//! # The rule for expected renewals
//!
//! A lease is *counted* once it has renewed since its registration (a registration that
//! never heartbeats says nothing about the network) and until it is parked (past its
//! expiry while expiry is paused), expires or is removed. Each counted lease is expected to
//! renew once per its own *suspect time* `S` (`ttl / 4`; the configured `suspect_after_ms`
//! for leases at the default TTL): the longest silence that keeps it Healthy. A renewal
//! that ends a silence `g` earns `min(1, g / S)` renewals. So a client beating at any
//! cadence of at most `S` counts as exactly 100%: the SDK beats at `ttl / 8` and earns ½
//! twice per `S`; a chatty client earns no more than 100%, so it cannot hide a dead one; a
//! client slower than `S` (Suspect anyway) counts less.
//!
//! Both sides are kept per namespace in [`SELF_PRESERVATION_BUCKETS`] buckets covering the
//! window: *renewals* (the credit of each renewal) and *expected*, booked as follows so
//! that a lease renewing on time adds the same to both, in the same bucket, whatever the
//! phase of its heartbeats against the window (no noise from the window's edges):
//!
//! - a renewal that ends a silence `g` of a lease not overdue expects `g / S`;
//! - a counted lease the lease check finds silent for `S` or more becomes *overdue*: it
//!   expects its whole silence `/ S` at once, then `1 / S` per ms, continuously, until it
//!   renews (expecting nothing more), parks, expires or is removed;
//! - the renewal that makes a lease counted (its first since registration, or a parked
//!   lease's return) expects what it earns.
//!
//! What a lease added leaves with the window.
//!
//! # The decision, per namespace
//!
//! Expiry of a namespace's leases is paused, in this order of precedence:
//!
//! 1. never when `self_preservation_enabled` is false, or the namespace has fewer than
//!    `self_preservation_min_leases` leases (counted or not);
//! 2. always during the first `self_preservation_window_ms` after the accounting starts or
//!    adopts a new window (warm-up: after a restart the window has not seen a full round
//!    of heartbeats yet);
//! 3. when nothing was expected in the window (no counted lease): the namespace keeps its
//!    state (a pause holds while every lease is parked: nothing shows the network is back);
//! 4. otherwise when `renewals < threshold * expected`.
//!
//! A pause lasts at most `self_preservation_max_pause_ms`: then expiry resumes in that
//! namespace (a [`PreservationChange::Capped`], counted in [`SelfPreservation::pauses_capped`])
//! and it cannot pause again until the rules above stop asking for a pause. After a mass
//! death, the dead leases park, stop adding to the expectation, and once their silence has
//! left the window the survivors' renewals release the pause; if nothing renews any more,
//! the cap does.
//!
//! Memory: one entry per namespace that has leases (two arrays of
//! [`SELF_PRESERVATION_BUCKETS`] and one count per distinct suspect time); an entry goes
//! with its namespace's last lease.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;

/// A change of a namespace's pause, for the log.
#[derive(Clone, Debug, PartialEq)]
pub enum PreservationChange {
    Engaged {
        namespace: Arc<str>,
        renewals: f64,
        expected: f64,
    },
    Released {
        namespace: Arc<str>,
    },
    /// The pause reached `self_preservation_max_pause_ms`: expiry resumed.
    Capped {
        namespace: Arc<str>,
        paused_ms: u64,
    },
}

/// One namespace's figures as of the last [`SelfPreservation::evaluate`].
#[derive(Clone, Debug, PartialEq)]
pub struct NamespacePreservation {
    pub namespace: Arc<str>,
    pub active: bool,
    pub renewals: f64,
    pub expected: f64,
    /// Since when expiry is paused (the caller's monotonic ms).
    pub paused_since_ms: Option<u64>,
    /// Leases of the namespace, and how many of them are counted.
    pub leases: usize,
    pub counted: usize,
}

#[derive(Clone, Debug)]
struct Ring {
    /// `now_ms / bucket_ms` of the newest bucket.
    head: u64,
    renewals: [f64; SELF_PRESERVATION_BUCKETS],
    expected: [f64; SELF_PRESERVATION_BUCKETS],
}

const N: u64 = SELF_PRESERVATION_BUCKETS as u64;

impl Ring {
    fn new(bucket: u64) -> Ring {
        Ring {
            head: bucket,
            renewals: [0.0; SELF_PRESERVATION_BUCKETS],
            expected: [0.0; SELF_PRESERVATION_BUCKETS],
        }
    }

    fn advance(&mut self, bucket: u64) {
        if bucket <= self.head {
            return;
        }
        if bucket - self.head >= N {
            *self = Ring::new(bucket);
            return;
        }
        for b in self.head + 1..=bucket {
            self.renewals[(b % N) as usize] = 0.0;
            self.expected[(b % N) as usize] = 0.0;
        }
        self.head = bucket;
    }

    /// Whether `bucket` is within the window (after [`Ring::advance`]).
    fn slot(&self, bucket: u64) -> Option<usize> {
        (bucket <= self.head && self.head - bucket < N).then_some((bucket % N) as usize)
    }
}

#[derive(Clone, Debug)]
struct Namespace {
    ring: Ring,
    leases: usize,
    counted: usize,
    /// Overdue leases by suspect time (ms): the expectation's rate is `Σ count / S`.
    overdue: BTreeMap<u64, usize>,
    /// Up to when the expectation has been accrued.
    accrued_ms: u64,
    paused_since_ms: Option<u64>,
    /// The cap ended the last pause; no new pause until the rules stop asking for one.
    capped: bool,
    renewals_last_window: f64,
    expected_last_window: f64,
}

impl Namespace {
    fn rate_per_ms(&self) -> f64 {
        self.overdue.iter().map(|(s, n)| *n as f64 / *s as f64).sum()
    }

    fn book_expected(&mut self, now_ms: u64, bucket_ms: u64, expected: f64) {
        self.ring.advance(now_ms / bucket_ms);
        if let Some(slot) = self.ring.slot(now_ms / bucket_ms) {
            self.ring.expected[slot] += expected;
        }
    }

    fn set_overdue(&mut self, suspect_ms: u64, overdue: bool) {
        if overdue {
            *self.overdue.entry(suspect_ms).or_default() += 1;
        } else if let Some(n) = self.overdue.get_mut(&suspect_ms) {
            *n -= 1;
            if *n == 0 {
                self.overdue.remove(&suspect_ms);
            }
        }
    }

    /// Adds the expectation of the overdue leases from `accrued_ms` to `now_ms`, split over
    /// the buckets it covers.
    fn accrue(&mut self, now_ms: u64, bucket_ms: u64) {
        self.ring.advance(now_ms / bucket_ms);
        let from_ms = self.accrued_ms.max((self.ring.head + 1).saturating_sub(N) * bucket_ms);
        self.accrued_ms = self.accrued_ms.max(now_ms);
        let rate = self.rate_per_ms();
        if rate == 0.0 || from_ms >= now_ms {
            return;
        }
        let mut t = from_ms;
        while t < now_ms {
            let bucket = t / bucket_ms;
            let end = ((bucket + 1) * bucket_ms).min(now_ms);
            if let Some(slot) = self.ring.slot(bucket) {
                self.ring.expected[slot] += rate * (end - t) as f64;
            }
            t = end;
        }
    }
}

/// Per-namespace renewal accounting and pause decisions. Pure: every call takes `now_ms`.
#[derive(Clone, Debug)]
pub struct SelfPreservation {
    /// Start of the warm-up; `None` until the first [`SelfPreservation::evaluate`].
    started_ms: Option<u64>,
    window_ms: u64,
    bucket_ms: u64,
    namespaces: BTreeMap<Arc<str>, Namespace>,
    pauses_capped: u64,
}

impl Default for SelfPreservation {
    fn default() -> Self {
        SelfPreservation::new(&HealthConfig::default())
    }
}

impl SelfPreservation {
    /// Accounting with the window of `cfg`; the warm-up starts at the first evaluation.
    pub fn new(cfg: &HealthConfig) -> SelfPreservation {
        let window_ms = cfg.self_preservation_window_ms.max(1);
        SelfPreservation {
            started_ms: None,
            window_ms,
            bucket_ms: window_ms.div_ceil(N),
            namespaces: BTreeMap::new(),
            pauses_capped: 0,
        }
    }

    fn entry(&mut self, namespace: &str, now_ms: u64) -> &mut Namespace {
        let bucket_ms = self.bucket_ms;
        if !self.namespaces.contains_key(namespace) {
            let ns = Namespace {
                ring: Ring::new(now_ms / bucket_ms),
                leases: 0,
                counted: 0,
                overdue: BTreeMap::new(),
                accrued_ms: now_ms,
                paused_since_ms: None,
                capped: false,
                renewals_last_window: 0.0,
                expected_last_window: 0.0,
            };
            self.namespaces.insert(namespace.into(), ns);
        }
        self.namespaces.get_mut(namespace).expect("inserted above")
    }

    /// A lease of `namespace` was added (not counted until it renews).
    pub fn lease_added(&mut self, namespace: &str, now_ms: u64) {
        self.entry(namespace, now_ms).leases += 1;
    }

    /// A lease of `namespace` was removed (uncount it first if it was counted). The
    /// namespace's accounting goes with its last lease.
    pub fn lease_removed(&mut self, namespace: &str) {
        if let Some(ns) = self.namespaces.get_mut(namespace) {
            ns.leases = ns.leases.saturating_sub(1);
            if ns.leases == 0 {
                self.namespaces.remove(namespace);
            }
        }
    }

    /// A renewal of a lease with suspect time `suspect_ms` after a silence of `silence_ms`.
    /// `counted`: the lease was counted before (else it is from now on); `overdue`: it
    /// was overdue. Earns `min(1, silence / suspect)`; see the module docs for what it
    /// expects.
    pub fn renewed(
        &mut self,
        namespace: &str,
        now_ms: u64,
        silence_ms: u64,
        suspect_ms: u64,
        counted: bool,
        overdue: bool,
    ) {
        let bucket_ms = self.bucket_ms;
        let s = suspect_ms.max(1);
        let ns = self.entry(namespace, now_ms);
        let ratio = silence_ms as f64 / s as f64;
        let earned = ratio.min(1.0);
        if overdue {
            ns.accrue(now_ms, bucket_ms);
            ns.set_overdue(s, false);
        }
        let expected = match (counted, overdue) {
            (false, _) => earned,
            (true, false) => ratio,
            (true, true) => 0.0,
        };
        if !counted {
            ns.counted += 1;
        }
        ns.book_expected(now_ms, bucket_ms, expected);
        if let Some(slot) = ns.ring.slot(now_ms / bucket_ms) {
            ns.ring.renewals[slot] += earned;
        }
    }

    /// The lease check found a counted lease silent for `silence_ms >= suspect_ms`: it is
    /// overdue from now on.
    pub fn overdue(&mut self, namespace: &str, now_ms: u64, silence_ms: u64, suspect_ms: u64) {
        let bucket_ms = self.bucket_ms;
        let s = suspect_ms.max(1);
        let ns = self.entry(namespace, now_ms);
        ns.accrue(now_ms, bucket_ms);
        ns.book_expected(now_ms, bucket_ms, silence_ms as f64 / s as f64);
        ns.set_overdue(s, true);
    }

    /// A counted lease leaves the expectation (parked, expired or removed).
    pub fn uncounted(&mut self, namespace: &str, now_ms: u64, suspect_ms: u64, overdue: bool) {
        let bucket_ms = self.bucket_ms;
        let ns = self.entry(namespace, now_ms);
        if overdue {
            ns.accrue(now_ms, bucket_ms);
            ns.set_overdue(suspect_ms.max(1), false);
        }
        ns.counted = ns.counted.saturating_sub(1);
    }

    /// Decides, for every namespace, whether its expiry is paused at `now_ms` (see the
    /// module docs), and returns what changed. If `cfg` has another window than this
    /// accounting, the counts start over with the new window, warm-up included (the leases
    /// stay counted).
    pub fn evaluate(&mut self, now_ms: u64, cfg: &HealthConfig) -> Vec<PreservationChange> {
        let window_ms = cfg.self_preservation_window_ms.max(1);
        if window_ms != self.window_ms {
            self.window_ms = window_ms;
            self.bucket_ms = window_ms.div_ceil(N);
            self.started_ms = None;
            for ns in self.namespaces.values_mut() {
                ns.ring = Ring::new(now_ms / self.bucket_ms);
                ns.accrued_ms = now_ms;
            }
        }
        let started_ms = *self.started_ms.get_or_insert(now_ms);
        let warming_up = now_ms.saturating_sub(started_ms) < self.window_ms;
        let max_pause_ms = cfg.self_preservation_max_pause_ms.max(1);
        let mut changes = Vec::new();
        for (name, ns) in &mut self.namespaces {
            ns.accrue(now_ms, self.bucket_ms);
            ns.renewals_last_window = ns.ring.renewals.iter().sum();
            ns.expected_last_window = ns.ring.expected.iter().sum();
            let was_paused = ns.paused_since_ms.is_some();
            let want = if !cfg.self_preservation_enabled || ns.leases < cfg.self_preservation_min_leases {
                false
            } else if warming_up {
                true
            } else if ns.expected_last_window <= 0.0 {
                was_paused
            } else {
                ns.renewals_last_window < cfg.self_preservation_threshold * ns.expected_last_window
            };
            if !want {
                ns.capped = false;
                if ns.paused_since_ms.take().is_some() {
                    changes.push(PreservationChange::Released { namespace: name.clone() });
                }
                continue;
            }
            match ns.paused_since_ms {
                _ if ns.capped => {}
                None => {
                    ns.paused_since_ms = Some(now_ms);
                    changes.push(PreservationChange::Engaged {
                        namespace: name.clone(),
                        renewals: ns.renewals_last_window,
                        expected: ns.expected_last_window,
                    });
                }
                Some(since) if now_ms.saturating_sub(since) >= max_pause_ms => {
                    ns.paused_since_ms = None;
                    ns.capped = true;
                    self.pauses_capped += 1;
                    changes.push(PreservationChange::Capped {
                        namespace: name.clone(),
                        paused_ms: now_ms - since,
                    });
                }
                Some(_) => {}
            }
        }
        changes
    }

    /// Whether expiry of `namespace`'s leases is paused (as of the last evaluation).
    pub fn paused(&self, namespace: &str) -> bool {
        self.namespaces.get(namespace).is_some_and(|ns| ns.paused_since_ms.is_some())
    }

    /// Whether expiry is paused in any namespace.
    pub fn any_paused(&self) -> bool {
        self.namespaces.values().any(|ns| ns.paused_since_ms.is_some())
    }

    /// Pauses ended by `self_preservation_max_pause_ms` since the start.
    pub fn pauses_capped(&self) -> u64 {
        self.pauses_capped
    }

    /// Namespaces with accounting (those with leases).
    pub fn namespace_count(&self) -> usize {
        self.namespaces.len()
    }

    /// Every namespace's figures as of the last evaluation, by name.
    pub fn figures(&self) -> Vec<NamespacePreservation> {
        self.namespaces
            .iter()
            .map(|(name, ns)| NamespacePreservation {
                namespace: name.clone(),
                active: ns.paused_since_ms.is_some(),
                renewals: ns.renewals_last_window,
                expected: ns.expected_last_window,
                paused_since_ms: ns.paused_since_ms,
                leases: ns.leases,
                counted: ns.counted,
            })
            .collect()
    }
}
