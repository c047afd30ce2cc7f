//! The merge rule: what a receiver does with one replicated change event.
//!
//! This is the heart of tandem's cross-DC correctness, kept as pure functions with
//! exhaustive matches (no `_` arms) so that adding an op or a state forces a decision here.
//!
//! Architecture invariant: nothing in this module reads a clock, touches storage or a
//! socket. Inputs are the receiver's current state; outputs are verdicts the caller applies.
//!
//! The rules (docs/replication.md, "The merge rules"):
//! 1. Ownership: events of origin X are accepted only over a channel authenticated as X.
//! 2. Dedupe: an event whose seq is at or below the receiver's applied high-water mark for
//!    its origin is a duplicate and is dropped, even if its key is gone.
//! 3. Order: seqs are gapless per origin; an event past `mark + 1` is refused (the sender
//!    resends from the mark), an event of another epoch is refused (a snapshot is needed).
//! 4. Versions: otherwise it applies if it is newer than what the receiver holds for the
//!    key; DEREGISTER leaves a tombstone; a REGISTER at or below a tombstone's version is a
//!    no-op, so a stale REGISTER never resurrects an instance.
//! 5. A snapshot replaces the origin's state at or below its seq; one that would move the
//!    origin's cursor backwards inside the same epoch is refused, and so is one of an
//!    older epoch (epochs are ordered, see [`crate::epoch`]: a receiver never goes back).
//! 6. Scope: an event of a namespace outside the origin's replication scope here
//!    ([`Scope`]) that would otherwise apply (or be superseded) is a no-op that consumes its
//!    seq: the mark advances, nothing is written. A snapshot installs only its in-scope part.

use std::collections::{BTreeMap, HashMap};

use tandem_schemas::{ChangeEvent, InstanceKey, Mark, Op, Snapshot};

use crate::scope::Scope;

/// What the receiver currently holds for one key (of the event's origin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Absent,
    Live { seq: u64 },
    Tombstone { seq: u64 },
}

/// The effect an applied event has on the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Store the event's record as the key's live state at the event's seq.
    Put,
    /// Remove the live state and leave a tombstone at the event's seq.
    Tombstone,
}

/// Why an event or snapshot is refused. A refusal changes no state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Refusal {
    #[error("event of origin {origin} arrived over the channel of {channel}")]
    WrongChannel { channel: String, origin: String },
    #[error("event of epoch {got} but the receiver follows epoch {held}; a snapshot is needed")]
    EpochMismatch { held: u64, got: u64 },
    #[error("gap: expected seq {expected}, got {got}")]
    Gap { expected: u64, got: u64 },
    #[error("cursor regressed: receiver is at seq {held}, snapshot is at seq {got}")]
    CursorRegressed { held: u64, got: u64 },
    #[error("epoch {got} is older than epoch {held} the receiver follows: the sender is fenced")]
    EpochRegressed { held: u64, got: u64 },
    #[error("event of origin {origin} touches an instance owned by {owner}")]
    NotOwner { origin: String, owner: String },
    /// The receiver's operator retired this DC: its frames are refused until it is
    /// unretired (see docs/replication.md, "Retiring a DC").
    #[error("DC {dc} is retired here; its frames are refused")]
    Retired { dc: String },
}

/// The verdict on one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Apply `effect`; the origin's mark advances to the event's seq.
    Apply(Effect),
    /// The key already holds a version at or above this event's: nothing changes for the
    /// key but the mark still advances (the seq is consumed).
    Superseded,
    /// Already applied (seq at or below the mark): nothing changes at all.
    Duplicate,
    /// Refused: nothing changes; the caller reports the refusal to the sender.
    Refused(Refusal),
}

/// Decides what to do with `ev`, received over a channel authenticated as `channel_dc`,
/// given the receiver's mark for the event's origin and what it holds for the event's key.
pub fn decide(channel_dc: &str, mark: Option<Mark>, held: Held, ev: &ChangeEvent) -> Verdict {
    // Rule 1: ownership of the channel.
    if ev.origin_dc != channel_dc {
        return Verdict::Refused(Refusal::WrongChannel {
            channel: channel_dc.to_owned(),
            origin: ev.origin_dc.clone(),
        });
    }
    // Rule 1 again, on the key: an origin mints events only for instances it owns. The
    // decoder checks this too; the merge does not rely on every caller having decoded.
    if *ev.op.key().owner_dc != *ev.origin_dc {
        return Verdict::Refused(Refusal::NotOwner {
            origin: ev.origin_dc.clone(),
            owner: ev.op.key().owner_dc.to_string(),
        });
    }
    // Rules 2 and 3: dedupe by high-water mark, then demand the next seq of the same epoch.
    match mark {
        None => {
            if ev.seq != 1 {
                return Verdict::Refused(Refusal::Gap { expected: 1, got: ev.seq });
            }
        }
        Some(m) => {
            if ev.origin_epoch != m.epoch {
                return Verdict::Refused(Refusal::EpochMismatch { held: m.epoch, got: ev.origin_epoch });
            }
            if ev.seq <= m.seq {
                return Verdict::Duplicate;
            }
            if ev.seq != m.seq + 1 {
                return Verdict::Refused(Refusal::Gap { expected: m.seq + 1, got: ev.seq });
            }
        }
    }
    // Rule 4: per-key version comparison with tombstones.
    let newer = match held {
        Held::Absent => true,
        Held::Live { seq } | Held::Tombstone { seq } => ev.seq > seq,
    };
    if !newer {
        return Verdict::Superseded;
    }
    match &ev.op {
        // Register and update carry the full record: both are state-based upserts. A
        // tombstone with a lower seq is overridden only because the owner itself minted a
        // later registration of the same key; stale ones were stopped just above.
        Op::Register(_) | Op::Update(_) => Verdict::Apply(Effect::Put),
        Op::Deregister { .. } => Verdict::Apply(Effect::Tombstone),
    }
}

