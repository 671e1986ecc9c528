//! State survives `kill -9`: a switch (the `picnic` binary) runs in a network namespace, a VM
//! is added over its API (Unix socket), traffic flows to it; the switch is killed with
//! SIGKILL and started again from the same config file: the VM is back from the state file
//! and traffic flows again. Prints how long that took (the bound asserted is 1 s).
//! Needs root (namespaces, AF_PACKET); skips and says so otherwise.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfPacketOptions, AfPacketPort, Port};
use picnic_wire::etherparse::PacketBuilder;

const A1_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const A2_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root for network namespaces and AF_PACKET");
    }
    root
}

fn run(argv: &[&str]) {
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `pn-t-*` namespace with veth pairs, deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let ns = Netns(format!("pn-t-restart-{}", std::process::id()));
        let _ = Command::new("ip").args(["netns", "del", &ns.0]).output();
        run(&["ip", "netns", "add", &ns.0]);
        for sysctl in ["all", "default"] {
            let key = format!("net.ipv6.conf.{sysctl}.disable_ipv6=1");
            run(&["ip", "netns", "exec", &ns.0, "sysctl", "-qw", &key]);
        }
        for (a, b) in [("up0", "up0p"), ("a1", "a1v"), ("a2", "a2v")] {
            run(&[
                "ip", "-n", &ns.0, "link", "add", a, "type", "veth", "peer", "name", b,
            ]);
            run(&["ip", "-n", &ns.0, "link", "set", a, "up"]);
            run(&["ip", "-n", &ns.0, "link", "set", b, "up"]);
        }
        ns
    }

    /// Runs `f` on a thread inside the namespace.
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).unwrap();
                // SAFETY: an open namespace descriptor; setns only affects this thread.
                let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(ret, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// `picnic switch --config cfg` inside the namespace (`ip netns exec` execs it, so the
    /// child is the switch itself and `kill` is SIGKILL to it).
    fn switch(&self, cfg: &Path) -> Child {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.0,
                env!("CARGO_BIN_EXE_picnic"),
                "switch",
            ])
            .arg("--config")
            .arg(cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// One HTTP request over the API socket: (status, body); status 0 when nothing answers.
fn api(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = UnixStream::connect(sock) else {
        return (0, String::new());
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: picnic\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    )
}

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

/// Waits until the API answers `GET /vms` (the switch is up), at most 10 s.
fn wait_for_api(sock: &Path) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = api(sock, "GET", "/vms", "");
        if status == 200 {
            return body;
        }
        assert!(Instant::now() < end, "the switch's API never answered");
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let ns = Netns::new();
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
