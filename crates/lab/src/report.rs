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
    /// When the tenant's last `transfer` completed, ms after its start (absent without
    /// transfers; null when one did not complete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_ms: Option<f64>,
    /// Whether the tenant's SLO held (see [`slo_met`]).
    pub slo_met: bool,
    /// With `--repeat` > 1: the figures above are medians, these their min and max.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
}

/// Min and max of every figure over repetitions (summary.json: `FIELD_min`, `FIELD_max`
/// beside the median `FIELD`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Spread {
    /// Number of repetitions.
    pub repetitions: usize,
    /// Smallest throughput, bits/s.
    pub throughput_bps_min: f64,
    /// Largest throughput, bits/s.
    pub throughput_bps_max: f64,
    /// Smallest p50, us.
    pub p50_us_min: Option<f64>,
    /// Largest p50, us.
    pub p50_us_max: Option<f64>,
    /// Smallest p99, us.
    pub p99_us_min: Option<f64>,
    /// Largest p99, us.
    pub p99_us_max: Option<f64>,
    /// Smallest p99.9, us.
    pub p999_us_min: Option<f64>,
    /// Largest p99.9, us.
    pub p999_us_max: Option<f64>,
    /// Smallest loss fraction.
    pub loss_min: f64,
    /// Largest loss fraction.
    pub loss_max: f64,
    /// Earliest completion, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_ms_min: Option<f64>,
    /// Latest completion, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_ms_max: Option<f64>,
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
    /// Scenario metrics ([`SCENARIO_METRICS`]) that could be computed, median over
    /// repetitions.
    pub metrics: BTreeMap<String, f64>,
}

impl ModeReport {
    /// Merges repetitions of one mode and computes the tenant and scenario metrics: with
    /// one repetition its figures, with several the median of each figure over them (the
    /// min and max go to [`TenantMetrics::spread`]). Latency histograms are merged over all
    /// repetitions for the CDF.
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
        let per_rep = repetitions
            .iter()
            .map(|rep| tenant_metrics(scenario, rep))
            .collect::<Result<Vec<_>>>()?;
        let mut tenants = BTreeMap::new();
        for (group, tenant) in scenario.report_groups() {
            let reps: Vec<&TenantMetrics> = per_rep.iter().filter_map(|r| r.get(&group)).collect();
            if reps.is_empty() {
                continue;
            }
            let mut m = if reps.len() == 1 {
                reps[0].clone()
            } else {
                median_metrics(&reps)
            };
            let greedy = merged
                .iter()
                .any(|w| w.tenant == group && is_greedy(scenario, w));
            m.slo_met = slo_met(tenant, &m, greedy);
            tenants.insert(group, m);
        }
        let mut latency = BTreeMap::new();
        for (group, _) in scenario.report_groups() {
            let mut hist: Option<Histogram<u64>> = None;
            for h in merged
                .iter()
                .filter(|w| w.tenant == group)
                .filter_map(|w| w.latency.as_ref())
            {
                match hist.as_mut() {
                    Some(acc) => acc
                        .add(h)
                        .map_err(|e| anyhow!("merging histograms: {e:?}"))?,
                    None => hist = Some(h.clone()),
                }
            }
            if let Some(h) = hist.filter(|h| !h.is_empty()) {
                latency.insert(group, h);
            }
        }
        let mut metrics = BTreeMap::new();
        for key in SCENARIO_METRICS {
            let values: Vec<f64> = repetitions
                .iter()
                .filter_map(|rep| scenario_metric(key, scenario, rep))
                .collect();
            if let Some(v) = median(&values) {
                metrics.insert(key.to_string(), v);
            }
        }
        Ok(ModeReport {
            name: name.to_owned(),
            attackers,
            workloads: merged,
            repetitions,
            tenants,
            latency,
            metrics,
        })
    }
}

