//! The testbed a scenario describes, built in namespaces.
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
//! (a Linux bridge, or `picnic switch`). Names, addresses and MACs are planned by
//! [`picnic_scenario::plan`].

use anyhow::{Context, Result};
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::plan::{fabric_port_mac, Topology, PREFIX_LEN};
use picnic_scenario::Scenario;

/// Name of the fabric bridge.
pub const FABRIC_BRIDGE: &str = "br0";

/// The plan of `scenario` with `testbed`'s run id and namespace names (nothing is created).
pub fn plan(scenario: &Scenario, testbed: &Testbed) -> Topology {
    Topology::plan(scenario, testbed.run_id(), &|role| testbed.ns_name(role))
}

/// Plans and creates the namespaces, links, addresses and access-link shaping.
/// The dataplanes are not set up here. With `taps`, VMs that ask for a TAP get one in
/// the host namespace (and no interface yet): call [`attach_taps`] once the
/// dataplane has opened them.
pub fn build(scenario: &Scenario, testbed: &mut Testbed, taps: bool) -> Result<Topology> {
    let topo = plan(scenario, testbed);
    let fabric = testbed.add_namespace("fabric")?;
    netns::add_bridge(&fabric, FABRIC_BRIDGE)?;
    let queue_bytes = scenario.access_queue_bytes();
    for host in &topo.hosts {
        let ns = testbed.add_namespace(&format!("h-{}", host.name))?;
        // The uplink has a queue per CPU, as a host's multi-queue NIC: a picnic switch with
        // several workers gives each its own socket on it (AF_XDP: one per queue).
        let queues = std::thread::available_parallelism().map_or(1, |n| n.get());
        netns::add_veth_queues(&fabric, &host.fabric_port, &ns, &host.uplink, queues)
            .with_context(|| format!("uplink of host {}", host.name))?;
        // Each queue takes the frames the fabric forwards from its CPU (XPS), as a NIC's
        // flow steering (aRFS, ntuple rules) delivers a flow to the queue of the CPU that
        // consumes it: a frame sent by a switch worker on CPU c reaches the receiving switch's
        // worker on CPU c, which serves the same tenants where tenants are pinned alike on
        // every host. Hashed instead, half of each tenant's frames landed on the other
        // tenants' worker and were handed across (docs/RESULTS.md "pps-flood").
        netns::steer_queues_by_cpu(&fabric, &host.fabric_port, queues)
            .with_context(|| format!("queue steering toward host {}", host.name))?;
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
        // A host given CPUs of its own (`host_cpus`) processes what it receives on them, as
        // a machine's NIC interrupts land on its own cores (Iron 2.3): without this a veth
        // runs the receiving host's stack, bridge or switch socket on the sending host's CPU.
        let host_cpus = scenario.cpus_of_host(&host.name);
        netns::steer_rx_to_cpus(&ns, &host.uplink, queues, host_cpus)
            .with_context(|| format!("receive steering of host {}", host.name))?;
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
            // A VM's receive path runs on its own vCPUs (its tenant's `cpus`, else its
            // host's), as a guest's network stack does, not on the CPU of the dataplane that
            // delivered them (a veth runs the receiver's stack on the sender's CPU otherwise:
            // the switch's core would run a flooded VM's sockets).
            netns::steer_rx_to_cpus(&vm_ns, &vm.dev, 1, scenario.cpus_of_vm(&vm.name))
                .with_context(|| format!("receive steering of VM {}", vm.name))?;
            netns::configure_link(&ns, &vm.host_port, &vm.host_port_mac, host.mtu)?;
        }
    }
    Ok(topo)
}

/// Moves each TAP VM's device, already opened by the dataplane in the host namespace,
/// into the VM's namespace as its interface: the dataplane holds the file descriptor as
/// a VMM would, the VM's stack sees an Ethernet interface.
pub fn attach_taps(topo: &Topology) -> Result<()> {
    for host in &topo.hosts {
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
