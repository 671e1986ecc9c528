//! Token buckets and shapers.
//!
//! - [`TokenBucket`](crate::bucket::TokenBucket): rate + burst over abstract
//!   tokens (bytes, packets or nanoseconds of CPU), refilled from the caller's
//!   `now` with exact integer arithmetic (EyeQ section 4 rate limiters; FairNIC
//!   section 4.4 token limiters; refill in the style of Firecracker's limiter).
//! - [`Shaper`](crate::bucket::Shaper): a bounded FIFO gated by a bucket, so a
//!   shaped class has its own queue and never blocks fast-path traffic
//!   (PicNIC section 2.1).
//!
//! There is no "unlimited" bucket: a class without a limit simply has no
//! bucket (`Option<TokenBucket>` = `None`), which costs nothing on the fast path.

use std::collections::VecDeque;

use crate::time::{Duration, Instant, NANOS_PER_SEC};

/// A token bucket with an exact integer refill.
///
/// The bucket holds at most `burst` tokens and gains `rate` tokens per second.
/// Fractions of a token are carried between refills in units of
/// `1 / (1e9 / gcd(rate, 1e9))` token, so after any number of refills the total
/// refill over an elapsed time `T` ns is exactly `floor(rate * T / 1e9)` (as
/// long as the bucket never overflowed its burst): no drift, however long it runs.
///
/// An optional one-time burst is spent before the regular tokens and never
/// refills. [`force_consume`](Self::force_consume) may put the bucket into debt;
/// the debt is paid back from the refill before any token becomes available.
///
/// Time is in whole nanoseconds, so a bucket whose burst equals the size of
/// the packet waiting for it is already full when that packet becomes sendable
/// and loses what accrues until the next nanosecond (under `rate * 1 ns` per
/// packet). Give the burst at least `ceil(rate * 1 ns)` tokens more than the
/// largest packet (one token below 1e9 tokens/s).
///
/// A rate of 0 stops refilling: tokens already in the bucket may still be
/// spent, then the bucket is blocked. `set_rate(now, 0, 0)` blocks at once.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    /// Configured rate in tokens per second.
    rate: u64,
    /// Capacity of the regular tokens.
    burst: u64,
    /// `rate / gcd(rate, 1e9)`: sub-tokens gained per nanosecond.
    sub_per_ns: u64,
    /// `1e9 / gcd(rate, 1e9)`: sub-tokens per token (>= 1, so never a division by zero).
    sub_per_token: u64,
    /// Whole regular tokens, `<= burst`.
    tokens: u64,
    /// Fraction of a token carried over, in sub-tokens (`< sub_per_token`).
    sub_tokens: u64,
    /// Tokens owed after an over-consumption; non-zero only when `tokens` and `one_time` are 0.
    debt: u64,
    /// What is left of the one-time initial burst.
    one_time: u64,
    /// Time of the last refill.
    last: Instant,
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

/// `(rate / g, 1e9 / g)` with `g = gcd(rate, 1e9)`; for rate 0 this is `(0, 1)`.
const fn reduced(rate: u64) -> (u64, u64) {
    let g = gcd(rate, NANOS_PER_SEC);
    (rate / g, NANOS_PER_SEC / g)
}

impl TokenBucket {
    /// A bucket gaining `rate_per_sec` tokens per second, holding at most `burst`,
    /// starting full at `now`.
    pub fn new(rate_per_sec: u64, burst: u64, now: Instant) -> Self {
        let (sub_per_ns, sub_per_token) = reduced(rate_per_sec);
        TokenBucket {
            rate: rate_per_sec,
            burst,
            sub_per_ns,
            sub_per_token,
            tokens: burst,
            sub_tokens: 0,
            debt: 0,
            one_time: 0,
            last: now,
        }
    }

    /// Adds a one-time burst of `tokens`, spent before the regular tokens and
    /// never refilled (for example to let a new VM start fast).
    pub fn with_one_time_burst(mut self, tokens: u64) -> Self {
        self.one_time = tokens;
        self
    }

    /// Configured rate in tokens per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Configured capacity of the regular tokens.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Tokens owed after [`force_consume`](Self::force_consume), as of the last call.
    pub fn debt(&self) -> u64 {
        self.debt
    }

    /// Tokens that could be consumed at `now` (one-time burst included; 0 while in debt).
    pub fn available(&self, now: Instant) -> u64 {
        let mut at_now = self.clone();
        at_now.refill(now);
        at_now.spendable()
    }

    /// Takes `n` tokens if all of them are available at `now`; otherwise takes
    /// nothing and returns false.
    pub fn try_consume(&mut self, now: Instant, n: u64) -> bool {
        self.refill(now);
        if n > self.spendable() {
            return false;
        }
        self.take(n);
        true
    }

    /// Takes `n` tokens whatever the balance, going into debt for what is
    /// missing; returns the debt (0 if the balance covered `n`). Used to settle
    /// a cost only known after the work was done: the debt delays every later
    /// consumption by `debt / rate` seconds.
    pub fn force_consume(&mut self, now: Instant, n: u64) -> u64 {
        self.refill(now);
        let covered = n.min(self.spendable());
        self.take(covered);
        self.debt = self.debt.saturating_add(n - covered);
        self.debt
    }

