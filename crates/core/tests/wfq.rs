//! Behaviour of the hierarchical weighted fair scheduler (`picnic_core::wfq`):
//! bounded-lag fairness for every cost kind and tree shape, hierarchy, CPU
//! fairness with measured cost and settlement, caps, bounded buffers, live
//! changes. Everything runs on a virtual clock.

use picnic_core::wfq::{
    Cap, CostKind, NodeId, QueueId, QueueLimits, RejectReason, TreeId, Wfq, WfqError,
};
use picnic_core::Instant;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

const ROOMY: QueueLimits = QueueLimits {
    max_packets: 64,
    max_bytes: 1 << 20,
};

/// Traffic of one leaf queue: packet sizes drawn uniformly from `sizes`, and a
/// processing cost in ns of `ns_base + ns_per_kb * len / 1024` (+ up to
/// `ns_jitter`).
#[derive(Clone, Debug)]
struct Traffic {
    sizes: (u32, u32),
    ns_base: u64,
    ns_per_kb: u64,
    ns_jitter: u64,
}

impl Traffic {
    fn fixed(len: u32, ns: u64) -> Self {
        Traffic {
            sizes: (len, len),
            ns_base: ns,
            ns_per_kb: 0,
            ns_jitter: 0,
        }
    }
}

/// A scheduler tree to build: interior nodes and leaf queues with weights.
#[derive(Clone, Debug)]
enum Shape {
    Node {
        weight: u64,
        cap: Option<Cap>,
        children: Vec<Shape>,
    },
    Queue {
        weight: u64,
        traffic: Traffic,
    },
}

/// One interior node's children as seen by the lag checker.
#[derive(Debug)]
struct Group {
    weights: Vec<u64>,
    served: Vec<u128>,
    total: u128,
    lag_min: Vec<i128>,
    lag_max: Vec<i128>,
    max_cost: u64,
}

impl Group {
    fn new(weights: Vec<u64>) -> Self {
        let n = weights.len();
        Group {
            weights,
            served: vec![0; n],
            total: 0,
            lag_min: vec![0; n],
            lag_max: vec![0; n],
            max_cost: 0,
        }
    }

    fn record(&mut self, child: usize, cost: u64) {
        self.served[child] += cost as u128;
        self.total += cost as u128;
        self.max_cost = self.max_cost.max(cost);
        let sum_w: u128 = self.weights.iter().map(|&w| w as u128).sum();
        for i in 0..self.weights.len() {
            // lag_i * sum(w) = sum(w) * W_i - w_i * W, exact.
            let lag =
                (sum_w * self.served[i]) as i128 - (self.weights[i] as u128 * self.total) as i128;
            self.lag_min[i] = self.lag_min[i].min(lag);
            self.lag_max[i] = self.lag_max[i].max(lag);
        }
    }

    /// Over any interval where all children are backlogged, child i's cost is
    /// within `L * (1 + n * w_i / sum(w))` of its weighted share (SFQ bound,
    /// L = largest packet cost). The largest interval deviation is the spread of
    /// the cumulative lag, so that is what is checked (`slack_packets` widens L
    /// for delayed settlement).
    fn assert_bounded(&self, what: &str, slack_packets: u64) {
        let sum_w: u128 = self.weights.iter().map(|&w| w as u128).sum();
        let n = self.weights.len() as u128;
        let l = (self.max_cost * (1 + slack_packets)) as u128;
        for i in 0..self.weights.len() {
            let spread = (self.lag_max[i] - self.lag_min[i]) as u128;
            let bound = l * (sum_w + n * self.weights[i] as u128);
            assert!(
                spread <= bound,
                "{what}: child {i} of weights {:?} deviates {} cost from its share over some interval, bound {} (served {:?})",
                self.weights,
                spread as f64 / sum_w as f64,
                bound as f64 / sum_w as f64,
                self.served
            );
        }
    }
}

/// Drives a scheduler whose queues are all kept backlogged: after each dequeue
/// the same queue gets a new packet. Items carry their measured cost in ns.
struct Harness {
    wfq: Wfq<u64>,
    rng: SmallRng,
    leaves: HashMap<QueueId, (Traffic, Vec<(usize, usize)>)>,
    queues: Vec<QueueId>,
    nodes: Vec<NodeId>,
    groups: Vec<Group>,
    now: Instant,
}

impl Harness {
    fn new(kind: CostKind, root_children: Vec<Shape>, seed: u64) -> Self {
        let wfq = Wfq::new(kind);
        let mut h = Harness {
            wfq,
            rng: SmallRng::seed_from_u64(seed),
            leaves: HashMap::new(),
            queues: Vec::new(),
            nodes: Vec::new(),
            groups: Vec::new(),
            now: Instant::ZERO,
        };
        let root = h.wfq.root();
        h.build(root, &root_children, Vec::new());
        for q in h.queues.clone() {
            for _ in 0..4 {
                h.refill(q);
            }
        }
        h
    }

