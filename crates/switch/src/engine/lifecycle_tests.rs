//! Live changes in place (issue 15), on a virtual clock: a change to one tenant touches only
//! that tenant's state, a removed VM's frames go back to the pool, and a neighbour's frames
//! are forwarded at the same rate and with the same scheduling delay while another tenant
//! changes 100 times a second.

use std::collections::VecDeque;

use picnic_core::{Duration, Instant};
use picnic_wire::feedback::FeedbackOption;
use picnic_wire::geneve::standalone_feedback;
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap, OuterHeaders};

use super::tests::{config, udp, Host, NoWork, A1, A2, B1, B2, IP_A1, IP_A2, IP_B1, IP_B2};
use super::{Engine, PortChange};
use crate::change::{diff, Change};
use crate::config::{Config, ShapedClass};
use crate::directory::UPLINK;
use crate::frame::FramePool;
use crate::stats::DropReason;

/// Outer headers of a packet host 2 sends host 1.
fn from_host2() -> OuterHeaders {
    OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: [198, 19, 0, 2].into(),
        dst_ip: [198, 19, 0, 1].into(),
        src_port: 50000,
        ttl: 64,
    }
}

/// Feedback from host 2 slowing traffic to a2 (endpoint 3) to 1 Mb/s, so a1's frames to a2
/// wait in a limiter queue.
fn slow_down_a2() -> Vec<u8> {
    let fb = FeedbackOption {
        dst_endpoint: 3,
        rate_bps: 1_000_000,
        seq: 1,
    };
    let mut out = vec![0u8; 256];
    let n = encap(&from_host2(), &standalone_feedback(100, fb), &[], &mut out).unwrap();
    out.truncate(n);
    out
}

/// `inner` encapsulated by host 2 in tenant a's VNI.
fn overlay_from_host2(inner: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 2048];
    let n = encap(&from_host2(), &GeneveRepr::ethernet(100), inner, &mut out).unwrap();
    out.truncate(n);
    out
}

/// Applies every change from `from` to `to`.
fn change(h: &mut Host, now: Instant, from: &Config, to: &Config) -> Vec<PortChange> {
    diff(from, to)
        .unwrap()
        .iter()
        .filter_map(|c| h.engine.apply(now, c, &mut h.pool).unwrap())
        .collect()
}

/// Frames an engine holds: queued in either direction or waiting for transmit.
fn held(e: &Engine) -> usize {
    let snap = e.snapshot();
    let queued: usize = snap
        .vms
        .iter()
        .map(|v| v.egress_queue + v.ingress_queue)
        .sum();
    queued + e.tx.iter().map(Vec::len).sum::<usize>()
}

/// Tenant b's states on host 1, which the churn cycles through: b1's guarantee, a shaped
/// class, b1 removed and added back, an SLO, a CPU quota, the tenant removed and added back.
fn b_states() -> Vec<Config> {
    let base = config(1, 1000);
    let mut states = vec![base.clone()];
    let mut s = base.clone();
    s.vms[1].min_mbps = 300;
    states.push(s);
    let mut s = base.clone();
    s.vms[1].shaped.push(ShapedClass {
        dst_ip: None,
        protocol: Some(17),
        dst_port: Some(9000),
        rate_mbps: 50.0,
    });
    states.push(s);
    let mut s = base.clone();
    s.vms.retain(|v| v.name != "b1");
    states.push(s);
    let mut s = base.clone();
    s.tenants[1].slo = Some(picnic_core::slo::Slo {
        max_loss: Some(0.5),
        ..Default::default()
    });
    states.push(s);
    let mut s = base.clone();
    s.tenants[1].cpu_quota = Some(0.5);
    states.push(s);
    let mut s = base.clone();
    s.vms.retain(|v| v.tenant != "b");
    s.tenants.retain(|t| t.name != "b");
    states.push(s);
    for s in &states {
        s.validate().unwrap();
    }
    states
}

/// What the neighbour a1 saw in one run: frames sent to a2, and each forwarded one's delay
/// through the switch (ns) with the state of tenant b when it was sent.
struct Seen {
    sent: usize,
    delays: Vec<(u64, usize)>,
}

fn p99(mut delays: Vec<u64>) -> u64 {
    delays.sort_unstable();
    delays[delays.len() * 99 / 100]
}

