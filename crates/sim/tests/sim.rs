//! Behaviour of the whole simulator: determinism, TCP at link rate and fair, frame
//! conservation, and the lab's ingress-flood scenario in the same direction as the lab.

use std::path::Path;

use picnic_sim::report::run;
use picnic_sim::spec::Spec;

fn scenario(file: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scenarios")
            .join(file),
    )
    .unwrap()
}

/// The lab's ingress-flood, shortened to keep the test quick (same shape: flood in the middle).
fn short_flood() -> Spec {
    let text = scenario("ingress-flood.toml")
        .replace("duration_ms = 3000", "duration_ms = 800")
        .replace("start_ms = 500", "start_ms = 200")
        .replace("stop_ms = 2500", "stop_ms = 700");
    Spec::parse(&text).unwrap()
}

#[test]
fn same_seed_same_summary_byte_for_byte() {
    let spec = short_flood();
    let dir = std::env::temp_dir().join(format!("picnic-sim-det-{}", std::process::id()));
    let mut outputs = Vec::new();
    for i in 0..2 {
        let d = dir.join(i.to_string());
        run(&spec, 7, Some(&d), false).unwrap();
        outputs.push((
            std::fs::read(d.join("summary.json")).unwrap(),
            std::fs::read(d.join("timeseries.csv")).unwrap(),
            std::fs::read(d.join("latency.csv")).unwrap(),
        ));
    }
    assert!(outputs[0] == outputs[1], "two runs with seed 7 differ");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_frame_is_delivered_dropped_with_a_reason_or_still_in_flight() {
    let spec = short_flood();
    let out = run(&spec, 3, None, false).unwrap();
    for s in &out.stats {
        let c = &s.conservation;
        assert!(c.balanced, "{}: {c:?}", s.mode);
        assert!(c.app_created > 1000, "{c:?}");
    }
    // Isolation off: the flood overruns the access link, so the fabric drops (counted).
    let off = out.stats.iter().find(|s| s.mode == "picnic-off").unwrap();
    assert!(
        off.conservation.fabric_drops.values().sum::<u64>() > 0,
        "{off:?}"
    );
    // Isolation on: admission control holds the flood at the senders' engines (counted).
    let on = out.stats.iter().find(|s| s.mode == "picnic").unwrap();
    assert!(
        on.conservation.engine_drops.values().sum::<u64>() > 0,
        "{on:?}"
    );
    assert!(on.conservation.feedback_created > 0);
}

/// Every scenario file in scenarios/sim (sweep files aside) loads and validates: the files
/// docs/sim.md quotes figures from, the 10,000-host run and the speed benchmark's among them.
#[test]
fn every_shipped_simulator_scenario_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/sim");
    let mut loaded = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".toml") || name.ends_with("-sweep.toml") {
            continue;
        }
        Spec::load(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        loaded.push(name);
    }
    for shipped in [
        "ingress-flood-10000.toml",
        "speed-bench.toml",
        "bottleneck-dctcp.toml",
    ] {
        assert!(
            loaded.iter().any(|n| n == shipped),
            "{shipped} not in {loaded:?}"
        );
    }
}

const TCP: &str = r#"
name = "tcp-link"
duration_ms = 600
access_link_mbps = 100
access_queue_ms = 5
hosts = ["h1", "h2"]
victim = "t"

[[tenants]]
name = "t"
min_mbps = 50
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }]

[sim]
modes = ["picnic-off"]
"#;

fn tcp_flows(n: usize) -> Vec<f64> {
    let mut text = TCP.to_owned();
    for i in 0..n {
        text += &format!(
            "\n[[workloads]]\nname = \"f{i}\"\nkind = \"tcp_bulk\"\nfrom = \"a\"\nto = \"b\"\n"
        );
    }
    let out = run(&Spec::parse(&text).unwrap(), 1, None, false).unwrap();
    assert!(out.stats[0].conservation.balanced);
    let mode = &out.modes[0];
    (0..n)
        .map(|i| {
            let w = mode
                .workloads
                .iter()
                .find(|w| w.name == format!("f{i}"))
                .unwrap();
            w.throughput_bps() / 1e6
        })
        .collect()
}

