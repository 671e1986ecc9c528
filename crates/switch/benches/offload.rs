//! Per-frame cost of the offload hook (`picnic_switch::offload::Program::run`): the example
//! ACL and flow counter (examples/offload/), an empty program (the floor: the call through
//! the interpreter), and the two hostile programs of scenarios/offload-hog.toml, a trap and
//! a loop stopped at its packet's fuel. The fuel each is charged per frame is printed first.
//!
//! Run: `cargo bench -p picnic-switch --bench offload`.

use divan::{black_box, Bencher};
use picnic_core::Instant;
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::offload::{engine, Hook, Limits, Program, DEFAULT_PS_PER_FUEL};

fn main() {
    // The fuel each program is charged per frame (the table in docs/BENCHMARKS.md).
    for (name, wat, hook) in [
        ("empty", EMPTY, Hook::Egress),
        ("acl", ACL, Hook::Egress),
        ("flow_counter", COUNTER, Hook::Ingress),
        ("trap", TRAP, Hook::Egress),
        ("loop_to_packet_fuel", LOOP, Hook::Egress),
    ] {
        let mut p = program(wat);
        let mut pool = FramePool::new(1);
        let frame = udp_frame(&mut pool, 5000);
        let _ = p.run(Instant::ZERO, hook, frame, &mut Vec::new());
        println!("{name}: {} fuel charged per frame", p.stats().fuel);
    }
    divan::main();
}

const ACL: &str = include_str!("../../../examples/offload/acl.wat");
const COUNTER: &str = include_str!("../../../examples/offload/flow-counter.wat");
const EMPTY: &str = r#"(module (func (export "egress") (param i32) (result i32) (i32.const 0)))"#;
const TRAP: &str = r#"(module (func (export "egress") (param i32) (result i32) unreachable))"#;
const LOOP: &str =
    r#"(module (func (export "egress") (param i32) (result i32) (loop (br 0)) (i32.const 0)))"#;

/// A 64 B UDP/IPv4 frame from 198.18.0.1:40000 to 198.18.0.2:<port>.
fn udp_frame(pool: &mut FramePool, port: u16) -> Frame {
    let mut bytes = vec![0u8; 64];
    bytes[12..14].copy_from_slice(&[0x08, 0x00]);
    bytes[14] = 0x45;
    bytes[16..18].copy_from_slice(&50u16.to_be_bytes());
    bytes[22] = 64;
    bytes[23] = 17;
    bytes[26..30].copy_from_slice(&[198, 18, 0, 1]);
    bytes[30..34].copy_from_slice(&[198, 18, 0, 2]);
    bytes[34..36].copy_from_slice(&40000u16.to_be_bytes());
    bytes[36..38].copy_from_slice(&port.to_be_bytes());
    let mut frame = pool.get().expect("a frame");
    assert!(frame.fill_from(&bytes));
    frame
}

fn program(wat: &str) -> Program {
    let limits = Limits {
        fuel_per_packet: 20_000,
        fuel_per_period: u64::MAX / 2,
        memory_bytes: 1 << 20,
    };
    Program::load(
        &engine(),
        wat.as_bytes(),
        limits,
        DEFAULT_PS_PER_FUEL,
        Instant::ZERO,
    )
    .expect("the program loads")
}

fn bench(bencher: Bencher, wat: &str, hook: Hook) {
    let mut p = program(wat);
    let mut pool = FramePool::new(1);
    let mut frame = Some(udp_frame(&mut pool, 5000));
    let mut emitted = Vec::new();
    bencher.bench_local(|| {
        let (f, verdict, cpu) = p.run(Instant::ZERO, hook, frame.take().unwrap(), &mut emitted);
        frame = Some(f);
        black_box((verdict, cpu))
    });
}

#[divan::bench]
fn empty(bencher: Bencher) {
    bench(bencher, EMPTY, Hook::Egress);
}

#[divan::bench]
fn acl(bencher: Bencher) {
    bench(bencher, ACL, Hook::Egress);
}

#[divan::bench]
fn flow_counter(bencher: Bencher) {
    bench(bencher, COUNTER, Hook::Ingress);
}

#[divan::bench]
fn trap(bencher: Bencher) {
    bench(bencher, TRAP, Hook::Egress);
}

#[divan::bench]
fn loop_to_packet_fuel(bencher: Bencher) {
    bench(bencher, LOOP, Hook::Egress);
}
