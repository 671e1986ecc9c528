//! Shared-engine rate limiter (FairNIC, Grant et al., SIGCOMM'20, section 4.4; DESIGN.md
//! section 3 item 7).
//!
//! A shared engine (payload encryption, compression, checksum offload...) sustains
//! `capacity` tokens per second without queueing; every request costs tokens, scaled by its
//! size for size-dependent engines (FairNIC 4.4: ZIP and RAID "calculate the number of tokens
//! based on the size of the request"). Admission keeps the engine at or below that rate so
//! every admitted request sees the engine's minimum latency, while tenants over their share
//! are the only ones throttled.
//!
//! * **Guaranteed base.** Each tenant has a base rate; its tokens accrue in the tenant's own
//!   bucket that nobody else can take from, so the base is available whatever the others do.
//!   The sum of base rates may not exceed the capacity.
//! * **Per-core token caches.** A core spends tokens from its local cache for that tenant and
//!   only touches shared state when the cache runs dry, pulling a chunk from the tenant's
//!   bucket (FairNIC's per-core counters, "similar in spirit to ... sloppy counters"). A
//!   caller that shards this struct per core keeps that property; tokens sitting in an idle
//!   core's cache are bounded by one chunk plus one request.
//! * **Global overflow pool.** The unallocated capacity (capacity minus the sum of bases) and
//!   every base token a tenant does not use (its bucket is full) flow into one pool, capped
//!   at `pool_burst`. A tenant whose base runs out steals from it, so idle tenants' capacity
//!   is used (work conservation). Stolen tokens are single-use: granted for the request at
//!   hand, never cached (FairNIC 5, "Global overflow tokens are single-use").
//! * **AIMD on stealing.** Each tenant may steal at most `allowance` tokens per steal window.
//!   A window in which the tenant was limited by its allowance and never found the pool dry
//!   grows the allowance by `steal_increase` (additive increase); a steal that finds the pool
//!   too low is contention and shrinks the allowance by `steal_backoff_percent`, once per
//!   window (multiplicative decrease). Stealers converge to a fair split of the pool, and a
//!   stealer's draw on the pool shrinks quickly when a returning tenant stops overflowing
//!   into it (FairNIC 4.4, "additive increase, multiplicative decrease as it allows for cores
//!   to eventually reach stability and it is adaptive to changing loads").
//!
//! Departures from FairNIC, for the switch: the base is per tenant rather than per core (our
//! SLOs are per tenant) and refill is continuous, exact integer arithmetic on elapsed `now`
//! instead of a per-core replenish interval.

use core::fmt;

use crate::time::{Duration, Instant, NANOS_PER_SEC};

/// Token cost of one request: `per_request + per_byte * size`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TokenCost {
    /// Tokens every request costs (set-up, descriptor handling).
    pub per_request: u64,
    /// Tokens per byte of request, 0 for constant-time engines.
    pub per_byte: u64,
}

impl TokenCost {
    /// Tokens a request of `size` bytes costs (saturating).
    pub fn of(&self, size: u64) -> u64 {
        self.per_request
            .saturating_add(self.per_byte.saturating_mul(size))
    }
}

/// Limiter configuration. [`FairnicConfig::new`] fills in defaults for everything but the
/// engine's capacity, the number of cores and the cost model.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FairnicConfig {
    /// Tokens per second the engine sustains without queueing (measured, FairNIC 3.4).
    pub capacity: u64,
    /// Number of cores that submit requests; cores are numbered `0..cores`.
    pub cores: usize,
    /// Cost of a request as a function of its size.
    pub cost: TokenCost,
    /// Depth of each tenant's base bucket, as time at its base rate: how long a burst the
    /// guarantee covers after an idle spell.
    pub base_burst: Duration,
    /// Depth of the overflow pool in tokens.
    pub pool_burst: u64,
    /// Tokens a core cache pulls from its tenant's bucket when it runs dry (at least the
    /// request's shortfall).
    pub chunk: u64,
    /// Length of an AIMD window.
    pub steal_window: Duration,
    /// Additive increase of the steal allowance per window, and its starting value.
    pub steal_increase: u64,
    /// Multiplicative decrease: percentage the allowance loses on contention (1..=100).
    pub steal_backoff_percent: u8,
}

