//! The softirq accounting: the tracepoint programs attribute the kernel's receive softirq
//! time to the port and direction it was spent for, and a running switch charges it to the
//! tenants (Iron 3.1).

use std::time::Duration;

use crate::common::{have_ebpf, is_root, Netns};
use crate::{geneve_to, B1};
use picnic_switch::frame::FramePool;
use picnic_switch::port::{AfPacketOptions, AfPacketPort, Port};

/// The calling thread's id.
fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Sends 64 B frames through `port` for `how_long`, as fast as the kernel takes them;
/// returns how many it sent.
fn flood(port: &mut AfPacketPort, pool: &mut FramePool, how_long: Duration) -> u64 {
    let frame = geneve_to(1, B1, 0); // any 64 B+ frame: nobody on the far side parses it
    let end = std::time::Instant::now() + how_long;
    let mut batch = Vec::new();
    while std::time::Instant::now() < end {
        while batch.len() < 64 {
            let mut f = pool.get().unwrap();
            f.fill_from(&frame[..64]);
            batch.push(f);
        }
        port.send_batch(&mut batch, pool).unwrap();
    }
    for f in batch.drain(..) {
        pool.put(f);
    }
    port.stats().tx_frames
}

/// From inside a VM's namespace: sends 64 B UDP frames from a1 (02:..:a1, 198.18.0.1) to a
/// MAC nobody has (the switch drops them) through `ifname` for `how_long`.
pub(crate) fn flood_from_a1(ifname: &str, how_long: Duration) {
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0xa1], [2, 0, 0, 0, 0, 0xee])
        .ipv4([198, 18, 0, 1], [198, 18, 0, 99], 64)
        .udp(40000, 7)
        .write(&mut frame, &[0u8; 18])
        .unwrap();
    let mut port = AfPacketPort::open(ifname, AfPacketOptions::default()).unwrap();
    let mut pool = FramePool::new(1024);
    let end = std::time::Instant::now() + how_long;
    let mut batch = Vec::new();
    while std::time::Instant::now() < end {
        while batch.len() < 64 {
            let mut f = pool.get().unwrap();
            f.fill_from(&frame);
            batch.push(f);
        }
        port.send_batch(&mut batch, &mut pool).unwrap();
    }
}

/// Packets interface `ifname` of `ns` received (/proc/thread-self/net/dev: this thread's
/// namespace, where /sys would show the host's).
fn rx_packets(ns: &Netns, ifname: &str) -> u64 {
    ns.enter(|| {
        let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        let line = dev
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{ifname}:")))
            .unwrap();
        let fields: Vec<&str> = line.split(':').nth(1).unwrap().split_whitespace().collect();
        fields[1].parse().unwrap()
    })
}

