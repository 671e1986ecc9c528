//! Who is where: tenants, VMs (local and remote), hosts. Built from the config and
//! updated live by the API. Lookups are by (tenant, MAC) and (tenant, IPv4) so a frame can
//! never resolve to another tenant's VM (tenant separation by construction).

// FxHash: the keys are small integers and addresses from the config, and a lookup per frame
// with SipHash was a tenth of the engine's instructions (callgrind, docs/BENCHMARKS.md).
use picnic_core::Rate;
use rustc_hash::FxHashMap as HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::config::{Config, HostEntry, Mac, ShapedClass, TenantEntry, VmEntry};

/// Index of a tenant in [`Directory::tenants`].
pub type TenantIdx = usize;
/// Index of a VM in [`Directory::vms`].
pub type VmIdx = usize;
/// Index of a local port; 0 is the uplink, VM ports follow.
pub type PortIdx = usize;
pub const UPLINK: PortIdx = 0;

/// A tenant: its settings exactly as configured (read through `Deref`, so a tenant field added
/// to [`TenantEntry`] reaches the engines without touching the directory).
#[derive(Clone, Debug)]
pub struct Tenant {
    pub config: TenantEntry,
    /// False once removed (the slot waits for the next tenant added; its settings are the
    /// defaults, so a removed tenant has no quota, cgroup, SLO or encryption).
    pub present: bool,
}

impl std::ops::Deref for Tenant {
    type Target = TenantEntry;

    fn deref(&self) -> &TenantEntry {
        &self.config
    }
}

#[derive(Clone, Debug)]
pub struct Vm {
    pub name: String,
    /// Deployment-wide endpoint id (carried in feedback).
    pub id: u32,
    pub tenant: TenantIdx,
    pub host: u32,
    pub mac: Mac,
    pub ip: Ipv4Addr,
    /// IPv6 addresses the VM may send from: its config's and its EUI-64 link-local one.
    pub ipv6: Vec<Ipv6Addr>,
    /// EtherTypes beyond IPv4, IPv6 and ARP the VM may send.
    pub allow_ethertypes: Vec<u16>,
    pub min_bps: u64,
    pub max_bps: Option<u64>,
    pub max_pps: Option<u64>,
    pub min_pps: Option<u64>,
    /// Local port when the VM lives on this host.
    pub port: Option<PortIdx>,
    /// The CPUs of a local VM's vCPUs (its port entry's `cpus`): the workers that serve it.
    pub cpus: Vec<usize>,
    pub shaped: Vec<ShapedClass>,
    /// Bumped when the VM is removed: a frame queued for a VM index also records its
    /// generation, so it never reaches a VM added later in the same slot.
    pub generation: u32,
}

#[derive(Clone, Debug)]
pub struct Host {
    pub underlay_ip: Ipv4Addr,
    pub mac: Mac,
}

/// The tables. Indexes are stable while a tenant, VM or port exists: live changes add to
/// and remove from them in place, and a removed entry's slot is reused by the next one added
/// (so the engines' per-VM and per-tenant state is indexed the same way, DESIGN.md 4).
#[derive(Clone, Debug, Default)]
pub struct Directory {
    pub tenants: Vec<Tenant>,
    pub vms: Vec<Vm>,
    pub hosts: HashMap<u32, Host>,
    /// Port index -> VM (None for the uplink and for closed ports).
    pub port_vm: Vec<Option<VmIdx>>,
    by_vni: HashMap<u32, TenantIdx>,
    by_mac: HashMap<(TenantIdx, Mac), VmIdx>,
    by_ip: HashMap<(TenantIdx, Ipv4Addr), VmIdx>,
    by_id: HashMap<u32, VmIdx>,
    by_underlay: HashMap<Ipv4Addr, u32>,
    tenant_by_name: HashMap<String, TenantIdx>,
    vm_by_name: HashMap<String, VmIdx>,
    free_vms: Vec<VmIdx>,
}

