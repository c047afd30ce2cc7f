//! Running drills: the environment ([`Cluster`]), the seeded workload and fault plan, the
//! observers, the [`Checker`], and the report. Also `tandem chaos`'s command line.
//!
//! One drill, in order:
//! 1. print the seed; set up the two DCs ([`Cluster::start`]);
//! 2. start, per DC, an executor of the schedule, a heartbeater for its live ephemeral
//!    instances and a poller of its views and status (all bounded by timeouts);
//! 3. run the fault plan; record every fault window, process event and recovery point;
//! 4. stop the workload; wait (bounded by the recovery budget) until both DCs' views are
//!    identical and their marks caught up; take the final observations;
//! 5. let the checker judge; write the table, the JSON report and the timeline SVG.
//!
//! Where things are: this file runs one drill ([`run_drill`]); `observers` holds the tasks
//! that run beside the fault plan (executors, heartbeaters, pollers, progress) and the
//! waits on the DCs; `figures` turns the checker's report and the status samples into the
//! report's figures; `expectations` judges what each drill expects beyond the invariants;
//! `leases` is `failover-leases`' load of 10,000 leases; `cli` is `tandem chaos`'s command
//! line ([`main`]).

mod cli;
mod expectations;
mod figures;
mod leases;
mod observers;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::api::Api;
use crate::checker::{
    divergence, view_set, CheckReport, Checker, CheckerConfig, HealthRules, InstanceRef, Ms, ProcessEvent,
    ServiceView, StatusView, ViewScope,
};
use crate::cluster::{Cluster, Environment, NodeTuning, SetupError, DRAIN};
use crate::ledger::{FaultLedger, StepEffect};
use crate::plan::{plan, Action, Cut, DrillKind, Plan};
use crate::report::{DrillReport, Figures, Sample};
use crate::workload::{schedule, schedule_fixed, Scheduled, WorkloadConfig};

pub use cli::{main, parse_duration_ms};
use figures::{figures, snapshot_metrics};
use observers::{
    advancer, executor, heartbeater, poll_status, poll_view, poller, progress, remove_leftovers,
    wait_caught_up,
};

/// Timeout of one client write.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of one heartbeat.
const HB_TIMEOUT: Duration = Duration::from_secs(1);
/// Timeout of one discovery or status poll. Generous: a loaded CI machine must not turn a
/// slow answer into an availability violation.
const POLL_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause between polling rounds of one DC.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Most status samples kept for the plot (older ones are thinned).
const SAMPLES_MAX: usize = 20_000;
/// `node-disk-loss`: the members snapshot every this many Raft entries (and keep as many
/// behind the snapshot).
const NODE_DISK_LOSS_SNAPSHOT_EVERY: u64 = 50;

/// Settings of one drill run.
#[derive(Clone, Debug)]
pub struct DrillOptions {
    pub kind: DrillKind,
    pub seed: u64,
    /// `None`: the short version. `Some`: the long version over this span.
    pub span_ms: Option<u64>,
    /// Where configs, data, logs and the report go (default: a fresh temp dir).
    pub dir: Option<PathBuf>,
    pub env: Environment,
    pub recovery_budget_ms: u64,
    /// No progress lines.
    pub quiet: bool,
    /// The ACL token every request presents (`--token`, `TANDEM_TOKEN`): for targets with
    /// ACLs on. It must be valid at both DCs (docs/chaos.md).
    pub token: Option<String>,
    /// Processes per DC: 1, or the members of a Raft group (sandbox only).
    pub nodes: usize,
}

impl DrillOptions {
    /// The short version of `kind` in the sandbox.
    pub fn short(kind: DrillKind, seed: u64) -> DrillOptions {
        DrillOptions {
            kind,
            seed,
            span_ms: None,
            dir: None,
            env: Environment::Sandbox,
            recovery_budget_ms: 20_000,
            quiet: false,
            token: None,
            nodes: kind.nodes_default(),
        }
    }
}

/// Aborts the tasks when dropped (a drill interrupted by Ctrl-C or a panic leaves nothing
/// behind).
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

