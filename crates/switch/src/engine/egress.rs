//! Egress engine: frames from tenant ports to local VMs or, encapsulated, to the uplink.
//!
//! classify -> anti-spoofing -> (ARP answered here) -> destination lookup in the sender's
//! tenant -> shaped class or admission limiter (own queue each, PicNIC 2.1) or fast path ->
//! root WFQ over tenants and VMs weighted by min guarantee, capped by max -> encap -> uplink.
//! The pacer that holds the WFQ to the uplink's rate is the submodule `pacer`.

use std::collections::BTreeMap;
use std::sync::Arc;

use etherparse::{ArpOperation, IpNumber};

use picnic_core::bucket::{Shaper, TokenBucket};
use picnic_core::eyeq::Sender;
use picnic_core::wfq::{Cap, CostKind};
use picnic_core::{Duration, Instant, Rate};
use picnic_wire::classify::{classify, FrameSummary, Network};
use picnic_wire::ecn::mark_ce;
use picnic_wire::ndp;
use picnic_wire::overlay::{entropy_source_port, ENCAP_OVERHEAD};

use super::antispoof;
use super::queues::VmQueues;
use super::slo::Waited;
use super::{cost_kind, sender_config, Engine, SharedBudgets};
use crate::config::{Config, Mac, ShapedClass};
use crate::directory::{Directory, PortIdx, VmIdx};
use crate::frame::{Frame, FramePool};
use crate::offload::Hook;
use crate::stats::DropReason;

mod pacer;

use pacer::Pacer;

/// A frame on its way to a remote VM: the frame, its destination VM and that VM's
/// generation (a frame for a VM removed meanwhile is dropped), the outer UDP source port
/// (flow entropy), the local VM that sent it (who pays for its CPU) and when it entered the
/// switch (its latency, for the tenant's SLO).
pub(super) type Outbound = (Frame, VmIdx, u32, u16, VmIdx, Instant);

/// What a separately shaped queue of a VM is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ShapeKey {
    /// The VM's configured shaped class number `k`.
    Class(usize),
    /// Traffic to a destination endpoint the receiver asked to slow down (EyeQ 3.3).
    Destination(u32),
}

pub struct Egress {
    /// The root WFQ over tenants and their VMs' queues.
    q: VmQueues<Outbound>,
    /// What the WFQ charges, and the uplink's rate, for the caps of [`egress_cap`].
    kind: CostKind,
    link: Rate,
    /// Paces the WFQ to the uplink's capacity so the scheduler, not a FIFO downstream,
    /// decides who goes first.
    pacer: Option<Pacer>,
    /// Per-destination rates set by receiver feedback (EyeQ sender module).
    pub(super) admission: Option<Sender<u32>>,
    /// Shaped classes and rate-limited destinations, each in its own bounded queue so it
    /// never blocks the VM's fast path. BTreeMap: deterministic service order.
    shapers: BTreeMap<(VmIdx, ShapeKey), Shaper<Outbound>>,
    shaped_queue_packets: usize,
    /// The kernel fast path forwards within the destinations' rates: a destination's
    /// limiter here starts without a burst, since the kernel spent it (one budget across
    /// both paths, docs/switch.md "Two paths").
    pub(super) kernel_spends_bursts: bool,
    /// Destination endpoints whose limiter queue overflowed (see [`Overflow`]).
    overflowing: BTreeMap<u32, Overflow>,
    next_gc: Instant,
    /// Frames picked in one poll, before their outer headers are written, and where each
    /// waited (reused buffers).
    scratch: Vec<Outbound>,
    scratch_waited: Vec<Waited>,
    /// Time one byte takes on the uplink, ps: a frame's link cost in the CPU-fair WFQ.
    ps_per_wire_byte: u64,
    /// Whether the last poll stopped at its frame budget with frames left and the uplink
    /// free: the CPU, not the link, limits what leaves (see `CpuLedger::wfq_cost`).
    cpu_bound: bool,
    /// Local VMs with a packet-rate guarantee (`min_pps`) and the bucket of it: their queued
    /// frames are served up to that rate before the WFQ's turn, outside their share.
    guaranteed: Vec<(VmIdx, TokenBucket)>,
    /// With the egress WFQ on (each VM has its own queue): the least burst of a lane, a batch.
    lanes: Option<u64>,
}

