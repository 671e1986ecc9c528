//! A token bucket shared by several dataplane workers without a lock, and the per-worker
//! caches that keep it off the per-packet path (EyeQ section 4, "multi-queue rate limiter":
//! the total tokens split into a local count `t_c` per CPU that borrows from the global
//! tokens only when it runs out; FairNIC section 4.4: per-core token counters refilled from
//! a global token cache).
//!
//! [`SharedBucket`] is the global tokens: two atomics (the level, which may go negative for a
//! debt, and the instant up to which the rate has been credited), updated with
//! compare-and-swap, so any thread may borrow from it with `&self`. [`TokenCache`] is one
//! worker's local count, a plain integer the worker owns: a consumption that the cache covers
//! touches no shared memory; a short cache borrows at least `chunk` tokens at once.
//!
//! Sans-I/O like the rest of this crate: every call takes `now` from the caller. Callers on
//! different threads read one monotonic clock, but their `now`s may arrive out of order; a
//! refill at an instant before the last credited one credits nothing.
//!
//! Conformance: tokens leave the bucket only into caches or consumers, so the caches together
//! never consume more than `rate * t + burst` from the start; over any interval the slack is
//! what the caches held at its start, at most `caches * (chunk - 1)` beyond the bucket's own
//! bound. Costs only known after the work ([`TokenCache::charge`], Iron's measured CPU) may
//! overdraw the bucket: the debt delays everyone's next tokens, as in Iron 3.2 where a
//! negative `runtime` is paid back from the next period.

use core::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::time::{Instant, NANOS_PER_SEC};

/// The global tokens several workers borrow from (see the module doc).
#[derive(Debug)]
pub struct SharedBucket {
    rate: u64,
    burst: i64,
    /// Tokens in the bucket; negative while in debt.
    level: AtomicI64,
    /// Instant (ns) the bucket was made, and the tokens the rate has earned since then that
    /// were credited.
    origin: u64,
    credited: AtomicU64,
}

impl SharedBucket {
    /// A bucket of `rate_per_sec` tokens per second holding at most `burst`, full at `now`.
    pub fn new(rate_per_sec: u64, burst: u64, now: Instant) -> SharedBucket {
        let burst = burst.min(i64::MAX as u64) as i64;
        SharedBucket {
            rate: rate_per_sec,
            burst,
            level: AtomicI64::new(burst),
            origin: now.as_nanos(),
            credited: AtomicU64::new(0),
        }
    }

    /// Tokens per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Capacity in tokens.
    pub fn burst(&self) -> u64 {
        self.burst as u64
    }

    /// Credits what the rate earned up to `now`: the tokens due since the bucket was made,
    /// less those already credited. Only the caller whose compare-and-swap moves the count
    /// credits the difference, so nothing is credited twice, and counting whole tokens from
    /// one origin carries every fraction over exactly.
    fn refill(&self, now: Instant) {
        if self.rate == 0 {
            return;
        }
        let elapsed = now.as_nanos().saturating_sub(self.origin) as u128;
        let due =
            (elapsed * self.rate as u128 / NANOS_PER_SEC as u128).min(u64::MAX as u128) as u64;
        let mut credited = self.credited.load(Ordering::Acquire);
        while due > credited {
            match self.credited.compare_exchange_weak(
                credited,
                due,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // A full bucket keeps nothing of it.
                    self.add((due - credited).min(i64::MAX as u64) as i64);
                    return;
                }
                Err(seen) => credited = seen,
            }
        }
    }

    /// Adds `n` tokens (paying any debt first), never beyond the burst.
    fn add(&self, n: i64) {
        let burst = self.burst;
        let _ = self
            .level
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                Some(l.saturating_add(n).min(burst))
            });
    }

    /// Tokens that could be taken at `now` (0 while in debt).
    pub fn available(&self, now: Instant) -> u64 {
        self.refill(now);
        self.level.load(Ordering::Acquire).max(0) as u64
    }

    /// Takes as many tokens as there are, up to `max`, if at least `min` (and at least one)
    /// are there; returns how many were taken.
    pub fn take_up_to(&self, now: Instant, min: u64, max: u64) -> u64 {
        self.refill(now);
        let min = min.max(1).min(i64::MAX as u64) as i64;
        let max = max.min(i64::MAX as u64) as i64;
        match self
            .level
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                (l >= min).then(|| l - l.min(max))
            }) {
            Ok(before) => before.min(max) as u64,
            Err(_) => 0,
        }
    }

    /// Takes `n` tokens whatever the level, going into debt for what is missing.
    pub fn force(&self, now: Instant, n: u64) {
        self.refill(now);
        self.level
            .fetch_sub(n.min(i64::MAX as u64) as i64, Ordering::AcqRel);
    }

    /// Gives back `n` tokens taken but not used (a cache's leftovers).
    pub fn refund(&self, now: Instant, n: u64) {
        self.refill(now);
        self.add(n.min(i64::MAX as u64) as i64);
    }
}

