//! Simulated packets are real frames: tenant Ethernet/IPv4/UDP or TCP frames built with
//! etherparse, carrying the simulator's per-packet metadata (application, kind, sequence,
//! send time) in the first payload bytes. The switch's engines encapsulate, schedule and
//! decapsulate these bytes exactly as they would on a host.

use etherparse::{
    EtherType, Ethernet2Header, IpEcn, IpNumber, Ipv4Header, Ipv4HeaderSlice, TcpHeader, UdpHeader,
};
use picnic_switch::frame::Frame;

/// Bytes of metadata at the start of every payload; smaller payloads are padded to this.
pub const META_LEN: usize = 32;
const ETH: usize = 14;
const IPV4: usize = 20;

/// What a packet is to the application that sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// UDP datagram or TCP segment carrying data.
    Data = 0,
    /// TCP acknowledgement.
    Ack = 1,
    /// RPC request.
    Request = 2,
    /// RPC response.
    Response = 3,
}

/// The simulator's per-packet metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Application (connection) index.
    pub app: u32,
    /// Packet kind.
    pub kind: Kind,
    /// ECN-echo on an ACK (DCTCP).
    pub ece: bool,
    /// Sequence number (segment or request index; an ACK's cumulative ack).
    pub seq: u64,
    /// When the original was sent, ns (echoed by ACKs and responses).
    pub sent_ns: u64,
    /// An ACK's selective acknowledgement: the first segment of its SACK block.
    pub sack: u64,
    /// Segments in the SACK block (0: none).
    pub sack_len: u16,
}

/// Transport of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// UDP.
    Udp,
    /// TCP (headers are real; the model's state lives in the metadata).
    Tcp,
}

/// Addresses of a VM as seen on its port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    /// MAC.
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ip: [u8; 4],
}

/// Writes a tenant frame `src -> dst` with `payload` bytes of payload (at least
/// [`META_LEN`]) into `frame`; `ect` marks it ECN-capable. Returns false if it does not fit.
#[allow(clippy::too_many_arguments)]
pub fn build(
    frame: &mut Frame,
    src: Addr,
    dst: Addr,
    proto: Proto,
    ports: (u16, u16),
    payload: usize,
    ect: bool,
    meta: &Meta,
) -> bool {
    let payload = payload.max(META_LEN);
    let l4 = match proto {
        Proto::Udp => UdpHeader::LEN,
        Proto::Tcp => TcpHeader::MIN_LEN,
    };
    let total = ETH + IPV4 + l4 + payload;
    let buf = frame.buf_for_rx();
    if total > buf.len() {
        return false;
    }
    let eth = Ethernet2Header {
        destination: dst.mac,
        source: src.mac,
        ether_type: EtherType::IPV4,
    };
    buf[..ETH].copy_from_slice(&eth.to_bytes());
    let ip_number = match proto {
        Proto::Udp => IpNumber::UDP,
        Proto::Tcp => IpNumber::TCP,
    };
    let Ok(mut ip) = Ipv4Header::new((l4 + payload) as u16, 64, ip_number, src.ip, dst.ip) else {
        return false;
    };
    ip.ecn = if ect {
        etherparse::IpEcn::Ect0
    } else {
        etherparse::IpEcn::NotEct
    };
    ip.header_checksum = ip.calc_header_checksum();
    buf[ETH..ETH + IPV4].copy_from_slice(&ip.to_bytes());
    let at = ETH + IPV4;
    match proto {
        Proto::Udp => {
            let udp = UdpHeader {
                source_port: ports.0,
                destination_port: ports.1,
                length: (UdpHeader::LEN + payload) as u16,
                checksum: 0,
            };
            buf[at..at + l4].copy_from_slice(&udp.to_bytes());
        }
        Proto::Tcp => {
            let mut tcp = TcpHeader::new(ports.0, ports.1, meta.seq as u32, 65535);
            tcp.ack = true;
            tcp.psh = meta.kind != Kind::Ack;
            tcp.acknowledgment_number = meta.seq as u32;
            tcp.ece = meta.ece;
            buf[at..at + l4].copy_from_slice(&tcp.to_bytes());
        }
    }
    let p = &mut buf[at + l4..total];
    p[..4].copy_from_slice(&meta.app.to_le_bytes());
    p[4] = meta.kind as u8;
    p[5] = meta.ece as u8;
    p[6..8].copy_from_slice(&meta.sack_len.to_le_bytes());
    p[8..16].copy_from_slice(&meta.seq.to_le_bytes());
    p[16..24].copy_from_slice(&meta.sent_ns.to_le_bytes());
    p[24..32].copy_from_slice(&meta.sack.to_le_bytes());
    p[32..].fill(0);
    frame.set_len(total);
    true
}

