//! Per-call cost of the token bucket, the shaper and the rate meter.
//!
//! Run: `cargo bench -p picnic-core --bench bucket`. The clock advances by a
//! fixed step per call, as it would between packets.

use divan::{black_box, Bencher};
use picnic_core::bucket::{Shaper, TokenBucket};
use picnic_core::meter::RateMeter;
use picnic_core::{Duration, Instant};

fn main() {
    divan::main();
}

/// 1 Gb/s in bytes, 64 kB burst; 1500-byte packets every 12 us fit the rate.
const RATE: u64 = 125_000_000;
const BURST: u64 = 64 * 1024;
const PACKET: u64 = 1500;
const STEP: Duration = Duration::from_nanos(12_000);

/// `try_consume` at an odd rate with demand above the rate, so every call
/// refills with a division and about two in three calls are refused.
#[divan::bench]
fn bucket_try_consume(bencher: Bencher) {
    let mut now = Instant::ZERO;
    let mut bucket = TokenBucket::new(499_999_937, BURST, now);
    bencher.bench_local(|| {
        now += Duration::from_nanos(1_000);
        black_box(bucket.try_consume(now, black_box(PACKET)))
    });
}

/// `try_consume` on a bucket that stays full (the idle-limiter fast path).
#[divan::bench]
fn bucket_try_consume_full(bencher: Bencher) {
    let mut now = Instant::ZERO;
    let mut bucket = TokenBucket::new(RATE, BURST, now);
    bencher.bench_local(|| {
        now += STEP;
        black_box(bucket.try_consume(now, black_box(0)))
    });
}

/// One `enqueue` plus one `dequeue` on a shaper that keeps up with its input.
#[divan::bench]
fn shaper_enqueue_dequeue(bencher: Bencher) {
    let mut now = Instant::ZERO;
    let mut shaper = Shaper::new(TokenBucket::new(RATE, BURST, now), 1024, 128 * 1024);
    bencher.bench_local(|| {
        now += STEP;
        let _ = shaper.enqueue(black_box(7u32), PACKET);
        black_box(shaper.dequeue(now))
    });
}

/// `RateMeter::record`, one packet every 1.2 us (a window closes every ~167 calls).
#[divan::bench]
fn meter_record(bencher: Bencher) {
    let mut now = Instant::ZERO;
    let mut meter = RateMeter::new(now);
    bencher.bench_local(|| {
        now += Duration::from_nanos(1_200);
        black_box(meter.record(now, black_box(PACKET), black_box(800)))
    });
}
