//! Per-tenant metrics, pass-mark checks, the side-by-side table, summary.json and CSVs.

use crate::scenario::{Scenario, WorkloadKind};
use crate::workload::{WorkloadResult, BIN_MS};
use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One tenant's numbers in one mode (the keys of summary.json).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TenantMetrics {
    /// Application goodput summed over the tenant's workloads, bits/s.
    pub throughput_bps: f64,
    /// Median request latency, us (null without an RPC workload).
    pub p50_us: Option<f64>,
    /// 99th percentile request latency, us.
    pub p99_us: Option<f64>,
    /// 99.9th percentile request latency, us.
    pub p999_us: Option<f64>,
    /// Fraction of packets/requests lost over the tenant's UDP and RPC workloads.
    pub loss: f64,
    /// Whether the tenant's SLO held (see [`slo_met`]).
    pub slo_met: bool,
}

/// The results of one mode, all repetitions merged.
#[derive(Debug, Clone)]
pub struct ModeReport {
    /// Mode name (`bridge`, `victim-alone`, `picnic`, ...).
    pub name: String,
    /// Whether the attackers ran (false for victim-alone modes).
    pub attackers: bool,
    /// Per-workload results merged over repetitions.
    pub workloads: Vec<WorkloadResult>,
    /// Per-repetition results, for the time series.
    pub repetitions: Vec<Vec<WorkloadResult>>,
    /// Per-tenant metrics.
    pub tenants: BTreeMap<String, TenantMetrics>,
    /// Per-tenant merged latency histogram (ns), for the CDF CSV.
    pub latency: BTreeMap<String, Histogram<u64>>,
}

impl ModeReport {
    /// Merges repetitions of one mode and computes the tenant metrics.
    pub fn new(
        scenario: &Scenario,
        name: &str,
        attackers: bool,
        repetitions: Vec<Vec<WorkloadResult>>,
    ) -> Result<ModeReport> {
        let mut merged: Vec<WorkloadResult> = Vec::new();
        for rep in &repetitions {
            for r in rep {
                match merged.iter_mut().find(|m| m.name == r.name) {
                    Some(m) => {
                        m.sent += r.sent;
                        m.received += r.received;
                        m.received_bytes += r.received_bytes;
                        m.active_ns += r.active_ns;
                        if let (Some(a), Some(b)) = (m.latency.as_mut(), r.latency.as_ref()) {
                            a.add(b).map_err(|e| anyhow!("merging histograms: {e:?}"))?;
                        }
                    }
                    None => merged.push(r.clone()),
                }
            }
        }
        let mut tenants = BTreeMap::new();
        let mut latency = BTreeMap::new();
        for tenant in &scenario.tenants {
            let mine: Vec<&WorkloadResult> =
                merged.iter().filter(|w| w.tenant == tenant.name).collect();
            if mine.is_empty() {
                continue;
            }
            let mut hist: Option<Histogram<u64>> = None;
            for h in mine.iter().filter_map(|w| w.latency.as_ref()) {
                match hist.as_mut() {
                    Some(acc) => acc
                        .add(h)
                        .map_err(|e| anyhow!("merging histograms: {e:?}"))?,
                    None => hist = Some(h.clone()),
                }
            }
            let hist = hist.filter(|h| !h.is_empty());
            let q = |q: f64| {
                hist.as_ref()
                    .map(|h| h.value_at_quantile(q) as f64 / 1000.0)
            };
            let sent: u64 = mine.iter().map(|w| w.sent).sum();
            let lost: u64 = mine.iter().map(|w| w.sent.saturating_sub(w.received)).sum();
            let mut m = TenantMetrics {
                throughput_bps: mine.iter().map(|w| w.throughput_bps()).sum(),
                p50_us: q(0.5),
                p99_us: q(0.99),
                p999_us: q(0.999),
                loss: if sent == 0 {
                    0.0
                } else {
                    lost as f64 / sent as f64
                },
                slo_met: true,
            };
            let greedy = mine.iter().any(|w| is_greedy(scenario, w));
            m.slo_met = slo_met(tenant, &m, greedy);
            tenants.insert(tenant.name.clone(), m);
            if let Some(h) = hist {
                latency.insert(tenant.name.clone(), h);
            }
        }
        Ok(ModeReport {
            name: name.to_owned(),
            attackers,
            workloads: merged,
            repetitions,
            tenants,
            latency,
        })
    }
}

