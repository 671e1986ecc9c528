//! Feedback is applied only from the endpoint's owner host, authenticated with the
//! deployment's key and never twice (see `feedback.rs`); every refusal is counted by reason.

use picnic_core::{Duration, Instant};
use picnic_wire::feedback::{FeedbackAuth, FeedbackOption};
use picnic_wire::geneve::standalone_feedback;
use picnic_wire::overlay::{encap, OuterHeaders};

use super::feedback::{FeedbackAuthState, MAX_FEEDBACK_BPS};
use super::tests::{carry, udp, Host, A1, A2, IP_A1, IP_A2};
use crate::directory::UPLINK;
use crate::stats::{DropReason, FeedbackRejects};

pub(super) const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
/// The wall clock at the engines' zero in these tests: 2026-01-01.
pub(super) const WALL_AT_ZERO_NS: u64 = 1_767_225_600 * 1_000_000_000;
pub(super) const HOST1_IP: [u8; 4] = [198, 19, 0, 1];
pub(super) const HOST2_IP: [u8; 4] = [198, 19, 0, 2];

/// A standalone feedback packet to host 1 about `endpoint` in `vni`, from underlay address
/// `src`, with optional authentication.
pub(super) fn feedback_packet(
    src: [u8; 4],
    vni: u32,
    endpoint: u32,
    rate_bps: u64,
    seq: u32,
    auth: Option<FeedbackAuth>,
) -> Vec<u8> {
    let fb = FeedbackOption {
        dst_endpoint: endpoint,
        rate_bps,
        seq,
    };
    let mut geneve = standalone_feedback(vni, fb);
    geneve.feedback_auth = auth;
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: src.into(),
        dst_ip: HOST1_IP.into(),
        src_port: 50000,
        ttl: 64,
    };
    let mut out = vec![0u8; 256];
    let n = encap(&outer, &geneve, &[], &mut out).unwrap();
    out.truncate(n);
    out
}

/// Signs feedback as host 2 would with `key`, at `now`.
fn signed(key: &[u8], now: Instant, vni: u32, endpoint: u32, seq: u32) -> FeedbackAuth {
    let mut signer = FeedbackAuthState::new(key, WALL_AT_ZERO_NS).unwrap();
    let fb = FeedbackOption {
        dst_endpoint: endpoint,
        rate_bps: 1_000_000,
        seq,
    };
    signer
        .sign(now, HOST2_IP.into(), HOST1_IP.into(), vni, &fb)
        .unwrap()
}

/// Frames a1 (host 1) sent to a2 that had to wait in a feedback limiter's queue after 20
/// back-to-back frames: 0 when no feedback was applied to traffic towards a2.
pub(super) fn limited_frames(h1: &mut Host, now: Instant) -> u64 {
    let frame = udp(A1, A2, IP_A1, IP_A2, 7, 1400);
    for _ in 0..20 {
        h1.inject(now, h1.port_of("a1"), &frame);
    }
    h1.poll(now);
    h1.take(UPLINK);
    let a1 = h1.engine.dir.vms.iter().position(|v| v.name == "a1");
    h1.engine.vm_counters[a1.unwrap()].waited_limiter
}

fn rejected(h: &Host) -> FeedbackRejects {
    h.engine.counters.feedback_rejected.clone()
}

#[test]
fn feedback_not_from_the_endpoints_owner_is_refused_before_it_is_applied() {
    let mut h1 = Host::new(1, 1000);
    let t = Instant::ZERO;
    // a2 (endpoint 3, tenant a = VNI 100) lives on host 2. Each of these claims otherwise.
    for bad in [
        feedback_packet([198, 19, 0, 9], 100, 3, 1_000_000, 1, None), // no such host
        feedback_packet(HOST2_IP, 100, 1, 1_000_000, 1, None),        // a1 lives on host 1
        feedback_packet(HOST2_IP, 200, 3, 1_000_000, 1, None),        // a2 is not in VNI 200
        feedback_packet(HOST2_IP, 100, 99, 1_000_000, 1, None),       // no such endpoint
    ] {
        h1.inject(t, UPLINK, &bad);
    }
    assert_eq!(rejected(&h1).forged, 4);
    assert_eq!(limited_frames(&mut h1, t), 0, "forged feedback was applied");
    // The owner's own feedback is applied: a1's frames to a2 now wait in a limiter.
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, 1_000_000, 1, None),
    );
    assert!(limited_frames(&mut h1, t) > 0);
    assert_eq!(rejected(&h1).forged, 4);
    // Forged packets are control messages: none reached a VM or counted as a frame drop.
    assert_eq!(h1.engine.counters.drops.total(), 0);
}

