//! Root tests of the kernel fast path (docs/switch.md "Two paths"): a running switch with
//! `[fastpath] kernel = true` on veth pairs in a fresh `pn-t-*` namespace. The tests send
//! from the VMs' side of their veths and from a second host's side of the uplink, and check
//! what arrives, in what order, and on which path. Without root, or without the eBPF programs
//! (a build without clang), each test prints why it skipped and passes.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{have_ebpf, is_root, send_all, udp, Netns};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::Port;
use picnic_switch::port::{AfPacketOptions, AfPacketPort};
use picnic_switch::stats::FastPathCounters;
use picnic_wire::feedback::FeedbackOption;
use picnic_wire::geneve::{standalone_feedback, GeneveRepr};
use picnic_wire::overlay::{decap, encap, OuterHeaders};

const SWITCH: &str = r#"
[switch]
host_id = 1
[uplink]
ifname = "pnfu"
[fastpath]
kernel = true
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
[[vms]]
name = "a1"
id = 1
tenant = "a"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "pnfa" }
[[vms]]
name = "a2"
id = 2
tenant = "a"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
MAX_PPS
port = { ifname = "pnfb" }
[[vms]]
name = "a3"
id = 3
tenant = "a"
host = 2
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
"#;

/// A UDP frame from VM `src` to VM `dst` carrying sequence number `seq`.
fn numbered(src: u8, dst: u8, seq: u32) -> Vec<u8> {
    let mut f = udp(src, dst, 18);
    let n = f.len();
    f[n - 4..].copy_from_slice(&seq.to_be_bytes());
    // The payload changed: the UDP checksum 0 means "none" over IPv4.
    f[40..42].copy_from_slice(&[0, 0]);
    f
}

fn seq(data: &[u8]) -> u32 {
    let n = data.len();
    u32::from_be_bytes(data[n - 4..].try_into().unwrap())
}

/// The switch's view of the run: a VM's frames seen by the engines, and the kernel's counts.
struct Run {
    a1_tx_engine: u64,
    a1_rx_engine: u64,
    a2_rx_engine: u64,
    a1_fast: FastPathCounters,
    a2_fast: FastPathCounters,
}

/// Runs a switch for `cfg` in `ns` while `f` sends and receives; returns the engines' counts.
fn with_switch(ns: &Netns, cfg: &str, f: impl FnOnce() + Send) -> Run {
    let cfg = picnic_switch::config::Config::parse(cfg).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter(|| {
                let mut switch = picnic_switch::runner::Switch::open(cfg).unwrap();
                let on = switch
                    .describe_ports()
                    .iter()
                    .any(|l| l.contains("kernel fast path"));
                tx.send((switch.stop_flag(), switch.shared(), on)).unwrap();
                switch.run().unwrap();
            })
        });
        let (stop, shared, on) = rx.recv().unwrap();
        assert!(on, "the fast path is on");
        // The VMs are handed to the kernel within a few of the loop's syncs.
        std::thread::sleep(Duration::from_millis(50));
        // A failed check stops the switch too (else the scope would wait for it forever).
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        std::thread::sleep(Duration::from_millis(150));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = checked {
            std::panic::resume_unwind(panic);
        }
        shared
    });
    let snap = shared.latest().unwrap();
    let vm = |n: &str| {
        snap.switch
            .vms
            .iter()
            .find(|v| v.name == n)
            .unwrap()
            .counters
            .clone()
    };
    Run {
        a1_tx_engine: vm("a1").tx_packets,
        a1_rx_engine: vm("a1").rx_packets,
        a2_rx_engine: vm("a2").rx_packets,
        a1_fast: vm("a1").fast_path,
        a2_fast: vm("a2").fast_path,
    }
}

/// The namespace with the test's veths, or None (saying why) without root or the programs.
/// One test at a time: each runs a switch and sends at rates the flood test counts on, and
/// two at once share this machine's two cores (the flood test failed once in thirteen runs
/// of the file in parallel; run alone, never).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn testbed() -> Option<Netns> {
    if !is_root() || !have_ebpf() {
        return None;
    }
    let ns = Netns::new();
    // Switch side / other side: a1, a2 and the uplink to host 2.
    for (a, b) in [("pnfa", "pnfA"), ("pnfb", "pnfB"), ("pnfu", "pnfv")] {
        ns.veth_pair(a, b);
    }
    Some(ns)
}

