//! Live changes in place (docs/switch.md "Live changes"): each [`Change`] touches only the
//! host, tenant or VM it names, through the mechanisms' setters (the WFQs' `add_queue`,
//! `set_weight`, `set_cap`, `remove_queue`; the EyeQ receivers' endpoints; Iron's
//! `set_quota`; the SLO monitors), never by rebuilding the engines. Every other tenant's
//! queued frames, limiters and scheduler state stay as they are, and the frames a removed VM
//! or shaped class held go back to the pool. Sans-I/O like the engines: the caller opens and
//! closes ports as [`PortChange`] says.

use picnic_core::bucket::TokenBucket;
use picnic_core::Instant;

use super::queues::{tenant_min_pps, tenant_weights};
use super::AccelUse;
use super::Engine;
use crate::change::{apply_to, diff, Change};
use crate::config::{Config, TenantEntry, VmEntry};
use crate::directory::{PortIdx, VmIdx};
use crate::frame::{Frame, FramePool};
use crate::stats::{DropReason, VmCounters};

/// What the caller does with its ports after a change.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PortChange {
    /// A local VM was added on this port slot: open its port there.
    Opened(PortIdx),
    /// A local VM was removed: close the port in this slot.
    Closed(PortIdx),
}

/// Why [`Engine::apply_all`] did not apply a list of changes.
#[derive(Debug, Clone)]
pub struct ChangeFailed {
    /// The change that failed (its place in the list, the list's length, what it was) and why.
    pub index: usize,
    pub of: usize,
    pub change: String,
    pub error: String,
    /// None: the changes before it were undone and nothing changed. Some: undoing them failed
    /// too (why), so the first `index` changes stay applied.
    pub undo_failed: Option<String>,
}

impl ChangeFailed {
    /// The config the engine runs after the failure: `old`, or with the changes that stayed.
    pub fn running(&self, old: &Config, changes: &[Change]) -> Config {
        let mut cfg = old.clone();
        if self.undo_failed.is_some() {
            changes[..self.index]
                .iter()
                .for_each(|c| apply_to(&mut cfg, c));
        }
        cfg
    }
}

impl std::fmt::Display for ChangeFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, of, before) = (self.index + 1, self.of, self.index);
        write!(
            f,
            "change {n} of {of} ({}) failed: {}; ",
            self.change, self.error
        )?;
        match &self.undo_failed {
            None => write!(f, "the {before} before it were undone: nothing changed"),
            Some(e) => write!(
                f,
                "undoing the {before} before it failed too ({e}): those stay applied, as the running config shows"
            ),
        }
    }
}

impl std::error::Error for ChangeFailed {}

/// A packets/s bucket for a VM with `max_pps` (burst: 1 ms of its rate, at least one batch).
fn pps_bucket(max_pps: Option<u64>, now: Instant) -> Option<TokenBucket> {
    max_pps.map(|pps| TokenBucket::new(pps, (pps / 1000).max(64), now))
}

impl Engine {
    /// Applies one live change at `now`; frames it takes out of queues go back to `pool`.
    /// Fails, changing nothing, for an unknown or duplicate name or a tenant that still has
    /// VMs.
    pub fn apply(
        &mut self,
        now: Instant,
        change: &Change,
        pool: &mut FramePool,
    ) -> Result<Option<PortChange>, String> {
        // Meter windows that ended before the change are closed as it found them (they are
        // closed when read, `Ingress::catch_up`).
        self.catch_up(now);
        match change {
            Change::SetHost(h) => self.dir.set_host(h),
            Change::RemoveHost(id) => self.dir.remove_host(*id),
            Change::AddTenant(t) => self.add_tenant(now, t)?,
            Change::SetTenant(t) => self.set_tenant(now, t)?,
            Change::RemoveTenant(name) => self.remove_tenant(now, name)?,
            Change::AddVm(v) => return Ok(self.add_vm(now, v)?.map(PortChange::Opened)),
            Change::SetVm(v) => self.set_vm(now, v, pool)?,
            Change::RemoveVm(name) => {
                return Ok(self.remove_vm(name, pool)?.map(PortChange::Closed));
            }
            Change::SetFeedbackKeys(keys) => self.feedback_auth.install(keys.as_ref())?,
        }
        Ok(None)
    }

