//! The API over an in-memory switch: routes, limits, auth, metrics.

use etherparse::PacketBuilder;
use picnic_core::{Duration, Instant};

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use tiny_http::Method;

use super::*;
use crate::config::{Config, SwitchSection};
use crate::engine::{Engine, Work};
use crate::frame::{Frame, FramePool};
use crate::runner::{Command, CommandSender, Published};
use metrics::Format;

struct NoWork;
impl Work for NoWork {
    fn process(&mut self, _tenant: usize, _frame: &mut Frame) -> u64 {
        0
    }
}

fn udp(src: ([u8; 6], [u8; 4]), dst: ([u8; 6], [u8; 4])) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(src.0, dst.0)
        .ipv4(src.1, dst.1, 64)
        .udp(40000, 7)
        .write(&mut out, &[0u8; 100])
        .unwrap();
    out
}

/// The shipped example (blue and red hold SLOs) after 300 ms in which blue1 sent only
/// spoofed frames (policy drops, not its loss) and was sent twice its `max_pps` of 1000 by
/// blue2 (its loss), and red1 sent a steady flow to red2.
fn shared() -> Shared {
    let mut cfg = Config::parse(include_str!("../../../../examples/host1.toml")).unwrap();
    cfg.vms[0].max_pps = Some(1_000);
    let mut engine = Engine::new(&cfg, Instant::ZERO).unwrap();
    let mut pool = FramePool::new(1024);
    let blue1 = ([2, 0, 0, 0, 0, 1], [198, 18, 0, 1]);
    let red1 = ([2, 0, 0, 0, 0, 2], [198, 18, 0, 2]);
    let spoofed = udp(
        (blue1.0, [10, 0, 0, 9]),
        ([2, 0, 0, 0, 0, 3], [198, 18, 0, 3]),
    );
    let to_red2 = udp(red1, ([2, 0, 0, 0, 0, 4], [198, 18, 0, 4]));
    let blue2 = ([2, 0, 0, 0, 0, 3], [198, 18, 0, 3]);
    let outer = picnic_wire::OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: [198, 19, 0, 2].into(),
        dst_ip: [198, 19, 0, 1].into(),
        src_port: 50000,
        ttl: 64,
    };
    let inner = udp(blue2, blue1);
    let mut to_blue1 = vec![0u8; inner.len() + picnic_wire::ENCAP_OVERHEAD];
    let len = picnic_wire::encap(
        &outer,
        &picnic_wire::GeneveRepr::ethernet(100),
        &inner,
        &mut to_blue1,
    )
    .unwrap();
    to_blue1.truncate(len);
    let uplink = crate::directory::UPLINK;
    for ms in 0..300 {
        let now = Instant::ZERO + Duration::from_millis(ms);
        let frames = [
            (1, &spoofed),
            (2, &to_red2),
            (uplink, &to_blue1),
            (uplink, &to_blue1),
        ];
        for (port, bytes) in frames {
            let mut f = pool.get().unwrap();
            assert!(f.fill_from(bytes));
            engine.on_frames(now, port, &mut vec![f], &mut pool);
        }
        engine.poll(now, 64, &mut NoWork, &mut pool);
        for port in [0, 1] {
            for f in engine.tx_queue(port).drain(..) {
                pool.put(f);
            }
        }
    }
    let now = Instant::ZERO + Duration::from_millis(300);
    let shared = Shared::default();
    shared.set_config(cfg);
    shared.publish(Published {
        switch: engine.snapshot(),
        ports: Vec::new(),
        pool_free: pool.available(),
        pool_capacity: pool.capacity(),
        accel: None,
        workers: Vec::new(),
        slo: engine.slo_report(now),
    });
    shared
}

/// The API's state over `shared`, with a stand-in for the run loop that applies every
/// change (publishes the new config) and says so.
fn api_state(shared: Shared, state_file: Option<PathBuf>) -> ApiState {
    let shared = Arc::new(shared);
    let (commands, rx) = mpsc::channel::<Command>();
    let applied = shared.clone();
    std::thread::spawn(move || {
        for Command::Reconfigure(change, reply) in rx {
            applied.set_config(change.into_config());
            let _ = reply.send(Ok(()));
        }
    });
    ApiState {
        shared,
        commands: CommandSender::new(commands),
        token: None,
        state_file,
    }
}

