//! A VM's transmit offloads, finished in software, sans-I/O: the virtio-net header that TAP
//! (`IFF_VNET_HDR`) and AF_PACKET (`PACKET_VNET_HDR`) put before every frame
//! (`struct virtio_net_hdr`, linux/virtio_net.h; virtio 1.2 section 5.1.6), completion of a
//! partial checksum (`VIRTIO_NET_HDR_F_NEEDS_CSUM`) and segmentation of TSO/USO
//! super-frames into frames that fit the port's limit.
//!
//! - [`VnetHdr`]: the 10-byte header, parsed and emitted in the host's byte order (legacy
//!   virtio, which both TAP without `TUNSETVNETLE/BE` and AF_PACKET use).
//! - [`complete_checksum`]: what the kernel's `skb_checksum_help` does: the RFC 1071 sum
//!   from `csum_start` to the end, whose checksum field already holds the pseudo-header sum,
//!   complemented and stored at `csum_start + csum_offset` (a zero result is sent as 0xffff).
//! - [`Segmenter`]: what Linux's `tcp_gso_segment` / `__udp_gso_segment` do, one segment at
//!   a time into a caller's buffer: headers copied, IPv4 total length / IPv6 payload length
//!   set, the IPv4 id incremented per segment and its header checksum recomputed; TCP sequence
//!   numbers advanced, FIN and PSH kept on the last segment only, CWR on the first only (RFC
//!   3168 6.1.2); every L4 checksum computed in full (RFC 793, RFC 768, RFC 8200 8.1).
//!
//! Every input is untrusted (a VM builds it): nothing here panics or reads out of bounds on
//! any bytes; bad input is an [`Error`].

use crate::Error;

/// Bytes of `struct virtio_net_hdr` (without the `num_buffers` of the mergeable variant).
pub const VNET_HDR_LEN: usize = 10;

/// The longest super-frame a virtio-net device hands over: an Ethernet header, an IPv6
/// header and the 65535 bytes its payload length allows (IPv4's total length allows less).
pub const GSO_MAX_FRAME: usize = 14 + 40 + 65535;

/// Smallest `gso_size` accepted: it bounds a super-frame to about 1000 segments, so a VM
/// cannot make one frame cost the switch tens of thousands of segments.
pub const MIN_GSO_SIZE: usize = 64;

const NEEDS_CSUM: u8 = 1;
const GSO_ECN: u8 = 0x80;
const ETHERNET_LEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// What kind of super-frame a virtio-net header announces (`gso_type` without the ECN bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GsoType {
    /// An ordinary frame (`VIRTIO_NET_HDR_GSO_NONE`).
    None,
    /// TCP over IPv4 to be segmented (`VIRTIO_NET_HDR_GSO_TCPV4`, TSO).
    TcpV4,
    /// TCP over IPv6 to be segmented (`VIRTIO_NET_HDR_GSO_TCPV6`).
    TcpV6,
    /// UDP datagrams of `gso_size` bytes each (`VIRTIO_NET_HDR_GSO_UDP_L4`, USO).
    UdpL4,
}

