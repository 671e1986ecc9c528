//! Per-call cost of the shared-engine limiter (FairNIC 4.4): a grant from the core's token
//! cache (the common case), and a call that refills from the base bucket and steals from the
//! overflow pool or is denied.
//!
//! Run: `cargo bench -p picnic-core --bench fairnic`. The clock advances by a fixed step per
//! call, as it would between jobs.

use divan::{black_box, Bencher};
use picnic_core::fairnic::{FairnicConfig, SharedEngineLimiter, TokenCost};
use picnic_core::{Duration, Instant};

fn main() {
    divan::main();
}

/// Two workers (tokens are worker ns), a job costs 400 + 1/byte: the switch's engine.
fn limiter(now: Instant) -> SharedEngineLimiter {
    let cost = TokenCost {
        per_request: 400,
        per_byte: 1,
    };
    let mut l = SharedEngineLimiter::new(now, FairnicConfig::new(2_000_000_000, 2, cost)).unwrap();
    l.add_tenant(now, 500_000_000).unwrap();
    l.add_tenant(now, 1_500_000_000).unwrap();
    l
}

/// Jobs well under the tenant's rate: almost every call is served by the core's cache.
#[divan::bench]
fn acquire_under_rate(bencher: Bencher) {
    let mut now = Instant::ZERO;
    let mut l = limiter(now);
    bencher.bench_local(|| {
        now += Duration::from_nanos(2_000);
        black_box(l.try_acquire(now, 0, 0, black_box(64)).unwrap())
    });
}

/// A hog far over its base: calls refill, steal from the pool within the AIMD allowance,
/// or are denied.
#[divan::bench]
fn acquire_over_rate(bencher: Bencher) {
    let mut now = Instant::ZERO;
    let mut l = limiter(now);
    bencher.bench_local(|| {
        now += Duration::from_nanos(100);
        black_box(l.try_acquire(now, 1, 0, black_box(1500)).unwrap())
    });
}
