//! Overload (issue "Hardening"): a neighbour offers 64 B frames at ten times its packet
//! budget (`max_pps`) while a victim sends small and bulk frames (1,000 and 5,000 frames/s)
//! through the same switch. After a
//! warm-up the process's resident memory, descriptors and frame pool stay flat (within 5%), the victim loses nothing
//! and keeps its latency SLO through the switch, and the counters conserve: every frame the
//! VMs handed to the switch was delivered or dropped with a reason. In-memory ports, no root.
//!
//! `OVERLOAD_SECS` sets the length (default 5 s; the documented runs are 60 s of overload and
//! a 30-minute soak):
//! `OVERLOAD_SECS=60 cargo test --release -p picnic-switch --test overload -- --nocapture`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::udp;
use picnic_switch::config::Config;

/// The noisy VM's packet budget, frames/s; it offers ten times as many.
const BUDGET_PPS: u64 = 20_000;
/// The victim's rate of small frames, frames/s...
const VICTIM_PPS: u64 = 1_000;
/// ...each followed by this many 1400 B frames (mixed traffic: 57 Mb/s of bulk).
const VICTIM_BULK_PER_FRAME: u64 = 5;

const CONFIG: &str = r#"
[switch]
host_id = 1
# What is tested is the engines' path: the kernel fast path (the default) would carry
# these frames past them.
[fastpath]
kernel = false
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "victim"
vni = 100
slo = { min_bps = 0, latency_us = 1000, max_loss = 0.0 }
[[tenants]]
name = "noisy"
vni = 200
[[vms]]
name = "v1"
id = 1
tenant = "victim"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "v1" }
[[vms]]
name = "v2"
id = 2
tenant = "victim"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = { ifname = "v2" }
[[vms]]
name = "n1"
id = 3
tenant = "noisy"
host = 1
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
port = { ifname = "n1" }
max_pps = 20000
[[vms]]
name = "n2"
id = 4
tenant = "noisy"
host = 1
mac = "02:00:00:00:00:04"
ip = "198.18.0.4"
port = { ifname = "n2" }
"#;

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Sleeps until `t` (a short spin at the end keeps the pacing close).
fn pace_until(t: Instant) {
    let now = Instant::now();
    if t > now + Duration::from_micros(200) {
        std::thread::sleep(t - now - Duration::from_micros(100));
    }
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}

