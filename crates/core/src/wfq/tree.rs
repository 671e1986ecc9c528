//! Building and editing the tree: nodes and queues added and removed, weights, caps and
//! queue limits changed. Off the per-packet path; may allocate.

use super::exact::Exact;
use super::heap::ABSENT;
use super::*;

impl<T> Wfq<T> {
    /// Adds an interior node under `parent` with a `weight` (at least 1) and an
    /// optional cap.
    pub fn add_node(
        &mut self,
        parent: NodeId,
        weight: u64,
        cap: Option<Cap>,
    ) -> Result<NodeId, WfqError> {
        let (index, generation) = self.add_entry(parent, weight, cap, Kind::Node, None)?;
        Ok(NodeId { index, generation })
    }

    /// Adds a leaf queue under `parent` with a `weight` (at least 1) and buffer
    /// `limits`; its packet buffer is allocated now.
    pub fn add_queue(
        &mut self,
        parent: NodeId,
        weight: u64,
        limits: QueueLimits,
    ) -> Result<QueueId, WfqError> {
        if limits.max_packets == 0 {
            return Err(WfqError::ZeroPacketLimit);
        }
        let initial = match self.cost_kind {
            CostKind::Measured {
                initial_estimate, ..
            } => initial_estimate,
            _ => 1,
        };
        let leaf = Leaf {
            items: VecDeque::with_capacity(limits.max_packets as usize),
            limits,
            bytes: 0,
            estimate_fp: initial.min(u64::MAX >> EST_FRAC_BITS) << EST_FRAC_BITS,
            stats: QueueStats::default(),
        };
        let (index, generation) = self.add_entry(parent, weight, None, Kind::Queue, Some(leaf))?;
        Ok(QueueId { index, generation })
    }

    fn add_entry(
        &mut self,
        parent: NodeId,
        weight: u64,
        cap: Option<Cap>,
        kind: Kind,
        leaf: Option<Leaf<T>>,
    ) -> Result<(u32, u32), WfqError> {
        let parent = self.node_index(parent)?;
        if weight == 0 {
            return Err(WfqError::ZeroWeight);
        }
        if cap.is_some_and(|c| c.per_sec == 0) {
            return Err(WfqError::ZeroCap);
        }
        let index = match self.free.pop() {
            Some(index) => index,
            None if self.slots.len() >= (u32::MAX - 1) as usize => {
                return Err(WfqError::TooManyEntries)
            }
            None => self.push_slot(Slot::free()),
        };
        let slot = &mut self.slots[index as usize];
        slot.kind = kind;
        slot.parent = parent;
        slot.weight = weight;
        slot.share = Ratio::new(TAG_SCALE, weight);
        slot.tag = Exact::default();
        slot.vtime = 0;
        slot.pacing = cap.map(|cap| Box::new(Pacing::new(cap)));
        let generation = slot.generation;
        self.leaves[index as usize] = leaf;
        let parent_slot = &mut self.slots[parent as usize];
        parent_slot.children.push(index);
        let siblings = parent_slot.children.len();
        let heap = &mut self.heaps[parent as usize];
        heap.reserve(siblings - heap.len());
        Ok((index, generation))
    }

    pub(super) fn push_slot(&mut self, slot: Slot) -> u32 {
        let index = self.slots.len() as u32;
        self.slots.push(slot);
        self.heaps.push(Heap::default());
        self.heap_pos.push(ABSENT);
        self.throttle_pos.push(ABSENT);
        self.leaves.push(None);
        self.throttled.reserve(1);
        index
    }

    fn node_index(&self, id: NodeId) -> Result<u32, WfqError> {
        match self.slots.get(id.index as usize) {
            Some(s) if s.kind == Kind::Node && s.generation == id.generation => Ok(id.index),
            _ => Err(WfqError::UnknownNode),
        }
    }

    pub(super) fn queue_index(&self, id: QueueId) -> Result<u32, WfqError> {
        match self.slots.get(id.index as usize) {
            Some(s) if s.kind == Kind::Queue && s.generation == id.generation => Ok(id.index),
            _ => Err(WfqError::UnknownQueue),
        }
    }

    fn tree_index(&self, id: TreeId) -> Result<u32, WfqError> {
        let index = match id {
            TreeId::Node(n) => self.node_index(n)?,
            TreeId::Queue(q) => self.queue_index(q)?,
        };
        if index == ROOT {
            return Err(WfqError::Root);
        }
        Ok(index)
    }

    pub(super) fn leaf(&self, id: QueueId) -> Option<&Leaf<T>> {
        let index = self.queue_index(id).ok()?;
        self.leaves[index as usize].as_ref()
    }

    /// Removes a leaf queue, returning its queued items in FIFO order.
    pub fn remove_queue(&mut self, id: QueueId) -> Result<Vec<T>, WfqError> {
        let index = self.queue_index(id)?;
        let mut items = Vec::new();
        self.remove_subtree(index, &mut items);
        Ok(items)
    }

