//! Tests of the lease state machine, damping, the lease table and self-preservation.

/// The tables below were written for a 5 s suspect time (one heartbeat interval);
/// they test the rules, not the shipped default.
fn base() -> HealthConfig {
    HealthConfig { suspect_after_ms: 5_000, ..HealthConfig::default() }
}

use super::*;
use proptest::prelude::*;
use tandem_schemas::Health;
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
        (HealthConfig { suspect_after_ms: 0, ..ok }, HealthConfigError::Zero { field: "suspect_after_ms" }),
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

impl LeaseGroup for u8 {
    fn group(&self) -> &str {
        "default"
    }
}

/// A check in parts lets heartbeats in between: a lease renewed before its part comes is
/// found renewed, and the others in the later parts still go Suspect.
#[test]
fn a_lease_renewed_between_parts_of_a_check_is_found_renewed() {
    let cfg = base();
    let times = cfg.default_times();
    let mut table: LeaseTable<u8> = LeaseTable::default();
    for k in 0..10u8 {
        table.insert(k, Lease::new(0, times, &cfg));
    }
    let now = times.suspect_after_ms;
    let (mut seen, more) = table.check_some(now, false, 3);
    assert_eq!((seen.len(), more), (3, true));
    // Leases come up in deadline order, then insertion order: 9 is in the last part.
    assert_eq!(table.heartbeat(&9, now), Some(None));
    loop {
        let (mut part, more) = table.check_some(now, false, 3);
        assert!(part.len() <= 3);
        seen.append(&mut part);
        if !more {
            break;
        }
    }
    let want: Vec<(u8, Transition)> = (0..9).map(|k| (k, to(Health::Suspect).unwrap())).collect();
    assert_eq!(seen, want);
    assert_eq!(table.get(&9).map(Lease::health), Some(Health::Healthy));
    assert!(
        table.check(now + times.suspect_after_ms - 1, false).is_empty(),
        "9 is due a suspect time after its renewal"
    );
}

#[test]
fn a_lease_inserted_while_the_queue_compacts_still_ticks() {
    // Found by the chaos drills' lease-health invariant (crash-restart, seed 1): `insert`
    // queued the new lease's entry and compacted the queue before the lease was in the
    // map, so compaction dropped that entry as stale and the lease never turned Suspect or
    // Unhealthy, nor expired. Each re-insertion of key 1 leaves a stale entry; the 65th
    // push compacts.
    let cfg = HealthConfig::default();
    let times = LeaseTimes::from_ttl(2_400);
    let mut table: LeaseTable<u8> = LeaseTable::default();
    for _ in 0..65 {
        table.insert(1, Lease::new(0, times, &cfg));
    }
    assert_eq!(table.check(600, false), vec![(1, to(Health::Suspect).unwrap())]);
    assert_eq!(table.check(1_200, false), vec![(1, to(Health::Unhealthy).unwrap())]);
    assert_eq!(table.check(2_400, false), vec![(1, Transition::Expire)]);
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
    /// A check in parts of `part` due leases (0: in one go).
    Check {
        paused: bool,
        part: usize,
    },
}

fn table_ops() -> impl Strategy<Value = Vec<(u64, TableOp)>> {
    let delta_ms = prop_oneof![6 => 0u64..2_000, 3 => 2_000u64..8_000, 1 => 8_000u64..40_000];
    let op = prop_oneof![
        2 => (0u8..12).prop_map(TableOp::Insert),
        1 => (0u8..12).prop_map(TableOp::Remove),
        5 => (0u8..12).prop_map(TableOp::Beat),
        3 => (0usize..4).prop_map(|part| TableOp::Check { paused: false, part }),
        1 => (0usize..4).prop_map(|part| TableOp::Check { paused: true, part }),
    ];
    proptest::collection::vec((delta_ms, op), 0..400)
}

proptest! {
    /// The due-time queue of [`LeaseTable`] finds exactly the transitions a scan of every
    /// lease at every check finds, in any history of inserts, removals, heartbeats and
    /// (paused) checks, whether a check runs in one go or in parts.
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
                TableOp::Check { paused, part } => {
                    let mut got = if part == 0 {
                        table.check(now_ms, paused)
                    } else {
                        let mut all = Vec::new();
                        loop {
                            let (mut some, more) = table.check_some(now_ms, paused, part);
                            prop_assert!(some.len() <= part);
                            all.append(&mut some);
                            if !more {
                                break all;
                            }
                        }
                    };
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

use crate::hashed::counted::{hashed, Counted};

impl LeaseGroup for Counted {
    fn group(&self) -> &str {
        "default"
    }
}

/// The table doubles without hashing a key again: a doubling happens under the table's
/// lock, and rehashing every key there held all renewals and registrations (11 ms at
/// 114,688 leases). So 100,000 inserts (ten doublings) and one lookup each hash exactly
/// once per call (an insert once in all, not once to remove the lease it replaces and
/// again for its own entry).
#[test]
fn the_table_doubles_without_hashing_its_keys_again() {
    let cfg = base();
    let times = cfg.default_times();
    let mut table: LeaseTable<Counted> = LeaseTable::default();
    hashed();
    for k in 0..100_000 {
        table.insert(Counted(k), Lease::new(0, times, &cfg));
    }
    // An insert hashes once: the removal of a lease it replaces and its own entry share
    // the hash.
    assert_eq!(hashed(), 100_000);
    for k in (0..100_000).step_by(7) {
        assert!(table.get(&Counted(k)).is_some());
    }
    assert!(table.get(&Counted(100_000)).is_none());
    assert_eq!(table.len(), 100_000);
}
