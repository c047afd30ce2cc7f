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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::api::Api;
use crate::checker::{
    divergence, view_set, CheckReport, Checker, CheckerConfig, InstanceRef, Ms, OpKind, Outcome,
    ProcessEvent, ServiceView, StatusObservation, StatusView, ViewObservation, ViewScope,
};
use crate::cluster::{Cluster, Environment, NodeTuning, SetupError};
use crate::ledger::{FaultLedger, StepEffect};
use crate::plan::{plan, Action, DrillKind, Plan};
use crate::report::{DrillReport, Expectation, Figures, Quantiles, RecoveryRow, Sample};
use crate::workload::{schedule, PlannedOp, Scheduled, WorkloadConfig};

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
    bases: [String; 2],
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

    fn say(&self, msg: &str) {
        if !self.quiet {
            println!("[{:>6.1}s] {msg}", self.now() as f64 / 1000.0);
        }
    }
}

fn sample_from(t_ms: u64, side: usize, peer: &str, v: &Value) -> Sample {
    let u = |p: &str| v.pointer(p).and_then(Value::as_u64);
    let inbound = |k: &str| v.pointer(&format!("/peers/{peer}/inbound/{k}")).and_then(Value::as_u64);
    Sample {
        t_ms,
        side,
        instances: v
            .get("instances")
            .and_then(Value::as_object)
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum()),
        lag_events: 0,
        reported_lag_events: inbound("lag_events").unwrap_or(0),
        applied_peer_seq: v.pointer(&format!("/applied/{peer}/seq")).and_then(Value::as_u64).unwrap_or(0),
        lag_ms_p50: inbound("lag_ms_p50"),
        lag_ms_p99: inbound("lag_ms_p99"),
        events_applied: inbound("events_applied").unwrap_or(0),
        snapshots_sent: v
            .pointer(&format!("/peers/{peer}/outbound/snapshots_sent"))
            .and_then(Value::as_u64)
            .unwrap_or(0),
        snapshots_installed: inbound("snapshots_installed").unwrap_or(0),
        purge_floor: u("/log/purge_floor").unwrap_or(0),
        last_seq: u("/log/last_seq").unwrap_or(0),
    }
}

async fn poll_status(ctx: &Ctx, side: usize) -> Option<(StatusView, Value)> {
    let invoked = ctx.now();
    let r = ctx.api.status(&ctx.bases[side], POLL_TIMEOUT).await;
    let completed = ctx.now();
    let (result, raw) = match r {
        Ok((s, raw)) => (Ok(s), Some(raw)),
        Err(e) => (Err(e), None),
    };
    ctx.checker.lock().observe_status(StatusObservation {
        dc: ctx.names[side].clone(),
        invoked,
        completed,
        result: result.clone(),
    });
    let raw = raw?;
    let mut sample = sample_from(completed, side, &ctx.names[1 - side], &raw);
    let mut samples = ctx.samples.lock();
    if let Some(peer) = samples.iter().rev().find(|s| s.side != side) {
        sample.lag_events = peer.last_seq.saturating_sub(sample.applied_peer_seq);
    }
    if samples.len() >= SAMPLES_MAX {
        let mut keep = false;
        samples.retain(|_| {
            keep = !keep;
            keep
        });
    }
    samples.push(sample);
    Some((result.ok()?, raw))
}

async fn poll_view(ctx: &Ctx, side: usize, service: &str, scope: ViewScope) -> Option<ServiceView> {
    let invoked = ctx.now();
    let r = ctx.api.view(&ctx.bases[side], &ctx.ns, service, scope, POLL_TIMEOUT).await;
    let completed = ctx.now();
    ctx.polls.fetch_add(1, Ordering::Relaxed);
    ctx.checker.lock().observe_view(ViewObservation {
        dc: ctx.names[side].clone(),
        service: service.to_owned(),
        scope,
        invoked,
        completed,
        result: r.clone(),
    });
    r.ok()
}

