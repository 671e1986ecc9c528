//! Fair shares: bounded lag for every cost kind and tree shape, hierarchy, measured cost
//! with settlement.

use crate::harness::*;
use picnic_core::wfq::{CostKind, Wfq};
use picnic_core::Instant;
use proptest::prelude::*;

#[test]
fn backlogged_tenants_1_2_4_share_every_cost_kind_within_the_lag_bound() {
    for kind in kinds() {
        let traffic = Traffic {
            sizes: (64, 1500),
            ns_base: 200,
            ns_per_kb: 400,
            ns_jitter: 300,
        };
        let tenants = [1, 2, 4]
            .iter()
            .map(|&w| node(w, vec![queue(1, traffic.clone())]))
            .collect();
        let mut h = Harness::new(kind, tenants, 7);
        h.run(20_000, true, 1);
        h.assert_fair(0);
        let root = &h.groups[0];
        for (i, w) in [1u128, 2, 4].iter().enumerate() {
            let share = root.served[i] as f64 / root.total as f64;
            assert!(
                (share - *w as f64 / 7.0).abs() < 0.01,
                "{kind:?}: tenant {i} share {share}"
            );
        }
    }
}

fn traffic_strategy() -> impl Strategy<Value = Traffic> {
    (64u32..1500, 0u32..1500, 10u64..2000, 0u64..2000, 0u64..500).prop_map(
        |(lo, extra, ns_base, ns_per_kb, ns_jitter)| Traffic {
            sizes: (lo, (lo + extra).min(9000)),
            ns_base,
            ns_per_kb,
            ns_jitter,
        },
    )
}

