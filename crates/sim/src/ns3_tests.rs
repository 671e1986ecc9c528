use super::*;
use std::path::Path;
use std::process::Command;

fn scenario(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(name),
    )
    .unwrap()
}

#[test]
fn the_bottleneck_scenario_maps_to_one_link_and_its_connections() {
    let spec = Spec::parse(&scenario("scenarios/sim/bottleneck-tcp.toml")).unwrap();
    let b = Bottleneck::from_spec(&spec).unwrap();
    assert_eq!((b.receiver.as_str(), b.receiver_index), ("r", 4));
    assert_eq!((b.access_mbps, b.queue_bytes), (100, 25_000)); // 2 ms at 100 Mb/s
    assert_eq!(
        (b.nic_mbps, b.link_delay_ns, b.min_rto_us),
        (10_000, 1000, 5000)
    );
    assert_eq!(b.dctcp_threshold_kb, None);
    assert_eq!(b.flows.len(), 8);
    let senders: Vec<usize> = b.flows.iter().map(|f| f.sender).collect();
    assert_eq!(senders, [0, 0, 1, 1, 2, 2, 3, 3]);
    let ports: Vec<u16> = b.flows.iter().map(|f| f.port).collect();
    assert_eq!(ports, (20000..20008).collect::<Vec<u16>>());
    assert!(b.flows.iter().all(|f| (f.start_ms, f.stop_ms) == (0, 2000)));
    let p = generate(&spec, 3).unwrap();
    for line in [
        "ACCESS_MBPS = 100",
        "QUEUE_BYTES = 25000",
        "DCTCP_THRESHOLD_KB = None",
        "SEGMENT = 1390",
        "RECEIVER = 4",
        "    (\"t4\", 3, 20007, 0, 2000, 0),",
        "    ns.RngSeedManager.SetRun(3)",
    ] {
        assert!(p.lines().any(|l| l == line), "missing {line:?} in\n{p}");
    }
    // DCTCP takes the simulator's ECN threshold for ns-3's RED marking.
    let dctcp = scenario("scenarios/sim/bottleneck-tcp.toml")
        .replace("[sim]", "[sim]\ncc = \"dctcp\"\necn_threshold_kb = 10");
    let b = Bottleneck::from_spec(&Spec::parse(&dctcp).unwrap()).unwrap();
    assert_eq!(b.dctcp_threshold_kb, Some(10));
    // Fast recovery's rule is ns-3's of the same name: classic by default, PRR on request.
    assert!(
        p.contains("RECOVERY = \"ns3::TcpClassicRecovery\"\n"),
        "{p}"
    );
    let prr =
        scenario("scenarios/sim/bottleneck-tcp.toml").replace("[sim]", "[sim]\nrecovery = \"prr\"");
    let p = generate(&Spec::parse(&prr).unwrap(), 3).unwrap();
    assert!(p.contains("RECOVERY = \"ns3::TcpPrrRecovery\"\n"), "{p}");
    assert!(p.contains("cd(\"ns3::TcpL4Protocol::RecoveryType\", ns.TypeIdValue(ns.TypeId.LookupByName(RECOVERY)))"));
}

#[test]
fn the_incast_maps_its_transfers_to_whole_segments_with_their_completion() {
    let spec = Spec::parse(&scenario("scenarios/sim/incast-transfer.toml")).unwrap();
    let b = Bottleneck::from_spec(&spec).unwrap();
    assert_eq!(b.flows.len(), 16);
    // 131072 B is 94.3 segments of 1390: the simulator sends 95 whole ones, and so does ns-3.
    assert!(b.flows.iter().all(|f| f.bytes == 95 * 1390));
    assert!(b
        .flows
        .iter()
        .all(|f| (f.start_ms, f.stop_ms) == (10, 1000)));
    let p = generate(&spec, 1).unwrap();
    for line in [
        "    (\"b4\", 3, 20015, 10, 1000, 132050),",
        "        bulk.SetAttribute(\"MaxBytes\", ns.UintegerValue(size))",
        "            w[\"completion_ms\"] = None if None in w[\"fct_ms\"] else max(w[\"fct_ms\"])",
    ] {
        assert!(p.lines().any(|l| l == line), "missing {line:?} in\n{p}");
    }
    // A bulk connection sends until its stop.
    let bulk = Spec::parse(&scenario("scenarios/sim/bottleneck-tcp.toml")).unwrap();
    let b = Bottleneck::from_spec(&bulk).unwrap();
    assert!(b.flows.iter().all(|f| f.bytes == 0));
}

