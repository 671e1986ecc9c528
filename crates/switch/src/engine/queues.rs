//! The scheduler tree both engines use (PicNIC's per-VM queues, EyeQ's weights): a node per
//! tenant weighted by the sum of its local VMs' guarantees, a bounded leaf per local VM
//! weighted by its guarantee and optionally capped. With isolation off, one shared drop-tail
//! FIFO that holds as much as all the leaves would. VMs come and go in place (live changes):
//! only the VM's leaf and its tenant's node are touched, through the WFQ's setters.

use picnic_core::wfq::{Cap, CostKind, NodeId, QueueId, QueueLimits, Wfq};
use picnic_core::Instant;

use crate::directory::{Directory, TenantIdx, VmIdx};

pub(super) struct VmQueues<T> {
    pub(super) wfq: Wfq<T>,
    /// Leaf queue of each local VM (all share one when not isolated).
    queue_of: Vec<Option<QueueId>>,
    /// Node of each tenant with local VMs (none when not isolated).
    tenant_node: Vec<Option<NodeId>>,
    /// One VM's buffer.
    limits: QueueLimits,
    /// The queue every VM shares when not isolated.
    shared: Option<QueueId>,
    isolated: bool,
    what: &'static str,
}

/// Each tenant's weight on this host: the sum of its local VMs' guarantees (0 without).
pub(super) fn tenant_weights(dir: &Directory) -> Vec<u64> {
    let mut w = vec![0u64; dir.tenants.len()];
    for (v, _) in dir.local_vms() {
        w[dir.vms[v].tenant] += dir.vms[v].min_bps;
    }
    w
}

/// Each tenant's packet-rate guarantee on this host: the sum of its local VMs' `min_pps`.
pub(super) fn tenant_min_pps(dir: &Directory) -> Vec<u64> {
    let mut pps = vec![0u64; dir.tenants.len()];
    for (v, _) in dir.local_vms() {
        pps[dir.vms[v].tenant] += dir.vms[v].min_pps.unwrap_or(0);
    }
    pps
}

fn tenant_weight(dir: &Directory, t: TenantIdx) -> u64 {
    dir.local_vms()
        .filter(|&(v, _)| dir.vms[v].tenant == t)
        .map(|(v, _)| dir.vms[v].min_bps)
        .sum()
}

impl<T> VmQueues<T> {
    pub(super) fn new(
        kind: CostKind,
        queue_packets: usize,
        isolated: bool,
        what: &'static str,
    ) -> VmQueues<T> {
        VmQueues {
            wfq: Wfq::new(kind),
            queue_of: Vec::new(),
            tenant_node: Vec::new(),
            limits: QueueLimits {
                max_packets: queue_packets as u32,
                max_bytes: queue_packets as u64 * 2048,
            },
            shared: None,
            isolated,
            what,
        }
    }

    pub(super) fn queue(&self, vm: VmIdx) -> Option<QueueId> {
        self.queue_of.get(vm).copied().flatten()
    }

    fn err(&self, e: picnic_core::wfq::WfqError) -> String {
        format!("{}: {e:?}", self.what)
    }

    /// The shared queue's limits for `n` local VMs.
    fn shared_limits(&self, n: usize) -> QueueLimits {
        let n = n.max(1);
        QueueLimits {
            max_packets: self.limits.max_packets * n as u32,
            max_bytes: self.limits.max_bytes * n as u64,
        }
    }

