//! The feedback key rotated cluster-wide through etcd while feedback flows (issue 33): three
//! switches on a real etcd (the fabric of tests/cluster.rs), VMs pinging each other every
//! 2 ms so that every receiving host feeds back to its senders, and `picnic ctl
//! feedback-key rotate` run twice meanwhile. Asserted from each switch's `/stats`: feedback
//! kept arriving and none was refused (for its authentication or anything else), no frame
//! was dropped, every ping was answered; each switch signs with the last epoch and holds the
//! one before; a feedback frame signed with the first key, injected on host 1's uplink as
//! host 2, is refused as an unknown epoch, and one signed with the current key is accepted.
//!
//! Needs root (namespaces, AF_PACKET) and Debian's etcd-server; skips and says why otherwise.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::cluster::{add_vm, cluster, config, ctl_ok, first_reply, switch, vm, Ns};
use common::{api, wait_for_api, KillOnDrop};
use picnic_switch::config::FeedbackKeys;
use picnic_switch::engine::feedback::FeedbackAuthState;
use picnic_wire::feedback::FeedbackOption;
use picnic_wire::geneve::standalone_feedback;
use picnic_wire::overlay::{encap, OuterHeaders};

/// Host `id`'s `/stats`.
fn stats(dir: &Path, id: u32) -> serde_json::Value {
    let (status, body) = api(&dir.join(format!("h{id}.sock")), "GET", "/stats", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// (feedback received, refused for any reason, frames dropped for any reason) of `stats`.
fn counts(stats: &serde_json::Value) -> (u64, u64, u64) {
    let sw = &stats["switch"]["switch"];
    let sum = |v: &serde_json::Value| -> u64 {
        v.as_object()
            .map_or(0, |m| m.values().filter_map(|n| n.as_u64()).sum())
    };
    let vm_drops: u64 = stats["switch"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| sum(&v["counters"]["drops"]))
        .sum();
    (
        sw["feedback_received"].as_u64().unwrap(),
        sum(&sw["feedback_rejected"]),
        sum(&sw["drops"]) + vm_drops,
    )
}

/// Host `id`'s feedback keys as its `/config` shows them: (active epoch, previous epoch).
fn epochs(dir: &Path, id: u32) -> (Option<u64>, Option<u64>) {
    let (_, body) = api(&dir.join(format!("h{id}.sock")), "GET", "/config", "");
    let cfg: serde_json::Value = serde_json::from_str(&body).unwrap();
    let k = &cfg["feedback_keys"];
    (
        k["active"]["epoch"].as_u64(),
        k["previous"]["epoch"].as_u64(),
    )
}

/// The feedback keys host `id` persisted (its state file holds them, for a restart).
fn persisted_keys(dir: &Path, id: u32) -> FeedbackKeys {
    let text = std::fs::read_to_string(dir.join(format!("h{id}.state.json"))).unwrap();
    let state: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(state["feedback_keys"].clone()).unwrap()
}

/// A standalone feedback frame about VM b (id 2, host 2) from host 2 to host 1, signed as
/// the holder of `keys` would sign it now (in a nonce lane no switch worker uses).
fn feedback_from_host2(keys: &FeedbackKeys) -> Vec<u8> {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut signer = FeedbackAuthState::default();
    signer.set_file_key(None, wall).unwrap();
    signer.install(Some(keys)).unwrap();
    signer.set_lane(0x7f);
    let fb = FeedbackOption {
        dst_endpoint: 2,
        rate_bps: 10_000_000_000,
        seq: 1,
    };
    let (from, to) = ([198, 19, 0, 2].into(), [198, 19, 0, 1].into());
    let mut geneve = standalone_feedback(100, fb);
    geneve.feedback_auth = signer.sign(picnic_core::Instant::ZERO, from, to, 100, &fb);
    assert!(geneve.feedback_auth.is_some());
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: from,
        dst_ip: to,
        src_port: 50000,
        ttl: 64,
    };
    let mut frame = vec![0u8; 256];
    let n = encap(&outer, &geneve, &[], &mut frame).unwrap();
    frame.truncate(n);
    frame
}

/// Sends `frame` out of `ifname` in namespace `ns` (an AF_PACKET socket): on the fabric's
/// `f1`, it arrives on host 1's uplink.
fn inject(ns: &Ns, ifname: &str, frame: &[u8]) {
    let path = format!("/run/netns/{}", ns.0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(&path).unwrap();
            // SAFETY: plain syscalls on descriptors and structures this thread owns; setns
            // only affects this thread.
            unsafe {
                assert_eq!(libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET), 0);
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
                assert!(fd >= 0, "{}", std::io::Error::last_os_error());
                let name = std::ffi::CString::new(ifname).unwrap();
                let mut addr: libc::sockaddr_ll = std::mem::zeroed();
                addr.sll_family = libc::AF_PACKET as u16;
                addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
                addr.sll_halen = 6;
                let sent = libc::sendto(
                    fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                libc::close(fd);
                assert_eq!(
                    sent,
                    frame.len() as isize,
                    "{}",
                    std::io::Error::last_os_error()
                );
            }
        });
    });
}

