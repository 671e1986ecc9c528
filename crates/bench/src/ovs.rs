//! Open vSwitch's userspace datapath as a device under test: one instance per emulated host,
//! forwarding `t0 -> u0` (one-host shape) or one end of a VXLAN tunnel (two-host shape, see
//! [`crate::twohost`]).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use picnic_netns as netns;

use crate::bed::{DUT_CPU, TENANT_DEV, UPLINK_DEV};

/// What one OVS instance does.
#[derive(Debug, Clone)]
pub enum OvsRole {
    /// One bridge forwarding `t0 -> u0` through an OpenFlow meter (the one-host shape).
    Forward,
    /// One host of the two-host shape: the tenant port and a VXLAN tunnel port on bridge
    /// `br-int`, the underlay device on bridge `br-phy` (OVS's userspace tunnelling: the
    /// datapath pushes and pops the tunnel headers itself, routing by `br-phy`'s address).
    Tunnel(TunnelEnd),
}

/// One end of the two-host shape's tunnel.
#[derive(Debug, Clone)]
pub struct TunnelEnd {
    /// The tenant device of this host.
    pub tenant: &'static str,
    /// The underlay device of this host and its MAC (`br-phy` takes it).
    pub underlay: &'static str,
    pub underlay_mac: String,
    /// This host's and the peer's underlay addresses, and the peer's underlay MAC.
    pub local: Ipv4Addr,
    pub remote: Ipv4Addr,
    pub remote_mac: String,
    /// true: tenant -> tunnel through the meter (host A); false: tunnel -> tenant (host B).
    pub egress: bool,
}

