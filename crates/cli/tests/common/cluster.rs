//! The three-switch cluster of the etcd root tests (tests/cluster.rs, tests/feedback_key.rs):
//! namespaces for the fabric, the hosts and the VMs, etcd in the fabric's namespace on a
//! management bridge, `picnic ctl` there, and each host's switch configured with
//! `[control]` and nothing else of the deployment.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{api, run, KillOnDrop};

/// A namespace deleted on drop.
pub struct Ns(pub String);
impl Ns {
    pub fn new(role: &str) -> Ns {
        let ns = Ns(format!("pn-c-{role}-{}", std::process::id()));
        let _ = Command::new("ip").args(["netns", "del", &ns.0]).output();
        run(&["ip", "netns", "add", &ns.0]);
        for sysctl in ["all", "default"] {
            let key = format!("net.ipv6.conf.{sysctl}.disable_ipv6=1");
            run(&["ip", "netns", "exec", &ns.0, "sysctl", "-qw", &key]);
        }
        run(&["ip", "-n", &ns.0, "link", "set", "dev", "lo", "up"]);
        ns
    }
    pub fn ip(&self, args: &[&str]) {
        let mut argv = vec!["ip", "-n", &self.0];
        argv.extend_from_slice(args);
        run(&argv);
    }
}
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A veth pair: `a` in `na`, `b` in `nb`, both up.
pub fn veth(na: &Ns, a: &str, nb: &Ns, b: &str) {
    let (ta, tb) = (
        format!("pnc{}a", std::process::id()),
        format!("pnc{}b", std::process::id()),
    );
    run(&[
        "ip", "link", "add", &ta, "type", "veth", "peer", "name", &tb,
    ]);
    run(&["ip", "link", "set", "dev", &ta, "netns", &na.0, "name", a]);
    run(&["ip", "link", "set", "dev", &tb, "netns", &nb.0, "name", b]);
    na.ip(&["link", "set", "dev", a, "up"]);
    nb.ip(&["link", "set", "dev", b, "up"]);
}

/// etcd in the fabric's namespace `ns`, on its management address, data in `dir`.
pub struct Etcd {
    pub dir: PathBuf,
    pub ns: String,
}
impl Etcd {
    pub fn start(&self) -> KillOnDrop {
        let client = self.url();
        let peer = "http://127.0.0.1:2380";
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "etcd",
                "--name",
                "t",
                "--data-dir",
            ])
            .arg(&self.dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
            ])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let guard = KillOnDrop(child);
        let end = Instant::now() + Duration::from_secs(10);
        while !ctl(self, &["host", "show"]).status.success() {
            assert!(Instant::now() < end, "etcd did not answer within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        guard
    }
    pub fn url(&self) -> String {
        format!("http://{MGMT}.254:2379")
    }
}

/// The management network's /24.
pub const MGMT: &str = "198.19.255";

/// `picnic ctl --etcd URL ARGS`, in the fabric's namespace.
pub fn ctl(etcd: &Etcd, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &etcd.ns, env!("CARGO_BIN_EXE_picnic")])
        .args(["ctl", "--etcd", &etcd.url()])
        .args(args)
        .output()
        .unwrap()
}

