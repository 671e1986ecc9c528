//! Counters the engines keep: per VM, per tenant and per drop reason.
//! Plain integers updated in the hot path; the API thread reads snapshots.

use serde::Serialize;

/// Why a frame was dropped. Every drop has exactly one reason.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Unparseable frame (truncated, bad lengths, garbage Geneve).
    Malformed,
    /// A tenant port sent with a MAC/IP that is not its own.
    Spoofed,
    /// No VM with that destination in the sender's tenant.
    UnknownDestination,
    /// Overlay frame with a VNI no tenant owns.
    UnknownVni,
    /// Broadcast/multicast other than ARP (not forwarded between tenants' VMs).
    Multicast,
    /// Non-overlay frame on the uplink.
    NotOverlay,
    /// Overlay frame from an underlay address that is no known host.
    UnknownHost,
    /// Frame would not fit the underlay MTU after encapsulation.
    TooBig,
    /// The VM's egress queue was full (only when the port could not be backpressured).
    EgressQueueFull,
    /// A shaped class's or rate-limited destination's queue was full.
    ShapedQueueFull,
    /// The destination VM's ingress queue was full.
    IngressQueueFull,
    /// The tenant had exhausted its processing-CPU quota (Iron: dropped before any work).
    CpuThrottled,
    /// The VM was over its `max_pps` (dropped before any work).
    PpsLimit,
    /// No free frame buffer (pool exhausted).
    NoBuffer,
    /// As `CpuThrottled`, dropped by the uplink's XDP program before reaching the switch.
    CpuThrottledXdp,
    /// As `PpsLimit`, dropped by the uplink's XDP program before reaching the switch.
    PpsLimitXdp,
    /// A sealed frame whose tag did not verify, or sealed with a key epoch the tenant does
    /// not hold (tampered, forged or stale; `accel`).
    AuthFailed,
    /// A plain overlay frame for a tenant that encrypts, or a sealed one for a tenant that
    /// does not (never delivered: a forger could otherwise skip authentication).
    Unsealed,
    /// The shared engine's queue for the tenant was full, or the tenant has no key.
    AccelBusy,
    /// The tenant's offload program dropped the frame (its result was not 0; `offload`).
    OffloadDrop,
    /// The tenant's offload program ran out of its per-packet fuel and was stopped.
    OffloadFuel,
    /// The tenant's offload programs had used their fuel for the period (stopped, or not run).
    OffloadBudget,
    /// The tenant's offload program tried to grow its memory past its limit and was stopped.
    OffloadMemory,
    /// The tenant's offload program trapped (unreachable, out-of-bounds access, ...).
    OffloadTrap,
    /// The frame reached a worker other than its VM's, whose mailbox was full.
    HandoffFull,
    /// Queued for a VM or in a shaped class that a live change removed meanwhile.
    Removed,
    /// A port's transmit queue already held `driver::TX_QUEUE_BATCHES` batches: the
    /// destination did not take them (a vhost-user guest's full receive ring, a kernel send
    /// buffer), so the oldest were dropped.
    TxQueueFull,
}

impl DropReason {
    pub const ALL: [DropReason; 27] = [
        DropReason::Malformed,
        DropReason::Spoofed,
        DropReason::UnknownDestination,
        DropReason::UnknownVni,
        DropReason::Multicast,
        DropReason::NotOverlay,
        DropReason::UnknownHost,
        DropReason::TooBig,
        DropReason::EgressQueueFull,
        DropReason::ShapedQueueFull,
        DropReason::IngressQueueFull,
        DropReason::CpuThrottled,
        DropReason::PpsLimit,
        DropReason::NoBuffer,
        DropReason::CpuThrottledXdp,
        DropReason::PpsLimitXdp,
        DropReason::AuthFailed,
        DropReason::Unsealed,
        DropReason::AccelBusy,
        DropReason::OffloadDrop,
        DropReason::OffloadFuel,
        DropReason::OffloadBudget,
        DropReason::OffloadMemory,
        DropReason::OffloadTrap,
        DropReason::HandoffFull,
        DropReason::Removed,
        DropReason::TxQueueFull,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::Spoofed => "spoofed",
            DropReason::UnknownDestination => "unknown_destination",
            DropReason::UnknownVni => "unknown_vni",
            DropReason::Multicast => "multicast",
            DropReason::NotOverlay => "not_overlay",
            DropReason::UnknownHost => "unknown_host",
            DropReason::TooBig => "too_big",
            DropReason::EgressQueueFull => "egress_queue_full",
            DropReason::ShapedQueueFull => "shaped_queue_full",
            DropReason::IngressQueueFull => "ingress_queue_full",
            DropReason::CpuThrottled => "cpu_throttled",
            DropReason::PpsLimit => "pps_limit",
            DropReason::NoBuffer => "no_buffer",
            DropReason::CpuThrottledXdp => "cpu_throttled_xdp",
            DropReason::PpsLimitXdp => "pps_limit_xdp",
            DropReason::AuthFailed => "auth_failed",
            DropReason::Unsealed => "unsealed",
            DropReason::AccelBusy => "accel_busy",
            DropReason::OffloadDrop => "offload_drop",
            DropReason::OffloadFuel => "offload_fuel",
            DropReason::OffloadBudget => "offload_budget",
            DropReason::OffloadMemory => "offload_memory",
            DropReason::OffloadTrap => "offload_trap",
            DropReason::HandoffFull => "handoff_full",
            DropReason::Removed => "removed",
            DropReason::TxQueueFull => "tx_queue_full",
        }
    }
}

