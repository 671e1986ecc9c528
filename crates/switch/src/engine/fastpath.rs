//! What the kernel fast path may do for each local VM (docs/switch.md "Two paths", DESIGN.md
//! 4), as plain data, and the hand-back that keeps a VM's frames in order when it returns
//! from the engines to the kernel. The runner moves both to and from the BPF maps
//! (`crate::fastpath`).
//!
//! A VM's frames take the fast path while the engines would do nothing but forward them:
//! no shaped class, no encryption, no offload program, its tenant within its CPU allocation
//! and the VM within its packet budget, and nothing of it queued here. Its buckets in the
//! kernel run at its share of the link (weights = min guarantees, as the engines' WFQ;
//! receiving, at least its EyeQ allotment), capped by its `max_bps`/`max_pps`: within them it
//! is within its allocation (PicNIC 2.1, "shaping never blocks the fast path"); beyond them
//! its frames come to the engines, which share what is left of the link work-conservingly.
//! What the kernel forwards is metered by the engines' EyeQ receivers
//! ([`Engine::meter_fast_arrivals`]), and the rates receivers ask for become buckets per
//! destination in the kernel ([`Engine::destination_rate`]).
//!
//! The kernel bumps a VM's epoch at every frame it hands over; the fast path runs only while
//! the epoch granted here is current. [`Handback`] grants an epoch only once every frame
//! handed over before it has left the port rings (taken, or dropped by the kernel) and the
//! VM's queues here are empty: so a later frame can never pass one still here.

use std::net::Ipv4Addr;

use picnic_core::{Instant, Rate};

use super::Engine;
use crate::directory::VmIdx;
use crate::frame::FramePool;

/// What one local VM (its port index as `slot`) may do on the fast path now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastPathWant {
    pub slot: u32,
    /// Its frames may be forwarded in the kernel.
    pub tx: bool,
    /// Frames to it may be forwarded in the kernel.
    pub rx: bool,
    /// Frames to it are dropped before any work (tenant over its CPU, VM over its `max_pps`).
    pub rx_drop: bool,
    /// Frames from it are dropped before any work (tenant over its CPU: the engines would
    /// not read them either, Iron 3.3).
    pub tx_drop: bool,
    /// Nothing of it is queued in the engines.
    pub idle: bool,
    /// Bucket rates: picoseconds per byte, nanoseconds per packet (0: no bucket).
    pub tx_ps_per_byte: u64,
    pub tx_ns_per_packet: u64,
    pub rx_ps_per_byte: u64,
    pub rx_ns_per_packet: u64,
}

/// Picoseconds per byte of `bytes_per_s` (0 for no limit).
pub fn ps_per_byte(bytes_per_s: u64) -> u64 {
    if bytes_per_s == 0 {
        0
    } else {
        1_000_000_000_000u64.div_ceil(bytes_per_s)
    }
}