#[test]
fn ten_times_overload_keeps_memory_flat_the_victim_whole_and_the_counters_conserved() {
    let secs: u64 = std::env::var("OVERLOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(3);
    let cfg = Config::parse(CONFIG).unwrap();
    let (mut switch, handles) = common::memory_switch(cfg, &["up0", "v1", "v2", "n1", "n2"]);
    let (stop, shared) = (switch.stop_flag(), switch.shared());
    let dataplane = std::thread::spawn(move || switch.run().unwrap());

    let running = Arc::new(AtomicBool::new(true));
    // Frames the noisy VM got into its port, and those its full port refused (the kernel's
    // drop at the sender: the switch never saw them).
    let (noisy_in, noisy_refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let noisy = {
        let (running, n1) = (running.clone(), handles[3].clone());
        let (ok, refused) = (noisy_in.clone(), noisy_refused.clone());
        let frame = udp(3, 4, 18); // 64 B on the wire with the FCS
        std::thread::spawn(move || {
            let (start, per_ms) = (Instant::now(), 10 * BUDGET_PPS / 1_000);
            let mut ms = 0u64;
            while running.load(Ordering::Relaxed) {
                for _ in 0..per_ms {
                    if n1.inject(&frame) {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                ms += 1;
                pace_until(start + Duration::from_millis(ms));
            }
        })
    };
    // The victim sends and both receivers drain what the switch delivered.
    let victim = {
        let running = running.clone();
        let (v1, v2, n2) = (handles[1].clone(), handles[2].clone(), handles[4].clone());
        let (frame, bulk) = (udp(1, 2, 64), udp(1, 2, 1400));
        std::thread::spawn(move || {
            let (start, mut sent, mut bulk_sent, mut received, mut noisy_delivered) =
                (Instant::now(), 0u64, 0u64, 0u64, 0u64);
            let period = Duration::from_nanos(1_000_000_000 / VICTIM_PPS);
            while running.load(Ordering::Relaxed) {
                assert!(v1.inject(&frame), "the victim's own port is never full");
                sent += 1;
                // Mixed traffic: bulk 1400 B frames beside the small ones.
                for _ in 0..VICTIM_BULK_PER_FRAME {
                    assert!(v1.inject(&bulk), "the victim's own port is never full");
                }
                bulk_sent += VICTIM_BULK_PER_FRAME;
                pace_until(start + period * sent as u32);
                while v2.pop_sent().is_some() {
                    received += 1;
                }
                while n2.pop_sent().is_some() {
                    noisy_delivered += 1;
                }
            }
            // What was still on its way when the senders stopped.
            std::thread::sleep(Duration::from_millis(300));
            received += std::iter::from_fn(|| v2.pop_sent()).count() as u64;
            noisy_delivered += std::iter::from_fn(|| n2.pop_sent()).count() as u64;
            (sent + bulk_sent, received, noisy_delivered)
        })
    };

    // Resident memory, descriptors and free frames once a second after a second of
    // warm-up; progress every minute on long runs.
    let start = Instant::now();
    let (mut rss, mut fd_counts, mut pool_free) = (Vec::new(), Vec::new(), Vec::new());
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        if start.elapsed() > Duration::from_millis(1_500) {
            rss.push(rss_kib());
            fd_counts.push(fds());
            if let Some(p) = shared.latest() {
                pool_free.push(p.pool_free);
            }
        }
        let s = start.elapsed().as_secs();
        if s % 60 == 0 && s > 0 {
            eprintln!("overload: {s} of {secs} s, RSS {} KiB", rss_kib());
        }
    }
    running.store(false, Ordering::Relaxed);
    noisy.join().unwrap();
    let (sent, received, noisy_delivered) = victim.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap();

    let published = shared.latest().unwrap();
    let snap = &published.switch;
    let vm = |name: &str| snap.vms.iter().find(|v| v.name == name).unwrap();
    let (n1, n2) = (vm("n1"), vm("n2"));
    let noisy_drops: u64 = n1.counters.drops.iter().map(|(_, n)| n).sum::<u64>()
        + n2.counters.drops.iter().map(|(_, n)| n).sum::<u64>();
    let in_port = published.ports.iter().find(|p| p.name == "n1").unwrap();
    let out_port = published.ports.iter().find(|p| p.name == "n2").unwrap();
    let (min_rss, max_rss) = (*rss.iter().min().unwrap(), *rss.iter().max().unwrap());
    let slo = published
        .slo
        .tenants
        .iter()
        .find(|t| t.tenant == "victim")
        .unwrap();
    println!(
        "{secs} s: noisy offered {} frames ({} refused by its full port), took {} into the \
         switch, {} delivered, {} dropped by reason {:?}, {} unread in its port; victim sent \
         {sent}, received {received}, latency through the switch p99 {:?} us; RSS {min_rss}-{max_rss} KiB, \
         descriptors {:?}, free frames {:?}..{:?} of {}",
        noisy_in.load(Ordering::Relaxed) + noisy_refused.load(Ordering::Relaxed),
        noisy_refused.load(Ordering::Relaxed),
        n1.counters.tx_packets,
        noisy_delivered,
        noisy_drops,
        n1.counters
            .drops
            .iter()
            .chain(n2.counters.drops.iter())
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{}={n}", r.as_str()))
            .collect::<Vec<_>>(),
        in_port.stats.rx_dropped,
        slo.totals.latency_p99_us,
        fd_counts.iter().max(),
        pool_free.iter().min(),
        pool_free.iter().max(),
        published.pool_capacity,
    );
    // The overload was real: the noisy VM offered ten times what it may send.
    let offered = noisy_in.load(Ordering::Relaxed) + noisy_refused.load(Ordering::Relaxed);
    assert!(
        offered as f64 >= 9.0 * (BUDGET_PPS * secs) as f64,
        "offered only {offered}"
    );
    // The noisy VM got no more than its budget through (one burst of slack).
    assert!(
        noisy_delivered <= BUDGET_PPS * secs + BUDGET_PPS / 10,
        "{noisy_delivered} delivered"
    );
    // The victim lost nothing and kept its latency bound through the switch.
    assert_eq!(received, sent, "the victim lost frames");
    assert!(
        slo.totals.latency_p99_us.is_some_and(|p99| p99 <= 1_000.0),
        "victim p99 through the switch {:?} us",
        slo.totals.latency_p99_us
    );
    // Descriptors flat, the pool never ran dry, and every frame is back in it once the
    // queues drained.
    assert_eq!(
        fd_counts.iter().min(),
        fd_counts.iter().max(),
        "descriptors changed"
    );
    assert!(
        pool_free.iter().all(|&f| f > 0),
        "the frame pool ran dry: {:?}",
        pool_free.iter().min()
    );
    assert_eq!(
        published.pool_free, published.pool_capacity,
        "frames not returned to the pool"
    );
    // Memory flat after warm-up.
    assert!(
        max_rss as f64 <= min_rss as f64 * 1.05,
        "resident memory grew from {min_rss} to {max_rss} KiB"
    );
    // Conservation: what the noisy VM offered was taken by the switch or refused by its full
    // port, and the port counted every refusal (the kernel's `tp_drops` on a real port).
    assert_eq!(
        in_port.stats.rx_dropped,
        noisy_refused.load(Ordering::Relaxed)
    );
    assert_eq!(in_port.stats.rx_frames + in_port.stats.rx_dropped, offered);
    // What the noisy VM handed the switch was delivered or dropped with a
    // reason (the switch stopped with its queues drained), and what n2's port sent arrived.
    assert_eq!(
        n1.counters.tx_packets,
        n2.counters.rx_packets + noisy_drops,
        "frames taken = delivered + dropped by reason"
    );
    assert_eq!(
        out_port.stats.tx_frames, noisy_delivered,
        "frames n2's port sent = frames collected at its far end"
    );
}
