//! Bounded buffers, live changes, bad input, serving one queue out of turn.

use crate::harness::*;
use picnic_core::wfq::{Cap, CostKind, QueueId, QueueLimits, RejectReason, TreeId, Wfq, WfqError};
use picnic_core::Instant;
use std::collections::HashMap;

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
