//! The adaptive wait of one party of the queue: what to do when it finds no work.
//!
//! The caller feeds the peer's cumulative progress counter with `now`
//! ([`AdaptiveWait::observe`]) and, optionally, its own work
//! ([`AdaptiveWait::record_own_work`]), and asks [`AdaptiveWait::decide`] each time it finds
//! no work. No clock is read here.
//!
//! With `p` the peer's time per item (a running estimate) and `s` the silence since the
//! peer last made progress, N the peer's cost to notify us and S our cost to start after a
//! notification, the rule is:
//!
//! 1. no estimate yet, or a silent peer (`s > max(8p, max_sleep)`): **Block**. An idle
//!    peer makes notification the cheap option (§4, "Maximising efficiency").
//! 2. **SlowDown** (pause without asking for a notification) when the queue has room for
//!    a long enough pause: the fast peer "reacts to an upcoming blocking situation by
//!    increasing its processing time" (§4.1). Off when `max_sleep` is zero.
//! 3. **Spin**, at most `max_spin`, when `max(p, s) < N + S`: the next item is expected
//!    sooner than a notification and a wake-up would cost, so polling is the cheaper wait
//!    (§3.2.1: polling pays while its extra cost is below the notification's N + S).
//! 4. otherwise **Block**.

use super::{classify, ParamError, Params, Regime};
use crate::{Duration, Instant};
use serde::Serialize;

/// Which side of the queue the waiting party is on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Waits for free slots; the peer is the consumer.
    Producer,
    /// Waits for ready items; the peer is the producer.
    Consumer,
}

/// What a party that found no work should do next.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WaitDecision {
    /// Busy-poll the queue until work appears or `until`, then block.
    Spin {
        /// Deadline of the spin.
        until: Instant,
    },
    /// Slow down: pause without burning CPU and without asking the peer for a
    /// notification (timed sleep or housekeeping) until `until`, then re-check.
    SlowDown {
        /// End of the pause.
        until: Instant,
    },
    /// Block and let the peer notify (the paper's notification regimes).
    Block,
}

/// Configuration: the side, the model parameters known up front and the bounds.
#[derive(Copy, Clone, Debug)]
pub struct WaitConfig {
    /// The waiting party's side.
    pub role: Role,
    /// L, k_P, k_C, N_P, N_C, S_P, S_C as measured; W_P and W_C are initial
    /// guesses replaced by running estimates.
    pub params: Params,
    /// Longest single spin; zero never spins.
    pub max_spin: Duration,
    /// Longest single slow-down; zero never slows down (a party that must react within
    /// microseconds where a timed sleep overshoots by much more).
    pub max_sleep: Duration,
}

/// How many times each decision was taken (for metrics).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WaitCounts {
    /// [`WaitDecision::Spin`].
    pub spins: u64,
    /// [`WaitDecision::SlowDown`].
    pub slow_downs: u64,
    /// [`WaitDecision::Block`].
    pub blocks: u64,
}

/// Running estimates and the rule above.
#[derive(Clone, Debug)]
pub struct AdaptiveWait {
    config: WaitConfig,
    /// Peer's time per item (ns); None until the first sample.
    peer_period: Option<u64>,
    /// Own work per item (EWMA, ns); None until reported.
    own_work: Option<u64>,
    /// Start of the current sampling window: (time, peer counter).
    window: Option<(Instant, u64)>,
    /// Last time the peer's counter was seen to move.
    last_progress: Instant,
    /// Whether the last decision was to spin.
    spinning: bool,
    counts: WaitCounts,
}

/// Peer items per rate sample; smaller windows are too noisy to use.
const MIN_SAMPLE_ITEMS: u64 = 4;

/// A sample this many times above or below the estimate is a change of rate (a burst
/// after a quiet spell, a producer that slowed down), not noise: the estimate jumps to it
/// instead of averaging. The mean of 4 exponential gaps falls outside [p/8, 8p] with
/// probability ~0.2%.
const JUMP: u64 = 8;

/// EWMA weight 1/8 in integer arithmetic.
fn ewma(old: Option<u64>, sample: u64) -> u64 {
    match old {
        None => sample,
        Some(o) => (o * 7 + sample) / 8,
    }
}

impl AdaptiveWait {
    /// Creates the strategy; rejects invalid model parameters.
    pub fn new(config: WaitConfig) -> Result<Self, ParamError> {
        config.params.validate()?;
        Ok(AdaptiveWait {
            config,
            peer_period: None,
            own_work: None,
            window: None,
            last_progress: Instant::ZERO,
            spinning: false,
            counts: WaitCounts::default(),
        })
    }

