//! FairNIC's admission on the submit path (FairNIC 4.4, sans-I/O: every call takes `now`):
//! each dataplane thread that submits jobs (the single loop, or each worker) holds a
//! [`Gate`] with its own token cache per tenant and spends from it without a lock; only
//! when a cache runs dry does it take the [`Limiter`]'s lock, which refills the cache from
//! the tenant's base bucket or, past its base, steals from the global overflow pool within
//! the tenant's AIMD allowance ([`picnic_core::fairnic::SharedEngineLimiter`]). A job the
//! limiter holds waits in its tenant's queue of the gate until the time the limiter names;
//! a job it refuses with an error is given back, never run.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use picnic_core::fairnic::{
    FairnicConfig, FairnicError, SharedEngineLimiter, TenantEngineStats, TokenCost, Verdict,
};
use picnic_core::{Duration, Instant};

/// The largest job: a whole frame buffer.
pub(super) const MAX_JOB_BYTES: u64 = crate::frame::FRAME_CAP as u64;

/// The limiter's shared state, behind a lock the gates take only when a cache runs dry, and
/// per tenant the grants the gates made from their caches meanwhile (counted, not locked).
pub(crate) struct Limiter {
    inner: Mutex<SharedEngineLimiter>,
    cost: TokenCost,
    /// Per tenant: jobs granted from a cache, and their tokens.
    cached: Vec<(AtomicU64, AtomicU64)>,
}

impl Limiter {
    /// A limiter for `weights.len()` tenants and `gates` submitting threads over an engine
    /// that sustains `capacity` tokens per second at `cost` a job: each tenant's base rate
    /// is its weight's share of the capacity (weight 0: a tenant that does not use the
    /// engine), every base bucket holds the largest job, and the buckets and the pool are at
    /// least `burst` deep (at their rates), so a gate that comes back only every `burst`
    /// loses no tokens in between.
    pub(crate) fn new(
        now: Instant,
        weights: &[u64],
        gates: usize,
        capacity: u64,
        cost: TokenCost,
        burst: Duration,
    ) -> Result<Self, FairnicError> {
        let total: u128 = weights.iter().map(|&w| w as u128).sum();
        let idle = weights.iter().filter(|&&w| w == 0).count() as u64;
        let shared = capacity.saturating_sub(idle) as u128;
        let bases: Vec<u64> = weights
            .iter()
            .map(|&w| ((shared * w as u128 / total.max(1)) as u64).max(1))
            .collect();
        let mut config = FairnicConfig::new(capacity, gates.max(1), cost);
        let min_base = bases.iter().copied().min().unwrap_or(capacity).max(1);
        let largest = cost.of(MAX_JOB_BYTES) as u128;
        let fits = Duration::from_nanos(
            (largest * picnic_core::time::NANOS_PER_SEC as u128).div_ceil(min_base as u128) as u64,
        );
        config.base_burst = config.base_burst.max(fits).max(burst);
        let pool = (capacity as u128 * burst.as_nanos() as u128
            / picnic_core::time::NANOS_PER_SEC as u128) as u64;
        config.pool_burst = config.pool_burst.max(pool);
        // A cache pulls several jobs' tokens at a time, so the lock is taken once for them.
        config.chunk = config.chunk.max(config.pool_burst / 16);
        let mut limiter = SharedEngineLimiter::new(now, config)?;
        for base in bases {
            limiter.add_tenant(now, base)?;
        }
        Ok(Limiter {
            inner: Mutex::new(limiter),
            cost,
            cached: weights
                .iter()
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        })
    }

    /// The limiter's counters for `tenant`, grants from the gates' caches included.
    pub(crate) fn stats(&self, tenant: usize) -> Option<TenantEngineStats> {
        let mut s = super::lock(&self.inner).stats(tenant).ok()?;
        let (jobs, tokens) = self.cached.get(tenant)?;
        s.granted += jobs.load(Ordering::Relaxed);
        s.base_tokens += tokens.load(Ordering::Relaxed);
        Some(s)
    }
}

/// A job waiting in a gate: its size, when it was submitted, whether it came to a queue
/// holding at most one of its tenant's jobs (a light tenant's job, not a backlog's).
struct Held<T> {
    size: u64,
    at: Instant,
    fresh: bool,
    item: T,
}

/// An admitted job, for the engine's queues.
pub(crate) struct Admitted<T> {
    pub(crate) tenant: usize,
    pub(crate) size: u64,
    pub(crate) at: Instant,
    pub(crate) fresh: bool,
    pub(crate) item: T,
}

/// One submitting thread's side of the limiter: its token cache and queue per tenant.
pub(crate) struct Gate<T> {
    caches: Vec<u64>,
    held: Vec<VecDeque<Held<T>>>,
    /// Per tenant: the limiter denied it until then; not asked again before.
    blocked_until: Vec<Instant>,
}

impl<T> Gate<T> {
    pub(crate) fn new(tenants: usize) -> Self {
        Gate {
            caches: vec![0; tenants],
            held: (0..tenants).map(|_| VecDeque::new()).collect(),
            blocked_until: vec![Instant::ZERO; tenants],
        }
    }

    /// Queues `item`, a job of `size` bytes of `tenant` submitted at `at`, for
    /// [`Gate::admit`]; gives it back for an unknown tenant.
    pub(crate) fn offer(
        &mut self,
        tenant: usize,
        size: u64,
        at: Instant,
        item: T,
    ) -> Result<(), T> {
        let Some(q) = self.held.get_mut(tenant) else {
            return Err(item);
        };
        let fresh = q.len() < 2;
        q.push_back(Held {
            size,
            at,
            fresh,
            item,
        });
        Ok(())
    }

