//! The uplink's XDP program: the frames of throttled VMs and of VMs over their packet budget
//! are dropped before the AF_XDP socket, counted per VM and reason.

use std::time::Duration;

use crate::common::{collect, have_ebpf, is_root, send_all, Netns};
use crate::{geneve_to, A1, A2, A3, B1, INNER_ETHERTYPE};
use picnic_switch::engine::{XdpThrottle, XDP_CPU, XDP_PPS};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Port};

/// (VNI, inner destination MAC) of a frame the tests sent, None for anything else.
fn destination(f: &Frame) -> Option<(u32, [u8; 6])> {
    let d = f.data();
    // Outer Ethernet 14 + IPv4 20 + UDP 8 + Geneve 8 = 50; the inner frame follows.
    let inner = d.get(50..)?;
    (inner.get(12..14)? == INNER_ETHERTYPE).then(|| {
        let vni = u32::from_be_bytes(inner[14..18].try_into().unwrap());
        (vni, inner[0..6].try_into().unwrap())
    })
}

/// Sends `n` frames to each of `to` through `tx` and returns how many of each `rx` got.
fn send_and_count(
    tx: &mut AfPacketPort,
    rx: &mut AfXdpPort,
    pool: &mut FramePool,
    to: &[(u32, [u8; 6])],
    n: u32,
) -> Vec<usize> {
    let mut got = Vec::new();
    for seq in 0..n {
        let mut batch: Vec<Frame> = to
            .iter()
            .map(|&(vni, mac)| {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(&geneve_to(vni, mac, seq)));
                f
            })
            .collect();
        send_all(tx, pool, &mut batch);
        if seq % 16 == 0 {
            rx.recv_batch(pool, &mut got, usize::MAX).unwrap();
        }
    }
    // Whatever passes has arrived by then (a veth delivers within microseconds).
    collect(rx, pool, &mut got, Duration::from_millis(500), |_| false);
    let counts = to
        .iter()
        .map(|d| got.iter().filter(|f| destination(f) == Some(*d)).count())
        .collect();
    for f in got {
        pool.put(f);
    }
    counts
}

/// The uplink's XDP program drops the Geneve frames of the VMs the switch marked throttled
/// before they reach the AF_XDP socket, counts them per VM and reason, and passes everyone
/// else's; a released VM's frames pass again.
#[test]
fn xdp_drops_throttled_vms_frames_before_the_socket_and_counts_them() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnea", "pneb");
    ns.enter(|| {
        let mut up = AfXdpPort::open("pnea", AfXdpOptions::default()).unwrap();
        let mut early = up
            .early_drop()
            .expect("an AF_XDP port has the early-drop maps");
        assert!(up.early_drop().is_none(), "handed out once");
        let mut peer = AfPacketPort::open("pneb", AfPacketOptions::default()).unwrap();
        let mut pool = FramePool::new(8192);
        // Tenant 100: a1 over its CPU budget, a2 over its packet budget, a3 not held back;
        // tenant 200's b1 not held back either.
        let throttled = [
            XdpThrottle {
                vni: 100,
                mac: A1,
                slot: 1,
                reasons: XDP_CPU,
            },
            XdpThrottle {
                vni: 100,
                mac: A2,
                slot: 2,
                reasons: XDP_PPS,
            },
        ];
        early.apply(&throttled).unwrap();
        let to = [(100, A1), (100, A2), (100, A3), (200, B1), (200, A1)];
        let got = send_and_count(&mut peer, &mut up, &mut pool, &to, 300);
        assert_eq!(got, vec![0, 0, 300, 300, 300], "received per destination");
        let mut drops = Vec::new();
        early.new_drops(&[1, 2, 3], &mut drops);
        drops.sort();
        assert_eq!(
            drops,
            vec![(1, 0, 300), (2, 1, 300)],
            "(slot, reason, frames)"
        );
        // Released: a1 and a2 are received again, and nothing more is counted.
        early.apply(&[]).unwrap();
        let got = send_and_count(&mut peer, &mut up, &mut pool, &to, 100);
        assert_eq!(got, vec![100; 5]);
        early.new_drops(&[1, 2, 3], &mut drops);
        assert_eq!(drops, vec![]);
        assert_eq!(pool.available(), pool.capacity(), "no frame leaked");
    });
}

