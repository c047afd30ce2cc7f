//! The chaos drills, short versions, against real `tandem server` processes (the binary
//! this crate builds), each DC's replication link through a fault relay; plus proof that
//! the checker does catch a broken promise.
//!
//! The drills run one at a time (they are timing-sensitive and each starts two nodes), with
//! a fixed seed so that a failure replays with `tandem chaos <drill> --seed <SEED>`.

mod common;

use std::path::PathBuf;
use std::sync::Mutex;

use tandem_chaos::checker::{
    Checker, CheckerConfig, InstanceRef, Invariant, Mark, ObservedInstance, OpKind, Outcome, ProcessEvent,
    ServiceView, StatusObservation, StatusView, ViewObservation, ViewScope,
};
use tandem_chaos::cluster::Environment;
use tandem_chaos::drills::{run_drill, DrillOptions};
use tandem_chaos::plan::DrillKind;
use tandem_chaos::report::DrillReport;

/// The seed of every drill here.
const SEED: u64 = 0x7a9d_0c1d_0000_0001;

static SERIAL: Mutex<()> = Mutex::new(());

fn drill(kind: DrillKind, env: Environment) -> DrillReport {
    drill_with(kind, env, kind.nodes_default())
}

fn drill_with(kind: DrillKind, env: Environment, nodes: usize) -> DrillReport {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut opts = DrillOptions::short(kind, SEED);
    opts.dir = Some(dir.path().to_path_buf());
    opts.env = env;
    opts.nodes = nodes;
    // TANDEM_TEST_BIN: see tests/common/mod.rs.
    let bin = std::env::var_os("TANDEM_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tandem")));
    let report =
        rt.block_on(run_drill(&opts, &bin)).unwrap_or_else(|e| panic!("drill {kind} could not run: {e:#}"));
    if !report.passed() {
        // The report names the node logs, the report and the timeline in this dir: a
        // failed drill keeps them for whoever reads the failure.
        let kept = dir.keep();
        eprintln!("drill {kind} failed: its dir is kept at {}", kept.display());
    }
    report
}

fn assert_holds(kind: DrillKind) -> DrillReport {
    assert_holds_with(kind, kind.nodes_default())
}

fn assert_holds_with(kind: DrillKind, nodes: usize) -> DrillReport {
    let r = drill_with(kind, Environment::Sandbox, nodes);
    assert!(r.passed(), "drill {kind} failed (replay: {}):\n{}", r.replay, r.table());
    assert!(r.invariants.iter().all(|i| i.checks > 0), "every invariant was exercised:\n{}", r.table());
    r
}

#[test]
fn partition_heal_holds_every_invariant() {
    let r = assert_holds(DrillKind::PartitionHeal);
    assert!(
        r.figures.relay_datagrams.is_some_and(|[ab, ba]| ab.1 > 0 && ba.1 > 0),
        "the partition dropped packets"
    );
}

#[test]
fn partition_heal_with_three_node_dcs_holds_every_invariant() {
    // Each DC a Raft group of three: the gateway runs on the leader, the peer's dials
    // find it among three addresses, the drill's clients talk to one member.
    let r = assert_holds_with(DrillKind::PartitionHeal, 3);
    assert!(r.environment.contains("a group of 3"), "{}", r.environment);
}

#[test]
fn leader_kill_loses_no_ack_and_expires_no_beating_lease() {
    // kill -9 of a DC's leader under writes, each DC in turn, with the default Raft
    // timings: every acknowledged write survives, no lease that kept beating expires (the
    // new leader starts every lease over), the peer converges, and another member serves
    // writes after each kill.
    let r = assert_holds(DrillKind::LeaderKill);
    assert!(r.expectations.iter().any(|e| e.name == "leader-failover" && e.passed), "{}", r.table());
}

#[test]
fn rolling_upgrade_from_the_previous_release_loses_nothing() {
    // Every member of both DCs starts as the previous release (emulated) and is upgraded
    // in turn, followers first, leader last; then each is restarted again with the lead
    // handed over first. Under the seeded workload: every invariant holds, every member
    // comes back and catches up, each DC serves writes again after its leader's turn
    // (by election from the old leader, by transfer-leader from the new), no epoch moves.
    let r = assert_holds(DrillKind::RollingUpgrade);
    for name in ["members-back", "leader-handover", "epoch-kept"] {
        assert!(r.expectations.iter().any(|e| e.name == name && e.passed), "{name}:\n{}", r.table());
    }
}

#[test]
fn one_way_partition_holds_every_invariant() {
    assert_holds(DrillKind::OneWayPartition);
}

