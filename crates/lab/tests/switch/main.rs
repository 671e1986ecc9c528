//! Root integration tests of the picnic switch (issue 3): two hosts in network namespaces,
//! tenants blue and red with one VM on each host, a `picnic switch` per host (isolation on)
//! joining the VM ports to the host's uplink over Geneve. They show:
//!
//! - same-tenant ICMP echo, ping, TCP and iperf3 across hosts; nothing across tenants;
//! - cross-tenant and spoofed frames (from a VM port and forged on the fabric) dropped,
//!   counted by reason, none delivered;
//! - malformed frames counted while a latency probe keeps running;
//! - a flow shaped to 10 Mb/s keeps its rate without raising the fast path's latency;
//! - feedback from a congested receiver lowers the sender's applied rate (EyeQ 3.3).
//!
//! Every test builds its own testbed (addresses from 198.18.0.0/15 only), sends bounded
//! traffic and tears everything down; tests run one at a time so timings do not mix.
//! Without root they print "skipped: needs root" and pass.

mod frames;
mod lab;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use frames::*;
use lab::*;
use picnic_lab::workload;
use picnic_netns::{self as netns};
use picnic_scenario::plan::VmView;
use picnic_scenario::switch::vni_of;
use picnic_scenario::{Mode, Scenario, BASE_PORT, BIN_MS};
use picnic_switch::config::ShapedClass;
use picnic_switch::stats::DropReason;
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::encap_headers_len;

const IPERF: &str = r#"
[[workloads]]
name = "blue-iperf"
kind = "iperf3"
from = "blue1"
to = "blue2"
stop_ms = 2000

[[workloads]]
name = "red-iperf"
kind = "iperf3"
from = "red1"
to = "red2"
stop_ms = 2000
"#;

#[test]
fn same_tenant_ping_tcp_and_iperf3_cross_hosts_other_tenants_unreachable() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let lab = Lab::start(scenario("duration_ms = 2000", IPERF), |_, _| {});
    let have_ping = netns::have_tool("ping");
    for (a, b) in [("blue1", "blue2"), ("red1", "red2")] {
        let (a, b) = (lab.vm(a), lab.vm(b));
        assert_eq!(
            icmp_echo(&a.ns, b.ip, 5),
            5,
            "ICMP echo {} -> {}",
            a.name,
            b.name
        );
        if have_ping {
            assert_eq!(ping(&a.ns, b.ip, 5), 5, "ping {} -> {}", a.name, b.name);
        }
        let echoed = tcp_echo(a, b, 9000, 64).unwrap();
        assert_eq!(echoed, 64 * 16384);
        println!(
            "{} -> {}: 5/5 ICMP echo{}, {} KiB TCP echoed intact",
            a.name,
            b.name,
            if have_ping { ", ping 5/5" } else { "" },
            echoed / 1024
        );
    }
    if !have_ping {
        println!("ping part skipped: `ping` is not installed (Debian package iputils-ping)");
    }
    // Across tenants there is no path, not even ARP: nothing answers.
    for (a, b) in [("blue1", "red2"), ("red1", "blue2"), ("blue1", "red1")] {
        let (a, b) = (lab.vm(a), lab.vm(b));
        assert_eq!(
            icmp_echo(&a.ns, b.ip, 2),
            0,
            "{} reached {}",
            a.name,
            b.name
        );
        assert!(
            tcp_echo(a, b, 9001, 1).is_err(),
            "TCP {} -> {} connected",
            a.name,
            b.name
        );
    }
    if netns::have_tool("iperf3") {
        // Both tenants at once, as in the issue's "done when".
        let r = lab.run(&["blue-iperf", "red-iperf"]);
        for w in &r {
            println!(
                "iperf3 {} (iperf3 -c <vm> -t 2.0 -P 1 -J, isolation on): {:.1} Mb/s",
                w.name,
                w.throughput_bps() / 1e6
            );
            assert!(
                w.throughput_bps() > 1e6,
                "{} moved {} bytes",
                w.name,
                w.received_bytes
            );
        }
    } else {
        println!("iperf3 part skipped: `iperf3` is not installed (Debian package iperf3)");
    }
    lab.finish();
}