#[test]
fn one_tcp_flow_fills_the_link() {
    let rates = tcp_flows(1);
    // Goodput over a 100 Mb/s link: MSS 1390 of 1494 wire bytes (Geneve included) is 93%;
    // slow start and the first RTO-free ramp cost a little more.
    assert!(rates[0] > 85.0 && rates[0] < 94.0, "{rates:?}");
}

#[test]
fn tcp_flows_share_the_link_fairly() {
    let rates = tcp_flows(4);
    let sum: f64 = rates.iter().sum();
    let jain = sum * sum / (rates.len() as f64 * rates.iter().map(|r| r * r).sum::<f64>());
    assert!(sum > 85.0, "{rates:?}");
    assert!(jain > 0.95, "Jain index {jain}: {rates:?}");
}

#[test]
fn ingress_flood_agrees_with_the_lab_in_direction() {
    let spec = Spec::parse(&scenario("ingress-flood.toml")).unwrap();
    let out = run(&spec, 1, None, false).unwrap();
    let ratio = |mode: &str| out.summary.ratios[mode].victim_p99_ratio.unwrap();
    let (on, off) = (ratio("picnic"), ratio("picnic-off"));
    eprintln!("ingress-flood victim p99 ratio: sim picnic {on:.2}x, sim picnic-off {off:.2}x");
    // As in the lab: with isolation on the victim stays near its latency alone; with it off
    // the flood's queue at the access link multiplies its p99.
    assert!(on < 2.0, "{}", out.table);
    assert!(off > 10.0 * on, "{}", out.table);
    let loss = |mode: &str| out.summary.modes[mode]["victim"].loss;
    assert_eq!(loss("picnic"), 0.0, "{}", out.table);
    assert!(loss("picnic-off") > 0.0, "{}", out.table);
}

#[test]
fn egress_shaped_runs_unchanged_and_isolation_keeps_the_fast_path() {
    // The lab's file as is: the shaped class matches the workload's own port, the victim's
    // `attack = true` flow is its own row and sits out victim-alone.
    let out = run(
        &Spec::parse(&scenario("egress-shaped.toml")).unwrap(),
        1,
        None,
        false,
    )
    .unwrap();
    let mbps = |mode: &str, row: &str| out.summary.modes[mode][row].throughput_bps / 1e6;
    let shaped = mbps("picnic", "app/attack");
    assert!(
        (shaped - 10.0).abs() < 1.5,
        "shaped to {shaped} Mb/s\n{}",
        out.table
    );
    assert!(
        !out.summary.modes["victim-alone"].contains_key("app/attack"),
        "{}",
        out.table
    );
    let ratios = |mode: &str| &out.summary.ratios[mode];
    assert!(
        ratios("picnic").victim_throughput_ratio.unwrap() > 0.95,
        "{}",
        out.table
    );
    assert!(
        ratios("picnic").victim_p99_ratio.unwrap() < 1.5,
        "{}",
        out.table
    );
    // PicNIC 2.1: a shaped class in the VM's one queue holds the fast path back.
    assert!(
        ratios("picnic-off").victim_throughput_ratio.unwrap() < 0.8,
        "{}",
        out.table
    );
}

#[test]
fn lab_shuffle_transfers_complete_in_guarantee_order_only_with_isolation() {
    // The lab's `transfer` workloads record when their last flow finished, as in the lab.
    let out = run(
        &Spec::parse(&scenario("shuffle-priority.toml")).unwrap(),
        1,
        None,
        false,
    )
    .unwrap();
    let order = |mode: &str| out.summary.metrics[mode].get("completion_order").copied();
    assert_eq!(order("picnic"), Some(1.0), "{}", out.table);
    assert_eq!(order("picnic-off"), Some(0.0), "{}", out.table);
}

fn sim_scenario(file: &str) -> String {
    scenario(&format!("sim/{file}"))
}

