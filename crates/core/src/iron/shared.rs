//! One tenant's Iron account shared by every dataplane worker of a host (Iron 3.2, the
//! CFS bandwidth control it builds on): the global `runtime` of the tenant,
//! refilled once per period by Algorithm 1, and the per-worker slices (`rt_remain`) each
//! worker takes from them and settles its measured charges into (Algorithm 2).
//!
//! Iron's scheduler "minimizes locking overhead by updating local state on a fine-grained
//! level and global state on a coarse-grained level": a global `runtime` set to the quota at
//! the start of a period, from which a slice is handed to a core whenever its local
//! `rt_remain` runs out. Here [`SharedAccount`] is the global state, a few atomics any worker
//! updates with compare-and-swap, and [`Slice`] is one worker's `rt_remain`, a plain integer
//! it owns: a charge its slice covers touches no shared memory.
//!
//! * **Refill (Algorithm 1).** The first call at or after a period boundary applies it for
//!   every boundary passed: a positive leftover is dropped because the tenant was limited by its demand (lines 5-7), and the
//!   quota is added (line 8), so a debt (negative `runtime`) carries into the next period.
//!   Slices belong to the period they were taken in; what a slice still holds at a boundary is
//!   unused time of that period and is dropped with the rest (lines 5-7).
//! * **Charge (Algorithm 2 lines 3-9, 14-23).** A worker settles the measured cost of its work
//!   from its slice; when the slice is short it takes a new one from positive `runtime`
//!   (lines 19-22); what no slice covers is taken from `runtime` anyway, which goes negative:
//!   the debt every worker's next slice pays. Iron's credit (lines 10-12, `gained`) has no
//!   caller in the switch (see the parent module).
//!
//! Across all workers a tenant is therefore given at most its quota per period (less the
//! debt carried): slices never cross a boundary, and work measured after
//! the slices ran out is debt the next period pays. One account per worker instead would
//! give a tenant its quota on every worker.
//!
//! Sans-I/O: every call takes `now`. Workers on different threads read one monotonic clock;
//! a call with a `now` before the last boundary applied sees the new period.

use core::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::{Admission, IronConfig};
use crate::time::{Duration, Instant};

/// One tenant's global Iron state shared by every worker (see the module doc).
#[derive(Debug)]
pub struct SharedAccount {
    quota: i64,
    period: u64,
    origin: u64,
    early_drop_percent: Option<u8>,
    /// Periods since `origin` up to which Algorithm 1 has been applied.
    epoch: AtomicU64,
    /// Iron's `runtime`: negative while in debt.
    runtime: AtomicI64,
}

impl SharedAccount {
    /// An account of `quota` per `config.period` whose first period starts, full, at `now`.
    /// A zero period counts as 1 ns.
    pub fn new(quota: Duration, config: IronConfig, now: Instant) -> SharedAccount {
        let quota = quota.as_nanos().min(i64::MAX as u64) as i64;
        SharedAccount {
            quota,
            period: config.period.as_nanos().max(1),
            origin: now.as_nanos(),
            early_drop_percent: config.early_drop_percent,
            epoch: AtomicU64::new(0),
            runtime: AtomicI64::new(quota),
        }
    }

    /// The same account with a new quota from `now` on, as a cgroup quota written mid-period:
    /// this period's runtime moves by the difference, at most the new quota; the debt and the
    /// period clock stay.
    pub fn with_quota(&self, now: Instant, quota: Duration) -> SharedAccount {
        let epoch = self.roll(now);
        let new = quota.as_nanos().min(i64::MAX as u64) as i64;
        let runtime = self.runtime.load(Ordering::Acquire);
        SharedAccount {
            quota: new,
            period: self.period,
            origin: self.origin,
            early_drop_percent: self.early_drop_percent,
            epoch: AtomicU64::new(epoch),
            runtime: AtomicI64::new(runtime.saturating_add(new - self.quota).min(new)),
        }
    }

    /// The quota per period.
    pub fn quota(&self) -> Duration {
        Duration::from_nanos(self.quota as u64)
    }

