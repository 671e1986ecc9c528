//! [`Rate`]: a data rate in bits per second, the one unit rates travel in between the
//! config, the scenario, the switch, the simulator, the lab and the bench. Files keep their
//! own units (`min_mbps`); they become a `Rate` where they are read, and mechanisms that
//! count bytes (token buckets, meters) ask for [`Rate::bytes_per_sec`].

use crate::time::{Duration, NANOS_PER_SEC};

/// A data rate, bits per second.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(u64);

impl Rate {
    /// No rate at all.
    pub const ZERO: Rate = Rate(0);

    /// `bps` bits per second.
    pub const fn from_bps(bps: u64) -> Rate {
        Rate(bps)
    }

    /// `kbps` kilobits (10^3 bits) per second, saturating.
    pub const fn from_kbps(kbps: u64) -> Rate {
        Rate(kbps.saturating_mul(1_000))
    }

    /// `mbps` megabits (10^6 bits) per second, saturating.
    pub const fn from_mbps(mbps: u64) -> Rate {
        Rate(mbps.saturating_mul(1_000_000))
    }

    /// `gbps` gigabits (10^9 bits) per second, saturating.
    pub const fn from_gbps(gbps: u64) -> Rate {
        Rate(gbps.saturating_mul(1_000_000_000))
    }

    /// A fractional number of megabits per second (negative or NaN: zero).
    pub fn from_mbps_f64(mbps: f64) -> Rate {
        Rate((mbps * 1e6).max(0.0) as u64)
    }

    /// `bytes` bytes per second, saturating.
    pub const fn from_bytes_per_sec(bytes: u64) -> Rate {
        Rate(bytes.saturating_mul(8))
    }

    /// The rate at which `bytes` bytes pass in `span` (zero over an empty span).
    pub fn of_bytes_in(bytes: u64, span: Duration) -> Rate {
        if span.as_nanos() == 0 {
            return Rate::ZERO;
        }
        let bps = u128::from(bytes) * 8 * u128::from(NANOS_PER_SEC) / u128::from(span.as_nanos());
        Rate(bps.min(u128::from(u64::MAX)) as u64)
    }

    /// Bits per second.
    pub const fn bps(self) -> u64 {
        self.0
    }

    /// Whole bytes per second (rounded down), the unit token buckets and meters count in.
    pub const fn bytes_per_sec(self) -> u64 {
        self.0 / 8
    }

    /// Megabits per second, for reports.
    pub fn mbps(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// Gigabits per second, for reports.
    pub fn gbps(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// Picoseconds one byte takes at this rate (a zero rate counts as 1 b/s).
    pub const fn ps_per_byte(self) -> u64 {
        let bps = if self.0 == 0 { 1 } else { self.0 };
        (8_000_000_000_000u128 / bps as u128) as u64
    }

    /// Time to send `bytes` bytes at this rate, rounded up (a zero rate counts as 1 b/s).
    pub fn time_to_send(self, bytes: u64) -> Duration {
        let ns =
            (u128::from(bytes) * 8 * u128::from(NANOS_PER_SEC)).div_ceil(u128::from(self.0.max(1)));
        Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
    }

    /// Whole bytes sent at this rate in `span`, rounded down.
    pub fn bytes_in(self, span: Duration) -> u64 {
        let bytes =
            u128::from(self.0) * u128::from(span.as_nanos()) / (8 * u128::from(NANOS_PER_SEC));
        bytes.min(u128::from(u64::MAX)) as u64
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} Mb/s", self.mbps())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_agree() {
        assert_eq!(Rate::from_mbps(100).bps(), 100_000_000);
        assert_eq!(Rate::from_gbps(10), Rate::from_mbps(10_000));
        assert_eq!(Rate::from_kbps(8).bytes_per_sec(), 1_000);
        assert_eq!(Rate::from_bytes_per_sec(125_000), Rate::from_mbps(1));
        assert_eq!(Rate::from_mbps_f64(2.5).bps(), 2_500_000);
        assert_eq!(Rate::from_mbps_f64(-1.0), Rate::ZERO);
        assert_eq!(Rate::from_mbps(u64::MAX).bps(), u64::MAX);
        assert_eq!(Rate::from_mbps(1500).mbps(), 1500.0);
        assert_eq!(Rate::from_gbps(1).ps_per_byte(), 8_000);
        assert_eq!(Rate::ZERO.ps_per_byte(), 8_000_000_000_000);
    }

    #[test]
    fn time_and_bytes_are_inverse() {
        let r = Rate::from_gbps(1);
        // A 1500-byte frame at 1 Gb/s: 12 us.
        assert_eq!(r.time_to_send(1500), Duration::from_micros(12));
        assert_eq!(r.bytes_in(Duration::from_micros(12)), 1500);
        // Rounded up: one bit's worth more never takes less time.
        assert_eq!(Rate::from_bps(3).time_to_send(1).as_nanos(), 2_666_666_667);
        assert_eq!(Rate::ZERO.time_to_send(1), Duration::from_secs(8));
        assert_eq!(
            Rate::of_bytes_in(125_000, Duration::from_millis(1)),
            Rate::from_gbps(1)
        );
        assert_eq!(Rate::of_bytes_in(1, Duration::ZERO), Rate::ZERO);
    }
}
