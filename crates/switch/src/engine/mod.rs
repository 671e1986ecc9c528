//! The switch's packet engines, sans-I/O (DESIGN.md section 2): they take batches of frames
//! and `now`, and leave frames to send in per-port transmit queues; only the port backends
//! and the run loop touch the OS, so the simulator can drive exactly this code.
//!
//! Egress (PicNIC Fig. 1): classify -> policy -> admission control -> per-VM queues -> root
//! WFQ -> encap -> uplink. Ingress: decap -> classify -> per-VM bounded queue -> CPU-fair WFQ
//! -> deliver, with rate meters, RX scheduler and RCP producing feedback (EyeQ 3.2-3.4).
//!
//! Cheap before expensive (DESIGN.md section 4): before a frame is queued the engines only
//! parse headers and look up tables; the per-packet processing cost (synthetic rule
//! evaluation, delivery) is spent after the scheduler chose the frame, and is measured by the
//! caller's [`Work`] so it can be charged to the tenant it was spent for (Iron 3).

pub mod antispoof;
mod arp;
mod backpressure;
mod budgets;
mod capacity;
mod cpu;
mod egress;
pub mod fastpath;
pub mod feedback;
mod ingress;
mod jobs;
mod kernel;
mod link_share;
mod live;
mod offload;
mod queues;
mod sealing;
mod share;
mod slo;

use std::sync::Arc;

use picnic_core::bucket::TokenBucket;
use picnic_core::eyeq;
use picnic_core::{Duration, Instant, Rate};
use picnic_wire::feedback::FeedbackOption;
use picnic_wire::geneve::standalone_feedback;
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap_headers, encap_headers_len, OuterHeaders};
use serde::Serialize;

use crate::config::{Config, Isolation, Mac};
use crate::directory::{Directory, PortIdx, TenantIdx, VmIdx, UPLINK};
use crate::frame::{Frame, FramePool};
use crate::stats::{DropReason, SwitchCounters, VmCounters};
use picnic_core::wfq::CostKind;

use budgets::WorkerBudgets;

pub use budgets::{tenant_quotas, SharedBudgets};
pub use egress::{pacer_rate, Egress};
pub use ingress::Ingress;
pub use jobs::{Completion, Job, Op, Outcome};
pub use kernel::{SoftirqDelta, XdpThrottle, XDP_CPU, XDP_PPS};
pub use link_share::split_link;
pub use live::{ChangeFailed, PortChange};
pub use sealing::AccelUse;
pub use slo::{kind_name, Late, SloReport, TenantSlo, Totals, Why, WindowView, SLO_WINDOW};

/// Extra per-frame processing done after the ingress scheduler picked a frame: the optional
/// synthetic rule-set cost (`ingress.work_ns`), or the simulator's modelled cost. Returns the
/// ns it took, which the frame's scheduler charge includes. The loop's own CPU time (I/O,
/// engines) is measured per iteration and charged through [`Engine::charge_cpu`].
pub trait Work {
    fn process(&mut self, tenant: TenantIdx, frame: &mut Frame) -> u64;
}

/// How long after the last feedback a sender's limiter halves.
const FEEDBACK_TIMEOUT: Duration = Duration::from_millis(100);
/// Iron's accounting period, which is also the period of the cgroups the switch charges.
pub const IRON_PERIOD: Duration = Duration::from_millis(10);

/// The CPU the switch may spend per Iron period on `tenant`'s frames, if it has a quota. With a
/// cgroup, switch work and the cgroup's quota share the allocation (Iron 3.2), and the cgroup
/// never gets less than cgroup v1's minimum: the switch's part stops that much short, so
/// together they stay within it.
pub fn iron_quota(tenant: &crate::directory::Tenant) -> Option<Duration> {
    let q = tenant.cpu_quota?;
    let allocation = Duration::from_nanos((IRON_PERIOD.as_nanos() as f64 * q) as u64);
    Some(match tenant.cgroup {
        Some(_) => Duration::from_nanos(
            allocation
                .as_nanos()
                .saturating_sub(cpu::CGROUP_MIN_QUOTA.as_nanos())
                .max(100_000),
        ),
        None => allocation,
    })
}

