//! Rate meter behaviour on a virtual clock.

use picnic_core::meter::{MeterConfig, RateMeter};
use picnic_core::{Duration, Instant};

const WINDOW: u64 = 200_000;

fn at(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

fn within(value: u64, expect: u64, tolerance: f64) -> bool {
    (value as f64 - expect as f64).abs() <= tolerance * expect as f64
}

/// Feeds one packet of `bytes`/`cost` every `gap` ns over `[start, end)`.
fn feed(meter: &mut RateMeter, start: u64, end: u64, gap: u64, bytes: u64, cost: u64) {
    let mut t = start;
    while t < end {
        meter.record(at(t), bytes, cost);
        t += gap;
    }
}

#[test]
fn constant_input_reads_within_one_percent_after_a_few_windows() {
    // 125 B and 50 ns of cost every us: 125 MB/s, 1 Mpps, 50 ms of CPU per second.
    let mut m = RateMeter::new(Instant::ZERO);
    let mut t = 0;
    while t < 100_000_000 {
        m.record(at(t), 125, 50);
        if t >= 20 * WINDOW {
            assert!(
                within(m.bytes_per_sec(), 125_000_000, 0.01),
                "{t}: {:?}",
                m.rates()
            );
            assert!(
                within(m.packets_per_sec(), 1_000_000, 0.01),
                "{t}: {:?}",
                m.rates()
            );
            assert!(
                within(m.cost_per_sec(), 50_000_000, 0.01),
                "{t}: {:?}",
                m.rates()
            );
            assert!(m.was_active());
        }
        t += 1_000;
    }
    let raw = m.last_window_rates();
    assert_eq!(
        (raw.bytes_per_sec, raw.packets_per_sec),
        (125_000_000, 1_000_000)
    );
}

#[test]
fn uneven_packets_per_window_still_average_out() {
    // 1500-byte packets at 1 Gb/s: 16.67 per 200 us window, so raw windows jitter
    // by -4%/+2%; the EWMA stays within 2%.
    let mut m = RateMeter::new(Instant::ZERO);
    let mut t = 0;
    while t < 50_000_000 {
        m.record(at(t), 1_500, 0);
        if t >= 30 * WINDOW {
            assert!(
                within(m.bytes_per_sec(), 125_000_000, 0.02),
                "{t}: {:?}",
                m.rates()
            );
        }
        t += 12_000;
    }
}

#[test]
fn a_sender_that_stops_decays_to_zero_on_timeouts_alone() {
    let mut m = RateMeter::new(Instant::ZERO);
    feed(&mut m, 0, 10_000_000, 1_000, 125, 50);
    let before = m.bytes_per_sec();
    assert!(within(before, 125_000_000, 0.01));
    // No more records: only the timer, at the times the meter asks for.
    let mut windows = 0;
    while let Some(deadline) = m.poll_at() {
        assert!(m.on_timeout(deadline));
        windows += 1;
        if windows == 1 {
            assert!(m.was_active(), "the window holding the last packets");
        }
        if windows == 2 {
            assert!(!m.was_active());
        }
        if windows == 20 {
            assert!(m.bytes_per_sec() < before / 100, "{:?}", m.rates());
            assert!(m.packets_per_sec() < 1_000_000 / 100);
            assert!(m.cost_per_sec() < 50_000_000 / 100);
        }
        assert!(windows < 200, "meter never went quiet");
    }
    assert_eq!(m.rates(), Default::default());
}

#[test]
fn one_late_timeout_applies_every_idle_window() {
    let mut m = RateMeter::new(Instant::ZERO);
    feed(&mut m, 0, 10_000_000, 1_000, 125, 50);
    let mut stepped = m.clone();
    // 30 idle windows at once vs one by one: the same decay, to a token.
    assert!(m.on_timeout(at(10_000_000 + 30 * WINDOW)));
    for w in 1..=30 {
        stepped.on_timeout(at(10_000_000 + w * WINDOW));
    }
    let (lazy, step) = (m.bytes_per_sec(), stepped.bytes_per_sec());
    assert!(lazy < 125_000_000 / 100 && step < 125_000_000 / 100);
    assert!(lazy.abs_diff(step) <= 30 * 4, "{lazy} vs {step}");
    assert_eq!(m.poll_at(), stepped.poll_at());
    // An hour later a single record sees all rates at zero.
    m.record(at(3_600_000_000_000), 100, 1);
    assert_eq!(m.rates(), Default::default());
}

#[test]
fn windows_close_on_schedule() {
    let cfg = MeterConfig {
        window: Duration::from_millis(1),
        ewma_shift: 0,
    };
    let mut m = RateMeter::with_config(Instant::ZERO, cfg).unwrap();
    assert_eq!(m.poll_at(), None, "nothing to report yet");
    assert!(!m.record(at(10), 1_000, 7));
    assert_eq!(m.poll_at(), Some(at(1_000_000)));
    assert!(!m.on_timeout(at(999_999)));
    assert!(
        m.record(at(1_000_000), 500, 0),
        "a record past the end closes the window"
    );
    // Without smoothing the rates are the raw window: 1000 B and 7 units in 1 ms.
    assert_eq!(
        (m.bytes_per_sec(), m.packets_per_sec(), m.cost_per_sec()),
        (1_000_000, 1_000, 7_000)
    );
    assert_eq!(m.last_window().bytes, 1_000);
    assert_eq!(m.poll_at(), Some(at(2_000_000)));
}

#[test]
fn batches_count_like_single_packets() {
    let mut single = RateMeter::new(Instant::ZERO);
    let mut batch = RateMeter::new(Instant::ZERO);
    for _ in 0..32 {
        single.record(at(100), 64, 10);
    }
    batch.record_batch(at(100), 32, 32 * 64, 320);
    single.on_timeout(at(WINDOW));
    batch.on_timeout(at(WINDOW));
    assert_eq!(single.last_window(), batch.last_window());
    assert_eq!(single.rates(), batch.rates());
}
