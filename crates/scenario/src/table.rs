//! The side-by-side table of a [`Summary`] printed after a run: one row per mode and
//! tenant, then transfer completions, scenario metrics and pass marks.

use std::fmt::Write as _;

use crate::summary::Summary;

impl Summary {
    /// The side-by-side table: one row per mode and tenant.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<14} {:<10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>4} {:>9} {:>9}",
            "mode",
            "tenant",
            "Mb/s",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "loss %",
            "SLO",
            "p99/alone",
            "Mb/s/alone"
        );
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        for mode in &self.mode_order {
            for (tenant, m) in &self.modes[mode] {
                let r = self.ratios.get(mode).filter(|_| tenant == &self.victim);
                let _ = writeln!(
                    s,
                    "{:<14} {:<10} {:>10.1} {:>10} {:>10} {:>10} {:>8.3} {:>4} {:>9} {:>9}",
                    mode,
                    tenant,
                    m.throughput_bps / 1e6,
                    opt(m.p50_us),
                    opt(m.p99_us),
                    opt(m.p999_us),
                    m.loss * 100.0,
                    match m.slo_met {
                        Some(true) => "yes",
                        Some(false) => "NO",
                        None => "-",
                    },
                    r.and_then(|r| r.victim_p99_ratio)
                        .map_or("-".into(), |v| format!("{v:.2}x")),
                    r.and_then(|r| r.victim_throughput_ratio)
                        .map_or("-".into(), |v| format!("{v:.2}x")),
                );
                if let Some(sp) = &m.spread {
                    for (label, thr, p50, p99, p999, loss) in [
                        (
                            "  min",
                            sp.throughput_bps_min,
                            sp.p50_us_min,
                            sp.p99_us_min,
                            sp.p999_us_min,
                            sp.loss_min,
                        ),
                        (
                            "  max",
                            sp.throughput_bps_max,
                            sp.p50_us_max,
                            sp.p99_us_max,
                            sp.p999_us_max,
                            sp.loss_max,
                        ),
                    ] {
                        let _ = writeln!(
                            s,
                            "{:<14} {:<10} {:>10.1} {:>10} {:>10} {:>10} {:>8.3}",
                            label,
                            format!("(of {})", sp.repetitions),
                            thr / 1e6,
                            opt(p50),
                            opt(p99),
                            opt(p999),
                            loss * 100.0,
                        );
                    }
                }
            }
        }
        let completions: Vec<String> = self
            .mode_order
            .iter()
            .flat_map(|mode| {
                self.modes[mode].iter().filter_map(move |(t, m)| {
                    let c = m.completion_ms?;
                    let range = m
                        .spread
                        .as_ref()
                        .and_then(|sp| Some((sp.completion_ms_min?, sp.completion_ms_max?)))
                        .map_or(String::new(), |(a, b)| format!(" [{a:.0}..{b:.0}]"));
                    Some(format!("{mode}/{t} {c:.0} ms{range}"))
                })
            })
            .collect();
        if !completions.is_empty() {
            let _ = writeln!(s, "transfer completion: {}", completions.join(", "));
        }
        for (mode, metrics) in &self.metrics {
            let list: Vec<String> = metrics.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
            let _ = writeln!(s, "metrics [{mode}] {}", list.join(", "));
        }
        for c in &self.checks {
            let _ = writeln!(
                s,
                "check [{}] {:<32} value {:>10}  {}",
                c.mode,
                c.name,
                opt(c.value),
                if c.pass { "pass" } else { "FAIL" }
            );
        }
        let _ = writeln!(s, "overall: {}", if self.pass { "PASS" } else { "FAIL" });
        s
    }
}
