//! Scaffolding shared by the integration tests: the root tests of the port backends
//! (tests/ports.rs, tests/afxdp.rs: a `pn-t-*` network namespace guard with veth setup, the
//! skip-without-root check, builders and checks of numbered frames) and the in-memory switch
//! tests (a VM's UDP frame). Each test binary uses part of it.
#![allow(dead_code)]

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etherparse::PacketBuilder;
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{wait_readable, Port};

/// Experimental EtherType (IEEE 802 local use) marking the tests' frames.
const TEST_ETHERTYPE: [u8; 2] = [0x88, 0xb5];
/// Source MAC of the test frames.
pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
/// Destination MAC of the test frames (and the static neighbour's MAC in the TAP tests).
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

/// Whether the tests run as root; prints why a test skips when not.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root for network namespaces/AF_PACKET");
    }
    root
}

/// Whether the switch's eBPF programs were built (the build had clang); prints why a test
/// skips when not.
pub fn have_ebpf() -> bool {
    let built = picnic_switch::ebpf::programs_built();
    if !built {
        println!("skipped: the eBPF programs were not built (no clang; scripts/setup.sh)");
    }
    built
}

/// A network namespace (`pn-t-*`) that exists for the guard's lifetime.
pub struct Netns {
    /// The namespace's name (`ip netns` / `ip -n`).
    pub name: String,
}

impl Netns {
    /// Creates a fresh namespace with `lo` up.
    pub fn new() -> Netns {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "pn-t-{}-{}-{nanos:x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        run(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ip("link set lo up");
        ns
    }

    /// Runs `ip -n <ns> <args>`, panicking with its stderr on failure.
    pub fn ip(&self, args: &str) {
        let mut argv = vec!["ip", "-n", &self.name];
        argv.extend(args.split_whitespace());
        run(&argv);
    }

    /// Runs `argv` inside the namespace (`ip netns exec`) and returns its output, panicking
    /// with its stderr on failure.
    pub fn exec(&self, argv: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend(argv);
        output(&full)
    }

