//! Ingress engine: frames from the uplink (and from local VMs) to local VMs.
//!
//! decap -> tenant by VNI -> destination VM in that tenant -> Iron admission (a throttled
//! tenant's frame is dropped before any work, Iron 3.2) -> receiver meters and feedback
//! (EyeQ 3.2) -> bounded per-VM queue -> CPU-fair WFQ on measured processing cost (PicNIC)
//! -> processing ([`Work`]) -> delivery.
//!
//! The receiver controls two resources, as PicNIC's capacity varies in bytes/s and in
//! packets/s: the access link (bytes/s, capacity `ingress.capacity_mbps`) and the ingress
//! engine's CPU (ns of processing per second, one core). Each runs EyeQ's RX scheduler and
//! RCP per VM; the rate advertised to senders is the smaller of the link rate and the CPU
//! rate converted to bytes with the VM's measured bytes per ns of processing. So a flood of
//! small expensive packets is pushed back at its senders even when it uses little bandwidth.

use picnic_core::bucket::TokenBucket;
use picnic_core::eyeq::{EndpointConfig, Receiver, ReceiverConfig};
use picnic_core::iron::Admission;
use picnic_core::time::NANOS_PER_SEC;
use picnic_core::wfq::Dequeued;
use picnic_core::{Duration, Instant, Rate};
use picnic_wire::overlay::decap;
use picnic_wire::Error as WireError;

use super::backpressure::Backpressure;
use super::capacity::CpuCapacity;
use super::egress::set_guarantee_lane;
use super::queues::VmQueues;
use super::slo::Waited;
use super::{cost_kind, feedback, Engine, Work, IRON_PERIOD};
use crate::config::{Config, Mac};
use crate::directory::{Directory, VmIdx};
use crate::frame::{Frame, FramePool};
use crate::stats::{DropReason, FeedbackReject};

/// A remote sender as the EyeQ receivers count them: its host and the inner source MAC,
/// since each sending VM has a limiter of its own.
type Sender = (u32, [u8; 6]);

pub struct Ingress {
    /// Queued frames with their destination VM and when they were queued (= when they
    /// entered the switch: frames are queued in the call that received them).
    q: VmQueues<(Frame, VmIdx, Instant)>,
    /// EyeQ receiver over the access link, in bytes/s.
    pub(super) link: Option<Receiver<VmIdx>>,
    /// EyeQ receiver over the ingress engine's CPU, in ns of processing per second.
    cpu: Option<Receiver<VmIdx>>,
    /// Per-VM EWMA of processing ns per byte, scaled by 2^16, to convert CPU rates to bytes.
    ns_per_byte_fp: Vec<u64>,
    /// Per VM: the sequence number of its last feedback. One counter for both receivers:
    /// each numbers its own samples, and a sender takes a number not above the last it
    /// applied as stale (EyeQ 3.3), so the CPU receiver's feedback was mostly discarded.
    /// Not reset when a VM is added again: its senders' limiters may outlive it.
    feedback_seq: Vec<u32>,
    /// Processing per poll before the loop goes back to reading its ports.
    cost_budget_ns: u64,
    /// What the engine can actually process per second (PicNIC: capacity is variable).
    capacity: CpuCapacity,
    /// Time one byte takes on the access link, ps: a frame's link cost in the CPU-fair WFQ.
    ps_per_wire_byte: u64,
    /// Whether the last poll ended with frames still queued (see `CpuLedger::wfq_cost`).
    cpu_bound: bool,
    /// Caps on the rates advertised for VMs whose frames were refused here lately.
    pub(super) backpressure: Option<Backpressure>,
    /// Local VMs with a packet-rate guarantee (`min_pps`) and its bucket: frames queued for
    /// them are processed up to that rate before the WFQ's turn, outside their share, as the
    /// egress engine serves what they send.
    guaranteed: Vec<(VmIdx, TokenBucket)>,
    /// With the ingress WFQ on (each VM has its own queue): the least burst of a lane, a batch.
    lanes: Option<u64>,
}