    fn build(&mut self, parent: NodeId, children: &[Shape], path: Vec<(usize, usize)>) {
        let group = self.groups.len();
        let weights = children
            .iter()
            .map(|c| match c {
                Shape::Node { weight, .. } | Shape::Queue { weight, .. } => *weight,
            })
            .collect();
        self.groups.push(Group::new(weights));
        for (pos, child) in children.iter().enumerate() {
            let mut path = path.clone();
            path.push((group, pos));
            match child {
                Shape::Node {
                    weight,
                    cap,
                    children,
                } => {
                    let node = self.wfq.add_node(parent, *weight, *cap).unwrap();
                    self.nodes.push(node);
                    self.build(node, children, path);
                }
                Shape::Queue { weight, traffic } => {
                    let q = self.wfq.add_queue(parent, *weight, ROOMY).unwrap();
                    self.queues.push(q);
                    self.leaves.insert(q, (traffic.clone(), path));
                }
            }
        }
    }

    fn refill(&mut self, q: QueueId) {
        let t = &self.leaves[&q].0;
        let len = self.rng.gen_range(t.sizes.0..=t.sizes.1);
        let jitter = if t.ns_jitter > 0 {
            self.rng.gen_range(0..=t.ns_jitter)
        } else {
            0
        };
        let ns = t.ns_base + t.ns_per_kb * len as u64 / 1024 + jitter;
        self.wfq.enqueue(self.now, q, ns, len).unwrap();
    }

    fn true_cost(&self, len: u32, ns: u64) -> u64 {
        match self.wfq.cost_kind() {
            CostKind::Bytes => len as u64,
            CostKind::Packets => 1,
            CostKind::Measured { .. } => ns,
        }
    }

    /// Dequeues `steps` packets, settling each at once (or every `batch` packets,
    /// or never if `settle` is false), records true costs per group.
    fn run(&mut self, steps: usize, settle: bool, batch: usize) {
        let mut pending = Vec::with_capacity(batch);
        for _ in 0..steps {
            let d = self
                .wfq
                .dequeue(self.now)
                .expect("all queues are backlogged");
            let cost = self.true_cost(d.len_bytes, d.item);
            for &(g, pos) in &self.leaves[&d.queue].1 {
                self.groups[g].record(pos, cost);
            }
            if settle && matches!(self.wfq.cost_kind(), CostKind::Measured { .. }) {
                pending.push((d.queue, d.cost, d.item));
                if pending.len() >= batch {
                    for (q, est, measured) in pending.drain(..) {
                        self.wfq.settle(q, est, measured).unwrap();
                    }
                }
            }
            self.refill(d.queue);
        }
    }

    fn assert_fair(&self, slack_packets: u64) {
        for (g, group) in self.groups.iter().enumerate() {
            group.assert_bounded(&format!("group {g}"), slack_packets);
        }
    }
}

fn queue(weight: u64, traffic: Traffic) -> Shape {
    Shape::Queue { weight, traffic }
}

fn node(weight: u64, children: Vec<Shape>) -> Shape {
    Shape::Node {
        weight,
        cap: None,
        children,
    }
}

fn measured(initial_estimate: u64) -> CostKind {
    CostKind::Measured {
        initial_estimate,
        ewma_shift: 3,
    }
}

fn kinds() -> [CostKind; 3] {
    [CostKind::Bytes, CostKind::Packets, measured(300)]
}

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

#[test]
fn a_full_queue_rejects_and_returns_the_item_without_touching_others() {
    let mut wfq = Wfq::new(CostKind::Bytes);
    let small = wfq
        .add_queue(
            wfq.root(),
            1,
            QueueLimits {
                max_packets: 3,
                max_bytes: 2000,
            },
        )
        .unwrap();
    let other = wfq.add_queue(wfq.root(), 1, ROOMY).unwrap();
    let now = Instant::ZERO;
    wfq.enqueue(now, small, "a", 1000).unwrap();
    assert_eq!(
        wfq.headroom(small).map(|h| (h.packets, h.bytes)),
        Some((2, 1000))
    );
    let r = wfq.enqueue(now, small, "too big", 1001).unwrap_err();
    assert_eq!((r.item, r.reason), ("too big", RejectReason::ByteLimit));
    wfq.enqueue(now, small, "b", 500).unwrap();
    wfq.enqueue(now, small, "c", 500).unwrap();
    assert!(wfq.is_full(small));
    let r = wfq.enqueue(now, small, "d", 1).unwrap_err();
    assert_eq!((r.item, r.reason), ("d", RejectReason::PacketLimit));
    for i in 0..64 {
        wfq.enqueue(now, other, "x", i).unwrap();
    }
    assert!(wfq.is_full(other) && wfq.len() == 67);
    let stats = wfq.stats(small).unwrap();
    assert_eq!(
        (
            stats.enqueued_packets,
            stats.rejected_packets,
            stats.rejected_bytes
        ),
        (3, 2, 1002)
    );
    let mut from_small = Vec::new();
    while let Some(d) = wfq.dequeue(now) {
        if d.queue == small {
            from_small.push(d.item);
        }
    }
    assert_eq!(from_small, ["a", "b", "c"], "FIFO within a queue");
    assert!(!wfq.is_full(small) && wfq.is_empty());
}