#[test]
fn incast_runs_without_pool_exhaustion() {
    // The pool budget derives from the queue bounds and grows on demand: no send is refused
    // for want of a frame (the old fixed pool refused 14,728 here, distorting shares).
    let text = scenario("incast.toml").replace("duration_ms = 3000", "duration_ms = 1500");
    let out = run(&Spec::parse(&text).unwrap(), 1, None, false).unwrap();
    for s in &out.stats {
        assert_eq!(s.pool_exhausted, 0, "{}", s.mode);
        assert!(s.conservation.balanced, "{}", s.mode);
    }
}

#[test]
fn eyeq_burst_rate_reaches_its_allocation_only_with_isolation() {
    let out = run(
        &Spec::parse(&sim_scenario("eyeq-convergence.toml")).unwrap(),
        1,
        None,
        false,
    )
    .unwrap();
    let conv = |mode: &str, tenant: &str| {
        out.stats
            .iter()
            .find(|s| s.mode == mode)
            .unwrap()
            .convergence
            .iter()
            .find(|c| c.tenant == tenant)
            .unwrap()
            .clone()
    };
    // With isolation the burst's receiver reaches its allocation (5 ms mean within 10%)
    // within EyeQ's 5 ms (plus one window), and the TCP tenant keeps about its share.
    let udp = conv("picnic", "udp");
    assert!(udp.reached_ms.is_some_and(|ms| ms <= 10.0), "{udp:?}");
    let tcp = conv("picnic", "tcp");
    assert!(tcp.settled_mbps > 0.75 * tcp.target_mbps, "{tcp:?}");
    // Without it the burst takes the link and the TCP tenant is starved.
    let tcp_off = conv("picnic-off", "tcp");
    assert!(
        tcp_off.settled_mbps < 0.25 * tcp_off.target_mbps,
        "{tcp_off:?}"
    );
    assert!(tcp_off.converged_ms.is_none(), "{tcp_off:?}");
}

#[test]
fn the_tcp_tenant_keeps_its_share_at_the_burst_onset_at_every_seed() {
    // The test above at one seed is a sample: before the receivers started new senders at
    // C_i / N and kept the rate above a share of it, TCP kept its share at 13-15 of seeds
    // 1-40 (docs/BENCHMARKS.md "EyeQ's onset"). Isolation only, seeds 1-8 (about 2 s).
    let text = sim_scenario("eyeq-convergence.toml").replace(
        "modes = [\"picnic\", \"picnic-off\"]",
        "modes = [\"picnic\"]",
    );
    let spec = Spec::parse(&text).unwrap();
    for seed in 1..=8 {
        let out = run(&spec, seed, None, false).unwrap();
        let conv = |tenant: &str| {
            out.stats[0]
                .convergence
                .iter()
                .find(|c| c.tenant == tenant)
                .unwrap()
                .clone()
        };
        let udp = conv("udp");
        assert!(
            udp.reached_ms.is_some_and(|ms| ms <= 10.0),
            "seed {seed}: {udp:?}"
        );
        let tcp = conv("tcp");
        assert!(
            tcp.settled_mbps > 0.75 * tcp.target_mbps,
            "seed {seed}: {tcp:?}"
        );
    }
}

