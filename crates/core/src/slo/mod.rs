//! Per-tenant SLOs and conformance monitoring.
//!
//! An [`Slo`] is PicNIC's "predictable virtualized NIC" promise (PicNIC section 1): measurable
//! bounds on bandwidth (a min/max envelope), packet-rate share, latency at a percentile, and loss.
//! A [`SloMonitor`] judges one tenant's observed traffic against it over fixed, short windows,
//! because guarantees only mean something over short intervals (EyeQ section 2.1), and reports
//! violations as intervals with the time they started and ended (DESIGN.md section 3 item 9).
//! [`SloSummary`] condenses a whole run into the numbers and pass/fail [`Check`]s the lab reports.
//!
//! The minimum bandwidth is judged only in windows where the tenant offered at least its
//! minimum: a tenant sending less than its guarantee is not short-changed on bandwidth (what it
//! loses shows up against `max_loss`). `pps_share` is a scheduling weight and is not judged.
//!
//! The monitor is sans-I/O like the rest of the crate: every call takes `now`, windows close
//! lazily on the next call or in [`SloMonitor::on_timeout`] at [`SloMonitor::poll_at`].
//! This file holds the objective and what a violation is; `monitor.rs` the monitor and its
//! run summary.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::{Instant, NANOS_PER_SEC};

mod monitor;
pub use monitor::{Check, SloMonitor, SloMonitorConfig, SloSummary};

/// Percentile `latency_us` applies to when the config gives no `latency_percentile`.
pub const DEFAULT_LATENCY_PERCENTILE: f64 = 99.0;

/// Latency samples above this are counted at this value in reported percentiles (10 s).
/// Whether a sample breaks the latency bound is still decided on its exact value.
pub const MAX_TRACKED_LATENCY_NS: u64 = 10 * NANOS_PER_SEC;

/// One tenant's (or VM's) service-level objective (PicNIC section 1: bandwidth envelope,
/// latency percentiles, loss; EyeQ section 2: min guarantees, max caps).
///
/// Deserializes from a TOML table (embedded in switch and lab configs) and is validated while
/// parsing, so a parsed `Slo` always satisfies [`Slo::validate`]. Every key is optional; an
/// empty table is a best-effort tenant with no bounds. Unknown keys are rejected.
///
/// ```toml
/// min_bps = 100_000_000        # guaranteed 100 Mb/s while the tenant offers at least that
/// max_bps = 1_000_000_000      # never more than 1 Gb/s
/// pps_share = 2.0              # packet-rate weight relative to other tenants
/// latency_us = 200             # p99.9 latency within 200 us
/// latency_percentile = 99.9
/// max_loss = 0.001             # at most 0.1% of packets lost
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SloFields", into = "SloFields")]
pub struct Slo {
    /// Guaranteed delivered bandwidth in bits/s, judged only in windows where the tenant offered
    /// at least this much (EyeQ section 2.1: a guarantee holds as long as demand reaches it).
    /// 0 means no guarantee.
    pub min_bps: u64,
    /// Cap on delivered bandwidth in bits/s; `None` means uncapped.
    pub max_bps: Option<u64>,
    /// Share of the host's packet-processing rate (PicNIC section 2: capacity is variable in PPS
    /// as well as BPS), as a fraction (0.25) or a weight relative to other tenants (2.0). It is a
    /// scheduling weight: [`SloMonitor`] does not judge it, since a share is only defined
    /// against the neighbours' load.
    pub pps_share: Option<f64>,
    /// Latency bound in microseconds at `latency_percentile`; `None` means no latency bound.
    pub latency_us: Option<u64>,
    /// Percentile in (0, 100] that `latency_us` bounds, e.g. 99.0 or 99.9
    /// (default [`DEFAULT_LATENCY_PERCENTILE`]). Resolution 0.0001 percentage points.
    pub latency_percentile: f64,
    /// Largest tolerated fraction of packets lost, in [0, 1]; `None` means no loss bound.
    /// Resolution 1e-9.
    pub max_loss: Option<f64>,
}

impl Default for Slo {
    /// A best-effort SLO: no guarantee, no cap, no latency or loss bound.
    fn default() -> Self {
        Slo {
            min_bps: 0,
            max_bps: None,
            pps_share: None,
            latency_us: None,
            latency_percentile: DEFAULT_LATENCY_PERCENTILE,
            max_loss: None,
        }
    }
}

