//! The cheap pre-scheduler classification of a tenant frame (DESIGN.md section 4 "Cheap
//! before expensive"): read just enough of the headers to find who sent the frame and where it
//! goes, with bounded work and no copies beyond the fields themselves.
//!
//! Frames are untagged Ethernet II. A VLAN-tagged frame classifies as [`Network::Other`] with
//! its TPID as `ether_type`. Checksums are not verified here; that is later, expensive work.

use core::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    ArpHardwareId, ArpOperation, ArpPacketSlice, EtherType, Ethernet2Slice, IpNumber,
    IpPayloadSlice, Ipv4Slice, Ipv6Slice, TcpHeaderSlice, UdpHeaderSlice,
};

use crate::error::from_len_error;
use crate::Error;

/// The headers of a tenant frame that classification, anti-spoofing and flow hashing need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameSummary {
    /// Destination MAC address.
    pub dst_mac: [u8; 6],
    /// Source MAC address.
    pub src_mac: [u8; 6],
    /// EtherType of the Ethernet II header.
    pub ether_type: EtherType,
    /// What the network layer holds.
    pub network: Network,
}

/// The network-layer part of a [`FrameSummary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Network {
    /// IPv4, addresses and the protocol after any authentication header.
    Ipv4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Transport protocol.
        protocol: IpNumber,
        /// TCP or UDP ports; `None` for other protocols and for every fragment.
        ports: Option<Ports>,
    },
    /// IPv6, addresses and the protocol after the extension headers.
    Ipv6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// Transport protocol.
        protocol: IpNumber,
        /// TCP or UDP ports; `None` for other protocols and for every fragment.
        ports: Option<Ports>,
    },
    /// ARP for IPv4 over Ethernet.
    Arp(ArpSummary),
    /// Any other EtherType; nothing beyond the Ethernet header was read.
    Other,
}

/// Transport ports of a TCP or UDP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ports {
    /// Source port.
    pub src: u16,
    /// Destination port.
    pub dst: u16,
}

/// The fields of an Ethernet/IPv4 ARP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArpSummary {
    /// Request, reply, ...
    pub operation: ArpOperation,
    /// Sender hardware address (what anti-spoofing compares with the port's MAC).
    pub sender_mac: [u8; 6],
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address.
    pub target_mac: [u8; 6],
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

/// Classifies a tenant's Ethernet frame. Fails on a frame too short for its Ethernet header,
/// on a malformed or truncated IPv4/IPv6/TCP/UDP header, and on ARP that is not Ethernet/IPv4;
/// unknown EtherTypes succeed as [`Network::Other`].
pub fn classify(frame: &[u8]) -> Result<FrameSummary, Error> {
    let eth = Ethernet2Slice::from_slice_without_fcs(frame).map_err(|e| from_len_error(&e))?;
    let payload = eth.payload_slice();
    let network = match eth.ether_type() {
        EtherType::IPV4 => {
            let ip = Ipv4Slice::from_slice(payload).map_err(|e| match e {
                etherparse::err::ipv4::SliceError::Len(len) => from_len_error(&len),
                _ => Error::Malformed("IPv4 header"),
            })?;
            let header = ip.header();
            Network::Ipv4 {
                src: header.source_addr(),
                dst: header.destination_addr(),
                protocol: ip.payload().ip_number,
                ports: ports(ip.payload())?,
            }
        }
        EtherType::IPV6 => {
            let ip = Ipv6Slice::from_slice(payload).map_err(|e| match e {
                etherparse::err::ipv6::SliceError::Len(len) => from_len_error(&len),
                _ => Error::Malformed("IPv6 header"),
            })?;
            let header = ip.header();
            Network::Ipv6 {
                src: header.source_addr(),
                dst: header.destination_addr(),
                protocol: ip.payload().ip_number,
                ports: ports(ip.payload())?,
            }
        }
        EtherType::ARP => Network::Arp(arp(payload)?),
        _ => Network::Other,
    };
    Ok(FrameSummary {
        dst_mac: eth.destination(),
        src_mac: eth.source(),
        ether_type: eth.ether_type(),
        network,
    })
}