fn open(ns: &Netns, ifname: &str) -> AfPacketPort {
    ns.enter(|| AfPacketPort::open(ifname, AfPacketOptions::default()).unwrap())
}

/// Receives from `port` until `n` frames arrived or 2 s passed.
fn receive(port: &mut AfPacketPort, pool: &mut FramePool, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut batch: Vec<Frame> = Vec::new();
    while out.len() < n && std::time::Instant::now() < deadline {
        port.recv_batch(pool, &mut batch, 64).unwrap();
        for f in batch.drain(..) {
            out.push(f.data().to_vec());
            pool.put(f);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    out
}

fn send(port: &mut AfPacketPort, pool: &mut FramePool, frames: &[Vec<u8>]) {
    let mut batch: Vec<Frame> = frames
        .iter()
        .map(|d| {
            let mut f = pool.get().unwrap();
            f.fill_from(d);
            f
        })
        .collect();
    send_all(port, pool, &mut batch);
}

/// Both ways on one host, and to and from another: forwarded in the kernel, intact, the
/// engines seeing none of it.
#[test]
fn frames_within_their_allocation_take_the_kernel_path_both_ways() {
    let _serial = serial();
    let Some(ns) = testbed() else {
        return;
    };
    let cfg = SWITCH.replace("MAX_PPS", "");
    let (mut a1, mut a2, mut h2) = (open(&ns, "pnfA"), open(&ns, "pnfB"), open(&ns, "pnfv"));
    let mut pool = FramePool::new(1024);
    let run = with_switch(&ns, &cfg, || {
        // a1 -> a2 (same host), 100 frames one at a time.
        for i in 0..100 {
            send(&mut a1, &mut pool, &[numbered(1, 2, i)]);
            std::thread::sleep(Duration::from_micros(100));
        }
        let got = receive(&mut a2, &mut pool, 100);
        let seqs: Vec<u32> = got.iter().map(|d| seq(d)).collect();
        assert_eq!(
            seqs,
            (0..100).collect::<Vec<_>>(),
            "a1 -> a2: all, in order"
        );
        assert_eq!(got[7], numbered(1, 2, 7), "unchanged");

        // a1 -> a3 (host 2): encapsulated towards host 2.
        for i in 0..50 {
            send(&mut a1, &mut pool, &[numbered(1, 3, i)]);
            std::thread::sleep(Duration::from_micros(100));
        }
        let got = receive(&mut h2, &mut pool, 50);
        assert_eq!(got.len(), 50, "a1 -> a3: every frame on the uplink");
        for (i, d) in got.iter().enumerate() {
            let t = decap(d).expect("a Geneve frame");
            assert_eq!(t.geneve.vni, 100);
            assert_eq!(t.outer_src_ip, std::net::Ipv4Addr::new(198, 19, 0, 1));
            assert_eq!(&d[0..6], &[2, 0, 0, 0, 1, 2], "to host 2's MAC");
            assert_eq!(
                t.inner,
                &numbered(1, 3, i as u32)[..],
                "the frame inside, in order"
            );
        }

        // a3 -> a1 from host 2: decapsulated to a1.
        for i in 0..50 {
            from_host2(
                &mut h2,
                &mut pool,
                &GeneveRepr::ethernet(100),
                &numbered(3, 1, i),
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        let got = receive(&mut a1, &mut pool, 50);
        let seqs: Vec<u32> = got.iter().map(|d| seq(d)).collect();
        assert_eq!(seqs, (0..50).collect::<Vec<_>>(), "a3 -> a1: all, in order");
        assert_eq!(got[3], numbered(3, 1, 3), "decapsulated intact");
    });
    println!(
        "engines saw a1 send {} and a2 receive {} of 150 and 100",
        run.a1_tx_engine, run.a2_rx_engine
    );
    assert!(run.a1_tx_engine <= 5, "a1's frames went through the kernel");
    assert!(
        run.a2_rx_engine <= 5,
        "frames to a2 went through the kernel"
    );
    // The kernel's counts as /stats shows them: a1 sent 150 (100 to a2, 50 to host 2) and
    // received 50 from host 2; a2 received 100; each frame on one path or the other.
    println!("a1 {:?}\na2 {:?}", run.a1_fast, run.a2_fast);
    assert_eq!(run.a1_fast.tx_packets + run.a1_tx_engine, 150);
    assert_eq!(run.a2_fast.rx_packets + run.a2_rx_engine, 100);
    assert!(run.a1_fast.rx_packets >= 45 && run.a1_fast.rx_packets <= 50);
}

/// A VM's device may come with another switch's hop on its tc ingress: a VM moved from
/// another host brings its device, and a tcx link stays with its device. That hop does not
/// know the device and passes its frames, which ends the chain; this switch's hop goes first,
/// so the VM still takes its fast path (with the hop attached last, the cluster test's moved
/// VM was unreachable: its frames reached neither path).
#[test]
fn a_device_carrying_another_switchs_hop_still_takes_this_switchs_fast_path() {
    let _serial = serial();
    let Some(ns) = testbed() else {
        return;
    };
    // The other host's switch: its hop on a1's device, the device not registered with it.
    let mut other = ns.enter(|| picnic_switch::fastpath::KernelFastPath::load().unwrap());
    ns.enter(|| other.attach_device("pnfa").unwrap());
    let cfg = SWITCH.replace("MAX_PPS", "");
    let (mut a1, mut a2) = (open(&ns, "pnfA"), open(&ns, "pnfB"));
    let mut pool = FramePool::new(1024);
    let run = with_switch(&ns, &cfg, || {
        for i in 0..100 {
            send(&mut a1, &mut pool, &[numbered(1, 2, i)]);
            std::thread::sleep(Duration::from_micros(100));
        }
        let seqs: Vec<u32> = receive(&mut a2, &mut pool, 100)
            .iter()
            .map(|d| seq(d))
            .collect();
        assert_eq!(
            seqs,
            (0..100).collect::<Vec<_>>(),
            "a1 -> a2: all, in order"
        );
    });
    println!("a1 {:?}, engines saw {}", run.a1_fast, run.a1_tx_engine);
    assert!(run.a1_tx_engine <= 5, "a1's frames went through the kernel");
    assert_eq!(run.a1_fast.tx_packets + run.a1_tx_engine, 100);
    drop(other);
}

/// A VM over its packet budget is handed over to the engines when its bucket in the kernel
/// runs dry, and back once its frames have left them; no frame is passed by a later one.
#[test]
fn a_vm_over_its_budget_is_handed_over_and_back_in_order() {
    let _serial = serial();
    let Some(ns) = testbed() else {
        return;
    };
    // a2 may receive 2,000 frames/s: a burst of 300 at once overruns its bucket in the kernel.
    let cfg = SWITCH.replace("MAX_PPS", "max_pps = 2000");
    let (mut a1, mut a2) = (open(&ns, "pnfA"), open(&ns, "pnfB"));
    let mut pool = FramePool::new(2048);
    let run = with_switch(&ns, &cfg, || {
        let burst: Vec<Vec<u8>> = (0..300).map(|i| numbered(1, 2, i)).collect();
        send(&mut a1, &mut pool, &burst);
        let got = receive(&mut a2, &mut pool, 300);
        let seqs: Vec<u32> = got.iter().map(|d| seq(d)).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, sorted, "no frame passed an earlier one");
        println!("burst: {} of 300 delivered", seqs.len());
        // Idle, then frames at a rate within the budget go through the kernel again.
        std::thread::sleep(Duration::from_millis(300));
        for i in 1000..1020 {
            send(&mut a1, &mut pool, &[numbered(1, 2, i)]);
            std::thread::sleep(Duration::from_millis(1));
        }
        let got = receive(&mut a2, &mut pool, 20);
        let seqs: Vec<u32> = got.iter().map(|d| seq(d)).collect();
        assert_eq!(
            seqs,
            (1000..1020).collect::<Vec<_>>(),
            "after: all, in order"
        );
    });
    println!(
        "engines saw a1 send {} and a2 receive {}",
        run.a1_tx_engine, run.a2_rx_engine
    );
    assert!(run.a2_rx_engine > 0, "the excess went through the engines");
    println!("a1 {:?}", run.a1_fast);
    assert!(
        run.a1_fast.handed_tokens > 0,
        "counted as handed over for tokens: {:?}",
        run.a1_fast
    );
    assert_eq!(
        run.a1_fast.tx_packets + run.a1_tx_engine,
        320,
        "every frame of a1 on one path or the other"
    );
    assert!(
        run.a1_tx_engine < 300,
        "the burst's start and the later frames went through the kernel"
    );
}

/// Sends `inner` (with `geneve`) from host 2 to this switch over the uplink.
fn from_host2(uplink: &mut AfPacketPort, pool: &mut FramePool, geneve: &GeneveRepr, inner: &[u8]) {
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: std::net::Ipv4Addr::new(198, 19, 0, 2),
        dst_ip: std::net::Ipv4Addr::new(198, 19, 0, 1),
        src_port: 50000,
        ttl: 64,
    };
    let mut buf = vec![0u8; 256];
    let n = encap(&outer, geneve, inner, &mut buf).unwrap();
    buf.truncate(n);
    send(uplink, pool, &[buf]);
}

/// The sequence numbers of the tunnelled frames (not feedback) that reach host 2's side of
/// the uplink now, up to `max` frames read.
fn receive_tunnelled(
    uplink: &mut AfPacketPort,
    pool: &mut FramePool,
    batch: &mut Vec<Frame>,
    max: usize,
) -> Vec<u32> {
    uplink.recv_batch(pool, batch, max).unwrap();
    let mut seqs = Vec::new();
    for f in batch.drain(..) {
        if let Ok(t) = decap(f.data()) {
            if !t.inner.is_empty() {
                seqs.push(seq(t.inner));
            }
        }
        pool.put(f);
    }
    seqs
}

/// The feedback options among `frames` (Geneve from the uplink).
fn feedback_in(frames: &[Vec<u8>]) -> Vec<FeedbackOption> {
    frames
        .iter()
        .filter_map(|d| decap(d).ok()?.geneve.feedback)
        .collect()
}

/// Frames from another host forwarded in the kernel are metered by the EyeQ receiver all
/// the same (EyeQ 3.2): the switch feeds back to their sending host about their VM although
/// its engines never saw one of them.
#[test]
fn arrivals_in_the_kernel_are_metered_and_fed_back() {
    let _serial = serial();
    let Some(ns) = testbed() else {
        return;
    };
    let cfg = SWITCH.replace("MAX_PPS", "");
    let (mut a1, mut h2) = (open(&ns, "pnfA"), open(&ns, "pnfv"));
    let mut pool = FramePool::new(1024);
    let mut fed_back = Vec::new();
    let run = with_switch(&ns, &cfg, || {
        for i in 0..200 {
            from_host2(
                &mut h2,
                &mut pool,
                &GeneveRepr::ethernet(100),
                &numbered(3, 1, i),
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!(receive(&mut a1, &mut pool, 200).len(), 200, "a3 -> a1: all");
        fed_back = feedback_in(&receive(&mut h2, &mut pool, 3));
    });
    println!(
        "engines saw a1 receive {}; feedback {fed_back:?}",
        run.a1_rx_engine
    );
    assert!(
        run.a1_rx_engine <= 5,
        "frames to a1 went through the kernel"
    );
    assert!(!fed_back.is_empty(), "feedback to host 2 about a1");
    for fb in &fed_back {
        assert_eq!(fb.dst_endpoint, 1, "about a1");
        assert!(fb.rate_bps > 0);
    }
}

/// A receiver's feedback sets a bucket in the kernel for its VM (EyeQ 3.3): a burst to it
/// beyond that rate goes to the engines' limiter, which paces it, instead of to the wire at
/// once; nothing is lost or reordered.
#[test]
fn a_destination_held_by_feedback_is_paced_by_the_engines() {
    let _serial = serial();
    let Some(ns) = testbed() else {
        return;
    };
    let cfg = SWITCH.replace("MAX_PPS", "");
    let (mut a1, mut h2) = (open(&ns, "pnfA"), open(&ns, "pnfv"));
    let mut pool = FramePool::new(1024);
    let mut first_and_last = (std::time::Instant::now(), std::time::Instant::now());
    let run = with_switch(&ns, &cfg, || {
        // Host 2 asks for 2 Mb/s towards a3 (a3 is its VM, so the feedback is its to give).
        let fb = FeedbackOption {
            dst_endpoint: 3,
            rate_bps: 2_000_000,
            seq: 1,
        };
        from_host2(&mut h2, &mut pool, &standalone_feedback(100, fb), &[]);
        std::thread::sleep(Duration::from_millis(20));
        // 100 frames of 60 B at once: about 10 kB, 40 ms at 2 Mb/s.
        let burst: Vec<Vec<u8>> = (0..100).map(|i| numbered(1, 3, i)).collect();
        send(&mut a1, &mut pool, &burst);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let mut batch: Vec<Frame> = Vec::new();
        while got.len() < 100 && std::time::Instant::now() < deadline {
            let seqs = receive_tunnelled(&mut h2, &mut pool, &mut batch, 64);
            if !seqs.is_empty() {
                if got.is_empty() {
                    first_and_last.0 = std::time::Instant::now();
                }
                first_and_last.1 = std::time::Instant::now();
                got.extend(seqs);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(got, (0..100).collect::<Vec<_>>(), "a1 -> a3: all, in order");
    });
    let spread = first_and_last.1 - first_and_last.0;
    println!(
        "engines saw a1 send {} of 100; kernel {:?}; spread over {spread:?}",
        run.a1_tx_engine, run.a1_fast
    );
    // The kernel's bucket holds about 1 ms at 2 Mb/s (250 B): the rest went to the limiter.
    assert!(run.a1_tx_engine >= 90, "the burst went to the engines");
    assert!(
        spread >= Duration::from_millis(20),
        "paced, not sent at once: {spread:?}"
    );
}

/// A VM flooding a destination its receiver holds to 20 Mb/s (a frame within it every
/// 44 us, faster than the switch syncs): what goes beyond the rate is dropped in the kernel, at the sender, once the
/// engines' limiter has overflowed, and the kernel hands the VM back to itself (the switch
/// could never grant an epoch the flood has not moved past), so what is within the rate is
/// forwarded in the kernel too, in order.
#[test]
fn a_flood_beyond_its_destination_rate_is_dropped_at_its_sender_and_the_rest_kept_in_the_kernel() {
    let _serial = serial();
    let Some(ns) = testbed() else {
        return;
    };
    let cfg = SWITCH.replace("MAX_PPS", "");
    let (mut a1, mut h2) = (open(&ns, "pnfA"), open(&ns, "pnfv"));
    let mut pool = FramePool::new(4096);
    let mut got = Vec::new();
    let run = with_switch(&ns, &cfg, || {
        let mut batch: Vec<Frame> = Vec::new();
        let mut next = 0u32;
        // 600 ms at about 50,000 frames/s, 5 frames every 100 us, twice the rate; feedback
        // every 20 ms.
        let start = std::time::Instant::now();
        let mut fed_back = 0;
        while start.elapsed() < Duration::from_millis(600) {
            let ms = start.elapsed().as_millis() as u32;
            if ms >= fed_back * 20 {
                fed_back += 1;
                let fb = FeedbackOption {
                    dst_endpoint: 3,
                    rate_bps: 20_000_000,
                    seq: fed_back,
                };
                from_host2(&mut h2, &mut pool, &standalone_feedback(100, fb), &[]);
            }
            let burst: Vec<Vec<u8>> = (next..next + 5).map(|i| numbered(1, 3, i)).collect();
            next += 5;
            send(&mut a1, &mut pool, &burst);
            got.extend(receive_tunnelled(&mut h2, &mut pool, &mut batch, 256));
            let until = std::time::Instant::now() + Duration::from_micros(100);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        }
    });
    let f = run.a1_fast;
    println!(
        "h2 got {} frames; engines saw a1 send {}; kernel {f:?}",
        got.len(),
        run.a1_tx_engine
    );
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "no frame passed an earlier one"
    );
    // 20 Mb/s of 110 B frames on the wire for 0.6 s is about 13,600 frames.
    assert!(
        (8_000..20_000).contains(&got.len()),
        "about the destination's rate delivered: {}",
        got.len()
    );
    assert!(
        f.tx_dropped > 5_000,
        "the flood dropped at the sender: {f:?}"
    );
    assert!(
        f.tx_packets > run.a1_tx_engine,
        "most of what went out went through the kernel: kernel {} engines {}",
        f.tx_packets,
        run.a1_tx_engine
    );
}
