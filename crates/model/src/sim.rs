//! Event-driven simulation of the producer/consumer pair of §2 on a virtual clock
//! (the simulator of §3.3), with constant or random costs and three wait
//! strategies: notification, polling (GP) and the adaptive control of §4.1.
//!
//! The semantics are those documented in [`crate::model`].

use crate::model::{ParamError, Params};
use picnic_core::notify::{AdaptiveWait, Role, WaitConfig, WaitDecision};
use picnic_core::{Duration, Instant};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// How each cost (W, N, S) is drawn every time it is incurred.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum CostDist {
    /// Always the mean.
    Constant,
    /// Uniform in `mean * (1 - spread) ..= mean * (1 + spread)`, spread in 0..=1.
    Uniform {
        /// Relative half-width.
        spread: f64,
    },
    /// Exponential with the given mean.
    Exponential,
}

/// What a party does when it cannot proceed.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Strategy {
    /// Block and wait for a notification (regimes FC..SS).
    Notify,
    /// Spin on the queue (regime GP).
    Poll,
    /// Consult an [`AdaptiveWait`] (§4.1) with the given bound on one slow-down.
    Adaptive {
        /// Longest single spin or slow-down.
        max_sleep: Duration,
    },
}

/// One simulation run.
#[derive(Copy, Clone, Debug)]
pub struct SimConfig {
    /// Model parameters (means, in ns).
    pub params: Params,
    /// Cost distribution.
    pub dist: CostDist,
    /// Wait strategy of both parties.
    pub strategy: Strategy,
    /// RNG seed (runs are deterministic).
    pub seed: u64,
    /// Messages consumed before measuring.
    pub warmup: u64,
    /// Messages measured.
    pub messages: u64,
}

/// Steady-state measurements of a run.
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct SimResult {
    /// Average time per consumed message (ns).
    pub t_per_msg: f64,
    /// Work of P and C (including spinning) per message (ns).
    pub e_per_msg: f64,
    /// Times P blocked waiting for a notification during the measurement.
    pub producer_blocks: u64,
    /// Times C blocked waiting for a notification during the measurement.
    pub consumer_blocks: u64,
}

/// Why a simulation could not run.
#[derive(Clone, Debug, PartialEq)]
pub enum SimError {
    /// Invalid model parameters.
    Params(ParamError),
    /// `messages` must be positive and the spread within 0..=1.
    BadConfig,
    /// No party could make progress (a bug in a wait strategy).
    Stalled,
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Params(e) => write!(f, "{e}"),
            SimError::BadConfig => f.write_str("messages must be > 0 and spread in 0..=1"),
            SimError::Stalled => f.write_str("simulation stalled"),
        }
    }
}

impl std::error::Error for SimError {}

#[derive(Copy, Clone, Debug, PartialEq)]
enum Activity {
    Work,
    Notify,
    Wake,
    Spin,
    SlowDown,
    Blocked,
}

struct Party {
    activity: Activity,
    /// End of a timed activity (None while blocked or polling without deadline).
    until: Option<Instant>,
    cpu: u64,
    since: Instant,
    wake_pending: bool,
    blocks: u64,
    wait: Option<AdaptiveWait>,
}

impl Party {
    fn costed(&self) -> bool {
        !matches!(self.activity, Activity::Blocked | Activity::SlowDown)
    }
    fn cpu_at(&self, now: Instant) -> u64 {
        self.cpu
            + if self.costed() {
                (now - self.since).as_nanos()
            } else {
                0
            }
    }
    fn set(&mut self, now: Instant, activity: Activity, until: Option<Instant>) {
        self.cpu = self.cpu_at(now);
        self.since = now;
        self.activity = activity;
        self.until = until;
    }
}

struct Sim {
    cfg: SimConfig,
    rng: SmallRng,
    ready: u32,
    free: u32,
    produced: u64,
    consumed: u64,
    parties: [Party; 2],
}

const P: usize = 0;
const C: usize = 1;

impl Sim {
    fn draw(&mut self, mean: f64) -> Duration {
        let v = match self.cfg.dist {
            CostDist::Constant => mean,
            CostDist::Uniform { spread } => {
                mean * (1.0 + spread * (2.0 * self.rng.gen::<f64>() - 1.0))
            }
            CostDist::Exponential => -mean * (1.0 - self.rng.gen::<f64>()).ln(),
        };
        Duration::from_nanos(v.round().max(0.0) as u64)
    }

    /// Means of (W, N, S) for party `i`.
    fn costs(&self, i: usize) -> (f64, f64, f64) {
        let p = &self.cfg.params;
        if i == P {
            (p.wp, p.np, p.sp)
        } else {
            (p.wc, p.nc, p.sc)
        }
    }

    fn finish(&mut self, i: usize, now: Instant) {
        match self.parties[i].activity {
            Activity::Work if i == P => {
                self.ready += 1;
                self.produced += 1;
            }
            Activity::Work => {
                self.free += 1;
                self.consumed += 1;
            }
            Activity::Notify => {
                let s = self.costs(1 - i).2;
                let wake = self.draw(s);
                let peer = &mut self.parties[1 - i];
                peer.wake_pending = false;
                peer.set(now, Activity::Wake, Some(now + wake));
            }
            _ => {}
        }
        if let Some(w) = self.parties[i].wait.as_mut() {
            if self.parties[i].activity == Activity::Work {
                let busy = now - self.parties[i].since;
                w.record_own_work(1, busy);
            }
        }
        self.parties[i].until = None;
    }

