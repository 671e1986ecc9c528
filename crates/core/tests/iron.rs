//! Iron-style CPU accounting (Iron section 3): budgets, throttling, debt, early drop,
//! penalty bound and exact batch cost splitting.

use picnic_core::iron::{
    split_batch_cost, Admission, BatchCost, BatchPacket, CpuAccounts, IronConfig, IronError,
    PacketCostModel,
};
use picnic_core::{Duration, Instant};
use proptest::prelude::*;

const PERIOD: Duration = Duration::from_millis(100);
const QUOTA: Duration = Duration::from_millis(10);

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}
fn at_ms(v: u64) -> Instant {
    Instant::from_nanos(v * 1_000_000)
}

fn accounts(early_drop_percent: Option<u8>) -> (CpuAccounts, usize) {
    let mut a = CpuAccounts::new(
        Instant::ZERO,
        IronConfig {
            period: PERIOD,
            early_drop_percent,
        },
    )
    .unwrap();
    let t = a.add_tenant(QUOTA).unwrap();
    (a, t)
}

#[test]
fn charges_within_quota_are_admitted() {
    let (mut a, t) = accounts(None);
    for i in 0..9 {
        assert_eq!(a.admit(at_ms(i), t).unwrap(), Admission::Admit);
        a.charge(at_ms(i), t, ms(1)).unwrap();
    }
    assert_eq!(a.admit(at_ms(9), t).unwrap(), Admission::Admit);
    assert_eq!(a.budget(at_ms(9), t).unwrap(), (ms(1), Duration::ZERO));
    assert_eq!(a.stats(t).unwrap().throttled_periods, 0);
}

#[test]
fn exhausted_quota_throttles_until_next_period() {
    let (mut a, t) = accounts(None);
    a.charge(at_ms(1), t, QUOTA).unwrap();
    for now in [1, 50, 99] {
        assert_eq!(a.admit(at_ms(now), t).unwrap(), Admission::Throttled);
    }
    assert_eq!(a.poll_at(), Some(at_ms(100)));
    assert_eq!(a.admit(at_ms(100), t).unwrap(), Admission::Admit);
    assert_eq!(a.poll_at(), Some(at_ms(200)));
    let stats = a.stats(t).unwrap();
    assert_eq!(
        (
            stats.throttle_drops,
            stats.throttled_periods,
            stats.admitted
        ),
        (3, 1, 1)
    );
}

#[test]
fn debt_is_paid_back_next_period() {
    let (mut a, t) = accounts(None);
    assert_eq!(a.admit(at_ms(0), t).unwrap(), Admission::Admit);
    // The admitted packets turned out to cost 1.5 quotas: runtime goes negative.
    a.charge(at_ms(1), t, ms(15)).unwrap();
    assert_eq!(a.budget(at_ms(1), t).unwrap(), (Duration::ZERO, ms(5)));
    // Next period: quota - debt.
    assert_eq!(a.budget(at_ms(100), t).unwrap(), (ms(5), Duration::ZERO));
    // A debt larger than a quota takes several periods (lazy refill across skipped periods).
    a.charge(at_ms(101), t, ms(30)).unwrap(); // runtime -25 ms
    assert_eq!(a.admit(at_ms(200), t).unwrap(), Admission::Throttled); // -15
    assert_eq!(a.budget(at_ms(450), t).unwrap(), (ms(5), Duration::ZERO)); // -5 + 10
    assert_eq!(a.budget(at_ms(550), t).unwrap(), (ms(10), Duration::ZERO)); // leftover not carried
}

#[test]
fn unused_runtime_does_not_accumulate() {
    let (mut a, t) = accounts(None);
    a.charge(at_ms(1), t, ms(2)).unwrap();
    assert_eq!(a.budget(at_ms(150), t).unwrap().0, QUOTA);
}