/// Queue length of a limiter at which ECN-capable frames are marked CE.
const ECN_MARK_QUEUE_PACKETS: usize = 16;

/// A destination whose limiter queue overflowed: when that, or the kernel dropping beyond
/// its rate, was last seen, and the frames the kernel has dropped beyond its rate since it
/// last overflowed (or its queue was last emptied).
#[derive(Clone, Copy, Debug, Default)]
struct Overflow {
    seen: Instant,
    kernel_drops: u64,
}

/// How long a destination stays overflowing after its limiter queue last overflowed or the
/// kernel last dropped beyond its rate: its senders flood it steadily, so the kernel keeps
/// dropping at their CPUs rather than handing the flood back to the engines at each lull.
const OVERFLOW_HOLD: Duration = Duration::from_millis(20);

/// The egress cap of a VM capped at `max`: bytes/s, or with the dominant-resource cost
/// the same cap in ns of link time per second (a frame costs at least its link time, so the
/// VM's bytes stay capped).
fn egress_cap(kind: CostKind, link: Rate, max: Option<Rate>) -> Option<Cap> {
    max.map(|max| match kind {
        CostKind::Measured { .. } => Cap {
            per_sec: (max.bps() as u128 * 1_000_000_000 / link.bps() as u128).max(1) as u64,
            burst: burst_for(max.bytes_per_sec()) * link.ps_per_byte() / 1000,
        },
        _ => Cap {
            per_sec: max.bytes_per_sec(),
            burst: burst_for(max.bytes_per_sec()),
        },
    })
}

/// Sets local VM `vm`'s packet-rate guarantee lane in `lanes` as `dir` says now: a bucket at
/// its `min_pps`, burst 1 ms of the rate and at least one batch, or none without `min_pps`
/// or without per-VM queues (`batch` None). Shared by both engines.
pub(super) fn set_guarantee_lane(
    lanes: &mut Vec<(VmIdx, TokenBucket)>,
    batch: Option<u64>,
    dir: &Directory,
    vm: VmIdx,
    now: Instant,
) {
    lanes.retain(|(v, _)| *v != vm);
    if let (Some(batch), Some(pps)) = (batch, dir.vms[vm].min_pps) {
        lanes.push((vm, TokenBucket::new(pps, (pps / 1000).max(batch), now)));
    }
}

/// The uplink pacer's rate and burst, bytes/s and bytes, when egress is paced
/// (`uplink.capacity_mbps` with the egress WFQ on).
pub fn pacer_rate(cfg: &Config) -> Option<(u64, u64)> {
    let rate = cfg
        .uplink
        .capacity()
        .filter(|_| cfg.isolation.egress_wfq)?
        .bytes_per_sec();
    Some((rate, burst_for(rate)))
}

/// Burst of a rate limiter: one full frame plus what the rate earns in 1 ms, the latest a
/// timer wakes the loop here (DESIGN.md 7), so that a late wake-up loses no tokens. No more:
/// every sender's limiter toward a receiver may release its burst at once, and the bursts add
/// up in the receiver's access-link queue (pps-flood: with three frames at least, 64 B floods
/// limited to 4 Mb/s released 40 frames at a time and the victim's p99 doubled there).
fn burst_for(rate_bytes: u64) -> u64 {
    rate_bytes / 1000 + 1514
}

impl Egress {
    /// With several workers: paces to the link's bucket in `shared` (when egress is paced at
    /// all) through a cache of this worker's own.
    pub(super) fn share_pacer(&mut self, shared: &Arc<SharedBudgets>) {
        if let (Some(_), Some(link)) = (self.pacer.as_ref(), shared.link.as_ref()) {
            self.pacer = Some(Pacer::shared(link, shared.link_chunk));
        }
    }