#[test]
fn out_of_range_rates_are_refused() {
    let mut h1 = Host::new(1, 1000);
    let t = Instant::ZERO;
    h1.inject(t, UPLINK, &feedback_packet(HOST2_IP, 100, 3, 0, 1, None));
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, MAX_FEEDBACK_BPS + 1, 2, None),
    );
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, u64::MAX, 3, None),
    );
    assert_eq!(rejected(&h1).out_of_range, 3);
    assert_eq!(limited_frames(&mut h1, t), 0);
}

fn keyed_host(id: u32) -> Host {
    let mut h = Host::new(id, 1000);
    h.engine
        .set_feedback_key(Some(KEY), WALL_AT_ZERO_NS)
        .unwrap();
    h
}

#[test]
fn with_a_key_unsigned_and_wrongly_signed_feedback_is_refused() {
    let mut h1 = keyed_host(1);
    let t = Instant::ZERO + Duration::from_secs(1);
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, 1_000_000, 1, None),
    );
    let other_key = signed(b"another key of thirty-two bytes!", t, 100, 3, 2);
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, 1_000_000, 2, Some(other_key)),
    );
    // Signed for other contents: a different endpoint or VNI than the packet says.
    let for_endpoint_1 = signed(KEY, t, 100, 1, 3);
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, 1_000_000, 3, Some(for_endpoint_1)),
    );
    assert_eq!(rejected(&h1).unauthenticated, 3);
    assert_eq!(limited_frames(&mut h1, t), 0);
    // Ownership is still checked first: a valid tag does not make a host an owner.
    let owner_check = signed(KEY, t, 100, 1, 4);
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 1, 1_000_000, 4, Some(owner_check)),
    );
    assert_eq!(rejected(&h1).forged, 1);
    let good = signed(KEY, t, 100, 3, 5);
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, 1_000_000, 5, Some(good)),
    );
    assert!(limited_frames(&mut h1, t) > 0);
    assert_eq!(rejected(&h1).unauthenticated, 3);
}

#[test]
fn replayed_and_stale_feedback_is_refused() {
    let mut h1 = keyed_host(1);
    let t = Instant::ZERO + Duration::from_secs(20);
    let mut signer = FeedbackAuthState::new(KEY, WALL_AT_ZERO_NS).unwrap();
    let fb = |seq| FeedbackOption {
        dst_endpoint: 3,
        rate_bps: 1_000_000,
        seq,
    };
    let sign = |s: &mut FeedbackAuthState, now, seq| {
        s.sign(now, HOST2_IP.into(), HOST1_IP.into(), 100, &fb(seq))
            .unwrap()
    };
    let packet = |auth, seq| feedback_packet(HOST2_IP, 100, 3, 1_000_000, seq, Some(auth));
    let first = sign(&mut signer, t, 1);
    let second = sign(&mut signer, t, 2);
    let third = sign(&mut signer, t, 3);
    h1.inject(t, UPLINK, &packet(first, 1));
    h1.inject(t, UPLINK, &packet(third, 3));
    // Reordered but unseen: accepted. Seen: refused, however late it comes.
    h1.inject(t, UPLINK, &packet(second, 2));
    assert_eq!(rejected(&h1).replayed, 0);
    for later in [t, t + Duration::from_millis(500)] {
        h1.inject(later, UPLINK, &packet(first, 1));
        h1.inject(later, UPLINK, &packet(third, 3));
    }
    assert_eq!(rejected(&h1).replayed, 4);
    // A nonce more than the window below the newest one is refused unseen.
    let old = sign(&mut signer, t, 4);
    for seq in 5..75 {
        let a = sign(&mut signer, t, seq);
        h1.inject(t, UPLINK, &packet(a, seq));
    }
    h1.inject(t, UPLINK, &packet(old, 4));
    assert_eq!(rejected(&h1).replayed, 5);
    // Signed 15 s before the receiver's clock (beyond the skew bound): refused even by a
    // receiver that never saw it (its replay window was reset by a restart).
    let mut restarted = keyed_host(1);
    let stale = FeedbackAuthState::new(KEY, WALL_AT_ZERO_NS)
        .unwrap()
        .sign(
            t - Duration::from_secs(15),
            HOST2_IP.into(),
            HOST1_IP.into(),
            100,
            &fb(1),
        )
        .unwrap();
    restarted.inject(t, UPLINK, &packet(stale, 1));
    assert_eq!(rejected(&restarted).replayed, 1);
    assert_eq!(limited_frames(&mut restarted, t), 0);
    assert_eq!(rejected(&h1).unauthenticated + rejected(&h1).forged, 0);
}

