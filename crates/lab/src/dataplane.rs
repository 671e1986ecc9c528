//! What runs in each host namespace and joins the VM ports to the uplink.

use crate::cgroup::Placement;
use anyhow::Result;
use picnic_netns as netns;
use picnic_scenario::plan::{HostView, Topology};
use picnic_scenario::Scenario;
use std::sync::Arc;

/// The dataplane of one host: set up after the topology is built, torn down before the
/// namespaces are deleted. One instance per host.
pub trait Dataplane: Send {
    /// Connects `host.vms[*].host_port` and `host.uplink` inside `host.ns`.
    fn setup(&mut self, host: &HostView) -> Result<()>;
    /// Stops whatever `setup` started (processes, threads). Links vanish with the namespace.
    fn teardown(&mut self, host: &HostView) -> Result<()>;
    /// CPU the dataplane measured and charged to each tenant so far, ns: its threads' and,
    /// where it measures them, the kernel softirq's on the tenant's ports (picnic's kernel
    /// fast path forwards there); empty when it does not measure it, as a kernel bridge.
    fn tenant_cpu_ns(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Tenants none of whose frames the dataplane has dropped so far (for the max-min CPU
    /// share, `cpu_share_error`); empty when it does not count drops per tenant.
    fn tenants_served_in_full(&self) -> Vec<String> {
        Vec::new()
    }
    /// What the dataplane judged of each tenant's SLO so far (empty when it does not judge
    /// SLOs, as a kernel bridge).
    fn tenant_slo(&self) -> Vec<(String, picnic_scenario::SwitchSlo)> {
        Vec::new()
    }
}

/// Makes a fresh dataplane for a host; a mode of a run holds one.
/// It sees the whole scenario and topology, since an overlay dataplane needs to know every
/// host and VM, and the tenants' cgroups (a dataplane may charge them for its work).
pub type DataplaneFactory =
    Arc<dyn Fn(&Scenario, &Topology, &HostView, &Placement) -> Box<dyn Dataplane> + Send + Sync>;

/// Name of the bridge [`LinuxBridge`] creates in each host namespace.
pub const HOST_BRIDGE: &str = "br0";

/// The baseline: a Linux bridge in the host namespace enslaving the VM ports and the
/// uplink, so all VMs of all tenants share one flat L2 and are told apart by address only.
/// Tenants are not separated: the kernels we run on have neither bridge VLAN filtering nor
/// 802.1Q devices (DESIGN.md 7), and the baseline needs none to show the isolation gap.
#[derive(Debug, Default)]
pub struct LinuxBridge;

impl LinuxBridge {
    /// A factory making a [`LinuxBridge`] for every host.
    pub fn factory() -> DataplaneFactory {
        Arc::new(|_, _, _, _| Box::new(LinuxBridge))
    }
}

impl Dataplane for LinuxBridge {
    fn setup(&mut self, host: &HostView) -> Result<()> {
        netns::add_bridge(&host.ns, HOST_BRIDGE)?;
        netns::enslave(&host.ns, &host.uplink, HOST_BRIDGE)?;
        for vm in &host.vms {
            netns::enslave(&host.ns, &vm.host_port, HOST_BRIDGE)?;
        }
        Ok(())
    }

    fn teardown(&mut self, _host: &HostView) -> Result<()> {
        // Nothing runs: the bridge disappears with the host namespace.
        Ok(())
    }
}
