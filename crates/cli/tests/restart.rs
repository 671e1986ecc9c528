//! State survives `kill -9`: a switch (the `picnic` binary) runs in a network namespace, a VM
//! is added over its API (Unix socket), traffic flows to it; the switch is killed with
//! SIGKILL and started again from the same config file: the VM is back from the state file
//! and traffic flows again. Prints how long that took (the bound asserted is 1 s).
//! Needs root (namespaces, AF_PACKET); skips and says so otherwise.

use std::path::Path;
use std::time::{Duration, Instant};

use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfPacketOptions, AfPacketPort, Port};
use picnic_wire::etherparse::PacketBuilder;

const A1_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const A2_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

mod common;
use common::{api, is_root, wait_for_api, KillOnDrop, Netns};

fn udp_a1_to_a2(seq: u32) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(A1_MAC, A2_MAC)
        .ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
        .udp(40000, 7)
        .write(&mut out, &seq.to_be_bytes())
        .unwrap();
    out
}

/// Sends a1 -> a2 frames every millisecond from a1's VM side until one arrives on a2's VM
/// side or `limit` passes; returns how long that took from `since`.
fn first_delivery(
    from: &mut AfPacketPort,
    to: &mut AfPacketPort,
    pool: &mut FramePool,
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut got: Vec<Frame> = Vec::new();
    let mut seq = 0;
    while since.elapsed() < limit {
        let mut f = pool.get().unwrap();
        assert!(f.fill_from(&udp_a1_to_a2(seq)));
        seq += 1;
        let mut batch = vec![f];
        from.send_batch(&mut batch, pool).unwrap();
        for f in batch.drain(..) {
            pool.put(f);
        }
        std::thread::sleep(Duration::from_millis(1));
        to.recv_batch(pool, &mut got, 64).unwrap();
        let hit = got.iter().any(|f| {
            f.data().get(..6) == Some(&A2_MAC[..]) && f.data().get(6..12) == Some(&A1_MAC[..])
        });
        for f in got.drain(..) {
            pool.put(f);
        }
        if hit {
            return Some(since.elapsed());
        }
    }
    None
}

fn config(dir: &Path) -> String {
    format!(
        r#"
[switch]
host_id = 1
api = "{dir}/api.sock"
state_file = "{dir}/state.json"
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
[[vms]]
name = "a1"
id = 1
tenant = "t"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = {{ ifname = "a1" }}
"#,
        dir = dir.display()
    )
}

const A2_JSON: &str = r#"{"name": "a2", "id": 2, "tenant": "t", "host": 1, "mac": "02:00:00:00:00:02", "ip": "198.18.0.2", "port": {"ifname": "a2"}}"#;

#[test]
fn a_vm_added_over_the_api_survives_kill_9_and_traffic_resumes_within_1s() {
    if !is_root() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("picnic-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("host1.toml");
    std::fs::write(&cfg, config(&dir)).unwrap();
    let sock = dir.join("api.sock");
    let ns = Netns::new("restart", &[("up0", "up0p"), ("a1", "a1v"), ("a2", "a2v")]);
    ns.enter(|| {
        let mut pool = FramePool::new(1024);
        let mut a1v = AfPacketPort::open("a1v", AfPacketOptions::default()).unwrap();
        let mut a2v = AfPacketPort::open("a2v", AfPacketOptions::default()).unwrap();

        let mut first = KillOnDrop(ns.switch(&cfg));
        wait_for_api(&sock);
        let (status, body) = api(&sock, "POST", "/vms", A2_JSON);
        assert_eq!(status, 200, "{body}");
        let flowing = first_delivery(
            &mut a1v,
            &mut a2v,
            &mut pool,
            Instant::now(),
            Duration::from_secs(5),
        );
        assert!(flowing.is_some(), "no traffic a1 -> a2 after adding a2");

        // SIGKILL: no chance to clean up; the state file is all that is left.
        first.0.kill().unwrap();
        first.0.wait().unwrap();
        let state = std::fs::read_to_string(dir.join("state.json")).unwrap();
        assert!(state.contains("\"a2\""), "{state}");

        let restarted_at = Instant::now();
        let _second = KillOnDrop(ns.switch(&cfg));
        let resumed = first_delivery(
            &mut a1v,
            &mut a2v,
            &mut pool,
            restarted_at,
            Duration::from_secs(5),
        )
        .expect("no traffic a1 -> a2 after the restart");
        println!(
            "traffic a1 -> a2 flowed again {:.1} ms after the restart",
            resumed.as_secs_f64() * 1e3
        );
        let vms = wait_for_api(&sock);
        assert!(vms.contains("\"a2\""), "a2 is not back: {vms}");
        assert!(
            resumed < Duration::from_secs(1),
            "traffic resumed only after {resumed:?}"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}
