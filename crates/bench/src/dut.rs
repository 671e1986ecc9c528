//! The devices under test, on the testbed of [`crate::bed`] (the one-host shape here; the
//! two-host shape's pairs in [`crate::twohost`]).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use picnic_netns::{self as netns, NsThread};
use picnic_switch::config::{Backend, Config, Isolation, Mac, PortEntry};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{
    wait_readable, AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Port,
};
use picnic_switch::runner::Switch;

use crate::bed::{
    Bed, DUT_CPU, HOST1_IP, HOST1_MAC, HOST2_IP, HOST2_MAC, LINK_MTU, PEER_TENANT_DEV,
    PEER_UPLINK_DEV, REMOTE_IP, REMOTE_MAC, TENANT_DEV, UPLINK_DEV, VM_IP, VM_MAC,
};
use crate::cpu::{self, gettid};
use crate::ovs::{Ovs, OvsRole};
use crate::traffic::pin_current_thread;

/// Which device forwards `t0 -> u0` (and `u1 -> t1` in the two-host shape).
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
    /// picnic's switch, isolation on, with the kernel fast path (docs/switch.md "Two paths").
    PicnicFast,
    /// A Linux bridge, with an HTB class on the uplink as its QoS setting.
    Bridge,
    /// Open vSwitch userspace datapath, `type=afxdp-nonpmd` ports, an OpenFlow meter.
    OvsAfxdp,
    /// Open vSwitch userspace datapath, ordinary (AF_PACKET) ports, an OpenFlow meter.
    Ovs,
}

impl DutKind {
    /// All devices, in report order.
    pub const ALL: [DutKind; 9] = [
        DutKind::Raw,
        DutKind::RawXdp,
        DutKind::PicnicOn,
        DutKind::PicnicXdp,
        DutKind::PicnicOff,
        DutKind::PicnicFast,
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
            DutKind::PicnicFast => "picnic_fast",
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
            DutKind::PicnicFast => "picnic switch, isolation on, kernel fast path",
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
    /// The kernel bridge in namespace `.0`: nothing runs.
    Kernel(String),
    /// ovsdb-server and ovs-vswitchd.
    Ovs(Ovs),
    /// The two-host shape: the device on host A and on host B (of the same kind).
    Pair(Box<Dut>, Box<Dut>),
}

impl Dut {
    /// Starts `kind` on `bed`'s one-host shape (the two-host shape's pair:
    /// [`crate::twohost::start`]); the raw forwarders and picnic spin for work up to `spin`
    /// before they block (the bridge and OVS's non-PMD ports have no such setting).
    pub fn start(kind: DutKind, bed: &Bed, spin: Duration) -> Result<Dut> {
        let ns = &bed.dut_ns;
        match kind {
            DutKind::Raw | DutKind::RawXdp => {
                let xdp = kind == DutKind::RawXdp;
                spawn_thread(ns, move |stop, tid| {
                    raw_forwarder(xdp, spin, (TENANT_DEV, UPLINK_DEV), stop, tid)
                })
            }
            DutKind::PicnicOn | DutKind::PicnicOff | DutKind::PicnicXdp | DutKind::PicnicFast => {
                let cfg = picnic_device_config(kind, spin)?;
                spawn_thread(ns, move |stop, tid| run_picnic(cfg, stop, tid))
            }
            DutKind::Bridge => {
                netns::add_bridge(ns, "br0")?;
                netns::enslave(ns, TENANT_DEV, "br0")?;
                netns::enslave(ns, UPLINK_DEV, "br0")?;
                // The remote VM is behind the uplink: no flooding, no learning delay.
                static_fdb(ns, UPLINK_DEV)?;
                // Its QoS setting of the same intent as picnic's per-VM cap: an HTB class on
                // the uplink at a rate that does not bind (no police action on this kernel).
                netns::shape_htb(ns, UPLINK_DEV, 100_000, 4 << 20)?;
                Ok(Dut::Kernel(ns.clone()))
            }
            DutKind::OvsAfxdp | DutKind::Ovs => Ok(Dut::Ovs(Ovs::start(
                ns,
                kind == DutKind::OvsAfxdp,
                &OvsRole::Forward,
            )?)),
        }
    }

    /// Scheduler times of the device's threads so far (see `cpu`): the forwarding threads
    /// in this process, every thread of ovs-vswitchd (of both hosts), none for the kernel
    /// bridge (its work is softirq time).
    pub fn threads_ns(&self) -> cpu::ThreadTimes {
        match self {
            Dut::Thread { .. } => cpu::device_threads_ns(),
            Dut::Kernel(_) => cpu::ThreadTimes::default(),
            Dut::Ovs(o) => o.vswitchd_pid().map_or(Default::default(), |pid| {
                cpu::threads_ns(&pid.to_string(), &[])
            }),
            // Every device thread of this process is already in host A's figure.
            Dut::Pair(a, _) if matches!(**a, Dut::Thread { .. }) => a.threads_ns(),
            Dut::Pair(a, b) => {
                let (a, b) = (a.threads_ns(), b.threads_ns());
                cpu::ThreadTimes {
                    on_cpu: a.on_cpu + b.on_cpu,
                    waiting: a.waiting + b.waiting,
                }
            }
        }
    }

