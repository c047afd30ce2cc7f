//! Self-preservation through a real [`Registry`] on a [`ManualClock`] (issue 12 §3): the
//! issue's scenario, one namespace's collapse next to a healthy one, a mass death, and
//! the cap. Clients register and heartbeat through the registry's API, the lease check
//! runs every 200 ms of virtual time, and what the view holds is the verdict.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tandem::clock::ManualClock;
use tandem::config::Config;
use tandem::registry::{Counters, DcFilter, RegisterRequest, Registry, ViewCell};
use tandem::store::{CommitLog, CommitNotice, Committer, CommitterLimits, InlineCommitter, MemStore};

const CHECK_MS: u64 = 200;
const SVC: &str = "svc";

struct Client {
    ns: &'static str,
    id: String,
    every_ms: u64,
    next_ms: u64,
    /// Heartbeats left (`None`: forever).
    beats: Option<u32>,
}

pub struct Sim {
    reg: Arc<Registry>,
    inline: InlineCommitter<MemStore>,
    clock: Arc<ManualClock>,
    clients: Vec<Client>,
}

impl Sim {
    pub fn new() -> Sim {
        let clock = Arc::new(ManualClock::new(0, 1_700_000_000_000));
        let cfg: Config = toml::from_str(
            "dc = \"dc-a\"\ndata_dir = \"/nonexistent/preservation\"\n[protection]\nprotect_threshold = 0.0\n",
        )
        .expect("config");
        let mut store = MemStore::new("dc-a", 1);
        store.bump_index();
        let counters = Arc::new(Counters::default());
        let view = ViewCell::new("dc-a", store.index(), counters.clone());
        let cb_view = view.clone();
        let (inline, handle) = Committer::inline(
            store,
            Box::new(move |n: &CommitNotice| cb_view.follow(n)),
            CommitterLimits::default(),
        );
        let reg = Registry::new(Arc::new(cfg), Arc::new(handle), view, counters, clock.clone());
        Sim { reg, inline, clock, clients: vec![] }
    }

    fn drive<T: 'static>(&mut self, fut: impl Future<Output = T> + 'static) -> T {
        let mut fut: Pin<Box<dyn Future<Output = T>>> = Box::pin(fut);
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            assert!(self.inline.run_round() > 0, "waiting on a committer with nothing queued");
        }
    }

    pub fn now(&self) -> u64 {
        use tandem::clock::Clock;
        self.clock.now_ms()
    }

    /// Registers `ns/svc/id` with `ttl_ms`; it heartbeats every `every_ms` (the first one
    /// `every_ms` after now), `beats` times (`None`: forever).
    pub fn client(&mut self, ns: &'static str, id: &str, ttl_ms: u64, every_ms: u64, beats: Option<u32>) {
        let req = RegisterRequest {
            namespace: Some(ns.into()),
            service: SVC.into(),
            instance_id: Some(id.into()),
            address: "10.0.0.1".into(),
            port: 8080,
            ttl_ms: Some(ttl_ms),
            ..Default::default()
        };
        let reg = self.reg.clone();
        self.drive(async move { reg.register(req).await.map(|_| ()) }).expect("registered");
        let next_ms = self.now() + every_ms;
        self.clients.push(Client { ns, id: id.into(), every_ms, next_ms, beats });
    }

    /// Stops the heartbeats of the clients `pick` chooses.
    pub fn kill(&mut self, pick: impl Fn(&str, &str) -> bool) {
        for c in self.clients.iter_mut().filter(|c| pick(c.ns, &c.id)) {
            c.beats = Some(0);
        }
    }

    pub fn run_until(&mut self, to_ms: u64) {
        while self.now() < to_ms {
            self.clock.advance(CHECK_MS);
            let now = self.now();
            let mut due = vec![];
            for c in &mut self.clients {
                while c.next_ms <= now && c.beats.is_none_or(|b| b > 0) {
                    due.push((c.ns, c.id.clone()));
                    c.next_ms += c.every_ms;
                    if let Some(b) = &mut c.beats {
                        *b -= 1;
                    }
                }
            }
            for (ns, id) in due {
                let reg = self.reg.clone();
                let _ = self.drive(async move { reg.heartbeat(ns, SVC, &id).await.map_err(|e| e.code) });
            }
            let reg = self.reg.clone();
            self.drive(async move { reg.check_leases().await });
        }
    }

    pub fn live(&self, ns: &str, id: &str) -> bool {
        let answer = self.reg.discover(ns, SVC, &DcFilter::All, false).expect("discover");
        answer.instances.iter().any(|i| &*i.instance_id == id)
    }

    /// Runs until `ns/id` is gone; the time it went, or `None` by `to_ms`.
    pub fn gone_by(&mut self, ns: &str, id: &str, to_ms: u64) -> Option<u64> {
        while self.live(ns, id) {
            if self.now() >= to_ms {
                return None;
            }
            let next = self.now() + CHECK_MS;
            self.run_until(next);
        }
        Some(self.now())
    }
}

