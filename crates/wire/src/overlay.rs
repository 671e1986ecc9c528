//! Encapsulation and decapsulation of tenant frames in Geneve over IPv4/UDP, the per-packet
//! work of the switch's egress and ingress engines (DESIGN.md section 4 "Overlay").
//!
//! Both directions are allocation-free: `encap` writes into a caller's buffer, `decap` borrows
//! the inner frame from the received one. The outer Ethernet, IPv4 and UDP headers are built
//! and sliced with etherparse.
//!
//! The outer UDP checksum is 0 ("no checksum"), which RFC 8926 section 3.3 allows for Geneve
//! over IPv4: the inner frame carries its own checksums, and computing one over a 1500-byte
//! frame would be the most expensive step of encapsulation. The outer IPv4 header checksum is
//! always correct, and `decap` verifies it. IPv6 outer headers are not supported (a zero UDP
//! checksum there needs the RFC 6935/6936 conditions), nor are VLAN tags on the outer frame.

use core::net::Ipv4Addr;

use etherparse::checksum::Sum16BitWords;
use etherparse::{
    EtherType, Ethernet2Header, Ethernet2Slice, IpNumber, Ipv4Header, Ipv4Slice, UdpHeader,
    UdpSlice,
};

use crate::error::from_len_error;
use crate::geneve::{GenevePacket, GeneveRepr, GENEVE_HEADER_LEN, GENEVE_UDP_PORT};
use crate::Error;

const ETHERNET_LEN: usize = Ethernet2Header::LEN;
const IPV4_LEN: usize = Ipv4Header::MIN_LEN;
const UDP_LEN: usize = UdpHeader::LEN;

/// Largest number of bytes [`encap`] adds to a tenant frame: outer Ethernet (14), IPv4 (20),
/// UDP (8), Geneve (8) and the feedback option (20). The feedback authentication option
/// (28 more) only travels in standalone feedback packets, which carry no tenant frame. An uplink whose IP MTU is the tenants'
/// IP MTU plus this many bytes never fragments tunnel packets (the inner Ethernet header's
/// 14 bytes take the place of the outer one's in that sum).
pub const ENCAP_OVERHEAD: usize =
    ETHERNET_LEN + IPV4_LEN + UDP_LEN + GENEVE_HEADER_LEN + crate::feedback::FEEDBACK_OPTION_LEN;

/// Bytes of the headers [`encap`] writes before the inner frame for this Geneve header.
pub fn encap_headers_len(geneve: &GeneveRepr) -> usize {
    ETHERNET_LEN + IPV4_LEN + UDP_LEN + geneve.buffer_len()
}

/// The outer headers of a tunnel packet from this host to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OuterHeaders {
    /// This host's uplink MAC address.
    pub src_mac: [u8; 6],
    /// The next hop's MAC address (the peer host or the gateway).
    pub dst_mac: [u8; 6],
    /// This host's tunnel IPv4 address.
    pub src_ip: Ipv4Addr,
    /// The peer host's tunnel IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// UDP source port: entropy from the inner flow so the fabric spreads flows over paths
    /// but keeps each in order (see [`entropy_source_port`]).
    pub src_port: u16,
    /// Outer IPv4 time to live.
    pub ttl: u8,
}

/// Maps a flow hash to a UDP source port in the dynamic range 49152..=65535, as RFC 8926
/// section 3.3 recommends for the Geneve source port.
pub fn entropy_source_port(flow_hash: u32) -> u16 {
    const DYNAMIC_START: u16 = 49152;
    DYNAMIC_START + (flow_hash % 16384) as u16
}

/// Writes the outer Ethernet, IPv4 (DF set, correct header checksum) and UDP headers and the
/// Geneve header for an inner frame of `inner_len` bytes into the start of `out`, and returns
/// their length ([`encap_headers_len`]). The inner frame goes right after them; this lets a
/// switch encapsulate in place by leaving that much headroom before a frame.
pub fn encap_headers(
    outer: &OuterHeaders,
    geneve: &GeneveRepr,
    inner_len: usize,
    out: &mut [u8],
) -> Result<usize, Error> {
    let headers_len = encap_headers_len(geneve);
    let udp_len = UDP_LEN + geneve.buffer_len() + inner_len;
    let udp_len_u16 = u16::try_from(udp_len).map_err(|_| Error::TooLarge)?;
    let mut ip = Ipv4Header::new(
        udp_len_u16,
        outer.ttl,
        IpNumber::UDP,
        outer.src_ip.octets(),
        outer.dst_ip.octets(),
    )
    .map_err(|_| Error::TooLarge)?;
    ip.header_checksum = ip.calc_header_checksum();
    let out = out.get_mut(..headers_len).ok_or(Error::BufferTooSmall {
        needed: headers_len,
    })?;
    let (eth_out, rest) = out.split_at_mut(ETHERNET_LEN);
    let (ip_out, rest) = rest.split_at_mut(IPV4_LEN);
    let (udp_out, geneve_out) = rest.split_at_mut(UDP_LEN);
    // Emit Geneve first: it is the only part that can still fail (VNI out of range).
    geneve.emit(geneve_out)?;
    let eth = Ethernet2Header {
        source: outer.src_mac,
        destination: outer.dst_mac,
        ether_type: EtherType::IPV4,
    };
    eth_out.copy_from_slice(&eth.to_bytes());
    ip_out.copy_from_slice(&ip.to_bytes());
    let udp = UdpHeader {
        source_port: outer.src_port,
        destination_port: GENEVE_UDP_PORT,
        length: udp_len_u16,
        checksum: 0,
    };
    udp_out.copy_from_slice(&udp.to_bytes());
    Ok(headers_len)
}

