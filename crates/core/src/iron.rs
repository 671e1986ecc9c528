//! Processing-cost accounting and enforcement (Iron, Khalid et al., NSDI'18, section 3;
//! DESIGN.md section 3 item 6).
//!
//! The switch measures the CPU time it spends on each batch of packets, splits it across the
//! packets of the batch ([`split_batch_cost`], Iron 3.1) and charges each tenant for its
//! packets. Every tenant has a cfs-style budget of `quota` ns per `period` ns, one account per
//! host that every dataplane worker draws from ([`shared::SharedAccount`], each worker's slice
//! of it a [`shared::Slice`]), refilled and settled as in Iron's Algorithms 1 and 2 (Iron 3.2).
//! A tenant whose budget is exhausted is throttled: [`shared::Slice::admit`] tells the switch
//! to drop its packets before doing any work on them (Iron 3.2 "Dropping excess packets": do
//! not poll a throttled container's queue), optionally starting early drops when the budget
//! left falls below T% of the quota.
//!
//! # How Iron's algorithms map onto a userspace switch
//!
//! In Iron one `runtime` pool per cgroup pays for both the container's own tasks (handed out
//! to cores in slices, `rt_remain`) and the network work done for it (`cpuusage`, settled
//! into `runtime` by Algorithm 2). Here the switch's work *is* the consumption, so the slices
//! pay for that work alone: a worker settles each charge from its slice, and what no slice
//! covers from the global `runtime`, by the charge rule of Algorithm 2. The tenant may run
//! while Algorithm 2 could still hand it a non-zero amount, that is while `runtime > 0`
//! (lines 19-22); otherwise it is throttled until the next period refill (Algorithm 1).
//!
//! * A charge is the measured cost of the tenant's packets: it takes from `runtime`, which
//!   may go negative (Algorithm 2 lines 3-9). The debt is paid back at the next refill: the
//!   next period starts with `quota - debt`.
//! * Iron's credit (lines 10-12, `gained`: time a tenant is owed for work it did on another's
//!   behalf) has no caller here: the switch measures each batch's cost and charges it to the
//!   tenants whose packets it was, so no tenant is charged for another's work; the ports'
//!   softirq work the kernel ran in a tenant's own threads is given back to its cgroup
//!   instead (the switch's `CpuQuota::refill`).
//! * At each period boundary positive leftover runtime is discarded because the tenant was
//!   demand-limited and CFS does not let unused time accumulate (Algorithm 1 lines 5-7), and
//!   the quota is added (line 8).
//!
//! The same charges are taken off the tenant's cgroup CPU quota so a container pays for the
//! switch work done for it: the switch's `Engine::cgroup_quotas` gives the figure and
//! `CpuQuota::refill` writes it.
//!
//! The paper text available to us describes the algorithms in prose with only the last lines
//! of Algorithm 2 reproduced; the rules above follow that prose line by line.

use core::fmt;

pub mod shared;

use crate::time::Duration;

/// What the switch must do with a packet of a tenant, decided before any work is done on it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Process the packet.
    Admit,
    /// Drop the packet: the tenant is within the early-drop band (less than T% of its quota
    /// left), Iron 3.2 "drop packets before a container is throttled".
    EarlyDrop,
    /// Drop the packet: the tenant's budget is exhausted until the next period.
    Throttled,
}

/// Errors from splitting a batch's cost ([`split_batch_cost`]): bad arguments, never a panic.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IronError {
    /// A batch cost cannot be split across zero packets.
    EmptyBatch,
    /// The output buffer must have one slot per packet.
    OutputLengthMismatch {
        /// Number of packets in the batch.
        packets: usize,
        /// Length of the output buffer given.
        output: usize,
    },
}

impl fmt::Display for IronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IronError::EmptyBatch => write!(f, "batch has no packets to charge its cost to"),
            IronError::OutputLengthMismatch { packets, output } => write!(
                f,
                "output buffer has {output} slots for {packets} packets; give one per packet"
            ),
        }
    }
}

impl std::error::Error for IronError {}

/// Configuration shared by all tenants.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IronConfig {
    /// The accounting period (cfs `cpu.cfs_period_us`); every tenant's quota refills at each
    /// period boundary.
    pub period: Duration,
    /// Early-drop threshold T in percent of the quota: when less than T% of the quota is left,
    /// a growing fraction of the tenant's packets is dropped (see [`shared::Slice::admit`]).
    /// `None` drops only when throttled.
    pub early_drop_percent: Option<u8>,
}