impl Ingress {
    /// Every frame queued (the engine is being dropped).
    pub(super) fn take_frames(&mut self) -> Vec<Frame> {
        self.q.take_all().into_iter().map(|item| item.0).collect()
    }

    /// An ingress engine without VMs ([`Ingress::add_vm`] adds them).
    pub fn new(cfg: &Config, now: Instant) -> anyhow::Result<Ingress> {
        let q = VmQueues::new(
            cost_kind(cfg),
            cfg.ingress.queue_packets,
            cfg.isolation.ingress_wfq,
            "ingress scheduler",
        );
        let (link, cpu, backpressure) = if cfg.isolation.feedback {
            let headroom_permille = (cfg.ingress.headroom * 1000.0) as u32;
            let base = ReceiverConfig {
                headroom_permille,
                solo_headroom_permille: (cfg.ingress.solo_headroom * 1000.0) as u32,
                // The lowest rate advertised: 0.5% of the access link, at least 1 Mb/s (EyeQ's
                // floor). Low enough that many senders to one VM can be held to its share,
                // high enough that a throttled sender, whose feedback only comes with its own
                // packets, ramps back within a few windows.
                min_rate: (cfg.ingress.capacity().bytes_per_sec() / 200).max(125_000),
                ..Default::default()
            };
            // A meter window must hold several frames or y_i is mostly noise (EyeQ's 200 us
            // suits 10 Gb/s): at least ten full-size frames at the link's rate, at most 5 ms.
            let capacity = cfg.ingress.capacity().bytes_per_sec();
            let window_ns = (10 * 1514 * 1_000_000_000 / capacity.max(1)).clamp(200_000, 5_000_000);
            // Feedback at most once per window per endpoint unless 10 kB arrived (EyeQ 3.2
            // samples by bytes; a slow flow needs no message per packet).
            let window = Duration::from_nanos(window_ns);
            let base = ReceiverConfig {
                window,
                feedback_interval: Some(window),
                // A VM at its whole allotment with that rate already sent: a refresh every
                // 10 ms, a tenth of the senders' 100 ms halving. Each feedback wakes the
                // sender's switch; per window it was one per packet of a slow RPC, +10-20 us
                // on its round trip (docs/BENCHMARKS.md "The fast path at low load").
                quiet_feedback_interval: Some(Duration::from_millis(10)),
                // EyeQ's active set is 1 ms; a 1,000/s RPC then leaves it between requests and
                // comes back fresh, claiming its whole share for a window each time (defaults-
                // bursts: the victim's bulk held to 60 of its 90 Mb/s while its probe's
                // endpoint flapped). 3 ms keeps a steady flow down to ~350 pps active.
                idle_after: Duration::from_millis(3),
                ..base
            };
            let link_cfg = ReceiverConfig { capacity, ..base };
            // CPU: capacity one core (ns/s) until measured; feedback sampled every 0.5 ms of
            // processing.
            let cpu_cfg = ReceiverConfig {
                capacity: NANOS_PER_SEC,
                feedback_units: 500_000,
                min_rate: 1,
                ..base
            };
            let rerr = |e| anyhow::anyhow!("receiver rate control: {e:?}");
            let link = Receiver::new(link_cfg, now).map_err(rerr)?;
            let cpu = Receiver::new(cpu_cfg, now).map_err(rerr)?;
            let backpressure = Backpressure::new(IRON_PERIOD, link_cfg.min_rate, capacity, now);
            (Some(link), Some(cpu), Some(backpressure))
        } else {
            (None, None, None)
        };
        Ok(Ingress {
            q,
            link,
            cpu,
            ns_per_byte_fp: Vec::new(),
            feedback_seq: Vec::new(),
            cost_budget_ns: cfg.ingress.poll_budget_us * 1_000,
            capacity: CpuCapacity::new(NANOS_PER_SEC, now),
            ps_per_wire_byte: cfg.ingress.capacity().max(Rate::from_mbps(1)).ps_per_byte(),
            cpu_bound: false,
            backpressure,
            guaranteed: Vec::new(),
            lanes: cfg.isolation.ingress_wfq.then_some(cfg.switch.batch as u64),
        })
    }

