//! The control plane on a real etcd (issue 33): three switches (the `picnic` binary), one
//! per host namespace, their uplinks on one bridge, configured with `[control]` and nothing
//! else of the deployment; VMs are namespaces whose interface's host end is a switch port.
//! Everything (hosts, tenant, VMs) is added with `picnic ctl`. etcd and `picnic ctl` run in
//! the fabric's namespace, which the hosts reach on a management bridge of their own
//! (198.19.255.0/24): a host namespace's loopback is its own. Asserted:
//! - a VM added with `picnic ctl` is reachable from every host (ping through the switches);
//! - `picnic ctl vm move` re-homes a VM and its traffic follows within 1 s; its old host
//!   keeps no port for it;
//! - a switch restarted while etcd is down forwards on its persisted state, and catches up
//!   with what changed meanwhile when etcd returns.
//!
//! Needs root (namespaces, AF_PACKET) and Debian's etcd-server; skips and says why otherwise.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::cluster::{
    add_vm, cluster, config, ctl_ok, first_reply, ping, switch, vm, wait_for_vm,
};
use common::{api, wait_for_api, KillOnDrop};

#[test]
fn three_switches_follow_etcd_a_moved_vm_and_a_restart_while_etcd_is_down() {
    // The cluster, from nothing: hosts, a tenant, a VM on each host.
    let Some((dir, _fabric, hosts, etcd, etcd_proc)) = cluster("cluster") else {
        return;
    };
    let mut etcd_proc = Some(etcd_proc);
    let va = vm("a", 1, &hosts[0]);
    let vb = vm("b", 2, &hosts[1]);
    let vc = vm("c", 3, &hosts[2]);
    let cfgs: Vec<PathBuf> = (1..=3).map(|i| config(&dir, i, &etcd, "")).collect();
    let logs: Vec<PathBuf> = (1..=3).map(|i| dir.join(format!("h{i}.log"))).collect();
    let mut switches: Vec<KillOnDrop> = (0..3)
        .map(|i| switch(&hosts[i], &cfgs[i], &logs[i]))
        .collect();
    for i in 1..=3 {
        wait_for_api(&dir.join(format!("h{i}.sock")));
    }
    add_vm(&etcd, "a", 1, 1, &[]);
    add_vm(&etcd, "b", 2, 2, &[]);
    let added = Instant::now();
    add_vm(&etcd, "c", 3, 3, &[]);
    // c, added last, is reachable from every host.
    for (from, name) in [(&va, "a"), (&vb, "b")] {
        let t = first_reply(from, "198.18.0.3", added, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("c (host 3) does not answer {name}"));
        println!(
            "{name} -> c: first reply {:.0} ms after `picnic ctl vm add c`",
            t.as_secs_f64() * 1e3
        );
    }
    assert!(
        ping(&vc, "198.18.0.1") && ping(&vc, "198.18.0.2"),
        "c reaches a and b"
    );
    // An SLO set in etcd is held on every host; status shows it from each switch's API.
    ctl_ok(
        &etcd,
        &[
            "slo",
            "set",
            "t",
            "--latency-us",
            "5000",
            "--percentile",
            "99",
        ],
    );
    // The SLO report is published every 100 ms: read status until every host shows it.
    let end = Instant::now() + Duration::from_secs(2);
    let status = loop {
        let status = ctl_ok(&etcd, &["status"]);
        if status.matches("tenant t: SLO").count() == 3 || Instant::now() > end {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("{status}");
    assert_eq!(status.matches("switch up").count(), 3, "{status}");
    assert_eq!(status.matches("tenant t: SLO").count(), 3, "{status}");
    // One switch through its API: what etcd put there.
    let out = Command::new(env!("CARGO_BIN_EXE_picnic"))
        .args(["ctl", "--api"])
        .arg(dir.join("h1.sock"))
        .args(["vm", "show", "c"])
        .output()
        .unwrap();
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (c["host"].as_u64(), c["port"].is_null()),
        (Some(3), true),
        "{c}"
    );

    // c moves from host 3 to host 2: its interface first (the VM's migration), then etcd.
    hosts[2].ip(&["link", "set", "dev", "c", "netns", &hosts[1].0]);
    hosts[1].ip(&["link", "set", "dev", "c", "up"]);
    let moved = Instant::now();
    let out = ctl_ok(&etcd, &["vm", "move", "c", "2"]);
    let back = first_reply(&va, "198.18.0.3", moved, Duration::from_secs(5))
        .expect("a -> c after the move");
    println!(
        "{out}a -> c answered {:.0} ms after `picnic ctl vm move c 2` started",
        back.as_secs_f64() * 1e3
    );
    assert!(
        back < Duration::from_secs(1),
        "traffic followed only after {back:?}"
    );
    // Nothing stays behind: host 3 knows c on host 2, without a port.
    let (_, vms) = api(&dir.join("h3.sock"), "GET", "/vms", "");
    let vms: serde_json::Value = serde_json::from_str(&vms).unwrap();
    let c = vms
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "c")
        .unwrap()
        .clone();
    assert_eq!(
        (c["host"].as_u64(), c["port"].is_null()),
        (Some(2), true),
        "{c}"
    );

    // Host 2's switch stops; meanwhile d is added on host 3; etcd goes down; host 2's switch
    // starts again without etcd: it forwards on its persisted state, then catches up.
    drop(switches.remove(1));
    let vd = vm("d", 4, &hosts[2]);
    // Host 2's status outlives its switch by the lease's seconds: not waited for.
    add_vm(&etcd, "d", 4, 3, &["--wait-s", "0"]);
    wait_for_vm(&dir.join("h1.sock"), "d");
    wait_for_vm(&dir.join("h3.sock"), "d");
    drop(etcd_proc.take());
    switches.insert(1, switch(&hosts[1], &cfgs[1], &logs[1]));
    let restarted = Instant::now();
    let t = first_reply(&va, "198.18.0.2", restarted, Duration::from_secs(5))
        .expect("a -> b through host 2's switch restarted without etcd");
    println!(
        "a -> b: first reply {:.0} ms after host 2's switch restarted with etcd down",
        t.as_secs_f64() * 1e3
    );
    assert!(ping(&vb, "198.18.0.1"), "b -> a");
    let (_, vms) = api(&dir.join("h2.sock"), "GET", "/vms", "");
    assert!(!vms.contains("\"d\""), "host 2 cannot know d yet: {vms}");
    etcd_proc = Some(etcd.start());
    let returned = Instant::now();
    let t = first_reply(&vb, "198.18.0.4", returned, Duration::from_secs(10))
        .expect("b -> d once etcd is back: host 2 caught up");
    println!(
        "b -> d: first reply {:.0} ms after etcd came back",
        t.as_secs_f64() * 1e3
    );
    assert!(ping(&vd, "198.18.0.3"), "d -> c (c on host 2)");
    // Logged once the records applied are persisted, after the change itself.
    let end = Instant::now() + Duration::from_secs(2);
    let log = loop {
        let log = std::fs::read_to_string(&logs[1]).unwrap();
        if log.contains("resumed=true") || Instant::now() > end {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for line in log.lines().filter(|l| l.contains("control plane")) {
        println!("host 2: {line}");
    }
    assert!(
        log.contains("etcd unreachable") && log.contains("resumed=true"),
        "{log}"
    );
    drop(switches);
    drop(etcd_proc);
    let _ = std::fs::remove_dir_all(&dir);
}
