//! Read-side fairness (PicNIC 2.2; Iron 3.2's "do not poll a throttled container"): the
//! WFQs decide whose queued frames are processed, but reading a port, and dropping what its
//! tenant's full queues cannot take, is spent before any scheduler. While the loop is
//! saturated (it found work on its passes for most of the last period, whether its thread
//! ran or waited for a CPU), a tenant that has used its
//! weighted share of the current period is not read until the next one, so a flood's excess
//! stays in its own ring (the kernel drops it at the sender's expense). The share is of the
//! resource the schedulers share: measured CPU with `isolation.cpu_fair` (PicNIC's CPU-fair
//! queuing), bytes otherwise (byte-fair queuing at every stage, the baseline it is compared
//! with). Shares are weighted like the schedulers: by the sum of the tenant's local
//! guarantees, among the tenants that used the switch in this period or the last. Holding
//! back is work-conserving: nobody is held while every active tenant is past its share, nor
//! after a pass of the loop found nothing to do (until it reads a frame again). A
//! tenant whose VMs have packet-rate guarantees (`min_pps`) is not held while it has read
//! fewer packets this period than they add up to.

use picnic_core::{Duration, Instant};

/// Length of a fairness period.
const PERIOD: Duration = Duration::from_millis(10);
/// Idle fraction of a period, in thousandths, up to which the loop counts as saturated.
const SATURATED_IDLE_PERMILLE: u64 = 100;

/// What a tenant's share of a period is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShareUnit {
    /// Measured CPU ns.
    CpuNs,
    /// Frame bytes.
    Bytes,
}

#[derive(Debug)]
pub(super) struct FairShare {
    unit: ShareUnit,
    /// Per tenant: sum of its local VMs' guarantees (0 without local VMs).
    weights: Vec<u64>,
    /// Per tenant: units charged this period.
    used: Vec<u64>,
    /// Per tenant: frames read from its VMs' ports this period.
    packets: Vec<u64>,
    /// Per tenant: packets a period its local VMs' `min_pps` guarantee.
    guaranteed: Vec<u64>,
    /// Per tenant: whether it used the switch in the last period.
    active_before: Vec<bool>,
    /// Units charged to all tenants in the last period.
    used_before: u64,
    /// Time the loop found nothing to do this period, ns.
    idle: u64,
    period_start: Instant,
    /// Whether the last period was saturated.
    saturated: bool,
    /// Whether the loop's last pass found nothing to do: nobody is held until it reads a
    /// frame again.
    released: bool,
}

impl FairShare {
    pub(super) fn new(unit: ShareUnit, weights: Vec<u64>, now: Instant) -> FairShare {
        let n = weights.len();
        FairShare {
            unit,
            weights,
            used: vec![0; n],
            packets: vec![0; n],
            guaranteed: vec![0; n],
            active_before: vec![false; n],
            used_before: 0,
            idle: 0,
            period_start: now,
            saturated: false,
            released: false,
        }
    }

    /// Each tenant's new weight (a guarantee changed, a VM or tenant came or went).
    pub(super) fn set_weights(&mut self, weights: Vec<u64>) {
        self.used.resize(weights.len(), 0);
        self.packets.resize(weights.len(), 0);
        self.active_before.resize(weights.len(), false);
        self.weights = weights;
    }

    /// Each tenant's packet-rate guarantee, packets/s (the sum of its local VMs' `min_pps`).
    pub(super) fn set_guarantees(&mut self, pps: &[u64]) {
        self.guaranteed = pps
            .iter()
            .map(|&p| (p as u128 * PERIOD.as_nanos() as u128 / 1_000_000_000) as u64)
            .collect();
    }

