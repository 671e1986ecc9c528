//! Real per-tenant CPU cost (Iron 3.1, DESIGN.md 4 "Engines"): the run loop measures the
//! CPU time of each iteration (receive, classify, engines, encap/decap, transmit, system
//! calls and copies included) and hands it to [`Engine::charge_cpu`]; the engines tally,
//! per VM, the frames and bytes they handled in that iteration (once when a frame enters,
//! once when it is processed and sent), and the time is split over the tally with Iron's
//! batch split on the loop's measured cost model ([`CostFit`]). Nothing is configured: the
//! per-frame and per-byte costs are fitted from the iterations themselves.
//!
//! The split feeds everything that needs a frame's cost: the per-VM and per-tenant charges
//! shown in /stats, Iron's CPU accounts (quota, throttling, cgroup charging) and the
//! CPU-fair WFQ of both engines, which charge each frame the model's estimate for its size
//! plus any synthetic work measured for it.

use picnic_core::cost::CostFit;
use picnic_core::iron::{split_batch_cost, BatchPacket};
use picnic_core::{Duration, Instant};

use super::{Engine, IRON_PERIOD};
use crate::directory::{TenantIdx, VmIdx};

/// cgroup v1 refuses a CFS quota under 1 ms.
pub(super) const CGROUP_MIN_QUOTA: Duration = Duration::from_millis(1);

/// The frames and bytes each VM had handled since the last charge.
#[derive(Debug, Default)]
pub(super) struct CpuLedger {
    /// Per VM: frames, bytes.
    tally: Vec<(u32, u64)>,
    /// Per VM: extra processing measured frame by frame ([`super::Work`]), ns; charged as
    /// measured and left out of the split and the fit.
    direct: Vec<u64>,
    /// VMs with a nonzero tally, in first-touch order.
    touched: Vec<VmIdx>,
    /// Frames handled for nobody (malformed, unknown destination, feedback from other hosts).
    unattributed: (u32, u64),
    fit: CostFit,
    entries: Vec<BatchPacket>,
    shares: Vec<u64>,
    /// When the tenants' cgroup quotas are next due (an Iron period after the last).
    next_cgroup_update: Instant,
    /// Per tenant: what its account had been charged at the last cgroup refill, ns.
    charged_before: Vec<u64>,
    /// Whether the last refill had a cgroup to write.
    cgroups: bool,
    /// When the last batch (`entries`) was charged.
    batch_at: Instant,
}

/// How long after a batch a pass that handles no frame is still charged to that batch's VMs:
/// the engines' timers that follow traffic (limiter releases, pacing, EyeQ's meter windows and
/// feedback) fire well within it, and each wake-up costs the loop 15-25 us here (a context
/// switch in and out of the wait). Later passes are the switch's own idle loop.
const TRAFFIC_TAIL: Duration = Duration::from_millis(2);

/// A frame's first guess before the loop's cost model is fitted, ns per handling.
const INITIAL_HANDLING_NS: u64 = 500;

impl CpuLedger {
    /// Room for `vms` VMs (VMs are only ever added: removed VMs' slots are reused).
    pub(super) fn grow(&mut self, vms: usize) {
        if self.tally.len() < vms {
            self.tally.resize(vms, (0, 0));
            self.direct.resize(vms, 0);
        }
    }

    /// Notes that a frame of `bytes` was handled for `vm` (None: for nobody).
    pub(super) fn note(&mut self, vm: Option<VmIdx>, bytes: usize) {
        let slot = match vm {
            Some(v) => {
                if self.tally[v].0 == 0 && self.direct[v] == 0 {
                    self.touched.push(v);
                }
                &mut self.tally[v]
            }
            None => &mut self.unattributed,
        };
        slot.0 += 1;
        slot.1 += bytes as u64;
    }

    /// Forgets the last batch (a VM of it was removed): passes until the next batch are the
    /// switch's overhead.
    pub(super) fn forget_batch(&mut self) {
        self.entries.clear();
    }

    /// Notes `ns` of extra processing measured for one of `vm`'s frames.
    pub(super) fn note_direct(&mut self, vm: VmIdx, ns: u64) {
        if self.tally[vm].0 == 0 && self.direct[vm] == 0 {
            self.touched.push(vm);
        }
        self.direct[vm] += ns;
    }

