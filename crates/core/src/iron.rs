//! Processing-cost accounting and enforcement (Iron, Khalid et al., NSDI'18, section 3;
//! DESIGN.md section 3 item 6).
//!
//! The switch measures the CPU time it spends on each batch of packets, splits it across the
//! packets of the batch ([`split_batch_cost`], Iron 3.1) and charges each tenant for its
//! packets ([`CpuAccounts::charge`]). Every tenant has a cfs-style budget of `quota` ns per
//! `period` ns, refilled and settled as in Iron's Algorithms 1 and 2 (Iron 3.2). A tenant whose
//! budget is exhausted is throttled: [`CpuAccounts::admit`] tells the switch to drop its
//! packets before doing any work on them (Iron 3.2 "Dropping excess packets": do not poll a
//! throttled container's queue), optionally starting early drops when the budget left falls
//! below T% of the quota.
//!
//! # How Iron's algorithms map onto a userspace switch
//!
//! In Iron one `runtime` pool per cgroup pays for both the container's own tasks (handed out
//! to cores in slices, `rt_remain`) and the network work done for it (`cpuusage`, settled
//! into `runtime` by Algorithm 2). Here the switch's work *is* the consumption, so there are
//! no task slices: each charge is settled into the global state at once by the charge rule
//! of Algorithm 2 (the per-core slices of CFS/Iron only exist to avoid a global lock; this
//! struct is owned by one engine thread). The tenant may run while Algorithm 2 could still
//! hand it a non-zero amount, that is while `runtime > 0` (lines 19-22); otherwise it is
//! throttled until the next period refill (Algorithm 1).
//!
//! * `charge` is called for the measured cost of the tenant's packets: it takes from
//!   `runtime`, which may go negative (Algorithm 2 lines 3-9). The debt is paid back at the
//!   next refill: the next period starts with `quota - debt`.
//! * Iron's credit (lines 10-12, `gained`: time a tenant is owed for work it did on another's
//!   behalf) has no caller here: the switch measures each batch's cost and charges it to the
//!   tenants whose packets it was, so no tenant is charged for another's work; the ports'
//!   softirq work the kernel ran in a tenant's own threads is given back to its cgroup
//!   instead (the switch's `CpuQuota::refill`).
//! * At each period boundary positive leftover runtime is discarded because the tenant was
//!   demand-limited and CFS does not let unused time accumulate (Algorithm 1 lines 5-7), and
//!   the quota is added (line 8).
//!
//! The same charge can be applied to the tenant's cgroup CPU quota so a container pays for
//! the switch work done for it: [`CpuAccounts::cgroup_quota`] gives the figure, the switch
//! writes it.
//!
//! The paper text available to us describes the algorithms in prose with only the last lines
//! of Algorithm 2 reproduced; the rules above follow that prose line by line.

use core::fmt;

pub mod shared;

use crate::time::{Duration, Instant};

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

/// Errors from the accounting API: bad configuration or arguments, never a panic.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IronError {
    /// The period must be longer than zero.
    ZeroPeriod,
    /// A tenant's quota must be longer than zero.
    ZeroQuota,
    /// The early-drop threshold is a percentage of the quota and must be in 1..=100.
    BadEarlyDropPercent(u8),
    /// No tenant has this index; use the one returned by [`CpuAccounts::add_tenant`].
    UnknownTenant(usize),
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
            IronError::ZeroPeriod => write!(f, "CPU accounting period must be > 0 ns"),
            IronError::ZeroQuota => write!(f, "tenant CPU quota must be > 0 ns"),
            IronError::BadEarlyDropPercent(p) => {
                write!(f, "early-drop threshold {p}% out of range, use 1..=100")
            }
            IronError::UnknownTenant(t) => {
                write!(
                    f,
                    "unknown tenant index {t}: use an index returned by add_tenant"
                )
            }
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
    /// a growing fraction of the tenant's packets is dropped (see [`CpuAccounts::admit`]).
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