#[test]
fn cross_tenant_and_spoofed_frames_are_dropped_counted_and_never_delivered() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let mut lab = Lab::start(scenario("duration_ms = 1000", IDLE), |_, _| {});
    let (blue1, blue2, red1, red2) = (
        lab.vm("blue1").clone(),
        lab.vm("blue2").clone(),
        lab.vm("red1").clone(),
        lab.vm("red2").clone(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let sniffers: Vec<(String, Sniffer)> = [&blue1, &blue2, &red2]
        .into_iter()
        .map(|vm| (vm.name.clone(), Sniffer::start(vm, stop.clone())))
        .collect();

    // From red1's own port.
    const N: usize = 10;
    let (r1mac, b1mac) = (mac(&red1.mac), mac(&blue1.mac));
    let to = |dst: &VmView, src_mac, src_ip, payload: &[u8]| {
        udp_frame(src_mac, mac(&dst.mac), src_ip, dst.ip, SINK_PORT, payload)
    };
    let mut frames = Vec::new();
    for _ in 0..N {
        // Cross-tenant, to a VM on the other host and to one on the same host.
        frames.push(to(&blue2, r1mac, red1.ip, ATTACK));
        frames.push(to(&blue1, r1mac, red1.ip, ATTACK));
        // Spoofed source MAC (blue1's), then spoofed source IP, to red1's own tenant.
        frames.push(to(&red2, b1mac, red1.ip, ATTACK));
        frames.push(to(&red2, r1mac, blue2.ip, ATTACK));
        // Broadcast data: not forwarded.
        frames.push(with_dst(to(&red2, r1mac, red1.ip, ATTACK), [0xff; 6]));
    }
    // ARP: claiming blue1's address, and asking for a VM of another tenant.
    frames.push(arp_request(r1mac, blue1.ip, red2.ip));
    frames.push(arp_request(r1mac, red1.ip, blue2.ip));
    // The same path delivers well-formed same-tenant frames.
    for _ in 0..5 {
        frames.push(to(&red2, r1mac, red1.ip, CONTROL));
    }
    inject(&red1.ns, &red1.dev, frames, Duration::from_micros(200));

    // Forged on the fabric towards host 2: red's VNI to a blue VM, an unknown VNI, blue's
    // VNI from an underlay address that is no host; and a well-formed control frame.
    let h1_ip = lab.topo.hosts[0].underlay_ip;
    let stranger = Ipv4Addr::new(198, 19, 0, 99);
    let inner = |payload: &[u8]| to(&blue2, b1mac, blue1.ip, payload);
    let mut frames = Vec::new();
    for _ in 0..N {
        frames.push(overlay_frame(&lab, 1, h1_ip, vni_of(1), &inner(ATTACK)));
        frames.push(overlay_frame(&lab, 1, h1_ip, 999, &inner(ATTACK)));
        frames.push(overlay_frame(&lab, 1, stranger, vni_of(0), &inner(ATTACK)));
    }
    for _ in 0..5 {
        frames.push(overlay_frame(&lab, 1, h1_ip, vni_of(0), &inner(CONTROL)));
    }
    let fabric_port = lab.topo.hosts[1].fabric_port.clone();
    inject(
        &lab.topo.fabric_ns,
        &fabric_port,
        frames,
        Duration::from_micros(200),
    );

    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<(String, Sniffed)> = sniffers
        .into_iter()
        .map(|(name, s)| (name, s.join()))
        .collect();
    let snaps = lab.stop();
    println!("arrived at the VMs: {seen:?}");
    for (name, s) in &seen {
        assert_eq!(s.attack, 0, "{name} received forged frames");
    }
    let control = |n: &str| seen.iter().find(|(name, _)| name == n).unwrap().1.control;
    assert_eq!(control("red2"), 5, "control frames from red1's port");
    assert_eq!(control("blue2"), 5, "control frames forged on the fabric");

    let d = &vm_snap(&snaps[0], "red1").counters.drops;
    println!("h1 red1 drops: {:?}", d.iter().collect::<Vec<_>>());
    assert_eq!(d.get(DropReason::UnknownDestination), 2 * N as u64 + 1);
    assert_eq!(d.get(DropReason::Spoofed), 2 * N as u64 + 1);
    assert_eq!(d.get(DropReason::Multicast), N as u64);
    let d = &snaps[1].switch.drops;
    println!("h2 switch drops: {:?}", d.iter().collect::<Vec<_>>());
    // Red's VNI with blue1's source: no red VM lives on host 1 with that MAC, so the
    // inner-source check drops it before the destination lookup.
    assert_eq!(d.get(DropReason::Spoofed), N as u64);
    assert_eq!(d.get(DropReason::UnknownDestination), 0);
    assert_eq!(d.get(DropReason::UnknownVni), N as u64);
    assert_eq!(d.get(DropReason::UnknownHost), N as u64);
    // Nothing else reached the blue VMs through the switches, the engines or the kernel
    // fast path (the default).
    let delivered = |h: usize, name: &str| {
        let c = &vm_snap(&snaps[h], name).counters;
        c.rx_packets + c.fast_path.rx_packets
    };
    assert_eq!(delivered(0, "blue1"), 0);
    assert_eq!(delivered(1, "blue2"), 5);
    lab.finish();
}

const PROBE: &str = r#"
[[workloads]]
name = "probe"
kind = "rpc"
from = "blue1"
to = "blue2"
rate_pps = 1000
timeout_ms = 200
"#;

#[test]
fn malformed_frames_are_counted_while_traffic_continues() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let mut lab = Lab::start(scenario("duration_ms = 1500", PROBE), |_, _| {});
    let blue1 = lab.vm("blue1").clone();
    let b1mac = mac(&blue1.mac);
    let good = udp_frame(b1mac, [2, 0, 0, 0, 0, 9], blue1.ip, blue1.ip, 9, b"x");
    // From a VM port: an IPv4 header cut short, and one with a bad header length.
    let mut from_vm = Vec::new();
    const N: usize = 50;
    for _ in 0..N {
        from_vm.push(good[..24].to_vec());
        let mut bad_ihl = good.clone();
        bad_ihl[14] = 0x42;
        from_vm.push(bad_ihl);
    }
    // On the uplink: Geneve of an unknown version, a truncated outer IPv4 header, and a
    // plain UDP packet that is no overlay traffic at all.
    let h1_ip = lab.topo.hosts[0].underlay_ip;
    let blue2 = lab.vm("blue2").clone();
    let inner = udp_frame(b1mac, mac(&blue2.mac), blue1.ip, blue2.ip, 9, b"x");
    let geneve = overlay_frame(&lab, 1, h1_ip, vni_of(0), &inner);
    let mut from_fabric = Vec::new();
    for _ in 0..N {
        let mut bad_version = geneve.clone();
        bad_version[42] |= 0x40;
        from_fabric.push(bad_version);
        from_fabric.push(geneve[..20].to_vec());
        let mut not_overlay = geneve.clone();
        not_overlay[36..38].copy_from_slice(&9999u16.to_be_bytes());
        from_fabric.push(not_overlay);
    }

    let scenario = lab.scenario.clone();
    let topo = lab.topo.clone();
    let probe = std::thread::spawn(move || {
        let wl = &scenario.workloads[0];
        workload::run_all(&scenario, &topo, &[wl])
            .unwrap()
            .remove(0)
    });
    std::thread::sleep(Duration::from_millis(300));
    let fabric_ns = lab.topo.fabric_ns.clone();
    let fabric_port = lab.topo.hosts[1].fabric_port.clone();
    let gap = Duration::from_millis(5);
    let fab = std::thread::spawn(move || inject(&fabric_ns, &fabric_port, from_fabric, gap));
    inject(&blue1.ns, &blue1.dev, from_vm, gap);
    fab.join().unwrap();
    let r = probe.join().unwrap();
    let snaps = lab.stop();

    let h = r.latency.as_ref().unwrap();
    println!(
        "probe during malformed frames: {} sent, {} answered, p50 {:.0} us, p99 {:.0} us",
        r.sent,
        r.received,
        micros(h.value_at_quantile(0.5)),
        micros(h.value_at_quantile(0.99))
    );
    assert!(r.sent >= 1400, "probe sent {}", r.sent);
    assert!(
        r.received as f64 >= 0.98 * r.sent as f64,
        "probe lost {} of {}",
        r.sent - r.received,
        r.sent
    );
    let d = &vm_snap(&snaps[0], "blue1").counters.drops;
    assert_eq!(d.get(DropReason::Malformed), 2 * N as u64, "h1 blue1");
    let d = &snaps[1].switch.drops;
    println!("h2 switch drops: {:?}", d.iter().collect::<Vec<_>>());
    assert_eq!(d.get(DropReason::Malformed), 2 * N as u64, "h2 uplink");
    assert_eq!(d.get(DropReason::NotOverlay), N as u64, "h2 uplink");
    lab.finish();
}