/// A parsed `struct virtio_net_hdr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum is partial (`csum_start`,
    /// `csum_offset` say where).
    pub needs_csum: bool,
    /// The kind of super-frame.
    pub gso: GsoType,
    /// `VIRTIO_NET_HDR_GSO_ECN`: the TCP super-frame had CWR set.
    pub ecn: bool,
    /// Length of the headers (a hint; segmentation parses them itself).
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Offset from the frame's start at which checksumming starts.
    pub csum_start: u16,
    /// Offset after `csum_start` of the checksum field.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// The header of an ordinary, complete frame: all zero.
    pub const NONE: VnetHdr = VnetHdr {
        needs_csum: false,
        gso: GsoType::None,
        ecn: false,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
    };

    /// Parses the first [`VNET_HDR_LEN`] bytes of `b`. Unknown GSO types (including the
    /// obsolete UFO) and unknown flags are refused; `DATA_VALID` and `RSC_INFO` are ignored.
    pub fn parse(b: &[u8]) -> Result<VnetHdr, Error> {
        let b: &[u8; VNET_HDR_LEN] = b
            .get(..VNET_HDR_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(Error::Truncated)?;
        let word = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let gso = match b[1] & !GSO_ECN {
            0 => GsoType::None,
            1 => GsoType::TcpV4,
            4 => GsoType::TcpV6,
            5 => GsoType::UdpL4,
            _ => return Err(Error::Malformed("virtio-net gso_type")),
        };
        Ok(VnetHdr {
            needs_csum: b[0] & NEEDS_CSUM != 0,
            gso,
            ecn: b[1] & GSO_ECN != 0,
            hdr_len: word(2),
            gso_size: word(4),
            csum_start: word(6),
            csum_offset: word(8),
        })
    }

    /// The header's [`VNET_HDR_LEN`] bytes (as a device would hand them over).
    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let gso = match self.gso {
            GsoType::None => 0,
            GsoType::TcpV4 => 1,
            GsoType::TcpV6 => 4,
            GsoType::UdpL4 => 5,
        } | if self.ecn { GSO_ECN } else { 0 };
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = if self.needs_csum { NEEDS_CSUM } else { 0 };
        b[1] = gso;
        for (at, v) in [
            (2, self.hdr_len),
            (4, self.gso_size),
            (6, self.csum_start),
            (8, self.csum_offset),
        ] {
            b[at..at + 2].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }
}

/// Folds a one's-complement sum to 16 bits (end-around carry, RFC 1071 4.1).
fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The RFC 1071 sum of `data` as big-endian 16-bit words (an odd last byte padded with zero),
/// folded to 16 bits. Eight bytes at a time in the host's byte order, then swapped: the sum
/// is independent of byte order up to a swap (RFC 1071 2(B)).
fn sum(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let v = u64::from_ne_bytes(w);
        acc += (v & 0xffff_ffff) + (v >> 32);
    }
    let mut be = u64::from(u16::from_be(fold(acc)));
    for pair in chunks.remainder().chunks(2) {
        be += u64::from(pair[0]) << 8 | pair.get(1).map_or(0, |&b| u64::from(b));
    }
    fold(be)
}

/// Adds two folded sums.
fn add(a: u16, b: u16) -> u16 {
    fold(u64::from(a) + u64::from(b))
}

/// The Internet checksum of `data`: the complement of its RFC 1071 sum.
pub fn internet_checksum(data: &[u8]) -> u16 {
    !sum(data)
}

/// Completes a partial checksum in place (`VIRTIO_NET_HDR_F_NEEDS_CSUM`): sums `frame` from
/// `csum_start` to its end, the field at `csum_start + csum_offset` holding the pseudo-header
/// sum the sender left there, and stores the complement (0xffff for a zero result, as Linux
/// does, which UDP requires and TCP treats alike). `BadLength` if the field lies outside the
/// frame.
pub fn complete_checksum(frame: &mut [u8], csum_start: u16, csum_offset: u16) -> Result<(), Error> {
    let start = usize::from(csum_start);
    let field = start + usize::from(csum_offset);
    if field + 2 > frame.len() {
        return Err(Error::BadLength);
    }
    let csum = match !sum(&frame[start..]) {
        0 => 0xffff,
        c => c,
    };
    frame[field..field + 2].copy_from_slice(&csum.to_be_bytes());
    Ok(())
}

/// Where a super-frame's headers are and what it carries (see [`Segmenter::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum L3 {
    V4,
    V6,
}

/// Software segmentation of one super-frame (see the module doc). Holds offsets only: the
/// caller keeps the super-frame's bytes and passes them to every [`Segmenter::next_into`],
/// so a port can pause segmenting when its frame pool runs dry and resume later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segmenter {
    l3: L3,
    tcp: bool,
    /// Offset of the L4 header; the IP header starts at ETHERNET_LEN.
    l4: usize,
    /// Bytes of headers copied in front of every segment.
    hdr_len: usize,
    /// Payload bytes per segment (the last may be shorter).
    mss: usize,
    /// Length of the super-frame.
    total: usize,
    /// Offset in the super-frame of the next segment's payload.
    next: usize,
    /// Segments emitted so far.
    index: u16,
}

