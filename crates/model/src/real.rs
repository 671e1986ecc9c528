//! The synthetic system of §3.3 on this machine: a producer and a consumer thread
//! share a ring in memory, spin `W_P` / `W_C` per message and notify each other
//! through eventfds with thresholds `k_P` / `k_C`. Also measures N (cost of an
//! eventfd write that wakes a blocked thread) and S (wake-up latency after it).
//!
//! Every loop is bounded by a message count and a wall-clock limit.

use crate::model::Params;
use anyhow::{bail, Context};
use picnic_core::notify::{AdaptiveWait, Role, WaitConfig, WaitDecision};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier};
use std::time::Instant as WallInstant;

/// What a thread does when it cannot proceed.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum RealStrategy {
    /// Block on an eventfd until the peer notifies.
    Notify,
    /// Spin on the ring.
    Poll,
    /// Consult an [`AdaptiveWait`] built from these measured parameters.
    Adaptive {
        /// L, k, N and S as measured (W are initial guesses).
        params: Params,
        /// Longest single spin or slow-down.
        max_sleep: picnic_core::Duration,
    },
}

/// One run of the prototype.
#[derive(Copy, Clone, Debug)]
pub struct RealConfig {
    /// Queue length L.
    pub l: u32,
    /// Producer spin work per message (ns).
    pub wp: u64,
    /// Consumer spin work per message (ns).
    pub wc: u64,
    /// Producer notification threshold k_P.
    pub kp: u32,
    /// Consumer notification threshold k_C.
    pub kc: u32,
    /// Wait strategy of both threads.
    pub strategy: RealStrategy,
    /// Messages to send (upper bound).
    pub messages: u64,
    /// Wall-clock bound of the run.
    pub time_limit: std::time::Duration,
}

/// Measured time and CPU cost per message.
#[derive(Copy, Clone, Debug, Serialize)]
pub struct RealResult {
    /// Messages delivered.
    pub messages: u64,
    /// Wall time per message (ns).
    pub t_per_msg: f64,
    /// Producer plus consumer thread CPU time per message (ns).
    pub e_per_msg: f64,
    /// Notifications sent by the producer.
    pub producer_notifies: u64,
    /// Notifications sent by the consumer.
    pub consumer_notifies: u64,
    /// Mean N_P seen in the run (ns; 0 without notifications).
    pub np: f64,
    /// Mean N_C seen in the run (ns).
    pub nc: f64,
    /// Mean S_P seen in the run (ns).
    pub sp: f64,
    /// Mean S_C seen in the run (ns).
    pub sc: f64,
}

/// Notification cost and wake-up latency measured on this machine (ns).
#[derive(Copy, Clone, Debug, Serialize)]
pub struct SyncCosts {
    /// Median cost of an eventfd write that wakes a blocked thread (N).
    pub notify: f64,
    /// Median start-up cost of the woken thread (S): the larger of its delay
    /// after the end of that write and the CPU time its blocking read took.
    pub wake: f64,
    /// Median delay from the start of the write to the woken thread running.
    pub wake_latency: f64,
    /// Samples taken.
    pub samples: usize,
}

/// An eventfd owned by this process.
struct EventFd(libc::c_int);

impl EventFd {
    fn new() -> anyhow::Result<Self> {
        // SAFETY: plain syscall, the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        Ok(EventFd(fd))
    }
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own fd.
        unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }
    /// Blocks until signalled (returns early on signals; callers re-check state).
    fn wait(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own fd.
        unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: closes the fd we opened.
        unsafe { libc::close(self.0) };
    }
}

/// CPU time of the calling thread (ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Asks for precise timed sleeps (the default 50us timer slack would swamp them).
fn precise_sleeps() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

