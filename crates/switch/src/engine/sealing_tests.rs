//! Two hosts' engines and shared engines (real worker threads) back to back: tenant `a`
//! encrypts, `b` does not. Sealed on the way out, opened on the way in, tampering and
//! plain frames for an encrypting tenant dropped and counted, engine CPU charged.

use picnic_core::Instant;
use picnic_wire::overlay::decap;
use picnic_wire::seal::PROTOCOL_SEALED;

use super::tests::{udp, Host, A1, A2, B1, B2, IP_A1, IP_A2, IP_B1, IP_B2, TWO_HOSTS};
use crate::accel::{Accel, AccelPort, Exchange};
use crate::config::Config;
use crate::directory::UPLINK;
use crate::stats::DropReason;

const KEY: &str = "000102030405060708090a0b0c0d0e0f";

fn config(host: u32, encrypt: bool) -> Config {
    let port = |h: u32, name: &str| {
        if h == host {
            format!("port = {{ ifname = \"{name}\" }}")
        } else {
            String::new()
        }
    };
    let tenant_a = if encrypt {
        format!("name = \"a\"\nvni = 100\nencrypt = true\nkey = \"{KEY}\"")
    } else {
        "name = \"a\"\nvni = 100".to_string()
    };
    let text = TWO_HOSTS
        .replace("name = \"a\"\nvni = 100", &tenant_a)
        .replace("HOST", &host.to_string())
        .replace("CAPACITY", "1000")
        .replace("PORT1A", &port(1, "a1"))
        .replace("PORT1B", &port(1, "b1"))
        .replace("PORT2A", &port(2, "a2"))
        .replace("PORT2B", &port(2, "b2"));
    let mut cfg = Config::parse(&text).unwrap();
    cfg.accel.workers = 1;
    cfg
}

struct Sealed {
    host: Host,
    /// The engine (its workers stop when it drops) and the host's port into it.
    _accel: Accel,
    port: AccelPort,
    scratch: Exchange,
}

impl Sealed {
    fn new(id: u32) -> Sealed {
        Sealed::with_workers(id, 1)
    }

    /// With `workers` engine threads; 0: the engine runs its jobs in `exchange` (inline).
    fn with_workers(id: u32, workers: usize) -> Sealed {
        let mut cfg = config(id, true);
        cfg.accel.workers = workers;
        let mut host = Host::new(id, 1000);
        host.engine = super::Engine::new(&cfg, Instant::ZERO).unwrap();
        let mut accel = Accel::from_config(&cfg, 1)
            .unwrap()
            .expect("tenant a encrypts");
        let port = accel.port(0).expect("one port");
        Sealed {
            host,
            _accel: accel,
            port,
            scratch: Exchange::default(),
        }
    }

    /// Polls and exchanges with the workers until `port` has `n` frames to send (bounded).
    fn settle(&mut self, port: usize, n: usize) -> Vec<Vec<u8>> {
        self.settle_until(port, |s| s.host.engine.tx_queue(port).len() >= n)
    }

    /// Polls and exchanges with the workers until `drops` frames were dropped for `reason`,
    /// then returns what `port` has to send.
    fn settle_drops(&mut self, port: usize, reason: DropReason, drops: u64) -> Vec<Vec<u8>> {
        self.settle_until(port, |s| s.host.engine.counters.drops.get(reason) >= drops)
    }

    fn settle_until(&mut self, port: usize, done: impl Fn(&mut Sealed) -> bool) -> Vec<Vec<u8>> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            self.host.poll(Instant::ZERO);
            self.port.exchange(
                &mut self.host.engine,
                Instant::ZERO,
                &mut self.host.pool,
                &mut self.scratch,
            );
            self.host.poll(Instant::ZERO);
            if done(self) {
                return self.host.take(port);
            }
            if std::time::Instant::now() > deadline {
                return self.host.take(port);
            }
            std::thread::yield_now();
        }
    }
}

#[test]
fn encrypted_tenant_is_sealed_on_the_wire_and_opened_for_its_vm() {
    sealed_and_opened(1);
}

/// The same with inline engines (`accel.workers = 0`): the exchange runs the jobs itself.
#[test]
fn an_inline_engine_seals_and_opens_in_the_exchange_itself() {
    sealed_and_opened(0);
}

fn sealed_and_opened(workers: usize) {
    let (mut h1, mut h2) = (
        Sealed::with_workers(1, workers),
        Sealed::with_workers(2, workers),
    );
    let t = Instant::ZERO;
    let frame = udp(A1, A2, IP_A1, IP_A2, 7, 300);
    h1.host.inject(t, h1.host.port_of("a1"), &frame);
    let wire = h1.settle(UPLINK, 1);
    assert_eq!(wire.len(), 1);
    let d = decap(&wire[0]).unwrap();
    assert_eq!(d.geneve.protocol, PROTOCOL_SEALED);
    assert!(!d.inner.windows(32).any(|w| w == &frame[frame.len() - 32..]));
    // Tenant b does not encrypt: plain Geneve, no engine.
    let plain_b = udp(B1, B2, IP_B1, IP_B2, 7, 100);
    h1.host.inject(t, h1.host.port_of("b1"), &plain_b);
    let wire_b = h1.settle(UPLINK, 1);
    assert_eq!(decap(&wire_b[0]).unwrap().inner, &plain_b[..]);

    let a2 = h2.host.port_of("a2");
    h2.host.inject(t, UPLINK, &wire[0]);
    assert_eq!(h2.settle(a2, 1), vec![frame.clone()]);
    // The same packet altered in flight: dropped as auth_failed, nothing delivered.
    let mut tampered = wire[0].clone();
    let at = tampered.len() - 20;
    tampered[at] ^= 1;
    h2.host.inject(t, UPLINK, &tampered);
    assert!(h2.settle_drops(a2, DropReason::AuthFailed, 1).is_empty());
    assert_eq!(h2.host.engine.counters.drops.get(DropReason::AuthFailed), 1);
    let snap = h2.host.engine.snapshot();
    let use_a = snap.tenants[0].accel.clone().unwrap();
    assert_eq!((use_a.frames, use_a.auth_failed), (2, 1));
    assert!(use_a.cpu_ns > 0, "engine CPU charged to the tenant");
    assert!(snap.tenants[1].accel.is_none());
    let b2 = h2.host.port_of("b2");
    h2.host.inject(t, UPLINK, &wire_b[0]);
    assert_eq!(h2.settle(b2, 1), vec![plain_b]);
}

