//! Pods through CNI (issue 31): a switch (the `picnic` binary) runs in a network namespace
//! standing for the host; the CNI project's own `cnitool` (scripts/setup_cni.sh) runs there
//! too and attaches three pods, each a namespace of its own (`ip netns add`), with picnic's
//! plugin (`picnic` under the name `picnic-cni`) and the host-local IPAM plugin: a1 and a2 to
//! network `red` (tenant red, created by the plugin with its SLO; a1 with a per-pod cap from
//! the `bandwidth` capability), b1 to network `blue` (tenant blue, same subnet). Asserted:
//! the switch's records (tenants, SLO, VMs, limits), a1 and a2 ping each other over IPv4 and
//! IPv6 and move 1 MB of TCP through picnic (its counters show it), b1 cannot reach a1,
//! CHECK passes and finds a pod's interface set down, a malformed netconf gets a spec error
//! and creates nothing, STATUS passes, DEL and GC (of a pod the runtime lost track of) remove
//! the veths, the addresses and the switch's VM records, and DEL succeeds again when repeated. Addresses: 198.18.10.0/24 and 2001:db8:10::/64, only
//! inside the test's namespaces. Needs root and cnitool; skips and says so otherwise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::{api, is_root, run, wait_for_api, KillOnDrop, Netns};

/// Where scripts/setup_cni.sh puts cnitool and host-local.
fn tools_dir() -> PathBuf {
    std::env::var_os("PICNIC_CNI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/lib/picnic/cni"))
}

/// cnitool and host-local, installed by scripts/setup_cni.sh when missing; `None` (and why)
/// when they cannot be.
fn cni_tools() -> Option<PathBuf> {
    let dir = tools_dir();
    let present = |d: &Path| d.join("cnitool").is_file() && d.join("host-local").is_file();
    if !present(&dir) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/setup_cni.sh");
        let out = Command::new("bash").arg(script).output();
        if !present(&dir) {
            println!(
                "skipped: cnitool could not be installed into {} (scripts/setup_cni.sh: {})",
                dir.display(),
                out.map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
                    .unwrap_or_else(|e| e.to_string())
            );
            return None;
        }
    }
    Some(dir)
}

/// A pod: an empty network namespace made by `ip netns add`, deleted on drop.
struct Pod(String);

impl Pod {
    fn new(tag: &str) -> Pod {
        let pod = Pod(format!("pn-t-cni{tag}-{}", std::process::id()));
        let _ = Command::new("ip").args(["netns", "del", &pod.0]).output();
        run(&["ip", "netns", "add", &pod.0]);
        pod
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    fn exec(&self, argv: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(argv)
            .output()
            .unwrap()
    }

    /// Runs `f` on a thread inside the pod's namespace.
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
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
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A network's netconf: tenant `name`, `vni`, the SLO, and host-local addresses in
/// 198.18.10.`first`..=`last` (and 2001:db8:10::/64 when `ipv6`).
fn netconf(dir: &Path, name: &str, vni: u32, first: u8, last: u8, ipv6: bool) -> Value {
    let mut ranges = vec![json!([{
        "subnet": "198.18.10.0/24",
        "rangeStart": format!("198.18.10.{first}"),
        "rangeEnd": format!("198.18.10.{last}"),
    }])];
    if ipv6 {
        ranges.push(json!([{ "subnet": "2001:db8:10::/64" }]));
    }
    json!({
        "cniVersion": "1.1.0",
        "name": name,
        "type": "picnic-cni",
        "socket": dir.join("api.sock"),
        "tenant": name,
        "vni": vni,
        "slo": { "min_bps": 10_000_000, "max_loss": 0.01 },
        "pod": { "min_mbps": 50 },
        "capabilities": { "bandwidth": true, "picnic": true },
        "ipam": {
            "type": "host-local",
            "dataDir": dir.join("ipam"),
            "ranges": ranges,
        },
    })
}

/// cnitool in the switch's namespace (the host's, for the pods), with the test's netconfs
/// and plugins.
struct Cnitool {
    tool: PathBuf,
    switch_ns: String,
    netconfs: PathBuf,
    plugins: PathBuf,
}

impl Cnitool {
    fn run(&self, verb: &str, network: &str, pod: &Pod, cap_args: Option<&Value>) -> Output {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.switch_ns])
            .arg(&self.tool)
            .args([verb, network, &pod.path()])
            .env("NETCONFPATH", &self.netconfs)
            .env("CNI_PATH", &self.plugins);
        if let Some(caps) = cap_args {
            cmd.env("CAP_ARGS", caps.to_string());
        }
        cmd.output().unwrap()
    }