/// A switch with an AF_XDP uplink: `b1` may receive 1000 packets/s, `a1` is not limited.
const XDP_SWITCH: &str = r#"
[switch]
host_id = 1
# What is tested is the engines' path: the kernel fast path (the default) would carry
# these frames past them.
[fastpath]
kernel = false
[uplink]
ifname = "pnxu"
backend = "af_xdp"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[hosts]]
id = 2
underlay_ip = "198.19.0.2"
mac = "02:00:00:00:01:02"
[[tenants]]
name = "a"
vni = 100
[[tenants]]
name = "b"
vni = 200
[[vms]]
name = "a1"
id = 1
tenant = "a"
host = 1
mac = "02:00:00:00:00:a1"
ip = "198.18.0.1"
port = { ifname = "pnxa" }
[[vms]]
name = "b1"
id = 2
tenant = "b"
host = 1
mac = "02:00:00:00:00:b1"
ip = "198.18.0.2"
max_pps = 1000
port = { ifname = "pnxb" }
[[vms]]
name = "a2"
id = 3
tenant = "a"
host = 2
mac = "02:00:00:00:00:64"
ip = "198.18.0.3"
allow_ethertypes = [0x88b5]
[[vms]]
name = "b2"
id = 4
tenant = "b"
host = 2
mac = "02:00:00:00:00:c8"
ip = "198.18.0.4"
allow_ethertypes = [0x88b5]
"#;

/// Issue 12 item 3 on a running switch: frames from the uplink to a VM over its packet
/// budget are dropped by the uplink's XDP program (most of the excess: `pps_limit_xdp`), the
/// VM still gets its budget, and another tenant's VM gets every frame.
#[test]
fn a_vm_over_its_packet_budget_is_dropped_in_xdp_on_a_running_switch() {
    packet_budget_dropped_in_xdp(1);
}

/// The same with two workers: b1 is worker 1's, which sets its VMs' entries in the map
/// through a handle of its own (issue 13: early drop on the worker model).
#[test]
fn a_vm_over_its_packet_budget_is_dropped_in_xdp_by_its_worker() {
    packet_budget_dropped_in_xdp(2);
}