/// One second on host 1 in 20 us steps with the uplink paced to 100 Mb/s: a1 sends a
/// 1000-byte frame to a2 every 500 us (16 Mb/s, under its share), b1 floods b2 (two
/// 1400-byte frames per step) and sends one frame a millisecond to UDP port 9000 (the class
/// one of b's states shapes). With `churn`, tenant b changes every 10 ms (100 times a
/// second), cycling through [`b_states`]. The pool's free count is checked exactly after
/// every step and at the end.
fn run(churn: bool, first: usize) -> Seen {
    const POOL: usize = 4096;
    let states = b_states();
    let mut cfg = states[first].clone();
    cfg.uplink.capacity_mbps = Some(100);
    let mut h = Host {
        engine: Engine::new(&cfg, Instant::ZERO).unwrap(),
        pool: FramePool::new(POOL),
    };
    let a1_port = h.port_of("a1");
    let (mut seen, mut pending) = (
        Seen {
            sent: 0,
            delays: Vec::new(),
        },
        VecDeque::new(),
    );
    let mut state = first;
    let step = Duration::from_micros(20);
    let mut now = Instant::ZERO;
    for i in 0..50_000u64 {
        now = Instant::from_nanos(step.as_nanos() * i);
        if churn && i % 500 == 499 {
            let next = (state + 1) % states.len();
            let (mut from, mut to) = (states[state].clone(), states[next].clone());
            for c in [&mut from, &mut to] {
                c.uplink.capacity_mbps = Some(100);
            }
            let ports = change(&mut h, now, &from, &to);
            // Only b1's port slot opens or closes; a1 keeps its own.
            assert!(ports.iter().all(
                |p| !matches!(p, PortChange::Opened(s) | PortChange::Closed(s) if *s == a1_port)
            ));
            assert_eq!(h.port_of("a1"), a1_port);
            state = next;
        }
        if i % 25 == 0 {
            h.inject(now, a1_port, &udp(A1, A2, IP_A1, IP_A2, 7, 1000));
            pending.push_back((now, state));
            seen.sent += 1;
        }
        if h.engine.dir.vm_named("b1").is_some() {
            let b1 = h.port_of("b1");
            for _ in 0..2 {
                h.inject(now, b1, &udp(B1, B2, IP_B1, IP_B2, 7, 1400));
            }
            if i % 50 == 0 {
                h.inject(now, b1, &udp(B1, B2, IP_B1, IP_B2, 9000, 1400));
            }
        }
        h.engine.poll(now, 64, &mut NoWork, &mut h.pool);
        for f in h.take(UPLINK) {
            if f[56..62] == A1 {
                let (at, in_state) = pending.pop_front().unwrap();
                seen.delays.push(((now - at).as_nanos(), in_state));
            }
        }
        assert_eq!(h.pool.available() + held(&h.engine), POOL, "step {i}");
    }
    // Drained, every frame is back.
    let mut until = now;
    while held(&h.engine) > 0 {
        until += Duration::from_millis(1);
        h.engine.poll(until, 64, &mut NoWork, &mut h.pool);
        h.take(UPLINK);
        assert!(until < now + Duration::from_secs(5), "queues never drained");
    }
    assert_eq!(h.pool.available(), POOL);
    let a1 = h.engine.dir.vm_named("a1").unwrap();
    assert_eq!(h.engine.vm_counters[a1].drops.total(), 0);
    seen
}

/// The neighbour's delay under churn is compared with its delay in each of b's states held
/// still (a shaped class on b, for one, changes it: shaped queues are served ahead of the
/// WFQ): the churned run's distribution against the mix of the still runs' in the
/// proportions the churned run spent in each state.
#[test]
fn a_neighbour_is_forwarded_alike_while_another_tenant_changes_100_times_a_second() {
    let churned = run(true, 0);
    // Throughput: every frame of the neighbour's forwarded within the second.
    assert_eq!(churned.delays.len(), churned.sent);
    let mut still_mix = Vec::new();
    for state in 0..b_states().len() {
        let still = run(false, state);
        assert_eq!(still.delays.len(), still.sent, "state {state}");
        let n = churned.delays.iter().filter(|d| d.1 == state).count();
        assert!(n > 0 && n <= still.delays.len());
        still_mix.extend(still.delays.iter().take(n).map(|d| d.0));
    }
    // Scheduling delay: the same p99, to within 1.1x.
    let q = p99(still_mix);
    let c = p99(churned.delays.iter().map(|d| d.0).collect());
    assert!(
        c * 10 <= q * 11 && q * 10 <= c * 11,
        "p99 still {q} ns, churned {c} ns"
    );
}

