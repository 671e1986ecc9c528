//! What a run measured: the lab's per-workload results as the applications record them
//! ([`Measurements`]), and at the end the simulator's own statistics ([`RunStats`]): frame
//! conservation, queue occupancy quantiles, TCP counters, shuffle completions and
//! convergence times.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use picnic_scenario::{WorkloadKind, WorkloadResult, BIN_MS};
use serde::Serialize;

use super::fabric::LinkClass;
use super::FINE_BIN_NS;
use crate::event::Nanos;
use crate::spec::Convergence;

/// Counters proving conservation: every frame is created, delivered, dropped with a reason,
/// or still somewhere in the deployment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Conservation {
    /// Frames built by applications.
    pub app_created: u64,
    /// Standalone feedback frames built by the engines.
    pub feedback_created: u64,
    /// Frames that reached an application.
    pub delivered: u64,
    /// Standalone feedback frames consumed by the engines.
    pub feedback_consumed: u64,
    /// Frames dropped by the engines, by reason (NoBuffer excluded: no frame existed).
    pub engine_drops: BTreeMap<String, u64>,
    /// Frames dropped by fabric queues (buffer full), by link class.
    pub fabric_drops: BTreeMap<String, u64>,
    /// Frames dropped at a full NIC receive ring, or with no pool frame to receive into.
    pub nic_rx_drops: u64,
    /// Frames dropped at a full NIC transmit queue.
    pub nic_tx_drops: u64,
    /// Frames still held somewhere at the end (the pool's missing frames and the packets
    /// in the fabric).
    pub in_flight: u64,
    /// Whether created == delivered + consumed + drops + in flight.
    pub balanced: bool,
}

/// One shuffle job's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ShuffleResult {
    /// Job tag (`shuffle-TENANT`).
    pub job: String,
    /// Flows (ordered pairs x connections x replicas).
    pub flows: u64,
    /// Flows that completed.
    pub completed: u64,
    /// Completion of the job (its last flow), ms after its start; none if some flow did not
    /// complete.
    pub completion_ms: Option<f64>,
    /// Median flow completion time, ms.
    pub median_fct_ms: f64,
}

/// One convergence measurement's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ConvergenceResult {
    /// Tenant watched.
    pub tenant: String,
    /// Allocation, Mb/s.
    pub target_mbps: f64,
    /// Time from the disturbance to the first 1 ms bin whose `hold_ms` window mean is
    /// within the tolerance (the rate reaches its allocation; it may leave again), ms.
    pub reached_ms: Option<f64>,
    /// Time from the disturbance to the first 1 ms bin from which on (until `until_ms`) the
    /// mean rate over every `hold_ms` window is within the tolerance of the target, ms; none
    /// if never.
    pub converged_ms: Option<f64>,
    /// Mean rate from convergence (or the disturbance) to `until_ms`, Mb/s.
    pub settled_mbps: f64,
    /// Share of 1 ms bins from convergence to `until_ms` within the tolerance (how steady
    /// the rate is at 1 ms).
    pub in_band_share: f64,
}

/// Everything a mode's run measured besides the lab's workload results.
#[derive(Debug, Clone, Serialize)]
pub struct RunStats {
    /// Mode name.
    pub mode: String,
    /// Hosts simulated.
    pub hosts: usize,
    /// Events processed.
    pub events: u64,
    /// Wall time of the run, s (not part of summary.json: it varies between runs).
    pub wall_s: f64,
    /// Events per second of wall time (one core).
    pub events_per_sec: f64,
    /// Simulated time, s.
    pub sim_s: f64,
    /// Frame accounting.
    pub conservation: Conservation,
    /// Sends refused because the VM's ring was full (backpressure, not loss).
    pub app_blocked: u64,
    /// Sends refused because the frame pool was empty.
    pub pool_exhausted: u64,
    /// ECN marks set by fabric switches.
    pub ecn_marks: u64,
    /// TCP model segments sent again, and retransmission timeouts, over all connections.
    pub tcp_retransmits: u64,
    /// See `tcp_retransmits`.
    pub tcp_timeouts: u64,
    /// Queue occupancy seen by arriving packets per link class: (quantile, KB).
    pub queue_kb: BTreeMap<String, Vec<(f64, f64)>>,
    /// Occupancy of every queue sampled each 1 ms ([`SAMPLE_NS`](super::SAMPLE_NS)), per link class (EyeQ
    /// 5.4's measure; idle queues count as empty): (quantile, KB).
    pub queue_sampled_kb: BTreeMap<String, Vec<(f64, f64)>>,
    /// Shuffles: per job, flows, flows completed and the job's completion time (its last
    /// flow's), ms.
    pub shuffles: Vec<ShuffleResult>,
    /// Convergence measurements of the spec (`[[sim.convergence]]`).
    pub convergence: Vec<ConvergenceResult>,
    /// Completed tagged flows; written to flows.csv.
    #[serde(skip)]
    pub flows: Vec<FlowRecord>,
    /// Flows started but not completed.
    pub unfinished_flows: u64,
    /// Per tenant, received payload bytes per [`FINE_BIN_NS`] bin (all replicas); written
    /// to rates.csv.
    #[serde(skip)]
    pub fine_series: BTreeMap<String, Vec<u64>>,
}

