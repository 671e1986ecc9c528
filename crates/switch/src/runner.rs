//! The run loop: the only part of the switch that reads the clock, touches ports and waits.
//!
//! One thread polls every port in turn (a VM port only when its egress queue has room:
//! backpressure), hands frames to the engines, runs the schedulers and sends what they
//! produced: one [`Driver::iterate`], the policy the simulator runs too. When there is nothing to do it asks each port's adaptive wait (Rizzo et al.,
//! `picnic_core::notify`) whether to spin or to block: while a port's producer is expected to
//! deliver its next frame sooner than a notification and wake-up cost, the loop polls (spin,
//! at most `spin_us`), otherwise it blocks on the ports' descriptors until the engines' next
//! deadline. Several switches share 2 cores in the lab, so an idle switch must not burn a
//! core (DESIGN.md section 7).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::Context;
use picnic_core::notify::AdaptiveWait;
use picnic_core::{Duration, Instant};

use crate::accel::{Accel, AccelPort, Exchange};
use crate::cgroup::CpuQuota;
use crate::config::Config;
use crate::directory::{PortIdx, TenantIdx};
use crate::driver::Driver;
use crate::ebpf::KernelLink;
use crate::engine::{Engine, IRON_PERIOD};
use crate::frame::FramePool;
use crate::port::{Port, WaitSet};

mod command;
#[cfg(test)]
mod fake_port;
mod fastpath;
mod idle;
mod keeper;
mod live;
mod ports;
mod publish;
mod wake;
mod work;
pub use command::{CommandSender, Reconfigure};
pub(crate) use idle::{ring_wait, IdlePolicy};
use keeper::PortKeeper;
use live::Opening;
pub(crate) use live::{encryption_changed, take_named};
pub use ports::{open_port, open_uplinks, open_vm_port, vm_max_frame, PortOpener, PortSpec};
use ports::{tenant_ports, vm_max_frame_of, PortIo};
pub(crate) use publish::CommitClock;
pub use publish::{CommitTimes, HandoffCounters, PortView, Published, Shared, WorkerView};
pub(crate) use work::setup_thread;
pub use work::{thread_cpu_ns, Clock, SpinWork};

/// Writes each tenant group's budget for the Iron period starting now, crediting what the
/// kernel ran of the ports' softirq work in the group's threads (Iron's Algorithm 2; the
/// switch charges that work to the ports' tenants).
pub(crate) fn refill_cgroups(
    cgroups: &mut [Option<(std::path::PathBuf, CpuQuota)>],
    quotas: &[(TenantIdx, Duration)],
    kernel: &mut KernelLink,
) {
    let groups: Vec<Vec<u32>> = quotas
        .iter()
        .map(|&(t, _)| match cgroups.get(t) {
            Some(Some((_, group))) => group.threads().unwrap_or_default(),
            _ => Vec::new(),
        })
        .collect();
    let mut credits = Vec::with_capacity(groups.len());
    kernel.softirq_in_threads(&groups, &mut credits);
    for (&(tenant, quota), &credit) in quotas.iter().zip(&credits) {
        if let Some(Some((_, group))) = cgroups.get_mut(tenant) {
            if let Err(e) = group.refill(quota, Duration::from_nanos(credit)) {
                tracing::warn!("{e:#}");
            }
        }
    }
}

/// A request from the control API, applied by the loop between batches.
pub enum Command {
    /// Replace the configuration (tenants, VMs, hosts), applied as live changes in place;
    /// only new VMs' ports open and removed VMs' ports close. Diffed on the API's thread.
    Reconfigure(Box<Reconfigure>, mpsc::Sender<anyhow::Result<()>>),
}