#[test]
fn plain_frames_for_an_encrypting_tenant_are_dropped() {
    // Host 1 does not encrypt tenant a (misconfigured, or a forger): host 2 refuses.
    let mut h1 = Host::new(1, 1000);
    h1.engine = super::Engine::new(&config(1, false), Instant::ZERO).unwrap();
    let mut h2 = Sealed::new(2);
    let t = Instant::ZERO;
    h1.inject(t, h1.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 7, 100));
    h1.poll(t);
    let wire = h1.take(UPLINK);
    assert_eq!(wire.len(), 1);
    h2.host.inject(t, UPLINK, &wire[0]);
    let a2 = h2.host.port_of("a2");
    assert!(h2.settle_drops(a2, DropReason::Unsealed, 1).is_empty());
    assert_eq!(h2.host.engine.counters.drops.get(DropReason::Unsealed), 1);
}

/// FairNIC 5.2's back-pressure: an encrypting tenant's VM ports are read only while its
/// queue at the engine has room for a read's batch (or, shallower than a batch, is empty);
/// a tenant that does not encrypt is never held by the engine.
#[test]
fn a_tenant_whose_engine_queue_is_full_is_not_read() {
    let mut s = Sealed::new(1);
    let (a1, b1) = (s.host.port_of("a1"), s.host.port_of("b1"));
    let t = Instant::ZERO;
    // The engine reports every tenant's room after each exchange: all of it, at first.
    s.host.poll(t);
    s.port
        .exchange(&mut s.host.engine, t, &mut s.host.pool, &mut s.scratch);
    assert!(s.host.engine.rx_ready(t, a1, 64));
    let ready = |s: &mut Sealed, depth: usize, room_a: usize| {
        s.host.engine.set_accel_room(depth, [room_a, 0].into_iter());
        (
            s.host.engine.rx_ready(t, a1, 64),
            s.host.engine.rx_ready(t, b1, 64),
        )
    };
    assert_eq!(ready(&mut s, 256, 0), (false, true));
    assert_eq!(ready(&mut s, 256, 63), (false, true));
    assert_eq!(ready(&mut s, 256, 64), (true, true));
    assert_eq!(ready(&mut s, 16, 15), (false, true));
    assert_eq!(ready(&mut s, 16, 16), (true, true));
}

/// Iron 3.1 with the shared engine: the loop's iteration that takes a sealed frame back and
/// sends it is charged to the frame's VM. It used to count as the switch's overhead, so in
/// accel-hog most of the loop's work for the hog's results (0.5 s of h1's 3 s) was charged
/// to nobody: not to the hog's CPU account, nor to its read-side share.
#[test]
fn the_loop_time_of_a_sealed_frame_coming_back_is_charged_to_its_vm() {
    let cfg = config(1, true);
    let mut host = Host::new(1, 1000);
    host.engine = super::Engine::new(&cfg, Instant::ZERO).unwrap();
    let a1 = host
        .engine
        .dir
        .vms
        .iter()
        .position(|v| v.name == "a1")
        .unwrap();
    let t = Instant::ZERO;
    host.inject(t, host.port_of("a1"), &udp(A1, A2, IP_A1, IP_A2, 7, 1000));
    host.poll(t);
    let mut jobs = Vec::new();
    host.engine.take_accel_jobs(&mut jobs);
    assert_eq!(jobs.len(), 1, "the frame waits for the engine");
    // The iterations that read and queued it are charged; then the result comes back.
    host.engine.charge_cpu(t, 20_000);
    let (cost, overhead) = (
        host.engine.vm_counters[a1].cost_ns,
        host.engine.counters.overhead_ns,
    );
    let job = jobs.pop().unwrap();
    let done = crate::accel::Completion {
        tenant: job.tenant,
        op: job.op,
        frame: job.frame,
        cookie: job.cookie,
        outcome: crate::accel::Outcome::Done,
        cpu_ns: 0,
        waited: picnic_core::Duration::ZERO,
        queued_at: t,
    };
    host.engine.on_accel_done(t, done, &mut host.pool);
    assert_eq!(host.take(UPLINK).len(), 1, "sent on the uplink");
    host.engine.charge_cpu(t, 9_000);
    assert_eq!(host.engine.vm_counters[a1].cost_ns - cost, 9_000);
    assert_eq!(
        host.engine.counters.overhead_ns, overhead,
        "none of it overhead"
    );
}
