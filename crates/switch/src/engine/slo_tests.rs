//! Tenants' SLOs judged on the delivery path, on a virtual clock: a tenant whose frames are
//! dropped or delayed beyond its bounds shows as violated with the right kind and the reason
//! in its breakdown, while a neighbour with an SLO shows met.

use picnic_core::slo::{Slo, ViolationKind};
use picnic_core::{Duration, Instant};

use super::tests::{config, udp, Host, A1, A2, B1, B2, IP_A1, IP_A2, IP_B1, IP_B2};
use super::{Engine, SloReport, TenantSlo};
use crate::change::Change;
use crate::directory::UPLINK;
use crate::frame::FramePool;
use crate::stats::DropReason;

/// An SLO written as the config's inline table, e.g. `{ max_loss = 0.01 }`.
fn slo(table: &str) -> Slo {
    #[derive(serde::Deserialize)]
    struct Tenant {
        slo: Slo,
    }
    toml::from_str::<Tenant>(&format!("slo = {table}"))
        .unwrap()
        .slo
}

/// Host `id` of the two-host test overlay, started at `start`, with both tenants holding an
/// SLO.
fn host_with_slos(
    id: u32,
    start: Instant,
    a: &str,
    b: &str,
    edit: impl FnOnce(&mut crate::config::Config),
) -> Host {
    let mut cfg = config(id, 1000);
    cfg.tenants[0].slo = Some(slo(a));
    cfg.tenants[1].slo = Some(slo(b));
    edit(&mut cfg);
    cfg.validate().unwrap();
    Host {
        engine: Engine::new(&cfg, start).unwrap(),
        pool: FramePool::new(4096),
    }
}

fn tenant<'a>(report: &'a SloReport, name: &str) -> &'a TenantSlo {
    report.tenants.iter().find(|t| t.tenant == name).unwrap()
}

fn kinds(t: &TenantSlo) -> Vec<ViolationKind> {
    t.violated.iter().collect()
}

fn ms(n: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(n)
}

/// An overlay frame host 1 sends for `frame` (a tenant frame from local VM `vm`).
fn encapsulated(vm: &str, frame: &[u8]) -> Vec<u8> {
    let mut h1 = Host::new(1, 1000);
    h1.inject(Instant::ZERO, h1.port_of(vm), frame);
    h1.poll(Instant::ZERO);
    h1.take(UPLINK).pop().unwrap()
}

#[test]
fn frames_dropped_beyond_max_loss_violate_loss_while_the_neighbour_is_met() {
    let both = "{ latency_us = 1000, max_loss = 0.01 }";
    // a2 may receive 1000 frames/s (burst 64); it is sent 2000/s, b2 the same and unlimited.
    let mut h2 = host_with_slos(2, ms(0), both, both, |c| c.vms[2].max_pps = Some(1_000));
    let to_a2 = encapsulated("a1", &udp(A1, A2, IP_A1, IP_A2, 7, 200));
    let to_b2 = encapsulated("b1", &udp(B1, B2, IP_B1, IP_B2, 7, 200));
    let (a2, b2) = (h2.port_of("a2"), h2.port_of("b2"));
    for step in 0..1_000 {
        let now = ms(step);
        for _ in 0..2 {
            h2.inject(now, UPLINK, &to_a2);
            h2.inject(now, UPLINK, &to_b2);
        }
        h2.poll(now);
        h2.take(a2);
        h2.take(b2);
        h2.take(UPLINK);
    }
    let report = h2.engine.slo_report(ms(1_000));
    assert_eq!(report.window_ms, 100);
    let a = tenant(&report, "a");
    assert!(!a.met);
    assert_eq!(
        kinds(a),
        [ViolationKind::Loss],
        "loss only: delivered frames were prompt"
    );
    assert_eq!(a.open_violations.len(), 1);
    let v = &a.open_violations[0];
    assert_eq!(
        (v.kind, v.started_at, v.ended_at),
        (ViolationKind::Loss, ms(0), None)
    );
    assert!(v.worst_value > 0.4 && v.bound == 0.01, "{v:?}");
    assert_eq!(a.violations_total["loss"], 1);
    // Every frame lost was a2's packet-rate limit, and the breakdown says so.
    let lost = h2.drops("a2", DropReason::PpsLimit);
    assert!(lost > 900, "{lost} dropped");
    assert_eq!(a.why.drops.get(DropReason::PpsLimit), lost);
    assert_eq!(a.why.drops.total(), lost);
    assert_eq!(a.totals.lost_packets, lost);
    assert_eq!(a.totals.delivered_packets + lost, 2_000);
    assert_eq!(a.totals.offered_bytes, 2_000 * 242);
    assert_eq!(a.why.late.map(|l| l.ingress_queue), Some(0));

    let b = tenant(&report, "b");
    assert!(b.met, "{b:?}");
    assert!(kinds(b).is_empty() && b.open_violations.is_empty());
    assert!(b.recent_violations.is_empty());
    assert!(b.violations_total.values().all(|&n| n == 0));
    assert_eq!(
        (b.totals.delivered_packets, b.totals.lost_packets),
        (2_000, 0)
    );
    assert_eq!(b.totals.windows, 10);

    // a2's senders slow down to what it may receive: the violation ends at the next window.
    for step in 1_000..1_300 {
        if step % 2 == 0 {
            h2.inject(ms(step), UPLINK, &to_a2);
        }
        h2.poll(ms(step));
        h2.take(a2);
        h2.take(UPLINK);
    }
    let report = h2.engine.slo_report(ms(1_300));
    let a = tenant(&report, "a");
    assert!(a.met, "{a:?}");
    assert!(a.open_violations.is_empty());
    let v = &a.recent_violations[..];
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].started_at, v[0].ended_at), (ms(0), Some(ms(1_000))));
    assert_eq!(a.violations_total["loss"], 1);
}