#[test]
fn flapping_link_holds_every_invariant() {
    assert_holds(DrillKind::FlappingLink);
}

#[test]
fn crash_restart_holds_every_invariant() {
    let r = assert_holds(DrillKind::CrashRestart);
    let excused =
        r.invariants.iter().find(|i| i.name == "availability").map(|i| i.detail.clone()).unwrap_or_default();
    assert!(!excused.contains(" 0 failed while down"), "polls did hit the dead processes: {excused}");
}

#[test]
fn pause_holds_every_invariant() {
    assert_holds(DrillKind::Pause);
}

#[test]
fn packet_chaos_holds_every_invariant() {
    assert_holds(DrillKind::PacketChaos);
}

#[test]
fn long_partition_takes_the_snapshot_path_and_holds_every_invariant() {
    let r = assert_holds(DrillKind::LongPartition);
    let f = &r.figures;
    assert!(
        f.snapshots_sent.iter().all(|n| *n >= 1) && f.snapshots_installed.iter().all(|n| *n >= 1),
        "{}",
        r.table()
    );
    assert!(r.expectations.iter().any(|e| e.name == "snapshot-path" && e.passed));
}

#[test]
fn restore_rollback_converges_after_an_older_data_dir_comes_back() {
    // Issue 13 §1: without ordered epochs and the event-id check, the restored DC's new
    // writes reuse seqs its peer already holds, and the peer keeps zombies forever (the
    // final digests differ).
    let r = assert_holds(DrillKind::RestoreRollback);
    let nr = r
        .invariants
        .iter()
        .find(|i| i.name == "no-resurrection")
        .map(|i| i.detail.clone())
        .unwrap_or_default();
    assert!(nr.contains("restored to an older data dir"), "the restores happened: {nr}");
}

#[test]
fn split_incarnation_fences_the_old_process() {
    // Issue 13 §1: an old process alive next to its replacement must be fenced, not make
    // the peer flip between the two histories.
    let r = assert_holds(DrillKind::SplitIncarnation);
    assert!(r.expectations.iter().any(|e| e.name == "fenced" && e.passed), "{}", r.table());
}

/// Target mode against two nodes with ACLs on: every request of the drill presents the
/// token (`--token`), whose policy is scoped (not `admin`): read and write on every
/// namespace, status and metrics. The nodes count no unauthenticated or forbidden request.
#[test]
fn target_mode_works_against_nodes_with_acls_on() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut tokens = tandem::acl::tokens::TokenFile::default();
        let (_, secret) = tokens.create(vec!["chaos".into()], "chaos drills".into(), 0, None);
        let p = common::pair_with(|c| {
            let policy = "name = \"chaos\"\nrules = [{ namespace = \"*\", read = true, write = true }]\n\
                          status = true\nmetrics = true\n";
            c.acl.enabled = Some(true);
            c.acl.policies = vec![toml::from_str(policy).unwrap()];
            std::fs::create_dir_all(&c.data_dir).unwrap();
            tokens.store(&c.acl.tokens_path(&c.data_dir)).unwrap();
        })
        .await;
        let bases = [&p.a, &p.b].map(|n| format!("http://{}", n.as_ref().unwrap().http_addr()));
        let dir = tempfile::tempdir().unwrap();
        let mut opts = DrillOptions::short(DrillKind::PartitionHeal, SEED);
        opts.dir = Some(dir.path().to_path_buf());
        opts.env = Environment::Targets { a: bases[0].clone(), b: bases[1].clone(), hook: None };
        opts.quiet = true;
        // Without the token the targets refuse the drill at its first request.
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_tandem"));
        let refused = run_drill(&opts, &bin).await.expect_err("no token: refused");
        assert!(format!("{refused:#}").contains("401"), "{refused:#}");
        opts.token = Some(secret);
        let r = run_drill(&opts, &bin).await.unwrap_or_else(|e| panic!("target drill could not run: {e:#}"));
        assert!(r.passed(), "target drill with ACLs failed:\n{}", r.table());
        let api = tandem_chaos::api::Api::with_token(opts.token.as_deref()).unwrap();
        for base in &bases {
            let m = api.metrics(base, std::time::Duration::from_secs(5)).await.unwrap();
            let count = |name: &str| -> u64 {
                m.lines()
                    .filter(|l| l.starts_with(name))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64
            };
            // The one refused probe above; nothing of the drill itself.
            assert!(count("tandem_http_requests_unauthenticated_total") <= 1, "{m}");
            assert_eq!(count("tandem_http_requests_forbidden_total"), 0, "{m}");
        }
        p.stop().await;
    });
}

