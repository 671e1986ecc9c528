//! Cost of finishing a VM's transmit offloads in software: completing the partial checksum
//! of a 1500 B frame, and segmenting a 64 KiB TSO super-frame into 1448-byte segments (45
//! segments: copy, header fix-up, full TCP checksum each). A bare copy of the same bytes is
//! the baseline.
//!
//! Run: `cargo bench -p picnic-wire --bench offload`

use divan::{black_box, Bencher};
use picnic_wire::etherparse::PacketBuilder;
use picnic_wire::offload::{complete_checksum, GsoType, Segmenter, VnetHdr};

fn main() {
    divan::main();
}

fn tcp_frame(payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
        .tcp(40000, 5201, 1, 512)
        .write(&mut out, &vec![0x5a; payload])
        .unwrap();
    out
}

#[divan::bench]
fn complete_checksum_1500(bencher: Bencher) {
    let mut frame = tcp_frame(1500 - 54);
    bencher.bench_local(|| complete_checksum(black_box(&mut frame), 34, 16).unwrap());
}

#[divan::bench]
fn copy_1500_baseline(bencher: Bencher) {
    let frame = tcp_frame(1500 - 54);
    let mut out = vec![0u8; 2048];
    bencher.bench_local(|| out[..frame.len()].copy_from_slice(black_box(&frame)));
}

/// 65,160 payload bytes (45 x 1448), segmented into 1,502-byte frames.
#[divan::bench]
fn segment_64k_tso(bencher: Bencher) {
    let frame = tcp_frame(45 * 1448);
    let hdr = VnetHdr {
        needs_csum: true,
        gso: GsoType::TcpV4,
        gso_size: 1448,
        ..VnetHdr::NONE
    };
    let mut out = vec![0u8; 2048];
    bencher.bench_local(|| {
        let mut s = Segmenter::new(black_box(&frame), &hdr, 1514).unwrap();
        while let Some(n) = s.next_into(&frame, &mut out).unwrap() {
            black_box(&out[..n]);
        }
    });
}

#[divan::bench]
fn copy_64k_baseline(bencher: Bencher) {
    let frame = tcp_frame(45 * 1448);
    let mut out = vec![0u8; 2048];
    bencher.bench_local(|| {
        for chunk in black_box(&frame).chunks(1448) {
            out[..chunk.len()].copy_from_slice(chunk);
            black_box(&out[..chunk.len()]);
        }
    });
}
