//! Tests of per-namespace self-preservation (issue 12 §3), driven through a [`LeaseTable`]
//! the way the registry drives it: renewals, an evaluation and a check every 200 ms, and
//! expired leases removed.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key(&'static str, u32);

impl LeaseGroup for Key {
    fn group(&self) -> &str {
        self.0
    }
}

const CHECK_MS: u64 = 200;

/// A lease table as a registry runs it, on a virtual clock.
struct Sim {
    table: LeaseTable<Key>,
    cfg: HealthConfig,
    now: u64,
    expired: Vec<(Key, u64)>,
    changes: Vec<(u64, PreservationChange)>,
    /// (key, ttl, beat every ms, next beat, beats until it dies: `None` beats forever).
    clients: Vec<(Key, u64, u64, u64, Option<u32>)>,
}

impl Sim {
    fn new(cfg: HealthConfig) -> Sim {
        let table = LeaseTable::new(SelfPreservation::new(&cfg));
        Sim { table, cfg, now: 0, expired: vec![], changes: vec![], clients: vec![] }
    }

    /// Registers `key` with `ttl_ms`; it heartbeats every `every_ms` (first after
    /// `phase_ms`) `beats` times (`None`: forever; `Some(0)`: never).
    fn client(&mut self, key: Key, ttl_ms: u64, every_ms: u64, phase_ms: u64, beats: Option<u32>) {
        let lease = Lease::new(self.now, LeaseTimes::from_ttl(ttl_ms), &self.cfg);
        self.table.insert(key.clone(), lease);
        self.clients.push((key, ttl_ms, every_ms, self.now + phase_ms, beats));
    }

    /// Stops every client of `ns`.
    fn kill(&mut self, ns: &str) {
        for c in self.clients.iter_mut().filter(|c| c.0 .0 == ns) {
            c.4 = Some(0);
        }
    }

    fn run_until(&mut self, to_ms: u64) {
        while self.now < to_ms {
            self.now += CHECK_MS.min(to_ms - self.now);
            let now = self.now;
            for (key, _, every, next, beats) in &mut self.clients {
                while *next <= now && beats.is_none_or(|b| b > 0) {
                    let _ = self.table.heartbeat(key, *next);
                    *next += *every;
                    if let Some(b) = beats {
                        *b -= 1;
                    }
                }
            }
            for c in self.table.evaluate_preservation(now, &self.cfg) {
                self.changes.push((now, c));
            }
            for (key, t) in self.table.check(now, false) {
                if t == Transition::Expire {
                    self.table.remove(&key);
                    self.clients.retain(|c| c.0 != key);
                    self.expired.push((key, now));
                }
            }
        }
    }

    fn ns(&self, ns: &str) -> Option<NamespacePreservation> {
        self.table.preservation().figures().into_iter().find(|f| &*f.namespace == ns)
    }

    fn paused(&self, ns: &str) -> bool {
        self.table.preservation().paused(ns)
    }

    fn expired_at(&self, key: &Key) -> Option<u64> {
        self.expired.iter().find(|(k, _)| k == key).map(|(_, t)| *t)
    }
}

fn cfg() -> HealthConfig {
    HealthConfig::default()
}

/// Past the warm-up of a simulation started at 0.
const WARM_MS: u64 = 60_000;

#[test]
fn the_issues_scenario_expires_the_dead_instance_within_its_ttl() {
    // Issue 12 §3: 10 clients with ttl 60000 beating every 7.5 s (the SDK's ttl/8), in
    // phase (one batch), and one instance with ttl 4000 that dies. The old rule expected
    // 12 renewals a minute of each (60 s / heartbeat_interval_ms) against 8 made, and kept
    // expiry paused for good.
    for dead_beats in [0, 5, 100] {
        let mut sim = Sim::new(cfg());
        sim.run_until(WARM_MS);
        for i in 0..10 {
            sim.client(Key("default", i), 60_000, 7_500, 7_500, None);
        }
        sim.run_until(2 * WARM_MS);
        let dead = Key("default", 99);
        sim.client(dead.clone(), 4_000, 500, 500, Some(dead_beats));
        let last_beat = sim.now + 500 * u64::from(dead_beats);
        sim.run_until(4 * WARM_MS);
        let at = sim.expired_at(&dead).expect("the dead instance expired");
        assert!(
            at <= last_beat + 4_000 + 2 * CHECK_MS,
            "{dead_beats} beats: expired at {at}, last beat {last_beat}"
        );
        assert_eq!(sim.expired.len(), 1, "only the dead one");
        assert!(sim.changes.iter().all(|(t, _)| *t <= WARM_MS), "no pause after warm-up: {:?}", sim.changes);
        let f = sim.ns("default").unwrap();
        assert!(f.renewals >= 0.85 * f.expected && f.renewals <= 1.15 * f.expected, "{f:?}");
    }
}

