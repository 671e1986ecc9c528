//! Root integration tests of the real port backends. Each test builds its own network
//! namespace (`pn-t-*`, addresses from 198.18.0.0/15 only), runs its body on a thread that
//! entered it with setns(2), and deletes it on drop, also when the test fails. Without root
//! each test prints why it skipped and passes.
//!
//! The throughput check prints numbers (run with `--nocapture`) and asserts nothing about them.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    collect, exchange, have_ebpf, is_root, is_test_frame, send_all, send_burst_and_receive, seq_of,
    test_frame, Netns, MAC_B,
};
use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use picnic_switch::frame::{Frame, FramePool, DATA_CAP};
use picnic_switch::port::{
    wait_readable, AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Backend, Port,
    RingVersion, TapPort,
};

#[test]
fn af_packet_frames_cross_a_veth_intact_and_are_not_seen_by_the_sender() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnta", "pntb");
    ns.enter(|| {
        let mut a = AfPacketPort::open("pnta", AfPacketOptions::default()).unwrap();
        let mut b = AfPacketPort::open("pntb", AfPacketOptions::default()).unwrap();
        assert_eq!(a.backend(), Backend::AfPacket);
        let mut pool = FramePool::new(4096);
        for len in [64, 1500] {
            exchange(&mut a, &mut b, &mut pool, len);
        }

        // The sender's own ring must not show its transmissions. Blocks are handed over by
        // timeout, so wait well past it before concluding nothing came.
        let mut echoed = Vec::new();
        collect(
            &mut a,
            &mut pool,
            &mut echoed,
            Duration::from_millis(100),
            |_| false,
        );
        assert_eq!(echoed.iter().filter(|f| is_test_frame(f)).count(), 0);

        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.tx_frames, sa.tx_errors), (2000, 0));
        assert_eq!(sa.tx_bytes, 1000 * (64 + 1500));
        assert!(sb.rx_frames >= 2000);
        assert_eq!((sb.rx_dropped, sb.rx_oversize), (0, 0));
        assert_eq!(
            pool.available(),
            pool.capacity() - echoed.len(),
            "no frame leaked"
        );
    });
}

/// Sending must not wake the descriptor the run loop waits on. The kernel frees every sent
/// frame against the socket that sent it and wakes that socket's waiters; were it the
/// receiving socket, which stays registered in the loop's epoll set, every frame sent would
/// run the epoll callback (12.5% of the switch's CPU at its maximum rate, issue 13). An
/// edge-triggered EPOLLOUT registration on the port's descriptor reports each such wake-up.
#[test]
fn af_packet_sends_do_not_wake_the_descriptor_the_loop_waits_on() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pntwa", "pntwb");
    ns.enter(|| {
        let mut a = AfPacketPort::open("pntwa", AfPacketOptions::default()).unwrap();
        let mut b = AfPacketPort::open("pntwb", AfPacketOptions::default()).unwrap();
        let mut pool = FramePool::new(1024);
        // SAFETY: plain epoll calls on descriptors this test owns; `ev` outlives each call.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(epoll >= 0);
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLOUT | libc::EPOLLET) as u32,
            u64: 0,
        };
        let fd = a.raw_fd().unwrap();
        assert_eq!(
            unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) },
            0
        );
        let wakes = |timeout_ms: i32| {
            let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
            unsafe { libc::epoll_wait(epoll, out.as_mut_ptr(), 4, timeout_ms) }
        };
        // Writable when registered: one edge.
        assert_eq!(wakes(0), 1);
        send_burst_and_receive(&mut a, &mut b, &mut pool, 256);
        assert_eq!(wakes(50), 0, "a send woke the waited-on descriptor");
        unsafe { libc::close(epoll) };
    });
}