impl Directory {
    /// Empty tables: no tenant, no VM, only the uplink's port.
    pub fn new() -> Directory {
        Directory {
            port_vm: vec![None],
            ..Default::default()
        }
    }

    /// Builds the tables of a validated config. Local VM ports are numbered from 1 in
    /// config order.
    pub fn from_config(cfg: &Config) -> Directory {
        let mut d = Directory::new();
        for t in &cfg.tenants {
            d.add_tenant(t);
        }
        for h in &cfg.hosts {
            d.set_host(h);
        }
        for v in &cfg.vms {
            d.add_vm(v, cfg.switch.host_id);
        }
        d
    }

    /// Adds a tenant (in a removed tenant's slot if there is one).
    pub fn add_tenant(&mut self, t: &TenantEntry) -> TenantIdx {
        let tenant = Tenant {
            config: t.clone(),
            present: true,
        };
        let idx = match self.tenants.iter().position(|t| !t.present) {
            Some(free) => {
                self.tenants[free] = tenant;
                free
            }
            None => {
                self.tenants.push(tenant);
                self.tenants.len() - 1
            }
        };
        self.by_vni.insert(t.vni, idx);
        self.tenant_by_name.insert(t.name.clone(), idx);
        idx
    }

    /// Updates tenant `idx` (same name) to `t`.
    pub fn set_tenant(&mut self, idx: TenantIdx, t: &TenantEntry) {
        let tenant = &mut self.tenants[idx];
        remove_if(&mut self.by_vni, &tenant.vni, idx);
        self.by_vni.insert(t.vni, idx);
        tenant.config = t.clone();
    }

    /// Removes tenant `idx` (which has no VMs left).
    pub fn remove_tenant(&mut self, idx: TenantIdx) {
        let tenant = &mut self.tenants[idx];
        remove_if(&mut self.by_vni, &tenant.vni, idx);
        remove_if(&mut self.tenant_by_name, &tenant.name, idx);
        *tenant = Tenant {
            config: TenantEntry::default(),
            present: false,
        };
    }

    /// Adds or updates a host.
    pub fn set_host(&mut self, h: &HostEntry) {
        self.remove_host(h.id);
        self.hosts.insert(
            h.id,
            Host {
                underlay_ip: h.underlay_ip,
                mac: h.mac,
            },
        );
        self.by_underlay.insert(h.underlay_ip, h.id);
    }

    pub fn remove_host(&mut self, id: u32) {
        if let Some(old) = self.hosts.remove(&id) {
            remove_if(&mut self.by_underlay, &old.underlay_ip, id);
        }
    }

    /// Adds a VM of an existing tenant; one on `this_host` gets a port (a closed port's
    /// slot if there is one). Returns its index.
    pub fn add_vm(&mut self, v: &VmEntry, this_host: u32) -> VmIdx {
        let tenant = self.tenant_named(&v.tenant).expect("validated");
        let idx = self.free_vms.pop().unwrap_or(self.vms.len());
        let port = (v.host == this_host).then(|| {
            match (1..self.port_vm.len()).find(|&p| self.port_vm[p].is_none()) {
                Some(p) => {
                    self.port_vm[p] = Some(idx);
                    p
                }
                None => {
                    self.port_vm.push(Some(idx));
                    self.port_vm.len() - 1
                }
            }
        });
        let vm = Vm {
            name: v.name.clone(),
            id: v.id,
            tenant,
            host: v.host,
            mac: v.mac,
            ip: v.ip,
            ipv6: Vec::new(),
            allow_ethertypes: Vec::new(),
            min_bps: 0,
            max_bps: None,
            max_pps: None,
            min_pps: None,
            port,
            cpus: v
                .port
                .as_ref()
                .filter(|_| port.is_some())
                .map(|p| p.cpus.clone())
                .unwrap_or_default(),
            shaped: Vec::new(),
            generation: self.vms.get(idx).map_or(0, |old| old.generation),
        };
        if idx == self.vms.len() {
            self.vms.push(vm);
        } else {
            self.vms[idx] = vm;
        }
        self.by_id.insert(v.id, idx);
        self.vm_by_name.insert(v.name.clone(), idx);
        self.set_vm(idx, v);
        idx
    }

