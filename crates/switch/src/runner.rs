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

use arc_swap::ArcSwapOption;
use std::time::Instant as StdInstant;

use anyhow::Context;
use picnic_core::{Duration, Instant};
use picnic_wire::overlay::ENCAP_OVERHEAD;

use crate::accel::{Accel, AccelKeys, AccelView, Exchange};
use crate::cgroup::CpuQuota;
use crate::config::{Backend, Config};
use crate::directory::{PortIdx, TenantIdx};
use crate::driver::{Driver, Io};
use crate::ebpf::KernelLink;
use crate::engine::{Engine, SloReport, Snapshot, Work, IRON_PERIOD};
use crate::frame::{Frame, FramePool};
use crate::port::{
    wait_readable, AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Port, PortStats, TapPort,
};
use crate::worker::WorkerView;
use picnic_core::notify::{AdaptiveWait, Params, Role, WaitConfig, WaitDecision};

mod live;
use live::Opening;

/// Writes each tenant group's budget for the Iron period starting now, crediting what the
/// kernel ran of the ports' softirq work in the group's threads (Iron's Algorithm 2; the
/// switch charges that work to the ports' tenants).
fn refill_cgroups(
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
                eprintln!("picnic switch: warning: {e:#}");
            }
        }
    }
}

/// What a loop does between passes (Rizzo et al. 3.2.1): after work, each ring's adaptive
/// wait learns the loop's own service time; when idle, it spins while some ring's producer is
/// expected to deliver its next frame sooner than a notification and wake-up would cost, at
/// most `spin_us`, and otherwise (or once a spin has run out) the caller blocks until a frame
/// arrives or the engines' next deadline. The single loop and every worker run it.
#[derive(Default)]
pub(crate) struct IdlePolicy {
    spin_until: Option<Instant>,
}

impl IdlePolicy {
    /// A pass handled `busy` frames in `took`.
    pub(crate) fn worked(
        &mut self,
        waits: &mut [(AdaptiveWait, u64)],
        busy: usize,
        took: Duration,
    ) {
        for (wait, _) in waits.iter_mut() {
            wait.record_own_work(busy as u32, took);
        }
        self.spin_until = None;
    }

    /// A pass found nothing at `now`: whether to poll again (spinning) rather than block.
    pub(crate) fn spin(&mut self, now: Instant, waits: &mut [(AdaptiveWait, u64)]) -> bool {
        match self.spin_until {
            Some(t) if now < t => {
                std::hint::spin_loop();
                true
            }
            Some(_) => {
                self.spin_until = None;
                false
            }
            None => {
                self.spin_until = waits
                    .iter_mut()
                    .filter_map(|(w, _)| match w.decide(now, RING_SLOTS) {
                        WaitDecision::Spin { until } => Some(until),
                        WaitDecision::SlowDown { .. } | WaitDecision::Block => None,
                    })
                    .max();
                self.spin_until.is_some()
            }
        }
    }
}

/// Monotonic nanoseconds since the switch started, as the engines' `now`.
#[derive(Clone, Copy)]
pub struct Clock(StdInstant);
impl Clock {
    pub fn new() -> Clock {
        Clock(StdInstant::now())
    }
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
    /// Wall-clock time at this clock's zero, ns since the UNIX epoch (feedback nonces).
    pub fn wall_at_zero_ns(&self) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (wall.as_nanos() as u64).saturating_sub(self.0.elapsed().as_nanos() as u64)
    }
}
impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// The optional synthetic rule-set cost (`ingress.work_ns`, `ingress.work_ps_per_byte`):
/// spins on the thread's CPU clock for that long and returns what it took, so the frame's
/// scheduler charge includes it. Without it, processing is the loop's own work, measured
/// per iteration ([`Engine::charge_cpu`]).
pub struct SpinWork {
    work_ns: u64,
    work_ps_per_byte: u64,
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl SpinWork {
    pub fn new(cfg: &Config) -> SpinWork {
        SpinWork {
            work_ns: cfg.ingress.work_ns,
            work_ps_per_byte: cfg.ingress.work_ps_per_byte,
        }
    }
}

impl Work for SpinWork {
    fn process(&mut self, _tenant: TenantIdx, frame: &mut Frame) -> u64 {
        let target = self.work_ns + self.work_ps_per_byte * frame.len() as u64 / 1000;
        if target == 0 {
            return 0;
        }
        let start = thread_cpu_ns();
        loop {
            let spent = thread_cpu_ns().saturating_sub(start);
            if spent >= target {
                return spent;
            }
            std::hint::spin_loop();
        }
    }
}

/// A request from the control API, applied by the loop between batches.
pub enum Command {
    /// Replace the configuration (tenants, VMs, hosts), applied as live changes in place;
    /// only new VMs' ports open and removed VMs' ports close.
    Reconfigure(Box<Config>, mpsc::Sender<anyhow::Result<()>>),
}

/// A port as the API shows it: counters and how the loop waits on its receive ring.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PortView {
    pub name: String,
    pub backend: String,
    /// The worker that reads it (each worker has its own uplink socket).
    pub worker: usize,
    pub stats: PortStats,
    /// Rizzo et al. regime of this ring: GP while its wait last chose to spin, otherwise the
    /// Table 1 regime under notification (None until estimated).
    pub wait_regime: Option<String>,
    /// Idle passes on which this ring's wait chose to spin.
    pub wait_spins: u64,
    /// Idle passes on which this ring's wait chose to block.
    pub wait_blocks: u64,
    /// Estimated time between frames from the ring's producer, ns.
    pub producer_period_ns: Option<u64>,
}