#[test]
fn hosts_sharing_a_key_exchange_authenticated_feedback_end_to_end() {
    // Host 2's access link is 100 Mb/s; a1 sends to a2 at ~400 Mb/s: host 2 pushes back.
    let (mut h1, mut h2) = (keyed_host(1), Host::new(2, 100));
    h2.engine
        .set_feedback_key(Some(KEY), WALL_AT_ZERO_NS)
        .unwrap();
    let mut now = Instant::ZERO + Duration::from_secs(1);
    let frame = udp(A1, A2, IP_A1, IP_A2, 7, 1400);
    for _ in 0..200 {
        now += Duration::from_micros(100);
        for _ in 0..4 {
            h1.inject(now, h1.port_of("a1"), &frame);
        }
        h1.poll(now);
        carry(&mut h1, &mut h2, now);
        h2.poll(now);
        carry(&mut h2, &mut h1, now);
        h2.take(h2.port_of("a2"));
    }
    assert!(h2.engine.counters.feedback_sent > 10);
    assert_eq!(
        h1.engine.counters.feedback_received,
        h2.engine.counters.feedback_sent
    );
    let r = rejected(&h1);
    assert_eq!(
        (r.forged, r.unauthenticated, r.replayed, r.out_of_range),
        (0, 0, 0, 0)
    );
    let snap = h1.engine.snapshot();
    let a1 = snap.vms.iter().find(|v| v.name == "a1").unwrap();
    assert!(a1
        .applied_limits
        .iter()
        .any(|(d, r)| *d == 3 && *r < 100_000_000));
    // A host with another deployment's key refuses every one of them.
    let mut other = Host::new(1, 1000);
    other
        .engine
        .set_feedback_key(Some(b"another deployment's key, 32 B.."), WALL_AT_ZERO_NS)
        .unwrap();
    for _ in 0..20 {
        now += Duration::from_micros(100);
        h1.inject(now, h1.port_of("a1"), &frame);
        h1.poll(now);
        carry(&mut h1, &mut h2, now);
        h2.poll(now);
        carry(&mut h2, &mut other, now);
    }
    assert!(other.engine.counters.feedback_received > 0);
    assert_eq!(
        rejected(&other).unauthenticated,
        other.engine.counters.feedback_received
    );
}

/// A host's workers sign in lanes of their own: a busy worker's nonces never push a quiet
/// one's out of the receiver's replay window, and each lane still refuses its replays.
#[test]
fn each_worker_signs_in_its_own_nonce_lane() {
    let mut h1 = keyed_host(1);
    let t = Instant::ZERO + Duration::from_secs(20);
    let fb = |seq| FeedbackOption {
        dst_endpoint: 3,
        rate_bps: 1_000_000,
        seq,
    };
    let (mut busy, mut quiet) = (
        FeedbackAuthState::new(KEY, WALL_AT_ZERO_NS).unwrap(),
        FeedbackAuthState::new(KEY, WALL_AT_ZERO_NS).unwrap(),
    );
    quiet.set_lane(1);
    let packet = |s: &mut FeedbackAuthState, seq| {
        let auth = s.sign(t, HOST2_IP.into(), HOST1_IP.into(), 100, &fb(seq));
        feedback_packet(HOST2_IP, 100, 3, 1_000_000, seq, auth)
    };
    let late = packet(&mut quiet, 1);
    for seq in 0..100 {
        h1.inject(t, UPLINK, &packet(&mut busy, seq));
    }
    h1.inject(t, UPLINK, &late);
    assert_eq!(
        rejected(&h1).replayed,
        0,
        "the quiet lane's nonce is in its window"
    );
    h1.inject(t, UPLINK, &late);
    assert_eq!(rejected(&h1).replayed, 1, "and is not accepted twice");
}

