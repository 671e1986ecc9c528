//! Send schedules: sleeping until a send is due, and the exact due times at a fixed rate.

use super::Window;
use std::time::{Duration, Instant};

/// Sleeps until `t`. Timers here wake 0.1 to 1 ms late (DESIGN.md 7); paced senders send
/// everything due when they wake, so their rate holds. They do not spin: a generator
/// spinning for precision takes the cores the switches under test need (on 2 cores a
/// spinning line-rate flood raised the victim's p99 in picnic mode 4x).
pub(super) fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The send time of packet `n` at `rate` per second from `start`, exact in integers.
pub(super) fn nth_send_time(start: Instant, n: u64, rate: u64) -> Instant {
    start + Duration::from_nanos((n as u128 * 1_000_000_000 / rate as u128) as u64)
}

/// How many requests a probe at `rate` per second can send in `w`'s sending period.
pub(super) fn request_count(rate: u64, w: &Window) -> usize {
    ((w.stop - w.start).as_nanos() * rate as u128 / 1_000_000_000 + 1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn send_times_are_exact() {
        let t = Instant::now();
        assert_eq!(nth_send_time(t, 3, 1000) - t, Duration::from_millis(3));
        assert_eq!(
            nth_send_time(t, 1, 3) - t,
            Duration::from_nanos(333_333_333)
        );
    }

    #[test]
    fn request_count_covers_the_sending_period() {
        let t0 = Instant::now();
        let w = Window {
            t0,
            start: t0 + Duration::from_millis(100),
            stop: t0 + Duration::from_millis(1100),
            bins: 200,
        };
        assert_eq!(request_count(1000, &w), 1001);
        assert_eq!(request_count(3, &w), 4);
    }
}