impl Segmenter {
    /// Checks the headers of super-frame `frame` against its virtio-net header `hdr` and
    /// plans segments of at most `max_frame` bytes (Ethernet header included).
    ///
    /// TCP segments carry `gso_size` payload bytes, or fewer when that would exceed
    /// `max_frame` (TCP accepts any segment size: a VM whose MSS ignores the overlay still
    /// gets through). UDP datagrams cannot be resized: a `gso_size` that does not fit is an
    /// error. Only untagged Ethernet with IPv4 (not a fragment) or IPv6 without extension
    /// headers is segmented, as virtio-net TSO/USO produce.
    pub fn new(frame: &[u8], hdr: &VnetHdr, max_frame: usize) -> Result<Segmenter, Error> {
        let (want_l3, tcp) = match hdr.gso {
            GsoType::None => return Err(Error::Malformed("GSO frame without a gso_type")),
            GsoType::TcpV4 => (Some(L3::V4), true),
            GsoType::TcpV6 => (Some(L3::V6), true),
            GsoType::UdpL4 => (None, false),
        };
        let ether_type = u16::from_be_bytes(read(frame, 12)?);
        let (l3, l4, proto) = match ether_type {
            ETHERTYPE_IPV4 => {
                let [vihl] = read(frame, ETHERNET_LEN)?;
                let ihl = usize::from(vihl & 0x0f) * 4;
                if vihl >> 4 != 4 || ihl < 20 {
                    return Err(Error::Malformed("IPv4 header of a GSO frame"));
                }
                let frag = u16::from_be_bytes(read(frame, ETHERNET_LEN + 6)?);
                if frag & 0x3fff != 0 {
                    return Err(Error::Malformed("fragmented GSO frame"));
                }
                let [proto] = read(frame, ETHERNET_LEN + 9)?;
                (L3::V4, ETHERNET_LEN + ihl, proto)
            }
            ETHERTYPE_IPV6 => {
                let [v] = read(frame, ETHERNET_LEN)?;
                if v >> 4 != 6 {
                    return Err(Error::Malformed("IPv6 header of a GSO frame"));
                }
                let [next] = read(frame, ETHERNET_LEN + 6)?;
                (L3::V6, ETHERNET_LEN + 40, next)
            }
            _ => return Err(Error::Malformed("GSO frame that is not untagged IPv4/IPv6")),
        };
        if want_l3.is_some_and(|w| w != l3) {
            return Err(Error::Malformed("GSO type for the other IP version"));
        }
        let hdr_len = match (tcp, proto) {
            (true, PROTO_TCP) => {
                let [doff] = read(frame, l4 + 12)?;
                let len = usize::from(doff >> 4) * 4;
                if len < 20 {
                    return Err(Error::Malformed("TCP data offset"));
                }
                l4 + len
            }
            (false, PROTO_UDP) => l4 + 8,
            _ => return Err(Error::Malformed("GSO type for another L4 protocol")),
        };
        if hdr_len > frame.len() {
            return Err(Error::Truncated);
        }
        let ip_len_max = if l3 == L3::V4 { 65535 } else { 65535 + 40 };
        if frame.len() - ETHERNET_LEN > ip_len_max {
            return Err(Error::TooLarge);
        }
        let gso_size = usize::from(hdr.gso_size);
        if gso_size < MIN_GSO_SIZE {
            return Err(Error::Malformed("gso_size below 64 bytes"));
        }
        let room = max_frame.saturating_sub(hdr_len);
        let mss = if tcp { gso_size.min(room) } else { gso_size };
        if mss > room || mss < MIN_GSO_SIZE {
            return Err(Error::Malformed(
                "GSO segment larger than the port's frame limit",
            ));
        }
        Ok(Segmenter {
            l3,
            tcp,
            l4,
            hdr_len,
            mss,
            total: frame.len(),
            next: hdr_len,
            index: 0,
        })
    }