#[test]
fn the_netns_mode_runs_or_says_skipped_never_a_silent_pass() {
    let r = drill(DrillKind::PartitionHeal, Environment::Netns);
    match r.result.as_str() {
        "skipped" => {
            assert!(r.skipped_reason.as_deref().is_some_and(|s| !s.is_empty()));
            assert!(r.invariants.is_empty(), "a skipped drill claims no invariant");
        }
        _ => assert!(r.passed(), "{}", r.table()),
    }
    // Nothing is left behind: the namespaces this process may have created are gone.
    if let Ok(out) = std::process::Command::new("ip").args(["netns", "list"]).output() {
        let list = String::from_utf8_lossy(&out.stdout);
        let ours: Vec<String> = (0..16u64)
            .map(|k| format!("tchaos{}a", (u64::from(std::process::id()) * 16 + k) % 100_000))
            .collect();
        assert!(!list.lines().any(|l| ours.iter().any(|o| l.starts_with(o.as_str()))), "{list}");
    }
}

/// A synthetic history with a resurrection and a lost acknowledged write: the checker must
/// report both, naming the instances, the operations and the observations.
#[test]
fn the_checker_reports_a_resurrection_and_a_lost_write() {
    let (a, b) = ("dc-a", "dc-b");
    let mut cfg = CheckerConfig::new(&[a, b]);
    cfg.hold_ms = 100;
    let mut c = Checker::new(cfg);
    for dc in [a, b] {
        c.process(dc, 0, ProcessEvent::Ready);
    }
    let x = InstanceRef::new("svc", "x");
    let y = InstanceRef::new("svc", "y");
    let acked = |v| Outcome::Acked { version: Some(v), epoch: Some(1) };
    let op = c.invoke(a, &x, OpKind::Register { persistent: true, ttl_ms: 0 }, 10);
    c.complete(op, 12, acked(1));
    let op = c.invoke(a, &y, OpKind::Register { persistent: true, ttl_ms: 0 }, 20);
    c.complete(op, 22, acked(2));
    let view = |ids: &[&str]| {
        Ok(ServiceView {
            index: 1,
            instances: ids
                .iter()
                .map(|id| ObservedInstance {
                    id: (*id).into(),
                    owner_dc: a.into(),
                    seq: if *id == "x" { 1 } else { 2 },
                    status: "up".into(),
                    health: "healthy".into(),
                    stale: false,
                    damped: false,
                })
                .collect(),
        })
    };
    let obs = |dc: &str, t: u64, ids: &[&str]| ViewObservation {
        dc: dc.into(),
        service: "svc".into(),
        scope: ViewScope::All,
        invoked: t,
        completed: t + 1,
        result: view(ids),
    };
    c.observe_view(obs(b, 30, &["x", "y"]));
    let op = c.invoke(a, &x, OpKind::Deregister, 40);
    c.complete(op, 42, acked(3));
    c.observe_view(obs(b, 50, &["y"]));
    c.observe_view(obs(b, 60, &["x", "y"])); // x is back: resurrection
    c.observe_view(obs(a, 70, &[])); // y vanished from its owner: lost write
    for (dc, t) in [(a, 80), (b, 80)] {
        c.observe_view(obs(dc, t, &[]));
        let log = if dc == a { Mark { epoch: 1, seq: 3 } } else { Mark { epoch: 2, seq: 0 } };
        let other = if dc == a { (b, Mark { epoch: 2, seq: 0 }) } else { (a, Mark { epoch: 1, seq: 3 }) };
        c.observe_status(StatusObservation {
            dc: dc.into(),
            invoked: t,
            completed: t + 1,
            result: Ok(StatusView {
                log,
                applied: [(other.0.to_owned(), other.1)].into(),
                ..StatusView::default()
            }),
        });
    }
    let r = c.finish(80);
    assert!(!r.passed());
    let res = r.result(Invariant::NoResurrection).unwrap();
    assert_eq!(res.violations[0].instance, Some(x.clone()));
    assert_eq!(res.violations[0].dc.as_deref(), Some(b));
    let text = res.violations[0].to_string();
    assert!(
        text.contains("deregister invoked 40ms") && text.contains("60..61ms dc-b view of svc: present"),
        "{text}"
    );
    let lost = r.result(Invariant::NoLostAck).unwrap();
    assert!(
        lost.violations.iter().any(|v| v.instance == Some(y.clone()) && v.dc.as_deref() == Some(a)),
        "{lost:#?}"
    );
    assert!(r.result(Invariant::Ownership).unwrap().passed);
}