/// The softirq programs see both directions of a veth port: a VM's frames received on the
/// switch-side end (from VM), the switch's frames received on the VM-side peer in another
/// namespace (to VM); the switch's own thread's softirq time is kept apart; every packet the
/// switch-side end received is counted once; an idle port gets nothing.
#[test]
fn softirq_time_is_attributed_to_the_port_and_direction_it_was_spent_for() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let (sw, vm) = (Netns::new(), Netns::new());
    for (a, b) in [("pnsa", "pnsb"), ("pnsc", "pnsd")] {
        sw.veth_pair(a, b);
        sw.ip(&format!("link set {b} netns {}", vm.name));
        vm.ip(&format!("link set {b} up"));
    }
    let mut acct = sw
        .enter(picnic_switch::ebpf::SoftirqAccounting::open)
        .unwrap();
    let index = |name: &str| {
        let name = std::ffi::CString::new(name).unwrap();
        // SAFETY: `name` is NUL-terminated and outlives the call.
        sw.enter(|| unsafe { libc::if_nametoindex(name.as_ptr()) })
    };
    // Registered from a thread in the switch's namespace (the one `open` saw).
    acct.set_ports(&[(index("pnsa"), 1), (index("pnsc"), 2)])
        .unwrap();
    let mut usage = Vec::new();
    acct.new_usage(&mut usage);
    let before = rx_packets(&sw, "pnsa");

    // The VM behind pnsa floods its port for a second.
    let (sent, flooder) = vm.enter(|| {
        let mut port = AfPacketPort::open("pnsb", AfPacketOptions::default()).unwrap();
        let sent = flood(&mut port, &mut FramePool::new(1024), Duration::from_secs(1));
        (sent, gettid())
    });
    std::thread::sleep(Duration::from_millis(100));
    let received = rx_packets(&sw, "pnsa") - before;
    acct.new_usage(&mut usage);
    println!("after the VM's flood ({sent} sent, {received} received): {usage:?}");
    let a = usage
        .iter()
        .find(|d| d.slot == 1)
        .expect("port 1 has usage");
    assert_eq!(a.packets, received, "each received frame once");
    assert!(
        a.from_vm_ns > 10_000_000,
        "a second's flood costs > 10 ms: {a:?}"
    );
    assert!(a.from_vm_ns > 20 * a.to_vm_ns, "{a:?}");
    // The kernel ran that work in the flooding thread's time slices (a veth's receive runs
    // when its sender re-enables softirqs), except what ksoftirqd took over: the scheduler
    // charged it to the flooder, which Iron's Algorithm 2 credits back.
    let mut in_threads = Vec::new();
    acct.new_in_threads(&[vec![flooder], vec![]], &mut in_threads);
    println!("of it in the flooding thread's context: {in_threads:?}");
    let in_context = a.from_vm_ns + a.to_vm_ns - a.kthread_ns;
    assert!(
        in_threads[0] >= in_context * 8 / 10 && in_threads[0] <= in_context,
        "{in_threads:?} of {in_context} ns"
    );
    assert_eq!(in_threads[1], 0, "no thread, no time");
    acct.new_in_threads(&[vec![flooder]], &mut in_threads);
    assert_eq!(in_threads, [0], "counted once");
    let idle = usage
        .iter()
        .find(|d| d.slot == 2)
        .copied()
        .unwrap_or_default();
    assert!(
        a.from_vm_ns >= 10 * (idle.from_vm_ns + idle.to_vm_ns).max(1),
        "idle port {idle:?}"
    );

    // The switch's frames to the VM: from a thread that is not the switch's dataplane they
    // are charged to the port (to VM); from the dataplane thread they are its own time.
    let mut to_vm = |as_switch: bool| {
        sw.enter(|| {
            if as_switch {
                acct.set_switch_thread(gettid()).unwrap();
            }
            let mut port = AfPacketPort::open("pnsa", AfPacketOptions::default()).unwrap();
            flood(
                &mut port,
                &mut FramePool::new(1024),
                Duration::from_millis(500),
            );
            acct.set_switch_thread(0).unwrap();
        });
        std::thread::sleep(Duration::from_millis(100));
        acct.new_usage(&mut usage);
        usage
            .iter()
            .find(|d| d.slot == 1)
            .copied()
            .unwrap_or_default()
    };
    let other = to_vm(false);
    println!("switch -> VM from another thread: {other:?}");
    assert!(other.to_vm_ns > 5_000_000, "{other:?}");
    assert!(
        other.to_vm_ns > 10 * (other.from_vm_ns + other.in_switch_ns),
        "{other:?}"
    );
    let own = to_vm(true);
    println!("switch -> VM from the dataplane thread: {own:?}");
    assert!(own.in_switch_ns > 5_000_000, "{own:?}");
    // Only what ksoftirqd took over from the dataplane thread is charged.
    assert!(own.in_switch_ns > 5 * own.to_vm_ns, "{own:?}");
    let t = acct.totals();
    println!("totals: {t:?}");
    assert!(t.attributed_ns + t.switch_ns + t.untracked_ns <= t.net_rx_ns + 1_000_000);
}

/// A switch with an AF_PACKET uplink and two tenants of one VM each; `a1` is the flooder.
pub(crate) const SWITCH: &str = r#"
[switch]
host_id = 1
# What is tested is the engines' path: the kernel fast path (the default) would carry
# these frames past them.
[fastpath]
kernel = false
[uplink]
ifname = "pnwu"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "a"
vni = 100
cpu_quota = 1.0
[[tenants]]
name = "b"
vni = 200
cpu_quota = 1.0
[[vms]]
name = "a1"
id = 1
tenant = "a"
host = 1
mac = "02:00:00:00:00:a1"
ip = "198.18.0.1"
port = { ifname = "pnwa" }
[[vms]]
name = "b1"
id = 2
tenant = "b"
host = 1
mac = "02:00:00:00:00:b1"
ip = "198.18.0.2"
port = { ifname = "pnwc" }
"#;

/// Softirq time of all CPUs so far (/proc/stat, sampled on the scheduler tick), ns.
fn proc_stat_softirq_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    // user nice system idle iowait irq softirq, in USER_HZ (100 per second) units.
    cpu[6] * 10_000_000
}

