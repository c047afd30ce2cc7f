//! Unit tests of the sans-IO core: verdicts, probabilities, clamping, determinism.

use std::time::Duration;

use super::*;

fn verdicts(seed: u64, faults: &LinkFaults, n: usize) -> Vec<Verdict> {
    let mut shaper = Shaper::new(seed);
    (0..n).map(|_| shaper.decide(faults)).collect()
}

#[test]
fn no_faults_deliver_immediately() {
    for verdict in verdicts(1, &LinkFaults::NONE, 100) {
        assert_eq!(verdict, Verdict::Deliver { delay: Duration::ZERO, held_back: false, duplicate: None });
    }
}

#[test]
fn partition_drops_everything_even_without_loss() {
    for verdict in verdicts(1, &LinkFaults::PARTITIONED, 100) {
        assert_eq!(verdict, Verdict::Drop(DropCause::Partition));
    }
}

#[test]
fn same_seed_same_verdicts_and_different_seed_differs() {
    let faults = LinkFaults {
        loss: Probability::percent(30),
        delay_ms: 5,
        jitter_ms: 10,
        duplicate: Probability::percent(20),
        reorder: Probability::percent(20),
        reorder_hold_ms: 7,
        ..LinkFaults::NONE
    };
    assert_eq!(verdicts(7, &faults, 500), verdicts(7, &faults, 500));
    assert_ne!(verdicts(7, &faults, 500), verdicts(8, &faults, 500));
}

#[test]
fn nth_verdict_does_not_depend_on_earlier_outcomes() {
    // A partition for the first 10 datagrams must not shift the loss decisions after it.
    let lossy = LinkFaults { loss: Probability::percent(50), ..LinkFaults::NONE };
    let mut plain = Shaper::new(3);
    let mut partitioned_first = Shaper::new(3);
    for _ in 0..10 {
        plain.decide(&lossy);
        partitioned_first.decide(&LinkFaults::PARTITIONED);
    }
    for _ in 0..100 {
        assert_eq!(plain.decide(&lossy), partitioned_first.decide(&lossy));
    }
}

#[test]
fn delay_stays_within_base_plus_jitter_plus_hold() {
    let faults = LinkFaults {
        delay_ms: 10,
        jitter_ms: 5,
        duplicate: Probability::ONE,
        reorder: Probability::percent(50),
        reorder_hold_ms: 100,
        ..LinkFaults::NONE
    };
    let (mut held, mut not_held) = (0, 0);
    for verdict in verdicts(9, &faults, 1000) {
        let Verdict::Deliver { delay, held_back, duplicate } = verdict else {
            panic!("no loss configured, got {verdict:?}");
        };
        let hold = if held_back { Duration::from_millis(100) } else { Duration::ZERO };
        assert!(delay >= Duration::from_millis(10) + hold, "{delay:?}");
        assert!(delay <= Duration::from_millis(15) + hold, "{delay:?}");
        let duplicate = duplicate.expect("duplicate probability is one");
        assert!((Duration::from_millis(10)..=Duration::from_millis(15)).contains(&duplicate));
        if held_back {
            held += 1;
        } else {
            not_held += 1;
        }
    }
    assert!(held > 400 && not_held > 400, "held {held}, not held {not_held}");
}

#[test]
fn millisecond_fields_are_clamped() {
    let faults = LinkFaults { delay_ms: u32::MAX, ..LinkFaults::NONE };
    let Verdict::Deliver { delay, .. } = Shaper::new(0).decide(&faults) else { panic!("delivered") };
    assert_eq!(delay, Duration::from_millis(u64::from(DELAY_MS_MAX)));
}

#[test]
fn probability_rejects_out_of_range_and_nan() {
    assert_eq!(Probability::new(-0.1), None);
    assert_eq!(Probability::new(1.1), None);
    assert_eq!(Probability::new(f64::NAN), None);
    assert_eq!(Probability::new(0.25).map(Probability::value), Some(0.25));
    assert_eq!(Probability::percent(250), Probability::ONE);
}

#[test]
fn zero_and_one_probabilities_are_exact() {
    // Draws are in [0, 1): ZERO never hits and ONE always hits.
    assert!(!Probability::ZERO.hit(0.0));
    assert!(Probability::ONE.hit(0.999_999_999));
}
