//! Unit tests of the registry: patches minted against the overlay, the overlay settling,
//! decisions judged on another registration, and the watch index.

use std::sync::Arc;

use tandem_schemas::{DeregisterReason, Health, InstanceKey, InstanceRecord, Op, Status};

use super::write::{settle, Minted, Overlay, Patch};
use super::ViewIndex;

fn rec() -> InstanceRecord {
    tandem_replicator::log::conformance::record("dc-a", "i1")
}

#[test]
fn concurrent_patches_of_one_instance_keep_each_others_fields() {
    // A status change and a health change minted back to back (as two requests of one
    // commit group would be) must both survive: each builds on the other.
    let key = rec().key;
    let mut minted = Overlay::default();
    let none = |_: &InstanceKey| None;
    assert!(matches!(
        Patch::Register(Box::new(rec())).apply(&key, &mut minted, 1, none, Some(1)),
        Minted::Op(Op::Register(_))
    ));
    let Minted::Op(Op::Update(a)) =
        Patch::Status(Status::Draining).apply(&key, &mut minted, 2, none, Some(1))
    else {
        panic!()
    };
    assert_eq!(a.status, Status::Draining);
    let Minted::Op(Op::Update(b)) = Patch::Health { health: Health::Suspect, damped: false, version: 1 }
        .apply(&key, &mut minted, 3, none, Some(1))
    else {
        panic!()
    };
    assert_eq!((b.status, b.health), (Status::Draining, Health::Suspect), "status kept by the health update");
    assert!(matches!(
        Patch::Status(Status::Draining).apply(&key, &mut minted, 4, none, Some(1)),
        Minted::Unchanged
    ));
    assert!(matches!(
        Patch::Deregister(DeregisterReason::Explicit, None).apply(&key, &mut minted, 4, none, Some(1)),
        Minted::Op(_)
    ));
    // A deregistration in flight hides what the (older) view still holds.
    let stale = |_: &InstanceKey| Some(Arc::new(rec()));
    assert!(matches!(Patch::Status(Status::Up).apply(&key, &mut minted, 5, stale, Some(1)), Minted::Gone));
    assert!(matches!(
        Patch::Deregister(DeregisterReason::Explicit, None).apply(&key, &mut minted, 5, stale, Some(1)),
        Minted::Gone
    ));
}

#[test]
fn the_overlay_holds_only_writes_in_flight() {
    let key = rec().key;
    let mut minted = Overlay::default();
    let none = |_: &InstanceKey| None;
    assert!(matches!(
        Patch::Register(Box::new(rec())).apply(&key, &mut minted, 1, none, Some(1)),
        Minted::Op(_)
    ));
    assert!(matches!(
        Patch::Status(Status::Draining).apply(&key, &mut minted, 2, none, Some(1)),
        Minted::Op(_)
    ));
    // The first write is answered while the second is still in flight: the entry stays.
    settle(&mut minted, &[(key.clone(), 1)]);
    assert_eq!(minted.get(&key).map(|p| p.seq), Some(2));
    settle(&mut minted, &[(key.clone(), 2)]);
    assert!(minted.is_empty());
    // Settled: the next patch builds on the view's record.
    let mut in_view = rec();
    in_view.status = Status::Draining;
    in_view.weight = 7;
    let from_view = |_: &InstanceKey| Some(Arc::new(in_view.clone()));
    let Minted::Op(Op::Update(r)) = Patch::Health { health: Health::Suspect, damped: false, version: 1 }
        .apply(&key, &mut minted, 3, from_view, Some(1))
    else {
        panic!()
    };
    assert_eq!((r.status, r.weight, r.health), (Status::Draining, 7, Health::Suspect));
}