#[test]
fn forty_registrations_that_never_heartbeat_pause_nothing() {
    // Issue 12 §3: they switched self-preservation on for every namespace.
    let mut sim = Sim::new(cfg());
    sim.run_until(WARM_MS);
    for i in 0..12 {
        sim.client(Key("a", i), 30_000, 3_750, 1_000 + u64::from(i) * 300, None);
    }
    sim.run_until(2 * WARM_MS);
    let dead_in_a = Key("a", 99);
    sim.client(dead_in_a.clone(), 30_000, 3_750, 0, Some(0));
    for i in 0..40 {
        sim.client(Key("b", i), 30_000, 3_750, 0, Some(0));
    }
    let registered = sim.now;
    sim.run_until(4 * WARM_MS);
    assert!(sim.changes.iter().all(|(t, _)| *t <= WARM_MS), "{:?}", sim.changes);
    assert_eq!(sim.expired.len(), 41);
    assert!(sim.expired.iter().all(|(_, t)| *t <= registered + 30_000 + CHECK_MS));
    assert_eq!(sim.ns("b"), None, "accounting of a namespace goes with its last lease");
    assert_eq!(sim.table.preservation().namespace_count(), 1);
}

#[test]
fn one_namespace_collapsing_pauses_expiry_there_only() {
    let mut sim = Sim::new(cfg());
    for ns in ["a", "b"] {
        for i in 0..20 {
            sim.client(Key(ns, i), 30_000, 3_750, 500 + u64::from(i) * 150, None);
        }
    }
    sim.run_until(2 * WARM_MS);
    assert!(!sim.paused("a") && !sim.paused("b"));
    sim.kill("a");
    // One lease of b dies too: b is still at 95%, so it expires on time.
    sim.clients.iter_mut().find(|c| c.0 == Key("b", 0)).unwrap().4 = Some(0);
    let killed = sim.now;
    sim.run_until(killed + 20_000);
    assert!(sim.paused("a"), "{:?}", sim.ns("a"));
    assert!(!sim.paused("b"), "{:?}", sim.ns("b"));
    sim.run_until(killed + 40_000);
    assert_eq!(sim.expired.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), vec![Key("b", 0)]);
    assert!(sim.expired_at(&Key("b", 0)).unwrap() <= killed + 30_000 + CHECK_MS);
    let a = sim.ns("a").unwrap();
    assert_eq!((a.leases, a.counted), (20, 0), "a's leases parked, out of the count");
    assert!(a.active && a.paused_since_ms.is_some());
}

#[test]
fn after_a_mass_death_the_parked_leases_leave_the_count_and_expiry_resumes() {
    // 40 of 100 die: renewals fall below 85%, expiry pauses; the dead park, stop adding to
    // the expectation, and once their silence has left the window the survivors release
    // the pause and the dead expire. (The old rule kept them in the count: paused for good.)
    let mut sim = Sim::new(cfg());
    for i in 0..100 {
        sim.client(Key("default", i), 30_000, 3_750, 100 + u64::from(i) * 37, None);
    }
    sim.run_until(2 * WARM_MS);
    for c in sim.clients.iter_mut().filter(|c| c.0 .1 < 40) {
        c.4 = Some(0);
    }
    let died = sim.now;
    sim.run_until(died + 30_000);
    assert!(sim.paused("default"), "{:?}", sim.ns("default"));
    assert!(sim.expired.is_empty());
    sim.run_until(died + 30_000 + WARM_MS + 2 * CHECK_MS);
    assert!(!sim.paused("default"), "{:?}", sim.ns("default"));
    let gone: BTreeSet<u32> = sim.expired.iter().map(|(k, _)| k.1).collect();
    assert_eq!(gone, (0..40).collect(), "exactly the dead expired");
    assert_eq!(sim.table.preservation().pauses_capped(), 0, "released by the count, not the cap");
    assert!(matches!(sim.changes.last(), Some((_, PreservationChange::Released { .. }))));
}

#[test]
fn a_pause_with_nothing_renewing_holds_until_the_cap_then_expiry_resumes() {
    let cfg = HealthConfig { self_preservation_max_pause_ms: 5 * 60_000, ..cfg() };
    let mut sim = Sim::new(cfg);
    for i in 0..50 {
        sim.client(Key("default", i), 30_000, 3_750, 100 + u64::from(i) * 37, None);
    }
    sim.run_until(2 * WARM_MS);
    sim.kill("default");
    let died = sim.now;
    sim.run_until(died + 10_000);
    let since = sim.ns("default").unwrap().paused_since_ms.expect("paused");
    // Every lease parks; nothing renews, so nothing shows the network is back: held.
    sim.run_until(since + 5 * 60_000 - CHECK_MS);
    assert!(sim.paused("default") && sim.expired.is_empty(), "{:?}", sim.ns("default"));
    assert_eq!(sim.ns("default").unwrap().counted, 0);
    sim.run_until(since + 5 * 60_000 + CHECK_MS);
    assert_eq!(sim.expired.len(), 50, "the cap resumed expiry");
    assert_eq!(sim.table.preservation().pauses_capped(), 1);
    let capped: Vec<_> =
        sim.changes.iter().filter(|(_, c)| matches!(c, PreservationChange::Capped { .. })).collect();
    assert_eq!(capped.len(), 1, "said once: {:?}", sim.changes);
    assert_eq!(sim.table.preservation().namespace_count(), 0);
}

