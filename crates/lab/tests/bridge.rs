//! Root integration test: a 2-host testbed over the Linux-bridge dataplane carrying real
//! traffic, torn down afterwards. Prints "skipped: needs root" when not root.

use picnic_lab::dataplane::{Dataplane, LinuxBridge};
use picnic_lab::{topology, workload};
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::Scenario;

const SCENARIO: &str = r#"
name = "bridge-test"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "t1"

[[tenants]]
name = "t1"
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }]

[[workloads]]
name = "probe"
kind = "rpc"
from = "a"
to = "b"
rate_pps = 1000
timeout_ms = 1000

[[workloads]]
name = "flood"
kind = "udp_flood"
from = "a"
to = "b"
size = 256
rate_pps = 20000
"#;

#[test]
fn two_hosts_over_linux_bridges_carry_probe_and_flood_then_vanish() {
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root");
        return;
    }
    let scenario = Scenario::parse(SCENARIO).unwrap();
    let mut testbed = Testbed::new().unwrap();
    let prefix = format!("{}{}", netns::PREFIX, testbed.run_id());
    let topo = topology::build(&scenario, &mut testbed, false).unwrap();
    assert_eq!(testbed.namespaces().len(), 1 + 2 + 2);
    for host in &topo.hosts {
        LinuxBridge.setup(host).unwrap();
    }

    // The probe alone: every request answered, every latency recorded.
    let probe = &scenario.workloads[0];
    let r = &workload::run_all(&scenario, &topo, &[probe]).unwrap()[0];
    let hist = r.latency.as_ref().unwrap();
    assert!(r.sent >= 990, "sent {}", r.sent);
    assert_eq!(r.received, r.sent, "probe lost requests without any attack");
    assert_eq!(hist.len(), r.received);
    assert!(hist.value_at_quantile(0.5) > 0);
    println!(
        "probe: {} requests, p50 {} us, p99 {} us",
        r.sent,
        hist.value_at_quantile(0.5) / 1000,
        hist.value_at_quantile(0.99) / 1000
    );

    // A paced flood: about 20k packets arrive, visible in the time series.
    let flood = &scenario.workloads[1];
    let r = &workload::run_all(&scenario, &topo, &[flood]).unwrap()[0];
    println!(
        "flood: sent {} received {} ({:.1} Mb/s)",
        r.sent,
        r.received,
        r.throughput_bps() / 1e6
    );
    assert!(r.sent > 15_000 && r.sent <= 20_001, "sent {}", r.sent);
    assert!(
        r.received as f64 >= 0.9 * r.sent as f64,
        "received {}",
        r.received
    );
    assert_eq!(r.series.iter().sum::<u64>(), r.received_bytes);

    drop(testbed);
    let left: Vec<String> = netns::list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
