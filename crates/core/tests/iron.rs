//! Iron's batch cost splitting (Iron 3.1): shares that follow the cost model and sum to the
//! measured cost exactly, and errors for bad input. The per-tenant accounts (Iron 3.2) are
//! tested beside their code, in `picnic_core::iron::shared`.

use picnic_core::iron::{split_batch_cost, BatchCost, BatchPacket, IronError, PacketCostModel};
use picnic_core::Duration;
use proptest::prelude::*;

#[test]
fn bad_input_gives_errors() {
    let mut out = [0u64; 1];
    let packets = [BatchPacket {
        packets: 1,
        tenant: 0,
        bytes: 1,
    }; 2];
    let batch = BatchCost {
        total: Duration::from_millis(1),
        fixed_overhead: Duration::ZERO,
    };
    assert_eq!(
        split_batch_cost(batch, PacketCostModel::EVEN, &packets, &mut out),
        Err(IronError::OutputLengthMismatch {
            packets: 2,
            output: 1
        })
    );
    assert_eq!(
        split_batch_cost(batch, PacketCostModel::EVEN, &[], &mut []),
        Err(IronError::EmptyBatch)
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