impl Engine {
    /// Every local VM's fast-path permissions and rates now (`out` is replaced).
    pub fn fast_path_wants(&mut self, now: Instant, out: &mut Vec<FastPathWant>) {
        out.clear();
        let link = self.link_bytes;
        let locals: Vec<(usize, usize)> = (1..self.dir.port_vm.len())
            .filter_map(|p| self.dir.port_vm[p].map(|v| (p, v)))
            .collect();
        let weight = |v: usize| self.dir.vms[v].min_bps.max(1);
        let total: u64 = locals.iter().map(|&(_, v)| weight(v)).sum::<u64>().max(1);
        for &(p, v) in &locals {
            let vm = &self.dir.vms[v];
            let tenant = &self.dir.tenants[vm.tenant];
            let plain = !tenant.encrypt && tenant.offload.is_none() && self.isolation.anti_spoofing;
            let throttled = self.cpu_throttled(now, v);
            let pps_out_debt = self.pps_out[v]
                .as_ref()
                .is_some_and(|b| b.available(now) == 0);
            let pps_in_out = self.pps_in[v]
                .as_ref()
                .is_some_and(|b| b.available(now) == 0);
            let share = (u128::from(link) * u128::from(weight(v)) / u128::from(total)) as u64;
            // Arrivals: the EyeQ receiver's allotment while the VM receives (work-conserving:
            // the whole link when it receives alone), at least its share (EyeQ 3.2).
            let allotted = self
                .ingress
                .link
                .as_ref()
                .and_then(|l| l.endpoint(v))
                .filter(|e| e.active)
                .map_or(share, |e| e.allowed.max(share));
            let cap = |max: Option<u64>, share: u64| match max {
                Some(m) if m / 8 < share || share == 0 => m / 8,
                _ => share,
            };
            let pps = |max: Option<u64>| max.filter(|&p| p > 0).map_or(0, |p| 1_000_000_000 / p);
            out.push(FastPathWant {
                slot: p as u32,
                tx: plain && vm.shaped.is_empty() && !throttled && !pps_out_debt,
                rx: plain && !throttled && !pps_in_out,
                rx_drop: throttled || pps_in_out,
                tx_drop: throttled,
                idle: self.egress.queue_len(v) == 0
                    && !self.egress.shaped_backlog(v)
                    && self.ingress.queue_len(v) == 0,
                tx_ps_per_byte: ps_per_byte(cap(vm.max_bps, share)),
                tx_ns_per_packet: pps(vm.max_pps),
                rx_ps_per_byte: ps_per_byte(cap(vm.max_bps, allotted)),
                rx_ns_per_packet: pps(vm.max_pps),
            });
        }
    }
}

impl Engine {
    /// The kernel fast path is linked: it forwards within the destinations' rates (EyeQ 3.3),
    /// so the limiters here, which pace what it hands over, start without a burst.
    pub fn link_fast_path(&mut self) {
        self.egress.kernel_spends_bursts = true;
    }

    /// (destination endpoint, bits/s) of every admission limiter applied to local VM `vm`'s
    /// traffic (EyeQ 3.3): the shapers the engines hold for it and, with the kernel fast path,
    /// the rate each remote VM of its tenant is paced at in the kernel (its destination
    /// bucket, set from the same limiter): the engines hold a VM's limiter only while they
    /// hold its frames, and /stats showed no limit while the kernel enforced one.
    pub(super) fn applied_limits(&self, vm: VmIdx) -> Vec<(u32, u64)> {
        let mut limits = self.egress.applied_limits(vm);
        if self.egress.kernel_spends_bursts {
            let tenant = self.dir.vms[vm].tenant;
            for (d, peer) in self.dir.vms.iter().enumerate() {
                let remote = peer.tenant == tenant && peer.port.is_none();
                if !remote || limits.iter().any(|&(id, _)| id == peer.id) {
                    continue;
                }
                if let Some(bytes_per_sec) = self.destination_rate(d) {
                    limits.push((peer.id, Rate::from_bytes_per_sec(bytes_per_sec).bps()));
                }
            }
        }
        limits
    }

    /// The VM in port `slot` goes back to the kernel for what it sends: its destinations'
    /// limiters with nothing queued are forgotten, and the directory indices of those
    /// destinations returned, whose kernel buckets must not start with a burst either. One
    /// budget per destination across both paths: else each hand-over and hand-back adds a
    /// burst, and a VM sending on and off overruns the receiver's access link.
    pub fn fast_path_resumes_tx(&mut self, slot: usize) -> Vec<u32> {
        let Some(v) = self.dir.port_vm.get(slot).copied().flatten() else {
            return Vec::new();
        };
        self.egress
            .release_destination_limiters(v)
            .into_iter()
            .filter_map(|endpoint| self.dir.vm_by_id(endpoint))
            .map(|w| w as u32)
            .collect()
    }

