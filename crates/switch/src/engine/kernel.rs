//! What the kernel does for the engines through the switch's eBPF programs (docs/switch.md,
//! "eBPF"), as plain data in and out; the runner moves it to and from the BPF maps.
//!
//! - **Early drop** (Iron 3.3, issue 12 item 3): [`Engine::xdp_throttles`] is the set of local
//!   VMs whose frames the uplink's XDP program should drop before they reach the switch's
//!   rings: those of a tenant over its CPU allocation (Iron's account exhausted) and those over
//!   their `max_pps` inbound. A VM's packet budget is throttled when its bucket is empty and
//!   released when half a burst is back, so the map changes at most a few times per burst,
//!   never per packet. The program's counts come back through [`Engine::on_xdp_drops`] as
//!   drop reasons `cpu_throttled_xdp` and `pps_limit_xdp`.
//! - **Softirq accounting** (Iron 3.1-3.2, issue 12 item 4): the kernel's NET_RX softirq time
//!   for a VM's port, measured on tracepoints, is charged to the VM's tenant with
//!   [`Engine::charge_softirq`], like the switch's own measured work: it counts against the
//!   tenant's Iron account and so lowers its cgroup quota.

use picnic_core::Instant;

use super::Engine;
use crate::directory::PortIdx;
use crate::stats::DropReason;

/// [`XdpThrottle::reasons`] bit: the tenant is over its CPU allocation.
pub const XDP_CPU: u32 = 1 << 0;
/// [`XdpThrottle::reasons`] bit: the VM is over its inbound `max_pps`.
pub const XDP_PPS: u32 = 1 << 1;

/// A local VM whose Geneve frames the uplink's XDP program drops (VNI and inner destination
/// MAC), the slot its drops are counted in (its port index) and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpThrottle {
    pub vni: u32,
    pub mac: [u8; 6],
    pub slot: u32,
    pub reasons: u32,
}

/// One tenant port's NET_RX softirq work since the last read, ns (slot: its port index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftirqDelta {
    pub slot: u32,
    /// Receiving the VM's frames on the switch-side device, outside the switch's thread.
    pub from_vm_ns: u64,
    /// Receiving the switch's frames on the VM-side peer, outside the switch's thread.
    pub to_vm_ns: u64,
    /// Packets in those two.
    pub packets: u64,
    /// Of those two, the part run in kernel threads (ksoftirqd) or on an idle CPU: time the
    /// kernel charged to no task.
    pub kthread_ns: u64,
    /// Run by the switch's own thread: already in its measured CPU time, not charged again.
    pub in_switch_ns: u64,
}

impl Engine {
    /// The local VMs whose frames the uplink's XDP program should drop now (`out` is
    /// replaced). Cheap: one pass over the local VMs.
    pub fn xdp_throttles(&mut self, now: Instant, out: &mut Vec<XdpThrottle>) {
        out.clear();
        for p in 1..self.dir.port_vm.len() {
            let Some(v) = self.dir.port_vm[p] else {
                continue;
            };
            let mut reasons = 0;
            if self.cpu_throttled(now, v) {
                reasons |= XDP_CPU;
            }
            if let Some(bucket) = self.pps_in[v].as_ref() {
                let held = &mut self.xdp_pps[v];
                let available = bucket.available(now);
                if *held && available >= release_tokens(bucket.burst()) {
                    *held = false;
                } else if !*held && available == 0 {
                    *held = true;
                }
                if *held {
                    reasons |= XDP_PPS;
                }
            }
            if reasons != 0 {
                let vm = &self.dir.vms[v];
                out.push(XdpThrottle {
                    vni: self.dir.tenants[vm.tenant].vni,
                    mac: vm.mac.0,
                    slot: p as u32,
                    reasons,
                });
            }
        }
    }

    /// When a VM held back for its packet budget in XDP gets it back (the loop must look
    /// then: nothing else wakes it while the program drops the VM's frames).
    pub(super) fn xdp_poll_at(&self) -> Option<Instant> {
        self.xdp_pps
            .iter()
            .enumerate()
            .filter(|(_, &held)| held)
            .filter_map(|(v, _)| {
                let b = self.pps_in[v].as_ref()?;
                b.ready_at(release_tokens(b.burst()))
            })
            .min()
    }

    /// Counts `frames` the uplink's XDP program dropped for the VM on port `slot`: `reason`
    /// 0 for its tenant's CPU budget, 1 for its packet budget (the program's order).
    pub fn on_xdp_drops(&mut self, now: Instant, slot: PortIdx, reason: usize, frames: u64) {
        let Some(Some(v)) = self.dir.port_vm.get(slot).copied() else {
            return;
        };
        let reason = match reason {
            0 => DropReason::CpuThrottledXdp,
            _ => DropReason::PpsLimitXdp,
        };
        self.vm_counters[v].drops.add_n(reason, frames);
        self.slo.lost_n(now, self.dir.vms[v].tenant, frames);
    }

    /// Charges a port's softirq work to its VM's tenant (Iron 3.2): the time outside the
    /// switch's thread counts against the tenant's CPU account like the switch's own work.
    pub fn charge_softirq(&mut self, now: Instant, d: &SoftirqDelta) {
        let Some(Some(v)) = self.dir.port_vm.get(d.slot as usize).copied() else {
            return;
        };
        let ns = d.from_vm_ns + d.to_vm_ns;
        let c = &mut self.vm_counters[v];
        c.softirq_ns += ns;
        c.softirq_packets += d.packets;
        c.softirq_kthread_ns += d.kthread_ns;
        c.softirq_in_switch_ns += d.in_switch_ns;
        self.charge_tenant_cpu(now, self.dir.vms[v].tenant, ns);
    }
}

/// Tokens a VM held back for its packet budget must have before it is released: half its
/// burst (at least one), so the throttle flips at most twice per half burst of packets.
fn release_tokens(burst: u64) -> u64 {
    (burst / 2).max(1)
}
