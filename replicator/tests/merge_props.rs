//! Properties of the merge rules, exercised through [`MemLog`] (the reference model of the
//! event log) with random histories and random delivery schedules.
//!
//! The model: two or three origin DCs each own a gapless stream of change events over a
//! small key space (four instance ids per origin, so registers, updates, deregisters and
//! re-registers of the same key collide a lot). One receiver DC gets those streams through
//! a hostile transport: interleaved across origins, duplicated, reordered, replayed (old
//! batches and whole prefixes), cut into batches of random size, sometimes over the wrong
//! channel, and — in the snapshot properties — mixed with snapshots of an origin taken at a
//! random point, also after that origin purged its log and tombstones, and with the
//! tombstone purges an origin's ping allows. Every schedule ends with the at-least-once
//! retry the protocol does: each origin's whole stream once more, in order.
//!
//! What must hold (docs/replication.md, "The merge rules"):
//! 1. The final state (instances, tombstones, marks) equals the reference: each origin's
//!    stream applied once, in order. Tombstones may differ only where a purge allowed it.
//! 2. Every schedule of the same histories converges to the same state.
//! 3. No resurrection: once the receiver consumed a DEREGISTER of key k at seq s, k is never
//!    live again with a seq at or below s; a stale REGISTER never makes it live. Checked
//!    after every step, together with the stronger prefix property: what the receiver holds
//!    of an origin is exactly that origin's state at the receiver's mark.
//! 4. Marks never go backwards.
//! 5. A delivery over the wrong channel, and a refused snapshot, change nothing.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::Config;
use tandem_replicator::log::conformance::{ev, key, record};
use tandem_replicator::log::{EventLog, LogError, MemLog};
use tandem_replicator::merge::{Held, Refusal};
use tandem_schemas::{ChangeEvent, DeregisterReason, InstanceRecord, Mark, Op, Tombstone};

const RECEIVER: &str = "dc-r";
const ORIGINS: [&str; 3] = ["dc-a", "dc-b", "dc-c"];
const IDS: [&str; 4] = ["i0", "i1", "i2", "i3"];
/// Channels that are never right for any origin's events: the receiver itself and a DC
/// nobody knows. The other origins' channels are wrong too.
const FOREIGN_CHANNELS: [&str; 2] = [RECEIVER, "dc-z"];
const HISTORY_EVENTS_MAX: usize = 30;
const STEPS_MAX: usize = 48;
const SCHEDULES: usize = 3;

/// One origin's own stream.
#[derive(Clone, Debug)]
struct History {
    dc: &'static str,
    epoch: u64,
    events: Vec<ChangeEvent>,
}

impl History {
    /// Builds the stream an owner would mint from raw choices: a key that is not live gets
    /// registered; a live one is updated or deregistered (with any reason).
    fn build(dc: &'static str, epoch: u64, choices: &[(usize, u8)]) -> History {
        let mut live = [false; IDS.len()];
        let events = choices
            .iter()
            .enumerate()
            .map(|(i, &(id, choice))| {
                let seq = i as u64 + 1;
                let op = if !live[id] {
                    live[id] = true;
                    Op::Register(record_at(dc, IDS[id], seq))
                } else if choice < 2 {
                    Op::Update(record_at(dc, IDS[id], seq))
                } else {
                    live[id] = false;
                    let reason = match choice {
                        2 => DeregisterReason::Explicit,
                        3 => DeregisterReason::LeaseExpired,
                        _ => DeregisterReason::Evicted,
                    };
                    Op::Deregister { key: key(dc, IDS[id]), reason }
                };
                ev(dc, epoch, seq, op)
            })
            .collect();
        History { dc, epoch, events }
    }

    fn len(&self) -> u64 {
        self.events.len() as u64
    }

    /// Events with seqs in `from..=to`, clamped to the stream.
    fn range(&self, from: u64, to: u64) -> &[ChangeEvent] {
        let lo = (from.max(1) - 1).min(self.len()) as usize;
        let hi = to.min(self.len()) as usize;
        if lo >= hi {
            &[]
        } else {
            &self.events[lo..hi]
        }
    }

    /// The origin's own log after appending the first `upto` events and purging.
    fn origin_log(&self, upto: u64, purge_upto: u64) -> MemLog {
        let mut log = MemLog::new(self.dc, self.epoch);
        log.append_local(self.range(1, upto)).unwrap();
        log.purge_own(purge_upto).unwrap();
        log
    }