/// Both engines of one host plus the tables they share.
pub struct Engine {
    pub dir: Directory,
    pub isolation: Isolation,
    host_id: u32,
    uplink_mtu: usize,
    /// Bytes of outer headers a tenant frame gets on the wire (without a feedback option).
    encap_len: u64,
    /// The access link's rate, bytes/s: what the kernel fast path's per-VM shares divide.
    link_bytes: u64,
    egress: Egress,
    ingress: Ingress,
    /// The tenants' Iron accounts (one per tenant with a CPU quota) and this engine's slice of
    /// each: accounts of its own, or, as one of several workers, the accounts every worker
    /// draws from (see [`crate::workers`]). None: no tenant has a quota.
    budgets: Option<WorkerBudgets>,
    /// Per local VM with `max_pps`: packets it may send into / receive from the switch.
    pps_out: Vec<Option<TokenBucket>>,
    pps_in: Vec<Option<TokenBucket>>,
    /// Per VM: whether the uplink's XDP program holds it back for its packet budget.
    xdp_pps: Vec<bool>,
    /// Frames handled per VM since the loop last charged its CPU time.
    cpu: cpu::CpuLedger,
    /// Since when the loop has been idle (its last pass found nothing), until its next pass
    /// notes the idle time: the EyeQ receivers' meter windows that end meanwhile are closed
    /// as at their ends when next needed ([`Engine::catch_up`]), not on a timer.
    idle_from: Option<Instant>,
    /// Per-tenant CPU used in the current period of a saturated loop (read-side fairness).
    share: share::FairShare,
    /// SLO monitors of the tenants that have one (DESIGN.md 3.9).
    slo: slo::SloTracker,
    /// The deployment's feedback keys with this host's nonces and replay windows (see
    /// [`feedback`]): feedback is authenticated while one is active.
    feedback_auth: feedback::FeedbackAuthState,
    /// Whether both schedulers share the dominant resource (CPU or link time) instead of
    /// bytes.
    cpu_fair: bool,
    /// Whether ports are read fairly ([`share`]): with the schedulers, in their resource.
    fair_reads: bool,
    /// Frames waiting for each port's transmit, filled by the engines, drained by the caller.
    tx: Vec<Vec<Frame>>,
    /// Frames of encrypting tenants waiting to be sealed or opened (`sealing.rs`).
    accel_jobs: Vec<Job>,
    /// Per tenant: its use of the shared engine.
    accel_use: Vec<AccelUse>,
    /// Per tenant: jobs its engine queue can still take, and the queue's depth, as the
    /// engine last reported them (`AccelPort::exchange`); a tenant missing is not held.
    accel_room: Vec<usize>,
    accel_depth: usize,
    /// Tenants' packet programs (`offload.rs`).
    offload: offload::Offloads,
    pub vm_counters: Vec<VmCounters>,
    pub counters: SwitchCounters,
}

impl Engine {
    /// Builds the engines for a validated config, starting at `now`: an empty engine to
    /// which the config's tenants, hosts and VMs are added as live changes would add them.
    pub fn new(cfg: &Config, now: Instant) -> anyhow::Result<Engine> {
        let mut engine = Engine {
            dir: Directory::new(),
            isolation: cfg.isolation.clone(),
            host_id: cfg.switch.host_id,
            encap_len: encap_headers_len(&GeneveRepr::ethernet(1)) as u64,
            link_bytes: cfg
                .uplink
                .capacity()
                .unwrap_or(cfg.ingress.capacity())
                .bytes_per_sec(),
            uplink_mtu: cfg.uplink.mtu,
            egress: Egress::new(cfg, now)?,
            ingress: Ingress::new(cfg, now)?,
            budgets: None,
            pps_out: Vec::new(),
            pps_in: Vec::new(),
            xdp_pps: Vec::new(),
            cpu: cpu::CpuLedger::default(),
            idle_from: None,
            share: share::FairShare::new(share_unit(cfg), Vec::new(), now),
            slo: slo::SloTracker::default(),
            feedback_auth: Default::default(),
            cpu_fair: cfg.isolation.cpu_fair,
            fair_reads: cfg.isolation.cpu_fair
                || cfg.isolation.egress_wfq
                || cfg.isolation.ingress_wfq,
            tx: vec![Vec::with_capacity(cfg.switch.batch * 2)],
            vm_counters: Vec::new(),
            accel_jobs: Vec::with_capacity(cfg.switch.batch * 2),
            accel_use: Vec::new(),
            accel_room: Vec::new(),
            accel_depth: 0,
            offload: offload::Offloads::new(cfg),
            counters: SwitchCounters::default(),
        };
        engine
            .feedback_auth
            .install(cfg.feedback_keys.as_ref())
            .map_err(|e| anyhow::anyhow!("feedback_keys: {e}"))?;
        for (i, t) in cfg.tenants.iter().enumerate() {
            engine
                .add_tenant(now, t)
                .map_err(|e| anyhow::anyhow!("tenants[{i}]: {e}"))?;
        }
        for h in &cfg.hosts {
            engine.dir.set_host(h);
        }
        for (i, v) in cfg.vms.iter().enumerate() {
            engine
                .add_vm(now, v)
                .map_err(|e| anyhow::anyhow!("vms[{i}]: {e}"))?;
        }
        for q in &mut engine.tx {
            q.reserve(cfg.switch.batch * 2);
        }
        Ok(engine)
    }

