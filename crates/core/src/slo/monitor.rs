//! The conformance monitor of an [`Slo`]: one tenant's observed traffic judged against it
//! over fixed windows, violations as intervals, and the run's [`SloSummary`].

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::{
    Slo, SloError, SloState, Violation, ViolationKind, ViolationKinds, MAX_TRACKED_LATENCY_NS,
};
use crate::time::{Duration, Instant, NANOS_PER_SEC};

/// Precision of a window's reported latency percentile (2 digits: about 28 KiB). Whether the
/// window met its bound is decided exactly, without the histogram.
const WINDOW_LATENCY_DIGITS: u8 = 2;
/// Resolution of `latency_percentile` in the conformance test: parts per million of samples.
const PPM: u64 = 1_000_000;
/// Resolution of `max_loss` in the conformance test: parts per billion of packets.
const PPB: u64 = 1_000_000_000;

/// How an [`SloMonitor`] judges and how much history it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SloMonitorConfig {
    /// Length of a conformance window; each window is judged on its own (must be > 0).
    pub window: Duration,
    /// Closed violations kept; beyond this the oldest are dropped and counted.
    pub max_closed_violations: usize,
    /// Precision of the run-wide latency percentiles, in significant decimal digits (1 to 5).
    /// Memory: 2 digits take about 28 KiB, 3 about 200 KiB, 4 about 2.6 MiB
    /// (a simulator with thousands of tenants may want 2).
    pub latency_significant_digits: u8,
}

impl Default for SloMonitorConfig {
    /// 100 ms windows (DESIGN.md section 6 accuracy windows), 256 closed violations kept,
    /// latency percentiles to 3 significant digits.
    fn default() -> Self {
        SloMonitorConfig {
            window: Duration::from_millis(100),
            max_closed_violations: 256,
            latency_significant_digits: 3,
        }
    }
}

/// One pass/fail line of a report: `{ name, value, bound, pass }` (the lab's summary.json shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked, e.g. `"min_bps"` or `"latency_p99_us"`.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// The bound it was held to.
    pub bound: f64,
    /// Whether the bound was met.
    pub pass: bool,
}

/// A whole run of one monitor: totals, run-wide latency percentiles, and the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SloSummary {
    /// Time from the monitor's creation to the summary.
    pub elapsed: Duration,
    /// Closed windows judged.
    pub windows: u64,
    /// Closed windows in which at least one bound was violated.
    pub violated_windows: u64,
    /// Bytes offered by (or to) the tenant.
    pub offered_bytes: u64,
    /// Bytes delivered.
    pub delivered_bytes: u64,
    /// Packets delivered.
    pub delivered_packets: u64,
    /// Packets lost.
    pub lost_packets: u64,
    /// Mean offered rate over `elapsed`, bits/s.
    pub offered_bps: f64,
    /// Mean delivered rate (throughput) over `elapsed`, bits/s.
    pub throughput_bps: f64,
    /// Lost packets / (lost + delivered packets); 0 when no packets were seen.
    pub loss_fraction: f64,
    /// Latency samples recorded.
    pub latency_samples: u64,
    /// Median latency in microseconds (to the configured significant digits, rounded up to the
    /// top of its histogram bucket); `None` without samples.
    pub latency_p50_us: Option<f64>,
    /// 99th-percentile latency in microseconds; `None` without samples.
    pub latency_p99_us: Option<f64>,
    /// 99.9th-percentile latency in microseconds; `None` without samples.
    pub latency_p999_us: Option<f64>,
    /// Whether every judged window met every bound (equivalently: every check passes).
    pub slo_met: bool,
    /// Kept violations, closed ones oldest first, then the open ones.
    pub violations: Vec<Violation>,
    /// Closed violations dropped to bound memory.
    pub dropped_violations: u64,
    /// One check per bound that applied in at least one window; its value is the worst window.
    /// Bounds that never applied (say the tenant never offered its `min_bps`) have no check.
    pub checks: Vec<Check>,
}

/// What one closed window said about one bound.
struct Judgement {
    /// The window's value in the kind's unit.
    value: f64,
    /// The bound in the kind's unit.
    bound: f64,
    violated: bool,
}

