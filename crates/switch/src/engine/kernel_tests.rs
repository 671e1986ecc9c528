//! The engine's side of the eBPF programs on a virtual clock: which VMs the uplink's XDP
//! program is told to drop, and softirq time charged like the switch's own work.

use picnic_core::{Duration, Instant};

use super::kernel::{SoftirqDelta, XdpThrottle, XDP_CPU, XDP_PPS};
use super::tests::{config, udp, Host, B1, B2, IP_B1, IP_B2};
use super::Engine;
use crate::frame::FramePool;
use crate::stats::DropReason;

fn host_with(f: impl FnOnce(&mut crate::config::Config)) -> Host {
    let text = toml::to_string(&config(1, 1000)).unwrap();
    let mut cfg: crate::config::Config = toml::from_str(&text).unwrap();
    f(&mut cfg);
    Host {
        engine: Engine::new(&cfg, Instant::ZERO).unwrap(),
        pool: FramePool::new(4096),
    }
}

fn throttles(h: &mut Host, now: Instant) -> Vec<XdpThrottle> {
    let mut out = Vec::new();
    h.engine.xdp_throttles(now, &mut out);
    out
}

#[test]
fn a_tenant_over_its_cpu_allocation_is_dropped_in_xdp_until_the_next_period() {
    let mut h = host_with(|c| c.tenants[1].cpu_quota = Some(0.1)); // b: 1 ms per 10 ms
    let b1 = h.port_of("b1");
    let t = Instant::from_nanos(100_000);
    assert_eq!(throttles(&mut h, t), vec![], "nobody is over anything");
    h.inject(t, b1, &udp(B1, B2, IP_B1, IP_B2, 7, 64));
    h.poll(t);
    h.engine.charge_cpu(t, 1_100_000);
    assert_eq!(
        throttles(&mut h, t),
        vec![XdpThrottle {
            vni: 200,
            mac: B1,
            slot: b1 as u32,
            reasons: XDP_CPU
        }]
    );
    let next = Instant::from_nanos(10_000_000);
    h.poll(next);
    assert_eq!(
        throttles(&mut h, next),
        vec![],
        "paid back from the next period"
    );
}

#[test]
fn a_vm_over_its_packet_budget_is_held_in_xdp_until_half_a_burst_is_back() {
    let mut h = host_with(|c| c.vms[1].max_pps = Some(10_000)); // b1: burst 64 frames
    let b1 = h.port_of("b1");
    let t = Instant::ZERO;
    let mut h2 = Host::new(2, 1000);
    for _ in 0..64 {
        h2.inject(t, h2.port_of("b2"), &udp(B2, B1, IP_B2, IP_B1, 7, 64));
    }
    h2.poll(t);
    super::tests::carry(&mut h2, &mut h, t);
    let held = vec![XdpThrottle {
        vni: 200,
        mac: B1,
        slot: b1 as u32,
        reasons: XDP_PPS,
    }];
    assert_eq!(throttles(&mut h, t), held, "the burst is spent");
    // One token back is not enough: the map would flip per packet. 32 tokens at 10 kpps
    // take 3.2 ms, and the loop is asked to look then.
    let one = Instant::from_nanos(100_000);
    assert_eq!(throttles(&mut h, one), held);
    assert_eq!(
        h.engine.xdp_poll_at().map(|t| t.as_nanos()),
        Some(3_200_000)
    );
    assert!(
        h.engine.poll_at().unwrap().as_nanos() <= 3_200_000,
        "the loop looks by then"
    );
    assert_eq!(throttles(&mut h, Instant::from_nanos(3_200_000)), vec![]);
}

#[test]
fn xdp_drops_are_counted_per_vm_with_their_own_reasons() {
    let mut h = Host::new(1, 1000);
    let b1 = h.port_of("b1");
    h.engine.on_xdp_drops(Instant::ZERO, b1, 0, 5);
    h.engine.on_xdp_drops(Instant::ZERO, b1, 1, 7);
    h.engine.on_xdp_drops(Instant::ZERO, 999, 0, 9); // no such port: ignored
    assert_eq!(h.drops("b1", DropReason::CpuThrottledXdp), 5);
    assert_eq!(h.drops("b1", DropReason::PpsLimitXdp), 7);
    assert_eq!(h.drops("b1", DropReason::CpuThrottled), 0);
    assert_eq!(h.drops("a1", DropReason::CpuThrottledXdp), 0);
}

#[test]
fn softirq_time_counts_against_the_tenants_cpu_allocation() {
    let mut h = host_with(|c| c.tenants[1].cpu_quota = Some(0.1)); // b: 1 ms per 10 ms
    let b1 = h.port_of("b1");
    let t = Instant::from_nanos(100_000);
    let delta = SoftirqDelta {
        slot: b1 as u32,
        from_vm_ns: 700_000,
        to_vm_ns: 450_000,
        packets: 900,
        kthread_ns: 300_000,
        in_switch_ns: 5_000_000,
    };
    h.engine.charge_softirq(t, &delta);
    // 1.15 ms of softirq outside the switch's thread exhausts b's 1 ms (less the cgroup's
    // share); the 5 ms the switch's own thread ran is its measured time, not charged again.
    assert!(!h.engine.rx_ready(t, b1, 64), "b is over its allocation");
    assert!(h.engine.rx_ready(t, h.port_of("a1"), 64));
    let snap = h.engine.snapshot();
    let vm = snap.vms.iter().find(|v| v.name == "b1").unwrap();
    assert_eq!(vm.counters.softirq_ns, 1_150_000);
    assert_eq!(vm.counters.softirq_packets, 900);
    assert_eq!(vm.counters.softirq_in_switch_ns, 5_000_000);
    let b = snap.tenants.iter().find(|t| t.name == "b").unwrap();
    assert_eq!(b.softirq_ns, 1_150_000);
    assert_eq!(b.cpu_charged_ns, 1_150_000);
    let next = Instant::from_nanos(100_000) + Duration::from_millis(10);
    h.poll(next);
    assert!(h.engine.rx_ready(next, b1, 64), "the debt is paid back");
}
