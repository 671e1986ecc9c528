//! The shared engine ("accelerator"): a pool of worker threads sealing and opening tenants'
//! tunnel packets with their AES-GCM keys (`picnic_wire::seal`), isolated between tenants by
//! FairNIC's limiter (FairNIC 4.4; DESIGN.md section 3 item 7).
//!
//! The dataplane [`Accel::submit`]s a [`Job`] (a frame and what to do with it) to its
//! tenant's bounded queue and takes the results back with [`Accel::completions`] from a
//! bounded channel; a full queue gives the job back at once, so the dataplane never blocks.
//! A free worker asks [`sched::EngineQueues`] for the next job: per-tenant queues, admitted by
//! size-scaled tokens from the worker's token cache, the tenant's base (its weight's share
//! of the engine's capacity) or the global overflow pool within an AIMD allowance. The
//! queues and the limiter sit behind one lock held for a pop (FairNIC's global lock is on
//! its slow path only; here the queues are shared anyway, so the per-worker caches save the
//! refill arithmetic, not the lock).
//!
//! Every job reports the worker CPU it took (the thread's CPU clock), so the dataplane
//! charges it to the tenant whose job it was, as it charges its own CPU (Iron 3.1); frames
//! failing authentication come back marked and are dropped and counted by the caller.
//!
//! Tokens are worker nanoseconds: the engine's capacity is `workers` x 1e9 tokens/s scaled by
//! `capacity_percent`, and a job costs `per_job_ns + per_byte_ps * bytes / 1000` (measured at
//! start-up, [`calibrate`], unless configured) plus the synthetic `job_work_ns`.
//!
//! Split by concern: `sched.rs` picks the next job, `worker.rs` runs it, `keys.rs` holds the
//! tenants' keys, `stats.rs` is what `/stats` shows.

mod keys;
pub(crate) mod sched;
mod stats;
#[cfg(test)]
mod tests;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant as StdInstant;

use picnic_core::fairnic::TokenCost;
use picnic_core::Instant;
use picnic_wire::seal::TunnelKey;

use crate::config::Config;
use crate::engine::Engine;
pub use crate::engine::{Completion, Job, Op, Outcome};
use crate::frame::{Frame, FramePool};
pub use keys::{AccelKeys, KeyError, KeyRing};
use sched::EngineQueues;
use stats::Counters;
pub use stats::{AccelView, EngineLatency, LimiterView, TenantAccelStats};
pub use worker::calibrate;

/// Buffers [`Accel::exchange`] reuses between calls, and what the last call's inline run of
/// jobs did.
#[derive(Default)]
pub struct Exchange {
    jobs: Vec<Job>,
    done: Vec<Completion>,
    inline: InlineRun,
    finished: usize,
}

impl Exchange {
    /// Thread CPU the last [`Accel::exchange`] spent running jobs on the caller's thread
    /// (an inline engine), ns: already charged to the jobs' tenants, so the caller leaves
    /// it out of the iteration's CPU it charges (Iron 3.1, once).
    pub fn inline_cpu_ns(&self) -> u64 {
        self.inline.cpu_ns
    }

    /// Results the last [`Accel::exchange`] handed back to the engines (sealed frames now in
    /// the uplink's transmit queue, opened ones in their VMs' schedulers).
    pub fn finished(&self) -> usize {
        self.finished
    }

    /// When an inline engine holds jobs its limiter admits only later: how long the caller
    /// may wait at most before calling [`Accel::exchange`] again.
    pub fn inline_wake_in(&self) -> Option<std::time::Duration> {
        self.inline.wake_in
    }
}

/// What one inline run of the engine's jobs did ([`Accel::run_inline`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InlineRun {
    /// Jobs run.
    pub jobs: usize,
    /// Thread CPU they took, ns.
    pub cpu_ns: u64,
    /// Jobs are queued that the limiter admits in this long, none before.
    pub wake_in: Option<std::time::Duration>,
}