/// What the run loop publishes every 100 ms (`/stats`; `slo` is `/slo`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Published {
    pub switch: Snapshot,
    pub ports: Vec<PortView>,
    /// The frame pool: free frames and capacity (a frame not free is queued in an engine or
    /// a port's transmit batch; all are back when the queues drain).
    pub pool_free: usize,
    pub pool_capacity: usize,
    /// The shared encryption engine, when a tenant encrypts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accel: Option<AccelView>,
    /// The dataplane workers: the VMs each owns, its CPU, its handoffs.
    pub workers: Vec<WorkerView>,
    #[serde(skip)]
    pub slo: SloReport,
}

/// Shared with the API thread: the latest snapshot and the current config, each an `Arc`
/// swapped atomically (`arc-swap`): the loop publishes without taking a lock, and a reader
/// that holds a snapshot for as long as it likes (a slow scrape) never delays the loop.
#[derive(Default)]
pub struct Shared {
    snapshot: ArcSwapOption<Published>,
    config: ArcSwapOption<Config>,
    /// The encrypting tenants' keys, for rotation through the API (None: nobody encrypts).
    accel_keys: ArcSwapOption<AccelKeys>,
}

impl Shared {
    /// The latest published snapshot (None before the first).
    pub fn latest(&self) -> Option<Arc<Published>> {
        self.snapshot.load_full()
    }
    /// Replaces the published snapshot; never waits for readers.
    pub fn publish(&self, published: Published) {
        self.snapshot.store(Some(Arc::new(published)));
    }
    /// The running config (None before the loop started).
    pub fn config(&self) -> Option<Arc<Config>> {
        self.config.load_full()
    }
    pub fn set_config(&self, cfg: Config) {
        self.config.store(Some(Arc::new(cfg)));
    }
    /// The running shared engine's keys (None when no tenant encrypts).
    pub fn accel_keys(&self) -> Option<Arc<AccelKeys>> {
        self.accel_keys.load_full()
    }
    /// Publishes the running shared engine's keys for the API.
    pub fn set_accel_keys(&self, keys: Option<AccelKeys>) {
        self.accel_keys.store(keys.map(Arc::new));
    }
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
    /// Per port: the adaptive wait of its receive ring and frames read from it so far.
    waits: Vec<(AdaptiveWait, u64)>,
    /// The eBPF programs' maps: the uplink's early drop, the ports' softirq time.
    pub(crate) kernel: KernelLink,
    /// Per tenant slot: the cgroup charged for its switch work (Iron), with its path.
    pub(crate) cgroups: Vec<Option<(std::path::PathBuf, CpuQuota)>>,
    /// The shared encryption engine, when a tenant encrypts, and its exchange buffers.
    accel: Option<Accel>,
    accel_scratch: Exchange,
    /// Dataplane workers (`switch.workers`); 1 runs the single loop of [`Switch::run`].
    pub(crate) workers: usize,
    /// The uplink sockets of workers 1.. (worker 0 reads `ports[0]`).
    pub(crate) extra_uplinks: Vec<Box<dyn Port>>,
    /// The deployment's feedback key, for the engines of workers 1...
    pub(crate) feedback_key: Option<Vec<u8>>,
}

