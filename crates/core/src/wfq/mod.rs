//! Hierarchical weighted fair queueing with pluggable packet cost.
//!
//! A scheduler tree (tenant -> VM -> traffic class, any depth) whose leaves are
//! bounded FIFO queues. Each interior node shares what it is given among its
//! backlogged children in proportion to their weights (PicNIC "CPU-fair weighted
//! fair queues"; EyeQ 3.3 Fig. 5 root WRR; BESS traffic classes: one tree over one
//! resource). The resource is chosen per scheduler by [`CostKind`]: bytes,
//! packets, or measured processing nanoseconds (DESIGN.md section 3 item 1).
//!
//! # Algorithm: hierarchical start-time fair queueing (H-SFQ)
//!
//! Every node carries a start tag in its parent's virtual time; a parent serves
//! the child with the smallest tag and sets its own virtual time to that tag;
//! serving cost `c` advances the child's tag by `c / weight` (Goyal, Vin, Cheng,
//! "Start-time Fair Queuing", SIGCOMM 1996; hierarchical form in Goyal et al.,
//! OSDI 1996). Why SFQ rather than DRR or WF2Q+:
//! - **Cost known only afterwards.** SFQ orders by *start* tags, so picking a
//!   packet never needs its cost; the cost only moves the tag after service. A
//!   [`Wfq::settle`] correction simply moves the tags on the leaf's path by
//!   `(measured - estimated) / weight`, and the difference is paid in the next
//!   rounds (WF2Q+ needs finish tags, hence the cost, before picking).
//! - **Variable capacity.** SFQ's fairness bound holds whatever the server rate
//!   does, which is the PicNIC situation (capacity varies in bytes/s and pkts/s).
//! - **Bounded lag.** For two children `i`, `j` of one node backlogged over any
//!   interval, `|W_i/w_i - W_j/w_j| <= Lmax_i/w_i + Lmax_j/w_j`, where `W` is
//!   cost served and `Lmax` the largest cost of one packet. Hence a child's
//!   share of cost over any backlogged interval is off weight/sum(weights) by at
//!   most `Lmax * (1 + n * w_i / sum(w))` with `n` siblings. DRR's bound grows with
//!   the quantum, which must exceed the largest packet for O(1) service and is
//!   awkward to size when costs are nanoseconds known after the fact.
//! - **Cost per operation.** One indexed binary heap per interior node:
//!   O(depth * log fanout) per dequeue, O(1) for an enqueue onto a backlogged
//!   queue; 100,000 queues under one node is 17 heap levels. Tags are exact
//!   integers (`cost * 2^64 / weight` with the remainder carried), so u64 weights
//!   of any magnitude (for example guarantees in bit/s) share without drift.
//!
//! Caps use exact GCRA pacing per node: a node that has used its cap leaves its
//! parent's heap until its theoretical arrival time allows it again
//! ([`Wfq::poll_at`]); its share goes to its backlogged siblings meanwhile (work
//! conserving), and it returns with no accumulated credit.
//!
//! No allocation happens in [`Wfq::enqueue`], [`Wfq::dequeue`] or
//! [`Wfq::settle`]: leaf buffers are preallocated to their packet limit and heaps
//! are reserved when nodes are added.

mod exact;
mod heap;
mod tree;
mod types;

pub use types::{
    Cap, CostKind, Dequeued, Headroom, NodeId, QueueId, QueueLimits, QueueStats, RejectReason,
    Rejected, TreeId, WfqError,
};

use crate::time::{Instant, NANOS_PER_SEC};
use exact::{apply_signed, Exact, Ratio};
use heap::{Heap, ABSENT};
use std::collections::VecDeque;

const ROOT: u32 = 0;
/// Tags are in units of 2^-64 cost per unit weight.
const TAG_SCALE: u128 = 1 << 64;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Free,
    Node,
    Queue,
}

#[derive(Debug)]
struct Pacing {
    cap: Cap,
    /// Nanoseconds per cost unit.
    pace: Ratio,
    /// Burst tolerance in nanoseconds.
    tolerance: u128,
    /// GCRA theoretical arrival time in nanoseconds.
    tat: Exact,
}