    /// Returns the link tokens this worker's cache holds (it stops).
    pub(super) fn release_pacer(&mut self, now: Instant) {
        if let Some(pacer) = self.pacer.as_mut() {
            pacer.release(now);
        }
    }

    /// An egress engine without VMs ([`Egress::add_vm`] adds them).
    pub fn new(cfg: &Config, now: Instant) -> anyhow::Result<Egress> {
        let link = cfg
            .uplink
            .capacity()
            .unwrap_or(cfg.ingress.capacity())
            .max(Rate::from_mbps(1));
        let ps_per_wire_byte = link.ps_per_byte();
        let kind = cost_kind(cfg);
        let q = VmQueues::new(
            kind,
            cfg.egress.queue_packets,
            cfg.isolation.egress_wfq,
            "egress scheduler",
        );
        let pacer =
            pacer_rate(cfg).map(|(rate, burst)| Pacer::Own(TokenBucket::new(rate, burst, now)));
        let admission = if cfg.isolation.admission {
            Some(
                Sender::new(sender_config(cfg))
                    .map_err(|e| anyhow::anyhow!("admission control: {e:?}"))?,
            )
        } else {
            None
        };
        Ok(Egress {
            q,
            kind,
            link,
            pacer,
            admission,
            shapers: BTreeMap::new(),
            shaped_queue_packets: cfg.egress.shaped_queue_packets,
            kernel_spends_bursts: false,
            overflowing: BTreeMap::new(),
            next_gc: now,
            scratch: Vec::with_capacity(cfg.switch.batch),
            scratch_waited: Vec::with_capacity(cfg.switch.batch),
            ps_per_wire_byte,
            cpu_bound: false,
            guaranteed: Vec::new(),
            lanes: cfg.isolation.egress_wfq.then_some(cfg.switch.batch as u64),
        })
    }

    pub(super) fn has_room(&self, vm: VmIdx, batch: usize) -> bool {
        match self.q.queue(vm) {
            Some(q) => self
                .q
                .wfq
                .headroom(q)
                .is_some_and(|h| h.packets as usize >= batch),
            None => true,
        }
    }

    fn cap(&self, vm: &crate::directory::Vm) -> Option<Cap> {
        egress_cap(self.kind, self.link, vm.max_bps.map(Rate::from_bps))
    }

    /// Adds local VM `vm` (already in `dir`): its queue, and its tenant's new weight.
    pub(super) fn add_vm(
        &mut self,
        now: Instant,
        dir: &Directory,
        vm: VmIdx,
    ) -> Result<(), String> {
        let cap = self.cap(&dir.vms[vm]);
        self.q.add_vm(now, dir, vm, cap)?;
        self.set_lane(now, dir, vm);
        Ok(())
    }

    /// `vm`'s packet-rate guarantee lane as `dir` says now (none without `min_pps`).
    fn set_lane(&mut self, now: Instant, dir: &Directory, vm: VmIdx) {
        set_guarantee_lane(&mut self.guaranteed, self.lanes, dir, vm, now);
    }

    /// Applies `vm`'s new guarantee and cap in place (queued frames and every other VM's
    /// state stay), and its shaped classes, which were `old`: a class still there at the
    /// same position keeps its queue at its new rate; the frames of a class gone are
    /// returned.
    pub(super) fn set_vm(
        &mut self,
        now: Instant,
        dir: &Directory,
        vm: VmIdx,
        old: &[ShapedClass],
    ) -> Result<Vec<Frame>, String> {
        let cap = self.cap(&dir.vms[vm]);
        self.q.set_vm(now, dir, vm, cap)?;
        self.set_lane(now, dir, vm);
        let classes = &dir.vms[vm].shaped;
        let mut gone = Vec::new();
        for k in 0..old.len() {
            let Some(shaper) = self.shapers.get_mut(&(vm, ShapeKey::Class(k))) else {
                continue;
            };
            match classes.get(k) {
                Some(class) => {
                    let rate = class_rate(class);
                    if shaper.bucket().rate() != rate {
                        shaper.bucket_mut().set_rate(now, rate, burst_for(rate));
                    }
                }
                None => {
                    gone.extend(shaper.drain().map(|item| item.0));
                    self.shapers.remove(&(vm, ShapeKey::Class(k)));
                }
            }
        }
        Ok(gone)
    }

