//! The shared bucket and per-worker token caches: conformance in aggregate on a virtual
//! clock (random interleavings), and exact totals under real concurrent borrowing.

use std::sync::Arc;

use picnic_core::pool::{SharedBucket, TokenCache};
use picnic_core::time::NANOS_PER_SEC;
use picnic_core::Instant;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEC: u128 = NANOS_PER_SEC as u128;

/// Caches sharing one bucket: each step advances the clock, then the caches try in a random
/// interleaving (backlogged: each until blocked; otherwise one call, with random releases).
/// Returns `(time, size)` of every consumption and the last instant.
#[derive(Clone, Copy)]
struct CacheRun {
    caches: usize,
    chunk: u64,
    rate: u64,
    burst: u64,
    max_packet: u64,
    max_gap: u64,
    backlogged: bool,
}

fn run_caches(rng: &mut SmallRng, run: CacheRun) -> (Vec<(u64, u64)>, u64) {
    let CacheRun {
        caches,
        chunk,
        rate,
        burst,
        max_packet,
        max_gap,
        backlogged,
    } = run;
    let shared = SharedBucket::new(rate, burst, Instant::ZERO);
    let mut cores: Vec<TokenCache> = (0..caches).map(|_| TokenCache::new(chunk)).collect();
    let mut heads: Vec<u64> = (0..caches).map(|_| rng.gen_range(1..=max_packet)).collect();
    let mut sends = Vec::new();
    let mut now = 0u64;
    for step in 0..400 {
        if step > 0 {
            now += rng.gen_range(0..=max_gap);
        }
        let mut trying: Vec<usize> = (0..caches).collect();
        while !trying.is_empty() {
            let k = rng.gen_range(0..trying.len());
            let c = trying[k];
            if cores[c].try_consume(Instant::from_nanos(now), &shared, heads[c]) {
                sends.push((now, heads[c]));
                heads[c] = rng.gen_range(1..=max_packet);
            } else {
                trying.swap_remove(k);
            }
            if !backlogged {
                if rng.gen_bool(0.1) {
                    cores[c].release(Instant::from_nanos(now), &shared);
                }
                break;
            }
        }
    }
    (sends, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// From the start the caches together never exceed rate * t + burst; over any interval,
    /// never more than rate * dt + burst + caches * (chunk - 1).
    #[test]
    fn token_caches_conform_in_aggregate(
        seed in any::<u64>(),
        caches in 2usize..=8,
        chunk in 0u64..=20_000,
        rate in 1_000u64..=1_000_000_000,
        max_packet in 1u64..=9_000,
        backlogged in any::<bool>(),
    ) {
        let burst = 4 * max_packet;
        let mut rng = SmallRng::seed_from_u64(seed);
        let max_gap = rng.gen_range(1..=2_000_000);
        let run = CacheRun { caches, chunk, rate, burst, max_packet, max_gap, backlogged };
        let (sends, _) = run_caches(&mut rng, run);
        let slack = burst + caches as u64 * chunk.saturating_sub(1);
        let mut sent = 0u128;
        for (i, &(t, size)) in sends.iter().enumerate() {
            sent += size as u128;
            prop_assert!(sent * SEC <= rate as u128 * t as u128 + burst as u128 * SEC);
            // Any window ending here.
            let mut window = 0u128;
            for &(t0, s0) in sends[..=i].iter().rev() {
                window += s0 as u128;
                let dt = (t - t0) as u128;
                prop_assert!(window * SEC <= rate as u128 * dt + slack as u128 * SEC);
            }
        }
    }

    /// Backlogged caches together get rate * t + burst, less at most what the bucket and the
    /// caches strand (under a packet each).
    #[test]
    fn backlogged_token_caches_get_the_rate(
        seed in any::<u64>(),
        caches in 2usize..=8,
        chunk in 0u64..=20_000,
        rate in 1_000_000u64..=1_000_000_000,
        max_packet in 1u64..=9_000,
    ) {
        // The caches wake every <= 100 us: the burst must hold what accrues in between.
        let max_gap = 100_000;
        let burst = 4 * max_packet + rate * max_gap / NANOS_PER_SEC;
        let mut rng = SmallRng::seed_from_u64(seed);
        let run = CacheRun { caches, chunk, rate, burst, max_packet, max_gap, backlogged: true };
        let (sends, end) = run_caches(&mut rng, run);
        let sent: u128 = sends.iter().map(|s| s.1 as u128).sum();
        let stranded = (max_packet + caches as u64 * chunk.min(max_packet)) as u128;
        prop_assert!(sent * SEC + stranded * SEC > rate as u128 * end as u128 + burst as u128 * SEC);
    }
}

/// Four threads borrow concurrently from a bucket that does not refill: together they get
/// exactly its tokens, never one more.
#[test]
fn concurrent_caches_take_exactly_the_bucket() {
    const BURST: u64 = 1_000_000;
    let shared = Arc::new(SharedBucket::new(0, BURST, Instant::ZERO));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut cache = TokenCache::new(1_000 + i * 17);
                let mut got = 0u64;
                while cache.try_consume(Instant::ZERO, &shared, 7) {
                    got += 7;
                }
                got + cache.local_tokens()
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total + shared.available(Instant::ZERO), BURST);
}

/// Concurrent charges beyond the tokens all land: the debt is the sum of what was charged
/// minus the burst.
#[test]
fn concurrent_charges_add_up_to_the_debt() {
    let shared = Arc::new(SharedBucket::new(1_000_000_000, 10_000, Instant::ZERO));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut cache = TokenCache::new(500);
                for _ in 0..1_000 {
                    cache.charge(Instant::ZERO, &shared, 30);
                }
                cache.local_tokens()
            })
        })
        .collect();
    let left: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    // 120,000 charged from 10,000: 110,000 of debt (plus what caches still hold), repaid at
    // 1 token/ns from t = 0.
    let debt = 4 * 1_000 * 30 + left - 10_000;
    assert_eq!(shared.available(Instant::from_nanos(debt)), 0);
    assert_eq!(shared.available(Instant::from_nanos(debt + 1)), 1);
}
