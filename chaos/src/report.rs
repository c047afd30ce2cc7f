//! The drill report: the readable table, the JSON file and the timeline SVG.
//!
//! The JSON is this module's output format (documented in docs/chaos.md); the structs below
//! exist only to be written, never read back by the drills.

use std::fmt::Write as _;

use serde::Serialize;

use crate::checker::{CheckReport, Violation};

/// One status sample of one DC, for figures and the plot.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub t_ms: u64,
    pub side: usize,
    /// Instances held (every owner).
    pub instances: u64,
    /// The peer's events not yet applied here: the peer's latest observed log position minus
    /// this DC's applied mark of the peer (filled in by the drill; counts a partition's
    /// backlog, which the DC itself cannot see).
    pub lag_events: u64,
    /// The same as this DC reports it (`lag_events` in /v1/status: the peer's position as
    /// last told, so it stays 0 while the link is down).
    pub reported_lag_events: u64,
    /// This DC's applied mark of the peer.
    pub applied_peer_seq: u64,
    pub lag_ms_p50: Option<u64>,
    pub lag_ms_p99: Option<u64>,
    /// Counters as reported (they restart with the process).
    pub events_applied: u64,
    pub snapshots_sent: u64,
    pub snapshots_installed: u64,
    pub purge_floor: u64,
    pub last_seq: u64,
}