    /// Applies Algorithm 1 for every boundary up to `now` that no worker applied yet; returns
    /// the current period's number. Only the caller whose compare-and-swap moves the period
    /// refills, so each boundary is applied once.
    fn roll(&self, now: Instant) -> u64 {
        let current = now.as_nanos().saturating_sub(self.origin) / self.period;
        let mut seen = self.epoch.load(Ordering::Acquire);
        while current > seen {
            match self.epoch.compare_exchange_weak(
                seen,
                current,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.refill(current - seen);
                    return current;
                }
                Err(s) => seen = s,
            }
        }
        seen
    }

    /// Algorithm 1 for `periods` consecutive boundaries.
    fn refill(&self, periods: u64) {
        let quota = self.quota;
        let add = quota.saturating_mul(periods.min(i64::MAX as u64) as i64);
        let _ = self
            .runtime
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                // Lines 5-7: a positive leftover is not carried. Line 8, once per boundary:
                // from runtime <= 0, k refills give min(runtime + k * quota, quota).
                Some(r.min(0).saturating_add(add).min(quota))
            });
    }

    /// When the period after `now`'s starts (a throttled tenant's next refill).
    pub fn next_boundary(&self, now: Instant) -> Instant {
        let current = now.as_nanos().saturating_sub(self.origin) / self.period;
        Instant::from_nanos(self.origin + (current + 1) * self.period)
    }

    /// Time the tenant can still be given this period, not counting workers' slices:
    /// positive runtime.
    pub fn available(&self, now: Instant) -> u64 {
        self.roll(now);
        self.runtime.load(Ordering::Acquire).max(0) as u64
    }

    /// Iron's `runtime` at `now`: the time left this period not counting workers' slices,
    /// negative while in debt.
    fn runtime(&self, now: Instant) -> i64 {
        self.roll(now);
        self.runtime.load(Ordering::Acquire)
    }

    /// Time owed beyond this period's quota and not paid yet (0 if none).
    pub fn debt(&self, now: Instant) -> u64 {
        self.roll(now);
        (-self.runtime.load(Ordering::Acquire)).max(0) as u64
    }

    /// A slice of up to `max` for a worker (Algorithm 2 lines 19-22): from positive
    /// `runtime`; 0 when it has none.
    fn take(&self, max: u64) -> u64 {
        let want = max.min(i64::MAX as u64) as i64;
        match self
            .runtime
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r > 0).then(|| r - r.min(want))
            }) {
            Ok(r) => r.min(want) as u64,
            Err(_) => 0,
        }
    }

    /// Takes `ns` from runtime whatever is left: a debt (Algorithm 2 lines 6-8).
    fn force(&self, ns: u64) {
        self.runtime
            .fetch_sub(ns.min(i64::MAX as u64) as i64, Ordering::AcqRel);
    }
}

/// Counters of one worker's slice of a tenant's account.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceStats {
    /// ns this worker charged.
    pub charged_ns: u64,
    /// Packets this worker admitted, dropped early, dropped throttled.
    pub admitted: u64,
    pub early_drops: u64,
    pub throttle_drops: u64,
}

/// One worker's `rt_remain` of a [`SharedAccount`] (see the module doc).
#[derive(Clone, Debug)]
pub struct Slice {
    local: u64,
    /// The period `local` was taken in.
    epoch: u64,
    chunk: u64,
    /// Error-diffusion accumulator of the early-drop ramp, this worker's.
    early_drop_acc: u64,
    stats: SliceStats,
}

impl Slice {
    /// An empty slice that takes at least `chunk` ns from the account at a time.
    pub fn new(chunk: u64) -> Slice {
        Slice {
            local: 0,
            epoch: 0,
            chunk: chunk.max(1),
            early_drop_acc: 0,
            stats: SliceStats::default(),
        }
    }

    /// This worker's counters.
    pub fn stats(&self) -> SliceStats {
        self.stats
    }

    /// Takes `other`'s counters over (a worker joins new accounts after a live change).
    pub fn keep_stats(&mut self, other: &Slice) {
        self.stats = other.stats;
    }

    /// What the slice holds at `now` (nothing left from an earlier period).
    fn held(&mut self, now: Instant, account: &SharedAccount) -> u64 {
        let epoch = account.roll(now);
        if epoch != self.epoch {
            // Lines 5-7: time unused in an earlier period is not carried.
            self.epoch = epoch;
            self.local = 0;
            self.early_drop_acc = 0;
        }
        self.local
    }

    /// Settles `ns` of work already done (Algorithm 2): from the slice, then a new slice of
    /// at least a chunk, then as debt on the account.
    pub fn charge(&mut self, now: Instant, account: &SharedAccount, ns: u64) {
        self.stats.charged_ns = self.stats.charged_ns.saturating_add(ns);
        let held = self.held(now, account);
        if ns <= held {
            self.local -= ns;
            return;
        }
        let short = ns - held;
        let taken = account.take(short.max(self.chunk));
        if taken >= short {
            self.local = taken - short;
        } else {
            self.local = 0;
            account.force(short - taken);
        }
    }

