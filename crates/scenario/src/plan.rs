//! The testbed a scenario describes, as data: every host and VM with its names, MACs and
//! addresses (pure; the lab builds it in namespaces, the simulator only reads it).
//!
//! Addresses: VM `i` of tenant `t` (both from 0) is 198.18.(t+1).(i+1)/16, so all VMs share
//! one flat L2 (tenants are separated by the dataplane, if it does); host `h` has the
//! underlay address 198.19.0.(h+1)/16, used by a dataplane that encapsulates. MACs are
//! deterministic (see [`vm_mac`] and friends).

use serde::Serialize;
use std::net::Ipv4Addr;

use crate::Scenario;

/// Name of the uplink inside every host namespace.
pub const UPLINK: &str = "uplink";
/// Name of the interface inside every VM namespace.
pub const VM_DEV: &str = "eth0";
/// Prefix length of the VM and underlay networks.
pub const PREFIX_LEN: u8 = 16;

/// One VM (or container) of the testbed.
#[derive(Debug, Clone, Serialize)]
pub struct VmView {
    /// VM name from the scenario.
    pub name: String,
    /// Tenant name.
    pub tenant: String,
    /// Index of the tenant in the scenario (0-based).
    pub tenant_index: usize,
    /// Host name.
    pub host: String,
    /// The VM's namespace.
    pub ns: String,
    /// Interface inside the VM namespace ([`VM_DEV`]).
    pub dev: String,
    /// MAC of `dev`.
    pub mac: String,
    /// IPv4 address of `dev` (prefix [`PREFIX_LEN`]).
    pub ip: Ipv4Addr,
    /// The veth peer in the host namespace: the tenant port of the dataplane (`v-NAME`).
    pub host_port: String,
    /// MAC of `host_port`.
    pub host_port_mac: String,
    /// Attached through a TAP device when the dataplane takes TAPs: then `host_port` is a
    /// TAP the dataplane opens, which becomes `dev` in the VM namespace afterwards
    /// (the lab's `topology::attach_taps`).
    pub tap: bool,
}

/// One host: its namespace, uplink and VMs. What a dataplane needs to set itself up.
#[derive(Debug, Clone, Serialize)]
pub struct HostView {
    /// Host name from the scenario.
    pub name: String,
    /// Index of the host in the scenario (0-based).
    pub index: usize,
    /// The host's namespace, where the dataplane runs.
    pub ns: String,
    /// Uplink interface in `ns` ([`UPLINK`]), peer of the fabric port.
    pub uplink: String,
    /// MAC of the uplink.
    pub uplink_mac: String,
    /// Underlay address of the host (for an encapsulating dataplane; not configured).
    pub underlay_ip: Ipv4Addr,
    /// The fabric-side port of this host's access link (`p-NAME` in the fabric namespace).
    pub fabric_port: String,
    /// Access-link rate, Mb/s.
    pub access_link_mbps: u64,
    /// MTU of every link.
    pub mtu: u32,
    /// The VMs on this host.
    pub vms: Vec<VmView>,
}

/// The whole testbed as data.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// Run id contained in every namespace name.
    pub run_id: String,
    /// Fabric namespace (the lab's fabric bridge is in it).
    pub fabric_ns: String,
    /// Hosts in scenario order.
    pub hosts: Vec<HostView>,
}

impl Topology {
    /// Computes names, MACs and addresses for `scenario` (pure): run id `run_id`, the
    /// namespace of a role such as `fabric`, `h-HOST` or `v-VM` named by `ns_name`.
    pub fn plan(scenario: &Scenario, run_id: &str, ns_name: &dyn Fn(&str) -> String) -> Topology {
        let hosts = scenario
            .hosts
            .iter()
            .enumerate()
            .map(|(h, host)| {
                let vms = scenario
                    .tenants
                    .iter()
                    .enumerate()
                    .flat_map(|(t, tenant)| {
                        tenant
                            .vms
                            .iter()
                            .enumerate()
                            .map(move |(i, vm)| (t, tenant, i, vm))
                    })
                    .filter(|(_, _, _, vm)| &vm.host == host)
                    .map(|(t, tenant, i, vm)| VmView {
                        name: vm.name.clone(),
                        tenant: tenant.name.clone(),
                        tenant_index: t,
                        host: host.clone(),
                        ns: ns_name(&format!("v-{}", vm.name)),
                        dev: VM_DEV.into(),
                        mac: vm_mac(t, i),
                        ip: vm_ip(t, i),
                        host_port: format!("v-{}", vm.name),
                        host_port_mac: host_port_mac(t, i),
                        tap: vm.tap,
                    })
                    .collect();
                HostView {
                    name: host.clone(),
                    index: h,
                    ns: ns_name(&format!("h-{host}")),
                    uplink: UPLINK.into(),
                    uplink_mac: uplink_mac(h),
                    underlay_ip: Ipv4Addr::new(198, 19, ((h + 1) >> 8) as u8, (h + 1) as u8),
                    fabric_port: format!("p-{host}"),
                    access_link_mbps: scenario.access_link_mbps,
                    mtu: scenario.mtu,
                    vms,
                }
            })
            .collect();
        Topology {
            run_id: run_id.to_owned(),
            fabric_ns: ns_name("fabric"),
            hosts,
        }
    }

    /// The VM named `name`.
    pub fn vm(&self, name: &str) -> Option<&VmView> {
        self.hosts
            .iter()
            .flat_map(|h| &h.vms)
            .find(|v| v.name == name)
    }
}

/// IPv4 address of VM `i` of tenant `t`: 198.18.(t+1).(i+1).
pub fn vm_ip(t: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, (t + 1) as u8, (i + 1) as u8)
}

/// MAC of VM `i` of tenant `t` inside the VM: 02:70:6e:TT:II:II ("pn").
pub fn vm_mac(t: usize, i: usize) -> String {
    format!("02:70:6e:{:02x}:{:02x}:{:02x}", t, i >> 8, i & 0xff)
}

/// MAC of the host-side peer of VM `i` of tenant `t`: 02:70:76:TT:II:II.
pub fn host_port_mac(t: usize, i: usize) -> String {
    format!("02:70:76:{:02x}:{:02x}:{:02x}", t, i >> 8, i & 0xff)
}

/// MAC of host `h`'s uplink: 02:70:68:00:HH:HH.
pub fn uplink_mac(h: usize) -> String {
    format!("02:70:68:00:{:02x}:{:02x}", h >> 8, h & 0xff)
}

/// MAC of the fabric port facing host `h`: 02:70:66:00:HH:HH.
pub fn fabric_port_mac(h: usize) -> String {
    format!("02:70:66:00:{:02x}:{:02x}", h >> 8, h & 0xff)
}
