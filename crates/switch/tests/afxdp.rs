//! Root integration tests of the AF_XDP port backend, on veth pairs in fresh `pn-t-*`
//! namespaces (as tests/ports.rs). Without root each test prints why it skipped and passes.
//! The send-rate measurement prints numbers and asserts nothing: it is ignored unless asked
//! for (`--ignored --nocapture`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{collect, exchange, have_ebpf, is_root, is_test_frame, seq_of, test_frame, Netns};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfXdpOptions, AfXdpPort, Backend, BindMode, Port, XdpMode};

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
    // The BPF links closed with the ports: no program is left on the interfaces. The kernel
    // may finish the detach after the last descriptor is closed (rarely seen here): a
    // second's grace.
    let detached = || !has_xdp_program(ns, a_name) && !has_xdp_program(ns, b_name);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !detached() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(detached());
}

#[test]
fn af_xdp_frames_cross_a_veth_intact_both_ways_native() {
    if !is_root() || !have_ebpf() {
        return;
    }
    frames_cross_both_ways(XdpMode::Auto, XdpMode::Native, "pnxa", "pnxb");
}

#[test]
fn af_xdp_frames_cross_a_veth_intact_both_ways_generic() {
    if !is_root() || !have_ebpf() {
        return;
    }
    frames_cross_both_ways(XdpMode::Generic, XdpMode::Generic, "pnxc", "pnxd");
}

/// A writer that keeps what a tracing subscriber writes, for reading back.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The process's log lines so far: a global subscriber writing to memory, installed on the
/// first call (a scoped one would miss events whose callsite another test thread registered
/// first). Tests pick their lines by their own interface names.
fn log_lines() -> Vec<String> {
    static LOG: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    let log = LOG.get_or_init(|| {
        let out = Captured::default();
        let writer = out.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        out
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_owned).collect()
}

/// veth has no zero-copy AF_XDP: the default bind falls back to copy mode, with need_wakeup,
/// says so in one log line, and wakes the kernel only when a ring asks (in copy mode: one
/// `sendto` per burst, never a fill-ring wake-up). Asking for zero-copy outright is refused
/// with the reason, and leaves the queue free.
#[test]
fn af_xdp_falls_back_to_copy_mode_on_a_veth_with_need_wakeup_and_says_so() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnxk", "pnxl");
    ns.enter(|| {
        let zero_copy = AfXdpOptions {
            bind: BindMode::ZeroCopy,
            ..Default::default()
        };
        let err = AfXdpPort::open("pnxk", zero_copy).unwrap_err();
        let text = err.to_string();
        println!("zero-copy on a veth: {text}");
        assert!(text.contains("bind in zero-copy mode"), "{text}");
        assert!(text.contains("no zero-copy AF_XDP"), "{text}");

        log_lines();
        let mut a = AfXdpPort::open("pnxk", AfXdpOptions::default())
            .expect("copy mode after the refused zero-copy bind");
        let mut b = AfXdpPort::open("pnxl", AfXdpOptions::default()).unwrap();
        let lines = log_lines();
        let bound: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("af_xdp socket bound") && l.contains("\"pnxk\""))
            .collect();
        assert_eq!(bound.len(), 1, "one line per socket: {lines:?}");
        assert!(
            bound[0].contains("in copy mode with need_wakeup"),
            "{}",
            bound[0]
        );
        assert_eq!(
            (a.bind_mode(), b.bind_mode()),
            (BindMode::Copy, BindMode::Copy)
        );
        // In copy mode the TX ring always asks (the kernel sets the flag when the ring is
        // made and only a zero-copy driver clears it): only sendto transmits there.
        assert!(a.tx_needs_wakeup() && b.tx_needs_wakeup());

        let mut pool = FramePool::new(1024);
        let mut burst: Vec<Frame> = (0..20u32)
            .map(|seq| {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(&test_frame(seq, 64)));
                f
            })
            .collect();
        assert_eq!(a.send_batch(&mut burst, &mut pool).unwrap(), 20);
        let mut got = Vec::new();
        collect(&mut b, &mut pool, &mut got, Duration::from_secs(3), |g| {
            g.iter().filter(|f| is_test_frame(f)).count() >= 20
        });
        assert_eq!(got.iter().filter(|f| is_test_frame(f)).count(), 20);
        assert_eq!(
            a.stats().kernel_wakeups,
            1,
            "one sendto for a burst within the budget"
        );
        assert_eq!(
            b.stats().kernel_wakeups,
            0,
            "copy mode never asks for a fill wake-up"
        );
    });
}

#[test]
fn af_xdp_refuses_a_second_port_on_the_interface_and_reopens_after_drop() {
    if !is_root() || !have_ebpf() {
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
    if !is_root() || !have_ebpf() {
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
    if !is_root() || !have_ebpf() {
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

/// Sends 64 B frames as fast as one thread can for 1 s at a time, alternately with the port's
/// descriptor out of an epoll set and in one for input (as the run loop's `WaitSet` keeps
/// it), and prints the rates: what a wake-up of the waited-on descriptor per sent frame costs
/// shows as the difference (docs/BENCHMARKS.md). Asserts nothing about the numbers.
#[test]
#[ignore = "a measurement, not a check: prints send rates (run with --ignored --nocapture)"]
fn af_xdp_send_rate_with_the_descriptor_in_an_epoll_set_printed() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let ns = Netns::new();
    // Nothing reads the peer: its stack drops the frames, freeing each sent one.
    ns.veth_pair("pnxr", "pnxs");
    ns.enter(|| {
        let mut port = AfXdpPort::open("pnxr", AfXdpOptions::default()).unwrap();
        let mut pool = FramePool::new(1024);
        let template = test_frame(0, 64);
        let mut rate = |port: &mut AfXdpPort, period: Duration| {
            let mut batch: Vec<Frame> = Vec::with_capacity(64);
            let before = port.stats().tx_frames;
            let start = Instant::now();
            while start.elapsed() < period {
                while batch.len() < 64 {
                    let mut f = pool.get().unwrap();
                    f.fill_from(&template);
                    batch.push(f);
                }
                port.send_batch(&mut batch, &mut pool).unwrap();
            }
            batch.drain(..).for_each(|f| pool.put(f));
            (port.stats().tx_frames - before) as f64 / start.elapsed().as_secs_f64()
        };
        rate(&mut port, Duration::from_millis(200));
        // SAFETY: plain epoll calls on descriptors this test owns; `ev` outlives each call.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(epoll >= 0);
        let fd = port.raw_fd().unwrap();
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        let mut ctl = |op| {
            // SAFETY: as above.
            assert_eq!(unsafe { libc::epoll_ctl(epoll, op, fd, &mut ev) }, 0);
        };
        for round in 0..2 {
            for registered in [false, true] {
                match (round, registered) {
                    (0, false) => {}
                    (_, false) => ctl(libc::EPOLL_CTL_DEL),
                    (_, true) => ctl(libc::EPOLL_CTL_ADD),
                }
                let r = rate(&mut port, Duration::from_secs(1));
                println!(
                    "af_xdp send, descriptor {}: {:.0} kpps ({:.0} ns/frame)",
                    if registered {
                        "in an epoll set"
                    } else {
                        "waited on by nobody"
                    },
                    r / 1e3,
                    1e9 / r
                );
            }
        }
        // SAFETY: closes the epoll descriptor made above.
        unsafe { libc::close(epoll) };
    });
}
