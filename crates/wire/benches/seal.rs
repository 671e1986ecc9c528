//! Per-packet cost of sealing and opening a tunnel packet (AES-GCM, `picnic_wire::seal`) at
//! 64 and 1500 bytes of inner frame, AES-128 and AES-256, beside a bare copy of the frame.
//!
//! Run: `cargo bench -p picnic-wire --bench seal`

use std::net::Ipv4Addr;

use divan::{black_box, Bencher};
use picnic_wire::seal::{open_in_place, seal_in_place, SealHeader, TunnelKey, SEAL_OVERHEAD};
use picnic_wire::{encap, GeneveRepr, OuterHeaders};

fn main() {
    divan::main();
}

const FRAME_SIZES: [usize; 2] = [64, 1500];
const KEY_BYTES: [usize; 2] = [16, 32];

fn plain(inner: usize) -> (Vec<u8>, usize) {
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: Ipv4Addr::new(198, 18, 0, 1),
        dst_ip: Ipv4Addr::new(198, 18, 0, 2),
        src_port: 50_000,
        ttl: 64,
    };
    let mut buf = vec![0u8; inner + 128];
    let len = encap(
        &outer,
        &GeneveRepr::ethernet(7),
        &vec![0x5A; inner],
        &mut buf,
    )
    .unwrap();
    (buf, len)
}

/// Copying the plain packet back into the buffer: the floor every other bench includes.
#[divan::bench(args = FRAME_SIZES)]
fn copy_only(bencher: Bencher, size: usize) {
    let (plain, len) = plain(size);
    let mut buf = plain.clone();
    bencher.bench_local(|| {
        buf[..len].copy_from_slice(&plain[..len]);
        black_box(&mut buf);
    });
}

#[divan::bench(args = FRAME_SIZES, consts = KEY_BYTES)]
fn seal<const KEY: usize>(bencher: Bencher, size: usize) {
    let key = TunnelKey::new(&[0x42; KEY]).unwrap();
    let (plain, len) = plain(size);
    let mut buf = plain.clone();
    let mut counter = 0;
    bencher.bench_local(|| {
        buf[..len].copy_from_slice(&plain[..len]);
        counter += 1;
        black_box(seal_in_place(&mut buf, len, &key, SealHeader::new(1, 1, counter)).unwrap())
    });
}

#[divan::bench(args = FRAME_SIZES, consts = KEY_BYTES)]
fn open<const KEY: usize>(bencher: Bencher, size: usize) {
    let key = TunnelKey::new(&[0x42; KEY]).unwrap();
    let (mut sealed, len) = plain(size);
    let n = seal_in_place(&mut sealed, len, &key, SealHeader::new(1, 1, 1)).unwrap();
    assert_eq!(n, len + SEAL_OVERHEAD);
    let mut buf = sealed.clone();
    bencher.bench_local(|| {
        buf[..n].copy_from_slice(&sealed[..n]);
        black_box(open_in_place(&mut buf, n, |_| Some(&key)).unwrap())
    });
}
