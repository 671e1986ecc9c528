//! Tests of the report: metrics, scenario metrics, pass marks, summary, table and files.

use super::*;
use crate::shares::{completion_order, convergence_ms, median, share_error};
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, BTreeSet};

const SCENARIO: &str = r#"
name = "t"
duration_ms = 1000
hosts = ["h1"]
victim = "v"
pass = ["victim_p99_ratio <= 1.5", "victim_loss <= 0", "x.throughput_mbps >= 100"]

[[tenants]]
name = "v"
latency_p99_us = 500
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h1" }]

[[tenants]]
name = "x"
min_mbps = 100
vms = [{ name = "c", host = "h1" }, { name = "d", host = "h1" }]

[[workloads]]
name = "probe"
kind = "rpc"
from = "a"
to = "b"

[[workloads]]
name = "flood"
kind = "udp_flood"
from = "c"
to = "d"
"#;

fn probe(latency_us: u64, sent: u64, received: u64) -> WorkloadResult {
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    for _ in 0..received {
        h.record(latency_us * 1000).unwrap();
    }
    WorkloadResult {
        name: "probe".into(),
        tenant: "v".into(),
        kind: WorkloadKind::Rpc,
        sent,
        received,
        received_bytes: received * 64,
        active_ns: 1_000_000_000,
        latency: Some(h),
        series: vec![0; 10],
        completion_ns: None,
    }
}

fn flood(bytes: u64) -> WorkloadResult {
    WorkloadResult {
        name: "flood".into(),
        tenant: "x".into(),
        kind: WorkloadKind::UdpFlood,
        sent: 1000,
        received: 900,
        received_bytes: bytes,
        active_ns: 1_000_000_000,
        latency: None,
        series: vec![bytes / 2, bytes / 2],
        completion_ns: None,
    }
}

fn modes(s: &Scenario) -> Vec<ModeReport> {
    let attacked = ModeReport::new(
        s,
        "bridge",
        true,
        vec![vec![probe(300, 1000, 1000), flood(25_000_000)]],
    )
    .unwrap();
    let alone =
        ModeReport::new(s, "victim-alone", false, vec![vec![probe(100, 1000, 1000)]]).unwrap();
    vec![attacked, alone]
}

#[test]
fn checks_parse_and_hold() {
    let c = Check::parse("victim_p99_ratio <= 1.5").unwrap();
    assert!(c.holds(1.5) && !c.holds(1.6));
    assert!(Check::parse("victim_p99_ratio =< 1.5").is_err());
    assert!(Check::parse("victim_p99_ratio <= x").is_err());
    assert!(Check::parse("nonsense <= 1").is_err());
    assert!(Check::parse("t1.p99_us < 80").is_ok());
}

