//! A tiny Prometheus text writer for `GET /metrics` (see `metrics`): counters, gauges and
//! histograms, grouped by family.

use std::fmt::Write as _;

/// A tiny Prometheus text writer: samples are grouped by family, each family's HELP and
/// TYPE written once, in first-seen order.
#[derive(Default)]
pub(super) struct Metrics {
    families: Vec<(&'static str, String, &'static str, Vec<String>)>,
}

impl Metrics {
    fn sample(
        &mut self,
        name: &'static str,
        help: &str,
        kind: &'static str,
        labels: &[(&str, &str)],
        v: f64,
    ) {
        let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let line =
            if l.is_empty() { format!("{name} {v}") } else { format!("{name}{{{}}} {v}", l.join(",")) };
        match self.families.iter_mut().find(|f| f.0 == name) {
            Some(f) => f.3.push(line),
            None => self.families.push((name, help.to_owned(), kind, vec![line])),
        }
    }
    pub(super) fn counter(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: u64) {
        self.sample(name, help, "counter", labels, v as f64);
    }
    /// A counter of a fractional amount (seconds).
    pub(super) fn counter_f64(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.sample(name, help, "counter", labels, v);
    }
    pub(super) fn gauge(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.sample(name, help, "gauge", labels, v);
    }
    /// A histogram family: cumulative `_bucket` samples at each upper bound (in seconds,
    /// then `+Inf`), `_sum` and `_count`. `counts` has one more entry than `bounds_s`.
    pub(super) fn histogram(
        &mut self,
        name: &'static str,
        help: &str,
        labels: &[(&str, &str)],
        bounds_s: &[f64],
        counts: &[u64],
        sum_s: f64,
    ) {
        let mut lines = Vec::with_capacity(counts.len() + 2);
        let mut cumulative = 0u64;
        let base: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        for (i, c) in counts.iter().enumerate() {
            cumulative += c;
            let le = bounds_s.get(i).map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let mut l = base.clone();
            l.push(format!("le=\"{le}\""));
            lines.push(format!("{name}_bucket{{{}}} {cumulative}", l.join(",")));
        }
        lines.push(format!("{name}_sum{{{}}} {sum_s}", base.join(",")));
        lines.push(format!("{name}_count{{{}}} {cumulative}", base.join(",")));
        match self.families.iter_mut().find(|f| f.0 == name) {
            Some(f) => f.3.extend(lines),
            None => self.families.push((name, help.to_owned(), "histogram", lines)),
        }
    }
    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, kind, lines) in &self.families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for l in lines {
                let _ = writeln!(out, "{l}");
            }
        }
        out
    }
}

/// A label value, escaped as the text format asks.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
