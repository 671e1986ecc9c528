//! What runs in each host namespace and joins the VM ports to the uplink.

use crate::netns;
use crate::topology::HostView;
use anyhow::Result;
use std::sync::Arc;

/// The dataplane of one host: set up after the topology is built, torn down before the
/// namespaces are deleted. One instance per host.
pub trait Dataplane: Send {
    /// Connects `host.vms[*].host_port` and `host.uplink` inside `host.ns`.
    fn setup(&mut self, host: &HostView) -> Result<()>;
    /// Stops whatever `setup` started (processes, threads). Links vanish with the namespace.
    fn teardown(&mut self, host: &HostView) -> Result<()>;
}

/// Makes a fresh dataplane for a host; a mode of a run holds one.
pub type DataplaneFactory = Arc<dyn Fn(&HostView) -> Box<dyn Dataplane> + Send + Sync>;

/// Name of the bridge [`LinuxBridge`] creates in each host namespace.
pub const HOST_BRIDGE: &str = "br0";

/// First VLAN id of the bridge dataplane; tenant `t` uses `VLAN_BASE + t`.
pub const VLAN_BASE: usize = 100;

/// The baseline: a Linux bridge in the host namespace enslaving the VM ports and the
/// uplink. Tenants are separated by VLANs: the bridge filters VLANs, each VM port is an
/// untagged access port of its tenant's VLAN (100 + tenant index) and the uplink is a
/// trunk carrying the tenant VLANs of the host tagged; the fabric bridge passes tagged
/// frames as they are. No isolation mechanism beyond that: this is what picnic is compared
/// against.
#[derive(Debug, Default)]
pub struct LinuxBridge;

impl LinuxBridge {
    /// A factory making a [`LinuxBridge`] for every host.
    pub fn factory() -> DataplaneFactory {
        Arc::new(|_| Box::new(LinuxBridge))
    }
}

impl Dataplane for LinuxBridge {
    fn setup(&mut self, host: &HostView) -> Result<()> {
        let ns = &host.ns;
        netns::add_bridge(ns, HOST_BRIDGE, true)?;
        netns::enslave(ns, &host.uplink, HOST_BRIDGE)?;
        let mut vlans: Vec<usize> = host
            .vms
            .iter()
            .map(|v| VLAN_BASE + v.tenant_index)
            .collect();
        vlans.sort_unstable();
        vlans.dedup();
        for vlan in vlans {
            netns::bridge(
                ns,
                &["vlan", "add", "dev", &host.uplink, "vid", &vlan.to_string()],
            )?;
        }
        for vm in &host.vms {
            let vid = (VLAN_BASE + vm.tenant_index).to_string();
            netns::enslave(ns, &vm.host_port, HOST_BRIDGE)?;
            netns::bridge(ns, &["vlan", "del", "dev", &vm.host_port, "vid", "1"])?;
            netns::bridge(
                ns,
                &[
                    "vlan",
                    "add",
                    "dev",
                    &vm.host_port,
                    "vid",
                    &vid,
                    "pvid",
                    "untagged",
                ],
            )?;
        }
        Ok(())
    }

    fn teardown(&mut self, _host: &HostView) -> Result<()> {
        // Nothing runs: the bridge disappears with the host namespace.
        Ok(())
    }
}