    /// Next step of party `i` after its timed activity ended (or while spinning).
    fn advance(&mut self, i: usize, now: Instant, just_worked: bool) {
        let (w, n, _) = self.costs(i);
        let k = if i == P {
            self.cfg.params.kp
        } else {
            self.cfg.params.kc
        };
        let peer_waits =
            self.parties[1 - i].activity == Activity::Blocked && !self.parties[1 - i].wake_pending;
        let peer_can_go = if i == P {
            self.ready >= k
        } else {
            self.free >= k
        };
        if just_worked && peer_waits && peer_can_go {
            self.parties[1 - i].wake_pending = true;
            let d = self.draw(n);
            self.parties[i].set(now, Activity::Notify, Some(now + d));
            return;
        }
        let available = if i == P { self.free } else { self.ready };
        if available > 0 {
            if i == P {
                self.free -= 1;
            } else {
                self.ready -= 1;
            }
            let d = self.draw(w);
            self.parties[i].set(now, Activity::Work, Some(now + d));
            return;
        }
        if self.parties[i].activity == Activity::Spin
            && self.parties[i].until.is_some_and(|u| u > now)
        {
            return; // keep spinning until the deadline
        }
        let (peer_total, room) = if i == P {
            (self.consumed, self.ready)
        } else {
            (self.produced, self.free)
        };
        let decision = match self.cfg.strategy {
            Strategy::Notify => WaitDecision::Block,
            Strategy::Poll => WaitDecision::Spin {
                until: Instant::MAX,
            },
            Strategy::Adaptive { .. } => {
                let wait = self.parties[i]
                    .wait
                    .as_mut()
                    .expect("adaptive parties have a wait strategy");
                wait.observe(now, peer_total);
                wait.decide(now, room)
            }
        };
        let party = &mut self.parties[i];
        match decision {
            WaitDecision::Spin { until } => {
                let deadline = (until != Instant::MAX).then_some(until);
                if party.activity == Activity::Spin {
                    party.until = deadline;
                } else {
                    party.set(now, Activity::Spin, deadline);
                }
            }
            WaitDecision::SlowDown { until } => party.set(now, Activity::SlowDown, Some(until)),
            WaitDecision::Block => {
                party.blocks += 1;
                party.set(now, Activity::Blocked, None);
            }
        }
    }

    fn total_cpu(&self, now: Instant) -> u64 {
        self.parties[P].cpu_at(now) + self.parties[C].cpu_at(now)
    }
}

/// Runs one simulation to steady state and measures T and E.
pub fn simulate(cfg: &SimConfig) -> Result<SimResult, SimError> {
    cfg.params.validate().map_err(SimError::Params)?;
    if cfg.messages == 0 {
        return Err(SimError::BadConfig);
    }
    if let CostDist::Uniform { spread } = cfg.dist {
        if !(0.0..=1.0).contains(&spread) {
            return Err(SimError::BadConfig);
        }
    }
    let make_party = |role| -> Result<Party, SimError> {
        let wait = match cfg.strategy {
            Strategy::Adaptive { max_sleep } => Some(
                AdaptiveWait::new(WaitConfig {
                    role,
                    params: cfg.params,
                    max_spin: max_sleep,
                    max_sleep,
                })
                .map_err(SimError::Params)?,
            ),
            _ => None,
        };
        Ok(Party {
            activity: Activity::Wake,
            until: Some(Instant::ZERO),
            cpu: 0,
            since: Instant::ZERO,
            wake_pending: false,
            blocks: 0,
            wait,
        })
    };
    let mut sim = Sim {
        cfg: *cfg,
        rng: SmallRng::seed_from_u64(cfg.seed),
        ready: 0,
        free: cfg.params.l,
        produced: 0,
        consumed: 0,
        parties: [make_party(Role::Producer)?, make_party(Role::Consumer)?],
    };
    let end = cfg.warmup + cfg.messages;
    let mut start: Option<(Instant, u64, u64, u64)> = None;
    loop {
        let Some(now) = sim.parties.iter().filter_map(|p| p.until).min() else {
            return Err(SimError::Stalled);
        };
        let mut worked = [false; 2];
        let mut due = [false; 2];
        for i in [P, C] {
            if sim.parties[i].until == Some(now) {
                worked[i] = sim.parties[i].activity == Activity::Work;
                due[i] = true;
                sim.finish(i, now);
            }
        }
        for i in [P, C] {
            if due[i] || sim.parties[i].activity == Activity::Spin {
                sim.advance(i, now, worked[i]);
            }
        }
        if start.is_none() && sim.consumed >= cfg.warmup {
            let [p, c] = &sim.parties;
            start = Some((now, sim.total_cpu(now), p.blocks, c.blocks));
        }
        if sim.consumed >= end {
            let (t0, cpu0, pb0, cb0) = start.expect("warm-up ends before the measurement");
            let n = (sim.consumed - cfg.warmup).max(1) as f64;
            return Ok(SimResult {
                t_per_msg: (now - t0).as_nanos() as f64 / n,
                e_per_msg: (sim.total_cpu(now) - cpu0) as f64 / n,
                producer_blocks: sim.parties[P].blocks - pb0,
                consumer_blocks: sim.parties[C].blocks - cb0,
            });
        }
    }
}