/// The engine's configuration.
#[derive(Clone, Debug)]
pub struct AccelConfig {
    /// Worker threads; 0: none, the dataplane loop runs the jobs itself ([`Accel::exchange`],
    /// within `inline_budget` an iteration, in FairNIC's order), one "worker" for the
    /// limiter's capacity and token caches.
    pub workers: usize,
    /// Inline engine: the loop stops starting jobs once it has spent this long on them in an
    /// iteration (it runs at least one), so it goes back to its ports.
    pub inline_budget: std::time::Duration,
    /// Inline engine: when the limiter holds every queued job, the loop comes back for them
    /// no sooner than this (it does not wake for each job; the buckets hold this much).
    pub inline_wait: std::time::Duration,
    /// Jobs each tenant's queue holds.
    pub queue_jobs: usize,
    /// The limiter admits this percentage of the workers' time (FairNIC 4.4 admits what the
    /// unit sustains without queueing; below 100 leaves room for the workers' own overhead).
    pub capacity_percent: u64,
    /// Token cost of a job; None: [`calibrate`]d at start.
    pub cost: Option<TokenCost>,
    /// FairNIC isolation; off: one shared FIFO, no limiter.
    pub isolated: bool,
    /// This host's id: the sender part of every nonce it seals with.
    pub sender_id: u32,
    /// Synthetic extra CPU spun per job, ns (`accel.job_work_ns`).
    pub job_work_ns: u64,
    /// The switch threads' nice value and EEVDF slice (`switch.nice`, `switch.slice_us`):
    /// the workers are switch threads and run with them.
    pub nice: Option<i8>,
    pub slice_us: Option<u64>,
    /// The dataplane's SCHED_FIFO priority (`switch.realtime_priority`): the workers then
    /// run SCHED_FIFO one below it instead of with `nice` and `slice_us`.
    pub realtime_priority: Option<u8>,
}

struct Shared {
    queues: Mutex<EngineQueues<Job>>,
    work: Condvar,
    keys: RwLock<Vec<KeyRing>>,
    counters: Vec<Counters>,
    /// Per tenant: the next nonce counter. Starts at the wall clock in ns, so a restarted
    /// switch starts above every counter it used before (it seals far fewer than 1e9
    /// packets per second), without keeping state.
    nonce: Vec<AtomicU64>,
    sender_id: u32,
    job_work_ns: u64,
    /// Per tenant: jobs submitted whose results the dataplane has not taken back yet.
    outstanding: Vec<AtomicUsize>,
    /// Per tenant: how long its jobs took through the engine (written by the dataplane).
    latency: Mutex<Vec<EngineLatency>>,
    /// Jobs each tenant's queue holds.
    depth: usize,
    isolated: bool,
    stop: AtomicBool,
    epoch: StdInstant,
    /// Written when results are waiting, so a dataplane blocked in poll(2) wakes.
    notify: Option<std::os::fd::OwnedFd>,
    /// Whether the dataplane has been told since it last drained.
    notified: AtomicBool,
}

impl Shared {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }
}

/// The running engine; dropping it stops the workers.
pub struct Accel {
    shared: Arc<Shared>,
    /// Tenant names, by index (for carrying keys over a reconfiguration).
    names: Vec<String>,
    results: Receiver<Completion>,
    workers: Vec<JoinHandle<()>>,
    cost: TokenCost,
    capacity: u64,
    workers_count: usize,
    inline_budget: std::time::Duration,
    inline_wait: std::time::Duration,
}

