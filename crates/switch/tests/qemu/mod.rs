//! The QEMU guest shared by the guest test (tests/guest.rs) and the guest benchmark
//! (tests/guest_bench.rs): the image `scripts/guest.sh` builds, the addresses of the guest
//! and of its container peer, and QEMU started on a TAP or on vhost-user, on KVM where it
//! boots the guest and on TCG otherwise.
#![allow(dead_code)]

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::Netns;

pub const TAP: &str = "pngtap0";
pub const GUEST_MAC: &str = "02:00:00:00:05:02";
pub const GUEST_IP: &str = "198.18.5.2";
pub const CTR_MAC: &str = "02:00:00:00:05:03";
pub const CTR_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 5, 3);
/// IPv6 addresses (documentation prefix), only inside the tests' namespaces.
pub const GUEST_IP6: &str = "2001:db8:5::2";
pub const CTR_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, 3);
/// Tenant MTU: the uplink's 1500 less the overlay (docs/switch.md "MTU").
pub const MTU: u32 = 1400;
/// How long KVM gets to show the kernel's first line before TCG is used instead.
const KVM_PROBE: Duration = Duration::from_secs(15);

/// One host with the guest and a container of one tenant; the guest's port is a TAP
/// (`vhost_config` turns it into vhost-user).
pub const CONFIG: &str = r#"
[switch]
host_id = 1
workers = 1
[uplink]
ifname = "pngup"
backend = "af_packet"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
[[vms]]
name = "guest"
id = 1
tenant = "t"
host = 1
mac = "02:00:00:00:05:02"
ip = "198.18.5.2"
ipv6 = ["2001:db8:5::2"]
port = { ifname = "pngtap0", backend = "tap" }
[[vms]]
name = "ctr"
id = 2
tenant = "t"
host = 1
mac = "02:00:00:00:05:03"
ip = "198.18.5.3"
ipv6 = ["2001:db8:5::3"]
port = { ifname = "pngv0" }
"#;

/// The vhost-user variant of [`CONFIG`]: the guest's port served on a socket (its path
/// replaces `@SOCKET@`).
pub fn vhost_config(config: &str) -> String {
    config.replace(
        r#"port = { ifname = "pngtap0", backend = "tap" }"#,
        r#"port = { ifname = "pngvu0", backend = "vhost_user", socket = "@SOCKET@" }"#,
    )
}

/// The guest image (kernel, initrd) of format `format` or later, or why the test skips.
pub fn guest_image(format: u32) -> Result<(PathBuf, PathBuf), String> {
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !qemu.is_ok_and(|s| s.success()) {
        return Err("qemu-system-x86_64 not found (apt-get install qemu-system-x86)".into());
    }
    let dir = std::env::var_os("PICNIC_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/picnic/guest"));
    let (kernel, initrd) = (dir.join("vmlinuz"), dir.join("initrd.img"));
    if !kernel.is_file() || !initrd.is_file() {
        return Err(format!(
            "no guest image in {} (build it: bash scripts/guest.sh)",
            dir.display()
        ));
    }
    let version = std::fs::read_to_string(dir.join("VERSION")).unwrap_or_default();
    let found = version
        .lines()
        .find_map(|l| l.strip_prefix("format ")?.parse::<u32>().ok());
    if !found.is_some_and(|f| f >= format) {
        return Err(format!(
            "the guest image in {} is older than format {format} (rebuild it: bash \
             scripts/guest.sh)",
            dir.display()
        ));
    }
    Ok((kernel, initrd))
}

/// How the guest's virtio-net device reaches the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A TAP QEMU holds ([`TAP`]), whose host side picnic (or a bridge) attaches to.
    Tap,
    /// vhost-user on a socket picnic listens on (the guest's memory shared).
    VhostUser,
}

/// A QEMU process, killed when dropped.
pub struct Qemu(pub Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a guest boots with.
pub struct Boot<'a> {
    /// Kernel and initrd ([`guest_image`]).
    pub image: (&'a Path, &'a Path),
    /// Its serial console's file.
    pub serial: &'a Path,
    pub attach: Attach,
    /// The vhost-user socket (with [`Attach::VhostUser`]).
    pub socket: &'a Path,
    /// The guest's checks (`picnic.*` parameters of scripts/guest.sh), after the console's.
    pub append: &'a str,
    /// Appended to the virtio-net device's options (`,csum=off,...`).
    pub device: &'a str,
    /// Queue pairs of a vhost-user device (more than 1: multiqueue, as many vCPUs).
    pub queues: u16,
    /// QEMU connects again, each second, when the vhost-user socket's switch went
    /// (`-chardev socket,...,reconnect=1`).
    pub reconnect: bool,
}

