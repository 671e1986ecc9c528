//! Shared-engine limiter (FairNIC 4.4) on a virtual clock: guaranteed base under a hog, work
//! conservation, AIMD convergence when an idle tenant returns, size-scaled costs.

use picnic_core::fairnic::{FairnicConfig, FairnicError, SharedEngineLimiter, TokenCost, Verdict};
use picnic_core::{Duration, Instant};

/// An engine of 1 GB/s (e.g. payload encryption), costed per byte: 1,000 requests of
/// 1,000 B per ms.
const CAPACITY: u64 = 1_000_000_000;
const BASE: u64 = 300_000_000;
const REQUEST: u64 = 1_000;
const STEP_NS: u64 = 1_000;
const WINDOW_NS: u64 = 100_000;
const BYTE_COST: TokenCost = TokenCost {
    per_request: 0,
    per_byte: 1,
};

#[derive(Copy, Clone, PartialEq)]
enum Demand {
    Idle,
    /// As many requests as the limiter grants, alternating over two cores.
    Greedy,
    /// Exactly the tenant's base rate, on core 1.
    AtBase,
}

struct Run {
    /// Tokens granted per tenant per 100 us window.
    windows: Vec<[u64; 2]>,
    limiter: SharedEngineLimiter,
}

/// Two tenants with base 300 MB/s each on a 1 GB/s engine, driven every 1 us of virtual time
/// for `duration_ms`; `demand(t_ns)` gives each tenant's behaviour at that time.
fn run(duration_ms: u64, demand: impl Fn(u64) -> [Demand; 2]) -> Run {
    let config = FairnicConfig::new(CAPACITY, 2, BYTE_COST);
    let mut limiter = SharedEngineLimiter::new(Instant::ZERO, config).unwrap();
    let tenants = [
        limiter.add_tenant(Instant::ZERO, BASE).unwrap(),
        limiter.add_tenant(Instant::ZERO, BASE).unwrap(),
    ];
    let steps = duration_ms * 1_000_000 / STEP_NS;
    let mut windows = vec![[0u64; 2]; (duration_ms * 1_000_000 / WINDOW_NS) as usize];
    let mut paced_sent = [0u64; 2];
    for step in 0..steps {
        let t_ns = step * STEP_NS;
        let now = Instant::from_nanos(t_ns);
        let window = &mut windows[(t_ns / WINDOW_NS) as usize];
        for (i, d) in demand(t_ns).into_iter().enumerate() {
            match d {
                Demand::Idle => {}
                Demand::Greedy => {
                    for _ in 0..8 {
                        match limiter
                            .try_acquire(now, (step % 2) as usize, tenants[i], REQUEST)
                            .unwrap()
                        {
                            Verdict::Granted { .. } => window[i] += REQUEST,
                            Verdict::Denied { retry_at } => {
                                assert!(retry_at > now);
                                break;
                            }
                        }
                    }
                }
                Demand::AtBase => {
                    // Requests due by now at the base rate since this tenant became active.
                    while (paced_sent[i] + 1) * REQUEST * 1_000_000_000 <= BASE * t_ns {
                        let verdict = limiter.try_acquire(now, 1, tenants[i], REQUEST).unwrap();
                        assert!(
                            matches!(verdict, Verdict::Granted { .. }),
                            "paced tenant {i} denied at {t_ns} ns"
                        );
                        window[i] += REQUEST;
                        paced_sent[i] += 1;
                    }
                }
            }
        }
    }
    Run { windows, limiter }
}

fn sum(windows: &[[u64; 2]], tenant: usize) -> u64 {
    windows.iter().map(|w| w[tenant]).sum()
}