impl FairnicConfig {
    /// Defaults: 100 us steal window; pool one window of full capacity deep (enough to absorb
    /// the AIMD sawtooth, so a lone stealer still uses what the pool receives); allowance step
    /// 1/16 of a window's capacity; halving on contention; base buckets one window deep;
    /// chunks of 1/64 of a window's capacity.
    pub fn new(capacity: u64, cores: usize, cost: TokenCost) -> Self {
        let steal_window = Duration::from_micros(100);
        let per_window = tokens_in(capacity, steal_window);
        FairnicConfig {
            capacity,
            cores,
            cost,
            base_burst: steal_window,
            pool_burst: per_window,
            chunk: (per_window / 64).max(1),
            steal_window,
            steal_increase: (per_window / 16).max(1),
            steal_backoff_percent: 50,
        }
    }
}

/// Errors from the limiter: bad configuration or arguments, never a panic.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FairnicError {
    /// Capacity, core count and steal window must be non-zero.
    ZeroConfig(&'static str),
    /// The multiplicative decrease must be in 1..=100 percent.
    BadBackoffPercent(u8),
    /// A tenant's base rate must be non-zero (every tenant has a guarantee).
    ZeroBaseRate,
    /// Adding this base rate would promise more than the engine's capacity.
    Oversubscribed {
        /// Sum of base rates including the new tenant, tokens/s.
        requested: u64,
        /// Engine capacity, tokens/s.
        capacity: u64,
    },
    /// No tenant has this index; use the one returned by [`SharedEngineLimiter::add_tenant`].
    UnknownTenant(usize),
    /// The core number is not below the configured core count.
    UnknownCore(usize),
    /// The request costs more tokens than the tenant's base bucket holds, so its guarantee
    /// could never cover it; split the request or raise `base_burst`.
    RequestTooLarge {
        /// Tokens the request costs.
        cost: u64,
        /// Depth of the tenant's base bucket.
        max: u64,
    },
}

impl fmt::Display for FairnicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FairnicError::ZeroConfig(field) => write!(f, "engine limiter `{field}` must be > 0"),
            FairnicError::BadBackoffPercent(p) => {
                write!(f, "steal_backoff_percent {p} out of range, use 1..=100")
            }
            FairnicError::ZeroBaseRate => write!(f, "tenant base rate must be > 0 tokens/s"),
            FairnicError::Oversubscribed { requested, capacity } => write!(
                f,
                "base rates would sum to {requested} tokens/s, above the engine capacity {capacity}"
            ),
            FairnicError::UnknownTenant(t) => {
                write!(f, "unknown tenant index {t}: use an index returned by add_tenant")
            }
            FairnicError::UnknownCore(c) => write!(f, "core {c} is not below the configured core count"),
            FairnicError::RequestTooLarge { cost, max } => write!(
                f,
                "request costs {cost} tokens, more than the tenant's base bucket ({max}); split it or raise base_burst"
            ),
        }
    }
}

impl std::error::Error for FairnicError {}

/// Outcome of [`SharedEngineLimiter::try_acquire`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Submit the request to the engine. `stolen` tokens of its cost came from the overflow
    /// pool, the rest from the tenant's base.
    Granted {
        /// Tokens taken from the overflow pool.
        stolen: u64,
    },
    /// Do not submit now; by `retry_at` the tenant's base will cover it, or a new steal
    /// window starts, whichever is first.
    Denied {
        /// When to try again.
        retry_at: Instant,
    },
}

