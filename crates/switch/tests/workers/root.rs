//! Workers on a multi-queue veth uplink, in a `pn-t-*` namespace (root; skipped without): two
//! workers on two queues, one and two workers on four.

use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, is_root, send_all, udp, Netns};
use crate::from_r9_flow;
use picnic_switch::config::Config;
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{wait_readable, AfPacketOptions, AfPacketPort, Port};
use picnic_switch::runner::{Published, Switch};

const ROOT_CONFIG: &str = r#"
[switch]
host_id = 1
workers = 2
# What is tested is the engines' path: the kernel fast path (the default) would carry
# these frames past them.
[fastpath]
kernel = false
[uplink]
ifname = "pnwup"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[hosts]]
id = 2
underlay_ip = "198.19.0.2"
mac = "02:00:00:00:01:02"
[[tenants]]
name = "small"
vni = 100
[[vms]]
name = "s1"
id = 1
tenant = "small"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "pnwv1" }
[[vms]]
name = "s2"
id = 2
tenant = "small"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = { ifname = "pnwv2" }
[[vms]]
name = "r9"
id = 9
tenant = "small"
host = 2
mac = "02:00:00:00:00:09"
ip = "198.18.0.9"
"#;

/// Frames from r9 (UDP from 198.18.0.9) received on `port` so far, added to `n`.
fn count_from_r9(port: &mut AfPacketPort, pool: &mut FramePool, n: &mut usize) {
    let mut got: Vec<Frame> = Vec::new();
    while port.recv_batch(pool, &mut got, 256).unwrap() > 0 {}
    for f in got {
        if f.len() > 30 && f.data()[26..30] == [198, 18, 0, 9] {
            *n += 1;
        }
        pool.put(f);
    }
}

#[test]
fn root_two_workers_read_a_two_queue_uplink_through_fanout() {
    if !is_root() {
        return;
    }
    two_workers_on_a_two_queue_uplink("af_packet");
}

/// As above with an AF_XDP uplink: one socket per queue of the veth, each a worker's.
#[test]
fn root_two_workers_read_a_two_queue_uplink_with_an_af_xdp_socket_per_queue() {
    if !is_root() || !common::have_ebpf() {
        return;
    }
    if picnic_switch::sched::thread_cpus().map_or(0, |c| c.len()) < 2 {
        println!("skipped: needs two CPUs to send on both queues of the veth");
        return;
    }
    two_workers_on_a_two_queue_uplink("af_xdp");
}

/// Two workers, VMs s1 and s2 on one each, the uplink a two-queue veth with `backend`: 32
/// flows to each VM arrive, every frame once, and both workers' uplink sockets read frames.
fn two_workers_on_a_two_queue_uplink(backend: &str) {
    let ns = uplink_namespace(2);
    ns.enter(|| {
        let switch = Switch::open(root_config(backend, 2)).unwrap();
        assert!(
            switch
                .describe_ports()
                .iter()
                .filter(|l| l.contains("pnwup"))
                .count()
                == 2,
            "one uplink socket per worker: {:?}",
            switch.describe_ports()
        );
        let opts = AfPacketOptions::default;
        // 32 flows to each VM, 8 frames each, in batches the switch drains in between, sent
        // by two threads on CPUs 0 and 1: a veth puts a frame sent from an AF_PACKET socket
        // on the queue of the sending CPU (packet_pick_tx_queue), as a NIC's RSS would
        // spread flows.
        const FLOWS: u16 = 32;
        const PER_FLOW: usize = 8;
        let want = FLOWS as usize * PER_FLOW;
        let (delivered, p) = deliver_from_r9(switch, PER_FLOW, want, |_| {
            std::thread::scope(|s| {
                for cpu in 0..2u16 {
                    s.spawn(move || {
                        let _ = picnic_switch::sched::set_thread_cpus(&[cpu as usize]);
                        let mut fabric = AfPacketPort::open("pnwfab", opts()).unwrap();
                        let mut pool = FramePool::new(256);
                        let mut batch: Vec<Frame> = (0..FLOWS)
                            .filter(|flow| flow % 2 == cpu)
                            .flat_map(|flow| [from_r9_flow(1, flow), from_r9_flow(2, flow)])
                            .map(|bytes| {
                                let mut f = pool.get().unwrap();
                                assert!(f.fill_from(&bytes));
                                f
                            })
                            .collect();
                        send_all(&mut fabric, &mut pool, &mut batch);
                    });
                }
            });
        });
        assert_eq!(
            delivered,
            (want, want),
            "every frame to s1 and s2 arrives once"
        );
        let uplink_rx = uplink_rx_per_worker(&p);
        println!(
            "{backend}: uplink frames read per worker: {uplink_rx:?}; workers: {:?}",
            p.workers
        );
        assert_eq!(uplink_rx.len(), 2, "each worker has its uplink socket");
        for (w, rx) in &uplink_rx {
            assert!(
                *rx > 0,
                "worker {w} read part of the uplink (fanout by flow hash)"
            );
        }
        assert!(uplink_rx.iter().map(|(_, rx)| rx).sum::<u64>() >= 2 * want as u64);
        for w in &p.workers {
            assert!(
                w.cpu_ns > 0 && w.vms.len() == 1,
                "worker {} owns a VM and ran",
                w.worker
            );
        }
    });
}