/// Rate the shaped class is held to, Mb/s.
const SHAPED_MBPS: f64 = 10.0;
/// UDP payload of the shaped flow.
const SHAPED_SIZE: usize = 1200;

#[test]
fn shaped_flow_keeps_its_rate_without_raising_fast_path_latency() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    // The flood offers ~4x the shaped rate; the probe shares the VM's port and the path.
    let flood = format!(
        r#"{PROBE}
[[workloads]]
name = "bulk"
kind = "udp_flood"
from = "blue1"
to = "blue2"
size = {SHAPED_SIZE}
rate_pps = 4000
"#
    );
    let mut lab = Lab::start(scenario("duration_ms = 1500", &flood), |h, cfg| {
        if h == 0 {
            let blue1 = cfg.vms.iter_mut().find(|v| v.name == "blue1").unwrap();
            blue1.shaped.push(ShapedClass {
                dst_ip: None,
                protocol: Some(17),
                // Workload i listens on BASE_PORT + i.
                dst_port: Some(BASE_PORT + 1),
                rate_mbps: SHAPED_MBPS,
            });
        }
    });
    // Latency on this shared machine has outliers of its own: a second measurement is
    // taken before a rise is believed (the bound holds in one of two paired runs).
    let q = |h: &hdrhistogram::Histogram<u64>, p| h.value_at_quantile(p);
    let mut attempt = 0;
    let bulk = loop {
        attempt += 1;
        let alone = lab.run(&["probe"]).remove(0);
        let mut both = lab.run(&["probe", "bulk"]);
        let bulk = both.pop().unwrap();
        let probe = both.pop().unwrap();
        let (a, b) = (alone.latency.unwrap(), probe.latency.as_ref().unwrap());
        println!(
            "attempt {attempt}: fast path alone: p50 {:.0} us p99 {:.0} us; beside the shaped flow: p50 {:.0} us p99 {:.0} us, {} of {} answered",
            micros(q(&a, 0.5)),
            micros(q(&a, 0.99)),
            micros(q(b, 0.5)),
            micros(q(b, 0.99)),
            probe.received,
            probe.sent
        );
        let answered = probe.received as f64 >= 0.98 * probe.sent as f64;
        let within = |p| q(b, p) <= 3 * q(&a, p) + 1_000_000;
        if answered && within(0.5) && within(0.99) {
            break bulk;
        }
        assert!(
            attempt < 2,
            "fast path suffered beside the shaped flow: {} of {} answered, p50 {:.0} -> {:.0} us, p99 {:.0} -> {:.0} us",
            probe.received,
            probe.sent,
            micros(q(&a, 0.5)),
            micros(q(b, 0.5)),
            micros(q(&a, 0.99)),
            micros(q(b, 0.99))
        );
    };
    let snaps = lab.stop();

    // Delivered rate in steady state (after the first 300 ms, before the stop), counted
    // in the bytes the shaper meters: the frame plus its encapsulation.
    let wire_per_datagram = (SHAPED_SIZE + 42 + encap_headers_len(&GeneveRepr::ethernet(1))) as f64;
    let (from, to) = (300 / BIN_MS as usize, 1500 / BIN_MS as usize);
    let payload: u64 = bulk.series[from..to].iter().sum();
    let secs = (to - from) as f64 * BIN_MS as f64 / 1e3;
    let mbps = payload as f64 / SHAPED_SIZE as f64 * wire_per_datagram * 8.0 / secs / 1e6;
    println!(
        "shaped flow: offered {:.1} Mb/s of payload, delivered {mbps:.2} Mb/s on the wire (shaped to {SHAPED_MBPS})",
        bulk.sent as f64 * SHAPED_SIZE as f64 * 8.0 / 1.5 / 1e6
    );
    assert!(
        (mbps - SHAPED_MBPS).abs() <= 0.1 * SHAPED_MBPS,
        "shaped flow delivered {mbps:.2} Mb/s"
    );
    let d = &vm_snap(&snaps[0], "blue1").counters.drops;
    assert!(
        d.get(DropReason::ShapedQueueFull) > 0,
        "the excess is dropped in the class's own queue"
    );
    assert_eq!(d.get(DropReason::EgressQueueFull), 0);
    lab.finish();
}