/// Receive ring slots, the queue length L of the Rizzo model.
pub(crate) const RING_SLOTS: u32 = 2048;

/// The adaptive wait of one receive ring: the switch is its consumer. N and S are the
/// notification and wake-up costs measured on the lab machines (`picnic model measure`:
/// N 1.6-7.3 us, S 2.8-3.7 us), so the loop spins (at most `max_spin`) while the producer's
/// frames come less than N + S = 6.5 us apart. It never slows down with a timed sleep: a
/// 50 us sleep wakes after 105-162 us here (DESIGN.md 7), while blocking on the ring wakes
/// on the frame. W_P and W_C start as guesses and are estimated as frames flow.
pub(crate) fn ring_wait(max_spin: Duration) -> AdaptiveWait {
    AdaptiveWait::new(WaitConfig {
        role: Role::Consumer,
        params: Params::measured_ring(RING_SLOTS),
        max_spin,
        max_sleep: Duration::ZERO,
    })
    .expect("valid model parameters")
}

/// Applies `switch.nice`, `cpus` (the CPUs this thread may use) and `switch.slice_us`, or
/// `switch.realtime_priority`, to the calling dataplane thread.
pub(crate) fn setup_thread(cfg: &Config, cpus: Option<&[usize]>) -> anyhow::Result<()> {
    if let Some(cpus) = cpus {
        crate::sched::set_thread_cpus(cpus).with_context(|| format!("switch.cpus {cpus:?}"))?;
    }
    if let Some(priority) = cfg.switch.realtime_priority {
        // Asked for explicitly: without it the isolation the config promises does not hold.
        return crate::sched::set_thread_realtime(priority).with_context(|| {
            format!("switch.realtime_priority {priority}: SCHED_FIFO needs CAP_SYS_NICE")
        });
    }
    if let Some(nice) = cfg.switch.nice {
        if let Err(e) = crate::sched::set_thread_nice(nice.into()) {
            eprintln!(
                "picnic switch: warning: switch.nice {nice}: {e} (running at the inherited priority)"
            );
        }
    }
    if let Some(us) = cfg.switch.slice_us {
        if let Err(e) = crate::sched::set_thread_slice(us * 1000) {
            eprintln!(
                "picnic switch: warning: switch.slice_us {us}: {e} (needs Linux 6.12+; running with the kernel's slice)"
            );
        }
    }
    Ok(())
}

/// The ports as the driver's [`Io`]: each read feeds the adaptive wait of the port's ring.
struct PortIo<'a> {
    ports: &'a mut [Option<Box<dyn Port>>],
    waits: &'a mut [(AdaptiveWait, u64)],
    work: &'a mut SpinWork,
}

impl Io for PortIo<'_> {
    fn recv(
        &mut self,
        now: Instant,
        port: PortIdx,
        pool: &mut FramePool,
        rx: &mut Vec<Frame>,
        max: usize,
    ) -> anyhow::Result<usize> {
        let Some(p) = self.ports[port].as_mut() else {
            return Ok(0);
        };
        let n = p
            .recv_batch(pool, rx, max)
            .with_context(|| format!("receive on {}", p.name()))?;
        if n > 0 {
            let (wait, seen) = &mut self.waits[port];
            *seen += n as u64;
            wait.observe(now, *seen);
        }
        Ok(n)
    }

    fn send(
        &mut self,
        port: PortIdx,
        queue: &mut Vec<Frame>,
        pool: &mut FramePool,
    ) -> anyhow::Result<()> {
        match self.ports[port].as_mut() {
            Some(p) => {
                p.send_batch(queue, pool)
                    .with_context(|| format!("send on {}", p.name()))?;
            }
            None => queue.drain(..).for_each(|f| pool.put(f)),
        }
        Ok(())
    }

    fn work(&mut self) -> &mut dyn Work {
        self.work
    }
}