/// Sending must not wake the descriptor the run loop waits on, on an AF_XDP port either. In
/// copy mode the kernel sends each frame as an skb charged to the sending socket, and freeing
/// it wakes that socket's waiters (`sock_wfree`); were it the receiving socket, every frame
/// sent would run the loop's epoll callback (10.7% of picnic_xdp's CPU at its maximum rate).
/// The receiving socket has no TX ring, so it never reports writable and an edge-triggered
/// registration as above would not show such a wake-up; a thread asleep in poll(2) for
/// POLLOUT on it is woken by each one (the wake-up's key matches what it asks for), polls,
/// finds nothing and sleeps again: its voluntary context switches count them.
#[test]
fn af_xdp_sends_do_not_wake_the_descriptor_the_loop_waits_on() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pntxa", "pntxb");
    ns.enter(|| {
        let mut a = AfXdpPort::open("pntxa", AfXdpOptions::default()).unwrap();
        let mut b = AfXdpPort::open("pntxb", AfXdpOptions::default()).unwrap();
        let mut pool = FramePool::new(1024);
        let fd = a.raw_fd().unwrap();
        // SAFETY: eventfd takes no pointers; the descriptor is closed below.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(stop >= 0);
        let (revents, switches) = std::thread::scope(|s| {
            let waiter = s.spawn(move || {
                let mut fds = [
                    libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: stop,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                let before = voluntary_switches();
                // SAFETY: two live pollfds.
                let ret = unsafe { libc::poll(fds.as_mut_ptr(), 2, 10_000) };
                let switches = voluntary_switches() - before;
                assert!(ret > 0, "poll: {ret}");
                (fds[0].revents, switches)
            });
            // Time for the waiter to fall asleep in poll.
            std::thread::sleep(Duration::from_millis(100));
            send_burst_and_receive(&mut a, &mut b, &mut pool, 256);
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: a write of 8 bytes from a live u64 to the eventfd.
            assert_eq!(unsafe { libc::eventfd_write(stop, 1) }, 0);
            waiter.join().unwrap()
        });
        // SAFETY: closes the eventfd made above, used by nobody since the join.
        unsafe { libc::close(stop) };
        assert_eq!(
            revents & libc::POLLOUT,
            0,
            "the descriptor the loop waits on is writable: it is the one that sends"
        );
        // One: the wake-up by `stop`.
        assert!(
            switches <= 1,
            "sends woke the descriptor the loop waits on {} times",
            switches - 1
        );
    });
}

/// The calling thread's voluntary context switches so far (each time it slept).
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
}

/// The TPACKET_V3 ring (blocks of frames, each after its virtio-net header) delivers the
/// same frames intact.
#[test]
fn af_packet_v3_ring_frames_cross_a_veth_intact() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pntv3a", "pntv3b");
    ns.enter(|| {
        let v3 = AfPacketOptions {
            ring: RingVersion::V3,
            ..Default::default()
        };
        let mut a = AfPacketPort::open("pntv3a", v3).unwrap();
        let mut b = AfPacketPort::open("pntv3b", v3).unwrap();
        let mut pool = FramePool::new(4096);
        for len in [64, 1500] {
            exchange(&mut a, &mut b, &mut pool, len);
        }
        let sb = b.stats();
        assert_eq!(
            (sb.rx_dropped, sb.rx_oversize, sb.rx_offload_errors),
            (0, 0, 0)
        );
    });
}

#[test]
fn af_packet_counts_frames_too_big_for_a_frame() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pntc", "pntd");
    ns.ip("link set pntc mtu 4000");
    ns.ip("link set pntd mtu 4000");
    ns.enter(|| {
        let mut c = AfPacketPort::open("pntc", AfPacketOptions::default()).unwrap();
        let mut d = AfPacketPort::open("pntd", AfPacketOptions::default()).unwrap();
        // A jumbo frame (too big for a pool Frame) is sent with a plain packet socket.
        // SAFETY: plain socket(2) call; the descriptor is closed at the end of the test.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(raw >= 0);
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex_of("pntc");
        let jumbo = test_frame(7, 3000);
        // SAFETY: `jumbo` and `addr` are live for the call and the lengths are theirs.
        let ret = unsafe {
            libc::sendto(
                raw,
                jumbo.as_ptr().cast(),
                jumbo.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(ret, 3000, "{}", std::io::Error::last_os_error());
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(raw) };
        let mut pool = FramePool::new(64);
        let mut small = vec![pool.get().unwrap()];
        small[0].fill_from(&test_frame(8, 64));
        send_all(&mut c, &mut pool, &mut small);
        let mut got = Vec::new();
        collect(&mut d, &mut pool, &mut got, Duration::from_secs(2), |g| {
            g.iter().any(is_test_frame)
        });
        let ours: Vec<u32> = got
            .iter()
            .filter(|f| is_test_frame(f))
            .map(seq_of)
            .collect();
        assert_eq!(
            ours,
            vec![8],
            "the jumbo frame is dropped, the next one arrives"
        );
        assert_eq!(d.stats().rx_oversize, 1);
    });
}

