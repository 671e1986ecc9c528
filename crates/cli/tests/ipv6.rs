//! IPv6 through a running switch: two VMs of one tenant, each a network namespace of its own
//! with the kernel's IPv6 stack, `ping -6` each other and exchange TCP through the `picnic`
//! binary (the switch answers their neighbour solicitations from its directory); a VM of
//! another tenant on the same /64 cannot resolve either address. Addresses: 2001:db8::/64
//! (documentation prefix), only inside the test's namespaces. Needs root (namespaces,
//! AF_PACKET); skips and says so otherwise.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{api, is_root, run, wait_for_api, KillOnDrop, Netns};

/// (name, id, tenant, MAC, IPv4, IPv6) of the three VMs.
const VMS: [(&str, u32, &str, &str, &str, &str); 3] = [
    (
        "a1",
        1,
        "t",
        "02:00:00:00:00:01",
        "198.18.0.1",
        "2001:db8::1",
    ),
    (
        "a2",
        2,
        "t",
        "02:00:00:00:00:02",
        "198.18.0.2",
        "2001:db8::2",
    ),
    (
        "b1",
        3,
        "u",
        "02:00:00:00:00:03",
        "198.18.0.3",
        "2001:db8::3",
    ),
];

fn config(dir: &Path) -> String {
    let mut text = format!(
        r#"
[switch]
host_id = 1
api = "{dir}/api.sock"
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
slo = {{ max_loss = 0.001 }}
[[tenants]]
name = "u"
vni = 200
"#,
        dir = dir.display()
    );
    for (name, id, tenant, mac, ip, ipv6) in VMS {
        text += &format!(
            "[[vms]]\nname = \"{name}\"\nid = {id}\ntenant = \"{tenant}\"\nhost = 1\n\
             mac = \"{mac}\"\nip = \"{ip}\"\nipv6 = [\"{ipv6}\"]\nport = {{ ifname = \"{name}\" }}\n"
        );
    }
    text
}

/// A VM: a namespace holding the VM side of its port's veth pair, deleted on drop.
struct VmNs(String);

impl VmNs {
    /// Moves `dev` from namespace `switch` into a new namespace and gives it `mac` and
    /// `ipv6`/64 (no duplicate address detection: the switch consumes the probes, so it would
    /// only wait a second).
    fn new(switch: &str, dev: &str, mac: &str, ipv6: &str) -> VmNs {
        let ns = VmNs(format!("pn-t-v6{dev}-{}", std::process::id()));
        let _ = Command::new("ip").args(["netns", "del", &ns.0]).output();
        run(&["ip", "netns", "add", &ns.0]);
        for key in ["all", "default"] {
            for (k, v) in [("disable_ipv6", "0"), ("accept_dad", "0")] {
                let kv = format!("net.ipv6.conf.{key}.{k}={v}");
                run(&["ip", "netns", "exec", &ns.0, "sysctl", "-qw", &kv]);
            }
        }
        run(&["ip", "-n", switch, "link", "set", dev, "netns", &ns.0]);
        run(&["ip", "-n", &ns.0, "link", "set", dev, "address", mac]);
        run(&["ip", "-n", &ns.0, "link", "set", dev, "up"]);
        run(&[
            "ip",
            "-n",
            &ns.0,
            "-6",
            "addr",
            "add",
            &format!("{ipv6}/64"),
            "dev",
            dev,
            "nodad",
        ]);
        ns
    }

    /// Runs `f` on a thread inside the namespace.
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).unwrap();
                // SAFETY: an open namespace descriptor; setns only affects this thread.
                let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(ret, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
        })
    }

    fn exec(&self, argv: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(argv)
            .output()
            .unwrap()
    }
}