/// Per-tenant counters since the tenant was added.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantEngineStats {
    /// Requests granted.
    pub granted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Tokens granted from the tenant's base.
    pub base_tokens: u64,
    /// Tokens granted from the overflow pool.
    pub stolen_tokens: u64,
    /// Steals that found the pool too low (multiplicative decreases at most one per window).
    pub contentions: u64,
    /// Current steal allowance per window.
    pub allowance: u64,
}

/// Exact integer refill: `rate` tokens per second accrued over elapsed ns, the fraction of a
/// token carried in `remainder` (units of 1/1e9 token) so nothing drifts.
#[derive(Clone, Debug)]
struct Refill {
    rate: u64,
    remainder: u128,
    last: Instant,
}

impl Refill {
    fn new(rate: u64, now: Instant) -> Self {
        Refill {
            rate,
            remainder: 0,
            last: now,
        }
    }

    fn advance(&mut self, now: Instant) -> u64 {
        if now <= self.last {
            return 0;
        }
        let scaled = self.rate as u128 * (now - self.last).as_nanos() as u128 + self.remainder;
        self.last = now;
        self.remainder = scaled % NANOS_PER_SEC as u128;
        (scaled / NANOS_PER_SEC as u128).min(u64::MAX as u128) as u64
    }

    /// Time from `self.last` until `tokens` more have accrued.
    fn time_for(&self, tokens: u64) -> Duration {
        let needed = (tokens as u128 * NANOS_PER_SEC as u128).saturating_sub(self.remainder);
        let rate = self.rate.max(1) as u128;
        Duration::from_nanos(needed.div_ceil(rate).min(u64::MAX as u128) as u64)
    }
}

fn tokens_in(rate: u64, span: Duration) -> u64 {
    (rate as u128 * span.as_nanos() as u128 / NANOS_PER_SEC as u128).min(u64::MAX as u128) as u64
}

/// The unallocated capacity and unused base tokens, shared by stealers.
#[derive(Clone, Debug)]
struct Pool {
    tokens: u64,
    cap: u64,
    refill: Refill,
    wasted: u64,
}

impl Pool {
    fn add(&mut self, tokens: u64) {
        let room = self.cap - self.tokens;
        self.tokens += tokens.min(room);
        self.wasted = self.wasted.saturating_add(tokens.saturating_sub(room));
    }
}

#[derive(Clone, Debug)]
struct Tenant {
    base: Refill,
    bucket: u64,
    bucket_cap: u64,
    /// Per-core token caches, allocated once when the tenant is added.
    caches: Box<[u64]>,
    allowance: u64,
    window_start: Instant,
    stolen_in_window: u64,
    allowance_limited: bool,
    contended: bool,
    retry_at: Option<Instant>,
    stats: TenantEngineStats,
}

impl Tenant {
    /// Accrues base tokens; what overflows the full bucket goes to the pool.
    fn refill(&mut self, now: Instant, pool: &mut Pool) {
        let fresh = self.base.advance(now);
        let room = self.bucket_cap - self.bucket;
        self.bucket += fresh.min(room);
        pool.add(fresh.saturating_sub(room));
    }

    /// Closes elapsed AIMD windows: additive increase if the last window was limited by the
    /// allowance and saw no contention.
    fn roll_window(&mut self, now: Instant, window: Duration, increase: u64, max_allowance: u64) {
        let elapsed = now - self.window_start;
        if elapsed < window {
            return;
        }
        if self.allowance_limited && !self.contended {
            self.allowance = self.allowance.saturating_add(increase).min(max_allowance);
        }
        let windows = elapsed.as_nanos() / window.as_nanos();
        self.window_start += Duration::from_nanos(windows.saturating_mul(window.as_nanos()));
        self.stolen_in_window = 0;
        self.allowance_limited = false;
        self.contended = false;
    }
}

/// Rate limiter for one shared engine used by several tenants from several cores
/// (FairNIC 4.4). Deterministic and sans-I/O: every call takes `now`.
#[derive(Clone, Debug)]
pub struct SharedEngineLimiter {
    config: FairnicConfig,
    pool: Pool,
    base_sum: u64,
    tenants: Vec<Tenant>,
}