#[test]
fn early_drop_starts_at_threshold_and_not_before() {
    let (mut a, t) = accounts(Some(20)); // drop band: less than 2 ms of 10 ms left
    a.charge(at_ms(1), t, ms(8)).unwrap(); // exactly 20% left: not yet
    for _ in 0..1000 {
        assert_eq!(a.admit(at_ms(1), t).unwrap(), Admission::Admit);
    }
    a.charge(at_ms(1), t, Duration::from_nanos(1)).unwrap();
    // 1 ns into the band: the drop fraction is 1 ns / 2 ms, one packet in 2 million.
    let dropped = (0..2_000_000)
        .filter(|_| a.admit(at_ms(1), t).unwrap() == Admission::EarlyDrop)
        .count();
    assert_eq!(dropped, 1);
    // Half way into the band (1 ms of 2 ms left): half the packets, deterministically.
    a.charge(at_ms(1), t, Duration::from_nanos(999_999))
        .unwrap();
    let dropped = (0..1000)
        .filter(|_| a.admit(at_ms(1), t).unwrap() == Admission::EarlyDrop)
        .count();
    assert_eq!(dropped, 500);
    // Quota gone: throttled, not early drop.
    a.charge(at_ms(1), t, ms(1)).unwrap();
    assert_eq!(a.admit(at_ms(1), t).unwrap(), Admission::Throttled);
    assert_eq!(a.stats(t).unwrap().early_drops, 501);
}

/// Two tenants with equal quotas on a 100 ms period; the flooder is offered far more packets
/// than its quota pays for, each costing 7 us. Over every period its charged CPU stays within
/// its quota plus one packet's overshoot, and over the whole run within its quota share.
#[test]
fn flooding_tenant_cannot_exceed_its_quota_share() {
    let mut a = CpuAccounts::new(
        Instant::ZERO,
        IronConfig {
            period: PERIOD,
            early_drop_percent: Some(10),
        },
    )
    .unwrap();
    let flooder = a.add_tenant(QUOTA).unwrap();
    let victim = a.add_tenant(QUOTA).unwrap();
    let cost = Duration::from_micros(7);
    let periods = 50u64;
    let mut processed = [0u64; 2];
    let mut per_period = vec![0u64; periods as usize];
    // One packet offered every 1 us by the flooder (7x what its quota allows), one every
    // 100 us by the victim (0.7 ms per period, well within quota).
    for us in 0..periods * 100_000 {
        let now = Instant::from_nanos(us * 1_000);
        if a.admit(now, flooder).unwrap() == Admission::Admit {
            a.charge(now, flooder, cost).unwrap();
            processed[0] += cost.as_nanos();
            per_period[(us / 100_000) as usize] += cost.as_nanos();
        }
        if us % 100 == 0 {
            assert_eq!(
                a.admit(now, victim).unwrap(),
                Admission::Admit,
                "victim dropped at {us} us"
            );
            a.charge(now, victim, cost).unwrap();
            processed[1] += cost.as_nanos();
        }
    }
    for (i, ns) in per_period.iter().enumerate() {
        assert!(
            *ns <= QUOTA.as_nanos() + cost.as_nanos(),
            "period {i}: {ns} ns"
        );
    }
    assert!(processed[0] <= periods * QUOTA.as_nanos() + cost.as_nanos());
    // Still work conserving within its quota: early drop stops it at 90% plus the ramp.
    assert!(
        processed[0] >= periods * QUOTA.as_nanos() * 85 / 100,
        "flooder got {}",
        processed[0]
    );
    assert_eq!(processed[1], periods * 1000 * cost.as_nanos());
    assert_eq!(
        a.stats(victim).unwrap().throttle_drops + a.stats(victim).unwrap().early_drops,
        0
    );
}