    /// The kernel fast path's counters for the VM in port `slot`, as the program has them
    /// now: kept for /stats, and what it forwarded since `before` counted as offered to and
    /// delivered by the switch for the tenants' SLOs (no latency sample: the kernel path
    /// does not time frames).
    pub fn note_fast_path(
        &mut self,
        now: Instant,
        slot: usize,
        counters: crate::stats::FastPathCounters,
    ) {
        let Some(v) = self.dir.port_vm.get(slot).copied().flatten() else {
            return;
        };
        let before = std::mem::replace(&mut self.vm_counters[v].fast_path, counters);
        let tenant = self.dir.vms[v].tenant;
        let tx = counters.tx_bytes.saturating_sub(before.tx_bytes);
        let rx = counters.rx_bytes.saturating_sub(before.rx_bytes);
        let rx_packets = counters.rx_packets.saturating_sub(before.rx_packets);
        if tx > 0 {
            self.slo.offered(now, tenant, tx);
        }
        if rx > 0 {
            self.slo.delivered_untimed(now, tenant, rx_packets, rx);
        }
        // Dropped beyond a destination's rate, or shed while the switch was behind on the
        // VM's ring: what the overflowing limiter or the full ring would have lost.
        let tx_dropped = (counters.tx_dropped + counters.tx_shed)
            .saturating_sub(before.tx_dropped + before.tx_shed);
        if tx_dropped > 0 {
            self.slo.lost_n(now, tenant, tx_dropped);
        }
    }

    /// The access link's capacity, bytes/s.
    pub fn access_link_bytes_per_sec(&self) -> u64 {
        self.link_bytes
    }

    /// This host's id in the directory.
    pub fn host_id(&self) -> u32 {
        self.host_id
    }

    /// The rate, bytes/s, frames to remote VM `vm` are held to because its receiver asked
    /// for it (EyeQ 3.3): the kernel forwards up to it and hands the rest to the engines'
    /// limiter. `None`: not limited.
    pub fn destination_rate(&self, vm: VmIdx) -> Option<u64> {
        let endpoint = self.dir.vms[vm].id;
        self.egress.admission.as_ref()?.rate_for(endpoint)
    }

    /// Whether the limiter of remote VM `vm` overflows (its local senders go far beyond the
    /// rate its receiver asked for): the kernel then drops what is beyond that rate before
    /// any work, on the senders' CPUs, instead of handing it over (Iron 3.3).
    pub fn destination_overflowing(&self, vm: VmIdx) -> bool {
        self.egress.destination_overflowing(self.dir.vms[vm].id)
    }

    /// The kernel dropped `frames` beyond remote VM `vm`'s rate since the last call (its
    /// local senders still flood it): its limiter here stays held, though its queue may be
    /// empty, and is emptied once the kernel has dropped a queue's worth.
    pub fn kernel_dropped_for(&mut self, vm: VmIdx, now: Instant, frames: u64) {
        if let Some(endpoint) = self.dir.vms.get(vm).map(|v| v.id) {
            self.egress.still_overflowing(endpoint, now, frames);
        }
    }

    /// What the kernel forwarded from the uplink to local VMs since the last call, metered by
    /// the EyeQ receivers as the frames the engines read are (EyeQ 3.2), with the feedback
    /// their sampling asks for sent now. Every VM is first marked as receiving until its
    /// last arrival, then the arrivals are counted (counting one may close the window).
    pub fn meter_fast_arrivals(
        &mut self,
        now: Instant,
        arrivals: &[FastArrival],
        pool: &mut FramePool,
    ) {
        let local = |engine: &Engine, a: &FastArrival| {
            let w = engine.dir.port_vm.get(a.slot).copied().flatten()?;
            let source = engine.dir.host_by_underlay(a.from)?;
            Some((w, source))
        };
        for a in arrivals {
            if let (Some((w, _)), Some(link)) = (local(self, a), self.ingress.link.as_mut()) {
                link.received_until(w, a.last.min(now));
            }
        }
        for a in arrivals {
            let Some((w, source)) = local(self, a) else {
                continue;
            };
            let sample = self.meter_link(now, w, (source, a.src_mac), a.wire_bytes);
            if let Some(bp) = self.ingress.backpressure.as_mut() {
                if a.dropped > 0 {
                    bp.refused(w);
                } else {
                    bp.admitted(w, a.wire_bytes);
                }
            }
            if sample {
                self.feed_back(now, w, source, pool);
            }
        }
    }
}

