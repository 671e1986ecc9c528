//! Anti-spoofing on tenant ports, for every EtherType (DESIGN.md 4 "Policy"; trust model in
//! docs/switch.md "Security"). A VM may only send:
//! - from its own MAC address (every frame);
//! - IPv4 from its `ip`; ARP whose sender MAC and IP are its own;
//! - IPv6 from one of its addresses: `ipv6` in its config and its EUI-64 link-local address
//!   (RFC 4291 appendix A), or from `::` for duplicate address detection (RFC 4862 5.4);
//! - Neighbor Discovery (RFC 4861) only about itself: a Neighbor Advertisement's target is
//!   one of its addresses and its target link-layer option its MAC; a Neighbor Solicitation's
//!   source link-layer option is its MAC (and a DAD probe from `::` carries none, 7.1.1).
//!   Router Advertisements and Redirects are dropped: a VM is not the tenant's router (the
//!   RA guard of RFC 6105). NDP in a fragment is dropped (RFC 6980);
//! - other EtherTypes only when listed in its `allow_ethertypes` (default deny).

use std::net::Ipv6Addr;

use etherparse::{IpNumber, Ipv6Slice};
use picnic_wire::classify::{FrameSummary, Network};

use crate::directory::Vm;

const ROUTER_ADVERTISEMENT: u8 = 134;
const NEIGHBOR_SOLICITATION: u8 = 135;
const NEIGHBOR_ADVERTISEMENT: u8 = 136;
const REDIRECT: u8 = 137;
/// NDP option types (RFC 4861 4.6.1).
const SOURCE_LINK_LAYER: u8 = 1;
const TARGET_LINK_LAYER: u8 = 2;

/// Whether a frame VM `v` sent, classified as `s` (`frame` its bytes), breaks the rules of
/// the module docs.
pub fn is_spoofed(v: &Vm, s: &FrameSummary, frame: &[u8]) -> bool {
    if s.src_mac != v.mac.0 {
        return true;
    }
    match s.network {
        Network::Ipv4 { src, .. } => src != v.ip,
        Network::Arp(arp) => arp.sender_mac != v.mac.0 || arp.sender_ip != v.ip,
        Network::Ipv6 { src, protocol, .. } => {
            let own = v.ipv6.contains(&src);
            if protocol == IpNumber::IPV6_ICMP {
                return ndp_spoofed(v, src, frame);
            }
            !own
        }
        Network::Other => !v.allow_ethertypes.contains(&s.ether_type.0),
    }
}

/// IPv6 source and Neighbor Discovery checks of an ICMPv6 packet.
fn ndp_spoofed(v: &Vm, src: Ipv6Addr, frame: &[u8]) -> bool {
    let own = |a: &Ipv6Addr| v.ipv6.contains(a);
    let Some(ip) = frame.get(14..).and_then(|b| Ipv6Slice::from_slice(b).ok()) else {
        return true;
    };
    let payload = ip.payload();
    let icmp = payload.payload;
    let Some(&icmp_type) = icmp.first() else {
        return true;
    };
    let is_ndp = matches!(
        icmp_type,
        ROUTER_ADVERTISEMENT | NEIGHBOR_SOLICITATION | NEIGHBOR_ADVERTISEMENT | REDIRECT
    );
    if !is_ndp {
        return !own(&src);
    }
    if payload.fragmented {
        return true;
    }
    let target = icmp
        .get(8..24)
        .and_then(|t| <[u8; 16]>::try_from(t).ok())
        .map(Ipv6Addr::from);
    let options = icmp.get(24..).unwrap_or(&[]);
    match (icmp_type, target) {
        (NEIGHBOR_ADVERTISEMENT, Some(target)) => {
            let tlla_spoofed = match link_layer_option(options, TARGET_LINK_LAYER) {
                Ok(None) => false,
                Ok(Some(m)) => m != v.mac.0,
                Err(()) => true,
            };
            !own(&src) || !own(&target) || tlla_spoofed
        }
        (NEIGHBOR_SOLICITATION, Some(target)) => {
            let Ok(slla) = link_layer_option(options, SOURCE_LINK_LAYER) else {
                return true;
            };
            if src.is_unspecified() {
                // Duplicate address detection of one of its own addresses.
                slla.is_some() || !own(&target)
            } else {
                !own(&src) || slla.is_some_and(|m| m != v.mac.0)
            }
        }
        // Router Advertisements, Redirects, and truncated NS/NA.
        _ => true,
    }
}