/// Per-tenant counters since the tenant was added.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantStats {
    /// Total ns charged.
    pub charged_ns: u64,
    /// Packets admitted.
    pub admitted: u64,
    /// Packets dropped in the early-drop band.
    pub early_drops: u64,
    /// Packets dropped because the tenant was throttled.
    pub throttle_drops: u64,
    /// Periods in which the tenant was throttled at some point.
    pub throttled_periods: u64,
}

/// Network CPU charged to a tenant over one whole period.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PeriodUsage {
    /// ns charged during the period.
    pub charged_ns: u64,
}

#[derive(Clone, Debug)]
struct Account {
    quota: u64,
    /// Iron's global `runtime`: may go negative (a debt paid back at the next refill).
    runtime: i128,
    throttled_this_period: bool,
    /// Error-diffusion accumulator of the deterministic early-drop ramp.
    early_drop_acc: u128,
    current: PeriodUsage,
    last: PeriodUsage,
    stats: TenantStats,
}

impl Account {
    fn new(quota: u64) -> Self {
        Account {
            quota,
            runtime: quota as i128,
            throttled_this_period: false,
            early_drop_acc: 0,
            current: PeriodUsage::default(),
            last: PeriodUsage::default(),
            stats: TenantStats::default(),
        }
    }

    /// Algorithm 1 applied for `periods` consecutive boundaries (`periods >= 1`).
    fn refill(&mut self, periods: u64) {
        // Lines 5-7: leftover runtime was unused because demand was low; CFS does not carry it.
        if self.runtime > 0 {
            self.runtime = 0;
        }
        // Line 8, once per boundary: runtime += quota. From runtime <= 0, k refills give
        // min(runtime + k*quota, quota) because lines 5-7 zero any positive leftover.
        let quota = self.quota as i128;
        self.runtime = (self.runtime + periods as i128 * quota).min(quota);
        self.throttled_this_period = false;
        self.early_drop_acc = 0;
        self.last = if periods == 1 {
            self.current
        } else {
            PeriodUsage::default()
        };
        self.current = PeriodUsage::default();
    }

    /// Algorithm 2 lines 3-9: a charge comes out of runtime, which may go negative.
    fn settle(&mut self, cpu_usage: u128) {
        self.runtime -= cpu_usage.min(i128::MAX as u128) as i128;
    }

    /// Time the tenant can still use this period: positive runtime.
    fn available(&self) -> u128 {
        self.runtime.max(0) as u128
    }

    /// Algorithm 2 lines 19-22 hand out a non-zero amount only from positive runtime; without
    /// it the tenant is throttled.
    fn is_throttled(&self) -> bool {
        self.available() == 0
    }

    fn note_throttle(&mut self) {
        if self.is_throttled() && !self.throttled_this_period {
            self.throttled_this_period = true;
            self.stats.throttled_periods += 1;
        }
    }
}

/// Per-tenant CPU budgets with quota/period, Iron-style charges, and drop verdicts.
///
/// Deterministic and sans-I/O: every call takes `now`; period refills happen lazily on the
/// first call at or after a boundary, or in [`CpuAccounts::on_timeout`].
#[derive(Clone, Debug)]
pub struct CpuAccounts {
    period: u64,
    early_drop_percent: Option<u8>,
    next_boundary: Instant,
    /// Indexed by tenant; a removed tenant's slot is None until [`CpuAccounts::add_tenant`]
    /// reuses it.
    accounts: Vec<Option<Account>>,
}

impl CpuAccounts {
    /// Creates an empty set of accounts whose first period starts at `start`.
    pub fn new(start: Instant, config: IronConfig) -> Result<Self, IronError> {
        if config.period == Duration::ZERO {
            return Err(IronError::ZeroPeriod);
        }
        if let Some(p) = config.early_drop_percent {
            if p == 0 || p > 100 {
                return Err(IronError::BadEarlyDropPercent(p));
            }
        }
        Ok(CpuAccounts {
            period: config.period.as_nanos(),
            early_drop_percent: config.early_drop_percent,
            next_boundary: start + config.period,
            accounts: Vec::new(),
        })
    }