    /// What the origin's history says about `id` at `seq`: the last event of the key at or
    /// below it.
    fn at(&self, id: &str, seq: u64) -> Option<&ChangeEvent> {
        self.range(1, seq).iter().rev().find(|e| *e.op.key().instance_id == *id)
    }
}

/// A record whose fields depend on the seq that wrote it, so that holding the wrong
/// version of a key is visible in the state, not only in its seq.
fn record_at(owner: &str, id: &str, seq: u64) -> InstanceRecord {
    let mut r = record(owner, id);
    r.port = 1_000 + (seq % 60_000) as u16;
    r.metadata.insert("written-at".into(), seq.to_string());
    r
}

/// Everything observable in the receiver's state.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    instances: Vec<(u64, InstanceRecord)>,
    tombstones: Vec<Tombstone>,
    marks: BTreeMap<String, Mark>,
}

impl State {
    fn of(log: &MemLog) -> State {
        State {
            instances: log.instances().unwrap(),
            tombstones: log.tombstones().unwrap(),
            marks: log.marks(),
        }
    }
}

/// One delivery step. Raw numbers are resolved against the histories when the step runs.
#[derive(Clone, Debug)]
enum Step {
    /// What a correct sender does: the events right after the receiver's mark.
    Next { origin: usize, len: usize },
    /// An arbitrary window of the stream: an old one (replay), the right one, or one in
    /// the future (a gap: refused where it starts past the mark).
    Window { origin: usize, start: usize, len: usize },
    /// A whole prefix of the stream in one batch.
    Prefix { origin: usize, upto: usize },
    /// A window whose events arrive reversed.
    Reversed { origin: usize, start: usize, len: usize },
    /// One of the batches delivered earlier, again.
    Redeliver { back: usize },
    /// A window of one origin's events over the channel of another DC.
    WrongChannel { origin: usize, channel: usize, start: usize, len: usize },
    /// The origin's snapshot after `at` events and a purge up to `purge`.
    Snapshot { origin: usize, at: usize, purge: usize },
    /// The same snapshot over a wrong channel.
    WrongChannelSnapshot { origin: usize, channel: usize, at: usize },
    /// The origin's ping said it purged up to `floor`: drop its tombstones up to there.
    PurgeTombstones { origin: usize, floor: usize },
}

fn step_strategy(snapshots: bool) -> BoxedStrategy<Step> {
    let n = 0..64usize;
    let len = 1..9usize;
    let basic = prop_oneof![
        6 => (n.clone(), len.clone()).prop_map(|(origin, len)| Step::Next { origin, len }),
        4 => (n.clone(), n.clone(), len.clone())
            .prop_map(|(origin, start, len)| Step::Window { origin, start, len }),
        1 => (n.clone(), n.clone()).prop_map(|(origin, upto)| Step::Prefix { origin, upto }),
        1 => (n.clone(), n.clone(), len.clone())
            .prop_map(|(origin, start, len)| Step::Reversed { origin, start, len }),
        2 => n.clone().prop_map(|back| Step::Redeliver { back }),
        1 => (n.clone(), n.clone(), n.clone(), len.clone())
            .prop_map(|(origin, channel, start, len)| Step::WrongChannel { origin, channel, start, len }),
    ];
    if !snapshots {
        return basic.boxed();
    }
    prop_oneof![
        10 => basic,
        2 => (n.clone(), n.clone(), n.clone())
            .prop_map(|(origin, at, purge)| Step::Snapshot { origin, at, purge }),
        1 => (n.clone(), n.clone(), n.clone())
            .prop_map(|(origin, channel, at)| Step::WrongChannelSnapshot { origin, channel, at }),
        1 => (n.clone(), n).prop_map(|(origin, floor)| Step::PurgeTombstones { origin, floor }),
    ]
    .boxed()
}

fn histories_strategy() -> impl Strategy<Value = Vec<History>> {
    let origin = (1..1_000_000u64, prop::collection::vec((0..IDS.len(), 0..5u8), 1..=HISTORY_EVENTS_MAX));
    prop::collection::vec(origin, 2..=3).prop_map(|origins| {
        origins
            .iter()
            .enumerate()
            .map(|(i, (epoch, choices))| History::build(ORIGINS[i], *epoch, choices))
            .collect()
    })
}