/// A port kept open after its VM was removed (live changes park it, docs/switch.md "Live
/// changes") is reused for a VM added on the same interface: what arrived meanwhile, an
/// overflowed ring's worth included, is discarded, its counters start from zero, and frames
/// flow as on a new port; once the interface is deleted and made again under the same name
/// the port refuses to be reused (its socket was bound to the old one). Both ring layouts.
#[test]
fn af_packet_port_reused_discards_what_arrived_meanwhile_and_counts_from_zero() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pntra", "pntrb");
    ns.enter(|| {
        for ring in [RingVersion::V2, RingVersion::V3] {
            let opts = AfPacketOptions {
                ring,
                // 256 slots of V2: the 3,000 frames below overflow it.
                block_size: 64 << 10,
                block_count: 8,
                ..Default::default()
            };
            let mut a = AfPacketPort::open("pntra", opts).unwrap();
            let mut b = AfPacketPort::open("pntrb", AfPacketOptions::default()).unwrap();
            let mut pool = FramePool::new(4096);
            for start in (0..3000u32).step_by(100) {
                let mut batch: Vec<Frame> = (start..start + 100)
                    .map(|seq| {
                        let mut f = pool.get().unwrap();
                        assert!(f.fill_from(&test_frame(seq, 1000)));
                        f
                    })
                    .collect();
                send_all(&mut b, &mut pool, &mut batch);
            }
            std::thread::sleep(Duration::from_millis(50));
            assert!(a.stats().rx_dropped > 0, "{ring:?}: the ring overflowed");
            assert!(a.reuse(DATA_CAP), "{ring:?}");
            assert_eq!(
                a.stats(),
                Default::default(),
                "{ring:?}: counters from zero"
            );
            let mut got = Vec::new();
            collect(
                &mut a,
                &mut pool,
                &mut got,
                Duration::from_millis(100),
                |_| false,
            );
            assert_eq!(
                got.iter().filter(|f| is_test_frame(f)).count(),
                0,
                "{ring:?}: nothing from before the reuse"
            );
            for f in got {
                pool.put(f);
            }
            exchange(&mut b, &mut a, &mut pool, 64);
            assert_eq!(a.stats().rx_dropped, 0, "{ring:?}");
        }

        let mut a = AfPacketPort::open("pntra", AfPacketOptions::default()).unwrap();
        ns.ip("link del pntra");
        ns.veth_pair("pntra", "pntrb");
        assert!(!a.reuse(DATA_CAP), "bound to the interface deleted");
    });
}