    /// The EyeQ guarantees of local VM `vm` on the access link.
    fn link_endpoint(vm: &crate::directory::Vm) -> EndpointConfig {
        EndpointConfig {
            guarantee: Rate::from_bps(vm.min_bps).bytes_per_sec(),
            max_rate: vm.max_bps.map(|m| Rate::from_bps(m).bytes_per_sec()),
        }
    }

    /// Every local VM's CPU guarantee: its share of the core in proportion to its
    /// guarantee among the local VMs' (EyeQ's B_i on the CPU resource).
    fn set_cpu_shares(&mut self, dir: &Directory) -> Result<(), String> {
        let Some(cpu) = self.cpu.as_mut() else {
            return Ok(());
        };
        let total_min: u64 = dir
            .local_vms()
            .map(|(v, _)| dir.vms[v].min_bps)
            .sum::<u64>()
            .max(1);
        for (v, _) in dir.local_vms() {
            let share =
                (NANOS_PER_SEC as u128 * dir.vms[v].min_bps as u128 / total_min as u128) as u64;
            let config = EndpointConfig {
                guarantee: share.max(1),
                max_rate: None,
            };
            cpu.set_endpoint(v, config)
                .map_err(|e| format!("receiver rate control: {e:?}"))?;
        }
        Ok(())
    }

    /// The EyeQ receiver over the access link (None without feedback).
    pub(super) fn link(&self) -> Option<&Receiver<VmIdx>> {
        self.link.as_ref()
    }

    pub(super) fn link_mut(&mut self) -> Option<&mut Receiver<VmIdx>> {
        self.link.as_mut()
    }

    /// Adds local VM `vm` (already in `dir`): its queue, its tenant's new weight, its
    /// receiver endpoints, and every local VM's new CPU share.
    pub(super) fn add_vm(
        &mut self,
        now: Instant,
        dir: &Directory,
        vm: VmIdx,
    ) -> Result<(), String> {
        self.q.add_vm(now, dir, vm, None)?;
        self.ns_per_byte_fp.resize(dir.vms.len(), 0);
        self.ns_per_byte_fp[vm] = 0;
        self.feedback_seq.resize(dir.vms.len(), 0);
        if let Some(bp) = self.backpressure.as_mut() {
            bp.reset_vm(vm);
        }
        self.set_lane(now, dir, vm);
        let rerr = |e| format!("receiver rate control: {e:?}");
        if let Some(link) = self.link.as_mut() {
            link.add_endpoint(vm, Self::link_endpoint(&dir.vms[vm]))
                .map_err(rerr)?;
        }
        if let Some(cpu) = self.cpu.as_mut() {
            let config = EndpointConfig {
                guarantee: 1,
                max_rate: None,
            };
            cpu.add_endpoint(vm, config).map_err(rerr)?;
        }
        self.set_cpu_shares(dir)
    }

    /// Applies `vm`'s guarantee and cap in place: its leaf's and its tenant's weights, its
    /// link guarantee and cap, and every local VM's CPU share.
    pub(super) fn set_vm(
        &mut self,
        now: Instant,
        dir: &Directory,
        vm: VmIdx,
    ) -> Result<(), String> {
        self.q.set_vm(now, dir, vm, None)?;
        if let Some(link) = self.link.as_mut() {
            link.set_endpoint(vm, Self::link_endpoint(&dir.vms[vm]))
                .map_err(|e| format!("receiver rate control: {e:?}"))?;
        }
        self.set_lane(now, dir, vm);
        self.set_cpu_shares(dir)
    }

