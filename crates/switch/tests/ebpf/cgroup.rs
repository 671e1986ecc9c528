//! Iron 3.2 with two workers: a tenant's kernel receive work (softirq) is charged to its one
//! account and so to its cgroup, and the part the kernel ran in the group's own threads is
//! credited back, as with one loop.

use std::time::Duration;

use crate::common::{have_ebpf, is_root, Netns};
use crate::softirq::{flood_from_a1, SWITCH};

/// Sets the switch's stop flag when dropped.
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Tenant a (0.3 cores, a cgroup v1 group) floods from its VM a1 with a thread in its group,
/// on a switch of two workers. The switch charges a's ports' softirq time and its own work
/// for a to a's one account, and writes each period's budget as the allocation less that:
/// the quota written falls below the allocation. The softirq the kernel ran in the flooder's
/// own time (its sends' receive processing) is already in the group's use and is credited
/// back, so the flooder's CPU time plus what the switch charged, less the softirq time, is
/// the allocation: without the credit the group would pay for that softirq twice (about
/// the allocation less the softirq time).
#[test]
fn a_tenants_softirq_work_is_charged_to_its_cgroup_with_two_workers() {
    let root = std::path::Path::new("/sys/fs/cgroup/cpu");
    if !is_root() || !have_ebpf() || !root.join("cpu.cfs_quota_us").exists() {
        eprintln!("skipped: needs root, the programs and cgroup v1's cpu controller");
        return;
    }
    let group = root.join(format!("picnic-softirq-cgroup-test-{}", std::process::id()));
    std::fs::create_dir_all(&group).unwrap();
    // -1 (no limit) while the switch sets the group's period: read as signed.
    let read = |f: &str| -> i64 {
        std::fs::read_to_string(group.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (sw, vm) = (Netns::new(), Netns::new());
    sw.veth_pair("pnwu", "pnwv");
    for (a, b) in [("pnwa", "pnwb"), ("pnwc", "pnwd")] {
        sw.veth_pair(a, b);
        sw.ip(&format!("link set {b} netns {}", vm.name));
        vm.ip(&format!("link set {b} up"));
    }
    let text = SWITCH
        .replace("host_id = 1", "host_id = 1\nworkers = 2")
        .replacen(
            "vni = 100\ncpu_quota = 1.0",
            &format!(
                "vni = 100\ncpu_quota = 0.3\ncgroup = \"{}\"",
                group.display()
            ),
            1,
        );
    let cfg = picnic_switch::config::Config::parse(&text).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let flood_for = Duration::from_secs(2);
    let (published, on, flooder_ns, lowest_quota, elapsed) = std::thread::scope(|s| {
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
        // The switch stops even when an assertion below fails (else the scope waits on it).
        let _stop = StopOnDrop(stop.clone());
        let started = std::time::Instant::now();
        let tasks = group.join("tasks");
        let (vm, flood_for) = (&vm, flood_for);
        let flooder = s.spawn(move || {
            vm.enter(|| {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                std::fs::write(&tasks, tid.to_string()).unwrap();
                flood_from_a1("pnwb", flood_for);
                picnic_switch::runner::thread_cpu_ns()
            })
        });
        let mut lowest = i64::MAX;
        while started.elapsed() < flood_for {
            std::thread::sleep(Duration::from_millis(3));
            if started.elapsed() > Duration::from_millis(200) {
                lowest = match read("cpu.cfs_quota_us") {
                    -1 => lowest,
                    q => lowest.min(q),
                };
            }
        }
        let flooder_ns = flooder.join().unwrap();
        let elapsed = started.elapsed();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (shared, on, flooder_ns, lowest, elapsed)
    });
    let restored = read("cpu.cfs_quota_us");
    std::fs::remove_dir(&group).unwrap();
    assert!(on, "softirq accounting loads");
    let snap = published.latest().unwrap();
    assert_eq!(snap.workers.len(), 2, "two workers");
    let a = snap.switch.tenants.iter().find(|t| t.name == "a").unwrap();
    let allocation_ns = elapsed.as_nanos() as f64 * 0.3;
    println!(
        "two workers: a softirq {:.1} ms, charged {:.1} ms (switch work {:.1} ms); flooder \
         thread {:.1} ms; allocation {:.1} ms; lowest quota {lowest_quota} us of 3000",
        a.softirq_ns as f64 / 1e6,
        a.cpu_charged_ns as f64 / 1e6,
        a.cost_ns as f64 / 1e6,
        flooder_ns as f64 / 1e6,
        allocation_ns / 1e6
    );
    assert_eq!(restored, 3000, "the allocation is given back at stop");
    assert!(
        a.softirq_ns > 20_000_000,
        "2 s of flood cost > 20 ms of softirq"
    );
    assert!(
        a.cpu_charged_ns >= a.softirq_ns,
        "a's account has its softirq time"
    );
    assert!(lowest_quota < 3000, "the charges lowered a's cgroup budget");
    // The group's use and the switch's charge, less the softirq run in the group's thread
    // (credited), fill the allocation: within 25% below (the flooder's own slack: it yields
    // on full rings) and 10% + 5 ms above (a period's overrun, the kernel's refill a second).
    let net = (flooder_ns + a.cpu_charged_ns) as f64 - a.softirq_ns as f64;
    assert!(
        net <= allocation_ns * 1.1 + 5e6,
        "{net} ns used beyond the allocation {allocation_ns}"
    );
    assert!(
        net >= allocation_ns * 0.75,
        "{net} ns: the group paid its softirq time twice (allocation {allocation_ns} ns)"
    );
}
