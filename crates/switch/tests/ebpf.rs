//! Root integration tests of the switch's eBPF programs (docs/switch.md, "eBPF"), on veth
//! pairs in fresh `pn-t-*` namespaces. Without root, or without the programs (a build without
//! clang), each test prints why it skipped and passes.

#[allow(dead_code)] // the helpers of the other root tests
mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::{collect, is_root, send_all, Netns};
use picnic_switch::engine::{XdpThrottle, XDP_CPU, XDP_PPS};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Port};
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap, OuterHeaders};

/// Whether the eBPF programs were built; prints why a test skips when not.
fn have_programs(err: &std::io::Error) -> bool {
    let built = !err.to_string().contains("were not built");
    if !built {
        println!("skipped: {err}");
    }
    built
}

/// Marks the inner frames of these tests (EtherType for local experiments).
const INNER_ETHERTYPE: [u8; 2] = [0x88, 0xb5];

/// A Geneve frame from a remote host to VM `mac` of tenant `vni`, numbered `seq`.
fn geneve_to(vni: u32, mac: [u8; 6], seq: u32) -> Vec<u8> {
    let mut inner = Vec::with_capacity(64);
    inner.extend_from_slice(&mac);
    inner.extend_from_slice(&[2, 0, 0, 0, 0, 0xee]);
    inner.extend_from_slice(&INNER_ETHERTYPE);
    inner.extend_from_slice(&vni.to_be_bytes());
    inner.extend_from_slice(&seq.to_be_bytes());
    inner.resize(64, 0);
    let outer = OuterHeaders {
        src_mac: [2, 0, 0, 0, 1, 2],
        dst_mac: [2, 0, 0, 0, 1, 1],
        src_ip: Ipv4Addr::new(198, 19, 0, 2),
        dst_ip: Ipv4Addr::new(198, 19, 0, 1),
        src_port: 49152 + (seq % 64) as u16,
        ttl: 64,
    };
    let mut out = vec![0u8; 256];
    let n = encap(&outer, &GeneveRepr::ethernet(vni), &inner, &mut out).unwrap();
    out.truncate(n);
    out
}

/// (VNI, inner destination MAC) of a frame the tests sent, None for anything else.
fn destination(f: &Frame) -> Option<(u32, [u8; 6])> {
    let d = f.data();
    // Outer Ethernet 14 + IPv4 20 + UDP 8 + Geneve 8 = 50; the inner frame follows.
    let inner = d.get(50..)?;
    (inner.get(12..14)? == INNER_ETHERTYPE).then(|| {
        let vni = u32::from_be_bytes(inner[14..18].try_into().unwrap());
        (vni, inner[0..6].try_into().unwrap())
    })
}

const A1: [u8; 6] = [2, 0, 0, 0, 0, 0xa1];
const A2: [u8; 6] = [2, 0, 0, 0, 0, 0xa2];
const A3: [u8; 6] = [2, 0, 0, 0, 0, 0xa3];
const B1: [u8; 6] = [2, 0, 0, 0, 0, 0xb1];

/// Sends `n` frames to each of `to` through `tx` and returns how many of each `rx` got.
fn send_and_count(
    tx: &mut AfPacketPort,
    rx: &mut AfXdpPort,
    pool: &mut FramePool,
    to: &[(u32, [u8; 6])],
    n: u32,
) -> Vec<usize> {
    let mut got = Vec::new();
    for seq in 0..n {
        let mut batch: Vec<Frame> = to
            .iter()
            .map(|&(vni, mac)| {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(&geneve_to(vni, mac, seq)));
                f
            })
            .collect();
        send_all(tx, pool, &mut batch);
        if seq % 16 == 0 {
            rx.recv_batch(pool, &mut got, usize::MAX).unwrap();
        }
    }
    // Whatever passes has arrived by then (a veth delivers within microseconds).
    collect(rx, pool, &mut got, Duration::from_millis(500), |_| false);
    let counts = to
        .iter()
        .map(|d| got.iter().filter(|f| destination(f) == Some(*d)).count())
        .collect();
    for f in got {
        pool.put(f);
    }
    counts
}

/// The uplink's XDP program drops the Geneve frames of the VMs the switch marked throttled
/// before they reach the AF_XDP socket, counts them per VM and reason, and passes everyone
/// else's; a released VM's frames pass again.
#[test]
fn xdp_drops_throttled_vms_frames_before_the_socket_and_counts_them() {
    if !is_root() {
        return;
    }
    let ns = Netns::new();
    ns.veth_pair("pnea", "pneb");
    ns.enter(|| {
        let mut up = match AfXdpPort::open("pnea", AfXdpOptions::default()) {
            Ok(p) => p,
            Err(e) if !have_programs(&e) => return,
            Err(e) => panic!("{e}"),
        };
        let mut early = up
            .early_drop()
            .expect("an AF_XDP port has the early-drop maps");
        assert!(up.early_drop().is_none(), "handed out once");
        let mut peer = AfPacketPort::open("pneb", AfPacketOptions::default()).unwrap();
        let mut pool = FramePool::new(8192);
        // Tenant 100: a1 over its CPU budget, a2 over its packet budget, a3 not held back;
        // tenant 200's b1 not held back either.
        let throttled = [
            XdpThrottle {
                vni: 100,
                mac: A1,
                slot: 1,
                reasons: XDP_CPU,
            },
            XdpThrottle {
                vni: 100,
                mac: A2,
                slot: 2,
                reasons: XDP_PPS,
            },
        ];
        early.apply(&throttled).unwrap();
        let to = [(100, A1), (100, A2), (100, A3), (200, B1), (200, A1)];
        let got = send_and_count(&mut peer, &mut up, &mut pool, &to, 300);
        assert_eq!(got, vec![0, 0, 300, 300, 300], "received per destination");
        let mut drops = Vec::new();
        early.new_drops(&[1, 2, 3], &mut drops);
        drops.sort();
        assert_eq!(
            drops,
            vec![(1, 0, 300), (2, 1, 300)],
            "(slot, reason, frames)"
        );
        // Released: a1 and a2 are received again, and nothing more is counted.
        early.apply(&[]).unwrap();
        let got = send_and_count(&mut peer, &mut up, &mut pool, &to, 100);
        assert_eq!(got, vec![100; 5]);
        early.new_drops(&[1, 2, 3], &mut drops);
        assert_eq!(drops, vec![]);
        assert_eq!(pool.available(), pool.capacity(), "no frame leaked");
    });
}