fn get(shared: &Shared, url: &str) -> Reply {
    let state = api_state(Shared::default(), None);
    state.shared.set_config((*shared.config().unwrap()).clone());
    if let Some(p) = shared.latest() {
        state.shared.publish((*p).clone());
    }
    handle(&state, &Method::Get, url, "")
}

#[test]
fn get_slo_shows_each_tenants_state_violations_and_why() {
    let shared = shared();
    let (status, _, body) = get(&shared, "/slo");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["window_ms"], 100);
    let blue = &v["tenants"][0];
    assert_eq!(blue["tenant"], "blue");
    assert_eq!(blue["met"], false);
    assert_eq!(blue["violated"], serde_json::json!(["loss"]));
    assert_eq!(blue["open_violations"][0]["kind"], "loss");
    assert_eq!(blue["open_violations"][0]["started_at"], 0);
    assert_eq!(
        blue["open_violations"][0]["ended_at"],
        serde_json::Value::Null
    );
    assert_eq!(blue["violations_total"]["loss"], 1);
    // The spoofed frames are in the breakdown, not in the loss; the frames over blue1's
    // packet rate are both.
    assert_eq!(blue["why"]["drops"]["spoofed"], 300);
    // 600 frames in 300 ms at 1000/s: 300 and the bucket's burst pass, the rest is dropped.
    let over_rate = blue["why"]["drops"]["pps_limit"].as_u64().unwrap();
    assert!((200..=260).contains(&over_rate), "{over_rate}");
    assert_eq!(blue["totals"]["lost_packets"], over_rate);
    assert_eq!(
        blue["totals"]["delivered_packets"].as_u64().unwrap() + over_rate,
        600
    );
    assert_eq!(blue["slo"]["latency_percentile"], 99.9);
    let red = &v["tenants"][1];
    assert_eq!(
        (red["tenant"].as_str(), red["met"].as_bool()),
        (Some("red"), Some(true))
    );
    assert_eq!(red["violated"], serde_json::json!([]));
    assert_eq!(red["totals"]["delivered_packets"], 300);
    assert_eq!(red["window"]["start_ns"], 300_000_000);

    // /stats is unchanged by it.
    let (status, _, stats) = get(&shared, "/stats");
    assert_eq!(status, 200);
    assert!(!serde_json::from_str::<serde_json::Value>(&stats).unwrap()["slo"].is_object());
}

/// A writer that blocks (a scrape whose client reads slowly) until told to go on.
struct StalledClient {
    started: mpsc::Sender<()>,
    go_on: mpsc::Receiver<()>,
    stalled: bool,
}
impl std::io::Write for StalledClient {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.stalled {
            self.stalled = true;
            let _ = self.started.send(());
            let _ = self.go_on.recv();
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_stalled_scrape_does_not_hold_up_the_dataplanes_publish() {
    let shared = Arc::new(shared());
    let (started_tx, started) = mpsc::channel();
    let (go_on, go_on_rx) = mpsc::channel();
    // A scrape that took the snapshot and is stuck serializing it to its client.
    let scrape = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let snapshot = shared.latest().unwrap();
            let client = StalledClient {
                started: started_tx,
                go_on: go_on_rx,
                stalled: false,
            };
            serde_json::to_writer(client, &*snapshot).unwrap();
            snapshot.switch.host_id
        })
    };
    started.recv().unwrap();
    // Meanwhile the dataplane publishes, from another thread, without waiting for it.
    let (done_tx, done) = mpsc::channel();
    let publisher = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let mut next = (*shared.latest().unwrap()).clone();
            next.switch.host_id = 42;
            shared.publish(next);
            done_tx.send(()).unwrap();
        })
    };
    // Generous: a publish that waited for the scrape would never finish, it is held.
    assert!(
        done.recv_timeout(std::time::Duration::from_secs(30))
            .is_ok(),
        "publish blocked behind a held scrape"
    );
    publisher.join().unwrap();
    assert_eq!(shared.latest().unwrap().switch.host_id, 42);
    go_on.send(()).unwrap();
    // The scrape finished with the snapshot it started with.
    assert_eq!(scrape.join().unwrap(), 1);
}