impl ModeReport {
    /// Adds `cpu_share_error` (median over repetitions) from the CPU the dataplanes charged
    /// each tenant in each repetition: the largest relative deviation of a competing tenant's
    /// switch CPU from its weighted share of what the competitors got together (PicNIC's
    /// CPU-fair queuing: equal guarantees, equal CPU). Competitors as for `share_error`.
    pub fn add_cpu_share_error(&mut self, scenario: &Scenario, cpu: &[BTreeMap<String, u64>]) {
        let values: Vec<f64> = self
            .repetitions
            .iter()
            .zip(cpu)
            .filter_map(|(rep, cpu)| {
                let comp = competitors(scenario, rep)?;
                let used: Vec<f64> = comp
                    .iter()
                    .map(|(t, _)| cpu.get(*t).copied().map(|ns| ns as f64))
                    .collect::<Option<_>>()?;
                weighted_error(&used, &comp.iter().map(|c| c.1).collect::<Vec<_>>())
            })
            .collect();
        if let Some(v) = median(&values) {
            self.metrics.insert("cpu_share_error".into(), v);
        }
    }
}

/// Per-tenant figures of one repetition (SLO not yet judged).
fn tenant_metrics(
    scenario: &Scenario,
    results: &[WorkloadResult],
) -> Result<BTreeMap<String, TenantMetrics>> {
    let mut out = BTreeMap::new();
    for (group, _) in scenario.report_groups() {
        let mine: Vec<&WorkloadResult> = results.iter().filter(|w| w.tenant == group).collect();
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
        out.insert(
            group,
            TenantMetrics {
                throughput_bps: mine.iter().map(|w| w.throughput_bps()).sum(),
                p50_us: q(0.5),
                p99_us: q(0.99),
                p999_us: q(0.999),
                loss: if sent == 0 {
                    0.0
                } else {
                    lost as f64 / sent as f64
                },
                completion_ms: completion_ms(&mine),
                slo_met: true,
                spread: None,
            },
        );
    }
    Ok(out)
}

/// When the last of `workloads`' transfers completed, ms after its start; none without
/// transfers or when one did not complete.
fn completion_ms(workloads: &[&WorkloadResult]) -> Option<f64> {
    let transfers: Vec<_> = workloads
        .iter()
        .filter(|w| w.kind == WorkloadKind::Transfer)
        .collect();
    if transfers.is_empty() {
        return None;
    }
    transfers
        .iter()
        .map(|w| w.completion_ns)
        .try_fold(0u64, |acc, c| Some(acc.max(c?)))
        .map(|ns| ns as f64 / 1e6)
}

/// The median of `values` (mean of the middle two for an even count); none when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    let lo = values.iter().copied().reduce(f64::min)?;
    Some((lo, values.iter().copied().fold(lo, f64::max)))
}

/// The median of every figure over repetitions, with their min and max.
fn median_metrics(reps: &[&TenantMetrics]) -> TenantMetrics {
    let all = |f: fn(&TenantMetrics) -> f64| reps.iter().map(|m| f(m)).collect::<Vec<_>>();
    let some =
        |f: fn(&TenantMetrics) -> Option<f64>| reps.iter().filter_map(|m| f(m)).collect::<Vec<_>>();
    let (thr, p50, p99, p999, loss, done) = (
        all(|m| m.throughput_bps),
        some(|m| m.p50_us),
        some(|m| m.p99_us),
        some(|m| m.p999_us),
        all(|m| m.loss),
        some(|m| m.completion_ms),
    );
    let lo = |v: &[f64]| min_max(v).map(|p| p.0);
    let hi = |v: &[f64]| min_max(v).map(|p| p.1);
    TenantMetrics {
        throughput_bps: median(&thr).unwrap_or(0.0),
        p50_us: median(&p50),
        p99_us: median(&p99),
        p999_us: median(&p999),
        loss: median(&loss).unwrap_or(0.0),
        // A transfer that did not complete in some repetition has no completion figure.
        completion_ms: median(&done).filter(|_| done.len() == reps.len()),
        slo_met: true,
        spread: Some(Spread {
            repetitions: reps.len(),
            throughput_bps_min: lo(&thr).unwrap_or(0.0),
            throughput_bps_max: hi(&thr).unwrap_or(0.0),
            p50_us_min: lo(&p50),
            p50_us_max: hi(&p50),
            p99_us_min: lo(&p99),
            p99_us_max: hi(&p99),
            p999_us_min: lo(&p999),
            p999_us_max: hi(&p999),
            loss_min: lo(&loss).unwrap_or(0.0),
            loss_max: hi(&loss).unwrap_or(0.0),
            completion_ms_min: lo(&done),
            completion_ms_max: hi(&done),
        }),
    }
}

