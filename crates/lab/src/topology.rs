//! The testbed a scenario describes, as data and as namespaces.
//!
//! Layout (DESIGN.md 5):
//!
//! ```text
//!  VM ns  [eth0] --veth-- [v-VM] host ns [uplink] --veth-- [p-HOST] fabric ns: bridge br0
//! ```
//!
//! The fabric port `p-HOST` is the host's access link. Its egress, the direction toward
//! the host, is shaped with HTB to `access_link_mbps` with a bounded bfifo queue: that is
//! the receiver's downlink where senders together overrun a receiver (EyeQ 2.1). The
//! host-to-fabric direction is not shaped (senders are limited by their own CPU here, and a
//! userspace switch sending with qdisc bypass would skip a host-side qdisc anyway).
//!
//! What joins a host's VM ports to its uplink is the [`crate::dataplane::Dataplane`]
//! (a Linux bridge, or `picnic switch`). Addresses: VM `i` of tenant `t` (both from 0) is
//! 198.18.(t+1).(i+1)/16, so all VMs share one flat L2 (tenants are separated by the
//! dataplane, if it does); host `h` has the underlay address 198.19.0.(h+1)/16, to be used by a
//! dataplane that encapsulates. MACs are deterministic (see [`vm_mac`] and friends).

use crate::netns::{self, Testbed};
use crate::scenario::Scenario;
use anyhow::{Context, Result};
use serde::Serialize;
use std::net::Ipv4Addr;

/// Name of the fabric bridge.
pub const FABRIC_BRIDGE: &str = "br0";
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
    /// ([`Topology::attach_taps`]).
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
    /// Fabric namespace holding [`FABRIC_BRIDGE`].
    pub fabric_ns: String,
    /// Hosts in scenario order.
    pub hosts: Vec<HostView>,
}

impl Topology {
    /// Computes names, MACs and addresses for `scenario` under `testbed`'s run id (pure).
    pub fn plan(scenario: &Scenario, testbed: &Testbed) -> Topology {
        Topology::plan_with(scenario, testbed.run_id(), &|role| testbed.ns_name(role))
    }

    /// Computes the same plan without a testbed (nothing is created; namespace names are
    /// `sim-RUN-ROLE`): for the simulator, which needs the addresses and switch configs only.
    pub fn plan_detached(scenario: &Scenario, run_id: &str) -> Topology {
        Topology::plan_with(scenario, run_id, &|role| format!("sim-{run_id}-{role}"))
    }

    fn plan_with(scenario: &Scenario, run_id: &str, ns_name: &dyn Fn(&str) -> String) -> Topology {
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

    /// Plans and creates the namespaces, links, addresses and access-link shaping.
    /// The dataplanes are not set up here. With `taps`, VMs that ask for a TAP get one in
    /// the host namespace (and no interface yet): call [`Topology::attach_taps`] once the
    /// dataplane has opened them.
    pub fn build(scenario: &Scenario, testbed: &mut Testbed, taps: bool) -> Result<Topology> {
        let topo = Topology::plan(scenario, testbed);
        let fabric = testbed.add_namespace("fabric")?;
        netns::add_bridge(&fabric, FABRIC_BRIDGE)?;
        let queue_bytes =
            scenario.access_link_mbps * 1_000_000 / 8 * scenario.access_queue_ms / 1000;
        for host in &topo.hosts {
            let ns = testbed.add_namespace(&format!("h-{}", host.name))?;
            netns::add_veth(&fabric, &host.fabric_port, &ns, &host.uplink)
                .with_context(|| format!("uplink of host {}", host.name))?;
            netns::configure_link(
                &fabric,
                &host.fabric_port,
                &fabric_port_mac(host.index),
                host.mtu,
            )?;
            netns::enslave(&fabric, &host.fabric_port, FABRIC_BRIDGE)?;
            netns::shape_htb(
                &fabric,
                &host.fabric_port,
                host.access_link_mbps,
                queue_bytes.max(3000),
            )?;
            netns::configure_link(&ns, &host.uplink, &host.uplink_mac, host.mtu)?;
            for vm in &host.vms {
                let vm_ns = testbed.add_namespace(&format!("v-{}", vm.name))?;
                if taps && vm.tap {
                    netns::ip(&ns, &["tuntap", "add", "dev", &vm.host_port, "mode", "tap"])
                        .with_context(|| format!("TAP of VM {}", vm.name))?;
                    netns::configure_link(&ns, &vm.host_port, &vm.host_port_mac, host.mtu)?;
                    continue;
                }
                netns::add_veth(&vm_ns, &vm.dev, &ns, &vm.host_port)
                    .with_context(|| format!("port of VM {}", vm.name))?;
                netns::configure_link(&vm_ns, &vm.dev, &vm.mac, host.mtu)?;
                netns::add_address(&vm_ns, &vm.dev, &format!("{}/{PREFIX_LEN}", vm.ip))?;
                netns::configure_link(&ns, &vm.host_port, &vm.host_port_mac, host.mtu)?;
            }
        }
        Ok(topo)
    }

    /// Moves each TAP VM's device, already opened by the dataplane in the host namespace,
    /// into the VM's namespace as its interface: the dataplane holds the file descriptor as
    /// a VMM would, the VM's stack sees an Ethernet interface.
    pub fn attach_taps(&self) -> Result<()> {
        for host in &self.hosts {
            for vm in host.vms.iter().filter(|v| v.tap) {
                netns::ip(&host.ns, &["link", "set", &vm.host_port, "netns", &vm.ns])
                    .with_context(|| format!("moving the TAP of VM {}", vm.name))?;
                // The dataplane has set its MTU; only name and address change.
                netns::ip(&vm.ns, &["link", "set", &vm.host_port, "name", &vm.dev])?;
                netns::ip(&vm.ns, &["link", "set", "dev", &vm.dev, "address", &vm.mac])?;
                netns::link_up(&vm.ns, &vm.dev)?;
                netns::add_address(&vm.ns, &vm.dev, &format!("{}/{PREFIX_LEN}", vm.ip))?;
            }
        }
        Ok(())
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