/// Ports of an unfragmented TCP or UDP payload.
fn ports(ip_payload: &IpPayloadSlice<'_>) -> Result<Option<Ports>, Error> {
    if ip_payload.fragmented {
        return Ok(None);
    }
    let bytes = ip_payload.payload;
    let ports = match ip_payload.ip_number {
        IpNumber::UDP => {
            let udp = UdpHeaderSlice::from_slice(bytes).map_err(|e| from_len_error(&e))?;
            Ports {
                src: udp.source_port(),
                dst: udp.destination_port(),
            }
        }
        IpNumber::TCP => {
            let tcp = TcpHeaderSlice::from_slice(bytes).map_err(|e| match e {
                etherparse::err::tcp::HeaderSliceError::Len(len) => from_len_error(&len),
                etherparse::err::tcp::HeaderSliceError::Content(_) => {
                    Error::Malformed("TCP header")
                }
            })?;
            Ports {
                src: tcp.source_port(),
                dst: tcp.destination_port(),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(ports))
}

fn arp(payload: &[u8]) -> Result<ArpSummary, Error> {
    let arp = ArpPacketSlice::from_slice(payload).map_err(|e| from_len_error(&e))?;
    let is_eth_ipv4 = arp.hw_addr_type() == ArpHardwareId::ETHERNET
        && arp.proto_addr_type() == EtherType::IPV4
        && arp.hw_addr_size() == 6
        && arp.proto_addr_size() == 4;
    let not_eth_ipv4 = Error::Malformed("ARP packet (only Ethernet/IPv4 ARP is accepted)");
    if !is_eth_ipv4 {
        return Err(not_eth_ipv4);
    }
    let mac = |s: &[u8]| <[u8; 6]>::try_from(s).map_err(|_| not_eth_ipv4);
    let ip = |s: &[u8]| {
        <[u8; 4]>::try_from(s)
            .map(Ipv4Addr::from)
            .map_err(|_| not_eth_ipv4)
    };
    Ok(ArpSummary {
        operation: arp.operation(),
        sender_mac: mac(arp.sender_hw_addr())?,
        sender_ip: ip(arp.sender_protocol_addr())?,
        target_mac: mac(arp.target_hw_addr())?,
        target_ip: ip(arp.target_protocol_addr())?,
    })
}

impl FrameSummary {
    /// A deterministic hash of the frame's flow: the 5-tuple for TCP/UDP, addresses and
    /// protocol for other IP packets, MACs and EtherType otherwise. Both fragments and whole
    /// packets of an IP flow without ports hash alike. Feed it to
    /// [`crate::entropy_source_port`] for the outer UDP source port.
    pub fn flow_hash(&self) -> u32 {
        let mut hash = FlowHasher::default();
        match self.network {
            Network::Ipv4 {
                src,
                dst,
                protocol,
                ports,
            } => {
                hash.add(u64::from(src.to_bits()) << 32 | u64::from(dst.to_bits()));
                hash.add_l4(protocol, ports);
            }
            Network::Ipv6 {
                src,
                dst,
                protocol,
                ports,
            } => {
                let (src, dst) = (src.to_bits(), dst.to_bits());
                for word in [src >> 64, src, dst >> 64, dst] {
                    hash.add(word as u64);
                }
                hash.add_l4(protocol, ports);
            }
            Network::Arp(_) | Network::Other => {
                let mut macs = [0u8; 16];
                macs[..6].copy_from_slice(&self.src_mac);
                macs[6..12].copy_from_slice(&self.dst_mac);
                macs[12..14].copy_from_slice(&self.ether_type.0.to_be_bytes());
                hash.add(u128::from_be_bytes(macs) as u64);
                hash.add((u128::from_be_bytes(macs) >> 64) as u64);
            }
        }
        hash.finish()
    }
}

/// Multiply-rotate word hashing (the FxHash step) with a final avalanche; not for hash tables
/// facing adversaries, only for spreading flows over paths.
#[derive(Default)]
struct FlowHasher(u64);

impl FlowHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn add_l4(&mut self, protocol: IpNumber, ports: Option<Ports>) {
        let ports = ports.map_or(0, |p| u64::from(p.src) << 16 | u64::from(p.dst));
        self.add(u64::from(protocol.0) << 32 | ports);
    }

    fn finish(&self) -> u32 {
        // Fold with a murmur3 finaliser so every input bit reaches the low bits.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        (h ^ (h >> 32)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    fn udp_frame(src_port: u16, dst_port: u16) -> Vec<u8> {
        let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([198, 18, 1, 1], [198, 18, 1, 2], 64)
            .udp(src_port, dst_port);
        let mut frame = Vec::new();
        builder.write(&mut frame, &[0u8; 18]).unwrap();
        frame
    }

    #[test]
    fn udp_over_ipv4() {
        let summary = classify(&udp_frame(1000, 53)).unwrap();
        assert_eq!(summary.src_mac, [2, 0, 0, 0, 0, 1]);
        assert_eq!(summary.dst_mac, [2, 0, 0, 0, 0, 2]);
        assert_eq!(summary.ether_type, EtherType::IPV4);
        assert_eq!(
            summary.network,
            Network::Ipv4 {
                src: Ipv4Addr::new(198, 18, 1, 1),
                dst: Ipv4Addr::new(198, 18, 1, 2),
                protocol: IpNumber::UDP,
                ports: Some(Ports { src: 1000, dst: 53 }),
            }
        );
    }

    #[test]
    fn tcp_over_ipv6() {
        let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6([1; 16], [2; 16], 64)
            .tcp(40000, 80, 1, 1000);
        let mut frame = Vec::new();
        builder.write(&mut frame, b"GET /").unwrap();
        let summary = classify(&frame).unwrap();
        assert_eq!(
            summary.network,
            Network::Ipv6 {
                src: Ipv6Addr::from([1; 16]),
                dst: Ipv6Addr::from([2; 16]),
                protocol: IpNumber::TCP,
                ports: Some(Ports {
                    src: 40000,
                    dst: 80
                }),
            }
        );
    }

    #[test]
    fn arp_request() {
        let arp = etherparse::ArpPacket::new(
            ArpHardwareId::ETHERNET,
            EtherType::IPV4,
            ArpOperation::REQUEST,
            &[2, 0, 0, 0, 0, 1],
            &[198, 18, 1, 1],
            &[0; 6],
            &[198, 18, 1, 2],
        )
        .unwrap();
        let mut frame = vec![0xFF; 6];
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        frame.extend_from_slice(&arp.to_bytes());
        let summary = classify(&frame).unwrap();
        assert_eq!(
            summary.network,
            Network::Arp(ArpSummary {
                operation: ArpOperation::REQUEST,
                sender_mac: [2, 0, 0, 0, 0, 1],
                sender_ip: Ipv4Addr::new(198, 18, 1, 1),
                target_mac: [0; 6],
                target_ip: Ipv4Addr::new(198, 18, 1, 2),
            })
        );
    }

    #[test]
    fn fragments_have_no_ports_and_errors_are_values() {
        let mut frame = udp_frame(1, 2);
        frame[14 + 6] |= 0x20; // more fragments
        let summary = classify(&frame).unwrap();
        assert!(matches!(summary.network, Network::Ipv4 { ports: None, .. }));

        let frame = udp_frame(1, 2);
        assert_eq!(classify(&frame[..13]), Err(Error::Truncated));
        assert_eq!(classify(&frame[..30]), Err(Error::Truncated));
        let mut bad_ihl = frame.clone();
        bad_ihl[14] = 0x44;
        assert_eq!(classify(&bad_ihl), Err(Error::Malformed("IPv4 header")));
        let mut other = frame;
        other[12..14].copy_from_slice(&[0x88, 0xB5]);
        assert_eq!(classify(&other).unwrap().network, Network::Other);
    }

    #[test]
    fn flow_hash_separates_flows_and_is_stable() {
        let a = classify(&udp_frame(1000, 53)).unwrap();
        let b = classify(&udp_frame(1001, 53)).unwrap();
        assert_eq!(
            a.flow_hash(),
            classify(&udp_frame(1000, 53)).unwrap().flow_hash()
        );
        assert_ne!(a.flow_hash(), b.flow_hash());
    }
}