    /// Observes the peer's cumulative progress (items produced, for a consumer;
    /// items consumed, for a producer) at `now`.
    pub fn observe(&mut self, now: Instant, peer_total: u64) {
        let Some((t0, c0)) = self.window else {
            self.window = Some((now, peer_total));
            self.last_progress = now;
            return;
        };
        if peer_total < c0 {
            // Counter reset by the caller: start over.
            self.window = Some((now, peer_total));
            return;
        }
        if peer_total == c0 {
            return;
        }
        self.last_progress = now;
        let items = peer_total - c0;
        // Items read at the window's own instant (several reads in one pass) carry no
        // time: keep counting until the clock has moved.
        if items < MIN_SAMPLE_ITEMS || now <= t0 {
            return;
        }
        let sample = ((now - t0).as_nanos() / items).max(1);
        self.peer_period = Some(match self.peer_period {
            Some(p) if sample < p.saturating_mul(JUMP) && sample.saturating_mul(JUMP) > p => {
                ewma(Some(p), sample)
            }
            _ => sample,
        });
        self.window = Some((now, peer_total));
    }

    /// Reports `items` of own work that took `busy` (feeds [`Self::regime`]).
    pub fn record_own_work(&mut self, items: u32, busy: Duration) {
        if items > 0 {
            self.own_work = Some(ewma(self.own_work, busy.as_nanos() / u64::from(items)));
        }
    }

    /// Current estimate of the peer's time per item.
    pub fn peer_period(&self) -> Option<Duration> {
        self.peer_period.map(Duration::from_nanos)
    }

    /// How many times each decision was taken so far.
    pub fn counts(&self) -> WaitCounts {
        self.counts
    }

    /// Called when no work is available. `room` is how many more items the peer
    /// can do before it must wait for us (free slots for a consumer, ready items
    /// for a producer).
    pub fn decide(&mut self, now: Instant, room: u32) -> WaitDecision {
        let decision = self.rule(now, room);
        match decision {
            WaitDecision::Spin { .. } => self.counts.spins += 1,
            WaitDecision::SlowDown { .. } => self.counts.slow_downs += 1,
            WaitDecision::Block => self.counts.blocks += 1,
        }
        self.spinning = matches!(decision, WaitDecision::Spin { .. });
        decision
    }

    fn rule(&self, now: Instant, room: u32) -> WaitDecision {
        let Some(period) = self.peer_period else {
            return WaitDecision::Block;
        };
        let p = &self.config.params;
        let (own_wake, peer_notify) = match self.config.role {
            Role::Producer => (p.sp, p.nc),
            Role::Consumer => (p.sc, p.np),
        };
        let own_wake = own_wake as u64;
        let peer_notify = peer_notify as u64;
        let max_sleep = self.config.max_sleep.as_nanos();
        // 1. A peer silent for several periods is idle, not greedy (§4).
        let silent = (now - self.last_progress).as_nanos();
        if silent > (8 * period).max(max_sleep) {
            return WaitDecision::Block;
        }
        // 2. Sleep while up to half the room fills, waking (after our own start-up
        // cost S) at least one period before the peer would stall (§4.1).
        let horizon = (u64::from(room) * period).saturating_sub(own_wake + period);
        let sleep = horizon.min(u64::from(room / 2) * period).min(max_sleep);
        if sleep > 0 && sleep >= 2 * own_wake {
            return WaitDecision::SlowDown {
                until: now + Duration::from_nanos(sleep),
            };
        }
        // 3. The next item is due within max(p, s); blocking costs the peer's N plus our
        // S (§3.2.1). A silence longer than p means the estimate is stale: trust it.
        if self.config.max_spin > Duration::ZERO && period.max(silent) < peer_notify + own_wake {
            return WaitDecision::Spin {
                until: now + self.config.max_spin,
            };
        }
        WaitDecision::Block
    }

