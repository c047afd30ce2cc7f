//! The seeded workload: the schedule of client operations of a drill, generated up front
//! from one `u64` seed.
//!
//! The same seed and settings always give the same schedule (the real timing of a run may
//! differ; the schedule does not). Heartbeats are implied rather than listed: every
//! ephemeral instance is renewed every `heartbeat_interval_ms` from its registration until
//! the schedule deregisters it or stops its heartbeats (after which its lease expires).
//!
//! Besides, [`schedule_fixed`] gives the clients that reuse their instance ids, on their own
//! service ([`WorkloadConfig::fixed_service`]): *fixed-id clients*, each registering the
//! same id again after a deregistration or after letting its lease expire (or before it
//! expired), and *id races*: rounds of "register the id, then deregister it and register
//! it again in parallel", with no heartbeats, after which the instance must hold exactly
//! one lease and expire. Each id's operations run in order on their own task.
//!
//! Architecture invariant: no I/O, no clock. Outside the fixed service, instance ids are
//! never reused, which the checker relies on.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checker::InstanceRef;

/// What the schedule does to an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlannedOp {
    Register {
        instance: InstanceRef,
        persistent: bool,
        ttl_ms: u64,
        address: String,
        port: u16,
    },
    Deregister {
        instance: InstanceRef,
    },
    SetStatus {
        instance: InstanceRef,
        status: &'static str,
    },
    /// Stop heartbeating an ephemeral instance: its lease will expire.
    StopHeartbeat {
        instance: InstanceRef,
    },
    /// `rounds` times: register the (ephemeral) instance, then deregister it and register
    /// it again in parallel. Never heartbeated.
    Race {
        instance: InstanceRef,
        rounds: u32,
        ttl_ms: u64,
    },
}

impl PlannedOp {
    pub fn instance(&self) -> &InstanceRef {
        match self {
            PlannedOp::Register { instance, .. }
            | PlannedOp::Deregister { instance }
            | PlannedOp::SetStatus { instance, .. }
            | PlannedOp::StopHeartbeat { instance }
            | PlannedOp::Race { instance, .. } => instance,
        }
    }
}

/// One operation of the schedule: at `at_ms` after the workload starts, on DC `side`
/// (0 = the first DC, 1 = the second).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub at_ms: u64,
    pub side: usize,
    pub op: PlannedOp,
}

/// Shape of the workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Operations are scheduled in [0, duration_ms).
    pub duration_ms: u64,
    /// Mean operations per second on each DC.
    pub ops_per_sec: f64,
    pub services: Vec<String>,
    /// Share of registrations that are persistent, in percent.
    pub persistent_pct: u8,
    /// Lease TTL of ephemeral instances.
    pub ttl_ms: u64,
    /// Registrations stop while a DC holds this many live instances.
    pub live_max: usize,
    /// Below this many live instances a DC only registers.
    pub live_min: usize,
    /// Id prefix per side; ids are `<prefix><n>`.
    pub id_prefixes: [String; 2],
    /// Most operations per side (a bound on the schedule's size).
    pub ops_max: usize,
    /// The service of the clients that reuse their ids (`None`: none run).
    pub fixed_service: Option<String>,
    /// Fixed-id clients per side.
    pub fixed_clients: usize,
    /// Id races per side start about this often (each on one of two ids in turn).
    pub race_every_ms: u64,
    /// Rounds of one id race.
    pub race_rounds: u32,
}

impl WorkloadConfig {
    pub fn new(duration_ms: u64) -> WorkloadConfig {
        WorkloadConfig {
            duration_ms,
            ops_per_sec: 8.0,
            services: vec!["orders".into(), "payments".into(), "search".into()],
            persistent_pct: 40,
            ttl_ms: 2_400,
            live_max: 40,
            live_min: 6,
            id_prefixes: ["a-".into(), "b-".into()],
            ops_max: 200_000,
            fixed_service: Some("fixed".into()),
            fixed_clients: 2,
            race_every_ms: 3_000,
            race_rounds: 30,
        }
    }
}

