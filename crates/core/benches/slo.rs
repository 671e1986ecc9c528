//! Per-packet cost of feeding an SloMonitor (it sits on the switch's delivery path).
//! Run: cargo bench -p picnic-core --bench slo

use divan::{black_box, Bencher};
use picnic_core::slo::{Slo, SloMonitor, SloMonitorConfig};
use picnic_core::{Duration, Instant};

fn main() {
    divan::main();
}

const PACKETS: u64 = 100_000;
/// 1 us between packets, so 100 ms windows close every 100,000 packets.
const GAP: Duration = Duration::from_micros(1);

fn full_slo() -> Slo {
    Slo {
        min_bps: 10_000_000,
        max_bps: Some(1_000_000_000),
        latency_us: Some(100),
        max_loss: Some(0.001),
        ..Slo::default()
    }
}

/// Offered + delivered per packet: the bandwidth and loss path.
#[divan::bench]
fn offered_and_delivered_per_packet(bencher: Bencher) {
    let mut m = SloMonitor::new(full_slo(), SloMonitorConfig::default(), Instant::ZERO).unwrap();
    let mut now = Instant::ZERO;
    bencher
        .counter(divan::counter::ItemsCount::new(PACKETS))
        .bench_local(|| {
            for _ in 0..PACKETS {
                now += GAP;
                m.record_offered(now, black_box(1_500));
                m.record_delivered(now, 1, black_box(1_500));
            }
        });
}

/// One latency sample per packet, with a latency bound set.
#[divan::bench]
fn latency_per_packet(bencher: Bencher) {
    let mut m = SloMonitor::new(full_slo(), SloMonitorConfig::default(), Instant::ZERO).unwrap();
    let mut now = Instant::ZERO;
    let mut latency = 40_000u64;
    bencher
        .counter(divan::counter::ItemsCount::new(PACKETS))
        .bench_local(|| {
            for _ in 0..PACKETS {
                now += GAP;
                latency = (latency * 7 + 13) % 200_000;
                m.record_latency(now, black_box(latency));
            }
        });
}