/// Access link of every host in the feedback test, Mb/s.
const LINK_MBPS: u64 = 20;

#[test]
fn feedback_from_a_congested_receiver_lowers_the_senders_rate() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    // ~64 Mb/s of payload at a receiver whose access link carries 20.
    let blast = r#"
[[workloads]]
name = "blast"
kind = "udp_flood"
from = "blue1"
to = "blue2"
size = 1000
rate_pps = 8000
"#;
    let top = format!("duration_ms = 1500\naccess_link_mbps = {LINK_MBPS}");
    let mut lab = Lab::start(scenario(&top, blast), |h, cfg| {
        if h == 0 {
            // Host 1's link towards the fabric is not shaped in the testbed: let it send
            // as fast as it likes, so only feedback can slow it down.
            cfg.uplink.capacity_mbps = Some(1000);
        }
    });
    let blue2_id = lab.endpoint_id("blue2");
    let scenario = lab.scenario.clone();
    let topo = lab.topo.clone();
    let blast = std::thread::spawn(move || {
        let wl = &scenario.workloads[0];
        workload::run_all(&scenario, &topo, &[wl])
            .unwrap()
            .remove(0)
    });
    // Watch host 1's limiter towards blue2 while the blast runs.
    let mut limits = Vec::new();
    while !blast.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(snap) = lab.snapshot(0) {
            let applied = vm_snap(&snap, "blue1").applied_limits.clone();
            if let Some((_, bps)) = applied.iter().find(|(d, _)| *d == blue2_id) {
                limits.push(*bps);
            }
        }
    }
    let r = blast.join().unwrap();
    let snaps = lab.stop();
    println!(
        "blast: {:.1} Mb/s offered, {:.1} Mb/s delivered; h1 limits towards blue2 (Mb/s): {:?}; feedback sent by h2 {}, received by h1 {}",
        r.sent as f64 * 8000.0 / 1.5 / 1e6,
        r.throughput_bps() / 1e6,
        limits.iter().map(|b| b / 1_000_000).collect::<Vec<_>>(),
        snaps[1].switch.feedback_sent,
        snaps[0].switch.feedback_received
    );
    assert!(snaps[1].switch.feedback_sent > 0, "h2 sent no feedback");
    assert!(snaps[0].switch.feedback_received > 0, "h1 got no feedback");
    let lowest = limits.iter().min().copied();
    assert!(
        lowest.is_some_and(|l| l < LINK_MBPS * 1_000_000),
        "no limit below the {LINK_MBPS} Mb/s link applied at the sender: {limits:?}"
    );
    // The excess now waits (and overflows) at the sender, not in the fabric.
    let d = &vm_snap(&snaps[0], "blue1").counters.drops;
    assert!(d.get(DropReason::ShapedQueueFull) > 0);
    lab.finish();
}

