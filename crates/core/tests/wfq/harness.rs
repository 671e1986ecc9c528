//! A scheduler tree kept backlogged on a virtual clock, and a lag checker per interior node.

use picnic_core::wfq::{Cap, CostKind, NodeId, QueueId, QueueLimits, Wfq};
use picnic_core::Instant;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

pub(crate) const ROOMY: QueueLimits = QueueLimits {
    max_packets: 64,
    max_bytes: 1 << 20,
};

/// Traffic of one leaf queue: packet sizes drawn uniformly from `sizes`, and a
/// processing cost in ns of `ns_base + ns_per_kb * len / 1024` (+ up to
/// `ns_jitter`).
#[derive(Clone, Debug)]
pub(crate) struct Traffic {
    pub(crate) sizes: (u32, u32),
    pub(crate) ns_base: u64,
    pub(crate) ns_per_kb: u64,
    pub(crate) ns_jitter: u64,
}

impl Traffic {
    pub(crate) fn fixed(len: u32, ns: u64) -> Self {
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
pub(crate) enum Shape {
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
pub(crate) struct Group {
    pub(crate) weights: Vec<u64>,
    pub(crate) served: Vec<u128>,
    pub(crate) total: u128,
    pub(crate) lag_min: Vec<i128>,
    pub(crate) lag_max: Vec<i128>,
    pub(crate) max_cost: u64,
}

impl Group {
    pub(crate) fn new(weights: Vec<u64>) -> Self {
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

    pub(crate) fn record(&mut self, child: usize, cost: u64) {
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
    pub(crate) fn assert_bounded(&self, what: &str, slack_packets: u64) {
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
pub(crate) struct Harness {
    pub(crate) wfq: Wfq<u64>,
    pub(crate) rng: SmallRng,
    pub(crate) leaves: HashMap<QueueId, (Traffic, Vec<(usize, usize)>)>,
    pub(crate) queues: Vec<QueueId>,
    pub(crate) nodes: Vec<NodeId>,
    pub(crate) groups: Vec<Group>,
    pub(crate) now: Instant,
}

impl Harness {
    pub(crate) fn new(kind: CostKind, root_children: Vec<Shape>, seed: u64) -> Self {
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

    pub(crate) fn build(&mut self, parent: NodeId, children: &[Shape], path: Vec<(usize, usize)>) {
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

    pub(crate) fn refill(&mut self, q: QueueId) {
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

    pub(crate) fn true_cost(&self, len: u32, ns: u64) -> u64 {
        match self.wfq.cost_kind() {
            CostKind::Bytes => len as u64,
            CostKind::Packets => 1,
            CostKind::Measured { .. } => ns,
        }
    }

    /// Dequeues `steps` packets, settling each at once (or every `batch` packets,
    /// or never if `settle` is false), records true costs per group.
    pub(crate) fn run(&mut self, steps: usize, settle: bool, batch: usize) {
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

    pub(crate) fn assert_fair(&self, slack_packets: u64) {
        for (g, group) in self.groups.iter().enumerate() {
            group.assert_bounded(&format!("group {g}"), slack_packets);
        }
    }
}

pub(crate) fn queue(weight: u64, traffic: Traffic) -> Shape {
    Shape::Queue { weight, traffic }
}

pub(crate) fn node(weight: u64, children: Vec<Shape>) -> Shape {
    Shape::Node {
        weight,
        cap: None,
        children,
    }
}

pub(crate) fn measured(initial_estimate: u64) -> CostKind {
    CostKind::Measured {
        initial_estimate,
        ewma_shift: 3,
    }
}

pub(crate) fn kinds() -> [CostKind; 3] {
    [CostKind::Bytes, CostKind::Packets, measured(300)]
}
