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
//! `capacity_percent`, and a job costs `per_job_ns + per_byte_ps * bytes / 1000`, measured at
//! start-up ([`calibrate`]) unless configured.

mod keys;
pub(crate) mod sched;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant as StdInstant;

use picnic_core::fairnic::{TenantEngineStats, TokenCost};
use picnic_core::{Duration, Instant};
use picnic_wire::seal::{open_in_place, seal_in_place, OpenError, SealHeader, TunnelKey};
use serde::Serialize;

use crate::config::Config;
use crate::engine::Engine;
use crate::frame::{Frame, FramePool};
pub use keys::{KeyError, KeyRing};
use sched::{EngineQueues, Pick};

/// What to do with a frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Seal a plain tunnel packet with the tenant's sending key.
    Seal,
    /// Open a sealed tunnel packet with the tenant's key of its epoch.
    Open,
}

/// A frame for the engine. `cookie` is the caller's, given back with the result.
pub struct Job {
    pub tenant: usize,
    pub op: Op,
    pub frame: Frame,
    pub cookie: u64,
}

/// How a job ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Sealed or opened: the frame holds the result.
    Done,
    /// Open: the tag did not verify (tampered, or sealed with another key).
    AuthFailed,
    /// Open: the tenant has no live key of the packet's epoch.
    UnknownKey,
    /// Seal: the tenant has no key.
    NoKey,
    /// Not a tunnel packet the engine can seal or open.
    Malformed,
}

/// A finished job.
pub struct Completion {
    pub tenant: usize,
    pub op: Op,
    pub frame: Frame,
    pub cookie: u64,
    pub outcome: Outcome,
    /// Worker CPU the job took, ns (charged to the tenant).
    pub cpu_ns: u64,
    /// Time the job waited in its tenant's queue.
    pub waited: Duration,
}

/// The engine as `/stats` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct AccelView {
    pub workers: usize,
    pub isolated: bool,
    /// Tokens (worker ns) per second the limiter admits.
    pub capacity_tokens_per_sec: u64,
    /// Token cost of a job: `per_job + per_byte * bytes`.
    pub cost_per_job: u64,
    pub cost_per_byte: u64,
    /// Per encrypting tenant, by name.
    pub tenants: std::collections::BTreeMap<String, TenantAccelStats>,
}

/// Buffers [`Accel::exchange`] reuses between calls.
#[derive(Default)]
pub struct Exchange {
    jobs: Vec<Job>,
    done: Vec<Completion>,
}

/// The engine's configuration.
#[derive(Clone, Debug)]
pub struct AccelConfig {
    /// Worker threads.
    pub workers: usize,
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
}

/// Per-tenant engine counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantAccelStats {
    pub sealed: u64,
    pub opened: u64,
    pub auth_failed: u64,
    pub unknown_key: u64,
    pub no_key: u64,
    pub malformed: u64,
    /// Jobs given back because the tenant's queue was full.
    pub queue_full: u64,
    /// Jobs waiting in the tenant's queue now (all tenants' without isolation).
    pub queued: usize,
    /// Worker CPU spent on the tenant's jobs, ns.
    pub cpu_ns: u64,
    /// Bytes the tenant's jobs covered.
    pub bytes: u64,
    /// Live key epochs and the one sealing.
    pub key_epochs: Vec<u32>,
    pub sending_epoch: Option<u32>,
    /// The FairNIC limiter's view (None without isolation).
    pub limiter: Option<LimiterView>,
}

/// The limiter's counters for one tenant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LimiterView {
    pub granted: u64,
    pub denied: u64,
    pub base_tokens: u64,
    pub stolen_tokens: u64,
    pub contentions: u64,
    pub allowance: u64,
}

impl From<TenantEngineStats> for LimiterView {
    fn from(s: TenantEngineStats) -> Self {
        LimiterView {
            granted: s.granted,
            denied: s.denied,
            base_tokens: s.base_tokens,
            stolen_tokens: s.stolen_tokens,
            contentions: s.contentions,
            allowance: s.allowance,
        }
    }
}