impl Accel {
    /// Starts `cfg.workers` workers for tenants with these weights and key rings.
    /// With `cfg.workers == 0` no thread starts: the caller runs the jobs ([`Accel::exchange`]).
    pub fn start(cfg: &AccelConfig, weights: &[u64], rings: Vec<KeyRing>) -> anyhow::Result<Accel> {
        anyhow::ensure!(cfg.queue_jobs > 0, "accel.queue_jobs must be > 0");
        anyhow::ensure!(
            (1..=100).contains(&cfg.capacity_percent),
            "accel.capacity_percent must be in 1..=100"
        );
        anyhow::ensure!(rings.len() == weights.len(), "one key ring per tenant");
        // FairNIC 4.4 admits what the unit sustains: a job's tokens are all the worker time
        // it takes, the synthetic work included.
        let base = cfg.cost.unwrap_or_else(calibrate);
        let cost = TokenCost {
            per_request: base.per_request + cfg.job_work_ns,
            ..base
        };
        let (queues, capacity) = engine_queues(cfg, weights, cost)?;
        let epoch = StdInstant::now();
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let notify = if cfg.workers > 0 {
            Some(worker::eventfd()?)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            queues: Mutex::new(queues),
            work: Condvar::new(),
            counters: (0..weights.len()).map(|_| Counters::default()).collect(),
            nonce: (0..weights.len())
                .map(|_| AtomicU64::new(wall_ns))
                .collect(),
            keys: RwLock::new(rings),
            sender_id: cfg.sender_id,
            job_work_ns: cfg.job_work_ns,
            outstanding: (0..weights.len()).map(|_| AtomicUsize::new(0)).collect(),
            latency: Mutex::new(vec![EngineLatency::default(); weights.len()]),
            depth: cfg.queue_jobs,
            isolated: cfg.isolated,
            stop: AtomicBool::new(false),
            epoch,
            notify,
            notified: AtomicBool::new(false),
        });
        // Room for every job that can be in flight, so a worker never waits to hand one back
        // while the dataplane keeps draining.
        let (tx, results) = sync_channel(cfg.queue_jobs * weights.len().max(1) + cfg.workers);
        let workers = (0..cfg.workers)
            .map(|w| {
                let shared = Arc::clone(&shared);
                let tx = tx.clone();
                let (nice, slice_us, rt) = (cfg.nice, cfg.slice_us, cfg.realtime_priority);
                std::thread::Builder::new()
                    .name(format!("picnic-accel-{w}"))
                    .spawn(move || {
                        worker::setup_thread(nice, slice_us, rt);
                        worker::worker(&shared, w, &tx)
                    })
                    .map_err(|e| anyhow::anyhow!("cannot start accel worker: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Accel {
            shared,
            names: Vec::new(),
            results,
            workers,
            cost,
            capacity,
            workers_count: cfg.workers,
            inline_budget: cfg.inline_budget,
            inline_wait: cfg.inline_wait,
        })
    }

    /// Queues a job; gives it back (counted as `queue_full`) when its tenant's queue is full
    /// or the tenant is unknown.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        let tenant = job.tenant;
        let size = job.frame.len() as u64;
        let now = self.shared.now();
        let pushed = lock(&self.shared.queues).push(now, tenant, size, job);
        match pushed {
            Ok(()) => {
                if let Some(n) = self.shared.outstanding.get(tenant) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                self.shared.work.notify_one();
                Ok(())
            }
            Err(job) => {
                if let Some(c) = self.shared.counters.get(tenant) {
                    c.queue_full.fetch_add(1, Ordering::Relaxed);
                }
                Err(job)
            }
        }
    }

    /// Moves every finished job into `out` (never blocks).
    pub fn completions(&self, out: &mut Vec<Completion>) {
        self.shared.notified.store(false, Ordering::Release);
        if let Some(fd) = &self.shared.notify {
            worker::drain_eventfd(fd);
        }
        let first = out.len();
        while let Ok(c) = self.results.try_recv() {
            out.push(c);
        }
        self.took_back(&out[first..]);
    }

    /// Whether the engine has no workers and its jobs are run by the caller.
    pub fn is_inline(&self) -> bool {
        self.workers_count == 0
    }

    /// Inline engine: runs on the calling thread the jobs FairNIC's scheduler admits, in its
    /// order (per-tenant queues, token limiter, start-time fair queueing; the caller is worker
    /// 0), until none is admitted or `budget` is spent (at least one job runs), and moves
    /// their results into `out`. No hand-off to another thread and no wake-up: the job runs
    /// when the dataplane loop, which has the CPU, gets to it.
    pub fn run_inline(&self, budget: std::time::Duration, out: &mut Vec<Completion>) -> InlineRun {
        let start = StdInstant::now();
        let first = out.len();
        let mut run = InlineRun::default();
        loop {
            let now = self.shared.now();
            let pick = lock(&self.shared.queues).pick(now, 0);
            match pick {
                sched::Pick::Run {
                    tenant,
                    item,
                    waited,
                } => {
                    let done = worker::execute(&self.shared, tenant, item, waited, now - waited);
                    let cpu = picnic_core::Duration::from_nanos(done.cpu_ns);
                    let cap = picnic_core::Duration::from_nanos(self.inline_wait.as_nanos() as u64);
                    lock(&self.shared.queues).ran(self.shared.now(), cpu, cap);
                    run.jobs += 1;
                    run.cpu_ns += done.cpu_ns;
                    out.push(done);
                    if start.elapsed() >= budget {
                        break;
                    }
                }
                sched::Pick::WaitUntil(at) => {
                    run.wake_in = Some(
                        std::time::Duration::from_nanos((at - now).as_nanos().max(1))
                            .max(self.inline_wait),
                    );
                    break;
                }
                sched::Pick::Paced(at) => {
                    run.wake_in = Some(std::time::Duration::from_nanos(
                        (at - now).as_nanos().max(1),
                    ));
                    break;
                }
                sched::Pick::Idle => break,
            }
        }
        self.took_back(&out[first..]);
        run
    }

