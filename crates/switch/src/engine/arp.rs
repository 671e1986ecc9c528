//! Proxy ARP and neighbour discovery: the switch answers a VM's ARP request or IPv6 Neighbor
//! Solicitation for another VM of its tenant itself, from the directory, so no broadcast or
//! multicast leaves the host.

use std::net::Ipv6Addr;

use etherparse::{ArpHardwareId, ArpOperation, ArpPacket, EtherType, Ethernet2Header};
use picnic_core::Instant;
use picnic_wire::ndp::{NeighborAdvertisement, NeighborSolicitation};

use super::Engine;
use crate::directory::{PortIdx, TenantIdx, VmIdx};
use crate::frame::{Frame, FramePool};
use crate::stats::DropReason;

impl Engine {
    /// Turns an ARP request for tenant VM `target` into the reply and sends it back.
    pub(super) fn answer_arp(
        &mut self,
        mut frame: Frame,
        port: PortIdx,
        pool: &mut FramePool,
        req: &picnic_wire::classify::ArpSummary,
        target: VmIdx,
    ) {
        let t = &self.dir.vms[target];
        let reply = ArpPacket::new(
            ArpHardwareId::ETHERNET,
            EtherType::IPV4,
            ArpOperation::REPLY,
            &t.mac.0,
            &t.ip.octets(),
            &req.sender_mac,
            &req.sender_ip.octets(),
        );
        let eth = Ethernet2Header {
            source: t.mac.0,
            destination: req.sender_mac,
            ether_type: EtherType::ARP,
        };
        let Ok(reply) = reply else {
            return pool.put(frame);
        };
        let bytes = reply.to_bytes();
        let buf = frame.buf_for_rx();
        buf[..14].copy_from_slice(&eth.to_bytes());
        buf[14..14 + bytes.len()].copy_from_slice(&bytes);
        // Pad to the Ethernet minimum.
        let len = (14 + bytes.len()).max(60);
        buf[14 + bytes.len()..len].fill(0);
        frame.set_len(len);
        self.counters.arp_replies += 1;
        self.tx[port].push(frame);
    }
}

impl Engine {
    /// Answers a valid Neighbor Solicitation local VM `vm` sent to a multicast group (RFC
    /// 4861 7.2.3) from the directory, as [`Engine::answer_arp`] answers ARP: for an address
    /// of another VM of its tenant (its `ipv6` or EUI-64 link-local address, on any host),
    /// the Neighbor Advertisement that VM would send goes back on `port`. A duplicate address
    /// detection probe or a solicitation for its own address is consumed (the directory's
    /// addresses are the VMs' own, so no VM defends them; counted as `multicast`, a frame not
    /// carried), one for any other address is `unknown_destination`: another tenant's
    /// addresses are never looked at.
    pub(super) fn answer_neighbor_solicitation(
        &mut self,
        now: Instant,
        mut frame: Frame,
        vm: VmIdx,
        port: PortIdx,
        pool: &mut FramePool,
        ns: &NeighborSolicitation,
    ) {
        let tenant = self.dir.vms[vm].tenant;
        let target = if ns.is_dad() {
            None
        } else {
            self.vm_by_ipv6(tenant, ns.target).filter(|&w| w != vm)
        };
        let Some(w) = target else {
            let reason = if ns.is_dad() || self.dir.vms[vm].ipv6.contains(&ns.target) {
                DropReason::Multicast
            } else {
                DropReason::UnknownDestination
            };
            return self.drop_frame(now, pool, frame, Some(vm), reason);
        };
        let t = &self.dir.vms[w];
        let na = NeighborAdvertisement {
            src_mac: t.mac.0,
            dst_mac: ns.src_mac,
            src: ns.target,
            dst: ns.src,
            target: ns.target,
            target_mac: t.mac.0,
            solicited: true,
            override_flag: true,
        };
        let Some(len) = na.write(frame.buf_for_rx()) else {
            return pool.put(frame);
        };
        frame.set_len(len);
        self.counters.nd_replies += 1;
        self.tx[port].push(frame);
    }

