//! Root tests of the TAP backends (issue 31, "TAP the standard way"): the switch attaches to
//! the host side of a TAP whose queue a VMM holds (`backend = "tap"`), creates a TAP only
//! when the config asks, never deletes one, and says what is wrong with a device it cannot
//! use. The VMM is played by a [`TapPort`], which holds the TAP's queue as QEMU does. Each
//! test builds its own network namespace (`pn-t-*`) and deletes it on drop. Without root each
//! test prints why it skipped and passes.

mod common;

use std::io;

use common::{exchange, is_root, Netns};
use picnic_switch::config::Config;
use picnic_switch::frame::{FramePool, DATA_CAP};
use picnic_switch::port::{
    tap_state, AfPacketOptions, Backend, Port, TapHostPort, TapPort, TapState,
};
use picnic_switch::runner::{open_port, Switch};

/// Whether `ifname` exists in the namespace (`ip link show`).
fn exists(ns: &Netns, ifname: &str) -> bool {
    std::process::Command::new("ip")
        .args(["-n", &ns.name, "link", "show", ifname])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn root_tap_host_side_carries_frames_both_ways_while_a_vmm_holds_the_queue() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.enter(|| {
        // The VMM: holds the TAP's queue (QEMU -netdev tap,ifname=pnvq0,vnet_hdr=on).
        let mut vmm = TapPort::open("pnvq0", DATA_CAP).unwrap();
        assert_eq!(vmm.backend(), Backend::TapQueue);
        ns.ip("link set pnvq0 up");
        // What picnic did before: open the queue too. The VMM has it.
        let busy = TapPort::open("pnvq0", DATA_CAP).unwrap_err();
        assert!(busy.to_string().contains("busy"), "{busy}");
        // The standard way: the host side, beside the VMM.
        let mut host = TapHostPort::open("pnvq0", false, AfPacketOptions::default()).unwrap();
        assert_eq!((host.name(), host.backend()), ("pnvq0", Backend::Tap));
        let mut pool = FramePool::new(4096);
        for len in [64, 1500] {
            // Guest to switch: the VMM writes, the switch receives on the netdev.
            exchange(&mut vmm, &mut host, &mut pool, len);
            // Switch to guest: the switch transmits on the netdev, the VMM reads.
            exchange(&mut host, &mut vmm, &mut pool, len);
        }
        let (h, v) = (host.stats(), vmm.stats());
        assert_eq!((h.tx_frames, h.tx_errors), (2000, 0));
        assert!(h.rx_frames >= 2000 && v.rx_frames >= 2000, "{h:?} {v:?}");
        assert_eq!(
            (h.rx_dropped, h.rx_oversize, h.rx_offload_errors),
            (0, 0, 0)
        );
    });
}

#[test]
fn root_tap_devices_the_switch_cannot_use_are_named_with_the_fix() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnvv0", "pnvv1");
    ns.ip("tuntap add dev pnvd0 mode tap");
    ns.enter(|| {
        let open = |name: &str| TapHostPort::open(name, false, AfPacketOptions::default());
        let missing = open("pnvm0").unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(missing.to_string().contains("port.create"), "{missing}");
        assert_eq!(tap_state("pnvv0").unwrap(), TapState::NotTap);
        let veth = open("pnvv0").unwrap_err();
        assert_eq!(veth.kind(), io::ErrorKind::InvalidInput);
        assert!(veth.to_string().contains("not a TAP"), "{veth}");
        assert_eq!(tap_state("pnvd0").unwrap(), TapState::Tap { up: false });
        let down = open("pnvd0").unwrap_err();
        assert!(down.to_string().contains("is down"), "{down}");

        // Through the config's opener: the field is named; tap_queue does not create either.
        let err = open_port("pnvm0", Backend::Tap, false, "vms[0].port.ifname", 1500)
            .err()
            .expect("missing TAP");
        assert!(
            format!("{err:#}").starts_with("vms[0].port.ifname"),
            "{err:#}"
        );
        let err = open_port(
            "pnvm0",
            Backend::TapQueue,
            false,
            "vms[0].port.ifname",
            1500,
        )
        .err()
        .expect("missing TAP");
        assert!(format!("{err:#}").contains("not found"), "{err:#}");
        assert_eq!(
            tap_state("pnvm0").unwrap(),
            TapState::Missing,
            "not created"
        );
    });
}

