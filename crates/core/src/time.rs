//! Time as plain numbers passed in by the caller.
//!
//! Mechanisms never read a clock: every call takes `now: Instant` and timers are
//! exposed as `poll_at() -> Option<Instant>` (the quinn-proto / smoltcp pattern).
//! The switch feeds the monotonic clock, the simulator a virtual one, tests a
//! hand-stepped one, so behaviour is exactly reproducible.

use core::ops::{Add, AddAssign, Sub, SubAssign};

/// A point in time, in nanoseconds since an arbitrary epoch chosen by the caller.
#[derive(
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Instant(u64);

/// A span of time in nanoseconds.
#[derive(
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Duration(u64);

pub const NANOS_PER_SEC: u64 = 1_000_000_000;

impl Instant {
    pub const ZERO: Instant = Instant(0);
    pub const MAX: Instant = Instant(u64::MAX);

    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time elapsed since `earlier`, zero if `earlier` is in the future
    /// (callers may hand in slightly out-of-order timestamps from several cores).
    pub const fn saturating_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    pub const ZERO: Duration = Duration(0);
    pub const MAX: Duration = Duration(u64::MAX);

    pub const fn from_nanos(ns: u64) -> Self {
        Duration(ns)
    }
    pub const fn from_micros(us: u64) -> Self {
        Duration(us.saturating_mul(1_000))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Duration(ms.saturating_mul(1_000_000))
    }
    pub const fn from_secs(s: u64) -> Self {
        Duration(s.saturating_mul(NANOS_PER_SEC))
    }
    pub fn from_secs_f64(s: f64) -> Self {
        Duration((s * NANOS_PER_SEC as f64).max(0.0) as u64)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / NANOS_PER_SEC as f64
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}
impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}
impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(d.0))
    }
}
/// `a - b` saturates at zero, like [`Instant::saturating_since`].
impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}
impl Add for Duration {
    type Output = Duration;
    fn add(self, o: Duration) -> Duration {
        Duration(self.0.saturating_add(o.0))
    }
}
impl AddAssign for Duration {
    fn add_assign(&mut self, o: Duration) {
        *self = *self + o;
    }
}
impl Sub for Duration {
    type Output = Duration;
    fn sub(self, o: Duration) -> Duration {
        Duration(self.0.saturating_sub(o.0))
    }
}
impl SubAssign for Duration {
    fn sub_assign(&mut self, o: Duration) {
        *self = *self - o;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let t = Instant::from_nanos(10);
        assert_eq!(Instant::from_nanos(5) - t, Duration::ZERO);
        assert_eq!(t - Duration::from_nanos(20), Instant::ZERO);
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Duration::from_millis(3).as_nanos(), 3_000_000);
    }
}
