//! Operations (issue 33): a switch (the `picnic` binary) in a network namespace serves its
//! metrics on the namespace's loopback (`switch.metrics`) while tenant t's VM a1 sends 200
//! frames to a2. Asserted: the classic exposition passes `promtool check metrics` and counts
//! a1's frames; OpenMetrics is served when asked for; a real Prometheus (Debian's, started
//! in the namespace with a generated config) scrapes it and answers per-tenant queries
//! through its HTTP API, and runs every query of the Grafana dashboard; every live change
//! is logged with what changed and from where.
//! Needs root (namespaces, AF_PACKET), promtool and prometheus; skips and says so otherwise.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use picnic_switch::frame::FramePool;
use picnic_switch::port::{AfPacketOptions, AfPacketPort, Port};
use picnic_wire::etherparse::PacketBuilder;

mod common;
use common::{api, is_root, wait_for_api, KillOnDrop, Netns};

const METRICS: &str = "127.0.0.1:19464";
const PROMETHEUS: &str = "127.0.0.1:19090";
const FRAMES: u64 = 200;
const DASHBOARD: &str = include_str!("../../../packaging/grafana/picnic-switch.json");

fn config(dir: &Path) -> String {
    format!(
        r#"
[switch]
host_id = 1
workers = 1
api = "{dir}/api.sock"
metrics = "{METRICS}"
[uplink]
ifname = "up0"
# The engines' path, so that every series the dashboard draws has samples (the ingress
# waits, the SLO windows are the engines'); the kernel fast path's series are checked by
# promtool beside them.
[fastpath]
kernel = false
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
slo = {{ latency_us = 1000 }}
[[vms]]
name = "a1"
id = 1
tenant = "t"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = {{ ifname = "a1" }}
[[vms]]
name = "a2"
id = 2
tenant = "t"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = {{ ifname = "a2" }}
"#,
        dir = dir.display()
    )
}

/// `GET path` from `addr` over TCP: (head, body); empty when nothing answers.
fn http_get(addr: &str, path: &str, accept: &str) -> (String, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (String::new(), String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    if s.write_all(req.as_bytes()).is_err() || s.read_to_string(&mut out).is_err() {
        return (String::new(), String::new());
    }
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}

/// `text` percent-encoded for a URL's query.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the one series Prometheus answers `query` with, once it has one (at most
/// 20 s: Prometheus starting, then scraping every second).
fn prometheus_value(query: &str) -> f64 {
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < end {
        let path = format!("/api/v1/query?query={}", encode(query));
        let (_, body) = http_get(PROMETHEUS, &path, "application/json");
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) {
            if let Some(value) = v["data"]["result"][0]["value"][1].as_str() {
                return value.parse().unwrap();
            }
        }
        last = body;
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("Prometheus never answered {query}; last: {last}");
}

/// `promtool check metrics` of `text`: its complaints, empty when it passes.
fn promtool_check(text: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        return String::new();
    }
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn has(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        println!("skipped: {tool} not found (Debian's prometheus package; scripts/setup.sh)");
    }
    found
}