/// What the kernel forwarded from the uplink to one local VM (port `slot`) from one sending
/// VM (its host's tunnel address `from`, its MAC) since the last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastArrival {
    pub slot: usize,
    pub from: Ipv4Addr,
    pub src_mac: [u8; 6],
    /// Encapsulated bytes, as the access link carried them.
    pub wire_bytes: u64,
    /// Frames of them dropped before any work (Iron, `max_pps`).
    pub dropped: u64,
    /// When the last of them arrived.
    pub last: Instant,
}

/// A VM's epochs as the kernel keeps them (bumped at every frame handed over).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epochs {
    pub tx: u64,
    pub rx: u64,
}

/// One port's hand-over counts: frames the kernel handed over, frames of those let into the
/// switch's socket, and the ring entries the switch has taken or the kernel dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCounts {
    pub handed: u64,
    pub tapped: u64,
    pub taken: u64,
}

/// What the runner writes for a VM: its permissions, the epochs they hold for, its rates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub want: FastPathWant,
    pub epochs: Epochs,
}

/// A snapshot taken before the rings were read: the VM's epochs and every port's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Snapshot {
    epochs: Epochs,
    rings: Vec<RingCounts>,
}

/// The hand-back of each VM from the engines to the kernel (see the module doc).
#[derive(Debug, Default)]
pub struct Handback {
    /// Per slot: the snapshot waiting for the rings to catch up with it.
    pending: Vec<Option<Snapshot>>,
    /// Per slot: what was last written.
    written: Vec<Option<Grant>>,
}

/// What to do for one VM after [`Handback::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to write.
    Keep,
    /// Write this grant (permissions given or taken away).
    Write(Grant),
}

impl Handback {
    /// One step for the VM of `want`: `epochs` and `rings` are read now, after the rings were
    /// read up to `rings[p].taken`. Taking a permission away is written at once; giving one
    /// back waits until the snapshot of the previous step is covered: every frame handed over
    /// by then has been let into a socket and taken from its ring, and the VM is idle here.
    /// The grant then holds for that snapshot's epochs (if the kernel handed frames over
    /// since, they differ and the kernel keeps handing over: a later step grants again).
    pub fn step(&mut self, want: FastPathWant, epochs: Epochs, rings: &[RingCounts]) -> Step {
        let slot = want.slot as usize;
        if self.pending.len() <= slot {
            self.pending.resize(slot + 1, None);
            self.written.resize(slot + 1, None);
        }
        let snapshot = self.pending[slot].replace(Snapshot {
            epochs,
            rings: rings.to_vec(),
        });
        let written = self.written[slot];
        // A grant still in force: the kernel handed nothing over since it was written.
        let in_force = written.is_some_and(|g| (g.want.tx || g.want.rx) && g.epochs == epochs);
        let may_give = want.idle && (in_force || covered(snapshot.as_ref(), rings));
        let mut give = want;
        if !may_give {
            give.tx = false;
            give.rx = false;
        }
        let grant = Grant {
            want: give,
            epochs: match &snapshot {
                Some(s) if may_give && !in_force => s.epochs,
                _ => epochs,
            },
        };
        let same = written.is_some_and(|g| {
            g.want.tx == grant.want.tx
                && g.want.rx == grant.want.rx
                && g.want.rx_drop == grant.want.rx_drop
                && g.want.tx_drop == grant.want.tx_drop
                && g.epochs == grant.epochs
                && rates_equal(&g.want, &grant.want)
        });
        if same {
            return Step::Keep;
        }
        self.written[slot] = Some(grant);
        Step::Write(grant)
    }