/// A batch whose processing time was measured as one span.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BatchCost {
    /// Measured CPU time of the whole batch.
    pub total: Duration,
    /// Part of `total` that is a fixed per-batch overhead (system call, ring handling,
    /// wake-up), split evenly across the packets (Iron 3.1, the `O_RX` share). Clamped to
    /// `total`.
    pub fixed_overhead: Duration,
}

/// Relative per-packet cost model used to split the variable part of a batch's cost.
///
/// A packet's weight is `per_packet + per_byte * bytes`. Iron measures each packet's cost
/// individually (3.1); a batched userspace switch measures the batch, so the variable part
/// is apportioned by this model instead. `per_packet = 1, per_byte = 0` gives Iron's
/// sender-side rule (equal share per packet of the batch). If every weight is zero the split
/// is even.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PacketCostModel {
    /// Weight every packet carries regardless of size (parsing, lookup, scheduling).
    pub per_packet: u64,
    /// Weight per byte of packet (copies, checksums, encryption).
    pub per_byte: u64,
}

impl PacketCostModel {
    /// Every packet of a batch pays the same share (Iron's sender-side rule).
    pub const EVEN: PacketCostModel = PacketCostModel {
        per_packet: 1,
        per_byte: 0,
    };

    fn weight(&self, packets: u32, bytes: u64) -> u128 {
        (self.per_packet as u128 * packets as u128)
            .saturating_add((self.per_byte as u128).saturating_mul(bytes as u128))
    }
}

/// Packets of one tenant in a measured batch: one packet (`packets: 1`), or a tally of all
/// the packets a tenant had in the batch (a switch loop iteration tallies per tenant).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BatchPacket {
    /// Index of the tenant the packets belong to.
    pub tenant: usize,
    /// How many packets this entry stands for.
    pub packets: u32,
    /// Their total length in bytes.
    pub bytes: u64,
}

/// Calls `f(i, ns)` with entry `i`'s share of the batch: `fixed_overhead` in proportion to
/// packets, the rest by `model` weight. Shares are computed by differences of cumulative
/// floors, so they sum to `total` exactly and each is within 1 ns of its exact real share.
fn for_each_share(
    batch: BatchCost,
    model: PacketCostModel,
    packets: &[BatchPacket],
    mut f: impl FnMut(usize, u64),
) -> Result<(), IronError> {
    if packets.is_empty() {
        return Err(IronError::EmptyBatch);
    }
    let total = batch.total.as_nanos() as u128;
    let fixed = (batch.fixed_overhead.as_nanos() as u128).min(total);
    let variable = total - fixed;
    // Entries standing for no packet count as one, so the fixed part is always split.
    let count = |p: &BatchPacket| p.packets.max(1) as u128;
    let n: u128 = packets.iter().map(count).sum();
    let total_weight = packets.iter().fold(0u128, |w, p| {
        w.saturating_add(model.weight(p.packets, p.bytes))
    });
    // `variable * weight` must fit in u128: drop low weight bits beyond 64 (relative error
    // under 2^-63). Cumulative weights stay monotone and end at the total, so the split
    // stays exact.
    let shift = (128 - total_weight.leading_zeros()).saturating_sub(64);
    let scaled_total = total_weight >> shift;
    let (mut cum_weight, mut cum_packets) = (0u128, 0u128);
    let mut prev_fixed = 0u128;
    let mut prev_variable = 0u128;
    for (i, p) in packets.iter().enumerate() {
        cum_packets += count(p);
        let upto_fixed = fixed * cum_packets / n;
        cum_weight = cum_weight.saturating_add(model.weight(p.packets, p.bytes));
        let upto_variable = (variable * (cum_weight >> shift))
            .checked_div(scaled_total)
            .unwrap_or(variable * cum_packets / n);
        let share = (upto_fixed - prev_fixed) + (upto_variable - prev_variable);
        prev_fixed = upto_fixed;
        prev_variable = upto_variable;
        // A share never exceeds `total`, which came from a u64.
        f(i, share as u64);
    }
    Ok(())
}

/// Splits a measured batch cost across its packets into `out` (ns per packet, same order):
/// `fixed_overhead` evenly, the rest in proportion to `model` weights (Iron 3.1). The shares
/// sum to `batch.total` exactly. No allocation.
pub fn split_batch_cost(
    batch: BatchCost,
    model: PacketCostModel,
    packets: &[BatchPacket],
    out: &mut [u64],
) -> Result<(), IronError> {
    if out.len() != packets.len() {
        return Err(IronError::OutputLengthMismatch {
            packets: packets.len(),
            output: out.len(),
        });
    }
    for_each_share(batch, model, packets, |i, ns| out[i] = ns)
}
