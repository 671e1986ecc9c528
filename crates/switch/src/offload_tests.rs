//! The sandbox: the example programs, and hostile ones (a loop, a trap, a memory hog, a
//! program reaching for other imports) stopped with their reason while the program and its
//! neighbours go on.

use etherparse::PacketBuilder;

use super::*;
use crate::frame::FramePool;

const ACL: &str = include_str!("../../../examples/offload/acl.wat");
const FLOW_COUNTER: &str = include_str!("../../../examples/offload/flow-counter.wat");

const LIMITS: Limits = Limits {
    fuel_per_packet: 10_000,
    fuel_per_period: 1_000_000,
    memory_bytes: 1 << 20,
};

fn load(code: &str, limits: Limits) -> anyhow::Result<Program> {
    Program::load(&engine(), code.as_bytes(), limits, 1000, Instant::ZERO)
}

/// A tenant frame to `dst` port `port`, UDP or TCP.
fn frame(pool: &mut FramePool, dst: [u8; 4], port: u16, tcp: bool) -> Frame {
    let ip = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(
        [198, 18, 0, 1],
        dst,
        64,
    );
    let mut bytes = Vec::new();
    if tcp {
        ip.tcp(40000, port, 1, 1000)
            .write(&mut bytes, &[7; 32])
            .unwrap();
    } else {
        ip.udp(40000, port).write(&mut bytes, &[7; 32]).unwrap();
    }
    let mut f = pool.get().unwrap();
    assert!(f.fill_from(&bytes));
    f
}

fn run(p: &mut Program, now: Instant, hook: Hook, f: Frame) -> (Frame, Verdict, u64) {
    p.run(now, hook, f, &mut Vec::new())
}

#[test]
fn the_acl_drops_ssh_and_the_blocked_subnet() {
    let mut pool = FramePool::new(4);
    let mut acl = load(ACL, LIMITS).unwrap();
    assert!(acl.has(Hook::Egress) && !acl.has(Hook::Ingress));
    let cases = [
        (
            [198, 18, 0, 2],
            22,
            true,
            Verdict::Drop(DropReason::OffloadDrop),
        ),
        (
            [198, 18, 0, 2],
            22,
            false,
            Verdict::Drop(DropReason::OffloadDrop),
        ),
        ([198, 18, 0, 2], 80, true, Verdict::Pass),
        (
            [198, 18, 99, 7],
            80,
            false,
            Verdict::Drop(DropReason::OffloadDrop),
        ),
        ([198, 18, 98, 7], 80, false, Verdict::Pass),
    ];
    for (dst, port, tcp, want) in cases {
        let f = frame(&mut pool, dst, port, tcp);
        let before = f.data().to_vec();
        let (f, verdict, cpu_ns) = run(&mut acl, Instant::ZERO, Hook::Egress, f);
        assert_eq!(verdict, want, "{dst:?}:{port} tcp {tcp}");
        assert_eq!(f.data(), &before[..], "the ACL does not modify frames");
        assert!(cpu_ns > 0);
        pool.put(f);
    }
    // No ingress hook: frames pass untouched and uncharged.
    let (f, verdict, cpu_ns) = run(
        &mut acl,
        Instant::ZERO,
        Hook::Ingress,
        frame(&mut pool, [198, 18, 0, 2], 22, true),
    );
    assert_eq!((verdict, cpu_ns), (Verdict::Pass, 0));
    pool.put(f);
    let s = acl.stats();
    assert_eq!((s.runs, s.dropped), (5, 3));
    assert_eq!(s.counters, vec![(0, 2), (1, 3)]);
    assert_eq!(s.cpu_ns, s.fuel);
}