    /// Runs `f` on a thread inside the namespace (sockets and devices it opens live there).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).expect("open netns file");
                // SAFETY: `file` is an open namespace descriptor; setns only affects this thread.
                let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(ret, 0, "setns: {}", std::io::Error::last_os_error());
                // IPv6 router/neighbour chatter would only add noise to the counts.
                let _ = std::fs::write("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1");
                let _ = std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// A veth pair `a`/`b` inside the namespace, both up, tx checksum offload irrelevant
    /// (the tests send complete frames themselves).
    pub fn veth_pair(&self, a: &str, b: &str) {
        self.ip(&format!("link add {a} type veth peer name {b}"));
        self.ip(&format!("link set {a} up"));
        self.ip(&format!("link set {b} up"));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs `argv`, panicking with its stderr on failure.
pub fn run(argv: &[&str]) {
    output(argv);
}

/// Runs `argv` and returns its output, panicking with its stderr on failure.
pub fn output(argv: &[&str]) -> String {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The test frame with sequence number `seq`, `len` bytes long: Ethernet header with the test
/// EtherType, then the sequence number and a pattern derived from it.
pub fn test_frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&MAC_B);
    f.extend_from_slice(&MAC_A);
    f.extend_from_slice(&TEST_ETHERTYPE);
    f.extend_from_slice(&seq.to_be_bytes());
    while f.len() < len {
        f.push((f.len() as u32 ^ seq) as u8);
    }
    f
}

/// Whether `f` is one of the tests' frames (by EtherType).
pub fn is_test_frame(f: &Frame) -> bool {
    f.len() >= 18 && f.data()[12..14] == TEST_ETHERTYPE
}

/// The sequence number of a test frame.
pub fn seq_of(f: &Frame) -> u32 {
    u32::from_be_bytes(f.data()[14..18].try_into().unwrap())
}

/// Receives from `port` until `until` holds for the frames collected or `deadline` passes.
pub fn collect(
    port: &mut dyn Port,
    pool: &mut FramePool,
    got: &mut Vec<Frame>,
    deadline: Duration,
    until: impl Fn(&[Frame]) -> bool,
) {
    let end = Instant::now() + deadline;
    let fd = port.raw_fd().unwrap();
    while !until(got) && Instant::now() < end {
        if port.recv_batch(pool, got, 256).unwrap() == 0 {
            wait_readable(&[fd], Duration::from_millis(5)).unwrap();
        }
    }
}

/// Sends all of `frames` through `port`, retrying what the kernel defers, for up to 5 s.
pub fn send_all(port: &mut dyn Port, pool: &mut FramePool, frames: &mut Vec<Frame>) {
    let end = Instant::now() + Duration::from_secs(5);
    while !frames.is_empty() {
        port.send_batch(frames, pool).unwrap();
        assert!(Instant::now() < end, "{} frames never sent", frames.len());
    }
}

/// Sends `n` 64-byte test frames from `tx` at once and checks that all of them reach `rx`
/// within 2 s.
pub fn send_burst_and_receive(tx: &mut dyn Port, rx: &mut dyn Port, pool: &mut FramePool, n: u32) {
    let mut frames: Vec<Frame> = (0..n)
        .map(|seq| {
            let mut f = pool.get().unwrap();
            assert!(f.fill_from(&test_frame(seq, 64)));
            f
        })
        .collect();
    send_all(tx, pool, &mut frames);
    let mut got = Vec::new();
    collect(rx, pool, &mut got, Duration::from_secs(2), |g| {
        g.iter().filter(|f| is_test_frame(f)).count() >= n as usize
    });
    assert_eq!(got.iter().filter(|f| is_test_frame(f)).count(), n as usize);
}

/// Sends 1000 frames of `len` bytes from `tx` to `rx` at a modest rate (batches of 32, the
/// receiver drained in between) and checks that all arrive once, in order and intact.
pub fn exchange(tx: &mut dyn Port, rx: &mut dyn Port, pool: &mut FramePool, len: usize) {
    let mut received = Vec::new();
    for batch_start in (0..1000u32).step_by(32) {
        let mut batch: Vec<Frame> = (batch_start..(batch_start + 32).min(1000))
            .map(|seq| {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(&test_frame(seq, len)));
                f
            })
            .collect();
        send_all(tx, pool, &mut batch);
        rx.recv_batch(pool, &mut received, usize::MAX).unwrap();
    }
    collect(rx, pool, &mut received, Duration::from_secs(3), |got| {
        got.iter().filter(|f| is_test_frame(f)).count() >= 1000
    });
    let ours: Vec<&Frame> = received.iter().filter(|f| is_test_frame(f)).collect();
    assert_eq!(
        ours.len(),
        1000,
        "{len} B frames {} -> {}: all 1000 arrive, none twice",
        tx.name(),
        rx.name()
    );
    for (expected_seq, f) in ours.iter().enumerate() {
        assert_eq!(seq_of(f), expected_seq as u32, "in order");
        assert_eq!(
            f.data(),
            &test_frame(expected_seq as u32, len)[..],
            "intact"
        );
    }
    for f in received {
        pool.put(f);
    }
}

/// A UDP frame from VM `src` (MAC 02:00:00:00:00:src, 198.18.0.src) to VM `dst`, with
/// `payload` zero bytes.
pub fn udp(src: u8, dst: u8, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, src], [2, 0, 0, 0, 0, dst])
        .ipv4([198, 18, 0, src], [198, 18, 0, dst], 64)
        .udp(40000, 7)
        .write(&mut out, &vec![0u8; payload])
        .unwrap();
    out
}

/// A switch for `cfg` on in-memory ports named `names` (the uplink first, then the local
/// VMs' ports in config order), with the handles that feed and drain them.
pub fn memory_switch(
    cfg: picnic_switch::config::Config,
    names: &[&str],
) -> (
    picnic_switch::runner::Switch,
    Vec<picnic_switch::port::MemoryPortHandle>,
) {
    let clock = picnic_switch::runner::Clock::new();
    let engine = picnic_switch::engine::Engine::new(&cfg, clock.now()).unwrap();
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    let mut handles = Vec::new();
    for name in names {
        let (p, h) = picnic_switch::port::MemoryPort::new(name);
        ports.push(Box::new(p));
        handles.push(h);
    }
    let switch = picnic_switch::runner::Switch::with_ports(cfg, engine, ports, clock);
    (switch, handles)
}

/// Applies a live change to `cfg` to a running switch (diffed by the switch, as for a
/// caller that does not hold the running config) and waits for its answer.
pub fn reconfigure(
    commands: &picnic_switch::runner::CommandSender,
    cfg: &picnic_switch::config::Config,
) -> anyhow::Result<()> {
    let change = picnic_switch::runner::Reconfigure::to(cfg.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    commands
        .send(picnic_switch::runner::Command::Reconfigure(
            Box::new(change),
            tx,
        ))
        .unwrap();
    rx.recv_timeout(Duration::from_secs(10)).expect("a reply")
}