    /// Sets the wall-clock time at this engine's `Instant::ZERO` (ns since the UNIX epoch),
    /// for the nonces' timestamps, and `switch.feedback_key_file`'s key: while the config has
    /// no `feedback_keys` (the control plane's), feedback this host sends is authenticated
    /// with it and the feedback it receives must be.
    pub fn set_feedback_key(
        &mut self,
        file_key: Option<&[u8]>,
        wall_at_zero_ns: u64,
    ) -> Result<(), String> {
        self.feedback_auth.set_file_key(file_key, wall_at_zero_ns)
    }

    /// The feedback key epochs held, oldest first, and the one this host signs with.
    pub fn feedback_epochs(&self) -> (Vec<u32>, Option<u32>) {
        self.feedback_auth.epochs()
    }

    /// Whether the caller should read `port` now. A VM port whose egress queue cannot take
    /// another batch is not read (backpressure: the VM's frames wait in its own ring rather
    /// than being dropped here, PicNIC 2.1), nor one over its packet rate or whose tenant
    /// used its CPU allocation (Iron 3.2: no work is spent on a throttled tenant's frames),
    /// whose tenant's queue at the shared engine cannot take a batch (FairNIC 5.2's
    /// back-pressure), or whose tenant's offload program spent its period's fuel.
    pub fn rx_ready(&self, now: Instant, port: PortIdx, batch: usize) -> bool {
        match self.dir.port_vm.get(port) {
            // Without admission isolation a VM's shaped class shares the VM's one queue, as
            // in the stacks PicNIC 2.1 describes: while shaped frames wait, nothing behind
            // them is read (head-of-line blocking of the fast path).
            Some(Some(vm)) => {
                self.egress.has_room(*vm, batch)
                    && (self.isolation.admission || !self.egress.shaped_backlog(*vm))
                    && self.pps_out[*vm]
                        .as_ref()
                        .is_none_or(|b| b.available(now) > 0)
                    && !self.cpu_throttled(now, *vm)
                    && !(self.fair_reads && self.share.over(self.dir.vms[*vm].tenant))
                    && !self.accel_held(*vm, batch)
                    && !self.offload_held(now, *vm)
            }
            _ => true,
        }
    }

    /// Whether `vm`'s tenant has used its CPU allocation for this period (Iron 3.2): its port
    /// is then not read, so its frames wait or are dropped by the kernel at the sender's
    /// expense, before the switch spends any work on them.
    fn cpu_throttled(&self, now: Instant, vm: VmIdx) -> bool {
        let tenant = self.dir.vms[vm].tenant;
        self.budgets
            .as_ref()
            .is_some_and(|b| b.exhausted(now, tenant))
    }

    /// Makes this engine one of several workers': tenants' CPU is charged to and checked
    /// against `budgets`' accounts, one per tenant for every worker (Iron 3.2), through slices
    /// of this engine's own, which replace its own accounts; so is the uplink's pacing shared;
    /// the feedback it signs uses nonce lane `worker`.
    pub fn join_workers(&mut self, budgets: Arc<SharedBudgets>, worker: usize) {
        self.egress.share_pacer(&budgets);
        self.budgets = Some(WorkerBudgets::new(budgets, true, self.budgets.take()));
        self.feedback_auth.set_lane(worker as u8);
    }

    /// Returns the time this worker's slices hold to the shared accounts (it stops).
    pub fn leave_workers(&mut self, now: Instant) {
        self.egress.release_pacer(now);
        if let Some(b) = self.budgets.as_mut() {
            b.release(now);
        }
    }