/// Scenario-level metrics (values of pass marks without a tenant prefix).
pub const SCENARIO_METRICS: &[&str] = &[
    "share_error",
    "convergence_ms",
    "completion_order",
    "cpu_share_error",
];

/// Relative band around its weighted share a tenant's rate must stay in to count as
/// converged (see [`convergence_ms`]).
pub const CONVERGENCE_BAND: f64 = 0.2;
/// Bins of the moving average [`convergence_ms`] looks at (5 x 10 ms).
pub const CONVERGENCE_BINS: usize = 5;

/// Computes scenario metric `key` on one repetition.
fn scenario_metric(key: &str, scenario: &Scenario, rep: &[WorkloadResult]) -> Option<f64> {
    match key {
        "share_error" => share_error(scenario, rep),
        "convergence_ms" => convergence_ms(scenario, rep),
        "completion_order" => completion_order(scenario, rep),
        // From the dataplanes' charges, not from the workloads: see `add_cpu_share_error`.
        _ => None,
    }
}

/// Tenants running an open-ended greedy workload, with their guarantees as weights (EyeQ 3.2:
/// C_i = B_i * C / sum B_j). Needs two or more, each with `min_mbps` > 0.
fn competitors<'a>(scenario: &'a Scenario, rep: &[WorkloadResult]) -> Option<Vec<(&'a str, f64)>> {
    let list: Vec<(&str, f64)> = scenario
        .tenants
        .iter()
        .filter(|t| {
            t.min_mbps > 0
                && rep
                    .iter()
                    .any(|w| w.tenant == t.name && is_open_greedy(scenario, w))
        })
        .map(|t| (t.name.as_str(), t.min_mbps as f64))
        .collect();
    (list.len() >= 2).then_some(list)
}

/// Largest relative deviation of a competing tenant's throughput from its weighted share
/// of what the competitors got together: max_i |x_i - X w_i / W| / (X w_i / W).
pub fn share_error(scenario: &Scenario, rep: &[WorkloadResult]) -> Option<f64> {
    let comp = competitors(scenario, rep)?;
    let rates: Vec<f64> = comp
        .iter()
        .map(|(t, _)| {
            rep.iter()
                .filter(|w| w.tenant == *t && is_open_greedy(scenario, w))
                .map(|w| w.throughput_bps())
                .sum()
        })
        .collect();
    weighted_error(&rates, &comp.iter().map(|c| c.1).collect::<Vec<_>>())
}

fn weighted_error(rates: &[f64], weights: &[f64]) -> Option<f64> {
    let total: f64 = rates.iter().sum();
    let w: f64 = weights.iter().sum();
    if total <= 0.0 || w <= 0.0 {
        return None;
    }
    rates
        .iter()
        .zip(weights)
        .map(|(x, wi)| (x - total * wi / w).abs() / (total * wi / w))
        .reduce(f64::max)
}

/// Time from the moment every competing tenant's greedy workloads run (the latest start)
/// until the rates settle: the first [`BIN_MS`] bin from which on, until the first greedy
/// stop, every competitor's rate averaged over [`CONVERGENCE_BINS`] bins stays within
/// [`CONVERGENCE_BAND`] of its weighted share of their total. A run that never settles
/// reports the whole window.
pub fn convergence_ms(scenario: &Scenario, rep: &[WorkloadResult]) -> Option<f64> {
    let comp = competitors(scenario, rep)?;
    let greedy: Vec<&crate::scenario::Workload> = scenario
        .workloads
        .iter()
        .filter(|w| {
            rep.iter()
                .any(|r| r.name == w.name && is_open_greedy(scenario, r))
        })
        .collect();
    let start = greedy.iter().map(|w| w.start_ms).max()?;
    let stop = greedy.iter().map(|w| w.stop_ms(scenario)).min()?;
    let (first, last) = (start.div_ceil(BIN_MS) as usize, (stop / BIN_MS) as usize);
    if last < first + CONVERGENCE_BINS {
        return None;
    }
    let series: Vec<Vec<u64>> = comp
        .iter()
        .map(|(t, _)| {
            let mut acc = vec![0u64; last];
            for w in rep
                .iter()
                .filter(|w| w.tenant == *t && is_open_greedy(scenario, w))
            {
                for (a, b) in acc.iter_mut().zip(&w.series) {
                    *a += b;
                }
            }
            acc
        })
        .collect();
    let weights: Vec<f64> = comp.iter().map(|c| c.1).collect();
    let settled = |k: usize| {
        let rates: Vec<f64> = series
            .iter()
            .map(|s| s[k..k + CONVERGENCE_BINS].iter().sum::<u64>() as f64)
            .collect();
        weighted_error(&rates, &weights).is_some_and(|e| e <= CONVERGENCE_BAND)
    };
    let mut converged_at = last - CONVERGENCE_BINS + 1;
    for k in (first..=last - CONVERGENCE_BINS).rev() {
        if !settled(k) {
            break;
        }
        converged_at = k;
    }
    Some(((converged_at - first) as u64 * BIN_MS) as f64)
}