impl Pacing {
    fn new(cap: Cap) -> Self {
        let pace = Ratio::new(NANOS_PER_SEC as u128, cap.per_sec);
        let mut burst = Exact::default();
        pace.add(&mut burst, cap.burst);
        Pacing {
            cap,
            pace,
            tolerance: burst.whole,
            tat: Exact::default(),
        }
    }

    /// Earliest time (ns) at which the node may be served again.
    fn eligible_at(&self) -> u128 {
        self.tat.whole.saturating_sub(self.tolerance)
    }
}

#[derive(Debug)]
struct Slot {
    kind: Kind,
    generation: u32,
    parent: u32,
    weight: u64,
    /// 2^64 / weight: tag advance per unit of cost.
    share: Ratio,
    /// Start tag of the next service, in the parent's virtual time.
    tag: Exact,
    /// This node's virtual time: the start tag of the child served last.
    vtime: u128,
    /// Boxed: caps are rare and the slot stays small for cache-friendly descents.
    pacing: Option<Box<Pacing>>,
    children: Vec<u32>,
}

impl Slot {
    fn free() -> Self {
        Slot {
            kind: Kind::Free,
            generation: 0,
            parent: ROOT,
            weight: 1,
            share: Ratio::new(TAG_SCALE, 1),
            tag: Exact::default(),
            vtime: 0,
            pacing: None,
            children: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Leaf<T> {
    items: VecDeque<(T, u32)>,
    limits: QueueLimits,
    bytes: u64,
    /// EWMA of measured cost with 16 fractional bits.
    estimate_fp: u64,
    stats: QueueStats,
}

const EST_FRAC_BITS: u32 = 16;

impl<T> Leaf<T> {
    /// The EWMA rounded to an integer cost, at least 1.
    fn estimate(&self) -> u64 {
        (self.estimate_fp.saturating_add(1 << (EST_FRAC_BITS - 1)) >> EST_FRAC_BITS).max(1)
    }
}

/// Hierarchical weighted fair scheduler over items of type `T`. See the module doc.
#[derive(Debug)]
pub struct Wfq<T> {
    cost_kind: CostKind,
    slots: Vec<Slot>,
    /// Eligible, backlogged children of each interior node, keyed by start tag.
    heaps: Vec<Heap>,
    heap_pos: Vec<u32>,
    /// Capped nodes waiting for their cap, keyed by the time they may run again.
    throttled: Heap,
    throttle_pos: Vec<u32>,
    leaves: Vec<Option<Leaf<T>>>,
    free: Vec<u32>,
    queued: usize,
}

impl<T> Wfq<T> {
    /// An empty scheduler (just the root) sharing the resource named by `cost_kind`.
    pub fn new(cost_kind: CostKind) -> Self {
        Self::with_capacity(cost_kind, 0)
    }

    /// Like [`Wfq::new`], with room for `entries` nodes and queues reserved.
    pub fn with_capacity(cost_kind: CostKind, entries: usize) -> Self {
        let entries = entries + 1;
        let mut wfq = Wfq {
            cost_kind,
            slots: Vec::with_capacity(entries),
            heaps: Vec::with_capacity(entries),
            heap_pos: Vec::with_capacity(entries),
            throttled: Heap::default(),
            throttle_pos: Vec::with_capacity(entries),
            leaves: Vec::with_capacity(entries),
            free: Vec::new(),
            queued: 0,
        };
        wfq.throttled.reserve(entries);
        let mut root = Slot::free();
        root.kind = Kind::Node;
        wfq.push_slot(root);
        wfq
    }

    /// The root node; tenants are its children.
    pub const fn root(&self) -> NodeId {
        NodeId {
            index: ROOT,
            generation: 0,
        }
    }

    /// The resource this scheduler shares.
    pub const fn cost_kind(&self) -> CostKind {
        self.cost_kind
    }

    /// Queues `item` of `len_bytes` on leaf `queue`, or hands it back if the
    /// queue is full or unknown.
    pub fn enqueue(
        &mut self,
        now: Instant,
        queue: QueueId,
        item: T,
        len_bytes: u32,
    ) -> Result<(), Rejected<T>> {
        let Ok(index) = self.queue_index(queue) else {
            return Err(Rejected {
                item,
                reason: RejectReason::UnknownQueue,
            });
        };
        let Some(leaf) = self.leaves[index as usize].as_mut() else {
            return Err(Rejected {
                item,
                reason: RejectReason::UnknownQueue,
            });
        };
        let reason = if leaf.items.len() >= leaf.limits.max_packets as usize {
            Some(RejectReason::PacketLimit)
        } else if leaf.bytes + len_bytes as u64 > leaf.limits.max_bytes {
            Some(RejectReason::ByteLimit)
        } else {
            None
        };
        if let Some(reason) = reason {
            leaf.stats.rejected_packets += 1;
            leaf.stats.rejected_bytes += len_bytes as u64;
            return Err(Rejected { item, reason });
        }
        let was_empty = leaf.items.is_empty();
        leaf.items.push_back((item, len_bytes));
        leaf.bytes += len_bytes as u64;
        leaf.stats.enqueued_packets += 1;
        leaf.stats.enqueued_bytes += len_bytes as u64;
        self.queued += 1;
        if was_empty {
            self.activate(index, now.as_nanos());
        }
        Ok(())
    }

    /// Picks the next item: the eligible path of smallest start tags from the
    /// root down. Returns `None` if nothing is queued or every backlogged queue
    /// waits for a cap (see [`Wfq::poll_at`]).
    pub fn dequeue(&mut self, now: Instant) -> Option<Dequeued<T>> {
        let now = now.as_nanos();
        self.wake(now);
        // SFQ: serve the child of smallest start tag; the node's virtual time
        // becomes that tag (Goyal et al. 1996, section 2).
        let mut x = ROOT;
        while self.slots[x as usize].kind == Kind::Node {
            let (tag, child) = self.heaps[x as usize].peek()?;
            self.slots[x as usize].vtime = tag;
            x = child;
        }
        let leaf_index = x;
        let generation = self.slots[x as usize].generation;
        let leaf = self.leaves[x as usize].as_mut()?;
        let (item, len_bytes) = leaf.items.pop_front()?;
        let cost = match self.cost_kind {
            CostKind::Bytes => (len_bytes as u64).max(1),
            CostKind::Packets => 1,
            CostKind::Measured { .. } => leaf.estimate(),
        };
        leaf.bytes -= len_bytes as u64;
        leaf.stats.dequeued_packets += 1;
        leaf.stats.dequeued_bytes += len_bytes as u64;
        leaf.stats.cost_served = leaf.stats.cost_served.saturating_add(cost);
        self.queued -= 1;
        let mut backlogged = !leaf.items.is_empty();
        // Charge the cost on the path, bottom up: tags advance by cost / weight,
        // caps by cost / rate; a node leaves its parent's heap when it has nothing
        // eligible left or has used its cap.
        while x != ROOT {
            let slot = &mut self.slots[x as usize];
            let parent = slot.parent;
            slot.share.add(&mut slot.tag, cost);
            let mut wait_until = None;
            if let Some(p) = slot.pacing.as_mut() {
                if p.tat.whole < now as u128 {
                    p.tat = Exact::from_whole(now as u128);
                }
                p.pace.add(&mut p.tat, cost);
                let at = p.eligible_at();
                if at > now as u128 {
                    wait_until = Some(at);
                }
            }
            let tag = slot.tag.whole;
            let heap = &mut self.heaps[parent as usize];
            match (backlogged, wait_until) {
                (true, None) => heap.rekey(x, tag, &mut self.heap_pos),
                (true, Some(at)) => {
                    heap.remove(x, &mut self.heap_pos);
                    self.throttled.push(at, x, &mut self.throttle_pos);
                }
                (false, _) => heap.remove(x, &mut self.heap_pos),
            }
            backlogged = !heap.is_empty();
            x = parent;
        }
        Some(Dequeued {
            item,
            queue: QueueId {
                index: leaf_index,
                generation,
            },
            len_bytes,
            cost,
        })
    }

    /// Takes the head of `queue` outside the fair share: nothing is charged to its path's
    /// tags or caps. For a reservation served before the tree (a VM's packet-rate guarantee,
    /// PicNIC's pps SLO): the reserved service comes on top of the queue's weighted share of
    /// the rest, and leaves no debt behind. `None` for an unknown or empty queue.
    pub fn dequeue_from(&mut self, queue: QueueId) -> Option<Dequeued<T>> {
        let mut x = self.queue_index(queue).ok()?;
        let cost_kind = self.cost_kind;
        let leaf = self.leaves[x as usize].as_mut()?;
        let (item, len_bytes) = leaf.items.pop_front()?;
        let cost = match cost_kind {
            CostKind::Bytes => (len_bytes as u64).max(1),
            CostKind::Packets => 1,
            CostKind::Measured { .. } => leaf.estimate(),
        };
        leaf.bytes -= len_bytes as u64;
        leaf.stats.dequeued_packets += 1;
        leaf.stats.dequeued_bytes += len_bytes as u64;
        self.queued -= 1;
        // A queue left empty leaves its parent's heap, a parent left without eligible
        // children its own parent's, as in `dequeue`.
        let mut empty = leaf.items.is_empty();
        while empty && x != ROOT {
            let parent = self.slots[x as usize].parent;
            if self.heap_pos[x as usize] != ABSENT {
                self.heaps[parent as usize].remove(x, &mut self.heap_pos);
            }
            empty = self.heaps[parent as usize].is_empty();
            x = parent;
        }
        Some(Dequeued {
            item,
            queue,
            len_bytes,
            cost,
        })
    }

    /// Reports the measured cost of an item dequeued from `queue` that was charged
    /// `estimated`. The difference is charged to the queue and its ancestors
    /// (tags and caps), so an under-estimated tenant pays in the next rounds, and
    /// with [`CostKind::Measured`] the queue's estimate moves towards `measured`.
    pub fn settle(
        &mut self,
        queue: QueueId,
        estimated: u64,
        measured: u64,
    ) -> Result<(), WfqError> {
        let mut x = self.queue_index(queue)?;
        if let (CostKind::Measured { ewma_shift, .. }, Some(leaf)) =
            (self.cost_kind, self.leaves[x as usize].as_mut())
        {
            let target = (measured.min(u64::MAX >> EST_FRAC_BITS) << EST_FRAC_BITS) as i128;
            let current = leaf.estimate_fp as i128;
            leaf.estimate_fp = (current + ((target - current) >> ewma_shift.min(32))) as u64;
        }
        let diff = measured as i128 - estimated as i128;
        if diff == 0 {
            return Ok(());
        }
        if let Some(leaf) = self.leaves[x as usize].as_mut() {
            let served = (leaf.stats.cost_served as i128 + diff).clamp(0, u64::MAX as i128);
            leaf.stats.cost_served = served as u64;
        }
        while x != ROOT {
            let slot = &mut self.slots[x as usize];
            apply_signed(&slot.share, &mut slot.tag, diff);
            let parent = slot.parent;
            if self.heap_pos[x as usize] != ABSENT {
                self.heaps[parent as usize].rekey(x, slot.tag.whole, &mut self.heap_pos);
            }
            if let Some(p) = slot.pacing.as_mut() {
                apply_signed(&p.pace, &mut p.tat, diff);
                if self.throttle_pos[x as usize] != ABSENT {
                    self.throttled
                        .rekey(x, p.eligible_at(), &mut self.throttle_pos);
                }
            }
            x = parent;
        }
        Ok(())
    }

    /// The earliest time a capped node with queued items may be served again, if
    /// any waits for its cap. Call [`Wfq::dequeue`] at that time.
    pub fn poll_at(&self) -> Option<Instant> {
        self.throttled
            .peek()
            .map(|(at, _)| Instant::from_nanos(at.min(u64::MAX as u128) as u64))
    }

    /// Items queued in all queues.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Items queued in `queue` (`None` for an unknown queue).
    pub fn queue_len(&self, queue: QueueId) -> Option<usize> {
        self.leaf(queue).map(|l| l.items.len())
    }

    /// Room left in `queue` (`None` for an unknown queue).
    pub fn headroom(&self, queue: QueueId) -> Option<Headroom> {
        self.leaf(queue).map(|l| Headroom {
            packets: l.limits.max_packets - l.items.len() as u32,
            bytes: l.limits.max_bytes.saturating_sub(l.bytes),
        })
    }

    /// Whether `queue` can take no further item (an unknown queue counts as full).
    /// A switch stops reading the VM port behind a full queue (backpressure).
    pub fn is_full(&self, queue: QueueId) -> bool {
        match self.headroom(queue) {
            Some(h) => h.packets == 0 || h.bytes == 0,
            None => true,
        }
    }

    /// Counters of `queue` (`None` for an unknown queue).
    pub fn stats(&self, queue: QueueId) -> Option<&QueueStats> {
        self.leaf(queue).map(|l| &l.stats)
    }

    /// The cost the next item of `queue` will be charged with [`CostKind::Measured`]
    /// (`None` for an unknown queue; 1 per packet or its length otherwise).
    pub fn estimate(&self, queue: QueueId) -> Option<u64> {
        self.leaf(queue).map(Leaf::estimate)
    }

    fn has_backlog(&self, index: u32) -> bool {
        match &self.leaves[index as usize] {
            Some(leaf) => !leaf.items.is_empty(),
            None => !self.heaps[index as usize].is_empty(),
        }
    }

    /// `index` just got something eligible to serve: insert it in its parent's
    /// heap (or the throttled heap if its cap says so), and the parent in turn if
    /// that made the parent backlogged.
    fn activate(&mut self, mut index: u32, now: u64) {
        while index != ROOT
            && self.heap_pos[index as usize] == ABSENT
            && self.throttle_pos[index as usize] == ABSENT
        {
            let slot = &mut self.slots[index as usize];
            if let Some(p) = &slot.pacing {
                let at = p.eligible_at();
                if at > now as u128 {
                    self.throttled.push(at, index, &mut self.throttle_pos);
                    return;
                }
            }
            let parent = slot.parent;
            // SFQ: a newly backlogged flow starts at max(its last finish tag, the
            // parent's virtual time), so idling earns no credit.
            let vtime = self.slots[parent as usize].vtime;
            let slot = &mut self.slots[index as usize];
            if slot.tag.whole < vtime {
                slot.tag = Exact::from_whole(vtime);
            }
            let heap = &mut self.heaps[parent as usize];
            let parent_was_idle = heap.is_empty();
            heap.push(slot.tag.whole, index, &mut self.heap_pos);
            if !parent_was_idle {
                return;
            }
            index = parent;
        }
    }

    /// Takes `index` out of its parent's heap (and of the throttled heap), and
    /// ancestors whose heaps became empty out of theirs.
    fn detach(&mut self, mut index: u32) {
        if self.throttle_pos[index as usize] != ABSENT {
            self.throttled.remove(index, &mut self.throttle_pos);
        }
        while index != ROOT && self.heap_pos[index as usize] != ABSENT {
            let parent = self.slots[index as usize].parent;
            self.heaps[parent as usize].remove(index, &mut self.heap_pos);
            if !self.heaps[parent as usize].is_empty() {
                return;
            }
            index = parent;
        }
    }

    /// Releases capped nodes whose time has come.
    fn wake(&mut self, now: u64) {
        while let Some((at, index)) = self.throttled.peek() {
            if at > now as u128 {
                break;
            }
            self.throttled.remove(index, &mut self.throttle_pos);
            if self.has_backlog(index) {
                self.activate(index, now);
            }
        }
    }
}