#[test]
fn summary_has_the_documented_shape_and_verdict() {
    let s = Scenario::parse(SCENARIO).unwrap();
    let reports = modes(&s);
    let summary = Summary::new(&s, &reports, None).unwrap();
    let json: serde_json::Value = serde_json::to_value(&summary).unwrap();
    for mode in ["bridge", "victim-alone"] {
        let v = &json["modes"][mode]["v"];
        for key in [
            "throughput_bps",
            "p50_us",
            "p99_us",
            "p999_us",
            "loss",
            "slo_met",
        ] {
            assert!(v.get(key).is_some(), "{mode}.v.{key} missing");
        }
    }
    let x = &json["modes"]["bridge"]["x"];
    assert_eq!(x["throughput_bps"], 200e6);
    assert!((x["loss"].as_f64().unwrap() - 0.1).abs() < 1e-9);
    // No switch judged the bridge modes' SLOs.
    assert_eq!(x["slo_met"], serde_json::Value::Null);
    assert_eq!(
        json["modes"]["bridge"]["v"]["slo_met"],
        serde_json::Value::Null
    );
    let ratio = json["ratios"]["bridge"]["victim_p99_ratio"]
        .as_f64()
        .unwrap();
    assert!((ratio - 3.0).abs() < 0.01, "{ratio}");
    let checks = json["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 3);
    for c in checks {
        for key in ["name", "value", "bound", "pass"] {
            assert!(c.get(key).is_some(), "check key {key} missing");
        }
    }
    assert_eq!(checks[0]["pass"], false);
    assert_eq!(checks[1]["pass"], true);
    assert_eq!(checks[2]["pass"], true);
    assert_eq!(json["pass"], false);
    let table = summary.table();
    assert!(
        table.contains("victim-alone") && table.contains("3.00x"),
        "{table}"
    );
    assert!(table.contains("overall: FAIL"));
}

#[test]
fn each_mode_is_compared_with_the_victim_alone_on_its_own_dataplane() {
    let s = Scenario::parse(SCENARIO).unwrap();
    let mode = |name: &str, attackers: bool, latency_us: u64| {
        let mut runs = vec![probe(latency_us, 1000, 1000)];
        if attackers {
            runs.push(flood(25_000_000));
        }
        ModeReport::new(&s, name, attackers, vec![runs]).unwrap()
    };
    let reports = vec![
        mode("picnic", true, 400),
        mode("bridge", true, 300),
        mode("picnic-engines", true, 250),
        mode("picnic-off", true, 800),
        mode("picnic-alone", false, 200),
        mode("victim-alone", false, 100),
        mode("picnic-engines-alone", false, 50),
    ];
    let summary = Summary::new(&s, &reports, None).unwrap();
    let json = serde_json::to_value(&summary).unwrap();
    let p99 = |m: &str| json["ratios"][m]["victim_p99_ratio"].as_f64().unwrap();
    assert!((p99("picnic") - 2.0).abs() < 0.01, "{}", p99("picnic"));
    assert!((p99("bridge") - 3.0).abs() < 0.01, "{}", p99("bridge"));
    // A mode with an alone partner of its own name uses it; others their family's.
    assert!(
        (p99("picnic-engines") - 5.0).abs() < 0.01,
        "{}",
        p99("picnic-engines")
    );
    assert!(
        (p99("picnic-off") - 4.0).abs() < 0.01,
        "{}",
        p99("picnic-off")
    );
}

#[test]
fn a_check_without_a_value_fails() {
    let s = Scenario::parse(SCENARIO).unwrap();
    let only_attacked = &modes(&s)[..1];
    let summary = Summary::new(&s, only_attacked, None).unwrap();
    assert_eq!(summary.checks[0].value, None);
    assert!(!summary.checks[0].pass && !summary.pass);
}

#[test]
fn outputs_are_written() {
    let s = Scenario::parse(SCENARIO).unwrap();
    let reports = modes(&s);
    let summary = Summary::new(&s, &reports, Some("bridge")).unwrap();
    let dir = std::env::temp_dir().join(format!("picnic-lab-report-{}", std::process::id()));
    write_outputs(&dir, &summary, &reports).unwrap();
    let ts = std::fs::read_to_string(dir.join("timeseries.csv")).unwrap();
    assert!(ts.starts_with("mode,repeat,tenant,t_ms,mbps\n"));
    assert!(ts.contains("bridge,0,x,0,10000.000"), "{ts}");
    let lat = std::fs::read_to_string(dir.join("latency.csv")).unwrap();
    assert!(lat.lines().any(|l| l.starts_with("victim-alone,v,0.5,")));
    assert!(dir.join("summary.json").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn repetitions_report_medians_with_min_and_max() {
    let s = Scenario::parse(SCENARIO).unwrap();
    let reps = vec![
        vec![probe(300, 1000, 1000), flood(10_000_000)],
        vec![probe(100, 1000, 990), flood(30_000_000)],
        vec![probe(200, 1000, 980), flood(20_000_000)],
    ];
    let m = ModeReport::new(&s, "bridge", true, reps).unwrap();
    let v = &m.tenants["v"];
    let p50 = v.p50_us.unwrap();
    assert!((p50 - 200.0).abs() < 1.0, "{p50}");
    let sp = v.spread.as_ref().unwrap();
    assert_eq!(sp.repetitions, 3);
    assert!((sp.p50_us_min.unwrap() - 100.0).abs() < 1.0);
    assert!((sp.p50_us_max.unwrap() - 300.0).abs() < 1.0);
    assert!((v.loss - 0.01).abs() < 1e-9 && sp.loss_max == 0.02 && sp.loss_min == 0.0);
    assert_eq!(m.tenants["x"].throughput_bps, 160e6);
    let alone = ModeReport::new(&s, "victim-alone", false, vec![vec![probe(100, 10, 10)]]).unwrap();
    assert!(alone.tenants["v"].spread.is_none());
    let summary = Summary::new(&s, &[m, alone], None).unwrap();
    let json = serde_json::to_value(&summary).unwrap();
    let x = &json["modes"]["bridge"]["x"];
    assert_eq!(x["throughput_bps"], 160e6);
    assert_eq!(x["throughput_bps_min"], 80e6);
    assert_eq!(x["throughput_bps_max"], 240e6);
    assert!(json["modes"]["victim-alone"]["v"]
        .get("p50_us_min")
        .is_none());
    let table = summary.table();
    assert!(
        table.contains("  min") && table.contains("(of 3)"),
        "{table}"
    );
}

#[test]
fn median_of_odd_even_and_empty() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0]), Some(2.5));
    assert_eq!(median(&[]), None);
}