    /// Admits, in each tenant's order, the jobs `limiter` grants at `now` (all of them
    /// without a limiter: no isolation) into `admitted`; a job the limiter refuses with an
    /// error goes to `refused`, with the error. Returns when the first job held back may be
    /// admitted.
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        limiter: Option<&Limiter>,
        mut admitted: impl FnMut(Admitted<T>),
        mut refused: impl FnMut(usize, T, FairnicError),
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for t in 0..self.held.len() {
            if self.held[t].is_empty() {
                continue;
            }
            if self.blocked_until[t] > now {
                next = Some(next.map_or(self.blocked_until[t], |n| n.min(self.blocked_until[t])));
                continue;
            }
            while let Some(h) = self.held[t].front() {
                let verdict = match limiter {
                    None => Ok(Verdict::Granted { stolen: 0 }),
                    Some(l) => {
                        let cost = l.cost.of(h.size);
                        if self.caches[t] >= cost {
                            // FairNIC's fast path: the cache covers it, no lock.
                            self.caches[t] -= cost;
                            let (jobs, tokens) = &l.cached[t];
                            jobs.fetch_add(1, Ordering::Relaxed);
                            tokens.fetch_add(cost, Ordering::Relaxed);
                            Ok(Verdict::Granted { stolen: 0 })
                        } else {
                            super::lock(&l.inner).acquire_cached(
                                now,
                                &mut self.caches[t],
                                t,
                                h.size,
                            )
                        }
                    }
                };
                match verdict {
                    Ok(Verdict::Granted { .. }) => {
                        let h = self.held[t].pop_front().expect("front above");
                        admitted(Admitted {
                            tenant: t,
                            size: h.size,
                            at: h.at,
                            fresh: h.fresh,
                            item: h.item,
                        });
                    }
                    Ok(Verdict::Denied { retry_at }) => {
                        self.blocked_until[t] = retry_at;
                        next = Some(next.map_or(retry_at, |n| n.min(retry_at)));
                        break;
                    }
                    Err(e) => {
                        let h = self.held[t].pop_front().expect("front above");
                        refused(t, h.item, e);
                    }
                }
            }
        }
        next
    }

    /// Empties every queue into `out` (the engine is stopping).
    pub(crate) fn drain_into(&mut self, out: &mut Vec<T>) {
        for q in &mut self.held {
            out.extend(q.drain(..).map(|h| h.item));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost() -> TokenCost {
        TokenCost {
            per_request: 1000,
            per_byte: 0,
        }
    }

    /// Two gates submitting a tenant's jobs within its base get every job granted, most of
    /// them from their caches, without the lock (FairNIC 4.4's fast path).
    #[test]
    fn within_its_base_a_tenant_is_granted_every_job_mostly_without_the_lock() {
        let limiter = Limiter::new(
            Instant::ZERO,
            &[1, 1],
            2,
            1_000_000_000,
            cost(),
            Duration::ZERO,
        )
        .unwrap();
        let mut gates: Vec<Gate<()>> = (0..2).map(|_| Gate::new(2)).collect();
        let (mut offered, mut granted) = (0u64, 0u64);
        // Each gate a 1000-token job every 5 us: 0.4e9 tokens/s against a 0.5e9 base.
        let mut now = Instant::ZERO;
        for _ in 0..2_000 {
            for g in &mut gates {
                g.offer(0, 64, now, ()).unwrap();
                offered += 1;
                g.admit(
                    now,
                    Some(&limiter),
                    |_| granted += 1,
                    |_, _, e| panic!("{e}"),
                );
            }
            now += Duration::from_micros(5);
        }
        assert_eq!(granted, offered);
        let s = limiter.stats(0).unwrap();
        assert_eq!((s.granted, s.stolen_tokens), (granted, 0));
        let cached = limiter.cached[0].0.load(Ordering::Relaxed);
        assert!(
            cached * 10 >= granted * 8,
            "{cached} of {granted} from caches"
        );
    }

    /// A job the limiter cannot grant with an error (larger than any bucket) is refused, not
    /// run, and the jobs behind it still are admitted.
    #[test]
    fn a_limiter_error_refuses_the_job_instead_of_running_it() {
        let huge = TokenCost {
            per_request: 1,
            per_byte: 1_000_000,
        };
        let limiter =
            Limiter::new(Instant::ZERO, &[1], 1, 1_000_000_000, huge, Duration::ZERO).unwrap();
        let mut gate: Gate<u32> = Gate::new(1);
        // Sized over the largest job the buckets were made for.
        gate.offer(0, MAX_JOB_BYTES * 4, Instant::ZERO, 1).unwrap();
        gate.offer(0, 1, Instant::ZERO, 2).unwrap();
        let (mut ran, mut refused) = (Vec::new(), Vec::new());
        gate.admit(
            Instant::ZERO,
            Some(&limiter),
            |a| ran.push(a.item),
            |_, item, e| refused.push((item, e)),
        );
        assert_eq!(ran, vec![2]);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, 1);
        assert!(matches!(refused[0].1, FairnicError::RequestTooLarge { .. }));
        assert_eq!(gate.offer(5, 1, Instant::ZERO, 3), Err(3), "unknown tenant");
    }
}
