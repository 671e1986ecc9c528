//! Iron 3.1 on a running switch: every nanosecond of the dataplane thread's CPU is charged to
//! a VM, to frames of nobody, or to the loop's own overhead, and that total agrees with what
//! the kernel reports for the thread (/proc/thread-self/schedstat). In-memory ports, no root.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::udp;
use picnic_switch::config::Config;
use picnic_switch::port::MemoryPortHandle;
use picnic_switch::runner::Shared;

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
name = "small"
vni = 100
[[tenants]]
name = "large"
vni = 200
[[vms]]
name = "s1"
id = 1
tenant = "small"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "s1" }
[[vms]]
name = "s2"
id = 2
tenant = "small"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = { ifname = "s2" }
[[vms]]
name = "l1"
id = 3
tenant = "large"
host = 1
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
port = { ifname = "l1" }
[[vms]]
name = "l2"
id = 4
tenant = "large"
host = 1
mac = "02:00:00:00:00:04"
ip = "198.18.0.4"
port = { ifname = "l2" }
"#;

/// A switch over in-memory ports (uplink, s1, s2, l1, l2) running on its own thread, which
/// returns its CPU time as the kernel accounts it over the run, ns.
fn start(
    cfg: Config,
) -> (
    Vec<MemoryPortHandle>,
    Arc<AtomicBool>,
    Arc<Shared>,
    std::thread::JoinHandle<u64>,
) {
    let (mut switch, handles) = common::memory_switch(cfg, &["up0", "s1", "s2", "l1", "l2"]);
    let (stop, shared) = (switch.stop_flag(), switch.shared());
    let dataplane = std::thread::spawn(move || {
        let before = schedstat_ns();
        switch.run().unwrap();
        schedstat_ns() - before
    });
    (handles, stop, shared, dataplane)
}

/// The thread's CPU time as the scheduler accounts it, ns.
fn schedstat_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn charges_add_up_to_the_threads_cpu_time_the_kernel_reports() {
    let (handles, stop, shared, dataplane) = start(Config::parse(CONFIG).unwrap());
    // A mixed load: 64 B frames from s1 to s2 and 1400 B frames from l1 to l2, drained on
    // the far side, for a second and a half.
    let (small, large) = (udp(1, 2, 64), udp(3, 4, 1400));
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        for _ in 0..16 {
            handles[1].inject(&small);
            handles[3].inject(&large);
        }
        while handles[2].pop_sent().is_some() {}
        while handles[4].pop_sent().is_some() {}
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    let kernel_ns = dataplane.join().unwrap();
    let published = shared.latest().unwrap();
    let snap = &published.switch;
    let charged: u64 = snap.vms.iter().map(|v| v.counters.cost_ns).sum();
    let c = &snap.switch;
    println!(
        "thread CPU {:.1} ms (kernel), {:.1} ms (measured): VMs {:.1}, unattributed {:.1}, \
         overhead {:.1}; model {:?}",
        kernel_ns as f64 / 1e6,
        c.cpu_ns as f64 / 1e6,
        charged as f64 / 1e6,
        c.unattributed_ns as f64 / 1e6,
        c.overhead_ns as f64 / 1e6,
        snap.cost_model
    );
    // Exact by construction: the split never loses or invents a nanosecond.
    assert_eq!(charged + c.unattributed_ns + c.overhead_ns, c.cpu_ns);
    // And what was split is the thread's CPU time as the kernel counts it, within 5%.
    let err = (c.cpu_ns as f64 - kernel_ns as f64).abs() / kernel_ns as f64;
    assert!(
        err < 0.05,
        "measured {} ns, kernel {kernel_ns} ns",
        c.cpu_ns
    );
    // Both tenants' VMs were charged for their frames (sender and receiver side).
    for v in &snap.vms {
        assert!(v.counters.cost_ns > 0, "{} charged nothing", v.name);
    }
}