impl Drop for VmNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn vms_of_one_tenant_talk_ping6_and_tcp_and_another_tenant_cannot_resolve_them() {
    if !is_root() {
        return;
    }
    if Command::new("ping").arg("-V").output().is_err() {
        println!("skipped: needs ping (iputils-ping) inside the VMs' namespaces");
        return;
    }
    let dir = std::env::temp_dir().join(format!("picnic-ipv6-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let cfg = dir.join("host1.toml");
    std::fs::write(&cfg, config(&dir)).unwrap();
    let sock = dir.join("api.sock");
    let sw = Netns::new(
        "v6",
        &[("up0", "up0p"), ("a1", "a1v"), ("a2", "a2v"), ("b1", "b1v")],
    );
    let switch_ns = format!("pn-t-v6-{}", std::process::id());
    let vm = |i: usize| {
        let (name, _, _, mac, _, ipv6) = VMS[i];
        VmNs::new(&switch_ns, &format!("{name}v"), mac, ipv6)
    };
    let (a1, a2, b1) = (vm(0), vm(1), vm(2));
    let switch = KillOnDrop(sw.switch(&cfg));
    wait_for_api(&sock);

    // a1 -> a2 and a2 -> a1: address resolution answered by the switch, echo both ways.
    for (from, to) in [(&a1, "2001:db8::2"), (&a2, "2001:db8::1")] {
        let out = from.exec(&["ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", to]);
        assert!(
            out.status.success(),
            "{} could not ping {to}: {}{}",
            from.0,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // TCP over IPv6, a1 -> a2: 4 MB in full-size segments, echoed back byte for byte.
    let a2_addr = SocketAddr::from(("2001:db8::2".parse::<Ipv6Addr>().unwrap(), 5001));
    let listener = a2.enter(|| TcpListener::bind(a2_addr).unwrap());
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    let echoed = std::thread::scope(|s| {
        s.spawn(|| {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = conn.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                conn.write_all(&buf[..n]).unwrap();
            }
        });
        a1.enter(|| {
            let mut conn = TcpStream::connect_timeout(&a2_addr, Duration::from_secs(5)).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut reader = conn.try_clone().unwrap();
            let collector = std::thread::spawn(move || {
                let mut got = Vec::new();
                reader.read_to_end(&mut got).unwrap();
                got
            });
            conn.write_all(&data).unwrap();
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            collector.join().unwrap()
        })
    });
    assert!(
        echoed == data,
        "TCP echo: {} of {} bytes, or corrupted",
        echoed.len(),
        data.len()
    );

    // a1 learned a2's MAC from the switch's advertisement.
    let neigh = a1.exec(&["ip", "-6", "neigh", "show", "2001:db8::2"]);
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(neigh.contains("lladdr 02:00:00:00:00:02"), "{neigh}");

    // b1, another tenant on the same /64: no answer for tenant t's addresses.
    let out = b1.exec(&[
        "ping",
        "-6",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "1",
        "2001:db8::1",
    ]);
    assert!(
        !out.status.success(),
        "b1 reached a1: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let neigh = b1.exec(&["ip", "-6", "neigh", "show", "2001:db8::1"]);
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(!neigh.contains("lladdr"), "b1 resolved a1: {neigh}");

    // The switch's account: advertisements sent, b1's solicitations refused as unknown
    // destinations, and tenant t's SLO loss.
    let (status, stats) = api(&sock, "GET", "/stats", "");
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let snapshot = &stats["switch"];
    let replies = snapshot["switch"]["nd_replies"].as_u64().unwrap();
    assert!(replies >= 2, "nd_replies {replies}: {stats}");
    let b1_unknown = snapshot["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "b1")
        .map(|v| {
            v["counters"]["drops"]["unknown_destination"]
                .as_u64()
                .unwrap()
        });
    assert!(b1_unknown.is_some_and(|n| n >= 1), "{stats}");
    std::thread::sleep(std::time::Duration::from_millis(250));
    let (_, slo) = api(&sock, "GET", "/slo", "");
    let slo: serde_json::Value = serde_json::from_str(&slo).unwrap();
    let t = &slo["tenants"][0];
    assert_eq!(t["tenant"], "t");
    // Its loss is what the switch dropped of what it should carry (a TCP burst may overflow
    // an ingress queue), never the multicast chatter of the VMs' kernels (MLD reports, router
    // solicitations) it refused: those are in the breakdown only.
    let drops = t["why"]["drops"].as_object().unwrap();
    let policy = ["multicast", "unknown_destination", "spoofed", "malformed"];
    let carried: u64 = drops
        .iter()
        .filter(|(reason, _)| !policy.contains(&reason.as_str()))
        .map(|(_, n)| n.as_u64().unwrap())
        .sum();
    assert_eq!(t["totals"]["lost_packets"], carried, "{t}");
    println!("tenant t: {}", t["totals"]);
    println!("tenant t's drops: {}", t["why"]["drops"]);
    drop(switch);
    drop((a1, a2, b1));
    drop(sw);
}

/// Removes the test's directory when the test ends, failed or not.
struct RemoveOnDrop(std::path::PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