impl SharedEngineLimiter {
    /// Creates a limiter with no tenants; until tenants are added the whole capacity flows
    /// into the pool.
    pub fn new(now: Instant, config: FairnicConfig) -> Result<Self, FairnicError> {
        let nonzero = [
            ("capacity", config.capacity != 0),
            ("cores", config.cores != 0),
            ("steal_window", config.steal_window != Duration::ZERO),
        ];
        if let Some((field, _)) = nonzero.iter().find(|(_, ok)| !ok) {
            return Err(FairnicError::ZeroConfig(field));
        }
        if config.steal_backoff_percent == 0 || config.steal_backoff_percent > 100 {
            return Err(FairnicError::BadBackoffPercent(
                config.steal_backoff_percent,
            ));
        }
        Ok(SharedEngineLimiter {
            config,
            pool: Pool {
                tokens: 0,
                cap: config.pool_burst,
                refill: Refill::new(config.capacity, now),
                wasted: 0,
            },
            base_sum: 0,
            tenants: Vec::new(),
        })
    }

    /// Adds a tenant guaranteed `base_rate` tokens per second; its bucket starts full.
    /// Returns its index.
    pub fn add_tenant(&mut self, now: Instant, base_rate: u64) -> Result<usize, FairnicError> {
        if base_rate == 0 {
            return Err(FairnicError::ZeroBaseRate);
        }
        let requested = self.base_sum.saturating_add(base_rate);
        if requested > self.config.capacity {
            return Err(FairnicError::Oversubscribed {
                requested,
                capacity: self.config.capacity,
            });
        }
        self.refresh_all(now);
        self.base_sum = requested;
        self.pool.refill.rate = self.config.capacity - requested;
        let bucket_cap = tokens_in(base_rate, self.config.base_burst).max(1);
        self.tenants.push(Tenant {
            base: Refill::new(base_rate, now),
            bucket: bucket_cap,
            bucket_cap,
            caches: vec![0; self.config.cores].into_boxed_slice(),
            allowance: self.config.steal_increase,
            window_start: now,
            stolen_in_window: 0,
            allowance_limited: false,
            contended: false,
            retry_at: None,
            stats: TenantEngineStats::default(),
        });
        Ok(self.tenants.len() - 1)
    }

    /// Brings the pool and every tenant's bucket up to `now` (the slow path: FairNIC's global
    /// lock, taken only when a core's local tokens run out).
    fn refresh_all(&mut self, now: Instant) {
        let fresh = self.pool.refill.advance(now);
        self.pool.add(fresh);
        for tenant in &mut self.tenants {
            tenant.refill(now, &mut self.pool);
        }
    }

    /// Asks to submit a request of `request_size` bytes from `core` on behalf of `tenant`.
    ///
    /// Fast path: the core's cache for the tenant covers the cost. Otherwise the cache pulls
    /// from the tenant's base bucket, and what the base cannot cover is stolen from the
    /// overflow pool within the tenant's AIMD allowance.
    pub fn try_acquire(
        &mut self,
        now: Instant,
        core: usize,
        tenant: usize,
        request_size: u64,
    ) -> Result<Verdict, FairnicError> {
        if core >= self.config.cores {
            return Err(FairnicError::UnknownCore(core));
        }
        let mut cache = self
            .tenants
            .get(tenant)
            .ok_or(FairnicError::UnknownTenant(tenant))?
            .caches[core];
        let verdict = self.acquire_cached(now, &mut cache, tenant, request_size);
        self.tenants[tenant].caches[core] = cache;
        verdict
    }