/// Per-bound tallies over the run.
#[derive(Clone, Copy, Default)]
struct BoundStats {
    violated_windows: u64,
    /// Worst window value so far, in the kind's unit.
    worst: Option<f64>,
}

/// Counters of the window being filled.
#[derive(Clone, Copy)]
struct WindowCounters {
    offered_bytes: u64,
    delivered_bytes: u64,
    delivered_packets: u64,
    lost_packets: u64,
    latency_samples: u64,
    latency_above_bound: u64,
    /// Smallest sample above the latency bound (u64::MAX when there is none).
    min_latency_above_bound: u64,
}

impl WindowCounters {
    const EMPTY: WindowCounters = WindowCounters {
        offered_bytes: 0,
        delivered_bytes: 0,
        delivered_packets: 0,
        lost_packets: 0,
        latency_samples: 0,
        latency_above_bound: 0,
        min_latency_above_bound: u64::MAX,
    };

    fn is_empty(&self) -> bool {
        self.offered_bytes == 0
            && self.delivered_bytes == 0
            && self.delivered_packets == 0
            && self.lost_packets == 0
            && self.latency_samples == 0
    }
}

/// The latency bound in the form the per-window test uses.
struct LatencyBound {
    bound_ns: u64,
    /// `latency_percentile` in parts per million.
    quantile_ppm: u64,
    /// Latencies of the current window, for reporting the window's percentile.
    window_histogram: Histogram<u64>,
}

/// Judges one tenant's traffic against its [`Slo`] over fixed windows and records violations.
///
/// Windows are `[created + k * window, created + (k + 1) * window)`; an observation belongs to
/// the window containing its `now` (timestamps older than the current window count in it). A
/// window is judged once it has ended, so a violation is seen at most one window late. Closed
/// violations are kept up to [`SloMonitorConfig::max_closed_violations`].
///
/// Per-packet calls only add to counters and preallocated histograms (no allocation). Memory
/// is fixed apart from the closed-violation list: the run-wide latency histogram (see
/// [`SloMonitorConfig::latency_significant_digits`]) plus about 28 KiB when a latency bound
/// is set.
pub struct SloMonitor {
    slo: Slo,
    window: Duration,
    latency: Option<LatencyBound>,
    max_loss_ppb: Option<u64>,
    created_at: Instant,
    window_start: Instant,
    current: WindowCounters,
    windows: u64,
    violated_windows: u64,
    offered_bytes: u64,
    delivered_bytes: u64,
    delivered_packets: u64,
    lost_packets: u64,
    run_latency: Histogram<u64>,
    stats: [BoundStats; 4],
    open: [Option<Violation>; 4],
    closed: VecDeque<Violation>,
    max_closed: usize,
    dropped: u64,
    /// Violations started so far, per kind (open, closed and dropped ones).
    started: [u64; 4],
}

impl SloMonitor {
    /// A monitor for `slo` whose first window starts at `now`. Fails, naming the field, if the
    /// SLO is invalid, the window is zero or the latency precision is outside 1..=5 digits.
    pub fn new(slo: Slo, config: SloMonitorConfig, now: Instant) -> Result<Self, SloError> {
        slo.validate()?;
        if config.window == Duration::ZERO {
            return Err(SloError::new("window", "window must be > 0".into()));
        }
        if !(1..=5).contains(&config.latency_significant_digits) {
            return Err(SloError::new(
                "latency_significant_digits",
                format!(
                    "latency_significant_digits must be in 1..=5, got {}",
                    config.latency_significant_digits
                ),
            ));
        }
        let latency = slo.latency_us.map(|us| LatencyBound {
            bound_ns: us.saturating_mul(1_000),
            quantile_ppm: (slo.latency_percentile * 10_000.0).round() as u64,
            window_histogram: latency_histogram(WINDOW_LATENCY_DIGITS),
        });
        let max_loss_ppb = slo.max_loss.map(|f| (f * PPB as f64).round() as u64);
        Ok(SloMonitor {
            slo,
            window: config.window,
            latency,
            max_loss_ppb,
            created_at: now,
            window_start: now,
            current: WindowCounters::EMPTY,
            windows: 0,
            violated_windows: 0,
            offered_bytes: 0,
            delivered_bytes: 0,
            delivered_packets: 0,
            lost_packets: 0,
            run_latency: latency_histogram(config.latency_significant_digits),
            stats: [BoundStats::default(); 4],
            open: [None, None, None, None],
            closed: VecDeque::new(),
            max_closed: config.max_closed_violations,
            dropped: 0,
            started: [0; 4],
        })
    }

