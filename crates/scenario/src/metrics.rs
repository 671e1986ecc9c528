//! Per-tenant figures of a mode ([`TenantMetrics`]: throughput, latency quantiles, loss,
//! transfer completion, whether the SLO held) and the merging of repetitions into a
//! [`ModeReport`] (medians, with min and max in [`Spread`]).

use anyhow::{anyhow, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use crate::results::WorkloadResult;
use crate::shares::{
    competitors, completion_ms, max_min_error, median, scenario_metric, SCENARIO_METRICS,
};
use crate::Scenario;

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
    /// Whether the tenant's SLO held, as the switches judged it (their SLO monitors, `GET
    /// /slo`): no conformance window violated on any switch of its path in any repetition.
    /// Null where no switch judged it (Linux bridges). See [`ModeReport::add_switch_slo`].
    pub slo_met: Option<bool>,
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
        for (group, _) in scenario.report_groups() {
            let reps: Vec<&TenantMetrics> = per_rep.iter().filter_map(|r| r.get(&group)).collect();
            if reps.is_empty() {
                continue;
            }
            let m = if reps.len() == 1 {
                reps[0].clone()
            } else {
                median_metrics(&reps)
            };
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
                slo_met: None,
                spread: None,
            },
        );
    }
    Ok(out)
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
        slo_met: None,
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

/// What the switches judged of a tenant's SLO in one run, summed over the switches that
/// carried its traffic (`GET /slo`'s totals): conformance windows judged and violated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchSlo {
    pub windows: u64,
    pub violated_windows: u64,
}

impl ModeReport {
    /// Takes each tenant's SLO verdict from the switches: `per_rep[r]` holds, per tenant
    /// name, what the switches judged in repetition `r`. A tenant met its SLO when some
    /// window was judged and none was violated, in every repetition; tenants no switch
    /// judged keep `slo_met` null. The switches judge their own part of the path (latency
    /// through the switch, frames they dropped), which is what picnic can promise; the
    /// end-to-end figures are in the other columns and the pass marks.
    pub fn add_switch_slo(&mut self, scenario: &Scenario, per_rep: &[BTreeMap<String, SwitchSlo>]) {
        for (group, tenant) in scenario.report_groups() {
            let Some(m) = self.tenants.get_mut(&group) else {
                continue;
            };
            let judged: Vec<SwitchSlo> = per_rep
                .iter()
                .filter_map(|rep| rep.get(&tenant.name).copied())
                .collect();
            m.slo_met = (!judged.is_empty()).then(|| {
                judged
                    .iter()
                    .all(|j| j.windows > 0 && j.violated_windows == 0)
            });
        }
    }

    /// The churn's figures over the repetitions that churned (`None`: not in that one):
    /// the fewest changes, every unreachable VM, the longest time to follow.
    pub fn add_churn(&mut self, churns: &[Option<crate::ChurnOutcome>]) {
        let done: Vec<_> = churns.iter().flatten().collect();
        if done.is_empty() {
            return;
        }
        let changes = done.iter().map(|c| c.changes).min().unwrap_or(0);
        let unreachable: u32 = done.iter().map(|c| c.unreachable).sum();
        let follow = done.iter().map(|c| c.follow_ms_max).fold(0.0, f64::max);
        self.metrics
            .insert("churn_changes".into(), f64::from(changes));
        self.metrics
            .insert("churn_unreachable".into(), f64::from(unreachable));
        self.metrics.insert("churn_follow_ms".into(), follow);
    }

    /// Adds `cpu_share_error` (median over repetitions) from the CPU the dataplanes charged
    /// each tenant in each repetition: the largest relative deviation of a competing tenant's
    /// dataplane CPU from its weighted max-min fair share of what the competitors got together
    /// (PicNIC's CPU-fair queuing: equal guarantees, equal CPU, work-conserving). A tenant in
    /// `served` (per repetition: the dataplane dropped none of its frames) asked for no more
    /// than it got: below its share it keeps what it used and the others share the rest, as
    /// WFQ gives them (a tenant whose frames all went through picnic's kernel fast path at its
    /// own CPU's expense wants none of the engines' CPU). Competitors as for `share_error`.
    pub fn add_cpu_share_error(
        &mut self,
        scenario: &Scenario,
        cpu: &[BTreeMap<String, u64>],
        served: &[BTreeSet<String>],
    ) {
        let none = BTreeSet::new();
        let values: Vec<f64> = self
            .repetitions
            .iter()
            .zip(cpu)
            .enumerate()
            .filter_map(|(i, (rep, cpu))| {
                let comp = competitors(scenario, rep)?;
                let used: Vec<f64> = comp
                    .iter()
                    .map(|(t, _)| cpu.get(*t).copied().map(|ns| ns as f64))
                    .collect::<Option<_>>()?;
                let served = served.get(i).unwrap_or(&none);
                let satisfied: Vec<bool> = comp.iter().map(|(t, _)| served.contains(*t)).collect();
                max_min_error(
                    &used,
                    &comp.iter().map(|c| c.1).collect::<Vec<_>>(),
                    &satisfied,
                )
            })
            .collect();
        if let Some(v) = median(&values) {
            self.metrics.insert("cpu_share_error".into(), v);
        }
    }
}