async fn poller(ctx: Arc<Ctx>, side: usize) {
    let mut k = 0usize;
    while !ctx.stop_polls.load(Ordering::Relaxed) {
        for svc in &ctx.services {
            poll_view(&ctx, side, svc, ViewScope::All).await;
        }
        let svc = ctx.services[k % ctx.services.len()].clone();
        poll_view(&ctx, side, &svc, ViewScope::Policy).await;
        poll_status(&ctx, side).await;
        k += 1;
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn executor(ctx: Arc<Ctx>, side: usize, ops: Vec<Scheduled>) {
    let dc = ctx.names[side].clone();
    let base = ctx.bases[side].clone();
    for s in ops {
        tokio::time::sleep_until(ctx.start + Duration::from_millis(s.at_ms)).await;
        if ctx.stop_workload.load(Ordering::Relaxed) {
            break;
        }
        let ns = ctx.ns.clone();
        match s.op {
            PlannedOp::Register { instance, persistent, ttl_ms, address, port } => {
                let id = ctx.checker.lock().invoke(
                    &dc,
                    &instance,
                    OpKind::Register { persistent, ttl_ms },
                    ctx.now(),
                );
                let out = ctx
                    .api
                    .register(
                        &base,
                        &ns,
                        &instance.service,
                        &instance.id,
                        &address,
                        port,
                        persistent,
                        ttl_ms,
                        OP_TIMEOUT,
                    )
                    .await;
                let heartbeat = !persistent && !matches!(out, Outcome::Failed { .. });
                ctx.checker.lock().complete(id, ctx.now(), out);
                if heartbeat {
                    ctx.heartbeating[side].lock().insert(instance);
                }
            }
            PlannedOp::Deregister { instance } => {
                ctx.heartbeating[side].lock().remove(&instance);
                let id = ctx.checker.lock().invoke(&dc, &instance, OpKind::Deregister, ctx.now());
                let out = ctx.api.deregister(&base, &ns, &instance.service, &instance.id, OP_TIMEOUT).await;
                ctx.checker.lock().complete(id, ctx.now(), out);
            }
            PlannedOp::SetStatus { instance, status } => {
                let id = ctx.checker.lock().invoke(
                    &dc,
                    &instance,
                    OpKind::SetStatus { status: status.to_owned() },
                    ctx.now(),
                );
                let out =
                    ctx.api.set_status(&base, &ns, &instance.service, &instance.id, status, OP_TIMEOUT).await;
                ctx.checker.lock().complete(id, ctx.now(), out);
            }
            PlannedOp::StopHeartbeat { instance } => {
                ctx.heartbeating[side].lock().remove(&instance);
                ctx.checker.lock().stop_heartbeats(&instance, ctx.now());
            }
        }
    }
}

async fn heartbeater(ctx: Arc<Ctx>, side: usize) {
    let dc = ctx.names[side].clone();
    while !ctx.stop_heartbeats.load(Ordering::Relaxed) {
        let round = Instant::now();
        let list: Vec<InstanceRef> = ctx.heartbeating[side].lock().iter().cloned().collect();
        let mut set = tokio::task::JoinSet::new();
        for inst in list {
            let ctx = ctx.clone();
            let dc = dc.clone();
            set.spawn(async move {
                let id = ctx.checker.lock().invoke(&dc, &inst, OpKind::Heartbeat, ctx.now());
                let out =
                    ctx.api.heartbeat(&ctx.bases[side], &ctx.ns, &inst.service, &inst.id, HB_TIMEOUT).await;
                let forgotten = matches!(out, Outcome::Failed { http_status: Some(404), .. });
                ctx.checker.lock().complete(id, ctx.now(), out);
                if forgotten {
                    // The client would re-register under a new id; this workload just stops.
                    ctx.heartbeating[side].lock().remove(&inst);
                }
            });
        }
        while set.join_next().await.is_some() {}
        tokio::time::sleep_until(round + ctx.heartbeat_interval).await;
    }
}

async fn advancer(ctx: Arc<Ctx>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ctx.now();
        ctx.checker.lock().advance(now);
    }
}

async fn progress(ctx: Arc<Ctx>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let (ops, acked, unknown, violations) = {
            let c = ctx.checker.lock();
            let k = c.op_counts();
            (k.registers + k.deregisters + k.status_changes, k.acked, k.unknown, c.violations_so_far())
        };
        let parts: Vec<String> = {
            let samples = ctx.samples.lock();
            (0..2)
                .map(|side| match samples.iter().rev().find(|s| s.side == side) {
                    Some(s) => format!("{} {} inst, lag {} ev", ctx.names[side], s.instances, s.lag_events),
                    None => format!("{} -", ctx.names[side]),
                })
                .collect()
        };
        ctx.say(&format!(
            "ops {ops} (acked {acked}, unknown {unknown}) | {} | {} | violations so far {violations}",
            parts[0], parts[1]
        ));
    }
}