/// Runs `f` on a new thread inside namespace `ns`, returning at once: for kernel endpoints
/// that run while the test drives ports.
fn spawn_in<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let file = std::fs::File::open(format!("/run/netns/{}", ns.name)).expect("netns file");
    std::thread::spawn(move || {
        // SAFETY: `file` is an open namespace descriptor; setns only affects this thread.
        let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(ret, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
}

/// `(TcpInCsumErrors, UdpInCsumErrors)` of the calling thread's network namespace.
fn csum_errors() -> (u64, u64) {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
    let counter = |proto: &str| {
        let mut lines = snmp.lines().filter(|l| l.starts_with(proto));
        let names = lines.next().unwrap().split_whitespace();
        let values = lines.next().unwrap().split_whitespace();
        names
            .zip(values)
            .find(|(n, _)| *n == "InCsumErrors")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap()
    };
    (counter("Tcp:"), counter("Udp:"))
}

/// Bytes the client sends.
const TRANSFER: usize = 8 << 20;

/// A kernel TCP client with the Linux default offloads (checksum offload and TSO on) sends
/// 8 MiB to a kernel server in another namespace; a test forwarder in a third joins the two
/// ports. The client's port is an AF_PACKET port on a veth (V2 ring, then V3), or a TAP port
/// (offloads set by the port, as QEMU does). The ports complete the partial checksums and segment the TSO
/// super-frames: the transfer arrives intact, neither stack counts a checksum error, and the
/// counters show that partial checksums and super-frames did arrive.
#[test]
fn kernel_tcp_with_default_offloads_crosses_af_packet_and_tap_ports_intact() {
    if !is_root() {
        return;
    }
    for (tap, ring) in [
        (false, RingVersion::V2),
        (true, RingVersion::V2),
        (false, RingVersion::V3),
    ] {
        let what = match (tap, ring) {
            (true, _) => "TAP",
            (false, RingVersion::V2) => "veth/AF_PACKET V2",
            (false, RingVersion::V3) => "veth/AF_PACKET V3, 128 KiB blocks",
        };
        let (s, a, b) = (Netns::new(), Netns::new(), Netns::new());
        s.ip(&format!(
            "link add pnsb type veth peer name pnvb netns {}",
            b.name
        ));
        s.ip("link set pnsb up");
        b.ip("addr add 198.18.3.2/24 dev pnvb");
        b.ip("link set pnvb up");
        if !tap {
            s.ip(&format!(
                "link add pnsa type veth peer name pnva netns {}",
                a.name
            ));
            s.ip("link set pnsa up");
        }
        let (client_stats, server_stats, secs) = s.enter(|| {
            let mut client_port: Box<dyn Port> = if tap {
                let port = TapPort::open("pnva", DATA_CAP).unwrap();
                s.ip(&format!("link set pnva netns {}", a.name));
                Box::new(port)
            } else {
                // V3 blocks must hold a 64 KiB super-frame (see the afpacket module doc).
                let opts = AfPacketOptions {
                    ring,
                    block_size: 128 << 10,
                    block_count: 32,
                    ..Default::default()
                };
                Box::new(AfPacketPort::open("pnsa", opts).unwrap())
            };
            let mut server_port = AfPacketPort::open("pnsb", AfPacketOptions::default()).unwrap();
            a.ip("addr add 198.18.3.1/24 dev pnva");
            a.ip("link set pnva up");
            let features = std::process::Command::new("ip")
                .args(["netns", "exec", &a.name, "ethtool", "-k", "pnva"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for f in ["tx-checksumming: on", "tcp-segmentation-offload: on"] {
                assert!(
                    features.is_empty() || features.contains(f),
                    "{f}:\n{features}"
                );
            }
            let listener = Arc::new(std::sync::Mutex::new(None));
            let ready = Arc::clone(&listener);
            let server = spawn_in(&b, move || {
                let l = TcpListener::bind("198.18.3.2:5001").unwrap();
                *ready.lock().unwrap() = Some(());
                let (mut conn, _) = l.accept().unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                let mut buf = vec![0u8; 1 << 16];
                let (mut got, mut intact) = (0usize, true);
                loop {
                    let n = conn.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    intact &= buf[..n]
                        .iter()
                        .enumerate()
                        .all(|(i, &x)| x == pattern(got + i));
                    got += n;
                }
                (got, intact, csum_errors())
            });
            while listener.lock().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let client = spawn_in(&a, || {
                let before = csum_errors();
                let mut conn = TcpStream::connect_timeout(
                    &"198.18.3.2:5001".parse().unwrap(),
                    Duration::from_secs(5),
                )
                .unwrap();
                let data: Vec<u8> = (0..TRANSFER).map(pattern).collect();
                let start = Instant::now();
                conn.write_all(&data).unwrap();
                conn.shutdown(std::net::Shutdown::Write).unwrap();
                let mut rest = Vec::new();
                conn.read_to_end(&mut rest).unwrap();
                (start.elapsed(), before, csum_errors())
            });
            // The forwarder: both directions, until both ends are done (bounded).
            let mut pool = FramePool::new(4096);
            let mut frames = Vec::with_capacity(256);
            let fds = [client_port.raw_fd().unwrap(), server_port.raw_fd().unwrap()];
            let deadline = Instant::now() + Duration::from_secs(60);
            while !(client.is_finished() && server.is_finished()) {
                assert!(Instant::now() < deadline, "transfer stuck");
                let mut moved = client_port.recv_batch(&mut pool, &mut frames, 256).unwrap();
                send_all(&mut server_port, &mut pool, &mut frames);
                moved += server_port.recv_batch(&mut pool, &mut frames, 256).unwrap();
                send_all(client_port.as_mut(), &mut pool, &mut frames);
                if moved == 0 {
                    wait_readable(&fds, Duration::from_millis(1)).unwrap();
                }
            }
            let (took, before, after) = client.join().unwrap();
            let (got, intact, server_errors) = server.join().unwrap();
            assert_eq!((got, intact), (TRANSFER, true), "{what}: all bytes, intact");
            assert_eq!(after, before, "{what}: client stack saw no checksum error");
            assert_eq!(server_errors, (0, 0), "{what}: server stack saw none");
            (client_port.stats(), server_port.stats(), took.as_secs_f64())
        });
        println!(
            "{}: 8 MiB in {secs:.2} s ({:.0} Mb/s through the test forwarder); client port: \
             {} super-frames -> {} segments, {} partial checksums completed; server port: {} \
             partial checksums completed",
            what,
            TRANSFER as f64 * 8.0 / secs / 1e6,
            client_stats.rx_gso_frames,
            client_stats.rx_gso_segments,
            client_stats.rx_csum_partial,
            server_stats.rx_csum_partial
        );
        assert!(
            client_stats.rx_gso_frames > 0,
            "{what}: TSO super-frames arrived"
        );
        assert!(
            client_stats.rx_gso_segments >= (TRANSFER / 1448) as u64 / 2,
            "{what}: most data came as super-frames: {client_stats:?}"
        );
        assert!(
            server_stats.rx_csum_partial > 0,
            "{what}: ACKs arrived partial"
        );
        assert_eq!(
            (
                client_stats.rx_offload_errors,
                server_stats.rx_offload_errors
            ),
            (0, 0)
        );
    }
}

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn ifindex_of(name: &str) -> i32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: `c` is NUL-terminated.
    unsafe { libc::if_nametoindex(c.as_ptr()) as i32 }
}

#[test]
fn tap_port_created_by_name_exchanges_frames_with_the_kernel() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.enter(|| {
        let mut tap = TapPort::open("pntap0", DATA_CAP).unwrap();
        assert_eq!((tap.name(), tap.backend()), ("pntap0", Backend::TapQueue));
        ns.ip("addr add 198.18.0.1/24 dev pntap0");
        ns.ip("link set pntap0 up");
        ns.ip("neigh add 198.18.0.2 lladdr 02:00:00:00:00:0b dev pntap0 nud permanent");
        let mut pool = FramePool::new(256);

        // Kernel -> TAP: a UDP datagram from the kernel side comes out of the port.
        let sock = UdpSocket::bind("198.18.0.1:0").unwrap();
        sock.send_to(b"hello tap", "198.18.0.2:9000").unwrap();
        let is_hello = |f: &Frame| match SlicedPacket::from_ethernet(f.data()) {
            Ok(p) => {
                matches!(p.transport, Some(TransportSlice::Udp(u)) if u.payload() == b"hello tap")
            }
            Err(_) => false,
        };
        let mut got = Vec::new();
        collect(&mut tap, &mut pool, &mut got, Duration::from_secs(3), |g| {
            g.iter().any(is_hello)
        });
        let hello = got
            .iter()
            .find(|f| is_hello(f))
            .expect("datagram on the TAP");
        assert_eq!(hello.data()[..6], MAC_B, "to the static neighbour's MAC");
        let tap_mac: [u8; 6] = hello.data()[6..12].try_into().unwrap();

        // TAP -> kernel: a UDP datagram written to the port reaches the kernel's socket.
        let local_port = sock.local_addr().unwrap().port();
        let builder = PacketBuilder::ethernet2(MAC_B, tap_mac)
            .ipv4([198, 18, 0, 2], [198, 18, 0, 1], 64)
            .udp(9000, local_port);
        let mut bytes = Vec::new();
        builder.write(&mut bytes, b"hello kernel").unwrap();
        let mut out = vec![pool.get().unwrap()];
        out[0].fill_from(&bytes);
        assert_eq!(tap.send_batch(&mut out, &mut pool).unwrap(), 1);
        sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = sock.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello kernel");
        assert_eq!(
            from,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 9000).into()
        );
        let s = tap.stats();
        assert_eq!((s.tx_frames, s.tx_bytes), (1, bytes.len() as u64));
        assert!(s.rx_frames >= 1);
    });
}

#[test]
fn tap_port_attaches_to_an_existing_tap_and_open_errors_are_actionable() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.ip("tuntap add dev pntap1 mode tap");
    ns.veth_pair("pntv0", "pntv1");
    ns.enter(|| {
        // QEMU-style: the device exists (persistent), the port attaches to it.
        let first = TapPort::open("pntap1", DATA_CAP).unwrap();
        let busy = TapPort::open("pntap1", DATA_CAP).unwrap_err();
        assert_eq!(busy.kind(), std::io::ErrorKind::ResourceBusy);
        assert!(busy.to_string().contains("busy"), "{busy}");
        drop(first);
        TapPort::open("pntap1", DATA_CAP).expect("free again once the first port is gone");

        let not_tap = TapPort::open("pntv0", DATA_CAP).unwrap_err();
        assert_eq!(not_tap.kind(), std::io::ErrorKind::InvalidInput);
        assert!(
            not_tap.to_string().contains("not a single-queue TAP"),
            "{not_tap}"
        );

        let missing = AfPacketPort::open("pntnone", AfPacketOptions::default()).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        assert!(
            missing
                .to_string()
                .contains("create it or fix the port's ifname"),
            "{missing}"
        );
    });
}