#[test]
fn decisions_about_another_registration_change_nothing() {
    // Issue 12 §2: an expiry (or a health change) judged on registration 1 must not
    // touch registration 2 of the same id, acknowledged in between.
    let key = rec().key;
    let mut minted = Overlay::default();
    let live = |_: &InstanceKey| Some(Arc::new(rec()));
    let expire = Patch::Deregister(DeregisterReason::LeaseExpired, Some(1));
    assert!(matches!(expire.clone().apply(&key, &mut minted, 5, live, Some(2)), Minted::Gone));
    let health = Patch::Health { health: Health::Unhealthy, damped: false, version: 1 };
    assert!(matches!(health.apply(&key, &mut minted, 5, live, Some(2)), Minted::Gone));
    assert!(matches!(Patch::Damped(true, 1).apply(&key, &mut minted, 5, live, None), Minted::Gone));
    assert!(minted.is_empty());
    // On its own registration, the expiry writes the tombstone.
    assert!(matches!(expire.apply(&key, &mut minted, 5, live, Some(1)), Minted::Op(Op::Deregister { .. })));
}

#[test]
fn the_view_index_moves_past_every_bump_after_a_durable_write() {
    let base = ViewIndex::from_durable(7);
    let mut i = base;
    for _ in 0..1000 {
        i = i.bumped();
    }
    assert!(ViewIndex::from_durable(8) > i);
}

mod dropped_callers {
    //! Issue 12 §4: a caller that goes away before the committer ran its builder must not
    //! leave its overlay entry (or its lease) behind.

    use std::sync::Arc;

    use futures::FutureExt as _;

    use crate::clock::ManualClock;
    use crate::config::Config;
    use crate::registry::{Counters, RegisterRequest, Registry, ViewCell};
    use crate::store::{Committer, CommitterLimits, InlineCommitter, MemFault, MemStore};

    pub(super) fn node() -> (Arc<Registry>, InlineCommitter<MemStore>) {
        let store = MemStore::new("dc-a", 7);
        let counters = Arc::new(Counters::default());
        let view = ViewCell::new("dc-a", 0, counters.clone());
        let cb_view = view.clone();
        let (inline, handle) =
            Committer::inline(store, Box::new(move |n| cb_view.follow(n)), CommitterLimits::default());
        let cfg = Config::single("dc-a", "/nonexistent/registry-test".into(), "127.0.0.1:0".parse().unwrap());
        let clock = Arc::new(ManualClock::new(1_000, 0));
        (Registry::new(Arc::new(cfg), Arc::new(handle), view, counters, clock), inline)
    }

    pub(super) fn req(id: &str) -> RegisterRequest {
        RegisterRequest {
            service: "svc".into(),
            instance_id: Some(id.into()),
            address: "10.0.0.1".into(),
            port: 80,
            ..Default::default()
        }
    }

    #[test]
    fn a_take_over_leaves_the_runtime_free_while_it_rebuilds_the_leases() {
        // A new leader's take-over reads every owner and rebuilds every lease (about half a
        // second at a million): on a runtime of one thread, a task queued meanwhile must
        // run before the take-over ends, as it could not if the take-over held the thread.
        let (reg, mut inline) = node();
        for i in 0..200 {
            let _ = reg.register(req(&format!("i{i}"))).now_or_never();
        }
        assert_eq!(inline.run_round(), 200);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (leases, ran_before_the_end) = rt.block_on(async {
            let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let seen = ended.clone();
            let queued = tokio::spawn(async move { !seen.load(std::sync::atomic::Ordering::SeqCst) });
            let leases =
                reg.take_lead(|| Ok::<_, tandem_replicator::log::LogError>(Vec::new())).await.unwrap();
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            (leases, queued.await.unwrap())
        });
        assert_eq!(leases, 200, "every lease taken over");
        assert!(ran_before_the_end, "the take-over held the runtime's only thread until it ended");
        // An owners' read that fails fails the take-over (it retries), with its reason.
        let failed =
            rt.block_on(reg.take_lead(|| Err(tandem_replicator::log::LogError::Storage("disk gone".into()))));
        let why = format!("{:#}", failed.unwrap_err());
        assert!(why.contains("cannot read the instance owners") && why.contains("disk gone"), "{why}");
    }

    #[test]
    fn a_caller_dropped_before_its_builder_ran_leaves_no_overlay_entry() {
        let (reg, mut inline) = node();
        // Polled once: the request is queued and the caller waits for its answer; then the
        // caller goes away (a client disconnect, a request time budget).
        assert!(reg.register(req("i1")).now_or_never().is_none());
        assert_eq!(inline.run_round(), 1);
        assert_eq!(reg.view.instance_count(), 1, "the write stands");
        assert!(reg.minted.lock().is_empty(), "the overlay holds only writes in flight");
    }

