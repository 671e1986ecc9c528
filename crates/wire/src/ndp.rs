//! IPv6 Neighbor Discovery (RFC 4861) messages the switch answers itself: parsing a Neighbor
//! Solicitation out of an Ethernet frame and writing the Neighbor Advertisement that answers
//! it, as ARP's request and reply. Formats only (what to answer is the switch's business);
//! no panic on any bytes.

use std::net::Ipv6Addr;

use etherparse::{IpNumber, Ipv6Slice};

/// ICMPv6 type of a Neighbor Solicitation (RFC 4861 4.3).
pub const NEIGHBOR_SOLICITATION: u8 = 135;
/// ICMPv6 type of a Neighbor Advertisement (RFC 4861 4.4).
pub const NEIGHBOR_ADVERTISEMENT: u8 = 136;
/// NDP option types (RFC 4861 4.6.1).
const SOURCE_LINK_LAYER: u8 = 1;
const TARGET_LINK_LAYER: u8 = 2;
/// Length of a Neighbor Advertisement with a target link-layer option, Ethernet included.
pub const ADVERTISEMENT_LEN: usize = 14 + 40 + 32;

/// A Neighbor Solicitation that passed RFC 4861 7.1.1's validity checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeighborSolicitation {
    /// Ethernet source and destination.
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// IPv6 source (`::` for duplicate address detection) and destination.
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// The address whose link-layer address is asked for.
    pub target: Ipv6Addr,
    /// The source link-layer address option, if present.
    pub source_mac: Option<[u8; 6]>,
}

impl NeighborSolicitation {
    /// Whether this is a duplicate address detection probe (source `::`, RFC 4862 5.4.2).
    pub fn is_dad(&self) -> bool {
        self.src.is_unspecified()
    }
}

/// The solicited-node multicast address of `addr` (RFC 4291 2.7.1): ff02::1:ffXX:XXXX.
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// The Neighbor Solicitation in Ethernet II `frame`, if it is a valid one (RFC 4861 7.1.1):
/// IPv6 (extension headers allowed, no fragment) with hop limit 255, ICMPv6 type 135 code 0
/// with a correct checksum and at least 24 bytes, a target that is not multicast, well-formed
/// options, and from `::` only to a solicited-node address and without a source link-layer
/// option. `None` for anything else, whatever the bytes.
pub fn neighbor_solicitation(frame: &[u8]) -> Option<NeighborSolicitation> {
    if frame.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    let ip = Ipv6Slice::from_slice(frame.get(14..)?).ok()?;
    let header = ip.header();
    let payload = ip.payload();
    if header.hop_limit() != 255 || payload.ip_number != IpNumber::IPV6_ICMP || payload.fragmented {
        return None;
    }
    let icmp = payload.payload;
    let (src, dst) = (header.source_addr(), header.destination_addr());
    if icmp.len() < 24
        || icmp[0] != NEIGHBOR_SOLICITATION
        || icmp[1] != 0
        || icmpv6_checksum(src, dst, icmp) != 0
    {
        return None;
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).ok()?);
    if target.is_multicast() {
        return None;
    }
    let source_mac = link_layer_option(&icmp[24..], SOURCE_LINK_LAYER).ok()?;
    if src.is_unspecified() && (source_mac.is_some() || dst != solicited_node(target)) {
        return None;
    }
    Some(NeighborSolicitation {
        src_mac: frame.get(6..12)?.try_into().ok()?,
        dst_mac: frame.get(0..6)?.try_into().ok()?,
        src,
        dst,
        target,
        source_mac,
    })
}

/// What a Neighbor Advertisement says (RFC 4861 4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeighborAdvertisement {
    /// Ethernet source (the target's MAC) and destination (the solicitor's).
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// IPv6 source (the target address) and destination (the solicitor's source).
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub target: Ipv6Addr,
    /// The target's link-layer address (carried in the target link-layer option).
    pub target_mac: [u8; 6],
    /// The S flag: an answer to a solicitation.
    pub solicited: bool,
    /// The O flag: replace a cached link-layer address.
    pub override_flag: bool,
}