    /// The CPU one handling of a `bytes` frame costs by the fitted model, ns.
    pub(super) fn handling_ns(&self, bytes: usize) -> u64 {
        match self.fit.coefficients() {
            Some(c) => (c.per_packet_ns + c.per_byte_ns * bytes as f64).max(1.0) as u64,
            None => INITIAL_HANDLING_NS,
        }
    }

    /// A frame's CPU cost, ns: its two handlings (in and out) by the model plus `work_ns`
    /// of extra processing.
    pub(super) fn frame_cost(&self, bytes: usize, work_ns: u64) -> u64 {
        2 * self.handling_ns(bytes) + work_ns
    }

    /// A frame's cost in the CPU-fair WFQ, ns of the resource it takes: its time on the link
    /// of `ps_per_wire_byte`, or, while the engine is CPU-bound (its last poll left work
    /// queued with the link free), its CPU cost if that is larger. Charging CPU only while
    /// CPU is what runs out keeps the schedulers bandwidth-fair (EyeQ's guarantees) when the
    /// link is the bottleneck, and CPU-fair (PicNIC 2.2) when the switch is.
    pub(super) fn wfq_cost(
        &self,
        bytes: usize,
        work_ns: u64,
        wire_bytes: u64,
        ps_per_wire_byte: u64,
        cpu_bound: bool,
    ) -> u64 {
        let wire = (wire_bytes * ps_per_wire_byte / 1000).max(1);
        if cpu_bound {
            wire.max(self.frame_cost(bytes, work_ns))
        } else {
            wire
        }
    }

    /// The fitted model, for /stats.
    pub(super) fn model(&self) -> Option<picnic_core::cost::Coefficients> {
        self.fit.coefficients()
    }
}

impl Engine {
    /// The CPU budget each tenant's cgroup is entitled to for the Iron period that starts at
    /// `now`: its allocation minus the switch work charged to its account since the last
    /// refill (Iron 3.2: the container pays for its network processing; with workers, what
    /// every worker charged), possibly zero. Fills `out` with (tenant, budget) once per period,
    /// leaves it empty between; the caller writes the cgroup files (`CpuQuota::refill`, which
    /// applies the kernel's 1 ms minimum and carries the group's own overruns).
    pub fn cgroup_quotas(&mut self, now: Instant, out: &mut Vec<(TenantIdx, Duration)>) {
        out.clear();
        let Some(b) = self.budgets.as_ref() else {
            return;
        };
        if now < self.cpu.next_cgroup_update {
            return;
        }
        // On the period's clock; from `now` at the first call, or after a loop held up for a
        // whole period.
        let next = self.cpu.next_cgroup_update + IRON_PERIOD;
        self.cpu.next_cgroup_update = if next > now { next } else { now + IRON_PERIOD };
        let used = b.budgets.usage_since(&mut self.cpu.charged_before);
        for (t, tenant) in self.dir.tenants.iter().enumerate() {
            let (Some(_), Some(cores), Some(&used)) =
                (tenant.cgroup.as_ref(), tenant.cpu_quota, used.get(t))
            else {
                continue;
            };
            let allocation = (IRON_PERIOD.as_nanos() as f64 * cores) as u64;
            out.push((t, Duration::from_nanos(allocation.saturating_sub(used))));
        }
        self.cpu.cgroups = !out.is_empty();
    }

    /// When the tenants' cgroups are next refilled, if the loop refills any: it wakes then.
    pub(super) fn cgroups_due(&self) -> Option<Instant> {
        self.cpu.cgroups.then_some(self.cpu.next_cgroup_update)
    }

    /// Notes that the loop spent `ns` up to `now` without work (read-side fairness holds
    /// tenants back only while the loop is saturated).
    pub fn note_idle(&mut self, now: Instant, ns: u64) {
        self.share.roll(now);
        self.share.idle(ns);
        // The receivers' meter windows that ended while the loop slept, closed as at their
        // ends (they no longer wake it), before this pass meters anything.
        let from = now - Duration::from_nanos(ns);
        self.ingress
            .catch_up(self.idle_from.take().map_or(from, |f| f.min(from)), now);
    }

