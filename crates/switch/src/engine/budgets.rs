//! What the engines of several workers draw from together (docs/switch.md "Workers",
//! [`crate::workers`]): the tenants' CPU budgets (Iron 3.2) and the uplink's pacing bucket,
//! each a lock-free [`SharedBucket`] every worker borrows from through its own
//! [`TokenCache`] (EyeQ 4's per-CPU token counts, FairNIC 4.4's per-core caches). Plain
//! shared state without I/O: the coordinator builds it, each worker's engine draws from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use picnic_core::pool::{SharedBucket, TokenCache};
use picnic_core::{Duration, Instant};

use crate::directory::TenantIdx;

/// What all workers draw from (see the module doc): per tenant its CPU budget in ns, and the
/// uplink's pacing bucket in bytes.
#[derive(Debug)]
pub struct SharedBudgets {
    /// The uplink's capacity (`uplink.capacity_mbps`), bytes/s, when egress is paced to it:
    /// every worker's egress scheduler borrows from it (EyeQ 4's multi-queue rate limiter).
    pub link: Option<Arc<SharedBucket>>,
    /// What a worker's link cache borrows at once, bytes.
    pub link_chunk: u64,
    /// Per tenant with a quota: its bucket, refilled at its allocation (quota per Iron period)
    /// and holding one period's quota.
    pub buckets: Vec<Option<Arc<SharedBucket>>>,
    /// Per tenant: ns charged by every worker since the start.
    pub charged: Vec<Arc<AtomicU64>>,
    /// What a worker's cache borrows at once, ns.
    pub chunk: u64,
}

impl SharedBudgets {
    /// Budgets for the tenants with a quota of `quotas` (index = tenant), each `quota` ns of
    /// CPU per `period`, starting full at `now`; caches of `workers` workers borrow 1/16 of a
    /// period's smallest quota split over the workers, at most 100 us.
    pub fn new(
        quotas: &[Option<Duration>],
        period: Duration,
        workers: usize,
        now: Instant,
    ) -> Self {
        let per_sec = |q: Duration| {
            (q.as_nanos() as u128 * 1_000_000_000 / period.as_nanos().max(1) as u128) as u64
        };
        let smallest = quotas.iter().flatten().map(|q| q.as_nanos()).min();
        SharedBudgets {
            link: None,
            link_chunk: 1,
            buckets: quotas
                .iter()
                .map(|q| q.map(|q| Arc::new(SharedBucket::new(per_sec(q), q.as_nanos(), now))))
                .collect(),
            charged: quotas.iter().map(|_| Arc::default()).collect(),
            chunk: smallest
                .map(|q| (q / 16 / workers.max(1) as u64).clamp(1, 100_000))
                .unwrap_or(1),
        }
    }

    /// Paces the workers' egress together to `rate` bytes/s with bursts of `burst`; each
    /// worker's cache borrows a share of the burst at once.
    pub fn with_link(mut self, rate: u64, burst: u64, now: Instant, workers: usize) -> Self {
        self.link = Some(Arc::new(SharedBucket::new(rate, burst, now)));
        self.link_chunk = (burst / (2 * workers.max(1) as u64)).max(1);
        self
    }

    /// The budgets after a live change left the tenants with `quotas`: a tenant whose quota
    /// is unchanged keeps its bucket and its charges, the uplink its pacer (None: nothing
    /// changed).
    pub fn after_change(
        &self,
        quotas: &[Option<Duration>],
        period: Duration,
        workers: usize,
        now: Instant,
    ) -> Option<SharedBudgets> {
        let mut new = SharedBudgets::new(quotas, period, workers, now);
        let same: Vec<bool> = (0..quotas.len())
            .map(|t| match (self.bucket(t), new.bucket(t)) {
                (Some(a), Some(b)) => a.rate() == b.rate() && a.burst() == b.burst(),
                (a, b) => a.is_none() && b.is_none(),
            })
            .collect();
        if quotas.len() == self.buckets.len() && same.iter().all(|&s| s) {
            return None;
        }
        let kept = self
            .buckets
            .iter()
            .zip(&self.charged)
            .zip(&same)
            .take(quotas.len());
        for (t, ((bucket, charged), &same)) in kept.enumerate() {
            new.charged[t] = charged.clone();
            if same {
                new.buckets[t] = bucket.clone();
            }
        }
        new.link = self.link.clone();
        new.link_chunk = self.link_chunk;
        Some(new)
    }

    /// The tenant's bucket, if it has a quota.
    pub fn bucket(&self, tenant: TenantIdx) -> Option<&SharedBucket> {
        self.buckets.get(tenant).and_then(Option::as_deref)
    }

    /// Notes `ns` charged to `tenant` by some worker.
    pub fn note_charged(&self, tenant: TenantIdx, ns: u64) {
        if let Some(c) = self.charged.get(tenant) {
            c.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// One worker's share of the tenants' CPU budgets: the budgets every worker draws from and
/// this worker's token cache of each.
pub(super) struct WorkerBudgets {
    pub(super) budgets: Arc<SharedBudgets>,
    pub(super) caches: Vec<TokenCache>,
    /// Per tenant: frames this worker dropped because the shared budget was used up.
    pub(super) throttle_drops: Vec<u64>,
}

impl WorkerBudgets {
    pub(super) fn exhausted(&self, now: Instant, tenant: TenantIdx) -> bool {
        self.budgets
            .bucket(tenant)
            .is_some_and(|b| self.caches[tenant].exhausted(now, b))
    }

    /// Charges `ns` to `tenant` after the work: what the cache cannot cover is debt on the
    /// shared budget.
    pub(super) fn charge(&mut self, now: Instant, tenant: TenantIdx, ns: u64) {
        if let Some(bucket) = self.budgets.bucket(tenant) {
            self.caches[tenant].charge(now, bucket, ns);
            self.budgets.note_charged(tenant, ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_budgets_refill_at_the_allocation_and_hold_one_quota() {
        let period = Duration::from_millis(10);
        let quotas = [Some(Duration::from_millis(5)), None];
        let b = SharedBudgets::new(&quotas, period, 2, Instant::ZERO);
        let bucket = b.bucket(0).unwrap();
        assert!(b.bucket(1).is_none());
        assert_eq!((bucket.rate(), bucket.burst()), (500_000_000, 5_000_000));
        // 5 ms / 16 / 2 workers, capped at 100 us.
        assert_eq!(b.chunk, 100_000);
        b.note_charged(0, 7);
        b.note_charged(0, 5);
        assert_eq!(b.charged[0].load(Ordering::Relaxed), 12);
    }

    /// A live change keeps the buckets and charges of tenants whose quota stayed, and reports
    /// no change when no quota changed.
    #[test]
    fn budgets_after_a_change_keep_unchanged_tenants_buckets() {
        let ms = Duration::from_millis;
        let period = ms(10);
        let old = SharedBudgets::new(&[Some(ms(5)), None], period, 2, Instant::ZERO);
        old.note_charged(0, 7);
        assert!(old
            .after_change(&[Some(ms(5)), None], period, 2, Instant::ZERO)
            .is_none());
        let new = old
            .after_change(&[Some(ms(5)), Some(ms(2)), None], period, 2, Instant::ZERO)
            .unwrap();
        assert!(Arc::ptr_eq(
            old.buckets[0].as_ref().unwrap(),
            new.buckets[0].as_ref().unwrap()
        ));
        assert_eq!(new.charged[0].load(Ordering::Relaxed), 7);
        assert!(new.bucket(1).is_some() && new.bucket(2).is_none());
    }
}