impl NeighborAdvertisement {
    /// Writes the frame (Ethernet, IPv6 hop limit 255, ICMPv6 with its checksum, a target
    /// link-layer option) at the start of `buf`; returns its length, [`ADVERTISEMENT_LEN`], or
    /// `None` when `buf` is shorter.
    pub fn write(&self, buf: &mut [u8]) -> Option<usize> {
        let out = buf.get_mut(..ADVERTISEMENT_LEN)?;
        out[0..6].copy_from_slice(&self.dst_mac);
        out[6..12].copy_from_slice(&self.src_mac);
        out[12..14].copy_from_slice(&[0x86, 0xdd]);
        let ip = &mut out[14..54];
        ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
        ip[4..6].copy_from_slice(&32u16.to_be_bytes());
        ip[6] = IpNumber::IPV6_ICMP.0;
        ip[7] = 255;
        ip[8..24].copy_from_slice(&self.src.octets());
        ip[24..40].copy_from_slice(&self.dst.octets());
        let icmp = &mut out[54..86];
        icmp[0] = NEIGHBOR_ADVERTISEMENT;
        icmp[1] = 0;
        icmp[2..4].fill(0);
        let flags = (u8::from(self.solicited) << 6) | (u8::from(self.override_flag) << 5);
        icmp[4..8].copy_from_slice(&[flags, 0, 0, 0]);
        icmp[8..24].copy_from_slice(&self.target.octets());
        icmp[24..26].copy_from_slice(&[TARGET_LINK_LAYER, 1]);
        icmp[26..32].copy_from_slice(&self.target_mac);
        let sum = icmpv6_checksum(self.src, self.dst, icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        Some(ADVERTISEMENT_LEN)
    }
}

/// The ICMPv6 checksum over the IPv6 pseudo-header and `icmp` (RFC 4443 2.3): 0 for a
/// message whose checksum field is right, the field's value for one whose field is 0.
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, icmp: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    for addr in [src, dst] {
        for pair in addr.octets().chunks_exact(2) {
            sum += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    sum += icmp.len() as u64 + u64::from(IpNumber::IPV6_ICMP.0);
    let mut words = icmp.chunks_exact(2);
    for pair in &mut words {
        sum += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An NDP option list with an option of length 0 or running past its end (RFC 4861 7.1:
/// the packet is discarded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MalformedOptions;

/// The MAC in the first NDP option of `kind` (type, length in 8-byte units, then the
/// address).
pub fn link_layer_option(
    mut options: &[u8],
    kind: u8,
) -> Result<Option<[u8; 6]>, MalformedOptions> {
    while let [t, len, ..] = *options {
        let bytes = usize::from(len) * 8;
        if bytes == 0 || bytes > options.len() {
            return Err(MalformedOptions);
        }
        if t == kind {
            return options[2..8]
                .try_into()
                .map(Some)
                .map_err(|_| MalformedOptions);
        }
        options = &options[bytes..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Icmpv6Type, PacketBuilder, SlicedPacket, TransportSlice};

    const A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
    const IP_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xa);
    const IP_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0x1234, 0x5678);

    /// A Neighbor Solicitation built by etherparse (its checksum, not ours).
    fn ns(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, target: Ipv6Addr, slla: bool) -> Vec<u8> {
        let mut body = target.octets().to_vec();
        if slla {
            body.extend_from_slice(&[SOURCE_LINK_LAYER, 1]);
            body.extend_from_slice(&A);
        }
        let mut out = Vec::new();
        PacketBuilder::ethernet2(A, [0x33, 0x33, 0xff, 0x34, 0x56, 0x78])
            .ipv6(src.octets(), dst.octets(), hop_limit)
            .icmpv6(Icmpv6Type::Unknown {
                type_u8: NEIGHBOR_SOLICITATION,
                code_u8: 0,
                bytes5to8: [0; 4],
            })
            .write(&mut out, &body)
            .unwrap();
        out
    }

    #[test]
    fn a_valid_solicitation_is_parsed_and_invalid_ones_are_not() {
        let group = solicited_node(IP_B);
        assert_eq!(group, "ff02::1:ff34:5678".parse::<Ipv6Addr>().unwrap());
        let s = neighbor_solicitation(&ns(IP_A, group, 255, IP_B, true)).unwrap();
        assert_eq!(
            (s.src, s.dst, s.target, s.source_mac, s.src_mac),
            (IP_A, group, IP_B, Some(A), A)
        );
        assert!(!s.is_dad());
        let dad = neighbor_solicitation(&ns(Ipv6Addr::UNSPECIFIED, group, 255, IP_B, false));
        assert!(dad.unwrap().is_dad());
        // Hop limit below 255 (it crossed a router), DAD with an option or to another group,
        // a multicast target: all invalid (RFC 4861 7.1.1).
        assert_eq!(
            neighbor_solicitation(&ns(IP_A, group, 64, IP_B, true)),
            None
        );
        let dad_slla = ns(Ipv6Addr::UNSPECIFIED, group, 255, IP_B, true);
        assert_eq!(neighbor_solicitation(&dad_slla), None);
        let dad_group = ns(
            Ipv6Addr::UNSPECIFIED,
            solicited_node(IP_A),
            255,
            IP_B,
            false,
        );
        assert_eq!(neighbor_solicitation(&dad_group), None);
        assert_eq!(
            neighbor_solicitation(&ns(IP_A, group, 255, group, true)),
            None
        );
        // A wrong checksum, a truncated message, a zero-length option.
        let mut bad_sum = ns(IP_A, group, 255, IP_B, true);
        bad_sum[54 + 2] ^= 1;
        assert_eq!(neighbor_solicitation(&bad_sum), None);
        let full = ns(IP_A, group, 255, IP_B, true);
        for len in 0..full.len() {
            assert_eq!(neighbor_solicitation(&full[..len]), None, "{len} bytes");
        }
        let mut zero_opt = ns(IP_A, group, 255, IP_B, true);
        zero_opt[54 + 25] = 0;
        zero_opt[54 + 2..54 + 4].fill(0);
        let sum = icmpv6_checksum(IP_A, group, &zero_opt[54..]);
        zero_opt[54 + 2..54 + 4].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(neighbor_solicitation(&zero_opt), None);
    }

    #[test]
    fn the_advertisement_is_one_etherparse_reads_with_a_valid_checksum() {
        let na = NeighborAdvertisement {
            src_mac: B,
            dst_mac: A,
            src: IP_B,
            dst: IP_A,
            target: IP_B,
            target_mac: B,
            solicited: true,
            override_flag: true,
        };
        assert_eq!(na.write(&mut [0; ADVERTISEMENT_LEN - 1]), None);
        let mut buf = [0u8; 128];
        let len = na.write(&mut buf).unwrap();
        let frame = &buf[..len];
        let p = SlicedPacket::from_ethernet(frame).unwrap();
        let Some(TransportSlice::Icmpv6(icmp)) = p.transport else {
            panic!("not ICMPv6: {p:?}");
        };
        assert!(icmp.is_checksum_valid(IP_B.octets(), IP_A.octets()));
        let bytes = icmp.slice();
        assert_eq!((bytes[0], bytes[4]), (NEIGHBOR_ADVERTISEMENT, 0x60));
        assert_eq!(&bytes[8..24], &IP_B.octets());
        assert_eq!(
            link_layer_option(&bytes[24..], TARGET_LINK_LAYER),
            Ok(Some(B))
        );
        assert_eq!((&frame[0..6], &frame[6..12]), (&A[..], &B[..]));
        assert_eq!(frame[14 + 7], 255, "hop limit");
    }
}