/// A workload that takes all the bandwidth it can get (so a shortfall is the network's).
fn is_greedy(scenario: &Scenario, w: &WorkloadResult) -> bool {
    let rate = scenario
        .workloads
        .iter()
        .find(|s| s.name == w.name)
        .and_then(|s| s.rate_pps);
    matches!(w.kind, WorkloadKind::TcpBulk | WorkloadKind::Iperf3)
        || (w.kind == WorkloadKind::UdpFlood && rate.is_none())
}

/// A tenant's SLO holds when its p99 is within `latency_p99_us`, its loss within
/// `loss_max` (each when set), and, if it runs a greedy workload, its throughput reaches
/// 90% of `min_mbps` (the 10% is the receiver's headroom, EyeQ 3.2, and header overhead).
pub fn slo_met(tenant: &crate::scenario::Tenant, m: &TenantMetrics, greedy: bool) -> bool {
    let latency_ok = match (tenant.latency_p99_us, m.p99_us) {
        (Some(bound), Some(p99)) => p99 <= bound,
        _ => true,
    };
    let loss_ok = tenant.loss_max.is_none_or(|max| m.loss <= max);
    let rate_ok = !greedy || m.throughput_bps >= 0.9 * tenant.min_mbps as f64 * 1e6;
    latency_ok && loss_ok && rate_ok
}

/// Comparison operator of a pass mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<=`
    Le,
    /// `<`
    Lt,
    /// `>=`
    Ge,
    /// `>`
    Gt,
}

/// A pass mark: `METRIC OP NUMBER`.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Metric name: `victim_p50_ratio`, `victim_p99_ratio`, `victim_p999_ratio`,
    /// `victim_throughput_ratio`, `victim_loss`, `victim_p99_us`, `victim_throughput_mbps`,
    /// or `TENANT.FIELD` with FIELD one of `throughput_mbps`, `p50_us`, `p99_us`,
    /// `p999_us`, `loss`.
    pub metric: String,
    /// Comparison.
    pub op: Op,
    /// Bound.
    pub bound: f64,
}

const VICTIM_METRICS: &[&str] = &[
    "victim_p50_ratio",
    "victim_p99_ratio",
    "victim_p999_ratio",
    "victim_throughput_ratio",
    "victim_loss",
    "victim_p99_us",
    "victim_throughput_mbps",
];
const TENANT_FIELDS: &[&str] = &["throughput_mbps", "p50_us", "p99_us", "p999_us", "loss"];

impl Check {
    /// Parses `"victim_p99_ratio <= 1.5"`.
    pub fn parse(text: &str) -> Result<Check> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [metric, op, bound] = parts[..] else {
            bail!("{text:?}: expected `METRIC OP NUMBER`, e.g. `victim_p99_ratio <= 1.5`");
        };
        let op = match op {
            "<=" => Op::Le,
            "<" => Op::Lt,
            ">=" => Op::Ge,
            ">" => Op::Gt,
            _ => bail!("{text:?}: operator must be one of <= < >= >"),
        };
        let bound: f64 = bound
            .parse()
            .ok()
            .filter(|b: &f64| b.is_finite())
            .ok_or_else(|| anyhow!("{text:?}: bound {bound:?} is not a number"))?;
        let known = VICTIM_METRICS.contains(&metric)
            || metric
                .split_once('.')
                .is_some_and(|(t, f)| !t.is_empty() && TENANT_FIELDS.contains(&f));
        if !known {
            bail!(
                "{text:?}: unknown metric {metric:?} (one of {} or TENANT.{{{}}})",
                VICTIM_METRICS.join(", "),
                TENANT_FIELDS.join(",")
            );
        }
        Ok(Check {
            metric: metric.to_owned(),
            op,
            bound,
        })
    }

    /// Whether `value` satisfies the check.
    pub fn holds(&self, value: f64) -> bool {
        match self.op {
            Op::Le => value <= self.bound,
            Op::Lt => value < self.bound,
            Op::Ge => value >= self.bound,
            Op::Gt => value > self.bound,
        }
    }
}

