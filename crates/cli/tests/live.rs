//! Live changes under load (issue 15): a switch (the `picnic` binary) runs in a network
//! namespace; a neighbour's UDP flow a1 -> a2 (tenant t) runs through it for a quiet phase
//! and then while tenant u is changed over the API 100 times a second (b1's guarantee, u's
//! SLO, b1 removed and added back). Asserted: the neighbour loses no frame in either phase,
//! the changes are all applied, and the frame pool's free count is back to its capacity once
//! the queues drain. Measured and printed, not asserted (timing on a shared machine): the
//! neighbour's throughput and p99 latency under churn relative to the quiet phase.
//! Run with one loop and with two workers (the neighbour's flow then crosses from one worker
//! to the other, and b1's port is handed to a worker while both run).
//! Needs root (namespaces, AF_PACKET); skips and says so otherwise.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfPacketOptions, AfPacketPort, Port};
use picnic_wire::etherparse::PacketBuilder;

mod common;
use common::{api, is_root, wait_for_api, KillOnDrop, Netns};

const A1_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const A2_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// The neighbour's rate, frames/s, and each phase's length.
const RATE: u64 = 2_000;
const PHASE: Duration = Duration::from_secs(3);

fn config(dir: &Path, workers: usize) -> String {
    format!(
        r#"
[switch]
host_id = 1
workers = {workers}
api = "{dir}/api.sock"
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
# Only for its latency through the switch, which its SLO monitor measures.
slo = {{ latency_us = 1000 }}
[[tenants]]
name = "u"
vni = 200
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
[[vms]]
name = "b1"
id = 3
tenant = "u"
host = 1
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
port = {{ ifname = "b1" }}
"#,
        dir = dir.display()
    )
}

fn b1_json(min_mbps: u64) -> String {
    format!(
        r#"{{"name": "b1", "id": 3, "tenant": "u", "host": 1, "mac": "02:00:00:00:00:03", "ip": "198.18.0.3", "min_mbps": {min_mbps}, "port": {{"ifname": "b1"}}}}"#
    )
}

/// The churn's cycle of changes to tenant u: (method, path, body).
fn churn_step(i: usize) -> (&'static str, &'static str, String) {
    match i % 6 {
        0 => ("PUT", "/vms/b1", b1_json(300)),
        1 => ("PUT", "/vms/b1", b1_json(100)),
        2 => (
            "PUT",
            "/tenants/u",
            r#"{"name": "u", "vni": 200, "slo": {"max_loss": 0.5}}"#.into(),
        ),
        3 => ("PUT", "/tenants/u", r#"{"name": "u", "vni": 200}"#.into()),
        4 => ("DELETE", "/vms/b1", String::new()),
        _ => ("POST", "/vms", b1_json(100)),
    }
}

/// A frame a1 -> a2 carrying its sequence number and send time (ns since `base`).
fn frame(seq: u64, base: Instant) -> Vec<u8> {
    let mut payload = seq.to_be_bytes().to_vec();
    payload.extend((base.elapsed().as_nanos() as u64).to_be_bytes());
    let mut out = Vec::new();
    PacketBuilder::ethernet2(A1_MAC, A2_MAC)
        .ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
        .udp(40000, 7)
        .write(&mut out, &payload)
        .unwrap();
    out
}

/// What a phase of the neighbour's flow saw: frames sent, received and their latencies.
struct Phase {
    sent: u64,
    latencies: Vec<u64>,
    secs: f64,
}

impl Phase {
    fn pps(&self) -> f64 {
        self.latencies.len() as f64 / self.secs
    }
    fn p99_us(&mut self) -> f64 {
        self.latencies.sort_unstable();
        self.latencies[self.latencies.len() * 99 / 100] as f64 / 1e3
    }
}

/// Sends the neighbour's flow at [`RATE`] for [`PHASE`] while `during` runs (on this thread's
/// sibling), and receives it on a2's side until 200 ms after the last frame.
fn phase(a1v: &mut AfPacketPort, a2v: &mut AfPacketPort, during: impl FnOnce() + Send) -> Phase {
    let base = Instant::now();
    let done = AtomicBool::new(false);
    let mut pool = FramePool::new(1024);
    let mut phase = Phase {
        sent: 0,
        latencies: Vec::new(),
        secs: PHASE.as_secs_f64(),
    };
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut pool = FramePool::new(1024);
            let mut got: Vec<Frame> = Vec::new();
            let mut latencies = Vec::new();
            let mut quiet_since = None;
            loop {
                a2v.recv_batch(&mut pool, &mut got, 64).unwrap();
                for f in got.drain(..) {
                    let d = f.data();
                    if d.len() >= 58 && d[6..12] == A1_MAC {
                        let sent = u64::from_be_bytes(d[50..58].try_into().unwrap());
                        latencies.push((base.elapsed().as_nanos() as u64).saturating_sub(sent));
                    }
                    pool.put(f);
                }
                if done.load(Ordering::Relaxed) {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_millis(200) {
                        return latencies;
                    }
                }
                // Blocks until a frame arrives (at most 10 ms), so that the latency measured is
                // the switch's and the wake-up's, not a polling period's.
                let mut fd = libc::pollfd {
                    fd: a2v.raw_fd().expect("AF_PACKET port"),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut fd, 1, 10) };
            }
        });
        s.spawn(during);
        let period = Duration::from_nanos(1_000_000_000 / RATE);
        while base.elapsed() < PHASE {
            let due = base + period * phase.sent as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let mut f = pool.get().unwrap();
            assert!(f.fill_from(&frame(phase.sent, base)));
            let mut batch = vec![f];
            a1v.send_batch(&mut batch, &mut pool).unwrap();
            for f in batch.drain(..) {
                pool.put(f);
            }
            phase.sent += 1;
        }
        done.store(true, Ordering::Relaxed);
        phase.latencies = receiver.join().unwrap();
    });
    phase
}

