//! SLOs live in the switch (DESIGN.md 3.9): every tenant with an `slo` in the config gets a
//! [`SloMonitor`] fed on the delivery path, sans-I/O like the engines (each call takes `now`;
//! per frame only counters and preallocated histograms are touched, nothing is allocated).
//!
//! What the monitor sees of a tenant on this host:
//! - offered: the bytes of each of its frames the switch is to carry, from one of its VMs'
//!   ports once classified, checked and its destination found, or, for one of its local VMs,
//!   from the uplink (inner frame bytes both ways);
//! - delivered: each frame handed to a port for transmit, to a local VM or encapsulated to
//!   the uplink, with its latency through the switch: from entering it to that hand-off
//!   (ingress queueing and processing for frames to local VMs; egress queueing, shaping or
//!   limiting and pacing for frames to the uplink). A frame held in a feedback limiter
//!   whose rate was at or above its VM's guarantee is delivered but its latency is not
//!   judged: EyeQ gives every VM at least its guarantee, so such a limiter holds only what
//!   the tenant sends beyond it (a TCP flow fills its bottleneck's queue wherever that is),
//!   and that wait is the tenant's own demand, not a broken guarantee. It is counted in
//!   [`Why`] (`held_beyond_guarantee`);
//! - lost: each of its frames the switch should have carried and dropped ([`is_loss`]: a
//!   full queue, a limiter or budget, no buffer). Policy drops of frames it must not carry
//!   (malformed, spoofed, unknown destination, multicast it does not forward, ...) are neither
//!   lost nor offered: an idle tenant whose kernel sends MLD reports and router solicitations
//!   is not in violation. Every drop, whose doing it was (its own `max_pps`, spoofing, a full
//!   queue), is in the per-tenant breakdown [`Why`], beside where its late frames waited.
//!
//! Frames a backpressured or throttled port leaves in the VM's own ring have not entered the
//! switch: they are neither offered nor lost here. ARP requests and Neighbor Solicitations the
//! switch answers itself are neither offered, delivered nor lost (the reply is the switch's own
//! frame).

use std::collections::BTreeMap;

use picnic_core::slo::{
    Slo, SloMonitor, SloMonitorConfig, SloState, Violation, ViolationKind, ViolationKinds,
};
use picnic_core::{Duration, Instant};
use serde::Serialize;

use super::Engine;
use crate::directory::TenantIdx;
use crate::stats::{DropReason, Drops};

/// Whether a drop for `reason` is a loss of the tenant's: the switch lost a frame it should
/// have carried (a full queue, a limiter, a CPU, packet-rate or offload budget, no buffer, a
/// busy engine, a live change). Policy drops of frames the switch must not carry are not:
/// malformed, spoofed, unknown destination, VNI or host, not overlay, multicast it does not
/// forward, too big for the underlay, failed authentication or unsealed, and frames the
/// tenant's own offload program chose to drop.
pub fn is_loss(reason: DropReason) -> bool {
    !matches!(
        reason,
        DropReason::Malformed
            | DropReason::Spoofed
            | DropReason::UnknownDestination
            | DropReason::UnknownVni
            | DropReason::Multicast
            | DropReason::NotOverlay
            | DropReason::UnknownHost
            | DropReason::TooBig
            | DropReason::AuthFailed
            | DropReason::Unsealed
            | DropReason::OffloadDrop
    )
}

/// Length of a conformance window (DESIGN.md section 6 accuracy windows).
pub const SLO_WINDOW: Duration = Duration::from_millis(100);
/// Closed violations kept per tenant (older ones are counted, not kept).
const KEPT_VIOLATIONS: usize = 256;
/// Closed violations `/slo` lists per tenant, the newest.
pub const RECENT_VIOLATIONS: usize = 16;
/// Run-wide latency percentiles to 2 significant digits: about 28 KiB per tenant.
const LATENCY_DIGITS: u8 = 2;

/// Where a frame waited in the switch before it was handed to its port.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// In the destination VM's ingress queue (frames to a local VM).
    IngressQueue,
    /// In the sending VM's egress queue and the uplink pacing (fast path to the uplink).
    EgressQueue,
    /// In one of the sending VM's shaped classes.
    ShapedClass,
    /// In a limiter set by the destination's feedback (EyeQ 3.3) below the VM's guarantee.
    Limiter,
    /// In a limiter set by the destination's feedback at or above the VM's guarantee: the
    /// tenant's demand beyond its guarantee (not judged against the latency bound).
    BeyondGuarantee,
}

/// One monitored tenant.
struct Tracked {
    tenant: TenantIdx,
    monitor: SloMonitor,
    /// `latency_us` in ns, to count late frames by where they waited.
    latency_bound_ns: Option<u64>,
    /// Frames delivered later than the bound, indexed by [`Waited`].
    late: [u64; 4],
    /// Frames delivered after waiting in a limiter at or above their VM's guarantee.
    beyond_guarantee: u64,
}

/// The monitors of the tenants with an SLO, indexed by tenant.
#[derive(Default)]
pub(super) struct SloTracker {
    tracked: Vec<Option<Tracked>>,
}

