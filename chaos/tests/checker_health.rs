//! The checker's lease-health and staleness invariants against synthetic histories: each
//! broken promise of issue 12 (a lease resumed Healthy after a restart, a heartbeat that
//! does not revive, an instance of an id race that never expires) and of issue 13 §6 (a
//! copy that looks fresh without progress, or stale while progressing) is caught; the
//! legitimate windows (the slow way back, a self-preservation pause, a damped lease) are not
//! flagged.

use tandem_chaos::checker::{
    CheckReport, Checker, CheckerConfig, HealthRules, InstanceRef, Invariant, Mark, ObservedInstance, OpKind,
    Outcome, PeerLinkView, ProcessEvent, ServiceView, StatusObservation, StatusView, ViewObservation,
    ViewScope,
};

const A: &str = "dc-a";
const B: &str = "dc-b";

fn checker() -> Checker {
    let mut cfg = CheckerConfig::new(&[A, B]);
    cfg.hold_ms = 1_000;
    cfg.health = Some(HealthRules::sandbox());
    cfg.stale_after_ms = Some(1_500);
    cfg.reused_services.insert("fixed".into());
    let mut c = Checker::new(cfg);
    for dc in [A, B] {
        c.process(dc, 0, ProcessEvent::Spawned);
        c.process(dc, 0, ProcessEvent::Ready);
    }
    c
}

fn acked(v: u64) -> Outcome {
    Outcome::Acked { version: Some(v), epoch: Some(1) }
}

fn register(c: &mut Checker, r: &InstanceRef, t: u64, v: u64) {
    let op = c.invoke(A, r, OpKind::Register { persistent: false, ttl_ms: 2_400 }, t);
    c.complete(op, t + 2, acked(v));
}

fn heartbeats(c: &mut Checker, r: &InstanceRef, from: u64, to: u64) {
    let mut t = from;
    while t < to {
        let op = c.invoke(A, r, OpKind::Heartbeat, t);
        c.complete(op, t + 2, acked(0));
        t += 200;
    }
}

/// dc-a's `?dc=all` view of `r`'s service at `t`: `shown` is (health, damped), or absent.
fn view(c: &mut Checker, r: &InstanceRef, t: u64, shown: Option<(&str, bool)>) {
    let instances = shown
        .map(|(health, damped)| ObservedInstance {
            id: r.id.clone(),
            owner_dc: A.into(),
            seq: 1,
            status: "up".into(),
            health: health.into(),
            damped,
            ..Default::default()
        })
        .into_iter()
        .collect();
    c.observe_view(ViewObservation {
        dc: A.into(),
        service: r.service.clone(),
        scope: ViewScope::All,
        invoked: t,
        completed: t + 2,
        result: Ok(ServiceView { index: t, instances }),
    });
}

/// A status of `dc` at `t`: its applied mark of the other DC, what it knows of the other's
/// log, the stale flag, and self-preservation.
fn status(c: &mut Checker, dc: &str, t: u64, applied: u64, origin: u64, stale: bool, paused: bool) {
    let peer = if dc == A { B } else { A };
    c.observe_status(StatusObservation {
        dc: dc.into(),
        invoked: t,
        completed: t + 2,
        result: Ok(StatusView {
            log: Mark { epoch: 1, seq: 0 },
            applied: [(peer.to_owned(), Mark { epoch: 2, seq: applied })].into(),
            peers: [(peer.to_owned(), PeerLinkView { stale, origin: Mark { epoch: 2, seq: origin } })].into(),
            preservation_active: Some(paused),
        }),
    });
}

fn lease_health(r: CheckReport) -> Vec<String> {
    r.result(Invariant::LeaseHealth).unwrap().violations.iter().map(|v| v.summary.clone()).collect()
}

fn staleness(r: &CheckReport) -> u64 {
    r.result(Invariant::Staleness).unwrap().violations_total
}

#[test]
fn a_heartbeating_instance_must_be_healthy_once_a_chain_of_renewals_proves_it() {
    let x = InstanceRef::new("svc", "x");
    let mut c = checker();
    register(&mut c, &x, 100, 1);
    heartbeats(&mut c, &x, 300, 3_000);
    view(&mut c, &x, 1_000, Some(("healthy", false)));
    view(&mut c, &x, 2_000, Some(("suspect", true))); // damped: excused
    view(&mut c, &x, 2_500, Some(("suspect", false)));
    let v = lease_health(c.finish(3_000));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("suspect although its client renewed it"), "{v:?}");
}