/// The neighbour tenant t's p99 latency through the switch since it started, us (its SLO
/// monitor's, from the frame's arrival in the port's ring to its hand-over to a2's port),
/// once the last frames are counted (the report is published every 100 ms).
fn in_switch_latency(sock: &Path) -> f64 {
    std::thread::sleep(Duration::from_millis(200));
    let (status, body) = api(sock, "GET", "/slo", "");
    assert_eq!(status, 200, "{body}");
    let slo: serde_json::Value = serde_json::from_str(&body).unwrap();
    let t = &slo["tenants"][0];
    assert_eq!(t["tenant"], "t");
    t["totals"]["latency_p99_us"].as_f64().unwrap()
}

/// The `pool_free` and `pool_capacity` of the switch's last published statistics.
fn pool(sock: &Path) -> (u64, u64) {
    let (status, body) = api(sock, "GET", "/stats", "");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        stats["pool_free"].as_u64().unwrap(),
        stats["pool_capacity"].as_u64().unwrap(),
    )
}

#[test]
fn a_neighbour_loses_nothing_while_another_tenant_changes_100_times_a_second() {
    if !is_root() {
        return;
    }
    // One after the other: both at once would share the machine's two cores.
    for workers in [1, 2] {
        neighbour_under_churn(workers);
    }
}

/// The test with `workers` dataplane workers.
fn neighbour_under_churn(workers: usize) {
    let dir = std::env::temp_dir().join(format!("picnic-live-{}-{workers}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("host1.toml");
    std::fs::write(&cfg, config(&dir, workers)).unwrap();
    let sock = dir.join("api.sock");
    let veths = [("up0", "up0p"), ("a1", "a1v"), ("a2", "a2v"), ("b1", "b1v")];
    let ns = Netns::new("live", &veths);
    ns.enter(|| {
        let mut a1v = AfPacketPort::open("a1v", AfPacketOptions::default()).unwrap();
        let mut a2v = AfPacketPort::open("a2v", AfPacketOptions::default()).unwrap();
        let _switch = KillOnDrop(ns.switch(&cfg));
        wait_for_api(&sock);

        let mut quiet = phase(&mut a1v, &mut a2v, || {});
        let in_switch_quiet = in_switch_latency(&sock);
        let mut applied = 0;
        let mut churned = phase(&mut a1v, &mut a2v, || {
            let start = Instant::now();
            let mut i = 0;
            while start.elapsed() < PHASE {
                let (method, path, body) = churn_step(i);
                let (status, text) = api(&sock, method, path, &body);
                assert_eq!(status, 200, "{method} {path}: {text}");
                i += 1;
                let due = start + Duration::from_millis(10) * i as u32;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            applied = i;
        });
        let in_switch_both = in_switch_latency(&sock);
        for (name, p) in [("quiet", &quiet), ("churned", &churned)] {
            assert_eq!(
                p.latencies.len() as u64,
                p.sent,
                "the neighbour lost frames in the {name} phase"
            );
        }
        // The queues drained: every frame is back in the pool (published every 100 ms).
        let end = Instant::now() + Duration::from_secs(2);
        let (mut free, capacity) = pool(&sock);
        while free != capacity && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
            free = pool(&sock).0;
        }
        assert_eq!(free, capacity, "frames missing from the pool");
        let changes_per_sec = applied as f64 / PHASE.as_secs_f64();
        assert!(changes_per_sec > 50.0, "only {changes_per_sec:.0} changes/s applied");
        let (q99, c99) = (quiet.p99_us(), churned.p99_us());
        println!(
            "{workers} worker(s): {applied} changes ({changes_per_sec:.0}/s); neighbour {} frames each phase, none lost; \
             throughput churned/quiet {:.3} ({:.0} vs {:.0} frames/s); p99 latency churned/quiet \
             {:.2} ({c99:.0} us vs {q99:.0} us); through the switch p99 {in_switch_quiet:.0} us quiet, \
             {in_switch_both:.0} us over both phases; pool {free}/{capacity} free after",
            quiet.sent,
            churned.pps() / quiet.pps(),
            churned.pps(),
            quiet.pps(),
            c99 / q99,
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}