    /// Updates VM `idx` to `v` (same name, id, tenant, host and port): addresses, allowed
    /// EtherTypes, rates and shaped classes.
    pub fn set_vm(&mut self, idx: VmIdx, v: &VmEntry) {
        let vm = &mut self.vms[idx];
        let t = vm.tenant;
        remove_if(&mut self.by_mac, &(t, vm.mac), idx);
        remove_if(&mut self.by_ip, &(t, vm.ip), idx);
        self.by_mac.insert((t, v.mac), idx);
        self.by_ip.insert((t, v.ip), idx);
        vm.mac = v.mac;
        vm.ip = v.ip;
        vm.ipv6 = std::iter::once(v.mac.link_local())
            .chain(v.ipv6.iter().copied())
            .collect();
        vm.allow_ethertypes = v.allow_ethertypes.clone();
        vm.min_bps = v.min_rate().bps();
        vm.max_bps = v.max_rate().map(Rate::bps);
        vm.max_pps = v.max_pps;
        vm.min_pps = v.min_pps;
        vm.shaped = v.shaped.clone();
    }

    /// Removes VM `idx`: no lookup finds it any more, its generation moves on and its port
    /// (returned, for a local VM) is closed.
    pub fn remove_vm(&mut self, idx: VmIdx) -> Option<PortIdx> {
        let vm = &mut self.vms[idx];
        remove_if(&mut self.by_mac, &(vm.tenant, vm.mac), idx);
        remove_if(&mut self.by_ip, &(vm.tenant, vm.ip), idx);
        remove_if(&mut self.by_id, &vm.id, idx);
        remove_if(&mut self.vm_by_name, &vm.name, idx);
        let port = vm.port.take();
        if let Some(p) = port {
            self.port_vm[p] = None;
        }
        vm.name.clear();
        vm.cpus.clear();
        vm.shaped.clear();
        vm.generation = vm.generation.wrapping_add(1);
        self.free_vms.push(idx);
        port
    }

    pub fn tenant_named(&self, name: &str) -> Option<TenantIdx> {
        self.tenant_by_name.get(name).copied()
    }
    pub fn vm_named(&self, name: &str) -> Option<VmIdx> {
        self.vm_by_name.get(name).copied()
    }
    pub fn tenant_by_vni(&self, vni: u32) -> Option<TenantIdx> {
        self.by_vni.get(&vni).copied()
    }
    pub fn vm_by_mac(&self, tenant: TenantIdx, mac: Mac) -> Option<VmIdx> {
        self.by_mac.get(&(tenant, mac)).copied()
    }
    pub fn vm_by_ip(&self, tenant: TenantIdx, ip: Ipv4Addr) -> Option<VmIdx> {
        self.by_ip.get(&(tenant, ip)).copied()
    }
    pub fn host_by_underlay(&self, ip: Ipv4Addr) -> Option<u32> {
        self.by_underlay.get(&ip).copied()
    }
    pub fn vm_by_id(&self, id: u32) -> Option<VmIdx> {
        self.by_id.get(&id).copied()
    }
    /// Local VMs with their ports.
    pub fn local_vms(&self) -> impl Iterator<Item = (VmIdx, PortIdx)> + '_ {
        self.port_vm
            .iter()
            .enumerate()
            .filter_map(|(p, v)| v.map(|v| (v, p)))
    }
    pub fn port_count(&self) -> usize {
        self.port_vm.len()
    }
}

/// Removes `key` if it still maps to `value`: within one live change an entry may already
/// have been taken over by another tenant, VM or host.
fn remove_if<K: std::hash::Hash + Eq, V: PartialEq>(map: &mut HashMap<K, V>, key: &K, value: V) {
    if map.get(key) == Some(&value) {
        map.remove(key);
    }
}