/// A completed tagged flow (flows.csv).
#[derive(Clone, Debug, PartialEq)]
pub struct FlowRecord {
    /// Its traffic's or shuffle's tag.
    pub tag: String,
    /// Payload bytes.
    pub bytes: u64,
    /// Completion time (start to the last segment's ACK), us.
    pub fct_us: f64,
    /// Sender and receiver hosts (global indices) and the start, ns.
    pub src: u32,
    /// See `src`.
    pub dst: u32,
    /// See `src`.
    pub start_ns: u64,
}

/// Where an application's results go: the lab's result slot `index` of replica `replica`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Slot {
    pub replica: u32,
    pub index: usize,
}

/// What the applications record while the run goes.
pub(super) struct Measurements {
    /// Per replica, per result slot: the lab's workload results.
    pub results: Vec<Vec<WorkloadResult>>,
    /// Per tenant, received payload bytes per [`FINE_BIN_NS`] (all replicas).
    pub fine: Vec<Vec<u64>>,
    /// Completed tagged flows.
    pub flows: Vec<FlowRecord>,
    /// Flows of each lab `transfer` still sending: its completion is when the last one
    /// finishes, as in the lab.
    pub transfer_flows_left: BTreeMap<Slot, u32>,
    /// Bins of the lab's [`BIN_MS`] series.
    bins: usize,
}

impl Measurements {
    /// Empty results for `replicas` replicas lasting `duration`, with `tenants` tenants.
    pub fn new(replicas: u32, duration: Nanos, tenants: usize) -> Measurements {
        Measurements {
            results: (0..replicas).map(|_| Vec::new()).collect(),
            fine: vec![vec![0; (duration / FINE_BIN_NS + 1) as usize]; tenants],
            flows: Vec::new(),
            transfer_flows_left: BTreeMap::new(),
            bins: (duration / 1_000_000 / BIN_MS + 1) as usize,
        }
    }