    /// Sets the nice value of every thread of the device (none for the bridge, whose work
    /// runs in the generator's context).
    pub fn set_nice(&self, nice: i32) -> Result<()> {
        let tids = match self {
            Dut::Thread { .. } => cpu::tids("self", &cpu::bench_threads()),
            Dut::Kernel(_) => Vec::new(),
            Dut::Ovs(o) => cpu::tids(&o.vswitchd_pid()?.to_string(), &[]),
            Dut::Pair(a, b) => return a.set_nice(nice).and_then(|()| b.set_nice(nice)),
        };
        tids.into_iter().try_for_each(|t| cpu::set_nice(t, nice))
    }

    /// Stops the device; returns its closing summary line, if any.
    pub fn stop(self) -> Result<String> {
        match self {
            Dut::Thread { stop, thread, .. } => {
                stop.store(true, Ordering::Relaxed);
                thread.join()?
            }
            Dut::Kernel(ns) => {
                netns::ip(&ns, &["link", "del", "br0"])?;
                // Only host A's uplink has the HTB class.
                let _ = netns::tc(&ns, &["qdisc", "del", "dev", UPLINK_DEV, "root"]);
                Ok(String::new())
            }
            Dut::Ovs(o) => o.stop(),
            Dut::Pair(a, b) => {
                let (a, b) = (a.stop(), b.stop());
                Ok(format!("host A: {}; host B: {}", a?, b?))
            }
        }
    }
}

/// A static fdb entry for the remote VM on bridge port `dev` of namespace `ns`.
pub(crate) fn static_fdb(ns: &str, dev: &str) -> Result<()> {
    let remote = Mac(REMOTE_MAC).to_string();
    netns::bridge(ns, &["fdb", "add", &remote, "dev", dev, "master", "static"]).map(drop)
}

/// picnic's host-1 config for `kind` in the one-host shape.
fn picnic_device_config(kind: DutKind, spin: Duration) -> Result<Config> {
    let mut cfg = picnic_config(kind != DutKind::PicnicOff)?;
    cfg.switch.spin_us = spin.as_micros() as u64;
    // Each device names its backend: AF_PACKET unless it is the AF_XDP one.
    cfg.uplink.backend = Some(Backend::AfPacket);
    cfg.fastpath.kernel = kind == DutKind::PicnicFast;
    if kind == DutKind::PicnicXdp {
        cfg.uplink.backend = Some(Backend::AfXdp);
        for port in cfg.vms.iter_mut().filter_map(|v| v.port.as_mut()) {
            port.backend = Backend::AfXdp;
        }
    }
    Ok(cfg)
}

/// picnic's config for `kind` on host `host_id` (1 or 2) of the two-host shape: host 1's as
/// in the one-host shape, host 2's with VM `b` on `t1` and `u1` as its uplink.
pub(crate) fn picnic_host_config(kind: DutKind, spin: Duration, host_id: u32) -> Result<Config> {
    let mut cfg = picnic_device_config(kind, spin)?;
    // As in the lab's multi-host scenarios: the softirq programs would see both hosts'
    // packets in this one kernel, so Iron charges each switch's own work only.
    cfg.isolation.softirq_accounting = false;
    if host_id == 2 {
        cfg.switch.host_id = 2;
        cfg.uplink.ifname = PEER_UPLINK_DEV.into();
        let port = cfg.vms[0].port.take();
        cfg.vms[1].port = port.map(|p| PortEntry {
            ifname: PEER_TENANT_DEV.into(),
            ..p
        });
    }
    cfg.validate().context("two-host switch config")?;
    Ok(cfg)
}

/// Runs `body` on a thread in namespace `ns` and waits until it published its thread id.
pub(crate) fn spawn_thread(
    ns: &str,
    body: impl FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Result<String> + Send + 'static,
) -> Result<Dut> {
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicU64::new(0));
    let (s, t) = (stop.clone(), tid.clone());
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let thread = netns::spawn_in_netns(ns, move || {
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

/// The raw limit: `from` -> `to` (`t0` -> `u0` on one host) through AF_PACKET rings and
/// sendmmsg (or AF_XDP sockets with `xdp`), no logic, in the switch's process model (one
/// thread, spin up to `spin` then block on the descriptors).
pub(crate) fn raw_forwarder(
    xdp: bool,
    spin: Duration,
    (from, to): (&str, &str),
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
    let mut rx_port = open(from)?;
    let mut tx_port = open(to)?;
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
underlay_ip = "{host1_ip}"
mac = "{HOST1_MAC}"

[[hosts]]
id = 2
underlay_ip = "{host2_ip}"
mac = "{HOST2_MAC}"

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
        host1_ip = Ipv4Addr::from(HOST1_IP),
        host2_ip = Ipv4Addr::from(HOST2_IP),
    );
    let mut cfg = Config::parse(&text).context("bench switch config")?;
    if !isolated {
        cfg.isolation = Isolation::off();
    }
    Ok(cfg)
}

pub(crate) fn run_picnic(
    cfg: Config,
    stop: Arc<AtomicBool>,
    tid: Arc<AtomicU64>,
) -> Result<String> {
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
            "picnic: uplink tx {} feedback sent {} received {} drops {:?}",
            published.switch.switch.uplink_tx_packets,
            published.switch.switch.feedback_sent,
            published.switch.switch.feedback_received,
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
