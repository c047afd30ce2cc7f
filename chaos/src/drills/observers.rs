//! What runs beside a drill's fault plan: per DC an executor of the scheduled operations, a
//! heartbeater of its live ephemeral instances and a poller of its views and status (each
//! call bounded by a timeout), the checker's clock and the progress lines; and the waits on
//! the DCs (catch-up after a recovery, leftovers removed from a user's deployment).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{Ctx, HB_TIMEOUT, OP_TIMEOUT, POLL_INTERVAL, POLL_TIMEOUT, SAMPLES_MAX};
use crate::checker::{
    InstanceRef, Ms, OpKind, Outcome, ProcessEvent, ServiceView, StatusObservation, StatusView,
    ViewObservation, ViewScope,
};
use crate::report::Sample;
use crate::workload::{PlannedOp, Scheduled};

pub(super) fn sample_from(t_ms: u64, side: usize, peer: &str, v: &Value) -> Sample {
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

pub(super) async fn poll_status(ctx: &Arc<Ctx>, side: usize) -> Option<(StatusView, Value)> {
    // The base first, then the time: a poll of a replaced process is invoked before the
    // drill declares the replacement.
    let base = ctx.base(side);
    let invoked = ctx.now();
    let r = ctx.api.status(&base, POLL_TIMEOUT).await;
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
    watch_term(ctx, side, invoked, &raw);
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

/// A DC group's term moved (a leader change, whoever caused it: a kill, or an election
/// the load set off): the checker hears `LeaderLost` from the previous poll that showed the
/// old term (no later than the change) and `LeaderServing` once a member is seen serving
/// writes in the new term or a later one (no earlier than its take-over), found by a
/// bounded task that asks every member.
fn watch_term(ctx: &Arc<Ctx>, side: usize, invoked: Ms, raw: &Value) {
    if ctx.members[side].len() < 2 {
        return;
    }
    let Some(term) = raw.pointer("/cluster/term").and_then(Value::as_u64) else { return };
    let previous = {
        let mut t = ctx.terms[side].lock();
        match *t {
            // An answer older than one already seen.
            Some((seen, _)) if seen > term => return,
            Some((seen, _)) if seen == term => {
                *t = Some((term, invoked));
                return;
            }
            previous => {
                *t = Some((term, invoked));
                previous
            }
        }
    };
    let Some((_, lost_at)) = previous else { return };
    ctx.checker.lock().process(&ctx.names[side], lost_at, ProcessEvent::LeaderLost);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            for base in &ctx.members[side] {
                let Ok((_, raw)) = ctx.api.status(base, Duration::from_millis(500)).await else { continue };
                let serving = raw.pointer("/cluster/serving_writes").and_then(Value::as_bool) == Some(true);
                let t = raw.pointer("/cluster/term").and_then(Value::as_u64).unwrap_or(0);
                if serving && t >= term {
                    ctx.checker.lock().process(&ctx.names[side], ctx.now(), ProcessEvent::LeaderServing);
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    });
}

pub(super) async fn poll_view(
    ctx: &Ctx,
    side: usize,
    service: &str,
    scope: ViewScope,
) -> Option<ServiceView> {
    let base = ctx.base(side);
    let invoked = ctx.now();
    let r = ctx.api.view(&base, &ctx.ns, service, scope, POLL_TIMEOUT).await;
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

pub(super) async fn poller(ctx: Arc<Ctx>, side: usize) {
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

pub(super) async fn executor(ctx: Arc<Ctx>, side: usize, ops: Vec<Scheduled>) {
    let dc = ctx.names[side].clone();
    for s in ops {
        tokio::time::sleep_until(ctx.start + Duration::from_millis(s.at_ms)).await;
        if ctx.stop_workload.load(Ordering::Relaxed) {
            break;
        }
        let base = ctx.base(side);
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
            PlannedOp::Race { instance, rounds, ttl_ms } => race(&ctx, side, &instance, rounds, ttl_ms).await,
        }
    }
}

/// An id race: `rounds` times, register `instance`, then deregister it and register it
/// again in parallel (issue 12's repro). No heartbeats: it must end with one lease and
/// expire. Stops early when the owner is unreachable.
async fn race(ctx: &Ctx, side: usize, instance: &InstanceRef, rounds: u32, ttl_ms: u64) {
    let dc = &ctx.names[side];
    let base = &ctx.base(side);
    let ns = &ctx.ns;
    let (svc, id) = (&instance.service, &instance.id);
    let register = || async {
        let op = ctx.checker.lock().invoke(
            dc,
            instance,
            OpKind::Register { persistent: false, ttl_ms },
            ctx.now(),
        );
        let out = ctx.api.register(base, ns, svc, id, "10.99.0.1", 9999, false, ttl_ms, OP_TIMEOUT).await;
        let unreachable = matches!(out, Outcome::Failed { http_status: None, .. });
        ctx.checker.lock().complete(op, ctx.now(), out);
        unreachable
    };
    for _ in 0..rounds {
        if ctx.stop_workload.load(Ordering::Relaxed) || register().await {
            break;
        }
        let del = async {
            let op = ctx.checker.lock().invoke(dc, instance, OpKind::Deregister, ctx.now());
            let out = ctx.api.deregister(base, ns, svc, id, OP_TIMEOUT).await;
            ctx.checker.lock().complete(op, ctx.now(), out);
        };
        let ((), unreachable) = tokio::join!(del, register());
        if unreachable {
            break;
        }
    }
    ctx.checker.lock().heartbeats_ended(instance, ctx.now());
}

pub(super) async fn heartbeater(ctx: Arc<Ctx>, side: usize) {
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
                    ctx.api.heartbeat(&ctx.base(side), &ctx.ns, &inst.service, &inst.id, HB_TIMEOUT).await;
                let forgotten = matches!(out, Outcome::Failed { http_status: Some(404), .. });
                ctx.checker.lock().complete(id, ctx.now(), out);
                if forgotten {
                    // The client would re-register under a new id; this workload just stops.
                    ctx.heartbeating[side].lock().remove(&inst);
                    ctx.checker.lock().heartbeats_ended(&inst, ctx.now());
                }
            });
        }
        while set.join_next().await.is_some() {}
        tokio::time::sleep_until(round + ctx.heartbeat_interval).await;
    }
}

