//! Everything summary.json holds ([`Summary`]): per mode and tenant the metrics, the victim's
//! ratios against its run alone on the same dataplane, the scenario metrics and the pass
//! marks evaluated on the judged mode.

use anyhow::{anyhow, Result};
use serde::Serialize;
use std::collections::BTreeMap;

use crate::check::Check;
use crate::metrics::{ModeReport, TenantMetrics};
use crate::shares::SCENARIO_METRICS;
use crate::Scenario;

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
    /// same dataplane (`picnic` and `picnic-off` against `picnic-alone`, `picnic-engines`
    /// against `picnic-engines-alone`, `bridge` against `victim-alone`), or against the first
    /// mode without attackers when there is no such
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
            // A mode's own alone partner first (`picnic-engines` -> `picnic-engines-alone`).
            let own = format!("{}-alone", m.name);
            let alone = modes
                .iter()
                .find(|a| !a.attackers && a.name == own)
                .or_else(|| {
                    modes
                        .iter()
                        .find(|a| !a.attackers && a.name == same_dataplane)
                })
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