#[test]
fn tap_vms_carry_tcp_rpc_through_picnic_and_veth_over_bridges() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let text = r#"
name = "tap-test"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "blue"

[[tenants]]
name = "blue"
min_mbps = 10
vms = [{ name = "blue1", host = "h1", tap = true }, { name = "blue2", host = "h2" }]

[[workloads]]
name = "probe"
kind = "rpc"
protocol = "tcp"
from = "blue1"
to = "blue2"
rate_pps = 500
"#;
    let scenario = Scenario::parse(text).unwrap();
    let opts = picnic_lab::RunOptions {
        modes: vec![Mode::picnic(), Mode::bridge()],
        progress: false,
        ..Default::default()
    };
    let out = picnic_lab::run_loaded(&scenario, &opts).unwrap();
    for mode in ["picnic", "bridge"] {
        let blue = &out.summary.modes[mode]["blue"];
        assert_eq!(blue.loss, 0.0, "{mode}\n{}", out.table);
        assert!(
            blue.p99_us.is_some_and(|p| p > 0.0),
            "{mode}\n{}",
            out.table
        );
    }
    // The TAP went into the VM's namespace and away with it.
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains("v-blue1"));
}

/// `--control etcd` (issue 33): the hosts take their deployment from a real etcd the lab
/// starts, and a tenant's VMs churned through it every 100 ms answer within 1 s of each
/// move or add while the victim's RPC loses nothing.
#[test]
fn a_lab_on_etcd_churns_vms_while_the_victim_runs() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    if std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: needs etcd (Debian's etcd-server; scripts/setup.sh installs it)");
        return;
    }
    let text = r#"