    /// `vm`'s packet-rate guarantee lane as `dir` says now (none without `min_pps`).
    fn set_lane(&mut self, now: Instant, dir: &Directory, vm: VmIdx) {
        set_guarantee_lane(&mut self.guaranteed, self.lanes, dir, vm, now);
    }

    /// Removes local VM `vm` of tenant `t` (already gone from `dir`'s local VMs): its queue
    /// and receiver endpoints; the other VMs' CPU shares grow. Returns its queued frames.
    pub(super) fn remove_vm(
        &mut self,
        dir: &Directory,
        vm: VmIdx,
        t: crate::directory::TenantIdx,
    ) -> Result<Vec<Frame>, String> {
        let items = self.q.remove_vm(dir, vm, t, |item| item.1 == vm)?;
        self.guaranteed.retain(|(v, _)| *v != vm);
        for r in [self.link.as_mut(), self.cpu.as_mut()]
            .into_iter()
            .flatten()
        {
            let _ = r.remove_endpoint(vm);
        }
        self.set_cpu_shares(dir)?;
        Ok(items.into_iter().map(|item| item.0).collect())
    }

    pub(super) fn queue_len(&self, vm: VmIdx) -> usize {
        self.q
            .queue(vm)
            .and_then(|q| self.q.wfq.queue_len(q))
            .unwrap_or(0)
    }

    /// The byte rate advertised for `vm`: the smaller of the link and CPU controllers' rates,
    /// and of the cap its refused frames set ([`Backpressure`]).
    pub(super) fn advertised(&self, vm: VmIdx) -> Option<u64> {
        let (controllers, cap) = self.rate_limits(vm)?;
        [controllers, cap].into_iter().flatten().min()
    }

    /// [`advertised`](Self::advertised), for a feedback about to leave. When backpressure's
    /// cap, not a controller, sets it, both controllers are told, so the VM is not sampled as
    /// quiet while capped and its senders learn within a feedback interval when the cap lifts
    /// ([`Receiver::fed_back_capped`]).
    fn feedback_rate(&mut self, vm: VmIdx) -> Option<u64> {
        let (controllers, cap) = self.rate_limits(vm)?;
        let rate = [controllers, cap].into_iter().flatten().min()?;
        if controllers > Some(rate) {
            for c in [self.link.as_mut(), self.cpu.as_mut()]
                .into_iter()
                .flatten()
            {
                c.fed_back_capped(vm);
            }
        }
        Some(rate)
    }

    /// The lower of the link and CPU controllers' rates for `vm` while it is active in them,
    /// bytes/s (the CPU's ns/s at the VM's measured CPU per byte), and backpressure's cap.
    /// `None` without both controllers.
    fn rate_limits(&self, vm: VmIdx) -> Option<(Option<u64>, Option<u64>)> {
        let active_rate =
            |r: &Receiver<VmIdx>| r.endpoint(vm).filter(|e| e.active).map(|e| e.advertised);
        let link = active_rate(self.link.as_ref()?);
        let cpu = active_rate(self.cpu.as_ref()?);
        let per_byte = self.ns_per_byte_fp[vm];
        let cpu_bytes = cpu
            .filter(|_| per_byte > 0)
            .map(|ns| ((ns as u128) << 16) / per_byte as u128)
            .map(|b| b.min(u64::MAX as u128) as u64);
        let cap = self.backpressure.as_ref().and_then(|b| b.cap(vm));
        Some(([link, cpu_bytes].into_iter().flatten().min(), cap))
    }

    /// The ingress scheduler's next deadline. The receivers' meter windows are not one: they
    /// are closed when read ([`Ingress::catch_up`]), not on a timer.
    pub(super) fn poll_at(&self) -> Option<Instant> {
        self.q.wfq.poll_at()
    }

