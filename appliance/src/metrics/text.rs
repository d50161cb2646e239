//! A small encoder for the Prometheus text exposition format (version 0.0.4): `# HELP` and
//! `# TYPE` once per family, then its samples. Label values are escaped as the format requires
//! (backslash, double quote, line feed); metric and label names are ours, never a caller's.

use std::fmt::{Display, Write};

use super::histogram::HistogramSnapshot;

/// The content type of what [`Exposition`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a family: its help text and type.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of the current family.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// The samples of one histogram: cumulative `_bucket`s with `le` (`+Inf` last), `_sum`
    /// (if known) and `_count`. Bounds and sum are in microseconds; the exposition is in seconds.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0u64;
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = match h.bounds_us.get(i) {
                Some(us) => seconds(*us),
                None => "+Inf".to_owned(),
            };
            self.out.push_str(name);
            self.out.push_str("_bucket");
            write_labels(&mut self.out, labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        if let Some(sum_us) = h.sum_us {
            self.sample(&format!("{name}_sum"), labels, seconds(sum_us));
        }
        self.sample(&format!("{name}_count"), labels, cumulative);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Microseconds as decimal seconds, exactly (no float rounding): 2500 -> "0.0025".
pub fn seconds(us: u64) -> String {
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:06}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut e = Exposition::new();
        e.family("edgevol_x_total", Kind::Counter, "A help\nline.");
        e.sample("edgevol_x_total", &[("a", "q\"b\\c\nd"), ("b", "2")], 7);
        e.sample("edgevol_y", &[], 1.5);
        assert_eq!(
            e.finish(),
            "# HELP edgevol_x_total A help\\nline.\n# TYPE edgevol_x_total counter\n\
             edgevol_x_total{a=\"q\\\"b\\\\c\\nd\",b=\"2\"} 7\nedgevol_y 1.5\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_in_seconds() {
        let mut e = Exposition::new();
        let h = HistogramSnapshot {
            bounds_us: vec![10, 2_500, 1_000_000],
            counts: vec![1, 0, 2, 3],
            sum_us: Some(3_000_250),
        };
        e.histogram("h_seconds", &[("m", "x")], &h);
        assert_eq!(
            e.finish(),
            "h_seconds_bucket{m=\"x\",le=\"0.00001\"} 1\n\
             h_seconds_bucket{m=\"x\",le=\"0.0025\"} 1\n\
             h_seconds_bucket{m=\"x\",le=\"1\"} 3\n\
             h_seconds_bucket{m=\"x\",le=\"+Inf\"} 6\n\
             h_seconds_sum{m=\"x\"} 3.00025\n\
             h_seconds_count{m=\"x\"} 6\n"
        );
    }
}
