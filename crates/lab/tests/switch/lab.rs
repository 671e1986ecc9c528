//! The testbed of these tests: a scenario of two hosts and a running picnic switch per host.

use std::sync::{Mutex, MutexGuard};

use picnic_lab::dataplane::Dataplane;
use picnic_lab::picnic::PicnicSwitch;
use picnic_lab::{topology, workload};
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::plan::{Topology, VmView};
use picnic_scenario::switch::switch_config;
use picnic_scenario::{Scenario, WorkloadResult};
use picnic_switch::config::{Config, Mac};
use picnic_switch::engine::{Snapshot, VmSnapshot};

/// One test at a time: each measures latency or rates on a shared 2-core machine.
pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

/// The lock serializing the tests, or None (after saying so) when not root.
pub(crate) fn root_or_skip() -> Option<MutexGuard<'static, ()>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root (creates network namespaces and raw packet sockets)");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Two hosts, tenants blue and red with a VM on each host; `top` holds `duration_ms` and
/// any other top-level field, `workloads` the workload tables.
pub(crate) fn scenario(top: &str, workloads: &str) -> Scenario {
    let text = format!(
        r#"
name = "switch-test"
hosts = ["h1", "h2"]
victim = "blue"
{top}

[[tenants]]
name = "blue"
min_mbps = 10
vms = [{{ name = "blue1", host = "h1" }}, {{ name = "blue2", host = "h2" }}]

[[tenants]]
name = "red"
min_mbps = 10
vms = [{{ name = "red1", host = "h1" }}, {{ name = "red2", host = "h2" }}]

{workloads}
"#
    );
    Scenario::parse(&text).unwrap()
}

/// A placeholder workload for tests that drive traffic themselves (a scenario needs one).
pub(crate) const IDLE: &str = r#"
[[workloads]]
name = "idle"
kind = "rpc"
from = "blue1"
to = "blue2"
"#;

/// A running testbed with a picnic switch per host. Dropping it stops the switches, then
/// deletes the namespaces.
pub(crate) struct Lab {
    pub(crate) scenario: Scenario,
    pub(crate) topo: Topology,
    switches: Vec<PicnicSwitch>,
    testbed: Testbed,
}

impl Lab {
    /// Builds the testbed and starts a switch per host (isolation on) with the generated
    /// config, after `adjust(host index, config)`.
    pub(crate) fn start(scenario: Scenario, adjust: impl Fn(usize, &mut Config)) -> Lab {
        let mut testbed = Testbed::new().unwrap();
        let topo = topology::build(&scenario, &mut testbed, false).unwrap();
        let mut lab = Lab {
            scenario,
            topo,
            switches: Vec::new(),
            testbed,
        };
        for host in lab.topo.hosts.clone() {
            let mut cfg = switch_config(&lab.scenario, &lab.topo, &host, true).unwrap();
            adjust(host.index, &mut cfg);
            cfg.validate().unwrap();
            let mut switch = PicnicSwitch::new(cfg, true);
            switch.setup(&host).unwrap();
            lab.switches.push(switch);
        }
        lab
    }

    pub(crate) fn vm(&self, name: &str) -> &VmView {
        self.topo.vm(name).unwrap()
    }

    /// The endpoint id the switches give VM `name` (carried in feedback).
    pub(crate) fn endpoint_id(&self, name: &str) -> u32 {
        let cfg = self.switches[0].config();
        cfg.vms.iter().find(|v| v.name == name).unwrap().id
    }

    /// The latest snapshot of host `h`'s switch (published every 100 ms).
    pub(crate) fn snapshot(&self, h: usize) -> Option<Snapshot> {
        self.switches[h].snapshot()
    }

    /// Runs workloads of the scenario by name.
    pub(crate) fn run(&self, names: &[&str]) -> Vec<WorkloadResult> {
        let wls: Vec<_> = names
            .iter()
            .map(|n| {
                self.scenario
                    .workloads
                    .iter()
                    .find(|w| w.name == *n)
                    .unwrap()
            })
            .collect();
        workload::run_all(&self.scenario, &self.topo, &wls).unwrap()
    }

    /// Stops every switch and returns their final snapshots, host order.
    pub(crate) fn stop(&mut self) -> Vec<Snapshot> {
        for (host, switch) in self.topo.hosts.iter().zip(&mut self.switches) {
            switch.teardown(host).unwrap();
        }
        self.switches
            .iter()
            .map(|s| {
                s.snapshot()
                    .expect("a stopped switch publishes its counters")
            })
            .collect()
    }

    /// Tears down and checks that no namespace of this testbed is left.
    pub(crate) fn finish(mut self) {
        let prefix = format!("{}{}-", netns::PREFIX, self.testbed.run_id());
        self.stop();
        self.testbed.teardown().unwrap();
        let left: Vec<String> = netns::list_namespaces()
            .unwrap()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Switches first: their sockets live in the namespaces the testbed deletes.
        for (host, switch) in self.topo.hosts.iter().zip(&mut self.switches) {
            let _ = switch.teardown(host);
        }
    }
}

pub(crate) fn vm_snap<'a>(snap: &'a Snapshot, name: &str) -> &'a VmSnapshot {
    snap.vms.iter().find(|v| v.name == name).unwrap()
}

pub(crate) fn mac(s: &str) -> [u8; 6] {
    s.parse::<Mac>().unwrap().0
}

pub(crate) fn micros(ns: u64) -> f64 {
    ns as f64 / 1e3
}

// ---------------------------------------------------------------------------------------
// Raw frames