name = "churn-test"
duration_ms = 2000
hosts = ["h1", "h2"]
victim = "blue"
pass = ["churn_unreachable <= 0", "churn_changes >= 5"]

[churn]
tenant = "red"
interval_ms = 100

[[tenants]]
name = "blue"
min_mbps = 10
vms = [{ name = "blue1", host = "h1", tap = true }, { name = "blue2", host = "h2" }]

[[tenants]]
name = "red"
vms = [{ name = "red1", host = "h1" }, { name = "red2", host = "h2" }, { name = "red3", host = "h1" }]

[[workloads]]
name = "probe"
kind = "rpc"
protocol = "tcp"
from = "blue1"
to = "blue2"
rate_pps = 500
"#;
    let scenario = Scenario::parse(text).unwrap();
    // The switch's default path (the engines): with the kernel fast path a VM moved to another
    // host was not reached again (`--test cluster`, docs/switch.md "Two paths").
    let mut opts = picnic_lab::RunOptions {
        modes: vec![Mode::picnic_engines()],
        progress: false,
        ..Default::default()
    };
    // Without etcd the churn has nothing to go through: refused before anything is built.
    let e = picnic_lab::run_loaded(&scenario, &opts).err().unwrap();
    assert!(format!("{e:#}").contains("--control etcd"), "{e:#}");
    opts.control = picnic_lab::Control::Etcd;
    let out = picnic_lab::run_loaded(&scenario, &opts).unwrap();
    assert!(out.pass(), "{}", out.table);
    let blue = &out.summary.modes["picnic-engines"]["blue"];
    assert_eq!(blue.loss, 0.0, "{}", out.table);
    assert!(blue.p99_us.is_some_and(|p| p > 0.0), "{}", out.table);
}

/// Tenant blue's key in the encryption test.
const BLUE_KEY: &str = "8f3a0c5e1b7d294a6e0f3c8b5a1d7e2f";