    /// Accounts for results the dataplane took back: its tenants' outstanding jobs and their
    /// latency through the engine.
    fn took_back(&self, done: &[Completion]) {
        if done.is_empty() {
            return;
        }
        let now = self.shared.now();
        let mut latency = lock(&self.shared.latency);
        for c in done {
            if let Some(n) = self.shared.outstanding.get(c.tenant) {
                n.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(l) = latency.get_mut(c.tenant) {
                l.queue.record(c.waited.as_nanos());
                l.turnaround
                    .record(now.saturating_since(c.queued_at).as_nanos());
            }
        }
    }

    /// Jobs `tenant` may still submit before its queue is full: its queue's depth less its
    /// jobs not yet taken back (queued, running or finished). Unbounded without isolation
    /// (one shared FIFO: no tenant's room of its own).
    pub fn room(&self, tenant: usize) -> usize {
        match self.shared.outstanding.get(tenant) {
            Some(n) if self.shared.isolated => {
                self.shared.depth.saturating_sub(n.load(Ordering::Relaxed))
            }
            _ => usize::MAX,
        }
    }

    /// A descriptor that becomes readable when results wait, for the dataplane's poll(2).
    pub fn notify_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.shared.notify.as_ref().map(|fd| fd.as_fd())
    }

    /// Installs a key for `tenant` (see [`KeyRing::install`]).
    pub fn install_key(
        &self,
        tenant: usize,
        epoch: u32,
        key: TunnelKey,
        activate: bool,
    ) -> anyhow::Result<()> {
        let mut rings = self.shared.keys.write().unwrap_or_else(|e| e.into_inner());
        let ring = rings
            .get_mut(tenant)
            .ok_or_else(|| anyhow::anyhow!("tenant does not use the engine"))?;
        ring.install(epoch, key, activate)?;
        Ok(())
    }

    /// Makes `epoch` the sending key of `tenant`.
    pub fn activate_key(&self, tenant: usize, epoch: u32) -> anyhow::Result<()> {
        let mut rings = self.shared.keys.write().unwrap_or_else(|e| e.into_inner());
        let ring = rings
            .get_mut(tenant)
            .ok_or_else(|| anyhow::anyhow!("tenant does not use the engine"))?;
        ring.activate(epoch)?;
        Ok(())
    }

    /// The engine a config asks for, started: None when no tenant encrypts. Tenants are
    /// indexed as in the config (and the engines' directory).
    pub fn from_config(cfg: &Config) -> anyhow::Result<Option<Accel>> {
        Accel::from_config_after(cfg, None)
    }

    /// As [`Accel::from_config`], keeping the keys `previous` holds for tenants of the same
    /// name (keys rotated through the API survive a reconfiguration).
    pub fn from_config_after(
        cfg: &Config,
        previous: Option<&Accel>,
    ) -> anyhow::Result<Option<Accel>> {
        if !cfg.tenants.iter().any(|t| t.encrypt) {
            return Ok(None);
        }
        let old_rings = previous.map(|p| {
            let rings = p.shared.keys.read().unwrap_or_else(|e| e.into_inner());
            (p.names.clone(), rings.clone())
        });
        let mut weights = Vec::with_capacity(cfg.tenants.len());
        let mut rings = Vec::with_capacity(cfg.tenants.len());
        for t in &cfg.tenants {
            let mut ring = KeyRing::default();
            let kept = old_rings.as_ref().and_then(|(names, rings)| {
                let i = names.iter().position(|n| *n == t.name)?;
                rings.get(i).filter(|r| r.sending().is_some()).cloned()
            });
            if let (true, Some(kept)) = (t.encrypt, kept) {
                ring = kept;
                weights.push(t.accel_weight);
            } else if t.encrypt {
                ring.install(t.key_epoch, t.load_key()?, true)?;
                weights.push(t.accel_weight);
            } else {
                weights.push(0);
            }
            rings.push(ring);
        }
        let a = &cfg.accel;
        let config = AccelConfig {
            workers: a.workers,
            inline_budget: std::time::Duration::from_micros(a.inline_budget_us),
            inline_wait: std::time::Duration::from_micros(a.inline_wait_us),
            queue_jobs: a.queue_jobs,
            capacity_percent: a.capacity_percent,
            cost: a.per_job_ns.zip(a.per_byte_ps).map(|(job, ps)| TokenCost {
                per_request: job,
                per_byte: ps.div_ceil(1000),
            }),
            isolated: cfg.isolation.accel,
            sender_id: cfg.switch.host_id,
            job_work_ns: a.job_work_ns,
            // Only a switch with one worker encrypts: the fast path is on if it is asked for.
            nice: Some(
                cfg.switch
                    .nice
                    .unwrap_or_else(|| crate::config::default_nice(cfg.fastpath.kernel)),
            ),
            slice_us: cfg.switch.slice_us,
            realtime_priority: cfg.switch.realtime_priority,
        };
        let mut accel = Accel::start(&config, &weights, rings)?;
        accel.names = cfg.tenants.iter().map(|t| t.name.clone()).collect();
        Ok(Some(accel))
    }