pub struct Switch {
    pub(crate) cfg: Config,
    pub(crate) engine: Engine,
    /// Indexed by port slot (0 the uplink); None: a removed VM's port, closed.
    pub(crate) ports: Vec<Option<Box<dyn Port>>>,
    pub(crate) pool: FramePool,
    pub(crate) clock: Clock,
    work: SpinWork,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) commands: Option<mpsc::Receiver<Command>>,
    /// A change waiting for its new ports, which a helper thread opens.
    opening: Option<Opening>,
    /// Opens and closes ports for live changes (started on the first).
    keeper: Option<PortKeeper>,
    /// Ports removed VMs gave up, for the keeper.
    given_up: command::GivenUp,
    /// Readable when the API sent a command ([`CommandSender`]).
    command_wake: Option<Arc<wake::CommandWake>>,
    /// How long applying each change held the loop up.
    commit_clock: CommitClock,
    /// Answers to the API's changes, sent when the loop is about to wait; since when.
    answers: Vec<(mpsc::Sender<anyhow::Result<()>>, anyhow::Result<()>)>,
    answers_since: Instant,
    /// Per port: the adaptive wait of its receive ring and frames read from it so far.
    waits: Vec<(AdaptiveWait, u64)>,
    /// The eBPF programs' maps: the uplink's early drop, the ports' softirq time.
    pub(crate) kernel: KernelLink,
    /// The kernel fast path, when on (`[fastpath] kernel`).
    fastpath: Option<fastpath::FastPathLink>,
    /// Per tenant slot: the cgroup charged for its switch work (Iron), with its path.
    pub(crate) cgroups: Vec<Option<(std::path::PathBuf, CpuQuota)>>,
    /// The shared encryption engine, when a tenant encrypts; the single loop's port into it
    /// (the workers' ports are theirs) and its exchange buffers.
    pub(crate) accel: Option<Accel>,
    accel_port: Option<AccelPort>,
    accel_scratch: Exchange,
    /// Dataplane workers (`switch.workers`); 1 runs the single loop of [`Switch::run`].
    pub(crate) workers: usize,
    /// The uplink sockets of workers 1.. (worker 0 reads `ports[0]`).
    pub(crate) extra_uplinks: Vec<Box<dyn Port>>,
    /// `switch.feedback_key_file`'s key, for the engines of workers 1...
    pub(crate) feedback_key: Option<Vec<u8>>,
    /// Opens a new VM's port at a live change.
    pub(crate) opener: PortOpener,
    /// The loop's blocking wait, kept across waits; reset when a descriptor it waited on may
    /// have been closed (a live change of ports, a new shared engine).
    pub(crate) wait_set: WaitSet,
}

impl Switch {
    /// Opens every port of the config and builds the engines. Prints the backend of each port.
    pub fn open(mut cfg: Config) -> anyhow::Result<Switch> {
        let clock = Clock::new();
        // The fast path's gate is a filter on AF_PACKET sockets (docs/switch.md "Two paths").
        if cfg.fastpath.kernel && cfg.uplink.backend.is_none() {
            cfg.uplink.backend = Some(crate::config::Backend::AfPacket);
        }
        let mut engine = Engine::new(&cfg, clock.now())?;
        calibrate_offloads(&mut engine);
        let feedback_key = match &cfg.switch.feedback_key_file {
            Some(path) => Some(crate::config::read_secret(
                path,
                "switch.feedback_key_file",
            )?),
            None => None,
        };
        engine
            .set_feedback_key(feedback_key.as_deref(), clock.wall_at_zero_ns())
            .map_err(|e| anyhow::anyhow!("switch.feedback_key_file: {e}"))?;
        let vm_ports = cfg
            .vms
            .iter()
            .filter(|vm| vm.port.is_some() && vm.host == cfg.switch.host_id)
            .count();
        let workers = crate::workers::worker_count(&cfg, vm_ports);
        let (mut uplinks, early_drop) = open_uplinks(&cfg, workers)?;
        let extra_uplinks = uplinks.split_off(1);
        let mut ports = uplinks;
        for (i, vm) in cfg.vms.iter().enumerate() {
            if let Some(p) = vm.port.as_ref().filter(|_| vm.host == cfg.switch.host_id) {
                ports.push(open_vm_port(&PortSpec {
                    ifname: p.ifname.clone(),
                    backend: p.backend,
                    create: p.create,
                    socket: p.socket.clone(),
                    field: format!("vms[{i}].port.ifname"),
                    max_frame: vm_max_frame_of(&cfg, &vm.tenant),
                })?);
            }
        }
        let softirq = crate::workers::wants_softirq(&cfg);
        let accel = Accel::from_config(&cfg, workers)?;
        let mut switch = Self::with_ports(cfg, engine, ports, clock);
        let kernel = KernelLink::open(early_drop, softirq, &tenant_ports(&switch.ports));
        switch.kernel = kernel;
        if switch.cfg.fastpath.kernel {
            if workers > 1 {
                tracing::warn!(
                    "kernel fast path off: it runs with one dataplane worker \
                     (switch.workers = {workers})"
                );
            } else {
                let now = switch.clock.now();
                match fastpath::FastPathLink::open(&mut switch.engine, &switch.ports, now) {
                    Ok(link) => switch.fastpath = Some(link),
                    Err(e) => tracing::warn!("kernel fast path off: {e}"),
                }
            }
        }
        switch.workers = workers;
        switch.set_accel(accel);
        switch.extra_uplinks = extra_uplinks;
        switch.feedback_key = feedback_key;
        Ok(switch)
    }

