//! The scheduler's public vocabulary: what a packet costs, caps and queue limits, the ids of
//! nodes and queues, what enqueue and dequeue return, per-queue statistics and errors.

use std::fmt;

/// What one packet costs, i.e. which resource the scheduler shares fairly.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CostKind {
    /// The packet's length in bytes (bandwidth-fair). Zero-length items cost 1.
    Bytes,
    /// 1 per packet (packet-rate fair).
    Packets,
    /// Processing cost measured after the fact, e.g. nanoseconds (PicNIC CPU-fair
    /// WFQ). Packets are charged the leaf queue's EWMA estimate when dequeued; the
    /// caller reports the measurement with [`Wfq::settle`].
    Measured {
        /// Estimate for a queue that has not been measured yet (at least 1 is charged).
        initial_estimate: u64,
        /// EWMA gain is `1 / 2^ewma_shift` (3 gives 1/8). Values above 32 act as 32.
        ewma_shift: u8,
    },
}

/// A maximum rate for a node, in cost units per second.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Cost units per second the node may be served at most (must be non-zero).
    pub per_sec: u64,
    /// Extra cost the node may be served back to back after being idle or served
    /// late; 0 paces strictly. Over any interval `t` the node is served at most
    /// `per_sec * t + burst + one packet`.
    pub burst: u64,
}

impl Cap {
    /// A strict cap of `per_sec` cost units per second without burst allowance.
    pub const fn per_sec(per_sec: u64) -> Self {
        Cap { per_sec, burst: 0 }
    }
}

/// Buffer bounds of one leaf queue. The packet buffer is preallocated in full.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Most packets the queue holds (must be non-zero).
    pub max_packets: u32,
    /// Most bytes the queue holds.
    pub max_bytes: u64,
}

/// Room left in a leaf queue.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Headroom {
    /// Packets that still fit.
    pub packets: u32,
    /// Bytes that still fit.
    pub bytes: u64,
}

/// Handle of an interior node. Stale handles (of removed nodes) are rejected.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId {
    pub(super) index: u32,
    pub(super) generation: u32,
}

/// Handle of a leaf queue. Stale handles (of removed queues) are rejected.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId {
    pub(super) index: u32,
    pub(super) generation: u32,
}

impl QueueId {
    /// A dense index (reused after removal), handy for per-queue arrays of callers.
    pub const fn index(self) -> usize {
        self.index as usize
    }
}

/// Either kind of tree member, for the calls that apply to both.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TreeId {
    /// An interior node.
    Node(NodeId),
    /// A leaf queue.
    Queue(QueueId),
}

impl From<NodeId> for TreeId {
    fn from(id: NodeId) -> Self {
        TreeId::Node(id)
    }
}

impl From<QueueId> for TreeId {
    fn from(id: QueueId) -> Self {
        TreeId::Queue(id)
    }
}

/// Why an item was not queued.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The queue holds `max_packets` already.
    PacketLimit,
    /// The item would take the queue over `max_bytes`.
    ByteLimit,
    /// The queue id is stale (the queue was removed).
    UnknownQueue,
}

/// A refused item, handed back so the caller decides between drop and backpressure.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejected<T> {
    /// The item that was not queued.
    pub item: T,
    /// Why.
    pub reason: RejectReason,
}

/// An item chosen by the scheduler.
#[derive(Debug, PartialEq, Eq)]
pub struct Dequeued<T> {
    /// The item.
    pub item: T,
    /// The leaf queue it came from.
    pub queue: QueueId,
    /// Its length as given to [`Wfq::enqueue`].
    pub len_bytes: u32,
    /// The cost charged now; with [`CostKind::Measured`] an estimate to pass back
    /// to [`Wfq::settle`] with the measurement.
    pub cost: u64,
}

/// Counters of one leaf queue.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Items accepted.
    pub enqueued_packets: u64,
    /// Bytes accepted.
    pub enqueued_bytes: u64,
    /// Items dequeued.
    pub dequeued_packets: u64,
    /// Bytes dequeued.
    pub dequeued_bytes: u64,
    /// Items refused because the queue was full.
    pub rejected_packets: u64,
    /// Bytes refused because the queue was full.
    pub rejected_bytes: u64,
    /// Cost charged, including settled corrections.
    pub cost_served: u64,
}

/// Errors of the control calls.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WfqError {
    /// The node id is stale or was never issued by this scheduler.
    UnknownNode,
    /// The queue id is stale or was never issued by this scheduler.
    UnknownQueue,
    /// Weights must be at least 1.
    ZeroWeight,
    /// A cap must allow a non-zero rate; use `None` for no cap.
    ZeroCap,
    /// A queue must hold at least one packet.
    ZeroPacketLimit,
    /// The root has no parent: it cannot be removed, weighted or capped.
    Root,
    /// More than `u32::MAX - 1` nodes and queues.
    TooManyEntries,
}

impl fmt::Display for WfqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WfqError::UnknownNode => "unknown node id (removed, or from another scheduler)",
            WfqError::UnknownQueue => "unknown queue id (removed, or from another scheduler)",
            WfqError::ZeroWeight => "weight must be at least 1",
            WfqError::ZeroCap => "cap rate must be at least 1 per second; pass None for no cap",
            WfqError::ZeroPacketLimit => "queue max_packets must be at least 1",
            WfqError::Root => "the root node cannot be removed, weighted or capped",
            WfqError::TooManyEntries => "too many nodes and queues (limit u32::MAX - 1)",
        })
    }
}

impl std::error::Error for WfqError {}
