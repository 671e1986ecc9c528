//! Property tests: round trips of every emitter through its parser, and no panic on any bytes.

use std::net::Ipv4Addr;

use picnic_wire::etherparse::{Ipv4HeaderSlice, PacketBuilder};
use picnic_wire::feedback::FeedbackAuth;
use picnic_wire::geneve::MAX_VNI;
use picnic_wire::seal::{
    open_in_place, seal_in_place, sealed_key_of, OpenError, SealHeader, TunnelKey, SEAL_OVERHEAD,
};
use picnic_wire::{
    classify, decap, encap, standalone_feedback, FeedbackOption, GenevePacket, GeneveRepr, Network,
    OuterHeaders, Ports,
};
use proptest::prelude::*;

fn feedback_strategy() -> impl Strategy<Value = FeedbackOption> {
    (any::<u32>(), any::<u64>(), any::<u32>()).prop_map(|(dst_endpoint, rate_bps, seq)| {
        FeedbackOption {
            dst_endpoint,
            rate_bps,
            seq,
        }
    })
}

fn geneve_strategy() -> impl Strategy<Value = GeneveRepr> {
    (
        0..=MAX_VNI,
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(feedback_strategy()),
        proptest::option::of((any::<u32>(), any::<u64>(), any::<[u8; 16]>())),
    )
        .prop_map(
            |(vni, protocol, oam, critical, feedback, auth)| GeneveRepr {
                vni,
                protocol,
                oam,
                critical,
                feedback,
                feedback_auth: auth.map(|(epoch, nonce, tag)| FeedbackAuth { epoch, nonce, tag }),
            },
        )
}

fn outer_strategy() -> impl Strategy<Value = OuterHeaders> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
        any::<u8>(),
    )
        .prop_map(
            |(src_mac, dst_mac, src_ip, dst_ip, src_port, ttl)| OuterHeaders {
                src_mac,
                dst_mac,
                src_ip: Ipv4Addr::from(src_ip),
                dst_ip: Ipv4Addr::from(dst_ip),
                src_port,
                ttl,
            },
        )
}

/// Feeds `bytes` to every parser and view and touches every accessor; must never panic.
fn parse_everything(bytes: &[u8]) {
    if let Ok(packet) = GenevePacket::new_checked(bytes) {
        assert!(packet.header_len() <= bytes.len());
        let (_, _, _, _) = (
            packet.vni(),
            packet.protocol(),
            packet.oam(),
            packet.critical(),
        );
        let options_len: usize = packet.options().map(|o| 4 + o.data.len()).sum();
        assert_eq!(8 + options_len, packet.header_len());
        assert_eq!(packet.payload().len(), bytes.len() - packet.header_len());
        if let Ok(repr) = GeneveRepr::parse(&packet) {
            let mut out = vec![0u8; repr.buffer_len()];
            assert_eq!(repr.emit(&mut out), Ok(repr.buffer_len()));
            let reparsed = GenevePacket::new_checked(&out[..]).unwrap();
            assert_eq!(GeneveRepr::parse(&reparsed), Ok(repr));
        }
    }
    let _ = FeedbackOption::parse(bytes);
    if let Some(ns) = picnic_wire::ndp::neighbor_solicitation(bytes) {
        assert!(!ns.target.is_multicast());
    }
    if let Ok(d) = decap(bytes) {
        // The inner frame is a slice of the received one.
        let start = d.inner.as_ptr() as usize - bytes.as_ptr() as usize;
        assert!(start + d.inner.len() <= bytes.len());
        let _ = classify(d.inner);
    }
    if let Ok(summary) = classify(bytes) {
        let _ = summary.flow_hash();
    }
    let _ = sealed_key_of(bytes);
    let key = TunnelKey::new(&[7; 16]).unwrap();
    let mut room = bytes.to_vec();
    room.extend_from_slice(&[0; SEAL_OVERHEAD]);
    if let Ok(n) = open_in_place(&mut room, bytes.len(), |_| Some(&key)) {
        assert!(n + SEAL_OVERHEAD <= bytes.len());
    }
    let mut room = bytes.to_vec();
    room.extend_from_slice(&[0; SEAL_OVERHEAD]);
    if let Ok(n) = seal_in_place(&mut room, bytes.len(), &key, SealHeader::new(1, 2, 3)) {
        assert!(n <= bytes.len() + SEAL_OVERHEAD);
    }
}