/// Prints AF_PACKET rx/tx rates on a veth pair with 64 B frames over ~1 s, and the latency of
/// a lone frame (bounded below by the ring's block timeout). Compare with DESIGN.md section 7.
#[test]
fn af_packet_throughput_on_veth_printed() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnte", "pntf");
    ns.enter(|| {
        let mut tx = AfPacketPort::open("pnte", AfPacketOptions::default()).unwrap();
        let mut rx = AfPacketPort::open("pntf", AfPacketOptions::default()).unwrap();
        let template = test_frame(0, 64);

        // Lone-frame latency: one frame at a time, receiver spinning.
        let mut pool = FramePool::new(1024);
        let mut lat = Vec::new();
        for seq in 0..20 {
            let mut one = vec![pool.get().unwrap()];
            one[0].fill_from(&test_frame(seq, 64));
            let t0 = Instant::now();
            send_all(&mut tx, &mut pool, &mut one);
            let mut got = Vec::new();
            while got.is_empty() && t0.elapsed() < Duration::from_secs(1) {
                rx.recv_batch(&mut pool, &mut got, 8).unwrap();
            }
            lat.push(t0.elapsed());
            got.into_iter().for_each(|f| pool.put(f));
        }
        lat.sort();

        let done = Arc::new(AtomicBool::new(false));
        let period = Duration::from_secs(1);
        let (sent, tx_secs, received, rx_secs, rx_stats) = std::thread::scope(|s| {
            let done_tx = Arc::clone(&done);
            let sender = s.spawn(move || {
                let mut pool = FramePool::new(1024);
                let mut batch = Vec::with_capacity(64);
                let start = Instant::now();
                let mut sent = 0u64;
                while start.elapsed() < period {
                    while batch.len() < 64 {
                        let mut f = pool.get().unwrap();
                        f.fill_from(&template);
                        batch.push(f);
                    }
                    sent += tx.send_batch(&mut batch, &mut pool).unwrap() as u64;
                }
                let secs = start.elapsed().as_secs_f64();
                done_tx.store(true, Ordering::Release);
                (sent, secs)
            });
            let receiver = s.spawn(|| {
                let mut pool = FramePool::new(1024);
                let mut got = Vec::with_capacity(256);
                let mut received = 0u64;
                let mut first: Option<Instant> = None;
                let mut last = Instant::now();
                let mut idle_since: Option<Instant> = None;
                loop {
                    let n = rx.recv_batch(&mut pool, &mut got, 256).unwrap();
                    if n > 0 {
                        first.get_or_insert_with(Instant::now);
                        last = Instant::now();
                        received += n as u64;
                        got.drain(..).for_each(|f| pool.put(f));
                        idle_since = None;
                    } else if done.load(Ordering::Acquire) {
                        // Drained: nothing new for well over a block timeout.
                        let idle = *idle_since.get_or_insert_with(Instant::now);
                        if idle.elapsed() > Duration::from_millis(50) {
                            break;
                        }
                    }
                }
                let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
                (received, secs, rx.stats())
            });
            let (sent, tx_secs) = sender.join().unwrap();
            let (received, rx_secs, rx_stats) = receiver.join().unwrap();
            (sent, tx_secs, received, rx_secs, rx_stats)
        });
        println!(
            "af_packet 64 B on veth: tx {:.0} kpps ({sent} frames in {tx_secs:.2} s), \
             rx {:.0} kpps ({received} frames in {rx_secs:.2} s), rx kernel drops {}, \
             lone-frame latency median {:?} max {:?}",
            sent as f64 / tx_secs / 1e3,
            received as f64 / rx_secs.max(1e-9) / 1e3,
            rx_stats.rx_dropped,
            lat[lat.len() / 2],
            lat[lat.len() - 1],
        );
    });
}