/// As [`ctl`], which must succeed; its stdout.
pub fn ctl_ok(etcd: &Etcd, args: &[&str]) -> String {
    let out = ctl(etcd, args);
    assert!(
        out.status.success(),
        "picnic ctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Host `id`'s switch config: itself, its uplink and the control plane, then `extra` (TOML
/// sections); no tenant, no VM.
pub fn config(dir: &Path, id: u32, etcd: &Etcd, extra: &str) -> PathBuf {
    let text = format!(
        r#"
[switch]
host_id = {id}
api = "{dir}/h{id}.sock"
state_file = "{dir}/h{id}.state.json"
[uplink]
ifname = "up0"
[control]
etcd = ["{url}"]
[[hosts]]
id = {id}
underlay_ip = "198.19.0.{id}"
mac = "02:00:00:00:01:0{id}"
{extra}
"#,
        dir = dir.display(),
        url = etcd.url()
    );
    let path = dir.join(format!("h{id}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

pub fn switch(host: &Ns, cfg: &Path, log: &Path) -> KillOnDrop {
    let log = std::fs::File::create(log).unwrap();
    let child: Child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &host.0,
            env!("CARGO_BIN_EXE_picnic"),
            "switch",
            "--config",
        ])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

/// One ping from namespace `from` to `ip`, waiting at most 200 ms for the reply.
pub fn ping(from: &Ns, ip: &str) -> bool {
    Command::new("ip")
        .args([
            "netns", "exec", &from.0, "ping", "-c", "1", "-W", "0.2", "-q", ip,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Pings until a reply or `limit`; how long after `since` the reply came.
pub fn first_reply(from: &Ns, ip: &str, since: Instant, limit: Duration) -> Option<Duration> {
    while since.elapsed() < limit {
        if ping(from, ip) {
            return Some(since.elapsed());
        }
    }
    None
}

/// A VM: namespace `v-NAME` with `eth0` (its MAC and address) whose peer `NAME` is in `host`.
pub fn vm(name: &str, id: u8, host: &Ns) -> Ns {
    let ns = Ns::new(&format!("v{name}"));
    veth(&ns, "eth0", host, name);
    ns.ip(&[
        "link",
        "set",
        "dev",
        "eth0",
        "address",
        &format!("02:00:00:00:00:{id:02x}"),
    ]);
    ns.ip(&["addr", "add", &format!("198.18.0.{id}/24"), "dev", "eth0"]);
    ns
}

/// `picnic ctl vm add` (then `extra` arguments); it waits for the switches that are up.
pub fn add_vm(etcd: &Etcd, name: &str, id: u8, host: u32, extra: &[&str]) {
    let (mac, ip) = (format!("02:00:00:00:00:{id:02x}"), format!("198.18.0.{id}"));
    let (id, host) = (id.to_string(), host.to_string());
    let mut args = vec![
        "vm", "add", name, "--tenant", "t", "--host", &host, "--mac", &mac, "--ip", &ip, "--id",
        &id,
    ];
    args.extend_from_slice(extra);
    ctl_ok(etcd, &args);
}

/// Waits until the switch whose API is `sock` lists VM `name`.
pub fn wait_for_vm(sock: &Path, name: &str) {
    let end = Instant::now() + Duration::from_secs(5);
    while !api(sock, "GET", "/vms", "")
        .1
        .contains(&format!("\"{name}\""))
    {
        assert!(
            Instant::now() < end,
            "{} never listed {name}",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A three-host cluster on a real etcd, its hosts registered with `picnic ctl` and one
/// tenant `t` (VNI 100) added: the scratch dir (named after `test`), the fabric, the hosts,
/// etcd and its process. `None`, with the reason printed, without root or etcd.
pub fn cluster(test: &str) -> Option<(PathBuf, Ns, Vec<Ns>, Etcd, KillOnDrop)> {
    if !super::is_root() {
        return None;
    }
    if Command::new("etcd").arg("--version").output().is_err() {
        println!("skipped: needs etcd (Debian's etcd-server; scripts/setup.sh installs it)");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("picnic-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (fabric, hosts, etcd) = fabric(&dir);
    let etcd_proc = etcd.start();
    for i in 1..=3 {
        let (id, ip, mac) = (
            i.to_string(),
            format!("198.19.0.{i}"),
            format!("02:00:00:00:01:0{i}"),
        );
        ctl_ok(
            &etcd,
            &["host", "add", &id, "--underlay-ip", &ip, "--mac", &mac],
        );
    }
    ctl_ok(&etcd, &["tenant", "add", "t", "--vni", "100"]);
    Some((dir, fabric, hosts, etcd, etcd_proc))
}

/// The fabric's namespace (a bridge `br0` with each host's uplink `up0`, host `i`'s MAC
/// 02:00:00:00:01:0i; the management bridge `mg0` with etcd's address), the three hosts'
/// namespaces, and etcd (not started; its data in `dir`).
pub fn fabric(dir: &Path) -> (Ns, Vec<Ns>, Etcd) {
    // The fabric: a bridge with each host's uplink, and the management bridge with etcd.
    let fabric = Ns::new("fabric");
    for br in ["br0", "mg0"] {
        fabric.ip(&["link", "add", br, "type", "bridge"]);
        fabric.ip(&["link", "set", "dev", br, "up"]);
    }
    fabric.ip(&["addr", "add", &format!("{MGMT}.254/24"), "dev", "mg0"]);
    let hosts: Vec<Ns> = (1..=3).map(|i| Ns::new(&format!("h{i}"))).collect();
    for (i, h) in hosts.iter().enumerate() {
        let (up, mg) = (format!("f{}", i + 1), format!("m{}", i + 1));
        veth(h, "up0", &fabric, &up);
        h.ip(&[
            "link",
            "set",
            "dev",
            "up0",
            "address",
            &format!("02:00:00:00:01:0{}", i + 1),
        ]);
        fabric.ip(&["link", "set", "dev", &up, "master", "br0"]);
        veth(h, "mgmt", &fabric, &mg);
        h.ip(&[
            "addr",
            "add",
            &format!("{MGMT}.{}/24", i + 1),
            "dev",
            "mgmt",
        ]);
        fabric.ip(&["link", "set", "dev", &mg, "master", "mg0"]);
    }
    let etcd = Etcd {
        dir: dir.join("etcd"),
        ns: fabric.0.clone(),
    };
    (fabric, hosts, etcd)
}
