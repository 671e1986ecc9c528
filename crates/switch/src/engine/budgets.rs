//! The tenants' CPU accounts (Iron 3.2: one [`SharedAccount`] per tenant with a quota,
//! refilled per period by Algorithm 1, from which each engine takes slices of its own, CFS's
//! `rt_remain`), for one loop and for workers alike: a lone engine builds accounts of its own
//! ([`Engine::own_budgets`]); with several workers the coordinator builds one set for the host
//! and every worker's engine joins it (docs/switch.md "Workers", [`crate::workers`]). With
//! workers the uplink's pacing bucket is shared too (a lock-free [`SharedBucket`] every worker
//! borrows from through its own [`picnic_core::pool::TokenCache`], EyeQ 4's per-CPU token
//! counts). Plain shared state without I/O.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use picnic_core::iron::shared::{SharedAccount, Slice};
use picnic_core::iron::{Admission, IronConfig};
use picnic_core::pool::SharedBucket;
use picnic_core::{Duration, Instant};

use super::{iron_quota, Engine, IRON_PERIOD};
use crate::directory::{Directory, TenantIdx};

/// Each tenant's Iron allocation per period (index = tenant), None without a quota or with
/// CPU accounting off.
pub fn tenant_quotas(dir: &Directory, cpu_accounting: bool) -> Vec<Option<Duration>> {
    dir.tenants
        .iter()
        .map(|t| iron_quota(t).filter(|_| cpu_accounting))
        .collect()
}

/// What all workers draw from (see the module doc): per tenant its CPU account in ns, and the
/// uplink's pacing bucket in bytes.
#[derive(Debug)]
pub struct SharedBudgets {
    /// The uplink's capacity (`uplink.capacity_mbps`), bytes/s, when egress is paced to it:
    /// every worker's egress scheduler borrows from it (EyeQ 4's multi-queue rate limiter).
    pub link: Option<Arc<SharedBucket>>,
    /// What a worker's link cache borrows at once, bytes.
    pub link_chunk: u64,
    /// Per tenant with a quota: its one Iron account, refilled to its quota every period.
    pub accounts: Vec<Option<Arc<SharedAccount>>>,
    /// Per tenant: ns charged by every worker since the start.
    pub charged: Vec<Arc<AtomicU64>>,
    /// What a worker's slice takes from an account at once, ns.
    pub chunk: u64,
}