#[test]
fn after_a_gap_four_consecutive_heartbeats_are_needed_not_one() {
    let x = InstanceRef::new("svc", "x");
    let mut c = checker();
    register(&mut c, &x, 100, 1);
    // Silent from 100 to 1_500 (Unhealthy), then heartbeats again: the slow way back.
    heartbeats(&mut c, &x, 1_500, 4_000);
    view(&mut c, &x, 1_800, Some(("unhealthy", false)));
    view(&mut c, &x, 2_000, Some(("suspect", false)));
    let clean = lease_health(c.finish(4_000));
    assert!(clean.is_empty(), "the way back is not a violation: {clean:?}");

    let mut c = checker();
    register(&mut c, &x, 100, 1);
    heartbeats(&mut c, &x, 1_500, 4_000);
    view(&mut c, &x, 3_000, Some(("unhealthy", false))); // 8 heartbeats later: never revived
    assert_eq!(lease_health(c.finish(4_000)).len(), 1);
}

#[test]
fn a_lease_resumed_healthy_after_a_restart_is_caught() {
    // Issue 12 §1: y stopped heartbeating, was Unhealthy, dc-a was killed and restarted.
    let y = InstanceRef::new("svc", "y");
    let mut c = checker();
    register(&mut c, &y, 100, 1);
    heartbeats(&mut c, &y, 300, 1_000);
    c.stop_heartbeats(&y, 1_000);
    view(&mut c, &y, 2_400, Some(("unhealthy", false)));
    c.process(A, 2_500, ProcessEvent::Killed);
    c.process(A, 2_600, ProcessEvent::Spawned);
    c.process(A, 3_000, ProcessEvent::Ready);
    view(&mut c, &y, 3_800, Some(("unhealthy", false)));
    view(&mut c, &y, 4_000, Some(("healthy", false)));
    let v = lease_health(c.finish(5_000));
    assert!(v.iter().any(|s| s.contains("improved from unhealthy to healthy")), "{v:?}");
}

#[test]
fn a_silent_instance_outliving_its_lease_is_caught_unless_expiry_is_paused() {
    let y = InstanceRef::new("svc", "y");
    let run = |paused: bool| {
        let mut c = checker();
        register(&mut c, &y, 100, 1);
        c.stop_heartbeats(&y, 200);
        // Expiry due at 200 + 2_400; the owner's status says whether it is paused.
        status(&mut c, A, 2_900, 0, 0, false, paused);
        view(&mut c, &y, 1_600, Some(("unhealthy", false)));
        view(&mut c, &y, 3_600, Some(("unhealthy", false)));
        lease_health(c.finish(4_000))
    };
    let v = run(false);
    assert!(v.len() == 1 && v[0].contains("outlived its lease"), "{v:?}");
    assert!(run(true).is_empty(), "a self-preservation pause keeps it legitimately");
}

#[test]
fn an_id_race_that_leaves_an_instance_without_a_lease_is_caught() {
    // Issue 12 §2: rounds of register, then DELETE and register in parallel, no heartbeats.
    let r = InstanceRef::new("fixed", "a-race-0");
    let mut c = checker();
    let mut t = 100;
    let mut v = 1;
    for _ in 0..3 {
        register(&mut c, &r, t, v);
        let d = c.invoke(A, &r, OpKind::Deregister, t + 3);
        let g = c.invoke(A, &r, OpKind::Register { persistent: false, ttl_ms: 2_400 }, t + 3);
        c.complete(d, t + 6, acked(v + 2));
        c.complete(g, t + 7, acked(v + 1));
        t += 10;
        v += 3;
    }
    c.heartbeats_ended(&r, t);
    view(&mut c, &r, t + 1_000, Some(("healthy", false)));
    view(&mut c, &r, t + 2_000, Some(("unhealthy", false)));
    status(&mut c, A, t + 3_200, 0, 0, false, false);
    view(&mut c, &r, t + 4_000, Some(("unhealthy", false)));
    let found = lease_health(c.finish(t + 5_000));
    assert!(found.len() == 1 && found[0].contains("outlived its lease"), "{found:?}");
}