    /// Applies `changes` (the diff from `old`) in order, telling `on_port` what each does to
    /// the ports. All or nothing: when one fails, the ones before it are undone (the diff back
    /// from the config they made to `old`, which the ports see too), and the error says which
    /// failed and whether undoing worked.
    pub fn apply_all(
        &mut self,
        now: Instant,
        old: &Config,
        changes: &[Change],
        pool: &mut FramePool,
        mut on_port: impl FnMut(PortChange, &Change),
    ) -> Result<(), ChangeFailed> {
        for (index, change) in changes.iter().enumerate() {
            let error = match self.apply(now, change, pool) {
                Ok(port) => {
                    port.into_iter().for_each(|p| on_port(p, change));
                    continue;
                }
                Err(e) => e,
            };
            let mut made = old.clone();
            changes[..index].iter().for_each(|c| apply_to(&mut made, c));
            let undone = diff(&made, old).and_then(|undo| {
                undo.iter().try_for_each(|c| {
                    let port = self.apply(now, c, pool).map_err(|e| format!("{c}: {e}"))?;
                    port.into_iter().for_each(|p| on_port(p, c));
                    Ok(())
                })
            });
            return Err(ChangeFailed {
                index,
                of: changes.len(),
                change: change.to_string(),
                error,
                undo_failed: undone.err(),
            });
        }
        Ok(())
    }

    /// Makes room in the per-tenant, per-VM and per-port state for the directory's slots.
    fn grow(&mut self) {
        let (tenants, vms, ports) = (
            self.dir.tenants.len(),
            self.dir.vms.len(),
            self.dir.port_count(),
        );
        self.accel_use.resize(tenants, AccelUse::default());
        self.vm_counters.resize(vms, VmCounters::default());
        self.pps_out.resize(vms, None);
        self.pps_in.resize(vms, None);
        self.xdp_pps.resize(vms, false);
        self.cpu.grow(vms);
        self.tx.resize_with(ports.max(self.tx.len()), Vec::new);
    }

    /// The read-side shares after a change of guarantees: weights and packet-rate
    /// guarantees per tenant.
    fn update_shares(&mut self) {
        self.share.set_weights(tenant_weights(&self.dir));
        self.share.set_guarantees(&tenant_min_pps(&self.dir));
    }

    pub(super) fn add_tenant(&mut self, now: Instant, t: &TenantEntry) -> Result<(), String> {
        if self.dir.tenant_named(&t.name).is_some() {
            return Err(format!("tenant '{}' exists", t.name));
        }
        let idx = self.dir.add_tenant(t);
        self.grow();
        self.update_shares();
        self.offload.set(now, idx, t)?;
        self.own_budgets(now);
        self.slo.set(now, idx, t.slo.clone())
    }

    fn set_tenant(&mut self, now: Instant, t: &TenantEntry) -> Result<(), String> {
        let idx = self
            .dir
            .tenant_named(&t.name)
            .ok_or_else(|| format!("no tenant '{}'", t.name))?;
        self.dir.set_tenant(idx, t);
        self.offload.set(now, idx, t)?;
        self.own_budgets(now);
        self.slo.set(now, idx, t.slo.clone())
    }

    fn remove_tenant(&mut self, now: Instant, name: &str) -> Result<(), String> {
        let idx = self
            .dir
            .tenant_named(name)
            .ok_or_else(|| format!("no tenant '{name}'"))?;
        if self
            .dir
            .vms
            .iter()
            .any(|v| v.tenant == idx && !v.name.is_empty())
        {
            return Err(format!("tenant '{name}' still has VMs"));
        }
        self.slo.set(Instant::ZERO, idx, None)?;
        self.dir.remove_tenant(idx);
        self.own_budgets(now);
        self.offload.clear(idx);
        self.update_shares();
        Ok(())
    }