/// A fault window, for shading.
#[derive(Clone, Debug, Serialize)]
pub struct FaultWindow {
    pub label: String,
    pub start_ms: u64,
    pub end_ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct InvariantRow {
    pub name: String,
    pub passed: bool,
    pub checks: u64,
    pub detail: String,
    pub violations_total: u64,
    pub violations: Vec<ViolationJson>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ViolationJson {
    pub invariant: String,
    pub at_ms: u64,
    pub dc: Option<String>,
    pub instance: Option<String>,
    pub summary: String,
    pub operations: Vec<String>,
    pub observations: Vec<String>,
}

impl From<&Violation> for ViolationJson {
    fn from(v: &Violation) -> Self {
        ViolationJson {
            invariant: v.invariant.name().into(),
            at_ms: v.at,
            dc: v.dc.clone(),
            instance: v.instance.as_ref().map(|i| i.to_string()),
            summary: v.summary.clone(),
            operations: v.ops.clone(),
            observations: v.observations.clone(),
        }
    }
}

/// A drill-specific expectation (for example: the snapshot path was really taken).
#[derive(Clone, Debug, Serialize)]
pub struct Expectation {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Quantiles {
    pub p50: Option<u64>,
    pub p99: Option<u64>,
    pub max: Option<u64>,
}

impl Quantiles {
    pub fn of(mut v: Vec<u64>) -> Quantiles {
        if v.is_empty() {
            return Quantiles::default();
        }
        v.sort_unstable();
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        Quantiles { p50: Some(q(0.5)), p99: Some(q(0.99)), max: v.last().copied() }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RecoveryRow {
    pub label: String,
    pub at_ms: u64,
    pub catch_up_ms: Option<u64>,
    pub interrupted_after_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    pub ops_invoked: u64,
    pub registers: u64,
    pub deregisters: u64,
    pub status_changes: u64,
    pub lease_stops: u64,
    pub acked: u64,
    pub failed: u64,
    pub unknown: u64,
    pub heartbeats: u64,
    pub heartbeats_acked: u64,
    pub heartbeats_unknown_instance: u64,
    pub heartbeats_failed: u64,
    pub heartbeats_unknown: u64,
    /// Events applied by the receiving DC, per direction, summed across its restarts.
    pub events_shipped: [u64; 2],
    /// Of the inbound lag samples in /v1/status (commit-to-apply ms, recent window).
    pub lag_ms: Quantiles,
    pub lag_events_max: u64,
    pub recoveries: Vec<RecoveryRow>,
    /// From the end of the workload (quiescence) to identical views and caught-up marks.
    pub final_convergence_ms: Option<u64>,
    pub snapshots_sent: [u64; 2],
    pub snapshots_installed: [u64; 2],
    pub purge_floor_max: [u64; 2],
    /// (forwarded, dropped) datagrams a->b and b->a, when relays were used.
    pub relay_datagrams: Option<[(u64, u64); 2]>,
    pub view_observations: u64,
    pub status_observations: u64,
    pub instances_created: u64,
    pub instances_final: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct DrillReport {
    pub drill: String,
    pub seed: u64,
    pub seed_hex: String,
    pub mode: String,
    pub environment: String,
    pub dcs: [String; 2],
    pub namespace: String,
    pub span_ms: u64,
    pub elapsed_ms: u64,
    /// "pass", "fail" or "skipped".
    pub result: String,
    pub skipped_reason: Option<String>,
    pub invariants: Vec<InvariantRow>,
    pub expectations: Vec<Expectation>,
    pub figures: Figures,
    pub faults: Vec<FaultWindow>,
    pub notes: Vec<String>,
    pub dir: String,
    pub replay: String,
}

impl DrillReport {
    pub fn passed(&self) -> bool {
        self.result == "pass"
    }

    pub fn invariant_rows(check: &CheckReport) -> Vec<InvariantRow> {
        check
            .invariants
            .iter()
            .map(|r| InvariantRow {
                name: r.invariant.name().into(),
                passed: r.passed,
                checks: r.checks,
                detail: r.detail.clone(),
                violations_total: r.violations_total,
                violations: r.violations.iter().map(ViolationJson::from).collect(),
            })
            .collect()
    }

    /// The readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let verdict = match self.result.as_str() {
            "pass" => "PASS",
            "fail" => "FAIL",
            _ => "SKIPPED",
        };
        let _ = writeln!(
            s,
            "\n== drill {} | seed {} | {} | {} | {:.1}s | {verdict}",
            self.drill,
            self.seed_hex,
            self.mode,
            self.environment,
            self.elapsed_ms as f64 / 1000.0
        );
        if let Some(r) = &self.skipped_reason {
            let _ = writeln!(s, "SKIPPED: {r} (no invariant was checked)");
            return s;
        }
        let _ = writeln!(s, "{:<18} {:<6} detail", "invariant", "result");
        for r in &self.invariants {
            let res = if r.passed { "pass".to_owned() } else { format!("FAIL({})", r.violations_total) };
            let _ = writeln!(s, "{:<18} {:<6} {}", r.name, res, r.detail);
        }
        for e in &self.expectations {
            let res = if e.passed { "pass" } else { "FAIL" };
            let _ = writeln!(s, "{:<18} {:<6} {}", e.name, res, e.detail);
        }
        let f = &self.figures;
        let _ = writeln!(
            s,
            "ops: {} invoked ({} register, {} deregister, {} status, {} lease stops) -> {} acked, {} failed, {} unknown",
            f.ops_invoked, f.registers, f.deregisters, f.status_changes, f.lease_stops, f.acked, f.failed, f.unknown
        );
        let _ = writeln!(
            s,
            "heartbeats: {} sent, {} acked, {} failed ({} of them unknown-instance), {} timed out",
            f.heartbeats,
            f.heartbeats_acked,
            f.heartbeats_failed,
            f.heartbeats_unknown_instance,
            f.heartbeats_unknown
        );
        let _ = writeln!(
            s,
            "events shipped: {}->{} {}, {}->{} {}; snapshots sent {}/{} installed {}/{} ({}/{}); purge floor max {}/{}",
            self.dcs[0],
            self.dcs[1],
            f.events_shipped[0],
            self.dcs[1],
            self.dcs[0],
            f.events_shipped[1],
            f.snapshots_sent[0],
            f.snapshots_sent[1],
            f.snapshots_installed[0],
            f.snapshots_installed[1],
            self.dcs[0],
            self.dcs[1],
            f.purge_floor_max[0],
            f.purge_floor_max[1],
        );
        let q = |v: Option<u64>| v.map_or("-".to_owned(), |x| x.to_string());
        let _ = writeln!(
            s,
            "replication lag ms: p50 {} p99 {} max {}; lag events max {}",
            q(f.lag_ms.p50),
            q(f.lag_ms.p99),
            q(f.lag_ms.max),
            f.lag_events_max
        );
        let rec: Vec<String> = f
            .recoveries
            .iter()
            .map(|r| match (r.catch_up_ms, r.interrupted_after_ms) {
                (Some(c), _) => format!("{}@{:.1}s: {c}ms", r.label, r.at_ms as f64 / 1000.0),
                (None, Some(i)) => {
                    format!("{}@{:.1}s: interrupted after {i}ms", r.label, r.at_ms as f64 / 1000.0)
                }
                (None, None) => format!("{}@{:.1}s: never", r.label, r.at_ms as f64 / 1000.0),
            })
            .collect();
        let _ = writeln!(
            s,
            "convergence after heals: {}; final convergence {} after the workload stopped",
            if rec.is_empty() { "-".to_owned() } else { rec.join(", ") },
            f.final_convergence_ms.map_or("not reached".to_owned(), |m| format!("{m}ms"))
        );
        if let Some([ab, ba]) = f.relay_datagrams {
            let _ = writeln!(
                s,
                "relay datagrams: {}->{} {} forwarded / {} dropped, {}->{} {} / {}",
                self.dcs[0], self.dcs[1], ab.0, ab.1, self.dcs[1], self.dcs[0], ba.0, ba.1
            );
        }
        let _ = writeln!(
            s,
            "observations: {} views, {} statuses; instances: {} created, {} at the end",
            f.view_observations, f.status_observations, f.instances_created, f.instances_final
        );
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        for r in &self.invariants {
            for v in &r.violations {
                let _ = writeln!(
                    s,
                    "\nVIOLATION [{}] at {}ms{}{}: {}",
                    v.invariant,
                    v.at_ms,
                    v.dc.as_ref().map_or(String::new(), |d| format!(" in {d}")),
                    v.instance.as_ref().map_or(String::new(), |i| format!(", instance {i}")),
                    v.summary
                );
                for o in &v.operations {
                    let _ = writeln!(s, "    op  {o}");
                }
                for o in &v.observations {
                    let _ = writeln!(s, "    obs {o}");
                }
            }
            if r.violations_total > r.violations.len() as u64 {
                let _ = writeln!(
                    s,
                    "... and {} more {} violations (see the JSON report)",
                    r.violations_total - r.violations.len() as u64,
                    r.name
                );
            }
        }
        let _ = writeln!(s, "replay: {}", self.replay);
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The timeline plot.
// ---------------------------------------------------------------------------------------------

const W: f64 = 1000.0;
const PANEL_H: f64 = 150.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const GAP: f64 = 45.0;
const COLORS: [&str; 2] = ["#1f77b4", "#d62728"];

/// Samples further apart than this are not joined by a line.
const PLOT_GAP_MS: u64 = 1_500;

/// A plotted quantity of a sample.
type Metric = Box<dyn Fn(&Sample) -> Option<f64>>;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Hand-written SVG: per DC the instance count, the lag in events and the recent p99 lag
/// in ms, over the drill, with fault windows shaded.
pub fn timeline_svg(report: &DrillReport, samples: &[Sample]) -> String {
    let span = samples.iter().map(|s| s.t_ms).max().unwrap_or(0).max(report.span_ms).max(1) as f64;
    let panels: [(&str, Metric); 3] = [
        ("instances held", Box::new(|s: &Sample| Some(s.instances as f64))),
        ("replication lag (events not yet applied)", Box::new(|s: &Sample| Some(s.lag_events as f64))),
        ("replication lag p99 (ms, recent window)", Box::new(|s: &Sample| s.lag_ms_p99.map(|v| v as f64))),
    ];
    let h = TOP + panels.len() as f64 * (PANEL_H + GAP) + 30.0;
    let plot_w = W - LEFT - RIGHT;
    let x = |t: u64| LEFT + (t as f64 / span) * plot_w;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">tandem chaos: {} (seed {}, {}) — {}</text>"#,
        esc(&report.drill),
        esc(&report.seed_hex),
        esc(&report.mode),
        esc(&report.result.to_uppercase())
    );
    for (pi, (title, f)) in panels.iter().enumerate() {
        let y0 = TOP + pi as f64 * (PANEL_H + GAP);
        let vals: Vec<f64> = samples.iter().filter_map(f).collect();
        let vmax = vals.iter().copied().fold(0.0f64, f64::max).max(1.0) * 1.1;
        let y = |v: f64| y0 + PANEL_H - (v / vmax) * PANEL_H;
        // Fault windows.
        for (k, fw) in report.faults.iter().enumerate() {
            let (x0, x1) = (x(fw.start_ms), x(fw.end_ms.max(fw.start_ms)));
            let _ = writeln!(
                s,
                r##"<rect x="{x0:.1}" y="{y0:.1}" width="{:.1}" height="{PANEL_H}" fill="#f0a030" fill-opacity="0.22"><title>{}</title></rect>"##,
                (x1 - x0).max(1.5),
                esc(&fw.label)
            );
            // Labels inside the first panel, on alternating rows; narrow windows only get
            // the tooltip.
            if pi == 0 && x1 - x0 >= 40.0 {
                let _ = writeln!(
                    s,
                    r##"<text x="{:.1}" y="{:.1}" fill="#a06000" font-size="9">{}</text>"##,
                    x0 + 2.0,
                    y0 + 10.0 + (k % 2) as f64 * 10.0,
                    esc(&fw.label)
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#888"/>"##
        );
        let _ =
            writeln!(s, r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#, y0 - 6.0, esc(title));
        for k in 0..=4 {
            let v = vmax * f64::from(k) / 4.0;
            let yy = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eee"/>"##,
                LEFT + plot_w
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"#,
                LEFT - 4.0,
                yy + 4.0,
                v
            );
        }
        for (side, color) in COLORS.iter().enumerate() {
            // One polyline per run of samples: a gap (the process was down) is not bridged.
            let mut runs: Vec<Vec<String>> = Vec::new();
            let mut last_t: Option<u64> = None;
            for p in samples.iter().filter(|p| p.side == side) {
                let Some(v) = f(p) else { continue };
                if last_t.is_none_or(|t| p.t_ms.saturating_sub(t) > PLOT_GAP_MS) {
                    runs.push(Vec::new());
                }
                last_t = Some(p.t_ms);
                if let Some(run) = runs.last_mut() {
                    run.push(format!("{:.1},{:.1}", x(p.t_ms), y(v)));
                }
            }
            for run in runs.iter().filter(|r| !r.is_empty()) {
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.4" points="{}"/>"#,
                    run.join(" ")
                );
            }
        }
    }
    // Time axis and legend.
    let yb = TOP + panels.len() as f64 * (PANEL_H + GAP) - GAP + 14.0;
    let step = nice_step(span / 1000.0 / 10.0);
    let mut t = 0.0;
    while t <= span / 1000.0 + 1e-9 {
        let xx = x((t * 1000.0) as u64);
        let _ = writeln!(s, r#"<text x="{xx:.1}" y="{yb:.1}" text-anchor="middle">{t:.0}s</text>"#);
        t += step;
    }
    for (side, color) in COLORS.iter().enumerate() {
        let lx = LEFT + 10.0 + side as f64 * 120.0;
        let ly = h - 10.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{ly}">{}</text>"#,
            lx + 20.0,
            ly - 4.0,
            ly - 4.0,
            lx + 25.0,
            esc(&report.dcs[side]),
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#555">lag of a DC: the other DC's log position minus its applied mark of it</text>"##,
        LEFT + 250.0,
        h - 10.0
    );
    let _ = writeln!(
        s,
        r##"<rect x="{:.1}" y="{:.1}" width="14" height="10" fill="#f0a030" fill-opacity="0.4"/><text x="{:.1}" y="{:.1}">fault window</text>"##,
        LEFT + 720.0,
        h - 19.0,
        LEFT + 738.0,
        h - 10.0
    );
    s.push_str("</svg>\n");
    s
}

fn nice_step(raw: f64) -> f64 {
    for c in [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0] {
        if c >= raw {
            return c;
        }
    }
    7200.0
}