    /// Whether the kernel was last told to neither forward nor drop anything of the VM in
    /// `slot` (a grant with no permission written): nothing of it is in the kernel's hands.
    pub fn holds_nothing(&self, slot: u32) -> bool {
        self.written
            .get(slot as usize)
            .copied()
            .flatten()
            .is_some_and(|g| !(g.want.tx || g.want.rx || g.want.tx_drop || g.want.rx_drop))
    }

    /// Whether the VM in `slot` holds a grant in force: given, for the kernel's `epochs`.
    pub fn in_force(&self, slot: u32, epochs: Epochs) -> bool {
        self.written
            .get(slot as usize)
            .copied()
            .flatten()
            .is_some_and(|g| (g.want.tx || g.want.rx) && g.epochs == epochs)
    }

    /// Forgets a VM (its port closed).
    pub fn forget(&mut self, slot: u32) {
        if let Some(p) = self.pending.get_mut(slot as usize) {
            *p = None;
        }
        if let Some(w) = self.written.get_mut(slot as usize) {
            *w = None;
        }
    }
}

fn rates_equal(a: &FastPathWant, b: &FastPathWant) -> bool {
    a.tx_ps_per_byte == b.tx_ps_per_byte
        && a.tx_ns_per_packet == b.tx_ns_per_packet
        && a.rx_ps_per_byte == b.rx_ps_per_byte
        && a.rx_ns_per_packet == b.rx_ns_per_packet
}