#[test]
fn root_one_worker_reads_every_queue_of_a_four_queue_af_xdp_uplink() {
    if !is_root() || !common::have_ebpf() {
        return;
    }
    every_queue_of_a_four_queue_uplink(1);
}

#[test]
fn root_two_workers_read_every_queue_of_a_four_queue_af_xdp_uplink() {
    if !is_root() || !common::have_ebpf() {
        return;
    }
    every_queue_of_a_four_queue_uplink(2);
}

/// `workers` workers on a four-queue veth uplink read through AF_XDP (issue 13: a queue
/// without a socket passes its frames to the kernel stack, past the switch): 64 flows from r9,
/// one UDP socket each on the fabric side, spread over the four queues by the sender's flow
/// hash; every frame reaches its VM, and on every queue the XDP program redirected all it saw
/// to a socket (veth's per-queue counters). Fails if the flows did not spread over every queue.
fn every_queue_of_a_four_queue_uplink(workers: usize) {
    let ns = uplink_namespace(4);
    // The fabric side sends as host 2 through its IP stack.
    ns.ip("link set pnwfab address 02:00:00:00:01:02");
    ns.ip("addr add 198.19.0.2/24 dev pnwfab");
    ns.ip("neigh add 198.19.0.1 lladdr 02:00:00:00:01:01 dev pnwfab nud permanent");
    ns.enter(|| {
        let switch = Switch::open(root_config("af_xdp", workers)).unwrap();
        let lines = switch.describe_ports();
        assert_eq!(
            lines.iter().filter(|l| l.contains("pnwup")).count(),
            workers,
            "one uplink port per worker: {lines:?}"
        );
        const FLOWS: u16 = 32;
        const PER_FLOW: usize = 8;
        // A UDP socket per flow: the kernel picks a veth transmit queue by flow hash (a veth
        // has no XPS map), which is the peer's receive queue.
        let flows: Vec<(UdpSocket, Vec<u8>)> = (0..FLOWS)
            .flat_map(|flow| [(1u8, flow), (2, flow)])
            .map(|(vm, flow)| {
                let frame = from_r9_flow(vm, flow);
                let outer_port = u16::from_be_bytes([frame[34], frame[35]]);
                let socket = UdpSocket::bind(("198.19.0.2", outer_port)).unwrap();
                // The Geneve header and inner frame, after Ethernet, IPv4 and UDP.
                (socket, frame[42..].to_vec())
            })
            .collect();
        let want = FLOWS as usize * PER_FLOW;
        let (delivered, p) = deliver_from_r9(switch, PER_FLOW, want, |_| {
            for (socket, payload) in &flows {
                socket.send_to(payload, ("198.19.0.1", 6081)).unwrap();
            }
        });
        let queues = xdp_rx_queues(&ns, "pnwup");
        let uplink_rx = uplink_rx_per_worker(&p);
        println!(
            "{workers} worker(s): delivered to s1, s2 {delivered:?} of {want} each; \
             per rx queue (XDP saw, redirected to a socket): {queues:?}; uplink frames read \
             per worker: {uplink_rx:?}"
        );
        assert_eq!(
            delivered,
            (want, want),
            "every frame to s1 and s2 arrives once, none bypasses the switch"
        );
        assert_eq!(queues.len(), 4);
        assert!(
            queues.iter().all(|&(seen, _)| seen > 0),
            "the flows spread over all four queues (else this test proves nothing): {queues:?}"
        );
        assert!(
            queues.iter().all(|&(seen, redirected)| redirected == seen),
            "every queue's frames went to an AF_XDP socket: {queues:?}"
        );
        assert!(queues.iter().map(|q| q.0).sum::<u64>() >= 2 * want as u64);
        assert_eq!(uplink_rx.len(), workers);
        assert!(
            uplink_rx.iter().all(|&(_, rx)| rx > 0),
            "every worker read its queues"
        );
    });
}