/// Busy work standing in for message processing (§3.3: "configurable amount of spinning").
fn spin_work(ns: u64) {
    let start = WallInstant::now();
    while (start.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

/// Measures N and S with `rounds` wake-ups of a thread blocked on an eventfd.
pub fn measure_sync_costs(rounds: usize) -> anyhow::Result<SyncCosts> {
    if rounds == 0 {
        bail!("rounds must be positive");
    }
    let to_b = Arc::new(EventFd::new()?);
    let to_a = Arc::new(EventFd::new()?);
    let woke_at = Arc::new(AtomicU64::new(0));
    let read_cpu = Arc::new(AtomicU64::new(0));
    let epoch = WallInstant::now();
    let sleeper = {
        let (to_b, to_a, woke_at, read_cpu) = (
            to_b.clone(),
            to_a.clone(),
            woke_at.clone(),
            read_cpu.clone(),
        );
        std::thread::spawn(move || {
            for _ in 0..rounds {
                let cpu0 = thread_cpu_ns();
                to_b.wait();
                woke_at.store(epoch.elapsed().as_nanos() as u64, SeqCst);
                read_cpu.store(thread_cpu_ns() - cpu0, SeqCst);
                to_a.signal();
            }
        })
    };
    let mut notify = Vec::with_capacity(rounds);
    let mut wake = Vec::with_capacity(rounds);
    let mut latency = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        // Give the sleeper time to block in read().
        std::thread::sleep(std::time::Duration::from_micros(100));
        let t0 = epoch.elapsed().as_nanos() as u64;
        to_b.signal();
        let t1 = epoch.elapsed().as_nanos() as u64;
        to_a.wait();
        notify.push((t1 - t0) as f64);
        let woke = woke_at.load(SeqCst);
        wake.push(woke.saturating_sub(t1).max(read_cpu.load(SeqCst)) as f64);
        latency.push(woke.saturating_sub(t0) as f64);
    }
    sleeper
        .join()
        .map_err(|_| anyhow::anyhow!("sleeper thread panicked"))?;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(SyncCosts {
        notify: median(&mut notify),
        wake: median(&mut wake),
        wake_latency: median(&mut latency),
        samples: rounds,
    })
}

/// Nanoseconds since the run's common epoch.
fn since(epoch: WallInstant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Running sums of in-run notification costs and start-up delays.
#[derive(Default, Clone, Copy)]
struct SyncSums {
    notify_ns: u64,
    notifies: u64,
    wake_ns: u64,
    wakes: u64,
}

/// One direction of notification: the waiter's flag, its eventfd, and the time
/// the last signal to it ended (to measure S in the run).
struct Doorbell {
    sleeping: AtomicBool,
    fd: EventFd,
    signalled_at: AtomicU64,
}

impl Doorbell {
    fn new() -> anyhow::Result<Self> {
        Ok(Doorbell {
            sleeping: AtomicBool::new(false),
            fd: EventFd::new()?,
            signalled_at: AtomicU64::new(0),
        })
    }

    /// Rings if the waiter sleeps; the write's duration is a sample of N.
    fn ring(&self, epoch: WallInstant, sums: &mut SyncSums) {
        if self.sleeping.load(SeqCst) && self.sleeping.swap(false, SeqCst) {
            let t0 = since(epoch);
            self.fd.signal();
            let t1 = since(epoch);
            self.signalled_at.store(t1, SeqCst);
            sums.notify_ns += t1 - t0;
            sums.notifies += 1;
        }
    }

    /// Blocks after announcing it, unless `ready()` already holds (the SeqCst
    /// flag/re-check pair means no wake-up is lost). A sample of S is the larger
    /// of the delay after the signal's end and the CPU time of the blocking read.
    fn block(&self, epoch: WallInstant, sums: &mut SyncSums, ready: impl Fn() -> bool) {
        self.sleeping.store(true, SeqCst);
        if ready() {
            if !self.sleeping.swap(false, SeqCst) {
                self.fd.wait(); // the peer already signalled: consume it
            }
            return;
        }
        let cpu0 = thread_cpu_ns();
        self.fd.wait();
        let woke = since(epoch);
        let delay = woke.saturating_sub(self.signalled_at.load(SeqCst));
        sums.wake_ns += delay.max(thread_cpu_ns() - cpu0);
        sums.wakes += 1;
    }
}

/// One thread's waiting logic.
struct Waiter {
    strategy: RealStrategy,
    adaptive: Option<AdaptiveWait>,
    sums: SyncSums,
}

impl Waiter {
    fn new(strategy: RealStrategy, role: Role) -> anyhow::Result<Self> {
        let adaptive = match strategy {
            RealStrategy::Adaptive { params, max_sleep } => Some(
                AdaptiveWait::new(WaitConfig {
                    role,
                    params,
                    max_spin: max_sleep,
                    max_sleep,
                })
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            ),
            _ => None,
        };
        Ok(Waiter {
            strategy,
            adaptive,
            sums: SyncSums::default(),
        })
    }

    /// Returns once `ready()` holds. `peer_total` is the peer's progress counter,
    /// `room` how many items the peer can still do before it waits for us.
    fn wait(
        &mut self,
        epoch: WallInstant,
        bell: &Doorbell,
        peer_total: impl Fn() -> u64,
        room: impl Fn() -> u32,
        ready: impl Fn() -> bool,
    ) {
        while !ready() {
            match self.strategy {
                RealStrategy::Notify => bell.block(epoch, &mut self.sums, &ready),
                RealStrategy::Poll => std::hint::spin_loop(),
                RealStrategy::Adaptive { .. } => {
                    let now = picnic_core::Instant::from_nanos(since(epoch));
                    let w = self
                        .adaptive
                        .as_mut()
                        .expect("adaptive waiter has a strategy");
                    w.observe(now, peer_total());
                    match w.decide(now, room()) {
                        WaitDecision::Spin { until } => {
                            while !ready() && since(epoch) < until.as_nanos() {
                                std::hint::spin_loop();
                            }
                        }
                        WaitDecision::SlowDown { until } => {
                            let left = until.as_nanos().saturating_sub(since(epoch));
                            std::thread::sleep(std::time::Duration::from_nanos(left));
                        }
                        WaitDecision::Block => bell.block(epoch, &mut self.sums, &ready),
                    }
                }
            }
        }
    }
}

/// Ring state shared by the two threads.
struct Shared {
    slots: Vec<AtomicU64>,
    produced: AtomicU64,
    consumed: AtomicU64,
    producer_done: AtomicBool,
    /// Rung by the consumer to wake the producer.
    to_producer: Doorbell,
    /// Rung by the producer to wake the consumer.
    to_consumer: Doorbell,
}

/// Per-thread outcome: CPU time and notification sums.
struct ThreadReport {
    cpu_ns: u64,
    sent: SyncSums,
    received: SyncSums,
}

/// Runs the prototype once and measures T and E, and N and S as seen in the run.
pub fn run_real(cfg: &RealConfig) -> anyhow::Result<RealResult> {
    if cfg.l == 0
        || !(1..=cfg.l).contains(&cfg.kp)
        || !(1..=cfg.l).contains(&cfg.kc)
        || cfg.messages == 0
    {
        bail!("need L >= 1, 1 <= k_P, k_C <= L and messages > 0");
    }
    let shared = Arc::new(Shared {
        slots: (0..cfg.l).map(|_| AtomicU64::new(0)).collect(),
        produced: AtomicU64::new(0),
        consumed: AtomicU64::new(0),
        producer_done: AtomicBool::new(false),
        to_producer: Doorbell::new()?,
        to_consumer: Doorbell::new()?,
    });
    let start = Arc::new(Barrier::new(3));
    let epoch = Arc::new(std::sync::OnceLock::<WallInstant>::new());
    let l = u64::from(cfg.l);
    let c = *cfg;
    let producer = {
        let (s, start, epoch) = (shared.clone(), start.clone(), epoch.clone());
        let mut waiter = Waiter::new(c.strategy, Role::Producer)?;
        std::thread::spawn(move || {
            precise_sleeps();
            start.wait();
            let epoch = *epoch.get().expect("epoch set before the barrier");
            let cpu0 = thread_cpu_ns();
            let mut sent = SyncSums::default();
            for seq in 0..c.messages {
                if epoch.elapsed() > c.time_limit {
                    break;
                }
                // A free slot is needed before the work starts (model semantics).
                waiter.wait(
                    epoch,
                    &s.to_producer,
                    || s.consumed.load(Acquire),
                    || (seq - s.consumed.load(Acquire)) as u32,
                    || seq - s.consumed.load(Acquire) < l,
                );
                spin_work(c.wp);
                s.slots[(seq % l) as usize].store(seq, Relaxed);
                s.produced.store(seq + 1, SeqCst);
                if seq + 1 - s.consumed.load(Acquire) >= u64::from(c.kp) {
                    s.to_consumer.ring(epoch, &mut sent);
                }
            }
            s.producer_done.store(true, SeqCst);
            s.to_consumer.ring(epoch, &mut SyncSums::default());
            ThreadReport {
                cpu_ns: thread_cpu_ns() - cpu0,
                sent,
                received: waiter.sums,
            }
        })
    };
    let consumer = {
        let (s, start, epoch) = (shared.clone(), start.clone(), epoch.clone());
        let mut waiter = Waiter::new(c.strategy, Role::Consumer)?;
        std::thread::spawn(
            move || -> anyhow::Result<(ThreadReport, u64, std::time::Duration)> {
                precise_sleeps();
                start.wait();
                let epoch = *epoch.get().expect("epoch set before the barrier");
                let cpu0 = thread_cpu_ns();
                let mut sent = SyncSums::default();
                let mut seq = 0u64;
                loop {
                    let finished =
                        || s.producer_done.load(SeqCst) && s.produced.load(SeqCst) == seq;
                    waiter.wait(
                        epoch,
                        &s.to_consumer,
                        || s.produced.load(Acquire),
                        || (l - (s.produced.load(Acquire) - seq)) as u32,
                        || s.produced.load(Acquire) > seq || finished(),
                    );
                    if s.produced.load(SeqCst) == seq {
                        break; // producer done and queue drained
                    }
                    let got = s.slots[(seq % l) as usize].load(Relaxed);
                    if got != seq {
                        bail!("ring corrupted: slot held {got}, expected {seq}");
                    }
                    spin_work(c.wc);
                    seq += 1;
                    s.consumed.store(seq, SeqCst);
                    if l - (s.produced.load(Acquire) - seq) >= u64::from(c.kc) {
                        s.to_producer.ring(epoch, &mut sent);
                    }
                }
                let report = ThreadReport {
                    cpu_ns: thread_cpu_ns() - cpu0,
                    sent,
                    received: waiter.sums,
                };
                Ok((report, seq, epoch.elapsed()))
            },
        )
    };
    epoch
        .set(WallInstant::now())
        .map_err(|_| anyhow::anyhow!("epoch set twice"))?;
    start.wait();
    let p = producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer panicked"))?;
    let (c_report, n, wall) = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("consumer panicked"))??;
    if n == 0 {
        bail!("no message delivered within {:?}", cfg.time_limit);
    }
    let mean = |sum: u64, count: u64| {
        if count == 0 {
            0.0
        } else {
            sum as f64 / count as f64
        }
    };
    Ok(RealResult {
        messages: n,
        t_per_msg: wall.as_nanos() as f64 / n as f64,
        e_per_msg: (p.cpu_ns + c_report.cpu_ns) as f64 / n as f64,
        producer_notifies: p.sent.notifies,
        consumer_notifies: c_report.sent.notifies,
        np: mean(p.sent.notify_ns, p.sent.notifies),
        nc: mean(c_report.sent.notify_ns, c_report.sent.notifies),
        sp: mean(p.received.wake_ns, p.received.wakes),
        sc: mean(c_report.received.wake_ns, c_report.received.wakes),
    })
}
