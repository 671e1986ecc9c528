//! Two dataplane workers. On in-memory ports (no root): VMs on both workers, frames between
//! VMs of different workers (handed over through the mailboxes) and from the uplink (read by
//! worker 0 only, handed to the owner of each frame's VM) all arrive, both workers do work,
//! and the per-worker CPU splits add up to the switch's total exactly (Iron 3.1). As root, in
//! a `pn-t-*` namespace: a two-queue veth uplink read by both workers through an AF_PACKET
//! fanout group, every frame delivered to VMs on both workers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod common;
use common::{is_root, send_all, udp, Netns};
use picnic_switch::config::Config;
use picnic_switch::engine::Engine;
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{wait_readable, AfPacketOptions, AfPacketPort};
use picnic_switch::port::{MemoryPort, Port};
use picnic_switch::runner::{Clock, Published, Reconfigure, Switch};
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

/// Live changes with two workers: a change of a VM's rates and removing a VM are applied to
/// the workers in place; frames keep flowing between the VMs that stay, and every reply comes.
#[test]
fn two_workers_take_live_changes() {
    let cfg = Config::parse(CONFIG).unwrap();
    let (mut switch, h) = common::memory_switch(cfg.clone(), &["up0", "s1", "s2", "l1", "l2"]);
    let (stop, shared, commands) = (
        switch.stop_flag(),
        switch.shared(),
        switch.command_channel(),
    );
    let dataplane = std::thread::spawn(move || switch.run());
    let s1_s2 = udp(1, 2, 64);
    let exchange = |n: usize| {
        for _ in 0..n {
            assert!(h[1].inject(&s1_s2));
        }
        let (deadline, mut got) = (Instant::now() + Duration::from_secs(10), 0);
        while got < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            while h[2].pop_sent().is_some() {
                got += 1;
            }
        }
        got
    };
    let change = |cfg: &Config| {
        let (tx, rx) = std::sync::mpsc::channel();
        commands
            .send(picnic_switch::runner::Command::Reconfigure(
                Box::new(Reconfigure::to(cfg.clone())),
                tx,
            ))
            .unwrap();
        rx.recv_timeout(Duration::from_secs(10)).expect("a reply")
    };
    assert_eq!(exchange(50), 50);
    let mut rates = cfg.clone();
    rates.vms[1].min_mbps += 5;
    change(&rates).unwrap();
    assert_eq!(exchange(50), 50, "after a rate change in place");
    let mut fewer = rates.clone();
    fewer.vms.retain(|v| v.name != "l2");
    change(&fewer).unwrap();
    assert_eq!(exchange(50), 50, "after l2 was removed");
    std::thread::sleep(Duration::from_millis(250));
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();
    let p = shared.latest().unwrap();
    let names: Vec<&str> = p.switch.vms.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["s1", "s2", "l1"]);
    let s2 = p.switch.vms.iter().find(|v| v.name == "s2").unwrap();
    assert_eq!(
        s2.counters.rx_packets, 150,
        "counters carried over both changes"
    );
    assert_eq!(shared.config().unwrap().vms.len(), 4);
}

/// A switch's reply to a live change of `commands` to `cfg`.
fn change(
    commands: &std::sync::mpsc::Sender<picnic_switch::runner::Command>,
    cfg: &Config,
) -> anyhow::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    commands
        .send(picnic_switch::runner::Command::Reconfigure(
            Box::new(Reconfigure::to(cfg.clone())),
            tx,
        ))
        .unwrap();
    rx.recv_timeout(Duration::from_secs(10)).expect("a reply")
}