/// Opens a port with the backend the config names, with an error that says what to fix.
/// GSO super-frames read on it are segmented into frames of at most `max_frame` bytes
/// ([`vm_max_frame`] for VM ports).
pub fn open_port(
    ifname: &str,
    backend: Backend,
    field: &str,
    max_frame: usize,
) -> anyhow::Result<Box<dyn Port>> {
    let port: Box<dyn Port> = match backend {
        Backend::AfPacket => Box::new(
            AfPacketPort::open(
                ifname,
                AfPacketOptions {
                    max_frame,
                    ..Default::default()
                },
            )
            .with_context(|| format!("{field}: cannot open '{ifname}'"))?,
        ),
        Backend::AfXdp => Box::new(
            AfXdpPort::open(ifname, AfXdpOptions::default())
                .with_context(|| format!("{field}: cannot open '{ifname}' with AF_XDP"))?,
        ),
        Backend::Tap => Box::new(
            TapPort::open(ifname, max_frame)
                .with_context(|| format!("{field}: cannot open TAP '{ifname}'"))?,
        ),
        Backend::Memory => {
            anyhow::bail!("{field}: '{ifname}': memory ports are made in-process, not opened")
        }
    };
    Ok(port)
}

/// The longest frame a VM may send that still fits the uplink once encapsulated (the
/// engine's egress check); VM ports segment super-frames to it.
pub fn vm_max_frame(cfg: &Config) -> usize {
    (cfg.uplink.mtu + 14).saturating_sub(ENCAP_OVERHEAD)
}

/// [`vm_max_frame`] for a VM of `tenant`: less the sealing overhead when the tenant
/// encrypts.
fn vm_max_frame_of(cfg: &Config, tenant: &str) -> usize {
    let encrypts = cfg.tenants.iter().any(|t| t.name == tenant && t.encrypt);
    vm_max_frame(cfg).saturating_sub(if encrypts {
        picnic_wire::seal::SEAL_OVERHEAD
    } else {
        0
    })
}

/// The tenant ports (every port but the uplink) as (interface name, slot = port index).
fn tenant_ports(ports: &[Option<Box<dyn Port>>]) -> Vec<(String, u32)> {
    ports
        .iter()
        .enumerate()
        .skip(1)
        .filter_map(|(i, p)| Some((p.as_ref()?.name().to_string(), i as u32)))
        .collect()
}

impl Switch {
    /// Opens every port of the config and builds the engines. Prints the backend of each port.
    pub fn open(cfg: Config) -> anyhow::Result<Switch> {
        let clock = Clock::new();
        let mut engine = Engine::new(&cfg, clock.now())?;
        calibrate_offloads(&mut engine);
        let feedback_key = match &cfg.switch.feedback_key_file {
            Some(path) => Some(crate::config::read_secret(
                path,
                "switch.feedback_key_file",
            )?),
            None => None,
        };
        if let Some(key) = &feedback_key {
            engine
                .set_feedback_key(key, clock.wall_at_zero_ns())
                .map_err(|e| anyhow::anyhow!("switch.feedback_key_file: {e}"))?;
        }
        let vm_ports = cfg
            .vms
            .iter()
            .filter(|vm| vm.port.is_some() && vm.host == cfg.switch.host_id)
            .count();
        let workers = crate::workers::worker_count(&cfg, vm_ports);
        if workers > 1 && crate::workers::encrypts(&cfg) {
            anyhow::bail!(
                "switch.workers = {workers}: a tenant encrypts (tenants[].encrypt), and the shared encryption engine runs with one worker only; set switch.workers = 1"
            );
        }
        if workers > 1 && crate::workers::drives_ebpf(&cfg) {
            eprintln!(
                "picnic switch: warning: with {workers} workers the uplink's XDP early drop and the softirq accounting are not driven (switch.workers = 1 keeps them)"
            );
        }
        let (mut uplinks, early_drop) = crate::workers::open_uplinks(&cfg, workers)?;
        let extra_uplinks = uplinks.split_off(1);
        let mut ports = uplinks;
        for (i, vm) in cfg.vms.iter().enumerate() {
            if let Some(p) = vm.port.as_ref().filter(|_| vm.host == cfg.switch.host_id) {
                ports.push(open_port(
                    &p.ifname,
                    p.backend,
                    &format!("vms[{i}].port.ifname"),
                    vm_max_frame_of(&cfg, &vm.tenant),
                )?);
            }
        }
        // Only while Iron runs (some tenant has an allocation): the tracepoints cost every
        // packet of the host (docs/switch.md "eBPF").
        // With several workers the eBPF programs are not driven (docs/switch.md "Workers").
        let softirq = cfg.isolation.cpu_accounting
            && cfg.isolation.softirq_accounting
            && cfg.tenants.iter().any(|t| t.cpu_quota.is_some())
            && workers == 1;
        let accel = Accel::from_config(&cfg)?;
        let mut switch = Self::with_ports(cfg, engine, ports, clock);
        let kernel = KernelLink::open(early_drop, softirq, &tenant_ports(&switch.ports));
        switch.kernel = kernel;
        switch.set_accel(accel);
        switch.workers = workers;
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
            pool: FramePool::new(cfg.switch.frame_pool),
            engine,
            ports: ports.into_iter().map(Some).collect(),
            clock,
            work,
            stop: Arc::new(AtomicBool::new(false)),
            shared: Arc::new(Shared::default()),
            commands: None,
            opening: None,
            waits: Vec::new(),
            kernel: KernelLink::default(),
            accel: None,
            accel_scratch: Exchange::default(),
            cgroups: Vec::new(),
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
        lines
    }