/// Iron 3.2 end to end with a real cgroup (root, cgroup v1 cpu controller): a tenant with a
/// 0.3-core allocation floods its own VMs while a thread of the tenant burns CPU in its
/// group; the switch drives the group's refills (kernel period 1 s, one budget written per
/// 10 ms period), lowers each budget below the allocation by the work it does for the
/// tenant, so that the tenant's thread and the switch's work for it together stay within the
/// allocation; it never charges the tenant more than its allocation per period, drops its
/// frames before any work once it is spent, and gives the allocation back when it stops.
#[test]
fn a_tenants_cgroup_pays_for_the_switch_work_done_for_it() {
    let root = std::path::Path::new("/sys/fs/cgroup/cpu");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !root.join("cpu.cfs_quota_us").exists() {
        eprintln!(
            "skipped: needs root and the cgroup v1 cpu controller at {}",
            root.display()
        );
        return;
    }
    let group = root.join(format!("picnic-accounting-test-{}", std::process::id()));
    std::fs::create_dir_all(&group).unwrap();
    let read = |f: &str| -> u64 {
        std::fs::read_to_string(group.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let text = CONFIG.replace(
        "name = \"small\"\nvni = 100",
        &format!(
            "name = \"small\"\nvni = 100\ncpu_quota = 0.3\ncgroup = \"{}\"",
            group.display()
        ),
    );
    let (handles, stop, shared, dataplane) = start(Config::parse(&text).unwrap());
    let small = udp(1, 2, 64);
    // The tenant's own work: a thread in its group burning CPU for the whole run.
    let burning = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let tasks = group.join("tasks");
    let burner = {
        let burning = burning.clone();
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            std::fs::write(&tasks, tid.to_string()).unwrap();
            let mut x = 0u64;
            while burning.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            picnic_switch::runner::thread_cpu_ns()
        })
    };
    let start = Instant::now();
    let mut lowest_quota = u64::MAX;
    while start.elapsed() < Duration::from_millis(1000) {
        while handles[1].inject(&small) {}
        while handles[2].pop_sent().is_some() {}
        if start.elapsed() > Duration::from_millis(100) {
            lowest_quota = lowest_quota.min(read("cpu.cfs_quota_us"));
            assert_eq!(read("cpu.cfs_period_us"), 1_000_000);
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    let elapsed = start.elapsed();
    burning.store(false, Ordering::Relaxed);
    let burned_ns = burner.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap();
    let restored = read("cpu.cfs_quota_us");
    let restored_period = read("cpu.cfs_period_us");
    std::fs::remove_dir(&group).unwrap();
    let published = shared.latest().unwrap();
    let snap = &published.switch;
    let tenant = snap.tenants.iter().find(|t| t.name == "small").unwrap();
    println!(
        "lowest quota {lowest_quota} us of 3000; charged {:.1} ms, tenant thread {:.1} ms \
         in {:.0} ms; throttled drops {}",
        tenant.cost_ns as f64 / 1e6,
        burned_ns as f64 / 1e6,
        elapsed.as_secs_f64() * 1e3,
        tenant.cpu_throttle_drops
    );
    assert!(
        lowest_quota < 3000,
        "the quota never went below the allocation"
    );
    assert!(lowest_quota >= 1000, "cgroup v1's minimum");
    assert_eq!(restored, 3000, "the allocation is given back at stop");
    assert_eq!(restored_period, 10_000, "with the accounting period");
    // The thread and the switch's work for the tenant share the allocation (0.3 cores): the
    // budget written each period is what is left of it. Margin: the first 100 ms before the
    // first charge, one period's overrun, the kernel's own refill once a second.
    let allocation_ns = elapsed.as_nanos() as f64 * 0.3;
    let used_ns = (burned_ns + tenant.cost_ns) as f64;
    assert!(
        used_ns <= allocation_ns * 1.1 + 5e6,
        "tenant thread {burned_ns} ns + switch work {} ns exceed the allocation {allocation_ns} ns",
        tenant.cost_ns
    );
    // Charged at most its allocation (less the group's 1 ms minimum) per 10 ms period, plus
    // one period of debt.
    let periods = elapsed.as_nanos() as u64 / 10_000_000 + 2;
    assert!(
        tenant.cost_ns <= periods * 2_000_000,
        "{} ns",
        tenant.cost_ns
    );
}