/// Encapsulates `inner_frame` (a tenant's Ethernet frame, or nothing for a standalone feedback
/// packet) into `out` as Ethernet/IPv4/UDP(6081)/Geneve and returns the frame length,
/// `encap_headers_len(geneve) + inner_frame.len()`.
pub fn encap(
    outer: &OuterHeaders,
    geneve: &GeneveRepr,
    inner_frame: &[u8],
    out: &mut [u8],
) -> Result<usize, Error> {
    let total = encap_headers_len(geneve) + inner_frame.len();
    let out = out
        .get_mut(..total)
        .ok_or(Error::BufferTooSmall { needed: total })?;
    let headers_len = encap_headers(outer, geneve, inner_frame.len(), out)?;
    out[headers_len..].copy_from_slice(inner_frame);
    Ok(total)
}

/// What [`decap`] found in a tunnel packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decapped<'a> {
    /// The sending host's tunnel address (where feedback about this traffic goes).
    pub outer_src_ip: Ipv4Addr,
    /// The outer UDP source port (the sender's flow entropy).
    pub outer_src_port: u16,
    /// The Geneve header: tenant (VNI), flags and feedback.
    pub geneve: GeneveRepr,
    /// The inner frame, borrowed from the received one (empty for standalone feedback).
    pub inner: &'a [u8],
}

/// Checks that `frame` is Ethernet/IPv4/UDP to port 6081 carrying a valid Geneve packet and
/// returns its metadata and inner frame. The outer IPv4 header checksum is verified; the UDP
/// checksum is not (see the module docs); outer fragments are refused.
pub fn decap(frame: &[u8]) -> Result<Decapped<'_>, Error> {
    tunnel_layout(frame).map(|(decapped, _)| decapped)
}

/// Where the headers of a checked tunnel packet start, as offsets into the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The outer IPv4 header (after the 14-byte Ethernet header).
    pub ip: usize,
    /// The outer UDP header.
    pub udp: usize,
    /// The Geneve header.
    pub geneve: usize,
    /// The Geneve payload (the inner frame).
    pub inner: usize,
    /// The end of the UDP datagram (Ethernet padding excluded).
    pub end: usize,
}

