//! The files of a run: summary.json, timeseries.csv and latency.csv (the same keys and
//! columns from the lab and the simulator).

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::metrics::ModeReport;
use crate::results::BIN_MS;
use crate::summary::Summary;

/// Quantiles written to latency.csv (enough points for a CDF plot).
fn cdf_quantiles() -> impl Iterator<Item = f64> {
    (0..100)
        .map(|i| i as f64 / 100.0)
        .chain([0.995, 0.999, 0.9995, 0.9999, 1.0])
}

/// Writes `summary.json`, `timeseries.csv` (per mode, repetition and tenant: Mb/s per
/// [`BIN_MS`] bin) and `latency.csv` (per mode and tenant: latency at CDF quantiles).
pub fn write_outputs(dir: &Path, summary: &Summary, modes: &[ModeReport]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(summary)?;
    write(dir, "summary.json", &json)?;
    let mut ts = String::from("mode,repeat,tenant,t_ms,mbps\n");
    for m in modes {
        for (rep, results) in m.repetitions.iter().enumerate() {
            let mut per_tenant: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
            for r in results {
                let acc = per_tenant.entry(&r.tenant).or_default();
                acc.resize(acc.len().max(r.series.len()), 0);
                for (a, b) in acc.iter_mut().zip(&r.series) {
                    *a += b;
                }
            }
            for (tenant, bins) in per_tenant {
                for (i, bytes) in bins.iter().enumerate() {
                    let mbps = *bytes as f64 * 8.0 / (BIN_MS as f64 * 1e3);
                    let _ = writeln!(
                        ts,
                        "{},{},{},{},{:.3}",
                        m.name,
                        rep,
                        tenant,
                        i as u64 * BIN_MS,
                        mbps
                    );
                }
            }
        }
    }
    write(dir, "timeseries.csv", &ts)?;
    let mut lat = String::from("mode,tenant,quantile,latency_us\n");
    for m in modes {
        for (tenant, h) in &m.latency {
            for q in cdf_quantiles() {
                let us = h.value_at_quantile(q) as f64 / 1000.0;
                let _ = writeln!(lat, "{},{},{},{:.3}", m.name, tenant, q, us);
            }
        }
    }
    write(dir, "latency.csv", &lat)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}
