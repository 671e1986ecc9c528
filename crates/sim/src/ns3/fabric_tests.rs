use super::*;
use std::path::Path;

use picnic_scenario::Mode;

use crate::world::World;

/// The shipped web-search fabric, its arrivals cut to `stop_ms` at `load`.
fn small(stop_ms: u64, load: f64) -> Spec {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/sim/fabric-websearch.toml"),
    )
    .unwrap()
    .replace("stop_ms = 1250", &format!("stop_ms = {stop_ms}"))
    .replace(
        "duration_ms = 1350",
        &format!("duration_ms = {}", stop_ms + 100),
    )
    .replace("load = 0.5", &format!("load = {load}"));
    Spec::parse(&text).unwrap()
}

#[test]
fn the_fabric_case_maps_the_topology_and_draws_the_simulators_flows() {
    let spec = small(60, 0.5);
    let f = Fabric::from_spec(&spec, 1).unwrap();
    assert_eq!((f.hosts, f.hosts_per_leaf, f.spines), (16, 4, 2));
    assert_eq!(
        (f.access_bps, f.nic_bps, f.core_bps),
        (1_000_000_000, 10_000_000_000, 2_000_000_000)
    );
    assert_eq!(
        (f.queue_bytes, f.window_ms, f.end_ms),
        (125_000, (0, 60), 360)
    );
    // One segment across leaves alone: four hops out (NIC, two core, access) and the ACK's
    // four back, each the delay plus the frame's serialization.
    let one = 4 * 1000 + 1196 + 5976 * 2 + 11_952 + 4 * 1000 + 109 + 544 * 2 + 1088;
    assert_eq!(f.ideal_ns(0, 4, 1390), one);
    assert_eq!(
        f.ideal_ns(0, 4, 2 * 1390),
        one + 11_952,
        "the rest at the access rate"
    );
    assert!(f.ideal_ns(0, 1, 1390) < one, "within a leaf: two hops");
    // The simulator with the same seed runs exactly these flows (its flows.csv).
    let mut w = World::new(&spec, &Mode::named("picnic-off").unwrap(), 1).unwrap();
    let stats = w.run(&mut |_| {});
    let drawn: Vec<(u32, u32, u64, u64)> = f
        .flows
        .iter()
        .filter(|x| x.reported)
        .map(|x| (x.src as u32, x.dst as u32, x.start_ns, x.bytes))
        .collect();
    let mut ran: Vec<(u32, u32, u64, u64)> = stats
        .flows
        .iter()
        .map(|r| (r.src, r.dst, r.start_ns, r.bytes))
        .collect();
    ran.sort_by_key(|x| (x.2, x.0));
    assert!(drawn.len() >= 20, "{}", drawn.len());
    assert_eq!(stats.unfinished_flows, 0);
    assert_eq!(ran, drawn);
    assert_ne!(
        Fabric::from_spec(&spec, 2).unwrap().flows,
        f.flows,
        "the seed draws"
    );
    let p = generate(&spec, 1).unwrap();
    for line in [
        "CORE_BPS = 2000000000",
        "WINDOW_MS = (0, 60)",
        "SCALE = 1444 / 1494",
    ] {
        assert!(p.contains(line), "{line}");
    }
}

#[test]
fn what_ns3_cannot_carry_alike_is_refused_with_the_reason() {
    let e = |spec: Spec| format!("{:#}", Fabric::from_spec(&spec, 1).unwrap_err());
    let mut s = small(60, 0.5);
    s.sim.ecmp = crate::spec::Ecmp::PerFlow;
    assert!(e(s).contains("per packet"));
    let mut s = small(60, 0.5);
    s.sim.switch_buffer_kb = 4096;
    assert!(e(s).contains("shared switch buffer"));
    let mut s = small(60, 0.5);
    s.sim.replicas = 2;
    assert!(e(s).contains("replicas"));
}

#[test]
fn a_small_fabric_runs_in_ns3_as_in_the_simulator() {
    let spec = small(40, 0.3);
    let Some(r) = crate::ns3::tests::run_program("fabric", &generate(&spec, 1).unwrap()) else {
        return;
    };
    let flows = r["flows"].as_array().unwrap();
    let f = Fabric::from_spec(&spec, 1).unwrap();
    assert_eq!(flows.len(), f.flows.iter().filter(|x| x.reported).count());
    // Every flow completes, none faster than alone (the rates scaled to the simulator's
    // frames), and the median flow is within 10% of the simulator's.
    let mut ns: Vec<f64> = flows
        .iter()
        .map(|x| x[5].as_f64().expect("completed") / x[4].as_f64().unwrap())
        .collect();
    assert!(ns.iter().all(|&s| s > 0.97), "{ns:?}");
    let mut w = World::new(&spec, &Mode::named("picnic-off").unwrap(), 1).unwrap();
    let stats = w.run(&mut |_| {});
    let mut sim: Vec<f64> = stats
        .flows
        .iter()
        .map(|x| x.fct_us * 1e3 / f.ideal_ns(x.src as usize, x.dst as usize, x.bytes) as f64)
        .collect();
    assert_eq!(sim.len(), ns.len());
    ns.sort_by(f64::total_cmp);
    sim.sort_by(f64::total_cmp);
    let (a, b) = (sim[sim.len() / 2], ns[ns.len() / 2]);
    assert!(
        (a / b - 1.0).abs() < 0.1,
        "median slowdown sim {a} ns-3 {b}"
    );
}