    /// Closes the meter windows of both receivers that ended by `now`, for a loop that was
    /// busy until `idle_from` and idle since (`Receiver::catch_up`): each window that ended
    /// while it was idle as at its own end, one that ended while it was busy late, as the
    /// timer the loop used to wake for would have (EyeQ 3.2 recomputes the rates once per
    /// window).
    ///
    /// What a closed window changes (measured rates, the active set, the allocation, the
    /// advertised rates) is only observed when a frame arrives (`on_packet`, whose feedback
    /// reads both receivers), when the engine polls (before the capacity estimate is given
    /// to the CPU receiver), when the workers' link split reads the aggregate, at a live
    /// change, and when stats are published. The windows are closed then, lazily, and no
    /// longer wake the loop: a 1,000/s RPC kept an endpoint active and woke each switch
    /// every window (605 us at 200 Mb/s) for a pass that handled no frame
    /// (docs/BENCHMARKS.md, "The fast path at low load").
    pub(super) fn catch_up(&mut self, idle_from: Instant, now: Instant) {
        for r in [self.link.as_mut(), self.cpu.as_mut()]
            .into_iter()
            .flatten()
        {
            r.catch_up(idle_from, now);
        }
    }

    /// Closes, late, the meter windows that ended while the loop was busy, at the first
    /// pass after them (as before: the loop did not sleep, so no timer was late).
    pub(super) fn on_timeout(&mut self, now: Instant) {
        for r in [self.link.as_mut(), self.cpu.as_mut()]
            .into_iter()
            .flatten()
        {
            if r.poll_at().is_some_and(|t| t <= now) {
                r.on_timeout(now);
            }
        }
    }
}

impl Engine {
    /// A frame from the uplink: overlay traffic for a local VM, or feedback for our senders.
    /// Returns the local VM the frame was for, who pays for the work done on it.
    pub(super) fn from_uplink(
        &mut self,
        now: Instant,
        frame: Frame,
        pool: &mut FramePool,
    ) -> Option<VmIdx> {
        self.counters.uplink_rx_packets += 1;
        self.from_uplink_as(now, frame, pool, false)
    }

    /// [`Engine::from_uplink`] for a frame that is `opened` by the shared engine (it was
    /// sealed and verified) or not.
    pub(super) fn from_uplink_as(
        &mut self,
        now: Instant,
        mut frame: Frame,
        pool: &mut FramePool,
        opened: bool,
    ) -> Option<VmIdx> {
        let (vni, feedback, auth, src_ip, inner_offset, standalone) = match decap(frame.data()) {
            Ok(d) if d.geneve.protocol == picnic_wire::seal::PROTOCOL_SEALED => {
                let vni = d.geneve.vni;
                self.to_open(now, vni, frame, pool);
                return None;
            }
            Ok(d) => (
                d.geneve.vni,
                d.geneve.feedback,
                d.geneve.feedback_auth,
                d.outer_src_ip,
                frame.len() - d.inner.len(),
                d.geneve.is_standalone_feedback(),
            ),
            Err(WireError::NotGeneve) => {
                self.drop_frame(now, pool, frame, None, DropReason::NotOverlay);
                return None;
            }
            Err(_) => {
                self.drop_frame(now, pool, frame, None, DropReason::Malformed);
                return None;
            }
        };
        if let Some(fb) = feedback {
            self.apply_feedback(now, src_ip, vni, &fb, auth.as_ref(), false);
        }
        if standalone {
            pool.put(frame);
            return None;
        }
        let Some(tenant) = self.dir.tenant_by_vni(vni) else {
            self.drop_frame(now, pool, frame, None, DropReason::UnknownVni);
            return None;
        };
        if self.dir.tenants[tenant].encrypt != opened {
            self.drop_frame(now, pool, frame, None, DropReason::Unsealed);
            return None;
        }
        let Some(source) = self.dir.host_by_underlay(src_ip) else {
            self.drop_frame(now, pool, frame, None, DropReason::UnknownHost);
            return None;
        };
        let inner = &frame.data()[inner_offset..];
        if inner.len() < 14 {
            self.drop_frame(now, pool, frame, None, DropReason::Malformed);
            return None;
        }
        if self.isolation.anti_spoofing && !self.sent_by(tenant, source, inner) {
            self.drop_frame(now, pool, frame, None, DropReason::Spoofed);
            return None;
        }
        let dst = Mac(inner[0..6].try_into().expect("length checked"));
        // Lookup within the VNI's tenant only: no frame can reach another tenant's VM.
        let Some(w) = self
            .dir
            .vm_by_mac(tenant, dst)
            .filter(|&w| self.dir.vms[w].port.is_some())
        else {
            self.drop_frame(now, pool, frame, None, DropReason::UnknownDestination);
            return None;
        };
        let wire_len = frame.len() as u64;
        frame.strip_front(inner_offset);
        self.slo.offered(now, tenant, frame.len() as u64);
        self.to_local_vm(now, w, frame, Some((source, wire_len)), pool);
        Some(w)
    }

