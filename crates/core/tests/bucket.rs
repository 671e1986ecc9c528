//! Token bucket and shaper behaviour on a virtual clock.

use std::collections::VecDeque;

use picnic_core::bucket::{Shaper, TokenBucket};
use picnic_core::time::NANOS_PER_SEC;
use picnic_core::{Duration, Instant};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEC: u128 = NANOS_PER_SEC as u128;

fn at(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

/// Asserts that over every interval between two sends (inclusive) the tokens
/// sent are at most `rate * dt + allowance`, in exact fluid arithmetic.
fn assert_never_above(sends: &[(u64, u64)], rate: u64, allowance: u64) {
    let mut prefix = vec![0u128];
    for &(_, size) in sends {
        prefix.push(prefix.last().unwrap() + size as u128);
    }
    for i in 0..sends.len() {
        for j in i..sends.len() {
            let sent = prefix[j + 1] - prefix[i];
            let dt = (sends[j].0 - sends[i].0) as u128;
            assert!(
                sent * SEC <= rate as u128 * dt + allowance as u128 * SEC,
                "sent {sent} in {dt} ns at rate {rate}/s, allowance {allowance}"
            );
        }
    }
}

/// Drives a FIFO of `(arrival, size)` packets through `bucket`, sending each
/// head as soon as the bucket allows (waking at arrivals and at `time_until`).
/// Returns `(time, size)` for every send.
fn drive(bucket: &mut TokenBucket, arrivals: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut sends = Vec::new();
    let mut backlog: VecDeque<u64> = VecDeque::new();
    let mut next = 0;
    let mut now = 0u64;
    loop {
        while next < arrivals.len() && arrivals[next].0 <= now {
            backlog.push_back(arrivals[next].1);
            next += 1;
        }
        while let Some(&size) = backlog.front() {
            if !bucket.try_consume(at(now), size) {
                break;
            }
            sends.push((now, size));
            backlog.pop_front();
        }
        let ready = backlog
            .front()
            .and_then(|&size| bucket.time_until(at(now), size))
            .map(|d| now + d.as_nanos());
        let arrival = arrivals.get(next).map(|a| a.0);
        now = match (ready, arrival) {
            (Some(r), Some(a)) => r.min(a),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => return sends,
        };
    }
}

proptest! {
    /// Random arrivals: over every interval, sent <= rate * dt + burst.
    #[test]
    fn never_exceeds_rate_plus_burst(
        rate in 1u64..=2_000_000_000,
        max_packet in 1u64..=9_000,
        burst_packets in 1u64..=8,
        gaps_sizes in prop::collection::vec((0u64..3_000_000, any::<u64>()), 1..200),
    ) {
        let burst = max_packet * burst_packets;
        let mut t = 0;
        let arrivals: Vec<(u64, u64)> = gaps_sizes
            .iter()
            .map(|&(gap, s)| { t += gap; (t, 1 + s % max_packet) })
            .collect();
        let mut bucket = TokenBucket::new(rate, burst, Instant::ZERO);
        let sends = drive(&mut bucket, &arrivals);
        assert_never_above(&sends, rate, burst);
    }

    /// Continuously backlogged from t = 0 (bucket full): sent by each send time t
    /// is more than rate * t + burst - max_packet, and over any interval between
    /// sends more than rate * dt - max_packet.
    #[test]
    fn backlogged_sender_gets_rate_plus_burst(
        rate in 1_000u64..=2_000_000_000,
        max_packet in 1u64..=9_000,
        burst_packets in 1u64..=8,
        sizes in prop::collection::vec(any::<u64>(), 1..300),
    ) {
        // A burst of exactly one packet sits full for part of a nanosecond
        // before each send (see `TokenBucket`); one nanosecond's refill more
        // (rounded up: one token below 1e9 tokens/s) avoids that.
        let burst = max_packet * burst_packets + rate.div_ceil(NANOS_PER_SEC);
        let arrivals: Vec<(u64, u64)> = sizes.iter().map(|s| (0, 1 + s % max_packet)).collect();
        let mut bucket = TokenBucket::new(rate, burst, Instant::ZERO);
        let sends = drive(&mut bucket, &arrivals);
        prop_assert_eq!(sends.len(), arrivals.len());
        // Only sends after which the next packet was still waiting count.
        let mut sent = 0u128;
        for (k, &(t, size)) in sends.iter().enumerate() {
            sent += size as u128;
            let last_at_t = sends.get(k + 1).map(|n| n.0) != Some(t);
            if last_at_t && k + 1 < sends.len() {
                let floor = rate as u128 * t as u128 + (burst as u128) * SEC;
                prop_assert!(sent * SEC + max_packet as u128 * SEC > floor);
            }
        }
        let mut prefix = vec![0u128];
        for &(_, s) in &sends { prefix.push(prefix.last().unwrap() + s as u128); }
        for i in 0..sends.len() {
            // Intervals (t_i, t_j] starting after the last send at t_i.
            if sends.get(i + 1).is_some_and(|n| n.0 == sends[i].0) { continue; }
            for j in i + 1..sends.len() - 1 {
                if sends[j + 1].0 == sends[j].0 { continue; }
                let sent = prefix[j + 1] - prefix[i + 1];
                let dt = (sends[j].0 - sends[i].0) as u128;
                prop_assert!(sent * SEC + max_packet as u128 * SEC > rate as u128 * dt);
            }
        }
    }

    /// Debt of D tokens at a refill boundary delays the next n tokens by
    /// exactly ceil((D + n) / rate).
    #[test]
    fn debt_delays_by_debt_over_rate(
        rate in 1u64..=10_000_000_000,
        burst in 1u64..=100_000,
        debt in 1u64..=1_000_000,
        n in 1u64..=100_000,
    ) {
        let n = 1 + (n - 1) % burst;
        let mut b = TokenBucket::new(rate, burst, Instant::ZERO);
        prop_assert_eq!(b.force_consume(Instant::ZERO, burst + debt), debt);
        prop_assert_eq!(b.available(Instant::ZERO), 0);
        let wait = ((debt + n) as u128 * SEC).div_ceil(rate as u128) as u64;
        prop_assert_eq!(b.time_until(Instant::ZERO, n), Some(Duration::from_nanos(wait)));
        let mut early = b.clone();
        prop_assert!(!early.try_consume(at(wait - 1), n));
        prop_assert!(b.try_consume(at(wait), n));
        prop_assert_eq!(b.debt(), 0);
    }
}

#[test]
fn debt_example_one_token_per_ms() {
    let mut b = TokenBucket::new(1_000, 500, Instant::ZERO);
    assert_eq!(b.force_consume(Instant::ZERO, 1_500), 1_000);
    // 1000 tokens of debt at 1 token/ms: the next token appears at 1001 ms.
    assert!(!b.clone().try_consume(at(1_001_000_000 - 1), 1));
    assert!(b.try_consume(at(1_001_000_000), 1));
}

/// Hours of virtual time at awkward rates, draining at irregular moments: the
/// total refill is exactly floor(rate * elapsed), with no drift.
#[test]
fn refill_is_exact_over_hours() {
    let mut rng = SmallRng::seed_from_u64(7);
    for rate in [
        7u64,
        999_999_937,
        1,
        3,
        1_000_000_007,
        125_000_000,
        40_000_000_001,
    ] {
        // Burst large enough that the drained bucket never overflows between steps.
        let max_step = 2 * NANOS_PER_SEC;
        let burst = (rate as u128 * max_step as u128 / SEC) as u64 + 1;
        let mut b = TokenBucket::new(rate, burst, Instant::ZERO);
        assert!(b.try_consume(Instant::ZERO, burst)); // start empty: no refill is clipped
        let mut consumed = burst as u128;
        let mut now = 0u64;
        let end = 3 * 3600 * NANOS_PER_SEC + 12_345;
        while now < end {
            now = (now + rng.gen_range(1..=max_step)).min(end);
            let avail = b.available(at(now));
            assert!(b.try_consume(at(now), avail));
            consumed += avail as u128;
        }
        assert_eq!(
            consumed,
            burst as u128 + rate as u128 * end as u128 / SEC,
            "rate {rate}"
        );
    }
}

/// Rate changes keep exactness within each segment and never create tokens.
#[test]
fn set_rate_live_never_creates_tokens() {
    let mut b = TokenBucket::new(1_000, 10_000, Instant::ZERO);
    assert!(b.try_consume(Instant::ZERO, 10_000));
    b.set_rate(at(NANOS_PER_SEC), 3_000, 10_000); // earned 1000 at the old rate
    assert_eq!(b.available(at(NANOS_PER_SEC)), 1_000);
    assert_eq!(b.available(at(2 * NANOS_PER_SEC)), 4_000);
    b.set_rate(at(2 * NANOS_PER_SEC), 0, 2_500); // blocked, clipped to the new burst
    assert_eq!(b.available(at(100 * NANOS_PER_SEC)), 2_500);
    assert_eq!(b.time_until(at(100 * NANOS_PER_SEC), 2_501), None);
}

/// Bytes released by `shaper` per 100 ms bin while kept backlogged, waking
/// either exactly at `poll_at` or on a coarse `tick`.
fn shaped_bins(rate: u64, burst: u64, packet: u64, tick: Option<Duration>) -> Vec<u64> {
    let bin = 100_000_000u64;
    let mut shaper = Shaper::new(
        TokenBucket::new(rate, burst, Instant::ZERO),
        64,
        64 * packet,
    );
    let mut bins = vec![0u64; 10];
    let mut now = Instant::ZERO;
    while now.as_nanos() < 10 * bin {
        while shaper.enqueue((), packet).is_ok() {}
        while shaper.dequeue(now).is_some() {
            bins[(now.as_nanos() / bin) as usize] += packet;
        }
        now = match tick {
            Some(t) => now + t,
            None => shaper.poll_at().expect("backlogged"),
        };
    }
    bins
}

#[test]
fn shaper_holds_rate_within_two_percent_per_100ms() {
    // 10 Mb/s and 1 Gb/s in bytes, exact wake-ups and a 50 us timer (EyeQ section 4).
    for (rate, burst, packet) in [
        (1_250_000u64, 1_500u64, 1_500u64),
        (125_000_000, 65_536, 1_500),
    ] {
        for tick in [None, Some(Duration::from_micros(50))] {
            let expect = rate / 10;
            for (i, bytes) in shaped_bins(rate, burst, packet, tick)
                .into_iter()
                .enumerate()
            {
                let err = (bytes as f64 - expect as f64).abs() / expect as f64;
                assert!(
                    err < 0.02,
                    "rate {rate} tick {tick:?} bin {i}: {bytes} vs {expect}"
                );
            }
        }
    }
}

#[test]
fn full_shaper_returns_the_item() {
    let mut s = Shaper::new(TokenBucket::new(1_000, 100, Instant::ZERO), 2, 150);
    assert_eq!(s.enqueue("a", 60), Ok(()));
    assert_eq!(s.enqueue("b", 100), Err("b")); // over the token bound
    assert_eq!(s.enqueue("c", 90), Ok(()));
    assert_eq!(s.enqueue("d", 0), Err("d")); // over the item bound
    assert_eq!((s.len(), s.queued()), (2, 150));
    let mut s = Shaper::new(TokenBucket::new(1_000, 100, Instant::ZERO), 8, 1_000);
    assert_eq!(s.enqueue("jumbo", 101), Err("jumbo")); // could never pass
}

#[test]
fn shaper_poll_at_is_exactly_when_the_head_passes() {
    let mut s = Shaper::new(TokenBucket::new(1_000, 100, Instant::ZERO), 8, 1_000);
    assert_eq!(s.poll_at(), None);
    s.enqueue(1, 100).unwrap();
    s.enqueue(2, 40).unwrap();
    assert_eq!(s.dequeue(Instant::ZERO), Some(1));
    assert_eq!(s.dequeue(Instant::ZERO), None);
    let ready = s.poll_at().unwrap();
    assert_eq!(ready, at(40_000_000));
    assert_eq!(s.dequeue(ready - Duration::from_nanos(1)), None);
    assert_eq!(s.dequeue(ready), Some(2));
    assert!(s.is_empty());
}