/// One planned change to the receiver's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedChange<'a> {
    pub event: &'a ChangeEvent,
    pub effect: Effect,
    /// What the receiver held for the key when the event was judged: what `held` read,
    /// or what an earlier change of the same batch left.
    pub before: Held,
}

/// The plan for a batch: the changes to write and the mark to write with them, atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan<'a> {
    pub changes: Vec<PlannedChange<'a>>,
    /// The origin's mark after the batch, `None` when nothing advanced it.
    pub new_mark: Option<Mark>,
    pub duplicates: usize,
    pub superseded: usize,
    /// Events outside the origin's scope (rule 6): their seqs were consumed, nothing
    /// written.
    pub out_of_scope: usize,
    /// The namespace of the first of them (for a sampled log line).
    pub out_of_scope_namespace: Option<&'a str>,
    /// A refusal stops the batch at that event; changes before it still apply.
    pub refusal: Option<Refusal>,
}

/// Plans a whole batch against the receiver's state; `held` looks up the stored state of a
/// key, `scope` is the origin's replication scope here. Events are judged in order, each
/// against the state the previous ones left.
pub fn plan_batch<'a>(
    channel_dc: &str,
    mut mark: Option<Mark>,
    scope: &Scope,
    held: impl Fn(&InstanceKey) -> Held,
    events: &'a [ChangeEvent],
) -> BatchPlan<'a> {
    let mut overlay: HashMap<&InstanceKey, Held> = HashMap::new();
    let mut plan = BatchPlan {
        changes: Vec::new(),
        new_mark: None,
        duplicates: 0,
        superseded: 0,
        out_of_scope: 0,
        out_of_scope_namespace: None,
        refusal: None,
    };
    for ev in events {
        let key = ev.op.key();
        let h = overlay.get(key).copied().unwrap_or_else(|| held(key));
        match decide(channel_dc, mark, h, ev) {
            // Rule 6: judged after rules 1-3 (so ownership, dedupe and order hold for every
            // event), before anything is written.
            Verdict::Apply(_) | Verdict::Superseded if !scope.allows(&key.namespace) => {
                plan.out_of_scope += 1;
                plan.out_of_scope_namespace.get_or_insert(&*key.namespace);
                mark = Some(Mark { epoch: ev.origin_epoch, seq: ev.seq });
                plan.new_mark = mark;
            }
            Verdict::Apply(effect) => {
                let after = match effect {
                    Effect::Put => Held::Live { seq: ev.seq },
                    Effect::Tombstone => Held::Tombstone { seq: ev.seq },
                };
                overlay.insert(key, after);
                plan.changes.push(PlannedChange { event: ev, effect, before: h });
                mark = Some(Mark { epoch: ev.origin_epoch, seq: ev.seq });
                plan.new_mark = mark;
            }
            Verdict::Superseded => {
                plan.superseded += 1;
                mark = Some(Mark { epoch: ev.origin_epoch, seq: ev.seq });
                plan.new_mark = mark;
            }
            Verdict::Duplicate => plan.duplicates += 1,
            Verdict::Refused(r) => {
                plan.refusal = Some(r);
                break;
            }
        }
    }
    plan
}

/// What installing a snapshot does to the receiver's state of that origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPlan {
    /// Keys of the origin held now that the snapshot does not hold: removed outright.
    pub remove: Vec<InstanceKey>,
    /// Tombstones of the origin held now that the snapshot does not hold: removed.
    pub remove_tombstones: Vec<InstanceKey>,
    pub new_mark: Mark,
}