    /// Takes the frames received on `port`: classifies, polices and queues or drops each.
    pub fn on_frames(
        &mut self,
        now: Instant,
        port: PortIdx,
        frames: &mut Vec<Frame>,
        pool: &mut FramePool,
    ) {
        for frame in frames.drain(..) {
            let len = frame.len();
            if port == UPLINK {
                let owner = self.from_uplink(now, frame, pool);
                self.cpu.note(owner, len);
            } else if let Some(Some(vm)) = self.dir.port_vm.get(port).copied() {
                self.cpu.note(Some(vm), len);
                self.share.read(self.dir.vms[vm].tenant);
                self.from_vm(now, vm, port, frame, pool);
            } else {
                self.cpu.note(None, len);
                pool.put(frame);
            }
        }
    }

    /// Runs the schedulers: up to `budget` frames of each direction are processed and moved
    /// to transmit queues. Returns how many frames were processed.
    pub fn poll(
        &mut self,
        now: Instant,
        budget: usize,
        work: &mut dyn Work,
        pool: &mut FramePool,
    ) -> usize {
        self.on_timeout(now);
        let mut done = self.egress_poll(now, budget, pool);
        done += self.ingress_poll(now, budget, work, pool);
        done
    }

    /// Returns every frame this engine holds (queued in either direction, in shaped and
    /// limiter queues, waiting for transmit) to `pool`; the engine is empty afterwards.
    /// Call it before dropping an engine, or the pool shrinks by what it held.
    pub fn release_frames(&mut self, pool: &mut FramePool) {
        for frame in self.egress.take_frames() {
            pool.put(frame);
        }
        for frame in self.ingress.take_frames() {
            pool.put(frame);
        }
        for q in &mut self.tx {
            for frame in q.drain(..) {
                pool.put(frame);
            }
        }
        for job in self.accel_jobs.drain(..) {
            pool.put(job.frame);
        }
    }

    /// Frames waiting to be sent on `port`.
    pub fn tx_queue(&mut self, port: PortIdx) -> &mut Vec<Frame> {
        &mut self.tx[port]
    }

