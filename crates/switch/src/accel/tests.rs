//! The engine: correctness of sealing, tamper detection, rotation without loss and CPU
//! attribution with real threads; isolation under a bulk hog on a virtual clock (the real
//! threads' share is an ignored measurement). The scheduling policy's shares, latency bound
//! and work conservation are also tested on a virtual clock in `sched.rs`.

use std::net::Ipv4Addr;

use picnic_core::fairnic::TokenCost;
use picnic_core::Duration;
use picnic_wire::overlay::{decap, encap, OuterHeaders};
use picnic_wire::seal::{TunnelKey, PROTOCOL_SEALED};
use picnic_wire::GeneveRepr;

use super::sched::Pick;
use super::*;
use crate::frame::FramePool;

fn outer() -> OuterHeaders {
    OuterHeaders {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: Ipv4Addr::new(198, 18, 0, 1),
        dst_ip: Ipv4Addr::new(198, 18, 0, 2),
        src_port: 50000,
        ttl: 64,
    }
}

fn key(b: u8) -> TunnelKey {
    TunnelKey::new(&[b; 16]).unwrap()
}

fn ring(epoch: u32, b: u8) -> KeyRing {
    let mut r = KeyRing::default();
    r.install(epoch, key(b), true).unwrap();
    r
}

fn config(sender_id: u32, isolated: bool, capacity_percent: u64) -> AccelConfig {
    AccelConfig {
        workers: 2,
        inline_budget: std::time::Duration::from_micros(20),
        inline_wait: std::time::Duration::ZERO,
        queue_jobs: 64,
        capacity_percent,
        cost: Some(TokenCost {
            per_request: 400,
            per_byte: 1,
        }),
        isolated,
        sender_id,
        job_work_ns: 0,
        nice: None,
        slice_us: None,
        realtime_priority: None,
    }
}

/// A plain tunnel packet of tenant `vni` with an inner frame of `inner` bytes.
fn plain_frame(pool: &mut FramePool, vni: u32, inner: usize, fill: u8) -> Frame {
    let mut f = pool.get().unwrap();
    let n = encap(
        &outer(),
        &GeneveRepr::ethernet(vni),
        &vec![fill; inner],
        f.buf_for_rx(),
    )
    .unwrap();
    f.set_len(n);
    f
}

/// Submits, then waits (bounded) for exactly one completion.
fn one(accel: &mut AccelPort, job: Job) -> Completion {
    assert!(accel.submit(job).is_ok());
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while out.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no completion in 10 s"
        );
        accel.completions(&mut out);
        std::thread::yield_now();
    }
    assert_eq!(out.len(), 1);
    out.pop().unwrap()
}

fn job(tenant: usize, op: Op, frame: Frame) -> Job {
    Job {
        tenant,
        op,
        frame,
        cookie: 7,
    }
}

#[test]
fn seal_then_open_restores_the_frame_and_tampering_is_counted() {
    let mut pool = FramePool::new(16);
    let mut a = Accel::start(&config(1, true, 50), &[1], vec![ring(1, 9)], 1).unwrap();
    let mut b = Accel::start(&config(2, true, 50), &[1], vec![ring(1, 9)], 1).unwrap();
    let (mut pa, mut pb) = (a.port(0).unwrap(), b.port(0).unwrap());
    let plain = plain_frame(&mut pool, 5, 300, 0xAB);
    let original = plain.data().to_vec();
    let sealed = one(&mut pa, job(0, Op::Seal, plain));
    assert_eq!(sealed.outcome, Outcome::Done);
    assert_eq!(sealed.cookie, 7);
    assert_eq!(
        decap(sealed.frame.data()).unwrap().geneve.protocol,
        PROTOCOL_SEALED
    );
    let mut tampered = pool.get().unwrap();
    assert!(tampered.fill_from(sealed.frame.data()));
    let at = tampered.len() - 40;
    tampered.data_mut()[at] ^= 0x20;
    let opened = one(&mut pb, job(0, Op::Open, sealed.frame));
    assert_eq!(opened.outcome, Outcome::Done);
    assert_eq!(opened.frame.data(), &original[..]);
    let bad = one(&mut pb, job(0, Op::Open, tampered));
    assert_eq!(bad.outcome, Outcome::AuthFailed);
    let s = b.stats();
    assert_eq!((s[0].opened, s[0].auth_failed), (1, 1));
    // Worker CPU is reported per job and adds up per tenant.
    assert!(opened.cpu_ns > 0 && bad.cpu_ns > 0);
    assert_eq!(s[0].cpu_ns, opened.cpu_ns + bad.cpu_ns);
}