/// Derives an independent stream from the seed (SplitMix64 finalizer).
pub fn sub_seed(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone)]
struct Live {
    instance: InstanceRef,
    heartbeating: bool,
}

/// The schedule of both sides, sorted by time (then side).
pub fn schedule(seed: u64, cfg: &WorkloadConfig) -> Vec<Scheduled> {
    let mut out = Vec::new();
    for side in 0..2 {
        out.extend(schedule_side(sub_seed(seed, 1 + side as u64), side, cfg));
    }
    out.sort_by_key(|s| (s.at_ms, s.side));
    out
}

fn schedule_side(seed: u64, side: usize, cfg: &WorkloadConfig) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut live: Vec<Live> = Vec::new();
    let mut next_id = 0u64;
    let mean_gap_ms = (1000.0 / cfg.ops_per_sec.max(0.01)).max(1.0);
    let mut t = 0.0f64;
    while out.len() < cfg.ops_max {
        t += mean_gap_ms * rng.gen_range(0.3..1.7);
        let at_ms = t as u64;
        if at_ms >= cfg.duration_ms {
            break;
        }
        let roll: u32 = rng.gen_range(0..100);
        let register = live.len() < cfg.live_min || (live.len() < cfg.live_max && roll < 40);
        let op = if register {
            let service = cfg.services[rng.gen_range(0..cfg.services.len())].clone();
            let n = next_id;
            next_id += 1;
            let instance = InstanceRef { service, id: format!("{}{n:05}", cfg.id_prefixes[side]) };
            let persistent = rng.gen_range(0..100) < u32::from(cfg.persistent_pct);
            live.push(Live { instance: instance.clone(), heartbeating: !persistent });
            PlannedOp::Register {
                instance,
                persistent,
                ttl_ms: if persistent { 0 } else { cfg.ttl_ms },
                address: format!("10.{}.{}.{}", 10 + side, (n / 250) % 250, n % 250 + 1),
                port: 8000 + (n % 1000) as u16,
            }
        } else {
            let pick = rng.gen_range(0..live.len());
            let kind: u32 = rng.gen_range(0..100);
            if kind < 45 {
                let l = live.swap_remove(pick);
                PlannedOp::Deregister { instance: l.instance }
            } else if kind < 80 || !live[pick].heartbeating {
                let status = ["up", "draining", "out_of_service", "up"][rng.gen_range(0..4)];
                PlannedOp::SetStatus { instance: live[pick].instance.clone(), status }
            } else {
                // The instance is left to expire; nothing touches it again.
                let l = live.swap_remove(pick);
                PlannedOp::StopHeartbeat { instance: l.instance }
            }
        };
        out.push(Scheduled { at_ms, side, op });
    }
    out
}

