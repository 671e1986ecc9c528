//! How a loop waits when idle (Rizzo et al.): the adaptive wait of each receive ring and the
//! policy that spins or blocks on it. The single loop and every worker run it.

use picnic_core::notify::{AdaptiveWait, Params, Role, WaitConfig, WaitDecision};
use picnic_core::{Duration, Instant};

/// What a loop does between passes (Rizzo et al. 3.2.1): after work, each ring's adaptive
/// wait learns the loop's own service time; when idle, it spins while some ring's producer is
/// expected to deliver its next frame sooner than a notification and wake-up would cost, at
/// most `spin_us`, and otherwise (or once a spin has run out) the caller blocks until a frame
/// arrives or the engines' next deadline. The single loop and every worker run it.
#[derive(Default)]
pub(crate) struct IdlePolicy {
    spin_until: Option<Instant>,
}

impl IdlePolicy {
    /// A pass handled `busy` frames in `took`.
    pub(crate) fn worked(
        &mut self,
        waits: &mut [(AdaptiveWait, u64)],
        busy: usize,
        took: Duration,
    ) {
        for (wait, _) in waits.iter_mut() {
            wait.record_own_work(busy as u32, took);
        }
        self.spin_until = None;
    }

    /// A pass found nothing at `now`: whether to poll again (spinning) rather than block.
    pub(crate) fn spin(&mut self, now: Instant, waits: &mut [(AdaptiveWait, u64)]) -> bool {
        match self.spin_until {
            Some(t) if now < t => {
                std::hint::spin_loop();
                true
            }
            Some(_) => {
                self.spin_until = None;
                false
            }
            None => {
                self.spin_until = waits
                    .iter_mut()
                    .filter_map(|(w, _)| match w.decide(now, RING_SLOTS) {
                        WaitDecision::Spin { until } => Some(until),
                        WaitDecision::SlowDown { .. } | WaitDecision::Block => None,
                    })
                    .max();
                self.spin_until.is_some()
            }
        }
    }
}

/// Receive ring slots, the queue length L of the Rizzo model.
pub(crate) const RING_SLOTS: u32 = 2048;

/// The adaptive wait of one receive ring: the switch is its consumer. N and S are the
/// notification and wake-up costs measured on the lab machines (`picnic model measure`:
/// N 1.6-7.3 us, S 2.8-3.7 us), so the loop spins (at most `max_spin`) while the producer's
/// frames come less than N + S = 6.5 us apart. It never slows down with a timed sleep: a
/// 50 us sleep wakes after 105-162 us here (DESIGN.md 7), while blocking on the ring wakes
/// on the frame. W_P and W_C start as guesses and are estimated as frames flow.
pub(crate) fn ring_wait(max_spin: Duration) -> AdaptiveWait {
    AdaptiveWait::new(WaitConfig {
        role: Role::Consumer,
        params: Params::measured_ring(RING_SLOTS),
        max_spin,
        max_sleep: Duration::ZERO,
    })
    .expect("valid model parameters")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's own ring wait (not a copy of its parameters): spins for a producer whose
    /// frames come 2 us apart, blocks for one 1 ms apart.
    #[test]
    fn ring_wait_spins_for_a_2us_producer_and_blocks_for_a_1ms_one() {
        for (period, spin) in [(2_000, true), (1_000_000, false)] {
            let mut wait = ring_wait(Duration::from_micros(50));
            for i in 0..=64u64 {
                wait.observe(Instant::from_nanos(i * period), i);
            }
            let last = Instant::from_nanos(64 * period);
            let expected = if spin {
                WaitDecision::Spin {
                    until: last + Duration::from_micros(50),
                }
            } else {
                WaitDecision::Block
            };
            assert_eq!(
                wait.decide(last, RING_SLOTS),
                expected,
                "period {period} ns"
            );
        }
    }
}