    /// The live VM of `tenant` that owns IPv6 address `addr` (configured or link-local).
    /// A scan of the directory: solicitations are rare (neighbour caches hold the answers)
    /// and each one's CPU is charged to its sender like any frame's.
    fn vm_by_ipv6(&self, tenant: TenantIdx, addr: Ipv6Addr) -> Option<VmIdx> {
        self.dir.vms.iter().enumerate().find_map(|(w, v)| {
            (v.tenant == tenant
                && v.ipv6.contains(&addr)
                && self.dir.vm_by_mac(tenant, v.mac) == Some(w))
            .then_some(w)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use etherparse::{Icmpv6Type, PacketBuilder, SlicedPacket, TransportSlice};
    use picnic_core::Instant;
    use picnic_wire::ndp::{link_layer_option, solicited_node};

    use crate::config::{Config, Mac};
    use crate::directory::UPLINK;
    use crate::engine::tests::{carry, config, Host, A1, A2, B1};
    use crate::engine::Engine;
    use crate::frame::FramePool;
    use crate::stats::DropReason;

    const A1_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const A2_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 3);
    const A3_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 5);
    const B1_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    const OTHER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 99);
    const A3: [u8; 6] = [2, 0, 0, 0, 0, 5];

    /// The two-host test overlay with IPv6 addresses, and a third VM of tenant a, a3, on
    /// host 1 beside a1.
    fn ipv6_config(host: u32) -> Config {
        let mut cfg = config(host, 1000);
        cfg.vms[0].ipv6 = vec![A1_V6];
        cfg.vms[1].ipv6 = vec![B1_V6];
        cfg.vms[2].ipv6 = vec![A2_V6];
        let mut a3 = cfg.vms[0].clone();
        a3.name = "a3".into();
        a3.id = 5;
        a3.mac = Mac(A3);
        a3.ip = [198, 18, 0, 5].into();
        a3.ipv6 = vec![A3_V6];
        a3.shaped.clear();
        match a3.port.as_mut() {
            Some(p) => p.ifname = "a3".into(),
            None => a3.port = None,
        }
        cfg.vms.push(a3);
        cfg.validate().unwrap();
        cfg
    }

    fn host(id: u32) -> Host {
        Host {
            engine: Engine::new(&ipv6_config(id), Instant::ZERO).unwrap(),
            pool: FramePool::new(1024),
        }
    }

    /// A Neighbor Solicitation from `src_mac`/`src` for `target`, to its solicited-node
    /// group, with `slla` as source link-layer option.
    fn ns(src_mac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr, slla: Option<[u8; 6]>) -> Vec<u8> {
        let group = solicited_node(target);
        let o = group.octets();
        let dst_mac = [0x33, 0x33, o[12], o[13], o[14], o[15]];
        solicitation_to(src_mac, dst_mac, src, group, target, slla)
    }

    fn solicitation_to(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv6Addr,
        dst: Ipv6Addr,
        target: Ipv6Addr,
        slla: Option<[u8; 6]>,
    ) -> Vec<u8> {
        let mut body = target.octets().to_vec();
        if let Some(mac) = slla {
            body.extend_from_slice(&[1, 1]);
            body.extend_from_slice(&mac);
        }
        let mut out = Vec::new();
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv6(src.octets(), dst.octets(), 255)
            .icmpv6(Icmpv6Type::Unknown {
                type_u8: 135,
                code_u8: 0,
                bytes5to8: [0; 4],
            })
            .write(&mut out, &body)
            .unwrap();
        out
    }

    fn udp6(src_mac: [u8; 6], dst_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv6(src.octets(), dst.octets(), 64)
            .udp(40000, 7)
            .write(&mut out, &[0x5a; 100])
            .unwrap();
        out
    }

    /// (Ethernet source, Ethernet destination, IPv6 source, IPv6 destination, target,
    /// target link-layer option, flags byte).
    type Advert = (
        [u8; 6],
        [u8; 6],
        Ipv6Addr,
        Ipv6Addr,
        Ipv6Addr,
        Option<[u8; 6]>,
        u8,
    );