#[test]
fn live_changes_remove_reweight_and_reject_stale_ids() {
    let mut wfq: Wfq<u32> = Wfq::new(CostKind::Packets);
    let root = wfq.root();
    let t1 = wfq.add_node(root, 1, None).unwrap();
    let t2 = wfq.add_node(root, 1, None).unwrap();
    let q1 = wfq.add_queue(t1, 1, ROOMY).unwrap();
    let q2 = wfq.add_queue(t2, 1, ROOMY).unwrap();
    let q3 = wfq.add_queue(t2, 1, ROOMY).unwrap();
    let now = Instant::ZERO;
    for i in 0..30 {
        for q in [q1, q2, q3] {
            wfq.enqueue(now, q, i, 100).unwrap();
        }
    }
    let count = |wfq: &mut Wfq<u32>, n: usize| {
        let mut per = HashMap::new();
        for _ in 0..n {
            *per.entry(wfq.dequeue(now).unwrap().queue).or_insert(0) += 1;
        }
        per
    };
    let per = count(&mut wfq, 20);
    assert_eq!((per[&q1], per[&q2] + per[&q3]), (10, 10));
    wfq.set_weight(t1, 3).unwrap();
    let per = count(&mut wfq, 20);
    assert_eq!((per[&q1], per[&q2] + per[&q3]), (15, 5));
    let items = wfq.remove_node(t2).unwrap();
    assert_eq!(
        items.len(),
        60 - 5 - 10,
        "a removed tenant returns its queued items"
    );
    assert_eq!(wfq.len(), 30 - 25);
    assert_eq!(wfq.remove_queue(q2), Err(WfqError::UnknownQueue));
    assert_eq!(wfq.stats(q3), None);
    let r = wfq.enqueue(now, q3, 7, 10).unwrap_err();
    assert_eq!((r.item, r.reason), (7, RejectReason::UnknownQueue));
    assert_eq!(wfq.add_queue(t2, 1, ROOMY), Err(WfqError::UnknownNode));
    let reused = wfq.add_queue(t1, 1, ROOMY).unwrap();
    assert_ne!(reused, q3, "a reused slot gets a new generation");
    assert_eq!(count(&mut wfq, 5)[&q1], 5);
    assert!(wfq.dequeue(now).is_none());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let mut wfq: Wfq<()> = Wfq::new(CostKind::Bytes);
    let root = wfq.root();
    assert_eq!(wfq.add_node(root, 0, None), Err(WfqError::ZeroWeight));
    assert_eq!(
        wfq.add_node(root, 1, Some(Cap::per_sec(0))),
        Err(WfqError::ZeroCap)
    );
    assert_eq!(
        wfq.add_queue(
            root,
            1,
            QueueLimits {
                max_packets: 0,
                max_bytes: 1
            }
        ),
        Err(WfqError::ZeroPacketLimit)
    );
    assert_eq!(wfq.remove_node(root), Err(WfqError::Root));
    assert_eq!(wfq.set_weight(root, 2), Err(WfqError::Root));
    assert_eq!(
        wfq.set_cap(Instant::ZERO, TreeId::Node(root), Some(Cap::per_sec(1))),
        Err(WfqError::Root)
    );
    let q = wfq.add_queue(root, 1, ROOMY).unwrap();
    assert_eq!(wfq.set_weight(q, 0), Err(WfqError::ZeroWeight));
    wfq.remove_queue(q).unwrap();
    assert_eq!(wfq.settle(q, 1, 2), Err(WfqError::UnknownQueue));
    assert!(wfq.is_full(q));
}