/// `inner` sealed for tenant blue as host 1 would (key epoch 1, sender `sender`), towards
/// host 2; `tamper` flips one ciphertext byte after sealing.
fn sealed_overlay_frame(lab: &Lab, inner: &[u8], counter: u64, tamper: bool) -> Vec<u8> {
    use picnic_wire::seal::{seal_in_place, SealHeader, TunnelKey, SEAL_OVERHEAD};
    let mut frame = overlay_frame(lab, 1, lab.topo.hosts[0].underlay_ip, vni_of(0), inner);
    let len = frame.len();
    frame.resize(len + SEAL_OVERHEAD, 0);
    let key = TunnelKey::from_hex(BLUE_KEY).unwrap();
    // A sender id no switch uses, so these nonces never collide with the switches' own.
    let n = seal_in_place(&mut frame, len, &key, SealHeader::new(1, 0xABCD, counter)).unwrap();
    frame.truncate(n);
    if tamper {
        let at = n - 24;
        frame[at] ^= 0x01;
    }
    frame
}

/// FairNIC's application abstraction with its isolation (issue 14): red's egress program
/// loops on every IPv4 frame (ARP passes). The sandbox stops each run at its fuel, red's
/// frames are dropped and counted by reason, and blue, on the same switches, loses nothing.
#[test]
fn a_looping_offload_program_drops_its_own_frames_and_the_neighbour_sees_nothing() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    const LOOP: &str = r#"(module
  (import "picnic" "load" (func $load (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "egress") (param $len i32) (result i32)
    (drop (call $load (i32.const 0) (i32.const 0) (i32.const 14)))
    (if (i32.ne (i32.or (i32.shl (i32.load8_u (i32.const 12)) (i32.const 8))
                        (i32.load8_u (i32.const 13)))
                (i32.const 0x0800))
      (then (return (i32.const 0))))
    (loop $forever (br $forever))
    (i32.const 0)))"#;
    let mut lab = Lab::start(scenario("duration_ms = 1000", IDLE), |_, cfg| {
        let red = cfg.tenants.iter_mut().find(|t| t.name == "red").unwrap();
        red.offload = Some(picnic_switch::offload::OffloadEntry {
            program: None,
            wat: Some(LOOP.into()),
            fuel_per_packet: 20_000,
            fuel_per_period: 50_000,
            memory_kib: 64,
        });
    });
    let (blue1, blue2, red1, red2) = (
        lab.vm("blue1").clone(),
        lab.vm("blue2").clone(),
        lab.vm("red1").clone(),
        lab.vm("red2").clone(),
    );
    let red_echoes = icmp_echo(&red1.ns, red2.ip, 20);
    let blue_echoes = icmp_echo(&blue1.ns, blue2.ip, 20);
    let snaps = lab.stop();
    assert_eq!(
        red_echoes, 0,
        "red's IPv4 frames never leave its looping program"
    );
    assert_eq!(blue_echoes, 20, "blue's echoes through the same switches");
    let red_drops = &vm_snap(&snaps[0], "red1").counters.drops;
    println!("h1 red1 drops: {:?}", red_drops.iter().collect::<Vec<_>>());
    let stopped = red_drops.get(DropReason::OffloadFuel) + red_drops.get(DropReason::OffloadBudget);
    assert!(
        stopped >= 20,
        "every echo request stopped by its fuel or the period's"
    );
    for (host, name) in [(0, "blue1"), (1, "blue2")] {
        let d = &vm_snap(&snaps[host], name).counters.drops;
        let dropped: u64 = d.iter().map(|(_, n)| n).sum();
        assert_eq!(dropped, 0, "{name}: {:?}", d.iter().collect::<Vec<_>>());
    }
}

#[test]
fn encrypted_tenant_crosses_hosts_sealed_and_tampered_frames_are_dropped() {
    encrypted_crossing(1);
}

/// The same with inline engines (`accel.workers = 0`): each switch's loop seals and opens.
#[test]
fn encrypted_tenant_crosses_hosts_through_inline_engines() {
    encrypted_crossing(0);
}