    /// Adds a tenant allowed `quota` of CPU per period (may exceed the period: several
    /// cores' worth, as in cfs). Its full quota is available at once. Returns its index (a
    /// removed tenant's index may be reused).
    pub fn add_tenant(&mut self, quota: Duration) -> Result<usize, IronError> {
        if quota == Duration::ZERO {
            return Err(IronError::ZeroQuota);
        }
        let account = Some(Account::new(quota.as_nanos()));
        match self.accounts.iter().position(Option::is_none) {
            Some(free) => {
                self.accounts[free] = account;
                Ok(free)
            }
            None => {
                self.accounts.push(account);
                Ok(self.accounts.len() - 1)
            }
        }
    }

    /// Changes `tenant`'s quota in place, as a cgroup quota written mid-period: the current
    /// period's runtime moves by the difference (the debt stays), at most the new
    /// quota; later periods refill to the new quota. Other tenants are not touched.
    pub fn set_quota(
        &mut self,
        now: Instant,
        tenant: usize,
        quota: Duration,
    ) -> Result<(), IronError> {
        if quota == Duration::ZERO {
            return Err(IronError::ZeroQuota);
        }
        let account = self.account(now, tenant)?;
        let new = quota.as_nanos() as i128;
        account.runtime = (account.runtime + new - account.quota as i128).min(new);
        account.quota = quota.as_nanos();
        account.note_throttle();
        Ok(())
    }