fn packet_budget_dropped_in_xdp(workers: usize) {
    if !is_root() || !have_ebpf() {
        return;
    }
    let ns = Netns::new();
    for (a, b) in [("pnxu", "pnxv"), ("pnxa", "pnxc"), ("pnxb", "pnxd")] {
        ns.veth_pair(a, b);
    }
    let text = XDP_SWITCH.replace("host_id = 1", &format!("host_id = 1\nworkers = {workers}"));
    let cfg = picnic_switch::config::Config::parse(&text).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (shared, early, elapsed) = std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter(|| {
                let mut switch = picnic_switch::runner::Switch::open(cfg).unwrap();
                let early = switch
                    .describe_ports()
                    .iter()
                    .any(|l| l.contains("early drop"));
                tx.send((switch.stop_flag(), switch.shared(), early))
                    .unwrap();
                switch.run().unwrap();
            })
        });
        let (stop, shared, early) = rx.recv().unwrap();
        // Host 2 sends 3,000 frames to each VM over half a second, 10 each every 1.7 ms:
        // b1 at 6x its budget.
        let started = std::time::Instant::now();
        ns.enter(|| {
            let mut port = AfPacketPort::open("pnxv", AfPacketOptions::default()).unwrap();
            let mut pool = FramePool::new(1024);
            for round in 0..300u32 {
                let mut batch = Vec::new();
                for i in 0..10 {
                    for (vni, mac) in [(100, [2, 0, 0, 0, 0, 0xa1]), (200, [2, 0, 0, 0, 0, 0xb1])] {
                        let mut f = pool.get().unwrap();
                        f.fill_from(&geneve_to(vni, mac, round * 10 + i));
                        batch.push(f);
                    }
                }
                send_all(&mut port, &mut pool, &mut batch);
                std::thread::sleep(Duration::from_micros(1_660));
            }
        });
        let elapsed = started.elapsed();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (shared, early, elapsed)
    });
    assert!(early, "an AF_XDP uplink has early drop");
    let snap = shared.latest().unwrap();
    let vm = |n: &str| {
        snap.switch
            .vms
            .iter()
            .find(|v| v.name == n)
            .unwrap()
            .counters
            .clone()
    };
    let worker = |n: &str| snap.switch.vms.iter().find(|v| v.name == n).unwrap().worker;
    assert_eq!(
        (worker("a1"), worker("b1")),
        (0, workers - 1),
        "with two workers b1 is the second's"
    );
    let (a1, b1) = (vm("a1"), vm("b1"));
    use picnic_switch::stats::DropReason::{PpsLimit, PpsLimitXdp};
    let (in_xdp, in_switch) = (b1.drops.get(PpsLimitXdp), b1.drops.get(PpsLimit));
    println!(
        "{workers} worker(s): a1 received {}; b1 received {} in {elapsed:?}, dropped {in_xdp} \
         in XDP, {in_switch} in the switch",
        a1.rx_packets, b1.rx_packets
    );
    assert_eq!(a1.rx_packets, 3000, "the other tenant's VM gets everything");
    assert_eq!(a1.drops.total(), 0);
    // b1's budget: a 64-frame burst plus 1000/s over the run (the loop may lag a little).
    let budget = 64 + (elapsed.as_secs_f64() * 1000.0) as u64;
    assert!(
        b1.rx_packets <= budget + 32,
        "b1 got {} > {budget}",
        b1.rx_packets
    );
    assert!(b1.rx_packets >= budget / 2, "b1 still gets its budget");
    assert_eq!(
        b1.rx_packets + in_xdp + in_switch,
        3000,
        "every frame accounted for"
    );
    assert!(
        in_xdp > 4 * in_switch,
        "most of the excess never reaches the switch"
    );
}

/// Issue 13, AF_XDP by default: without `uplink.backend` the uplink is AF_XDP, with its early
/// drop; when the device cannot take the switch's XDP program (here another AF_XDP socket
/// already holds its XDP hook) the switch opens AF_PACKET instead and runs.
#[test]
fn without_the_fast_path_the_uplink_is_af_xdp_by_default_and_falls_back_to_af_packet() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let ns = Netns::new();
    for (a, b) in [("pnxu", "pnxv"), ("pnxa", "pnxc"), ("pnxb", "pnxd")] {
        ns.veth_pair(a, b);
    }
    let text = XDP_SWITCH.replace("backend = \"af_xdp\"\n", "");
    let cfg = picnic_switch::config::Config::parse(&text).unwrap();
    assert_eq!(cfg.uplink.backend, None, "the test config names no backend");
    let uplink = |lines: &[String]| lines.iter().find(|l| l.starts_with("port 0 ")).cloned();
    let lines = ns.enter(|| {
        picnic_switch::runner::Switch::open(cfg.clone())
            .unwrap()
            .describe_ports()
    });
    println!("{lines:#?}");
    assert!(uplink(&lines).unwrap().contains("af_xdp"), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("early drop")), "{lines:?}");
    let lines = ns.enter(|| {
        let _holder = AfXdpPort::open("pnxu", AfXdpOptions::default()).unwrap();
        picnic_switch::runner::Switch::open(cfg)
            .unwrap()
            .describe_ports()
    });
    println!("{lines:#?}");
    assert!(uplink(&lines).unwrap().contains("af_packet"), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("early drop")), "{lines:?}");
}