/// The kernel's tick period (CONFIG_HZ), ns; 10 ms (HZ 100, the coarsest) when unknown.
fn tick_ns() -> f64 {
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null | grep '^CONFIG_HZ='",
        ])
        .output()
        .ok();
    let hz = out
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().strip_prefix("CONFIG_HZ=")?.parse::<f64>().ok())
        .unwrap_or(100.0);
    1e9 / hz
}

/// Iron on a running switch: a VM flooding its port makes its tenant's softirq charge grow
/// (in /stats, and in the tenant's CPU charge), an idle tenant's does not, and the softirq
/// time attributed is no more than the kernel's softirq time over the same interval.
#[test]
fn a_flooding_tenant_is_charged_its_ports_softirq_time_on_a_running_switch() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let (sw, vm) = (Netns::new(), Netns::new());
    sw.veth_pair("pnwu", "pnwv");
    for (a, b) in [("pnwa", "pnwb"), ("pnwc", "pnwd")] {
        sw.veth_pair(a, b);
        sw.ip(&format!("link set {b} netns {}", vm.name));
        vm.ip(&format!("link set {b} up"));
    }
    let cfg = picnic_switch::config::Config::parse(SWITCH).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (published, on, stat_ns, wall) = std::thread::scope(|s| {
        let stat_before = proc_stat_softirq_ns();
        let started = std::time::Instant::now();
        s.spawn(|| {
            sw.enter(|| {
                let mut switch = picnic_switch::runner::Switch::open(cfg).unwrap();
                let on = switch
                    .describe_ports()
                    .iter()
                    .any(|l| l.contains("softirq"));
                tx.send((switch.stop_flag(), switch.shared(), on)).unwrap();
                switch.run().unwrap();
            })
        });
        let (stop, shared, on) = rx.recv().unwrap();
        if on {
            // a1's VM sends 64 B frames to a MAC nobody has (the switch drops them).
            vm.enter(|| flood_from_a1("pnwb", Duration::from_secs(2)));
            std::thread::sleep(Duration::from_millis(300));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // The scope joins the switch, which publishes once more as it stops.
        (shared, on, stat_before, started)
    });
    assert!(on, "softirq accounting loads (see the switch's line above)");
    let stat_ns = proc_stat_softirq_ns() - stat_ns;
    let wall_ns = wall.elapsed().as_nanos() as f64;
    let snap = published.latest().unwrap();
    let tenant = |n: &str| {
        snap.switch
            .tenants
            .iter()
            .find(|t| t.name == n)
            .unwrap()
            .clone()
    };
    let (a, b) = (tenant("a"), tenant("b"));
    let totals = snap
        .switch
        .switch
        .softirq
        .expect("softirq totals in /stats");
    println!(
        "a: softirq {:.1} ms, charged {:.1} ms; b: softirq {:.1} ms; totals {totals:?}; \
         /proc/stat softirq {:.1} ms",
        a.softirq_ns as f64 / 1e6,
        a.cpu_charged_ns as f64 / 1e6,
        b.softirq_ns as f64 / 1e6,
        stat_ns as f64 / 1e6
    );
    let a1 = &snap
        .switch
        .vms
        .iter()
        .find(|v| v.name == "a1")
        .unwrap()
        .counters;
    println!(
        "a1: {} frames into the switch, {} in softirq: switch {:.0} ns/frame, softirq {:.0} \
         ns/packet",
        a1.tx_packets,
        a1.softirq_packets,
        a1.cost_ns as f64 / a1.tx_packets.max(1) as f64,
        a1.softirq_ns as f64 / a1.softirq_packets.max(1) as f64
    );
    assert!(a.softirq_ns > 20_000_000, "2 s of flood cost > 20 ms");
    assert!(
        a.softirq_ns >= 10 * b.softirq_ns,
        "idle b: {} ns",
        b.softirq_ns
    );
    assert!(
        a.cpu_charged_ns >= a.softirq_ns,
        "the charge includes the softirq time"
    );
    assert!(totals.attributed_ns <= totals.net_rx_ns);
    // /proc/stat samples the state of each CPU on every tick: the count of softirq ticks
    // out of N is binomial, so it may fall short of the true time by up to 3 standard
    // deviations (sqrt(N p (1 - p)) ticks), plus 10 ms of USER_HZ rounding.
    let tick = tick_ns();
    let n = wall_ns * cpus / tick;
    let p = (stat_ns as f64 / (wall_ns * cpus)).clamp(0.01, 0.99);
    let margin = 3.0 * (n * p * (1.0 - p)).sqrt() * tick + 10e6;
    println!("margin {:.1} ms ({n:.0} ticks, p {p:.3})", margin / 1e6);
    assert!(
        (a.softirq_ns + b.softirq_ns) as f64 <= stat_ns as f64 + margin,
        "attributed {} ns > kernel softirq {stat_ns} ns + {margin:.0}",
        a.softirq_ns + b.softirq_ns
    );
}

