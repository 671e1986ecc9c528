//! The engines' side of the shared encryption engine (`crate::accel`): an encrypting
//! tenant's tunnel packets are sealed after encapsulation and opened before decapsulation.
//! The engines stay sans-I/O: they only set such frames aside as [`Job`]s; the run loop
//! hands them to the worker pool and gives the results back through [`Engine::on_accel_done`].
//!
//! A tenant that encrypts accepts only sealed packets that verify: a plain packet for it,
//! or a sealed one for a tenant that does not encrypt, is dropped as `unsealed`.

use picnic_core::Instant;
use serde::Serialize;

use super::{Completion, Engine, Job, Op, Outcome};
use crate::directory::{TenantIdx, VmIdx, UPLINK};
use crate::frame::{Frame, FramePool};
use crate::stats::DropReason;

/// The cookie of an open job: the local VM is only known once the frame is opened.
const NO_VM: u64 = u64::MAX;

/// A tenant's use of the shared engine, as charged to it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AccelUse {
    /// Frames sealed or opened for the tenant.
    pub frames: u64,
    /// Worker CPU those took, ns (also charged to the tenant's CPU account).
    pub cpu_ns: u64,
    /// Sealed frames for the tenant that failed authentication.
    pub auth_failed: u64,
}

impl AccelUse {
    /// Adds another worker's use of the engine for the same tenant (each worker's engines
    /// count the jobs submitted through its own port).
    pub fn add(&mut self, other: &AccelUse) {
        self.frames += other.frames;
        self.cpu_ns += other.cpu_ns;
        self.auth_failed += other.auth_failed;
    }
}

impl Engine {
    /// Bytes sealing adds to `tenant`'s frames on the wire.
    pub(super) fn seal_overhead(&self, tenant: TenantIdx) -> usize {
        if self.dir.tenants[tenant].encrypt {
            picnic_wire::seal::SEAL_OVERHEAD
        } else {
            0
        }
    }

    /// An encapsulated frame of `tenant` from local VM `src` leaves by the uplink, through
    /// the engine when the tenant encrypts.
    pub(super) fn to_uplink(&mut self, tenant: TenantIdx, src: VmIdx, frame: Frame) {
        if self.dir.tenants[tenant].encrypt {
            self.accel_jobs.push(Job {
                tenant,
                op: Op::Seal,
                frame,
                cookie: src as u64,
            });
        } else {
            self.tx[UPLINK].push(frame);
        }
    }

    /// A sealed frame from the uplink for the tenant of `vni`: to the engine to be opened.
    pub(super) fn to_open(&mut self, now: Instant, vni: u32, frame: Frame, pool: &mut FramePool) {
        match self.dir.tenant_by_vni(vni) {
            Some(tenant) if self.dir.tenants[tenant].encrypt => self.accel_jobs.push(Job {
                tenant,
                op: Op::Open,
                frame,
                cookie: NO_VM,
            }),
            Some(_) => self.drop_frame(now, pool, frame, None, DropReason::Unsealed),
            None => self.drop_frame(now, pool, frame, None, DropReason::UnknownVni),
        }
    }

    /// The shared engine's room per tenant (jobs each tenant's queue can still take) and its
    /// queues' depth, reported by the engine after each exchange.
    pub fn set_accel_room(&mut self, depth: usize, rooms: impl Iterator<Item = usize>) {
        self.accel_depth = depth;
        self.accel_room.clear();
        self.accel_room.extend(rooms);
    }

    /// Whether `vm`'s port is held because its tenant encrypts and its queue at the engine
    /// cannot take a read's `batch` (or, with a shallower queue, is full): FairNIC 5.2's
    /// back-pressure to a tenant's VFs. The frames wait in the VM's ring, or the kernel
    /// drops them at the sender's expense, instead of being read, switched and refused
    /// (`accel_busy`) with the loop's CPU.
    pub(super) fn accel_held(&self, vm: VmIdx, batch: usize) -> bool {
        let tenant = self.dir.vms[vm].tenant;
        self.dir.tenants[tenant].encrypt
            && self
                .accel_room
                .get(tenant)
                .is_some_and(|&room| room < batch.min(self.accel_depth).max(1))
    }

    /// Moves the frames waiting for the engine into `out`.
    pub fn take_accel_jobs(&mut self, out: &mut Vec<Job>) {
        out.append(&mut self.accel_jobs);
    }

    /// A job the engine refused (its tenant's queue was full): dropped and counted.
    pub fn on_accel_refused(&mut self, now: Instant, job: Job, pool: &mut FramePool) {
        let vm = (job.cookie != NO_VM).then_some(job.cookie as VmIdx);
        self.drop_frame(now, pool, job.frame, vm, DropReason::AccelBusy);
    }

    /// A finished job: a sealed frame goes out on the uplink, an opened one continues as a
    /// frame received from the uplink; failures are dropped and counted. The worker CPU it
    /// took is charged to its tenant (Iron 3.1: work done for a tenant is the tenant's).
    pub fn on_accel_done(&mut self, now: Instant, done: Completion, pool: &mut FramePool) {
        let tenant = done.tenant;
        self.charge_accel(now, tenant, done.cpu_ns);
        let vm = (done.cookie != NO_VM).then_some(done.cookie as VmIdx);
        match (done.outcome, done.op) {
            // Taking the sealed frame back and sending it is a handling of the loop's like
            // the others (Iron 3.1): noted for its VM, or the iteration's CPU (the wake-up
            // for the result included) would be the switch's overhead, charged to nobody.
            (Outcome::Done, Op::Seal) => {
                self.cpu.note(vm, done.frame.len());
                self.tx[UPLINK].push(done.frame)
            }
            (Outcome::Done, Op::Open) => {
                let len = done.frame.len();
                let owner = self.from_uplink_as(now, done.frame, pool, true);
                self.cpu.note(owner, len);
            }
            (Outcome::AuthFailed | Outcome::UnknownKey, _) => {
                self.accel_use[tenant].auth_failed += 1;
                self.drop_frame(now, pool, done.frame, vm, DropReason::AuthFailed);
            }
            (Outcome::NoKey, _) => {
                self.drop_frame(now, pool, done.frame, vm, DropReason::AccelBusy)
            }
            (Outcome::Malformed, _) => {
                self.drop_frame(now, pool, done.frame, vm, DropReason::Malformed)
            }
        }
    }

    /// Charges `cpu_ns` of engine work to `tenant`: its CPU account (quota and cgroup), the
    /// read-side fair share and its engine use.
    fn charge_accel(&mut self, now: Instant, tenant: TenantIdx, cpu_ns: u64) {
        let Some(usage) = self.accel_use.get_mut(tenant) else {
            return;
        };
        usage.frames += 1;
        usage.cpu_ns += cpu_ns;
        self.share.charge(tenant, cpu_ns, 0);
        self.charge_tenant_cpu(now, tenant, cpu_ns);
    }
}