#[test]
fn rotation_with_two_live_keys_drops_nothing() {
    let mut pool = FramePool::new(64);
    let mut a = Accel::start(&config(1, true, 50), &[1], vec![ring(1, 1)], 1).unwrap();
    let mut b = Accel::start(&config(2, true, 50), &[1], vec![ring(1, 1)], 1).unwrap();
    let (mut pa, mut pb) = (a.port(0).unwrap(), b.port(0).unwrap());
    let mut in_flight = Vec::new();
    for step in 0..12 {
        match step {
            // Install epoch 2 on both hosts, then the sender moves over, then the receiver.
            4 => {
                a.install_key(0, 2, key(2), false).unwrap();
                b.install_key(0, 2, key(2), false).unwrap();
            }
            6 => a.activate_key(0, 2).unwrap(),
            8 => b.activate_key(0, 2).unwrap(),
            _ => {}
        }
        let sealed = one(
            &mut pa,
            job(0, Op::Seal, plain_frame(&mut pool, 5, 100, step)),
        );
        in_flight.push(sealed.frame);
        // Packets arrive two steps after they were sealed (in flight across the rotation).
        if in_flight.len() > 2 {
            let f = in_flight.remove(0);
            assert_eq!(
                one(&mut pb, job(0, Op::Open, f)).outcome,
                Outcome::Done,
                "step {step}"
            );
        }
    }
    for f in in_flight {
        assert_eq!(one(&mut pb, job(0, Op::Open, f)).outcome, Outcome::Done);
    }
    let s = b.stats();
    assert_eq!(
        (s[0].opened, s[0].auth_failed, s[0].unknown_key),
        (12, 0, 0)
    );
    assert_eq!(
        (s[0].key_epochs.clone(), s[0].sending_epoch),
        (vec![1, 2], Some(2))
    );
    // A third epoch forgets epoch 1: its packets are then refused as unknown, not opened.
    let old = one(&mut pb, job(0, Op::Seal, plain_frame(&mut pool, 5, 100, 0)));
    b.install_key(0, 3, key(3), true).unwrap();
    b.activate_key(0, 3).unwrap();
    b.install_key(0, 4, key(4), false).unwrap();
    assert_eq!(b.stats()[0].key_epochs, vec![3, 4]);
    assert_eq!(
        one(&mut pb, job(0, Op::Open, old.frame)).outcome,
        Outcome::UnknownKey
    );
    // An epoch cannot be given another key; re-installing the same key is harmless.
    assert!(b.install_key(0, 3, key(9), false).is_err());
    assert!(b.install_key(0, 3, key(3), false).is_ok());
    assert!(b.activate_key(0, 8).is_err());
}

#[test]
fn a_full_queue_gives_the_job_back_and_counts_it() {
    let mut pool = FramePool::new(256);
    let mut cfg = config(1, true, 1);
    cfg.queue_jobs = 4;
    cfg.workers = 1;
    let mut a = Accel::start(&cfg, &[1, 1], vec![ring(1, 1), ring(1, 2)], 1).unwrap();
    let mut pa = a.port(0).unwrap();
    let mut refused = 0;
    for _ in 0..64 {
        if let Err(j) = pa.submit(job(0, Op::Seal, plain_frame(&mut pool, 5, 1400, 1))) {
            pool.put(j.frame);
            refused += 1;
        }
    }
    // Tenant 0 keeps at most 4 queued plus what the worker holds; the limiter (1% of one
    // worker) starts few of them in the meantime.
    assert!(refused >= 40, "refused {refused}");
    assert_eq!(a.stats()[0].queue_full, refused);
    assert_eq!(a.stats()[1].queue_full, 0);
}

