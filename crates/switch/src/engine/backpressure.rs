//! Backpressure from the receiver's budgets to the senders (PicNIC 1, design principle (ii):
//! "packets likely to be dropped at the receiver due to insufficient resources should not be
//! admitted at the source").
//!
//! A frame for a local VM whose tenant has spent its CPU budget here (Iron 3.2) or that is over
//! the VM's packet-rate limit is dropped before any work; but it has crossed the access link
//! already, and its sender keeps sending more at the rate EyeQ advertised, which knows only
//! the link and the engine's CPU. So, per local VM and Iron period, the engine counts the wire
//! bytes it admitted and the frames it refused. A VM that was refused frames in a period has
//! the rate advertised to its senders capped at what it was admitted in that period: what
//! its budget sustained. Each period without refusal doubles the cap, until it exceeds the
//! link and is lifted. The senders' limiters then drop the excess at the source, where the
//! sending tenant pays for it, and the receiver's access link carries only what will be
//! delivered.

use picnic_core::time::NANOS_PER_SEC;
use picnic_core::{Duration, Instant};

use crate::directory::VmIdx;

#[derive(Debug)]
pub(super) struct Backpressure {
    period: Duration,
    started: Instant,
    /// Lowest cap, bytes/s (EyeQ's floor: a capped sender still gets feedback to ramp back).
    floor: u64,
    /// Highest cap kept, bytes/s (the access link): above it the cap is lifted.
    ceiling: u64,
    /// Per VM, this period: wire bytes admitted, frames refused.
    admitted: Vec<u64>,
    refused: Vec<u32>,
    /// Per VM: the cap on its advertised rate, bytes/s.
    cap: Vec<Option<u64>>,
}

impl Backpressure {
    pub(super) fn new(period: Duration, floor: u64, ceiling: u64, now: Instant) -> Backpressure {
        Backpressure {
            period,
            started: now,
            floor,
            ceiling: ceiling.max(floor),
            admitted: Vec::new(),
            refused: Vec::new(),
            cap: Vec::new(),
        }
    }

    /// Makes room for VM `vm`, with no cap (a new or reused slot).
    pub(super) fn reset_vm(&mut self, vm: VmIdx) {
        if self.cap.len() <= vm {
            self.admitted.resize(vm + 1, 0);
            self.refused.resize(vm + 1, 0);
            self.cap.resize(vm + 1, None);
        }
        self.admitted[vm] = 0;
        self.refused[vm] = 0;
        self.cap[vm] = None;
    }

    /// Closes the period if it is over: a VM refused frames in it is capped at its admitted
    /// rate; a capped VM that was not has its cap doubled.
    pub(super) fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_since(self.started);
        if elapsed < self.period {
            return;
        }
        let elapsed_ns = elapsed.as_nanos().max(1) as u128;
        for vm in 0..self.cap.len() {
            let rate = (self.admitted[vm] as u128 * NANOS_PER_SEC as u128 / elapsed_ns) as u64;
            self.cap[vm] = if self.refused[vm] > 0 {
                Some(rate.clamp(self.floor, self.ceiling))
            } else {
                self.cap[vm]
                    .map(|c| c.saturating_mul(2))
                    .filter(|&c| c <= self.ceiling)
            };
            self.admitted[vm] = 0;
            self.refused[vm] = 0;
        }
        self.started = now;
    }

    pub(super) fn admitted(&mut self, vm: VmIdx, wire_bytes: u64) {
        self.admitted[vm] += wire_bytes;
    }

    pub(super) fn refused(&mut self, vm: VmIdx) {
        self.refused[vm] += 1;
    }

    /// The cap on `vm`'s advertised rate, bytes/s, if its budget limited it lately.
    pub(super) fn cap(&self, vm: VmIdx) -> Option<u64> {
        self.cap.get(vm).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_millis(10);

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_refused_vm_is_capped_at_its_admitted_rate_and_the_cap_doubles_away() {
        // Floor 125 kB/s, ceiling 6.25 MB/s (a 50 Mb/s link), 10 ms periods.
        let mut bp = Backpressure::new(PERIOD, 125_000, 6_250_000, at(0));
        bp.reset_vm(0);
        bp.reset_vm(1);
        // VM 0 is admitted 20 kB and refused frames; VM 1 is admitted 40 kB, refused nothing.
        bp.admitted(0, 20_000);
        bp.refused(0);
        bp.admitted(1, 40_000);
        bp.roll(at(5));
        assert_eq!(bp.cap(0), None, "the period is not over");
        bp.roll(at(10));
        assert_eq!(bp.cap(0), Some(2_000_000), "20 kB in 10 ms");
        assert_eq!(bp.cap(1), None, "never refused, never capped");
        // Periods without refusal: 2, 4 MB/s, then 8 MB/s is over the link: lifted.
        bp.roll(at(20));
        assert_eq!(bp.cap(0), Some(4_000_000));
        bp.roll(at(30));
        assert_eq!(bp.cap(0), None);
    }

    #[test]
    fn the_cap_keeps_to_the_floor_and_uses_the_time_that_really_passed() {
        let mut bp = Backpressure::new(PERIOD, 125_000, 6_250_000, at(0));
        bp.reset_vm(0);
        bp.refused(0);
        bp.roll(at(10));
        assert_eq!(bp.cap(0), Some(125_000), "nothing admitted: the floor");
        // 100 kB over a 40 ms period (no frame arrived to roll it sooner): 2.5 MB/s.
        bp.admitted(0, 100_000);
        bp.refused(0);
        bp.roll(at(50));
        assert_eq!(bp.cap(0), Some(2_500_000));
        // A removed VM's slot is reused uncapped.
        bp.reset_vm(0);
        assert_eq!(bp.cap(0), None);
    }
}