/// The evaluated pass mark, as written to summary.json.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckResult {
    /// The pass mark as written in the scenario.
    pub name: String,
    /// The mode it was evaluated on.
    pub mode: String,
    /// The measured value (null when it could not be computed, which fails the check).
    pub value: Option<f64>,
    /// The bound.
    pub bound: f64,
    /// Whether it held.
    pub pass: bool,
}

/// Victim under attack over victim alone, per attacked mode.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Ratios {
    /// p50 latency ratio.
    pub victim_p50_ratio: Option<f64>,
    /// p99 latency ratio.
    pub victim_p99_ratio: Option<f64>,
    /// p99.9 latency ratio.
    pub victim_p999_ratio: Option<f64>,
    /// Throughput ratio.
    pub victim_throughput_ratio: Option<f64>,
}

/// Everything `summary.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// The victim tenant.
    pub victim: String,
    /// Modes in run order.
    pub mode_order: Vec<String>,
    /// Per mode, per tenant metrics.
    pub modes: BTreeMap<String, BTreeMap<String, TenantMetrics>>,
    /// Per attacked mode, victim ratios against the victim-alone mode.
    pub ratios: BTreeMap<String, Ratios>,
    /// The mode whose results decide `pass`.
    pub judged_mode: Option<String>,
    /// Pass marks evaluated on the judged mode.
    pub checks: Vec<CheckResult>,
    /// All checks passed.
    pub pass: bool,
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

impl Summary {
    /// Builds the summary: ratios for every attacked mode against the victim alone on the
    /// same dataplane (`picnic` and `picnic-off` against `picnic-alone`), or against the first
    /// mode without attackers when there is no such mode; checks on `judge` (default: the
    /// first attacked mode).
    pub fn new(scenario: &Scenario, modes: &[ModeReport], judge: Option<&str>) -> Result<Summary> {
        let victim = &scenario.victim;
        let mut ratios = BTreeMap::new();
        for m in modes.iter().filter(|m| m.attackers) {
            let family = m.name.split('-').next().unwrap_or_default();
            let same_dataplane = format!("{family}-alone");
            let alone = modes
                .iter()
                .find(|a| !a.attackers && a.name == same_dataplane)
                .or_else(|| modes.iter().find(|a| !a.attackers));
            let (Some(v), Some(a)) = (
                m.tenants.get(victim),
                alone.and_then(|a| a.tenants.get(victim)),
            ) else {
                continue;
            };
            ratios.insert(
                m.name.clone(),
                Ratios {
                    victim_p50_ratio: ratio(v.p50_us, a.p50_us),
                    victim_p99_ratio: ratio(v.p99_us, a.p99_us),
                    victim_p999_ratio: ratio(v.p999_us, a.p999_us),
                    victim_throughput_ratio: ratio(Some(v.throughput_bps), Some(a.throughput_bps)),
                },
            );
        }
        let judged = match judge {
            Some(name) => Some(
                modes
                    .iter()
                    .find(|m| m.name == name)
                    .ok_or_else(|| anyhow!("judged mode {name:?} was not run"))?,
            ),
            None => modes.iter().find(|m| m.attackers).or(modes.first()),
        };
        let mut checks = Vec::new();
        if let Some(j) = judged {
            for text in &scenario.pass {
                let check = Check::parse(text)?;
                let value = metric_value(&check.metric, victim, j, ratios.get(&j.name));
                checks.push(CheckResult {
                    name: text.clone(),
                    mode: j.name.clone(),
                    value,
                    bound: check.bound,
                    pass: value.is_some_and(|v| check.holds(v)),
                });
            }
        }
        Ok(Summary {
            scenario: scenario.name.clone(),
            victim: victim.clone(),
            mode_order: modes.iter().map(|m| m.name.clone()).collect(),
            modes: modes
                .iter()
                .map(|m| (m.name.clone(), m.tenants.clone()))
                .collect(),
            ratios,
            judged_mode: judged.map(|j| j.name.clone()),
            pass: checks.iter().all(|c| c.pass),
            checks,
        })
    }

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
                    if m.slo_met { "yes" } else { "NO" },
                    r.and_then(|r| r.victim_p99_ratio)
                        .map_or("-".into(), |v| format!("{v:.2}x")),
                    r.and_then(|r| r.victim_throughput_ratio)
                        .map_or("-".into(), |v| format!("{v:.2}x")),
                );
            }
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