/// Drop counters indexed by reason; serialized as `{"reason": count}` for the nonzero ones.
#[derive(Clone, Debug, Default)]
pub struct Drops([u64; DropReason::ALL.len()]);

impl Serialize for Drops {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (reason, n) in self.iter().filter(|(_, n)| *n > 0) {
            map.serialize_entry(reason.as_str(), &n)?;
        }
        map.end()
    }
}

impl Drops {
    pub fn add(&mut self, r: DropReason) {
        self.0[r as usize] += 1;
    }
    pub fn add_n(&mut self, r: DropReason, n: u64) {
        self.0[r as usize] += n;
    }
    pub fn get(&self, r: DropReason) -> u64 {
        self.0[r as usize]
    }
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|&r| (r, self.get(r)))
    }
    /// Adds every count of `other` to this one's.
    pub fn add_all(&mut self, other: &Drops) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
    }
}

/// Counters of one VM (as seen by this host's switch).
#[derive(Clone, Debug, Default, Serialize)]
pub struct VmCounters {
    /// Frames/bytes the VM sent into the switch.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Frames/bytes delivered to the VM.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Drops of frames from or to this VM, by reason.
    pub drops: Drops,
    /// Dataplane CPU time charged for this VM's frames (both directions, I/O included), ns.
    pub cost_ns: u64,
    /// Kernel NET_RX softirq time on the VM's port outside the switch's thread, charged to
    /// its tenant (eBPF, docs/switch.md "eBPF"), ns; the packets it handled; the part run by
    /// ksoftirqd or on an idle CPU (charged to no task by the kernel).
    pub softirq_ns: u64,
    pub softirq_packets: u64,
    pub softirq_kthread_ns: u64,
    /// Softirq time on the VM's port run by the switch's own thread (part of its `cost_ns`
    /// already), ns.
    pub softirq_in_switch_ns: u64,
    /// Time frames to this VM waited in its ingress queue.
    pub ingress_wait: WaitHistogram,
    /// Frames of the VM that went through one of its shaped classes' queues instead of the
    /// fast path.
    pub waited_shaped_class: u64,
    /// Frames of the VM held in a limiter's queue because their destination asked for less
    /// (receiver feedback, EyeQ 3.3).
    pub waited_limiter: u64,
    /// The kernel fast path's work for this VM (none of it is in the counters above).
    pub fast_path: FastPathCounters,
}