fn encrypted_crossing(workers: usize) {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    // Blue encrypts (AES-128-GCM in the shared engine of each switch), red does not.
    let mut lab = Lab::start(scenario("duration_ms = 1000", IDLE), |_, cfg| {
        let blue = cfg.tenants.iter_mut().find(|t| t.name == "blue").unwrap();
        blue.encrypt = true;
        blue.key = Some(BLUE_KEY.into());
        cfg.accel.workers = workers;
        // Two dataplane workers (with the kernel fast path, the default, a switch runs one):
        // blue's VM submits its seals through one worker's port and the uplink's worker its
        // opens through the other's, and /stats adds up both.
        cfg.switch.workers = Some(2);
    });
    let (blue1, blue2, red1, red2) = (
        lab.vm("blue1").clone(),
        lab.vm("blue2").clone(),
        lab.vm("red1").clone(),
        lab.vm("red2").clone(),
    );
    // Same-tenant echo across the hosts, sealed on the wire both ways.
    assert_eq!(
        icmp_echo(&blue1.ns, blue2.ip, 20),
        20,
        "blue echo through the engine"
    );
    assert_eq!(icmp_echo(&red1.ns, red2.ip, 5), 5, "red (plain) echo");

    // Forged on the fabric towards host 2: sealed with blue's key but altered, sealed and
    // intact (control), and plain Geneve for blue (which must be sealed).
    let stop = Arc::new(AtomicBool::new(false));
    let sniffer = Sniffer::start(&blue2, stop.clone());
    let inner = |payload: &[u8]| {
        udp_frame(
            mac(&blue1.mac),
            mac(&blue2.mac),
            blue1.ip,
            blue2.ip,
            SINK_PORT,
            payload,
        )
    };
    const N: usize = 10;
    let mut frames = Vec::new();
    for i in 0..N as u64 {
        frames.push(sealed_overlay_frame(&lab, &inner(ATTACK), 2 * i, true));
        frames.push(overlay_frame(
            &lab,
            1,
            lab.topo.hosts[0].underlay_ip,
            vni_of(0),
            &inner(ATTACK),
        ));
    }
    for i in 0..5 {
        frames.push(sealed_overlay_frame(&lab, &inner(CONTROL), 1000 + i, false));
    }
    let fabric_port = lab.topo.hosts[1].fabric_port.clone();
    inject(
        &lab.topo.fabric_ns,
        &fabric_port,
        frames,
        Duration::from_micros(200),
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let seen = sniffer.join();
    let snaps = lab.stop();
    println!("arrived at blue2: {seen:?}");
    assert_eq!(
        seen.attack, 0,
        "blue2 received a tampered or unsealed frame"
    );
    assert_eq!(seen.control, 5, "intact sealed frames are delivered");
    let d = &snaps[1].switch.drops;
    println!("h2 switch drops: {:?}", d.iter().collect::<Vec<_>>());
    assert_eq!(d.get(DropReason::AuthFailed), N as u64);
    assert_eq!(d.get(DropReason::Unsealed), N as u64);
    for (h, snap) in snaps.iter().enumerate() {
        let blue = snap.tenants.iter().find(|t| t.name == "blue").unwrap();
        let use_ = blue.accel.as_ref().expect("blue uses the engine");
        println!("h{} blue engine use: {use_:?}", h + 1);
        // 20 echo requests sealed on h1 and opened on h2, the replies the other way.
        assert!(use_.frames >= 40, "host {h}: {use_:?}");
        assert!(use_.cpu_ns > 0, "engine CPU charged to blue on host {h}");
        let red = snap.tenants.iter().find(|t| t.name == "red").unwrap();
        assert!(red.accel.is_none());
    }
    let blue_h2 = snaps[1].tenants.iter().find(|t| t.name == "blue").unwrap();
    assert_eq!(blue_h2.accel.as_ref().unwrap().auth_failed, N as u64);
    lab.finish();
}