/// A namespace with the uplink veth `pnwup` (the switch's side; peer `pnwfab`, the fabric)
/// of `queues` queues each way, and VM veths `pnwv1`/`pnwp1`, `pnwv2`/`pnwp2`.
fn uplink_namespace(queues: usize) -> Netns {
    let ns = Netns::new();
    ns.ip(&format!(
        "link add pnwup numtxqueues {queues} numrxqueues {queues} type veth peer name pnwfab \
         numtxqueues {queues} numrxqueues {queues}"
    ));
    ns.ip("link set pnwup up");
    ns.ip("link set pnwfab up");
    ns.veth_pair("pnwv1", "pnwp1");
    ns.veth_pair("pnwv2", "pnwp2");
    ns
}

/// [`ROOT_CONFIG`] with `workers` workers and an uplink of `backend`.
fn root_config(backend: &str, workers: usize) -> Config {
    let cfg = ROOT_CONFIG
        .replace("workers = 2", &format!("workers = {workers}"))
        .replace(
            "ifname = \"pnwup\"",
            &format!("ifname = \"pnwup\"\nbackend = \"{backend}\""),
        );
    Config::parse(&cfg).unwrap()
}

/// Runs `switch` while `send(round)` sends `rounds` rounds of frames from r9 (the VM ports
/// drained after each), until `want` frames reached each of s1 and s2 (or 5 s passed); stops
/// it and returns how many reached (s1, s2) and its last snapshot.
fn deliver_from_r9(
    mut switch: Switch,
    rounds: usize,
    want: usize,
    mut send: impl FnMut(usize),
) -> ((usize, usize), Arc<Published>) {
    let (stop, shared) = (switch.stop_flag(), switch.shared());
    let dataplane = std::thread::spawn(move || switch.run());
    let opts = AfPacketOptions::default;
    let mut vm1 = AfPacketPort::open("pnwp1", opts()).unwrap();
    let mut vm2 = AfPacketPort::open("pnwp2", opts()).unwrap();
    let mut pool = FramePool::new(4096);
    let (mut to1, mut to2) = (0, 0);
    for round in 0..rounds {
        send(round);
        std::thread::sleep(Duration::from_millis(5 + round as u64));
        count_from_r9(&mut vm1, &mut pool, &mut to1);
        count_from_r9(&mut vm2, &mut pool, &mut to2);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while (to1, to2) != (want, want) && Instant::now() < deadline {
        let _ = wait_readable(
            &[vm1.raw_fd().unwrap(), vm2.raw_fd().unwrap()],
            Duration::from_millis(10),
        );
        count_from_r9(&mut vm1, &mut pool, &mut to1);
        count_from_r9(&mut vm2, &mut pool, &mut to2);
    }
    // A snapshot after the last frame (published every 100 ms).
    std::thread::sleep(Duration::from_millis(250));
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();
    ((to1, to2), shared.latest().unwrap())
}

/// The uplink frames each worker read, as (worker, frames).
fn uplink_rx_per_worker(p: &Published) -> Vec<(usize, u64)> {
    p.ports
        .iter()
        .filter(|port| port.name == "pnwup")
        .map(|port| (port.worker, port.stats.rx_frames))
        .collect()
}

/// Per receive queue of veth `dev` in `ns`: the frames its XDP program saw and those it
/// redirected to an AF_XDP socket (`ethtool -S`: `rx_queue_<q>_xdp_packets`, `_xdp_redirect`).
fn xdp_rx_queues(ns: &Netns, dev: &str) -> Vec<(u64, u64)> {
    let stats = ns.exec(&["ethtool", "-S", dev]);
    let counter = |q: usize, name: &str| {
        let key = format!("rx_queue_{q}_{name}:");
        stats
            .lines()
            .find_map(|l| l.trim().strip_prefix(&key))
            .map(|v| v.trim().parse::<u64>().unwrap())
    };
    (0..)
        .map_while(|q| Some((counter(q, "xdp_packets")?, counter(q, "xdp_redirect")?)))
        .collect()
}

/// Inner IPv4 source (last byte) of a Geneve frame on the underlay, None for anything else.
fn inner_source(f: &Frame) -> Option<u8> {
    let d = f.data();
    // Outer Ethernet 14, IPv4 20, UDP 8 to port 6081, Geneve 8 + options.
    if d.len() < 50 || d[23] != 17 || d[36..38] != [0x17, 0xc1] {
        return None;
    }
    let inner = 50 + 4 * (d[42] & 0x3f) as usize;
    let ip = d.get(inner + 14 + 12..inner + 14 + 16)?;
    (ip[..3] == [198, 18, 0]).then_some(ip[3])
}

/// Two workers on a one-queue AF_XDP uplink: worker 0 has its only socket, worker 1 hands
/// the frames it sends to the uplink to worker 0 (`Handoff::UplinkTx`): 100 frames from
/// each VM all leave on the uplink.
#[test]
fn root_two_workers_send_through_a_one_queue_af_xdp_uplink() {
    if !is_root() || !common::have_ebpf() {
        return;
    }
    let ns = uplink_namespace(1);
    ns.enter(|| {
        let switch = Switch::open(root_config("af_xdp", 2)).unwrap();
        let lines = switch.describe_ports();
        assert_eq!(
            lines.iter().filter(|l| l.contains("pnwup")).count(),
            1,
            "one uplink socket: {lines:?}"
        );
        let (stop, shared) = (switch.stop_flag(), switch.shared());
        let mut switch = switch;
        let dataplane = std::thread::spawn(move || switch.run());
        let opts = AfPacketOptions::default;
        let mut fabric = AfPacketPort::open("pnwfab", opts()).unwrap();
        let mut pool = FramePool::new(1024);
        let mut from = [0usize; 3];
        for round in 0..10 {
            for (dev, vm) in [("pnwp1", 1u8), ("pnwp2", 2u8)] {
                let mut port = AfPacketPort::open(dev, opts()).unwrap();
                let mut batch: Vec<Frame> = (0..10)
                    .map(|_| {
                        let mut f = pool.get().unwrap();
                        assert!(f.fill_from(&udp(vm, 9, 22 + round)));
                        f
                    })
                    .collect();
                send_all(&mut port, &mut pool, &mut batch);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while from[1..] != [100, 100] && Instant::now() < deadline {
            let _ = wait_readable(&[fabric.raw_fd().unwrap()], Duration::from_millis(10));
            let mut got: Vec<Frame> = Vec::new();
            while fabric.recv_batch(&mut pool, &mut got, 256).unwrap() > 0 {}
            for f in got {
                if let Some(src @ 1..=2) = inner_source(&f) {
                    from[src as usize] += 1;
                }
                pool.put(f);
            }
        }
        stop.store(true, Ordering::Relaxed);
        dataplane.join().unwrap().unwrap();
        let p = shared.latest().unwrap();
        println!(
            "on the uplink from s1, s2: {:?}; workers: {:?}",
            &from[1..],
            p.workers
        );
        assert_eq!(
            from[1..],
            [100, 100],
            "every frame of both workers' VMs leaves"
        );
        assert!(
            p.workers.iter().all(|w| w.vms.len() == 1),
            "s1 and s2 on different workers"
        );
    });
}

/// Forwarding rate and switch CPU per forwarded frame with 1 and 2 workers, printed (not a
/// pass mark: the machine's cores are shared with the generators and whatever else runs).
/// Two generator threads, one per VM, each send 64 B frames to remote VM r9 as fast as an
/// AF_PACKET socket lets them for a second; the switch encapsulates them onto the uplink.
/// Run: `sudo cargo test --release -p picnic-switch --test workers -- --ignored --nocapture`.
#[test]
#[ignore]
fn root_forwarding_with_1_and_2_workers_printed() {
    if !is_root() {
        return;
    }
    for workers in [1, 2, 1, 2] {
        let ns = uplink_namespace(2);
        ns.enter(|| {
            let cfg = ROOT_CONFIG
                .replace("workers = 2", &format!("workers = {workers}"))
                .replace(
                    "ifname = \"pnwup\"",
                    "ifname = \"pnwup\"\ncapacity_mbps = 100000\n[ingress]\ncapacity_mbps = 100000",
                );
            let mut switch = Switch::open(Config::parse(&cfg).unwrap()).unwrap();
            let (stop, shared) = (switch.stop_flag(), switch.shared());
            let dataplane = std::thread::spawn(move || switch.run());
            std::thread::sleep(Duration::from_millis(200));
            let idle_start = shared.latest().unwrap();
            std::thread::sleep(Duration::from_secs(1));
            let before = shared.latest().unwrap();
            let idle_ns = before.switch.switch.cpu_ns - idle_start.switch.switch.cpu_ns;
            let window = Duration::from_secs(1);
            let offered: u64 = std::thread::scope(|s| {
                let gens: Vec<_> = [("pnwp1", 1u8), ("pnwp2", 2u8)]
                    .into_iter()
                    .map(|(dev, vm)| {
                        s.spawn(move || {
                            let mut port = AfPacketPort::open(dev, AfPacketOptions::default()).unwrap();
                            let mut pool = FramePool::new(1024);
                            let frame = udp(vm, 9, 22);
                            let (start, mut sent) = (Instant::now(), 0u64);
                            while start.elapsed() < window {
                                let mut batch: Vec<Frame> = (0..64)
                                    .map(|_| {
                                        let mut f = pool.get().unwrap();
                                        assert!(f.fill_from(&frame));
                                        f
                                    })
                                    .collect();
                                sent += port.send_batch(&mut batch, &mut pool).unwrap_or(0) as u64;
                                for f in batch.drain(..) {
                                    pool.put(f);
                                }
                            }
                            sent
                        })
                    })
                    .collect();
                gens.into_iter().map(|g| g.join().unwrap()).sum()
            });
            std::thread::sleep(Duration::from_millis(200));
            let after = shared.latest().unwrap();
            stop.store(true, Ordering::Relaxed);
            dataplane.join().unwrap().unwrap();
            let tx = |p: &Published| {
                p.ports
                    .iter()
                    .filter(|port| port.name == "pnwup")
                    .map(|port| port.stats.tx_frames)
                    .sum::<u64>()
            };
            let forwarded = tx(&after) - tx(&before);
            let cpu = after.switch.switch.cpu_ns - before.switch.switch.cpu_ns;
            println!(
                "workers {workers}: idle CPU {:.2}% of a core; offered {offered} frames, forwarded {forwarded} ({:.0} kpps over the 1 s window), switch CPU {:.1} ms, {:.0} ns per forwarded frame",
                idle_ns as f64 / 1e7,
                forwarded as f64 / 1e3,
                cpu as f64 / 1e6,
                cpu as f64 / forwarded.max(1) as f64
            );
        });
    }
}