#[test]
fn the_flow_counter_gives_each_flow_a_slot() {
    let mut pool = FramePool::new(4);
    let mut counter = load(FLOW_COUNTER, LIMITS).unwrap();
    let flows = [
        (80, true),
        (80, false),
        (443, true),
        (80, true),
        (80, true),
        (443, true),
    ];
    for (port, tcp) in flows {
        let f = frame(&mut pool, [198, 18, 0, 2], port, tcp);
        let (f, verdict, _) = run(&mut counter, Instant::ZERO, Hook::Ingress, f);
        assert_eq!(verdict, Verdict::Pass);
        pool.put(f);
    }
    assert_eq!(counter.stats().counters, vec![(0, 3), (1, 1), (2, 2)]);
    // Past 63 flows, the overflow slot.
    for port in 1000..1070 {
        let f = frame(&mut pool, [198, 18, 0, 2], port, false);
        let (f, _, _) = run(&mut counter, Instant::ZERO, Hook::Ingress, f);
        pool.put(f);
    }
    let s = counter.stats();
    assert_eq!(s.counters.len(), 64);
    assert_eq!(s.counters[63], (63, 70 - 60));
    assert_eq!(s.traps + s.out_of_fuel, 0, "{s:?}");
}

const LOOP_ON_UDP: &str = r#"(module
  (import "picnic" "load" (func $load (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; Loops forever on UDP frames, passes the others.
  (func (export "egress") (param i32) (result i32)
    (drop (call $load (i32.const 23) (i32.const 0) (i32.const 1)))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 17))
      (then (loop (br 0))))
    (i32.const 0)))"#;

#[test]
fn a_loop_is_stopped_at_its_fuel_and_the_period_budget_caps_the_tenant() {
    let mut pool = FramePool::new(4);
    let limits = Limits {
        fuel_per_packet: 10_000,
        fuel_per_period: 35_000,
        memory_bytes: 65536,
    };
    let mut p = load(LOOP_ON_UDP, limits).unwrap();
    let now = Instant::ZERO + Duration::from_millis(1);
    // A looping run is stopped at its packet's fuel, charged for it, and its frame dropped;
    // the frame comes back as it was.
    let f = frame(&mut pool, [198, 18, 0, 2], 9, false);
    let before = f.data().to_vec();
    let (f, verdict, cpu_ns) = run(&mut p, now, Hook::Egress, f);
    assert_eq!(verdict, Verdict::Drop(DropReason::OffloadFuel));
    assert_eq!(f.data(), &before[..]);
    assert_eq!(
        cpu_ns,
        10_000 + CALL_FUEL,
        "charged the whole packet's fuel and the call (1 ns per fuel here)"
    );
    pool.put(f);
    // The program stays attached: a TCP frame passes.
    let (f, verdict, _) = run(
        &mut p,
        now,
        Hook::Egress,
        frame(&mut pool, [198, 18, 0, 2], 9, true),
    );
    assert_eq!(verdict, Verdict::Pass);
    pool.put(f);
    // Two more loops, the third gets what is left of the period and is stopped by it;
    // then frames are dropped without running until the next period.
    let mut reasons = Vec::new();
    for _ in 0..4 {
        let (f, verdict, _) = run(
            &mut p,
            now,
            Hook::Egress,
            frame(&mut pool, [198, 18, 0, 2], 9, false),
        );
        reasons.push(verdict);
        pool.put(f);
    }
    use DropReason::{OffloadBudget, OffloadFuel};
    assert_eq!(
        reasons,
        [OffloadFuel, OffloadFuel, OffloadBudget, OffloadBudget].map(Verdict::Drop)
    );
    let (f, _, cpu_ns) = run(
        &mut p,
        now,
        Hook::Egress,
        frame(&mut pool, [198, 18, 0, 2], 9, true),
    );
    assert_eq!(cpu_ns, 0, "nothing runs once the period's fuel is spent");
    pool.put(f);
    // Spent: the switch holds the tenant's ports until the next period.
    assert_eq!(p.spent_until(now), Some(Instant::ZERO + PERIOD));
    assert_eq!(p.spent_until(Instant::ZERO + PERIOD), None);
    let s = p.stats();
    assert!(s.fuel <= limits.fuel_per_period, "{s:?}");
    assert_eq!((s.out_of_fuel, s.out_of_budget), (3, 3));
    // The next period refills the budget.
    let later = now + PERIOD;
    let (f, verdict, _) = run(
        &mut p,
        later,
        Hook::Egress,
        frame(&mut pool, [198, 18, 0, 2], 9, true),
    );
    assert_eq!(verdict, Verdict::Pass);
    pool.put(f);
}

