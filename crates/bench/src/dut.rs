//! The testbed and the devices under test.
//!
//! One path shape for every device: `gen` namespace (device `g0`) --veth--> `dut` namespace
//! (tenant port `t0`, uplink `u0`) --veth--> `sink` namespace (device `s0`). The device under
//! test forwards `t0 -> u0` and nothing else differs between runs. picnic is measured as one
//! host's switch with the generator as its local VM and the sink as the fabric: its egress
//! engine (classify, anti-spoofing, admission, WFQ, pacing, Geneve encap) is one forwarding
//! pass, as the raw forwarder's, the bridge's and OVS's are, so the ratios compare like with
//! like. (A two-host shape would make picnic do two passes, egress and ingress, where the
//! peers do one.)

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use picnic_netns::{self as netns, NsThread, Testbed};
use picnic_switch::config::{Backend, Config, Isolation, Mac};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{
    wait_readable, AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Port,
};
use picnic_switch::runner::Switch;

use crate::cpu::{self, gettid};
use crate::traffic::pin_current_thread;

/// Generator device (sender namespace).
pub const GEN_DEV: &str = "g0";
/// Tenant port of the device under test.
pub const TENANT_DEV: &str = "t0";
/// Uplink of the device under test.
pub const UPLINK_DEV: &str = "u0";
/// Sink device (receiver namespace).
pub const SINK_DEV: &str = "s0";
/// MTU of every link: room for 1500 B tenant frames plus picnic's encapsulation.
pub const LINK_MTU: u32 = 1600;
/// CPU the device under test is pinned to (the generator gets CPU 0).
pub const DUT_CPU: usize = 1;

/// The tenant VM (the generator) and the remote VM its frames go to.
pub const VM_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 1];
pub const VM_IP: [u8; 4] = [10, 0, 0, 1];
pub const REMOTE_MAC: [u8; 6] = [0x02, 0, 0, 0, 2, 1];
pub const REMOTE_IP: [u8; 4] = [10, 0, 0, 2];

/// The namespaces and links of one bench run.
pub struct Bed {
    pub gen_ns: String,
    pub dut_ns: String,
    pub sink_ns: String,
    _testbed: Testbed,
}

impl Bed {
    /// Builds the three namespaces and two veth pairs; tx checksum offload off on the
    /// generator's device (userspace forwarders pass frames as they are, DESIGN.md 7).
    pub fn new() -> Result<Bed> {
        let mut tb = Testbed::new()?;
        let gen_ns = tb.add_namespace("bgen")?;
        let dut_ns = tb.add_namespace("bdut")?;
        let sink_ns = tb.add_namespace("bsink")?;
        netns::add_veth(&gen_ns, GEN_DEV, &dut_ns, TENANT_DEV)?;
        netns::add_veth(&dut_ns, UPLINK_DEV, &sink_ns, SINK_DEV)?;
        let mac = |b: [u8; 6]| Mac(b).to_string();
        netns::configure_link(&gen_ns, GEN_DEV, &mac(VM_MAC), LINK_MTU)?;
        netns::configure_link(&dut_ns, TENANT_DEV, "02:00:00:00:00:0a", LINK_MTU)?;
        netns::configure_link(&dut_ns, UPLINK_DEV, "02:00:00:00:00:01", LINK_MTU)?;
        netns::configure_link(&sink_ns, SINK_DEV, "02:00:00:00:00:99", LINK_MTU)?;
        for (ns, dev) in [
            (&gen_ns, GEN_DEV),
            (&dut_ns, TENANT_DEV),
            (&dut_ns, UPLINK_DEV),
        ] {
            netns::tx_offload_off(ns, dev)?;
        }
        Ok(Bed {
            gen_ns,
            dut_ns,
            sink_ns,
            _testbed: tb,
        })
    }
}