    /// Removes an interior node and everything under it, returning all their
    /// queued items (each queue's in FIFO order). The root cannot be removed.
    pub fn remove_node(&mut self, id: NodeId) -> Result<Vec<T>, WfqError> {
        let index = self.tree_index(id.into())?;
        let mut items = Vec::new();
        self.remove_subtree(index, &mut items);
        Ok(items)
    }

    fn remove_subtree(&mut self, index: u32, items: &mut Vec<T>) {
        self.detach(index);
        let parent = self.slots[index as usize].parent;
        let siblings = &mut self.slots[parent as usize].children;
        if let Some(at) = siblings.iter().position(|&c| c == index) {
            siblings.swap_remove(at);
        }
        let mut stack = vec![index];
        while let Some(x) = stack.pop() {
            let slot = &mut self.slots[x as usize];
            stack.append(&mut slot.children);
            slot.kind = Kind::Free;
            slot.generation = slot.generation.wrapping_add(1);
            slot.pacing = None;
            if self.throttle_pos[x as usize] != ABSENT {
                self.throttled.remove(x, &mut self.throttle_pos);
            }
            self.heaps[x as usize].clear(&mut self.heap_pos);
            if let Some(leaf) = self.leaves[x as usize].take() {
                self.queued -= leaf.items.len();
                items.extend(leaf.items.into_iter().map(|(item, _)| item));
            }
            self.free.push(x);
        }
    }

    /// Takes the items of `queue` that `keep` refuses out (the rest stay in FIFO order and
    /// keep their place in the schedule), returning them in FIFO order. A queue left empty
    /// leaves the schedule as after its last dequeue.
    pub fn retain(
        &mut self,
        queue: QueueId,
        mut keep: impl FnMut(&T) -> bool,
    ) -> Result<Vec<T>, WfqError> {
        let index = self.queue_index(queue)?;
        let Some(leaf) = self.leaves[index as usize].as_mut() else {
            return Err(WfqError::UnknownQueue);
        };
        let mut taken = Vec::new();
        let mut kept = std::collections::VecDeque::with_capacity(leaf.items.capacity());
        for (item, len) in leaf.items.drain(..) {
            if keep(&item) {
                kept.push_back((item, len));
            } else {
                leaf.bytes -= len as u64;
                taken.push(item);
            }
        }
        leaf.items = kept;
        self.queued -= taken.len();
        if leaf.items.is_empty() && !taken.is_empty() {
            self.detach(index);
        }
        Ok(taken)
    }

    /// Sets the buffer limits of `queue`; items already queued beyond them stay and are
    /// served (only new items are refused).
    pub fn set_limits(&mut self, queue: QueueId, limits: QueueLimits) -> Result<(), WfqError> {
        if limits.max_packets == 0 {
            return Err(WfqError::ZeroPacketLimit);
        }
        let index = self.queue_index(queue)?;
        let leaf = self.leaves[index as usize]
            .as_mut()
            .ok_or(WfqError::UnknownQueue)?;
        leaf.limits = limits;
        Ok(())
    }

    /// Sets the weight (at least 1) of a node or queue; it applies to the cost
    /// charged from now on.
    pub fn set_weight(&mut self, id: impl Into<TreeId>, weight: u64) -> Result<(), WfqError> {
        let index = self.tree_index(id.into())?;
        if weight == 0 {
            return Err(WfqError::ZeroWeight);
        }
        let slot = &mut self.slots[index as usize];
        slot.weight = weight;
        slot.share = Ratio::new(TAG_SCALE, weight);
        // The carried remainder was in units of the old weight.
        slot.tag = Exact::from_whole(slot.tag.whole);
        Ok(())
    }

    /// Sets or clears the cap of a node or queue. Removing a cap releases a
    /// throttled node at once; a new rate applies from the next packet served.
    pub fn set_cap(
        &mut self,
        now: Instant,
        id: impl Into<TreeId>,
        cap: Option<Cap>,
    ) -> Result<(), WfqError> {
        let index = self.tree_index(id.into())?;
        if cap.is_some_and(|c| c.per_sec == 0) {
            return Err(WfqError::ZeroCap);
        }
        let slot = &mut self.slots[index as usize];
        let tat = slot.pacing.as_ref().map(|p| p.tat);
        slot.pacing = cap.map(|cap| {
            let mut pacing = Pacing::new(cap);
            pacing.tat = tat.unwrap_or_default();
            Box::new(pacing)
        });
        if self.throttle_pos[index as usize] != ABSENT {
            self.throttled.remove(index, &mut self.throttle_pos);
            if self.has_backlog(index) {
                self.activate(index, now.as_nanos());
            }
        }
        Ok(())
    }

    /// Weight of a node or queue.
    pub fn weight(&self, id: impl Into<TreeId>) -> Result<u64, WfqError> {
        Ok(self.slots[self.tree_index(id.into())? as usize].weight)
    }

    /// Cap of a node or queue.
    pub fn cap(&self, id: impl Into<TreeId>) -> Result<Option<Cap>, WfqError> {
        Ok(self.slots[self.tree_index(id.into())? as usize]
            .pacing
            .as_ref()
            .map(|p| p.cap))
    }
}