/// One worker's local count of tokens borrowed from a [`SharedBucket`] (EyeQ's `t_c`).
#[derive(Clone, Debug)]
pub struct TokenCache {
    local: u64,
    chunk: u64,
}

impl TokenCache {
    /// An empty cache borrowing at least `chunk` tokens at a time (0: exactly what it needs).
    pub fn new(chunk: u64) -> TokenCache {
        TokenCache { local: 0, chunk }
    }

    /// Tokens held locally.
    pub fn local_tokens(&self) -> u64 {
        self.local
    }

    /// Takes `n` tokens from the local count if it suffices, else borrows the shortfall (or a
    /// chunk, whichever is larger) from `shared`; all or nothing.
    pub fn try_consume(&mut self, now: Instant, shared: &SharedBucket, n: u64) -> bool {
        if n <= self.local {
            self.local -= n;
            return true;
        }
        let short = n - self.local;
        let borrowed = shared.take_up_to(now, short, short.max(self.chunk));
        if borrowed == 0 {
            return false;
        }
        self.local = borrowed - short;
        true
    }

    /// Takes `n` tokens for work already done: what the cache and a borrow (a chunk at most)
    /// cannot cover becomes debt on `shared`, so every worker's next tokens pay for it.
    pub fn charge(&mut self, now: Instant, shared: &SharedBucket, n: u64) {
        if n <= self.local {
            self.local -= n;
            return;
        }
        let short = n - self.local;
        let borrowed = shared.take_up_to(now, 0, short.max(self.chunk));
        if borrowed >= short {
            self.local = borrowed - short;
        } else {
            self.local = 0;
            shared.force(now, short - borrowed);
        }
    }

    /// Whether neither this cache nor `shared` has a token at `now` (checks `shared` only when
    /// the cache is empty).
    pub fn exhausted(&self, now: Instant, shared: &SharedBucket) -> bool {
        self.local == 0 && shared.available(now) == 0
    }

    /// Returns the locally held tokens to `shared` (the worker goes idle or stops), so other
    /// workers can use them.
    pub fn release(&mut self, now: Instant, shared: &SharedBucket) {
        if self.local > 0 {
            shared.refund(now, self.local);
            self.local = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    #[test]
    fn cache_serves_locally_borrows_in_chunks_and_returns_leftovers() {
        let shared = SharedBucket::new(1_000, 10_000, Instant::ZERO);
        let mut cache = TokenCache::new(4_000);
        assert!(cache.try_consume(Instant::ZERO, &shared, 1_500));
        assert_eq!(cache.local_tokens(), 2_500);
        assert_eq!(shared.available(Instant::ZERO), 6_000);
        assert!(cache.try_consume(Instant::ZERO, &shared, 2_500));
        assert_eq!(shared.available(Instant::ZERO), 6_000);
        assert!(cache.try_consume(Instant::ZERO, &shared, 100));
        cache.release(Instant::ZERO, &shared);
        assert_eq!(
            (cache.local_tokens(), shared.available(Instant::ZERO)),
            (0, 5_900)
        );
        assert!(!cache.try_consume(Instant::ZERO, &shared, 6_000));
        // 100 tokens take 100 ms at 1,000/s.
        assert!(!cache.try_consume(at_us(99_999), &shared, 6_000));
        assert!(cache.try_consume(at_us(100_000), &shared, 6_000));
    }

    #[test]
    fn a_charge_beyond_the_tokens_is_debt_every_cache_pays() {
        let shared = SharedBucket::new(1_000_000, 1_000, Instant::ZERO);
        let (mut a, b) = (TokenCache::new(100), TokenCache::new(100));
        a.charge(Instant::ZERO, &shared, 3_000);
        assert_eq!(a.local_tokens(), 0);
        assert!(a.exhausted(Instant::ZERO, &shared) && b.exhausted(Instant::ZERO, &shared));
        // 2,000 tokens of debt take 2 ms at 1 M/s, then the bucket has tokens again.
        assert!(b.exhausted(at_us(2_000), &shared));
        assert!(!b.exhausted(at_us(2_001), &shared));
    }

    #[test]
    fn fractions_of_a_token_carry_over_between_refills() {
        // 3 tokens/s refilled every 100 ms: 30 refills in 10 s must give exactly 30 tokens.
        let shared = SharedBucket::new(3, 100, Instant::ZERO);
        assert_eq!(shared.take_up_to(Instant::ZERO, 0, 100), 100);
        let mut got = 0;
        for i in 1..=100 {
            got += shared.take_up_to(at_us(i * 100_000), 0, 100);
        }
        assert_eq!(got, 30);
    }

    #[test]
    fn a_refill_at_an_earlier_instant_credits_nothing() {
        let shared = SharedBucket::new(1_000_000, 10_000, Instant::ZERO);
        assert_eq!(shared.take_up_to(Instant::ZERO, 0, 10_000), 10_000);
        assert_eq!(shared.available(at_us(5)), 5);
        assert_eq!(shared.available(at_us(3)), 5);
        assert_eq!(shared.available(at_us(5)), 5);
    }
}