    /// Congestion feedback for this host's senders: checked before anything is applied (only
    /// the host owning the endpoint may slow traffic to it, authenticated when the deployment
    /// has a key), then given to the egress limiters. A `copy` (another worker counted the
    /// frame) is not counted again.
    fn apply_feedback(
        &mut self,
        now: Instant,
        src_ip: std::net::Ipv4Addr,
        vni: u32,
        fb: &picnic_wire::feedback::FeedbackOption,
        auth: Option<&picnic_wire::feedback::FeedbackAuth>,
        copy: bool,
    ) {
        self.counters.feedback_received += u64::from(!copy);
        let my_ip = self.dir.hosts.get(&self.host_id).map(|h| h.underlay_ip);
        let verdict = match my_ip {
            Some(my_ip) => feedback::check(
                &self.dir,
                &mut self.feedback_auth,
                now,
                src_ip,
                my_ip,
                vni,
                fb,
                auth,
            ),
            None => Err(FeedbackReject::Forged),
        };
        match verdict {
            Ok(()) => self.egress.on_feedback(
                now,
                fb.dst_endpoint,
                Rate::from_bps(fb.rate_bps).bytes_per_sec(),
                fb.seq,
            ),
            Err(reason) if !copy => self.counters.feedback_rejected.add(reason),
            Err(_) => {}
        }
    }

    /// A copy of an uplink frame another worker received, for the feedback it carries only
    /// (every worker's senders obey it); the frame goes back to `pool`.
    pub fn on_feedback_copy(&mut self, now: Instant, frame: Frame, pool: &mut FramePool) {
        if let Ok(d) = decap(frame.data()) {
            if let Some(fb) = d.geneve.feedback {
                let auth = d.geneve.feedback_auth;
                self.apply_feedback(now, d.outer_src_ip, d.geneve.vni, &fb, auth.as_ref(), true);
            }
        }
        pool.put(frame);
    }

    /// Whether `inner`, a frame of `tenant` from host `source`, is one a VM of that tenant
    /// living on that host could have sent: the directory knows which VM lives where, so a
    /// host can only speak for its own VMs, and the VM's anti-spoofing rules hold for its
    /// frames here too (docs/switch.md "Security").
    fn sent_by(&self, tenant: crate::directory::TenantIdx, source: u32, inner: &[u8]) -> bool {
        let Ok(summary) = picnic_wire::classify::classify(inner) else {
            return false;
        };
        self.dir
            .vm_by_mac(tenant, Mac(summary.src_mac))
            .map(|v| &self.dir.vms[v])
            .is_some_and(|vm| {
                vm.host == source && !super::antispoof::is_spoofed(vm, &summary, inner)
            })
    }