/// Which device forwards `t0 -> u0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DutKind {
    /// AF_PACKET receive ring -> sendmmsg, no logic: the limit of this backend.
    Raw,
    /// AF_XDP RX ring -> AF_XDP TX ring (copy mode), no logic: the limit of that backend.
    RawXdp,
    /// picnic's switch with every isolation mechanism on.
    PicnicOn,
    /// picnic's switch with every isolation mechanism on, AF_XDP ports.
    PicnicXdp,
    /// picnic's switch with isolation off (anti-spoofing and tenant separation stay).
    PicnicOff,
    /// A Linux bridge, with an HTB class on the uplink as its QoS setting.
    Bridge,
    /// Open vSwitch userspace datapath, `type=afxdp-nonpmd` ports, an OpenFlow meter.
    OvsAfxdp,
    /// Open vSwitch userspace datapath, ordinary (AF_PACKET) ports, an OpenFlow meter.
    Ovs,
}

impl DutKind {
    /// All devices, in report order.
    pub const ALL: [DutKind; 8] = [
        DutKind::Raw,
        DutKind::RawXdp,
        DutKind::PicnicOn,
        DutKind::PicnicXdp,
        DutKind::PicnicOff,
        DutKind::OvsAfxdp,
        DutKind::Ovs,
        DutKind::Bridge,
    ];

    /// The JSON key prefix (`<key>_pps`).
    pub fn key(self) -> &'static str {
        match self {
            DutKind::Raw => "raw",
            DutKind::RawXdp => "raw_xdp",
            DutKind::PicnicXdp => "picnic_xdp",
            DutKind::PicnicOn => "picnic",
            DutKind::PicnicOff => "picnic_off",
            DutKind::Bridge => "bridge",
            DutKind::OvsAfxdp => "ovs_afxdp",
            DutKind::Ovs => "ovs",
        }
    }

    /// What is measured, for the table.
    pub fn describe(self) -> &'static str {
        match self {
            DutKind::Raw => "raw AF_PACKET forwarder (no logic)",
            DutKind::RawXdp => "raw AF_XDP forwarder (no logic)",
            DutKind::PicnicXdp => "picnic switch, isolation on, AF_XDP",
            DutKind::PicnicOn => "picnic switch, isolation on",
            DutKind::PicnicOff => "picnic switch, isolation off",
            DutKind::Bridge => "Linux bridge + HTB class",
            DutKind::OvsAfxdp => "OVS netdev, afxdp ports + meter",
            DutKind::Ovs => "OVS netdev, system ports + meter",
        }
    }
}

/// A running device under test.
pub enum Dut {
    /// A forwarding thread in this process (raw forwarder or picnic switch).
    Thread {
        stop: Arc<AtomicBool>,
        tid: Arc<AtomicU64>,
        thread: NsThread<Result<String>>,
    },
    /// The kernel bridge: nothing runs.
    Kernel,
    /// ovsdb-server and ovs-vswitchd.
    Ovs(Ovs),
}

impl Dut {
    /// Starts `kind` on `bed`; the raw forwarders and picnic spin for work up to `spin`
    /// before they block (the bridge and OVS's non-PMD ports have no such setting).
    pub fn start(kind: DutKind, bed: &Bed, spin: Duration) -> Result<Dut> {
        match kind {
            DutKind::Raw => {
                spawn_thread(bed, move |stop, tid| raw_forwarder(false, spin, stop, tid))
            }
            DutKind::RawXdp => {
                spawn_thread(bed, move |stop, tid| raw_forwarder(true, spin, stop, tid))
            }
            DutKind::PicnicOn | DutKind::PicnicOff | DutKind::PicnicXdp => {
                let mut cfg = picnic_config(kind != DutKind::PicnicOff)?;
                cfg.switch.spin_us = spin.as_micros() as u64;
                if kind == DutKind::PicnicXdp {
                    cfg.uplink.backend = Backend::AfXdp;
                    for port in cfg.vms.iter_mut().filter_map(|v| v.port.as_mut()) {
                        port.backend = Backend::AfXdp;
                    }
                }
                spawn_thread(bed, move |stop, tid| run_picnic(cfg, stop, tid))
            }
            DutKind::Bridge => {
                let ns = &bed.dut_ns;
                netns::add_bridge(ns, "br0")?;
                netns::enslave(ns, TENANT_DEV, "br0")?;
                netns::enslave(ns, UPLINK_DEV, "br0")?;
                // The remote VM is behind the uplink: no flooding, no learning delay.
                netns::bridge(
                    ns,
                    &[
                        "fdb",
                        "add",
                        &Mac(REMOTE_MAC).to_string(),
                        "dev",
                        UPLINK_DEV,
                        "master",
                        "static",
                    ],
                )?;
                // Its QoS setting of the same intent as picnic's per-VM cap: an HTB class on
                // the uplink at a rate that does not bind (no police action on this kernel).
                netns::shape_htb(ns, UPLINK_DEV, 100_000, 4 << 20)?;
                Ok(Dut::Kernel)
            }
            DutKind::OvsAfxdp | DutKind::Ovs => Ok(Dut::Ovs(Ovs::start(
                &bed.dut_ns,
                kind == DutKind::OvsAfxdp,
            )?)),
        }
    }