/// Deregisters, at their owners, the instances the workload left in its namespace (targets
/// only: a user's deployment is left as it was found). Bounded by the number of instances
/// and a timeout per request; returns how many were removed.
async fn remove_leftovers(ctx: &Ctx) -> usize {
    let mut removed = 0;
    for side in 0..2 {
        for svc in &ctx.services {
            let Ok(v) = ctx.api.view(&ctx.bases[side], &ctx.ns, svc, ViewScope::All, POLL_TIMEOUT).await
            else {
                continue;
            };
            for i in v.instances.iter().filter(|i| i.owner_dc == ctx.names[side]).take(100_000) {
                if let Outcome::Acked { .. } =
                    ctx.api.deregister(&ctx.bases[side], &ctx.ns, svc, &i.id, OP_TIMEOUT).await
                {
                    removed += 1;
                }
            }
        }
    }
    removed
}

/// Polls both DCs until each has applied the other up to the position the other had at
/// the first poll; returns the time that took, or `None` after `budget`.
async fn wait_caught_up(ctx: &Ctx, budget: Duration) -> Option<Ms> {
    let t0 = ctx.now();
    let deadline = Instant::now() + budget;
    let mut targets: Option<[crate::checker::Mark; 2]> = None;
    loop {
        let a = poll_status(ctx, 0).await.map(|x| x.0);
        let b = poll_status(ctx, 1).await.map(|x| x.0);
        if let (Some(a), Some(b)) = (a, b) {
            match targets {
                None => targets = Some([a.log, b.log]),
                Some([ta, tb]) => {
                    let has = |s: &StatusView, origin: &str, t: crate::checker::Mark| {
                        s.applied.get(origin).is_some_and(|m| m.epoch == t.epoch && m.seq >= t.seq)
                    };
                    if has(&a, &ctx.names[1], tb) && has(&b, &ctx.names[0], ta) {
                        return Some(ctx.now() - t0);
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
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

fn env_name(env: &Environment) -> String {
    match env {
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
        environment: env_name(&opts.env),
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
        env_name(&opts.env)
    ));
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
    let mut tuning = NodeTuning { purge_grace_ms: opts.kind.purge_grace_ms(), ..NodeTuning::default() };
    if let Environment::Targets { .. } = opts.env {
        tuning = NodeTuning::default();
    }
    let mut cluster = match Cluster::start(opts.env.clone(), bin, &dir, &tuning, opts.seed).await {
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
    let ctx = Arc::new(Ctx {
        start: Instant::now(),
        checker: Mutex::new(Checker::new(ccfg)),
        api: Api::new(),
        bases: bases.clone(),
        names: names.clone(),
        ns: ns.clone(),
        services: wl.services.clone(),
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
    let mut background = Tasks(vec![
        tokio::spawn(advancer(ctx.clone())),
        tokio::spawn(progress(ctx.clone(), Duration::from_secs(2))),
    ]);
    let pollers = Tasks(vec![tokio::spawn(poller(ctx.clone(), 0)), tokio::spawn(poller(ctx.clone(), 1))]);
    let heartbeaters =
        Tasks(vec![tokio::spawn(heartbeater(ctx.clone(), 0)), tokio::spawn(heartbeater(ctx.clone(), 1))]);
    let executors = Tasks(vec![
        tokio::spawn(executor(ctx.clone(), 0, ops_a)),
        tokio::spawn(executor(ctx.clone(), 1, ops_b)),
    ]);

    // The fault plan.
    let mut ledger = FaultLedger::new(names.clone());
    let mut last_fault_end: Ms = 0;
    let mut purge_floor_before_heal = [0u64; 2];
    // Real time runs `shift` behind the plan once the drill waited for a recovery.
    let mut shift: u64 = 0;
    for (i, step) in the_plan.actions.iter().enumerate() {
        tokio::time::sleep_until(ctx.start + Duration::from_millis(step.at_ms + shift)).await;
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
        if matches!(step.action, Action::Heal) {
            for (side, floor) in purge_floor_before_heal.iter_mut().enumerate() {
                let samples = ctx.samples.lock();
                *floor = (*floor)
                    .max(samples.iter().filter(|s| s.side == side).map(|s| s.purge_floor).max().unwrap_or(0));
            }
        }
        let note = cluster.apply(step.action).await.with_context(|| format!("fault {:?}", step.action))?;
        let t1 = ctx.now();
        let label = ledger.label(step.action);
        ctx.say(&format!("fault: {label}{}", note.map(|n| format!(" ({n})")).unwrap_or_default()));
        for (side, ev) in process_events.after {
            ctx.checker.lock().process(&names[side], t1, ev);
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
    let metrics_snapshots = snapshot_metrics(&ctx.api, &bases).await;
    let logs: Vec<String> =
        cluster.dcs.iter().filter_map(|d| d.log_path().map(|p| p.display().to_string())).collect();
    cluster.shutdown().await;

    let check: CheckReport = {
        let c = std::mem::replace(&mut *ctx.checker.lock(), Checker::new(CheckerConfig::new(&[])));
        c.finish(final_from)
    };
    let samples = ctx.samples.lock().clone();
    let figures = figures(&check, &samples, relay, converged_at.map(|c| c.saturating_sub(workload_end)));
    let mut expectations = Vec::new();
    if opts.kind == DrillKind::LongPartition && cluster_did_processes(&opts.env) {
        let purged = purge_floor_before_heal[0] > 0;
        expectations.push(Expectation {
            name: "purge".into(),
            passed: purged,
            detail: format!(
                "{}'s purge floor reached {} before the heal ({} {}): once {} lost its disk, its empty cursor was below the floor and only a snapshot could catch it up",
                names[0], purge_floor_before_heal[0], names[1], purge_floor_before_heal[1], names[1]
            ),
        });
        let ab = figures.snapshots_sent[0] >= 1 && figures.snapshots_installed[1] >= 1;
        let ba = figures.snapshots_sent[1] >= 1 && figures.snapshots_installed[0] >= 1;
        expectations.push(Expectation {
            name: "snapshot-path".into(),
            passed: ab && ba,
            detail: format!(
                "{a}->{b}: {} sent / {} installed (cursor below purge floor); {b}->{a}: {} sent / {} installed (new epoch){}",
                figures.snapshots_sent[0],
                figures.snapshots_installed[1],
                figures.snapshots_sent[1],
                figures.snapshots_installed[0],
                metrics_snapshots.map(|(s, i)| format!("; /metrics at the end: sent {s}, installed {i}")).unwrap_or_default(),
                a = names[0],
                b = names[1]
            ),
        });
    }
    let passed = check.passed() && expectations.iter().all(|e| e.passed);
    let mut report = DrillReport {
        drill: opts.kind.name().into(),
        seed: opts.seed,
        seed_hex: format!("{:#018x}", opts.seed),
        mode: mode_name(opts),
        environment: env_name(&opts.env),
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

fn cluster_did_processes(env: &Environment) -> bool {
    match env {
        Environment::Sandbox | Environment::Netns => true,
        Environment::Targets { hook, .. } => hook.is_some(),
    }
}

/// Sum of `tandem_peer_snapshots_{sent,installed}_total` over both DCs, as /metrics says
/// at the end (counters restart with the process).
async fn snapshot_metrics(api: &Api, bases: &[String; 2]) -> Option<(u64, u64)> {
    let (mut sent, mut installed) = (0u64, 0u64);
    for b in bases {
        let text = api.metrics(b, Duration::from_secs(2)).await.ok()?;
        for line in text.lines() {
            let v = line.rsplit(' ').next().and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0) as u64;
            if line.starts_with("tandem_peer_snapshots_sent_total") {
                sent += v;
            } else if line.starts_with("tandem_peer_snapshots_installed_total") {
                installed += v;
            }
        }
    }
    Some((sent, installed))
}

/// Sum of a per-process counter across restarts (a drop means the process restarted).
fn cumulative(samples: &[Sample], side: usize, f: impl Fn(&Sample) -> u64) -> u64 {
    let (mut base, mut last) = (0u64, 0u64);
    for s in samples.iter().filter(|s| s.side == side) {
        let v = f(s);
        if v < last {
            base += last;
        }
        last = v;
    }
    base + last
}

fn figures(
    check: &CheckReport,
    samples: &[Sample],
    relay: Option<(u64, u64, u64, u64)>,
    final_conv: Option<u64>,
) -> Figures {
    let k = &check.ops;
    let p50s: Vec<u64> = samples.iter().filter_map(|s| s.lag_ms_p50).collect();
    let p99s: Vec<u64> = samples.iter().filter_map(|s| s.lag_ms_p99).collect();
    let lag_ms = Quantiles {
        p50: Quantiles::of(p50s).p50,
        p99: Quantiles::of(p99s.clone()).p99,
        max: p99s.iter().copied().max(),
    };
    Figures {
        ops_invoked: k.registers + k.deregisters + k.status_changes,
        registers: k.registers,
        deregisters: k.deregisters,
        status_changes: k.status_changes,
        lease_stops: k.lease_stops,
        acked: k.acked,
        failed: k.failed,
        unknown: k.unknown,
        heartbeats: k.heartbeats,
        heartbeats_acked: k.heartbeats_acked,
        heartbeats_unknown_instance: k.heartbeats_unknown_instance,
        heartbeats_failed: k.heartbeats_failed,
        heartbeats_unknown: k.heartbeats_unknown,
        // Side 1 applies what side 0 shipped, and the reverse.
        events_shipped: [
            cumulative(samples, 1, |s| s.events_applied),
            cumulative(samples, 0, |s| s.events_applied),
        ],
        lag_ms,
        lag_events_max: samples.iter().map(|s| s.lag_events).max().unwrap_or(0),
        recoveries: check
            .recoveries
            .iter()
            .map(|r| RecoveryRow {
                label: r.label.clone(),
                at_ms: r.at,
                catch_up_ms: r.catch_up_ms,
                interrupted_after_ms: r.interrupted_after_ms,
            })
            .collect(),
        final_convergence_ms: final_conv,
        snapshots_sent: [
            cumulative(samples, 0, |s| s.snapshots_sent),
            cumulative(samples, 1, |s| s.snapshots_sent),
        ],
        snapshots_installed: [
            cumulative(samples, 0, |s| s.snapshots_installed),
            cumulative(samples, 1, |s| s.snapshots_installed),
        ],
        purge_floor_max: [
            samples.iter().filter(|s| s.side == 0).map(|s| s.purge_floor).max().unwrap_or(0),
            samples.iter().filter(|s| s.side == 1).map(|s| s.purge_floor).max().unwrap_or(0),
        ],
        relay_datagrams: relay.map(|(a, b, c, d)| [(a, b), (c, d)]),
        view_observations: check.observations.0,
        status_observations: check.observations.1,
        instances_created: check.instances,
        instances_final: check.instances_final,
    }
}

// ---------------------------------------------------------------------------------------------
// The command line: `tandem chaos ...`.
// ---------------------------------------------------------------------------------------------

#[derive(Parser, Debug)]
#[command(
    name = "tandem chaos",
    about = "Partition-heal chaos drills with a seeded workload and an invariant checker",
    after_help = "Drills: partition-heal, one-way-partition, flapping-link, crash-restart, pause, packet-chaos, long-partition; `all` runs them all, `list` describes them.\n\
Exit status: 0 when every invariant held (and, by default, when a drill was SKIPPED: see --skipped-exit-code), 1 when an invariant failed, 2 when a drill could not run, 130 on Ctrl-C."
)]
struct ChaosCli {
    /// Drill names, `all`, or `list`.
    #[arg(required = true)]
    drills: Vec<String>,
    /// The workload and fault seed (decimal or 0x-hex); default: random, printed.
    #[arg(long)]
    seed: Option<String>,
    /// Long mode: run each drill over this span (e.g. 10m); default: the short CI version.
    #[arg(long)]
    duration: Option<String>,
    /// Where configs, data, logs, report.json and timeline.svg go (per drill a subdir when
    /// several drills run). Default: a fresh dir under the system temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run each DC in its own network namespace (Linux, root); partitions take the veth
    /// link down. Prints SKIPPED when namespaces are not permitted.
    #[arg(long, conflicts_with_all = ["target_a", "target_b"])]
    netns: bool,
    /// Your own deployment: base URL of the first DC's registry (for example http://10.0.0.1:8500).
    #[arg(long, requires = "target_b")]
    target_a: Option<String>,
    /// Base URL of the second DC's registry.
    #[arg(long, requires = "target_a")]
    target_b: Option<String>,
    /// With targets: a command run as `<hook> <action> [args]` for each fault
    /// (partition both|A->B|B->A, heal, packets LOSS DELAY JITTER DUP REORDER, clear-packets,
    /// kill DC, kill-wipe DC, restart DC, pause DC, resume DC). Without it faults are only marked.
    #[arg(long, requires = "target_a")]
    fault_hook: Option<String>,
    /// Every recovery (and the final convergence) must complete within this.
    #[arg(long, default_value = "20s")]
    recovery_budget: String,
    /// Exit status when a drill was SKIPPED and none failed.
    #[arg(long, default_value_t = 0)]
    skipped_exit_code: u8,
    /// Only the final tables.
    #[arg(long)]
    quiet: bool,
}

/// Parses `250ms`, `30s`, `5m`, `1h` or a bare number of seconds.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let mult = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s, m or h)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("duration {s:?} too large"))
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("bad seed {s:?}: use a decimal or 0x-hex u64"))
}

/// `tandem chaos <args>`: runs drills against processes started from `bin`. Returns the
/// process exit status.
pub async fn main(args: Vec<String>, bin: PathBuf) -> ExitCode {
    let cli = match ChaosCli::try_parse_from(std::iter::once("tandem chaos".to_owned()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    if cli.drills.iter().any(|d| d == "list") {
        for d in DrillKind::ALL {
            println!("{:<18} {} (short: {}s)", d.name(), d.about(), d.short_span_ms() / 1000);
        }
        return ExitCode::SUCCESS;
    }
    let mut kinds = Vec::new();
    for d in &cli.drills {
        if d == "all" {
            kinds.extend(DrillKind::ALL);
            continue;
        }
        match d.parse::<DrillKind>() {
            Ok(k) => kinds.push(k),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let seed = match cli.seed.as_deref().map(parse_seed) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        None => rand::random(),
    };
    let span_ms = match cli.duration.as_deref().map(parse_duration_ms) {
        Some(Ok(ms)) if ms >= 10_000 => Some(ms),
        Some(Ok(_)) => {
            eprintln!("error: --duration must be at least 10s");
            return ExitCode::from(2);
        }
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        None => None,
    };
    let budget = match parse_duration_ms(&cli.recovery_budget) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let env = match (&cli.target_a, &cli.target_b) {
        (Some(a), Some(b)) => {
            Environment::Targets { a: a.clone(), b: b.clone(), hook: cli.fault_hook.clone() }
        }
        _ if cli.netns => Environment::Netns,
        _ => Environment::Sandbox,
    };
    println!("tandem chaos: seed {seed:#018x} (replay with --seed {seed:#x})");
    let several = kinds.len() > 1;
    let mut reports: Vec<DrillReport> = Vec::new();
    let mut errors = 0;
    for kind in kinds {
        let opts = DrillOptions {
            kind,
            seed,
            span_ms,
            dir: cli.dir.as_ref().map(|d| if several { d.join(kind.name()) } else { d.clone() }),
            env: env.clone(),
            recovery_budget_ms: budget,
            quiet: cli.quiet,
        };
        let run = run_drill(&opts, &bin);
        let res = tokio::select! {
            r = run => r,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: child processes killed, namespaces removed");
                return ExitCode::from(130);
            }
        };
        match res {
            Ok(r) => {
                if cli.quiet {
                    print!("{}", r.table());
                }
                reports.push(r);
            }
            Err(e) => {
                eprintln!("error: drill {kind} could not run: {e:#}");
                errors += 1;
            }
        }
    }
    if reports.len() > 1 {
        println!("\n== summary (seed {seed:#018x})");
        for r in &reports {
            let res = match r.result.as_str() {
                "pass" => "PASS".to_owned(),
                "fail" => "FAIL".to_owned(),
                _ => format!("SKIPPED: {}", r.skipped_reason.clone().unwrap_or_default()),
            };
            println!("{:<18} {:>6.1}s  {res}", r.drill, r.elapsed_ms as f64 / 1000.0);
        }
    }
    let failed = reports.iter().any(|r| r.result == "fail");
    let skipped = reports.iter().any(|r| r.result == "skipped");
    if failed {
        ExitCode::from(1)
    } else if errors > 0 {
        ExitCode::from(2)
    } else if skipped {
        ExitCode::from(cli.skipped_exit_code)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_seeds_parse() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("7"), Ok(7_000));
        assert!(parse_duration_ms("5d").is_err());
        assert_eq!(parse_seed("0x10"), Ok(16));
        assert_eq!(parse_seed("42"), Ok(42));
        assert!(parse_seed("x").is_err());
    }

    #[test]
    fn counters_are_summed_across_restarts() {
        let s = |t, v| Sample { t_ms: t, side: 0, events_applied: v, ..Sample::default() };
        let samples = vec![s(1, 5), s(2, 10), s(3, 2), s(4, 7)];
        assert_eq!(cumulative(&samples, 0, |x| x.events_applied), 17);
    }
}
