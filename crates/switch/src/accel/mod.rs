//! The shared engine ("accelerator"): a pool of worker threads sealing and opening tenants'
//! tunnel packets with their AES-GCM keys (`picnic_wire::seal`), isolated between tenants by
//! FairNIC's limiter (FairNIC 4.4; DESIGN.md section 3 item 7).
//!
//! Every dataplane thread (the single loop, or each of the switch's workers) submits through
//! its own [`AccelPort`]: a [`Job`] (a frame and what to do with it) passes the port's
//! FairNIC gate ([`admit::Gate`]: a token cache per tenant, spent without a lock; the
//! limiter's lock only when a cache runs dry, to refill it from the tenant's base or steal
//! from the global overflow pool within its AIMD allowance) into a lock-free queue of
//! admitted jobs; a job the limiter holds waits in the port until the time it names, and a
//! full tenant (`queue_jobs` not yet taken back) gets the job back at once, so the dataplane
//! never blocks. A free engine worker takes the admitted jobs into [`sched::EngineQueues`]
//! (per tenant, served in start-time fair order) and runs the next; its result goes back to
//! the port that submitted it through a bounded channel and an eventfd.
//!
//! Every job reports the worker CPU it took (the thread's CPU clock), so the dataplane
//! charges it to the tenant whose job it was, as it charges its own CPU (Iron 3.1); frames
//! failing authentication come back marked and are dropped and counted by the caller.
//!
//! Tokens are worker nanoseconds: the engine's capacity is `workers` x 1e9 tokens/s scaled by
//! `capacity_percent`, and a job costs `per_job_ns + per_byte_ps * bytes / 1000` (measured at
//! start-up, [`calibrate`], unless configured) plus the synthetic `job_work_ns`.
//!
//! Split by concern: `admit.rs` is the limiter on the submit path, `sched.rs` picks the next
//! admitted job, `worker.rs` runs it, `keys.rs` holds the tenants' keys, `stats.rs` is what
//! `/stats` shows.

mod admit;
mod keys;
mod port;
pub(crate) mod sched;
mod stats;
#[cfg(test)]
mod tests;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use crossbeam_queue::SegQueue;
use std::thread::JoinHandle;
use std::time::Instant as StdInstant;

use picnic_core::fairnic::TokenCost;
use picnic_core::Instant;
use picnic_wire::seal::TunnelKey;

use crate::config::Config;
pub use crate::engine::{Completion, Job, Op, Outcome};
use crate::frame::Frame;
use admit::{Admitted, Gate, Limiter};
pub use keys::{AccelKeys, KeyError, KeyRing};
pub use port::AccelPort;
use sched::EngineQueues;
use stats::Counters;
pub use stats::{AccelView, EngineLatency, LimiterView, TenantAccelStats};
pub use worker::calibrate;

/// Buffers [`AccelPort::exchange`] reuses between calls, and what the last call did.
#[derive(Default)]
pub struct Exchange {
    jobs: Vec<Job>,
    done: Vec<Completion>,
    refused: Vec<Job>,
    inline: InlineRun,
    wake_in: Option<std::time::Duration>,
    finished: usize,
}

impl Exchange {
    /// Thread CPU the last [`AccelPort::exchange`] spent running jobs on the caller's thread
    /// (an inline engine), ns: already charged to the jobs' tenants, so the caller leaves
    /// it out of the iteration's CPU it charges (Iron 3.1, once).
    pub fn inline_cpu_ns(&self) -> u64 {
        self.inline.cpu_ns
    }

    /// Results the last [`AccelPort::exchange`] handed back to the engines (sealed frames
    /// now in the uplink's transmit queue, opened ones in their VMs' schedulers).
    pub fn finished(&self) -> usize {
        self.finished
    }

    /// When the port holds jobs the limiter admits only later (or an inline engine's pace
    /// holds them): how long the caller may wait at most before calling
    /// [`AccelPort::exchange`] again.
    pub fn wake_in(&self) -> Option<std::time::Duration> {
        self.wake_in
    }
}

/// What one inline run of the engine's jobs did ([`AccelPort::run_inline`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InlineRun {
    /// Jobs run.
    pub jobs: usize,
    /// Thread CPU they took, ns.
    pub cpu_ns: u64,
    /// The pace holds the jobs queued for this long.
    pub wake_in: Option<std::time::Duration>,
}