    /// Scheduler times of the device's threads so far (see `cpu`): the forwarding threads
    /// in this process, every thread of ovs-vswitchd, none for the kernel bridge (its work
    /// is softirq time).
    pub fn threads_ns(&self) -> cpu::ThreadTimes {
        match self {
            Dut::Thread { .. } => cpu::device_threads_ns(),
            Dut::Kernel => cpu::ThreadTimes::default(),
            Dut::Ovs(o) => o.vswitchd_pid().map_or(Default::default(), |pid| {
                cpu::threads_ns(&pid.to_string(), &[])
            }),
        }
    }

    /// Sets the nice value of every thread of the device (none for the bridge, whose work
    /// runs in the generator's context).
    pub fn set_nice(&self, nice: i32) -> Result<()> {
        let tids = match self {
            Dut::Thread { .. } => cpu::tids("self", &cpu::bench_threads()),
            Dut::Kernel => Vec::new(),
            Dut::Ovs(o) => cpu::tids(&o.vswitchd_pid()?.to_string(), &[]),
        };
        tids.into_iter().try_for_each(|t| cpu::set_nice(t, nice))
    }

    /// Stops the device; returns its closing summary line, if any.
    pub fn stop(self, bed: &Bed) -> Result<String> {
        match self {
            Dut::Thread { stop, thread, .. } => {
                stop.store(true, Ordering::Relaxed);
                thread.join()?
            }
            Dut::Kernel => {
                netns::ip(&bed.dut_ns, &["link", "del", "br0"])?;
                netns::tc(&bed.dut_ns, &["qdisc", "del", "dev", UPLINK_DEV, "root"])?;
                Ok(String::new())
            }
            Dut::Ovs(o) => o.stop(),
        }
    }
}

