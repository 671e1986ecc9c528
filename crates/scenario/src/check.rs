//! The pass-mark grammar: `METRIC OP NUMBER`, e.g. `victim_p99_ratio <= 1.5`.

use anyhow::{anyhow, bail, Result};

use crate::shares::SCENARIO_METRICS;

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
