//! Two dataplane workers. On in-memory ports (no root): VMs on both workers, frames between
//! VMs of different workers (handed over through the mailboxes) and from the uplink (read by
//! worker 0 only, handed to the owner of each frame's VM) all arrive, both workers do work,
//! and the per-worker CPU splits add up to the switch's total exactly (Iron 3.1). As root, in
//! a `pn-t-*` namespace: a two-queue veth uplink read by both workers through an AF_PACKET
//! fanout group, every frame delivered to VMs on both workers.
//!
//! Split by concern: this file forwards and shares the links with two workers, `live.rs`
//! applies live changes to them, `root.rs` runs them on a two-queue veth uplink (root),
//! `encrypt.rs` shares the encryption engine between them (root).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;
mod encrypt;
mod live;
mod root;

use common::udp;
use picnic_switch::config::Config;
use picnic_switch::engine::Engine;
use picnic_switch::port::{MemoryPort, Port};
use picnic_switch::runner::{Clock, Switch};
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap, OuterHeaders};

const CONFIG: &str = r#"
[switch]
host_id = 1
workers = 2
[uplink]
ifname = "up0"
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
[[tenants]]
name = "large"
vni = 200
[[vms]]
name = "s1"
id = 1
tenant = "small"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "s1" }
[[vms]]
name = "s2"
id = 2
tenant = "small"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = { ifname = "s2" }
[[vms]]
name = "l1"
id = 3
tenant = "large"
host = 1
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
port = { ifname = "l1" }
[[vms]]
name = "l2"
id = 4
tenant = "large"
host = 1
mac = "02:00:00:00:00:04"
ip = "198.18.0.4"
port = { ifname = "l2" }
[[vms]]
name = "r9"
id = 9
tenant = "small"
host = 2
mac = "02:00:00:00:00:09"
ip = "198.18.0.9"
"#;

/// A frame of remote VM r9 (host 2) to local VM `dst`, as host 2's switch encapsulates it.
fn from_r9(dst: u8) -> Vec<u8> {
    from_r9_flow(dst, 0)
}

/// As [`from_r9`], for flow `flow` (its own outer UDP source port and inner source port).
fn from_r9_flow(dst: u8, flow: u16) -> Vec<u8> {
    let mut inner = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, dst])
        .ipv4([198, 18, 0, 9], [198, 18, 0, dst], 64)
        .udp(40000 + flow, 7)
        .write(&mut inner, &[0u8; 200])
        .unwrap();
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: [198, 19, 0, 2].into(),
        dst_ip: [198, 19, 0, 1].into(),
        src_port: 50000 + u16::from(dst) * 256 + flow,
        ttl: 64,
    };
    let mut out = vec![0u8; 2048];
    let n = encap(&outer, &GeneveRepr::ethernet(100), &inner, &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn two_workers_forward_between_their_vms_and_from_the_uplink() {
    let cfg = Config::parse(CONFIG).unwrap();
    let (mut switch, h) = common::memory_switch(cfg, &["up0", "s1", "s2", "l1", "l2"]);
    let (stop, shared) = (switch.stop_flag(), switch.shared());
    let dataplane = std::thread::spawn(move || switch.run());

    // Equal guarantees: s1 and l1 on worker 0, s2 and l2 on worker 1 (config order).
    let (s1_s2, l2_l1) = (udp(1, 2, 64), udp(4, 3, 64));
    let (r9_s1, r9_s2) = (from_r9(1), from_r9(2));
    const ROUNDS: usize = 200;
    let mut got = [0usize; 5];
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..ROUNDS {
        for (port, frame) in [(1, &s1_s2), (4, &l2_l1), (0, &r9_s1), (0, &r9_s2)] {
            assert!(h[port].inject(frame));
        }
        std::thread::sleep(Duration::from_micros(500));
        for (p, n) in got.iter_mut().enumerate() {
            while h[p].pop_sent().is_some() {
                *n += 1;
            }
        }
    }
    while got[1..] != [ROUNDS, 2 * ROUNDS, ROUNDS, 0] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        for (p, n) in got.iter_mut().enumerate() {
            while h[p].pop_sent().is_some() {
                *n += 1;
            }
        }
    }
    // s1: r9's frames; s2: s1's and r9's; l1: l2's; nothing to l2 (the uplink carries the
    // receivers' feedback to host 2).
    assert_eq!(
        got[1..],
        [ROUNDS, 2 * ROUNDS, ROUNDS, 0],
        "frames out of s1, s2, l1, l2"
    );
    std::thread::sleep(Duration::from_millis(250));
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();

    let p = shared.latest().unwrap();
    let worker_of = |name: &str| p.switch.vms.iter().find(|v| v.name == name).unwrap().worker;
    assert_eq!(
        ["s1", "s2", "l1", "l2"].map(worker_of),
        [0, 1, 0, 1],
        "the assignment as /stats shows it"
    );
    assert_eq!(p.workers.len(), 2);
    for w in &p.workers {
        assert!(w.cpu_ns > 0, "worker {} ran", w.worker);
        assert!(w.handoff.out > 0, "worker {} handed frames over", w.worker);
        assert_eq!(w.handoff.full, 0);
    }
    // Worker 1 owns s2 and l2: r9's frames to s2 came through worker 0's uplink.
    assert_eq!(p.workers[1].vms, vec!["s2".to_string(), "l2".to_string()]);
    let c = &p.switch.switch;
    let charged: u64 = p.switch.vms.iter().map(|v| v.counters.cost_ns).sum();
    assert_eq!(
        charged + c.unattributed_ns + c.overhead_ns,
        c.cpu_ns,
        "the workers' splits add up exactly"
    );
    assert_eq!(c.cpu_ns, p.workers.iter().map(|w| w.cpu_ns).sum::<u64>());
    let rx = |name: &str| {
        let v = p.switch.vms.iter().find(|v| v.name == name).unwrap();
        v.counters.rx_packets
    };
    assert_eq!(
        ["s1", "s2", "l1"].map(rx),
        [ROUNDS as u64, 2 * ROUNDS as u64, ROUNDS as u64]
    );
}

