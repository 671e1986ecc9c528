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

/// Every tenant's program (None: no program), with the interpreter they share.
pub(super) struct Offloads {
    programs: Vec<Option<Program>>,
    /// Frames the last run emitted, before they are copied into pool frames.
    emitted: Vec<Vec<u8>>,
}

impl Offloads {
    /// Loads the program of every tenant of `cfg` that has one, at `now` (without
    /// `isolation.offload`, with no period budget).
    pub(super) fn new(cfg: &Config, now: Instant) -> anyhow::Result<Offloads> {
        let wasm = cfg
            .tenants
            .iter()
            .any(|t| t.offload.is_some())
            .then(offload::engine);
        let programs = cfg
            .tenants
            .iter()
            .map(|t| match (&t.offload, &wasm) {
                (Some(o), Some(engine)) => Program::load(
                    engine,
                    &o.code()?,
                    offload::Limits {
                        fuel_per_period: if cfg.isolation.offload {
                            o.fuel_per_period
                        } else {
                            u64::MAX
                        },
                        ..o.limits()
                    },
                    offload::DEFAULT_PS_PER_FUEL,
                    now,
                )
                .map(Some)
                .map_err(|e| anyhow::anyhow!("tenant '{}': {e}", t.name)),
                _ => Ok(None),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Offloads {
            programs,
            emitted: Vec::new(),
        })
    }
}

impl Engine {
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
        let Some(program) = self.offload.programs[tenant].as_mut() else {
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
        self.offload.programs[tenant].as_ref().map(Program::stats)
    }
}
