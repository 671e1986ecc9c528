//! What the run loop shares with the API thread: its snapshots (ports and workers as `/stats`
//! shows them) and the running config.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::accel::{AccelKeys, AccelView};
use crate::config::Config;
use crate::engine::{SloReport, Snapshot};
use crate::port::PortStats;

/// A worker's handoff counters (`/stats` `workers`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct HandoffCounters {
    /// Frames this worker handed to others (uplink frames for their VMs, frames for their
    /// ports, feedback copies).
    pub out: u64,
    /// Frames other workers handed to this one.
    pub r#in: u64,
    /// Frames dropped because the receiving worker's mailbox was full.
    pub full: u64,
    /// Frames dropped because a live change removed or moved their VM's port while they were
    /// handed over (the worker no longer holds that VM, or nobody holds the port yet).
    pub stale: u64,
}

/// A worker as `/stats` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkerView {
    pub worker: usize,
    /// The VMs whose ports it owns.
    pub vms: Vec<String>,
    /// CPU time of its thread, ns (its engine's `cpu_ns`).
    pub cpu_ns: u64,
    pub handoff: HandoffCounters,
    /// How long its loop took to apply the live changes that changed something.
    pub live_commits: CommitTimes,
}

/// The time a dataplane loop spends applying one API change, during which the frames in its
/// rings wait: from taking it until the loop goes on (a worker's answer to the coordinator
/// included; the single loop answers the API later, when about to wait). Count and
/// quantiles, us.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CommitTimes {
    pub commits: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Records [`CommitTimes`] (ns, 1 ns to 10 s, 3 significant digits).
pub(crate) struct CommitClock(hdrhistogram::Histogram<u64>);

impl Default for CommitClock {
    fn default() -> Self {
        Self(hdrhistogram::Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds"))
    }
}

impl CommitClock {
    pub(crate) fn record(&mut self, since: std::time::Instant) {
        self.0.saturating_record(since.elapsed().as_nanos() as u64);
    }
    pub(crate) fn view(&self) -> CommitTimes {
        let us = |q: f64| self.0.value_at_quantile(q) as f64 / 1e3;
        CommitTimes {
            commits: self.0.len(),
            p50_us: us(0.5),
            p90_us: us(0.9),
            p99_us: us(0.99),
            max_us: self.0.max() as f64 / 1e3,
        }
    }
}

/// A port as the API shows it: counters and how the loop waits on its receive ring.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PortView {
    pub name: String,
    pub backend: String,
    /// The worker that reads it (each worker has its own uplink socket).
    pub worker: usize,
    pub stats: PortStats,
    /// Rizzo et al. regime of this ring: GP while its wait last chose to spin, otherwise the
    /// Table 1 regime under notification (None until estimated).
    pub wait_regime: Option<String>,
    /// Idle passes on which this ring's wait chose to spin.
    pub wait_spins: u64,
    /// Idle passes on which this ring's wait chose to block.
    pub wait_blocks: u64,
    /// Estimated time between frames from the ring's producer, ns.
    pub producer_period_ns: Option<u64>,
}

/// What the run loop publishes every 100 ms (`/stats`; `slo` is `/slo`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Published {
    pub switch: Snapshot,
    pub ports: Vec<PortView>,
    /// The frame pool: free frames and capacity (a frame not free is queued in an engine or
    /// a port's transmit batch; all are back when the queues drain).
    pub pool_free: usize,
    pub pool_capacity: usize,
    /// The shared encryption engine, when a tenant encrypts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accel: Option<AccelView>,
    /// The dataplane workers: the VMs each owns, its CPU, its handoffs.
    pub workers: Vec<WorkerView>,
    #[serde(skip)]
    pub slo: SloReport,
}

/// Shared with the API thread: the latest snapshot and the current config, each an `Arc`
/// swapped atomically (`arc-swap`): the loop publishes without taking a lock, and a reader
/// that holds a snapshot for as long as it likes (a slow scrape) never delays the loop.
#[derive(Default)]
pub struct Shared {
    snapshot: ArcSwapOption<Published>,
    config: ArcSwapOption<Config>,
    /// The encrypting tenants' keys, for rotation through the API (None: nobody encrypts).
    accel_keys: ArcSwapOption<AccelKeys>,
}

impl Shared {
    /// The latest published snapshot (None before the first).
    pub fn latest(&self) -> Option<Arc<Published>> {
        self.snapshot.load_full()
    }
    /// Replaces the published snapshot; never waits for readers.
    pub fn publish(&self, published: Published) {
        self.snapshot.store(Some(Arc::new(published)));
    }
    /// The running config (None before the loop started).
    pub fn config(&self) -> Option<Arc<Config>> {
        self.config.load_full()
    }
    pub fn set_config(&self, cfg: Config) {
        self.config.store(Some(Arc::new(cfg)));
    }
    /// The running shared engine's keys (None when no tenant encrypts).
    pub fn accel_keys(&self) -> Option<Arc<AccelKeys>> {
        self.accel_keys.load_full()
    }
    /// Publishes the running shared engine's keys for the API.
    pub fn set_accel_keys(&self, keys: Option<AccelKeys>) {
        self.accel_keys.store(keys.map(Arc::new));
    }
}