#[derive(Default)]
struct Counters {
    sealed: AtomicU64,
    opened: AtomicU64,
    auth_failed: AtomicU64,
    unknown_key: AtomicU64,
    no_key: AtomicU64,
    malformed: AtomicU64,
    queue_full: AtomicU64,
    cpu_ns: AtomicU64,
    bytes: AtomicU64,
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
}

impl Accel {
    /// Starts `cfg.workers` workers for tenants with these weights and key rings.
    pub fn start(cfg: &AccelConfig, weights: &[u64], rings: Vec<KeyRing>) -> anyhow::Result<Accel> {
        anyhow::ensure!(cfg.workers > 0, "accel.workers must be > 0");
        anyhow::ensure!(cfg.queue_jobs > 0, "accel.queue_jobs must be > 0");
        anyhow::ensure!(
            (1..=100).contains(&cfg.capacity_percent),
            "accel.capacity_percent must be in 1..=100"
        );
        anyhow::ensure!(rings.len() == weights.len(), "one key ring per tenant");
        let cost = cfg.cost.unwrap_or_else(calibrate);
        let (queues, capacity) = engine_queues(cfg, weights, cost)?;
        let epoch = StdInstant::now();
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let notify = eventfd()?;
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
            stop: AtomicBool::new(false),
            epoch,
            notify: Some(notify),
            notified: AtomicBool::new(false),
        });
        // Room for every job that can be in flight, so a worker never waits to hand one back
        // while the dataplane keeps draining.
        let (tx, results) = sync_channel(cfg.queue_jobs * weights.len().max(1) + cfg.workers);
        let workers = (0..cfg.workers)
            .map(|w| {
                let shared = Arc::clone(&shared);
                let tx = tx.clone();
                std::thread::Builder::new()
                    .name(format!("picnic-accel-{w}"))
                    .spawn(move || worker(&shared, w, &tx))
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
            drain_eventfd(fd);
        }
        loop {
            match self.results.try_recv() {
                Ok(c) => out.push(c),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
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
            queue_jobs: a.queue_jobs,
            capacity_percent: a.capacity_percent,
            cost: a.per_job_ns.zip(a.per_byte_ps).map(|(job, ps)| TokenCost {
                per_request: job,
                per_byte: ps.div_ceil(1000),
            }),
            isolated: cfg.isolation.accel,
            sender_id: cfg.switch.host_id,
            job_work_ns: a.job_work_ns,
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
        self.completions(&mut scratch.done);
        moved += scratch.done.len();
        for done in scratch.done.drain(..) {
            engine.on_accel_done(now, done, pool);
        }
        moved
    }

    /// Counters of every tenant.
    pub fn stats(&self) -> Vec<TenantAccelStats> {
        let rings = self.shared.keys.read().unwrap_or_else(|e| e.into_inner());
        let queues = lock(&self.shared.queues);
        self.shared
            .counters
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let (key_epochs, sending_epoch) = rings[t].epochs();
                let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
                TenantAccelStats {
                    sealed: get(&c.sealed),
                    opened: get(&c.opened),
                    auth_failed: get(&c.auth_failed),
                    unknown_key: get(&c.unknown_key),
                    no_key: get(&c.no_key),
                    malformed: get(&c.malformed),
                    queue_full: get(&c.queue_full),
                    queued: queues.queued(t),
                    cpu_ns: get(&c.cpu_ns),
                    bytes: get(&c.bytes),
                    key_epochs,
                    sending_epoch,
                    limiter: queues.limiter_stats(t).map(LimiterView::from),
                }
            })
            .collect()
    }

    /// The engine's state for `/stats`; tenants named from `cfg` (those that encrypt).
    pub fn view(&self, cfg: &Config) -> AccelView {
        let tenants = self
            .stats()
            .into_iter()
            .zip(&cfg.tenants)
            .filter(|(_, t)| t.encrypt)
            .map(|(s, t)| (t.name.clone(), s))
            .collect();
        AccelView {
            workers: self.workers_count,
            isolated: cfg.isolation.accel,
            capacity_tokens_per_sec: self.capacity,
            cost_per_job: self.cost.per_request,
            cost_per_byte: self.cost.per_byte,
            tenants,
        }
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

/// The tenants' keys of a running engine, for the API thread.
#[derive(Clone)]
pub struct AccelKeys {
    shared: Arc<Shared>,
    names: Vec<String>,
}

impl AccelKeys {
    /// Installs `key` as `epoch` for the tenant `name`, sealing with it when `activate`
    /// (see [`KeyRing::install`]).
    pub fn install(
        &self,
        name: &str,
        epoch: u32,
        key: TunnelKey,
        activate: bool,
    ) -> anyhow::Result<()> {
        self.with_ring(name, |ring| Ok(ring.install(epoch, key, activate)?))
    }

    /// Makes the installed `epoch` the sending key of tenant `name`.
    pub fn activate(&self, name: &str, epoch: u32) -> anyhow::Result<()> {
        self.with_ring(name, |ring| Ok(ring.activate(epoch)?))
    }

    /// The live epochs of tenant `name`, the sending one, and each key's fingerprint (hex).
    pub fn describe(&self, name: &str) -> anyhow::Result<serde_json::Value> {
        self.with_ring(name, |ring| {
            let (epochs, sending) = ring.epochs();
            let keys: Vec<_> = epochs
                .iter()
                .map(|&e| {
                    let fp = ring.key(e).map(|k| k.fingerprint()).unwrap_or_default();
                    let hex: String = fp.iter().map(|b| format!("{b:02x}")).collect();
                    serde_json::json!({ "epoch": e, "fingerprint": hex })
                })
                .collect();
            Ok(serde_json::json!({ "tenant": name, "sending_epoch": sending, "keys": keys }))
        })
    }

    fn with_ring<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut KeyRing) -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        let t = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| anyhow::anyhow!("no tenant '{name}'"))?;
        let mut rings = self.shared.keys.write().unwrap_or_else(|e| e.into_inner());
        match rings.get_mut(t) {
            Some(ring) if ring.sending().is_some() => f(ring),
            _ => anyhow::bail!("tenant '{name}' does not encrypt (set encrypt = true and a key)"),
        }
    }
}