/// The engine's configuration.
#[derive(Clone, Debug)]
pub struct AccelConfig {
    /// Worker threads; 0: none, the dataplane loops run the jobs themselves
    /// ([`AccelPort::exchange`], within `inline_budget` an iteration, in FairNIC's order),
    /// one "worker" for the limiter's capacity.
    pub workers: usize,
    /// Inline engine: the loop stops starting jobs once it has spent this long on them in an
    /// iteration (it runs at least one), so it goes back to its ports.
    pub inline_budget: std::time::Duration,
    /// When the limiter holds a port's jobs, its loop comes back for them no sooner than
    /// this (it does not wake for each job; the buckets hold this much); an inline engine's
    /// pause after a job is at most this.
    pub inline_wait: std::time::Duration,
    /// Jobs each tenant may have outstanding.
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

/// Where one port's results go: a bounded channel, and an eventfd written when results wait
/// so that a dataplane blocked in poll(2) wakes.
struct Outlet {
    tx: SyncSender<Completion>,
    notify: std::os::fd::OwnedFd,
    /// Whether the port has been told since it last drained.
    notified: AtomicBool,
}

struct Shared {
    /// Jobs the ports' gates admitted, by port, not yet in `queues` (no lock to submit).
    admitted: SegQueue<Admitted<(usize, Job)>>,
    /// The engine's side: the admitted jobs by tenant, taken by the free worker.
    queues: Mutex<EngineQueues<(usize, Job)>>,
    /// Workers waiting in `work` for admitted jobs: a port takes the lock to wake one only
    /// then.
    sleeping: AtomicUsize,
    work: Condvar,
    /// FairNIC's limiter (None without isolation).
    limiter: Option<Limiter>,
    outlets: Vec<Outlet>,
    keys: RwLock<Vec<KeyRing>>,
    counters: Vec<Counters>,
    /// Per tenant: the next nonce counter. Starts at the wall clock in ns, so a restarted
    /// switch starts above every counter it used before (it seals far fewer than 1e9
    /// packets per second), without keeping state.
    nonce: Vec<AtomicU64>,
    sender_id: u32,
    job_work_ns: u64,
    /// Per tenant: jobs submitted whose results no port has taken back yet, and all
    /// tenants' (the bound of the shared FIFO without isolation).
    outstanding: Vec<AtomicUsize>,
    outstanding_all: AtomicUsize,
    /// Per tenant: how long its jobs took through the engine (written by the dataplane).
    latency: Mutex<Vec<EngineLatency>>,
    /// Jobs each tenant may have outstanding.
    depth: usize,
    isolated: bool,
    stop: AtomicBool,
    epoch: StdInstant,
}

impl Shared {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Moves the admitted jobs into the engine's queues (under their lock).
    fn take_admitted(&self, queues: &mut EngineQueues<(usize, Job)>) {
        while let Some(a) = self.admitted.pop() {
            // The gates admit only the tenants the queues were made for.
            let _ = queues.push(a);
        }
    }