    /// Queues a frame for local VM `w`; `source` is the sending host and the frame's length on
    /// the wire (encapsulated) for remote frames.
    pub(super) fn to_local_vm(
        &mut self,
        now: Instant,
        w: VmIdx,
        frame: Frame,
        source: Option<(u32, u64)>,
        pool: &mut FramePool,
    ) {
        let tenant = self.dir.vms[w].tenant;
        let mut src_mac = [0; 6];
        if let Some(mac) = frame.data().get(6..12) {
            src_mac.copy_from_slice(mac);
        }
        // EyeQ meters what the access link carried: every remote frame, encapsulated bytes,
        // whether it is refused below or not.
        let link_sample = source
            .is_some_and(|(source, wire_len)| self.meter_link(now, w, (source, src_mac), wire_len));
        let refused = if self.admit_tenant(now, tenant) != Admission::Admit {
            Some(DropReason::CpuThrottled)
        } else if self.pps_in[w]
            .as_mut()
            .is_some_and(|pps| !pps.try_consume(now, 1))
        {
            Some(DropReason::PpsLimit)
        } else {
            None
        };
        if let Some(reason) = refused {
            if let Some(bp) = self.ingress.backpressure.as_mut() {
                bp.refused(w);
            }
            if let Some((source, _)) = source.filter(|_| link_sample) {
                self.feed_back(now, w, source, pool);
            }
            return self.drop_frame(now, pool, frame, Some(w), reason);
        }
        let len = frame.len() as u64;
        if let Some((source, wire_len)) = source {
            if let Some(bp) = self.ingress.backpressure.as_mut() {
                bp.admitted(w, wire_len);
            }
            let cpu_sample = self.meter_cpu(now, w, (source, src_mac), wire_len);
            if link_sample || cpu_sample {
                self.feed_back(now, w, source, pool);
            }
        }
        let Some(frame) = self.offload_hook(now, w, crate::offload::Hook::Ingress, frame, pool)
        else {
            return;
        };
        let q = self
            .ingress
            .q
            .queue(w)
            .expect("every local VM has an ingress queue");
        let entered = frame.entered(now);
        if let Err(rejected) = self
            .ingress
            .q
            .wfq
            .enqueue(now, q, (frame, w, entered), len as u32)
        {
            self.drop_frame(
                now,
                pool,
                rejected.item.0,
                Some(w),
                DropReason::IngressQueueFull,
            );
        }
    }

    /// EyeQ 3.2: meters a remote frame's arrival on the access link from `sender`; whether
    /// it is sampled for feedback. Closes a backpressure period that is over.
    pub(super) fn meter_link(&mut self, now: Instant, w: VmIdx, sender: Sender, len: u64) -> bool {
        let ing = &mut self.ingress;
        if let Some(bp) = ing.backpressure.as_mut() {
            bp.roll(now);
        }
        ing.link
            .as_mut()
            .is_some_and(|link| matches!(link.on_packet(now, w, sender, len), Ok(Some(_))))
    }

    /// EyeQ 3.2 on the engine's CPU: meters an admitted remote frame's estimated processing
    /// from `sender`; whether it is sampled for feedback.
    fn meter_cpu(&mut self, now: Instant, w: VmIdx, sender: Sender, len: u64) -> bool {
        let ing = &mut self.ingress;
        let Some(cpu) = ing.cpu.as_mut() else {
            return false;
        };
        // The frame's CPU cost, from the VM's measured CPU per byte (the model's figure
        // until a frame of this VM has been processed).
        let est_cost = match ing.ns_per_byte_fp[w] {
            0 => self.cpu.frame_cost(len as usize, 0),
            per_byte => (per_byte * len) >> 16,
        }
        .max(1);
        matches!(cpu.on_packet(now, w, sender, est_cost), Ok(Some(_)))
    }

    /// Tells host `source` the rate it may send to `w` at.
    pub(super) fn feed_back(&mut self, now: Instant, w: VmIdx, source: u32, pool: &mut FramePool) {
        if let Some(rate) = self.ingress.feedback_rate(w) {
            let seq = &mut self.ingress.feedback_seq[w];
            *seq = seq.wrapping_add(1);
            let seq = *seq;
            self.send_feedback(now, pool, source, w, rate, seq);
        }
    }