/// Trees of 1-3 levels below the root, fan-out 1-4, weights 1-64 times a common
/// scale up to 10^9 (weights as guarantees in bit/s).
fn shape_strategy() -> impl Strategy<Value = Vec<Shape>> {
    let leaf = (1u64..=64, traffic_strategy()).prop_map(|(w, t)| queue(w, t));
    let tree = leaf.prop_recursive(2, 24, 4, |inner| {
        (1u64..=64, prop::collection::vec(inner, 1..=4)).prop_map(|(w, children)| node(w, children))
    });
    (prop::collection::vec(tree, 2..=4), 0u32..=9).prop_map(|(tenants, exp)| {
        fn scale(s: Shape, f: u64) -> Shape {
            match s {
                Shape::Queue { weight, traffic } => Shape::Queue {
                    weight: weight * f,
                    traffic,
                },
                Shape::Node {
                    weight,
                    cap,
                    children,
                } => Shape::Node {
                    weight: weight * f,
                    cap,
                    children: children.into_iter().map(|c| scale(c, f)).collect(),
                },
            }
        }
        tenants
            .into_iter()
            .map(|t| scale(t, 10u64.pow(exp)))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every interior node shares cost among its backlogged children within the
    /// SFQ lag bound, whatever the weights, sizes, costs and tree shape.
    #[test]
    fn every_node_shares_within_the_lag_bound(shape in shape_strategy(), kind in 0usize..3, seed in any::<u64>()) {
        let mut h = Harness::new(kinds()[kind], shape, seed);
        h.run(3_000, true, 1);
        h.assert_fair(0);
    }

    /// Same operations, same decisions.
    #[test]
    fn scheduling_is_deterministic(shape in shape_strategy(), seed in any::<u64>()) {
        let mut a = Harness::new(measured(100), shape.clone(), seed);
        let mut b = Harness::new(measured(100), shape, seed);
        for _ in 0..500 {
            let (x, y) = (a.wfq.dequeue(a.now).unwrap(), b.wfq.dequeue(b.now).unwrap());
            prop_assert_eq!(x.queue.index(), y.queue.index());
            prop_assert_eq!(x.cost, y.cost);
            a.wfq.settle(x.queue, x.cost, x.item).unwrap();
            b.wfq.settle(y.queue, y.cost, y.item).unwrap();
            a.refill(x.queue);
            b.refill(y.queue);
        }
    }
}

#[test]
fn tenants_split_evenly_whatever_their_vm_count_and_vms_split_by_weight() {
    let t = Traffic {
        sizes: (64, 1500),
        ns_base: 100,
        ns_per_kb: 0,
        ns_jitter: 0,
    };
    let one_vm = node(1, vec![node(5, vec![queue(1, t.clone())])]);
    let ten_vms = node(
        1,
        (1..=10)
            .map(|w| node(w, vec![queue(1, t.clone()), queue(3, t.clone())]))
            .collect(),
    );
    let mut h = Harness::new(CostKind::Bytes, vec![one_vm, ten_vms], 3);
    h.run(50_000, true, 1);
    h.assert_fair(0);
    let root = &h.groups[0];
    let share = root.served[0] as f64 / root.total as f64;
    assert!(
        (share - 0.5).abs() < 0.005,
        "tenant with one VM got {share}"
    );
    // Group 2 holds tenant B's ten VMs, weights 1..=10.
    let vms = &h.groups.iter().find(|g| g.weights.len() == 10).unwrap();
    for (i, &served) in vms.served.iter().enumerate() {
        let share = served as f64 / vms.total as f64;
        assert!(
            (share - (i + 1) as f64 / 55.0).abs() < 0.005,
            "VM {i} share {share}"
        );
    }
}

/// PicNIC's CPU-fair WFQ: tenant A sends 64 B packets costing 5x the processing
/// time of tenant B's 1500 B packets. Bytes-fair scheduling hands A ~117x B's
/// CPU time; with measured cost A gets its weight of nanoseconds, no more.
#[test]
fn measured_cost_shares_processing_time_where_bytes_would_not() {
    let tenants = || {
        vec![
            node(1, vec![queue(1, Traffic::fixed(64, 1000))]),
            node(1, vec![queue(1, Traffic::fixed(1500, 200))]),
        ]
    };
    let ns_served = |kind| {
        let mut h = Harness::new(kind, tenants(), 1);
        h.run(20_000, true, 1);
        let a = h.wfq.stats(h.queues[0]).unwrap();
        let b = h.wfq.stats(h.queues[1]).unwrap();
        (a.dequeued_packets * 1000, b.dequeued_packets * 200, h)
    };
    let (a_ns, b_ns, h) = ns_served(measured(50));
    // Lag bound at the root: L * (1 + n * 1/2) = 2 * 1000 ns.
    assert!(
        a_ns.abs_diff(b_ns) <= 2 * 1000,
        "measured: A {a_ns} ns vs B {b_ns} ns"
    );
    h.assert_fair(0);
    let (a_ns, b_ns, _) = ns_served(CostKind::Bytes);
    assert!(
        a_ns > 100 * b_ns,
        "bytes-fair: A {a_ns} ns should dwarf B {b_ns} ns"
    );
}

/// With an estimator that never learns (shift 32) every estimate of A is 10x too
/// low; settling charges the difference so A still gets only its weight of CPU,
/// with immediate or batched (32 packets) settlement. Without settle, A takes
/// ~10x B's time.
#[test]
fn settle_makes_an_underestimated_tenant_pay_back() {
    let stuck = CostKind::Measured {
        initial_estimate: 100,
        ewma_shift: 32,
    };
    let tenants = || {
        vec![
            node(
                1,
                vec![queue(
                    1,
                    Traffic {
                        sizes: (64, 64),
                        ns_base: 800,
                        ns_per_kb: 0,
                        ns_jitter: 400,
                    },
                )],
            ),
            node(1, vec![queue(1, Traffic::fixed(1500, 100))]),
        ]
    };
    for batch in [1, 32] {
        let mut h = Harness::new(stuck, tenants(), 9);
        h.run(20_000, true, batch);
        assert_eq!(
            h.wfq.estimate(h.queues[0]),
            Some(100),
            "the estimate never learns"
        );
        h.assert_fair(if batch == 1 { 0 } else { batch as u64 });
        let root = &h.groups[0];
        let share = root.served[0] as f64 / root.total as f64;
        assert!(
            (share - 0.5).abs() < 0.01,
            "batch {batch}: A got {share} of the CPU"
        );
    }
    let mut h = Harness::new(stuck, tenants(), 9);
    h.run(20_000, false, 1);
    let root = &h.groups[0];
    assert!(
        root.served[0] > 8 * root.served[1],
        "without settle A takes {:?}",
        root.served
    );
}

#[test]
fn the_ewma_learns_the_measured_cost() {
    let mut wfq = Wfq::new(CostKind::Measured {
        initial_estimate: 100,
        ewma_shift: 2,
    });
    let q = wfq.add_queue(wfq.root(), 1, ROOMY).unwrap();
    for _ in 0..100 {
        wfq.enqueue(Instant::ZERO, q, (), 64).unwrap();
        let d = wfq.dequeue(Instant::ZERO).unwrap();
        wfq.settle(q, d.cost, 900).unwrap();
    }
    assert_eq!(wfq.estimate(q), Some(900));
    assert_eq!(wfq.stats(q).unwrap().cost_served, 100 * 900);
}