/// 1 when tenants' transfers completed in the order of their guarantees (a tenant with a
/// larger `min_mbps` finished no later than one with a smaller), else 0 (EyeQ 5.3). None
/// without two tenants with transfers, or when a transfer did not complete.
pub fn completion_order(scenario: &Scenario, rep: &[WorkloadResult]) -> Option<f64> {
    let mut done = Vec::new();
    for t in &scenario.tenants {
        let mine: Vec<&WorkloadResult> = rep.iter().filter(|w| w.tenant == t.name).collect();
        if mine.iter().any(|w| w.kind == WorkloadKind::Transfer) {
            done.push((t.min_mbps, completion_ms(&mine)?));
        }
    }
    if done.len() < 2 {
        return None;
    }
    let ordered = done
        .iter()
        .all(|a| done.iter().all(|b| a.0 <= b.0 || a.1 <= b.1));
    Some(if ordered { 1.0 } else { 0.0 })
}

/// A greedy workload that runs for its whole window (not a fixed-size transfer): the
/// competitors of [`share_error`] and [`convergence_ms`].
fn is_open_greedy(scenario: &Scenario, w: &WorkloadResult) -> bool {
    w.kind != WorkloadKind::Transfer && is_greedy(scenario, w)
}

/// A workload that takes all the bandwidth it can get (so a shortfall is the network's).
fn is_greedy(scenario: &Scenario, w: &WorkloadResult) -> bool {
    let rate = scenario
        .workloads
        .iter()
        .find(|s| s.name == w.name)
        .and_then(|s| s.rate_pps);
    matches!(
        w.kind,
        WorkloadKind::TcpBulk | WorkloadKind::Iperf3 | WorkloadKind::Transfer
    ) || (w.kind == WorkloadKind::UdpFlood && rate.is_none())
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
const TENANT_FIELDS: &[&str] = &[
    "throughput_mbps",
    "p50_us",
    "p99_us",
    "p999_us",
    "loss",
    "completion_ms",
];

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
            || SCENARIO_METRICS.contains(&metric)
            || metric
                .split_once('.')
                .is_some_and(|(t, f)| !t.is_empty() && TENANT_FIELDS.contains(&f));
        if !known {
            bail!(
                "{text:?}: unknown metric {metric:?} (one of {}, {} or TENANT.{{{}}})",
                VICTIM_METRICS.join(", "),
                SCENARIO_METRICS.join(", "),
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
    /// Per mode, the scenario metrics that apply (`share_error`, `convergence_ms`,
    /// `completion_order`; medians over repetitions).
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
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
    /// same dataplane (`picnic` and `picnic-off` against `picnic-alone`, `bridge` against
    /// `victim-alone`), or against the first mode without attackers when there is no such
    /// mode; checks on `judge` (default: the first attacked mode).
    pub fn new(scenario: &Scenario, modes: &[ModeReport], judge: Option<&str>) -> Result<Summary> {
        let victim = &scenario.victim;
        let mut ratios = BTreeMap::new();
        for m in modes.iter().filter(|m| m.attackers) {
            let family = m.name.split('-').next().unwrap_or_default();
            let same_dataplane = match family {
                "bridge" => "victim-alone".to_string(),
                _ => format!("{family}-alone"),
            };
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
            metrics: modes
                .iter()
                .filter(|m| !m.metrics.is_empty())
                .map(|m| (m.name.clone(), m.metrics.clone()))
                .collect(),
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
            "completion_ms" => m.completion_ms,
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
        other if SCENARIO_METRICS.contains(&other) => mode.metrics.get(other).copied(),
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
            completion_ns: None,
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
            completion_ns: None,
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
    fn each_mode_is_compared_with_the_victim_alone_on_its_own_dataplane() {
        let s = Scenario::parse(SCENARIO).unwrap();
        let mode = |name: &str, attackers: bool, latency_us: u64| {
            let mut runs = vec![probe(latency_us, 1000, 1000)];
            if attackers {
                runs.push(flood(25_000_000));
            }
            ModeReport::new(&s, name, attackers, vec![runs]).unwrap()
        };
        let reports = vec![
            mode("picnic", true, 400),
            mode("bridge", true, 300),
            mode("picnic-alone", false, 200),
            mode("victim-alone", false, 100),
        ];
        let summary = Summary::new(&s, &reports, None).unwrap();
        let json = serde_json::to_value(&summary).unwrap();
        let p99 = |m: &str| json["ratios"][m]["victim_p99_ratio"].as_f64().unwrap();
        assert!((p99("picnic") - 2.0).abs() < 0.01, "{}", p99("picnic"));
        assert!((p99("bridge") - 3.0).abs() < 0.01, "{}", p99("bridge"));
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

    #[test]
    fn repetitions_report_medians_with_min_and_max() {
        let s = Scenario::parse(SCENARIO).unwrap();
        let reps = vec![
            vec![probe(300, 1000, 1000), flood(10_000_000)],
            vec![probe(100, 1000, 990), flood(30_000_000)],
            vec![probe(200, 1000, 980), flood(20_000_000)],
        ];
        let m = ModeReport::new(&s, "bridge", true, reps).unwrap();
        let v = &m.tenants["v"];
        let p50 = v.p50_us.unwrap();
        assert!((p50 - 200.0).abs() < 1.0, "{p50}");
        let sp = v.spread.as_ref().unwrap();
        assert_eq!(sp.repetitions, 3);
        assert!((sp.p50_us_min.unwrap() - 100.0).abs() < 1.0);
        assert!((sp.p50_us_max.unwrap() - 300.0).abs() < 1.0);
        assert!((v.loss - 0.01).abs() < 1e-9 && sp.loss_max == 0.02 && sp.loss_min == 0.0);
        assert_eq!(m.tenants["x"].throughput_bps, 160e6);
        let alone =
            ModeReport::new(&s, "victim-alone", false, vec![vec![probe(100, 10, 10)]]).unwrap();
        assert!(alone.tenants["v"].spread.is_none());
        let summary = Summary::new(&s, &[m, alone], None).unwrap();
        let json = serde_json::to_value(&summary).unwrap();
        let x = &json["modes"]["bridge"]["x"];
        assert_eq!(x["throughput_bps"], 160e6);
        assert_eq!(x["throughput_bps_min"], 80e6);
        assert_eq!(x["throughput_bps_max"], 240e6);
        assert!(json["modes"]["victim-alone"]["v"]
            .get("p50_us_min")
            .is_none());
        let table = summary.table();
        assert!(
            table.contains("  min") && table.contains("(of 3)"),
            "{table}"
        );
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    const SHARES: &str = r#"
name = "t"
duration_ms = 1000
hosts = ["h1"]
victim = "a"
pass = ["share_error <= 0.1", "completion_order >= 1", "convergence_ms <= 100"]

[[tenants]]
name = "a"
min_mbps = 100
vms = [{ name = "a1", host = "h1" }, { name = "a2", host = "h1" }]

[[tenants]]
name = "b"
min_mbps = 50
vms = [{ name = "b1", host = "h1" }, { name = "b2", host = "h1" }]

[[workloads]]
name = "wa"
kind = "transfer"
bytes = 1000
from = "a1"
to = "a2"

[[workloads]]
name = "wb"
kind = "transfer"
bytes = 1000
from = "b1"
to = "b2"
"#;

    fn transfer(
        name: &str,
        tenant: &str,
        series: Vec<u64>,
        done_ms: Option<u64>,
    ) -> WorkloadResult {
        let bytes: u64 = series.iter().sum();
        WorkloadResult {
            name: name.into(),
            tenant: tenant.into(),
            kind: WorkloadKind::Transfer,
            sent: 0,
            received: 0,
            received_bytes: bytes,
            active_ns: 1_000_000_000,
            latency: None,
            series,
            completion_ns: done_ms.map(|ms| ms * 1_000_000),
        }
    }

    #[test]
    fn weighted_shares_convergence_and_completion_order() {
        let s = Scenario::parse(SHARES).unwrap();
        // 100 bins of 10 ms. a gets 2/3 from bin 30 on (before that an even split).
        let a: Vec<u64> = (0..100).map(|i| if i < 30 { 500 } else { 2000 }).collect();
        let b: Vec<u64> = (0..100).map(|i| if i < 30 { 500 } else { 1000 }).collect();
        let rep = vec![
            transfer("wa", "a", a, Some(600)),
            transfer("wb", "b", b, Some(900)),
        ];
        // Shares and convergence look at open-ended greedy workloads, not transfers.
        assert_eq!(share_error(&s, &rep), None);
        let bulk: Vec<WorkloadResult> = rep
            .iter()
            .map(|r| WorkloadResult {
                kind: WorkloadKind::TcpBulk,
                ..r.clone()
            })
            .collect();
        let err = share_error(&s, &bulk).unwrap();
        // a: 155000, b: 85000 of 240000; b's share 1/3 = 80000: error 5000 / 80000.
        assert!((err - 0.0625).abs() < 1e-9, "{err}");
        let conv = convergence_ms(&s, &bulk).unwrap();
        // The 50 ms average is within 20% from bin 28 on (mostly the new split).
        assert!((250.0..=300.0).contains(&conv), "{conv}");
        assert_eq!(completion_order(&s, &rep), Some(1.0));
        let swapped = vec![rep[0].clone(), transfer("wb", "b", vec![1; 100], Some(500))];
        assert_eq!(completion_order(&s, &swapped), Some(0.0));
        let unfinished = vec![rep[0].clone(), transfer("wb", "b", vec![1; 100], None)];
        assert_eq!(completion_order(&s, &unfinished), None);
        let m = ModeReport::new(&s, "bridge", true, vec![rep]).unwrap();
        assert_eq!(m.tenants["a"].completion_ms, Some(600.0));
        assert_eq!(m.metrics["completion_order"], 1.0);
        let summary = Summary::new(&s, &[m], None).unwrap();
        // No open-ended competitors: share_error and convergence_ms have no value and fail.
        assert_eq!(summary.checks[0].value, None);
        assert!(!summary.checks[0].pass && summary.checks[1].pass && !summary.checks[2].pass);
        assert!(summary.table().contains("metrics [bridge]"));
    }

    #[test]
    fn scenario_metrics_parse_as_checks() {
        for m in [
            "share_error <= 0.1",
            "convergence_ms < 5",
            "t.completion_ms <= 900",
        ] {
            assert!(Check::parse(m).is_ok(), "{m}");
        }
    }

    #[test]
    fn cpu_share_error_weighs_the_dataplanes_charges_like_share_error_weighs_rates() {
        let s = Scenario::parse(SHARES).unwrap();
        let bulk = |name: &str, tenant: &str| WorkloadResult {
            kind: WorkloadKind::TcpBulk,
            ..transfer(name, tenant, vec![1000; 10], None)
        };
        let rep = vec![bulk("wa", "a"), bulk("wb", "b")];
        let mut m = ModeReport::new(&s, "picnic", true, vec![rep.clone(), rep]).unwrap();
        // Guarantees 100:50; charged 500 and 400 ns: b's share is 300, off by 100/300.
        let cpu = |a: u64, b: u64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        m.add_cpu_share_error(&s, &[cpu(500, 400), cpu(600, 300)]);
        // The median of 1/3 and 0 (600:300 is exact).
        let v = m.metrics["cpu_share_error"];
        assert!((v - 1.0 / 6.0).abs() < 1e-9, "{v}");
        // A dataplane that measures nothing leaves the metric out (its check then fails).
        let mut bridge = m.clone();
        bridge.metrics.clear();
        bridge.add_cpu_share_error(&s, &[BTreeMap::new(), BTreeMap::new()]);
        assert!(!bridge.metrics.contains_key("cpu_share_error"));
    }
}