#[test]
fn what_is_not_a_single_bottleneck_is_refused_with_the_reason() {
    let e = |text: &str| {
        format!(
            "{:#}",
            Bottleneck::from_spec(&Spec::parse(text).unwrap()).unwrap_err()
        )
    };
    let flood = e(&scenario("scenarios/ingress-flood.toml"));
    assert!(
        flood.contains("workload `probe`") && flood.contains("tcp_bulk"),
        "{flood}"
    );
    let base = scenario("scenarios/sim/bottleneck-tcp.toml");
    let replicas = e(&base.replace("[sim]", "[sim]\nreplicas = 2"));
    assert!(replicas.contains("replicas"), "{replicas}");
    let two = e(&base.replace(
        "to = \"vr\"\nflows = 2\n\n[sim]",
        "to = \"v1\"\nflows = 2\n\n[sim]",
    ));
    assert!(two.contains("one host"), "{two}");
    let dctcp = e(&base.replace("[sim]", "[sim]\ncc = \"dctcp\""));
    assert!(dctcp.contains("ecn_threshold_kb"), "{dctcp}");
}

/// Writes `program` to a scratch file named `name`.py, checks that it is valid Python
/// wherever there is a python3 (ns-3 or not), and runs it in ns-3: its JSON output, or None
/// (said why) without ns-3. The file is left for a look when the program fails.
pub(crate) fn run_program(name: &str, program: &str) -> Option<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("picnic-ns3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.py"));
    std::fs::write(&file, program).unwrap();
    if let Ok(o) = Command::new("python3")
        .args(["-m", "py_compile"])
        .arg(&file)
        .output()
    {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let py = match ns3_python() {
        Ok(py) => py,
        Err(why) => {
            eprintln!("skipped running the program: no ns-3: {why}");
            return None;
        }
    };
    let o = Command::new(&py).arg(&file).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_file(&file);
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

/// The Python that has ns-3: `$PICNIC_NS3_PYTHON`, else `python3`.
pub(crate) fn ns3_python() -> std::result::Result<String, String> {
    let py = std::env::var("PICNIC_NS3_PYTHON").unwrap_or_else(|_| "python3".into());
    match Command::new(&py).args(["-c", "from ns import ns"]).output() {
        Ok(o) if o.status.success() => Ok(py),
        Ok(o) => Err(format!(
            "`{py} -c 'from ns import ns'` failed ({}); bash scripts/setup_ns3.sh and PICNIC_NS3_PYTHON=target/venv-ns3/bin/python run it",
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        )),
        Err(e) => Err(format!("cannot start {py}: {e}")),
    }
}

#[test]
fn the_generated_program_runs_in_ns3_and_fills_the_bottleneck_fairly() {
    // A small case: two connections from two hosts, 300 ms.
    let text = scenario("scenarios/sim/bottleneck-tcp.toml")
        .replace("duration_ms = 2000", "duration_ms = 300")
        .replace("flows = 2", "flows = 1");
    let mut spec = Spec::parse(&text).unwrap();
    spec.scenario.workloads.truncate(2);
    let Some(r) = run_program("small", &generate(&spec, 1).unwrap()) else {
        return;
    };
    let agg = r["aggregate_mbps"].as_f64().unwrap();
    let jain = r["jain"].as_f64().unwrap();
    // Goodput ceiling: 1390 of every 1444 bytes on the wire (IPv4, TCP with the timestamp
    // option, PPP: the queue's 1 ms samples are multiples of 1442 B).
    assert!(agg > 80.0 && agg < 96.3, "{r}");
    // The senders' counters are read: two connections into a 25 KB FIFO lose segments.
    let rtx = r["retransmissions"].as_u64().unwrap();
    assert!(rtx > 0 && r["timeouts"].as_u64().unwrap() <= rtx, "{r}");
    assert!(jain > 0.9, "{r}");
    assert_eq!(r["flows_mbps"].as_array().unwrap().len(), 2);
    // The bottleneck queue, sampled every 1 ms: at most its 25 KB, and not empty throughout
    // (two NewReno connections fill a 2 ms buffer).
    let q = r["bottleneck_queue_kb_sampled_1ms"].as_array().unwrap();
    assert_eq!(q.len(), 5);
    let max = q[4][1].as_f64().unwrap();
    assert!(max > 1.5 && max <= 25.0, "{r}");
}
