//! Shaped egress classes a scenario asks for (PicNIC 2.1: a VM's rate-limited flow gets its
//! own queue so it never blocks the VM's fast-path traffic), as picnic switch config.

use crate::scenario::Scenario;
use crate::topology::Topology;
use picnic_switch::config::ShapedClass;

/// The shaped classes of VM `vm`: one per workload sent from it with `shaped_mbps`,
/// matching its packets exactly (receiver IP, IP protocol, receiver port). Pure; for the
/// `shaped` field of the VM's entry in the switch config. Workloads whose receiver is not
/// in `topo` are skipped (a validated scenario has none).
pub fn shaped_classes(scenario: &Scenario, topo: &Topology, vm: &str) -> Vec<ShapedClass> {
    scenario
        .workloads
        .iter()
        .filter(|w| w.from == vm)
        .filter_map(|w| {
            let rate_mbps = w.shaped_mbps?;
            Some(ShapedClass {
                dst_ip: Some(topo.vm(&w.to)?.ip),
                protocol: Some(w.ip_protocol()),
                dst_port: Some(w.port(scenario)?),
                rate_mbps,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::Testbed;

    #[test]
    fn a_shaped_workload_becomes_an_exact_class_of_its_sender() {
        let s = Scenario::parse(
            r#"
name = "t"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "v"
[[tenants]]
name = "v"
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }, { name = "c", host = "h2" }]
[[workloads]]
name = "fast"
kind = "tcp_bulk"
from = "a"
to = "b"
[[workloads]]
name = "slow"
kind = "udp_flood"
from = "a"
to = "c"
shaped_mbps = 10
"#,
        )
        .unwrap();
        let topo = Topology::plan(&s, &Testbed::unbuilt("t"));
        let classes = shaped_classes(&s, &topo, "a");
        assert_eq!(classes.len(), 1);
        let c = &classes[0];
        assert_eq!(c.dst_ip, Some(topo.vm("c").unwrap().ip));
        assert_eq!(c.protocol, Some(17));
        assert_eq!(c.dst_port, Some(crate::workload::BASE_PORT + 1));
        assert_eq!(c.rate_mbps, 10.0);
        assert!(shaped_classes(&s, &topo, "b").is_empty());
    }
}