fn spawn_thread(
    bed: &Bed,
    body: impl FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Result<String> + Send + 'static,
) -> Result<Dut> {
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicU64::new(0));
    let (s, t) = (stop.clone(), tid.clone());
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let thread = netns::spawn_in_netns(&bed.dut_ns, move || {
        let result = body(s, t);
        let _ = done_tx.send(());
        result
    })?;
    // Started once the thread published its id (after opening its ports).
    for _ in 0..500 {
        if tid.load(Ordering::Relaxed) != 0 {
            return Ok(Dut::Thread { stop, tid, thread });
        }
        if done_rx.try_recv().is_ok() {
            return Err(thread
                .join()?
                .err()
                .unwrap_or_else(|| anyhow!("forwarder exited at start")));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("forwarding thread did not start within 5 s")
}

/// The raw limit: `t0` -> `u0` through AF_PACKET rings and sendmmsg (or AF_XDP sockets with
/// `xdp`), no logic, in the switch's process model (one thread, spin up to `spin` then block on
/// the descriptors).
fn raw_forwarder(
    xdp: bool,
    spin: Duration,
    stop: Arc<AtomicBool>,
    tid: Arc<AtomicU64>,
) -> Result<String> {
    pin_current_thread(DUT_CPU)?;
    let open = |dev: &str| -> Result<Box<dyn Port>> {
        Ok(if xdp {
            Box::new(AfXdpPort::open(dev, AfXdpOptions::default())?)
        } else {
            Box::new(AfPacketPort::open(dev, AfPacketOptions::default())?)
        })
    };
    let mut rx_port = open(TENANT_DEV)?;
    let mut tx_port = open(UPLINK_DEV)?;
    let mut pool = FramePool::new(16384);
    let mut q: Vec<Frame> = Vec::with_capacity(1024);
    let fds: Vec<_> = rx_port.raw_fd().into_iter().collect();
    let mut last_work = std::time::Instant::now();
    tid.store(gettid(), Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        let n = if q.len() < 256 {
            rx_port.recv_batch(&mut pool, &mut q, 64)?
        } else {
            0
        };
        tx_port.send_batch(&mut q, &mut pool)?;
        if n > 0 {
            last_work = std::time::Instant::now();
        } else if q.is_empty() && last_work.elapsed() >= spin {
            wait_readable(&fds, Duration::from_millis(5))?;
        }
    }
    let (r, t) = (rx_port.stats(), tx_port.stats());
    Ok(format!(
        "raw forwarder: rx {} (kernel drops {}) tx {}",
        r.rx_frames, r.rx_dropped, t.tx_frames
    ))
}

/// picnic's switch config for the bench: this host (1) with the generator as VM `a`, the
/// remote VM `b` on host 2 behind the uplink; limits far above the offered load, so every
/// mechanism runs and none binds.
pub fn picnic_config(isolated: bool) -> Result<Config> {
    // Written as a config file, so a new setting with a default needs no change here.
    let text = format!(
        r#"
[switch]
host_id = 1
frame_pool = 16384
batch = 64
spin_us = 50

[uplink]
ifname = "{UPLINK_DEV}"
mtu = {LINK_MTU}
capacity_mbps = 100000

[ingress]
capacity_mbps = 100000

[[hosts]]
id = 1
underlay_ip = "192.168.0.1"
mac = "02:00:00:00:00:01"

[[hosts]]
id = 2
underlay_ip = "192.168.0.2"
mac = "02:00:00:00:00:02"

# Iron accounting on, with a quota that does not bind: Iron charges the tenant for the
# switch's work and for the softirq work of its frames (about 4.5 us per 64 B frame on
# AF_PACKET ports), so a quota of one core bound at ~220 kpps; 64 (the largest) never does.
[[tenants]]
name = "t"
vni = 100
cpu_quota = 64.0

[[vms]]
name = "a"
id = 1
tenant = "t"
host = 1
mac = "{vm_mac}"
ip = "{vm_ip}"
min_mbps = 1000
max_mbps = 100000
port = {{ ifname = "{TENANT_DEV}" }}

[[vms]]
name = "b"
id = 2
tenant = "t"
host = 2
mac = "{remote_mac}"
ip = "{remote_ip}"
min_mbps = 1000
"#,
        vm_mac = Mac(VM_MAC),
        vm_ip = Ipv4Addr::from(VM_IP),
        remote_mac = Mac(REMOTE_MAC),
        remote_ip = Ipv4Addr::from(REMOTE_IP),
    );
    let mut cfg = Config::parse(&text).context("bench switch config")?;
    if !isolated {
        cfg.isolation = Isolation::off();
    }
    Ok(cfg)
}

fn run_picnic(cfg: Config, stop: Arc<AtomicBool>, tid: Arc<AtomicU64>) -> Result<String> {
    pin_current_thread(DUT_CPU)?;
    let mut switch = Switch::open(cfg)?;
    let flag = switch.stop_flag();
    let shared = switch.shared();
    let watcher = std::thread::spawn(move || {
        cpu::register_bench_thread();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        flag.store(true, Ordering::Relaxed);
    });
    tid.store(gettid(), Ordering::Relaxed);
    let result = switch.run();
    let _ = watcher.join();
    result?;
    let snap = shared.latest();
    Ok(match snap.as_deref() {
        Some(published) => format!(
            "picnic: uplink tx {} drops {:?}",
            published.switch.switch.uplink_tx_packets,
            published
                .switch
                .vms
                .iter()
                .flat_map(|v| v.counters.drops.iter())
                .filter(|(_, n)| *n > 0)
                .map(|(r, n)| format!("{}={n}", r.as_str()))
                .collect::<Vec<_>>()
        ),
        None => String::new(),
    })
}

/// Open vSwitch's userspace datapath, started by hand inside the device namespace with its
/// database, sockets and logs in a temporary directory (DESIGN.md 7: the kernel has no OVS
/// module; one ovsdb-server/ovs-vswitchd pair per namespace works).
pub struct Ovs {
    ns: String,
    dir: PathBuf,
    /// ovs-vswitchd, run as a child rather than detached: see [`Ovs::configure`].
    vswitchd: Option<std::process::Child>,
}

/// Debian package providing OVS.
pub const OVS_PACKAGE: &str = "openvswitch-switch";

/// Installs Open vSwitch with apt-get when it is missing (the bench runs as root).
pub fn ensure_ovs() -> Result<()> {
    if netns::have_tool("ovs-vswitchd") && netns::have_tool("ovsdb-server") {
        return Ok(());
    }
    eprintln!("bench: Open vSwitch is missing: running `apt-get install -y {OVS_PACKAGE}`");
    let status = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends", OVS_PACKAGE])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get install {OVS_PACKAGE} failed ({status}); try `apt-get update` first");
    }
    Ok(())
}