    #[test]
    fn a_failed_write_of_a_dropped_caller_leaves_no_overlay_entry_nor_lease() {
        let (reg, mut inline) = node();
        let fault = inline.log().fault();
        *fault.lock() = MemFault::Refuse;
        assert!(reg.register(req("i1")).now_or_never().is_none());
        assert_eq!(inline.run_round(), 1, "built, minted (overlay entry, lease), then the write fails");
        inline.run_round();
        assert_eq!(reg.lease_count(), 1, "in doubt while the disk refuses");
        *fault.lock() = MemFault::None;
        inline.run_round();
        assert_eq!(reg.view.instance_count(), 0, "the write was not made");
        assert!(reg.minted.lock().is_empty(), "no overlay entry left behind");
        assert_eq!(reg.lease_count(), 0, "no lease without its instance");
    }

    /// A registration minted (its lease made) but not yet in the view, here in doubt while
    /// the disk refuses: a heartbeat finds no instance (404), as a renewal that reads the
    /// view says, though its lease is in the table (renewals by name renew only leases the
    /// view shows).
    #[test]
    fn a_heartbeat_of_a_registration_the_view_does_not_show_yet_is_unknown() {
        let (reg, mut inline) = node();
        let fault = inline.log().fault();
        *fault.lock() = MemFault::Refuse;
        let mut first = Box::pin(reg.register(req("i1")));
        assert!((&mut first).now_or_never().is_none());
        inline.run_round();
        inline.run_round();
        assert_eq!(reg.lease_count(), 1, "minted: its lease is in the table");
        assert_eq!(reg.view.instance_count(), 0);
        let e = reg.heartbeat("default", "svc", "i1").now_or_never().expect("answered").unwrap_err();
        assert_eq!(e.status.as_u16(), 404, "{e}");
        // And in a batch: unknown, not renewed.
        let item = crate::registry::HeartbeatItem {
            namespace: None,
            service: "svc".into(),
            instance_id: "i1".into(),
        };
        let batch = std::slice::from_ref(&item);
        let answer = reg.heartbeat_batch(batch).now_or_never().expect("answered").expect("answered");
        assert_eq!((answer.renewed, answer.unknown.clone()), (0, vec![0]), "{answer:?}");
        // Once the write lands and the view shows it, the heartbeat renews.
        *fault.lock() = MemFault::None;
        inline.run_round();
        assert_eq!(reg.view.instance_count(), 0, "the refused write was not made");
        let mut again = Box::pin(reg.register(req("i1")));
        assert!((&mut again).now_or_never().is_none());
        inline.run_round();
        (&mut again).now_or_never().expect("answered").expect("registered");
        reg.heartbeat("default", "svc", "i1").now_or_never().expect("answered").expect("renewed");
        let answer = reg.heartbeat_batch(batch).now_or_never().expect("answered").expect("answered");
        assert_eq!((answer.renewed, answer.unknown), (1, vec![]));
    }

    #[test]
    fn while_the_log_is_unwritable_writes_are_refused_and_a_landed_write_is_acknowledged() {
        let (reg, mut inline) = node();
        let fault = inline.log().fault();
        *fault.lock() = MemFault::LandThenFail;
        let mut first = Box::pin(reg.register(req("i1")));
        assert!((&mut first).now_or_never().is_none());
        inline.run_round();
        assert!((&mut first).now_or_never().is_none(), "in doubt: the caller waits for the outcome");
        // Refused at once, without being built: nothing of it is minted.
        *fault.lock() = MemFault::Refuse;
        inline.run_round();
        let mut second = Box::pin(reg.register(req("i2")));
        assert!((&mut second).now_or_never().is_none());
        inline.run_round();
        let e = (&mut second).now_or_never().expect("answered").unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (503, "log_unwritable"), "{e}");
        assert!(reg.minted.lock().keys().all(|k| &*k.instance_id == "i1"));
        // The disk takes writes again: the first write had landed, so it is acknowledged.
        *fault.lock() = MemFault::None;
        inline.run_round();
        let answer = (&mut first).now_or_never().expect("answered").expect("acknowledged");
        assert_eq!(answer.version, 1);
        assert_eq!(reg.view.instance_count(), 1);
        assert_eq!(reg.lease_count(), 1);
        assert!(reg.minted.lock().is_empty());
        // And the node writes again, without a restart.
        let mut third = Box::pin(reg.register(req("i3")));
        assert!((&mut third).now_or_never().is_none());
        inline.run_round();
        assert_eq!((&mut third).now_or_never().expect("answered").expect("written").version, 2);
    }
}