    /// Processes queued frames, at most `budget` and about `ingress.poll_budget_us` of
    /// processing, and hands them to their ports: first the packet-rate guarantees' lanes up
    /// to their rates, then the WFQ's order. Stopping on a time budget lets the loop read its
    /// ports (cheap) more often than it processes frames (expensive), so overload lands in
    /// per-VM queues, not in the shared uplink ring.
    pub(super) fn ingress_poll(
        &mut self,
        now: Instant,
        budget: usize,
        work: &mut dyn Work,
        _pool: &mut FramePool,
    ) -> usize {
        let (mut n, mut spent) = (0, 0u64);
        // Packet-rate guarantees (PicNIC's pps SLO): served from the VM's own queue, which
        // charges it no WFQ tags, so its share is untouched.
        let mut lanes = std::mem::take(&mut self.ingress.guaranteed);
        for (vm, bucket) in lanes.iter_mut() {
            let Some(q) = self.ingress.q.queue(*vm) else {
                continue;
            };
            while n < budget && spent < self.ingress.cost_budget_ns && bucket.available(now) > 0 {
                let Some(d) = self.ingress.q.wfq.dequeue_from(q) else {
                    break;
                };
                bucket.force_consume(now, 1);
                spent += self.process_and_deliver(now, d, work, false);
                n += 1;
            }
        }
        self.ingress.guaranteed = lanes;
        while n < budget && spent < self.ingress.cost_budget_ns {
            let Some(d) = self.ingress.q.wfq.dequeue(now) else {
                break;
            };
            spent += self.process_and_deliver(now, d, work, true);
            n += 1;
        }
        self.ingress.cpu_bound = !self.ingress.q.wfq.is_empty();
        if n > 0 {
            let backlogged = !self.ingress.q.wfq.is_empty();
            self.ingress
                .capacity
                .on_poll(now, spent, backlogged, self.ingress.cpu.as_mut());
        }
        n
    }

    /// Processes a dequeued frame and hands it to its VM's port; with `settle`, settles its
    /// WFQ estimate with the measured cost (frames of a guarantee lane were charged none).
    /// Returns the frame's cost, ns.
    fn process_and_deliver(
        &mut self,
        now: Instant,
        d: Dequeued<(Frame, VmIdx, Instant)>,
        work: &mut dyn Work,
        settle: bool,
    ) -> u64 {
        let (mut frame, w, queued_at) = d.item;
        let tenant = self.dir.vms[w].tenant;
        let len = frame.len() as u64;
        let work_ns = work.process(tenant, &mut frame);
        self.cpu.note(Some(w), frame.len());
        self.cpu.note_direct(w, work_ns);
        let cost = self.cpu.frame_cost(frame.len(), work_ns);
        if self.cpu_fair && settle {
            // PicNIC CPU-fair WFQ: settle the estimate with the frame's measured cost
            // (or its access-link time, if that is the larger share it takes).
            let wfq_cost = self.cpu.wfq_cost(
                frame.len(),
                work_ns,
                len + self.encap_len,
                self.ingress.ps_per_wire_byte,
                self.ingress.cpu_bound,
            );
            let _ = self.ingress.q.wfq.settle(d.queue, d.cost, wfq_cost);
        }
        let per_byte = &mut self.ingress.ns_per_byte_fp[w];
        let sample = (cost << 16) / (len + self.encap_len);
        *per_byte = if *per_byte == 0 {
            sample
        } else {
            *per_byte - (*per_byte >> 3) + (sample >> 3)
        };
        let c = &mut self.vm_counters[w];
        c.rx_packets += 1;
        c.rx_bytes += len;
        c.ingress_wait.record((now - queued_at).as_nanos());
        let port = self.dir.vms[w].port.expect("queued only for local VMs");
        self.tx[port].push(frame);
        self.slo
            .delivered(now, tenant, len, queued_at, Waited::IngressQueue);
        cost
    }
}