#[test]
fn batch_charge_reaches_tenant_accounts() {
    let (mut a, t0) = accounts(None);
    let t1 = a.add_tenant(QUOTA).unwrap();
    let packets = [
        BatchPacket {
            packets: 1,
            tenant: t0,
            bytes: 1500,
        },
        BatchPacket {
            packets: 1,
            tenant: t1,
            bytes: 64,
        },
        BatchPacket {
            packets: 1,
            tenant: t0,
            bytes: 1500,
        },
    ];
    let batch = BatchCost {
        total: Duration::from_nanos(10_000),
        fixed_overhead: Duration::from_nanos(3_000),
    };
    a.charge_batch(at_ms(1), batch, PacketCostModel::EVEN, &packets)
        .unwrap();
    assert_eq!(
        a.stats(t0).unwrap().charged_ns + a.stats(t1).unwrap().charged_ns,
        10_000
    );
    assert_eq!(a.stats(t1).unwrap().charged_ns, 3_333);
    let bad = [BatchPacket {
        packets: 1,
        tenant: 7,
        bytes: 1,
    }];
    assert_eq!(
        a.charge_batch(at_ms(1), batch, PacketCostModel::EVEN, &bad),
        Err(IronError::UnknownTenant(7))
    );
    assert_eq!(
        a.charge_batch(at_ms(1), batch, PacketCostModel::EVEN, &[]),
        Err(IronError::EmptyBatch)
    );
}

#[test]
fn cgroup_quota_pays_for_switch_work() {
    let (mut a, t) = accounts(None);
    a.charge(at_ms(1), t, ms(3)).unwrap();
    assert_eq!(
        a.cgroup_quota(at_ms(100), t, ms(50), ms(1)).unwrap(),
        ms(47)
    );
    a.charge(at_ms(101), t, ms(60)).unwrap();
    assert_eq!(a.cgroup_quota(at_ms(200), t, ms(50), ms(1)).unwrap(), ms(1));
}

#[test]
fn bad_input_gives_errors() {
    let cfg = IronConfig {
        period: Duration::ZERO,
        early_drop_percent: None,
    };
    assert_eq!(
        CpuAccounts::new(Instant::ZERO, cfg).unwrap_err(),
        IronError::ZeroPeriod
    );
    let cfg = IronConfig {
        period: PERIOD,
        early_drop_percent: Some(101),
    };
    assert_eq!(
        CpuAccounts::new(Instant::ZERO, cfg).unwrap_err(),
        IronError::BadEarlyDropPercent(101)
    );
    let (mut a, _) = accounts(None);
    assert_eq!(a.add_tenant(Duration::ZERO), Err(IronError::ZeroQuota));
    assert_eq!(a.admit(at_ms(0), 5), Err(IronError::UnknownTenant(5)));
    let mut out = [0u64; 1];
    let packets = [BatchPacket {
        packets: 1,
        tenant: 0,
        bytes: 1,
    }; 2];
    let batch = BatchCost {
        total: ms(1),
        fixed_overhead: Duration::ZERO,
    };
    assert_eq!(
        split_batch_cost(batch, PacketCostModel::EVEN, &packets, &mut out),
        Err(IronError::OutputLengthMismatch {
            packets: 2,
            output: 1
        })
    );
}

#[test]
fn batch_split_follows_model() {
    let packets = [
        BatchPacket {
            packets: 1,
            tenant: 0,
            bytes: 100,
        },
        BatchPacket {
            packets: 1,
            tenant: 1,
            bytes: 300,
        },
    ];
    let batch = BatchCost {
        total: Duration::from_nanos(1_000),
        fixed_overhead: Duration::from_nanos(200),
    };
    let mut out = [0u64; 2];
    split_batch_cost(
        batch,
        PacketCostModel {
            per_packet: 0,
            per_byte: 1,
        },
        &packets,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [100 + 200, 100 + 600]);
}

