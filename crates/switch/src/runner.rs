//! The switch: its ports, engines and kernel programs as opened from the config, and the
//! state that outlives a run. [`Switch::run`] runs it as a coordinator and its dataplane
//! workers ([`crate::coordinator`], [`crate::worker`]): one worker is the one-worker case of
//! the same model, not a loop of its own (docs/switch.md "Workers").
//!
//! Each worker polls its ports in turn (a VM port only when its egress queue has room:
//! backpressure), hands frames to the engines, runs the schedulers and sends what they
//! produced: one [`Driver::iterate`], the policy the simulator runs too. When there is nothing
//! to do it asks each port's adaptive wait (Rizzo et al., `picnic_core::notify`) whether to
//! spin or to block: while a port's producer is expected to deliver its next frame sooner than
//! a notification and wake-up cost, the worker polls (spin, at most `spin_us`), otherwise it
//! blocks on the ports' descriptors until the engines' next deadline. Several switches share 2
//! cores in the lab, so an idle switch must not burn a core (DESIGN.md section 7).

use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};

use anyhow::Context;
use picnic_core::Duration;

use crate::accel::Accel;
use crate::cgroup::CpuQuota;
use crate::config::Config;
use crate::directory::{PortIdx, TenantIdx};
use crate::ebpf::KernelLink;
use crate::engine::{Engine, IRON_PERIOD};
use crate::frame::FramePool;
use crate::port::Port;

mod command;
#[cfg(test)]
mod fake_port;
mod fastpath;
mod idle;
mod keeper;
mod live;
mod ports;
mod publish;
mod work;
pub use command::{CommandSender, Reconfigure};
pub(crate) use fastpath::FastPathLink;
pub(crate) use idle::{ring_wait, IdlePolicy};
use keeper::PortKeeper;
pub(crate) use live::{encryption_changed, take_named};
pub use ports::{open_port, open_uplinks, open_vm_port, vm_max_frame, PortOpener, PortSpec};
use ports::{tenant_ports, vm_max_frame_of};
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
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) commands: Option<mpsc::Receiver<Command>>,
    /// Opens and closes ports for live changes (started on the first).
    keeper: Option<PortKeeper>,
    /// Ports a stale change had opened, for the keeper.
    given_up: command::GivenUp,
    /// The eBPF programs' maps: the uplink's early drop, the ports' softirq time.
    pub(crate) kernel: KernelLink,
    /// The kernel fast path, when on (`[fastpath] kernel`): worker 0's while it runs.
    pub(crate) fastpath: Option<fastpath::FastPathLink>,
    /// Per tenant slot: the cgroup charged for its switch work (Iron), with its path.
    pub(crate) cgroups: Vec<Option<(std::path::PathBuf, CpuQuota)>>,
    /// The shared encryption engine, when a tenant encrypts (each worker has a port into it).
    pub(crate) accel: Option<Accel>,
    /// Dataplane workers (`switch.workers`, else [`crate::workers::worker_count`]).
    pub(crate) workers: usize,
    /// The uplink sockets of workers 1.. (worker 0 reads `ports[0]`).
    pub(crate) extra_uplinks: Vec<Box<dyn Port>>,
    /// `switch.feedback_key_file`'s key, for the engines of workers 1...
    pub(crate) feedback_key: Option<Vec<u8>>,
    /// Opens a new VM's port at a live change.
    pub(crate) opener: PortOpener,
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
        switch
            .shared
            .set_accel_keys(accel.as_ref().map(Accel::keys));
        switch.accel = accel;
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
        Switch {
            workers: cfg.switch.workers.unwrap_or(1),
            extra_uplinks: Vec::new(),
            feedback_key: None,
            opener: ports::real_opener(),
            pool: FramePool::new(cfg.switch.frame_pool),
            engine,
            ports: ports.into_iter().map(Some).collect(),
            clock,
            stop: Arc::new(AtomicBool::new(false)),
            shared: Arc::new(Shared::default()),
            commands: None,
            keeper: None,
            given_up: Default::default(),
            kernel: KernelLink::default(),
            fastpath: None,
            accel: None,
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
