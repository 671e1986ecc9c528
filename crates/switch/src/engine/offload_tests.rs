//! Offload programs in the engines: tenant `a` attaches a hostile program, tenant `b` the
//! example ACL and flow counter; `a`'s frames are stopped with their reason and charged to
//! it, `b`'s go on as before.

use picnic_core::{Duration, Instant};

use super::tests::{carry, udp, Host, A1, A2, B1, B2, IP_A1, IP_A2, IP_B1, IP_B2, TWO_HOSTS};
use crate::config::Config;
use crate::stats::DropReason;

/// Loops on frames to UDP port 9, traps on port 10, grows its memory without end on port
/// 11, passes the rest.
const HOSTILE: &str = r#"
(module
  (import "picnic" "load" (func $load (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "egress") (param i32) (result i32)
    (drop (call $load (i32.const 36) (i32.const 0) (i32.const 2)))
    (if (i32.eq (i32.load8_u (i32.const 1)) (i32.const 9)) (then (loop (br 0))))
    (if (i32.eq (i32.load8_u (i32.const 1)) (i32.const 10)) (then unreachable))
    (if (i32.eq (i32.load8_u (i32.const 1)) (i32.const 11))
      (then (loop (drop (memory.grow (i32.const 1))) (br 0))))
    (i32.const 0)))"#;

fn host(id: u32) -> Host {
    host_with(id, "fuel_per_packet = 5000")
}

/// Host `id`; on host 1 tenant `a` runs [`HOSTILE`] with these offload settings.
fn host_with(id: u32, a_settings: &str) -> Host {
    let acl = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/offload/acl.wat"
    );
    let counter = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/offload/flow-counter.wat"
    );
    let port = |h: u32, name: &str| {
        if h == id {
            format!("port = {{ ifname = \"{name}\" }}")
        } else {
            String::new()
        }
    };
    // Host 1 runs a's hostile program and b's ACL, host 2 b's flow counter.
    let (a, b) = if id == 1 {
        (
            format!("[tenants.offload]\nwat = '''{HOSTILE}'''\n{a_settings}"),
            format!("[tenants.offload]\nprogram = \"{acl}\""),
        )
    } else {
        (
            String::new(),
            format!("[tenants.offload]\nprogram = \"{counter}\""),
        )
    };
    let text = TWO_HOSTS
        .replace(
            "name = \"a\"\nvni = 100",
            &format!("name = \"a\"\nvni = 100\n{a}"),
        )
        .replace(
            "name = \"b\"\nvni = 200",
            &format!("name = \"b\"\nvni = 200\n{b}"),
        )
        .replace("HOST", &id.to_string())
        .replace("CAPACITY", "1000")
        .replace("PORT1A", &port(1, "a1"))
        .replace("PORT1B", &port(1, "b1"))
        .replace("PORT2A", &port(2, "a2"))
        .replace("PORT2B", &port(2, "b2"));
    let cfg = Config::parse(&text).unwrap();
    let mut h = Host::new(id, 1000);
    h.engine = super::Engine::new(&cfg, Instant::ZERO).unwrap();
    h
}

#[test]
fn a_hostile_program_is_stopped_and_its_neighbour_sees_nothing() {
    let (mut h1, mut h2) = (host(1), host(2));
    assert!(h1.engine.has_offloads() && h2.engine.has_offloads());
    let t = Instant::ZERO;
    let (a1, b1) = (h1.port_of("a1"), h1.port_of("b1"));
    for i in 0..30 {
        // a: a loop, a trap, a frame that passes.
        let dport = [9, 10, 7][i % 3];
        h1.inject(t, a1, &udp(A1, A2, IP_A1, IP_A2, dport, 100));
        // b: allowed to ports 7 and 8, denied to 22 by its ACL.
        let dport = [7, 8, 22][i % 3];
        h1.inject(t, b1, &udp(B1, B2, IP_B1, IP_B2, dport, 100));
    }
    h1.poll(t);
    assert_eq!(
        carry(&mut h1, &mut h2, t),
        30,
        "a's 10 and b's 20 frames that pass"
    );
    h2.poll(t);
    assert_eq!(h2.take(h2.port_of("a2")).len(), 10);
    assert_eq!(h2.take(h2.port_of("b2")).len(), 20);
    assert_eq!(h1.drops("a1", DropReason::OffloadFuel), 10);
    assert_eq!(h1.drops("a1", DropReason::OffloadTrap), 10);
    assert_eq!(h1.drops("b1", DropReason::OffloadDrop), 10);
    for r in DropReason::ALL {
        if r != DropReason::OffloadDrop {
            assert_eq!(h1.drops("b1", r), 0, "{r:?}");
        }
    }
    let snap = h1.engine.snapshot();
    let a = snap.tenants[0].offload.as_ref().unwrap();
    let b = snap.tenants[1].offload.as_ref().unwrap();
    assert_eq!((a.runs, a.out_of_fuel, a.traps), (30, 10, 10));
    assert_eq!(b.counters, vec![(0, 20), (1, 10)]);
    // b's flow counter on host 2 saw its two flows.
    let b2 = h2.engine.snapshot().tenants[1].offload.clone().unwrap();
    assert_eq!(b2.counters, vec![(0, 10), (1, 10)]);
    // The loops' fuel is charged to a: at least 10 x 5000 fuel, over b's ACL's charge.
    let (a_cpu, b_cpu) = (a.cpu_ns, b.cpu_ns);
    assert!(a_cpu >= 10 * 5000 * crate::offload::DEFAULT_PS_PER_FUEL / 1000);
    assert!(a_cpu > 10 * b_cpu, "a {a_cpu} ns, b {b_cpu} ns");
    // The runs' CPU goes to the VMs whose frames they were, as measured per frame.
    h1.engine.charge_cpu(t, a_cpu + b_cpu);
    let cost = |h: &Host, vm: &str| {
        let i = h.engine.dir.vms.iter().position(|v| v.name == vm).unwrap();
        h.engine.vm_counters[i].cost_ns
    };
    assert_eq!((cost(&h1, "a1"), cost(&h1, "b1")), (a_cpu, b_cpu));
}