    /// Whether the tenant is throttled: neither this slice nor the account has time left
    /// this period (Algorithm 2 hands out nothing), a debt run up since this slice was taken
    /// counted against what it holds ([`Slice::left`]).
    pub fn exhausted(&self, now: Instant, account: &SharedAccount) -> bool {
        let held = if account.roll(now) == self.epoch {
            self.local
        } else {
            0
        };
        Self::left(held, now, account) == 0
    }

    /// The tenant's time left as one worker sees it: what its slice holds and the account's
    /// positive runtime, less the account's debt. A debt means the tenant is over its quota
    /// this period, run up by work another holder charged (another worker, or the
    /// coordinator charging the ports' softirq time) after this slice was taken: without
    /// the debt counted, a worker whose slice the kernel fast path left unspent saw the
    /// tenant within its allocation for the whole period, and let its flood through.
    fn left(held: u64, now: Instant, account: &SharedAccount) -> u64 {
        // One read of `runtime` (this is on every packet's admission): its positive part is
        // time available, its negative part the debt.
        (held.min(i64::MAX as u64) as i64)
            .saturating_add(account.runtime(now))
            .max(0) as u64
    }

    /// Decides before any work whether one of the tenant's packets may be processed: dropped
    /// when throttled, and with an early-drop threshold T a growing fraction dropped once less
    /// than T% of the quota is left (this slice and the account's), from 0 at T% left to all
    /// at nothing left, by deterministic error diffusion (no randomness).
    pub fn admit(&mut self, now: Instant, account: &SharedAccount) -> Admission {
        let held = self.held(now, account);
        let left = Self::left(held, now, account);
        if left == 0 {
            self.stats.throttle_drops += 1;
            return Admission::Throttled;
        }
        if let Some(percent) = account.early_drop_percent {
            let threshold = (account.quota as u64).saturating_mul(percent as u64) / 100;
            if left < threshold {
                self.early_drop_acc += threshold - left;
                if self.early_drop_acc >= threshold {
                    self.early_drop_acc -= threshold;
                    self.stats.early_drops += 1;
                    return Admission::EarlyDrop;
                }
            }
        }
        self.stats.admitted += 1;
        Admission::Admit
    }

