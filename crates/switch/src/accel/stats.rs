//! What the engine shows in `/stats`: per tenant, the jobs done and refused, the worker CPU
//! they took, the FairNIC limiter's counters, and how long jobs took through the engine (the
//! wait in the tenant's queue, and the whole turnaround from submission until the dataplane
//! took the result back: queue, worker run, and the worker's and the dataplane's wake-ups).

use std::sync::atomic::{AtomicU64, Ordering};

use picnic_core::fairnic::TenantEngineStats;
use serde::Serialize;

use super::{lock, Accel};
use crate::config::Config;
use crate::stats::WaitHistogram;

/// The engine as `/stats` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct AccelView {
    pub workers: usize,
    pub isolated: bool,
    /// Tokens (worker ns) per second the limiter admits.
    pub capacity_tokens_per_sec: u64,
    /// Token cost of a job: `per_job + per_byte * bytes`.
    pub cost_per_job: u64,
    pub cost_per_byte: u64,
    /// Per encrypting tenant, by name.
    pub tenants: std::collections::BTreeMap<String, TenantAccelStats>,
}

/// Per-tenant engine counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantAccelStats {
    pub sealed: u64,
    pub opened: u64,
    pub auth_failed: u64,
    pub unknown_key: u64,
    pub no_key: u64,
    pub malformed: u64,
    /// Jobs given back because the tenant's queue was full.
    pub queue_full: u64,
    /// Jobs the limiter refused with an error (dropped, never run).
    pub refused: u64,
    /// Admitted jobs waiting for a worker now (all tenants' without isolation).
    pub queued: usize,
    /// Worker CPU spent on the tenant's jobs, ns.
    pub cpu_ns: u64,
    /// Bytes the tenant's jobs covered.
    pub bytes: u64,
    /// Live key epochs and the one sealing.
    pub key_epochs: Vec<u32>,
    pub sending_epoch: Option<u32>,
    /// The FairNIC limiter's view (None without isolation).
    pub limiter: Option<LimiterView>,
    /// How long its jobs took through the engine.
    pub latency: EngineLatency,
}

/// How long a tenant's jobs took through the engine, in power-of-two us buckets.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EngineLatency {
    /// In the tenant's queue, until a worker started the job.
    pub queue: WaitHistogram,
    /// From submission until the dataplane took the result back.
    pub turnaround: WaitHistogram,
}

/// The limiter's counters for one tenant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LimiterView {
    pub granted: u64,
    pub denied: u64,
    pub base_tokens: u64,
    pub stolen_tokens: u64,
    pub contentions: u64,
    pub allowance: u64,
}

impl From<TenantEngineStats> for LimiterView {
    fn from(s: TenantEngineStats) -> Self {
        LimiterView {
            granted: s.granted,
            denied: s.denied,
            base_tokens: s.base_tokens,
            stolen_tokens: s.stolen_tokens,
            contentions: s.contentions,
            allowance: s.allowance,
        }
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) sealed: AtomicU64,
    pub(super) opened: AtomicU64,
    pub(super) auth_failed: AtomicU64,
    pub(super) unknown_key: AtomicU64,
    pub(super) no_key: AtomicU64,
    pub(super) malformed: AtomicU64,
    pub(super) queue_full: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) cpu_ns: AtomicU64,
    pub(super) bytes: AtomicU64,
}

impl Accel {
    /// Counters of every tenant.
    pub fn stats(&self) -> Vec<TenantAccelStats> {
        let rings = self.shared.keys.read().unwrap_or_else(|e| e.into_inner());
        let queues = {
            let mut q = lock(&self.shared.queues);
            self.shared.take_admitted(&mut q);
            q
        };
        let latency = lock(&self.shared.latency);
        self.shared
            .counters
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let (key_epochs, sending_epoch) = rings[t].epochs();
                let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
                TenantAccelStats {
                    sealed: get(&c.sealed),
                    opened: get(&c.opened),
                    auth_failed: get(&c.auth_failed),
                    unknown_key: get(&c.unknown_key),
                    no_key: get(&c.no_key),
                    malformed: get(&c.malformed),
                    queue_full: get(&c.queue_full),
                    refused: get(&c.refused),
                    queued: queues.queued(t),
                    cpu_ns: get(&c.cpu_ns),
                    bytes: get(&c.bytes),
                    key_epochs,
                    sending_epoch,
                    limiter: self
                        .shared
                        .limiter
                        .as_ref()
                        .and_then(|l| l.stats(t))
                        .map(LimiterView::from),
                    latency: latency.get(t).cloned().unwrap_or_default(),
                }
            })
            .collect()
    }

    /// The engine's state for `/stats`; tenants named from `cfg` (those that encrypt).
    pub fn view(&self, cfg: &Config) -> AccelView {
        let tenants = self
            .stats()
            .into_iter()
            .zip(&cfg.tenants)
            .filter(|(_, t)| t.encrypt)
            .map(|(s, t)| (t.name.clone(), s))
            .collect();
        AccelView {
            workers: self.workers_count,
            isolated: cfg.isolation.accel,
            capacity_tokens_per_sec: self.capacity,
            cost_per_job: self.cost.per_request,
            cost_per_byte: self.cost.per_byte,
            tenants,
        }
    }
}