#[test]
fn copies_must_turn_stale_without_progress_and_stay_fresh_with_it() {
    // dc-b reads dc-a's copies. A partition from 1_000 ms: stale required from 2_800 ms.
    let mut c = checker();
    c.link(1_000, A, B, true);
    c.link(1_000, B, A, true);
    status(&mut c, B, 3_000, 5, 5, false, false); // fresh during a partition: caught
    c.link(4_000, A, B, false);
    c.link(4_000, B, A, false);
    let r = c.finish(5_000);
    assert_eq!(staleness(&r), 1, "{:#?}", r.result(Invariant::Staleness));

    // Progress seen (the mark rises between two samples): stale is wrong right after.
    let mut c = checker();
    status(&mut c, B, 1_000, 5, 9, false, false);
    status(&mut c, B, 1_100, 9, 9, false, false);
    status(&mut c, B, 1_300, 9, 9, true, false);
    let r = c.finish(3_000);
    assert_eq!(staleness(&r), 1, "{:#?}", r.result(Invariant::Staleness));

    // No progress while known to be behind (a handshake that does not count): must be
    // stale after stale_after_ms, and is (clean); the same history saying fresh is caught.
    for (flag, want) in [(true, 0), (false, 4)] {
        let mut c = checker();
        status(&mut c, B, 1_000, 5, 9, false, false);
        for t in (1_200..4_000).step_by(200) {
            status(&mut c, B, t, 5, 9, t < 2_800 || flag, false);
        }
        let r = c.finish(5_000);
        assert_eq!(staleness(&r), want, "{:#?}", r.result(Invariant::Staleness));
        assert!(r.result(Invariant::Staleness).unwrap().checks > 0);
    }
}

#[test]
fn a_registration_of_unknown_outcome_held_by_a_paused_owner_may_land_after_the_pause() {
    // Seed 5's pause drill: a reused id deregistered, registered again while its owner was
    // paused (the client timed out), then read absent just after SIGCONT and present a moment
    // later when the held request was served. Not a violation; the same read order after a
    // registration that timed out early on a running owner (it could not land that late) is.
    let r = InstanceRef::new("fixed", "a-fix-0");
    let run = |paused: bool| {
        let mut c = checker();
        register(&mut c, &r, 100, 1);
        let d = c.invoke(A, &r, OpKind::Deregister, 2_000);
        c.complete(d, 2_002, acked(2));
        if paused {
            c.process(A, 3_000, ProcessEvent::Paused);
        }
        let g = c.invoke(A, &r, OpKind::Register { persistent: false, ttl_ms: 2_400 }, 3_494);
        c.complete(g, if paused { 5_495 } else { 3_600 }, Outcome::Unknown { message: "timeout".into() });
        if paused {
            c.process(A, 5_645, ProcessEvent::Resumed);
        }
        c.heartbeats_ended(&r, 5_648);
        view(&mut c, &r, 5_649, None);
        view(&mut c, &r, 5_755, Some(("healthy", false)));
        lease_health(c.finish(7_000))
    };
    let clean = run(true);
    assert!(clean.is_empty(), "{clean:?}");
    let caught = run(false);
    assert!(caught.iter().any(|s| s.contains("improved from gone to healthy")), "{caught:?}");
}

#[test]
fn a_paused_peer_is_silent_until_its_sigcont_is_sent_not_until_the_drill_notes_it() {
    // The pause drill's seed 1 (CI): dc-b paused at 3_000 ms; the drill sent SIGCONT at
    // 6_288 ms and noted `Resumed` once `kill -CONT` had exited, at 6_300 ms. dc-b shipped
    // at once, and dc-a's read at 6_290 ms said fresh: right, and not a violation once the
    // checker knows when the signal went out. A fresh read before that still is one.
    for (read_at, want) in [(6_290, 0), (6_000, 1)] {
        let mut c = checker();
        c.process(B, 3_000, ProcessEvent::Paused);
        c.resuming(6_288, B);
        status(&mut c, A, read_at, 5, 5, false, false);
        c.process(B, 6_300, ProcessEvent::Resumed);
        let r = c.finish(8_000);
        assert_eq!(staleness(&r), want, "read at {read_at}: {:#?}", r.result(Invariant::Staleness));
    }
}