/// A schedule: its steps and the batch size of the final in-order re-delivery.
fn schedule_strategy(snapshots: bool) -> impl Strategy<Value = (Vec<Step>, usize)> {
    (prop::collection::vec(step_strategy(snapshots), 0..STEPS_MAX), 1..12usize)
}

/// Runs schedules against one receiver and checks every step.
struct Run<'h> {
    hs: &'h [History],
    log: MemLog,
    /// Batches delivered over the right channel, for replays.
    delivered: Vec<(usize, Vec<ChangeEvent>)>,
    /// Per origin: the highest seq up to which a purge (snapshot or ping) may have removed
    /// tombstones the reference still holds.
    purged_upto: Vec<u64>,
    /// Per origin and key: the highest seq of a DEREGISTER the receiver has consumed.
    deregistered: BTreeMap<(usize, &'static str), u64>,
}

impl<'h> Run<'h> {
    fn new(hs: &'h [History]) -> Self {
        Run {
            hs,
            log: MemLog::new(RECEIVER, 1),
            delivered: Vec::new(),
            purged_upto: vec![0; hs.len()],
            deregistered: BTreeMap::new(),
        }
    }

    fn mark(&self, origin: usize) -> Option<Mark> {
        self.log.mark_of(self.hs[origin].dc)
    }