/// The MAC in the first NDP option of `kind` (RFC 4861 4.6.1: type, length in 8-byte units,
/// then the address); `Err` for a malformed option list, which RFC 4861 7.1 discards.
fn link_layer_option(mut options: &[u8], kind: u8) -> Result<Option<[u8; 6]>, ()> {
    while let [t, len, ..] = *options {
        let bytes = usize::from(len) * 8;
        if bytes == 0 || bytes > options.len() {
            return Err(());
        }
        if t == kind {
            return options[2..8].try_into().map(Some).map_err(|_| ());
        }
        options = &options[bytes..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use etherparse::{Icmpv6Type, PacketBuilder};
    use picnic_core::Instant;

    use crate::config::Mac;
    use crate::directory::UPLINK;
    use crate::engine::tests::{config, Host, A1, A2, B1, B2};
    use crate::engine::Engine;
    use crate::frame::FramePool;
    use crate::stats::DropReason;

    const A1_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const A2_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 3);
    const OTHER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 99);
    const EXPERIMENTAL: u16 = 0x88b5;

    /// Host 1 where a1 has IPv6 address A1_V6 and may send EtherType 0x88b5; b1 has neither.
    fn host(anti_spoofing: bool) -> Host {
        let mut cfg = config(1, 1000);
        cfg.vms[0].ipv6 = vec![A1_V6];
        cfg.vms[0].allow_ethertypes = vec![EXPERIMENTAL];
        cfg.vms[2].ipv6 = vec![A2_V6];
        cfg.isolation.anti_spoofing = anti_spoofing;
        Host {
            engine: Engine::new(&cfg, Instant::ZERO).unwrap(),
            pool: FramePool::new(1024),
        }
    }

    fn udp6(src_mac: [u8; 6], dst_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv6(src.octets(), dst.octets(), 64)
            .udp(40000, 7)
            .write(&mut out, &[0; 64])
            .unwrap();
        out
    }

    /// An NDP message of `icmp_type` (135 NS, 136 NA, 134 RA) about `target`, with an
    /// optional link-layer address option (source for NS, target for NA).
    fn ndp(
        icmp_type: u8,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv6Addr,
        target: Ipv6Addr,
        lla: Option<[u8; 6]>,
    ) -> Vec<u8> {
        let mut body = target.octets().to_vec();
        if let Some(mac) = lla {
            let kind = if icmp_type == 135 { 1 } else { 2 };
            body.extend_from_slice(&[kind, 1]);
            body.extend_from_slice(&mac);
        }
        let mut out = Vec::new();
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv6(src.octets(), A2_V6.octets(), 255)
            .icmpv6(Icmpv6Type::Unknown {
                type_u8: icmp_type,
                code_u8: 0,
                bytes5to8: [0x60, 0, 0, 0],
            })
            .write(&mut out, &body)
            .unwrap();
        out
    }

    fn other_ethertype(src_mac: [u8; 6], dst_mac: [u8; 6], ether_type: u16) -> Vec<u8> {
        let mut f = dst_mac.to_vec();
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&ether_type.to_be_bytes());
        f.resize(60, 0x5a);
        f
    }

    /// Sends each frame from `vm`'s port; returns (forwarded to the uplink, spoofed drops).
    fn send(h: &mut Host, vm: &str, frames: &[Vec<u8>]) -> (usize, u64) {
        let before = h.drops(vm, DropReason::Spoofed);
        for f in frames {
            h.inject(Instant::ZERO, h.port_of(vm), f);
        }
        h.poll(Instant::ZERO);
        let sent = h.take(UPLINK).len();
        (sent, h.drops(vm, DropReason::Spoofed) - before)
    }

    #[test]
    fn ipv6_is_sent_only_from_the_vms_own_addresses() {
        let mut h = host(true);
        let ll = Mac(A1).link_local();
        assert_eq!(ll.segments()[..4], [0xfe80, 0, 0, 0]);
        let own = [udp6(A1, A2, A1_V6, A2_V6), udp6(A1, A2, ll, A2_V6)];
        assert_eq!(send(&mut h, "a1", &own), (2, 0));
        let spoofed = [
            udp6(A1, A2, OTHER_V6, A2_V6),
            udp6(A1, A2, A2_V6, A2_V6),
            udp6(A1, A2, Mac(B1).link_local(), A2_V6),
            udp6(B1, A2, A1_V6, A2_V6), // a1's address, b1's MAC
        ];
        assert_eq!(send(&mut h, "a1", &spoofed), (0, 4));
        // b1 has no configured IPv6 address, only its link-local one.
        assert_eq!(send(&mut h, "b1", &[udp6(B1, B2, A1_V6, A2_V6)]), (0, 1));
        assert_eq!(
            send(&mut h, "b1", &[udp6(B1, B2, Mac(B1).link_local(), A2_V6)]),
            (1, 0)
        );
    }

    #[test]
    fn neighbor_discovery_only_about_the_vm_itself() {
        let mut h = host(true);
        // Unicast NA and NS about its own address, with its own link-layer address: sent.
        let fine = [
            ndp(136, A1, A2, A1_V6, A1_V6, Some(A1)),
            ndp(136, A1, A2, A1_V6, A1_V6, None),
            ndp(135, A1, A2, A1_V6, A2_V6, Some(A1)),
        ];
        assert_eq!(send(&mut h, "a1", &fine), (3, 0));
        let spoofed = [
            // NA claiming a2's address (neighbor cache poisoning) or pointing it at b1's MAC.
            ndp(136, A1, A2, A1_V6, A2_V6, Some(A1)),
            ndp(136, A1, A2, A1_V6, A1_V6, Some(B1)),
            // NS whose source link-layer option is another MAC.
            ndp(135, A1, A2, A1_V6, A2_V6, Some(B1)),
            // DAD probes: from :: with a link-layer option, or for another VM's address.
            ndp(135, A1, A2, Ipv6Addr::UNSPECIFIED, A1_V6, Some(A1)),
            ndp(135, A1, A2, Ipv6Addr::UNSPECIFIED, A2_V6, None),
            // A Router Advertisement: a VM is not the router.
            ndp(134, A1, A2, A1_V6, A1_V6, None),
        ];
        assert_eq!(send(&mut h, "a1", &spoofed), (0, 6));
        // A DAD probe for its own address is fine.
        let dad = ndp(135, A1, A2, Ipv6Addr::UNSPECIFIED, A1_V6, None);
        assert_eq!(send(&mut h, "a1", &[dad]), (1, 0));
        // An option of length 0 makes the packet invalid (RFC 4861 7.1.1).
        let mut bad = ndp(136, A1, A2, A1_V6, A1_V6, Some(A1));
        let opt_len = bad.len() - 7;
        bad[opt_len] = 0;
        assert_eq!(send(&mut h, "a1", &[bad]), (0, 1));
    }

    #[test]
    fn unknown_ethertypes_are_denied_unless_allowed_for_the_vm() {
        let mut h = host(true);
        assert_eq!(
            send(&mut h, "a1", &[other_ethertype(A1, A2, EXPERIMENTAL)]),
            (1, 0)
        );
        let denied = [
            other_ethertype(A1, A2, 0x88cc),       // LLDP: not in a1's list
            other_ethertype(B1, A2, EXPERIMENTAL), // allowed type, another VM's MAC
        ];
        assert_eq!(send(&mut h, "a1", &denied), (0, 2));
        let b1 = [
            other_ethertype(B1, B2, EXPERIMENTAL),
            other_ethertype(B1, B2, 0x8100), // VLAN-tagged
        ];
        assert_eq!(send(&mut h, "b1", &b1), (0, 2));
        // ARP and IPv4 keep their checks (existing tests); with anti-spoofing off all pass.
        let mut open = host(false);
        assert_eq!(
            send(&mut open, "b1", &[other_ethertype(B1, B2, 0x88cc)]),
            (1, 0)
        );
    }
}