#[test]
fn a_capped_namespace_pauses_again_only_after_it_recovered() {
    let cfg = HealthConfig { self_preservation_max_pause_ms: 60_000, ..cfg() };
    let mut sp = SelfPreservation::new(&cfg);
    for _ in 0..20 {
        sp.lease_added("n", 0);
        sp.renewed("n", 0, 7_500, 7_500, false, false);
        sp.overdue("n", 0, 7_500, 7_500);
    }
    assert!(!sp.evaluate(0, &cfg).is_empty() && sp.paused("n"), "warm-up");
    // Nothing renews: paused, capped after 60 s, and stays unpaused while still collapsed.
    assert!(matches!(sp.evaluate(60_000, &cfg)[..], [PreservationChange::Capped { paused_ms: 60_000, .. }]));
    assert!(!sp.paused("n"));
    assert!(sp.evaluate(120_000, &cfg).is_empty() && !sp.paused("n"));
    // Renewals come back (20 leases, one per 3.75 s each): the cap is re-armed...
    for t in (120_000..=240_000).step_by(3_750) {
        for _ in 0..20 {
            sp.renewed("n", t, 3_750, 7_500, true, t == 120_000);
        }
    }
    assert!(sp.evaluate(240_000, &cfg).is_empty() && !sp.paused("n"));
    // ...so the next collapse pauses again.
    for _ in 0..20 {
        sp.overdue("n", 300_000, 60_000, 7_500);
    }
    let changes = sp.evaluate(300_000, &cfg);
    assert!(matches!(changes[..], [PreservationChange::Engaged { .. }]), "{changes:?}");
    assert_eq!(sp.pauses_capped(), 1);
}

#[test]
fn warm_up_min_leases_and_disabled() {
    let cfg = cfg();
    let mut sp = SelfPreservation::new(&cfg);
    for _ in 0..9 {
        sp.lease_added("small", 0);
    }
    for _ in 0..10 {
        sp.lease_added("big", 0);
    }
    sp.evaluate(1_000, &cfg);
    assert!(sp.paused("big") && !sp.paused("small"), "warm-up pauses namespaces of 10 leases or more");
    sp.evaluate(61_000, &cfg);
    assert!(sp.paused("big"), "after the warm-up, nothing renews: held");
    sp.renewed("big", 62_000, 1_000, 7_500, false, false);
    sp.evaluate(62_000, &cfg);
    assert!(!sp.paused("big"), "renewals as expected: released");
    let off = HealthConfig { self_preservation_enabled: false, ..cfg };
    let mut sp = SelfPreservation::new(&off);
    for _ in 0..100 {
        sp.lease_added("big", 0);
    }
    sp.evaluate(1_000, &off);
    assert!(!sp.any_paused());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The rule: a client renewing at any cadence of at most its suspect time (ttl / 4)
    /// counts as 100%, within the phase of the window's edges (`1 ± cadence / window`), so
    /// healthy namespaces never pause, in phase (one batch) or not, for TTLs up to half the
    /// window.
    #[test]
    fn clients_at_their_cadence_count_as_full(
        ttls in proptest::collection::vec(600u64..=30_000, 1..4),
        cadence_eighths in 1u64..=2,
        in_phase in any::<bool>(),
        per_ttl in 4u32..12,
        seed in any::<u64>(),
    ) {
        let mut sim = Sim::new(cfg());
        let mut n = 0;
        for ttl in &ttls {
            for _ in 0..per_ttl {
                let every = ttl * cadence_eighths / 8;
                let phase = if in_phase { every } else { 1 + (seed.wrapping_mul(u64::from(n) + 7) % every) };
                sim.client(Key("default", n), *ttl, every, phase, None);
                n += 1;
            }
        }
        sim.run_until(WARM_MS + 1);
        for t in 0..600 {
            sim.run_until(WARM_MS + 1 + (t + 1) * CHECK_MS);
            let f = sim.ns("default").unwrap();
            prop_assert!(!f.active, "{f:?}");
            prop_assert!(f.renewals >= 0.85 * f.expected, "{f:?}");
        }
        prop_assert!(sim.expired.is_empty());
    }
}