#[test]
fn frames_held_beyond_latency_us_violate_latency_while_the_neighbour_is_met() {
    // a1's UDP to port 9000 is shaped to 10 Mb/s in its own queue (the test config): bursts
    // of 50 full frames every 100 ms (5.8 Mb/s on average) wait up to ~55 ms in it, none is
    // lost. b1 sends a steady flow on the fast path.
    let bound = "{ latency_us = 1000, max_loss = 0.01 }";
    let mut h1 = host_with_slos(1, ms(0), bound, bound, |_| {});
    let shaped = udp(A1, A2, IP_A1, IP_A2, 9000, 1400);
    let steady = udp(B1, B2, IP_B1, IP_B2, 7, 1400);
    let (a1, b1) = (h1.port_of("a1"), h1.port_of("b1"));
    let (mut out, mut sent) = (0, 0);
    for step in 0..1_000 {
        let now = ms(step);
        if step % 100 == 0 {
            for _ in 0..50 {
                h1.inject(now, a1, &shaped);
            }
        }
        h1.inject(now, b1, &steady);
        sent += 1;
        h1.poll(now);
        out += h1.take(UPLINK).len();
    }
    assert_eq!(out, 500 + sent, "nothing lost");
    let report = h1.engine.slo_report(ms(1_000));
    let a = tenant(&report, "a");
    assert_eq!(kinds(a), [ViolationKind::Latency], "{a:?}");
    let v = &a.open_violations[0];
    assert_eq!((v.kind, v.started_at), (ViolationKind::Latency, ms(0)));
    assert!(v.worst_value > 40_000.0 && v.bound == 1_000.0, "{v:?}");
    assert_eq!(a.totals.lost_packets, 0);
    assert!(a.totals.latency_p99_us.unwrap() > 40_000.0);
    // Why: the frames waited in the shaped class, not in the fast path.
    assert_eq!(a.why.waited_shaped_class, 500);
    assert_eq!(a.why.waited_limiter, 0);
    let late = a.why.late.unwrap();
    assert!(late.shaped_class > 400, "{late:?}");
    assert_eq!(
        (late.egress_queue, late.ingress_queue, late.limiter),
        (0, 0, 0)
    );
    assert_eq!(a.why.drops.total(), 0);

    let b = tenant(&report, "b");
    assert!(b.met && kinds(b).is_empty(), "{b:?}");
    assert_eq!(b.totals.delivered_packets, sent as u64);
    assert!(b.totals.latency_p99_us.unwrap() < 1_000.0);
    assert_eq!(b.why.late.unwrap().egress_queue, 0);
}