#[test]
fn base_is_guaranteed_while_another_tenant_saturates() {
    // Tenant 0 hogs the engine for 1 s; tenant 1 asks for exactly its base all along and is
    // never denied (asserted inside `run`).
    let r = run(1_000, |_| [Demand::Greedy, Demand::AtBase]);
    let per_window_base = BASE * WINDOW_NS / 1_000_000_000;
    for (i, w) in r.windows.iter().enumerate().skip(1) {
        assert!(
            w[1] + REQUEST >= per_window_base,
            "window {i}: tenant 1 got {}",
            w[1]
        );
    }
    let total = sum(&r.windows, 0) + sum(&r.windows, 1);
    // Work conserving: the hog gets what the guaranteed tenant leaves...
    assert!(
        total >= CAPACITY * 95 / 100,
        "engine used {total} of {CAPACITY}"
    );
    // ...and the engine is never promised much more than it sustains (initial buckets and
    // the pool's depth are the only slack).
    assert!(
        total <= CAPACITY + 2 * BASE / 10_000 + CAPACITY / 10_000,
        "engine over-admitted: {total}"
    );
    let hog = r.limiter.stats(0).unwrap();
    assert!(hog.denied > 0 && hog.stolen_tokens > 0);
}

#[test]
fn busy_tenant_uses_idle_capacity() {
    let r = run(1_000, |_| [Demand::Greedy, Demand::Idle]);
    let used = sum(&r.windows, 0);
    println!(
        "busy alone used {used} of {CAPACITY}; wasted {}",
        r.limiter.wasted_tokens()
    );
    assert!(
        used >= CAPACITY * 90 / 100,
        "busy tenant alone used {used} of {CAPACITY} per s"
    );
    // Steady state too, not just on average: every 10 ms after warm-up.
    for (i, chunk) in r.windows.chunks(100).enumerate().skip(1) {
        let ten_ms = sum(chunk, 0);
        assert!(
            ten_ms >= CAPACITY / 100 * 90 / 100,
            "10 ms block {i}: {ten_ms}"
        );
    }
}

/// Tenant 1 is idle for 300 ms while tenant 0 takes the whole engine, then comes back
/// greedy. It must get its base from its first window back, and AIMD must split the pool
/// between the two stealers within a bounded time; both times are measured and asserted.
#[test]
fn returning_tenant_regains_base_and_fair_share_quickly() {
    const RETURN_NS: u64 = 300_000_000;
    let r = run(600, |t| {
        [
            Demand::Greedy,
            if t < RETURN_NS {
                Demand::Idle
            } else {
                Demand::Greedy
            },
        ]
    });
    let first = (RETURN_NS / WINDOW_NS) as usize;
    let after = &r.windows[first..];
    let per_window_base = BASE * WINDOW_NS / 1_000_000_000;

    // Base: every window from the first one back holds at least the base.
    let regain_base = after.iter().position(|w| w[1] >= per_window_base).unwrap();
    assert_eq!(regain_base, 0, "base regained after {regain_base} windows");
    assert!(
        after.iter().all(|w| w[1] >= per_window_base),
        "base lost in some window"
    );

    // Fair share: the time until both tenants' 1 ms totals are within 5% of each other and
    // stay so. AIMD (additive increase for the newcomer, halving for the incumbent on
    // contention) has to close a gap of the whole pool.
    let ms_blocks: Vec<[u64; 2]> = after.chunks(10).map(|c| [sum(c, 0), sum(c, 1)]).collect();
    let fair = |b: &[u64; 2]| b[0].abs_diff(b[1]) * 20 <= b[0].max(b[1]);
    let converged_ms = (0..ms_blocks.len())
        .find(|&i| ms_blocks[i..].iter().all(fair))
        .unwrap();
    println!(
        "fair share regained {converged_ms} ms after return; last ms {:?}",
        ms_blocks.last().unwrap()
    );
    assert!(converged_ms <= 5, "took {converged_ms} ms to converge");
    // The transient over-admission is bounded by the pool and bucket depths (100 us each).
    for (i, b) in ms_blocks.iter().enumerate() {
        assert!(
            b[0] + b[1] <= CAPACITY / 1_000 + CAPACITY / 10_000 + 2 * BASE / 10_000,
            "ms {i}: {b:?}"
        );
    }

    // Engine stays fully used across the return.
    let total: u64 = after.iter().map(|w| w[0] + w[1]).sum();
    assert!(
        total >= CAPACITY * 3 / 10 * 90 / 100,
        "engine used {total} in 300 ms"
    );
    assert!(r.limiter.stats(0).unwrap().contentions > 0);
}