    /// Removes local VM `vm` of tenant `t` (already gone from `dir`'s local VMs): its queue,
    /// shaped classes and limiters. Returns their frames.
    pub(super) fn remove_vm(
        &mut self,
        dir: &Directory,
        vm: VmIdx,
        t: crate::directory::TenantIdx,
    ) -> Result<Vec<Frame>, String> {
        let items = self.q.remove_vm(dir, vm, t, |item| item.4 == vm)?;
        self.guaranteed.retain(|(v, _)| *v != vm);
        let mut frames: Vec<Frame> = items.into_iter().map(|item| item.0).collect();
        let keys: Vec<_> = self
            .shapers
            .range((vm, ShapeKey::Class(0))..)
            .take_while(|((v, _), _)| *v == vm)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Some(mut shaper) = self.shapers.remove(&key) {
                frames.extend(shaper.drain().map(|item| item.0));
            }
        }
        Ok(frames)
    }

    /// Every frame queued, in the scheduler and in shaped classes and limiters (the engine is
    /// being dropped).
    pub(super) fn take_frames(&mut self) -> Vec<Frame> {
        let mut frames: Vec<Frame> = self.q.take_all().into_iter().map(|item| item.0).collect();
        for shaper in self.shapers.values_mut() {
            frames.extend(shaper.drain().map(|item| item.0));
        }
        frames
    }

    /// Whether any of `vm`'s shaped classes or limiters has frames waiting.
    pub(super) fn shaped_backlog(&self, vm: VmIdx) -> bool {
        self.shapers
            .range((vm, ShapeKey::Class(0))..)
            .take_while(|((v, _), _)| *v == vm)
            .any(|(_, s)| !s.is_empty())
    }

    /// Whether a limiter of destination `endpoint` overflowed and has not been empty, with no
    /// frame dropped beyond its rate in the kernel, for [`OVERFLOW_HOLD`]: its VMs send far
    /// beyond the rate its receiver asked for.
    pub(super) fn destination_overflowing(&self, endpoint: u32) -> bool {
        self.overflowing.contains_key(&endpoint)
    }

    /// The kernel dropped `frames` beyond `endpoint`'s rate: it stays overflowing.
    pub(super) fn still_overflowing(&mut self, endpoint: u32, now: Instant, frames: u64) {
        if let Some(o) = self.overflowing.get_mut(&endpoint) {
            o.seen = now;
            o.kernel_drops += frames;
        }
    }

    /// Forgets `vm`'s limiters of destinations with nothing queued, as its frames go back to
    /// the kernel fast path; returns those destinations' endpoints. Its next frames handed
    /// over meet new limiters that start without a burst.
    pub(super) fn release_destination_limiters(&mut self, vm: VmIdx) -> Vec<u32> {
        let mut released = Vec::new();
        self.shapers.retain(|(v, key), s| match key {
            ShapeKey::Destination(d) if *v == vm && s.is_empty() => {
                released.push(*d);
                false
            }
            _ => true,
        });
        released
    }

    pub(super) fn queue_len(&self, vm: VmIdx) -> usize {
        let shaped: usize = self
            .shapers
            .range((vm, ShapeKey::Class(0))..)
            .take_while(|((v, _), _)| *v == vm)
            .map(|(_, s)| s.len())
            .sum();
        self.q
            .queue(vm)
            .and_then(|q| self.q.wfq.queue_len(q))
            .unwrap_or(0)
            + shaped
    }

    /// (destination endpoint, bits/s) of every admission limiter applied to `vm`'s traffic.
    pub(super) fn applied_limits(&self, vm: VmIdx) -> Vec<(u32, u64)> {
        self.shapers
            .iter()
            .filter_map(|((v, key), s)| match key {
                ShapeKey::Destination(d) if *v == vm => {
                    Some((*d, Rate::from_bytes_per_sec(s.bucket().rate()).bps()))
                }
                _ => None,
            })
            .collect()
    }

    /// Applies congestion feedback from a receiver (EyeQ 3.3).
    pub(super) fn on_feedback(&mut self, now: Instant, endpoint: u32, rate_bytes: u64, seq: u32) {
        if let Some(a) = self.admission.as_mut() {
            a.on_feedback(now, endpoint, rate_bytes, seq);
        }
    }

    pub(super) fn poll_at(&self) -> Option<Instant> {
        let shapers = self.shapers.values().filter_map(|s| s.poll_at()).min();
        let admission = self.admission.as_ref().and_then(|a| a.poll_at());
        [self.q.wfq.poll_at(), shapers, admission]
            .into_iter()
            .flatten()
            .min()
    }

    pub(super) fn on_timeout(&mut self, now: Instant) {
        let Some(admission) = self.admission.as_mut() else {
            return;
        };
        if admission.poll_at().is_some_and(|t| t <= now) {
            admission.on_timeout(now);
        }
        // Follow limiter rates (halving without feedback) and drop idle limiter queues.
        if now >= self.next_gc {
            self.next_gc = now + picnic_core::Duration::from_millis(1);
            self.shapers.retain(|(_, key), s| match key {
                ShapeKey::Destination(d) => match admission.rate_for(*d) {
                    Some(rate) => {
                        if s.bucket().rate() != rate {
                            s.bucket_mut().set_rate(now, rate, burst_for(rate));
                        }
                        true
                    }
                    None => !s.is_empty(),
                },
                ShapeKey::Class(_) => true,
            });
        }
    }
}