/// The node's warm-up (one self-preservation window, 60 s by default).
const WARM_MS: u64 = 60_000;
/// How late an expiry may come: two lease checks.
const SLACK_MS: u64 = 2 * CHECK_MS;

#[test]
fn the_issues_scenario_the_dead_instance_expires_within_its_ttl() {
    // 10 healthy clients, ttl 60000, beating every 7.5 s (the SDK's ttl/8), one dead
    // instance with ttl 4000. On main the expectation was 12 renewals a minute per lease
    // (60 s / heartbeat_interval_ms) against 8 made: paused for good, the dead one listed.
    let mut sim = Sim::new();
    sim.run_until(WARM_MS);
    for i in 0..10 {
        sim.client("default", &format!("ok-{i}"), 60_000, 7_500, None);
    }
    sim.run_until(2 * WARM_MS);
    sim.client("default", "dead", 4_000, 500, Some(0));
    let registered = sim.now();
    let gone = sim.gone_by("default", "dead", registered + 120_000);
    assert!(gone.is_some_and(|t| t <= registered + 4_000 + SLACK_MS), "dead one gone at {gone:?}");
    sim.run_until(sim.now() + 2 * WARM_MS);
    assert!((0..10).all(|i| sim.live("default", &format!("ok-{i}"))), "the healthy stay");
}

#[test]
fn one_namespace_collapsing_leaves_expiry_on_in_the_others() {
    // "a" is healthy with one instance that dies; "b" has 40 registrations that never
    // heartbeat and 20 clients that all stop. On main one global decision paused expiry
    // everywhere, so a's dead instance stayed listed.
    let mut sim = Sim::new();
    for i in 0..12 {
        sim.client("a", &format!("ok-{i}"), 30_000, 3_750, None);
    }
    sim.client("a", "dead", 30_000, 3_750, None);
    for i in 0..20 {
        sim.client("b", &format!("ok-{i}"), 30_000, 3_750, None);
    }
    for i in 0..40 {
        sim.client("b", &format!("silent-{i}"), 30_000, 3_750, Some(0));
    }
    sim.run_until(2 * WARM_MS);
    for i in 0..40 {
        assert!(!sim.live("b", &format!("silent-{i}")), "never-heartbeating registrations expire");
    }
    sim.kill(|ns, id| ns == "b" || id == "dead");
    let died = sim.now();
    let gone = sim.gone_by("a", "dead", died + 120_000);
    assert!(gone.is_some_and(|t| t <= died + 30_000 + SLACK_MS), "a's dead one gone at {gone:?}");
    assert!((0..20).all(|i| sim.live("b", &format!("ok-{i}"))), "b's collapse pauses b's expiry");
    assert!((0..12).all(|i| sim.live("a", &format!("ok-{i}"))));
}

#[test]
fn after_a_mass_death_expiry_resumes() {
    // 40 of 100 die (more than 15%); the clients beat every heartbeat_interval_ms (5 s)
    // at the default TTL, so the old rule counted them at 100% too. The pause engages
    // before the dead expire (they park). On main the parked dead stayed in the count:
    // expiry paused for good. Now they leave the count and the survivors release it.
    let mut sim = Sim::new();
    for i in 0..100 {
        sim.client("default", &format!("i-{i}"), 30_000, 5_000, None);
        sim.run_until(sim.now() + 37);
    }
    sim.run_until(2 * WARM_MS);
    sim.kill(|_, id| id.trim_start_matches("i-").parse::<u32>().unwrap() < 40);
    let died = sim.now();
    sim.run_until(died + 31_000);
    assert!(sim.live("default", "i-0"), "self-preservation engaged before the dead expired");
    for i in 0..40 {
        let gone = sim.gone_by("default", &format!("i-{i}"), died + 30_000 + 2 * WARM_MS);
        assert!(gone.is_some(), "i-{i} expired after the mass death");
    }
    assert!((40..100).all(|i| sim.live("default", &format!("i-{i}"))), "the survivors stay");
}

#[test]
fn a_pause_with_nothing_renewing_ends_at_the_cap() {
    // Every client stops (a partition from all of them): expiry pauses, and stays paused
    // while nothing renews, but only for self_preservation_max_pause_ms (15 min by
    // default). On main it stayed paused for good.
    let mut sim = Sim::new();
    for i in 0..20 {
        sim.client("default", &format!("i-{i}"), 30_000, 3_750, None);
    }
    sim.run_until(2 * WARM_MS);
    sim.kill(|_, _| true);
    let died = sim.now();
    sim.run_until(died + 10 * WARM_MS);
    assert!((0..20).all(|i| sim.live("default", &format!("i-{i}"))), "paused: nothing expires");
    let gone = sim.gone_by("default", "i-0", died + 16 * WARM_MS + SLACK_MS);
    assert!(gone.is_some_and(|t| t >= died + 15 * WARM_MS), "expiry resumed at the cap: {gone:?}");
}
