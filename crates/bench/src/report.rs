//! The bench's tables (markdown, as docs/BENCHMARKS.md shows them) and JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{BenchArgs, LoadPoint, MaxPoint};

/// CPU-per-packet ratios reported at every load: (name, device, reference).
const RATIOS: [(&str, &str, &str); 9] = [
    ("picnic/raw", "picnic", "raw"),
    ("picnic/ovs_afxdp", "picnic", "ovs_afxdp"),
    ("picnic/picnic_off", "picnic", "picnic_off"),
    ("picnic_xdp/raw_xdp", "picnic_xdp", "raw_xdp"),
    ("picnic_xdp/ovs_afxdp", "picnic_xdp", "ovs_afxdp"),
    ("picnic/bridge", "picnic", "bridge"),
    ("picnic_xdp/bridge", "picnic_xdp", "bridge"),
    ("picnic_fast/bridge", "picnic_fast", "bridge"),
    ("picnic_fast/raw", "picnic_fast", "raw"),
];

/// CPU ns per packet of device / reference at one point, where both were measured.
fn ratios(loads: &[LoadPoint], size: usize, flows: u16, pct: u32) -> BTreeMap<&'static str, f64> {
    let find = |dut: &str| {
        loads
            .iter()
            .find(|p| p.dut == dut && p.size == size && p.flows == flows && p.load_pct == pct)
    };
    RATIOS
        .iter()
        .filter_map(|&(name, a, b)| {
            let (a, b) = (find(a)?, find(b)?);
            Some((name, a.cpu_ns_per_pkt / b.cpu_ns_per_pkt))
        })
        .collect()
}

/// The slowest device's maximum at one size and flow count.
fn slowest(maxima: &[MaxPoint], size: usize, flows: u16) -> Option<&MaxPoint> {
    maxima
        .iter()
        .filter(|m| m.size == size && m.flows == flows)
        .min_by(|a, b| a.pps.total_cmp(&b.pps))
}

/// Prints the equal-load table (primary), the ratios and the maximum-rate table.
pub fn print(maxima: &[MaxPoint], loads: &[LoadPoint], args: &BenchArgs) {
    println!("Equal offered loads (CPU ns per forwarded packet = the device's threads + softirq; latency of every frame, us):");
    println!();
    println!("| frame | flows | load | device | delivered | CPU ns/pkt | threads | softirq | waited for CPU | p50 us | p99 us | p99.9 us |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &size in &args.sizes {
        for &flows in &args.flows {
            for &pct in &args.loads {
                for p in loads
                    .iter()
                    .filter(|p| p.size == size && p.flows == flows && p.load_pct == pct)
                {
                    println!(
                        "| {size} B | {flows} | {pct}% = {:.0} kpps | {} | {:.1}% | {:.0} | {:.0} | {:.0} | {:.1}% | {:.1} | {:.1} | {:.1} |",
                        p.offered_pps / 1e3,
                        p.dut,
                        100.0 * p.delivered_pps / p.offered_pps,
                        p.cpu_ns_per_pkt,
                        p.threads_ns_per_pkt,
                        p.softirq_ns_per_pkt,
                        p.cpu_wait_pct,
                        p.p50_us,
                        p.p99_us,
                        p.p999_us
                    );
                }
            }
        }
    }
    println!();
    for &size in &args.sizes {
        for &flows in &args.flows {
            if let Some(m) = slowest(maxima, size, flows) {
                println!(
                    "loads {size} B, {flows} flow(s): percent of the slowest device's maximum, {} at {:.0} kpps",
                    m.dut,
                    m.pps / 1e3
                );
            }
            for &pct in &args.loads {
                let r = ratios(loads, size, flows, pct);
                if !r.is_empty() {
                    let text: Vec<String> = r.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
                    println!(
                        "CPU/pkt ratios {size} B, {flows} flow(s), {pct}%: {}",
                        text.join(", ")
                    );
                }
            }
        }
    }
    println!();
    println!("Maximum rate (generator at full speed; where `gen kpps` equals `kpps` the generator is the limit):");
    println!();
    println!("| frame | flows | device | kpps | Gb/s | gen kpps |");
    println!("|---|---|---|---|---|---|");
    for &size in &args.sizes {
        for &flows in &args.flows {
            for m in maxima.iter().filter(|m| m.size == size && m.flows == flows) {
                println!(
                    "| {size} B | {flows} | {} | {:.0} | {:.2} | {:.0} |",
                    m.dut,
                    m.pps / 1e3,
                    m.gbps,
                    m.gen_pps / 1e3
                );
            }
        }
    }
}

/// Everything measured, for `--json`.
pub fn json(
    maxima: &[MaxPoint],
    loads: &[LoadPoint],
    runs: usize,
    window: Duration,
    shape: &str,
) -> serde_json::Value {
    let mut all_ratios = Vec::new();
    let mut keys: Vec<(usize, u16, u32)> = loads
        .iter()
        .map(|p| (p.size, p.flows, p.load_pct))
        .collect();
    keys.dedup();
    for (size, flows, pct) in keys {
        all_ratios.push(serde_json::json!({
            "size": size, "flows": flows, "load_pct": pct,
            "cpu_per_pkt": ratios(loads, size, flows, pct),
        }));
    }
    serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "shape": shape,
        "runs": runs,
        "window_ms": window.as_millis() as u64,
        "maximum": maxima,
        "loads": loads,
        "ratios": all_ratios,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(dut: &'static str, cpu: f64) -> LoadPoint {
        LoadPoint {
            dut,
            size: 64,
            flows: 1,
            load_pct: 50,
            offered_pps: 1e5,
            gen_pps: 1e5,
            delivered_pps: 1e5,
            cpu_ns_per_pkt: cpu,
            threads_ns_per_pkt: cpu,
            softirq_ns_per_pkt: 0.0,
            cpu_wait_pct: 0.0,
            p50_us: 1.0,
            p99_us: 2.0,
            p999_us: 3.0,
            latency_samples: 10,
        }
    }

    #[test]
    fn ratios_divide_cpu_per_packet_where_both_devices_were_measured() {
        let loads = [load("picnic", 1500.0), load("raw", 1000.0)];
        let r = ratios(&loads, 64, 1, 50);
        assert_eq!(r.len(), 1);
        assert!((r["picnic/raw"] - 1.5).abs() < 1e-9);
        assert!(ratios(&loads, 64, 1, 90).is_empty());
    }
}