struct Ctx {
    start: Instant,
    checker: Mutex<Checker>,
    api: Api,
    /// The DCs' base URLs; a split moves one to the replacement process.
    bases: [parking_lot::RwLock<String>; 2],
    /// Every member's base URL, per DC (one entry for a DC of one node).
    members: [Vec<String>; 2],
    /// Per DC of several members: the Raft term its status last showed, and when that
    /// poll was invoked (a term the drill did not cause is a leader change all the same).
    terms: [Mutex<Option<(u64, Ms)>>; 2],
    names: [String; 2],
    ns: String,
    services: Vec<String>,
    heartbeating: [Mutex<BTreeSet<InstanceRef>>; 2],
    samples: Mutex<Vec<Sample>>,
    stop_workload: AtomicBool,
    stop_polls: AtomicBool,
    stop_heartbeats: AtomicBool,
    heartbeat_interval: Duration,
    quiet: bool,
    polls: AtomicU64,
}

impl Ctx {
    fn now(&self) -> Ms {
        self.start.elapsed().as_millis() as Ms
    }

    fn base(&self, side: usize) -> String {
        self.bases[side].read().clone()
    }

    fn say(&self, msg: &str) {
        if !self.quiet {
            println!("[{:>6.1}s] {msg}", self.now() as f64 / 1000.0);
        }
    }
}
fn fresh_dir(opts: &DrillOptions) -> anyhow::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = match &opts.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join("tandem-chaos").join(format!(
            "{}-{:016x}-{}-{}",
            opts.kind,
            opts.seed,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )),
    };
    if dir.exists() {
        // A previous run's data would break the "fresh history" assumption.
        for sub in ["dc-a", "dc-b", "certs"] {
            let _ = std::fs::remove_dir_all(dir.join(sub));
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn mode_name(opts: &DrillOptions) -> String {
    match opts.span_ms {
        None => "short".into(),
        Some(ms) => format!("long {}s", ms / 1000),
    }
}

fn env_name(env: &Environment, nodes: usize) -> String {
    match env {
        Environment::Sandbox if nodes > 1 => {
            format!("sandbox (loopback + UDP relays), a group of {nodes} nodes per DC")
        }
        Environment::Sandbox => "sandbox (loopback + UDP relays)".into(),
        Environment::Netns => "sandbox in network namespaces".into(),
        Environment::Targets { hook: Some(h), .. } => format!("targets (fault hook {h})"),
        Environment::Targets { hook: None, .. } => "targets (no fault hook: faults marked only)".into(),
    }
}

fn replay_cmd(opts: &DrillOptions) -> String {
    let mut s = format!("tandem chaos {} --seed {:#x}", opts.kind, opts.seed);
    if let Some(ms) = opts.span_ms {
        s.push_str(&format!(" --duration {}s", ms / 1000));
    }
    if opts.nodes != opts.kind.nodes_default() {
        s.push_str(&format!(" --nodes {}", opts.nodes));
    }
    match &opts.env {
        Environment::Sandbox => {}
        Environment::Netns => s.push_str(" --netns"),
        Environment::Targets { a, b, hook } => {
            s.push_str(&format!(" --target-a {a} --target-b {b}"));
            if let Some(h) = hook {
                s.push_str(&format!(" --fault-hook '{h}'"));
            }
        }
    }
    s
}

fn skipped(opts: &DrillOptions, reason: String, started: Instant) -> DrillReport {
    DrillReport {
        drill: opts.kind.name().into(),
        seed: opts.seed,
        seed_hex: format!("{:#018x}", opts.seed),
        mode: mode_name(opts),
        environment: env_name(&opts.env, opts.nodes),
        dcs: ["-".into(), "-".into()],
        namespace: String::new(),
        span_ms: 0,
        elapsed_ms: started.elapsed().as_millis() as u64,
        result: "skipped".into(),
        skipped_reason: Some(reason),
        invariants: Vec::new(),
        expectations: Vec::new(),
        figures: Figures::default(),
        faults: Vec::new(),
        notes: Vec::new(),
        dir: String::new(),
        replay: replay_cmd(opts),
    }
}

/// Runs one drill against real `tandem` processes started from `bin` (or the targets).
/// `Err` means the drill could not run (setup failed); a skipped drill and a failed
/// invariant are reports.
pub async fn run_drill(opts: &DrillOptions, bin: &Path) -> anyhow::Result<DrillReport> {
    let started = Instant::now();
    let say = |m: &str| {
        if !opts.quiet {
            println!("{m}");
        }
    };
    say(&format!(
        "drill {} ({}) | seed {:#018x} | {} | {}",
        opts.kind,
        opts.kind.about(),
        opts.seed,
        mode_name(opts),
        env_name(&opts.env, opts.nodes)
    ));
    if let Some(reason) = opts.kind.refuses_nodes(opts.nodes) {
        let r = skipped(opts, reason, started);
        say(&format!("SKIPPED: {}", r.skipped_reason.clone().unwrap_or_default()));
        return Ok(r);
    }
    if matches!(opts.env, Environment::Netns) && opts.kind.needs_relay() {
        let r = skipped(
            opts,
            format!(
                "{} needs the user-space relay (one-way cuts, packet faults); not available with --netns",
                opts.kind
            ),
            started,
        );
        say(&format!("SKIPPED: {}", r.skipped_reason.clone().unwrap_or_default()));
        return Ok(r);
    }
    let dir = fresh_dir(opts)?;
    let mut tuning = NodeTuning {
        purge_grace_ms: opts.kind.purge_grace_ms(),
        relay_members: opts.kind.cuts_members(),
        ..NodeTuning::default()
    };
    if opts.kind == DrillKind::FailoverLeases {
        // Ten thousand leases beat once a second, in batches; they may miss a few rounds
        // while a leader dies, never enough to turn suspect.
        tuning = NodeTuning {
            heartbeat_interval_ms: 1_000,
            suspect_after_ms: 3_000,
            unhealthy_after_ms: 6_000,
            expire_after_ms: 12_000,
            self_preservation_window_ms: 8_000,
            ..tuning
        };
    }
    if opts.kind == DrillKind::RollingUpgrade {
        tuning.previous_release = true;
    }
    if matches!(opts.kind, DrillKind::NodeDiskLoss | DrillKind::AddRemoveNode | DrillKind::BackupRestore) {
        // A few hundred entries a drill: a member that lost its disk (or a new one) is
        // behind the leader's first log entry, so it comes back from a snapshot.
        tuning.snapshot_every_entries = Some(NODE_DISK_LOSS_SNAPSHOT_EVERY);
    }
    if let Environment::Targets { .. } = opts.env {
        tuning = NodeTuning::default();
    }
    let api = Api::with_token(opts.token.as_deref()).map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    let mut cluster =
        match Cluster::start(opts.env.clone(), bin, &dir, &tuning, opts.seed, api, opts.nodes).await {
            Ok(c) => c,
            Err(SetupError::Skipped(reason)) => {
                let r = skipped(opts, reason, started);
                say(&format!("SKIPPED: {}", r.skipped_reason.clone().unwrap_or_default()));
                return Ok(r);
            }
            Err(SetupError::Failed(e)) => return Err(e.context(format!("setting up drill {}", opts.kind))),
        };
    let names = [cluster.dcs[0].name.clone(), cluster.dcs[1].name.clone()];
    let bases = [cluster.dcs[0].base.clone(), cluster.dcs[1].base.clone()];
    let caps = cluster.capabilities();
    let the_plan: Plan = plan(opts.kind, opts.seed, opts.span_ms, caps);
    let mut notes = Vec::new();
    if matches!(opts.env, Environment::Targets { hook: None, .. }) {
        notes.push(
            "no --fault-hook was given: fault windows are marked, but no fault was injected".to_owned(),
        );
    }
    let ns = match opts.env {
        Environment::Targets { .. } => format!("chaos-{:08x}", rand::random::<u32>()),
        Environment::Sandbox | Environment::Netns => "drill".into(),
    };
    // Each recovery may add up to the budget (the drill waits for catch-up before the next
    // fault), so the schedule covers that too; the drill stops it when the plan is done.
    let recoveries = the_plan.actions.iter().filter(|a| !a.action.starts_fault()).count() as u64;
    let mut wl = WorkloadConfig::new(the_plan.span_ms + recoveries * opts.recovery_budget_ms);
    wl.ttl_ms = tuning.expire_after_ms;
    let sched = schedule(opts.seed, &wl);
    let fixed = schedule_fixed(opts.seed, &wl);
    let mut services = wl.services.clone();
    services.extend(wl.fixed_service.clone());
    if let Some(svc) = wl.services.first() {
        cluster.set_probe_target(&ns, svc);
    }
    let lease_stats = Arc::new(Mutex::new(leases::LeaseStats::default()));
    let mut bulk_ids = Arc::new(Vec::new());
    if opts.kind == DrillKind::FailoverLeases && cluster_did_processes(&opts.env) {
        let t = Instant::now();
        let ids =
            leases::register(cluster.api(), &bases[0], &ns, leases::BULK_LEASES, tuning.expire_after_ms)
                .await
                .context("registering the leases")?;
        let register_ms = t.elapsed().as_millis() as u64;
        let every = Duration::from_millis(tuning.heartbeat_interval_ms);
        let settle_ms = leases::settle(cluster.api(), &bases[0], &ns, &ids, every)
            .await
            .context("renewing the leases until all are healthy")?;
        let mut s = lease_stats.lock();
        (s.registered, s.register_ms, s.settle_ms) = (ids.len(), register_ms, settle_ms);
        say(&format!(
            "{} leases registered at {} in {register_ms}ms, all healthy {settle_ms}ms later",
            s.registered, names[0]
        ));
        drop(s);
        bulk_ids = Arc::new(ids);
    }
    say(&format!(
        "dir {} | {} {} | {} {} | namespace {ns} | ~{} ops/s per DC, {} faults, span {:.1}s",
        dir.display(),
        names[0],
        bases[0],
        names[1],
        bases[1],
        wl.ops_per_sec,
        the_plan.actions.iter().filter(|a| a.action.starts_fault()).count(),
        the_plan.span_ms as f64 / 1000.0
    ));

    let mut ccfg = CheckerConfig::new(&[&names[0], &names[1]]);
    ccfg.recovery_budget_ms = opts.recovery_budget_ms;
    ccfg.hold_ms = POLL_TIMEOUT.as_millis() as u64 + 3_000;
    ccfg.reused_services.extend(wl.fixed_service.clone());
    if matches!(opts.env, Environment::Sandbox | Environment::Netns) {
        // The nodes' settings are ours: judge health, leases and staleness by them.
        ccfg.health = Some(HealthRules {
            suspect_ms: tuning.suspect_after_ms,
            unhealthy_ms: tuning.unhealthy_after_ms,
            expire_ms: tuning.expire_after_ms,
            check_interval_ms: tuning.check_interval_ms,
            ..HealthRules::sandbox()
        });
        ccfg.stale_after_ms = Some(tuning.stale_after_ms);
    }
    let ctx = Arc::new(Ctx {
        start: Instant::now(),
        checker: Mutex::new(Checker::new(ccfg)),
        api: cluster.api().clone(),
        bases: bases.clone().map(parking_lot::RwLock::new),
        members: [cluster.dcs[0].node_bases(), cluster.dcs[1].node_bases()],
        terms: [Mutex::new(None), Mutex::new(None)],
        names: names.clone(),
        ns: ns.clone(),
        services,
        heartbeating: [Mutex::new(BTreeSet::new()), Mutex::new(BTreeSet::new())],
        samples: Mutex::new(Vec::new()),
        stop_workload: AtomicBool::new(false),
        stop_polls: AtomicBool::new(false),
        stop_heartbeats: AtomicBool::new(false),
        heartbeat_interval: Duration::from_millis(tuning.heartbeat_interval_ms),
        quiet: opts.quiet,
        polls: AtomicU64::new(0),
    });
    {
        let mut c = ctx.checker.lock();
        for n in &names {
            c.process(n, 0, ProcessEvent::Spawned);
            c.process(n, 0, ProcessEvent::Ready);
        }
    }
    let mut per_side: [Vec<Scheduled>; 2] = [Vec::new(), Vec::new()];
    for s in sched {
        per_side[s.side].push(s);
    }
    let [ops_a, ops_b] = per_side;
    // One task per reused id, so that a long race never delays another id's schedule.
    let mut per_id: std::collections::BTreeMap<(usize, InstanceRef), Vec<Scheduled>> = Default::default();
    for s in fixed {
        per_id.entry((s.side, s.op.instance().clone())).or_default().push(s);
    }
    let mut background = Tasks(vec![
        tokio::spawn(advancer(ctx.clone())),
        tokio::spawn(progress(ctx.clone(), Duration::from_secs(2))),
    ]);
    let pollers = Tasks(vec![tokio::spawn(poller(ctx.clone(), 0)), tokio::spawn(poller(ctx.clone(), 1))]);
    let mut heartbeaters =
        Tasks(vec![tokio::spawn(heartbeater(ctx.clone(), 0)), tokio::spawn(heartbeater(ctx.clone(), 1))]);
    if !bulk_ids.is_empty() {
        heartbeaters.0.push(tokio::spawn(leases::beat(ctx.clone(), bulk_ids.clone(), lease_stats.clone())));
        heartbeaters.0.push(tokio::spawn(leases::watch(ctx.clone(), lease_stats.clone())));
    }
    let mut executors = Tasks(vec![
        tokio::spawn(executor(ctx.clone(), 0, ops_a)),
        tokio::spawn(executor(ctx.clone(), 1, ops_b)),
    ]);
    for ((side, _), ops) in per_id {
        executors.0.push(tokio::spawn(executor(ctx.clone(), side, ops)));
    }

    // The fault plan.
    let mut ledger = FaultLedger::new(names.clone());
    let mut last_fault_end: Ms = 0;
    let mut purge_floor_before_heal = [0u64; 2];
    // Real time runs `shift` behind the plan once the drill waited for a recovery.
    let mut shift: u64 = 0;
    for (i, step) in the_plan.actions.iter().enumerate() {
        tokio::time::sleep_until(ctx.start + Duration::from_millis(step.at_ms + shift)).await;
        // A leader kill: the clients move off the member first (a DC's other members keep
        // answering; only writes wait for the next leader).
        if cluster.prepare(step.action).await.with_context(|| format!("fault {:?}", step.action))? {
            let _ = follow_bases(&ctx, &cluster);
            tokio::time::sleep(DRAIN).await;
        }
        let t0 = ctx.now();
        if ledger.breaks_quiet(step.action) {
            ctx.checker.lock().fault_started(t0);
        }
        // Without control of the processes (targets without a hook) faults are only marked:
        // telling the checker about kills that did not happen would excuse real failures.
        let real = cluster.controls_processes();
        let process_events = if real { FaultLedger::process_events(step.action) } else { Default::default() };
        for (side, ev) in process_events.before {
            ctx.checker.lock().process(&names[side], t0, ev);
        }
        if let (true, Action::Resume { side }) = (real, step.action) {
            // The process may run from the moment the signal is sent.
            ctx.checker.lock().resuming(t0, &names[side]);
        }
        if real && matches!(step.action, Action::Heal) {
            // Conservative: the link may flow again from the moment the heal starts.
            let mut c = ctx.checker.lock();
            c.link(t0, &names[0], &names[1], false);
            c.link(t0, &names[1], &names[0], false);
        }
        if matches!(step.action, Action::Heal) {
            for (side, floor) in purge_floor_before_heal.iter_mut().enumerate() {
                let samples = ctx.samples.lock();
                *floor = (*floor)
                    .max(samples.iter().filter(|s| s.side == side).map(|s| s.purge_floor).max().unwrap_or(0));
            }
        }
        let note = cluster.apply(step.action).await.with_context(|| format!("fault {:?}", step.action))?;
        // A split moved a DC to its replacement: the clients follow before the checker hears
        // of it (a request read the base before its invocation time). Times are in ms: a
        // request that read the old base in the same ms as the switch must not count as
        // invoked after the declaration, so the declaration waits for the next ms.
        let moved_at = follow_bases(&ctx, &cluster);
        if moved_at.is_some() {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let t1 = ctx.now();
        // A split's replacement answers every request that read the new base: from the ms
        // after the switch, not from the declaration 3 ms later (a heartbeat in between got
        // the replacement's "unknown instance" and was judged against the old process).
        let t_after = match (step.action, moved_at) {
            (Action::Split { .. }, Some(at)) => at,
            _ => t1,
        };
        let label = ledger.label(step.action);
        ctx.say(&format!("fault: {label}{}", note.map(|n| format!(" ({n})")).unwrap_or_default()));
        for (side, ev) in process_events.after {
            ctx.checker.lock().process(&names[side], t_after, ev);
        }
        if let (true, Action::Cut(cut)) = (real, step.action) {
            // The cut is certain once applied.
            let mut c = ctx.checker.lock();
            if matches!(cut, Cut::Both | Cut::AToB) {
                c.link(t1, &names[0], &names[1], true);
            }
            if matches!(cut, Cut::Both | Cut::BToA) {
                c.link(t1, &names[1], &names[0], true);
            }
        }
        if let StepEffect::Ended { quiet } = ledger.record(step.action, t0, t1) {
            last_fault_end = t1;
            if quiet {
                ctx.checker.lock().recovery_point(t1, &label);
                // Measure every recovery: hold the next fault until the DCs caught up (or
                // the budget ran out). Flapping is about not letting them.
                if let Some(next) = the_plan.actions.get(i + 1) {
                    if opts.kind != DrillKind::FlappingLink {
                        match wait_caught_up(&ctx, Duration::from_millis(opts.recovery_budget_ms)).await {
                            Some(ms) => ctx.say(&format!("caught up {ms}ms after {label}")),
                            None => ctx.say(&format!("NOT caught up within the budget after {label}")),
                        }
                        let planned = next.at_ms + shift;
                        shift += ctx.now().saturating_sub(planned);
                    }
                }
            }
        }
    }
    let faults = ledger.windows(ctx.now());

    // Quiescence: the schedule ends, then the final convergence.
    tokio::time::sleep_until(ctx.start + Duration::from_millis(the_plan.span_ms + shift)).await;
    ctx.stop_workload.store(true, Ordering::Relaxed);
    let workload_end = ctx.now();
    // Bounded: every operation has a timeout.
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        for h in executors.0.iter() {
            while !h.is_finished() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await;
    drop(executors);
    ctx.stop_polls.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(POLL_TIMEOUT * 12, async {
        for h in pollers.0.iter() {
            while !h.is_finished() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await;
    drop(pollers);
    ctx.say("workload stopped; waiting for convergence");
    let budget = Duration::from_millis(opts.recovery_budget_ms);
    let deadline = Instant::now() + budget;
    let mut final_from;
    let mut converged_at: Option<Ms> = None;
    let mut last_diff: Vec<String> = Vec::new();
    loop {
        final_from = ctx.now();
        let mut views: [std::collections::BTreeMap<String, ServiceView>; 2] = Default::default();
        let mut statuses: [Option<StatusView>; 2] = [None, None];
        for side in 0..2 {
            for svc in &ctx.services {
                if let Some(v) = poll_view(&ctx, side, svc, ViewScope::All).await {
                    views[side].insert(svc.clone(), v);
                }
            }
            statuses[side] = poll_status(&ctx, side).await.map(|(s, _)| s);
        }
        if let (Some(sa), Some(sb)) = (&statuses[0], &statuses[1]) {
            if views[0].len() == ctx.services.len() && views[1].len() == ctx.services.len() {
                let (va, vb) = (view_set(views[0].iter()), view_set(views[1].iter()));
                match divergence((&names[0], &va, sa), (&names[1], &vb, sb), 5) {
                    None => {
                        converged_at = Some(ctx.now());
                        break;
                    }
                    Some(d) => last_diff = d,
                }
            }
        }
        if Instant::now() > deadline {
            ctx.say(&format!("no convergence within {budget:?}: {}", last_diff.join("; ")));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !bulk_ids.is_empty() {
        leases::peer_end(&ctx, &lease_stats).await;
    }
    ctx.stop_heartbeats.store(true, Ordering::Relaxed);
    drop(heartbeaters);
    background.0.iter().for_each(JoinHandle::abort);
    background.0.clear();
    if let Some(c) = converged_at {
        ctx.say(&format!(
            "converged {}ms after the workload stopped, {}ms after the last heal",
            c.saturating_sub(workload_end),
            c.saturating_sub(last_fault_end)
        ));
    }

    // Figures that need the live cluster.
    let mut cleanup_note = None;
    if let Environment::Targets { .. } = opts.env {
        let n = remove_leftovers(&ctx).await;
        cleanup_note =
            Some(format!("removed the {n} instances the drill left in namespace {ns} of your deployment"));
    }
    let relay = cluster.relay_totals();
    let metrics_snapshots = snapshot_metrics(&ctx.api, &[ctx.base(0), ctx.base(1)]).await;
    let split_checks = cluster.split_checks().to_vec();
    let failovers = cluster.failovers().to_vec();
    let isolations = cluster.isolations().to_vec();
    let rolls = cluster.rolls().to_vec();
    let restores = cluster.restores().to_vec();
    let probes_visible =
        if opts.kind.cuts_members() { cluster.probe_visible(&ns).await } else { Ok(Default::default()) };
    let logs: Vec<String> =
        cluster.dcs.iter().flat_map(|d| d.log_paths().map(|p| p.display().to_string())).collect();
    cluster.shutdown().await;

    let check: CheckReport = {
        let c = std::mem::replace(&mut *ctx.checker.lock(), Checker::new(CheckerConfig::new(&[])));
        c.finish(final_from)
    };
    let samples = ctx.samples.lock().clone();
    let figures = figures(&check, &samples, relay, converged_at.map(|c| c.saturating_sub(workload_end)));
    let expectations = if cluster_did_processes(&opts.env) {
        expectations::expectations(&expectations::Seen {
            kind: opts.kind,
            names: &names,
            plan: &the_plan,
            purge_floor_before_heal,
            figures: &figures,
            metrics_snapshots,
            split_checks: &split_checks,
            failovers: &failovers,
            isolations: &isolations,
            rolls: &rolls,
            restores: &restores,
            probes_visible: &probes_visible,
            leases: &lease_stats.lock(),
        })
    } else {
        Vec::new()
    };
    let passed = check.passed() && expectations.iter().all(|e| e.passed);
    let mut report = DrillReport {
        drill: opts.kind.name().into(),
        seed: opts.seed,
        seed_hex: format!("{:#018x}", opts.seed),
        mode: mode_name(opts),
        environment: env_name(&opts.env, opts.nodes),
        dcs: names.clone(),
        namespace: ns,
        span_ms: the_plan.span_ms,
        elapsed_ms: started.elapsed().as_millis() as u64,
        result: if passed { "pass".into() } else { "fail".into() },
        skipped_reason: None,
        invariants: DrillReport::invariant_rows(&check),
        expectations,
        figures,
        faults,
        notes,
        dir: dir.display().to_string(),
        replay: replay_cmd(opts),
    };
    if check.observations_late > 0 {
        report.notes.push(format!(
            "{} observations arrived later than the checker's hold and were judged out of order",
            check.observations_late
        ));
    }
    if !logs.is_empty() {
        report.notes.push(format!("node logs: {}", logs.join(", ")));
    }
    report.notes.extend(cleanup_note);
    let json_path = dir.join("report.json");
    let svg_path = dir.join("timeline.svg");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    std::fs::write(&svg_path, crate::report::timeline_svg(&report, &samples))?;
    if passed {
        // Keep configs, logs and the report; drop the data.
        for d in &names {
            let _ = std::fs::remove_dir_all(dir.join(d).join("data"));
        }
    }
    if !opts.quiet {
        print!("{}", report.table());
        println!("report: {} | timeline: {}", json_path.display(), svg_path.display());
    }
    Ok(report)
}

/// The drill's clients use the member each DC's [`Cluster`] names. Whether one moved.
/// Moves the clients to the DCs' current bases; returns when the last move counts from
/// (the ms after its switch), if one moved.
fn follow_bases(ctx: &Ctx, cluster: &Cluster) -> Option<u64> {
    let mut moved = None;
    for side in 0..2 {
        if *ctx.bases[side].read() != cluster.dcs[side].base {
            *ctx.bases[side].write() = cluster.dcs[side].base.clone();
            // After the ms of the switch: a read that took the old base in it is before.
            let at = ctx.now() + 1;
            ctx.checker.lock().client_moved(&ctx.names[side], at);
            moved = Some(at);
        }
    }
    moved
}

fn cluster_did_processes(env: &Environment) -> bool {
    match env {
        Environment::Sandbox | Environment::Netns => true,
        Environment::Targets { hook, .. } => hook.is_some(),
    }
}