/// Issue 15 with two workers: VM b1 (tenant u, capped at 1 Mb/s so its frames wait in its
/// queue) is added and removed 100 times while the neighbours' flows run on both workers
/// (s1 -> s2 and l2 -> l1 across the workers, r9 -> s2 from the uplink). No worker stops: every
/// neighbour frame arrives, b1 is placed on a worker and its port handed to it each time, the
/// frames b1 had queued go back to the pool (its free count is the capacity once idle), and a
/// request whose new port cannot be opened changes nothing and says which field failed.
#[test]
fn two_workers_add_and_remove_a_vm_100_times_without_touching_the_neighbours() {
    let base = CONFIG.to_string()
        + r#"
[[tenants]]
name = "u"
vni = 300
[[vms]]
name = "r8"
id = 8
tenant = "u"
host = 2
mac = "02:00:00:00:00:08"
ip = "198.18.0.8"
"#;
    let cfg = Config::parse(&base).unwrap();
    let with_b1 = Config::parse(
        &(base.clone()
            + r#"
[[vms]]
name = "b1"
id = 5
tenant = "u"
host = 1
mac = "02:00:00:00:00:05"
ip = "198.18.0.5"
min_mbps = 1
max_mbps = 1
port = { ifname = "b1" }
"#),
    )
    .unwrap();
    let (mut switch, h) = common::memory_switch(cfg.clone(), &["up0", "s1", "s2", "l1", "l2"]);
    // b1's port: a new in-memory port each time it is added, its handle kept for the test.
    let b1_ports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handles = b1_ports.clone();
    switch.set_port_opener(std::sync::Arc::new(
        move |spec: &picnic_switch::runner::PortSpec| {
            anyhow::ensure!(
                spec.ifname == "b1",
                "{}: cannot open '{}'",
                spec.field,
                spec.ifname
            );
            let (p, h) = MemoryPort::new(&spec.ifname);
            handles.lock().unwrap().push(h);
            Ok(Box::new(p) as Box<dyn Port>)
        },
    ));
    let (stop, shared, commands) = (
        switch.stop_flag(),
        switch.shared(),
        switch.command_channel(),
    );
    let dataplane = std::thread::spawn(move || switch.run());
    let (s1_s2, l2_l1, r9_s2, b1_r8) = (udp(1, 2, 64), udp(4, 3, 64), from_r9(2), udp(5, 8, 1000));
    const CYCLES: usize = 100;
    const EACH: usize = 5;
    let mut got = [0usize; 5];
    let drain = |got: &mut [usize; 5]| {
        for (p, n) in got.iter_mut().enumerate() {
            while h[p].pop_sent().is_some() {
                *n += 1;
            }
        }
    };
    let started = Instant::now();
    for _ in 0..CYCLES {
        change(&commands, &with_b1).unwrap();
        let b1 = b1_ports.lock().unwrap().last().cloned().unwrap();
        for _ in 0..20 {
            assert!(b1.inject(&b1_r8));
        }
        for _ in 0..EACH {
            assert!(h[1].inject(&s1_s2) && h[4].inject(&l2_l1) && h[0].inject(&r9_s2));
        }
        std::thread::sleep(Duration::from_millis(1));
        drain(&mut got);
        change(&commands, &cfg).unwrap();
        drain(&mut got);
    }
    let took = started.elapsed();
    let want = [CYCLES * EACH, 2 * CYCLES * EACH, CYCLES * EACH, 0];
    let deadline = Instant::now() + Duration::from_secs(10);
    while got[2..] != want[1..] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        drain(&mut got);
    }
    // s2: s1's and r9's frames; l1: l2's.
    assert_eq!(
        [got[2], got[3]],
        [want[1], want[2]],
        "neighbour frames out of s2 and l1"
    );
    assert_eq!(
        b1_ports.lock().unwrap().len(),
        CYCLES,
        "b1's port opened each time"
    );
    // Every frame back in the pools once the queues drained (published every 100 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut p = shared.latest().unwrap();
    while p.pool_free != p.pool_capacity && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        p = shared.latest().unwrap();
    }
    assert_eq!(
        p.pool_free, p.pool_capacity,
        "frames missing from the pools"
    );
    // A port that cannot be opened: the whole request is refused, b1 stays away, and the
    // neighbours' guarantee change in the same request is not applied.
    let mut bad = with_b1.clone();
    bad.vms.last_mut().unwrap().port.as_mut().unwrap().ifname = "nosuch".into();
    bad.vms[1].min_mbps += 5;
    let err = change(&commands, &bad).unwrap_err().to_string();
    assert!(err.contains("vms[6].port.ifname"), "{err}");
    assert_eq!(shared.config().unwrap().vms.len(), cfg.vms.len());
    assert_eq!(
        shared.config().unwrap().vms[1].min_mbps,
        cfg.vms[1].min_mbps
    );
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();
    let p = shared.latest().unwrap();
    let full: Vec<u64> = p.workers.iter().map(|w| w.handoff.full).collect();
    assert_eq!(full, [0, 0], "no mailbox overflowed");
    println!(
        "{CYCLES} add/remove cycles in {took:?} ({:.1} ms per change); neighbour frames {:?} of {:?}; pool {}/{}",
        took.as_secs_f64() * 1e3 / (2 * CYCLES) as f64,
        [got[2], got[3]],
        [want[1], want[2]],
        p.pool_free,
        p.pool_capacity
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

const ROOT_CONFIG: &str = r#"
[switch]
host_id = 1
workers = 2
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
    let ns = Netns::new();
    ns.ip("link add pnwup numtxqueues 2 numrxqueues 2 type veth peer name pnwfab numtxqueues 2 numrxqueues 2");
    ns.ip("link set pnwup up");
    ns.ip("link set pnwfab up");
    ns.veth_pair("pnwv1", "pnwp1");
    ns.veth_pair("pnwv2", "pnwp2");
    ns.enter(|| {
        let cfg = ROOT_CONFIG.replace(
            "ifname = \"pnwup\"",
            &format!("ifname = \"pnwup\"\nbackend = \"{backend}\""),
        );
        let switch = Switch::open(Config::parse(&cfg).unwrap()).unwrap();
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
        let (stop, shared) = (switch.stop_flag(), switch.shared());
        let mut switch = switch;
        let dataplane = std::thread::spawn(move || switch.run());
        let opts = AfPacketOptions::default;
        let mut vm1 = AfPacketPort::open("pnwp1", opts()).unwrap();
        let mut vm2 = AfPacketPort::open("pnwp2", opts()).unwrap();
        let mut pool = FramePool::new(4096);
        // 32 flows to each VM, 8 frames each, in batches the switch drains in between, sent
        // by two threads on CPUs 0 and 1: a veth puts a frame sent from an AF_PACKET socket
        // on the queue of the sending CPU (packet_pick_tx_queue), as a NIC's RSS would
        // spread flows.
        const FLOWS: u16 = 32;
        const PER_FLOW: usize = 8;
        let (mut to1, mut to2) = (0, 0);
        for round in 0..PER_FLOW {
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
            std::thread::sleep(Duration::from_millis(5 + round as u64));
            count_from_r9(&mut vm1, &mut pool, &mut to1);
            count_from_r9(&mut vm2, &mut pool, &mut to2);
        }
        let want = FLOWS as usize * PER_FLOW;
        let deadline = Instant::now() + Duration::from_secs(5);
        while (to1, to2) != (want, want) && Instant::now() < deadline {
            let _ = wait_readable(
                &[vm1.raw_fd().unwrap(), vm2.raw_fd().unwrap()],
                Duration::from_millis(10),
            );
            count_from_r9(&mut vm1, &mut pool, &mut to1);
            count_from_r9(&mut vm2, &mut pool, &mut to2);
        }
        assert_eq!(
            (to1, to2),
            (want, want),
            "every frame to s1 and s2 arrives once"
        );
        std::thread::sleep(Duration::from_millis(250));
        stop.store(true, Ordering::Relaxed);
        dataplane.join().unwrap().unwrap();
        let p = shared.latest().unwrap();
        let uplink_rx: Vec<(usize, u64)> = p
            .ports
            .iter()
            .filter(|port| port.name == "pnwup")
            .map(|port| (port.worker, port.stats.rx_frames))
            .collect();
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
        let ns = Netns::new();
        ns.ip("link add pnwup numtxqueues 2 numrxqueues 2 type veth peer name pnwfab numtxqueues 2 numrxqueues 2");
        ns.ip("link set pnwup up");
        ns.ip("link set pnwfab up");
        ns.veth_pair("pnwv1", "pnwp1");
        ns.veth_pair("pnwv2", "pnwp2");
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