    /// [`SharedEngineLimiter::try_acquire`] with the core's token cache for `tenant` held by
    /// the caller (`cache`), so that a core spends from it without touching this struct,
    /// which may then sit behind a lock taken only when the cache runs dry (FairNIC 4.4's
    /// per-core counters and global slow path). The caller's fast path: a request whose cost
    /// `cache` covers is granted by taking the cost from it.
    pub fn acquire_cached(
        &mut self,
        now: Instant,
        cache: &mut u64,
        tenant: usize,
        request_size: u64,
    ) -> Result<Verdict, FairnicError> {
        let cost = self.config.cost.of(request_size);
        let window = self.config.steal_window;
        let increase = self.config.steal_increase;
        let max_allowance = tokens_in(self.config.capacity, window);
        let t = self
            .tenants
            .get_mut(tenant)
            .ok_or(FairnicError::UnknownTenant(tenant))?;
        if cost > t.bucket_cap {
            return Err(FairnicError::RequestTooLarge {
                cost,
                max: t.bucket_cap,
            });
        }
        if t.retry_at.is_some_and(|r| r <= now) {
            t.retry_at = None;
        }
        if *cache < cost {
            t.refill(now, &mut self.pool);
            let pull = t.bucket.min((cost - *cache).max(self.config.chunk));
            t.bucket -= pull;
            *cache += pull;
        }
        if *cache >= cost {
            *cache -= cost;
            t.stats.granted += 1;
            t.stats.base_tokens += cost;
            return Ok(Verdict::Granted { stolen: 0 });
        }
        let shortfall = cost - *cache;
        // The base alone covers the shortfall by this time (the bucket is empty now).
        let base_ready = now + t.base.time_for(shortfall);
        t.roll_window(now, window, increase, max_allowance);
        let next_window = t.window_start + window;
        let retry_at = base_ready.min(next_window);
        if t.stolen_in_window.saturating_add(shortfall) > t.allowance {
            t.allowance_limited = true;
            return Ok(self.deny(tenant, retry_at));
        }
        self.refresh_all(now);
        let t = &mut self.tenants[tenant];
        if self.pool.tokens < shortfall {
            t.stats.contentions += 1;
            if !t.contended {
                t.contended = true;
                let keep = 100 - self.config.steal_backoff_percent as u128;
                t.allowance = (t.allowance as u128 * keep / 100) as u64;
            }
            return Ok(self.deny(tenant, retry_at));
        }
        self.pool.tokens -= shortfall;
        t.stolen_in_window += shortfall;
        let from_base = cost - shortfall;
        *cache = 0;
        t.stats.granted += 1;
        t.stats.base_tokens += from_base;
        t.stats.stolen_tokens += shortfall;
        Ok(Verdict::Granted { stolen: shortfall })
    }

    fn deny(&mut self, tenant: usize, retry_at: Instant) -> Verdict {
        let t = &mut self.tenants[tenant];
        t.stats.denied += 1;
        t.retry_at = Some(t.retry_at.map_or(retry_at, |r| r.min(retry_at)));
        Verdict::Denied { retry_at }
    }

    /// The earliest time a denied tenant should retry, if any denial is outstanding.
    pub fn poll_at(&self) -> Option<Instant> {
        self.tenants.iter().filter_map(|t| t.retry_at).min()
    }

    /// Clears the retry times that have passed and brings the pool up to date.
    pub fn on_timeout(&mut self, now: Instant) {
        self.refresh_all(now);
        for t in &mut self.tenants {
            if t.retry_at.is_some_and(|r| r <= now) {
                t.retry_at = None;
            }
        }
    }

    /// Counters of `tenant` since it was added.
    pub fn stats(&self, tenant: usize) -> Result<TenantEngineStats, FairnicError> {
        let t = self
            .tenants
            .get(tenant)
            .ok_or(FairnicError::UnknownTenant(tenant))?;
        Ok(TenantEngineStats {
            allowance: t.allowance,
            ..t.stats
        })
    }

    /// Tokens in the overflow pool (as of the last refresh).
    pub fn pool_tokens(&self) -> u64 {
        self.pool.tokens
    }

    /// Tokens of capacity lost because the pool was full (nobody wanted them).
    pub fn wasted_tokens(&self) -> u64 {
        self.pool.wasted
    }
}