fn tenant_frame(payload_len: usize, tcp: bool, ports: (u16, u16)) -> Vec<u8> {
    let ip = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(
        [198, 18, 0, 1],
        [198, 18, 0, 2],
        64,
    );
    let payload = vec![0x5A; payload_len];
    let mut frame = Vec::new();
    if tcp {
        ip.tcp(ports.0, ports.1, 7, 1000)
            .write(&mut frame, &payload)
            .unwrap();
    } else {
        ip.udp(ports.0, ports.1)
            .write(&mut frame, &payload)
            .unwrap();
    }
    frame
}

/// 2000 cases, or `PROPTEST_CASES` when set (a longer run: `PROPTEST_CASES=100000`).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn geneve_parse_emit_round_trip(repr in geneve_strategy(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut buf = vec![0u8; repr.buffer_len() + payload.len()];
        let len = repr.emit(&mut buf).unwrap();
        prop_assert_eq!(len, repr.buffer_len());
        buf[len..].copy_from_slice(&payload);
        let packet = GenevePacket::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(packet.vni(), repr.vni);
        prop_assert_eq!(packet.payload(), &payload[..]);
        prop_assert_eq!(GeneveRepr::parse(&packet), Ok(repr));
    }

    #[test]
    fn feedback_round_trip(fb in feedback_strategy()) {
        let mut data = [0u8; 16];
        fb.emit(&mut data).unwrap();
        prop_assert_eq!(FeedbackOption::parse(&data), Ok(fb));
    }

    #[test]
    fn decap_inverts_encap(
        outer in outer_strategy(),
        geneve in geneve_strategy(),
        inner in proptest::collection::vec(any::<u8>(), 0..1600),
    ) {
        // Room for the largest headers (options included) and payload the strategies draw:
        // a fixed 1700 B was short by a byte for 1600 B of payload under the longest options.
        let mut out = vec![0u8; picnic_wire::encap_headers_len(&geneve) + inner.len()];
        let len = encap(&outer, &geneve, &inner, &mut out).unwrap();
        prop_assert_eq!(len, picnic_wire::encap_headers_len(&geneve) + inner.len());
        // etherparse agrees the outer IPv4 header checksum is right.
        let ip = Ipv4HeaderSlice::from_slice(&out[14..len]).unwrap().to_header();
        prop_assert_eq!(ip.header_checksum, ip.calc_header_checksum());
        let d = decap(&out[..len]).unwrap();
        prop_assert_eq!(d.outer_src_ip, outer.src_ip);
        prop_assert_eq!(d.outer_src_port, outer.src_port);
        prop_assert_eq!(d.geneve, geneve);
        prop_assert_eq!(d.inner, &inner[..]);
    }

    #[test]
    fn standalone_feedback_survives_the_tunnel(outer in outer_strategy(), vni in 0..=MAX_VNI, fb in feedback_strategy()) {
        let mut out = [0u8; 128];
        let len = encap(&outer, &standalone_feedback(vni, fb), &[], &mut out).unwrap();
        let d = decap(&out[..len]).unwrap();
        prop_assert!(d.geneve.is_standalone_feedback());
        prop_assert_eq!(d.geneve.vni, vni);
        prop_assert_eq!(d.geneve.feedback, Some(fb));
        prop_assert!(d.inner.is_empty());
    }

    #[test]
    fn classify_finds_what_was_built(payload_len in 0usize..1400, tcp in any::<bool>(), src in any::<u16>(), dst in any::<u16>()) {
        let frame = tenant_frame(payload_len, tcp, (src, dst));
        let summary = classify(&frame).unwrap();
        let Network::Ipv4 { ports, .. } = summary.network else {
            return Err(TestCaseError::fail("not IPv4"));
        };
        prop_assert_eq!(ports, Some(Ports { src, dst }));
        // Through the tunnel, the inner frame classifies the same.
        let outer = OuterHeaders {
            src_mac: [2; 6], dst_mac: [4; 6],
            src_ip: Ipv4Addr::new(198, 19, 0, 1), dst_ip: Ipv4Addr::new(198, 19, 0, 2),
            src_port: picnic_wire::entropy_source_port(summary.flow_hash()), ttl: 64,
        };
        let mut out = vec![0u8; frame.len() + picnic_wire::ENCAP_OVERHEAD];
        let len = encap(&outer, &GeneveRepr::ethernet(5), &frame, &mut out).unwrap();
        prop_assert_eq!(classify(decap(&out[..len]).unwrap().inner), Ok(summary));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        parse_everything(&bytes);
    }

    #[test]
    fn mutated_tunnel_packets_never_panic(
        outer in outer_strategy(),
        geneve in geneve_strategy(),
        inner_len in 0usize..1500,
        tcp in any::<bool>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let inner = tenant_frame(inner_len, tcp, (1234, 80));
        let mut out = vec![0u8; inner.len() + picnic_wire::encap_headers_len(&geneve)];
        let len = encap(&outer, &geneve, &inner, &mut out).unwrap();
        let mut frame = out[..len].to_vec();
        for (index, xor) in flips {
            let i = index.index(frame.len());
            frame[i] ^= xor;
        }
        parse_everything(&frame);
        parse_everything(&frame[..cut.index(frame.len() + 1)]);
        // The Geneve part alone, mutated, through the view.
        parse_everything(&frame[42..]);
    }

    #[test]
    fn mutated_tenant_frames_never_panic(
        inner_len in 0usize..200,
        tcp in any::<bool>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut frame = tenant_frame(inner_len, tcp, (1, 2));
        for (index, xor) in flips {
            let i = index.index(frame.len());
            frame[i] ^= xor;
        }
        parse_everything(&frame);
        parse_everything(&frame[..cut.index(frame.len() + 1)]);
    }

    #[test]
    fn mutated_neighbor_solicitations_never_panic(
        target in any::<[u8; 16]>(),
        options in proptest::collection::vec(any::<u8>(), 0..24),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let target = std::net::Ipv6Addr::from(target);
        let mut body = target.octets().to_vec();
        body.extend_from_slice(&options);
        let mut frame = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0xff, 0, 0, 1])
            .ipv6([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], picnic_wire::ndp::solicited_node(target).octets(), 255)
            .icmpv6(picnic_wire::etherparse::Icmpv6Type::Unknown { type_u8: 135, code_u8: 0, bytes5to8: [0; 4] })
            .write(&mut frame, &body)
            .unwrap();
        if flips.is_empty() && options.is_empty() && !target.is_multicast() {
            // Unmutated and without options: valid.
            prop_assert_eq!(picnic_wire::ndp::neighbor_solicitation(&frame).map(|n| n.target), Some(target));
        }
        for (index, xor) in flips {
            let i = index.index(frame.len());
            frame[i] ^= xor;
        }
        parse_everything(&frame);
        parse_everything(&frame[..cut.index(frame.len() + 1)]);
    }

    #[test]
    fn sealing_round_trips_and_detects_flips(
        inner_len in 0usize..1500,
        key_bytes in proptest::collection::vec(any::<u8>(), 32),
        long_key in any::<bool>(),
        epoch in any::<u32>(),
        counter in any::<u64>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..3),
    ) {
        let key = TunnelKey::new(&key_bytes[..if long_key { 32 } else { 16 }]).unwrap();
        let inner = tenant_frame(inner_len.min(1400), false, (1, 2));
        let mut buf = vec![0u8; inner.len() + picnic_wire::ENCAP_OVERHEAD + SEAL_OVERHEAD];
        let len = encap(&outer_fixed(), &GeneveRepr::ethernet(77), &inner, &mut buf).unwrap();
        let plain = buf[..len].to_vec();
        let sealed = seal_in_place(&mut buf, len, &key, SealHeader::new(epoch, 1, counter)).unwrap();
        prop_assert_eq!(sealed_key_of(&buf[..sealed]), Ok((77, epoch)));
        let original = buf[..sealed].to_vec();
        for (index, xor) in flips {
            buf[index.index(sealed)] ^= xor;
        }
        // What changed, judged on the bytes (two flips of one byte may cancel). Past the
        // outer headers (Ethernet, IPv4, UDP: 42 bytes) everything is authenticated data,
        // ciphertext or tag. The outer UDP length (bytes 38-39) is not authenticated data,
        // but it says where the ciphertext and the tag end, and GCM authenticates the
        // ciphertext's length: a shorter length that still parses fails authentication.
        let authenticated = buf[42..sealed] != original[42..];
        let extent = buf[38..40] != original[38..40];
        let any_change = buf[..sealed] != original[..];
        match open_in_place(&mut buf, sealed, |e| (e == epoch).then_some(&key)) {
            Ok(n) => {
                prop_assert!(!authenticated && !extent);
                prop_assert_eq!(&buf[42..n], &plain[42..]);
            }
            Err(OpenError::AuthFailed | OpenError::UnknownKey(_)) => {
                prop_assert!(authenticated || extent)
            }
            // A flip in the outer headers (checksum, lengths) can make the packet unparseable.
            Err(OpenError::Malformed(_)) => prop_assert!(any_change),
        }
    }
}

fn outer_fixed() -> OuterHeaders {
    OuterHeaders {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: Ipv4Addr::new(198, 18, 0, 1),
        dst_ip: Ipv4Addr::new(198, 18, 0, 2),
        src_port: 50000,
        ttl: 64,
    }
}
