//! Per-endpoint rate meters over fixed windows (EyeQ section 3.2).
//!
//! A [`RateMeter`](crate::meter::RateMeter) counts bytes, packets and an abstract cost (for example
//! nanoseconds of CPU spent on the endpoint's packets) in fixed windows of
//! 200 us by default, and smooths the per-window rates with an EWMA. The
//! per-packet update is a few additions; the window is closed lazily on the next
//! `record` or on `on_timeout`, so the meter needs no timer of its own
//! (EyeQ section 4: counter updates batched over 200 us intervals).

use crate::time::{Duration, Instant, NANOS_PER_SEC};

/// Largest accepted [`MeterConfig::ewma_shift`] (an EWMA gain of 1/65536).
pub const MAX_EWMA_SHIFT: u32 = 16;

/// How a [`RateMeter`] measures.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MeterConfig {
    /// Length of a window. EyeQ section 4: shorter windows mistake tiny bursts
    /// for rates, longer ones miss the bursts that fill a shallow switch buffer.
    pub window: Duration,
    /// EWMA gain across windows as a power of two: each window moves the
    /// smoothed rate by `(sample - rate) / 2^ewma_shift`. 0 means no smoothing.
    pub ewma_shift: u32,
}

impl Default for MeterConfig {
    /// 200 us windows (EyeQ section 3.2), gain 1/4.
    fn default() -> Self {
        MeterConfig {
            window: Duration::from_micros(200),
            ewma_shift: 2,
        }
    }
}

/// Why a [`MeterConfig`] was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MeterError {
    /// `window` is zero; give it a length such as 200 us.
    ZeroWindow,
    /// `ewma_shift` is above [`MAX_EWMA_SHIFT`].
    EwmaShiftTooLarge(u32),
}

impl std::fmt::Display for MeterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MeterError::ZeroWindow => write!(f, "meter window must be longer than 0 ns"),
            MeterError::EwmaShiftTooLarge(s) => {
                write!(
                    f,
                    "meter ewma_shift {s} is above the maximum {MAX_EWMA_SHIFT}"
                )
            }
        }
    }
}

impl std::error::Error for MeterError {}

/// What was counted in one window.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Bytes recorded.
    pub bytes: u64,
    /// Packets recorded.
    pub packets: u64,
    /// Cost recorded (caller's unit, for example ns of CPU).
    pub cost: u64,
}

/// Rates per second.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    /// Bytes per second.
    pub bytes_per_sec: u64,
    /// Packets per second.
    pub packets_per_sec: u64,
    /// Cost units per second.
    pub cost_per_sec: u64,
}

impl Rates {
    fn is_zero(&self) -> bool {
        *self == Rates::default()
    }
}

/// A windowed, EWMA-smoothed meter of bytes, packets and cost for one endpoint.
#[derive(Clone, Debug)]
pub struct RateMeter {
    window_ns: u64,
    ewma_shift: u32,
    /// End of the window being filled.
    window_end: Instant,
    current: WindowCounts,
    last: WindowCounts,
    smoothed: Rates,
}

impl RateMeter {
    /// A meter with the default configuration (200 us windows), first window starting at `now`.
    pub fn new(now: Instant) -> Self {
        Self::with_config(now, MeterConfig::default()).expect("the default config is valid")
    }

    /// A meter with `config`, first window starting at `now`.
    pub fn with_config(now: Instant, config: MeterConfig) -> Result<Self, MeterError> {
        let window_ns = config.window.as_nanos();
        if window_ns == 0 {
            return Err(MeterError::ZeroWindow);
        }
        if config.ewma_shift > MAX_EWMA_SHIFT {
            return Err(MeterError::EwmaShiftTooLarge(config.ewma_shift));
        }
        Ok(RateMeter {
            window_ns,
            ewma_shift: config.ewma_shift,
            window_end: now + config.window,
            current: WindowCounts::default(),
            last: WindowCounts::default(),
            smoothed: Rates::default(),
        })
    }

    /// Counts one packet of `bytes` costing `cost`; returns true if this closed
    /// at least one window (EyeQ's REM is clocked by incoming packets, section 3.2).
    #[inline]
    pub fn record(&mut self, now: Instant, bytes: u64, cost: u64) -> bool {
        self.record_batch(now, 1, bytes, cost)
    }

    /// Counts `packets` packets totalling `bytes` and `cost` at once; returns
    /// true if this closed at least one window.
    #[inline]
    pub fn record_batch(&mut self, now: Instant, packets: u64, bytes: u64, cost: u64) -> bool {
        let closed = self.on_timeout(now);
        self.current.packets = self.current.packets.saturating_add(packets);
        self.current.bytes = self.current.bytes.saturating_add(bytes);
        self.current.cost = self.current.cost.saturating_add(cost);
        closed
    }

    /// Closes every window that ended by `now`; returns true if any did.
    /// Idle windows decay the smoothed rates toward zero.
    #[inline]
    pub fn on_timeout(&mut self, now: Instant) -> bool {
        if now < self.window_end {
            return false;
        }
        self.close_windows(now);
        true
    }

