//! Who is where: tenants, VMs (local and remote), hosts. Built from the config and
//! updated live by the API. Lookups are by (tenant, MAC) and (tenant, IPv4) so a frame can
//! never resolve to another tenant's VM (tenant separation by construction).

// FxHash: the keys are small integers and addresses from the config, and a lookup per frame
// with SipHash was a tenth of the engine's instructions (callgrind, docs/BENCHMARKS.md).
use rustc_hash::FxHashMap as HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::config::{Config, Mac, ShapedClass};

/// Index of a tenant in [`Directory::tenants`].
pub type TenantIdx = usize;
/// Index of a VM in [`Directory::vms`].
pub type VmIdx = usize;
/// Index of a local port; 0 is the uplink, VM ports follow.
pub type PortIdx = usize;
pub const UPLINK: PortIdx = 0;

#[derive(Clone, Debug)]
pub struct Tenant {
    pub name: String,
    pub vni: u32,
    pub cpu_quota: Option<f64>,
    /// The tenant's cgroup on this host, charged for the switch's work (Iron).
    pub cgroup: Option<std::path::PathBuf>,
    /// The tenant's SLO, judged by the engine's monitors.
    pub slo: Option<picnic_core::slo::Slo>,
    /// Its overlay traffic is sealed by the shared engine (`accel`).
    pub encrypt: bool,
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
    pub shaped: Vec<ShapedClass>,
}

#[derive(Clone, Debug)]
pub struct Host {
    pub underlay_ip: Ipv4Addr,
    pub mac: Mac,
}

#[derive(Clone, Debug, Default)]
pub struct Directory {
    pub tenants: Vec<Tenant>,
    pub vms: Vec<Vm>,
    pub hosts: HashMap<u32, Host>,
    /// Port index -> VM (None for the uplink).
    pub port_vm: Vec<Option<VmIdx>>,
    by_vni: HashMap<u32, TenantIdx>,
    by_mac: HashMap<(TenantIdx, Mac), VmIdx>,
    by_ip: HashMap<(TenantIdx, Ipv4Addr), VmIdx>,
    by_id: HashMap<u32, VmIdx>,
    by_underlay: HashMap<Ipv4Addr, u32>,
}

impl Directory {
    /// Builds the tables of a validated config. Local VM ports are numbered from 1 in
    /// config order.
    pub fn from_config(cfg: &Config) -> Directory {
        let mut d = Directory {
            port_vm: vec![None],
            ..Default::default()
        };
        for t in &cfg.tenants {
            d.by_vni.insert(t.vni, d.tenants.len());
            d.tenants.push(Tenant {
                name: t.name.clone(),
                vni: t.vni,
                cpu_quota: t.cpu_quota,
                cgroup: t.cgroup.clone(),
                encrypt: t.encrypt,
                slo: t.slo.clone(),
            });
        }
        for h in &cfg.hosts {
            d.hosts.insert(
                h.id,
                Host {
                    underlay_ip: h.underlay_ip,
                    mac: h.mac,
                },
            );
            d.by_underlay.insert(h.underlay_ip, h.id);
        }
        for v in &cfg.vms {
            let tenant = d
                .tenants
                .iter()
                .position(|t| t.name == v.tenant)
                .expect("validated");
            let idx = d.vms.len();
            let port = if v.host == cfg.switch.host_id {
                d.port_vm.push(Some(idx));
                Some(d.port_vm.len() - 1)
            } else {
                None
            };
            d.by_mac.insert((tenant, v.mac), idx);
            d.by_ip.insert((tenant, v.ip), idx);
            d.by_id.insert(v.id, idx);
            d.vms.push(Vm {
                name: v.name.clone(),
                id: v.id,
                tenant,
                host: v.host,
                mac: v.mac,
                ip: v.ip,
                ipv6: std::iter::once(crate::engine::antispoof::link_local(v.mac))
                    .chain(v.ipv6.iter().copied())
                    .collect(),
                allow_ethertypes: v.allow_ethertypes.clone(),
                min_bps: v.min_mbps * 1_000_000,
                max_pps: v.max_pps,
                min_pps: v.min_pps,
                max_bps: v.max_mbps.map(|m| m * 1_000_000),
                port,
                shaped: v.shaped.clone(),
            });
        }
        d
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
