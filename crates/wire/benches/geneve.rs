//! Per-packet cost of the overlay: Geneve header parse+emit, encap and decap of small and
//! full-size frames, and tenant frame classification. Each has a baseline beside it (a bare
//! copy of the frame, etherparse's full slicing) to read the numbers against.
//!
//! Run: `cargo bench -p picnic-wire --bench geneve`

use std::net::Ipv4Addr;

use divan::{black_box, Bencher};
use picnic_wire::etherparse::{PacketBuilder, SlicedPacket};
use picnic_wire::{
    classify, decap, encap, FeedbackOption, GenevePacket, GeneveRepr, OuterHeaders, ENCAP_OVERHEAD,
};

fn main() {
    divan::main();
}

const FRAME_SIZES: [usize; 2] = [64, 1500];

fn geneve_with_feedback() -> GeneveRepr {
    GeneveRepr {
        feedback: Some(FeedbackOption {
            dst_endpoint: 17,
            rate_bps: 2_500_000_000,
            seq: 99,
        }),
        ..GeneveRepr::ethernet(0x00AB_CDEF)
    }
}

fn outer() -> OuterHeaders {
    OuterHeaders {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: Ipv4Addr::new(198, 18, 0, 1),
        dst_ip: Ipv4Addr::new(198, 18, 0, 2),
        src_port: 50_000,
        ttl: 64,
    }
}

/// A UDP/IPv4 tenant frame of exactly `size` bytes.
fn tenant_frame(size: usize) -> Vec<u8> {
    let payload = vec![0x5A; size - 14 - 20 - 8];
    let mut frame = Vec::with_capacity(size);
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 3], [2, 0, 0, 0, 0, 4])
        .ipv4([198, 18, 1, 1], [198, 18, 1, 2], 64)
        .udp(40_000, 7)
        .write(&mut frame, &payload)
        .unwrap();
    frame
}

#[divan::bench]
fn geneve_emit_parse_with_feedback(bencher: Bencher) {
    let repr = geneve_with_feedback();
    let mut buf = [0u8; 64];
    bencher.bench_local(|| {
        let len = black_box(&repr).emit(black_box(&mut buf[..])).unwrap();
        let packet = GenevePacket::new_checked(black_box(&buf[..len])).unwrap();
        GeneveRepr::parse(&packet).unwrap()
    });
}

#[divan::bench(args = FRAME_SIZES)]
fn encap_frame(bencher: Bencher, size: usize) {
    let inner = tenant_frame(size);
    let (outer, geneve) = (outer(), geneve_with_feedback());
    let mut out = vec![0u8; size + ENCAP_OVERHEAD];
    bencher.bench_local(|| {
        encap(
            black_box(&outer),
            black_box(&geneve),
            black_box(&inner),
            &mut out,
        )
        .unwrap()
    });
}

#[divan::bench(args = FRAME_SIZES)]
fn encap_baseline_copy_only(bencher: Bencher, size: usize) {
    let inner = tenant_frame(size);
    let mut out = vec![0u8; size + ENCAP_OVERHEAD];
    bencher.bench_local(|| {
        out[ENCAP_OVERHEAD..].copy_from_slice(black_box(&inner));
        black_box(&out);
    });
}

#[divan::bench(args = FRAME_SIZES)]
fn decap_frame(bencher: Bencher, size: usize) {
    let inner = tenant_frame(size);
    let mut out = vec![0u8; size + ENCAP_OVERHEAD];
    let len = encap(&outer(), &geneve_with_feedback(), &inner, &mut out).unwrap();
    let frame = &out[..len];
    bencher.bench_local(|| decap(black_box(frame)).unwrap());
}

#[divan::bench]
fn classify_udp_ipv4(bencher: Bencher) {
    let frame = tenant_frame(64);
    bencher.bench_local(|| classify(black_box(&frame)).unwrap());
}

#[divan::bench]
fn classify_baseline_etherparse_sliced_packet(bencher: Bencher) {
    let frame = tenant_frame(64);
    bencher.bench_local(|| SlicedPacket::from_ethernet(black_box(&frame)).unwrap());
}