    /// Starts a new period if the current one is over.
    pub(super) fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_since(self.period_start);
        if elapsed < PERIOD {
            return;
        }
        self.saturated = self.idle * 1000 <= elapsed.as_nanos() * SATURATED_IDLE_PERMILLE;
        self.used_before = self.used.iter().sum();
        for (before, used) in self.active_before.iter_mut().zip(&mut self.used) {
            *before = *used > 0;
            *used = 0;
        }
        self.packets.iter_mut().for_each(|p| *p = 0);
        self.idle = 0;
        self.period_start = now;
    }

    /// Notes `ns` the loop spent without work (spinning or blocked). A loop idle for more
    /// than the saturation bound is not saturated for the rest of the period either: a
    /// tenant held back while the others lack work would leave the switch idle.
    pub(super) fn idle(&mut self, ns: u64) {
        self.idle += ns;
        if self.idle * 1000 > PERIOD.as_nanos() * SATURATED_IDLE_PERMILLE {
            self.saturated = false;
        }
    }

    /// Notes that a pass of the loop found nothing to do: the tenants with work are held
    /// back, and the ones with a share left have nothing ready. Holding would then leave the
    /// loop idle with frames in the held tenants' rings, so nobody is held until the loop
    /// reads a frame: a held tenant gets a batch whenever the others have nothing, and
    /// waits again as soon as they do.
    pub(super) fn found_nothing(&mut self) {
        self.released = true;
    }

    /// Notes a frame read from one of `tenant`'s VMs' ports.
    pub(super) fn read(&mut self, tenant: usize) {
        self.released = false;
        self.packets[tenant] += 1;
    }

    /// Charges `tenant` for frames of `bytes` that took `ns` of the loop's CPU.
    pub(super) fn charge(&mut self, tenant: usize, ns: u64, bytes: u64) {
        self.used[tenant] += match self.unit {
            ShareUnit::CpuNs => ns,
            ShareUnit::Bytes => bytes,
        };
    }

    /// Whether `tenant` has used its share of a saturated loop's current period while
    /// another active tenant has not.
    pub(super) fn over(&self, tenant: usize) -> bool {
        if !self.saturated
            || self.released
            || self.weights[tenant] == 0
            || self.packets[tenant] < self.guaranteed[tenant]
        {
            return false;
        }
        let active = |t: usize| self.used[t] > 0 || self.active_before[t];
        let active_weight: u128 = (0..self.weights.len())
            .filter(|&t| active(t))
            .map(|t| self.weights[t] as u128)
            .sum();
        // A saturated period's capacity is what the last one delivered: the loop's thread
        // does not get the whole period's CPU where others compete for it.
        let capacity = self.used_before as u128;
        let past_share = |t: usize| {
            self.used[t] as u128 > capacity * self.weights[t] as u128 / active_weight.max(1)
        };
        past_share(tenant)
            && (0..self.weights.len())
                .any(|t| t != tenant && self.weights[t] > 0 && active(t) && !past_share(t))
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
        let mut s = FairShare::new(ShareUnit::CpuNs, vec![1, 3, 0], Instant::ZERO);
        // A period with the loop idle for half of it: nobody is held back in the next.
        s.idle(5_000_000);
        s.charge(0, 5_000_000, 0);
        s.roll(at_us(10_000));
        s.charge(0, 7_000_000, 0);
        s.charge(1, 1_000_000, 0);
        assert!(!s.over(0));
        // That period was saturated and delivered 8 ms of CPU (the thread did not get all
        // of the 10): tenants 0 and 1 share the next 8 ms 1:3, tenant 2 has no local VM.
        s.roll(at_us(20_000));
        s.charge(0, 2_000_000, 0);
        assert!(!s.over(0), "exactly its 2 ms");
        s.charge(0, 1, 0);
        assert!(s.over(0));
        assert_eq!(s.poll_at(), Some(at_us(30_000)));
        s.charge(1, 5_000_000, 0);
        assert!(!s.over(1), "5 of its 6 ms");
        // A tenant without local VMs is never held back.
        s.charge(2, 50_000_000, 0);
        assert!(!s.over(2));
        // Idle time beyond the bound ends the saturation at once, not a period later.
        s.idle(1_000_001);
        assert!(!s.over(0));
        assert_eq!(s.poll_at(), None);
    }

    #[test]
    fn byte_shares_follow_the_last_periods_bytes_and_nobody_is_held_when_all_are_past_theirs() {
        let mut s = FairShare::new(ShareUnit::Bytes, vec![1, 1], Instant::ZERO);
        // A saturated period that moved 100 kB: each tenant's share of the next is 50 kB,
        // counted in bytes whatever CPU they took.
        s.idle(0);
        s.charge(0, 9_000_000, 60_000);
        s.charge(1, 1_000_000, 40_000);
        s.roll(at_us(10_000));
        s.charge(0, 9_000_000, 50_000);
        assert!(!s.over(0), "exactly its 50 kB, however much CPU");
        s.charge(0, 0, 1);
        assert!(s.over(0));
        // Work conservation: once the other tenant is past its share too, neither waits.
        s.charge(1, 0, 50_001);
        assert!(!s.over(0) && !s.over(1));
        assert_eq!(s.poll_at(), None);
    }

    #[test]
    fn a_pass_that_finds_nothing_releases_the_held_tenants_until_a_frame_is_read() {
        let mut s = FairShare::new(ShareUnit::CpuNs, vec![1, 1], Instant::ZERO);
        s.charge(0, 5_000_000, 0);
        s.charge(1, 5_000_000, 0);
        s.roll(at_us(10_000));
        // Tenant 0 is past its 5 ms while tenant 1 has used 1 ms and has nothing ready.
        s.charge(0, 5_000_001, 0);
        s.charge(1, 1_000_000, 0);
        assert!(s.over(0));
        s.found_nothing();
        assert!(!s.over(0), "held while the loop has nothing else to do");
        assert_eq!(s.poll_at(), None);
        // A frame read (tenant 0's batch, or tenant 1's again) ends the release.
        s.read(0);
        assert!(s.over(0));
        s.found_nothing();
        s.read(1);
        assert!(s.over(0));
    }

    #[test]
    fn a_tenant_under_its_packet_rate_guarantee_is_never_held_back() {
        let mut s = FairShare::new(ShareUnit::CpuNs, vec![1, 1], Instant::ZERO);
        // Tenant 1 is guaranteed 200 kpps: 2,000 packets a 10 ms period.
        s.set_guarantees(&[0, 200_000]);
        s.charge(0, 4_000_000, 0);
        s.charge(1, 4_000_000, 0);
        s.roll(at_us(10_000));
        // Past its 4 ms share of the CPU but 1,999 frames into its 2,000: read on.
        s.charge(1, 6_000_000, 0);
        (0..1_999).for_each(|_| s.read(1));
        assert!(!s.over(1));
        s.read(1);
        assert!(s.over(1), "guarantee met, share exceeded");
        // A new period starts the count again.
        s.roll(at_us(20_000));
        s.charge(1, 9_000_000, 0);
        assert!(!s.over(1));
    }
}