#[test]
fn a_tenants_slo_changes_in_place_and_the_others_keep_their_conformance() {
    let loss = "{ max_loss = 0.01 }";
    let mut old = host_with_slos(2, ms(0), loss, loss, |c| c.vms[2].max_pps = Some(1_000));
    let to_a2 = encapsulated("a1", &udp(A1, A2, IP_A1, IP_A2, 7, 200));
    for step in 0..300 {
        for _ in 0..3 {
            old.inject(ms(step), UPLINK, &to_a2);
        }
        old.poll(ms(step));
        old.take(old.port_of("a2"));
        old.take(UPLINK);
    }
    // b's SLO changes in place, a's does not; then b's is removed and set again.
    let mut b = config(2, 1000).tenants[1].clone();
    b.slo = Some(slo("{ max_loss = 0.02 }"));
    let pool = &mut old.pool;
    old.engine
        .apply(ms(300), &Change::SetTenant(b.clone()), pool)
        .unwrap();
    let report = old.engine.slo_report(ms(300));
    assert_eq!(tenant(&report, "b").slo.max_loss, Some(0.02));
    let a = tenant(&report, "a");
    assert_eq!(kinds(a), [ViolationKind::Loss]);
    assert_eq!(a.totals.windows, 3);
    assert_eq!(
        tenant(&report, "b").totals.windows,
        0,
        "a new SLO starts afresh"
    );
    b.slo = None;
    old.engine
        .apply(ms(300), &Change::SetTenant(b), &mut old.pool)
        .unwrap();
    let report = old.engine.slo_report(ms(400));
    assert!(report.tenants.iter().all(|t| t.tenant != "b"));
    assert_eq!(tenant(&report, "a").totals.windows, 4);
}

/// a1 (host 1) sends ~400 Mb/s to a2, whose host's access link is 100 Mb/s, for 150 ms with
/// a latency bound of 1 ms; a1's guarantee is `a1_min_mbps`. Returns a's conformance on
/// host 1, where its frames wait in the limiter a2's feedback sets.
fn limited_sender(a1_min_mbps: u64) -> TenantSlo {
    let bound = "{ latency_us = 1000 }";
    let set_min = |c: &mut crate::config::Config| c.vms[0].min_mbps = a1_min_mbps;
    let mut h1 = host_with_slos(1, ms(0), bound, bound, set_min);
    let mut h2 = Host {
        engine: {
            let mut cfg = config(2, 100);
            set_min(&mut cfg);
            Engine::new(&cfg, ms(0)).unwrap()
        },
        pool: FramePool::new(4096),
    };
    let frame = udp(A1, A2, IP_A1, IP_A2, 7, 1400);
    let mut now = ms(0);
    for _ in 0..1_500 {
        now += Duration::from_micros(100);
        for _ in 0..4 {
            h1.inject(now, h1.port_of("a1"), &frame);
        }
        h1.poll(now);
        super::tests::carry(&mut h1, &mut h2, now);
        h2.poll(now);
        super::tests::carry(&mut h2, &mut h1, now);
        h2.take(h2.port_of("a2"));
    }
    tenant(&h1.engine.slo_report(now), "a").clone()
}

#[test]
fn frames_a_limiter_holds_beyond_the_guarantee_are_delivered_but_not_judged() {
    // A 1 Mb/s guarantee: everything the limiter holds is a's demand beyond it.
    let a = limited_sender(1);
    assert!(a.why.waited_limiter > 100, "{:?}", a.why);
    assert!(a.why.held_beyond_guarantee > 100, "{:?}", a.why);
    assert_eq!(a.why.late.unwrap().limiter, 0, "{:?}", a.why);
    assert!(!kinds(&a).contains(&ViolationKind::Latency), "{a:?}");
    assert!(a.totals.windows > 0);
    assert_eq!(a.violations_total["latency"], 0, "{a:?}");
    // A 150 Mb/s guarantee the receiver's 100 Mb/s link cannot give: the limiter is below
    // it, and the frames it holds past 1 ms violate the latency bound.
    let a = limited_sender(150);
    assert!(a.why.waited_limiter > 100, "{:?}", a.why);
    assert_eq!(a.why.held_beyond_guarantee, 0);
    assert!(a.why.late.unwrap().limiter > 0, "{:?}", a.why);
    assert!(a.violations_total["latency"] > 0, "{a:?}");
}

/// An ICMPv6 message of `icmp_type` from a1's link-local address to multicast group `group`
/// (the kernel's chatter on a new interface: MLD reports, router solicitations).
fn icmp6_to_group(icmp_type: u8, group: std::net::Ipv6Addr) -> Vec<u8> {
    let o = group.octets();
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2(A1, [0x33, 0x33, o[12], o[13], o[14], o[15]])
        .ipv6(
            crate::config::Mac(A1).link_local().octets(),
            group.octets(),
            255,
        )
        .icmpv6(etherparse::Icmpv6Type::Unknown {
            type_u8: icmp_type,
            code_u8: 0,
            bytes5to8: [0; 4],
        })
        .write(&mut out, &[0; 20])
        .unwrap();
    out
}