#[test]
fn shuffles_finish_in_guarantee_order_with_isolation_and_connection_order_without() {
    // The scenario file as is (8 hosts, 2 MB per pair; about 7 s a seed), at five seeds in
    // three threads: a job's completion is its last flow's, one tail sample, so one seed's order
    // of the two closest jobs is a draw (p1 before p2 held at 3 of these 5 seeds with the
    // receivers' fair start and floor, and at 3 of 5 other ones without them).
    let text = sim_scenario("eyeq-shuffle.toml");
    let spec = Spec::parse(&text).unwrap();
    let outs: Vec<_> = std::thread::scope(|scope| {
        let spec = &spec;
        let runs: Vec<_> = [1, 2, 3, 4, 5]
            .chunks(2)
            .map(|seeds| {
                scope.spawn(move || {
                    seeds
                        .iter()
                        .map(|&seed| (seed, run(spec, seed, None, false).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    // Seeds at which the job with the least guarantee finished last.
    let mut last_is_least = Vec::new();
    for (seed, out) in &outs {
        let jobs = |mode: &str| {
            out.stats
                .iter()
                .find(|s| s.mode == mode)
                .unwrap()
                .shuffles
                .clone()
        };
        let on = jobs("picnic");
        let done: Vec<f64> = on.iter().map(|j| j.completion_ms.unwrap()).collect();
        // Jobs sorted by tag: p1 (guarantee 4), p2 (2), p4 (1): the median flows follow the
        // guarantees, and the job with the least guarantee finishes last.
        assert!(
            on[0].median_fct_ms < on[1].median_fct_ms,
            "seed {seed}: {on:?}"
        );
        assert!(
            on[1].median_fct_ms < on[2].median_fct_ms,
            "seed {seed}: {on:?}"
        );
        if done[0] < done[2] && done[1] < done[2] {
            last_is_least.push(*seed);
        }
        println!("seed {seed}: {on:?}");
        let off = jobs("picnic-off");
        let median: Vec<f64> = off.iter().map(|j| j.median_fct_ms).collect();
        // Without isolation the median flow follows the connection counts instead.
        assert!(
            median[2] < median[1] && median[1] < median[0],
            "seed {seed}: {off:?}"
        );
    }
    // A job's completion is one tail sample: the least-guaranteed job finishes last at most
    // seeds, not all (since the CPU receiver's feedback is applied, 2026-11-28, one of five
    // seeds had a 4-guarantee job's last flow finish after it).
    assert!(
        last_is_least.len() >= 4,
        "the least-guaranteed job finished last only at seeds {last_is_least:?}"
    );
}

#[test]
fn per_packet_ecmp_moves_congestion_from_the_core_to_the_edge() {
    // eyeq-fabric on 48 hosts (3 ToRs of 16, 16 spines), 60 ms of flows.
    let p99 = |ecmp: &str, class: &str| {
        let mut text = sim_scenario(&format!("eyeq-fabric-{ecmp}.toml"))
            .replace("duration_ms = 500", "duration_ms = 60")
            .replace("to = \"w144\"", "to = \"w48\"");
        for i in 49..=144 {
            text = text
                .replace(&format!(", \"h{i}\""), "")
                .replace(&format!("  {{ name = \"w{i}\", host = \"h{i}\" }},\n"), "");
        }
        let out = run(&Spec::parse(&text).unwrap(), 1, None, false).unwrap();
        let s = &out.stats[0];
        assert!(s.conservation.balanced);
        s.queue_sampled_kb[class]
            .iter()
            .find(|(q, _)| *q == 0.99)
            .unwrap()
            .1
    };
    let (flow_core, packet_core, packet_edge) = (
        p99("perflow", "core"),
        p99("perpacket", "core"),
        p99("perpacket", "edge"),
    );
    assert!(
        packet_core < 0.5 * flow_core,
        "{packet_core} vs {flow_core}"
    );
    assert!(
        packet_edge > 4.0 * packet_core,
        "{packet_edge} vs {packet_core}"
    );
}

#[test]
fn tcp_on_a_reordering_fabric_resends_little_that_arrived() {
    // The web-search fabric (16 hosts, per-packet ECMP over 2 spines, so segments and ACKs
    // are reordered) at load 0.5 with 150 ms of arrivals. Each retransmission stands for a
    // drop, within a margin for the reordering no sender can tell from loss: 1.07 of the
    // fabric's drops (3,539 for 3,321) since SACK blocks and RFC 6675's NextSeg
    // (2026-11-29); 1.80 (7,142 for 3,972) before, when an ACK reported one segment and
    // every hole went first: a third of the fabric's losses were the simulator's own.
    let text = sim_scenario("fabric-websearch.toml")
        .replace("duration_ms = 1350", "duration_ms = 250")
        .replace("stop_ms = 1250", "stop_ms = 150");
    let out = run(&Spec::parse(&text).unwrap(), 1, None, false).unwrap();
    let s = &out.stats[0];
    assert!(s.conservation.balanced);
    assert_eq!(s.unfinished_flows, 0);
    let drops: u64 = s.conservation.fabric_drops.values().sum();
    assert!(drops > 1_000, "a congested fabric: {drops} drops");
    assert!(
        (s.tcp_retransmits as f64) < 1.25 * drops as f64,
        "{} retransmissions for {drops} drops",
        s.tcp_retransmits
    );
}