impl Ovs {
    fn start(ns: &str, afxdp: bool) -> Result<Ovs> {
        let dir = std::env::temp_dir().join(format!("{ns}-ovs"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut ovs = Ovs {
            ns: ns.to_owned(),
            dir,
            vswitchd: None,
        };
        match ovs.configure(afxdp) {
            Ok(()) => Ok(ovs),
            Err(e) => {
                // Never leave daemons behind a failed start.
                let _ = ovs.stop();
                Err(e)
            }
        }
    }

    /// Starts both daemons and sets up the bridge, ports, meter and flow.
    ///
    /// ovs-vswitchd is not `--detach`ed: a detached daemon starts a new session, hence (with
    /// the kernel's scheduler autogroups, on by default) its own CPU-share group, and on a
    /// shared machine it would get a full group's share of its CPU where picnic's and the raw
    /// forwarder's threads share the bench process's group with the generator. As a child it
    /// competes for CPU exactly as they do.
    fn configure(&mut self, afxdp: bool) -> Result<()> {
        let d = self.dir.display().to_string();
        let schema = "/usr/share/openvswitch/vswitch.ovsschema";
        self.run("ovsdb-tool", &["create", &format!("{d}/conf.db"), schema])?;
        self.run(
            "ovsdb-server",
            &[
                &format!("{d}/conf.db"),
                &format!("--remote=punix:{d}/db.sock"),
                &format!("--pidfile={d}/ovsdb-server.pid"),
                &format!("--log-file={d}/ovsdb-server.log"),
                &format!("--unixctl={d}/ovsdb-server.ctl"),
                "--detach",
            ],
        )?;
        self.vsctl(&["--no-wait", "init"])?;
        self.start_vswitchd()?;
        let ovs = &*self;
        // Same CPU as the other devices under test (all its threads).
        let pid = ovs.vswitchd_pid()?.to_string();
        let _ = netns::cmd("taskset", &["-a", "-p", "-c", &DUT_CPU.to_string(), &pid]);
        ovs.vsctl(&[
            "add-br",
            "br0",
            "--",
            "set",
            "bridge",
            "br0",
            "datapath_type=netdev",
            "protocols=OpenFlow13",
        ])?;
        for dev in [TENANT_DEV, UPLINK_DEV] {
            let mut args = vec!["add-port", "br0", dev];
            if afxdp {
                // Polled by the main thread, not a busy PMD thread (DESIGN.md 7).
                args.extend(["--", "set", "interface", dev, "type=afxdp-nonpmd"]);
            }
            ovs.vsctl(&args)?;
        }
        // Its QoS setting of the same intent as picnic's per-VM cap: an OpenFlow meter that
        // does not bind (ingress_policing_rate is not enforced here, DESIGN.md 7).
        ovs.ofctl(&[
            "add-meter",
            "br0",
            "meter=1,kbps,band=type=drop,rate=100000000",
        ])?;
        ovs.ofctl(&["del-flows", "br0"])?;
        ovs.ofctl(&[
            "add-flow",
            "br0",
            &format!("in_port={TENANT_DEV},actions=meter:1,output:{UPLINK_DEV}"),
        ])?;
        // Wait until the ports are up in the datapath.
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }

    /// Starts ovs-vswitchd as a child process and waits until it wrote its pid file.
    fn start_vswitchd(&mut self) -> Result<()> {
        let d = self.dir.display().to_string();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "ovs-vswitchd"])
            .args([
                format!("unix:{d}/db.sock"),
                format!("--pidfile={d}/ovs-vswitchd.pid"),
                format!("--log-file={d}/ovs-vswitchd.log"),
                format!("--unixctl={d}/ovs-vswitchd.ctl"),
            ])
            .env("OVS_RUNDIR", &d)
            .env("OVS_DBDIR", &d)
            .env("OVS_LOGDIR", &d)
            .env("OVS_SYSCONFDIR", &d)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("running ovs-vswitchd")?;
        self.vswitchd = Some(child);
        for _ in 0..500 {
            if self.vswitchd_pid().is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .vswitchd
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("ovs-vswitchd exited at start ({status}); see {d}/ovs-vswitchd.log");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("ovs-vswitchd wrote no pid file within 5 s; see {d}/ovs-vswitchd.log")
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let d = self.dir.display().to_string();
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, program])
            .args(args)
            .env("OVS_RUNDIR", &d)
            .env("OVS_DBDIR", &d)
            .env("OVS_LOGDIR", &d)
            .env("OVS_SYSCONFDIR", &d)
            .output()
            .with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!(
                "`{program} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn vsctl(&self, args: &[&str]) -> Result<String> {
        let db = format!("--db=unix:{}/db.sock", self.dir.display());
        let mut full = vec![db.as_str(), "--timeout=10"];
        full.extend_from_slice(args);
        self.run("ovs-vsctl", &full)
    }