#[test]
fn root_a_tap_created_on_request_is_persistent_up_and_left_for_the_vmm() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.enter(|| {
        let mut port = TapHostPort::open("pnvc0", true, AfPacketOptions::default()).unwrap();
        assert_eq!(tap_state("pnvc0").unwrap(), TapState::Tap { up: true });
        // The queue is free for the VMM while the switch is attached.
        let mut vmm = TapPort::open("pnvc0", DATA_CAP).expect("the VMM attaches");
        let mut pool = FramePool::new(4096);
        exchange(&mut vmm, &mut port, &mut pool, 100);
        // The VM stops (its VMM closes the queue): the switch's sends towards it do not fail
        // the port, and the restarted VMM gets frames again.
        drop(vmm);
        let mut frames: Vec<_> = (0..16)
            .map(|seq| {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(&common::test_frame(seq, 100)));
                f
            })
            .collect();
        for _ in 0..4 {
            port.send_batch(&mut frames, &mut pool)
                .expect("no VMM attached: not a port error");
        }
        pool_put_all(&mut pool, &mut frames);
        let mut vmm = reopen("pnvc0");
        exchange(&mut port, &mut vmm, &mut pool, 100);
        exchange(&mut vmm, &mut port, &mut pool, 100);
        drop(vmm);
        drop(port);
        // The switch stopped and the VMM went: the TAP stays, the next VM start attaches.
        assert_eq!(tap_state("pnvc0").unwrap(), TapState::Tap { up: true });
        // Asked again: attaches to the existing one.
        TapHostPort::open("pnvc0", true, AfPacketOptions::default()).unwrap();
    });
    assert!(exists(&ns, "pnvc0"));
}

/// Opens the queue of TAP `ifname` as a restarted VMM does. Tests run in parallel threads, and
/// a process another test forks holds a copy of every descriptor until its exec: the queue
/// the previous VMM closed can stay attached for that long, so EBUSY is retried for a second.
fn reopen(ifname: &str) -> TapPort {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match TapPort::open(ifname, DATA_CAP) {
            Ok(port) => return port,
            Err(e) if e.to_string().contains("busy") && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("the VMM attaches again: {e}"),
        }
    }
}

/// Gives frames a send left queued back to the pool.
fn pool_put_all(pool: &mut FramePool, frames: &mut Vec<picnic_switch::frame::Frame>) {
    for f in frames.drain(..) {
        pool.put(f);
    }
}

const CONFIG: &str = r#"
[switch]
host_id = 1
workers = 1
[uplink]
ifname = "pnvup"
backend = "af_packet"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
[[vms]]
name = "vm1"
id = 1
tenant = "t"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "pnvt1", backend = "tap" }
[[vms]]
name = "vm2"
id = 2
tenant = "t"
host = 1
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
port = { ifname = "pnvt2", backend = "tap", create = true }
"#;

#[test]
fn root_a_switch_leaves_every_tap_behind_when_it_stops() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnvup", "pnvfab");
    // vm1's TAP exists (the operator's or the VMM's), vm2's is created by the switch.
    ns.ip("tuntap add dev pnvt1 mode tap");
    ns.ip("link set pnvt1 up");
    ns.enter(|| {
        let cfg = Config::parse(CONFIG).unwrap();
        let vmm1 = TapPort::open("pnvt1", DATA_CAP).unwrap();
        let switch = Switch::open(cfg).unwrap();
        let ports = switch.describe_ports();
        assert!(
            ports
                .iter()
                .any(|l| l.contains("pnvt2") && l.contains("tap")),
            "{ports:?}"
        );
        let vmm2 = TapPort::open("pnvt2", DATA_CAP).expect("vm2's VMM attaches");
        drop(switch);
        drop(vmm2);
        assert_eq!(tap_state("pnvt1").unwrap(), TapState::Tap { up: true });
        assert_eq!(tap_state("pnvt2").unwrap(), TapState::Tap { up: true });
        drop(vmm1);
    });
    assert!(exists(&ns, "pnvt1") && exists(&ns, "pnvt2"));
}

#[test]
fn create_is_only_for_taps() {
    let bad = CONFIG.replace(
        "port = { ifname = \"pnvt1\", backend = \"tap\" }",
        "port = { ifname = \"pnvt1\", create = true }",
    );
    let err = Config::parse(&bad).expect_err("create on a veth");
    let msg = format!("{err:#}");
    assert!(msg.contains("vms[0].port.create"), "{msg}");
    let ok = Config::parse(CONFIG).unwrap();
    let p = ok.vms[1].port.as_ref().unwrap();
    assert!(p.create && p.backend == Backend::Tap);
    let queue = CONFIG.replace("backend = \"tap\" }", "backend = \"tap_queue\" }");
    let q = Config::parse(&queue).unwrap();
    assert_eq!(q.vms[0].port.as_ref().unwrap().backend, Backend::TapQueue);
}