#[test]
fn removing_a_vm_returns_its_frames_and_frames_for_it_never_reach_its_successor() {
    const POOL: usize = 4096;
    let cfg = config(1, 1000);
    let mut h1 = Host {
        engine: Engine::new(&cfg, Instant::ZERO).unwrap(),
        pool: FramePool::new(POOL),
    };
    // Frames of every kind for b1 and to a2: fast path, shaped class, limiter, ingress.
    let mut h2 = Host::new(2, 1000);
    h2.inject(
        Instant::ZERO,
        h2.port_of("b2"),
        &udp(B2, B1, IP_B2, IP_B1, 7, 200),
    );
    h2.poll(Instant::ZERO);
    let to_b1 = h2.take(UPLINK).pop().unwrap();
    let now = Instant::ZERO;
    h1.inject(now, UPLINK, &slow_down_a2());
    for _ in 0..5 {
        h1.inject(now, h1.port_of("b1"), &udp(B1, B2, IP_B1, IP_B2, 7, 200));
        h1.inject(now, UPLINK, &to_b1);
        h1.inject(now, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 9000, 200));
        h1.inject(now, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 7, 1400));
    }
    let b1_port = h1.port_of("b1");
    let queued = |h: &Host, vm: &str| {
        let snap = h.engine.snapshot();
        let v = snap.vms.iter().find(|v| v.name == vm).unwrap();
        (v.egress_queue, v.ingress_queue)
    };
    assert_eq!(queued(&h1, "b1"), (5, 5));
    let a1_before = queued(&h1, "a1");
    assert!(a1_before.0 >= 9, "{a1_before:?}");
    assert_eq!(h1.pool.available() + held(&h1.engine), POOL);

    // b1 goes: its 10 frames are back at once, its port closes, a1 is untouched.
    let mut no_b1 = cfg.clone();
    no_b1.vms.retain(|v| v.name != "b1");
    let free = h1.pool.available();
    assert_eq!(
        change(&mut h1, now, &cfg, &no_b1),
        vec![PortChange::Closed(b1_port)]
    );
    assert_eq!(h1.pool.available(), free + 10);
    assert_eq!(queued(&h1, "a1"), a1_before);
    assert!(h1.engine.snapshot().vms.iter().all(|v| v.name != "b1"));
    // Frames still arriving for it are unknown.
    h1.inject(now, UPLINK, &to_b1);
    assert_eq!(
        h1.engine.counters.drops.get(DropReason::UnknownDestination),
        1
    );

    // a2 (remote) goes and a3 takes its slot on host 2: a1's frames queued for a2 (in the
    // limiter and the fast path) are dropped as `removed`, none reaches a3.
    let mut a3 = no_b1.clone();
    let a2 = a3.vms.iter_mut().find(|v| v.name == "a2").unwrap();
    a2.name = "a3".into();
    a2.id = 7;
    a2.mac = crate::config::Mac([2, 0, 0, 0, 0, 9]);
    let a2_slot = h1.engine.dir.vm_named("a2").unwrap();
    assert!(change(&mut h1, now, &no_b1, &a3).is_empty());
    assert_eq!(h1.engine.dir.vm_named("a3"), Some(a2_slot));
    let mut t = now;
    for _ in 0..2000 {
        t += Duration::from_millis(1);
        h1.engine.poll(t, 64, &mut NoWork, &mut h1.pool);
        let sent = h1.take(UPLINK);
        assert!(
            sent.iter().all(|f| f.len() < 62 || f[56..62] != A1),
            "a frame for a2 was sent"
        );
    }
    let a1 = h1.engine.dir.vm_named("a1").unwrap();
    assert_eq!(h1.engine.vm_counters[a1].drops.get(DropReason::Removed), 10);
    assert_eq!(h1.pool.available(), POOL);

    // b1 comes back on the same slot, with fresh counters; tenant b can then be removed.
    assert_eq!(
        change(&mut h1, t, &a3, &{
            let mut c = a3.clone();
            c.vms.push(cfg.vms[1].clone());
            c
        }),
        vec![PortChange::Opened(b1_port)]
    );
    let b1 = h1.engine.dir.vm_named("b1").unwrap();
    assert_eq!(h1.engine.vm_counters[b1].rx_packets, 0);
    let mut no_b = a3.clone();
    no_b.vms.retain(|v| v.tenant != "b");
    no_b.tenants.retain(|t| t.name != "b");
    let remove_b = Change::RemoveTenant("b".into());
    assert!(
        h1.engine.apply(t, &remove_b, &mut h1.pool).is_err(),
        "b has VMs"
    );
    change(
        &mut h1,
        t,
        &{
            let mut c = a3.clone();
            c.vms.push(cfg.vms[1].clone());
            c
        },
        &no_b,
    );
    assert!(h1.engine.dir.tenant_named("b").is_none());
    assert!(h1.engine.snapshot().tenants.iter().all(|t| t.name != "b"));
}