impl Slo {
    /// Checks every field's range and their consistency; the error names the offending field.
    pub fn validate(&self) -> Result<(), SloError> {
        if let Some(max_bps) = self.max_bps {
            if max_bps == 0 {
                return Err(SloError::new(
                    "max_bps",
                    "max_bps must be > 0 (omit it for no cap)".into(),
                ));
            }
            if max_bps < self.min_bps {
                return Err(SloError::new(
                    "max_bps",
                    format!(
                        "max_bps must be >= min_bps (max_bps = {max_bps}, min_bps = {})",
                        self.min_bps
                    ),
                ));
            }
        }
        if let Some(share) = self.pps_share {
            if !(share.is_finite() && share > 0.0) {
                return Err(SloError::new(
                    "pps_share",
                    format!("pps_share must be a finite number > 0 (a fraction like 0.25 or a weight like 2), got {share}"),
                ));
            }
        }
        if self.latency_us == Some(0) {
            return Err(SloError::new(
                "latency_us",
                "latency_us must be > 0 (omit it for no latency bound)".into(),
            ));
        }
        let p = self.latency_percentile;
        if !(p > 0.0 && p <= 100.0) {
            return Err(SloError::new(
                "latency_percentile",
                format!("latency_percentile must be in (0, 100], e.g. 99.0, got {p}"),
            ));
        }
        if let Some(loss) = self.max_loss {
            if !(0.0..=1.0).contains(&loss) {
                return Err(SloError::new(
                    "max_loss",
                    format!("max_loss must be a fraction in [0, 1], e.g. 0.001, got {loss}"),
                ));
            }
        }
        Ok(())
    }
}

/// The TOML shape of [`Slo`]: what a config may say, before validation.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SloFields {
    #[serde(default)]
    min_bps: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pps_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    latency_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    latency_percentile: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_loss: Option<f64>,
}

impl TryFrom<SloFields> for Slo {
    type Error = SloError;

    fn try_from(f: SloFields) -> Result<Self, SloError> {
        if f.latency_percentile.is_some() && f.latency_us.is_none() {
            return Err(SloError::new(
                "latency_percentile",
                "latency_percentile needs latency_us (the bound it applies to)".into(),
            ));
        }
        let slo = Slo {
            min_bps: f.min_bps,
            max_bps: f.max_bps,
            pps_share: f.pps_share,
            latency_us: f.latency_us,
            latency_percentile: f.latency_percentile.unwrap_or(DEFAULT_LATENCY_PERCENTILE),
            max_loss: f.max_loss,
        };
        slo.validate()?;
        Ok(slo)
    }
}

impl From<Slo> for SloFields {
    fn from(slo: Slo) -> Self {
        SloFields {
            min_bps: slo.min_bps,
            max_bps: slo.max_bps,
            pps_share: slo.pps_share,
            latency_us: slo.latency_us,
            latency_percentile: slo.latency_us.map(|_| slo.latency_percentile),
            max_loss: slo.max_loss,
        }
    }
}

/// An invalid SLO or monitor setting: which field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SloError {
    /// The offending field as spelled in the config, e.g. `"max_bps"`.
    pub field: &'static str,
    /// A sentence naming the field, the rule it breaks and the value given.
    pub message: String,
}

impl SloError {
    fn new(field: &'static str, message: String) -> Self {
        SloError { field, message }
    }
}

impl fmt::Display for SloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid SLO: {}", self.message)
    }
}

impl std::error::Error for SloError {}

/// Which bound of an [`Slo`] a window broke. Values and bounds of each kind are reported in
/// the unit given per variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// Delivered less than `min_bps` while offering at least `min_bps` (bits/s).
    MinBandwidth,
    /// Delivered more than `max_bps` (bits/s).
    MaxBandwidth,
    /// The window's `latency_percentile` latency exceeded `latency_us` (microseconds).
    Latency,
    /// The window's lost fraction of packets exceeded `max_loss` (fraction).
    Loss,
}

impl ViolationKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ViolationKind; 4] = [
        ViolationKind::MinBandwidth,
        ViolationKind::MaxBandwidth,
        ViolationKind::Latency,
        ViolationKind::Loss,
    ];

    const fn index(self) -> usize {
        self as usize
    }

    /// The worse of two observed values: lower for a minimum, higher for the other bounds.
    fn worse(self, a: f64, b: f64) -> f64 {
        match self {
            ViolationKind::MinBandwidth => a.min(b),
            _ => a.max(b),
        }
    }
}

/// A set of [`ViolationKind`]s (serializes as a list).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ViolationKinds(u8);

impl ViolationKinds {
    /// Whether `kind` is in the set.
    pub fn contains(self, kind: ViolationKind) -> bool {
        self.0 & (1 << kind.index()) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The kinds in the set, in [`ViolationKind::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = ViolationKind> {
        ViolationKind::ALL
            .into_iter()
            .filter(move |k| self.contains(*k))
    }

    fn insert(&mut self, kind: ViolationKind) {
        self.0 |= 1 << kind.index();
    }
}

impl Serialize for ViolationKinds {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// Conformance right now, as of the last closed window (for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloState {
    /// No bound is in violation.
    Met,
    /// These bounds are in violation (never empty).
    Violated(ViolationKinds),
}

/// One interval during which a bound was broken: consecutive violating windows merged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// The bound that was broken.
    pub kind: ViolationKind,
    /// Start of the first violating window.
    pub started_at: Instant,
    /// Start of the first window that no longer violated (= end of the last violating one);
    /// `None` while the violation is still open.
    pub ended_at: Option<Instant>,
    /// The worst window value during the interval, in the kind's unit (see [`ViolationKind`]).
    pub worst_value: f64,
    /// The bound, in the kind's unit.
    pub bound: f64,
}