proptest! {
    /// No nanosecond lost or created, and each share within 1 ns of fixed/n + variable*w/W
    /// for the fixed part and the proportional part each.
    #[test]
    fn batch_split_sums_exactly(
        total in 0u64..=u64::MAX,
        fixed in 0u64..=u64::MAX,
        per_packet in prop_oneof![0u64..1_000_000, Just(u64::MAX)],
        per_byte in prop_oneof![0u64..1_000, Just(u64::MAX)],
        sizes in prop::collection::vec(0u32..65_536, 1..64),
    ) {
        let packets: Vec<_> = sizes.iter().map(|&b| BatchPacket { packets: 1, tenant: 0, bytes: b as u64 }).collect();
        let model = PacketCostModel { per_packet, per_byte };
        let batch = BatchCost { total: Duration::from_nanos(total), fixed_overhead: Duration::from_nanos(fixed) };
        let mut out = vec![0u64; packets.len()];
        split_batch_cost(batch, model, &packets, &mut out).unwrap();
        let sum: u128 = out.iter().map(|&v| v as u128).sum();
        prop_assert_eq!(sum, total as u128);
        let n = packets.len() as f64;
        let fixed = fixed.min(total) as f64;
        let variable = total as f64 - fixed;
        let weights: Vec<f64> = sizes.iter().map(|&b| per_packet as f64 + per_byte as f64 * b as f64).collect();
        let w_sum: f64 = weights.iter().sum();
        for (share, w) in out.iter().zip(&weights) {
            let exact = fixed / n + if w_sum == 0.0 { variable / n } else { variable * w / w_sum };
            prop_assert!((*share as f64 - exact).abs() <= 2.0 + exact * 1e-9, "share {} exact {}", share, exact);
        }
    }
}

/// Live changes: a tenant's quota changes in place (debt kept, the new quota from then on)
/// and a removed tenant's index is unknown until a new tenant reuses it; the neighbour's
/// account is untouched throughout.
#[test]
fn quota_changes_in_place_and_removed_tenants_free_their_index() {
    let (mut a, t) = accounts(None);
    let n = a.add_tenant(QUOTA).unwrap();
    a.charge(at_ms(1), n, ms(4)).unwrap();
    a.charge(at_ms(1), t, ms(12)).unwrap();
    // t is 2 ms in debt; a 20 ms quota leaves it 8 ms this period.
    a.set_quota(at_ms(2), t, ms(20)).unwrap();
    assert_eq!(a.budget(at_ms(2), t).unwrap(), (ms(8), ms(0)));
    // Down to 5 ms: 8 - 15 = 7 ms of debt, throttled.
    a.set_quota(at_ms(3), t, ms(5)).unwrap();
    assert_eq!(a.budget(at_ms(3), t).unwrap(), (ms(0), ms(7)));
    assert!(a.exhausted(t));
    // Next period: 5 ms refill pays 5 of the 7 ms debt.
    assert_eq!(a.budget(at_ms(100), t).unwrap(), (ms(0), ms(2)));
    assert_eq!(a.set_quota(at_ms(100), t, ms(0)), Err(IronError::ZeroQuota));
    // The neighbour: its own quota, refilled.
    assert_eq!(a.budget(at_ms(100), n).unwrap(), (QUOTA, ms(0)));
    assert_eq!(a.stats(n).unwrap().charged_ns, 4_000_000);

    a.remove_tenant(t).unwrap();
    assert_eq!(a.tenant_count(), 1);
    assert_eq!(a.remove_tenant(t), Err(IronError::UnknownTenant(t)));
    assert_eq!(
        a.charge(at_ms(101), t, ms(1)),
        Err(IronError::UnknownTenant(t))
    );
    assert!(a.stats(t).is_err() && !a.exhausted(t));
    let batch = BatchCost {
        total: ms(1),
        fixed_overhead: ms(0),
    };
    let packets = [BatchPacket {
        tenant: t,
        packets: 1,
        bytes: 64,
    }];
    assert_eq!(
        a.charge_batch(at_ms(101), batch, PacketCostModel::EVEN, &packets),
        Err(IronError::UnknownTenant(t))
    );
    // A new tenant reuses the index with a fresh account.
    assert_eq!(a.add_tenant(ms(3)).unwrap(), t);
    assert_eq!(a.budget(at_ms(101), t).unwrap(), (ms(3), ms(0)));
    assert_eq!(a.stats(t).unwrap().charged_ns, 0);
    assert_eq!(a.budget(at_ms(101), n).unwrap(), (QUOTA, ms(0)));
}
