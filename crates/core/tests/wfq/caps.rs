//! Caps: GCRA pacing per node, the rest of the capacity to the others.

use crate::harness::*;
use picnic_core::wfq::{Cap, CostKind, QueueId, QueueLimits, Wfq};
use picnic_core::Instant;
use std::collections::HashMap;

/// A link of `rate` bytes/s serving the scheduler back to back on a virtual
/// clock; idles until `poll_at` when nothing is eligible. Returns per queue the
/// (dequeue time, bytes) of each packet and the total idle time.
fn serve_link(
    wfq: &mut Wfq<()>,
    backlogged: &[QueueId],
    rate: u64,
    until: Instant,
) -> (HashMap<QueueId, Vec<(u64, u64)>>, u64) {
    let mut now = Instant::ZERO;
    let mut log: HashMap<QueueId, Vec<(u64, u64)>> = HashMap::new();
    let mut idle = 0;
    for &q in backlogged {
        while !wfq.is_full(q) {
            wfq.enqueue(now, q, (), 1500).unwrap();
        }
    }
    while now < until {
        match wfq.dequeue(now) {
            Some(d) => {
                log.entry(d.queue)
                    .or_default()
                    .push((now.as_nanos(), d.cost));
                wfq.enqueue(now, d.queue, (), d.len_bytes).unwrap();
                now += picnic_core::Duration::from_nanos(d.cost * 1_000_000_000 / rate);
            }
            None => {
                let next = wfq.poll_at().expect("backlogged but not throttled");
                assert!(next > now, "poll_at must lie in the future");
                idle += (next - now).as_nanos();
                now = next;
            }
        }
    }
    (log, idle)
}

/// Cost served in any window [t_i, t_j] (dequeue times) is at most
/// cap * (t_j - t_i) + burst + one packet.
fn assert_capped(log: &[(u64, u64)], cap: Cap, max_packet: u64) {
    for i in 0..log.len() {
        let mut sum = 0u128;
        for &(t, cost) in &log[i..] {
            sum += cost as u128;
            let allowed = cap.per_sec as u128 * (t - log[i].0) as u128 / 1_000_000_000
                + (cap.burst + max_packet) as u128;
            assert!(
                sum <= allowed,
                "served {sum} in {} ns, cap allows {allowed}",
                t - log[i].0
            );
        }
    }
}

#[test]
fn a_capped_tenant_never_exceeds_its_cap_and_others_take_the_rest() {
    let rate = 125_000_000; // 1 Gb/s link in bytes/s
    let limits = QueueLimits {
        max_packets: 8,
        max_bytes: 1 << 20,
    };
    for burst in [0, 15_000] {
        let cap = Cap {
            per_sec: rate * 3 / 10,
            burst,
        };
        let mut wfq = Wfq::new(CostKind::Bytes);
        let a = wfq.add_node(wfq.root(), 4, Some(cap)).unwrap();
        let b = wfq.add_node(wfq.root(), 1, None).unwrap();
        let qa = [
            wfq.add_queue(a, 1, limits).unwrap(),
            wfq.add_queue(a, 1, limits).unwrap(),
        ];
        let qb = wfq.add_queue(b, 1, limits).unwrap();
        let (log, idle) = serve_link(
            &mut wfq,
            &[qa[0], qa[1], qb],
            rate,
            Instant::from_nanos(100_000_000),
        );
        assert_eq!(idle, 0, "work conserving: B fills what A may not use");
        let mut a_log: Vec<(u64, u64)> = log[&qa[0]].iter().chain(&log[&qa[1]]).copied().collect();
        a_log.sort();
        assert_capped(&a_log, cap, 1500);
        let a_bytes: u64 = a_log.iter().map(|&(_, c)| c).sum();
        let b_bytes: u64 = log[&qb].iter().map(|&(_, c)| c).sum();
        let a_share = a_bytes as f64 / (a_bytes + b_bytes) as f64;
        // Strict pacing (burst 0) loses the time A waits for the packet in
        // flight; one packet of burst lets A reach its cap.
        assert!(
            a_share < 0.302 && a_share > if burst == 0 { 0.2 } else { 0.295 },
            "burst {burst}: A share {a_share} (cap 30%, weight 80%)"
        );
    }
}

#[test]
fn a_capped_queue_alone_is_paced_at_its_cap_via_poll_at() {
    let rate = 125_000_000;
    let cap = Cap::per_sec(10_000_000);
    let mut wfq = Wfq::new(CostKind::Bytes);
    let q = wfq.add_queue(wfq.root(), 1, ROOMY).unwrap();
    wfq.set_cap(Instant::ZERO, q, Some(cap)).unwrap();
    let (log, idle) = serve_link(&mut wfq, &[q], rate, Instant::from_nanos(50_000_000));
    assert_capped(&log[&q], cap, 1500);
    let bytes: u64 = log[&q].iter().map(|&(_, c)| c).sum();
    // 50 ms at 10 MB/s = 500,000 B, within one packet.
    assert!(bytes.abs_diff(500_000) <= 1500, "served {bytes} B");
    assert!(
        idle > 40_000_000,
        "the link idles while the cap waits ({idle} ns)"
    );
    wfq.set_cap(Instant::from_nanos(50_000_000), q, None)
        .unwrap();
    assert_eq!(wfq.poll_at(), None, "removing the cap releases the queue");
    assert!(wfq.dequeue(Instant::from_nanos(50_000_000)).is_some());
}