    /// Opens a result row of replica `replica` (`latency`: it records a latency histogram)
    /// and returns its slot.
    pub fn add_result(
        &mut self,
        replica: u32,
        name: &str,
        tenant: &str,
        kind: WorkloadKind,
        active_ns: u64,
        latency: bool,
    ) -> Slot {
        let results = &mut self.results[replica as usize];
        results.push(WorkloadResult {
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            kind,
            sent: 0,
            received: 0,
            received_bytes: 0,
            active_ns,
            latency: latency
                .then(|| Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")),
            series: vec![0; self.bins],
            completion_ns: None,
        });
        Slot {
            replica,
            index: results.len() - 1,
        }
    }

    /// The result row of `slot`.
    pub fn result(&mut self, slot: Slot) -> &mut WorkloadResult {
        &mut self.results[slot.replica as usize][slot.index]
    }

    /// Counts `packets` packets and `bytes` payload bytes received at `now` for `slot` and
    /// in `tenant`'s fine rate series.
    pub fn count_rx(&mut self, slot: Slot, tenant: usize, now: Nanos, bytes: u64, packets: u64) {
        let r = self.result(slot);
        r.received += packets;
        r.received_bytes += bytes;
        let bin = ((now / 1_000_000 / BIN_MS) as usize).min(r.series.len() - 1);
        r.series[bin] += bytes;
        let fine = &mut self.fine[tenant];
        let bin = ((now / FINE_BIN_NS) as usize).min(fine.len() - 1);
        fine[bin] += bytes;
    }
}

/// Quantiles reported for queue occupancy.
const QUANTILES: [f64; 5] = [0.5, 0.9, 0.99, 0.999, 1.0];

/// Per link class with samples, its occupancy quantiles in KB (histograms hold bytes + 1).
pub(super) fn queue_quantiles(hists: &[Histogram<u64>]) -> BTreeMap<String, Vec<(f64, f64)>> {
    LinkClass::ALL
        .iter()
        .zip(hists)
        .filter(|(_, h)| !h.is_empty())
        .map(|(c, h)| {
            (
                c.name().to_owned(),
                QUANTILES
                    .iter()
                    // Recorded as max(bytes, 1): one byte is an empty queue.
                    .map(|&q| (q, (h.value_at_quantile(q) as f64 - 1.0).max(0.0) / 1000.0))
                    .collect(),
            )
        })
        .collect()
}

/// Per shuffle job (flows tagged `shuffle-*`, one tag per flow in `tags`), its flows and
/// their completion from the completed `flows`.
pub(super) fn shuffle_results<'a>(
    tags: impl Iterator<Item = &'a str>,
    flows: &[FlowRecord],
) -> Vec<ShuffleResult> {
    let mut jobs: BTreeMap<&str, (u64, Vec<f64>)> = Default::default();
    for tag in tags.filter(|g| g.starts_with("shuffle-")) {
        jobs.entry(tag).or_default().0 += 1;
    }
    for f in flows {
        if let Some(j) = jobs.get_mut(f.tag.as_str()) {
            j.1.push(f.fct_us / 1e3);
        }
    }
    jobs.into_iter()
        .map(|(job, (flows, mut fcts))| {
            fcts.sort_by(f64::total_cmp);
            let completed = fcts.len() as u64;
            ShuffleResult {
                job: job.to_owned(),
                flows,
                completed,
                completion_ms: (completed == flows).then(|| fcts.last().copied()).flatten(),
                median_fct_ms: fcts.get(fcts.len() / 2).copied().unwrap_or(0.0),
            }
        })
        .collect()
}