/// The schedule of the clients that reuse ids (see the module docs), both sides, sorted by
/// time. Ids: `<prefix>fix-<k>` and `<prefix>race-<k>`.
pub fn schedule_fixed(seed: u64, cfg: &WorkloadConfig) -> Vec<Scheduled> {
    let Some(service) = cfg.fixed_service.clone() else { return Vec::new() };
    let ttl = cfg.ttl_ms;
    let mut out = Vec::new();
    for side in 0..2 {
        let prefix = &cfg.id_prefixes[side];
        for k in 0..cfg.fixed_clients {
            let mut rng = StdRng::seed_from_u64(sub_seed(seed, 20 + 2 * k as u64 + side as u64));
            let instance = InstanceRef { service: service.clone(), id: format!("{prefix}fix-{k}") };
            let mut t = rng.gen_range(0..1_500u64);
            let mut n = 0u64;
            while t < cfg.duration_ms && out.len() < cfg.ops_max {
                out.push(Scheduled {
                    at_ms: t,
                    side,
                    op: PlannedOp::Register {
                        instance: instance.clone(),
                        persistent: false,
                        ttl_ms: ttl,
                        address: format!("10.{}.250.{}", 10 + side, 1 + k),
                        port: 9000 + (n % 1000) as u16,
                    },
                });
                n += 1;
                t += rng.gen_range(800..3_000u64);
                if t >= cfg.duration_ms {
                    break;
                }
                let gap = if rng.gen_bool(0.5) {
                    out.push(Scheduled {
                        at_ms: t,
                        side,
                        op: PlannedOp::Deregister { instance: instance.clone() },
                    });
                    rng.gen_range(0..1_500u64)
                } else {
                    out.push(Scheduled {
                        at_ms: t,
                        side,
                        op: PlannedOp::StopHeartbeat { instance: instance.clone() },
                    });
                    // Mostly after its lease expired; sometimes while it is still held.
                    if rng.gen_bool(0.7) {
                        rng.gen_range(ttl + 600..ttl + 2_500)
                    } else {
                        rng.gen_range(0..ttl / 2 + 1)
                    }
                };
                t += gap;
            }
        }
        let mut rng = StdRng::seed_from_u64(sub_seed(seed, 40 + side as u64));
        let mut t = rng.gen_range(500..2_000u64);
        let mut k = 0u64;
        let every = cfg.race_every_ms.max(1);
        while t < cfg.duration_ms && out.len() < cfg.ops_max {
            let instance = InstanceRef { service: service.clone(), id: format!("{prefix}race-{}", k % 2) };
            out.push(Scheduled {
                at_ms: t,
                side,
                op: PlannedOp::Race { instance, rounds: cfg.race_rounds, ttl_ms: ttl },
            });
            k += 1;
            t += rng.gen_range(every..every + every / 2 + 1);
        }
    }
    out.sort_by(|a, b| (a.at_ms, a.side, a.op.instance()).cmp(&(b.at_ms, b.side, b.op.instance())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let cfg = WorkloadConfig::new(20_000);
        assert_eq!(schedule(7, &cfg), schedule(7, &cfg));
        assert_ne!(schedule(7, &cfg), schedule(8, &cfg));
    }

    #[test]
    fn ids_are_never_reused_and_removed_instances_are_never_touched_again() {
        let cfg = WorkloadConfig::new(60_000);
        let s = schedule(42, &cfg);
        assert!(s.len() > 500, "{}", s.len());
        let mut registered = BTreeSet::new();
        let mut removed = BTreeSet::new();
        for op in &s {
            let r = op.op.instance().clone();
            assert!(!removed.contains(&r), "{r} touched after removal");
            match &op.op {
                PlannedOp::Register { .. } => assert!(registered.insert(r), "id reused"),
                PlannedOp::Deregister { .. } | PlannedOp::StopHeartbeat { .. } => {
                    assert!(registered.contains(&r));
                    removed.insert(r);
                }
                PlannedOp::SetStatus { .. } => assert!(registered.contains(&r)),
                PlannedOp::Race { .. } => panic!("no races outside the fixed service"),
            }
        }
    }

    #[test]
    fn fixed_ids_are_reused_in_a_seeded_schedule() {
        let cfg = WorkloadConfig::new(30_000);
        let s = schedule_fixed(5, &cfg);
        assert_eq!(s, schedule_fixed(5, &cfg));
        assert_ne!(s, schedule_fixed(6, &cfg));
        let regs = |id: &str| {
            s.iter()
                .filter(|x| x.op.instance().id == id && matches!(x.op, PlannedOp::Register { .. }))
                .count()
        };
        assert!(regs("a-fix-0") >= 3 && regs("b-fix-1") >= 3, "fixed-id clients register again");
        let races: Vec<&Scheduled> = s.iter().filter(|x| matches!(x.op, PlannedOp::Race { .. })).collect();
        assert!(races.len() >= 10, "{}", races.len());
        // The same race id waits long enough for its lease to expire before its next race.
        let mut last: std::collections::BTreeMap<&InstanceRef, u64> = Default::default();
        for r in &races {
            if let Some(prev) = last.insert(r.op.instance(), r.at_ms) {
                assert!(r.at_ms - prev >= 2 * cfg.race_every_ms);
            }
        }
        assert!(s.iter().all(|x| x.op.instance().service == "fixed"));
    }
}