    /// The SLO being judged.
    pub fn slo(&self) -> &Slo {
        &self.slo
    }

    /// Bytes the tenant offered (sent, or had sent to it) before any queueing or drop; the
    /// minimum bandwidth is only judged in windows where this reached `min_bps`.
    pub fn record_offered(&mut self, now: Instant, bytes: u64) {
        self.advance(now);
        self.current.offered_bytes = self.current.offered_bytes.saturating_add(bytes);
    }

    /// Packets and bytes delivered to their destination.
    pub fn record_delivered(&mut self, now: Instant, packets: u64, bytes: u64) {
        self.advance(now);
        let w = &mut self.current;
        w.delivered_packets = w.delivered_packets.saturating_add(packets);
        w.delivered_bytes = w.delivered_bytes.saturating_add(bytes);
    }

    /// Packets lost (dropped anywhere on the tenant's path).
    pub fn record_lost(&mut self, now: Instant, packets: u64) {
        self.advance(now);
        self.current.lost_packets = self.current.lost_packets.saturating_add(packets);
    }

    /// One latency sample in nanoseconds, completed at `now`.
    pub fn record_latency(&mut self, now: Instant, latency_ns: u64) {
        self.advance(now);
        let w = &mut self.current;
        w.latency_samples = w.latency_samples.saturating_add(1);
        if let Some(lat) = &mut self.latency {
            if latency_ns > lat.bound_ns {
                w.latency_above_bound += 1;
                w.min_latency_above_bound = w.min_latency_above_bound.min(latency_ns);
            }
            lat.window_histogram.saturating_record(latency_ns);
        }
        self.run_latency.saturating_record(latency_ns);
    }

    /// When the current window ends and should be judged; `None` while nothing is pending
    /// (the window is empty and no violation is open), since judging it would change nothing.
    pub fn poll_at(&self) -> Option<Instant> {
        let pending = !self.current.is_empty() || self.open.iter().any(Option::is_some);
        pending.then(|| self.window_start + self.window)
    }

    /// Judges every window that ended at or before `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    /// Conformance as of the last window ended by `now` (judging it first).
    pub fn state(&mut self, now: Instant) -> SloState {
        self.advance(now);
        let mut kinds = ViolationKinds::default();
        for v in self.open.iter().flatten() {
            kinds.insert(v.kind);
        }
        if kinds.is_empty() {
            SloState::Met
        } else {
            SloState::Violated(kinds)
        }
    }

    /// Violations still going on (`ended_at` is `None`), in [`ViolationKind::ALL`] order.
    pub fn open_violations(&self) -> impl Iterator<Item = &Violation> {
        self.open.iter().flatten()
    }

    /// Kept closed violations, oldest first.
    pub fn closed_violations(&self) -> impl Iterator<Item = &Violation> {
        self.closed.iter()
    }

    /// Closed violations dropped because more than `max_closed_violations` occurred.
    pub fn dropped_violations(&self) -> u64 {
        self.dropped
    }

    /// Violations of `kind` started so far, open, closed and dropped ones alike: a counter
    /// that only grows (for metrics). Covers windows judged by the last call.
    pub fn violations_started(&self, kind: ViolationKind) -> u64 {
        self.started[kind.index()]
    }

    /// Start of the window being filled: observations from here to `window_start() +
    /// window()` are judged together once it ends. Advanced by every call that takes `now`.
    pub fn window_start(&self) -> Instant {
        self.window_start
    }