/// Frames the kernel fast path forwarded for a VM, and why frames of (or to) it were handed
/// over to the engines instead (docs/switch.md "Two paths"). Read from the program's per-CPU
/// counters; a reason counts where the frame was handed over (the VM's port for its own
/// frames; frames to it from the uplink are the uplink's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FastPathCounters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames to the VM dropped in the kernel before any work (tenant over its CPU, VM over
    /// its `max_pps`).
    pub rx_dropped: u64,
    /// Handed over: no grant in force (frames of the VM queued in the engines, or throttled).
    pub handed_not_granted: u64,
    /// Handed over: a token bucket (its share of the link, `max_bps`, `max_pps`) was empty.
    pub handed_tokens: u64,
    /// Handed over: ARP, IPv6, multicast, IPv4 options or fragments.
    pub handed_not_unicast_ipv4: u64,
    /// Handed over: a source MAC or IPv4 address not the VM's (the engine drops it).
    pub handed_spoofed: u64,
    /// Handed over: an unknown destination, or one a feedback limiter holds (EyeQ 3.3).
    pub handed_destination: u64,
    /// Handed over: a super-frame (GSO) to another host.
    pub handed_offload: u64,
    /// Handed over: a Geneve frame with options (feedback rides on it).
    pub handed_geneve_options: u64,
    /// Frames of the VM dropped in the kernel before any work: beyond the rate a remote
    /// receiver asked for, while the switch's limiter of that destination overflows, or
    /// sent while its tenant is over its CPU allocation (Iron 3.3).
    pub tx_dropped: u64,
    /// Times the kernel handed the VM back to the fast path itself, at a frame that found
    /// every frame it had handed over taken and nothing of the VM held by the switch.
    pub tx_resumed: u64,
    /// Frames of the VM dropped in the kernel instead of handed over, while the switch was
    /// behind on its port's ring (the ring would have dropped them, after the work).
    pub tx_shed: u64,
}

impl VmCounters {
    /// Adds every counter of `o` (the same VM as another worker counted it).
    pub fn add_all(&mut self, o: &VmCounters) {
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.drops.add_all(&o.drops);
        self.cost_ns += o.cost_ns;
        self.softirq_ns += o.softirq_ns;
        self.softirq_packets += o.softirq_packets;
        self.softirq_kthread_ns += o.softirq_kthread_ns;
        self.softirq_in_switch_ns += o.softirq_in_switch_ns;
        self.ingress_wait.add_all(&o.ingress_wait);
        self.waited_shaped_class += o.waited_shaped_class;
        self.waited_limiter += o.waited_limiter;
        // One switch reads the kernel's counters: taken as they are, not added.
        if o.fast_path != FastPathCounters::default() {
            self.fast_path = o.fast_path;
        }
    }
}

/// A histogram of waits in power-of-two microsecond buckets (bucket i holds waits below
/// 2^i us, the last one the rest) and their sum: fixed size, no allocation, cheap enough for
/// every frame.
#[derive(Clone, Debug, Default)]
pub struct WaitHistogram {
    buckets: [u64; 24],
    sum_ns: u64,
}

impl WaitHistogram {
    pub fn record(&mut self, wait_ns: u64) {
        let us = wait_ns / 1_000;
        let bucket = (64 - us.leading_zeros() as usize).min(self.buckets.len() - 1);
        self.buckets[bucket] += 1;
        self.sum_ns = self.sum_ns.saturating_add(wait_ns);
    }
    /// Adds every count of `o` (the same histogram kept by another worker).
    pub fn add_all(&mut self, o: &WaitHistogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(o.buckets) {
            *mine += theirs;
        }
        self.sum_ns = self.sum_ns.saturating_add(o.sum_ns);
    }
    /// (upper bound in us, None for the last bucket's "and above"; waits in the bucket).
    pub fn buckets(&self) -> impl Iterator<Item = (Option<u64>, u64)> + '_ {
        let last = self.buckets.len() - 1;
        self.buckets
            .iter()
            .enumerate()
            .map(move |(i, &n)| ((i < last).then_some(1u64 << i), n))
    }
    /// Every wait recorded, summed, ns.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }
    /// Upper bound of the bucket holding quantile `q` (0..=1), us; None when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(1u64 << i);
            }
        }
        Some(1u64 << (self.buckets.len() - 1))
    }
}

impl Serialize for WaitHistogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("p50_us_below", &self.quantile_us(0.5))?;
        map.serialize_entry("p99_us_below", &self.quantile_us(0.99))?;
        map.serialize_entry("max_us_below", &self.quantile_us(1.0))?;
        map.end()
    }
}

/// Why feedback was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FeedbackReject {
    Forged,
    Unauthenticated,
    UnknownEpoch,
    Replayed,
    OutOfRange,
}

