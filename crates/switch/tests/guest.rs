//! A real guest through picnic (issue 31, "A real guest"): a minimal Linux guest (Debian's
//! kernel and a busybox initramfs built by `scripts/guest.sh`) boots in QEMU on a TAP
//! (`-netdev tap,ifname=..,script=no,vnet_hdr=on -device virtio-net-pci`, the guest's default
//! offloads on: checksum and TSO), which a running picnic switch serves from the TAP's host
//! side (`backend = "tap"`), beside a container tenant (a veth in a namespace). The guest
//! pings the container and sends it 1 MiB over TCP, which the container echoes back, over
//! IPv4 and over IPv6 (the switch answering both sides' neighbour solicitations from its
//! directory); the guest reports each check on its serial console and powers off. KVM where
//! /dev/kvm boots the guest, TCG otherwise; everything is bounded in time.
//!
//! The same guest on vhost-user (`backend = "vhost_user"`: picnic serves the guest's
//! virtio-net queues from its shared memory, `-netdev vhost-user` with a memfd memory
//! backend) runs the same checks, then a second QEMU on the same socket runs them again:
//! the port listened again when the first went away.
//!
//! Skipped, saying why, without root, without `qemu-system-x86_64` (Debian: qemu-system-x86)
//! or without the guest image (`bash scripts/guest.sh`; `PICNIC_GUEST_DIR` or
//! /var/cache/picnic/guest). `PICNIC_GUEST_ACCEL=tcg|kvm` forces the accelerator.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{is_root, Netns};
use picnic_switch::config::Config;
use picnic_switch::runner::Switch;

const TAP: &str = "pngtap0";
const GUEST_MAC: &str = "02:00:00:00:05:02";
const GUEST_IP: &str = "198.18.5.2";
const CTR_MAC: &str = "02:00:00:00:05:03";
const CTR_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 5, 3);
/// IPv6 addresses (documentation prefix), only inside the test's namespaces.
const GUEST_IP6: &str = "2001:db8:5::2";
const CTR_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, 3);
const TCP_PORT: u16 = 7777;
/// What the guest sends and expects back (scripts/guest.sh: 16 x 64 KiB).
const TCP_BYTES: usize = 1 << 20;
/// Tenant MTU: the uplink's 1500 less the overlay (docs/switch.md "MTU").
const MTU: u32 = 1400;
/// The whole boot-check-poweroff, TCG included.
const GUEST_DEADLINE: Duration = Duration::from_secs(150);
/// How long the guest stays up after its checks, for the container to ping it.
const HOLD_S: u64 = 4;
/// How long KVM gets to show the kernel's first line before TCG is used instead.
const KVM_PROBE: Duration = Duration::from_secs(15);

const CONFIG: &str = r#"
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

/// The guest image, or why the test skips.
fn guest_image() -> Result<(PathBuf, PathBuf), String> {
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
    // Format 2's guest runs the IPv6 TCP check (picnic.tcp6).
    let version = std::fs::read_to_string(dir.join("VERSION")).unwrap_or_default();
    if !version.lines().any(|l| l == "format 2") {
        return Err(format!(
            "the guest image in {} is older than format 2 (rebuild it: bash scripts/guest.sh)",
            dir.display()
        ));
    }
    Ok((kernel, initrd))
}

/// The vhost-user variant of [`CONFIG`]: the guest's port served on a socket (its path
/// replaces `@SOCKET@`).
fn vhost_config(config: &str) -> String {
    config.replace(
        r#"port = { ifname = "pngtap0", backend = "tap" }"#,
        r#"port = { ifname = "pngvu0", backend = "vhost_user", socket = "@SOCKET@" }"#,
    )
}

/// How the guest's virtio-net device reaches picnic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attach {
    /// A TAP QEMU holds, whose host side picnic attaches to.
    Tap,
    /// vhost-user on a socket picnic listens on (the guest's memory shared).
    VhostUser,
}