/// Reads the metadata of a tenant frame and whether it arrived marked CE.
pub fn parse(frame: &[u8]) -> Option<(Meta, bool)> {
    if frame.len() < ETH + IPV4 {
        return None;
    }
    let ip = &frame[ETH..];
    let l4 = match ip[9] {
        17 => UdpHeader::LEN,
        6 => TcpHeader::MIN_LEN,
        _ => return None,
    };
    let p = frame.get(ETH + IPV4 + l4..ETH + IPV4 + l4 + META_LEN)?;
    let kind = match p[4] {
        0 => Kind::Data,
        1 => Kind::Ack,
        2 => Kind::Request,
        3 => Kind::Response,
        _ => return None,
    };
    let meta = Meta {
        app: u32::from_le_bytes(p[..4].try_into().ok()?),
        kind,
        ece: p[5] != 0,
        seq: u64::from_le_bytes(p[8..16].try_into().ok()?),
        sent_ns: u64::from_le_bytes(p[16..24].try_into().ok()?),
        sack: u64::from_le_bytes(p[24..32].try_into().ok()?),
        sack_len: u16::from_le_bytes(p[6..8].try_into().ok()?),
    };
    Some((meta, ip[1] & 3 == 3))
}

/// Offset of the inner frame in a Geneve data packet (picnic-wire's `decap`: outer
/// Ethernet/IPv4/UDP 6081, Geneve with options), or None for standalone feedback and
/// non-tunnel frames.
fn inner_offset(outer: &[u8]) -> Option<usize> {
    let inner = picnic_wire::decap(outer).ok()?.inner;
    // `inner` borrows from `outer`: its start is the offset.
    let at = inner.as_ptr() as usize - outer.as_ptr() as usize;
    (inner.len() >= ETH + IPV4).then_some(at)
}

/// ECN field of the IPv4 header at the start of `ip`, if it is one.
fn ipv4_ecn(ip: &[u8]) -> Option<IpEcn> {
    Some(Ipv4HeaderSlice::from_slice(ip).ok()?.ecn())
}

/// RFC 6040 encapsulation, done by the simulated NIC: the inner ECN field is copied to the
/// outer header so fabric switches can mark it.
pub fn copy_ecn_out(outer: &mut [u8]) {
    let Some(at) = inner_offset(outer) else {
        return;
    };
    let Some(ecn) = ipv4_ecn(&outer[at + ETH..]).filter(|e| *e != IpEcn::NotEct) else {
        return;
    };
    let Ok(header) = Ipv4HeaderSlice::from_slice(&outer[ETH..]) else {
        return;
    };
    let mut header = header.to_header();
    header.ecn = ecn;
    header.header_checksum = header.calc_header_checksum();
    outer[ETH..ETH + header.header_len()].copy_from_slice(&header.to_bytes());
}

/// RFC 6040 decapsulation, done by the simulated NIC: CE on the outer header is copied to an
/// ECN-capable inner header.
pub fn copy_ce_in(outer: &mut [u8]) {
    if outer.len() < ETH || ipv4_ecn(&outer[ETH..]) != Some(IpEcn::CongestionExperienced) {
        return;
    }
    if let Some(at) = inner_offset(outer) {
        picnic_wire::ecn::mark_ce(&mut outer[at..]);
    }
}

/// The local host index encoded in an underlay MAC (`02:70:68:00:HH:HH`, lab topology).
pub fn host_of_mac(mac: &[u8]) -> u32 {
    u32::from(mac[4]) << 8 | u32::from(mac[5])
}