/// Starts the guest in namespace `ns`, on KVM or TCG.
fn start_guest(ns: &Netns, boot: &Boot, kvm: bool) -> Qemu {
    let _ = std::fs::remove_file(boot.serial);
    let append = format!("console=ttyS0 earlyprintk=serial panic=-1 {}", boot.append);
    let machine = if kvm {
        "q35,accel=kvm"
    } else {
        "q35,accel=tcg"
    };
    let cpu = if kvm { "host" } else { "max" };
    // QEMU 7.2 under TCG dereferences its absent KVM irqfd table when it starts a vhost
    // device with MSI-X (a segfault in msix_set_vector_notifiers): legacy interrupts there.
    let tcg_vhost = if boot.attach == Attach::VhostUser && !kvm {
        ",vectors=0"
    } else {
        ""
    };
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name, "qemu-system-x86_64"])
        .args(["-machine", machine, "-cpu", cpu, "-m", "256"])
        .args(["-smp", &boot.queues.max(1).to_string()])
        .args([
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
        ])
        .arg("-kernel")
        .arg(boot.image.0)
        .arg("-initrd")
        .arg(boot.image.1)
        .args(["-append", &append])
        .args(["-serial", &format!("file:{}", boot.serial.display())])
        .args(match boot.attach {
            Attach::Tap => vec![
                "-netdev".to_string(),
                format!("tap,id=n0,ifname={TAP},script=no,downscript=no,vnet_hdr=on"),
            ],
            // vhost-user needs the guest's RAM in shared memory the switch can map.
            Attach::VhostUser => [
                "-object",
                "memory-backend-memfd,id=mem,size=256M,share=on",
                "-numa",
                "node,memdev=mem",
                "-chardev",
                &format!(
                    "socket,id=c0,path={}{}",
                    boot.socket.display(),
                    if boot.reconnect { ",reconnect=1" } else { "" }
                ),
                "-netdev",
                &format!("vhost-user,id=n0,chardev=c0,queues={}", boot.queues.max(1)),
            ]
            .map(String::from)
            .to_vec(),
        })
        .args([
            "-device",
            // host_mtu: the guest learns its MTU from the device (VIRTIO_NET_F_MTU). No option
            // ROM: iPXE only slows the boot.
            &format!(
                "virtio-net-pci,netdev=n0,mac={GUEST_MAC},host_mtu={MTU},romfile={tcg_vhost}{}{}",
                if boot.queues > 1 { ",mq=on" } else { "" },
                boot.device
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(boot.serial.with_extension("qemu-stderr"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("spawn qemu-system-x86_64");
    Qemu(child)
}

/// The accelerator: KVM where /dev/kvm exists until it fails to start a guest's kernel, TCG
/// otherwise; `PICNIC_GUEST_ACCEL=tcg|kvm` forces one.
pub struct Accel {
    kvm: bool,
    forced: bool,
}

impl Accel {
    pub fn new() -> Accel {
        let forced = std::env::var("PICNIC_GUEST_ACCEL").ok();
        let kvm = match forced.as_deref() {
            Some("kvm") => true,
            Some("tcg") => false,
            _ => Path::new("/dev/kvm").exists(),
        };
        Accel {
            kvm,
            forced: forced.is_some(),
        }
    }

    pub fn name(&self) -> &'static str {
        if self.kvm {
            "kvm"
        } else {
            "tcg"
        }
    }

    /// Starts the guest in `ns`, on TCG when KVM does not start its kernel in time.
    pub fn launch(&mut self, ns: &Netns, boot: &Boot) -> Qemu {
        let mut qemu = start_guest(ns, boot, self.kvm);
        if self.kvm && !self.forced && !wait_for(&mut qemu, boot.serial, "Linux version", KVM_PROBE)
        {
            println!(
                "KVM did not start the guest's kernel within {KVM_PROBE:?} (nested \
                 virtualization?): using TCG"
            );
            drop(qemu);
            self.kvm = false;
            qemu = start_guest(ns, boot, false);
        }
        println!("guest accelerator: {}", self.name());
        qemu
    }
}

/// The serial console so far.
pub fn console(serial: &Path) -> String {
    std::fs::read(serial)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The console and QEMU's own messages, for a failure.
pub fn diagnostics(serial: &Path) -> String {
    let stderr = std::fs::read_to_string(serial.with_extension("qemu-stderr")).unwrap_or_default();
    format!("{}\n--- qemu stderr:\n{stderr}", console(serial))
}

/// The console's `PICNIC-` lines.
pub fn reports(out: &str) -> String {
    out.lines()
        .filter(|l| l.contains("PICNIC-"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the console shows `what` or `timeout` passes (or QEMU exits).
pub fn wait_for(qemu: &mut Qemu, serial: &Path, what: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if console(serial).contains(what) {
            return true;
        }
        if let Ok(Some(_)) = qemu.0.try_wait() {
            return console(serial).contains(what);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The host's namespace (the uplink `pngup`, the container's host end `pngv0`, and on a TAP
/// [`TAP`], as an operator makes it for QEMU's script=no: persistent, up) and the
/// container's (`pngc0`, [`CTR_IP`], offloads at their defaults).
pub fn namespaces(attach: Attach) -> (Netns, Netns) {
    let host = Netns::new();
    let ctr = Netns::new();
    host.veth_pair("pngup", "pngfab");
    host.ip("link add pngv0 type veth peer name pngc0");
    host.ip(&format!("link set pngc0 netns {}", ctr.name));
    host.ip("link set pngv0 up");
    ctr.ip(&format!("link set pngc0 address {CTR_MAC} mtu {MTU} up"));
    ctr.ip(&format!("addr add {CTR_IP}/24 dev pngc0"));
    if attach == Attach::Tap {
        // The namespace's deletion removes it.
        host.ip(&format!("tuntap add dev {TAP} mode tap"));
        host.ip(&format!("link set {TAP} up"));
    }
    (host, ctr)
}