impl SloTracker {
    /// Sets `tenant`'s SLO (None: not monitored) in place: an unchanged SLO keeps its
    /// monitor and history, a new one starts a fresh monitor; other tenants' are not touched.
    pub(super) fn set(
        &mut self,
        now: Instant,
        tenant: TenantIdx,
        slo: Option<Slo>,
    ) -> Result<(), String> {
        if self.tracked.len() <= tenant {
            self.tracked.resize_with(tenant + 1, || None);
        }
        let current = self.tracked[tenant].as_ref().map(|t| t.monitor.slo());
        if current == slo.as_ref() {
            return Ok(());
        }
        self.tracked[tenant] = match slo {
            Some(slo) => {
                let config = SloMonitorConfig {
                    window: SLO_WINDOW,
                    max_closed_violations: KEPT_VIOLATIONS,
                    latency_significant_digits: LATENCY_DIGITS,
                };
                let latency_bound_ns = slo.latency_us.map(|us| us.saturating_mul(1_000));
                let monitor = SloMonitor::new(slo, config, now)
                    .map_err(|e| format!("slo.{}: {e}", e.field))?;
                Some(Tracked {
                    tenant,
                    monitor,
                    latency_bound_ns,
                    late: [0; 4],
                    beyond_guarantee: 0,
                })
            }
            None => None,
        };
        Ok(())
    }

    fn get(&mut self, tenant: TenantIdx) -> Option<&mut Tracked> {
        self.tracked.get_mut(tenant)?.as_mut()
    }

    /// A frame of `tenant`'s entered the switch.
    pub(super) fn offered(&mut self, now: Instant, tenant: TenantIdx, bytes: u64) {
        if let Some(t) = self.get(tenant) {
            t.monitor.record_offered(now, bytes);
        }
    }

    /// A frame of `tenant`'s that entered the switch at `arrived` was handed to its port.
    pub(super) fn delivered(
        &mut self,
        now: Instant,
        tenant: TenantIdx,
        bytes: u64,
        arrived: Instant,
        waited: Waited,
    ) {
        if let Some(t) = self.get(tenant) {
            t.monitor.record_delivered(now, 1, bytes);
            if waited == Waited::BeyondGuarantee {
                t.beyond_guarantee += 1;
                return;
            }
            let latency = now.saturating_since(arrived).as_nanos();
            t.monitor.record_latency(now, latency);
            if t.latency_bound_ns.is_some_and(|b| latency > b) {
                t.late[waited as usize] += 1;
            }
        }
    }

    /// `packets` frames of `tenant`'s (`bytes`) were delivered by a path that does not time
    /// them (the kernel fast path).
    pub(super) fn delivered_untimed(
        &mut self,
        now: Instant,
        tenant: TenantIdx,
        packets: u64,
        bytes: u64,
    ) {
        if let Some(t) = self.get(tenant) {
            t.monitor.record_delivered(now, packets, bytes);
        }
    }

    /// The switch dropped a frame of `tenant`'s for `reason`: lost when the switch should
    /// have carried it ([`is_loss`]).
    pub(super) fn lost(&mut self, now: Instant, tenant: TenantIdx, reason: DropReason) {
        if !is_loss(reason) {
            return;
        }
        if let Some(t) = self.get(tenant) {
            t.monitor.record_lost(now, 1);
        }
    }

    /// `n` frames of `tenant` lost at once (counted by the XDP program).
    pub(super) fn lost_n(&mut self, now: Instant, tenant: TenantIdx, n: u64) {
        if let Some(t) = self.get(tenant) {
            t.monitor.record_lost(now, n);
        }
    }
}

