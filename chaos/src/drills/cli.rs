//! The command line: `tandem chaos <drills> [--seed] [--duration] [--netns | --target-a
//! --target-b [--fault-hook]] ...`, which runs drills one after the other and sums them up.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::{run_drill, DrillOptions};
use crate::cluster::Environment;
use crate::plan::DrillKind;
use crate::report::DrillReport;

#[derive(Parser, Debug)]
#[command(
    name = "tandem chaos",
    about = "Partition-heal chaos drills with a seeded workload and an invariant checker",
    after_help = "Drills: partition-heal, one-way-partition, flapping-link, crash-restart, pause, packet-chaos, long-partition, restore-rollback, split-incarnation, leader-kill, leader-isolated, follower-partition, failover-leases, rolling-upgrade, node-disk-loss, add-remove-node, backup-restore; `all` runs them all, `list` describes them.\n\
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
    /// With targets that have ACLs on: the token every request presents, valid at both DCs.
    /// Its policy needs `read` and `write` on `namespace = "*"` (the drill's namespace is a
    /// fresh `chaos-<random>`), `status` and `metrics`; or `admin`.
    #[arg(long, env = "TANDEM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Every recovery (and the final convergence) must complete within this.
    #[arg(long, default_value = "20s")]
    recovery_budget: String,
    /// Exit status when a drill was SKIPPED and none failed.
    #[arg(long, default_value_t = 0)]
    skipped_exit_code: u8,
    /// Only the final tables.
    #[arg(long)]
    quiet: bool,
    /// Nodes per DC in the sandbox: 1, or a Raft group (3 or 5). Default: 3 for
    /// leader-kill, leader-isolated, follower-partition and failover-leases, 1 for the
    /// others.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=9))]
    nodes: Option<u16>,
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
            token: cli.token.clone(),
            nodes: cli.nodes.map_or(kind.nodes_default(), usize::from),
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
    fn the_help_names_every_drill() {
        let help = <ChaosCli as clap::CommandFactory>::command().render_long_help().to_string();
        for kind in DrillKind::ALL {
            assert!(
                help.contains(&format!(" {},", kind.name())) || help.contains(&format!(" {};", kind.name())),
                "{kind} is missing from the help"
            );
        }
    }
}