#[test]
fn services_that_empty_are_dropped_and_absent_indexes_never_go_backwards() {
    use std::sync::Arc;
    use tandem_replicator::log::StateChange;

    let view = super::ViewCell::new("dc-a", 1, Arc::new(super::Counters::default()));
    let r = rec();
    let (ns, svc) = (r.key.namespace.to_string(), r.key.service.to_string());
    let absent_at_start = view.absent_index("other-ns", "nosuch");
    // Created by its first instance.
    view.apply(2, &[StateChange::Put { seq: 1, record: r.clone() }]);
    assert_eq!((view.service_count(), view.namespace_count()), (1, 1));
    // Updates of a held service never move an absent service's index.
    let absent = view.absent_index("other-ns", "nosuch");
    assert!(absent >= absent_at_start);
    for seq in 2..10 {
        view.apply(seq + 1, &[StateChange::Put { seq, record: r.clone() }]);
    }
    assert_eq!(view.absent_index("other-ns", "nosuch"), absent);
    let held_index = view.view.read().services.values().next().unwrap().index;
    // Its last instance goes: dropped, uncounted, and its index (now its bucket's) is
    // the removal's, past every index it had.
    view.apply(11, &[StateChange::Remove { key: r.key.clone() }]);
    assert_eq!((view.service_count(), view.namespace_count()), (0, 0));
    let after = view.absent_index(&ns, &svc);
    assert!(after > held_index && after == view.index(), "{after} {held_index}");
    // A removal of an instance the view does not hold creates nothing.
    view.apply(12, &[StateChange::Remove { key: r.key.clone() }]);
    assert_eq!(view.service_count(), 0);
}

#[test]
fn a_replaced_record_is_uncounted_and_a_round_moves_each_service_it_touches() {
    use std::sync::Arc;
    use tandem_replicator::log::StateChange;

    let view = super::ViewCell::new("dc-a", 1, Arc::new(super::Counters::default()));
    let with_meta = |id: &str, bytes: usize| {
        let mut r = tandem_replicator::log::conformance::record("dc-a", id);
        r.metadata = [("k".to_string(), "v".repeat(bytes - 1))].into();
        r
    };
    let usage = |view: &super::ViewCell| {
        let u = view.namespace_usage();
        assert_eq!(u.len(), 1, "{u:?}");
        (u[0].1.instances, u[0].1.metadata_bytes)
    };
    // One round: two instances of the service, then the first again with less metadata.
    let put = |seq, record| StateChange::Put { seq, record };
    view.apply(2, &[put(1, with_meta("i1", 50)), put(2, with_meta("i2", 30)), put(3, with_meta("i1", 10))]);
    assert_eq!(usage(&view), (2, 40), "the replaced record's 50 bytes are no longer counted");
    let index = |view: &super::ViewCell| view.view.read().services.values().next().unwrap().index;
    let first = index(&view);
    assert_eq!(first, view.index());
    // A later round of the same service moves the service's index with the view's.
    view.apply(3, &[put(4, with_meta("i2", 20))]);
    assert_eq!(usage(&view), (2, 30));
    assert!(index(&view) > first && index(&view) == view.index());
}

