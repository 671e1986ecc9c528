//! Scenario-level metrics, values of pass marks without a tenant prefix: how close
//! competing tenants get to their weighted shares of bandwidth (`share_error`) and of the
//! switch's CPU (`cpu_share_error`), how fast their rates settle (`convergence_ms`), and
//! whether transfers finished in the order of their guarantees (`completion_order`).

use crate::results::{WorkloadResult, BIN_MS};
use crate::{Scenario, Workload, WorkloadKind};

/// Scenario-level metrics (values of pass marks without a tenant prefix).
pub const SCENARIO_METRICS: &[&str] = &[
    "share_error",
    "convergence_ms",
    "completion_order",
    "cpu_share_error",
    "churn_changes",
    "churn_unreachable",
    "churn_follow_ms",
];

/// Relative band around its weighted share a tenant's rate must stay in to count as
/// converged (see [`convergence_ms`]).
pub const CONVERGENCE_BAND: f64 = 0.2;
/// Bins of the moving average [`convergence_ms`] looks at (5 x 10 ms).
pub const CONVERGENCE_BINS: usize = 5;

/// Computes scenario metric `key` on one repetition.
pub(crate) fn scenario_metric(
    key: &str,
    scenario: &Scenario,
    rep: &[WorkloadResult],
) -> Option<f64> {
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
pub(crate) fn competitors<'a>(
    scenario: &'a Scenario,
    rep: &[WorkloadResult],
) -> Option<Vec<(&'a str, f64)>> {
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

pub(crate) fn weighted_error(rates: &[f64], weights: &[f64]) -> Option<f64> {
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

/// [`weighted_error`] against weighted max-min fair shares: a `satisfied` tenant (it asked for
/// no more than it got) whose use is below its weighted share of what is left keeps its use,
/// and the rest is shared by weight among the others (water-filling). The error is the largest
/// relative deviation of the others from their shares; 0 when every tenant is satisfied
/// below its share.
pub(crate) fn max_min_error(used: &[f64], weights: &[f64], satisfied: &[bool]) -> Option<f64> {
    let total: f64 = used.iter().sum();
    if total <= 0.0 || weights.iter().sum::<f64>() <= 0.0 {
        return None;
    }
    let mut fixed = vec![false; used.len()];
    loop {
        let left: f64 = total
            - (0..used.len())
                .filter(|&i| fixed[i])
                .map(|i| used[i])
                .sum::<f64>();
        let w: f64 = (0..used.len())
            .filter(|&i| !fixed[i])
            .map(|i| weights[i])
            .sum();
        if w <= 0.0 {
            return Some(0.0);
        }
        let level = left / w;
        let below: Vec<usize> = (0..used.len())
            .filter(|&i| !fixed[i] && satisfied[i] && used[i] < level * weights[i])
            .collect();
        if below.is_empty() {
            return (0..used.len())
                .filter(|&i| !fixed[i])
                .map(|i| (used[i] - level * weights[i]).abs() / (level * weights[i]))
                .reduce(f64::max);
        }
        for i in below {
            fixed[i] = true;
        }
    }
}

/// Time from the moment every competing tenant's greedy workloads run (the latest start)
/// until the rates settle: the first [`BIN_MS`] bin from which on, until the first greedy
/// stop, every competitor's rate averaged over [`CONVERGENCE_BINS`] bins stays within
/// [`CONVERGENCE_BAND`] of its weighted share of their total. A run that never settles
/// reports the whole window.
pub fn convergence_ms(scenario: &Scenario, rep: &[WorkloadResult]) -> Option<f64> {
    let comp = competitors(scenario, rep)?;
    let greedy: Vec<&Workload> = scenario
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
pub(crate) fn is_greedy(scenario: &Scenario, w: &WorkloadResult) -> bool {
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

/// When the last of `workloads`' transfers completed, ms after its start; none without
/// transfers or when one did not complete.
pub(crate) fn completion_ms(workloads: &[&WorkloadResult]) -> Option<f64> {
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