    /// The regime the queue is in as this party sees it: GP while its last decision was
    /// to spin (§2.1.1), otherwise the Table 1 regime notification gives with the current
    /// estimates; None until both work costs are estimated.
    pub fn regime(&self) -> Option<Regime> {
        if self.spinning {
            return Some(Regime::GP);
        }
        let own = self.own_work? as f64;
        let peer = self.peer_period? as f64;
        let mut est = self.config.params;
        match self.config.role {
            Role::Producer => (est.wp, est.wc) = (own.max(1.0), peer.max(1.0)),
            Role::Consumer => (est.wp, est.wc) = (peer.max(1.0), own.max(1.0)),
        }
        classify(&est).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    /// The switch's receive ring: L = 2048, N_P = 3 us, S_C = 3.5 us (N + S = 6.5 us),
    /// spin at most 50 us, never sleep.
    fn ring() -> AdaptiveWait {
        AdaptiveWait::new(WaitConfig {
            role: Role::Consumer,
            params: Params::measured_ring(2048),
            max_spin: Duration::from_micros(50),
            max_sleep: Duration::ZERO,
        })
        .unwrap()
    }

    /// A model party with N = 2 us, S = 5 us that may sleep up to 500 us.
    fn party(role: Role, l: u32) -> AdaptiveWait {
        AdaptiveWait::new(WaitConfig {
            role,
            params: Params {
                l,
                wp: 1000.0,
                wc: 1000.0,
                kp: 1,
                kc: 1,
                np: 2000.0,
                nc: 2000.0,
                sp: 5000.0,
                sc: 5000.0,
            },
            max_spin: Duration::from_micros(50),
            max_sleep: Duration::from_micros(500),
        })
        .unwrap()
    }

    /// Items 0..=n from a producer with the given period, starting at `start`; returns
    /// the time of the last one.
    fn feed(w: &mut AdaptiveWait, start: u64, period: u64, first: u64, n: u64) -> Instant {
        for i in 0..=n {
            w.observe(Instant::from_nanos(start + i * period), first + i);
        }
        Instant::from_nanos(start + n * period)
    }

    fn at(t: Instant, ns: u64) -> Instant {
        t + Duration::from_nanos(ns)
    }

    #[test]
    fn blocks_without_an_estimate() {
        let mut w = ring();
        assert_eq!(w.decide(Instant::from_nanos(10), 2048), WaitDecision::Block);
        w.observe(Instant::from_nanos(20), 1);
        assert_eq!(w.decide(Instant::from_nanos(30), 2048), WaitDecision::Block);
        assert_eq!(w.regime(), None);
    }

    #[test]
    fn a_2us_producer_makes_the_consumer_spin_until_the_silence_reaches_n_plus_s() {
        let mut w = ring();
        let last = feed(&mut w, 0, 2 * US, 0, 64);
        assert_eq!(w.peer_period(), Some(Duration::from_micros(2)));
        assert_eq!(
            w.decide(last, 2048),
            WaitDecision::Spin {
                until: at(last, 50 * US)
            }
        );
        assert_eq!(w.regime(), Some(Regime::GP));
        let late = at(last, 6_499);
        assert_eq!(
            w.decide(late, 2048),
            WaitDecision::Spin {
                until: at(late, 50 * US)
            }
        );
        // Silent for N + S: the frame is not coming soon, blocking is the cheaper wait.
        assert_eq!(w.decide(at(last, 6_500), 2048), WaitDecision::Block);
        assert_eq!(
            w.counts(),
            WaitCounts {
                spins: 2,
                slow_downs: 0,
                blocks: 1
            }
        );
    }

    #[test]
    fn spins_only_below_n_plus_s_and_within_the_spin_budget() {
        let mut fast = ring();
        let last = feed(&mut fast, 0, 6_499, 0, 64);
        assert!(matches!(fast.decide(last, 2048), WaitDecision::Spin { .. }));
        let mut slow = ring();
        let last = feed(&mut slow, 0, 6_500, 0, 64);
        assert_eq!(slow.decide(last, 2048), WaitDecision::Block);
        let mut no_budget = AdaptiveWait::new(WaitConfig {
            max_spin: Duration::ZERO,
            ..ring().config
        })
        .unwrap();
        let last = feed(&mut no_budget, 0, 2 * US, 0, 64);
        assert_eq!(no_budget.decide(last, 2048), WaitDecision::Block);
    }

    #[test]
    fn a_1ms_producer_or_an_idle_one_makes_the_consumer_block() {
        let mut w = ring();
        let last = feed(&mut w, 0, MS, 0, 64);
        assert_eq!(w.peer_period(), Some(Duration::from_millis(1)));
        assert_eq!(w.decide(last, 2048), WaitDecision::Block);
        assert_eq!(w.decide(at(last, 3 * US), 2048), WaitDecision::Block);
        // A fast producer that went quiet: blocks from the first decision of the silence
        // on, however many follow (an idle switch wakes every few ms).
        let mut idle = ring();
        let last = feed(&mut idle, 0, 2 * US, 0, 64);
        for k in 1..=1000 {
            assert_eq!(idle.decide(at(last, k * 5 * MS), 2048), WaitDecision::Block);
        }
        assert_eq!(
            idle.counts(),
            WaitCounts {
                spins: 0,
                slow_downs: 0,
                blocks: 1000
            }
        );
    }

    #[test]
    fn a_burst_after_idle_spins_from_its_eighth_frame() {
        let mut w = ring();
        // 1 ms producer: windows close at items 4, 8, 12, 16 (last at 16 ms).
        let last = feed(&mut w, 0, MS, 0, 16);
        assert_eq!(w.decide(last, 2048), WaitDecision::Block);
        assert_eq!(w.decide(at(last, 100 * MS), 2048), WaitDecision::Block);
        // Burst at 2 us from 116 ms: the window of frames 1..=4 spans the quiet spell
        // (25 ms per item: a change of rate, the estimate jumps there); the next one,
        // frames 5..=8, measures 2 us and the estimate jumps down.
        let start = 116 * MS;
        let mut first_spin = None;
        for j in 1..=16u64 {
            let t = Instant::from_nanos(start + (j - 1) * 2 * US);
            w.observe(t, 16 + j);
            if matches!(w.decide(t, 2048), WaitDecision::Spin { .. }) && first_spin.is_none() {
                first_spin = Some(j);
            }
        }
        assert_eq!(first_spin, Some(8));
        assert_eq!(w.peer_period(), Some(Duration::from_micros(2)));
    }

    #[test]
    fn estimate_averages_noise_waits_for_time_to_pass_and_jumps_on_a_change_of_rate() {
        let mut w = ring();
        let last = feed(&mut w, 0, 2 * US, 0, 64);
        // A slow window within 8x of the estimate is averaged (weight 1/8).
        w.observe(at(last, 40 * US), 68);
        assert_eq!(w.peer_period(), Some(Duration::from_nanos(3_000)));
        // A second read at the same instant carries no time: its items wait for the
        // next sample (132 items in 264 us: 2 us).
        w.observe(at(last, 40 * US), 200);
        assert_eq!(w.peer_period(), Some(Duration::from_nanos(3_000)));
        w.observe(at(last, 304 * US), 200);
        assert_eq!(w.peer_period(), Some(Duration::from_nanos(2_875)));
        // 8x slower, then 8x faster: the estimate follows at once.
        w.observe(at(last, 4_304 * US), 204);
        assert_eq!(w.peer_period(), Some(Duration::from_millis(1)));
        w.observe(at(last, 4_312 * US), 208);
        assert_eq!(w.peer_period(), Some(Duration::from_micros(2)));
    }

    #[test]
    fn slows_down_with_a_long_queue_and_wakes_before_the_peer_stalls() {
        let mut w = party(Role::Consumer, 256);
        let now = feed(&mut w, 0, 1500, 0, 64);
        match w.decide(now, 256) {
            WaitDecision::SlowDown { until } => {
                let slept = (until - now).as_nanos();
                // Half the room (128 * 1.5us = 192us), well before the peer stalls.
                assert_eq!(slept, 192_000);
                assert!(slept + 5000 < 256 * 1500);
            }
            d => panic!("expected slow-down, got {d:?}"),
        }
        // Without slow-downs the same consumer spins: 1.5 us < N + S = 7 us.
        let mut eager = AdaptiveWait::new(WaitConfig {
            max_sleep: Duration::ZERO,
            ..w.config
        })
        .unwrap();
        let now = feed(&mut eager, 0, 1500, 0, 64);
        assert!(matches!(eager.decide(now, 256), WaitDecision::Spin { .. }));
    }

    #[test]
    fn a_producer_with_no_room_to_slow_down_spins_for_a_consumer_faster_than_n_plus_s() {
        // One ready item left: no pause fits, and blocking costs N_C + S_P = 7 us.
        let mut w = party(Role::Producer, 4);
        let now = feed(&mut w, 0, 6_999, 0, 64);
        assert!(matches!(w.decide(now, 1), WaitDecision::Spin { .. }));
        let mut slow = party(Role::Producer, 4);
        let now = feed(&mut slow, 0, 7_000, 0, 64);
        assert_eq!(slow.decide(now, 1), WaitDecision::Block);
    }

    #[test]
    fn regime_follows_the_estimates_and_the_last_decision() {
        let mut c = party(Role::Consumer, 256);
        feed(&mut c, 0, 1500, 0, 64);
        c.record_own_work(10, Duration::from_nanos(11_000));
        assert_eq!(c.regime(), Some(Regime::FC));
        let mut p = party(Role::Producer, 256);
        feed(&mut p, 0, 1500, 0, 64);
        p.record_own_work(10, Duration::from_nanos(11_000));
        assert_eq!(p.regime(), Some(Regime::FP));
        let mut r = ring();
        let last_r = feed(&mut r, 0, 2 * US, 0, 64);
        r.record_own_work(1, Duration::from_nanos(1_000));
        assert!(matches!(r.decide(last_r, 2048), WaitDecision::Spin { .. }));
        assert_eq!(r.regime(), Some(Regime::GP));
        assert_eq!(r.decide(at(last_r, 10 * MS), 2048), WaitDecision::Block);
        assert_eq!(r.regime(), Some(Regime::FC));
    }
}
