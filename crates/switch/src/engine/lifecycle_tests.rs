//! An engine that is replaced (every API change rebuilds it) gives every frame it held back
//! to the pool: repeated changes under load must not shrink the pool until the switch drops
//! everything for lack of buffers.

use picnic_core::{Duration, Instant};
use picnic_wire::feedback::{standalone_feedback, FeedbackOption};
use picnic_wire::overlay::{encap, OuterHeaders};

use super::tests::{config, udp, Host, A1, A2, B1, B2, IP_A1, IP_A2, IP_B1, IP_B2};
use super::Engine;
use crate::directory::UPLINK;
use crate::frame::FramePool;

/// Feedback from host 2 slowing traffic to a2 (endpoint 3), so a1's frames to a2 wait in a
/// limiter queue.
fn slow_down_a2() -> Vec<u8> {
    let fb = FeedbackOption {
        dst_endpoint: 3,
        rate_bps: 1_000_000,
        seq: 1,
    };
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: [198, 19, 0, 2].into(),
        dst_ip: [198, 19, 0, 1].into(),
        src_port: 50000,
        ttl: 64,
    };
    let mut out = vec![0u8; 256];
    let n = encap(&outer, &standalone_feedback(100, fb), &[], &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn pool_free_count_is_conserved_across_1000_rebuilds_with_frames_queued() {
    const POOL: usize = 4096;
    let cfg = config(1, 1000);
    let mut h1 = Host {
        engine: Engine::new(&cfg, Instant::ZERO).unwrap(),
        pool: FramePool::new(POOL),
    };
    // Host 2 makes the overlay frames h1 receives for b1 (its ingress queue).
    let mut h2 = Host::new(2, 1000);
    let to_b1 = {
        h2.inject(
            Instant::ZERO,
            h2.port_of("b2"),
            &udp(B2, B1, IP_B2, IP_B1, 7, 200),
        );
        h2.poll(Instant::ZERO);
        h2.take(UPLINK).pop().unwrap()
    };
    let mut now = Instant::ZERO;
    for change in 0..1000 {
        now += Duration::from_millis(1);
        h1.inject(now, UPLINK, &slow_down_a2());
        for _ in 0..3 {
            // Fast path (egress WFQ), shaped class (UDP 9000), limiter (to a2), ingress.
            h1.inject(now, h1.port_of("b1"), &udp(B1, B2, IP_B1, IP_B2, 7, 200));
            h1.inject(now, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 9000, 200));
            h1.inject(now, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 7, 1400));
            h1.inject(now, UPLINK, &to_b1);
        }
        let snap = h1.engine.snapshot();
        let queued: usize = snap
            .vms
            .iter()
            .map(|v| v.egress_queue + v.ingress_queue)
            .sum();
        assert!(queued >= 9, "change {change}: only {queued} frames queued");
        assert_eq!(
            h1.pool.available(),
            POOL - queued - h1.engine.tx.iter().map(Vec::len).sum::<usize>()
        );
        // The change: a new engine replaces the old one, which gives its frames back.
        let mut old = std::mem::replace(&mut h1.engine, Engine::new(&cfg, now).unwrap());
        old.release_frames(&mut h1.pool);
        assert_eq!(h1.pool.available(), POOL, "change {change} lost frames");
    }
    let a1 = h1
        .engine
        .dir
        .vms
        .iter()
        .position(|v| v.name == "a1")
        .unwrap();
    assert_eq!(h1.engine.vm_counters[a1].drops.total(), 0);
}

/// Of the first `n` frames the egress WFQ sends, how many came from a1 and from b1 (by the
/// inner source MAC behind the 50 bytes of outer headers).
fn first_sent(h: &mut Host, now: Instant, n: usize) -> (usize, usize) {
    h.engine
        .poll(now, n, &mut super::tests::NoWork, &mut h.pool);
    let sent = h.take(UPLINK);
    let from = |mac: [u8; 6]| sent.iter().filter(|f| f[56..62] == mac).count();
    (from(A1), from(B1))
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
    assert_eq!((queued(&h1, "a1"), queued(&h1, "b1")), (100, 100));
    // Both at 100 Mb/s: the WFQ alternates.
    let (a, b) = first_sent(&mut h1, now, 20);
    assert_eq!((a, b), (10, 10));
    // b1 to 300 Mb/s, in place: nothing queued is lost or reset.
    h1.engine
        .set_vm_rates(now, "b1", 300_000_000, None)
        .unwrap();
    assert_eq!((queued(&h1, "a1"), queued(&h1, "b1")), (90, 90));
    // Now b1 gets three frames for each of a1's.
    let (a, b) = first_sent(&mut h1, now, 40);
    assert_eq!(a + b, 40);
    assert!(b >= 28 && a <= 12, "a1 {a}, b1 {b}");
    assert!(h1.engine.set_vm_rates(now, "a2", 1, None).is_err());
}