/// Flow hash of an outer packet for ECMP: underlay addresses and the entropy source port.
pub fn outer_flow_hash(outer: &[u8]) -> u32 {
    if outer.len() < ETH + IPV4 + 4 {
        return 0;
    }
    let mut h: u32 = 0x811c_9dc5;
    for &b in outer[ETH + 12..ETH + 20]
        .iter()
        .chain(&outer[ETH + IPV4..ETH + IPV4 + 2])
    {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use picnic_switch::frame::FramePool;

    #[test]
    fn metadata_round_trips_through_udp_and_tcp_frames() {
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        let a = Addr {
            mac: [2, 0, 0, 0, 0, 1],
            ip: [10, 0, 0, 1],
        };
        let b = Addr {
            mac: [2, 0, 0, 0, 0, 2],
            ip: [10, 0, 0, 2],
        };
        for proto in [Proto::Udp, Proto::Tcp] {
            let meta = Meta {
                app: 7,
                kind: Kind::Ack,
                ece: true,
                seq: 1 << 40,
                sent_ns: 123,
                sack: 9,
                sack_len: 3,
            };
            assert!(build(&mut f, a, b, proto, (1, 2), 10, true, &meta));
            assert_eq!(
                f.len(),
                14 + 20 + if proto == Proto::Udp { 8 } else { 20 } + META_LEN
            );
            let summary = picnic_wire::classify::classify(f.data()).unwrap();
            assert_eq!(summary.dst_mac, b.mac);
            assert_eq!(parse(f.data()), Some((meta, false)));
        }
    }

    #[test]
    fn the_ecmp_hash_covers_outer_addresses_and_entropy_port_only() {
        // Outer Ethernet, IPv4 (src 198.18.0.1, dst 198.18.0.2), UDP 50000 -> 6081.
        let mut outer = vec![0u8; ETH + IPV4 + 8];
        outer[ETH + 12..ETH + 20].copy_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        outer[ETH + IPV4..ETH + IPV4 + 4].copy_from_slice(&[0xc3, 0x50, 0x17, 0xc1]);
        // FNV-1a over the 10 bytes, written out.
        let mut fnv: u32 = 0x811c_9dc5;
        for b in [198, 18, 0, 1, 198, 18, 0, 2, 0xc3, 0x50] {
            fnv = (fnv ^ b).wrapping_mul(0x0100_0193);
        }
        let h = outer_flow_hash(&outer);
        assert_eq!(h, fnv);
        // The destination port, MACs, TTL and payload do not move a flow.
        let mut same = outer.clone();
        same[0] = 9;
        same[ETH + 8] = 1;
        same[ETH + IPV4 + 3] = 0;
        same.extend_from_slice(&[1, 2, 3]);
        assert_eq!(outer_flow_hash(&same), h);
        // The entropy port and either address do.
        for at in [ETH + IPV4 + 1, ETH + 12, ETH + 19] {
            let mut other = outer.clone();
            other[at] ^= 1;
            assert_ne!(outer_flow_hash(&other), h, "byte {at}");
        }
        assert_eq!(outer_flow_hash(&outer[..ETH + IPV4 + 3]), 0, "too short");
    }

    /// A tunnel packet around a tenant UDP frame (`ect`: ECN-capable, `ce`: and already
    /// marked, as a filling limiter does before encapsulation), with a feedback option so
    /// the inner frame does not start at a fixed offset.
    fn tunnel(ect: bool, ce: bool) -> Vec<u8> {
        use picnic_wire::{FeedbackOption, GeneveRepr, OuterHeaders};
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        let a = Addr {
            mac: [2, 0, 0, 0, 0, 1],
            ip: [10, 0, 0, 1],
        };
        let meta = Meta {
            app: 1,
            kind: Kind::Data,
            ece: false,
            seq: 5,
            sent_ns: 0,
            sack: 0,
            sack_len: 0,
        };
        assert!(build(&mut f, a, a, Proto::Udp, (1, 2), 100, ect, &meta));
        if ce {
            assert!(picnic_wire::ecn::mark_ce(f.data_mut()));
        }
        let outer = OuterHeaders {
            src_mac: [2, 0x70, 0x68, 0, 0, 1],
            dst_mac: [2, 0x70, 0x68, 0, 0, 2],
            src_ip: [198, 18, 0, 1].into(),
            dst_ip: [198, 18, 0, 2].into(),
            src_port: 50000,
            ttl: 64,
        };
        let geneve = GeneveRepr {
            feedback: Some(FeedbackOption {
                dst_endpoint: 1,
                rate_bps: 2,
                seq: 3,
            }),
            ..GeneveRepr::ethernet(7)
        };
        let mut out = vec![0; 2048];
        let n = picnic_wire::encap(&outer, &geneve, f.data(), &mut out).unwrap();
        out.truncate(n);
        out
    }

    /// Whether the inner frame is marked CE, through the switch's own decapsulation (which
    /// also verifies the outer checksum).
    fn inner_ce(outer: &[u8]) -> bool {
        parse(picnic_wire::decap(outer).unwrap().inner).unwrap().1
    }

    #[test]
    fn the_nic_carries_ecn_out_to_the_outer_header_and_ce_back_in() {
        let outer_ecn = |p: &[u8]| ipv4_ecn(&p[ETH..]).unwrap();
        let mut p = tunnel(true, false);
        assert_eq!(outer_ecn(&p), IpEcn::NotEct);
        copy_ecn_out(&mut p);
        assert_eq!(outer_ecn(&p), IpEcn::Ect0);
        assert!(!inner_ce(&p));
        copy_ce_in(&mut p);
        assert!(!inner_ce(&p), "ECT outside is no congestion");
        // A switch marks the outer header; the receiving NIC copies CE inside.
        assert!(picnic_wire::ecn::mark_ce(&mut p));
        copy_ce_in(&mut p);
        assert_eq!(outer_ecn(&p), IpEcn::CongestionExperienced);
        assert!(inner_ce(&p));
        // Marked before encapsulation: the outer header starts out CE.
        let mut p = tunnel(true, true);
        copy_ecn_out(&mut p);
        assert_eq!(outer_ecn(&p), IpEcn::CongestionExperienced);
        assert!(inner_ce(&p));
        // Not ECN-capable inside: nothing is copied out, and CE is not copied in.
        let mut p = tunnel(false, false);
        let before = p.clone();
        copy_ecn_out(&mut p);
        assert_eq!(p, before);
        let ce = |p: &mut [u8]| p[ETH + 1] |= 3;
        ce(&mut p);
        let marked = p.clone();
        copy_ce_in(&mut p);
        assert_eq!(p, marked);
        // Standalone feedback and short frames have no inner frame to touch.
        let mut short = before[..ETH + IPV4 + 8].to_vec();
        let copy = short.clone();
        copy_ecn_out(&mut short);
        copy_ce_in(&mut short);
        assert_eq!(short, copy);
    }
}