pub(super) async fn advancer(ctx: Arc<Ctx>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ctx.now();
        ctx.checker.lock().advance(now);
    }
}

pub(super) async fn progress(ctx: Arc<Ctx>, every: Duration) {
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
pub(super) async fn remove_leftovers(ctx: &Ctx) -> usize {
    let mut removed = 0;
    for side in 0..2 {
        for svc in &ctx.services {
            let Ok(v) = ctx.api.view(&ctx.base(side), &ctx.ns, svc, ViewScope::All, POLL_TIMEOUT).await
            else {
                continue;
            };
            for i in v.instances.iter().filter(|i| i.owner_dc == ctx.names[side]).take(100_000) {
                if let Outcome::Acked { .. } =
                    ctx.api.deregister(&ctx.base(side), &ctx.ns, svc, &i.id, OP_TIMEOUT).await
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
pub(super) async fn wait_caught_up(ctx: &Arc<Ctx>, budget: Duration) -> Option<Ms> {
    let t0 = ctx.now();
    let deadline = Instant::now() + budget;
    let mut targets: Option<[crate::checker::Mark; 2]> = None;
    loop {
        let a = poll_status(ctx, 0).await.map(|x| x.0);
        let b = poll_status(ctx, 1).await.map(|x| x.0);
        if let (Some(a), Some(b)) = (a, b) {
            match targets {
                // A DC that moved to a new epoch since (its first handshake after a fresh
                // start, a restore) is caught up to its new mark, not the old one.
                Some([ta, tb]) if ta.epoch != a.log.epoch || tb.epoch != b.log.epoch => {
                    targets = Some([a.log, b.log])
                }
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
