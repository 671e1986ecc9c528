//! Read-side CPU fairness (PicNIC 2.2; Iron 3.2's "do not poll a throttled container"):
//! the CPU-fair WFQs decide whose queued frames are processed, but reading a port, and
//! dropping what its tenant's full queues cannot take, is spent before any scheduler. While
//! the loop is saturated (its thread was busy for most of the last period), a tenant that
//! has used its weighted share of the current period's CPU is not read until the next one,
//! so a flood's excess stays in its own ring (the kernel drops it at the sender's expense).
//! Shares are weighted like the schedulers: by the sum of the tenant's local guarantees,
//! among the tenants that used the switch in this period or the last.

use picnic_core::{Duration, Instant};

/// Length of a fairness period.
const PERIOD: Duration = Duration::from_millis(10);
/// Busy fraction of a period, in thousandths, above which the loop counts as saturated.
const SATURATED_PERMILLE: u64 = 900;

#[derive(Debug)]
pub(super) struct FairShare {
    /// Per tenant: sum of its local VMs' guarantees (0 without local VMs).
    weights: Vec<u64>,
    /// Per tenant: CPU charged this period, ns.
    used: Vec<u64>,
    /// Per tenant: whether it used the switch in the last period.
    active_before: Vec<bool>,
    /// Loop CPU this period, ns.
    busy: u64,
    period_start: Instant,
    /// Whether the last period was saturated.
    saturated: bool,
}

impl FairShare {
    pub(super) fn new(weights: Vec<u64>, now: Instant) -> FairShare {
        let n = weights.len();
        FairShare {
            weights,
            used: vec![0; n],
            active_before: vec![false; n],
            busy: 0,
            period_start: now,
            saturated: false,
        }
    }

    /// Each tenant's new weight (a guarantee changed, a VM or tenant came or went).
    pub(super) fn set_weights(&mut self, weights: Vec<u64>) {
        self.used.resize(weights.len(), 0);
        self.active_before.resize(weights.len(), false);
        self.weights = weights;
    }

    /// Starts a new period if the current one is over.
    pub(super) fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_since(self.period_start);
        if elapsed < PERIOD {
            return;
        }
        self.saturated = self.busy * 1000 >= elapsed.as_nanos() * SATURATED_PERMILLE;
        for (before, used) in self.active_before.iter_mut().zip(&mut self.used) {
            *before = *used > 0;
            *used = 0;
        }
        self.busy = 0;
        self.period_start = now;
    }

    /// Notes `ns` of loop CPU, of which `tenant`'s frames took `ns` (call once per charge).
    pub(super) fn busy(&mut self, ns: u64) {
        self.busy += ns;
    }

    pub(super) fn charge(&mut self, tenant: usize, ns: u64) {
        self.used[tenant] += ns;
    }

    /// Whether `tenant` has used its share of a saturated loop's current period.
    pub(super) fn over(&self, tenant: usize) -> bool {
        if !self.saturated || self.weights[tenant] == 0 {
            return false;
        }
        let active: u128 = (0..self.weights.len())
            .filter(|&t| self.used[t] > 0 || self.active_before[t])
            .map(|t| self.weights[t] as u128)
            .sum();
        let allowance = PERIOD.as_nanos() as u128 * self.weights[tenant] as u128 / active.max(1);
        self.used[tenant] as u128 > allowance
    }

    /// When a tenant held back becomes readable again.
    pub(super) fn poll_at(&self) -> Option<Instant> {
        (self.saturated && (0..self.weights.len()).any(|t| self.over(t)))
            .then(|| self.period_start + PERIOD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    #[test]
    fn only_a_saturated_loop_holds_a_tenant_back_and_only_past_its_weighted_share() {
        let mut s = FairShare::new(vec![1, 3, 0], Instant::ZERO);
        // A period at half load: nobody is held back whatever they use.
        s.busy(5_000_000);
        s.charge(0, 5_000_000);
        s.roll(at_us(10_000));
        s.charge(0, 9_000_000);
        assert!(!s.over(0));
        // A saturated period with both tenants active: shares 1/4 and 3/4 of 10 ms.
        s.busy(10_000_000);
        s.charge(1, 1_000);
        s.roll(at_us(20_000));
        s.charge(0, 2_500_000);
        assert!(!s.over(0), "exactly its 2.5 ms");
        s.charge(0, 1);
        assert!(s.over(0));
        assert_eq!(s.poll_at(), Some(at_us(30_000)));
        s.charge(1, 7_000_000);
        assert!(!s.over(1), "7 of its 7.5 ms");
        // A tenant without local VMs is never held back.
        s.charge(2, 50_000_000);
        assert!(!s.over(2));
        // The next period starts unsaturated if the loop was not busy enough.
        s.busy(1_000_000);
        s.roll(at_us(30_000));
        s.charge(0, 9_000_000);
        assert!(!s.over(0));
        assert_eq!(s.poll_at(), None);
    }
}