/// CPU time of the calling thread, ns (softirq work it runs included: this kernel has no
/// IRQ_TIME_ACCOUNTING).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A measurement, not a check (docs/BENCHMARKS.md): what the softirq programs add to every
/// packet the host receives. A VM floods a veth port for 1 s, alternately without and with
/// the programs attached; the sending thread's CPU per frame includes the receive softirq
/// it runs. `cargo test --release -p picnic-switch --test ebpf tracepoint_cost -- --ignored
/// --nocapture` (root).
#[test]
#[ignore]
fn tracepoint_cost() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let (sw, vm) = (Netns::new(), Netns::new());
    sw.veth_pair("pnoa", "pnob");
    sw.ip(&format!("link set pnob netns {}", vm.name));
    vm.ip("link set pnob up");
    for round in 0..6 {
        let on = round % 2 == 1;
        let _programs = on.then(|| {
            let mut a = sw
                .enter(picnic_switch::ebpf::SoftirqAccounting::open)
                .unwrap();
            // SAFETY: a NUL-terminated name that outlives the call.
            let index = sw.enter(|| unsafe { libc::if_nametoindex(c"pnoa".as_ptr()) });
            a.set_ports(&[(index, 1)]).unwrap();
            a
        });
        let (sent, cpu) = vm.enter(|| {
            let mut port = AfPacketPort::open("pnob", AfPacketOptions::default()).unwrap();
            let start = thread_cpu_ns();
            let sent = flood(&mut port, &mut FramePool::new(1024), Duration::from_secs(1));
            (sent, thread_cpu_ns() - start)
        });
        println!(
            "programs {}: {sent} frames, {:.0} ns of the sender's CPU per frame (send and \
             receive softirq)",
            if on { "on " } else { "off" },
            cpu as f64 / sent as f64
        );
    }
}

/// Issue 15: a CPU quota given through a live change starts the softirq accounting as a
/// start-up config with that quota would: a switch started without quotas has it off; once
/// tenant a gets one, a flood from a1's VM is charged to a as softirq time.
#[test]
fn a_quota_given_live_starts_the_softirq_accounting() {
    if !is_root() || !have_ebpf() {
        return;
    }
    let (sw, vm) = (Netns::new(), Netns::new());
    sw.veth_pair("pnwu", "pnwv");
    for (a, b) in [("pnwa", "pnwb"), ("pnwc", "pnwd")] {
        sw.veth_pair(a, b);
        sw.ip(&format!("link set {b} netns {}", vm.name));
        vm.ip(&format!("link set {b} up"));
    }
    let with_quota = picnic_switch::config::Config::parse(SWITCH).unwrap();
    let mut without = with_quota.clone();
    without.tenants.iter_mut().for_each(|t| t.cpu_quota = None);
    let (tx, rx) = std::sync::mpsc::channel();
    let published = std::thread::scope(|s| {
        s.spawn(|| {
            sw.enter(|| {
                let mut switch = picnic_switch::runner::Switch::open(without).unwrap();
                let on = switch
                    .describe_ports()
                    .iter()
                    .any(|l| l.contains("softirq"));
                let commands = switch.command_channel();
                tx.send((switch.stop_flag(), switch.shared(), on, commands))
                    .unwrap();
                switch.run().unwrap();
            })
        });
        let (stop, shared, on, commands) = rx.recv().unwrap();
        assert!(!on, "no quota at start: softirq accounting off");
        let mut quota = with_quota.clone();
        quota.tenants[1].cpu_quota = None;
        crate::common::reconfigure(&commands, &quota).unwrap();
        vm.enter(|| flood_from_a1("pnwb", Duration::from_secs(1)));
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        shared
    });
    let snap = published.latest().unwrap();
    assert!(
        snap.switch.switch.softirq.is_some(),
        "softirq totals in /stats: the accounting runs"
    );
    let a = snap.switch.tenants.iter().find(|t| t.name == "a").unwrap();
    println!("tenant a after its live quota: softirq {} ns", a.softirq_ns);
    assert!(a.softirq_ns > 0, "a's ports' softirq time is charged to a");
}