/// A QEMU process, killed when dropped.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the guest in namespace `ns` on [`TAP`] or on vhost-user socket `socket`, its
/// serial console written to `serial`.
fn start_guest(
    ns: &Netns,
    (kernel, initrd): (&Path, &Path),
    serial: &Path,
    kvm: bool,
    (attach, socket): (Attach, &Path),
) -> Qemu {
    let _ = std::fs::remove_file(serial);
    let append = format!(
        "console=ttyS0 earlyprintk=serial panic=-1 picnic.ip={GUEST_IP}/24 \
         picnic.peer={CTR_IP} picnic.tcp={CTR_IP}:{TCP_PORT} picnic.ip6={GUEST_IP6}/64 \
         picnic.peer6={CTR_IP6} picnic.tcp6=[{CTR_IP6}]:{TCP_PORT} picnic.hold={HOLD_S}"
    );
    let machine = if kvm {
        "q35,accel=kvm"
    } else {
        "q35,accel=tcg"
    };
    let cpu = if kvm { "host" } else { "max" };
    // QEMU 7.2 under TCG dereferences its absent KVM irqfd table when it starts a vhost
    // device with MSI-X (a segfault in msix_set_vector_notifiers): legacy interrupts there.
    let tcg_vhost = if attach == Attach::VhostUser && !kvm {
        ",vectors=0"
    } else {
        ""
    };
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name, "qemu-system-x86_64"])
        .args(["-machine", machine, "-cpu", cpu, "-m", "256", "-smp", "1"])
        .args([
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &append])
        .args(["-serial", &format!("file:{}", serial.display())])
        .args(match attach {
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
                &format!("socket,id=c0,path={}", socket.display()),
                "-netdev",
                "vhost-user,id=n0,chardev=c0",
            ]
            .map(String::from)
            .to_vec(),
        })
        .args([
            "-device",
            // host_mtu: the guest learns its MTU from the device (VIRTIO_NET_F_MTU). No option
            // ROM: iPXE only slows the boot.
            &format!("virtio-net-pci,netdev=n0,mac={GUEST_MAC},host_mtu={MTU},romfile={tcg_vhost}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(serial.with_extension("qemu-stderr"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("spawn qemu-system-x86_64");
    Qemu(child)
}

/// The serial console so far.
fn console(serial: &Path) -> String {
    std::fs::read(serial)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The console and QEMU's own messages, for a failure.
fn diagnostics(serial: &Path) -> String {
    let stderr = std::fs::read_to_string(serial.with_extension("qemu-stderr")).unwrap_or_default();
    format!("{}\n--- qemu stderr:\n{stderr}", console(serial))
}

/// Waits until the console shows `what` or `timeout` passes (or QEMU exits).
fn wait_for(qemu: &mut Qemu, serial: &Path, what: &str, timeout: Duration) -> bool {
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

/// The container pings the guest over IPv4 and IPv6; what ping said of each that failed.
fn ping_guest(ctr: &Netns) -> Vec<String> {
    [GUEST_IP, GUEST_IP6]
        .into_iter()
        .filter_map(|addr| {
            let out = Command::new("ip")
                .args([
                    "netns", "exec", &ctr.name, "ping", "-c", "3", "-i", "0.2", "-W", "2",
                ])
                .arg(addr)
                .output()
                .expect("run ping in the container");
            let said = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            (!out.status.success()).then(|| format!("{addr}: {said}"))
        })
        .collect()
}

/// The container's TCP server: echoes what it reads until [`TCP_BYTES`] went back, then
/// closes. Returns the bytes echoed: 0 when the guest did not connect by the deadline or
/// before it was `done` (its console says why).
fn echo_server(listener: TcpListener, deadline: Instant, done: &AtomicBool) -> usize {
    listener.set_nonblocking(true).unwrap();
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < deadline && !done.load(Ordering::Relaxed) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(_) => return 0,
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut echoed = 0;
    while echoed < TCP_BYTES {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if stream.write_all(&buf[..n]).is_err() {
            break;
        }
        echoed += n;
    }
    echoed
}

#[test]
fn root_a_qemu_guest_on_a_tap_talks_to_a_container_through_picnic() {
    let Some(published) = boot_and_exchange(CONFIG, Attach::Tap) else {
        return;
    };
    // The guest's frames reached picnic on the TAP's host side with their offloads, which the
    // port finished.
    let port = published
        .ports
        .iter()
        .find(|p| p.name == TAP)
        .expect("the TAP port");
    println!("TAP port: {} {:?}", port.backend, port.stats);
    assert!(port.backend.starts_with("tap"), "{}", port.backend);
    assert!(
        port.stats.rx_frames > (TCP_BYTES / 1500) as u64 && port.stats.tx_frames > 0,
        "{:?}",
        port.stats
    );
    assert!(
        port.stats.rx_csum_partial > 0 || port.stats.rx_gso_frames > 0,
        "no partial checksum or super-frame from the guest: {:?}",
        port.stats
    );
    assert_eq!(port.stats.rx_offload_errors, 0);
}

/// The guest on vhost-user: picnic serves its virtio-net queues; two guests one after the
/// other on the same socket (the port listens again when a VMM goes).
#[test]
fn root_a_qemu_guest_on_vhost_user_talks_to_a_container_through_picnic() {
    let Some(published) = boot_and_exchange(&vhost_config(CONFIG), Attach::VhostUser) else {
        return;
    };
    let port = published
        .ports
        .iter()
        .find(|p| p.name == "pngvu0")
        .expect("the vhost-user port");
    println!("vhost-user port: {} {:?}", port.backend, port.stats);
    assert!(port.backend.starts_with("vhost_user"), "{}", port.backend);
    // Two guests' MiB each way through the rings, their offloads finished by the port.
    assert!(
        port.stats.rx_frames > 2 * (TCP_BYTES / 1500) as u64
            && port.stats.tx_frames > 2 * (TCP_BYTES / 1500) as u64,
        "{:?}",
        port.stats
    );
    assert!(
        port.stats.rx_csum_partial > 0 || port.stats.rx_gso_frames > 0,
        "no partial checksum or super-frame from the guest: {:?}",
        port.stats
    );
    assert_eq!(port.stats.rx_offload_errors, 0);
    assert_eq!(port.stats.ring_errors, 0);
}

/// The same through the kernel fast path (docs/switch.md "Two paths"): the guest's frames,
/// partial checksums and TSO super-frames included, are forwarded to the container by the
/// tc program on the TAP's host side, and the container's back to the guest.
#[test]
fn root_a_qemu_guest_on_a_tap_talks_to_a_container_through_the_kernel_fast_path() {
    let config = format!("{CONFIG}\n[fastpath]\nkernel = true\n");
    let Some(published) = boot_and_exchange(&config, Attach::Tap) else {
        return;
    };
    let vm = |name: &str| {
        published
            .switch
            .vms
            .iter()
            .find(|v| v.name == name)
            .expect("the VM")
            .counters
            .clone()
    };
    let (guest, ctr) = (vm("guest"), vm("ctr"));
    println!("guest {:?}\nctr {:?}", guest.fast_path, ctr.fast_path);
    // The MiB each way went through the kernel (the first frames of each side, ARP and what
    // was handed over while a grant was pending, through the engines).
    assert!(
        guest.fast_path.tx_bytes >= TCP_BYTES as u64,
        "{:?}",
        guest.fast_path
    );
    assert!(
        ctr.fast_path.tx_bytes >= TCP_BYTES as u64,
        "{:?}",
        ctr.fast_path
    );
}

/// Boots the guest on its TAP or on vhost-user with a switch running `config` beside a
/// container tenant, and checks what the guest reports (offloads on, ping, a MiB over TCP
/// echoed by the container); on vhost-user a second guest then connects to the same socket
/// and passes the same checks. The switch's last snapshot, or None when the test cannot run
/// here (it says why).
fn boot_and_exchange(
    config: &str,
    attach: Attach,
) -> Option<std::sync::Arc<picnic_switch::runner::Published>> {
    // One guest at a time: two TCG guests on this machine's two cores would each take the
    // other's time, and they share the process's id in their scratch directories' names.
    static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        return None;
    }
    let (kernel, initrd) = match guest_image() {
        Ok(image) => image,
        Err(why) => {
            println!("skipped: {why}");
            return None;
        }
    };
    let host = Netns::new();
    let ctr = Netns::new();
    host.veth_pair("pngup", "pngfab");
    // The container tenant: a veth with its default offloads, its end in its namespace.
    host.ip("link add pngv0 type veth peer name pngc0");
    host.ip(&format!("link set pngc0 netns {}", ctr.name));
    host.ip("link set pngv0 up");
    ctr.ip(&format!("link set pngc0 address {CTR_MAC} mtu {MTU} up"));
    ctr.ip(&format!("addr add {CTR_IP}/24 dev pngc0"));
    if attach == Attach::Tap {
        // The guest's TAP, as an operator makes it for QEMU's script=no (persistent, up);
        // the namespace's deletion removes it.
        host.ip(&format!("tuntap add dev {TAP} mode tap"));
        host.ip(&format!("link set {TAP} up"));
    }

    let tmp = std::env::temp_dir().join(format!("picnic-guest-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let serial = tmp.join("serial.log");
    let socket = tmp.join("guest.sock");
    let config = config.replace("@SOCKET@", &socket.to_string_lossy());

    let forced = std::env::var("PICNIC_GUEST_ACCEL").ok();
    let kvm_usable = Path::new("/dev/kvm").exists() && forced.as_deref() != Some("tcg");
    let kvm = std::sync::atomic::AtomicBool::new(kvm_usable || forced.as_deref() == Some("kvm"));
    let accel = || {
        if kvm.load(Ordering::Relaxed) {
            "kvm"
        } else {
            "tcg"
        }
    };
    // Starts the guest, on TCG when KVM does not start its kernel in time.
    let mut launch = || {
        let image = (kernel.as_path(), initrd.as_path());
        let net = (attach, socket.as_path());
        let mut qemu = start_guest(&host, image, &serial, kvm.load(Ordering::Relaxed), net);
        if kvm.load(Ordering::Relaxed)
            && forced.is_none()
            && !wait_for(&mut qemu, &serial, "Linux version", KVM_PROBE)
        {
            println!(
                "KVM did not start the guest's kernel within {KVM_PROBE:?} (nested \
                 virtualization?): using TCG"
            );
            drop(qemu);
            kvm.store(false, Ordering::Relaxed);
            qemu = start_guest(&host, image, &serial, false, net);
        }
        println!("guest accelerator: {}", accel());
        qemu
    };
    // On a TAP, the VMM first: picnic attaches to a TAP QEMU already holds. On vhost-user,
    // picnic first: QEMU connects to the socket it listens on.
    let mut first = (attach == Attach::Tap).then(&mut launch);
    let guests = if attach == Attach::VhostUser { 2 } else { 1 };

    let (listener, listener6) = ctr.enter(|| {
        // `enter` turns IPv6 off in the namespace (other tests count frames without its
        // chatter); the container speaks it here. No duplicate address detection: the switch
        // consumes the probes, which would only hold the address back a second.
        for conf in ["all", "default", "pngc0"] {
            let path = format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6");
            std::fs::write(path, "0").expect("turn IPv6 on in the container");
        }
        let cidr = format!("{CTR_IP6}/64");
        common::run(&["ip", "-6", "addr", "add", &cidr, "dev", "pngc0", "nodad"]);
        (
            TcpListener::bind(SocketAddrV4::new(CTR_IP, TCP_PORT)).expect("bind in the container"),
            TcpListener::bind(SocketAddrV6::new(CTR_IP6, TCP_PORT, 0, 0))
                .expect("bind IPv6 in the container"),
        )
    });
    // Per guest: whether it finished, its console, the bytes echoed over IPv4 and IPv6, and
    // the container's pings of it (None: the guest printed no PICNIC-STATS).
    type GuestRun = (bool, String, usize, usize, Option<Vec<String>>);
    let mut runs: Vec<GuestRun> = Vec::new();
    let published = host.enter(|| {
        let mut switch =
            Switch::open(Config::parse(&config).unwrap()).expect("picnic opens the guest's port");
        let (stop, shared) = (switch.stop_flag(), switch.shared());
        let dataplane = std::thread::spawn(move || switch.run());
        for _ in 0..guests {
            let mut qemu = first.take().unwrap_or_else(&mut launch);
            let started = Instant::now();
            let deadline = started + GUEST_DEADLINE;
            let guest_done = AtomicBool::new(false);
            let (done, echoed, echoed6, pinged) = std::thread::scope(|s| {
                let (l4, l6) = (
                    listener.try_clone().unwrap(),
                    listener6.try_clone().unwrap(),
                );
                let gd = &guest_done;
                let server = s.spawn(move || echo_server(l4, deadline, gd));
                let server6 = s.spawn(move || echo_server(l6, deadline, gd));
                // The container pings the guest while it holds (its checks done, STATS printed).
                let pinged = wait_for(&mut qemu, &serial, "PICNIC-STATS", GUEST_DEADLINE)
                    .then(|| ping_guest(&ctr));
                let done = wait_for(&mut qemu, &serial, "PICNIC-DONE", GUEST_DEADLINE);
                guest_done.store(true, Ordering::Relaxed);
                (
                    done,
                    server.join().unwrap(),
                    server6.join().unwrap(),
                    pinged,
                )
            });
            drop(qemu);
            let out = diagnostics(&serial);
            println!(
                "guest ({}) done in {:.1} s:\n{}",
                accel(),
                started.elapsed().as_secs_f64(),
                out.lines()
                    .filter(|l| l.contains("PICNIC-"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            runs.push((done, out, echoed, echoed6, pinged));
            if !done {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
        stop.store(true, Ordering::Relaxed);
        dataplane.join().unwrap().expect("the switch ran");
        shared.latest().expect("a snapshot")
    });
    let _ = std::fs::remove_dir_all(&tmp);

    for (done, out, echoed, echoed6, pinged) in runs {
        assert!(done, "the guest did not finish:\n{out}");
        // The guest's virtio-net kept its default offloads: CSUM (bit 0) and HOST_TSO4
        // (bit 11) negotiated.
        let features = out
            .lines()
            .filter(|l| l.contains("PICNIC-"))
            .find_map(|l| l.split("features=").nth(1))
            .unwrap_or_else(|| panic!("no PICNIC-UP line:\n{out}"));
        let bit = |i: usize| features.as_bytes().get(i) == Some(&b'1');
        assert!(bit(0) && bit(11), "guest offloads off: {features}");
        assert!(
            out.contains(&format!("mtu={MTU} ")),
            "the guest took its MTU from host_mtu:\n{out}"
        );
        assert!(out.contains("PICNIC-PING4 ok"), "ping failed:\n{out}");
        assert!(out.contains("PICNIC-TCP ok"), "TCP failed:\n{out}");
        assert_eq!(echoed, TCP_BYTES, "the container echoed the guest's MiB");
        assert!(out.contains("PICNIC-PING6 ok"), "ping -6 failed:\n{out}");
        assert!(
            out.contains("PICNIC-TCP6 ok"),
            "TCP over IPv6 failed:\n{out}"
        );
        assert_eq!(
            echoed6, TCP_BYTES,
            "the container echoed the guest's MiB over IPv6"
        );
        let failed = pinged.expect("the guest printed no PICNIC-STATS");
        assert!(
            failed.is_empty(),
            "the container could not ping the guest: {failed:?}"
        );
    }
    // The guests' and the container's neighbour solicitations, answered by the switch.
    let nd_replies = published.switch.switch.nd_replies;
    assert!(nd_replies >= 2, "nd_replies {nd_replies}");
    Some(published)
}