    /// Segments still to come.
    pub fn remaining(&self) -> usize {
        if self.next >= self.total {
            // A super-frame without payload still makes one (header-only) segment.
            usize::from(self.index == 0)
        } else {
            (self.total - self.next).div_ceil(self.mss)
        }
    }

    /// Writes the next segment of `frame` (the super-frame given to [`Segmenter::new`]) into
    /// the front of `out` and returns its length; `Ok(None)` when all were written.
    /// `BufferTooSmall` if `out` cannot hold a segment, `BadLength` if `frame` is not the
    /// super-frame this was planned for.
    pub fn next_into(&mut self, frame: &[u8], out: &mut [u8]) -> Result<Option<usize>, Error> {
        if self.remaining() == 0 {
            return Ok(None);
        }
        if frame.len() != self.total {
            return Err(Error::BadLength);
        }
        let payload = self.mss.min(self.total - self.next);
        let len = self.hdr_len + payload;
        if out.len() < len {
            return Err(Error::BufferTooSmall { needed: len });
        }
        let first = self.index == 0;
        let last = self.next + payload >= self.total;
        let out = &mut out[..len];
        out[..self.hdr_len].copy_from_slice(&frame[..self.hdr_len]);
        out[self.hdr_len..].copy_from_slice(&frame[self.next..self.next + payload]);
        let ip = ETHERNET_LEN;
        let l4_len = len - self.l4;
        match self.l3 {
            L3::V4 => {
                put16(out, ip + 2, (len - ip) as u16);
                let id = u16::from_be_bytes([out[ip + 4], out[ip + 5]]);
                put16(out, ip + 4, id.wrapping_add(self.index));
                put16(out, ip + 10, 0);
                let csum = internet_checksum(&out[ip..self.l4]);
                put16(out, ip + 10, csum);
            }
            L3::V6 => put16(out, ip + 4, (len - ip - 40) as u16),
        }
        let check_at = if self.tcp {
            let seq = u32::from_be_bytes([
                out[self.l4 + 4],
                out[self.l4 + 5],
                out[self.l4 + 6],
                out[self.l4 + 7],
            ]);
            let advanced = seq.wrapping_add((self.next - self.hdr_len) as u32);
            out[self.l4 + 4..self.l4 + 8].copy_from_slice(&advanced.to_be_bytes());
            let flags = &mut out[self.l4 + 13];
            if !last {
                *flags &= !(TCP_FIN | TCP_PSH);
            }
            if !first {
                *flags &= !TCP_CWR;
            }
            self.l4 + 16
        } else {
            put16(out, self.l4 + 4, l4_len as u16);
            self.l4 + 6
        };
        put16(out, check_at, 0);
        let proto = if self.tcp { PROTO_TCP } else { PROTO_UDP };
        let pseudo = match self.l3 {
            // RFC 793 3.1 / RFC 768: source, destination, zero, protocol, L4 length.
            L3::V4 => add(
                sum(&out[ip + 12..ip + 20]),
                fold(u64::from(proto) + l4_len as u64),
            ),
            // RFC 8200 8.1: source, destination, 32-bit L4 length, next header.
            L3::V6 => add(
                sum(&out[ip + 8..ip + 40]),
                fold(u64::from(proto) + l4_len as u64),
            ),
        };
        let mut csum = !add(pseudo, sum(&out[self.l4..]));
        if csum == 0 && !self.tcp {
            csum = 0xffff;
        }
        put16(out, check_at, csum);
        self.next += payload;
        self.index = self.index.wrapping_add(1);
        Ok(Some(len))
    }
}

/// `N` bytes of `frame` at `at`, or `Truncated`.
fn read<const N: usize>(frame: &[u8], at: usize) -> Result<[u8; N], Error> {
    frame
        .get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or(Error::Truncated)
}

/// Stores a big-endian u16 at `at` (callers stay inside the headers they checked).
fn put16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests;
