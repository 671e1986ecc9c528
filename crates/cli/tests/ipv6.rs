//! IPv6 through a running switch: two VMs of one tenant, each a network namespace of its own
//! with the kernel's IPv6 stack, `ping -6` each other through the `picnic` binary (the switch
//! answers their neighbour solicitations from its directory); a VM of another tenant on the
//! same /64 cannot resolve either address. Addresses: 2001:db8::/64 (documentation prefix),
//! only inside the test's namespaces. Needs root (namespaces, AF_PACKET); skips and says so
//! otherwise.

use std::path::Path;
use std::process::{Command, Output};

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
fn vms_of_one_tenant_ping6_each_other_and_another_tenant_cannot_resolve_them() {
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
    // destinations, and tenant t's SLO not violated by the kernels' MLD and router
    // solicitation chatter it dropped.
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
    assert_eq!(t["violations_total"]["loss"], 0, "{t}");
    assert_eq!(t["totals"]["lost_packets"], 0, "{t}");
    drop(switch);
    drop((a1, a2, b1));
    drop(sw);
    let _ = std::fs::remove_dir_all(&dir);
}