    /// Takes as many tokens as are available, up to `max`, but only if at least
    /// `min` are; returns how many were taken (0 if fewer than `min` were there).
    pub fn consume_up_to(&mut self, now: Instant, min: u64, max: u64) -> u64 {
        self.refill(now);
        let have = self.spendable();
        if have < min {
            return 0;
        }
        let n = have.min(max);
        self.take(n);
        n
    }

    /// Gives back `n` tokens taken but not used (a packet dropped after it was
    /// admitted, a cache returning its leftovers); pays the debt first and never
    /// fills beyond the burst.
    pub fn refund(&mut self, now: Instant, n: u64) {
        self.refill(now);
        self.add(n);
    }

    /// How long after `now` until `n` tokens can be consumed: `Some(ZERO)` if
    /// they are available now, `None` if they never will be (`n` exceeds the
    /// burst plus the remaining one-time burst, or the rate is 0).
    pub fn time_until(&self, now: Instant, n: u64) -> Option<Duration> {
        self.ready_at(n).map(|t| t.saturating_since(now))
    }

    /// The earliest instant at which `n` tokens can be consumed, computed from
    /// the state at the last call (so it needs no `now`); `None` if never.
    pub fn ready_at(&self, n: u64) -> Option<Instant> {
        let have = self.spendable();
        if n <= have {
            return Some(self.last);
        }
        if n > self.one_time.saturating_add(self.burst) || self.sub_per_ns == 0 {
            return None;
        }
        // Regular tokens still to be refilled (debt first), in sub-tokens.
        let missing = (n - have) as u128 + self.debt as u128;
        let missing_sub = missing * self.sub_per_token as u128 - self.sub_tokens as u128;
        let ns = missing_sub.div_ceil(self.sub_per_ns as u128);
        Some(self.last + Duration::from_nanos(ns.min(u64::MAX as u128) as u64))
    }

    /// When the bucket had no token left at its last update, the instant the next one is
    /// due (a caller holding work back for it wakes then); `None` while tokens are left.
    pub fn next_token_at(&self) -> Option<Instant> {
        if self.spendable() > 0 {
            return None;
        }
        self.ready_at(1)
    }

    /// Changes rate and burst at `now`: tokens earned so far are kept (up to
    /// the new burst), the debt and the one-time burst are kept, and the carried
    /// fraction of a token is converted to the new units.
    pub fn set_rate(&mut self, now: Instant, rate_per_sec: u64, burst: u64) {
        self.refill(now);
        let (sub_per_ns, sub_per_token) = reduced(rate_per_sec);
        let fraction = self.sub_tokens as u128 * sub_per_token as u128 / self.sub_per_token as u128;
        self.sub_tokens = fraction as u64;
        self.rate = rate_per_sec;
        self.sub_per_ns = sub_per_ns;
        self.sub_per_token = sub_per_token;
        self.burst = burst;
        if self.tokens >= burst {
            self.tokens = burst;
            self.sub_tokens = 0;
        }
    }

    /// Tokens spendable right now from the stored state.
    fn spendable(&self) -> u64 {
        if self.debt > 0 {
            0
        } else {
            self.one_time.saturating_add(self.tokens)
        }
    }

    /// Removes `n <= spendable()` tokens, one-time burst first.
    fn take(&mut self, n: u64) {
        let from_one_time = n.min(self.one_time);
        self.one_time -= from_one_time;
        self.tokens -= n - from_one_time;
    }

    /// Adds `n` whole tokens: pays the debt, then fills up to the burst
    /// (a full bucket carries no fraction, so level <= burst holds exactly).
    fn add(&mut self, n: u64) {
        let paid = n.min(self.debt);
        self.debt -= paid;
        let n = n - paid;
        if self.debt == 0 {
            self.tokens = self.tokens.saturating_add(n);
            if self.tokens >= self.burst {
                self.tokens = self.burst;
                self.sub_tokens = 0;
            }
        }
    }

    /// Credits the tokens earned between the last refill and `now`. Time that
    /// goes backwards (timestamps from several cores) credits nothing.
    fn refill(&mut self, now: Instant) {
        if now <= self.last {
            return;
        }
        let elapsed = (now - self.last).as_nanos();
        self.last = now;
        if self.debt == 0 && self.tokens >= self.burst {
            self.sub_tokens = 0;
            return;
        }
        let per_token = self.sub_per_token;
        let (whole, fraction) = match elapsed
            .checked_mul(self.sub_per_ns)
            .and_then(|s| s.checked_add(self.sub_tokens))
        {
            Some(sub) => (sub / per_token, sub % per_token),
            None => {
                let sub = elapsed as u128 * self.sub_per_ns as u128 + self.sub_tokens as u128;
                let whole = (sub / per_token as u128).min(u64::MAX as u128) as u64;
                (whole, (sub % per_token as u128) as u64)
            }
        };
        self.sub_tokens = fraction;
        self.add(whole);
    }
}

/// One queued item with its size in tokens.
#[derive(Debug)]
struct Queued<T> {
    item: T,
    size: u64,
}