    /// Removes `tenant`'s account; its index is unknown until `add_tenant` reuses it.
    pub fn remove_tenant(&mut self, tenant: usize) -> Result<(), IronError> {
        match self.accounts.get_mut(tenant) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(IronError::UnknownTenant(tenant)),
        }
    }

    /// Number of tenants present.
    pub fn tenant_count(&self) -> usize {
        self.accounts.iter().flatten().count()
    }

    /// The next period boundary, when quotas refill and throttled tenants may resume.
    pub fn poll_at(&self) -> Option<Instant> {
        Some(self.next_boundary)
    }

    /// Applies every period boundary up to `now` (Algorithm 1 for each tenant). Calling it
    /// is optional: every other method does it first.
    pub fn on_timeout(&mut self, now: Instant) {
        if now < self.next_boundary {
            return;
        }
        let periods = (now - self.next_boundary).as_nanos() / self.period + 1;
        for account in self.accounts.iter_mut().flatten() {
            account.refill(periods);
        }
        self.next_boundary += Duration::from_nanos(periods.saturating_mul(self.period));
    }

    fn account(&mut self, now: Instant, tenant: usize) -> Result<&mut Account, IronError> {
        self.on_timeout(now);
        self.accounts
            .get_mut(tenant)
            .and_then(Option::as_mut)
            .ok_or(IronError::UnknownTenant(tenant))
    }

    /// Whether `tenant` had used its whole budget when the accounts were last brought up to
    /// date (by [`CpuAccounts::on_timeout`] or any other call): a read-only check for a
    /// caller deciding whether to read the tenant's port at all. Unknown tenants are not.
    pub fn exhausted(&self, tenant: usize) -> bool {
        self.accounts
            .get(tenant)
            .and_then(Option::as_ref)
            .is_some_and(|a| a.is_throttled())
    }

    /// Decides, before any work is done, whether a packet of `tenant` may be processed.
    ///
    /// Throttled tenants get [`Admission::Throttled`]. With an early-drop threshold T, once
    /// less than T% of the quota is left the fraction of packets dropped grows linearly from
    /// 0 (at T% left) to 1 (nothing left); the choice is deterministic error diffusion, so
    /// exactly that fraction of consecutive packets is dropped, no randomness involved.
    pub fn admit(&mut self, now: Instant, tenant: usize) -> Result<Admission, IronError> {
        let early_drop_percent = self.early_drop_percent;
        let account = self.account(now, tenant)?;
        if account.is_throttled() {
            account.stats.throttle_drops += 1;
            return Ok(Admission::Throttled);
        }
        if let Some(percent) = early_drop_percent {
            let threshold = account.quota as u128 * percent as u128 / 100;
            let available = account.available();
            if available < threshold {
                account.early_drop_acc += threshold - available;
                if account.early_drop_acc >= threshold {
                    account.early_drop_acc -= threshold;
                    account.stats.early_drops += 1;
                    return Ok(Admission::EarlyDrop);
                }
            }
        }
        account.stats.admitted += 1;
        Ok(Admission::Admit)
    }

    /// Charges `tenant` for `cost` of CPU spent on its packets (Algorithm 2 lines 3-9). Its
    /// runtime may go negative; the debt is paid back from the next period's quota.
    pub fn charge(&mut self, now: Instant, tenant: usize, cost: Duration) -> Result<(), IronError> {
        let account = self.account(now, tenant)?;
        let ns = cost.as_nanos();
        account.settle(ns as u128);
        account.stats.charged_ns = account.stats.charged_ns.saturating_add(ns);
        account.current.charged_ns = account.current.charged_ns.saturating_add(ns);
        account.note_throttle();
        Ok(())
    }

    /// Splits a measured batch cost across its packets (see [`split_batch_cost`]) and charges
    /// each packet's share to its tenant. Every tenant is checked before anything is charged.
    pub fn charge_batch(
        &mut self,
        now: Instant,
        batch: BatchCost,
        model: PacketCostModel,
        packets: &[BatchPacket],
    ) -> Result<(), IronError> {
        if let Some(p) = packets
            .iter()
            .find(|p| self.accounts.get(p.tenant).is_none_or(Option::is_none))
        {
            return Err(IronError::UnknownTenant(p.tenant));
        }
        self.on_timeout(now);
        let accounts = &mut self.accounts;
        for_each_share(batch, model, packets, |i, ns| {
            let account = accounts[packets[i].tenant].as_mut().expect("checked");
            account.settle(ns as u128);
            account.stats.charged_ns = account.stats.charged_ns.saturating_add(ns);
            account.current.charged_ns = account.current.charged_ns.saturating_add(ns);
        })?;
        for p in packets {
            if let Some(account) = accounts[p.tenant].as_mut() {
                account.note_throttle();
            }
        }
        Ok(())
    }

    /// Whether `tenant` is throttled at `now` (its packets are to be dropped before any work).
    pub fn is_throttled(&mut self, now: Instant, tenant: usize) -> Result<bool, IronError> {
        Ok(self.account(now, tenant)?.is_throttled())
    }

    /// CPU time `tenant` may still use this period (positive runtime), and its
    /// debt if runtime is negative: `(available, debt)`.
    pub fn budget(
        &mut self,
        now: Instant,
        tenant: usize,
    ) -> Result<(Duration, Duration), IronError> {
        let account = self.account(now, tenant)?;
        let clamp = |v: u128| Duration::from_nanos(v.min(u64::MAX as u128) as u64);
        Ok((
            clamp(account.available()),
            clamp((-account.runtime).max(0) as u128),
        ))
    }

    /// Counters of `tenant` since it was added.
    pub fn stats(&self, tenant: usize) -> Result<TenantStats, IronError> {
        self.accounts
            .get(tenant)
            .and_then(Option::as_ref)
            .map(|a| a.stats)
            .ok_or(IronError::UnknownTenant(tenant))
    }

    /// Network CPU charged to `tenant` over the last complete period (zero
    /// before the first boundary, or if a whole period passed without any call).
    pub fn last_period_usage(
        &mut self,
        now: Instant,
        tenant: usize,
    ) -> Result<PeriodUsage, IronError> {
        Ok(self.account(now, tenant)?.last)
    }

    /// The cgroup CPU quota to set for `tenant`'s container for the current period so the
    /// container pays for the switch work done for it (DESIGN 3.6): `container_quota` minus
    /// the net network CPU of the last period, never below `floor` (cgroup v1 refuses quotas
    /// under 1 ms). Assumes the cgroup's period equals this
    /// accounting period; the switch writes the value (`cpu.cfs_quota_us` or `cpu.max`).
    pub fn cgroup_quota(
        &mut self,
        now: Instant,
        tenant: usize,
        container_quota: Duration,
        floor: Duration,
    ) -> Result<Duration, IronError> {
        let used = self.last_period_usage(now, tenant)?.charged_ns;
        Ok(Duration::from_nanos(container_quota.as_nanos().saturating_sub(used)).max(floor))
    }
}