#[test]
fn a_vms_new_guarantee_applies_in_place_without_touching_its_neighbour() {
    let mut h1 = Host::new(1, 1000);
    let now = Instant::ZERO;
    for _ in 0..100 {
        h1.inject(now, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 7, 200));
        h1.inject(now, h1.port_of("b1"), &udp(B1, B2, IP_B1, IP_B2, 7, 200));
    }
    let queued = |h: &Host, vm: &str| {
        let snap = h.engine.snapshot();
        snap.vms.iter().find(|v| v.name == vm).unwrap().egress_queue
    };
    let first_sent = |h: &mut Host, n: usize| {
        h.engine.poll(now, n, &mut NoWork, &mut h.pool);
        let sent = h.take(UPLINK);
        let from = |mac: [u8; 6]| sent.iter().filter(|f| f[56..62] == mac).count();
        (from(A1), from(B1))
    };
    assert_eq!((queued(&h1, "a1"), queued(&h1, "b1")), (100, 100));
    // Both at 100 Mb/s: the WFQ alternates.
    assert_eq!(first_sent(&mut h1, 20), (10, 10));
    // b1 to 300 Mb/s, in place: nothing queued is lost or reset.
    let mut b1 = config(1, 1000).vms[1].clone();
    b1.min_mbps = 300;
    h1.engine
        .apply(now, &Change::SetVm(b1), &mut h1.pool)
        .unwrap();
    assert_eq!((queued(&h1, "a1"), queued(&h1, "b1")), (90, 90));
    // Now b1 gets three frames for each of a1's.
    let (a, b) = first_sent(&mut h1, 40);
    assert_eq!(a + b, 40);
    assert!(b >= 28 && a <= 12, "a1 {a}, b1 {b}");
    let mut unknown = config(1, 1000).vms[1].clone();
    unknown.name = "nobody".into();
    assert!(h1
        .engine
        .apply(now, &Change::SetVm(unknown), &mut h1.pool)
        .is_err());
}

/// A frame from the underlay must come from a VM of its tenant that lives on the host that
/// sent it (the directory knows which VM lives where), with that VM's addresses.
#[test]
fn underlay_frames_carry_a_source_of_the_host_that_sent_them() {
    let mut h1 = Host::new(1, 1000);
    let now = Instant::ZERO;
    let a1 = h1.port_of("a1");
    // a2 lives on host 2: delivered.
    h1.inject(
        now,
        UPLINK,
        &overlay_from_host2(&udp(A2, A1, IP_A2, IP_A1, 7, 100)),
    );
    // a1's own MAC and IP (it lives on host 1), b2's MAC in tenant a's VNI, a2's MAC with
    // a1's IP: all dropped as spoofed, against the switch.
    for inner in [
        udp(A1, A1, IP_A1, IP_A1, 7, 100),
        udp(B2, A1, IP_B2, IP_A1, 7, 100),
        udp(A2, A1, IP_A1, IP_A1, 7, 100),
    ] {
        h1.inject(now, UPLINK, &overlay_from_host2(&inner));
    }
    h1.poll(now);
    assert_eq!(h1.take(a1).len(), 1);
    assert_eq!(h1.engine.counters.drops.get(DropReason::Spoofed), 3);
    assert_eq!(h1.drops("a1", DropReason::Spoofed), 0);
}

/// A list of changes whose last one fails is undone as a whole: the first change (b1's new
/// guarantee) is taken back, a1's queued frames stay, and the error names the change that
/// failed and says that nothing changed.
#[test]
fn a_change_list_that_fails_part_way_is_undone() {
    let mut h1 = Host::new(1, 1000);
    let now = Instant::ZERO;
    for _ in 0..10 {
        h1.inject(now, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 7, 200));
    }
    let old = config(1, 1000);
    let guarantee = |e: &Engine| {
        let v = e.dir.vm_named("b1").unwrap();
        e.dir.vms[v].min_bps
    };
    let before = guarantee(&h1.engine);
    let mut b1 = old.vms[1].clone();
    b1.min_mbps = 300;
    let mut unknown = old.vms[1].clone();
    unknown.name = "nobody".into();
    let changes = [Change::SetVm(b1), Change::SetVm(unknown)];
    let mut ports = Vec::new();
    let err = h1
        .engine
        .apply_all(now, &old, &changes, &mut h1.pool, |p, _| ports.push(p))
        .unwrap_err();
    assert_eq!(err.index, 1);
    assert!(err.undo_failed.is_none(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("change VM 'nobody'") && text.contains("nothing changed"),
        "{text}"
    );
    assert_eq!(guarantee(&h1.engine), before, "b1's guarantee taken back");
    assert!(ports.is_empty());
    assert_eq!(held(&h1.engine), 10, "a1's frames untouched");
    assert!(diff(&err.running(&old, &changes), &old).unwrap().is_empty());
}