impl Engine {
    /// Every monitored tenant's conformance at `now` (judging the windows that ended), for
    /// `GET /slo` and `/metrics`. Allocates: call it when publishing, not per frame.
    pub fn slo_report(&mut self, now: Instant) -> SloReport {
        let mut tenants = Vec::with_capacity(self.slo.tracked.len());
        for t in self.slo.tracked.iter_mut().flatten() {
            let m = &mut t.monitor;
            let state = m.state(now);
            let s = m.summary(now);
            let kept = m.closed_violations().count();
            let recent = m
                .closed_violations()
                .skip(kept.saturating_sub(RECENT_VIOLATIONS))
                .cloned()
                .collect();
            let mut drops = Drops::default();
            let (mut waited_shaped_class, mut waited_limiter) = (0, 0);
            for (v, _) in self
                .dir
                .vms
                .iter()
                .enumerate()
                .filter(|(_, v)| v.tenant == t.tenant)
            {
                let c = &self.vm_counters[v];
                drops.add_all(&c.drops);
                waited_shaped_class += c.waited_shaped_class;
                waited_limiter += c.waited_limiter;
            }
            let late = t.latency_bound_ns.map(|_| Late {
                ingress_queue: t.late[Waited::IngressQueue as usize],
                egress_queue: t.late[Waited::EgressQueue as usize],
                shaped_class: t.late[Waited::ShapedClass as usize],
                limiter: t.late[Waited::Limiter as usize],
            });
            let start = m.window_start();
            tenants.push(TenantSlo {
                tenant: self.dir.tenants[t.tenant].name.clone(),
                slo: m.slo().clone(),
                window: WindowView {
                    start_ns: start.as_nanos(),
                    end_ns: (start + m.window()).as_nanos(),
                },
                met: state == SloState::Met,
                violated: match state {
                    SloState::Met => ViolationKinds::default(),
                    SloState::Violated(kinds) => kinds,
                },
                open_violations: m.open_violations().cloned().collect(),
                recent_violations: recent,
                violations_total: ViolationKind::ALL
                    .into_iter()
                    .map(|k| (kind_name(k), m.violations_started(k)))
                    .collect(),
                totals: Totals {
                    windows: s.windows,
                    violated_windows: s.violated_windows,
                    offered_bytes: s.offered_bytes,
                    delivered_bytes: s.delivered_bytes,
                    delivered_packets: s.delivered_packets,
                    lost_packets: s.lost_packets,
                    loss_fraction: s.loss_fraction,
                    throughput_bps: s.throughput_bps,
                    latency_p50_us: s.latency_p50_us,
                    latency_p99_us: s.latency_p99_us,
                    latency_p999_us: s.latency_p999_us,
                    dropped_violations: s.dropped_violations,
                },
                why: Why {
                    drops,
                    waited_shaped_class,
                    waited_limiter,
                    held_beyond_guarantee: t.beyond_guarantee,
                    late,
                },
            });
        }
        SloReport {
            now_ns: now.as_nanos(),
            window_ms: SLO_WINDOW.as_nanos() / 1_000_000,
            tenants,
        }
    }
}

/// The snake_case name of a violation kind (as in JSON and metric labels).
pub fn kind_name(kind: ViolationKind) -> &'static str {
    match kind {
        ViolationKind::MinBandwidth => "min_bandwidth",
        ViolationKind::MaxBandwidth => "max_bandwidth",
        ViolationKind::Latency => "latency",
        ViolationKind::Loss => "loss",
    }
}

/// `GET /slo`: every tenant with an SLO on this host.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SloReport {
    /// The engines' clock when the report was taken, ns since the switch started; every
    /// instant in the report is on this clock.
    pub now_ns: u64,
    /// Length of a conformance window, ms.
    pub window_ms: u64,
    pub tenants: Vec<TenantSlo>,
}

/// One tenant's conformance.
#[derive(Clone, Debug, Serialize)]
pub struct TenantSlo {
    pub tenant: String,
    pub slo: Slo,
    /// The window being filled; `met` and `violated` judge the last window that ended.
    pub window: WindowView,
    /// No bound was violated in the last window that ended.
    pub met: bool,
    /// The bounds violated in the last window that ended (`min_bandwidth`, `max_bandwidth`,
    /// `latency`, `loss`).
    pub violated: ViolationKinds,
    /// Violations still going on (`ended_at` null), with when they started.
    pub open_violations: Vec<Violation>,
    /// The newest closed violations ([`RECENT_VIOLATIONS`] at most), oldest first.
    pub recent_violations: Vec<Violation>,
    /// Violation intervals started so far, by kind.
    pub violations_total: BTreeMap<&'static str, u64>,
    pub totals: Totals,
    pub why: Why,
}

/// A conformance window, [start_ns, end_ns) on the report's clock.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct WindowView {
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The tenant's traffic through this switch since the monitor started.
#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    /// Windows judged, and those in which some bound was violated.
    pub windows: u64,
    pub violated_windows: u64,
    pub offered_bytes: u64,
    pub delivered_bytes: u64,
    pub delivered_packets: u64,
    pub lost_packets: u64,
    /// lost / (lost + delivered) packets.
    pub loss_fraction: f64,
    /// Mean delivered rate, bits/s.
    pub throughput_bps: f64,
    /// Latency through the switch (entering it to being handed to the port), us; frames
    /// held beyond the guarantee left out.
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    pub latency_p999_us: Option<f64>,
    /// Closed violations no longer kept.
    pub dropped_violations: u64,
}

/// What dropped or delayed the tenant's frames (cumulative, like `/stats`).
#[derive(Clone, Debug, Serialize)]
pub struct Why {
    /// The tenant's frames the switch dropped, by reason, summed over its VMs.
    pub drops: Drops,
    /// Frames that went through a shaped class's queue instead of the fast path.
    pub waited_shaped_class: u64,
    /// Frames held in a limiter's queue because their destination asked for less (EyeQ 3.3).
    pub waited_limiter: u64,
    /// Of those, frames held while the limiter allowed at least their VM's guarantee:
    /// delivered, but their latency is left out of the judged distribution (the tenant's
    /// own demand beyond its guarantee).
    pub held_beyond_guarantee: u64,
    /// Frames delivered later than `latency_us`, by where they waited; null without a
    /// latency bound.
    pub late: Option<Late>,
}

/// Late frames by where they waited.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Late {
    pub ingress_queue: u64,
    pub egress_queue: u64,
    pub shaped_class: u64,
    pub limiter: u64,
}