impl SharedBudgets {
    /// Accounts for the tenants with a quota of `quotas` (index = tenant), each `quota` ns of
    /// CPU per `period` (early drops below 10% left, as the single loop's), the first period
    /// starting full at `now`; workers' slices take 1/16 of a period's smallest quota split
    /// over the workers, at most 100 us.
    pub fn new(
        quotas: &[Option<Duration>],
        period: Duration,
        workers: usize,
        now: Instant,
    ) -> Self {
        let smallest = quotas.iter().flatten().map(|q| q.as_nanos()).min();
        SharedBudgets {
            link: None,
            link_chunk: 1,
            accounts: quotas
                .iter()
                .map(|q| q.map(|q| Arc::new(SharedAccount::new(q, iron_config(period), now))))
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
    /// is unchanged keeps its account and its charges, one whose quota changed keeps its
    /// account's debt and period ([`SharedAccount::with_quota`]), the uplink its pacer (None:
    /// nothing changed).
    pub fn after_change(
        &self,
        quotas: &[Option<Duration>],
        period: Duration,
        workers: usize,
        now: Instant,
    ) -> Option<SharedBudgets> {
        let mut new = SharedBudgets::new(quotas, period, workers, now);
        let same: Vec<bool> = (0..quotas.len())
            .map(|t| match (self.account(t), new.account(t)) {
                (Some(a), Some(b)) => a.quota() == b.quota(),
                (a, b) => a.is_none() && b.is_none(),
            })
            .collect();
        if quotas.len() == self.accounts.len() && same.iter().all(|&s| s) {
            return None;
        }
        let kept = self
            .accounts
            .iter()
            .zip(&self.charged)
            .zip(&same)
            .take(quotas.len());
        for (t, ((account, charged), &same)) in kept.enumerate() {
            new.charged[t] = charged.clone();
            match (account, quotas[t]) {
                (Some(a), _) if same => new.accounts[t] = Some(a.clone()),
                (Some(a), Some(q)) => new.accounts[t] = Some(Arc::new(a.with_quota(now, q))),
                _ => {}
            }
        }
        new.link = self.link.clone();
        new.link_chunk = self.link_chunk;
        Some(new)
    }

    /// The tenant's account, if it has a quota.
    pub fn account(&self, tenant: TenantIdx) -> Option<&SharedAccount> {
        self.accounts.get(tenant).and_then(Option::as_deref)
    }

    /// Notes `ns` charged to `tenant` by some worker.
    pub fn note_charged(&self, tenant: TenantIdx, ns: u64) {
        if let Some(c) = self.charged.get(tenant) {
            c.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Per tenant: ns every worker charged since the totals in `before`, which become the
    /// current totals.
    pub fn usage_since(&self, before: &mut Vec<u64>) -> Vec<u64> {
        before.resize(self.charged.len(), 0);
        self.charged
            .iter()
            .zip(before.iter_mut())
            .map(|(charged, before)| {
                let total = charged.load(Ordering::Relaxed);
                total.saturating_sub(std::mem::replace(before, total))
            })
            .collect()
    }
}

/// The accounts' Iron configuration: periods of `period`, early drops below 10% of the quota
/// left.
fn iron_config(period: Duration) -> IronConfig {
    IronConfig {
        period,
        early_drop_percent: Some(10),
    }
}

/// One engine's share of the tenants' CPU accounts: the accounts and this engine's slice of
/// each.
pub(super) struct WorkerBudgets {
    pub(super) budgets: Arc<SharedBudgets>,
    /// Whether the accounts are every worker's (the coordinator gives new ones at a live
    /// change) rather than this engine's own.
    joined: bool,
    pub(super) slices: Vec<Slice>,
    /// When the earliest throttled tenant's account refills, as of the last pass.
    pub(super) refill_at: Option<Instant>,
}

impl WorkerBudgets {
    /// Slices of `budgets`' accounts, keeping the counts of `old`'s (new accounts after a
    /// live change); `old` must have given its slices back first ([`WorkerBudgets::release`]).
    pub(super) fn new(
        budgets: Arc<SharedBudgets>,
        joined: bool,
        old: Option<WorkerBudgets>,
    ) -> WorkerBudgets {
        let mut slices: Vec<_> = (0..budgets.accounts.len())
            .map(|_| Slice::new(budgets.chunk))
            .collect();
        for (new, old) in slices.iter_mut().zip(old.iter().flat_map(|o| &o.slices)) {
            new.keep_stats(old);
        }
        WorkerBudgets {
            budgets,
            joined,
            slices,
            refill_at: None,
        }
    }

    /// Gives what this engine's slices hold back to the accounts.
    pub(super) fn release(&mut self, now: Instant) {
        for (t, slice) in self.slices.iter_mut().enumerate() {
            if let Some(account) = self.budgets.account(t) {
                slice.release(now, account);
            }
        }
    }

    pub(super) fn exhausted(&self, now: Instant, tenant: TenantIdx) -> bool {
        match self.budgets.account(tenant) {
            Some(a) => self.slices[tenant].exhausted(now, a),
            None => false,
        }
    }

    /// Whether one of `tenant`'s packets may be processed (Iron 3.2's drops before any work).
    pub(super) fn admit(&mut self, now: Instant, tenant: TenantIdx) -> Admission {
        match self.budgets.account(tenant) {
            Some(a) => self.slices[tenant].admit(now, a),
            None => Admission::Admit,
        }
    }

    /// Charges `ns` to `tenant` after the work: what the worker's slice cannot cover is taken
    /// from the shared account, as debt if need be.
    pub(super) fn charge(&mut self, now: Instant, tenant: TenantIdx, ns: u64) {
        if let Some(account) = self.budgets.account(tenant) {
            self.slices[tenant].charge(now, account, ns);
            self.budgets.note_charged(tenant, ns);
        }
    }

    /// When the earliest throttled tenant's account refills (None: none is throttled).
    pub(super) fn poll_at(&self, now: Instant) -> Option<Instant> {
        (0..self.slices.len())
            .filter(|&t| self.exhausted(now, t))
            .filter_map(|t| Some(self.budgets.account(t)?.next_boundary(now)))
            .min()
    }
}

impl Engine {
    /// A lone engine's accounts after its tenants' quotas may have changed (Iron 3.2 with one
    /// worker): a tenant whose quota stayed keeps its account, one whose quota changed keeps
    /// its debt ([`SharedBudgets::after_change`]). An engine that joined the workers' accounts
    /// leaves them to the coordinator.
    pub(super) fn own_budgets(&mut self, now: Instant) {
        if self.budgets.as_ref().is_some_and(|b| b.joined) {
            return;
        }
        let quotas = tenant_quotas(&self.dir, self.isolation.cpu_accounting);
        let new = match self.budgets.as_ref() {
            Some(b) => b.budgets.after_change(&quotas, IRON_PERIOD, 1, now),
            None if quotas.iter().all(Option::is_none) => None,
            None => Some(SharedBudgets::new(&quotas, IRON_PERIOD, 1, now)),
        };
        if let Some(new) = new {
            let mut old = self.budgets.take();
            if let Some(old) = old.as_mut() {
                old.release(now);
            }
            self.budgets = Some(WorkerBudgets::new(Arc::new(new), false, old));
        }
    }

    /// Charges `ns` of CPU spent for `tenant` to its Iron account through this engine's
    /// slice of it.
    pub(super) fn charge_tenant_cpu(&mut self, now: Instant, tenant: TenantIdx, ns: u64) {
        if let Some(b) = self.budgets.as_mut() {
            b.charge(now, tenant, ns);
        }
    }

    /// Whether one of `tenant`'s packets may be processed (Iron 3.2: a throttled tenant's
    /// are dropped before any work, and some early as its quota runs out).
    pub(super) fn admit_tenant(&mut self, now: Instant, tenant: TenantIdx) -> Admission {
        match self.budgets.as_mut() {
            Some(b) => b.admit(now, tenant),
            None => Admission::Admit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_accounts_hold_one_quota_per_period() {
        let period = Duration::from_millis(10);
        let quotas = [Some(Duration::from_millis(5)), None];
        let b = SharedBudgets::new(&quotas, period, 2, Instant::ZERO);
        let account = b.account(0).unwrap();
        assert!(b.account(1).is_none());
        assert_eq!(account.quota(), Duration::from_millis(5));
        assert_eq!(account.available(Instant::ZERO), 5_000_000);
        // 5 ms / 16 / 2 workers, capped at 100 us.
        assert_eq!(b.chunk, 100_000);
        b.note_charged(0, 7);
        b.note_charged(0, 5);
        assert_eq!(b.charged[0].load(Ordering::Relaxed), 12);
    }

    /// A live change keeps the accounts and charges of tenants whose quota stayed, and reports
    /// no change when no quota changed; a changed quota keeps the tenant's debt.
    #[test]
    fn budgets_after_a_change_keep_unchanged_tenants_accounts() {
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
            old.accounts[0].as_ref().unwrap(),
            new.accounts[0].as_ref().unwrap()
        ));
        assert_eq!(new.charged[0].load(Ordering::Relaxed), 7);
        assert!(new.account(1).is_some() && new.account(2).is_none());
        // 6 ms of debt on a 5 ms quota, then the quota halved: the debt stays.
        let mut slice = Slice::new(1);
        slice.charge(Instant::ZERO, new.account(0).unwrap(), 11_000_000);
        let halved = new
            .after_change(&[Some(ms(2)), Some(ms(2)), None], period, 2, Instant::ZERO)
            .unwrap();
        assert_eq!(halved.account(0).unwrap().debt(Instant::ZERO), 9_000_000);
    }
}
