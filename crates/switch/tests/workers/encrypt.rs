//! The shared encryption engine with two workers, in a `pn-t-*` namespace (root; skipped
//! without): tenant `a` encrypts and has a VM on each worker, tenant `p` does not and sits
//! beside it. Every frame of each reaches the underlay, `a`'s sealed by the engine (through
//! both workers' ports), `p`'s plain, and the engine's counters and limiter account for
//! every job of `a` (FairNIC 4.4: each worker's gate, one engine).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::{is_root, send_all, Netns};
use picnic_switch::config::Config;
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{wait_readable, AfPacketOptions, AfPacketPort, Port};
use picnic_switch::runner::Switch;
use picnic_wire::overlay::decap;
use picnic_wire::seal::PROTOCOL_SEALED;

const CONFIG: &str = r#"
[switch]
host_id = 1
workers = 2
[uplink]
ifname = "pnwup"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[hosts]]
id = 2
underlay_ip = "198.19.0.2"
mac = "02:00:00:00:01:02"
[[tenants]]
name = "a"
vni = 100
encrypt = true
key = "000102030405060708090a0b0c0d0e0f"
[[tenants]]
name = "p"
vni = 200
[[vms]]
name = "a1"
id = 1
tenant = "a"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "pnwv1" }
[[vms]]
name = "a2"
id = 2
tenant = "a"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = { ifname = "pnwv2" }
[[vms]]
name = "p3"
id = 3
tenant = "p"
host = 1
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
port = { ifname = "pnwv3" }
[[vms]]
name = "r9"
id = 9
tenant = "a"
host = 2
mac = "02:00:00:00:00:09"
ip = "198.18.0.9"
[[vms]]
name = "r8"
id = 8
tenant = "p"
host = 2
mac = "02:00:00:00:00:08"
ip = "198.18.0.8"
"#;

/// A UDP frame of local VM `src` to remote VM `dst`, flow `flow`.
fn to_remote(src: u8, dst: u8, flow: u16) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, src], [2, 0, 0, 0, 0, dst])
        .ipv4([198, 18, 0, src], [198, 18, 0, dst], 64)
        .udp(40000 + flow, 7)
        .write(&mut out, &[0u8; 600])
        .unwrap();
    out
}

/// The tenant frames read from `fabric` so far, counted by (VNI 100 sealed, VNI 100 plain,
/// VNI 200 sealed, VNI 200 plain).
fn count_underlay(fabric: &mut AfPacketPort, pool: &mut FramePool, n: &mut [usize; 4]) {
    let mut got: Vec<Frame> = Vec::new();
    while fabric.recv_batch(pool, &mut got, 64).unwrap_or(0) > 0 {
        for f in got.drain(..) {
            // Tenant frames only (standalone feedback carries no inner frame).
            if let Some(d) = decap(f.data()).ok().filter(|d| !d.inner.is_empty()) {
                let sealed = d.geneve.protocol == PROTOCOL_SEALED;
                match (d.geneve.vni, sealed) {
                    (100, true) => n[0] += 1,
                    (100, false) => n[1] += 1,
                    (200, true) => n[2] += 1,
                    (200, false) => n[3] += 1,
                    _ => {}
                }
            }
            pool.put(f);
        }
    }
}

#[test]
fn root_an_encrypting_tenant_beside_another_on_two_workers() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnwup", "pnwfab");
    ns.veth_pair("pnwv1", "pnwp1");
    ns.veth_pair("pnwv2", "pnwp2");
    ns.veth_pair("pnwv3", "pnwp3");
    ns.enter(|| {
        let mut cfg = Config::parse(CONFIG).unwrap();
        // Known costs, so that the run does not wait for the calibration.
        cfg.accel.per_job_ns = Some(1000);
        cfg.accel.per_byte_ps = Some(1000);
        let mut switch = Switch::open(cfg).unwrap();
        let (stop, shared) = (switch.stop_flag(), switch.shared());
        let dataplane = std::thread::spawn(move || switch.run());
        let opts = AfPacketOptions::default;
        let mut fabric = AfPacketPort::open("pnwfab", opts()).unwrap();
        let mut vms: Vec<AfPacketPort> = ["pnwp1", "pnwp2", "pnwp3"]
            .iter()
            .map(|n| AfPacketPort::open(n, opts()).unwrap())
            .collect();
        let mut pool = FramePool::new(4096);
        const ROUNDS: u16 = 20;
        const PER_ROUND: u16 = 10;
        let mut n = [0usize; 4];
        for round in 0..ROUNDS {
            for (vm, (src, dst)) in vms.iter_mut().zip([(1u8, 9u8), (2, 9), (3, 8)]) {
                let mut batch: Vec<Frame> = (0..PER_ROUND)
                    .map(|i| {
                        let mut f = pool.get().unwrap();
                        assert!(f.fill_from(&to_remote(src, dst, round * PER_ROUND + i)));
                        f
                    })
                    .collect();
                send_all(vm, &mut pool, &mut batch);
            }
            std::thread::sleep(Duration::from_millis(5));
            count_underlay(&mut fabric, &mut pool, &mut n);
        }
        let sent = (ROUNDS * PER_ROUND) as usize;
        let want = [2 * sent, 0, 0, sent];
        let deadline = Instant::now() + Duration::from_secs(5);
        while n != want && Instant::now() < deadline {
            let _ = wait_readable(&[fabric.raw_fd().unwrap()], Duration::from_millis(10));
            count_underlay(&mut fabric, &mut pool, &mut n);
        }
        // A snapshot after the last frame (published every 100 ms).
        std::thread::sleep(Duration::from_millis(250));
        stop.store(true, Ordering::Relaxed);
        dataplane.join().unwrap().unwrap();
        assert_eq!(
            n, want,
            "underlay frames: a's sealed, a's plain, p's sealed, p's plain"
        );
        let p = shared.latest().unwrap();
        let worker_of = |name: &str| p.switch.vms.iter().find(|v| v.name == name).unwrap().worker;
        assert_ne!(
            worker_of("a1"),
            worker_of("a2"),
            "a's VMs on both workers: both submit to the engine"
        );
        let accel = p.accel.as_ref().expect("the engine shows in /stats");
        let a = &accel.tenants["a"];
        assert_eq!(a.sealed, 2 * sent as u64, "{a:?}");
        assert_eq!((a.queue_full, a.refused, a.auth_failed), (0, 0, 0), "{a:?}");
        // Every job passed a worker's gate: granted from its cache or by the limiter.
        let limiter = a.limiter.as_ref().expect("isolated");
        assert_eq!(limiter.granted, a.sealed, "{limiter:?}");
        assert!(a.cpu_ns > 0, "the engine's work is measured for its tenant");
        // Charged to `a` by the worker whose port took each result back: both workers' shares.
        let used = p.switch.tenants.iter().find(|t| t.name == "a").unwrap();
        let used = used.accel.as_ref().expect("a uses the engine");
        assert_eq!(used.frames, a.sealed, "{used:?}");
        assert!(!accel.tenants.contains_key("p"), "p does not encrypt");
        for w in &p.workers {
            assert!(w.cpu_ns > 0, "worker {} ran", w.worker);
        }
    });
}