#[test]
fn a_program_that_does_not_load_fails_the_config() {
    let text = TWO_HOSTS
        .replace(
            "name = \"a\"\nvni = 100",
            "name = \"a\"\nvni = 100\n[tenants.offload]\nwat = '(module (import \"env\" \"f\" (func)) (func (export \"egress\") (param i32) (result i32) (i32.const 0)))'",
        )
        .replace("HOST", "1")
        .replace("CAPACITY", "1000")
        .replace("PORT1A", "port = { ifname = \"a1\" }")
        .replace("PORT1B", "port = { ifname = \"b1\" }")
        .replace("PORT2A", "")
        .replace("PORT2B", "");
    let cfg = Config::parse(&text).unwrap();
    let e = super::Engine::new(&cfg, Instant::ZERO).err().unwrap();
    assert!(e.to_string().contains("tenant 'a'"), "{e}");
    // Both a file and text, or neither, is a config error naming the field.
    let both = text.replace(
        "[tenants.offload]\n",
        "[tenants.offload]\nprogram = \"x.wat\"\n",
    );
    let e = Config::parse(&both).err().unwrap();
    assert!(e.to_string().contains("tenants[0].offload.program"), "{e}");
}

/// A flood of hostile frames (loops, traps, memory grows) from `a1`, read as a run loop
/// reads (only while `rx_ready`), beside `b`'s steady traffic: once `a`'s period fuel is
/// spent its port is not read until the next period, so the switch reads a few of its
/// frames a period, drops each with its reason, and delivers every frame of `b`.
#[test]
fn a_hostile_flood_is_held_and_the_neighbour_loses_nothing() {
    let settings = "fuel_per_packet = 5000\nfuel_per_period = 20000\nmemory_kib = 256";
    let (mut h1, mut h2) = (host_with(1, settings), host(2));
    let (a1, b1, b2) = (h1.port_of("a1"), h1.port_of("b1"), h2.port_of("b2"));
    let (batch, steps, step) = (8, 500u64, Duration::from_micros(100));
    let (mut read, mut held, mut b_sent, mut b_delivered) = (0, 0, 0, 0);
    for i in 0..steps {
        let t = Instant::ZERO + Duration::from_nanos(step.as_nanos() * i);
        if h1.engine.rx_ready(t, a1, 64) {
            for k in 0..batch {
                let dport = [9, 10, 11][(i as usize + k) % 3];
                h1.inject(t, a1, &udp(A1, A2, IP_A1, IP_A2, dport, 100));
            }
            read += batch;
        } else {
            // Held: the loop wakes by the next period, when the budget is back.
            let period = 10_000_000;
            let next = Instant::from_nanos((t.as_nanos() / period + 1) * period);
            assert!(h1.engine.poll_at().is_some_and(|at| at <= next));
            held += 1;
        }
        assert!(h1.engine.rx_ready(t, b1, 64), "b is never held");
        h1.inject(t, b1, &udp(B1, B2, IP_B1, IP_B2, 7, 100));
        b_sent += 1;
        h1.poll(t);
        carry(&mut h1, &mut h2, t);
        h2.poll(t);
        assert!(
            h2.take(h2.port_of("a2")).is_empty(),
            "no hostile frame passes"
        );
        b_delivered += h2.take(b2).len();
    }
    assert_eq!(b_delivered, b_sent, "every frame of b delivered");
    // 5 periods of 20,000 fuel hold 4 faulting runs of 5,000 each: the switch read those
    // and the rest of their batches, of the 4,000 hostile frames offered.
    assert!(read <= 5 * 2 * batch, "read {read} hostile frames");
    assert!(held > steps * 9 / 10, "held on {held} of {steps} steps");
    let reasons = [
        DropReason::OffloadFuel,
        DropReason::OffloadTrap,
        DropReason::OffloadMemory,
    ];
    for r in reasons {
        assert!(h1.drops("a1", r) > 0, "{r:?}");
    }
    let dropped: u64 = reasons
        .iter()
        .chain(&[DropReason::OffloadBudget])
        .map(|&r| h1.drops("a1", r))
        .sum();
    assert_eq!(
        dropped, read as u64,
        "every hostile frame read dropped with its reason"
    );
    for r in DropReason::ALL {
        assert_eq!(h1.drops("b1", r), 0, "{r:?}");
    }
}