    /// Notes that a pass of the loop found no work at `now` (no port gave frames, no engine
    /// processed any): tenants held back by read-side fairness are read again at once.
    pub fn note_empty_pass(&mut self, now: Instant) {
        self.share.roll(now);
        self.share.found_nothing();
        self.idle_from.get_or_insert(now);
    }

    /// Charges `cpu_ns` of dataplane CPU time, measured since the previous call, to the VMs
    /// whose frames were handled in that time (Iron 3.1's batch split) and their tenants'
    /// CPU accounts. Time with no frame handled is the switch's own overhead. The charges,
    /// the overhead and the unattributed part add up to the measured time exactly.
    pub fn charge_cpu(&mut self, now: Instant, cpu_ns: u64) {
        self.counters.cpu_ns += cpu_ns;
        self.share.roll(now);
        let ledger = &mut self.cpu;
        let (packets, bytes) = ledger.touched.iter().fold(ledger.unattributed, |acc, &v| {
            (acc.0 + ledger.tally[v].0, acc.1 + ledger.tally[v].1)
        });
        // Extra processing was measured frame by frame: it goes to its VMs as measured.
        let mut direct_total = 0;
        for i in 0..ledger.touched.len() {
            let v = self.cpu.touched[i];
            let ns = self.cpu.direct[v].min(cpu_ns - direct_total);
            direct_total += ns;
            self.vm_counters[v].cost_ns += ns;
            let tenant = self.dir.vms[v].tenant;
            self.charge_tenant_cpu(now, tenant, ns);
            self.cpu.direct[v] = 0;
            self.share.charge(tenant, ns, 0);
        }
        let ledger = &mut self.cpu;
        let cpu_ns = cpu_ns - direct_total;
        ledger.fit.observe(packets as u64, bytes, cpu_ns);
        if packets == 0 {
            ledger.touched.clear();
            // A pass soon after a batch is the engines' timers working for that batch's
            // traffic: its VMs pay, in the batch's proportions. Later, it is overhead.
            if ledger.entries.is_empty() || now.saturating_since(ledger.batch_at) > TRAFFIC_TAIL {
                self.counters.overhead_ns += cpu_ns;
            } else {
                self.charge_split(now, cpu_ns, false);
            }
            return;
        }
        ledger.batch_at = now;
        ledger.entries.clear();
        for &v in ledger.touched.iter().filter(|&&v| ledger.tally[v].0 > 0) {
            let (p, b) = ledger.tally[v];
            ledger.entries.push(BatchPacket {
                tenant: v,
                packets: p,
                bytes: b,
            });
        }
        if ledger.unattributed.0 > 0 {
            ledger.entries.push(BatchPacket {
                tenant: usize::MAX,
                packets: ledger.unattributed.0,
                bytes: ledger.unattributed.1,
            });
        }
        self.charge_split(now, cpu_ns, true);
        let ledger = &mut self.cpu;
        for &v in &ledger.touched {
            ledger.tally[v] = (0, 0);
        }
        ledger.touched.clear();
        ledger.unattributed = (0, 0);
    }

    /// Splits `cpu_ns` over the last batch's entries (Iron 3.1's batch split on the fitted
    /// model) and charges each VM's share to it, its tenant's CPU account, budget and
    /// CPU-fair share (with the batch's bytes when `with_bytes`: once per batch); frames for
    /// nobody go to `unattributed_ns`.
    fn charge_split(&mut self, now: Instant, cpu_ns: u64, with_bytes: bool) {
        let ledger = &mut self.cpu;
        ledger.shares.clear();
        ledger.shares.resize(ledger.entries.len(), 0);
        let (batch, model) = ledger.fit.split_model(cpu_ns);
        split_batch_cost(batch, model, &ledger.entries, &mut ledger.shares)
            .expect("entries are not empty and shares match them");
        for i in 0..ledger.entries.len() {
            let (entry, ns) = (self.cpu.entries[i], self.cpu.shares[i]);
            if entry.tenant == usize::MAX {
                self.counters.unattributed_ns += ns;
                continue;
            }
            let v = entry.tenant;
            self.vm_counters[v].cost_ns += ns;
            let tenant = self.dir.vms[v].tenant;
            let bytes = if with_bytes { entry.bytes } else { 0 };
            self.share.charge(tenant, ns, bytes);
            self.charge_tenant_cpu(now, tenant, ns);
        }
    }
}