/// The engine `small_tenant_keeps_its_share_against_a_bulk_hog` starts (one worker whose
/// limiter admits a quarter of its time, tenants of equal weight), driven on a virtual
/// clock: the gate, limiter and queues `Accel::start` builds, a worker that takes
/// `ns_per_token` ns per token of a job's cost, tenant 0 queueing 1400-byte and tenant 1
/// 64-byte seals, both fully backlogged from the start (submitted alternately). Returns the
/// tokens each tenant got by the time tenant 1's backlog is done, and that time.
fn virtual_engine_run(ns_per_token: u64) -> ([u64; 2], Duration) {
    let mut cfg = config(1, true, 25);
    cfg.workers = 1;
    const JOBS: usize = 1024;
    cfg.queue_jobs = JOBS;
    let cost = cfg.cost.unwrap();
    let (mut queues, limiter, capacity) = engine_queues::<Job>(&cfg, &[1, 1], cost, 1).unwrap();
    assert_eq!(capacity, 250_000_000);
    let mut gate = super::admit::Gate::new(2);
    let mut pool = FramePool::new(2 * JOBS);
    let sizes = [1400usize, 64];
    let mut now = Instant::ZERO;
    for _ in 0..JOBS {
        for t in 0..2 {
            let f = plain_frame(&mut pool, 5, sizes[t], 1);
            let size = f.len() as u64;
            assert!(gate.offer(t, size, now, job(t, Op::Seal, f)).is_ok());
        }
    }
    let mut tokens = [0u64; 2];
    let mut jobs = [0usize; 2];
    while jobs[1] < JOBS {
        let held = gate.admit(
            now,
            limiter.as_ref(),
            |a| assert!(queues.push(a).is_ok()),
            |_, _, e| panic!("{e}"),
        );
        match queues.pick(now) {
            Pick::Run { tenant, item, .. } => {
                let t = cost.of(item.frame.len() as u64);
                tokens[tenant] += t;
                jobs[tenant] += 1;
                now += Duration::from_nanos(t * ns_per_token);
                pool.put(item.frame);
            }
            Pick::Paced(_) => panic!("a threaded engine is not paced"),
            Pick::Idle => {
                let at = held.expect("jobs held with nothing queued");
                assert!(at > now, "the limiter asked to wait for the past");
                now = at;
            }
        }
    }
    (tokens, now - Instant::ZERO)
}

#[test]
fn small_tenant_keeps_its_share_against_a_bulk_hog() {
    // A worker as fast as the tokens assume (the limiter binds at a quarter of its time),
    // and one ten times slower (a busy host: the limiter admits both, the fair order
    // decides). Either way, by the time tenant 1's backlog is done tenant 0 has had the
    // same engine time in tokens, within 10%.
    for ns_per_token in [1, 10] {
        let (tokens, elapsed) = virtual_engine_run(ns_per_token);
        let share = tokens[1] as f64 / (tokens[0] + tokens[1]) as f64;
        assert!(
            (0.45..=0.55).contains(&share),
            "{ns_per_token} ns/token: small tenant had {share:.3} of the engine's tokens, \
             its weight is 0.5 ({tokens:?})"
        );
        // The engine ran at the limiter's capacity (plus the buckets' initial burst, a few
        // percent of this 4 ms run), or at the worker's speed if that is slower.
        let rate = (tokens[0] + tokens[1]) as f64 / elapsed.as_secs_f64();
        let expected = (1e9 / ns_per_token as f64).min(250e6);
        assert!(
            (0.9 * expected..=1.05 * expected).contains(&rate),
            "{ns_per_token} ns/token: {rate:.3e} tokens/s, expected {expected:.3e}"
        );
    }
}

// The same with real worker threads and the real clock: a measurement of the threaded engine,
// not a test (its share depends on the machine's load; it read 0.34 once in a loaded CI
// run). Run it with `cargo test --release -p picnic-switch --lib real_threads -- --ignored`.
#[test]
#[ignore = "timing-dependent: real threads and clock"]
fn real_threads_small_tenant_share_against_a_bulk_hog() {
    // One worker whose limiter admits a quarter of its time. Tenant 0 queues 1400-byte
    // seals, tenant 1 64-byte ones, equal weights, both fully backlogged from the start
    // (submitted alternately, so neither leads). Whether the limiter binds or the worker
    // is slower than it (a busy machine), by the time tenant 1's backlog is done tenant 0
    // must have had the same engine time in tokens, within 10%.
    let mut cfg = config(1, true, 25);
    cfg.workers = 1;
    const JOBS: usize = 1024;
    cfg.queue_jobs = JOBS;
    let mut a = Accel::start(&cfg, &[1, 1], vec![ring(1, 1), ring(1, 2)], 1).unwrap();
    let mut pa = a.port(0).unwrap();
    let cost = a.cost();
    let mut pool = FramePool::new(2 * JOBS);
    let sizes = [1400usize, 64];
    for _ in 0..JOBS {
        for t in 0..2 {
            let f = plain_frame(&mut pool, 5, sizes[t], 1);
            assert!(pa.submit(job(t, Op::Seal, f)).is_ok());
        }
    }
    let mut tokens = [0u64; 2];
    let mut jobs = [0usize; 2];
    let mut done = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while jobs[1] < JOBS {
        assert!(
            std::time::Instant::now() < deadline,
            "engine stalled: {jobs:?}"
        );
        pa.completions(&mut done);
        for c in done.drain(..) {
            if jobs[1] < JOBS {
                tokens[c.tenant] += cost.of(c.frame.len() as u64 - 32);
                jobs[c.tenant] += 1;
            }
            pool.put(c.frame);
        }
        std::thread::yield_now();
    }
    let share = tokens[1] as f64 / (tokens[0] + tokens[1]) as f64;
    assert!(
        (0.45..=0.55).contains(&share),
        "small tenant had {share:.3} of the engine's tokens, its weight is 0.5 ({tokens:?}, jobs {jobs:?})"
    );
}