    /// Gives local VM `vm` (already in `dir`) its leaf under its tenant's node (created for
    /// the tenant's first local VM), and the node its new weight.
    pub(super) fn add_vm(
        &mut self,
        now: Instant,
        dir: &Directory,
        vm: VmIdx,
        cap: Option<Cap>,
    ) -> Result<(), String> {
        self.queue_of.resize(dir.vms.len(), None);
        self.tenant_node.resize(dir.tenants.len(), None);
        if !self.isolated {
            let limits = self.shared_limits(dir.local_vms().count());
            let q = match self.shared {
                Some(q) => {
                    self.wfq.set_limits(q, limits).map_err(|e| self.err(e))?;
                    q
                }
                None => {
                    let root = self.wfq.root();
                    self.wfq
                        .add_queue(root, 1, limits)
                        .map_err(|e| self.err(e))?
                }
            };
            self.shared = Some(q);
            self.queue_of[vm] = Some(q);
            return Ok(());
        }
        let t = dir.vms[vm].tenant;
        let weight = tenant_weight(dir, t).max(1);
        let node = match self.tenant_node[t] {
            Some(node) => {
                self.wfq.set_weight(node, weight).map_err(|e| self.err(e))?;
                node
            }
            None => {
                let root = self.wfq.root();
                self.wfq
                    .add_node(root, weight, None)
                    .map_err(|e| self.err(e))?
            }
        };
        self.tenant_node[t] = Some(node);
        let q = self
            .wfq
            .add_queue(node, dir.vms[vm].min_bps.max(1), self.limits)
            .map_err(|e| self.err(e))?;
        if cap.is_some() {
            self.wfq.set_cap(now, q, cap).map_err(|e| self.err(e))?;
        }
        self.queue_of[vm] = Some(q);
        Ok(())
    }

    /// Applies `vm`'s guarantee (its leaf's weight and its tenant's node's) and `cap` in
    /// place: queued items and every other VM's state stay.
    pub(super) fn set_vm(
        &mut self,
        now: Instant,
        dir: &Directory,
        vm: VmIdx,
        cap: Option<Cap>,
    ) -> Result<(), String> {
        let t = dir.vms[vm].tenant;
        if let (Some(q), Some(node)) = (self.queue(vm), self.tenant_node[t]) {
            let min = dir.vms[vm].min_bps.max(1);
            self.wfq.set_weight(q, min).map_err(|e| self.err(e))?;
            let weight = tenant_weight(dir, t).max(1);
            self.wfq.set_weight(node, weight).map_err(|e| self.err(e))?;
            self.wfq.set_cap(now, q, cap).map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Takes every queued item out (the queues stay, empty).
    pub(super) fn take_all(&mut self) -> Vec<T> {
        let queues: Vec<QueueId> = self
            .queue_of
            .iter()
            .flatten()
            .copied()
            .chain(self.shared)
            .collect();
        let mut items = Vec::new();
        for q in queues {
            if let Ok(mut taken) = self.wfq.retain(q, |_| false) {
                items.append(&mut taken);
            }
        }
        items
    }

    /// Removes local VM `vm` of tenant `t` (already gone from `dir`'s local VMs): its leaf
    /// with its items, and its tenant's node if it was the tenant's last local VM. Not
    /// isolated, the items of the shared queue `mine` says are the VM's are taken out.
    /// Returns the items removed.
    pub(super) fn remove_vm(
        &mut self,
        dir: &Directory,
        vm: VmIdx,
        t: TenantIdx,
        mine: impl FnMut(&T) -> bool,
    ) -> Result<Vec<T>, String> {
        let Some(q) = self.queue_of.get_mut(vm).and_then(Option::take) else {
            return Ok(Vec::new());
        };
        if let Some(shared) = self.shared {
            let mut mine = mine;
            let limits = self.shared_limits(dir.local_vms().count());
            self.wfq
                .set_limits(shared, limits)
                .map_err(|e| self.err(e))?;
            return self
                .wfq
                .retain(shared, |item| !mine(item))
                .map_err(|e| self.err(e));
        }
        let items = self.wfq.remove_queue(q).map_err(|e| self.err(e))?;
        if let Some(node) = self.tenant_node[t] {
            match tenant_weight(dir, t) {
                0 => {
                    self.wfq.remove_node(node).map_err(|e| self.err(e))?;
                    self.tenant_node[t] = None;
                }
                w => self.wfq.set_weight(node, w).map_err(|e| self.err(e))?,
            }
        }
        Ok(items)
    }
}
