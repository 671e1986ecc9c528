//! The adaptive wait strategy, after §4.1 of Rizzo et al. (ANCS 2016):
//! "the fast peer reacts to an upcoming blocking situation by increasing its
//! processing time" (short spins, or slowing down with a short sleep) instead of
//! blocking, from running estimates of the parameters.
//!
//! A party consults [`AdaptiveWait::decide`] each time it finds no work. The
//! caller feeds the peer's cumulative progress counter with `now`
//! ([`AdaptiveWait::observe`]) and, optionally, its own work
//! ([`AdaptiveWait::record_own_work`]); no clocks are read here.

use super::{classify, ParamError, Params, Regime};
use crate::{Duration, Instant};

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
    /// Busy-poll the queue until work appears or `until`, then ask again.
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

/// Configuration: the side and the model parameters known up front.
#[derive(Copy, Clone, Debug)]
pub struct WaitConfig {
    /// The waiting party's side.
    pub role: Role,
    /// L, k_P, k_C, N_P, N_C, S_P, S_C as measured; W_P and W_C are initial
    /// guesses replaced by running estimates.
    pub params: Params,
    /// Upper bound on one slow-down.
    pub max_sleep: Duration,
}

/// Running estimates and the spin / slow-down / block rule of §4.1.
#[derive(Clone, Debug)]
pub struct AdaptiveWait {
    config: WaitConfig,
    /// Peer's time per item (EWMA, ns); None until the first estimate.
    peer_period: Option<u64>,
    /// Own work per item (EWMA, ns); None until reported.
    own_work: Option<u64>,
    /// Start of the current sampling window: (time, peer counter).
    window: Option<(Instant, u64)>,
    /// Last time the peer's counter was seen to move.
    last_progress: Instant,
}

/// Peer items per rate sample; smaller windows are too noisy to use.
const MIN_SAMPLE_ITEMS: u64 = 4;

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
        })
    }

    /// Observes the peer's cumulative progress (items produced, for a consumer;
    /// items consumed, for a producer) at `now`.
    pub fn observe(&mut self, now: Instant, peer_total: u64) {
        match self.window {
            None => {
                self.window = Some((now, peer_total));
                self.last_progress = now;
            }
            Some((t0, c0)) => {
                if peer_total > c0 {
                    self.last_progress = now;
                    let items = peer_total - c0;
                    if items >= MIN_SAMPLE_ITEMS {
                        let sample = (now - t0).as_nanos() / items;
                        self.peer_period = Some(ewma(self.peer_period, sample));
                        self.window = Some((now, peer_total));
                    }
                } else if peer_total < c0 {
                    // Counter reset by the caller: start over.
                    self.window = Some((now, peer_total));
                }
            }
        }
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

    /// Called when no work is available. `room` is how many more items the peer
    /// can do before it must wait for us (free slots for a consumer, ready items
    /// for a producer).
    pub fn decide(&mut self, now: Instant, room: u32) -> WaitDecision {
        let Some(period) = self.peer_period.filter(|p| *p > 0) else {
            return WaitDecision::Block;
        };
        let p = &self.config.params;
        let (own_wake, peer_notify) = match self.config.role {
            Role::Producer => (p.sp, p.nc),
            Role::Consumer => (p.sc, p.np),
        };
        let own_wake = own_wake as u64;
        let peer_notify = peer_notify as u64;
        // A peer silent for several periods (and longer than a sleep) is idle, not
        // greedy: notifications are the cheap option then (§4, "Maximising efficiency").
        let idle_after = (8 * period).max(self.config.max_sleep.as_nanos());
        if (now - self.last_progress).as_nanos() > idle_after {
            return WaitDecision::Block;
        }
        // Sleep while up to half the room fills, waking (after our own start-up
        // cost S) at least one period before the peer would stall.
        let horizon = (u64::from(room) * period).saturating_sub(own_wake + period);
        let sleep = horizon
            .min(u64::from(room / 2) * period)
            .min(self.config.max_sleep.as_nanos());
        if sleep > 0 && sleep >= 2 * own_wake {
            return WaitDecision::SlowDown {
                until: now + Duration::from_nanos(sleep),
            };
        }
        // Waiting for the next item costs at most one period; blocking costs the
        // peer N per batch. Spinning is no dearer when period <= N (§3.2.1).
        if period <= peer_notify {
            return WaitDecision::Spin {
                until: now + Duration::from_nanos(2 * period),
            };
        }
        WaitDecision::Block
    }

    /// The Table 1 regime that pure notification would give with the current
    /// estimates (for metrics); None until both work costs are estimated.
    pub fn regime(&self) -> Option<Regime> {
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

    fn config(role: Role, l: u32) -> WaitConfig {
        WaitConfig {
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
            max_sleep: Duration::from_micros(500),
        }
    }

    fn feed(w: &mut AdaptiveWait, period: u64, items: u64) -> Instant {
        for i in 0..=items {
            w.observe(Instant::from_nanos(i * period), i);
        }
        Instant::from_nanos(items * period)
    }

    #[test]
    fn blocks_without_estimates() {
        let mut w = AdaptiveWait::new(config(Role::Consumer, 256)).unwrap();
        assert_eq!(w.decide(Instant::from_nanos(10), 256), WaitDecision::Block);
        assert_eq!(w.regime(), None);
    }

    #[test]
    fn slows_down_with_a_long_queue_and_wakes_before_the_peer_stalls() {
        let mut w = AdaptiveWait::new(config(Role::Consumer, 256)).unwrap();
        let now = feed(&mut w, 1500, 64);
        assert_eq!(w.peer_period(), Some(Duration::from_nanos(1500)));
        match w.decide(now, 256) {
            WaitDecision::SlowDown { until } => {
                let slept = (until - now).as_nanos();
                // Half the room (128 * 1.5us = 192us), well before the peer stalls.
                assert_eq!(slept, 192_000);
                assert!(slept + 5000 < 256 * 1500);
            }
            d => panic!("expected slow-down, got {d:?}"),
        }
    }

    #[test]
    fn spins_on_a_short_queue_when_items_come_faster_than_a_notification() {
        let mut w = AdaptiveWait::new(config(Role::Producer, 4)).unwrap();
        let now = feed(&mut w, 1500, 64);
        assert!(matches!(w.decide(now, 4), WaitDecision::Spin { .. }));
        // A slow peer is not worth spinning for.
        let mut slow = AdaptiveWait::new(config(Role::Producer, 4)).unwrap();
        let now = feed(&mut slow, 3000, 64);
        assert_eq!(slow.decide(now, 4), WaitDecision::Block);
    }

    #[test]
    fn blocks_when_the_peer_goes_idle() {
        let mut w = AdaptiveWait::new(config(Role::Consumer, 256)).unwrap();
        let now = feed(&mut w, 1500, 64);
        let later = now + Duration::from_millis(5);
        w.observe(later, 64);
        assert_eq!(w.decide(later, 256), WaitDecision::Block);
    }

    #[test]
    fn regime_follows_the_estimates() {
        let mut w = AdaptiveWait::new(config(Role::Consumer, 256)).unwrap();
        feed(&mut w, 1500, 64);
        w.record_own_work(10, Duration::from_nanos(11_000));
        assert_eq!(w.regime(), Some(Regime::FC));
        let mut p = AdaptiveWait::new(config(Role::Producer, 256)).unwrap();
        feed(&mut p, 1500, 64);
        p.record_own_work(10, Duration::from_nanos(11_000));
        assert_eq!(p.regime(), Some(Regime::FP));
    }
}