impl Engine {
    /// A frame sent by local VM `vm` on its port.
    pub(super) fn from_vm(
        &mut self,
        now: Instant,
        vm: VmIdx,
        port: PortIdx,
        frame: Frame,
        pool: &mut FramePool,
    ) {
        let c = &mut self.vm_counters[vm];
        c.tx_packets += 1;
        c.tx_bytes += frame.len() as u64;
        let tenant = self.dir.vms[vm].tenant;
        // Packets/s limit (PicNIC: capacity is packets as well as bytes): the port is not
        // read while the bucket is in debt, so the excess waits in the VM's own ring.
        if let Some(pps) = self.pps_out[vm].as_mut() {
            pps.force_consume(now, 1);
        }
        // The tenant's program sees the frame first, so what it makes of it is checked.
        let Some(frame) = self.offload_hook(now, vm, Hook::Egress, frame, pool) else {
            return;
        };
        let Ok(summary) = classify(frame.data()) else {
            return self.drop_frame(now, pool, frame, Some(vm), DropReason::Malformed);
        };
        if self.isolation.anti_spoofing
            && antispoof::is_spoofed(&self.dir.vms[vm], &summary, frame.data())
        {
            return self.drop_frame(now, pool, frame, Some(vm), DropReason::Spoofed);
        }
        if let Network::Arp(arp) = summary.network {
            // Proxy ARP: the switch knows every address of the tenant (DESIGN.md section 4).
            let target = self.dir.vm_by_ip(tenant, arp.target_ip);
            return match (arp.operation, target) {
                (ArpOperation::REQUEST, Some(w)) => self.answer_arp(frame, port, pool, &arp, w),
                _ => self.drop_frame(now, pool, frame, Some(vm), DropReason::UnknownDestination),
            };
        }
        if let Network::Ipv6 { protocol, .. } = summary.network {
            // Neighbour discovery, answered as ARP is; unicast solicitations (reachability
            // checks) are forwarded to their VM like any frame.
            let solicitation = (protocol == IpNumber::IPV6_ICMP && summary.dst_mac[0] & 1 == 1)
                .then(|| ndp::neighbor_solicitation(frame.data()))
                .flatten();
            if let Some(ns) = solicitation {
                return self.answer_neighbor_solicitation(now, frame, vm, port, pool, &ns);
            }
        }
        let dst_mac = Mac(summary.dst_mac);
        let Some(w) = self.dir.vm_by_mac(tenant, dst_mac) else {
            let reason = if dst_mac.is_multicast() {
                DropReason::Multicast
            } else {
                DropReason::UnknownDestination
            };
            return self.drop_frame(now, pool, frame, Some(vm), reason);
        };
        // Offered to the SLO once the switch is to carry it (policy drops are not the
        // tenant's demand).
        self.slo.offered(now, tenant, frame.len() as u64);
        if self.dir.vms[w].port.is_some() {
            // Same host: straight to the destination's ingress queue and scheduler.
            return self.to_local_vm(now, w, frame, None, pool);
        }
        if frame.len() + ENCAP_OVERHEAD + self.seal_overhead(tenant) > self.uplink_mtu + 14 {
            return self.drop_frame(now, pool, frame, Some(vm), DropReason::TooBig);
        }
        let entered = frame.entered(now);
        let generation = self.dir.vms[w].generation;
        let flow = entropy_source_port(summary.flow_hash());
        let item = (frame, w, generation, flow, vm, entered);
        // Limiters and the pacer count bytes on the wire, encapsulation included, the unit
        // the receiver meters its access link in.
        let len = item.0.len() as u64;
        let wire_len = len + self.encap_len;
        let eg = &mut self.egress;
        let key = match self.dir.vms[vm]
            .shaped
            .iter()
            .position(|class| class_matches(class, &summary))
        {
            Some(k) => Some((ShapeKey::Class(k), class_rate(&self.dir.vms[vm].shaped[k]))),
            None => {
                let endpoint = self.dir.vms[w].id;
                eg.admission
                    .as_ref()
                    .and_then(|a| a.rate_for(endpoint))
                    .map(|r| (ShapeKey::Destination(endpoint), r))
            }
        };
        if let Some((key, rate)) = key {
            let cap = eg.shaped_queue_packets;
            let spent = eg.kernel_spends_bursts && matches!(key, ShapeKey::Destination(_));
            let shaper = eg.shapers.entry((vm, key)).or_insert_with(|| {
                let mut bucket = TokenBucket::new(rate, burst_for(rate), now);
                if spent {
                    bucket.force_consume(now, burst_for(rate));
                }
                Shaper::new(bucket, cap, cap as u64 * 2048)
            });
            // Admission control: in-profile traffic with nothing queued ahead takes the fast
            // path; the rest waits in the class's own queue (PicNIC 2.1, EyeQ 3.3).
            let in_profile = matches!(key, ShapeKey::Destination(_))
                && shaper.is_empty()
                && shaper.bucket_mut().try_consume(now, wire_len);
            if !in_profile {
                // A filling limiter queue marks ECN-capable frames CE, so TCP backs off
                // before the queue overflows and drops (RFC 3168; EyeQ 3.3's limiters
                // otherwise lose TCP segments to tail drop).
                let mut item = item;
                if shaper.len() >= ECN_MARK_QUEUE_PACKETS && mark_ce(item.0.data_mut()) {
                    self.counters.ecn_marked += 1;
                }
                return match shaper.enqueue(item, wire_len) {
                    Ok(()) => {
                        let c = &mut self.vm_counters[vm];
                        match key {
                            ShapeKey::Class(_) => c.waited_shaped_class += 1,
                            ShapeKey::Destination(_) => c.waited_limiter += 1,
                        }
                    }
                    Err(item) => {
                        self.drop_frame(now, pool, item.0, Some(vm), DropReason::ShapedQueueFull);
                        if let ShapeKey::Destination(d) = key {
                            self.destination_overflowed(now, d);
                        }
                    }
                };
            }
        }
        let q = eg.q.queue(vm).expect("every local VM has an egress queue");
        if let Err(rejected) = eg.q.wfq.enqueue(now, q, item, len as u32) {
            self.drop_frame(
                now,
                pool,
                rejected.item.0,
                Some(vm),
                DropReason::EgressQueueFull,
            );
        }
    }