    /// End of the current window, when the meter wants [`on_timeout`](Self::on_timeout);
    /// `None` while nothing is left to report or decay (idle and all rates zero).
    pub fn poll_at(&self) -> Option<Instant> {
        let quiet = self.current.packets == 0 && self.last.packets == 0 && self.smoothed.is_zero();
        (!quiet).then_some(self.window_end)
    }

    /// Smoothed bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.smoothed.bytes_per_sec
    }

    /// Smoothed packets per second.
    pub fn packets_per_sec(&self) -> u64 {
        self.smoothed.packets_per_sec
    }

    /// Smoothed cost units per second.
    pub fn cost_per_sec(&self) -> u64 {
        self.smoothed.cost_per_sec
    }

    /// All smoothed rates.
    pub fn rates(&self) -> Rates {
        self.smoothed
    }

    /// Counts of the last closed window (raw, unsmoothed).
    pub fn last_window(&self) -> WindowCounts {
        self.last
    }

    /// Rates of the last closed window alone (raw, unsmoothed): the fastest
    /// signal, for detecting a flood within one window.
    pub fn last_window_rates(&self) -> Rates {
        self.rates_of(self.last)
    }

    /// True if the last closed window saw at least one packet: EyeQ's RX
    /// scheduler shares capacity among active endpoints only (section 3.2).
    pub fn was_active(&self) -> bool {
        self.last.packets > 0
    }

    fn per_sec(&self, count: u64) -> u64 {
        let rate = count as u128 * NANOS_PER_SEC as u128 / self.window_ns as u128;
        rate.min(u64::MAX as u128) as u64
    }

    fn rates_of(&self, counts: WindowCounts) -> Rates {
        Rates {
            bytes_per_sec: self.per_sec(counts.bytes),
            packets_per_sec: self.per_sec(counts.packets),
            cost_per_sec: self.per_sec(counts.cost),
        }
    }

    /// Closes the current window and every idle one up to `now >= window_end`.
    #[cold]
    fn close_windows(&mut self, now: Instant) {
        let idle_windows = (now - self.window_end).as_nanos() / self.window_ns;
        let sample = self.rates_of(self.current);
        let shift = self.ewma_shift;
        let s = &mut self.smoothed;
        s.bytes_per_sec = ewma(s.bytes_per_sec, sample.bytes_per_sec, shift);
        s.packets_per_sec = ewma(s.packets_per_sec, sample.packets_per_sec, shift);
        s.cost_per_sec = ewma(s.cost_per_sec, sample.cost_per_sec, shift);
        self.last = self.current;
        self.current = WindowCounts::default();
        if idle_windows > 0 {
            self.last = WindowCounts::default();
            if !s.is_zero() {
                let factor = idle_decay_q32(shift, idle_windows);
                s.bytes_per_sec = scale_q32(s.bytes_per_sec, factor);
                s.packets_per_sec = scale_q32(s.packets_per_sec, factor);
                s.cost_per_sec = scale_q32(s.cost_per_sec, factor);
            }
        }
        let advance = idle_windows
            .saturating_add(1)
            .saturating_mul(self.window_ns);
        self.window_end += Duration::from_nanos(advance);
    }
}

/// One EWMA step: `rate + (sample - rate) / 2^shift`, rounded toward minus
/// infinity so a rate fed zeros reaches exactly zero.
fn ewma(rate: u64, sample: u64, shift: u32) -> u64 {
    let step = (sample as i128 - rate as i128) >> shift;
    (rate as i128 + step) as u64
}

/// `(1 - 2^-shift)^windows` in Q32 fixed point (by squaring, so a long idle
/// gap costs O(log windows)): the EWMA fed `windows` zero samples.
fn idle_decay_q32(shift: u32, windows: u64) -> u64 {
    const ONE: u128 = 1 << 32;
    let mut base = ONE - (ONE >> shift);
    let mut factor = ONE;
    let mut e = windows;
    while e > 0 && factor > 0 {
        if e & 1 == 1 {
            factor = (factor * base) >> 32;
        }
        base = (base * base) >> 32;
        e >>= 1;
    }
    factor as u64
}

fn scale_q32(value: u64, factor_q32: u64) -> u64 {
    ((value as u128 * factor_q32 as u128) >> 32) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_config_is_an_error() {
        let now = Instant::ZERO;
        let zero = MeterConfig {
            window: Duration::ZERO,
            ..MeterConfig::default()
        };
        assert_eq!(
            RateMeter::with_config(now, zero).unwrap_err(),
            MeterError::ZeroWindow
        );
        let shift = MeterConfig {
            ewma_shift: 40,
            ..MeterConfig::default()
        };
        assert!(RateMeter::with_config(now, shift).is_err());
    }

    #[test]
    fn ewma_reaches_zero_and_target() {
        assert_eq!(ewma(3, 0, 2), 2);
        assert_eq!(ewma(1, 0, 2), 0);
        assert_eq!(ewma(0, 100, 0), 100);
        assert_eq!(idle_decay_q32(0, 1), 0);
        assert_eq!(idle_decay_q32(1, 2), 1 << 30);
        assert_eq!(idle_decay_q32(2, u64::MAX), 0);
    }
}