    /// Builds a switch over already opened ports (port 0 the uplink, then local VMs in config
    /// order): the in-memory ports of tests use this.
    pub fn with_ports(
        cfg: Config,
        engine: Engine,
        ports: Vec<Box<dyn Port>>,
        clock: Clock,
    ) -> Switch {
        let work = SpinWork::new(&cfg);
        Switch {
            workers: cfg.switch.workers.unwrap_or(1),
            extra_uplinks: Vec::new(),
            feedback_key: None,
            opener: ports::real_opener(),
            pool: FramePool::new(cfg.switch.frame_pool),
            engine,
            ports: ports.into_iter().map(Some).collect(),
            clock,
            work,
            stop: Arc::new(AtomicBool::new(false)),
            shared: Arc::new(Shared::default()),
            commands: None,
            opening: None,
            keeper: None,
            given_up: Default::default(),
            command_wake: None,
            commit_clock: CommitClock::default(),
            answers: Vec::new(),
            answers_since: Instant::ZERO,
            waits: Vec::new(),
            kernel: KernelLink::default(),
            fastpath: None,
            accel: None,
            accel_port: None,
            accel_scratch: Exchange::default(),
            cgroups: Vec::new(),
            wait_set: WaitSet::new(),
            cfg,
        }
    }

    pub fn describe_ports(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                Some(format!("port {i} {}: {}", p.name(), p.backend()))
            })
            .collect();
        for (w, p) in self.extra_uplinks.iter().enumerate() {
            lines.push(format!(
                "port 0 {} (worker {}'s socket): {}",
                p.name(),
                w + 1,
                p.backend()
            ));
        }
        self.describe_workers(&mut lines);
        if self.kernel.early_drop_on() {
            lines.push("uplink XDP early drop of throttled VMs: on".into());
        }
        if self.kernel.softirq_on() {
            lines.push("softirq accounting (eBPF tracepoints): on".into());
        }
        if self.fastpath.is_some() {
            lines.push("kernel fast path (tc ingress + socket gate): on".into());
        }
        lines
    }

    /// Has live changes open new VMs' ports with `opener` instead of [`open_port`] (tests
    /// hand out in-memory ports).
    pub fn set_port_opener(&mut self, opener: PortOpener) {
        self.opener = opener;
    }

    /// Set to true to make [`Switch::run`] return.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Runs until the stop flag is set. Port errors other than would-block end the run.
    pub fn run(&mut self) -> anyhow::Result<()> {
        if self.workers > 1 {
            return self.run_workers();
        }
        let batch = self.cfg.switch.batch;
        let spin = Duration::from_micros(self.cfg.switch.spin_us);
        let mut driver = Driver::new(batch);
        let mut next_publish = self.clock.now();
        let mut fds = Vec::new();
        let mut idle = IdlePolicy::default();
        self.shared.set_config(self.cfg.clone());
        setup_thread(
            &self.cfg,
            self.cfg.switch.cpus.as_deref(),
            self.fastpath.is_some(),
        )?;
        self.cgroups = self.open_cgroups()?;
        let mut quotas = Vec::new();
        self.kernel.set_dataplane_thread();
        // An inline engine's pace is a timed wait of this loop (Pick::Paced): ended late by
        // the kernel's default 50 us of timer slack, it would run the engine below its
        // capacity.
        if self.accel_port.as_ref().is_some_and(AccelPort::is_inline) {
            if let Err(e) = crate::sched::set_timer_slack(1_000) {
                tracing::warn!("timer slack: {e}");
            }
        }
        self.wait_set.reset();
        let mut cpu_mark = thread_cpu_ns();
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            // Iron 3.1: the previous iteration's CPU time, all of it (I/O, engines, the
            // wait), charged to the VMs whose frames it handled.
            let cpu_now = thread_cpu_ns();
            self.engine.charge_cpu(now, cpu_now - cpu_mark);
            cpu_mark = cpu_now;
            self.kernel.tick(&mut self.engine, now);
            self.engine.cgroup_quotas(now, &mut quotas);
            if !quotas.is_empty() {
                refill_cgroups(&mut self.cgroups, &quotas, &mut self.kernel);
            }
            if now >= next_publish {
                next_publish = now + Duration::from_millis(100);
                self.publish(now);
            }
            // Live changes are applied as they come (each touches only its tenant).
            self.apply_commands();
            self.answer(Some(now));
            // What the kernel forwarded is metered before the engines close their windows.
            if let Some(fp) = self.fastpath.as_mut() {
                fp.meter(&mut self.engine, now, &mut self.pool);
            }
            self.waits
                .resize_with(self.ports.len(), || (ring_wait(spin), 0));
            let mut io = PortIo {
                ports: &mut self.ports,
                waits: &mut self.waits,
                work: &mut self.work,
            };
            let mut busy = driver
                .iterate(now, &mut self.engine, &mut io, &mut self.pool)?
                .busy();
            // The shared engine: frames set aside go to its workers, their results come back
            // (and leave in this iteration, below).
            // An inline engine (`accel.workers = 0`) runs the jobs FairNIC admits here, on
            // this thread; their CPU is charged to their tenants by the engine, not again as
            // the iteration's.
            if let Some(port) = &mut self.accel_port {
                busy += port.exchange(
                    &mut self.engine,
                    now,
                    &mut self.pool,
                    &mut self.accel_scratch,
                );
                cpu_mark += self.accel_scratch.inline_cpu_ns();
                // What the engine finished leaves in this iteration, before the loop yields.
                if self.accel_scratch.finished() > 0 {
                    let mut io = PortIo {
                        ports: &mut self.ports,
                        waits: &mut self.waits,
                        work: &mut self.work,
                    };
                    let at = self.clock.now();
                    busy += driver.finish(at, &mut self.engine, &mut io, &mut self.pool)?;
                }
            }
            if let Some(fp) = self.fastpath.as_mut() {
                if let Err(e) = fp.sync(&mut self.engine, &self.ports, now, busy > 0) {
                    tracing::warn!("kernel fast path off: {e}");
                    self.fastpath = None;
                }
            }
            if busy > 0 {
                // A loop sharing its core with tenants' threads (`switch.yield_busy`) gives
                // it to whoever waits for it after each busy iteration, so its work delays a
                // woken thread by an iteration rather than by the loop's whole slice.
                if self.cfg.switch.yield_busy {
                    crate::sched::yield_now();
                }
                idle.worked(&mut self.waits, busy, self.clock.now() - now);
                continue;
            }
            if idle.spin(now, &mut self.waits) {
                continue;
            }
            let until = self
                .engine
                .poll_at()
                .map(|t| t - now)
                .unwrap_or(Duration::from_millis(5));
            let mut timeout = until.min(Duration::from_millis(5));
            // A VM waiting to be handed back to the kernel fast path.
            if let Some(cap) = self.fastpath.as_ref().and_then(|f| f.wait_cap(now)) {
                timeout = timeout.min(cap);
            }
            // Jobs the engine's limiter admits later (or its pace holds): back by then.
            if let Some(wake) = self.accel_port.as_ref().and(self.accel_scratch.wake_in()) {
                timeout = timeout.min(Duration::from_nanos(wake.as_nanos() as u64));
            }
            fds.clear();
            // A port held back for lack of queue room stays readable: waiting on it would
            // wake the loop at once, again and again. Its queue drains by the deadline.
            fds.extend(
                (0..self.ports.len())
                    .filter(|&p| self.engine.rx_ready(now, p, batch))
                    .filter_map(|p| self.ports[p].as_ref()?.raw_fd()),
            );
            // So do the API's commands.
            fds.extend(self.command_fd());
            // The shared engine's results wake the loop too.
            fds.extend(self.accel_port.as_ref().map(|p| p.notify_fd().as_raw_fd()));
            self.answer(None);
            self.wait_set
                .wait(&fds, std::time::Duration::from_nanos(timeout.as_nanos()))?;
        }
        self.answer(None);
        self.publish(self.clock.now());
        self.release_cgroups();
        Ok(())
    }

    /// The quota file of every tenant with a `cgroup` (index = tenant), period set to Iron's.
    pub(crate) fn open_cgroups(
        &self,
    ) -> anyhow::Result<Vec<Option<(std::path::PathBuf, CpuQuota)>>> {
        self.cfg
            .tenants
            .iter()
            .enumerate()
            .map(
                |(i, t)| match (&t.cgroup, self.cfg.isolation.cpu_accounting) {
                    (Some(dir), true) => CpuQuota::open(dir, IRON_PERIOD)
                        .map(|q| Some((dir.clone(), q)))
                        .with_context(|| format!("tenants[{i}].cgroup")),
                    _ => Ok(None),
                },
            )
            .collect()
    }

    /// Gives each charged cgroup its whole allocation back when the switch stops.
    pub(crate) fn release_cgroups(&mut self) {
        let cfg = self.cfg.clone();
        for slot in 0..self.cgroups.len() {
            self.release_cgroup(slot, &cfg);
        }
    }

    /// Stops charging tenant slot `slot`'s cgroup, giving it back the allocation `cfg` gave
    /// the tenant that had it.
    fn release_cgroup(&mut self, slot: usize, cfg: &Config) {
        let Some((path, mut group)) = self.cgroups.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let cores = cfg
            .tenants
            .iter()
            .find(|t| t.cgroup.as_ref() == Some(&path))
            .and_then(|t| t.cpu_quota);
        if let Some(cores) = cores {
            let allocation = IRON_PERIOD.as_nanos() as f64 * cores;
            if let Err(e) = group.release(Duration::from_nanos(allocation as u64)) {
                tracing::warn!("restoring a tenant's quota: {e:#}");
            }
        }
    }

    fn publish(&mut self, now: Instant) {
        self.hand_over_given_up();
        self.kernel.publish(&mut self.engine, now);
        if let Some(fp) = &self.fastpath {
            fp.publish(&mut self.engine, now);
        }
        let ports = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.as_ref()?)))
            .map(|(i, p)| {
                let wait = self.waits.get(i).map(|(w, _)| w);
                let decisions = wait.map(|w| w.counts()).unwrap_or_default();
                PortView {
                    name: p.name().to_string(),
                    backend: p.backend().to_string(),
                    worker: 0,
                    stats: p.stats(),
                    wait_regime: wait.and_then(|w| w.regime()).map(|r| r.to_string()),
                    wait_spins: decisions.spins,
                    wait_blocks: decisions.blocks,
                    producer_period_ns: wait.and_then(|w| w.peer_period()).map(|d| d.as_nanos()),
                }
            })
            .collect();
        // The receivers' meter windows are closed when read: the advertised rates as of now.
        self.engine.catch_up(now);
        let switch = self.engine.snapshot();
        let workers = vec![WorkerView {
            worker: 0,
            vms: switch.vms.iter().map(|v| v.name.clone()).collect(),
            cpu_ns: switch.switch.cpu_ns,
            handoff: Default::default(),
            live_commits: self.commit_clock.view(),
        }];
        self.shared.publish(Published {
            switch,
            ports,
            pool_free: self.pool.available(),
            pool_capacity: self.pool.capacity(),
            accel: self.accel.as_ref().map(|a| a.view(&self.cfg)),
            workers,
            slo: self.engine.slo_report(now),
        });
    }

    /// Replaces the shared engine; the old one's frames go back to the pool. The single loop
    /// takes port 0 of the new one; workers take theirs when they start.
    pub(crate) fn set_accel(&mut self, mut accel: Option<Accel>) {
        if let Some(mut old) = self.accel.take() {
            old.stop();
            let mut frames = Vec::new();
            if let Some(port) = self.accel_port.take() {
                port.shutdown(&mut frames);
            }
            old.shutdown(&mut frames);
            for f in frames {
                self.pool.put(f);
            }
        }
        self.shared.set_accel_keys(accel.as_ref().map(Accel::keys));
        if self.workers == 1 {
            self.accel_port = accel.as_mut().and_then(|a| a.port(0));
        }
        self.accel = accel;
        // The old engine's notify descriptor is closed: its number may be the new one's.
        self.wait_set.reset();
    }

    pub fn port_index(&self, name: &str) -> Option<PortIdx> {
        self.ports
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.name() == name))
    }
}

/// Charges the tenants' offload programs at the interpreter's speed on this machine,
/// measured once per process (`offload::calibrate`).
fn calibrate_offloads(engine: &mut Engine) {
    static PS_PER_FUEL: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if engine.has_offloads() {
        engine.set_offload_cost(*PS_PER_FUEL.get_or_init(crate::offload::calibrate));
    }
}