/// A VM whose advertised rate backpressure caps (its pps limit refused frames) is not fed
/// back as quiet: the capped rate reaches its senders every feedback interval, as EyeQ's
/// feedback does, so they learn within one when the cap lifts; a quiet VM, every 10 ms.
#[test]
fn a_vm_capped_by_backpressure_is_fed_back_every_interval_not_as_quiet() {
    let mut cfg = super::tests::config(2, 1000);
    let a2 = cfg.vms.iter().position(|v| v.name == "a2").unwrap();
    cfg.vms[a2].max_pps = Some(500);
    let mut h2 = Host {
        engine: super::Engine::new(&cfg, Instant::ZERO).unwrap(),
        pool: crate::frame::FramePool::new(4096),
    };
    let mut h1 = Host::new(1, 1000);
    let frame = udp(A1, A2, IP_A1, IP_A2, 7, 200);
    let mut now = Instant::ZERO;
    // One frame every 4 ms (250/s, within a2's 500 pps) for `ms`: feedback frames h2 sent.
    let slow = |h1: &mut Host, h2: &mut Host, now: &mut Instant, ms: u64| -> u64 {
        let before = h2.engine.counters.feedback_sent;
        for _ in 0..ms / 4 {
            *now += Duration::from_millis(4);
            h1.inject(*now, h1.port_of("a1"), &frame);
            h1.poll(*now);
            carry(h1, h2, *now);
            h2.poll(*now);
            carry(h2, h1, *now);
            h2.take(h2.port_of("a2"));
        }
        h2.engine.counters.feedback_sent - before
    };
    let quiet = slow(&mut h1, &mut h2, &mut now, 100);
    // A burst over a2's packet rate: frames refused, and at the end of the Iron period a2's
    // rate is capped at what it admitted (13 Mb/s), the cap doubling every period after.
    for _ in 0..200 {
        h1.inject(now, h1.port_of("a1"), &frame);
    }
    h1.poll(now);
    carry(&mut h1, &mut h2, now);
    h2.poll(now);
    slow(&mut h1, &mut h2, &mut now, 20);
    let capped = slow(&mut h1, &mut h2, &mut now, 60);
    // What a1's limiter towards a2 (id 3) holds: still a cap below the link's 900 Mb/s.
    let limit = |h1: &Host| {
        let snap = h1.engine.snapshot();
        let a1 = snap.vms.iter().find(|v| v.name == "a1").unwrap();
        a1.applied_limits.iter().find(|(d, _)| *d == 3).map(|l| l.1)
    };
    assert!(
        limit(&h1).is_some_and(|r| r < 900_000_000),
        "{:?}",
        limit(&h1)
    );
    // Quiet: the first frame and about one per 10 ms (the next frame after each). Capped:
    // every frame of the slow flow.
    assert!(quiet <= 10, "quiet: {quiet} feedback frames for 25 frames");
    assert_eq!(capped, 15, "capped: feedback frames for 15 frames");
    // The cap lifted (doubled past the link): the next frame's feedback says so.
    slow(&mut h1, &mut h2, &mut now, 20);
    assert_eq!(limit(&h1), Some(900_000_000));
}

/// With the kernel fast path linked, frames handed over to a destination's limiter meet no
/// burst (the kernel forwarded up to the rate and spent it), and once the VM goes back to the
/// kernel its empty limiters are forgotten and their destinations named, so the kernel's
/// buckets start without a burst too: one budget across both paths (EyeQ 3.3).
#[test]
fn with_the_fast_path_a_destination_limiter_holds_no_burst_across_the_hand_overs() {
    let waited = |fast: bool| {
        let mut h1 = Host::new(1, 1000);
        if fast {
            h1.engine.link_fast_path();
        }
        let t = Instant::ZERO;
        // 100 Mb/s for a2: a 1 ms bucket (14 kB) holds 9 of a1's 1.5 kB frames.
        h1.inject(
            t,
            UPLINK,
            &feedback_packet(HOST2_IP, 100, 3, 100_000_000, 1, None),
        );
        (limited_frames(&mut h1, t), h1)
    };
    let (engines_only, _) = waited(false);
    assert_eq!(
        engines_only, 11,
        "the engines alone: a full bucket lets 9 of 20 through"
    );
    let (handed_over, mut h1) = waited(true);
    assert_eq!(
        handed_over, 20,
        "after the kernel's burst, every frame waits its turn"
    );
    // Still queued: nothing to release, the VM stays with the engines.
    let slot = h1.port_of("a1");
    assert!(h1.engine.fast_path_resumes_tx(slot).is_empty());
    let a2 = h1.vm("a2") as u32;
    // The limiter sends them out at 100 Mb/s (2.4 ms).
    for ms in 1..=5 {
        h1.poll(Instant::from_nanos(ms * 1_000_000));
        h1.take(UPLINK);
    }
    assert_eq!(h1.engine.fast_path_resumes_tx(slot), vec![a2]);
    assert!(
        h1.engine.fast_path_resumes_tx(slot).is_empty(),
        "forgotten once"
    );
}