#[test]
fn a_lookup_by_a_key_of_its_own_allocations_finds_the_instance_of_its_owner_only() {
    use tandem_replicator::log::StateChange;

    // The view looks a request's key up with the service's shared names (the held keys
    // share them): a key whose names are separate allocations still finds its instance,
    // and the same id under another owner, or in an owner the service never had, does not.
    let view = super::ViewCell::new("dc-a", 1, Arc::new(super::Counters::default()));
    let put = |seq, record| StateChange::Put { seq, record };
    let (a, b) = (rec(), tandem_replicator::log::conformance::record("dc-b", "i2"));
    view.apply(2, &[put(1, a.clone()), put(2, b.clone())]);
    let own = |k: &InstanceKey| InstanceKey {
        owner_dc: k.owner_dc.to_string().into(),
        namespace: k.namespace.to_string().into(),
        service: k.service.to_string().into(),
        instance_id: k.instance_id.to_string().into(),
    };
    assert_eq!(view.get(&own(&a.key)).map(|h| h.seq), Some(1));
    assert_eq!(view.get(&own(&b.key)).map(|h| h.seq), Some(2));
    let elsewhere = |k: &InstanceKey, dc: &str| InstanceKey { owner_dc: dc.into(), ..own(k) };
    assert!(view.get(&elsewhere(&a.key, "dc-b")).is_none());
    assert!(view.get(&elsewhere(&b.key, "dc-a")).is_none());
    assert!(view.get(&elsewhere(&a.key, "dc-c")).is_none());
    let other_service = InstanceKey { service: "nosuch".into(), ..own(&a.key) };
    assert!(view.get(&other_service).is_none());
}

mod owner_records {
    //! What the anonymous principal (ACLs off) registers is owned by no one: the log holds
    //! no owner record for it (one write fewer per registration, nothing to read back at a
    //! start), and its registration removes the record of an earlier named owner.

    use std::sync::Arc;

    use futures::FutureExt as _;

    use super::dropped_callers::{node, req};
    use crate::registry::Writer;
    use crate::store::CommitLog as _;

    #[test]
    fn an_anonymous_registration_stores_no_owner_and_removes_a_named_one() {
        let (reg, mut inline) = node();
        let mut anon = Box::pin(reg.register(req("i1")));
        assert!((&mut anon).now_or_never().is_none());
        inline.run_round();
        (&mut anon).now_or_never().expect("answered").expect("registered");
        assert_eq!(inline.log().owners().unwrap(), vec![], "no owner record for the anonymous principal");

        let alice = Writer { principal: Arc::from("alice"), admin: false };
        let mut named = Box::pin(reg.register_as(req("i2"), &alice));
        assert!((&mut named).now_or_never().is_none());
        inline.run_round();
        (&mut named).now_or_never().expect("answered").expect("registered");
        let owners = inline.log().owners().unwrap();
        assert_eq!(
            owners.iter().map(|(k, o)| (&*k.instance_id, &**o)).collect::<Vec<_>>(),
            vec![("i2", "alice")]
        );
        assert_eq!(reg.owned_instances(), 1);

        // The anonymous principal may change anything (ACLs off): its registration of i2
        // leaves i2 owned by no one, in the log as in the registry.
        let mut again = Box::pin(reg.register(req("i2")));
        assert!((&mut again).now_or_never().is_none());
        inline.run_round();
        (&mut again).now_or_never().expect("answered").expect("registered");
        assert_eq!(inline.log().owners().unwrap(), vec![]);
        assert_eq!(reg.owned_instances(), 0);
    }
}

/// Issue 21: a local write's wait before its round's write is timed from its request, not
/// from when the committer took it, and its wait after the write is timed too.
#[test]
fn a_writes_wait_for_its_round_is_timed_from_its_request() {
    use futures::FutureExt as _;

    let (reg, mut inline) = dropped_callers::node();
    let mut registration = Box::pin(reg.register(dropped_callers::req("i1")));
    assert!((&mut registration).now_or_never().is_none(), "queued, not served yet");
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(inline.run_round(), 1);
    registration.now_or_never().expect("answered").expect("written");
    let stats = inline.stats();
    assert_eq!((stats.local_queued.count(), stats.local_answered.count()), (1, 1));
    let queued_us = stats.local_queued.quantile_us(1.0).unwrap();
    assert!(queued_us > 4096.0, "queued 5 ms before its round, timed as {queued_us} us");
    assert!(stats.local_answered.quantile_us(1.0).unwrap() <= 4096.0);
}