#[test]
fn traps_and_memory_hogs_are_stopped_and_the_program_goes_on() {
    let mut pool = FramePool::new(4);
    // Traps (unreachable) on frames longer than 80 bytes; grows memory without end on
    // ingress.
    let code = r#"(module
      (memory (export "memory") 1)
      (func (export "egress") (param $len i32) (result i32)
        (if (i32.gt_u (local.get $len) (i32.const 80)) (then unreachable))
        (i32.const 0))
      (func (export "ingress") (param i32) (result i32)
        (loop (drop (memory.grow (i32.const 1))) (br 0))
        (i32.const 0)))"#;
    let mut p = load(
        code,
        Limits {
            memory_bytes: 4 * 65536,
            ..LIMITS
        },
    )
    .unwrap();
    let long = frame(&mut pool, [198, 18, 0, 2], 9, true);
    assert!(long.len() > 80);
    let (f, verdict, _) = run(&mut p, Instant::ZERO, Hook::Egress, long);
    assert_eq!(verdict, Verdict::Drop(DropReason::OffloadTrap));
    f_short_passes(&mut p, f);
    let (f, verdict, _) = run(&mut p, Instant::ZERO, Hook::Ingress, pool.get().unwrap());
    assert_eq!(verdict, Verdict::Drop(DropReason::OffloadMemory));
    pool.put(f);
    let s = p.stats();
    assert_eq!((s.traps, s.memory_faults, s.runs), (1, 1, 3));
    // Each fault counted a whole packet's fuel against the period, the passing run its own.
    let left = LIMITS.fuel_per_period - 2 * LIMITS.fuel_per_packet;
    assert!(
        (left - 100..left).contains(&p.period_fuel),
        "{} fuel left of the period",
        p.period_fuel
    );
    assert!(
        s.fuel < 2 * LIMITS.fuel_per_packet,
        "{s:?}: the CPU charged is what ran"
    );

    fn f_short_passes(p: &mut Program, mut f: Frame) {
        f.set_len(60);
        let (_, verdict, _) = run(p, Instant::ZERO, Hook::Egress, f);
        assert_eq!(verdict, Verdict::Pass);
    }
}

#[test]
fn a_program_trapping_on_every_frame_spends_its_period_like_a_loop() {
    let mut pool = FramePool::new(2);
    let limits = Limits {
        fuel_per_packet: 10_000,
        fuel_per_period: 50_000,
        memory_bytes: 65536,
    };
    let mut p = load(
        r#"(module (func (export "egress") (param i32) (result i32) unreachable))"#,
        limits,
    )
    .unwrap();
    let now = Instant::ZERO + Duration::from_millis(3);
    let mut traps = 0;
    while p.spent_until(now).is_none() {
        let (f, verdict, cpu_ns) = run(&mut p, now, Hook::Egress, pool.get().unwrap());
        assert_eq!(verdict, Verdict::Drop(DropReason::OffloadTrap));
        assert!(
            cpu_ns < 100,
            "charged {cpu_ns} ns of CPU: what ran, not the penalty"
        );
        pool.put(f);
        traps += 1;
        assert!(traps <= 5, "still running after {traps} traps");
    }
    assert_eq!(traps, 5, "the period holds 5 packets' fuel");
    assert_eq!(p.spent_until(now), Some(Instant::ZERO + PERIOD));
}