/// Runs `accel`'s admitted jobs inline until `n` completions are out (bounded).
fn inline_until(accel: &AccelPort, budget: std::time::Duration, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while out.len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} done",
            out.len()
        );
        accel.run_inline(budget, &mut out);
    }
    out
}

#[test]
fn an_inline_engine_runs_jobs_on_the_callers_thread_and_charges_them() {
    let mut pool = FramePool::new(16);
    let mut cfg = config(1, true, 50);
    cfg.workers = 0;
    let mut a = Accel::start(&cfg, &[1], vec![ring(1, 9)], 1).unwrap();
    let mut pa = a.port(0).unwrap();
    assert!(a.is_inline() && pa.is_inline());
    let plain = plain_frame(&mut pool, 5, 300, 0xAB);
    let original = plain.data().to_vec();
    assert!(pa.submit(job(0, Op::Seal, plain)).is_ok());
    assert_eq!(pa.room(0), 63, "queued and not taken back");
    // Nothing runs until the caller asks: no thread of its own.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(a.stats()[0].sealed, 0);
    let sealed = inline_until(&pa, std::time::Duration::ZERO, 1)
        .pop()
        .unwrap();
    assert_eq!((sealed.outcome, sealed.cookie), (Outcome::Done, 7));
    assert_eq!(pa.room(0), 64);
    let opened = {
        assert!(pa.submit(job(0, Op::Open, sealed.frame)).is_ok());
        inline_until(&pa, std::time::Duration::ZERO, 1)
            .pop()
            .unwrap()
    };
    assert_eq!(opened.outcome, Outcome::Done);
    assert_eq!(opened.frame.data(), &original[..]);
    let s = a.stats();
    assert_eq!((s[0].sealed, s[0].opened), (1, 1));
    assert_eq!(s[0].cpu_ns, sealed.cpu_ns + opened.cpu_ns);
    assert!(sealed.cpu_ns > 0);
}

/// The loop of an inline engine runs jobs in FairNIC's order and only within its budget: a
/// small tenant's job submitted behind a hog's backlog is the next one run, and a run stops
/// once the budget is spent (at least one job each run), so the loop gets back to its ports.
#[test]
fn an_inline_engine_runs_a_small_tenants_job_first_and_stops_at_its_budget() {
    let mut pool = FramePool::new(128);
    let mut cfg = config(1, true, 90);
    cfg.workers = 0;
    // 200 us of work a job: a run with a zero budget does one, with 500 us three.
    cfg.job_work_ns = 200_000;
    let mut a = Accel::start(&cfg, &[1, 1], vec![ring(1, 1), ring(1, 2)], 1).unwrap();
    let mut pa = a.port(0).unwrap();
    for _ in 0..32 {
        assert!(pa
            .submit(job(0, Op::Seal, plain_frame(&mut pool, 5, 1400, 1)))
            .is_ok());
    }
    let mut out = Vec::new();
    let run = pa.run_inline(std::time::Duration::ZERO, &mut out);
    assert_eq!((run.jobs, out.len()), (1, 1));
    assert!(run.cpu_ns >= 200_000, "{run:?}");
    assert!(pa
        .submit(job(1, Op::Seal, plain_frame(&mut pool, 5, 64, 2)))
        .is_ok());
    out.clear();
    let run = pa.run_inline(std::time::Duration::ZERO, &mut out);
    assert_eq!(run.jobs, 1);
    assert_eq!(out[0].tenant, 1, "the small tenant's job is run next");
    // The budget, without a limiter to stop the run first (one FIFO, isolation off): 200 us
    // jobs and 500 us of budget stop the run at the third job at most (fewer if the thread
    // was preempted meanwhile), with the backlog still queued.
    let mut off = cfg.clone();
    off.isolated = false;
    let mut b = Accel::start(&off, &[1, 1], vec![ring(1, 1), ring(1, 2)], 1).unwrap();
    let mut pb = b.port(0).unwrap();
    for _ in 0..16 {
        assert!(pb
            .submit(job(0, Op::Seal, plain_frame(&mut pool, 5, 1400, 1)))
            .is_ok());
    }
    out.clear();
    let run = pb.run_inline(std::time::Duration::from_micros(500), &mut out);
    assert!((1..=3).contains(&run.jobs), "{run:?}");
    assert_eq!(run.wake_in, None);
}