    /// A handle on the tenants' keys for another thread (the API).
    pub fn keys(&self) -> AccelKeys {
        AccelKeys {
            shared: Arc::clone(&self.shared),
            names: self.names.clone(),
        }
    }

    /// Stops the workers and gives back every frame still queued, being worked on or
    /// finished, so the caller can return them to its pool.
    pub fn shutdown(mut self, out: &mut Vec<Frame>) {
        self.stop_workers(out);
        let mut jobs = Vec::new();
        lock(&self.shared.queues).drain_into(&mut jobs);
        out.extend(jobs.into_iter().map(|j| j.frame));
    }

    fn stop_workers(&mut self, out: &mut Vec<Frame>) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _guard = lock(&self.shared.queues);
            self.shared.work.notify_all();
        }
        // Each worker finishes at most the job it holds; emptying the channel leaves room for
        // those, so none blocks handing one back.
        while let Ok(c) = self.results.try_recv() {
            out.push(c.frame);
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        while let Ok(c) = self.results.try_recv() {
            out.push(c.frame);
        }
    }

    /// Hands the frames `engine` set aside to the workers and the finished ones back to it;
    /// returns how many frames moved. Called by the run loop every iteration.
    pub fn exchange(
        &self,
        engine: &mut Engine,
        now: Instant,
        pool: &mut FramePool,
        scratch: &mut Exchange,
    ) -> usize {
        engine.take_accel_jobs(&mut scratch.jobs);
        let mut moved = scratch.jobs.len();
        for job in scratch.jobs.drain(..) {
            if let Err(job) = self.submit(job) {
                engine.on_accel_refused(now, job, pool);
            }
        }
        if self.is_inline() {
            scratch.inline = self.run_inline(self.inline_budget, &mut scratch.done);
        } else {
            self.completions(&mut scratch.done);
        }
        moved += scratch.done.len();
        scratch.finished = scratch.done.len();
        for done in scratch.done.drain(..) {
            engine.on_accel_done(now, done, pool);
        }
        // FairNIC 5.2's back-pressure to a tenant's VFs: its VMs' ports are read only while
        // its queue has room for what a read brings (Engine::rx_ready).
        engine.set_accel_room(
            self.shared.depth,
            (0..self.shared.outstanding.len()).map(|t| self.room(t)),
        );
        moved
    }

    /// The token cost model in use (tokens are worker ns).
    pub fn cost(&self) -> TokenCost {
        self.cost
    }

    /// Tokens per second the limiter admits.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Drop for Accel {
    fn drop(&mut self) {
        self.stop_workers(&mut Vec::new());
    }
}

/// The queues and limiter of an engine configured by `cfg` at `Instant::ZERO`, and the
/// limiter's capacity in tokens per second (shared with the virtual-clock tests).
fn engine_queues<T>(
    cfg: &AccelConfig,
    weights: &[u64],
    cost: TokenCost,
) -> anyhow::Result<(EngineQueues<T>, u64)> {
    // An inline engine is one "worker": the dataplane loop.
    let workers = cfg.workers.max(1);
    let capacity = workers as u64 * 10_000_000 * cfg.capacity_percent;
    let burst = if cfg.workers == 0 {
        picnic_core::Duration::from_nanos(cfg.inline_wait.as_nanos() as u64)
    } else {
        picnic_core::Duration::ZERO
    };
    let mut queues = EngineQueues::with_burst(
        Instant::ZERO,
        weights,
        cfg.queue_jobs,
        workers,
        capacity,
        cost,
        cfg.isolated,
        burst,
    )
    .map_err(|e| anyhow::anyhow!("accel limiter: {e}"))?;
    if cfg.workers == 0 {
        queues.set_pace(cfg.capacity_percent);
    }
    Ok((queues, capacity))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