/// Refused feedback by reason (`/stats` `switch.feedback_rejected`, `/metrics`
/// `picnic_feedback_rejected_total{reason}`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct FeedbackRejects {
    /// Not from the host that owns the endpoint (or unknown endpoint, host or VNI).
    pub forged: u64,
    /// Missing or wrong authentication tag (deployments with a key).
    pub unauthenticated: u64,
    /// Signed with a key epoch this host does not hold (retired, or never staged here).
    pub unknown_epoch: u64,
    /// A nonce seen before, below the window, or outside the clock-skew bound.
    pub replayed: u64,
    /// A rate of 0 or above `engine::feedback::MAX_FEEDBACK_BPS`.
    pub out_of_range: u64,
}

impl FeedbackRejects {
    pub fn add(&mut self, r: FeedbackReject) {
        match r {
            FeedbackReject::Forged => self.forged += 1,
            FeedbackReject::Unauthenticated => self.unauthenticated += 1,
            FeedbackReject::UnknownEpoch => self.unknown_epoch += 1,
            FeedbackReject::Replayed => self.replayed += 1,
            FeedbackReject::OutOfRange => self.out_of_range += 1,
        }
    }
    /// (reason, count) for metrics.
    pub fn iter(&self) -> [(&'static str, u64); 5] {
        [
            ("forged", self.forged),
            ("unauthenticated", self.unauthenticated),
            ("unknown_epoch", self.unknown_epoch),
            ("replayed", self.replayed),
            ("out_of_range", self.out_of_range),
        ]
    }
}

/// Switch-wide counters for frames not attributable to a VM.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SwitchCounters {
    pub uplink_rx_packets: u64,
    pub uplink_tx_packets: u64,
    pub feedback_sent: u64,
    pub feedback_received: u64,
    /// Feedback refused before it was applied, by reason (see `engine::feedback`).
    pub feedback_rejected: FeedbackRejects,
    pub arp_replies: u64,
    /// Neighbor Advertisements the switch sent answering its VMs' solicitations.
    pub nd_replies: u64,
    /// Frames marked ECN CE by a filling limiter queue.
    pub ecn_marked: u64,
    pub drops: Drops,
    /// Dataplane thread CPU time measured, ns: the VMs' `cost_ns`, `unattributed_ns` and
    /// `overhead_ns` add up to it exactly.
    pub cpu_ns: u64,
    /// CPU spent on frames that belonged to no local VM (malformed, unknown, feedback), ns.
    pub unattributed_ns: u64,
    /// CPU spent in loop iterations that handled no frame (waiting, polling) and came more than
    /// 2 ms after one that did (earlier ones are the engines' timers for that traffic, charged
    /// to its VMs), ns.
    pub overhead_ns: u64,
    /// All NET_RX softirq time on this host and how it was attributed (None while softirq
    /// accounting is off).
    pub softirq: Option<SoftirqTotals>,
}

impl SwitchCounters {
    /// Adds every counter of `o` (another worker's); softirq totals are host-wide, kept.
    pub fn add_all(&mut self, o: &SwitchCounters) {
        self.uplink_rx_packets += o.uplink_rx_packets;
        self.uplink_tx_packets += o.uplink_tx_packets;
        self.feedback_sent += o.feedback_sent;
        self.feedback_received += o.feedback_received;
        let (r, q) = (&mut self.feedback_rejected, &o.feedback_rejected);
        r.forged += q.forged;
        r.unauthenticated += q.unauthenticated;
        r.replayed += q.replayed;
        r.out_of_range += q.out_of_range;
        self.arp_replies += o.arp_replies;
        self.nd_replies += o.nd_replies;
        self.ecn_marked += o.ecn_marked;
        self.drops.add_all(&o.drops);
        self.cpu_ns += o.cpu_ns;
        self.unattributed_ns += o.unattributed_ns;
        self.overhead_ns += o.overhead_ns;
        if self.softirq.is_none() {
            self.softirq = o.softirq;
        }
    }
}

/// The host's NET_RX softirq time as the softirq accounting programs measured it, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[repr(C)]
pub struct SoftirqTotals {
    /// Every NET_RX softirq run on every CPU.
    pub net_rx_ns: u64,
    pub windows: u64,
    /// On tenant ports, outside the switch's thread: charged to their tenants.
    pub attributed_ns: u64,
    /// On tenant ports, inside the switch's own thread (already in its measured CPU time).
    pub switch_ns: u64,
    /// On other devices, or runs that handed no packet to the stack.
    pub untracked_ns: u64,
    pub packets: u64,
}