#[test]
fn policy_drops_are_not_the_tenants_loss_and_an_idle_tenant_is_met() {
    let bounds = "{ min_bps = 1_000_000, latency_us = 1000, max_loss = 0.01 }";
    let mut h1 = host_with_slos(1, ms(0), bounds, bounds, |_| {});
    let a1 = h1.port_of("a1");
    let ll = crate::config::Mac(A1).link_local();
    let chatter = [
        icmp6_to_group(143, "ff02::16".parse().unwrap()), // MLDv2 report
        icmp6_to_group(133, "ff02::2".parse().unwrap()),  // router solicitation
    ];
    // A duplicate address detection probe for its link-local address.
    let mut dad = Vec::new();
    let group = picnic_wire::ndp::solicited_node(ll);
    let g = group.octets();
    etherparse::PacketBuilder::ethernet2(A1, [0x33, 0x33, g[12], g[13], g[14], g[15]])
        .ipv6([0; 16], g, 255)
        .icmpv6(etherparse::Icmpv6Type::Unknown {
            type_u8: 135,
            code_u8: 0,
            bytes5to8: [0; 4],
        })
        .write(&mut dad, &ll.octets())
        .unwrap();
    // What the switch must not carry, 16 Mb/s of it: spoofed, to nobody, truncated.
    let spoofed = udp(A1, A2, IP_B1, IP_A2, 7, 1000);
    let unknown = udp(A1, [2, 0, 0, 0, 0, 0x77], IP_A1, IP_A2, 7, 1000);
    let malformed = udp(A1, A2, IP_A1, IP_A2, 7, 1000)[..30].to_vec();
    for step in 0..1_000 {
        let now = ms(step);
        if step % 100 == 0 {
            for f in chatter.iter().chain([&dad]) {
                h1.inject(now, a1, f);
            }
        }
        if step % 10 == 0 {
            for _ in 0..8 {
                h1.inject(now, a1, &spoofed);
                h1.inject(now, a1, &unknown);
                h1.inject(now, a1, &malformed);
            }
        }
        h1.poll(now);
        assert!(h1.take(UPLINK).is_empty() && h1.take(a1).is_empty());
    }
    let report = h1.engine.slo_report(ms(1_000));
    let a = tenant(&report, "a");
    assert_eq!(a.totals.windows, 10);
    assert!(a.met && kinds(a).is_empty(), "{a:?}");
    assert!(a.violations_total.values().all(|&n| n == 0), "{a:?}");
    assert!(a.open_violations.is_empty() && a.recent_violations.is_empty());
    // Nothing lost, nothing offered (the 16 Mb/s above min_bps was no demand to carry); the
    // breakdown still says what was dropped.
    assert_eq!((a.totals.lost_packets, a.totals.offered_bytes), (0, 0));
    let d = &a.why.drops;
    assert_eq!(d.get(DropReason::Multicast), 30);
    assert_eq!(d.get(DropReason::Spoofed), 800);
    assert_eq!(d.get(DropReason::UnknownDestination), 800);
    assert_eq!(d.get(DropReason::Malformed), 800);
    assert!(tenant(&report, "b").met);
}

#[test]
fn only_drops_of_frames_the_switch_should_carry_are_loss() {
    use super::slo::is_loss;
    let policy = [
        DropReason::Malformed,
        DropReason::Spoofed,
        DropReason::UnknownDestination,
        DropReason::UnknownVni,
        DropReason::Multicast,
        DropReason::NotOverlay,
        DropReason::UnknownHost,
        DropReason::TooBig,
        DropReason::AuthFailed,
        DropReason::Unsealed,
        DropReason::OffloadDrop,
    ];
    for r in DropReason::ALL {
        assert_eq!(is_loss(r), !policy.contains(&r), "{r:?}");
    }
    for r in [
        DropReason::EgressQueueFull,
        DropReason::ShapedQueueFull,
        DropReason::IngressQueueFull,
        DropReason::CpuThrottled,
        DropReason::PpsLimit,
        DropReason::NoBuffer,
        DropReason::HandoffFull,
        DropReason::TxQueueFull,
    ] {
        assert!(is_loss(r), "{r:?}");
    }
}