    /// Set to true to make [`Switch::run`] return.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
    pub fn command_channel(&mut self) -> mpsc::Sender<Command> {
        let (tx, rx) = mpsc::channel();
        self.commands = Some(rx);
        tx
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
        setup_thread(&self.cfg, self.cfg.switch.cpus.as_deref())?;
        self.cgroups = self.open_cgroups()?;
        let mut quotas = Vec::new();
        self.kernel.set_dataplane_thread();
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
            // (sealed ones are sent by the next iteration).
            if let Some(accel) = &self.accel {
                busy += accel.exchange(
                    &mut self.engine,
                    now,
                    &mut self.pool,
                    &mut self.accel_scratch,
                );
            }
            if busy > 0 {
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
            let timeout = until.min(Duration::from_millis(5));
            fds.clear();
            // A port held back for lack of queue room stays readable: waiting on it would
            // wake the loop at once, again and again. Its queue drains by the deadline.
            fds.extend(
                (0..self.ports.len())
                    .filter(|&p| self.engine.rx_ready(now, p, batch))
                    .filter_map(|p| self.ports[p].as_ref()?.raw_fd()),
            );
            // The shared engine's results wake the loop too.
            fds.extend(
                self.accel
                    .as_ref()
                    .and_then(Accel::notify_fd)
                    .map(|fd| fd.as_raw_fd()),
            );
            wait_readable(&fds, std::time::Duration::from_nanos(timeout.as_nanos()))?;
        }
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
                eprintln!("picnic switch: warning: restoring a tenant's quota: {e:#}");
            }
        }
    }

    fn publish(&mut self, now: Instant) {
        self.kernel.publish(&mut self.engine, now);
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
        let switch = self.engine.snapshot();
        let workers = vec![WorkerView {
            worker: 0,
            vms: switch.vms.iter().map(|v| v.name.clone()).collect(),
            cpu_ns: switch.switch.cpu_ns,
            handoff: Default::default(),
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

    /// Replaces the shared engine; the old one's frames go back to the pool.
    fn set_accel(&mut self, accel: Option<Accel>) {
        if let Some(old) = self.accel.take() {
            let mut frames = Vec::new();
            old.shutdown(&mut frames);
            for f in frames {
                self.pool.put(f);
            }
        }
        self.shared.set_accel_keys(accel.as_ref().map(Accel::keys));
        self.accel = accel;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's own ring wait (not a copy of its parameters): spins for a producer whose
    /// frames come 2 us apart, blocks for one 1 ms apart.
    #[test]
    fn ring_wait_spins_for_a_2us_producer_and_blocks_for_a_1ms_one() {
        for (period, spin) in [(2_000, true), (1_000_000, false)] {
            let mut wait = ring_wait(Duration::from_micros(50));
            for i in 0..=64u64 {
                wait.observe(Instant::from_nanos(i * period), i);
            }
            let last = Instant::from_nanos(64 * period);
            let expected = if spin {
                WaitDecision::Spin {
                    until: last + Duration::from_micros(50),
                }
            } else {
                WaitDecision::Block
            };
            assert_eq!(
                wait.decide(last, RING_SLOTS),
                expected,
                "period {period} ns"
            );
        }
    }
}
