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
//! backend) runs the same checks, then a second QEMU on the same socket, with two queue pairs
//! (multiqueue) and two vCPUs, runs them again: the port listened again when the first went
//! away. And a guest on vhost-user outlives a restart of the switch (QEMU's `reconnect=1`).
//!
//! Skipped, saying why, without root, without `qemu-system-x86_64` (Debian: qemu-system-x86)
//! or without the guest image (`bash scripts/guest.sh`; `PICNIC_GUEST_DIR` or
//! /var/cache/picnic/guest). `PICNIC_GUEST_ACCEL=tcg|kvm` forces the accelerator.

mod common;
mod qemu;

use std::io::{Read, Write};
use std::net::{SocketAddrV4, SocketAddrV6, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{is_root, Netns};
use picnic_switch::config::Config;
use picnic_switch::runner::Switch;
use qemu::{
    diagnostics, guest_image, namespaces, reports, vhost_config, wait_for, Accel, Attach, Boot,
    CONFIG, CTR_IP, CTR_IP6, GUEST_IP, GUEST_IP6, MTU, TAP,
};

const TCP_PORT: u16 = 7777;
/// What the guest sends and expects back (scripts/guest.sh: 16 x 64 KiB).
const TCP_BYTES: usize = 1 << 20;
/// The whole boot-check-poweroff, TCG included.
const GUEST_DEADLINE: Duration = Duration::from_secs(150);
/// How long the guest stays up after its checks, for the container to ping it.
const HOLD_S: u64 = 4;

/// One guest at a time: two TCG guests on this machine's two cores would each take the
/// other's time, and they share the process's id in their scratch directories' names.
static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    // Most of the MiB each way went through the kernel. The first frames of each side, ARP,
    // and what was handed over while a grant was pending go through the engines: a TSO
    // super-frame handed over carries up to 64 KiB, and a slow (TCG) guest's first few
    // cost a CI run 5 KB short of the whole MiB, so the bound is three quarters of it.
    let most = (TCP_BYTES * 3 / 4) as u64;
    assert!(guest.fast_path.tx_bytes >= most, "{:?}", guest.fast_path);
    assert!(ctr.fast_path.tx_bytes >= most, "{:?}", ctr.fast_path);
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
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        return None;
    }
    let (kernel, initrd) = match guest_image(3) {
        Ok(image) => image,
        Err(why) => {
            println!("skipped: {why}");
            return None;
        }
    };
    let (host, ctr) = namespaces(attach);

    let tmp = std::env::temp_dir().join(format!("picnic-guest-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let serial = tmp.join("serial.log");
    let socket = tmp.join("guest.sock");
    let config = config.replace("@SOCKET@", &socket.to_string_lossy());
    let append = format!(
        "picnic.ip={GUEST_IP}/24 picnic.peer={CTR_IP} picnic.tcp={CTR_IP}:{TCP_PORT} \
         picnic.ip6={GUEST_IP6}/64 picnic.peer6={CTR_IP6} picnic.tcp6=[{CTR_IP6}]:{TCP_PORT} \
         picnic.hold={HOLD_S}"
    );
    let boot = Boot {
        image: (&kernel, &initrd),
        serial: &serial,
        attach,
        socket: &socket,
        append: &append,
        device: "",
        queues: 1,
        reconnect: false,
    };
    let mut accel = Accel::new();
    // Guest `i`: on vhost-user the second has two queue pairs (multiqueue) and two vCPUs.
    let mut launch = |i: usize| {
        let queues = if attach == Attach::VhostUser && i == 1 {
            2
        } else {
            1
        };
        accel.launch(&host, &Boot { queues, ..boot })
    };
    // On a TAP, the VMM first: picnic attaches to a TAP QEMU already holds. On vhost-user,
    // picnic first: QEMU connects to the socket it listens on.
    let mut first = (attach == Attach::Tap).then(|| launch(0));
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
        for i in 0..guests {
            let mut qemu = first.take().unwrap_or_else(|| launch(i));
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
                "guest done in {:.1} s:\n{}",
                started.elapsed().as_secs_f64(),
                reports(&out)
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

    for (i, (done, out, echoed, echoed6, pinged)) in runs.into_iter().enumerate() {
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
        if attach == Attach::VhostUser && i == 1 {
            // Multiqueue (VIRTIO_NET_F_MQ, bit 22) negotiated, both pairs in the driver's use.
            assert!(bit(22), "no MQ: {features}");
            assert!(
                out.contains("queues=rx-0,rx-1,tx-0,tx-1"),
                "the guest does not use two queue pairs:\n{out}"
            );
        }
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

/// Whether the container's pings of the guest's IPv4 address (`count`, 0.2 s apart) were
/// answered.
fn ping4(ctr: &Netns, count: &str) -> bool {
    Command::new("ip")
        .args([
            "netns", "exec", &ctr.name, "ping", "-c", count, "-i", "0.2", "-W", "1",
        ])
        .arg(GUEST_IP)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The switch restarts under a running guest on vhost-user (an upgrade, a crash): QEMU
/// (`-chardev socket,...,reconnect=1`) connects to the new switch's socket, hands it the
/// guest's memory and rings again, and the guest, never restarted, answers the container's
/// pings again.
#[test]
fn root_a_qemu_guest_on_vhost_user_is_served_again_after_the_switch_restarts() {
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        return;
    }
    let (kernel, initrd) = match guest_image(3) {
        Ok(image) => image,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let (host, ctr) = namespaces(Attach::VhostUser);
    let tmp = std::env::temp_dir().join(format!("picnic-guest-re-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let serial = tmp.join("serial.log");
    let socket = tmp.join("guest.sock");
    let config = vhost_config(CONFIG).replace("@SOCKET@", &socket.to_string_lossy());
    // The guest pings the container once up, then stays up (the test kills it sooner).
    let append = format!("picnic.ip={GUEST_IP}/24 picnic.peer={CTR_IP} picnic.hold=120");
    let boot = Boot {
        image: (&kernel, &initrd),
        serial: &serial,
        attach: Attach::VhostUser,
        socket: &socket,
        append: &append,
        device: "",
        queues: 1,
        reconnect: true,
    };
    let mut accel = Accel::new();
    let (first, second, pinged_before, pinged_after) = host.enter(|| {
        let start = || {
            let mut switch = Switch::open(Config::parse(&config).unwrap()).expect("picnic opens");
            let (stop, shared) = (switch.stop_flag(), switch.shared());
            let dataplane = std::thread::spawn(move || switch.run());
            move || {
                stop.store(true, Ordering::Relaxed);
                dataplane.join().unwrap().expect("the switch ran");
                let published = shared.latest().expect("a snapshot");
                let port = published.ports.iter().find(|p| p.name == "pngvu0");
                port.expect("the vhost-user port").stats
            }
        };
        let stop_first = start();
        let mut qemu = accel.launch(&host, &boot);
        let up = wait_for(&mut qemu, &serial, "PICNIC-STATS", GUEST_DEADLINE);
        let pinged_before = up && ping4(&ctr, "3");
        let first = stop_first();
        // QEMU finds the socket gone and tries again each second; the new switch listens.
        let stop_second = start();
        let started = Instant::now();
        let pinged_after = (0..30).any(|_| ping4(&ctr, "1"));
        println!(
            "after the restart: the container's ping answered: {pinged_after} ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        drop(qemu);
        (first, stop_second(), pinged_before, pinged_after)
    });
    let out = diagnostics(&serial);
    let _ = std::fs::remove_dir_all(&tmp);
    println!(
        "{}\nfirst switch's port {first:?}\nsecond's {second:?}",
        reports(&out)
    );
    assert!(
        pinged_before,
        "the guest did not answer before the restart:\n{out}"
    );
    assert!(
        pinged_after,
        "the guest did not answer after the restart:\n{out}"
    );
    assert!(second.rx_frames > 0 && second.tx_frames > 0, "{second:?}");
    assert_eq!(second.ring_errors, 0);
}