    fn ofctl(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-O", "OpenFlow13"];
        full.extend_from_slice(args);
        self.run("ovs-ofctl", &full)
    }

    fn pid(&self, daemon: &str) -> Result<u32> {
        let path = self.dir.join(format!("{daemon}.pid"));
        std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("pid in {}", path.display()))
    }

    /// Pid of ovs-vswitchd.
    pub fn vswitchd_pid(&self) -> Result<u32> {
        self.pid("ovs-vswitchd")
    }

    /// Stops both daemons (SIGTERM to the pids they wrote) and removes the directory.
    fn stop(mut self) -> Result<String> {
        let summary = self
            .ofctl(&["dump-flows", "br0"])
            .map(|s| format!("ovs flows: {}", s.lines().last().unwrap_or("").trim()))
            .unwrap_or_default();
        if let Some(mut child) = self.vswitchd.take() {
            if let Ok(pid) = self.pid("ovs-vswitchd") {
                // SAFETY: kill with the pid of our child; no memory involved.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            for _ in 0..100 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Reaps it; kills it first if SIGTERM did not end it.
            let _ = child.kill();
            let _ = child.wait();
        }
        for daemon in ["ovsdb-server"] {
            if let Ok(pid) = self.pid(daemon) {
                // SAFETY: kill with a pid the daemon we started wrote; no memory involved.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                for _ in 0..100 {
                    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(summary)
    }
}