    /// Destination `d`'s limiter queue overflowed: it becomes (or stays) overflowing, and
    /// with the fast path the kernel drops what goes beyond its rate (Iron 3.3), handing
    /// over only what is within it.
    fn destination_overflowed(&mut self, now: Instant, d: u32) {
        let o = self.egress.overflowing.entry(d).or_default();
        o.seen = now;
        o.kernel_drops = 0;
    }

    /// Empties the limiter queues of overflowing destinations the kernel has dropped at
    /// least a queue's worth of frames to since they last overflowed: a flood (TCP's
    /// super-frames are not dropped there, and TCP backs off first). What such a queue holds
    /// was sent within the rate alone and would never drain (it drains at that rate while
    /// the kernel keeps handing over that much); dropped, its senders hold nothing here and
    /// the kernel can resume them (`fastpath.bpf.c`'s `resumed`), forwarding within the
    /// rate on their own CPUs. The emptied limiter's bucket is filled too: what the kernel
    /// hands over meanwhile has passed its bucket for the destination (one budget across
    /// both paths), so it leaves at once instead of queueing behind the engines' tokens; a
    /// queue re-formed at the rate it drains at would again never empty (the fastpath root
    /// test's flood stayed on the engines for the whole run in about half the runs).
    fn flush_flooded_destinations(&mut self, now: Instant, pool: &mut FramePool) {
        let eg = &mut self.egress;
        let cap = eg.shaped_queue_packets as u64;
        let mut flushed = Vec::new();
        for (&d, o) in eg.overflowing.iter_mut() {
            if o.kernel_drops < cap {
                continue;
            }
            o.kernel_drops = 0;
            for ((vm, key), shaper) in eg.shapers.iter_mut() {
                if *key == ShapeKey::Destination(d) {
                    flushed.extend(shaper.drain().map(|item| (*vm, item.0)));
                    let burst = shaper.bucket().burst();
                    shaper.bucket_mut().refund(now, burst);
                }
            }
        }
        for (vm, frame) in flushed {
            self.drop_frame(now, pool, frame, Some(vm), DropReason::ShapedQueueFull);
        }
    }

