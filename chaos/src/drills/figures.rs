//! The report's figures: operation counts from the checker, replication lag and counters
//! from the status samples (summed across process restarts), and what /metrics said at
//! the end.

use std::time::Duration;

use crate::api::Api;
use crate::checker::CheckReport;
use crate::report::{Figures, Quantiles, RecoveryRow, Sample};

/// Sum of `tandem_peer_snapshots_{sent,installed}_total` over both DCs, as /metrics says
/// at the end (counters restart with the process).
pub(super) async fn snapshot_metrics(api: &Api, bases: &[String; 2]) -> Option<(u64, u64)> {
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

pub(super) fn figures(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_across_restarts() {
        let s = |t, v| Sample { t_ms: t, side: 0, events_applied: v, ..Sample::default() };
        let samples = vec![s(1, 5), s(2, 10), s(3, 2), s(4, 7)];
        assert_eq!(cumulative(&samples, 0, |x| x.events_applied), 17);
    }
}