/// EyeQ's access link with two workers: s1 (worker 0) and s2 (worker 1) each receive more
/// than half of a 10 Mb/s access link from r9. Each worker's link receiver meters only its
/// own VM, so alone each would advertise nearly the whole link (together ~1.8x it); with the
/// link split between the workers' receivers by the coordinator, what they advertise adds up
/// to the link less its headroom.
#[test]
fn two_workers_split_the_access_link_between_their_receivers() {
    let cfg = Config::parse(&(CONFIG.to_string() + "[ingress]\ncapacity_mbps = 10\n")).unwrap();
    let (mut switch, h) = common::memory_switch(cfg, &["up0", "s1", "s2", "l1", "l2"]);
    let (stop, shared) = (switch.stop_flag(), switch.shared());
    let dataplane = std::thread::spawn(move || switch.run());
    // ~8-10 Mb/s to each VM (a frame of ~300 B each every ~250 us, steadily: EyeQ's active
    // set forgets an endpoint idle for 1 ms) for 1 s; the snapshot sampled every 10 ms.
    let (to_s1, to_s2) = (from_r9(1), from_r9(2));
    let start = Instant::now();
    let mut sums = Vec::new();
    let mut next_sample = start;
    while start.elapsed() < Duration::from_millis(1000) {
        h[0].inject(&to_s1);
        h[0].inject(&to_s2);
        std::thread::sleep(Duration::from_micros(200));
        if Instant::now() < next_sample {
            continue;
        }
        next_sample += Duration::from_millis(10);
        for port in &h {
            while port.pop_sent().is_some() {}
        }
        if start.elapsed() > Duration::from_millis(500) {
            let p = shared.latest().unwrap();
            let adv = |name: &str| {
                let v = p.switch.vms.iter().find(|v| v.name == name).unwrap();
                v.advertised_bps.unwrap_or(0)
            };
            sums.push((adv("s1"), adv("s2")));
        }
    }
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();
    // An endpoint caught idle advertises nothing: the largest of each.
    let s1 = sums.iter().map(|s| s.0).max().unwrap();
    let s2 = sums.iter().map(|s| s.1).max().unwrap();
    let most = sums.iter().map(|(a, b)| a + b).max().unwrap();
    println!(
        "advertised at most: s1 {s1} b/s, s2 {s2} b/s; largest sum in the last 0.5 s {most} b/s"
    );
    assert!(s1 > 0 && s2 > 0, "both VMs' senders are told a rate");
    assert!(
        most <= 10_000_000,
        "the two receivers hand out at most the link: {most} b/s"
    );
}

/// Two workers' egress share the uplink's pacer (EyeQ 4's token caches): two VMs on different
/// workers, each offering more than the link, together leave at the link's rate, not twice it.
#[test]
fn two_workers_share_the_uplink_pacer() {
    const MBPS: u64 = 10;
    let cfg = Config::parse(&CONFIG.replace(
        "ifname = \"up0\"",
        &format!("ifname = \"up0\"\ncapacity_mbps = {MBPS}"),
    ))
    .unwrap();
    let clock = Clock::new();
    let engine = Engine::new(&cfg, clock.now()).unwrap();
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    let mut h = Vec::new();
    for name in ["up0", "s1", "s2", "l1", "l2"] {
        let (p, handle) = MemoryPort::with_capacity(name, 4096);
        ports.push(Box::new(p));
        h.push(handle);
    }
    let mut switch = Switch::with_ports(cfg, engine, ports, clock);
    let (stop, shared) = (switch.stop_flag(), switch.shared());
    let dataplane = std::thread::spawn(move || switch.run());
    // s1 (worker 0) and s2 (worker 1) each offer ~12 Mb/s to r9 for 1.5 s.
    let (a, b) = (udp(1, 9, 1000), udp(2, 9, 1000));
    let start = Instant::now();
    let mut sent_bytes = 0u64;
    while start.elapsed() < Duration::from_millis(1500) {
        for _ in 0..3 {
            h[1].inject(&a);
            h[2].inject(&b);
        }
        std::thread::sleep(Duration::from_millis(2));
        while let Some(f) = h[0].pop_sent() {
            sent_bytes += f.len() as u64;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    dataplane.join().unwrap().unwrap();
    while let Some(f) = h[0].pop_sent() {
        sent_bytes += f.len() as u64;
    }
    let p = shared.latest().unwrap();
    let from = |name: &str| {
        let v = p.switch.vms.iter().find(|v| v.name == name).unwrap();
        v.counters.tx_packets
    };
    println!(
        "{sent_bytes} B out of the uplink in {elapsed:?} (s1 {} frames, s2 {})",
        from("s1"),
        from("s2")
    );
    // The link's bytes in the time plus its burst (1 ms), what the workers' caches may hold
    // (a chunk each: together half a burst) and a frame each of debt; two pacers of their
    // own would let both VMs' ~20 Mb/s through.
    let rate = MBPS * 1_000_000 / 8;
    let burst = (rate / 1000).max(3 * 1514);
    let bound = rate * elapsed.as_millis() as u64 / 1000 + 2 * burst + 2 * 1100;
    assert!(sent_bytes <= bound, "{sent_bytes} B > {bound} B");
    assert!(from("s1") > 0 && from("s2") > 0, "both workers sent");
}