/// Plans installing `snap`, received over `channel_dc`, given the receiver's mark and the
/// keys it holds (live and tombstoned) of that origin. `snap` is the in-scope part of the
/// snapshot ([`Scope::filter_snapshot`], rule 6): held keys of the origin outside the scope
/// are not in it, so they are removed.
///
/// The snapshot is the origin's complete truth at `snap.mark`: anything of the origin not
/// in it is gone, which is what keeps "no resurrection" true after the origin purged its
/// tombstones.
pub fn plan_snapshot(
    channel_dc: &str,
    mark: Option<Mark>,
    held_live: &[InstanceKey],
    held_tombstones: &[InstanceKey],
    snap: &Snapshot,
) -> Result<SnapshotPlan, Refusal> {
    if snap.origin_dc != channel_dc {
        return Err(Refusal::WrongChannel { channel: channel_dc.to_owned(), origin: snap.origin_dc.clone() });
    }
    match mark {
        Some(m) if m.epoch == snap.mark.epoch && snap.mark.seq < m.seq => {
            return Err(Refusal::CursorRegressed { held: m.seq, got: snap.mark.seq });
        }
        Some(m) if snap.mark.epoch < m.epoch => {
            return Err(Refusal::EpochRegressed { held: m.epoch, got: snap.mark.epoch });
        }
        Some(_) | None => {}
    }
    let live: BTreeMap<&InstanceKey, ()> = snap.instances.iter().map(|i| (&i.record.key, ())).collect();
    let tomb: BTreeMap<&InstanceKey, ()> = snap.tombstones.iter().map(|t| (&t.key, ())).collect();
    Ok(SnapshotPlan {
        remove: held_live.iter().filter(|k| !live.contains_key(k)).cloned().collect(),
        remove_tombstones: held_tombstones.iter().filter(|k| !tomb.contains_key(k)).cloned().collect(),
        new_mark: snap.mark,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_schemas::{DeregisterReason, Health, InstanceRecord, Status};

    fn key(id: &str) -> InstanceKey {
        InstanceKey {
            owner_dc: "dc-a".into(),
            namespace: "default".into(),
            service: "svc".into(),
            instance_id: id.into(),
        }
    }

    fn reg(seq: u64, id: &str) -> ChangeEvent {
        ChangeEvent {
            event_id: uuid::Uuid::nil(),
            origin_dc: "dc-a".into(),
            origin_epoch: 7,
            seq,
            commit_time_ms: 0,
            op: Op::Register(InstanceRecord {
                key: key(id),
                address: "10.0.0.1".into(),
                port: 80,
                zone: "".into(),
                weight: 100,
                app_version: "".into(),
                tags: vec![],
                metadata: Default::default(),
                persistent: false,
                lease_ttl_ms: 30_000,
                status: Status::Up,
                health: Health::Healthy,
                damped: false,
            }),
        }
    }

    fn dereg(seq: u64, id: &str) -> ChangeEvent {
        ChangeEvent {
            op: Op::Deregister { key: key(id), reason: DeregisterReason::Explicit },
            ..reg(seq, id)
        }
    }

    const M: fn(u64) -> Option<Mark> = |seq| Some(Mark { epoch: 7, seq });

    #[test]
    fn table_of_verdicts() {
        use Held::*;
        let cases: Vec<(&str, Option<Mark>, Held, ChangeEvent, Verdict)> = vec![
            ("dc-a", None, Absent, reg(1, "i"), Verdict::Apply(Effect::Put)),
            ("dc-a", None, Absent, reg(2, "i"), Verdict::Refused(Refusal::Gap { expected: 1, got: 2 })),
            ("dc-a", M(4), Absent, reg(5, "i"), Verdict::Apply(Effect::Put)),
            ("dc-a", M(4), Absent, reg(4, "i"), Verdict::Duplicate),
            // A duplicate is dropped even though its key is gone.
            ("dc-a", M(9), Absent, reg(3, "i"), Verdict::Duplicate),
            ("dc-a", M(4), Absent, reg(6, "i"), Verdict::Refused(Refusal::Gap { expected: 5, got: 6 })),
            ("dc-a", M(4), Live { seq: 3 }, dereg(5, "i"), Verdict::Apply(Effect::Tombstone)),
            ("dc-a", M(4), Absent, dereg(5, "i"), Verdict::Apply(Effect::Tombstone)),
            // The stale REGISTER at or below a tombstone never resurrects.
            ("dc-a", M(4), Tombstone { seq: 5 }, reg(5, "i"), Verdict::Superseded),
            ("dc-a", M(4), Tombstone { seq: 9 }, reg(5, "i"), Verdict::Superseded),
            ("dc-a", M(4), Tombstone { seq: 3 }, reg(5, "i"), Verdict::Apply(Effect::Put)),
            ("dc-a", M(4), Live { seq: 8 }, reg(5, "i"), Verdict::Superseded),
            (
                "dc-a",
                M(4),
                Absent,
                ChangeEvent {
                    op: Op::Deregister {
                        key: InstanceKey { owner_dc: "dc-b".into(), ..key("i") },
                        reason: DeregisterReason::Explicit,
                    },
                    ..reg(5, "i")
                },
                Verdict::Refused(Refusal::NotOwner { origin: "dc-a".into(), owner: "dc-b".into() }),
            ),
            (
                "dc-b",
                M(4),
                Absent,
                reg(5, "i"),
                Verdict::Refused(Refusal::WrongChannel { channel: "dc-b".into(), origin: "dc-a".into() }),
            ),
            (
                "dc-a",
                Some(Mark { epoch: 6, seq: 4 }),
                Absent,
                reg(5, "i"),
                Verdict::Refused(Refusal::EpochMismatch { held: 6, got: 7 }),
            ),
        ];
        for (i, (ch, mark, held, ev, want)) in cases.into_iter().enumerate() {
            assert_eq!(decide(ch, mark, held, &ev), want, "case {i}");
        }
    }

    #[test]
    fn batch_plan_sees_its_own_earlier_events() {
        let evs = vec![reg(1, "i"), dereg(2, "i"), reg(3, "j")];
        let plan = plan_batch("dc-a", None, &Scope::All, |_| Held::Absent, &evs);
        assert_eq!(plan.changes.len(), 3);
        assert_eq!(plan.changes[1].effect, Effect::Tombstone);
        assert_eq!(plan.new_mark, M(3));
        assert!(plan.refusal.is_none());
    }

    #[test]
    fn batch_stops_at_a_gap_but_keeps_what_came_before() {
        let evs = vec![reg(1, "i"), reg(3, "j")];
        let plan = plan_batch("dc-a", None, &Scope::All, |_| Held::Absent, &evs);
        assert_eq!(plan.changes.len(), 1);
        assert_eq!(plan.new_mark, M(1));
        assert_eq!(plan.refusal, Some(Refusal::Gap { expected: 2, got: 3 }));
    }

    #[test]
    fn out_of_scope_events_consume_their_seq_and_change_nothing() {
        let other = |seq: u64, id: &str| {
            let mut ev = reg(seq, id);
            if let Op::Register(r) = &mut ev.op {
                r.key.namespace = "b".into();
            }
            ev
        };
        let mut b_dereg = dereg(4, "k");
        if let Op::Deregister { key, .. } = &mut b_dereg.op {
            key.namespace = "b".into();
        }
        let evs = vec![other(1, "i"), reg(2, "j"), other(3, "i"), b_dereg];
        let scope = Scope::only(["default"]);
        let plan = plan_batch("dc-a", None, &scope, |_| Held::Absent, &evs);
        assert_eq!(plan.changes.len(), 1);
        assert_eq!(plan.changes[0].event.seq, 2);
        assert_eq!(plan.out_of_scope, 3);
        assert_eq!(plan.out_of_scope_namespace, Some("b"));
        assert_eq!(plan.new_mark, M(4));
        // Dedupe and order still hold for out-of-scope events.
        let plan = plan_batch("dc-a", M(3), &scope, |_| Held::Absent, &evs[..2]);
        assert_eq!((plan.duplicates, plan.out_of_scope, plan.new_mark), (2, 0, None));
        let gap = [other(6, "i")];
        let plan = plan_batch("dc-a", M(4), &scope, |_| Held::Absent, &gap);
        assert_eq!(plan.refusal, Some(Refusal::Gap { expected: 5, got: 6 }));
        // Every namespace: all four apply.
        let plan = plan_batch("dc-a", None, &Scope::All, |_| Held::Absent, &evs);
        assert_eq!((plan.changes.len(), plan.out_of_scope), (4, 0));
    }

    #[test]
    fn snapshot_removes_what_it_does_not_hold_and_refuses_regression() {
        let snap = Snapshot {
            origin_dc: "dc-a".into(),
            mark: Mark { epoch: 7, seq: 10 },
            instances: vec![],
            tombstones: vec![],
        };
        let plan = plan_snapshot("dc-a", M(3), &[key("x")], &[key("t")], &snap).unwrap();
        assert_eq!(plan.remove, vec![key("x")]);
        assert_eq!(plan.remove_tombstones, vec![key("t")]);
        assert_eq!(
            plan_snapshot("dc-a", M(11), &[], &[], &snap),
            Err(Refusal::CursorRegressed { held: 11, got: 10 })
        );
        // A newer epoch replaces the history whatever its seq; an older one never does.
        assert!(plan_snapshot("dc-a", Some(Mark { epoch: 1, seq: 99 }), &[], &[], &snap).is_ok());
        assert_eq!(
            plan_snapshot("dc-a", Some(Mark { epoch: 8, seq: 1 }), &[], &[], &snap),
            Err(Refusal::EpochRegressed { held: 8, got: 7 })
        );
    }
}