#[test]
fn prometheus_scrapes_the_switch_and_answers_per_tenant_queries() {
    if !is_root() || !has("promtool") || !has("prometheus") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("picnic-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("host1.toml");
    std::fs::write(&cfg, config(&dir)).unwrap();
    let prometheus_yml = dir.join("prometheus.yml");
    std::fs::write(
        &prometheus_yml,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
             - job_name: picnic\n    static_configs:\n      - targets: ['{METRICS}']\n"
        ),
    )
    .unwrap();
    let sock = dir.join("api.sock");
    let log = dir.join("switch.log");
    let ns = Netns::new("metrics", &[("up0", "up0p"), ("a1", "a1v"), ("a2", "a2v")]);
    ns.enter(|| {
        common::run(&["ip", "link", "set", "lo", "up"]);
        let mut a1v = AfPacketPort::open("a1v", AfPacketOptions::default()).unwrap();
        let mut switch = ns.switch_command(&cfg);
        switch.stderr(std::fs::File::create(&log).unwrap());
        let _switch = KillOnDrop(switch.spawn().unwrap());
        wait_for_api(&sock);

        // A live change, logged with what changed and from where.
        let slo = r#"{"name": "t", "vni": 100, "slo": {"latency_us": 2000}}"#;
        assert_eq!(api(&sock, "PUT", "/tenants/t", slo).0, 200);
        assert_eq!(api(&sock, "PUT", "/tenants/nobody", slo).0, 400);

        let mut pool = FramePool::new(64);
        for _ in 0..FRAMES {
            let mut out = Vec::new();
            PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                .ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
                .udp(40000, 7)
                .write(&mut out, &[0u8; 64])
                .unwrap();
            let mut f = pool.get().unwrap();
            assert!(f.fill_from(&out));
            let mut batch = vec![f];
            a1v.send_batch(&mut batch, &mut pool).unwrap();
            for f in batch.drain(..) {
                pool.put(f);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        // The loop publishes every 100 ms.
        std::thread::sleep(Duration::from_millis(300));

        let (head, text) = http_get(METRICS, "/metrics", "*/*");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        let problems = promtool_check(&text);
        assert!(problems.is_empty(), "promtool check metrics:\n{problems}");
        let a1 = "picnic_vm_tx_packets_total{tenant=\"t\",vm=\"a1\"} ";
        let sent: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(a1))
            .unwrap_or_else(|| panic!("{a1} missing"))
            .parse()
            .unwrap();
        assert!(sent >= FRAMES, "a1 sent {sent} of {FRAMES} frames");
        let (head, open) = http_get(METRICS, "/metrics", "application/openmetrics-text");
        assert!(head.contains("application/openmetrics-text"), "{head}");
        assert!(open.ends_with("# EOF\n"));
        let (head, _) = http_get(METRICS, "/stats", "*/*");
        assert!(head.starts_with("HTTP/1.1 404"), "{head}");

        let mut prometheus = Command::new("prometheus");
        prometheus
            .arg(format!("--config.file={}", prometheus_yml.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={PROMETHEUS}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _prometheus = KillOnDrop(prometheus.spawn().unwrap());
        let start = Instant::now();
        assert_eq!(prometheus_value("up{job=\"picnic\"}"), 1.0);
        let per_tenant = "sum by (tenant) (picnic_vm_tx_packets_total{tenant=\"t\"})";
        assert!(prometheus_value(per_tenant) >= FRAMES as f64);
        let waits = "sum by (tenant) (picnic_vm_ingress_wait_seconds_count{tenant=\"t\"})";
        assert!(prometheus_value(waits) >= FRAMES as f64);
        assert!(prometheus_value("picnic_tenant_slo_windows_total{tenant=\"t\"}") > 0.0);
        println!(
            "Prometheus scraped the switch and answered in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        // The dashboard's every query is valid PromQL to this Prometheus.
        let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap();
                let query = expr
                    .replace("$__rate_interval", "5s")
                    .replace("$instance", ".*")
                    .replace("$tenant", ".*");
                let path = format!("/api/v1/query?query={}", encode(&query));
                let (_, body) = http_get(PROMETHEUS, &path, "application/json");
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(v["status"], "success", "{query}: {body}");
            }
        }
    });
    let logged = std::fs::read_to_string(&log).unwrap();
    let applied = logged
        .lines()
        .find(|l| l.contains("live change applied"))
        .unwrap_or_else(|| panic!("no change logged:\n{logged}"));
    for what in [
        "from=unix socket",
        "request=PUT /tenants/t",
        "set tenant",
        "2000",
    ] {
        assert!(applied.contains(what), "{what} missing from: {applied}");
    }
    assert!(
        logged
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("live change refused")),
        "{logged}"
    );
    // Every line starts with its time (RFC 3339, UTC) and level.
    for line in logged.lines() {
        let (time, rest) = line.split_once(' ').unwrap();
        assert!(time.len() >= 20 && time.ends_with('Z'), "{line}");
        assert!(
            ["INFO", "WARN", "ERROR"]
                .iter()
                .any(|l| rest.trim_start().starts_with(l)),
            "{line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