/// The queues and limiter of an engine configured by `cfg` at `Instant::ZERO`, and the
/// limiter's capacity in tokens per second (shared with the virtual-clock tests).
fn engine_queues<T>(
    cfg: &AccelConfig,
    weights: &[u64],
    cost: TokenCost,
) -> anyhow::Result<(EngineQueues<T>, u64)> {
    let capacity = cfg.workers as u64 * 10_000_000 * cfg.capacity_percent;
    let queues = EngineQueues::new(
        Instant::ZERO,
        weights,
        cfg.queue_jobs,
        cfg.workers,
        capacity,
        cost,
        cfg.isolated,
    )
    .map_err(|e| anyhow::anyhow!("accel limiter: {e}"))?;
    Ok((queues, capacity))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker(shared: &Shared, index: usize, results: &SyncSender<Completion>) {
    loop {
        let (tenant, mut job, waited) = {
            let mut queues = lock(&shared.queues);
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                let now = shared.now();
                match queues.pick(now, index) {
                    Pick::Run {
                        tenant,
                        item,
                        waited,
                    } => break (tenant, item, waited),
                    Pick::Idle => {
                        queues = shared.work.wait(queues).unwrap_or_else(|e| e.into_inner());
                    }
                    Pick::WaitUntil(at) => {
                        let wait = std::time::Duration::from_nanos((at - now).as_nanos().max(1));
                        queues = shared
                            .work
                            .wait_timeout(queues, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        };
        let start = thread_cpu_ns();
        let bytes = job.frame.len() as u64;
        let outcome = run(shared, tenant, job.op, &mut job.frame);
        if shared.job_work_ns > 0 {
            let until = start + shared.job_work_ns;
            while thread_cpu_ns() < until {
                std::hint::spin_loop();
            }
        }
        let cpu_ns = thread_cpu_ns().saturating_sub(start);
        let c = &shared.counters[tenant];
        let counter = match (outcome, job.op) {
            (Outcome::Done, Op::Seal) => &c.sealed,
            (Outcome::Done, Op::Open) => &c.opened,
            (Outcome::AuthFailed, _) => &c.auth_failed,
            (Outcome::UnknownKey, _) => &c.unknown_key,
            (Outcome::NoKey, _) => &c.no_key,
            (Outcome::Malformed, _) => &c.malformed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        c.cpu_ns.fetch_add(cpu_ns, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        let done = Completion {
            tenant,
            op: job.op,
            frame: job.frame,
            cookie: job.cookie,
            outcome,
            cpu_ns,
            waited,
        };
        if results.send(done).is_err() {
            return;
        }
        if !shared.notified.swap(true, Ordering::AcqRel) {
            if let Some(fd) = &shared.notify {
                signal_eventfd(fd);
            }
        }
    }
}

/// Seals or opens `frame` in place with `tenant`'s keys.
fn run(shared: &Shared, tenant: usize, op: Op, frame: &mut Frame) -> Outcome {
    let len = frame.len();
    match op {
        Op::Seal => {
            let sending = {
                let rings = shared.keys.read().unwrap_or_else(|e| e.into_inner());
                rings.get(tenant).and_then(KeyRing::sending)
            };
            let Some((epoch, key)) = sending else {
                return Outcome::NoKey;
            };
            let counter = shared.nonce[tenant].fetch_add(1, Ordering::Relaxed);
            let header = SealHeader::new(epoch, shared.sender_id, counter);
            match seal_in_place(frame.data_and_tail_mut(), len, &key, header) {
                Ok(n) => {
                    frame.set_len(n);
                    Outcome::Done
                }
                Err(_) => Outcome::Malformed,
            }
        }
        Op::Open => {
            let rings = shared.keys.read().unwrap_or_else(|e| e.into_inner());
            let Some(ring) = rings.get(tenant) else {
                return Outcome::UnknownKey;
            };
            let result = open_in_place(frame.data_and_tail_mut(), len, |epoch| ring.key(epoch));
            match result {
                Ok(n) => {
                    frame.set_len(n);
                    Outcome::Done
                }
                Err(OpenError::AuthFailed) => Outcome::AuthFailed,
                Err(OpenError::UnknownKey(_)) => Outcome::UnknownKey,
                Err(OpenError::Malformed(_)) => Outcome::Malformed,
            }
        }
    }
}

/// The calling thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Measures the engine's token cost on this machine: the ns one seal takes at 64 and 1500
/// bytes, fitted to `per_request + per_byte * size` (tokens are ns; per_byte rounded up so
/// large jobs are never under-charged).
pub fn calibrate() -> TokenCost {
    let key = TunnelKey::new(&[0x42; 16]).expect("16-byte key");
    let time = |inner: usize| -> u64 {
        let outer = picnic_wire::overlay::OuterHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: [198, 18, 0, 1].into(),
            dst_ip: [198, 18, 0, 2].into(),
            src_port: 50000,
            ttl: 64,
        };
        let geneve = picnic_wire::GeneveRepr::ethernet(1);
        let mut plain = vec![0u8; inner + 128];
        let len = picnic_wire::encap(&outer, &geneve, &vec![0x11; inner], &mut plain)
            .expect("buffer sized for the frame");
        let mut buf = plain.clone();
        let rounds = 200u64;
        let mut best = u64::MAX;
        for _ in 0..5 {
            let start = StdInstant::now();
            for i in 0..rounds {
                buf[..len].copy_from_slice(&plain[..len]);
                let _ = seal_in_place(&mut buf, len, &key, SealHeader::new(1, 1, i));
            }
            best = best.min(start.elapsed().as_nanos() as u64 / rounds);
        }
        best.max(1)
    };
    let (small, large) = (time(64), time(1500));
    let per_byte = large.saturating_sub(small).div_ceil(1500 - 64).max(1);
    TokenCost {
        per_request: small.saturating_sub(per_byte * 64).max(1),
        per_byte,
    }
}

fn eventfd() -> anyhow::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        anyhow::bail!("eventfd: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn signal_eventfd(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a u64 we own; a full counter (EAGAIN) is fine to ignore.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn drain_eventfd(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a u64 we own; EAGAIN (nothing pending) is fine.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}