#[test]
fn metrics_carry_the_slo_state_per_tenant() {
    let (status, _, text) = get(&shared(), "/metrics");
    assert_eq!(status, 200);
    for line in [
        "picnic_tenant_slo_met{tenant=\"blue\"} 0",
        "picnic_tenant_slo_met{tenant=\"red\"} 1",
        "picnic_tenant_slo_violated{tenant=\"blue\",kind=\"loss\"} 1",
        "picnic_tenant_slo_violations_total{tenant=\"blue\",kind=\"loss\"} 1",
        "picnic_tenant_slo_violations_total{tenant=\"red\",kind=\"loss\"} 0",
        "picnic_tenant_drops_total{tenant=\"blue\",reason=\"spoofed\"} 300",
        "picnic_tenant_waited_frames_total{tenant=\"red\",queue=\"limiter\"} 0",
        "picnic_tenant_late_frames_total{tenant=\"red\",queue=\"egress_queue\"} 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

/// The value of the sample `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn metrics_are_classic_by_default_and_openmetrics_when_asked() {
    let state = api_state(shared(), None);
    let origin = super::Origin {
        from: "test".into(),
        agent: "-".into(),
    };
    let get = |format| super::route(&state, &Method::Get, "/metrics", "", format, &origin);
    let (status, content_type, classic) = get(Format::Classic);
    assert_eq!(
        (status, content_type),
        (200, "text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(classic.contains("# TYPE picnic_vm_rx_packets_total counter\n"));
    assert!(classic.contains("# TYPE picnic_vm_cpu_seconds_total counter\n"));
    assert!(!classic.contains("# EOF"));
    let (_, content_type, open) = get(Format::OpenMetrics);
    assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"));
    assert!(open.contains("# TYPE picnic_vm_rx_packets counter\n"));
    assert!(open.ends_with("# EOF\n"));
    // The same samples in both.
    let samples = |t: &str| {
        let mut v: Vec<String> = t
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    assert_eq!(samples(&classic), samples(&open));
    // No unit but seconds and bytes in a name.
    for bad in ["_ns", "_us", "_bps", "_ms"] {
        assert!(
            !classic
                .lines()
                .any(|l| l.split(['{', ' ']).next().unwrap().contains(bad)),
            "a name with {bad}"
        );
    }
}

#[test]
fn the_ingress_wait_histogram_counts_every_frame_delivered_through_the_queue() {
    let (_, _, text) = get(&shared(), "/metrics");
    let blue1 = "{tenant=\"blue\",vm=\"blue1\"}";
    let count = sample(
        &text,
        &format!("picnic_vm_ingress_wait_seconds_count{blue1}"),
    );
    let delivered = sample(&text, &format!("picnic_vm_rx_packets_total{blue1}"));
    assert!(delivered > 0.0);
    assert_eq!(count, delivered);
    let inf = "{le=\"+Inf\",tenant=\"blue\",vm=\"blue1\"}";
    assert_eq!(
        sample(
            &text,
            &format!("picnic_vm_ingress_wait_seconds_bucket{inf}")
        ),
        count
    );
    // Cumulative buckets never fall; the sum lies within what the buckets allow.
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with("picnic_vm_ingress_wait_seconds_bucket{le="))
        .filter(|l| l.contains(",tenant=\"blue\",vm=\"blue1\"}"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    assert_eq!(buckets.len(), 24, "{buckets:?}");
    assert!(buckets
        .windows(2)
        .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    let sum = sample(&text, &format!("picnic_vm_ingress_wait_seconds_sum{blue1}"));
    let upper: f64 = buckets[..23]
        .iter()
        .scan(0.0, |prev, &(le, n)| {
            let here = (n - *prev) * le;
            *prev = n;
            Some(here)
        })
        .sum();
    assert_eq!(buckets[22].1, count, "no wait of 4 s or more here");
    assert!(
        sum >= 0.0 && sum <= upper,
        "sum {sum} above the buckets' bound {upper}"
    );
}

#[test]
fn the_classic_exposition_passes_promtool() {
    let (_, _, text) = get(&shared(), "/metrics");
    let Some(problems) = promtool_check(&text) else {
        println!("skipped: promtool not found (Debian's prometheus package; scripts/setup.sh)");
        return;
    };
    assert!(problems.is_empty(), "promtool check metrics:\n{problems}");
}

/// `promtool check metrics` of `text`: its complaints (empty when it passes); None without
/// promtool.
fn promtool_check(text: &str) -> Option<String> {
    use std::io::Write;
    use std::process::{Command as Cmd, Stdio};
    let mut child = Cmd::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(if out.status.success() {
        String::new()
    } else {
        said
    })
}

#[test]
fn a_tenant_with_a_bad_slo_is_refused_naming_the_field() {
    let body = r#"{"name": "green", "vni": 300, "slo": {"min_bps": 10, "max_loss": 2.0}}"#;
    let state = api_state(shared(), None);
    let (status, _, text) = handle(&state, &Method::Post, "/tenants", body);
    assert_eq!(status, 400);
    assert!(text.contains("max_loss must be a fraction"), "{text}");
}

#[test]
fn an_offload_program_is_attached_checked_and_detached() {
    let state = api_state(shared(), None);
    let name = state.shared.config().unwrap().tenants[0].name.clone();
    let url = format!("/tenants/{name}/offload");
    let put = |body: &str| handle(&state, &Method::Put, &url, body);
    let acl = include_str!("../../../../examples/offload/acl.wat");
    let body = serde_json::json!({ "wat": acl, "fuel_per_packet": 5000 }).to_string();
    let (status, _, text) = put(&body);
    assert_eq!(status, 200, "{text}");
    let entry = state.shared.config().unwrap().tenants[0]
        .offload
        .clone()
        .unwrap();
    assert_eq!((entry.fuel_per_packet, entry.memory_kib), (5000, 1024));
    for (body, field) in [
        (r#"{"program": "/etc/passwd"}"#, "body.program"),
        (r#"{"wat": "(module)"}"#, "neither `egress` nor `ingress`"),
        (r#"{"wat": "(module", "memory_kib": 1}"#, "body: program"),
        (
            r#"{"wat": "(module)", "fuel_per_packet": 0}"#,
            "body.fuel_per_packet",
        ),
    ] {
        let (status, _, text) = put(body);
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(field), "{body}: {text}");
    }
    let delete = || handle(&state, &Method::Delete, &url, "");
    assert_eq!(delete().0, 200);
    assert!(state.shared.config().unwrap().tenants[0].offload.is_none());
    assert_eq!(delete().0, 404);
    let (status, _, _) = handle(&state, &Method::Put, "/tenants/nobody/offload", &body);
    assert_eq!(status, 404);
}

/// A VM entry for the example's tenant blue on host 2, as JSON with `extra` fields.
fn vm_json(extra: &str) -> String {
    format!(
        r#"{{"name": "blue9", "id": 9, "tenant": "blue", "host": 2, "mac": "02:00:00:00:00:09", "ip": "198.18.0.9"{extra}}}"#
    )
}

#[test]
fn every_bad_request_is_a_4xx_naming_the_field() {
    let state = api_state(shared(), None);
    let cases: [(Method, &str, String, u16, &str); 13] = [
        (
            Method::Post,
            "/vms",
            vm_json(r#", "min_mbps": "fast""#),
            400,
            "body.min_mbps",
        ),
        (
            Method::Post,
            "/vms",
            vm_json(r#", "colour": 1"#),
            400,
            "colour",
        ),
        (
            Method::Post,
            "/vms",
            r#"{"name": "x"}"#.into(),
            400,
            "missing field `id`",
        ),
        (
            Method::Post,
            "/vms",
            vm_json("").replace("02:00:00:00:00:09", "zz"),
            400,
            "body.mac",
        ),
        (Method::Post, "/vms", "[1, 2".into(), 400, "body"),
        (
            Method::Post,
            "/vms",
            vm_json("").replace("\"id\": 9", "\"id\": 1"),
            400,
            "vms[4].id",
        ),
        (Method::Put, "/vms/nobody", vm_json(""), 400, "body.name"),
        (
            Method::Put,
            "/vms/blue9",
            vm_json(""),
            404,
            "path: no VM 'blue9'",
        ),
        (
            Method::Put,
            "/tenants/blue",
            r#"{"name": "red", "vni": 7}"#.into(),
            400,
            "body.name",
        ),
        (
            Method::Put,
            "/tenants/green",
            r#"{"name": "green", "vni": 7}"#.into(),
            404,
            "path: no tenant 'green'",
        ),
        (
            Method::Delete,
            "/tenants/blue",
            String::new(),
            409,
            "path: tenant 'blue'",
        ),
        (
            Method::Delete,
            "/hosts/two",
            String::new(),
            400,
            "path: 'two'",
        ),
        (
            Method::Patch,
            "/vms",
            String::new(),
            404,
            "path: no route PATCH /vms",
        ),
    ];
    for (method, url, body, status, names) in cases {
        let (got, _, text) = handle(&state, &method, url, &body);
        assert_eq!(got, status, "{method} {url} {body}: {text}");
        assert!(
            text.contains(names),
            "{method} {url}: '{text}' should name '{names}'"
        );
    }
    // Nothing was applied; a good request still is.
    assert_eq!(state.shared.config().unwrap().vms.len(), 4);
    let (status, _, text) = handle(&state, &Method::Post, "/vms", &vm_json(""));
    assert_eq!(status, 200, "{text}");
    assert_eq!(state.shared.config().unwrap().vms.len(), 5);
}

#[test]
fn every_applied_change_is_persisted_before_the_reply() {
    let dir = std::env::temp_dir().join(format!("picnic-api-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let _ = std::fs::remove_file(&path);
    let state = api_state(shared(), Some(path.clone()));
    let (status, _, _) = handle(&state, &Method::Post, "/vms", &vm_json(""));
    assert_eq!(status, 200);
    let (status, _, _) = handle(&state, &Method::Delete, "/vms/red2", "");
    assert_eq!(status, 200);
    // A refused change leaves the file alone.
    let (status, _, _) = handle(&state, &Method::Delete, "/vms/red2", "");
    assert_eq!(status, 404);
    let file_cfg = Config::parse(include_str!("../../../../examples/host1.toml")).unwrap();
    let restored = crate::persist::restore(file_cfg, &path).unwrap();
    let names: Vec<&str> = restored.vms.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["blue1", "red1", "blue2", "blue9"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_host_is_replaced_by_put_and_the_path_must_name_it() {
    let state = api_state(shared(), None);
    let host = r#"{"id": 2, "underlay_ip": "198.19.0.22", "mac": "02:00:00:00:01:22"}"#;
    let (status, _, text) = handle(&state, &Method::Put, "/hosts/2", host);
    assert_eq!(status, 200, "{text}");
    let (_, _, hosts) = handle(&state, &Method::Get, "/hosts", "");
    assert!(hosts.contains("198.19.0.22"), "{hosts}");
    let (status, _, text) = handle(&state, &Method::Put, "/hosts/3", host);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("body.id"), "{text}");
    let host9 = host.replace("\"id\": 2", "\"id\": 9");
    let (status, _, text) = handle(&state, &Method::Put, "/hosts/9", &host9);
    assert_eq!(status, 404, "{text}");
}

/// Sends one raw HTTP/1.1 request on `stream`; returns (status, body).
fn http<S: std::io::Read + std::io::Write>(
    mut stream: S,
    request_line: &str,
    headers: &str,
    body: &[u8],
) -> (u16, String) {
    let head = format!(
        "{request_line} HTTP/1.1\r\nHost: picnic\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let _ = stream.write_all(body);
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn section(api: &str, token_file: Option<&Path>) -> SwitchSection {
    let mut cfg = Config::parse(include_str!("../../../../examples/host1.toml")).unwrap();
    cfg.switch.api = Some(api.into());
    cfg.switch.api_token_file = token_file.map(Path::to_path_buf);
    cfg.switch
}

#[test]
fn the_unix_socket_is_owner_only_and_bodies_are_bounded() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;
    let dir = std::env::temp_dir().join(format!("picnic-api-unix-{}", std::process::id()));
    let path = dir.join("api.sock");
    // A socket left behind by a killed switch is replaced.
    std::fs::create_dir_all(&dir).unwrap();
    drop(UnixListener::bind(&path).unwrap());
    let state = api_state(shared(), None);
    let api = spawn(
        &section(path.to_str().unwrap(), None),
        state.shared.clone(),
        state.commands.clone(),
    )
    .unwrap();
    assert_eq!(api.listening, format!("unix:{}", path.display()));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let connect = || UnixStream::connect(&path).unwrap();
    let (status, body) = http(connect(), "GET /stats", "", b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"host_id\": 1"));
    let big = vec![b' '; MAX_BODY + 1];
    let (status, body) = http(connect(), "POST /vms", "", &big);
    assert_eq!(status, 413);
    assert!(body.contains("body: larger than 65536 bytes"), "{body}");
    let (status, body) = http(connect(), "POST /vms", "", &[0xff, 0xfe]);
    assert_eq!(
        (status, body.contains("body: not UTF-8")),
        (400, true),
        "{body}"
    );
    let long = format!("GET /{}", "x".repeat(MAX_URL));
    assert_eq!(http(connect(), &long, "", b"").0, 414);
    // Anything but a socket at the path is left alone and refused.
    let file = dir.join("not-a-socket");
    std::fs::write(&file, "keep").unwrap();
    let e = spawn(
        &section(file.to_str().unwrap(), None),
        state.shared.clone(),
        state.commands.clone(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("switch.api") && e.contains("not a socket"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tcp_needs_the_bearer_token() {
    use std::net::TcpStream;
    let dir = std::env::temp_dir().join(format!("picnic-api-tcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret-token-0123456789\n").unwrap();
    // Without a token file: refused, by validation and by spawn.
    let mut cfg = Config::parse(include_str!("../../../../examples/host1.toml")).unwrap();
    cfg.switch.api = Some("tcp:127.0.0.1:0".into());
    assert_eq!(cfg.validate().unwrap_err().field, "switch.api_token_file");
    let state = api_state(shared(), None);
    assert!(spawn(&cfg.switch, state.shared.clone(), state.commands.clone()).is_err());
    std::fs::write(dir.join("short"), "abc").unwrap();
    let e = spawn(
        &section("tcp:127.0.0.1:0", Some(&dir.join("short"))),
        state.shared.clone(),
        state.commands.clone(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("switch.api_token_file"), "{e}");
    let api = spawn(
        &section("tcp:127.0.0.1:0", Some(&token_file)),
        state.shared.clone(),
        state.commands.clone(),
    )
    .unwrap();
    let addr = api.listening.strip_prefix("http://").unwrap().to_string();
    let connect = || TcpStream::connect(&addr).unwrap();
    for headers in [
        "",
        "Authorization: Bearer wrong-token-0123456789\r\n",
        "Authorization: s3cret-token-0123456789\r\n",
    ] {
        let (status, body) = http(connect(), "GET /config", headers, b"");
        assert_eq!(status, 401, "{headers}: {body}");
        assert!(body.contains("header Authorization"), "{body}");
    }
    let (status, body) = http(
        connect(),
        "GET /config",
        "Authorization: Bearer s3cret-token-0123456789\r\n",
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn key_rotation_installs_then_activates_and_never_shows_a_key() {
    let mut cfg = (*shared().config().unwrap()).clone();
    let t = &mut cfg.tenants[0];
    let name = t.name.clone();
    t.encrypt = true;
    t.key = Some("00112233445566778899aabbccddeeff".into());
    cfg.accel.workers = 1;
    cfg.accel.per_job_ns = Some(400);
    cfg.accel.per_byte_ps = Some(1000);
    let accel = crate::accel::Accel::from_config(&cfg, 1).unwrap().unwrap();
    let state = api_state(Shared::default(), None);
    state.shared.set_config(cfg);
    state.shared.set_accel_keys(Some(accel.keys()));
    let url = format!("/tenants/{name}/key");
    let put = |body: &str| handle(&state, &Method::Put, &url, body);
    let new_key = "ffeeddccbbaa99887766554433221100";
    let (status, _, body) = put(&format!(r#"{{"epoch": 2, "key": "{new_key}"}}"#));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["sending_epoch"], 1, "installed, not yet sealing: {v}");
    assert_eq!(v["keys"].as_array().unwrap().len(), 2);
    let (status, _, body) = put(r#"{"epoch": 2, "activate": true}"#);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["sending_epoch"], 2, "{v}");
    assert!(!body.contains(new_key), "a key is shown: {body}");
    // Refusals name what is wrong.
    for (body, want) in [
        (r#"{"epoch": 3, "key": "zz"}"#, "body.key"),
        (r#"{"epoch": 3}"#, "body.key"),
        (
            r#"{"epoch": 2, "key": "00000000000000000000000000000000"}"#,
            "epoch 2 is in use",
        ),
        (r#"{"epoch": 9, "activate": true}"#, "no key of epoch 9"),
    ] {
        let (status, _, text) = put(body);
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(want), "{body}: {text}");
    }
    let (status, _, text) = handle(&state, &Method::Get, "/tenants/nobody/key", "");
    assert_eq!(status, 400, "{text}");
    let (_, _, config) = handle(&state, &Method::Get, "/config", "");
    assert!(
        config.contains("(redacted)") && !config.contains("00112233"),
        "{config}"
    );
}