    /// Serves shaped queues as their rates allow, then the root WFQ as the uplink allows.
    pub(super) fn egress_poll(
        &mut self,
        now: Instant,
        budget: usize,
        pool: &mut FramePool,
    ) -> usize {
        if !self.egress.overflowing.is_empty() {
            self.flush_flooded_destinations(now, pool);
        }
        let mut picked = std::mem::take(&mut self.egress.scratch);
        let mut waited = std::mem::take(&mut self.egress.scratch_waited);
        let encap_len = self.encap_len;
        let eg = &mut self.egress;
        let dir = &self.dir;
        for ((vm, key), shaper) in eg.shapers.iter_mut() {
            let via = match key {
                ShapeKey::Class(_) => Waited::ShapedClass,
                // A limiter at or above the sending VM's guarantee holds only what it sends
                // beyond it (EyeQ gives every VM at least its guarantee).
                ShapeKey::Destination(_)
                    if shaper.bucket().rate()
                        >= Rate::from_bps(dir.vms[*vm].min_bps).bytes_per_sec() =>
                {
                    Waited::BeyondGuarantee
                }
                ShapeKey::Destination(_) => Waited::Limiter,
            };
            while picked.len() < budget {
                let Some(item) = shaper.dequeue(now) else {
                    break;
                };
                if let Some(p) = eg.pacer.as_mut() {
                    p.force_consume(now, item.0.len() as u64 + encap_len);
                }
                picked.push(item);
                waited.push(via);
            }
        }
        if !eg.overflowing.is_empty() {
            let shapers = &eg.shapers;
            eg.overflowing.retain(|&d, o| {
                now.saturating_since(o.seen) < OVERFLOW_HOLD
                    || shapers
                        .iter()
                        .any(|((_, key), s)| *key == ShapeKey::Destination(d) && !s.is_empty())
            });
        }
        // Packet-rate guarantees: each such VM's queued frames up to its rate, on top of
        // its share (PicNIC's pps SLO), as the uplink allows.
        for (vm, bucket) in eg.guaranteed.iter_mut() {
            let Some(q) = eg.q.queue(*vm) else { continue };
            while picked.len() < budget && bucket.available(now) > 0 {
                if eg.pacer.as_ref().is_some_and(|p| !p.has_tokens(now)) {
                    break;
                }
                let Some(d) = eg.q.wfq.dequeue_from(q) else {
                    break;
                };
                bucket.force_consume(now, 1);
                if let Some(p) = eg.pacer.as_mut() {
                    p.force_consume(now, d.len_bytes as u64 + encap_len);
                }
                picked.push(d.item);
                waited.push(Waited::EgressQueue);
            }
        }
        while picked.len() < budget {
            if eg.pacer.as_ref().is_some_and(|p| !p.has_tokens(now)) {
                break;
            }
            let Some(d) = eg.q.wfq.dequeue(now) else {
                break;
            };
            let wire_len = d.len_bytes as u64 + encap_len;
            if let Some(p) = eg.pacer.as_mut() {
                p.force_consume(now, wire_len);
            }
            if self.cpu_fair {
                // PicNIC's CPU-fair WFQ: settle the estimate with the frame's measured cost.
                // Its link time counts the tenant's bytes, as the byte-fair WFQ always did.
                let cost = self.cpu.wfq_cost(
                    d.len_bytes as usize,
                    0,
                    d.len_bytes as u64,
                    eg.ps_per_wire_byte,
                    eg.cpu_bound,
                );
                let _ = eg.q.wfq.settle(d.queue, d.cost, cost);
            }
            picked.push(d.item);
            waited.push(Waited::EgressQueue);
        }
        let done = picked.len();
        eg.cpu_bound = done == budget
            && !eg.q.wfq.is_empty()
            && eg.pacer.as_ref().is_none_or(|p| p.has_tokens(now));
        let picked_waited = picked.drain(..).zip(waited.drain(..));
        for ((mut frame, w, generation, entropy, src, arrived), via) in picked_waited {
            self.cpu.note(Some(src), frame.len());
            if self.dir.vms[w].generation != generation {
                // Its destination was removed (live change) while it waited.
                self.drop_frame(now, pool, frame, Some(src), DropReason::Removed);
                continue;
            }
            let (host, endpoint, tenant) = {
                let v = &self.dir.vms[w];
                (v.host, v.id, v.tenant)
            };
            let len = frame.len() as u64;
            if self.encap(
                &mut frame,
                host,
                self.dir.tenants[tenant].vni,
                entropy,
                None,
            ) {
                if let Some(a) = self.egress.admission.as_mut() {
                    a.note_sent(now, endpoint, len);
                }
                self.counters.uplink_tx_packets += 1;
                self.to_uplink(tenant, src, frame);
                self.slo.delivered(now, tenant, len, arrived, via);
            } else {
                self.drop_frame(now, pool, frame, Some(w), DropReason::TooBig);
            }
        }
        self.egress.scratch = picked;
        self.egress.scratch_waited = waited;
        done
    }
}

fn class_matches(class: &ShapedClass, s: &FrameSummary) -> bool {
    let Network::Ipv4 {
        dst,
        protocol,
        ports,
        ..
    } = s.network
    else {
        return false;
    };
    class.dst_ip.is_none_or(|ip| ip == dst)
        && class.protocol.is_none_or(|p| p == protocol.0)
        && class
            .dst_port
            .is_none_or(|p| ports.is_some_and(|ports| ports.dst == p))
}

/// A shaped class's rate, bytes/s.
fn class_rate(class: &ShapedClass) -> u64 {
    class.rate().bytes_per_sec()
}
