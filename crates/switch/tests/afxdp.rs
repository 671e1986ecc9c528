//! Root integration tests of the AF_XDP port backend, on veth pairs in fresh `pn-t-*`
//! namespaces (as tests/ports.rs). Without root each test prints why it skipped and passes.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{wait_readable, AfXdpOptions, AfXdpPort, Backend, Port, XdpMode};

/// Experimental EtherType (IEEE 802 local use) marking the tests' frames.
const TEST_ETHERTYPE: [u8; 2] = [0x88, 0xb5];
const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root for network namespaces/AF_PACKET");
    }
    root
}

/// A network namespace that exists for the guard's lifetime.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
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
    fn ip(&self, args: &str) {
        let mut argv = vec!["ip", "-n", &self.name];
        argv.extend(args.split_whitespace());
        run(&argv);
    }

    /// Runs `f` on a thread inside the namespace (sockets and devices it opens live there).
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
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
    fn veth_pair(&self, a: &str, b: &str) {
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

fn run(argv: &[&str]) {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test frame with sequence number `seq`, `len` bytes long: Ethernet header with the test
/// EtherType, then the sequence number and a pattern derived from it.
fn test_frame(seq: u32, len: usize) -> Vec<u8> {
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

fn is_test_frame(f: &Frame) -> bool {
    f.len() >= 18 && f.data()[12..14] == TEST_ETHERTYPE
}

fn seq_of(f: &Frame) -> u32 {
    u32::from_be_bytes(f.data()[14..18].try_into().unwrap())
}

/// Receives from `port` until `until` holds for the frames collected or `deadline` passes.
fn collect(
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

fn send_all(port: &mut dyn Port, pool: &mut FramePool, frames: &mut Vec<Frame>) {
    let end = Instant::now() + Duration::from_secs(5);
    while !frames.is_empty() {
        port.send_batch(frames, pool).unwrap();
        assert!(Instant::now() < end, "{} frames never sent", frames.len());
    }
}

/// Sends 1000 frames of `len` bytes from `tx` to `rx` at a modest rate (batches of 32, the
/// receiver drained in between) and checks that all arrive once, in order and intact.
fn exchange(tx: &mut dyn Port, rx: &mut dyn Port, pool: &mut FramePool, len: usize) {
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

/// Whether `ip link show` reports an XDP program on `ifname` inside `ns`.
fn has_xdp_program(ns: &Netns, ifname: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", &ns.name, "link", "show", ifname])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

fn frames_cross_both_ways(mode: XdpMode, expected: XdpMode, a_name: &str, b_name: &str) {
    let ns = &Netns::new();
    ns.veth_pair(a_name, b_name);
    ns.enter(|| {
        let opts = AfXdpOptions {
            mode,
            ..Default::default()
        };
        let mut a = AfXdpPort::open(a_name, opts).unwrap();
        let mut b = AfXdpPort::open(b_name, opts).unwrap();
        assert_eq!(a.backend(), Backend::AfXdp);
        assert_eq!((a.attach_mode(), b.attach_mode()), (expected, expected));
        assert!(has_xdp_program(ns, a_name) && has_xdp_program(ns, b_name));
        let mut pool = FramePool::new(4096);
        for len in [64, 1500] {
            exchange(&mut a, &mut b, &mut pool, len);
            exchange(&mut b, &mut a, &mut pool, len);
        }
        for (port, other) in [(&a, &b), (&b, &a)] {
            let (s, o) = (port.stats(), other.stats());
            assert_eq!((s.tx_frames, s.tx_errors), (2000, 0), "{}", port.name());
            assert_eq!(s.tx_bytes, 1000 * (64 + 1500));
            assert!(o.rx_frames >= 2000);
            assert_eq!((o.rx_dropped, o.rx_oversize), (0, 0), "{}", other.name());
        }
        assert_eq!(pool.available(), pool.capacity(), "no frame leaked");
    });
    // The BPF links closed with the ports: no program is left on the interfaces.
    assert!(!has_xdp_program(ns, a_name) && !has_xdp_program(ns, b_name));
}

#[test]
fn af_xdp_frames_cross_a_veth_intact_both_ways_native() {
    if !is_root() {
        return;
    }
    frames_cross_both_ways(XdpMode::Auto, XdpMode::Native, "pnxa", "pnxb");
}

#[test]
fn af_xdp_frames_cross_a_veth_intact_both_ways_generic() {
    if !is_root() {
        return;
    }
    frames_cross_both_ways(XdpMode::Generic, XdpMode::Generic, "pnxc", "pnxd");
}

#[test]
fn af_xdp_refuses_a_second_port_on_the_interface_and_reopens_after_drop() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnxe", "pnxf");
    ns.enter(|| {
        let first = AfXdpPort::open("pnxe", AfXdpOptions::default()).unwrap();
        let err = AfXdpPort::open("pnxe", AfXdpOptions::default()).unwrap_err();
        let text = err.to_string();
        println!("second port on pnxe: {text}");
        assert!(text.contains("af_xdp port 'pnxe'"), "{text}");
        assert!(text.contains("af_packet"), "suggests the fallback: {text}");
        drop(first);
        AfXdpPort::open("pnxe", AfXdpOptions::default()).expect("free again after drop");
    });
}

/// A burst far larger than the kernel's per-call transmit budget (32) and the rings goes out
/// whole: `send_batch` keeps what the TX ring cannot take and a later call sends it.
#[test]
fn af_xdp_sends_bursts_larger_than_its_rings() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnxg", "pnxh");
    ns.enter(|| {
        let opts = AfXdpOptions {
            frames: 256,
            ..Default::default()
        };
        let mut tx = AfXdpPort::open("pnxg", opts).unwrap();
        let mut rx = AfXdpPort::open("pnxh", AfXdpOptions::default()).unwrap();
        let mut pool = FramePool::new(4096);
        let mut burst: Vec<Frame> = (0..600u32)
            .map(|seq| {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(&test_frame(seq, 64)));
                f
            })
            .collect();
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(5);
        while !burst.is_empty() {
            let sent = tx.send_batch(&mut burst, &mut pool).unwrap();
            assert!(sent <= 128, "at most the TX chunks ({sent})");
            rx.recv_batch(&mut pool, &mut got, usize::MAX).unwrap();
            assert!(Instant::now() < end, "{} frames never sent", burst.len());
        }
        collect(&mut rx, &mut pool, &mut got, Duration::from_secs(3), |g| {
            g.iter().filter(|f| is_test_frame(f)).count() >= 600
        });
        let seqs: Vec<u32> = got
            .iter()
            .filter(|f| is_test_frame(f))
            .map(seq_of)
            .collect();
        assert_eq!(seqs, (0..600).collect::<Vec<_>>());
        assert_eq!(tx.stats().tx_frames, 600);
    });
}

#[test]
fn af_xdp_refuses_an_mtu_too_large_for_its_frames() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnxi", "pnxj");
    ns.ip("link set pnxi mtu 4000");
    ns.enter(|| {
        let err = AfXdpPort::open("pnxi", AfXdpOptions::default()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("MTU 4000"), "{err}");
        AfXdpPort::open("pnxj", AfXdpOptions::default()).expect("MTU 1500 is fine");
    });
}