    /// What a Neighbor Advertisement says, its ICMPv6 checksum checked.
    fn advertisement(frame: &[u8]) -> Advert {
        let p = SlicedPacket::from_ethernet(frame).unwrap();
        let Some(etherparse::NetSlice::Ipv6(ip)) = &p.net else {
            panic!("not IPv6: {p:?}");
        };
        let h = ip.header();
        let (src, dst) = (h.source_addr(), h.destination_addr());
        assert_eq!(h.hop_limit(), 255);
        let Some(TransportSlice::Icmpv6(icmp)) = &p.transport else {
            panic!("not ICMPv6: {p:?}");
        };
        assert!(icmp.is_checksum_valid(src.octets(), dst.octets()));
        let b = icmp.slice();
        assert_eq!((b[0], b[1]), (136, 0), "a Neighbor Advertisement");
        let target = Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).unwrap());
        let tlla = link_layer_option(&b[24..], 2).unwrap();
        let mac = |r: std::ops::Range<usize>| <[u8; 6]>::try_from(&frame[r]).unwrap();
        (mac(6..12), mac(0..6), src, dst, target, tlla, b[4])
    }

    /// Sends `frame` from `vm`; returns what came back on its port and what left on the
    /// uplink.
    fn send(h: &mut Host, vm: &str, frame: &[u8]) -> (Vec<Vec<u8>>, usize) {
        let port = h.port_of(vm);
        h.inject(Instant::ZERO, port, frame);
        h.poll(Instant::ZERO);
        (h.take(port), h.take(UPLINK).len())
    }

    #[test]
    fn solicitations_are_answered_from_the_directory_within_the_tenant() {
        let mut h = host(1);
        let a1_ll = Mac(A1).link_local();
        // For a VM on another host, and for a VM on this host (configured and link-local
        // addresses), from a configured or a link-local source: answered here, nothing sent
        // on.
        let cases = [
            (A1_V6, A2_V6, A2),
            (a1_ll, Mac(A2).link_local(), A2),
            (A1_V6, A3_V6, A3),
            (a1_ll, Mac(A3).link_local(), A3),
        ];
        for (n, &(src, target, owner)) in cases.iter().enumerate() {
            let (back, sent) = send(&mut h, "a1", &ns(A1, src, target, Some(A1)));
            assert_eq!((back.len(), sent), (1, 0), "case {n}");
            assert_eq!(
                advertisement(&back[0]),
                (owner, A1, target, src, target, Some(owner), 0x60),
                "case {n}: solicited and override, from the target's MAC to a1"
            );
        }
        // Without a source link-layer option the answer goes to the frame's source.
        let (back, _) = send(&mut h, "a1", &ns(A1, A1_V6, A2_V6, None));
        assert_eq!(advertisement(&back[0]).1, A1);
        assert_eq!(h.engine.counters.nd_replies, 5);
        let drops: u64 = DropReason::ALL.iter().map(|&r| h.drops("a1", r)).sum();
        assert_eq!(drops, 0, "no drop counted");
    }

    #[test]
    fn no_answer_for_another_tenants_address_or_an_unknown_one() {
        let mut h = host(1);
        let b1_ll = Mac(B1).link_local();
        // b1 asks for tenant a's addresses, on this host and the other: no answer, not
        // forwarded, counted as an unknown destination of b1's.
        for target in [
            A1_V6,
            A2_V6,
            A3_V6,
            Mac(A1).link_local(),
            Mac(A2).link_local(),
        ] {
            assert_eq!(
                send(&mut h, "b1", &ns(B1, b1_ll, target, Some(B1))),
                (vec![], 0)
            );
        }
        assert_eq!(h.drops("b1", DropReason::UnknownDestination), 5);
        // a1 asks for an address no VM of its tenant has, or b1's.
        for target in [OTHER_V6, B1_V6, b1_ll] {
            assert_eq!(
                send(&mut h, "a1", &ns(A1, A1_V6, target, Some(A1))),
                (vec![], 0)
            );
        }
        assert_eq!(h.drops("a1", DropReason::UnknownDestination), 3);
        // Duplicate address detection of its own address, or a solicitation for it: nobody
        // defends it, consumed as multicast the switch does not carry.
        let dad = ns(A1, Ipv6Addr::UNSPECIFIED, A1_V6, None);
        assert_eq!(send(&mut h, "a1", &dad), (vec![], 0));
        assert_eq!(send(&mut h, "a1", &ns(A1, A1_V6, A1_V6, None)), (vec![], 0));
        assert_eq!(h.drops("a1", DropReason::Multicast), 2);
        assert_eq!(h.engine.counters.nd_replies, 0);
    }

    #[test]
    fn solicitations_a_vm_may_not_send_stay_refused() {
        let mut h = host(1);
        let spoofed = [
            // Another VM's MAC in the source link-layer option, or as the frame's source.
            ns(A1, A1_V6, A2_V6, Some(B1)),
            ns(B1, A1_V6, A2_V6, Some(B1)),
            // From another VM's address (b1's, a3's), and a DAD probe for a3's address.
            ns(A1, B1_V6, A2_V6, Some(A1)),
            ns(A1, A3_V6, A2_V6, Some(A1)),
            ns(A1, Ipv6Addr::UNSPECIFIED, A3_V6, None),
        ];
        for (n, f) in spoofed.iter().enumerate() {
            assert_eq!(send(&mut h, "a1", f), (vec![], 0), "case {n}");
        }
        assert_eq!(h.drops("a1", DropReason::Spoofed), 5);
        assert_eq!(h.engine.counters.nd_replies, 0);
        // An invalid solicitation (hop limit 64: it crossed a router) is not answered: the
        // multicast frame is dropped as before.
        let mut far = ns(A1, A1_V6, A2_V6, Some(A1));
        far[14 + 7] = 64;
        assert_eq!(send(&mut h, "a1", &far), (vec![], 0));
        assert_eq!(h.drops("a1", DropReason::Multicast), 1);
    }

    #[test]
    fn a_unicast_solicitation_reaches_its_vm_and_its_advertisement_comes_back() {
        // Neighbour unreachability detection: a1 asks a3 directly; a3 answers itself.
        let mut h = host(1);
        let nud = solicitation_to(A1, A3, A1_V6, A3_V6, A3_V6, Some(A1));
        let (back, _) = send(&mut h, "a1", &nud);
        assert!(back.is_empty());
        assert_eq!(h.take(h.port_of("a3")), vec![nud]);
        assert_eq!(h.engine.counters.nd_replies, 0);
    }

    #[test]
    fn vms_of_one_tenant_on_two_hosts_resolve_each_other_and_exchange_ipv6() {
        let (mut h1, mut h2) = (host(1), host(2));
        let now = Instant::ZERO;
        // a2 (host 2) resolves a1 (host 1): its own switch answers.
        let (back, sent) = send(&mut h2, "a2", &ns(A2, A2_V6, A1_V6, Some(A2)));
        assert_eq!(sent, 0);
        let (from_mac, ..) = advertisement(&back[0]);
        assert_eq!(from_mac, A1);
        // Then its UDP to the MAC it learned crosses both switches intact.
        let datagram = udp6(A2, from_mac, A2_V6, A1_V6);
        h2.inject(now, h2.port_of("a2"), &datagram);
        h2.poll(now);
        assert_eq!(carry(&mut h2, &mut h1, now), 1);
        h1.poll(now);
        assert_eq!(h1.take(h1.port_of("a1")), vec![datagram]);
        // a1 answers a2's unicast reachability check with its own advertisement, which
        // anti-spoofing lets through because it is about a1 itself.
        let mut na = Vec::new();
        PacketBuilder::ethernet2(A1, A2)
            .ipv6(A1_V6.octets(), A2_V6.octets(), 255)
            .icmpv6(Icmpv6Type::Unknown {
                type_u8: 136,
                code_u8: 0,
                bytes5to8: [0x60, 0, 0, 0],
            })
            .write(
                &mut na,
                &[&A1_V6.octets()[..], &[2u8, 1][..], &A1[..]].concat(),
            )
            .unwrap();
        h1.take(UPLINK); // the feedback a2's datagram triggered
        h1.inject(now, h1.port_of("a1"), &na);
        h1.poll(now);
        assert_eq!(carry(&mut h1, &mut h2, now), 1);
        h2.poll(now);
        assert_eq!(h2.take(h2.port_of("a2")), vec![na]);
    }
}