    /// Length of a conformance window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The run so far, after judging every window ended by `now`. Totals include the
    /// unfinished current window; conformance covers closed windows only.
    pub fn summary(&mut self, now: Instant) -> SloSummary {
        self.advance(now);
        let elapsed = now.saturating_since(self.created_at);
        let w = &self.current;
        let offered_bytes = self.offered_bytes.saturating_add(w.offered_bytes);
        let delivered_bytes = self.delivered_bytes.saturating_add(w.delivered_bytes);
        let delivered_packets = self.delivered_packets.saturating_add(w.delivered_packets);
        let lost_packets = self.lost_packets.saturating_add(w.lost_packets);
        let packets = delivered_packets.saturating_add(lost_packets);
        let latency_us = |q: f64| {
            (!self.run_latency.is_empty())
                .then(|| self.run_latency.value_at_quantile(q) as f64 / 1_000.0)
        };
        SloSummary {
            elapsed,
            windows: self.windows,
            violated_windows: self.violated_windows,
            offered_bytes,
            delivered_bytes,
            delivered_packets,
            lost_packets,
            offered_bps: rate_bps(offered_bytes, elapsed),
            throughput_bps: rate_bps(delivered_bytes, elapsed),
            loss_fraction: if packets == 0 {
                0.0
            } else {
                lost_packets as f64 / packets as f64
            },
            latency_samples: self.run_latency.len(),
            latency_p50_us: latency_us(0.5),
            latency_p99_us: latency_us(0.99),
            latency_p999_us: latency_us(0.999),
            slo_met: self.stats.iter().all(|s| s.violated_windows == 0),
            violations: self
                .closed
                .iter()
                .chain(self.open.iter().flatten())
                .cloned()
                .collect(),
            dropped_violations: self.dropped,
            checks: self.checks(),
        }
    }

    /// One check per bound that applied in some window, valued at the worst window.
    fn checks(&self) -> Vec<Check> {
        ViolationKind::ALL
            .into_iter()
            .filter_map(|kind| {
                let stats = self.stats[kind.index()];
                let (name, bound) = match kind {
                    ViolationKind::MinBandwidth => ("min_bps".to_string(), self.slo.min_bps as f64),
                    ViolationKind::MaxBandwidth => {
                        ("max_bps".to_string(), self.slo.max_bps? as f64)
                    }
                    ViolationKind::Latency => (
                        format!("latency_p{}_us", self.slo.latency_percentile),
                        self.slo.latency_us? as f64,
                    ),
                    ViolationKind::Loss => ("max_loss".to_string(), self.slo.max_loss?),
                };
                Some(Check {
                    name,
                    value: stats.worst?,
                    bound,
                    pass: stats.violated_windows == 0,
                })
            })
            .collect()
    }

    /// Judges every window that ended at or before `now`. After the first, all such windows
    /// are empty: one empty window closes every open violation, the rest change nothing and
    /// are skipped in O(1).
    fn advance(&mut self, now: Instant) {
        if now < self.window_start + self.window {
            return;
        }
        self.close_window();
        if now < self.window_start + self.window {
            return;
        }
        self.close_window();
        let skipped = now.saturating_since(self.window_start).as_nanos() / self.window.as_nanos();
        self.windows += skipped;
        self.window_start += Duration::from_nanos(skipped.saturating_mul(self.window.as_nanos()));
    }

    /// Judges the current window, updates violations and totals, and starts the next window.
    fn close_window(&mut self) {
        let start = self.window_start;
        let mut any_violated = false;
        for kind in ViolationKind::ALL {
            let i = kind.index();
            let judgement = self.judge(kind);
            if let Some(j) = &judgement {
                let stats = &mut self.stats[i];
                stats.worst = Some(stats.worst.map_or(j.value, |w| kind.worse(w, j.value)));
            }
            match judgement {
                Some(j) if j.violated => {
                    self.stats[i].violated_windows += 1;
                    any_violated = true;
                    if self.open[i].is_none() {
                        self.started[i] += 1;
                    }
                    let open = self.open[i].get_or_insert(Violation {
                        kind,
                        started_at: start,
                        ended_at: None,
                        worst_value: j.value,
                        bound: j.bound,
                    });
                    open.worst_value = kind.worse(open.worst_value, j.value);
                }
                _ => {
                    if let Some(mut ended) = self.open[i].take() {
                        ended.ended_at = Some(start);
                        self.keep_closed(ended);
                    }
                }
            }
        }
        self.windows += 1;
        self.violated_windows += u64::from(any_violated);
        let w = self.current;
        self.offered_bytes = self.offered_bytes.saturating_add(w.offered_bytes);
        self.delivered_bytes = self.delivered_bytes.saturating_add(w.delivered_bytes);
        self.delivered_packets = self.delivered_packets.saturating_add(w.delivered_packets);
        self.lost_packets = self.lost_packets.saturating_add(w.lost_packets);
        self.current = WindowCounters::EMPTY;
        if let Some(lat) = &mut self.latency {
            lat.window_histogram.reset();
        }
        self.window_start = start + self.window;
    }