    /// `verb` must succeed; its stdout.
    fn ok(&self, verb: &str, network: &str, pod: &Pod, cap_args: Option<&Value>) -> String {
        let out = self.run(verb, network, pod, cap_args);
        assert!(
            out.status.success(),
            "cnitool {verb} {network} {}: {}{}",
            pod.0,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The IPv4 (and IPv6) address of an ADD result.
fn addresses(result: &str) -> (String, Option<String>) {
    let v: Value = serde_json::from_str(result).unwrap_or_else(|e| panic!("{e}: {result}"));
    let ips: Vec<String> = v["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| {
            ip["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let v4 = ips.iter().find(|a| !a.contains(':')).unwrap().clone();
    (v4, ips.into_iter().find(|a| a.contains(':')))
}

/// The host ends of pod veths (`pc...`) in the switch's namespace.
fn pod_veths(switch_ns: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-n", switch_ns, "-j", "link", "show"])
        .output()
        .unwrap();
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    links
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["ifname"].as_str())
        .filter(|n| n.starts_with("pc"))
        .map(str::to_string)
        .collect()
}

fn vms(sock: &Path) -> Vec<Value> {
    let (status, body) = api(sock, "GET", "/vms", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Value>(&body)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn ping(from: &Pod, to: &str) -> Output {
    let family = if to.contains(':') { "-6" } else { "-4" };
    from.exec(&["ping", family, "-c", "3", "-i", "0.2", "-W", "2", to])
}

#[test]
fn cnitool_attaches_pods_with_their_slos_that_talk_through_picnic_and_del_cleans_up() {
    if !is_root() {
        return;
    }
    let Some(tools) = cni_tools() else { return };
    let dir = std::env::temp_dir().join(format!("picnic-cni-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _cleanup = RemoveOnDrop(dir.clone());
    let (netconfs, plugins) = (dir.join("net.d"), dir.join("bin"));
    std::fs::create_dir_all(&netconfs).unwrap();
    std::fs::create_dir_all(&plugins).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_picnic"), plugins.join("picnic-cni")).unwrap();
    std::os::unix::fs::symlink(tools.join("host-local"), plugins.join("host-local")).unwrap();
    for (name, vni, first, last, ipv6) in
        [("red", 100, 10, 50, true), ("blue", 200, 100, 150, false)]
    {
        let conf = netconf(&dir, name, vni, first, last, ipv6);
        std::fs::write(netconfs.join(format!("{name}.conf")), conf.to_string()).unwrap();
    }
    // A typo in an SLO key: refused with the spec's error, naming it.
    let mut typo = netconf(&dir, "typo", 300, 200, 210, false);
    typo["slo"] = json!({ "max_los": 0.01 });
    std::fs::write(netconfs.join("typo.conf"), typo.to_string()).unwrap();

    let cfg = dir.join("host1.toml");
    std::fs::write(
        &cfg,
        format!(
            "[switch]\nhost_id = 1\napi = \"{}\"\n[uplink]\nifname = \"up0\"\n\
             [[hosts]]\nid = 1\nunderlay_ip = \"198.19.0.1\"\nmac = \"02:00:00:00:01:01\"\n",
            dir.join("api.sock").display()
        ),
    )
    .unwrap();
    let sock = dir.join("api.sock");
    let sw = Netns::new("cni", &[("up0", "up0p")]);
    let switch_ns = format!("pn-t-cni-{}", std::process::id());
    let (a1, a2, b1, stray) = (
        Pod::new("a1"),
        Pod::new("a2"),
        Pod::new("b1"),
        Pod::new("x1"),
    );
    let switch = KillOnDrop(sw.switch(&cfg));
    wait_for_api(&sock);
    let cni = Cnitool {
        tool: tools.join("cnitool"),
        switch_ns: switch_ns.clone(),
        netconfs,
        plugins,
    };
    // On failure too: DEL every pod while the switch runs (cnitool keeps each ADD's result
    // in /var/lib/cni until its DEL).
    let _del = DelOnDrop(
        &cni,
        [("red", &a1), ("red", &a2), ("blue", &b1), ("red", &stray)],
    );

    // ADD, the three at once as a runtime may (tenant red created once, distinct VM ids): a1
    // with a per-pod cap (the bandwidth capability) and packet rate (picnic's).
    let caps = json!({
        "bandwidth": { "ingressRate": 200_000_000, "egressRate": 300_000_000,
                       "ingressBurst": 1_000_000, "egressBurst": 1_000_000 },
        "picnic": { "max_pps": 50_000 },
    });
    let (a1_result, a2_result, b1_result) = std::thread::scope(|s| {
        let a1 = s.spawn(|| cni.ok("add", "red", &a1, Some(&caps)));
        let a2 = s.spawn(|| cni.ok("add", "red", &a2, None));
        let b1 = s.spawn(|| cni.ok("add", "blue", &b1, None));
        (a1.join().unwrap(), a2.join().unwrap(), b1.join().unwrap())
    });
    let (a1_ip, a1_ip6) = addresses(&a1_result);
    let (a2_ip, a2_ip6) = addresses(&a2_result);
    let (b1_ip, _) = addresses(&b1_result);
    println!("a1 {a1_ip} {a1_ip6:?}, a2 {a2_ip} {a2_ip6:?}, b1 {b1_ip}");

    // The switch's records: the tenants the plugin created with their SLO, the pods as VMs.
    let (_, tenants) = api(&sock, "GET", "/tenants", "");
    let tenants: Value = serde_json::from_str(&tenants).unwrap();
    for (name, vni) in [("red", 100), ("blue", 200)] {
        let t = tenants
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tenant {name}: {tenants}"));
        assert_eq!(t["vni"], vni, "{t}");
        assert_eq!(t["slo"]["min_bps"], 10_000_000, "{t}");
        assert_eq!(t["slo"]["max_loss"], 0.01, "{t}");
    }
    let recorded = vms(&sock);
    assert_eq!(recorded.len(), 3, "{recorded:?}");
    let mut ids: Vec<u64> = recorded.iter().map(|v| v["id"].as_u64().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "VM ids {ids:?}");
    let vm_of = |ip: &str| recorded.iter().find(|v| v["ip"] == ip).unwrap().clone();
    let (a1_vm, a2_vm) = (vm_of(&a1_ip), vm_of(&a2_ip));
    assert_eq!(a1_vm["tenant"], "red");
    assert_eq!(vm_of(&b1_ip)["tenant"], "blue");
    assert_eq!(a1_vm["max_mbps"], 200, "the lower bandwidth rate: {a1_vm}");
    assert_eq!(a1_vm["max_pps"], 50_000, "{a1_vm}");
    assert_eq!(a1_vm["min_mbps"], 50, "{a1_vm}");
    assert!(a2_vm["max_mbps"].is_null(), "{a2_vm}");
    assert_eq!(a1_vm["ipv6"][0], a1_ip6.as_deref().unwrap(), "{a1_vm}");
    assert_eq!(pod_veths(&switch_ns).len(), 3);

    // a1 and a2 talk through picnic: ping both ways, IPv4 and IPv6, then 1 MB of TCP echoed.
    for (from, to) in [
        (&a1, a2_ip.clone()),
        (&a2, a1_ip.clone()),
        (&a1, a2_ip6.clone().unwrap()),
        (&a2, a1_ip6.clone().unwrap()),
    ] {
        let out = ping(from, &to);
        assert!(
            out.status.success(),
            "{} could not ping {to}: {}{}",
            from.0,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let a2_addr = SocketAddr::new(a2_ip.parse().unwrap(), 5001);
    let listener = a2.enter(|| TcpListener::bind(a2_addr).unwrap());
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
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

    // Another tenant on the same subnet cannot reach a1.
    let out = b1.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "1", &a1_ip]);
    assert!(
        !out.status.success(),
        "b1 reached a1: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The switch carried it: a1's and a2's counters hold the transfer (1 MB each way); it
    // judges both tenants' SLOs.
    std::thread::sleep(Duration::from_millis(250));
    let (_, slo) = api(&sock, "GET", "/slo", "");
    let slo: Value = serde_json::from_str(&slo).unwrap();
    for name in ["red", "blue"] {
        let judged = slo["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["tenant"] == name);
        assert!(judged, "/slo has no tenant {name}: {slo}");
    }
    let (_, stats) = api(&sock, "GET", "/stats", "");
    let stats: Value = serde_json::from_str(&stats).unwrap();
    for name in [&a1_vm["name"], &a2_vm["name"]] {
        let vm = stats["switch"]["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| &v["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in /stats"));
        let c = &vm["counters"];
        println!(
            "{name}: {c:#}",
            c = json!({
                "tx_packets": c["tx_packets"], "tx_bytes": c["tx_bytes"],
                "rx_packets": c["rx_packets"], "rx_bytes": c["rx_bytes"],
            })
        );
        // Through picnic on either path: the engines' counts and the kernel fast path's.
        for key in ["tx_bytes", "rx_bytes"] {
            let both = c[key].as_u64().unwrap() + c["fast_path"][key].as_u64().unwrap();
            assert!(both >= 1 << 20, "{name} {key}: {c}");
        }
    }

    // CHECK: passes as added; finds a1's interface set down, then (up again) the IPv6
    // address the kernel dropped with the link; passes once that is back.
    cni.ok("check", "red", &a1, Some(&caps));
    run(&["ip", "-n", &a1.0, "link", "set", "eth0", "down"]);
    let a1_ip6 = a1_ip6.unwrap();
    for drift in [
        "eth0 is down".to_string(),
        format!("eth0 lacks its address {a1_ip6}/64"),
    ] {
        let out = cni.run("check", "red", &a1, Some(&caps));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(&drift), "{said}");
        run(&["ip", "-n", &a1.0, "link", "set", "eth0", "up"]);
    }
    let cidr = format!("{a1_ip6}/64");
    run(&[
        "ip", "-n", &a1.0, "-6", "addr", "add", &cidr, "dev", "eth0", "nodad",
    ]);
    cni.ok("check", "red", &a1, Some(&caps));

    // A malformed netconf: the spec's error naming the key, and nothing created.
    let out = cni.run("add", "typo", &stray, None);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("max_los"), "{said}");
    assert_eq!(pod_veths(&switch_ns).len(), 3);
    assert_eq!(vms(&sock).len(), 3);

    // CHECK finds a pod the switch lost (a restart without its state file): a2's record
    // removed by hand. (GC below cleans a2 up.)
    let a2_name = a2_vm["name"].as_str().unwrap();
    let (status, body) = api(&sock, "DELETE", &format!("/vms/{a2_name}"), "");
    assert_eq!(status, 200, "{body}");
    let out = cni.run("check", "red", &a2, None);
    let said = String::from_utf8_lossy(&out.stderr);
    let drift = format!("the switch has no VM '{a2_name}'");
    assert!(!out.status.success() && said.contains(&drift), "{said}");

    // STATUS: the switch answers.
    cni.ok("status", "red", &a1, None);

    // DEL: the switch's records, the veths and the pods' interfaces go.
    let gone = |pod: &Pod| {
        let out = pod.exec(&["ip", "link", "show", "eth0"]);
        assert!(!out.status.success(), "{}'s eth0 is still there", pod.0);
    };
    for (network, pod) in [("red", &a1), ("blue", &b1)] {
        cni.ok("del", network, pod, None);
        gone(pod);
    }
    // GC: a pod the runtime lost track of (its cached result gone) is removed with the ones
    // the runtime no longer lists (cnitool lists none: its DELs go to a2 through libcni's
    // cache, the plugin's GC finds the stray one in the switch).
    let (stray_ip, _) = addresses(&cni.ok("add", "red", &stray, None));
    let stray_vm = vms(&sock)
        .into_iter()
        .find(|v| v["ip"] == stray_ip.as_str())
        .unwrap();
    // The switch's name is cni:CONTAINERID:IFNAME, libcni's file NETWORK-CONTAINERID-IFNAME.
    let stray_name = stray_vm["name"].as_str().unwrap();
    let cached = format!("red-{}", stray_name["cni:".len()..].replace(':', "-"));
    std::fs::remove_file(Path::new("/var/lib/cni/results").join(&cached)).unwrap();
    cni.ok("gc", "red", &stray, None);
    gone(&a2);
    gone(&stray);
    assert!(vms(&sock).is_empty(), "{:?}", vms(&sock));
    assert!(
        pod_veths(&switch_ns).is_empty(),
        "{:?}",
        pod_veths(&switch_ns)
    );
    // DEL again succeeds.
    cni.ok("del", "red", &a1, None);
    // The addresses went back to host-local (it keeps a file per address in use).
    for network in ["red", "blue"] {
        let held: Vec<String> = std::fs::read_dir(dir.join("ipam").join(network))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.parse::<std::net::IpAddr>().is_ok())
            .collect();
        assert!(
            held.is_empty(),
            "{network}: host-local still holds {held:?}"
        );
    }

    // STATUS with the switch stopped: not available.
    drop(switch);
    let out = cni.run("status", "red", &a1, None);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("does not answer"),
        "{said}"
    );
}

/// DELs the pods when the test ends, failed or not (a DEL of a pod gone succeeds).
struct DelOnDrop<'a, const N: usize>(&'a Cnitool, [(&'static str, &'a Pod); N]);
impl<const N: usize> Drop for DelOnDrop<'_, N> {
    fn drop(&mut self) {
        for (network, pod) in self.1 {
            let _ = self.0.run("del", network, pod, None);
        }
    }
}

/// Removes the test's directory when the test ends, failed or not.
struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
