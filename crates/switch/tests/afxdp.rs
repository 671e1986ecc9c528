//! Root integration tests of the AF_XDP port backend, on veth pairs in fresh `pn-t-*`
//! namespaces (as tests/ports.rs). Without root each test prints why it skipped and passes.
//! The send-rate measurement prints numbers and asserts nothing: it is ignored unless asked
//! for (`--ignored --nocapture`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{collect, exchange, have_ebpf, is_root, is_test_frame, seq_of, test_frame, Netns};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfXdpOptions, AfXdpPort, Backend, Port, XdpMode};

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