/// Open vSwitch's userspace datapath, started by hand inside the device namespace with its
/// database, sockets and logs in a temporary directory (DESIGN.md 7: the kernel has no OVS
/// module; one ovsdb-server/ovs-vswitchd pair per namespace works).
pub struct Ovs {
    ns: String,
    dir: PathBuf,
    /// ovs-vswitchd, run as a child rather than detached: see [`Ovs::configure`].
    vswitchd: Option<std::process::Child>,
    /// Set up as one end of the tunnel (bridges `br-int` and `br-phy`).
    tunnelled: bool,
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
    /// Starts ovsdb-server and ovs-vswitchd in namespace `ns` and sets them up for `role`.
    pub fn start(ns: &str, afxdp: bool, role: &OvsRole) -> Result<Ovs> {
        let dir = std::env::temp_dir().join(format!("{ns}-ovs"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut ovs = Ovs {
            ns: ns.to_owned(),
            dir,
            vswitchd: None,
            tunnelled: matches!(role, OvsRole::Tunnel(_)),
        };
        match ovs.configure(afxdp, role) {
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
    fn configure(&mut self, afxdp: bool, role: &OvsRole) -> Result<()> {
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
        match role {
            OvsRole::Forward => ovs.forward(afxdp)?,
            OvsRole::Tunnel(end) => ovs.tunnel(afxdp, end)?,
        }
        // Wait until the ports are up in the datapath.
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }

    /// Adds netdev bridge `br` (OpenFlow 1.3) with `extra` settings of the bridge.
    fn add_bridge(&self, br: &str, extra: &[&str]) -> Result<()> {
        let mut args = vec![
            "add-br",
            br,
            "--",
            "set",
            "bridge",
            br,
            "datapath_type=netdev",
            "protocols=OpenFlow13",
        ];
        args.extend_from_slice(extra);
        self.vsctl(&args).map(drop)
    }

    /// Adds device `dev` to bridge `br`, as an `afxdp-nonpmd` port with `afxdp`.
    fn add_port(&self, br: &str, dev: &str, afxdp: bool) -> Result<()> {
        let mut args = vec!["add-port", br, dev];
        if afxdp {
            // Polled by the main thread, not a busy PMD thread (DESIGN.md 7).
            args.extend(["--", "set", "interface", dev, "type=afxdp-nonpmd"]);
        }
        self.vsctl(&args).map(drop)
    }

    /// Its QoS setting of the same intent as picnic's per-VM cap: an OpenFlow meter that
    /// does not bind (ingress_policing_rate is not enforced here, DESIGN.md 7), and `flow` as
    /// the bridge's only flow.
    fn meter_and_flow(&self, br: &str, flow: &str) -> Result<()> {
        self.ofctl(&[
            "add-meter",
            br,
            "meter=1,kbps,band=type=drop,rate=100000000",
        ])?;
        self.ofctl(&["del-flows", br])?;
        self.ofctl(&["add-flow", br, flow]).map(drop)
    }

    /// The one-host shape: `t0 -> u0` through the meter.
    fn forward(&self, afxdp: bool) -> Result<()> {
        self.add_bridge("br0", &[])?;
        for dev in [TENANT_DEV, UPLINK_DEV] {
            self.add_port("br0", dev, afxdp)?;
        }
        self.meter_and_flow(
            "br0",
            &format!("in_port={TENANT_DEV},actions=meter:1,output:{UPLINK_DEV}"),
        )
    }

    /// One end of the two-host shape: OVS's userspace tunnelling (its documentation's
    /// "userspace-tunneling" layout): `br-int` holds the tenant port and a VXLAN port (VNI
    /// 100), `br-phy` the underlay device and the local tunnel address, the peer's MAC is
    /// set in OVS's neighbour table (no ARP on the measured path).
    fn tunnel(&self, afxdp: bool, end: &TunnelEnd) -> Result<()> {
        let remote = end.remote.to_string();
        self.add_bridge("br-int", &[])?;
        self.add_port("br-int", end.tenant, afxdp)?;
        self.vsctl(&[
            "add-port",
            "br-int",
            "vx0",
            "--",
            "set",
            "interface",
            "vx0",
            "type=vxlan",
            &format!("options:remote_ip={remote}"),
            "options:key=100",
        ])?;
        let hwaddr = format!("other_config:hwaddr=\"{}\"", end.underlay_mac);
        self.add_bridge("br-phy", &["--", "set", "bridge", "br-phy", &hwaddr])?;
        self.add_port("br-phy", end.underlay, afxdp)?;
        netns::ip(
            &self.ns,
            &["addr", "add", &format!("{}/24", end.local), "dev", "br-phy"],
        )?;
        netns::link_up(&self.ns, "br-phy")?;
        // OVS learns the kernel's routes; the explicit one covers a slow route cache.
        let _ = self.appctl(&["ovs/route/add", &format!("{remote}/32"), "br-phy"]);
        self.appctl(&["tnl/neigh/set", "br-phy", &remote, &end.remote_mac])?;
        let flow = if end.egress {
            format!("in_port={},actions=meter:1,output:vx0", end.tenant)
        } else {
            format!("in_port=vx0,actions=output:{}", end.tenant)
        };
        self.meter_and_flow("br-int", &flow)
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

    fn appctl(&self, args: &[&str]) -> Result<String> {
        let target = format!("{}/ovs-vswitchd.ctl", self.dir.display());
        let mut full = vec!["-t", target.as_str()];
        full.extend_from_slice(args);
        self.run("ovs-appctl", &full)
    }

    fn pid(&self, daemon: &str) -> Result<u32> {
        let path = self.dir.join(format!("{daemon}.pid"));
        std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("pid in {}", path.display()))
    }

    /// The bridge with the measured flow.
    fn main_bridge(&self) -> &'static str {
        if self.tunnelled {
            "br-int"
        } else {
            "br0"
        }
    }

    /// Pid of ovs-vswitchd.
    pub fn vswitchd_pid(&self) -> Result<u32> {
        self.pid("ovs-vswitchd")
    }

    /// Stops both daemons (SIGTERM to the pids they wrote) and removes the directory.
    pub fn stop(mut self) -> Result<String> {
        let summary = self
            .ofctl(&["dump-flows", self.main_bridge()])
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