#[test]
fn token_cost_scales_with_request_size() {
    // No pool (bases take the whole capacity): each tenant gets exactly its base in tokens,
    // so double-size requests are admitted half as often.
    let cost = TokenCost {
        per_request: 100,
        per_byte: 1,
    };
    let mut l =
        SharedEngineLimiter::new(Instant::ZERO, FairnicConfig::new(CAPACITY, 1, cost)).unwrap();
    let small = l.add_tenant(Instant::ZERO, CAPACITY / 2).unwrap();
    let large = l.add_tenant(Instant::ZERO, CAPACITY / 2).unwrap();
    let mut granted = [0u64; 2];
    for step in 0..100_000u64 {
        let now = Instant::from_nanos(step * STEP_NS);
        for (i, (tenant, size)) in [(small, 900u64), (large, 1_900)].into_iter().enumerate() {
            while let Verdict::Granted { stolen } = l.try_acquire(now, 0, tenant, size).unwrap() {
                assert_eq!(stolen, 0);
                granted[i] += 1;
            }
        }
    }
    // 100 ms at 500 MB/s: 50e6 tokens plus the initial bucket (50e3), in requests of 1,000
    // and 2,000 tokens.
    assert!((50_000..=50_050).contains(&granted[0]), "{granted:?}");
    assert!((25_000..=25_025).contains(&granted[1]), "{granted:?}");
    assert_eq!(l.stats(large).unwrap().base_tokens, granted[1] * 2_000);
}

#[test]
fn denial_gives_retry_time_and_poll_at() {
    let cost = TokenCost {
        per_request: 1,
        per_byte: 0,
    };
    let mut config = FairnicConfig::new(1_000_000, 1, cost); // 1 request per us
    config.base_burst = Duration::from_micros(10);
    config.pool_burst = 0;
    let mut l = SharedEngineLimiter::new(Instant::ZERO, config).unwrap();
    let t = l.add_tenant(Instant::ZERO, 1_000_000).unwrap();
    let now = Instant::ZERO;
    for _ in 0..10 {
        assert_eq!(
            l.try_acquire(now, 0, t, 0).unwrap(),
            Verdict::Granted { stolen: 0 }
        );
    }
    let Verdict::Denied { retry_at } = l.try_acquire(now, 0, t, 0).unwrap() else {
        panic!("not denied")
    };
    assert_eq!(retry_at, Instant::from_nanos(1_000));
    assert_eq!(l.poll_at(), Some(retry_at));
    assert_eq!(
        l.try_acquire(retry_at, 0, t, 0).unwrap(),
        Verdict::Granted { stolen: 0 }
    );
    assert_eq!(l.poll_at(), None);
}

#[test]
fn bad_input_gives_errors() {
    let cfg = FairnicConfig::new(1_000, 2, BYTE_COST);
    let mut l = SharedEngineLimiter::new(Instant::ZERO, cfg).unwrap();
    assert_eq!(
        l.add_tenant(Instant::ZERO, 0),
        Err(FairnicError::ZeroBaseRate)
    );
    let t = l.add_tenant(Instant::ZERO, 600).unwrap();
    assert_eq!(
        l.add_tenant(Instant::ZERO, 600),
        Err(FairnicError::Oversubscribed {
            requested: 1_200,
            capacity: 1_000
        })
    );
    assert_eq!(
        l.try_acquire(Instant::ZERO, 2, t, 1),
        Err(FairnicError::UnknownCore(2))
    );
    assert_eq!(
        l.try_acquire(Instant::ZERO, 0, 9, 1),
        Err(FairnicError::UnknownTenant(9))
    );
    let big = l.try_acquire(Instant::ZERO, 0, t, 1_000_000);
    assert!(
        matches!(big, Err(FairnicError::RequestTooLarge { .. })),
        "{big:?}"
    );
    let zero = FairnicConfig { capacity: 0, ..cfg };
    assert_eq!(
        SharedEngineLimiter::new(Instant::ZERO, zero).unwrap_err(),
        FairnicError::ZeroConfig("capacity")
    );
}