    /// Hands `done` to the port that submitted it and wakes that port's dataplane.
    fn deliver(&self, port: usize, done: Completion) -> bool {
        let Some(outlet) = self.outlets.get(port) else {
            return false;
        };
        if outlet.tx.send(done).is_err() {
            return false;
        }
        if !outlet.notified.swap(true, Ordering::AcqRel) {
            worker::signal_eventfd(&outlet.notify);
        }
        true
    }
}

/// The running engine; dropping it stops the workers. Its ports ([`Accel::port`]) go to the
/// dataplane threads.
pub struct Accel {
    shared: Arc<Shared>,
    /// Tenant names, by index (for carrying keys over a reconfiguration).
    names: Vec<String>,
    ports: Vec<Option<AccelPort>>,
    workers: Vec<JoinHandle<()>>,
    cost: TokenCost,
    capacity: u64,
    workers_count: usize,
}

impl Accel {
    /// Starts `cfg.workers` workers for tenants with these weights and key rings, with
    /// `ports` ports for the dataplane threads that submit jobs. With `cfg.workers == 0` no
    /// thread starts: the ports run the jobs ([`AccelPort::exchange`]).
    pub fn start(
        cfg: &AccelConfig,
        weights: &[u64],
        rings: Vec<KeyRing>,
        ports: usize,
    ) -> anyhow::Result<Accel> {
        anyhow::ensure!(cfg.queue_jobs > 0, "accel.queue_jobs must be > 0");
        anyhow::ensure!(
            (1..=100).contains(&cfg.capacity_percent),
            "accel.capacity_percent must be in 1..=100"
        );
        anyhow::ensure!(rings.len() == weights.len(), "one key ring per tenant");
        anyhow::ensure!(ports > 0, "the engine needs a port");
        // FairNIC 4.4 admits what the unit sustains: a job's tokens are all the worker time
        // it takes, the synthetic work included.
        let base = cfg.cost.unwrap_or_else(calibrate);
        let cost = TokenCost {
            per_request: base.per_request + cfg.job_work_ns,
            ..base
        };
        let (queues, limiter, capacity) = engine_queues(cfg, weights, cost, ports)?;
        let epoch = StdInstant::now();
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        // Room for every job a port can have in flight, so a worker never waits to hand one
        // back while the dataplane keeps draining.
        let room = cfg.queue_jobs * weights.len().max(1) + cfg.workers;
        let mut outlets = Vec::with_capacity(ports);
        let mut receivers = Vec::with_capacity(ports);
        for _ in 0..ports {
            let (tx, rx) = sync_channel(room);
            outlets.push(Outlet {
                tx,
                notify: worker::eventfd()?,
                notified: AtomicBool::new(false),
            });
            receivers.push(rx);
        }
        let shared = Arc::new(Shared {
            admitted: SegQueue::new(),
            queues: Mutex::new(queues),
            sleeping: AtomicUsize::new(0),
            work: Condvar::new(),
            limiter,
            outlets,
            counters: (0..weights.len()).map(|_| Counters::default()).collect(),
            nonce: (0..weights.len())
                .map(|_| AtomicU64::new(wall_ns))
                .collect(),
            keys: RwLock::new(rings),
            sender_id: cfg.sender_id,
            job_work_ns: cfg.job_work_ns,
            outstanding: (0..weights.len()).map(|_| AtomicUsize::new(0)).collect(),
            outstanding_all: AtomicUsize::new(0),
            latency: Mutex::new(vec![EngineLatency::default(); weights.len()]),
            depth: cfg.queue_jobs,
            isolated: cfg.isolated,
            stop: AtomicBool::new(false),
            epoch,
        });
        let ports = receivers
            .into_iter()
            .enumerate()
            .map(|(index, results)| {
                Some(AccelPort {
                    index,
                    shared: Arc::clone(&shared),
                    gate: Gate::new(weights.len()),
                    results,
                    inline: cfg.workers == 0,
                    inline_budget: cfg.inline_budget,
                    inline_wait: cfg.inline_wait,
                })
            })
            .collect();
        let workers = (0..cfg.workers)
            .map(|w| {
                let shared = Arc::clone(&shared);
                let (nice, slice_us, rt) = (cfg.nice, cfg.slice_us, cfg.realtime_priority);
                std::thread::Builder::new()
                    .name(format!("picnic-accel-{w}"))
                    .spawn(move || {
                        worker::setup_thread(nice, slice_us, rt);
                        worker::worker(&shared)
                    })
                    .map_err(|e| anyhow::anyhow!("cannot start accel worker: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Accel {
            shared,
            names: Vec::new(),
            ports,
            workers,
            cost,
            capacity,
            workers_count: cfg.workers,
        })
    }

    /// Port `index`, for the dataplane thread of that index (each is taken once).
    pub fn port(&mut self, index: usize) -> Option<AccelPort> {
        self.ports.get_mut(index).and_then(Option::take)
    }

    /// Whether the engine has no workers and its jobs are run by its ports.
    pub fn is_inline(&self) -> bool {
        self.workers_count == 0
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
    /// `ports`: the dataplane threads that submit jobs.
    pub fn from_config(cfg: &Config, ports: usize) -> anyhow::Result<Option<Accel>> {
        Accel::from_config_after(cfg, None, ports)
    }

    /// As [`Accel::from_config`], keeping the keys `previous` holds for tenants of the same
    /// name (keys rotated through the API survive a reconfiguration).
    pub fn from_config_after(
        cfg: &Config,
        previous: Option<&Accel>,
        ports: usize,
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
            nice: Some(
                cfg.switch
                    .nice
                    .unwrap_or_else(|| crate::config::default_nice(cfg.fastpath.kernel)),
            ),
            slice_us: cfg.switch.slice_us,
            realtime_priority: cfg.switch.realtime_priority,
        };
        let mut accel = Accel::start(&config, &weights, rings, ports)?;
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
    /// finished, so the caller can return them to its pool; the ports still out give back
    /// theirs with [`AccelPort::shutdown`].
    pub fn shutdown(mut self, out: &mut Vec<Frame>) {
        self.stop();
        for port in self.ports.drain(..).flatten() {
            port.shutdown(out);
        }
        let mut jobs = Vec::new();
        let mut queues = lock(&self.shared.queues);
        self.shared.take_admitted(&mut queues);
        queues.drain_into(&mut jobs, |_| false);
        out.extend(jobs.into_iter().map(|(_, j)| j.frame));
    }

    /// Stops the workers: each finishes at most the job it holds and hands it to its port,
    /// so that a port shut down afterwards gives back every frame of its jobs.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _guard = lock(&self.shared.queues);
            self.shared.work.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
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
        self.stop();
    }
}

/// The queues and limiter of an engine configured by `cfg` at `Instant::ZERO` for `ports`
/// submitting threads, and the limiter's capacity in tokens per second (shared with the
/// virtual-clock tests).
fn engine_queues<T>(
    cfg: &AccelConfig,
    weights: &[u64],
    cost: TokenCost,
    ports: usize,
) -> anyhow::Result<(EngineQueues<T>, Option<Limiter>, u64)> {
    // An inline engine is one "worker": the dataplane loop.
    let workers = cfg.workers.max(1);
    let capacity = workers as u64 * 10_000_000 * cfg.capacity_percent;
    // A port comes back for the jobs the limiter holds no sooner than `inline_wait`: the
    // buckets hold that much, so no token is lost meanwhile.
    let burst = picnic_core::Duration::from_nanos(cfg.inline_wait.as_nanos() as u64);
    let limiter = cfg
        .isolated
        .then(|| Limiter::new(Instant::ZERO, weights, ports, capacity, cost, burst))
        .transpose()
        .map_err(|e| anyhow::anyhow!("accel limiter: {e}"))?;
    let mut queues = EngineQueues::new(Instant::ZERO, weights, cost, cfg.isolated);
    if cfg.workers == 0 {
        queues.set_pace(cfg.capacity_percent);
    }
    Ok((queues, limiter, capacity))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