    fn wrong_channel(&self, origin: usize, channel: usize) -> &'static str {
        let others: Vec<&'static str> = self
            .hs
            .iter()
            .map(|h| h.dc)
            .filter(|dc| *dc != self.hs[origin].dc)
            .chain(FOREIGN_CHANNELS)
            .collect();
        others[channel % others.len()]
    }

    /// A window `start..start+len` of the stream, `start` in 1..=len+1.
    fn window(&self, origin: usize, start: usize, len: usize) -> Vec<ChangeEvent> {
        let h = &self.hs[origin];
        let from = 1 + start as u64 % (h.len() + 1);
        h.range(from, from + len as u64 - 1).to_vec()
    }

    fn deliver(&mut self, origin: usize, events: Vec<ChangeEvent>) {
        let dc = self.hs[origin].dc;
        let next = self.mark(origin).map_or(1, |m| m.seq + 1);
        let report = self.log.apply_remote(dc, &events).unwrap();
        // A refusal is only ever about order here: the channel and the epoch are right.
        assert!(
            matches!(report.refusal, None | Some(Refusal::Gap { .. })),
            "unexpected refusal {:?}",
            report.refusal
        );
        // A consecutive batch that does not start past the mark is never refused: what it
        // holds at or below the mark is dropped as duplicates, the rest applies.
        let consecutive = events.windows(2).all(|w| w[1].seq == w[0].seq + 1);
        if consecutive && events.first().is_some_and(|e| e.seq <= next) {
            assert_eq!(report.refusal, None);
            let dups = events.iter().filter(|e| e.seq < next).count();
            assert_eq!(report.duplicates, dups);
            assert_eq!(report.applied + report.superseded, events.len() - dups);
        }
        self.delivered.push((origin, events));
    }

    fn step(&mut self, step: &Step) {
        let before = State::of(&self.log);
        let n = self.hs.len();
        match *step {
            Step::Next { origin, len } => {
                let origin = origin % n;
                let h = &self.hs[origin];
                let from = self.mark(origin).map_or(1, |m| m.seq + 1);
                let want = (from + len as u64 - 1).min(h.len());
                let events = h.range(from, want).to_vec();
                self.deliver(origin, events);
                // The correct sender always makes progress to exactly the batch end.
                if want >= from {
                    assert_eq!(self.mark(origin), Some(Mark { epoch: h.epoch, seq: want }));
                }
            }
            Step::Window { origin, start, len } => {
                let events = self.window(origin % n, start, len);
                self.deliver(origin % n, events);
            }
            Step::Prefix { origin, upto } => {
                let h = &self.hs[origin % n];
                let events = h.range(1, upto as u64 % (h.len() + 1)).to_vec();
                self.deliver(origin % n, events);
            }
            Step::Reversed { origin, start, len } => {
                let mut events = self.window(origin % n, start, len);
                events.reverse();
                self.deliver(origin % n, events);
            }
            Step::Redeliver { back } => {
                if !self.delivered.is_empty() {
                    let (origin, events) = self.delivered[back % self.delivered.len()].clone();
                    self.deliver(origin, events);
                }
            }
            Step::WrongChannel { origin, channel, start, len } => {
                let origin = origin % n;
                let channel = self.wrong_channel(origin, channel);
                let mut events = self.window(origin, start, len);
                if events.is_empty() {
                    events = self.hs[origin].range(1, 1).to_vec();
                }
                match self.log.apply_remote(channel, &events) {
                    Ok(report) => {
                        assert!(matches!(report.refusal, Some(Refusal::WrongChannel { .. })), "{report:?}");
                        assert_eq!(report.applied + report.superseded + report.duplicates, 0);
                        assert!(report.changes.is_empty());
                    }
                    Err(LogError::Refused(Refusal::WrongChannel { .. })) => assert_eq!(channel, RECEIVER),
                    Err(e) => panic!("unexpected error {e}"),
                }
                assert_eq!(State::of(&self.log), before, "a wrong-channel delivery changed the state");
            }
            Step::Snapshot { origin, at, purge } => {
                let origin = origin % n;
                let h = &self.hs[origin];
                let at = at as u64 % (h.len() + 1);
                let purge = purge as u64 % (at + 1);
                let snap = h.origin_log(at, purge).snapshot_own().unwrap();
                assert_eq!(snap.mark, Mark { epoch: h.epoch, seq: at });
                let held = self.mark(origin);
                match self.log.install_snapshot(h.dc, &snap) {
                    Ok(report) => {
                        assert!(
                            held.is_none_or(|m| m.seq <= at),
                            "installed a snapshot behind mark {held:?}"
                        );
                        assert_eq!(report.mark, Some(snap.mark));
                        assert_eq!(self.mark(origin), Some(snap.mark));
                        self.purged_upto[origin] = self.purged_upto[origin].max(purge);
                    }
                    Err(LogError::Refused(Refusal::CursorRegressed { held: h_seq, got })) => {
                        assert_eq!((Some(h_seq), got), (held.map(|m| m.seq), at));
                        assert!(h_seq > at);
                        assert_eq!(State::of(&self.log), before, "a refused snapshot changed the state");
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Step::WrongChannelSnapshot { origin, channel, at } => {
                let origin = origin % n;
                let channel = self.wrong_channel(origin, channel);
                let h = &self.hs[origin];
                let snap = h.origin_log(at as u64 % (h.len() + 1), 0).snapshot_own().unwrap();
                let res = self.log.install_snapshot(channel, &snap);
                assert!(matches!(res, Err(LogError::Refused(Refusal::WrongChannel { .. }))), "{res:?}");
                assert_eq!(State::of(&self.log), before, "a wrong-channel snapshot changed the state");
            }
            Step::PurgeTombstones { origin, floor } => {
                let origin = origin % n;
                let h = &self.hs[origin];
                let floor = floor as u64 % (h.len() + 1);
                self.log.purge_remote_tombstones(h.dc, floor).unwrap();
                let effective = floor.min(self.mark(origin).map_or(0, |m| m.seq));
                self.purged_upto[origin] = self.purged_upto[origin].max(effective);
                let after = State::of(&self.log);
                assert_eq!((&after.instances, &after.marks), (&before.instances, &before.marks));
                let kept: Vec<Tombstone> = before
                    .tombstones
                    .iter()
                    .filter(|t| *t.key.owner_dc != *h.dc || t.seq > effective)
                    .cloned()
                    .collect();
                assert_eq!(after.tombstones, kept, "a tombstone purge removed the wrong tombstones");
            }
        }
        self.check(&before);
    }

    /// Invariants after every step.
    fn check(&mut self, before: &State) {
        let after = State::of(&self.log);
        // 4. Marks never go backwards, and never disappear.
        for (origin, m) in &before.marks {
            let now = after.marks.get(origin).unwrap_or_else(|| panic!("mark of {origin} vanished"));
            assert_eq!(now.epoch, m.epoch, "epoch of {origin} changed");
            assert!(now.seq >= m.seq, "mark of {origin} went back from {m:?} to {now:?}");
        }
        // Nothing of an unknown origin, nothing of the receiver's own.
        let known = |dc: &str| self.hs.iter().any(|h| h.dc == dc);
        assert!(after.marks.keys().all(|dc| known(dc)));
        assert!(after.instances.iter().all(|(_, r)| known(&r.key.owner_dc)));
        assert!(after.tombstones.iter().all(|t| known(&t.key.owner_dc)));
        for (o, h) in self.hs.iter().enumerate() {
            let mark = self.log.mark_of(h.dc);
            let upto = mark.map_or(0, |m| m.seq);
            if let Some(m) = mark {
                assert_eq!(m.epoch, h.epoch);
                assert!(m.seq <= h.len(), "mark {m:?} past the origin's stream");
            }
            for id in IDS {
                let k = key(h.dc, id);
                let held = self.log.held(&k);
                // 3. No resurrection: a consumed DEREGISTER keeps the key dead at its seq.
                for e in h.range(1, upto) {
                    if matches!(e.op, Op::Deregister { .. }) && e.op.key() == &k {
                        let s = self.deregistered.entry((o, id)).or_insert(0);
                        *s = (*s).max(e.seq);
                    }
                }
                if let (Held::Live { seq }, Some(&dead)) = (held, self.deregistered.get(&(o, id))) {
                    assert!(seq > dead, "{id} of {} live at seq {seq} after its DEREGISTER at {dead}", h.dc);
                }
                // The prefix property: the key is exactly the origin's state at the mark.
                match (h.at(id, upto), held) {
                    (None, Held::Absent) => {}
                    (Some(e), Held::Live { seq }) if e.seq == seq => {
                        let (Op::Register(r) | Op::Update(r)) = &e.op else {
                            panic!("{id} live at seq {seq}, which deregistered it");
                        };
                        let got = after.instances.iter().find(|(_, x)| x.key == k).map(|(_, x)| x);
                        assert_eq!(got, Some(r), "{id} holds the wrong record");
                    }
                    (Some(e), Held::Tombstone { seq }) if e.seq == seq => {
                        assert!(matches!(e.op, Op::Deregister { .. }), "tombstone at seq {seq} of a put");
                    }
                    // A purged tombstone: allowed only below a purge floor.
                    (Some(e), Held::Absent) if matches!(e.op, Op::Deregister { .. }) => {
                        assert!(e.seq <= self.purged_upto[o], "tombstone of {id} at {} vanished", e.seq);
                    }
                    (want, got) => panic!("{id} of {} at mark {upto}: want {want:?}, hold {got:?}", h.dc),
                }
            }
        }
    }

    /// The at-least-once retry: each origin's whole stream again, in order.
    fn redeliver_all(&mut self, batch: usize) {
        for o in 0..self.hs.len() {
            let events = self.hs[o].events.clone();
            for chunk in events.chunks(batch) {
                let before = State::of(&self.log);
                self.deliver(o, chunk.to_vec());
                self.check(&before);
            }
        }
    }
}

/// The reference: each origin's stream applied once, in order.
fn reference(hs: &[History]) -> State {
    let mut log = MemLog::new(RECEIVER, 1);
    for h in hs {
        let report = log.apply_remote(h.dc, &h.events).unwrap();
        assert_eq!(report.refusal, None);
        assert_eq!(report.applied + report.superseded, h.events.len());
        // The receiver's view of an origin is the origin's own view of itself.
        let own = h.origin_log(h.len(), 0);
        let mine = |s: &State| -> (Vec<(u64, InstanceRecord)>, Vec<Tombstone>) {
            (
                s.instances.iter().filter(|(_, r)| *r.key.owner_dc == *h.dc).cloned().collect(),
                s.tombstones.iter().filter(|t| *t.key.owner_dc == *h.dc).cloned().collect(),
            )
        };
        assert_eq!(mine(&State::of(&log)), mine(&State::of(&own)));
    }
    State::of(&log)
}

/// Runs a schedule to its end and checks the final state against the reference.
fn run_schedule(hs: &[History], reference: &State, steps: &[Step], batch: usize) -> (State, Vec<u64>) {
    let mut run = Run::new(hs);
    for step in steps {
        run.step(step);
    }
    run.redeliver_all(batch);
    let fin = State::of(&run.log);
    // 1. Converged to the reference: live instances and marks exactly...
    assert_eq!(fin.instances, reference.instances);
    assert_eq!(fin.marks, reference.marks);
    // ...and tombstones exactly, except those a purge allowed to go.
    let floor =
        |t: &Tombstone| hs.iter().position(|h| *h.dc == *t.key.owner_dc).map_or(0, |o| run.purged_upto[o]);
    for t in &fin.tombstones {
        assert!(reference.tombstones.contains(t), "tombstone {t:?} not in the reference");
    }
    for t in &reference.tombstones {
        assert!(t.seq <= floor(t) || fin.tombstones.contains(t), "tombstone {t:?} lost without a purge");
    }
    (fin, run.purged_upto)
}

fn check_schedules(hs: &[History], schedules: &[(Vec<Step>, usize)]) {
    let reference = reference(hs);
    let finals: Vec<(State, Vec<u64>)> =
        schedules.iter().map(|(steps, batch)| run_schedule(hs, &reference, steps, *batch)).collect();
    // 2. Every schedule converges to the same state (tombstones too, where none purged).
    for (fin, purged) in &finals[1..] {
        assert_eq!((&fin.instances, &fin.marks), (&finals[0].0.instances, &finals[0].0.marks));
        if purged.iter().chain(&finals[0].1).all(|p| *p == 0) {
            assert_eq!(fin.tombstones, finals[0].0.tombstones);
        }
    }
}

fn config() -> Config {
    // Named regression tests below pin interesting cases; no files are written.
    Config { cases: 384, failure_persistence: None, ..Config::default() }
}

proptest! {
    #![proptest_config(config())]

    /// Properties 1-5 with event deliveries only.
    #[test]
    fn any_delivery_schedule_converges_without_resurrection(
        hs in histories_strategy(),
        schedules in prop::collection::vec(schedule_strategy(false), SCHEDULES),
    ) {
        check_schedules(&hs, &schedules);
    }

    /// Properties 1-5 with snapshots (also of purged origins) and tombstone purges mixed in.
    #[test]
    fn snapshots_and_purges_keep_convergence_and_no_resurrection(
        hs in histories_strategy(),
        schedules in prop::collection::vec(schedule_strategy(true), SCHEDULES),
    ) {
        check_schedules(&hs, &schedules);
    }
}

fn fixed_history(dc: &'static str, epoch: u64, ops: &[(usize, u8)]) -> History {
    History::build(dc, epoch, ops)
}

/// A key registered, deregistered and purged at the origin: a receiver that only saw the
/// REGISTER learns of the removal from the snapshot alone, and the stale REGISTER replayed
/// afterwards stays dead.
#[test]
fn snapshot_after_purge_removes_what_the_receiver_missed_and_stale_register_stays_dead() {
    // seq 1 REGISTER i0, 2 REGISTER i1, 3 DEREGISTER i0, 4 UPDATE i1.
    let a = fixed_history("dc-a", 9, &[(0, 0), (1, 0), (0, 2), (1, 0)]);
    let b = fixed_history("dc-b", 4, &[(2, 0)]);
    let hs = [a, b];
    let steps = vec![
        Step::Next { origin: 0, len: 1 },
        Step::Snapshot { origin: 0, at: 4, purge: 3 },
        Step::Prefix { origin: 0, upto: 1 },
        Step::Redeliver { back: 0 },
        Step::Next { origin: 1, len: 1 },
    ];
    let mut run = Run::new(&hs);
    run.step(&steps[0]);
    assert_eq!(run.log.held(&key("dc-a", "i0")), Held::Live { seq: 1 });
    run.step(&steps[1]);
    assert_eq!(run.log.held(&key("dc-a", "i0")), Held::Absent);
    for s in &steps[2..] {
        run.step(s);
    }
    assert_eq!(run.log.held(&key("dc-a", "i0")), Held::Absent);
    assert_eq!(run.log.held(&key("dc-a", "i1")), Held::Live { seq: 4 });
    check_schedules(&hs, &[(steps, 2), (vec![], 1)]);
}

/// Deliveries over the wrong channel, and snapshots over it, are refused wholesale, even
/// when the batch would otherwise be exactly the next one.
#[test]
fn wrong_channel_is_refused_even_for_the_next_batch() {
    let hs = [fixed_history("dc-a", 1, &[(0, 0), (0, 2)]), fixed_history("dc-b", 2, &[(0, 0)])];
    let steps: Vec<Step> = (0..4)
        .flat_map(|channel| {
            [
                Step::WrongChannel { origin: 0, channel, start: 0, len: 2 },
                Step::WrongChannelSnapshot { origin: 1, channel, at: 1 },
            ]
        })
        .collect();
    let mut run = Run::new(&hs);
    for s in &steps {
        run.step(s);
    }
    assert_eq!(State::of(&run.log), State::of(&MemLog::new(RECEIVER, 1)));
    check_schedules(&hs, &[(steps, 1)]);
}