/// Each convergence measurement over its tenant's fine rate series (`fine`, per tenant in
/// the order of `tenant_names`) of a run lasting `duration`.
pub(super) fn convergence_results(
    specs: &[Convergence],
    tenant_names: &[String],
    fine: &[Vec<u64>],
    duration: Nanos,
) -> Vec<ConvergenceResult> {
    let bin_ms = FINE_BIN_NS as f64 / 1e6;
    let mbps = |bytes: u64| bytes as f64 * 8.0 / (bin_ms * 1e3);
    specs
        .iter()
        .map(|c| {
            let until = c.until_ms.map_or(duration, |u| u * 1_000_000);
            let series = tenant_names
                .iter()
                .position(|n| *n == c.tenant)
                .map(|i| &fine[i][..(until / FINE_BIN_NS) as usize])
                .unwrap_or(&[]);
            let first = (c.after_ms as f64 / bin_ms) as usize;
            let hold = ((c.hold_ms as f64 / bin_ms).ceil() as usize).max(1);
            let in_band = |r: f64| (r / c.target_mbps - 1.0).abs() <= c.tolerance;
            let window_ok = |b: usize| {
                in_band(series[b..b + hold].iter().map(|&x| mbps(x)).sum::<f64>() / hold as f64)
            };
            // Converged from the first bin after which every window stays in the band.
            let last = series.len().saturating_sub(hold - 1);
            let mut at = None;
            for b in (first..last).rev() {
                if !window_ok(b) {
                    break;
                }
                at = Some(b);
            }
            let reached = (first..last).find(|&b| window_ok(b));
            let rest = &series[at.unwrap_or(first).min(series.len())..];
            let n = rest.len().max(1) as f64;
            ConvergenceResult {
                tenant: c.tenant.clone(),
                target_mbps: c.target_mbps,
                reached_ms: reached.map(|b| (b - first) as f64 * bin_ms),
                converged_ms: at.map(|b| (b - first) as f64 * bin_ms),
                settled_mbps: rest.iter().map(|&b| mbps(b)).sum::<f64>() / n,
                in_band_share: rest.iter().filter(|&&b| in_band(mbps(b))).count() as f64 / n,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_bytes_land_in_the_lab_bin_and_the_fine_bin_of_their_time() {
        // 25 ms: lab bins of 10 ms (25 / 10 + 1 = 3), fine bins of 1 ms (25 + 1).
        let mut m = Measurements::new(1, 25_000_000, 2);
        let slot = m.add_result(0, "w", "t", WorkloadKind::UdpFlood, 25_000_000, false);
        assert_eq!(
            slot,
            Slot {
                replica: 0,
                index: 0
            }
        );
        m.count_rx(slot, 1, 12_500_000, 100, 1);
        m.count_rx(slot, 1, 12_999_999, 50, 0);
        // Late arrivals (the receivers' grace) count in the last bin.
        m.count_rx(slot, 1, 900_000_000, 7, 1);
        let r = &m.results[0][0];
        assert_eq!((r.received, r.received_bytes), (2, 157));
        assert_eq!(r.series, [0, 150, 7]);
        assert_eq!(m.fine[0].iter().sum::<u64>(), 0);
        assert_eq!(
            (m.fine[1][12], m.fine[1][25], m.fine[1].iter().sum::<u64>()),
            (150, 7, 157)
        );
        assert!(r.latency.is_none());
    }

    #[test]
    fn a_shuffle_completes_with_its_last_flow_and_reports_its_median_flow() {
        let mut tags = vec![
            "shuffle-a",
            "shuffle-a",
            "shuffle-a",
            "shuffle-b",
            "shuffle-b",
            "web",
        ];
        tags.extend(["shuffle-c"; 4]);
        let rec = |tag: &str, fct_us| FlowRecord {
            tag: tag.to_owned(),
            bytes: 1,
            fct_us,
            src: 0,
            dst: 1,
            start_ns: 0,
        };
        let mut flows = vec![
            rec("shuffle-a", 1000.0),
            rec("shuffle-a", 3000.0),
            rec("shuffle-b", 500.0),
            rec("shuffle-a", 2000.0),
            rec("web", 9000.0),
        ];
        flows.extend([4000.0, 1000.0, 3000.0, 2000.0].map(|t| rec("shuffle-c", t)));
        let jobs = shuffle_results(tags.into_iter(), &flows);
        assert_eq!(jobs.len(), 3, "flows of other tags are no job");
        assert_eq!(
            (jobs[0].job.as_str(), jobs[0].flows, jobs[0].completed),
            ("shuffle-a", 3, 3)
        );
        assert_eq!(
            (jobs[0].completion_ms, jobs[0].median_fct_ms),
            (Some(3.0), 2.0)
        );
        // One of b's two flows never finished: no completion time.
        assert_eq!((jobs[1].flows, jobs[1].completed), (2, 1));
        assert_eq!((jobs[1].completion_ms, jobs[1].median_fct_ms), (None, 0.5));
        // Of an even count, the upper median.
        assert_eq!(
            (jobs[2].completion_ms, jobs[2].median_fct_ms),
            (Some(4.0), 3.0)
        );
    }

    #[test]
    fn convergence_is_reached_at_the_first_good_window_and_held_from_the_last_bad_one() {
        // 8 Mb/s is 1,000 B per 1 ms bin. After 5 ms: in band at 10-11 ms, out at 12-13 ms,
        // in band from 14 ms to the end (30 ms).
        let mut series = vec![0u64; 31];
        for b in (10..12).chain(14..30) {
            series[b] = 1000;
        }
        let spec = Convergence {
            tenant: "t".into(),
            after_ms: 5,
            target_mbps: 8.0,
            tolerance: 0.1,
            hold_ms: 2,
            until_ms: None,
        };
        let names = ["other".to_owned(), "t".to_owned()];
        let fine = [vec![0; 31], series];
        let r = &convergence_results(std::slice::from_ref(&spec), &names, &fine, 30_000_000)[0];
        assert_eq!((r.reached_ms, r.converged_ms), (Some(5.0), Some(9.0)));
        assert_eq!((r.settled_mbps, r.in_band_share), (8.0, 1.0));
        // Watched only to 13 ms, it is never held: settled over 5-13 ms (2 of 8 bins in band).
        let short = Convergence {
            until_ms: Some(13),
            ..spec
        };
        let r = &convergence_results(&[short], &names, &fine, 30_000_000)[0];
        assert_eq!((r.reached_ms, r.converged_ms), (Some(5.0), None));
        assert_eq!((r.settled_mbps, r.in_band_share), (2.0, 0.25));
    }
}