/// A reservation served with `dequeue_from` comes on top of the queue's share: it leaves no
/// debt, so the tree then shares by weight as if it had not happened, and a queue it empties
/// leaves the tree (and rejoins on its next item).
#[test]
fn dequeue_from_serves_a_queue_outside_its_share_and_keeps_the_tree_consistent() {
    let mut wfq: Wfq<u32> = Wfq::new(CostKind::Packets);
    let root = wfq.root();
    let (ta, tb) = (
        wfq.add_node(root, 1, None).unwrap(),
        wfq.add_node(root, 1, None).unwrap(),
    );
    let (a, b) = (
        wfq.add_queue(ta, 1, ROOMY).unwrap(),
        wfq.add_queue(tb, 1, ROOMY).unwrap(),
    );
    let now = Instant::ZERO;
    for i in 0..40 {
        wfq.enqueue(now, a, i, 64).unwrap();
        wfq.enqueue(now, b, 100 + i, 64).unwrap();
    }
    // Ten of a's items outside the tree, in its FIFO order.
    for i in 0..10 {
        let d = wfq.dequeue_from(a).unwrap();
        assert_eq!((d.item, d.queue), (i, a));
    }
    // The tree still alternates a and b: no debt for a.
    let mut served = [0, 0];
    for _ in 0..20 {
        let d = wfq.dequeue(now).unwrap();
        served[usize::from(d.queue == b)] += 1;
    }
    assert_eq!(served, [10, 10]);
    // Emptying a with dequeue_from takes it out of the tree: b alone is served...
    while wfq.dequeue_from(a).is_some() {}
    assert_eq!(wfq.queue_len(a), Some(0));
    assert!(wfq.dequeue_from(a).is_none());
    let d = wfq.dequeue(now).unwrap();
    assert_eq!(d.queue, b);
    // ...until a has an item again.
    wfq.enqueue(now, a, 999, 64).unwrap();
    let both: Vec<QueueId> = (0..2).map(|_| wfq.dequeue(now).unwrap().queue).collect();
    assert!(both.contains(&a) && both.contains(&b), "{both:?}");
    assert_eq!(wfq.len(), 28, "b's 40 less the 12 served");
    // A whole tenant emptied leaves the root's heap too.
    while wfq.dequeue_from(b).is_some() {}
    assert_eq!(wfq.len(), 0);
    assert!(wfq.dequeue(now).is_none());
}

/// `retain` takes chosen items out of one queue without disturbing the others' order or
/// the schedule; a queue emptied by it leaves the schedule. `set_limits` bounds only what
/// comes next.
#[test]
fn retain_and_set_limits_change_one_queue_in_place() {
    let t = Instant::ZERO;
    let mut wfq: Wfq<u32> = Wfq::new(CostKind::Packets);
    let a = wfq.add_queue(wfq.root(), 1, ROOMY).unwrap();
    let b = wfq.add_queue(wfq.root(), 1, ROOMY).unwrap();
    for i in 0..6 {
        wfq.enqueue(t, a, i, 100).unwrap();
        wfq.enqueue(t, b, 100 + i, 100).unwrap();
    }
    // Odd items out of a: returned in FIFO order, a keeps 0, 2, 4.
    assert_eq!(wfq.retain(a, |i| i % 2 == 0).unwrap(), vec![1, 3, 5]);
    assert_eq!((wfq.queue_len(a), wfq.len()), (Some(3), 9));
    let order: Vec<u32> = std::iter::from_fn(|| wfq.dequeue(t).map(|d| d.item)).collect();
    assert_eq!(order, vec![0, 100, 2, 101, 4, 102, 103, 104, 105]);
    // A queue emptied by retain is no longer scheduled.
    wfq.enqueue(t, a, 7, 100).unwrap();
    wfq.enqueue(t, b, 8, 100).unwrap();
    assert_eq!(wfq.retain(a, |_| false).unwrap(), vec![7]);
    assert_eq!(wfq.dequeue(t).map(|d| d.item), Some(8));
    assert!(wfq.dequeue(t).is_none() && wfq.is_empty());
    // Limits: two packets from now on; what is queued stays.
    for i in 0..4 {
        wfq.enqueue(t, a, i, 100).unwrap();
    }
    let two = QueueLimits {
        max_packets: 2,
        max_bytes: 1 << 20,
    };
    wfq.set_limits(a, two).unwrap();
    assert_eq!(wfq.queue_len(a), Some(4));
    assert!(wfq.enqueue(t, a, 9, 100).is_err());
    assert_eq!(
        wfq.set_limits(
            a,
            QueueLimits {
                max_packets: 0,
                ..two
            }
        ),
        Err(WfqError::ZeroPacketLimit)
    );
    wfq.remove_queue(b).unwrap();
    assert_eq!(wfq.retain(b, |_| true), Err(WfqError::UnknownQueue));
    assert_eq!(wfq.set_limits(b, two), Err(WfqError::UnknownQueue));
}
