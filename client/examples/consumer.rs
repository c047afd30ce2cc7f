//! A consumer that watches one service through tandem and picks an instance every second.
//!
//! Against the two-DC sandbox (`tandem dev`, dc-a on http://127.0.0.1:8500):
//!
//! ```text
//! cargo run -p tandem-client --example consumer -- --service orders
//! cargo run -p tandem-client --example consumer -- --service orders --probe --strategy round-robin
//! ```
//!
//! It prints every change of the instance list (owner DC, status, health, stale flag,
//! weight) and of failover (active or not, and why), says when the registry is unreachable
//! (the cached list keeps serving) or when push-empty protection holds an empty answer,
//! and keeps a disk snapshot in `--snapshot-dir`, so that it starts with the last known list
//! while no registry answers. With `--probe` it opens a TCP connection to each picked
//! instance and reports the result, so failing instances get ejected for a while.

use std::time::Duration;

use tandem_client::sdk::{
    ClientConfig, Consumer, ConsumerStatus, Reported, ServiceView, Strategy, ViewSource,
};

#[path = "common/args.rs"]
mod args;

const USAGE: &str = "A tandem SDK consumer: watch, cache, snapshot, pick

Options:
  --addr URLS           registry addresses of this DC, comma-separated; failover in order
                        [default: http://127.0.0.1:8500]
  --namespace NAME      [default: default]
  --service NAME        [default: orders]
  --snapshot-dir DIR    where the disk snapshot lives [default: .tandem-sdk-cache]
  --strategy S          weighted or round-robin [default: weighted]
  --probe               connect to each picked instance over TCP, report success or failure
  --every-ms MS         pick every this many ms [default: 1000]";

struct Args {
    addr: Vec<String>,
    namespace: String,
    service: String,
    snapshot_dir: std::path::PathBuf,
    strategy: Strategy,
    probe: bool,
    every_ms: u64,
}

impl Args {
    fn parse() -> Args {
        let o = args::Opts::parse(
            USAGE,
            &["addr", "namespace", "service", "snapshot-dir", "strategy", "every-ms"],
            &["probe"],
        );
        let strategy = match o.get("strategy", "weighted".to_owned()).as_str() {
            "weighted" => Strategy::WeightedRandom,
            "round-robin" => Strategy::RoundRobin,
            other => {
                eprintln!("error: --strategy {other:?}: use weighted or round-robin");
                std::process::exit(2);
            }
        };
        Args {
            addr: o.get("addr", "http://127.0.0.1:8500".to_owned()).split(',').map(str::to_owned).collect(),
            namespace: o.get("namespace", "default".to_owned()),
            service: o.get("service", "orders".to_owned()),
            snapshot_dir: o.get("snapshot-dir", ".tandem-sdk-cache".into()),
            strategy,
            probe: o.flag("probe"),
            every_ms: o.get("every-ms", 1_000),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    tracing_subscriber::fmt().with_max_level(log_level()).init();

    let mut cfg = ClientConfig::new(args.addr.clone());
    cfg.consumer.snapshot_dir = Some(args.snapshot_dir.clone());
    cfg.consumer.strategy = args.strategy;
    cfg.consumer.ejection.consecutive_failures = 3;
    cfg.consumer.ejection.base = Duration::from_secs(10);

    let consumer = Consumer::watch(cfg, &args.namespace, &args.service).await?;
    println!("watching {}/{} through {}", args.namespace, args.service, args.addr.join(", "));
    print_view(&consumer.view());
    let mut changes = consumer.changes();
    changes.borrow_and_update();
    let mut last_status = consumer.status();
    let mut tick = tokio::time::interval(Duration::from_millis(args.every_ms.max(50)));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            r = changes.changed() => {
                if r.is_err() {
                    break;
                }
                let v = changes.borrow_and_update().clone();
                print_view(&v);
            }
            _ = tick.tick() => {
                let st = consumer.status();
                report_status(&last_status, &st, consumer.instances().len());
                last_status = st;
                match consumer.pick() {
                    None => println!("pick: no instance to call"),
                    Some(i) if args.probe => {
                        let target = format!("{}:{}", i.address, i.port);
                        let ok = matches!(
                            tokio::time::timeout(Duration::from_millis(500), tokio::net::TcpStream::connect(&target)).await,
                            Ok(Ok(_))
                        );
                        if ok {
                            consumer.report_success(&i);
                            println!("pick: {} ({}) at {target}: reachable", i.instance_id, i.owner_dc);
                        } else {
                            let r = consumer.report_failure(&i);
                            let what = match r {
                                Reported::Ejected { .. } => "unreachable; ejected for a while".to_owned(),
                                Reported::EjectionRefused { failures } => {
                                    format!("unreachable ({failures} in a row); not ejected: too many are out already")
                                }
                                Reported::Counted { failures } => format!("unreachable ({failures} in a row)"),
                                Reported::AlreadyEjected => "unreachable (already ejected)".to_owned(),
                                Reported::NotInView => "unreachable (and gone from the list meanwhile)".to_owned(),
                            };
                            println!("pick: {} ({}) at {target}: {what}", i.instance_id, i.owner_dc);
                        }
                    }
                    Some(i) => println!("pick: {} ({}) at {}:{}", i.instance_id, i.owner_dc, i.address, i.port),
                }
            }
        }
    }
    consumer.close().await;
    Ok(())
}

fn print_view(v: &ServiceView) {
    let source = match v.source {
        ViewSource::Empty => "nothing yet".to_owned(),
        ViewSource::Registry => format!("registry, index {}", v.index),
        ViewSource::Snapshot { saved_at_ms } => {
            format!("disk snapshot saved at {saved_at_ms} ms since epoch")
        }
    };
    println!("== {}/{}: {} instance(s) ({source})", v.namespace, v.service, v.instances.len());
    if let Some(f) = &v.failover {
        if f.active {
            println!("   failover ACTIVE to {:?}: {}", f.dcs, f.reason);
        } else {
            println!("   failover inactive: {}", f.reason);
        }
    }
    if v.protected {
        println!("   protect threshold engaged: unhealthy local instances are listed");
    }
    for i in &v.instances {
        println!(
            "   {:<6} {:<48} {}:{:<5} {:<14} {:<9} weight {:>3}{}",
            i.owner_dc,
            i.instance_id,
            i.address,
            i.port,
            i.status.as_str(),
            format!("{:?}", i.health).to_lowercase(),
            i.weight,
            if i.stale { "  STALE" } else { "" }
        );
    }
}

fn report_status(before: &ConsumerStatus, now: &ConsumerStatus, cached: usize) {
    if before.connected && !now.connected {
        println!(
            "registry unreachable ({}); serving {cached} cached instance(s)",
            now.last_error.as_deref().unwrap_or("?")
        );
    }
    if !before.connected && now.connected {
        println!("registry answers again");
    }
    if let (None, Some(p)) = (before.empty_held, now.empty_held) {
        println!(
            "push-empty protection: the registry answered an empty list (index {}); keeping {cached} cached instance(s) until confirmed",
            p.index
        );
    }
    if before.empty_held.is_some() && now.empty_held.is_none() {
        println!("push-empty protection released");
    }
    if now.snapshot_error.is_some() && now.snapshot_error != before.snapshot_error {
        println!("snapshot: {}", now.snapshot_error.as_deref().unwrap_or_default());
    }
}

/// The SDK's log level: `RUST_LOG` as one level name (error, warn, info, debug, trace).
fn log_level() -> tracing::Level {
    std::env::var("RUST_LOG").ok().and_then(|l| l.parse().ok()).unwrap_or(tracing::Level::ERROR)
}