/// Whether the rings now cover `snapshot`: at the snapshot no handed-over frame was between
/// the hand-over and the socket, and every one let in by then has since been taken.
fn covered(snapshot: Option<&Snapshot>, rings: &[RingCounts]) -> bool {
    let Some(s) = snapshot else {
        return false;
    };
    s.rings.len() == rings.len()
        && s.rings
            .iter()
            .zip(rings)
            .all(|(then, now)| then.handed == then.tapped && now.taken >= then.tapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(idle: bool) -> FastPathWant {
        FastPathWant {
            slot: 1,
            tx: true,
            rx: true,
            idle,
            ..Default::default()
        }
    }

    fn ring(handed: u64, tapped: u64, taken: u64) -> Vec<RingCounts> {
        vec![RingCounts {
            handed,
            tapped,
            taken,
        }]
    }

    fn granted(step: Step) -> Option<Epochs> {
        match step {
            Step::Write(g) if g.want.tx && g.want.rx => Some(g.epochs),
            _ => None,
        }
    }

    #[test]
    fn a_grant_waits_for_the_rings_to_cover_the_previous_snapshot() {
        let mut h = Handback::default();
        let e = Epochs { tx: 3, rx: 0 };
        // First step: no snapshot yet, so nothing is given (written as "no").
        assert_eq!(granted(h.step(want(true), e, &ring(3, 3, 2))), None);
        // The ring has not yet given up the third handed-over frame: still no.
        assert_eq!(h.step(want(true), e, &ring(3, 3, 2)), Step::Keep);
        // Now it has: granted for the snapshot's epochs.
        assert_eq!(granted(h.step(want(true), e, &ring(3, 3, 3))), Some(e));
        // Stable afterwards: nothing more to write.
        assert_eq!(h.step(want(true), e, &ring(3, 3, 3)), Step::Keep);
    }

    #[test]
    fn frames_between_hand_over_and_socket_hold_the_grant() {
        let mut h = Handback::default();
        let e = Epochs { tx: 5, rx: 1 };
        h.step(want(true), e, &ring(5, 4, 4));
        // The snapshot had a frame in flight (handed 5, tapped 4): not covered, whatever the
        // ring says now.
        assert_eq!(h.step(want(true), e, &ring(5, 5, 5)), Step::Keep);
        assert_eq!(granted(h.step(want(true), e, &ring(5, 5, 5))), Some(e));
    }

    #[test]
    fn a_vm_with_frames_queued_here_is_not_handed_back() {
        let mut h = Handback::default();
        let e = Epochs::default();
        h.step(want(false), e, &ring(0, 0, 0));
        assert_eq!(h.step(want(false), e, &ring(0, 0, 0)), Step::Keep);
        assert_eq!(granted(h.step(want(true), e, &ring(0, 0, 0))), Some(e));
    }

    #[test]
    fn permissions_are_taken_away_at_once() {
        let mut h = Handback::default();
        let e = Epochs::default();
        h.step(want(true), e, &ring(0, 0, 0));
        assert!(granted(h.step(want(true), e, &ring(0, 0, 0))).is_some());
        let mut off = want(true);
        off.tx = false;
        off.rx = false;
        off.rx_drop = true;
        off.tx_drop = true;
        match h.step(off, e, &ring(0, 0, 0)) {
            Step::Write(g) => {
                assert!(!g.want.tx && !g.want.rx && g.want.rx_drop && g.want.tx_drop)
            }
            other => panic!("expected a write, got {other:?}"),
        }
        // The tenant back within its CPU: its frames are no longer dropped at once.
        off.tx_drop = false;
        match h.step(off, e, &ring(0, 0, 0)) {
            Step::Write(g) => assert!(!g.want.tx_drop && g.want.rx_drop),
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn a_vm_holds_nothing_in_the_kernel_only_once_told_so() {
        let mut h = Handback::default();
        let e = Epochs::default();
        // Never written: the kernel's side is unknown, so the sync must still read it.
        assert!(!h.holds_nothing(1));
        h.step(want(true), e, &ring(0, 0, 0));
        h.step(want(true), e, &ring(0, 0, 0));
        assert!(
            !h.holds_nothing(1),
            "a grant to forward is in the kernel's hands"
        );
        let off = FastPathWant {
            slot: 1,
            idle: true,
            ..Default::default()
        };
        assert!(matches!(h.step(off, e, &ring(0, 0, 0)), Step::Write(_)));
        assert!(h.holds_nothing(1));
        let mut drop = off;
        drop.rx_drop = true;
        h.step(drop, e, &ring(0, 0, 0));
        assert!(!h.holds_nothing(1), "the kernel drops for it");
    }

    #[test]
    fn a_grant_for_a_stale_epoch_is_renewed_once_covered() {
        let mut h = Handback::default();
        h.step(want(true), Epochs { tx: 1, rx: 0 }, &ring(1, 1, 1));
        assert_eq!(
            granted(h.step(want(true), Epochs { tx: 1, rx: 0 }, &ring(1, 1, 1))),
            Some(Epochs { tx: 1, rx: 0 })
        );
        // The kernel handed a frame over since (epoch 2): the grant for 1 is no longer in
        // force. The covered snapshot is still epoch 1's, whose grant is written already, so
        // nothing new is written; the next step, epoch 2's snapshot covered, grants 2.
        assert!(!h.in_force(1, Epochs { tx: 2, rx: 0 }));
        assert_eq!(
            h.step(want(true), Epochs { tx: 2, rx: 0 }, &ring(2, 2, 1)),
            Step::Keep
        );
        assert_eq!(
            granted(h.step(want(true), Epochs { tx: 2, rx: 0 }, &ring(2, 2, 2))),
            Some(Epochs { tx: 2, rx: 0 })
        );
    }

    #[test]
    fn rates_convert_to_picoseconds_per_byte() {
        assert_eq!(ps_per_byte(0), 0);
        // 100 Mb/s = 12.5 MB/s: 80 ns per byte.
        assert_eq!(ps_per_byte(12_500_000), 80_000);
    }
}