fn metric_value(
    metric: &str,
    victim: &str,
    mode: &ModeReport,
    ratios: Option<&Ratios>,
) -> Option<f64> {
    let tenant_field = |tenant: &str, field: &str| -> Option<f64> {
        let m = mode.tenants.get(tenant)?;
        match field {
            "throughput_mbps" => Some(m.throughput_bps / 1e6),
            "p50_us" => m.p50_us,
            "p99_us" => m.p99_us,
            "p999_us" => m.p999_us,
            "loss" => Some(m.loss),
            _ => None,
        }
    };
    match metric {
        "victim_p50_ratio" => ratios?.victim_p50_ratio,
        "victim_p99_ratio" => ratios?.victim_p99_ratio,
        "victim_p999_ratio" => ratios?.victim_p999_ratio,
        "victim_throughput_ratio" => ratios?.victim_throughput_ratio,
        "victim_loss" => tenant_field(victim, "loss"),
        "victim_p99_us" => tenant_field(victim, "p99_us"),
        "victim_throughput_mbps" => tenant_field(victim, "throughput_mbps"),
        other => {
            let (t, f) = other.split_once('.')?;
            tenant_field(t, f)
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
name = "t"
duration_ms = 1000
hosts = ["h1"]
victim = "v"
pass = ["victim_p99_ratio <= 1.5", "victim_loss <= 0", "x.throughput_mbps >= 100"]

[[tenants]]
name = "v"
latency_p99_us = 500
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h1" }]

[[tenants]]
name = "x"
min_mbps = 100
vms = [{ name = "c", host = "h1" }, { name = "d", host = "h1" }]

[[workloads]]
name = "probe"
kind = "rpc"
from = "a"
to = "b"

[[workloads]]
name = "flood"
kind = "udp_flood"
from = "c"
to = "d"
"#;

    fn probe(latency_us: u64, sent: u64, received: u64) -> WorkloadResult {
        let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for _ in 0..received {
            h.record(latency_us * 1000).unwrap();
        }
        WorkloadResult {
            name: "probe".into(),
            tenant: "v".into(),
            kind: WorkloadKind::Rpc,
            sent,
            received,
            received_bytes: received * 64,
            active_ns: 1_000_000_000,
            latency: Some(h),
            series: vec![0; 10],
        }
    }

    fn flood(bytes: u64) -> WorkloadResult {
        WorkloadResult {
            name: "flood".into(),
            tenant: "x".into(),
            kind: WorkloadKind::UdpFlood,
            sent: 1000,
            received: 900,
            received_bytes: bytes,
            active_ns: 1_000_000_000,
            latency: None,
            series: vec![bytes / 2, bytes / 2],
        }
    }

    fn modes(s: &Scenario) -> Vec<ModeReport> {
        let attacked = ModeReport::new(
            s,
            "bridge",
            true,
            vec![vec![probe(300, 1000, 1000), flood(25_000_000)]],
        )
        .unwrap();
        let alone =
            ModeReport::new(s, "victim-alone", false, vec![vec![probe(100, 1000, 1000)]]).unwrap();
        vec![attacked, alone]
    }

    #[test]
    fn checks_parse_and_hold() {
        let c = Check::parse("victim_p99_ratio <= 1.5").unwrap();
        assert!(c.holds(1.5) && !c.holds(1.6));
        assert!(Check::parse("victim_p99_ratio =< 1.5").is_err());
        assert!(Check::parse("victim_p99_ratio <= x").is_err());
        assert!(Check::parse("nonsense <= 1").is_err());
        assert!(Check::parse("t1.p99_us < 80").is_ok());
    }

    #[test]
    fn summary_has_the_documented_shape_and_verdict() {
        let s = Scenario::parse(SCENARIO).unwrap();
        let reports = modes(&s);
        let summary = Summary::new(&s, &reports, None).unwrap();
        let json: serde_json::Value = serde_json::to_value(&summary).unwrap();
        for mode in ["bridge", "victim-alone"] {
            let v = &json["modes"][mode]["v"];
            for key in [
                "throughput_bps",
                "p50_us",
                "p99_us",
                "p999_us",
                "loss",
                "slo_met",
            ] {
                assert!(v.get(key).is_some(), "{mode}.v.{key} missing");
            }
        }
        let x = &json["modes"]["bridge"]["x"];
        assert_eq!(x["throughput_bps"], 200e6);
        assert!((x["loss"].as_f64().unwrap() - 0.1).abs() < 1e-9);
        assert_eq!(x["slo_met"], true); // greedy flood reached its 100 Mb/s guarantee
        assert_eq!(json["modes"]["bridge"]["v"]["slo_met"], true); // 300 us <= 500 us
        let ratio = json["ratios"]["bridge"]["victim_p99_ratio"]
            .as_f64()
            .unwrap();
        assert!((ratio - 3.0).abs() < 0.01, "{ratio}");
        let checks = json["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 3);
        for c in checks {
            for key in ["name", "value", "bound", "pass"] {
                assert!(c.get(key).is_some(), "check key {key} missing");
            }
        }
        assert_eq!(checks[0]["pass"], false);
        assert_eq!(checks[1]["pass"], true);
        assert_eq!(checks[2]["pass"], true);
        assert_eq!(json["pass"], false);
        let table = summary.table();
        assert!(
            table.contains("victim-alone") && table.contains("3.00x"),
            "{table}"
        );
        assert!(table.contains("overall: FAIL"));
    }

    #[test]
    fn a_check_without_a_value_fails() {
        let s = Scenario::parse(SCENARIO).unwrap();
        let only_attacked = &modes(&s)[..1];
        let summary = Summary::new(&s, only_attacked, None).unwrap();
        assert_eq!(summary.checks[0].value, None);
        assert!(!summary.checks[0].pass && !summary.pass);
    }

    #[test]
    fn outputs_are_written() {
        let s = Scenario::parse(SCENARIO).unwrap();
        let reports = modes(&s);
        let summary = Summary::new(&s, &reports, Some("bridge")).unwrap();
        let dir = std::env::temp_dir().join(format!("picnic-lab-report-{}", std::process::id()));
        write_outputs(&dir, &summary, &reports).unwrap();
        let ts = std::fs::read_to_string(dir.join("timeseries.csv")).unwrap();
        assert!(ts.starts_with("mode,repeat,tenant,t_ms,mbps\n"));
        assert!(ts.contains("bridge,0,x,0,10000.000"), "{ts}");
        let lat = std::fs::read_to_string(dir.join("latency.csv")).unwrap();
        assert!(lat.lines().any(|l| l.starts_with("victim-alone,v,0.5,")));
        assert!(dir.join("summary.json").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
