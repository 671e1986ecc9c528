//! The ingress engine's measured processing capacity (PicNIC 2: the stack's capacity varies,
//! so it is measured, not configured), which the EyeQ CPU receiver allocates.

use picnic_core::eyeq::Receiver;
use picnic_core::time::NANOS_PER_SEC;
use picnic_core::{Duration, Instant};

use crate::directory::VmIdx;

/// Estimates the processing the ingress engine really gets per second: the CPU it runs on is
/// shared and the per-frame cost varies, so a nominal "one core" overstates it (PicNIC 2:
/// "capacity is variable, so measure it"). Over each 10 ms, if most polls ended with frames
/// still queued the engine was saturated, and what it processed is its capacity; otherwise
/// the estimate recovers by 1/8 per period towards the nominal capacity. The EyeQ CPU
/// receiver allocates this estimate, so senders are pushed back before the uplink ring
/// overflows.
#[derive(Debug)]
pub(super) struct CpuCapacity {
    nominal: u64,
    estimate: u64,
    period_start: Instant,
    cost: u64,
    polls: u32,
    backlogged_polls: u32,
}

const CAPACITY_PERIOD: Duration = Duration::from_millis(10);

impl CpuCapacity {
    pub(super) fn new(nominal: u64, now: Instant) -> CpuCapacity {
        CpuCapacity {
            nominal,
            estimate: nominal,
            period_start: now,
            cost: 0,
            polls: 0,
            backlogged_polls: 0,
        }
    }

    pub(super) fn on_poll(
        &mut self,
        now: Instant,
        cost: u64,
        backlogged: bool,
        receiver: Option<&mut Receiver<VmIdx>>,
    ) {
        self.cost += cost;
        self.polls += 1;
        self.backlogged_polls += u32::from(backlogged);
        let elapsed = now - self.period_start;
        if elapsed < CAPACITY_PERIOD {
            return;
        }
        let processed =
            (self.cost as u128 * NANOS_PER_SEC as u128 / elapsed.as_nanos().max(1) as u128) as u64;
        self.estimate = if self.backlogged_polls * 2 > self.polls {
            processed.clamp(self.nominal / 100, self.nominal)
        } else {
            (self.estimate + self.estimate / 8).min(self.nominal)
        };
        if let Some(r) = receiver {
            let _ = r.set_capacity(self.estimate.max(1));
        }
        *self = CpuCapacity {
            estimate: self.estimate,
            ..CpuCapacity::new(self.nominal, now)
        };
    }
}