const SHARES: &str = r#"
name = "t"
duration_ms = 1000
hosts = ["h1"]
victim = "a"
pass = ["share_error <= 0.1", "completion_order >= 1", "convergence_ms <= 100"]

[[tenants]]
name = "a"
min_mbps = 100
vms = [{ name = "a1", host = "h1" }, { name = "a2", host = "h1" }]

[[tenants]]
name = "b"
min_mbps = 50
vms = [{ name = "b1", host = "h1" }, { name = "b2", host = "h1" }]

[[workloads]]
name = "wa"
kind = "transfer"
bytes = 1000
from = "a1"
to = "a2"

[[workloads]]
name = "wb"
kind = "transfer"
bytes = 1000
from = "b1"
to = "b2"
"#;

fn transfer(name: &str, tenant: &str, series: Vec<u64>, done_ms: Option<u64>) -> WorkloadResult {
    let bytes: u64 = series.iter().sum();
    WorkloadResult {
        name: name.into(),
        tenant: tenant.into(),
        kind: WorkloadKind::Transfer,
        sent: 0,
        received: 0,
        received_bytes: bytes,
        active_ns: 1_000_000_000,
        latency: None,
        series,
        completion_ns: done_ms.map(|ms| ms * 1_000_000),
    }
}

#[test]
fn weighted_shares_convergence_and_completion_order() {
    let s = Scenario::parse(SHARES).unwrap();
    // 100 bins of 10 ms. a gets 2/3 from bin 30 on (before that an even split).
    let a: Vec<u64> = (0..100).map(|i| if i < 30 { 500 } else { 2000 }).collect();
    let b: Vec<u64> = (0..100).map(|i| if i < 30 { 500 } else { 1000 }).collect();
    let rep = vec![
        transfer("wa", "a", a, Some(600)),
        transfer("wb", "b", b, Some(900)),
    ];
    // Shares and convergence look at open-ended greedy workloads, not transfers.
    assert_eq!(share_error(&s, &rep), None);
    let bulk: Vec<WorkloadResult> = rep
        .iter()
        .map(|r| WorkloadResult {
            kind: WorkloadKind::TcpBulk,
            ..r.clone()
        })
        .collect();
    let err = share_error(&s, &bulk).unwrap();
    // a: 155000, b: 85000 of 240000; b's share 1/3 = 80000: error 5000 / 80000.
    assert!((err - 0.0625).abs() < 1e-9, "{err}");
    let conv = convergence_ms(&s, &bulk).unwrap();
    // The 50 ms average is within 20% from bin 28 on (mostly the new split).
    assert!((250.0..=300.0).contains(&conv), "{conv}");
    assert_eq!(completion_order(&s, &rep), Some(1.0));
    let swapped = vec![rep[0].clone(), transfer("wb", "b", vec![1; 100], Some(500))];
    assert_eq!(completion_order(&s, &swapped), Some(0.0));
    let unfinished = vec![rep[0].clone(), transfer("wb", "b", vec![1; 100], None)];
    assert_eq!(completion_order(&s, &unfinished), None);
    let m = ModeReport::new(&s, "bridge", true, vec![rep]).unwrap();
    assert_eq!(m.tenants["a"].completion_ms, Some(600.0));
    assert_eq!(m.metrics["completion_order"], 1.0);
    let summary = Summary::new(&s, &[m], None).unwrap();
    // No open-ended competitors: share_error and convergence_ms have no value and fail.
    assert_eq!(summary.checks[0].value, None);
    assert!(!summary.checks[0].pass && summary.checks[1].pass && !summary.checks[2].pass);
    assert!(summary.table().contains("metrics [bridge]"));
}

#[test]
fn scenario_metrics_parse_as_checks() {
    for m in [
        "share_error <= 0.1",
        "convergence_ms < 5",
        "t.completion_ms <= 900",
    ] {
        assert!(Check::parse(m).is_ok(), "{m}");
    }
}