/// [`decap`] plus the offsets of every header, for the in-place sealing of [`crate::seal`].
pub(crate) fn tunnel_layout(frame: &[u8]) -> Result<(Decapped<'_>, Layout), Error> {
    let eth = Ethernet2Slice::from_slice_without_fcs(frame).map_err(|e| from_len_error(&e))?;
    if eth.ether_type() != EtherType::IPV4 {
        return Err(Error::NotGeneve);
    }
    let ip = Ipv4Slice::from_slice(eth.payload_slice()).map_err(|e| match e {
        etherparse::err::ipv4::SliceError::Len(len) => from_len_error(&len),
        etherparse::err::ipv4::SliceError::Header(_) => Error::Malformed("outer IPv4 header"),
        etherparse::err::ipv4::SliceError::Exts(_) => {
            Error::Malformed("outer IPv4 authentication header")
        }
    })?;
    let header = ip.header();
    if Sum16BitWords::new()
        .add_slice(header.slice())
        .ones_complement()
        != 0
    {
        return Err(Error::BadChecksum);
    }
    let payload = ip.payload();
    if payload.fragmented {
        return Err(Error::Fragmented);
    }
    if payload.ip_number != IpNumber::UDP {
        return Err(Error::NotGeneve);
    }
    let udp = UdpSlice::from_slice(payload.payload).map_err(|e| from_len_error(&e))?;
    if udp.destination_port() != GENEVE_UDP_PORT {
        return Err(Error::NotGeneve);
    }
    let geneve_bytes = udp.payload();
    let packet = GenevePacket::new_checked(geneve_bytes)?;
    let geneve = GeneveRepr::parse(&packet)?;
    let offset_of = |part: &[u8]| part.as_ptr() as usize - frame.as_ptr() as usize;
    let geneve_at = offset_of(geneve_bytes);
    let layout = Layout {
        ip: ETHERNET_LEN,
        udp: offset_of(udp.slice()),
        geneve: geneve_at,
        inner: geneve_at + packet.header_len(),
        end: geneve_at + geneve_bytes.len(),
    };
    let decapped = Decapped {
        outer_src_ip: header.source_addr(),
        outer_src_port: udp.source_port(),
        geneve,
        inner: &geneve_bytes[packet.header_len()..],
    };
    Ok((decapped, layout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feedback::FeedbackOption;
    use crate::geneve::standalone_feedback;

    fn outer() -> OuterHeaders {
        OuterHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(198, 18, 0, 1),
            dst_ip: Ipv4Addr::new(198, 18, 0, 2),
            src_port: entropy_source_port(12345),
            ttl: 64,
        }
    }

    #[test]
    fn overhead_is_seventy_bytes() {
        let with_feedback = GeneveRepr {
            feedback: Some(FeedbackOption {
                dst_endpoint: 1,
                rate_bps: 2,
                seq: 3,
            }),
            ..GeneveRepr::ethernet(5)
        };
        assert_eq!(ENCAP_OVERHEAD, 70);
        assert_eq!(encap_headers_len(&with_feedback), ENCAP_OVERHEAD);
        assert_eq!(encap_headers_len(&GeneveRepr::ethernet(5)), 50);
    }

    #[test]
    fn encap_writes_what_etherparse_reads() {
        let inner = [0xABu8; 100];
        let geneve = GeneveRepr::ethernet(77);
        let mut out = [0u8; 256];
        let len = encap(&outer(), &geneve, &inner, &mut out).unwrap();
        assert_eq!(len, 150);
        let parsed = etherparse::SlicedPacket::from_ethernet(&out[..len]).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = parsed.net else {
            panic!("no IPv4")
        };
        let ip_header = ip.header().to_header();
        assert_eq!(ip_header.header_checksum, ip_header.calc_header_checksum());
        assert!(ip_header.dont_fragment);
        assert_eq!(usize::from(ip_header.total_len), len - 14);
        let Some(etherparse::TransportSlice::Udp(udp)) = parsed.transport else {
            panic!("no UDP")
        };
        assert_eq!(udp.destination_port(), 6081);
        assert_eq!(udp.checksum(), 0);
        assert_eq!(&udp.payload()[8..], &inner[..]);
    }

    #[test]
    fn standalone_feedback_round_trips_with_empty_inner() {
        let fb = FeedbackOption {
            dst_endpoint: 9,
            rate_bps: 123_456_789,
            seq: 1,
        };
        let mut out = [0u8; 128];
        let len = encap(&outer(), &standalone_feedback(3, fb), &[], &mut out).unwrap();
        assert_eq!(len, ENCAP_OVERHEAD);
        let d = decap(&out[..len]).unwrap();
        assert!(d.geneve.is_standalone_feedback());
        assert!(d.geneve.oam);
        assert_eq!(d.geneve.feedback, Some(fb));
        assert!(d.inner.is_empty());
        // Ethernet padding to the 60-byte minimum does not leak into the inner frame.
        let mut padded = [0u8; 128];
        let plain = encap(&outer(), &GeneveRepr::ethernet(3), &[], &mut padded).unwrap();
        assert_eq!(decap(&padded[..plain.max(60)]).unwrap().inner, &[] as &[u8]);
    }

    #[test]
    fn decap_rejects_non_geneve_and_bad_checksum() {
        let mut out = [0u8; 256];
        let len = encap(&outer(), &GeneveRepr::ethernet(1), &[1, 2, 3, 4], &mut out).unwrap();
        let mut wrong_port = out;
        wrong_port[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&4789u16.to_be_bytes());
        assert_eq!(decap(&wrong_port[..len]), Err(Error::NotGeneve));
        let mut bad_sum = out;
        bad_sum[14 + 8] ^= 1; // TTL
        assert_eq!(decap(&bad_sum[..len]), Err(Error::BadChecksum));
        assert_eq!(decap(&out[..len - 1]), Err(Error::Truncated));
        assert_eq!(decap(&out[..10]), Err(Error::Truncated));
    }

    #[test]
    fn encap_errors() {
        let mut small = [0u8; 60];
        assert_eq!(
            encap(&outer(), &GeneveRepr::ethernet(1), &[0; 20], &mut small),
            Err(Error::BufferTooSmall { needed: 70 })
        );
        let huge = vec![0u8; 65_535];
        let mut out = vec![0u8; 70_000];
        assert_eq!(
            encap(&outer(), &GeneveRepr::ethernet(1), &huge, &mut out),
            Err(Error::TooLarge)
        );
    }
}
