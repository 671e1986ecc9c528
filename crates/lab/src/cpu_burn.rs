//! A CPU-bound tenant (Iron 2.3's victim): the `cpu_burn` workload does fixed units of pure
//! computation, each calibrated once per process to 1 ms of a thread's own CPU time, back to back
//! from its start to its stop time, and records each unit's wall-clock time in the latency
//! histogram. Alone, a unit takes about 1 ms; when neighbours (or the network processing
//! done for them) take the CPU it needs, units stretch and fewer get done. Iron's penalty
//! factor, the victim's work time with neighbours over its work time alone, is the inverse
//! of its work rate ratio: the workload reports its units as throughput, 1 Mb/s for 1,000
//! units (one second of CPU) per second, so `victim_throughput_ratio >= 0.953` is a penalty
//! factor of at most 1.05.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

/// CPU time one unit of work takes, calibrated.
const UNIT: Duration = Duration::from_millis(1);

/// Bytes a unit counts as in the throughput column: 1 Mb/s = 1,000 units/s.
pub const BYTES_PER_UNIT: u64 = 125;

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    Duration::from_nanos(picnic_switch::runner::thread_cpu_ns())
}

/// `rounds` rounds of integer mixing: no memory traffic, no system call.
fn work(rounds: u64) -> u64 {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for i in 0..rounds {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd).wrapping_add(i);
    }
    x
}

/// Rounds of [`work`] that take [`UNIT`] of this thread's CPU time, measured once per
/// process (the fastest of three 5 ms trials, on the thread CPU clock so a busy machine does
/// not change the figure): every mode and repetition of a run does the same work per unit,
/// so their work rates compare exactly.
pub fn rounds_per_unit() -> u64 {
    static ROUNDS: OnceLock<u64> = OnceLock::new();
    *ROUNDS.get_or_init(|| {
        let mut rounds = 10_000u64;
        let trial = UNIT * 5;
        loop {
            let start = thread_cpu();
            black_box(work(rounds));
            if thread_cpu() - start >= trial {
                break;
            }
            rounds *= 2;
        }
        let fastest = (0..3)
            .map(|_| {
                let start = thread_cpu();
                black_box(work(rounds));
                thread_cpu() - start
            })
            .min()
            .expect("three trials");
        (rounds as u128 * UNIT.as_nanos() / fastest.as_nanos().max(1)) as u64
    })
}

/// Runs units of `rounds` from `start` until `stop`; returns the units done and their
/// wall-clock times (ns).
pub fn burn(rounds: u64, start: Instant, stop: Instant, hist: &mut Histogram<u64>) -> Result<u64> {
    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
    }
    let mut units = 0;
    while Instant::now() < stop {
        let t = Instant::now();
        black_box(work(rounds));
        hist.record((t.elapsed().as_nanos() as u64).max(1))?;
        units += 1;
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibrated_unit_takes_about_a_millisecond_of_cpu() {
        let rounds = rounds_per_unit();
        let start = thread_cpu();
        black_box(work(rounds));
        let took = (thread_cpu() - start).as_secs_f64() * 1e3;
        // The same thread, the same loop: within a factor of 2 even on a busy CI machine.
        assert!((0.5..2.0).contains(&took), "{took} ms");
    }
}