    /// The earliest time something becomes due without new input (a shaper's head becomes
    /// sendable, a cap lifts, a quota period starts). EyeQ's meter windows are not waited
    /// for: they are closed when read ([`Engine::catch_up`]).
    pub fn poll_at(&self) -> Option<Instant> {
        // A throttled tenant's refill, and the tenants' cgroups' (one loop).
        let iron = [
            self.budgets.as_ref().and_then(|b| b.refill_at),
            self.cgroups_due(),
        ]
        .into_iter()
        .flatten()
        .min();
        // A port held back by its packet rate becomes readable when a token is back.
        let pps = self
            .pps_out
            .iter()
            .flatten()
            .filter_map(|b| b.next_token_at())
            .min();
        [
            self.egress.poll_at(),
            self.ingress.poll_at(),
            iron,
            pps,
            self.share.poll_at(),
            self.xdp_poll_at(),
            self.offload.poll_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Brings the EyeQ receivers' state up to `now` outside a pass: their meter windows
    /// that ended are closed as the timers the loop used to wake for would have closed them
    /// (`Ingress::catch_up`). A pass after idle time does it ([`Engine::note_idle`]); call
    /// it before reading their state otherwise (stats: [`Engine::snapshot`]'s advertised
    /// rates).
    pub fn catch_up(&mut self, now: Instant) {
        match self.idle_from {
            Some(from) => self.ingress.catch_up(from, now),
            None => self.ingress.on_timeout(now),
        }
    }

    fn on_timeout(&mut self, now: Instant) {
        self.egress.on_timeout(now);
        self.ingress.on_timeout(now);
        if let Some(b) = self.budgets.as_mut() {
            b.refill_at = b.poll_at(now);
        }
        self.offload.on_timeout(now);
    }

    /// Drops a frame for `reason`, counted against `vm` (the local VM it came from or was
    /// for, or the remote VM it was for) and as lost in its tenant's SLO, or against the
    /// switch when it belongs to no VM.
    fn drop_frame(
        &mut self,
        now: Instant,
        pool: &mut FramePool,
        frame: Frame,
        vm: Option<VmIdx>,
        reason: DropReason,
    ) {
        match vm {
            Some(v) => {
                self.vm_counters[v].drops.add(reason);
                self.slo.lost(now, self.dir.vms[v].tenant, reason);
            }
            None => self.counters.drops.add(reason),
        }
        pool.put(frame);
    }

    /// Writes the outer headers for a frame to a remote VM's host in front of the frame.
    fn encap(
        &self,
        frame: &mut Frame,
        dst_host: u32,
        vni: u32,
        entropy: u16,
        feedback: Option<FeedbackOption>,
    ) -> bool {
        let (Some(me), Some(peer)) = (
            self.dir.hosts.get(&self.host_id),
            self.dir.hosts.get(&dst_host),
        ) else {
            return false;
        };
        let outer = OuterHeaders {
            src_mac: me.mac.0,
            dst_mac: peer.mac.0,
            src_ip: me.underlay_ip,
            dst_ip: peer.underlay_ip,
            src_port: entropy,
            ttl: 64,
        };
        let mut geneve = GeneveRepr::ethernet(vni);
        geneve.feedback = feedback;
        let inner_len = frame.len();
        let headers = encap_headers_len(&geneve);
        match frame.prepend(headers) {
            Some(out) => encap_headers(&outer, &geneve, inner_len, out).is_ok(),
            None => false,
        }
    }

    /// Sends congestion feedback about local VM `vm` to host `to` in a standalone packet.
    fn send_feedback(
        &mut self,
        now: Instant,
        pool: &mut FramePool,
        to: u32,
        vm: VmIdx,
        rate_bytes_per_sec: u64,
        seq: u32,
    ) {
        let Some(mut frame) = pool.get() else {
            self.counters.drops.add(DropReason::NoBuffer);
            return;
        };
        let v = &self.dir.vms[vm];
        let fb = FeedbackOption {
            dst_endpoint: v.id,
            // At least 1 b/s: receivers refuse 0 as out of range.
            rate_bps: rate_bytes_per_sec
                .saturating_mul(8)
                .clamp(1, feedback::MAX_FEEDBACK_BPS),
            seq,
        };
        let vni = self.dir.tenants[v.tenant].vni;
        let mut geneve = standalone_feedback(vni, fb);
        let (Some(me), Some(peer)) = (self.dir.hosts.get(&self.host_id), self.dir.hosts.get(&to))
        else {
            pool.put(frame);
            return;
        };
        geneve.feedback_auth =
            self.feedback_auth
                .sign(now, me.underlay_ip, peer.underlay_ip, vni, &fb);
        let outer = OuterHeaders {
            src_mac: me.mac.0,
            dst_mac: peer.mac.0,
            src_ip: me.underlay_ip,
            dst_ip: peer.underlay_ip,
            src_port: picnic_wire::overlay::entropy_source_port(v.id),
            ttl: 64,
        };
        match picnic_wire::overlay::encap(&outer, &geneve, &[], frame.buf_for_rx()) {
            Ok(n) => {
                frame.set_len(n);
                self.cpu.note(Some(vm), n);
                self.counters.feedback_sent += 1;
                self.tx[UPLINK].push(frame);
            }
            Err(_) => pool.put(frame),
        }
    }

    /// A serializable view of every counter and mechanism state, for the API and metrics.
    pub fn snapshot(&self) -> Snapshot {
        let vms = self
            .dir
            .vms
            .iter()
            .enumerate()
            .filter(|(_, v)| v.port.is_some())
            .map(|(i, v)| VmSnapshot {
                name: v.name.clone(),
                id: v.id,
                worker: 0,
                tenant: self.dir.tenants[v.tenant].name.clone(),
                mac: v.mac,
                counters: self.vm_counters[i].clone(),
                egress_queue: self.egress.queue_len(i),
                ingress_queue: self.ingress.queue_len(i),
                advertised_bps: self
                    .ingress
                    .advertised(i)
                    .map(|r| Rate::from_bytes_per_sec(r).bps()),
                applied_limits: self.applied_limits(i),
            })
            .collect();
        let tenants = self
            .dir
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, tenant)| tenant.present)
            .map(|(t, tenant)| {
                // What this engine's slice of the tenant's account counted (with workers, each
                // counts its own: the coordinator sums them).
                let shared = self
                    .budgets
                    .as_ref()
                    .and_then(|b| Some(b.slices.get(t)?.stats()));
                TenantSnapshot {
                    name: tenant.name.clone(),
                    vni: tenant.vni,
                    cost_ns: self
                        .dir
                        .vms
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.tenant == t)
                        .map(|(i, _)| self.vm_counters[i].cost_ns)
                        .sum(),
                    cpu_throttle_drops: shared.map_or(0, |s| s.throttle_drops + s.early_drops),
                    cpu_charged_ns: shared.map_or(0, |s| s.charged_ns),
                    softirq_ns: self
                        .dir
                        .vms
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.tenant == t)
                        .map(|(i, _)| self.vm_counters[i].softirq_ns)
                        .sum(),
                    accel: tenant.encrypt.then(|| self.accel_use[t].clone()),
                    offload: self.offload_stats(t),
                }
            })
            .collect();
        Snapshot {
            host_id: self.host_id,
            vms,
            tenants,
            switch: self.counters.clone(),
            cost_model: self.cpu.model().map(|c| CostModelView {
                fixed_ns: c.fixed_ns,
                per_frame_ns: c.per_packet_ns,
                per_byte_ns: c.per_byte_ns,
            }),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub host_id: u32,
    pub vms: Vec<VmSnapshot>,
    pub tenants: Vec<TenantSnapshot>,
    pub switch: SwitchCounters,
    /// The loop's measured cost model (per iteration, per frame handling, per byte).
    pub cost_model: Option<CostModelView>,
}

