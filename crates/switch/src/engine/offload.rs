//! The engines' side of tenant offload programs (`crate::offload`): a tenant's program sees
//! every frame its VMs send before the switch classifies it (so anti-spoofing judges what the
//! program made of it), and every frame for its VMs after admission (Iron's quota, the
//! packet rate, EyeQ's meter) and before the VM's ingress queue: FairNIC 5.1's
//! `from_host_packet_cb` and `from_wire_packet_cb`. The engines stay sans-I/O: a run's cost is
//! its fuel, converted at the interpreter's measured speed and charged to the VM's tenant as
//! per-frame work (`CpuLedger::note_direct`), which Iron's accounts and the CPU-fair share
//! see like any other work done for the tenant.

use picnic_core::Instant;

use super::Engine;
use crate::config::Config;
use crate::directory::{TenantIdx, VmIdx};
use crate::frame::{Frame, FramePool};
use crate::offload::{self, Hook, OffloadStats, Program, Verdict};
use crate::stats::DropReason;

/// Every tenant's program (None: no program).
pub(super) struct Offloads {
    programs: Vec<Option<Program>>,
    /// `isolation.offload`: without it a program has no period budget.
    isolated: bool,
    /// Frames the last run emitted, before they are copied into pool frames.
    emitted: Vec<Vec<u8>>,
}

impl Offloads {
    /// No programs yet ([`Offloads::set`] loads them, tenant by tenant).
    pub(super) fn new(cfg: &Config) -> Offloads {
        Offloads {
            programs: Vec::new(),
            isolated: cfg.isolation.offload,
            emitted: Vec::new(),
        }
    }

    /// Loads tenant `idx`'s program as `t` says, at `now` (none: no program), replacing what
    /// it had; on error the tenant keeps what it had.
    pub(super) fn set(
        &mut self,
        now: Instant,
        idx: TenantIdx,
        t: &crate::config::TenantEntry,
    ) -> Result<(), String> {
        let program = match &t.offload {
            Some(o) => {
                let code = o.code().map_err(|e| format!("tenant '{}': {e}", t.name))?;
                let limits = offload::Limits {
                    fuel_per_period: if self.isolated {
                        o.fuel_per_period
                    } else {
                        u64::MAX
                    },
                    ..o.limits()
                };
                let engine = offload::engine();
                Some(
                    Program::load(&engine, &code, limits, offload::DEFAULT_PS_PER_FUEL, now)
                        .map_err(|e| format!("tenant '{}': {e}", t.name))?,
                )
            }
            None => None,
        };
        if self.programs.len() <= idx {
            self.programs.resize_with(idx + 1, || None);
        }
        self.programs[idx] = program;
        Ok(())
    }

    /// Starts new budget periods of the programs whose period ended by `now`.
    pub(super) fn on_timeout(&mut self, now: Instant) {
        for p in self.programs.iter_mut().flatten() {
            p.refill(now);
        }
    }

    /// When the earliest spent budget comes back (the loop's wake-up for held ports).
    pub(super) fn poll_at(&self) -> Option<Instant> {
        self.programs
            .iter()
            .flatten()
            .filter_map(Program::budget_back_at)
            .min()
    }

    /// Tenant `idx` has no program any more.
    pub(super) fn clear(&mut self, idx: TenantIdx) {
        if let Some(p) = self.programs.get_mut(idx) {
            *p = None;
        }
    }
}

impl Engine {
    /// Whether `vm`'s port is held because its tenant's egress program spent its period's
    /// fuel (Iron 3.2's throttling applied to the program's budget; FairNIC 5.2's
    /// back-pressure): no work is spent reading frames the program cannot run on.
    pub(super) fn offload_held(&self, now: Instant, vm: VmIdx) -> bool {
        self.offload
            .programs
            .get(self.dir.vms[vm].tenant)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.has(Hook::Egress) && p.spent_until(now).is_some())
    }

    /// Runs `vm`'s tenant's `hook` on `frame`: gives the frame back to go on, or drops it
    /// (counted against `vm` with the program's reason) and gives nothing. Frames the
    /// program emitted go to `vm`'s port.
    pub(super) fn offload_hook(
        &mut self,
        now: Instant,
        vm: VmIdx,
        hook: Hook,
        frame: Frame,
        pool: &mut FramePool,
    ) -> Option<Frame> {
        let tenant = self.dir.vms[vm].tenant;
        let Some(program) = self
            .offload
            .programs
            .get_mut(tenant)
            .and_then(Option::as_mut)
        else {
            return Some(frame);
        };
        if !program.has(hook) {
            return Some(frame);
        }
        let (frame, verdict, cpu_ns) = program.run(now, hook, frame, &mut self.offload.emitted);
        if cpu_ns > 0 && self.isolation.offload {
            self.cpu.note_direct(vm, cpu_ns);
        }
        let port = self.dir.vms[vm].port;
        for bytes in self.offload.emitted.drain(..) {
            let Some(mut f) = pool.get() else {
                self.vm_counters[vm].drops.add(DropReason::NoBuffer);
                continue;
            };
            match port {
                Some(port) if f.fill_from(&bytes) => self.tx[port].push(f),
                _ => pool.put(f),
            }
        }
        match verdict {
            Verdict::Pass => Some(frame),
            Verdict::Drop(reason) => {
                self.drop_frame(now, pool, frame, Some(vm), reason);
                None
            }
        }
    }

    /// Charges program runs at `ps_per_fuel` ps of CPU per unit of fuel (the interpreter's
    /// speed on this machine, `offload::calibrate`).
    pub fn set_offload_cost(&mut self, ps_per_fuel: u64) {
        for p in self.offload.programs.iter_mut().flatten() {
            p.set_ps_per_fuel(ps_per_fuel);
        }
    }

    /// Whether any tenant has a program.
    pub fn has_offloads(&self) -> bool {
        self.offload.programs.iter().any(Option::is_some)
    }

    /// The counters of `tenant`'s program, if it has one.
    pub(super) fn offload_stats(&self, tenant: TenantIdx) -> Option<OffloadStats> {
        self.offload
            .programs
            .get(tenant)
            .and_then(Option::as_ref)
            .map(Program::stats)
    }
}
