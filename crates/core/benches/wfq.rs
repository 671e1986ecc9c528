//! ns per enqueue + dequeue pair of the hierarchical WFQ with 10, 1,000 and
//! 100,000 backlogged queues: flat under the root, and as a tenant -> VM ->
//! class tree (10 classes per VM, 10 VMs per tenant). The Measured variant
//! also settles each packet. Run: `cargo bench -p picnic-core --bench wfq`.

use divan::Bencher;
use picnic_core::wfq::{CostKind, QueueLimits, Wfq};
use picnic_core::Instant;

fn main() {
    divan::main();
}

const QUEUES: &[usize] = &[10, 1_000, 100_000];
const LIMITS: QueueLimits = QueueLimits {
    max_packets: 4,
    max_bytes: 1 << 16,
};

/// A scheduler with `queues` leaves, each holding two packets of varied size.
fn backlogged(kind: CostKind, queues: usize, tree: bool) -> Wfq<u32> {
    let mut wfq = Wfq::with_capacity(kind, queues + queues / 10 + queues / 100 + 1);
    let root = wfq.root();
    let mut parent = root;
    let mut vm = root;
    for i in 0..queues {
        let weight = 1 + (i as u64 * 7919) % 64;
        if tree && i % 100 == 0 {
            parent = wfq.add_node(root, weight, None).unwrap();
        }
        if tree && i % 10 == 0 {
            vm = wfq.add_node(parent, weight, None).unwrap();
        }
        let q = wfq
            .add_queue(if tree { vm } else { root }, weight, LIMITS)
            .unwrap();
        for k in 0..2 {
            wfq.enqueue(Instant::ZERO, q, 0, 64 + ((i * 31 + k * 17) % 1437) as u32)
                .unwrap();
        }
    }
    wfq
}

fn pair(bencher: Bencher, kind: CostKind, queues: usize, tree: bool) {
    let mut wfq = backlogged(kind, queues, tree);
    let measured = matches!(kind, CostKind::Measured { .. });
    let mut now = 0u64;
    bencher.bench_local(|| {
        now += 100;
        let d = wfq.dequeue(Instant::from_nanos(now)).unwrap();
        if measured {
            wfq.settle(d.queue, d.cost, 200 + d.len_bytes as u64 / 4)
                .unwrap();
        }
        let _ = wfq.enqueue(Instant::from_nanos(now), d.queue, d.item, d.len_bytes);
    });
}

#[divan::bench(args = QUEUES)]
fn flat_bytes(bencher: Bencher, queues: usize) {
    pair(bencher, CostKind::Bytes, queues, false);
}

#[divan::bench(args = QUEUES)]
fn tree_bytes(bencher: Bencher, queues: usize) {
    pair(bencher, CostKind::Bytes, queues, true);
}

#[divan::bench(args = QUEUES)]
fn tree_measured_with_settle(bencher: Bencher, queues: usize) {
    pair(
        bencher,
        CostKind::Measured {
            initial_estimate: 300,
            ewma_shift: 3,
        },
        queues,
        true,
    );
}
