//! Live changes with two workers: applied in place, no worker stops, the neighbours' frames
//! keep flowing.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::{self, udp};
use crate::{from_r9, CONFIG};
use picnic_switch::config::Config;
use picnic_switch::port::{MemoryPort, Port};

/// Live changes with two workers: a change of a VM's rates and removing a VM are applied to
/// the workers in place; frames keep flowing between the VMs that stay, and every reply comes.
#[test]
fn two_workers_take_live_changes() {
    let cfg = Config::parse(CONFIG).unwrap();
    let (mut switch, h) = common::memory_switch(cfg.clone(), &["up0", "s1", "s2", "l1", "l2"]);
    let (stop, shared, commands) = (
        switch.stop_flag(),
        switch.shared(),
        switch.command_channel(),
    );
    let dataplane = std::thread::spawn(move || switch.run());
    let s1_s2 = udp(1, 2, 64);
    let exchange = |n: usize| {
        for _ in 0..n {
            assert!(h[1].inject(&s1_s2));
        }
        let (deadline, mut got) = (Instant::now() + Duration::from_secs(10), 0);
        while got < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            while h[2].pop_sent().is_some() {
                got += 1;
            }
        }
        got
    };
    let change = |cfg: &Config| common::reconfigure(&commands, cfg);
    assert_eq!(exchange(50), 50);
    let mut rates = cfg.clone();
    rates.vms[1].min_mbps += 5;
    change(&rates).unwrap();
    assert_eq!(exchange(50), 50, "after a rate change in place");
    let mut fewer = rates.clone();
    fewer.vms.retain(|v| v.name != "l2");
    change(&fewer).unwrap();
    assert_eq!(exchange(50), 50, "after l2 was removed");
    std::thread::sleep(Duration::from_millis(250));
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();
    let p = shared.latest().unwrap();
    let names: Vec<&str> = p.switch.vms.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["s1", "s2", "l1"]);
    let s2 = p.switch.vms.iter().find(|v| v.name == "s2").unwrap();
    assert_eq!(
        s2.counters.rx_packets, 150,
        "counters carried over both changes"
    );
    assert_eq!(shared.config().unwrap().vms.len(), 4);
}

/// Issue 15 with two workers: VM b1 (tenant u, capped at 1 Mb/s so its frames wait in its
/// queue) is added and removed 100 times while the neighbours' flows run on both workers
/// (s1 -> s2 and l2 -> l1 across the workers, r9 -> s2 from the uplink). No worker stops: every
/// neighbour frame arrives, b1 is placed on a worker and its port handed to it each time, the
/// frames b1 had queued go back to the pool (its free count is the capacity once idle), and a
/// request whose new port cannot be opened changes nothing and says which field failed.
#[test]
fn two_workers_add_and_remove_a_vm_100_times_without_touching_the_neighbours() {
    let base = CONFIG.to_string()
        + r#"
[[tenants]]
name = "u"
vni = 300
[[vms]]
name = "r8"
id = 8
tenant = "u"
host = 2
mac = "02:00:00:00:00:08"
ip = "198.18.0.8"
"#;
    let cfg = Config::parse(&base).unwrap();
    let with_b1 = Config::parse(
        &(base.clone()
            + r#"
[[vms]]
name = "b1"
id = 5
tenant = "u"
host = 1
mac = "02:00:00:00:00:05"
ip = "198.18.0.5"
min_mbps = 1
max_mbps = 1
port = { ifname = "b1" }
"#),
    )
    .unwrap();
    let (mut switch, h) = common::memory_switch(cfg.clone(), &["up0", "s1", "s2", "l1", "l2"]);
    // b1's port: a new in-memory port each time it is added, its handle kept for the test.
    let b1_ports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handles = b1_ports.clone();
    switch.set_port_opener(std::sync::Arc::new(
        move |spec: &picnic_switch::runner::PortSpec| {
            anyhow::ensure!(
                spec.ifname == "b1",
                "{}: cannot open '{}'",
                spec.field,
                spec.ifname
            );
            let (p, h) = MemoryPort::new(&spec.ifname);
            handles.lock().unwrap().push(h);
            Ok(Box::new(p) as Box<dyn Port>)
        },
    ));
    let (stop, shared, commands) = (
        switch.stop_flag(),
        switch.shared(),
        switch.command_channel(),
    );
    let dataplane = std::thread::spawn(move || switch.run());
    let (s1_s2, l2_l1, r9_s2, b1_r8) = (udp(1, 2, 64), udp(4, 3, 64), from_r9(2), udp(5, 8, 1000));
    const CYCLES: usize = 100;
    const EACH: usize = 5;
    let mut got = [0usize; 5];
    let drain = |got: &mut [usize; 5]| {
        for (p, n) in got.iter_mut().enumerate() {
            while h[p].pop_sent().is_some() {
                *n += 1;
            }
        }
    };
    let started = Instant::now();
    for _ in 0..CYCLES {
        common::reconfigure(&commands, &with_b1).unwrap();
        let b1 = b1_ports.lock().unwrap().last().cloned().unwrap();
        for _ in 0..20 {
            assert!(b1.inject(&b1_r8));
        }
        for _ in 0..EACH {
            assert!(h[1].inject(&s1_s2) && h[4].inject(&l2_l1) && h[0].inject(&r9_s2));
        }
        std::thread::sleep(Duration::from_millis(1));
        drain(&mut got);
        common::reconfigure(&commands, &cfg).unwrap();
        drain(&mut got);
    }
    let took = started.elapsed();
    let want = [CYCLES * EACH, 2 * CYCLES * EACH, CYCLES * EACH, 0];
    let deadline = Instant::now() + Duration::from_secs(10);
    while got[2..] != want[1..] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        drain(&mut got);
    }
    // s2: s1's and r9's frames; l1: l2's.
    assert_eq!(
        [got[2], got[3]],
        [want[1], want[2]],
        "neighbour frames out of s2 and l1"
    );
    assert_eq!(
        b1_ports.lock().unwrap().len(),
        CYCLES,
        "b1's port opened each time"
    );
    // Every frame back in the pools once the queues drained (published every 100 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut p = shared.latest().unwrap();
    while p.pool_free != p.pool_capacity && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        p = shared.latest().unwrap();
    }
    assert_eq!(
        p.pool_free, p.pool_capacity,
        "frames missing from the pools"
    );
    // A port that cannot be opened: the whole request is refused, b1 stays away, and the
    // neighbours' guarantee change in the same request is not applied.
    let mut bad = with_b1.clone();
    bad.vms.last_mut().unwrap().port.as_mut().unwrap().ifname = "nosuch".into();
    bad.vms[1].min_mbps += 5;
    let err = common::reconfigure(&commands, &bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("vms[6].port.ifname"), "{err}");
    assert_eq!(shared.config().unwrap().vms.len(), cfg.vms.len());
    assert_eq!(
        shared.config().unwrap().vms[1].min_mbps,
        cfg.vms[1].min_mbps
    );
    stop.store(true, Ordering::Relaxed);
    dataplane.join().unwrap().unwrap();
    let p = shared.latest().unwrap();
    let full: Vec<u64> = p.workers.iter().map(|w| w.handoff.full).collect();
    assert_eq!(full, [0, 0], "no mailbox overflowed");
    println!(
        "{CYCLES} add/remove cycles in {took:?} ({:.1} ms per change); neighbour frames {:?} of {:?}; pool {}/{}",
        took.as_secs_f64() * 1e3 / (2 * CYCLES) as f64,
        [got[2], got[3]],
        [want[1], want[2]],
        p.pool_free,
        p.pool_capacity
    );
}