/// A destination whose limiter queue overflowed is named as overflowing (the kernel then
/// drops what goes beyond its rate before any work, Iron 3.3) until that queue empties.
#[test]
fn a_destination_limiter_that_overflowed_is_overflowing_until_its_queue_empties() {
    let mut h1 = Host::new(1, 1000);
    let t = Instant::ZERO;
    h1.inject(
        t,
        UPLINK,
        &feedback_packet(HOST2_IP, 100, 3, 10_000_000, 1, None),
    );
    let a2 = h1.vm("a2");
    let frame = udp(A1, A2, IP_A1, IP_A2, 7, 1400);
    let a1 = h1.port_of("a1");
    for _ in 0..200 {
        h1.inject(t, a1, &frame);
    }
    h1.poll(t);
    h1.take(UPLINK);
    assert!(
        !h1.engine.destination_overflowing(a2),
        "200 frames fit its 256"
    );
    for _ in 0..200 {
        h1.inject(t, a1, &frame);
    }
    h1.poll(t);
    h1.take(UPLINK);
    assert!(h1.engine.destination_overflowing(a2));
    // 10 Mb/s, fed back every 50 ms, drains the 256 queued 1.5 kB frames in about 0.3 s.
    for ms in 1..=600 {
        let now = Instant::from_nanos(ms * 1_000_000);
        if ms % 50 == 0 {
            let seq = 1 + ms as u32 / 50;
            h1.inject(
                now,
                UPLINK,
                &feedback_packet(HOST2_IP, 100, 3, 10_000_000, seq, None),
            );
        }
        h1.poll(now);
        h1.take(UPLINK);
    }
    assert!(!h1.engine.destination_overflowing(a2));
}

/// A flood held by the kernel: the destination stays overflowing while the kernel drops
/// beyond its rate, though the limiter here is empty, and once the kernel has dropped a
/// queue's worth the limiter's queue is emptied (what it holds was sent within the rate
/// alone and would never drain), so its senders can go back to the kernel. Without kernel
/// drops (TCP's super-frames are not dropped there) the queue is left alone.
#[test]
fn a_flooded_destination_stays_held_while_the_kernel_drops_and_its_queue_is_emptied() {
    for kernel_drops in [false, true] {
        let mut h1 = Host::new(1, 1000);
        let feedback = |h1: &mut Host, now: Instant, seq: u32| {
            let f = feedback_packet(HOST2_IP, 100, 3, 10_000_000, seq, None);
            h1.inject(now, UPLINK, &f);
        };
        let t = Instant::ZERO;
        feedback(&mut h1, t, 1);
        let (a1, a2) = (h1.vm("a1"), h1.vm("a2"));
        let frame = udp(A1, A2, IP_A1, IP_A2, 7, 1400);
        let port = h1.port_of("a1");
        for _ in 0..300 {
            h1.inject(t, port, &frame);
        }
        h1.poll(t);
        h1.take(UPLINK);
        assert!(
            h1.engine.destination_overflowing(a2),
            "300 frames overflow its 256"
        );
        let queued = h1.engine.egress.queue_len(a1);
        assert!(queued >= 250, "{queued} queued");
        if kernel_drops {
            h1.engine.kernel_dropped_for(a2, t, 255);
            h1.poll(t);
            assert_eq!(
                h1.engine.egress.queue_len(a1),
                queued,
                "not yet a queue's worth"
            );
        }
        let lost = h1.drops("a1", DropReason::ShapedQueueFull);
        if kernel_drops {
            h1.engine.kernel_dropped_for(a2, t, 1);
        }
        h1.poll(t);
        let lost = h1.drops("a1", DropReason::ShapedQueueFull) - lost;
        let left = h1.engine.egress.queue_len(a1);
        if kernel_drops {
            assert_eq!((lost, left), (queued as u64, 0), "emptied");
        } else {
            assert_eq!((lost, left), (0, queued), "left alone");
        }
        // The kernel keeps dropping until 1 s; the queue drains at 10 Mb/s within 0.3 s.
        let mut held_until = 0;
        for ms in 1..=1100u64 {
            let now = Instant::from_nanos(ms * 1_000_000);
            if ms % 50 == 0 {
                feedback(&mut h1, now, 1 + ms as u32 / 50);
            }
            if kernel_drops && ms <= 1000 {
                h1.engine.kernel_dropped_for(a2, now, 10);
            }
            h1.poll(now);
            h1.take(UPLINK);
            if h1.engine.destination_overflowing(a2) {
                held_until = ms;
            }
        }
        assert_eq!(h1.engine.egress.queue_len(a1), 0);
        if kernel_drops {
            // Held 20 ms past the kernel's last drop.
            assert_eq!(held_until, 1019);
        } else {
            // Released once the queue drained (the last overflow was long before).
            assert!(
                (100..400).contains(&held_until),
                "held until {held_until} ms"
            );
        }
    }
}