/// A bounded FIFO gated by a [`TokenBucket`].
///
/// A shaped class gets its own queue so it never blocks fast-path traffic
/// (PicNIC section 2.1); the queue is bounded in items and in tokens (EyeQ
/// section 4 caps each rate limiter's FIFO at 128 kB and back-pressures beyond).
/// The ring is allocated once in [`new`](Self::new); no allocation per item.
#[derive(Debug)]
pub struct Shaper<T> {
    bucket: TokenBucket,
    queue: VecDeque<Queued<T>>,
    max_items: usize,
    max_queued: u64,
    queued: u64,
}

impl<T> Shaper<T> {
    /// A shaper releasing items at the pace of `bucket`, holding at most
    /// `max_items` items and `max_queued` tokens' worth of them.
    pub fn new(bucket: TokenBucket, max_items: usize, max_queued: u64) -> Self {
        Shaper {
            bucket,
            queue: VecDeque::with_capacity(max_items),
            max_items,
            max_queued,
            queued: 0,
        }
    }

    /// Queues `item` costing `size` tokens. When the queue is full, or the item
    /// could never pass the bucket as configured (`size` above the burst, or a
    /// rate of 0 with too few tokens left), the item comes back in `Err` and the
    /// caller chooses to drop it or to stop pulling from its source.
    pub fn enqueue(&mut self, item: T, size: u64) -> Result<(), T> {
        let fits = self.queue.len() < self.max_items
            && self.queued.saturating_add(size) <= self.max_queued
            && self.bucket.ready_at(size).is_some();
        if !fits {
            return Err(item);
        }
        self.queued += size;
        self.queue.push_back(Queued { item, size });
        Ok(())
    }

    /// Releases the head item if the bucket has the tokens for it at `now`.
    pub fn dequeue(&mut self, now: Instant) -> Option<T> {
        let size = self.queue.front()?.size;
        if !self.bucket.try_consume(now, size) {
            return None;
        }
        self.queued -= size;
        self.queue.pop_front().map(|q| q.item)
    }

    /// Takes every queued item out in FIFO order without spending tokens, e.g. to release
    /// them when the queue goes away.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.queued = 0;
        self.queue.drain(..).map(|q| q.item)
    }

    /// When the head item becomes sendable (possibly already in the past);
    /// `None` if the queue is empty or the head can never pass (rate 0).
    pub fn poll_at(&self) -> Option<Instant> {
        self.bucket.ready_at(self.queue.front()?.size)
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Total size of the queued items, in tokens.
    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// The gating bucket.
    pub fn bucket(&self) -> &TokenBucket {
        &self.bucket
    }

    /// The gating bucket, to reconfigure it live ([`TokenBucket::set_rate`]).
    pub fn bucket_mut(&mut self) -> &mut TokenBucket {
        &mut self.bucket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn rate_zero_is_blocked_without_dividing_by_zero() {
        let mut b = TokenBucket::new(0, 10, at(0));
        assert!(b.try_consume(at(5), 10));
        assert!(!b.try_consume(at(u64::MAX), 1));
        assert_eq!(b.time_until(at(7), 1), None);
        b.set_rate(at(8), 0, 0);
        assert_eq!(b.available(at(9)), 0);
    }

    #[test]
    fn one_time_burst_is_spent_first_and_not_refilled() {
        let mut b = TokenBucket::new(1_000, 100, at(0)).with_one_time_burst(50);
        assert_eq!(b.available(at(0)), 150);
        assert!(b.try_consume(at(0), 60));
        assert_eq!(b.available(at(0)), 90);
        // A full second refills the regular tokens only.
        assert_eq!(b.available(at(NANOS_PER_SEC)), 100);
    }

    #[test]
    fn set_rate_keeps_tokens_up_to_new_burst() {
        let mut b = TokenBucket::new(1_000, 100, at(0));
        assert!(b.try_consume(at(0), 100));
        // 50 ms at 1000/s = 50 tokens, then a faster rate with a smaller burst.
        b.set_rate(at(50_000_000), 2_000, 40);
        assert_eq!(b.available(at(50_000_000)), 40);
        b.set_rate(at(50_000_000), 2_000, 1_000);
        assert_eq!(b.available(at(50_000_000)), 40);
        assert_eq!(b.available(at(60_000_000)), 60);
    }

    #[test]
    fn refund_pays_debt_then_caps_at_burst() {
        let mut b = TokenBucket::new(0, 10, at(0));
        assert_eq!(b.force_consume(at(0), 15), 5);
        b.refund(at(0), 3);
        assert_eq!(b.debt(), 2);
        b.refund(at(0), 100);
        assert_eq!((b.debt(), b.available(at(0))), (0, 10));
    }

    #[test]
    fn time_going_backwards_credits_nothing() {
        let mut b = TokenBucket::new(1_000_000, 10, at(1_000));
        assert!(b.try_consume(at(1_000), 10));
        assert!(!b.try_consume(at(10), 1));
        assert_eq!(b.time_until(at(1_000), 1), Some(Duration::from_micros(1)));
    }
}