    /// Adds a VM; a VM on this host gets a port slot (returned), queues in both engines and
    /// receiver endpoints, and its tenant's weights grow.
    pub(super) fn add_vm(&mut self, now: Instant, v: &VmEntry) -> Result<Option<PortIdx>, String> {
        if self.dir.vm_named(&v.name).is_some() {
            return Err(format!("VM '{}' exists", v.name));
        }
        if self.dir.tenant_named(&v.tenant).is_none() {
            return Err(format!("no tenant '{}'", v.tenant));
        }
        let idx = self.dir.add_vm(v, self.host_id);
        self.grow();
        self.vm_counters[idx] = VmCounters::default();
        self.xdp_pps[idx] = false;
        let port = self.dir.vms[idx].port;
        if port.is_some() {
            self.egress.add_vm(now, &self.dir, idx)?;
            self.ingress.add_vm(now, &self.dir, idx)?;
            self.pps_out[idx] = pps_bucket(v.max_pps, now);
            self.pps_in[idx] = pps_bucket(v.max_pps, now);
            self.update_shares();
        }
        Ok(port)
    }

    /// Changes a VM in place: addresses and allowed EtherTypes in the directory; for a local
    /// VM also its guarantee and cap (weights, caps, receiver guarantees), its packet rate
    /// and its shaped classes (a class gone returns its frames, counted as `removed`).
    fn set_vm(&mut self, now: Instant, v: &VmEntry, pool: &mut FramePool) -> Result<(), String> {
        let idx = self
            .dir
            .vm_named(&v.name)
            .ok_or_else(|| format!("no VM '{}'", v.name))?;
        let old_shaped = std::mem::take(&mut self.dir.vms[idx].shaped);
        let old_pps = self.dir.vms[idx].max_pps;
        self.dir.set_vm(idx, v);
        if self.dir.vms[idx].port.is_none() {
            return Ok(());
        }
        let gone = self.egress.set_vm(now, &self.dir, idx, &old_shaped)?;
        self.drop_removed(now, pool, idx, gone);
        self.ingress.set_vm(now, &self.dir, idx)?;
        self.update_shares();
        if old_pps != v.max_pps {
            for bucket in [&mut self.pps_out[idx], &mut self.pps_in[idx]] {
                match (bucket.as_mut(), v.max_pps) {
                    (Some(b), Some(pps)) => b.set_rate(now, pps, (pps / 1000).max(64)),
                    (_, pps) => *bucket = pps_bucket(pps, now),
                }
            }
        }
        Ok(())
    }

    /// Frames a live change took from `vm`'s queues: back to the pool, counted as dropped.
    fn drop_removed(&mut self, now: Instant, pool: &mut FramePool, vm: VmIdx, frames: Vec<Frame>) {
        for frame in frames {
            self.drop_frame(now, pool, frame, Some(vm), DropReason::Removed);
        }
    }

    /// Removes a VM. A local one's queues, shaped classes, limiters, receiver endpoints and
    /// transmit queue go, their frames back to the pool; its port slot is returned to be
    /// closed. Frames other VMs queued for it are dropped when they reach the head of their
    /// queue (its generation moved on).
    fn remove_vm(&mut self, name: &str, pool: &mut FramePool) -> Result<Option<PortIdx>, String> {
        let idx = self
            .dir
            .vm_named(name)
            .ok_or_else(|| format!("no VM '{name}'"))?;
        let tenant = self.dir.vms[idx].tenant;
        let port = self.dir.remove_vm(idx);
        if let Some(p) = port {
            let mut frames = self.egress.remove_vm(&self.dir, idx, tenant)?;
            frames.extend(self.ingress.remove_vm(&self.dir, idx, tenant)?);
            frames.append(&mut self.tx[p]);
            for frame in frames {
                pool.put(frame);
            }
            self.update_shares();
        }
        self.vm_counters[idx] = VmCounters::default();
        // The last batch's split may name the VM's slot: its timer passes charge nobody now.
        self.cpu.forget_batch();
        self.pps_out[idx] = None;
        self.pps_in[idx] = None;
        self.xdp_pps[idx] = false;
        Ok(port)
    }
}
