//! Root integration tests of the switch's eBPF programs (docs/switch.md, "eBPF"), on veth
//! pairs in fresh `pn-t-*` namespaces. Without root, or without the programs (a build without
//! clang), each test prints why it skipped and passes.
//!
//! Split by program: `xdp.rs` tests the uplink's XDP early drop, `softirq.rs` the softirq
//! accounting, `cgroup.rs` the softirq time charged to a tenant's cgroup with two workers;
//! this file builds the frames they send.

mod cgroup;
#[path = "../common/mod.rs"]
mod common;
mod softirq;
mod xdp;

use std::net::Ipv4Addr;

use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap, OuterHeaders};

/// Marks the inner frames of these tests (EtherType for local experiments).
const INNER_ETHERTYPE: [u8; 2] = [0x88, 0xb5];

/// A Geneve frame from a remote host to VM `mac` of tenant `vni`, numbered `seq`.
fn geneve_to(vni: u32, mac: [u8; 6], seq: u32) -> Vec<u8> {
    let mut inner = Vec::with_capacity(64);
    inner.extend_from_slice(&mac);
    // From a VM of the VNI's tenant on host 2 (`a2`, `b2` in XDP_SWITCH): the switch checks
    // that an underlay frame's inner source lives on the host that sent it.
    inner.extend_from_slice(&[2, 0, 0, 0, (vni >> 8) as u8, vni as u8]);
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

const A1: [u8; 6] = [2, 0, 0, 0, 0, 0xa1];
const A2: [u8; 6] = [2, 0, 0, 0, 0, 0xa2];
const A3: [u8; 6] = [2, 0, 0, 0, 0, 0xa3];
const B1: [u8; 6] = [2, 0, 0, 0, 0, 0xb1];
