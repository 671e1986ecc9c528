//! Root integration test: the real tools as probes (sockperf ping-pong, memcached with
//! picnic's client) across a 2-host testbed over Linux bridges. Prints why it skips when not
//! root or when a tool is missing (scripts/setup.sh installs both).

use picnic_lab::dataplane::{Dataplane, LinuxBridge};
use picnic_lab::{topology, workload};
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::Scenario;

const SCENARIO: &str = r#"
name = "tools-test"
duration_ms = 2500
hosts = ["h1", "h2"]
victim = "t1"

[[tenants]]
name = "t1"
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }]

[[workloads]]
name = "sockperf"
kind = "sockperf"
from = "a"
to = "b"
rate_pps = 1000
size = 64

[[workloads]]
name = "memcached"
kind = "memcached"
from = "a"
to = "b"
rate_pps = 1000
size = 100
timeout_ms = 1000
"#;

#[test]
fn sockperf_and_memcached_probes_measure_every_request() {
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root");
        return;
    }
    for tool in ["sockperf", "memcached"] {
        if !netns::have_tool(tool) {
            println!("skipped: {tool} is not installed (Debian package {tool})");
            return;
        }
    }
    let scenario = Scenario::parse(SCENARIO).unwrap();
    let mut testbed = Testbed::new().unwrap();
    let topo = topology::build(&scenario, &mut testbed, false).unwrap();
    for host in &topo.hosts {
        LinuxBridge.setup(host).unwrap();
    }
    let probes: Vec<_> = scenario.workloads.iter().collect();
    let results = workload::run_all(&scenario, &topo, &probes).unwrap();
    for r in &results {
        let hist = r.latency.as_ref().unwrap();
        println!(
            "{}: sent {} received {} p50 {} us p99 {} us",
            r.name,
            r.sent,
            r.received,
            hist.value_at_quantile(0.5) / 1000,
            hist.value_at_quantile(0.99) / 1000
        );
        assert!(r.received > 0 && r.received <= r.sent, "{}", r.name);
        assert!(
            r.received as f64 >= 0.99 * r.sent as f64,
            "{} lost requests without any attack",
            r.name
        );
        assert!(hist.value_at_quantile(0.5) > 0);
    }
    // sockperf runs 2 whole seconds and measures after its ~0.85 s start: ~1150 requests.
    let sockperf = &results[0];
    assert!(
        (900..=1300).contains(&sockperf.sent),
        "sockperf sent {}",
        sockperf.sent
    );
    assert_eq!(sockperf.latency.as_ref().unwrap().len(), sockperf.received);
    // memcached answers every get of the 2.5 s run. A get answered after the next one was
    // due skips that tick (one request outstanding, as the RPC probe): on this 2-vCPU guest
    // the bridges' p99 reaches 1-3 ms in some runs, and 4-12% of the ticks were skipped in
    // three runs of 2026-11-28 (2,211-2,446 sent). 2,000 still needs the client to run to
    // the end of the window.
    let memcached = &results[1];
    assert!(memcached.sent >= 2000, "memcached sent {}", memcached.sent);
    assert_eq!(
        memcached.latency.as_ref().unwrap().len(),
        memcached.received
    );
}