#[test]
fn cpu_share_error_weighs_the_dataplanes_charges_like_share_error_weighs_rates() {
    let s = Scenario::parse(SHARES).unwrap();
    let bulk = |name: &str, tenant: &str| WorkloadResult {
        kind: WorkloadKind::TcpBulk,
        ..transfer(name, tenant, vec![1000; 10], None)
    };
    let rep = vec![bulk("wa", "a"), bulk("wb", "b")];
    let mut m = ModeReport::new(&s, "picnic", true, vec![rep.clone(), rep]).unwrap();
    // Guarantees 100:50; charged 500 and 400 ns: b's share is 300, off by 100/300.
    let cpu = |a: u64, b: u64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    m.add_cpu_share_error(&s, &[cpu(500, 400), cpu(600, 300)], &[]);
    // The median of 1/3 and 0 (600:300 is exact).
    let v = m.metrics["cpu_share_error"];
    assert!((v - 1.0 / 6.0).abs() < 1e-9, "{v}");
    // A dataplane that measures nothing leaves the metric out (its check then fails).
    let mut bridge = m.clone();
    bridge.metrics.clear();
    bridge.add_cpu_share_error(&s, &[BTreeMap::new(), BTreeMap::new()], &[]);
    assert!(!bridge.metrics.contains_key("cpu_share_error"));
}

#[test]
fn a_tenant_served_in_full_below_its_cpu_share_leaves_the_rest_to_the_others() {
    let s = Scenario::parse(SHARES).unwrap();
    let bulk = |name: &str, tenant: &str| WorkloadResult {
        kind: WorkloadKind::TcpBulk,
        ..transfer(name, tenant, vec![1000; 10], None)
    };
    let rep = vec![bulk("wa", "a"), bulk("wb", "b")];
    let cpu = |a: u64, b: u64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    let served = |t: &[&str]| t.iter().map(|t| t.to_string()).collect::<BTreeSet<_>>();
    let error = |used: BTreeMap<String, u64>, served: BTreeSet<String>| {
        let mut m = ModeReport::new(&s, "picnic", true, vec![rep.clone()]).unwrap();
        m.add_cpu_share_error(&s, &[used], &[served]);
        m.metrics["cpu_share_error"]
    };
    // Guarantees 100:50. b got 100 of 900 (its share is 300): unfair if it wanted more...
    assert!((error(cpu(800, 100), served(&[])) - 2.0 / 3.0).abs() < 1e-9);
    // ...fair if the dataplane dropped none of its frames: a keeps the rest.
    assert_eq!(error(cpu(800, 100), served(&["b"])), 0.0);
    // Served in full but above its share, it still counts: b used 400 against its 300.
    assert!((error(cpu(500, 400), served(&["b"])) - 1.0 / 3.0).abs() < 1e-9);
    // Both served below their shares: nothing is unfair.
    assert_eq!(error(cpu(800, 100), served(&["a", "b"])), 0.0);
}

#[test]
fn the_slo_verdict_is_the_switches_every_window_of_every_repetition() {
    use crate::SwitchSlo;
    let s = Scenario::parse(SCENARIO).unwrap();
    let mut report = modes(&s).remove(0);
    let judged = |windows, violated_windows| SwitchSlo {
        windows,
        violated_windows,
    };
    let rep = |v: SwitchSlo, x: Option<SwitchSlo>| {
        let mut m = std::collections::BTreeMap::new();
        m.insert("v".to_string(), v);
        if let Some(x) = x {
            m.insert("x".to_string(), x);
        }
        m
    };
    // v met in both repetitions; x violated one window of 30 in the second; nobody else.
    report.add_switch_slo(
        &s,
        &[
            rep(judged(30, 0), Some(judged(30, 0))),
            rep(judged(30, 0), Some(judged(30, 1))),
        ],
    );
    assert_eq!(report.tenants["v"].slo_met, Some(true));
    assert_eq!(report.tenants["x"].slo_met, Some(false));
    // Judged in no window: no verdict of met.
    report.add_switch_slo(&s, &[rep(judged(0, 0), None)]);
    assert_eq!(report.tenants["v"].slo_met, Some(false));
    assert_eq!(report.tenants["x"].slo_met, None);
}

#[test]
fn an_mtu_beyond_the_switchs_frame_buffers_is_refused_with_the_reason() {
    let jumbo = SCENARIO.replacen("name = ", "mtu = 9000\nname = ", 1);
    let e = Scenario::parse(&jumbo).unwrap_err().to_string();
    assert!(e.contains("mtu") && e.contains("jumbo"), "{e}");
    let most = SCENARIO.replacen("name = ", "mtu = 1900\nname = ", 1);
    assert_eq!(Scenario::parse(&most).unwrap().mtu, 1900);
}