/// Waits (at most 2 s, the statistics are published every 100 ms) until host 1's counts
/// differ from `before`; the new counts.
fn next_counts(dir: &Path, before: (u64, u64, u64)) -> (u64, u64, u64) {
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let now = counts(&stats(dir, 1));
        if now != before || Instant::now() > end {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host 1's counts once the traffic has stopped: read until two reads 300 ms apart (three
/// publications) agree, at most 3 s.
fn settled(dir: &Path) -> (u64, u64, u64) {
    let end = Instant::now() + Duration::from_secs(3);
    let mut last = counts(&stats(dir, 1));
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = counts(&stats(dir, 1));
        if now == last || Instant::now() > end {
            return now;
        }
        last = now;
    }
}

/// `ping` every 2 ms from `from` to `ip` until stopped ([`stop_ping`]).
fn flood(from: &Ns, ip: &str) -> Child {
    Command::new("ip")
        .args(["netns", "exec", &from.0, "ping", "-q", "-i", "0.002", ip])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Stops a [`flood`] (SIGINT: it prints its summary); (sent, answered).
fn stop_ping(child: Child) -> (u64, u64) {
    // SAFETY: signals our own child (`ip netns exec` execs ping, so it is ping).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no summary: {text}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

#[test]
fn the_feedback_key_rotates_cluster_wide_while_feedback_flows() {
    let Some((dir, fabric, hosts, etcd, etcd_proc)) = cluster("fbkey") else {
        return;
    };
    // The first key, before any switch runs: each starts with it from etcd.
    println!("{}", ctl_ok(&etcd, &["feedback-key", "rotate"]));
    let va = vm("a", 1, &hosts[0]);
    let vb = vm("b", 2, &hosts[1]);
    let vc = vm("c", 3, &hosts[2]);
    // The engines' path: their EyeQ receivers meter every frame and feed back.
    let extra = "[fastpath]\nkernel = false";
    let mut switches: Vec<KillOnDrop> = (1..=3)
        .map(|i| {
            let cfg = config(&dir, i, &etcd, extra);
            switch(&hosts[i as usize - 1], &cfg, &dir.join(format!("h{i}.log")))
        })
        .collect();
    for i in 1..=3 {
        wait_for_api(&dir.join(format!("h{i}.sock")));
    }
    add_vm(&etcd, "a", 1, 1, &[]);
    add_vm(&etcd, "b", 2, 2, &[]);
    add_vm(&etcd, "c", 3, 3, &[]);
    for (from, ip) in [
        (&va, "198.18.0.2"),
        (&vc, "198.18.0.2"),
        (&vb, "198.18.0.3"),
    ] {
        first_reply(from, ip, Instant::now(), Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{ip} does not answer {}", from.0));
    }
    for i in 1..=3 {
        assert_eq!(epochs(&dir, i), (Some(1), None), "host {i}");
    }
    let first = persisted_keys(&dir, 1);
    assert_eq!(first.active.as_ref().map(|k| k.epoch), Some(1));

    // Feedback flows: a -> b, c -> b, b -> c and the replies, every 2 ms.
    let pings = [
        flood(&va, "198.18.0.2"),
        flood(&vc, "198.18.0.2"),
        flood(&vb, "198.18.0.3"),
    ];
    std::thread::sleep(Duration::from_millis(500));
    let before: Vec<_> = (1..=3).map(|i| counts(&stats(&dir, i))).collect();
    let started = Instant::now();
    for _ in 0..2 {
        println!("{}", ctl_ok(&etcd, &["feedback-key", "rotate"]));
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let after: Vec<_> = (1..=3).map(|i| counts(&stats(&dir, i))).collect();
    let answered: Vec<_> = pings.into_iter().map(stop_ping).collect();
    println!(
        "two rotations in {:.2} s; per host (feedback received, refused, drops) before {before:?}, after {after:?}; pings (sent, answered) {answered:?}",
        took.as_secs_f64()
    );
    for i in 0..3 {
        let (received, refused, dropped) = (
            after[i].0 - before[i].0,
            after[i].1 - before[i].1,
            after[i].2 - before[i].2,
        );
        assert!(
            received >= 20,
            "host {}: {received} feedback frames while rotating",
            i + 1
        );
        assert_eq!((refused, dropped), (0, 0), "host {}", i + 1);
        assert_eq!(
            epochs(&dir, i as u32 + 1),
            (Some(3), Some(2)),
            "host {}",
            i + 1
        );
    }
    for (sent, got) in answered {
        assert!(
            sent >= 200 && got + 1 >= sent,
            "{got} of {sent} pings answered"
        );
    }

    // The first key is retired: refused as an unknown epoch. The current one is accepted.
    let was = settled(&dir);
    inject(&fabric, "f1", &feedback_from_host2(&first));
    let now = next_counts(&dir, was);
    assert_eq!((now.0 - was.0, now.1 - was.1), (1, 1), "epoch 1 refused");
    let unknown = stats(&dir, 1)["switch"]["switch"]["feedback_rejected"]["unknown_epoch"].clone();
    assert_eq!(unknown.as_u64(), Some(1));
    let current = persisted_keys(&dir, 1);
    assert_eq!(current.active.as_ref().map(|k| k.epoch), Some(3));
    inject(&fabric, "f1", &feedback_from_host2(&current));
    let last = next_counts(&dir, now);
    assert_eq!((last.0 - now.0, last.1 - now.1), (1, 0), "epoch 3 accepted");
    switches.clear();
    drop(etcd_proc);
    let _ = std::fs::remove_dir_all(&dir);
}