    /// What the current window says about `kind`; `None` when the bound does not apply to it.
    /// Decisions use exact integer arithmetic; the float values are for reporting.
    fn judge(&self, kind: ViolationKind) -> Option<Judgement> {
        let w = &self.current;
        let window_ns = u128::from(self.window.as_nanos());
        // bytes * 8 * 1e9 compared with bps * window_ns: both sides are bits * ns/s.
        let scaled_bits = |bytes: u64| u128::from(bytes) * 8 * u128::from(NANOS_PER_SEC);
        match kind {
            ViolationKind::MinBandwidth => {
                let need = u128::from(self.slo.min_bps) * window_ns;
                // EyeQ section 2.1: the guarantee holds while demand reaches it.
                if self.slo.min_bps == 0 || scaled_bits(w.offered_bytes) < need {
                    return None;
                }
                Some(Judgement {
                    value: rate_bps(w.delivered_bytes, self.window),
                    bound: self.slo.min_bps as f64,
                    violated: scaled_bits(w.delivered_bytes) < need,
                })
            }
            ViolationKind::MaxBandwidth => {
                let max_bps = self.slo.max_bps?;
                if w.delivered_bytes == 0 {
                    return None;
                }
                Some(Judgement {
                    value: rate_bps(w.delivered_bytes, self.window),
                    bound: max_bps as f64,
                    violated: scaled_bits(w.delivered_bytes) > u128::from(max_bps) * window_ns,
                })
            }
            ViolationKind::Latency => {
                let lat = self.latency.as_ref()?;
                if w.latency_samples == 0 {
                    return None;
                }
                // Nearest rank: the p-th percentile is <= bound iff at least p% of the
                // samples are <= bound.
                let within = u128::from(w.latency_samples - w.latency_above_bound);
                let violated = within * u128::from(PPM)
                    < u128::from(lat.quantile_ppm) * u128::from(w.latency_samples);
                // The histogram's percentile is exact to 2 digits; keep it on the side of the
                // bound the exact test chose.
                let approx = lat
                    .window_histogram
                    .value_at_quantile(lat.quantile_ppm as f64 / PPM as f64);
                let value_ns = if violated {
                    approx.max(w.min_latency_above_bound)
                } else {
                    approx.min(lat.bound_ns)
                };
                Some(Judgement {
                    value: value_ns as f64 / 1_000.0,
                    bound: lat.bound_ns as f64 / 1_000.0,
                    violated,
                })
            }
            ViolationKind::Loss => {
                let (max_loss, max_loss_ppb) = (self.slo.max_loss?, self.max_loss_ppb?);
                let packets = w.lost_packets.saturating_add(w.delivered_packets);
                if packets == 0 {
                    return None;
                }
                Some(Judgement {
                    value: w.lost_packets as f64 / packets as f64,
                    bound: max_loss,
                    violated: u128::from(w.lost_packets) * u128::from(PPB)
                        > u128::from(max_loss_ppb) * u128::from(packets),
                })
            }
        }
    }

    fn keep_closed(&mut self, violation: Violation) {
        if self.closed.len() >= self.max_closed {
            self.dropped += 1;
            if self.closed.pop_front().is_none() {
                return; // max_closed == 0: keep nothing
            }
        }
        self.closed.push_back(violation);
    }
}

/// A fixed-size latency histogram in nanoseconds, 1 ns to [`MAX_TRACKED_LATENCY_NS`]
/// (`significant_digits` already checked to be in 1..=5).
fn latency_histogram(significant_digits: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_LATENCY_NS, significant_digits)
        .expect("constant histogram bounds are valid")
}

/// Mean rate in bits/s of `bytes` over `span` (0 for an empty span).
fn rate_bps(bytes: u64, span: Duration) -> f64 {
    if span == Duration::ZERO {
        return 0.0;
    }
    bytes as f64 * 8.0 * NANOS_PER_SEC as f64 / span.as_nanos() as f64
}