#[test]
fn programs_modify_frames_and_emit_within_bounds() {
    let mut pool = FramePool::new(4);
    // Swaps the MAC addresses, grows the frame by 4 (zeroed) bytes, emits a copy of its
    // first 60 bytes, and tries out-of-range accesses (refused with -1, counted in slot 9).
    let code = r#"(module
      (import "picnic" "load" (func $load (param i32 i32 i32) (result i32)))
      (import "picnic" "store" (func $store (param i32 i32 i32) (result i32)))
      (import "picnic" "set_len" (func $set_len (param i32) (result i32)))
      (import "picnic" "frame_len" (func $frame_len (result i32)))
      (import "picnic" "emit" (func $emit (param i32 i32) (result i32)))
      (import "picnic" "count" (func $count (param i32 i64)))
      (memory (export "memory") 1)
      (func $refused (param i32) (if (i32.eq (local.get 0) (i32.const -1))
        (then (call $count (i32.const 9) (i64.const 1)))))
      (func (export "egress") (param $len i32) (result i32)
        (drop (call $load (i32.const 0) (i32.const 100) (i32.const 6)))
        (drop (call $load (i32.const 6) (i32.const 0) (i32.const 6)))
        (drop (call $store (i32.const 0) (i32.const 0) (i32.const 6)))
        (drop (call $store (i32.const 6) (i32.const 100) (i32.const 6)))
        (drop (call $set_len (i32.add (call $frame_len) (i32.const 4))))
        (drop (call $load (i32.const 0) (i32.const 200) (i32.const 60)))
        (drop (call $emit (i32.const 200) (i32.const 60)))
        (call $refused (call $load (local.get $len) (i32.const 0) (i32.const 5)))
        (call $refused (call $load (i32.const 0) (i32.const 65534) (i32.const 4)))
        (call $refused (call $store (i32.const -1) (i32.const 0) (i32.const 1)))
        (call $refused (call $set_len (i32.const 5000)))
        (call $refused (call $emit (i32.const 0) (i32.const 3)))
        (i32.const 0)))"#;
    let mut p = load(code, LIMITS).unwrap();
    let mut f = frame(&mut pool, [198, 18, 0, 2], 9, false);
    let before = f.data().to_vec();
    // Stale bytes past the frame must not reach the program.
    let len = f.len();
    f.data_and_tail_mut()[len..len + 4].fill(0xEE);
    let mut emitted = Vec::new();
    let (f, verdict, _) = p.run(Instant::ZERO, Hook::Egress, f, &mut emitted);
    assert_eq!(verdict, Verdict::Pass);
    assert_eq!(f.len(), before.len() + 4);
    assert_eq!(&f.data()[..6], &before[6..12]);
    assert_eq!(&f.data()[6..12], &before[..6]);
    assert_eq!(&f.data()[12..before.len()], &before[12..]);
    assert_eq!(&f.data()[before.len()..], &[0; 4]);
    assert_eq!(emitted, vec![f.data()[..60].to_vec()]);
    let s = p.stats();
    assert_eq!((s.emitted, s.counters.clone()), (1, vec![(9, 5)]));
}

#[test]
fn programs_that_reach_beyond_the_sandbox_are_refused() {
    let refused = [
        // Another import than the host API.
        r#"(module (import "wasi_snapshot_preview1" "fd_write"
              (func (param i32 i32 i32 i32) (result i32)))
            (func (export "egress") (param i32) (result i32) (i32.const 0)))"#,
        // No hook.
        r#"(module (func (export "main")))"#,
        // A hook of the wrong type.
        r#"(module (func (export "egress") (param i64) (result i32) (i32.const 0)))"#,
        // More memory than allowed (1 MiB: 17 pages).
        r#"(module (memory 17) (func (export "egress") (param i32) (result i32) (i32.const 0)))"#,
        // A start function that never ends.
        r#"(module (func $s (loop (br 0))) (start $s)
            (func (export "egress") (param i32) (result i32) (i32.const 0)))"#,
        // Not WebAssembly.
        "(module",
    ];
    for code in refused {
        assert!(load(code, LIMITS).is_err(), "loaded: {code}");
    }
}

#[test]
fn the_calibration_measures_a_plausible_speed() {
    let ps = calibrate();
    // An interpreter runs a fuel unit (an instruction) in between 0.05 and 100 ns.
    assert!((50..=100_000).contains(&ps), "{ps} ps per fuel");
}