    /// Gives what the slice holds back to the account (the worker stops or goes idle), so
    /// other workers can use it this period.
    pub fn release(&mut self, now: Instant, account: &SharedAccount) {
        if self.held(now, account) > 0 {
            account
                .runtime
                .fetch_add(self.local.min(i64::MAX as u64) as i64, Ordering::AcqRel);
            self.local = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD_NS: u64 = 10_000_000;

    fn config() -> IronConfig {
        IronConfig {
            period: Duration::from_nanos(PERIOD_NS),
            early_drop_percent: None,
        }
    }

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    fn account(quota_us: u64) -> SharedAccount {
        SharedAccount::new(Duration::from_micros(quota_us), config(), Instant::ZERO)
    }

    /// Two workers busy for one tenant, each doing 10 us of work per 10 us step while its
    /// slice or the account has time: what they charge together per period is the one quota
    /// (within a chunk per worker below and one step's work per worker above). An account per
    /// worker would let each charge the quota: 2x.
    #[test]
    fn two_workers_charging_one_tenant_get_one_quota_per_period() {
        let quota = 5_000_000u64;
        let chunk = 100_000;
        let shared = account(quota / 1_000);
        let mut slices = [Slice::new(chunk), Slice::new(chunk)];
        let mut per_period = [0u64; 10];
        for step in 0..10 * PERIOD_NS / 10_000 {
            let now = Instant::from_nanos(step * 10_000);
            for s in slices.iter_mut() {
                if !s.exhausted(now, &shared) {
                    s.charge(now, &shared, 10_000);
                    per_period[(now.as_nanos() / PERIOD_NS) as usize] += 10_000;
                }
            }
        }
        for (p, &ns) in per_period.iter().enumerate() {
            assert!(
                ns >= quota - 2 * chunk && ns <= quota + 2 * 10_000,
                "period {p}: {ns} ns charged for a {quota} ns quota"
            );
        }
        let total: u64 = slices.iter().map(|s| s.stats().charged_ns).sum();
        assert_eq!(total, per_period.iter().sum::<u64>());
    }

    /// A worker holding a slice sees the tenant throttled once work charged elsewhere (the
    /// coordinator's softirq charges) puts the account in debt beyond what the slice holds.
    #[test]
    fn a_debt_run_up_elsewhere_throttles_a_slice_that_still_holds_time() {
        let shared = account(1_000);
        let (mut worker, mut coordinator) = (Slice::new(100_000), Slice::new(100_000));
        let now = at_us(10);
        worker.charge(now, &shared, 1_000);
        assert!(
            !worker.exhausted(now, &shared),
            "99 us held, 900 us in the account"
        );
        // 950 us of softirq work charged through the coordinator's slice: 50 us of debt.
        coordinator.charge(now, &shared, 950_000);
        assert_eq!(shared.debt(now), 50_000);
        assert!(
            !worker.exhausted(now, &shared),
            "49 us of the worker's 99 left"
        );
        assert_eq!(worker.admit(now, &shared), Admission::Admit);
        coordinator.charge(now, &shared, 49_000);
        assert!(
            worker.exhausted(now, &shared),
            "the debt covers what the slice holds"
        );
        assert_eq!(worker.admit(now, &shared), Admission::Throttled);
        // The next period's quota pays the debt: time again.
        assert!(!worker.exhausted(at_us(10_010), &shared));
    }

    /// Algorithm 1: a debt carries into the next periods, unused runtime does not.
    #[test]
    fn debt_carries_and_unused_time_does_not() {
        let shared = account(5_000);
        let mut slice = Slice::new(100_000);
        // 12 ms of work in a 5 ms period: 7 ms of debt.
        slice.charge(at_us(100), &shared, 12_000_000);
        assert!(slice.exhausted(at_us(200), &shared));
        assert_eq!(shared.debt(at_us(200)), 7_000_000);
        // Period 1: -7 + 5 = -2 ms, still throttled; period 2: 3 ms.
        assert!(slice.exhausted(at_us(10_000), &shared));
        assert_eq!(shared.debt(at_us(10_000)), 2_000_000);
        assert_eq!(shared.available(at_us(20_000)), 3_000_000);
        // Period 3: 3 ms unused are not carried: the quota, not 8 ms.
        assert_eq!(shared.available(at_us(30_000)), 5_000_000);
        // Period 3: 8 ms of work, 3 ms of debt: period 4 starts with 2 ms.
        slice.charge(at_us(30_100), &shared, 8_000_000);
        assert!(slice.exhausted(at_us(30_200), &shared));
        assert_eq!(shared.available(at_us(40_000)), 2_000_000);
    }

    /// A slice's leftover belongs to its period: after the boundary the account holds the
    /// quota and the slice nothing; a slice released gives its time back to the others.
    #[test]
    fn slices_do_not_cross_a_boundary_and_released_time_goes_back() {
        let shared = account(1_000);
        let (mut a, mut b) = (Slice::new(400_000), Slice::new(400_000));
        a.charge(at_us(1), &shared, 100_000);
        assert_eq!(shared.available(at_us(1)), 600_000, "a took a 400 us slice");
        a.release(at_us(2), &shared);
        assert_eq!(shared.available(at_us(2)), 900_000);
        a.charge(at_us(3), &shared, 100_000);
        b.charge(at_us(3), &shared, 100_000);
        assert_eq!(shared.available(at_us(3)), 100_000, "each took 400 us");
        assert!(!a.exhausted(at_us(9_999), &shared), "a holds 300 us");
        assert_eq!(shared.available(at_us(10_000)), 1_000_000);
        a.release(at_us(10_001), &shared);
        assert_eq!(
            shared.available(at_us(10_001)),
            1_000_000,
            "nothing from period 0"
        );
    }

    /// A new quota mid-period moves this period's runtime by the difference and keeps the
    /// debt; later periods refill to it.
    #[test]
    fn a_new_quota_keeps_the_debt() {
        let shared = account(5_000);
        Slice::new(1).charge(at_us(1), &shared, 8_000_000);
        let bigger = shared.with_quota(at_us(2), Duration::from_millis(6));
        assert_eq!(bigger.debt(at_us(3)), 2_000_000);
        assert_eq!(bigger.available(at_us(10_000)), 4_000_000);
        assert_eq!(bigger.available(at_us(20_000)), 6_000_000);
    }

    /// The early-drop ramp: with T = 10% and 5% of the quota left, half the packets are
    /// dropped early; with nothing left, all are throttled.
    #[test]
    fn early_drops_grow_as_the_quota_runs_out() {
        let cfg = IronConfig {
            early_drop_percent: Some(10),
            ..config()
        };
        let shared = SharedAccount::new(Duration::from_millis(1), cfg, Instant::ZERO);
        let mut slice = Slice::new(1);
        slice.charge(at_us(1), &shared, 950_000);
        let admitted = (0..100)
            .filter(|_| slice.admit(at_us(2), &shared) == Admission::Admit)
            .count();
        assert_eq!(admitted, 50);
        slice.charge(at_us(3), &shared, 50_000);
        assert_eq!(slice.admit(at_us(4), &shared), Admission::Throttled);
        let s = slice.stats();
        assert_eq!((s.admitted, s.early_drops, s.throttle_drops), (50, 50, 1));
    }
}