/// The fitted CPU cost of the dataplane loop, ns (see `engine::cpu`).
#[derive(Clone, Debug, Serialize)]
pub struct CostModelView {
    pub fixed_ns: f64,
    pub per_frame_ns: f64,
    pub per_byte_ns: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VmSnapshot {
    pub name: String,
    pub id: u32,
    /// The dataplane worker that owns the VM's port (see [`crate::workers`]).
    pub worker: usize,
    pub tenant: String,
    pub mac: Mac,
    pub counters: VmCounters,
    pub egress_queue: usize,
    pub ingress_queue: usize,
    /// Rate this host advertises to senders of this VM (EyeQ R_i), bits/s.
    pub advertised_bps: Option<u64>,
    /// Limits applied by this host to this VM's traffic towards congested destinations:
    /// (destination endpoint id, bits/s).
    pub applied_limits: Vec<(u32, u64)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TenantSnapshot {
    pub name: String,
    pub vni: u32,
    pub cost_ns: u64,
    pub cpu_throttle_drops: u64,
    pub cpu_charged_ns: u64,
    /// Kernel softirq time on the tenant's ports charged to it (eBPF), ns.
    pub softirq_ns: u64,
    /// Use of the shared encryption engine (tenants with `encrypt = true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accel: Option<AccelUse>,
    /// The tenant's offload program's runs, faults, fuel and counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<crate::offload::OffloadStats>,
}

/// What both schedulers share: with `isolation.cpu_fair` the dominant resource a frame uses
/// (its measured CPU or its time on the link, whichever is larger: one scheduler over bits
/// and cycles, as BESS; PicNIC's CPU-fair WFQ when the CPU is the bottleneck), otherwise
/// bytes.
fn cost_kind(cfg: &Config) -> CostKind {
    if cfg.isolation.cpu_fair {
        CostKind::Measured {
            initial_estimate: 1_000,
            ewma_shift: 3,
        }
    } else {
        CostKind::Bytes
    }
}

/// What read-side fairness counts: the resource the schedulers share.
fn share_unit(cfg: &Config) -> share::ShareUnit {
    if cfg.isolation.cpu_fair {
        share::ShareUnit::CpuNs
    } else {
        share::ShareUnit::Bytes
    }
}

/// EyeQ sender configuration used by the egress engine. Limiters are keyed by destination
/// endpoint, so the table needs room for the directory's endpoints only (twice, at least
/// 64): its size is what `poll_at`/`on_timeout` scan on every poll.
fn sender_config(cfg: &Config) -> eyeq::SenderConfig {
    let defaults = eyeq::SenderConfig::default();
    eyeq::SenderConfig {
        feedback_timeout: FEEDBACK_TIMEOUT,
        floor: cfg.egress.min_rate().bytes_per_sec(),
        max_limiters: (cfg.vms.len() * 2).clamp(64, defaults.max_limiters),
        ..defaults
    }
}

#[cfg(test)]
mod cpu_tests;
#[cfg(test)]
mod feedback_tests;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod offload_tests;
#[cfg(test)]
mod sealing_tests;
#[cfg(test)]
mod slo_tests;
#[cfg(test)]
pub(crate) mod tests;
