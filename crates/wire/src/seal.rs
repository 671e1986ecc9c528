//! Sealed tunnel packets: a PSP-like AES-GCM encryption of the inner frame of a Geneve packet
//! with a per-tenant key (PSP Architecture Specification rev. 1.0, sections 2-3; AES-GCM as
//! NIST SP 800-38D; DESIGN.md section 3 item 7, "payload encryption of the overlay").
//!
//! # Layout
//!
//! A sealed packet is a Geneve packet whose protocol type is [`PROTOCOL_SEALED`] (0x88B5,
//! IEEE 802 "Local Experimental EtherType 1"): a receiver that does not know it never hands
//! the payload to a tenant as an Ethernet frame. Its payload is a 16-byte seal header, the
//! encrypted inner Ethernet frame and the 16-byte GCM tag:
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |            key epoch (which of the tenant's keys)             |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |         nonce (96 bits: sender id 32 | counter 64)            |
//! |                                                               |
//! |                                                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |              inner Ethernet frame, encrypted ...              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                     GCM tag (128 bits)                        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! The key epoch plays PSP's SPI role: a receiver holds up to two keys per tenant (the one it
//! sends with and the next or previous one), so keys rotate without dropping packets in
//! flight. The nonce is carried explicitly, as PSP's IV is: the sender writes its own 32-bit
//! id and a 64-bit counter, which keeps nonces unique per key across senders sharing a
//! tenant key (AES-GCM must never reuse a nonce under one key, SP 800-38D section 8).
//!
//! The additional authenticated data is the Geneve header (fixed part and every option, so
//! the VNI and picnic's piggybacked feedback are authenticated) and the seal header. The
//! outer Ethernet, IPv4 and UDP headers are not: their MACs, TTL, checksum and (behind NAT)
//! addresses and ports change in transit, as PSP excludes its outer headers too. There is
//! no replay window (PSP has none either). The outer UDP length is not authenticated data
//! either, but it decides where the ciphertext and the tag end, and GCM authenticates the
//! ciphertext's length (SP 800-38D section 7.2, len(A) || len(C) in the GHASH): a packet
//! whose UDP length was changed fails authentication, or does not parse.
//!
//! Both directions work in place on a buffer with 32 bytes to spare after the packet
//! ([`SEAL_OVERHEAD`]): [`seal_in_place`] turns a plain tunnel packet as
//! [`crate::overlay::encap`] writes it into a sealed one, [`open_in_place`] does the reverse,
//! so the switch seals after encapsulation and opens before decapsulation.

use core::fmt;

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit, Nonce, Tag};
use etherparse::Ipv4Header;

use crate::geneve::PROTOCOL_ETHERNET;
use crate::overlay::{tunnel_layout, Layout};
use crate::Error;

/// Geneve protocol type of a sealed payload (IEEE 802 Local Experimental EtherType 1).
pub const PROTOCOL_SEALED: u16 = 0x88B5;
/// Bytes of the seal header: key epoch (4) and nonce (12).
pub const SEAL_HEADER_LEN: usize = 16;
/// Bytes of the GCM tag after the ciphertext.
pub const TAG_LEN: usize = 16;
/// Bytes sealing adds to a tunnel packet.
pub const SEAL_OVERHEAD: usize = SEAL_HEADER_LEN + TAG_LEN;

/// The seal header: which key sealed the packet and with which nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SealHeader {
    /// The tenant key's epoch (PSP's SPI).
    pub key_epoch: u32,
    /// The 96-bit GCM nonce, unique per key.
    pub nonce: [u8; 12],
}

impl SealHeader {
    /// A header for the `counter`-th packet `sender` seals with the key of `key_epoch`.
    pub fn new(key_epoch: u32, sender: u32, counter: u64) -> SealHeader {
        let mut nonce = [0u8; 12];
        nonce[..4].copy_from_slice(&sender.to_be_bytes());
        nonce[4..].copy_from_slice(&counter.to_be_bytes());
        SealHeader { key_epoch, nonce }
    }

    /// Reads a header from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<SealHeader, Error> {
        let bytes: &[u8; SEAL_HEADER_LEN] = buf
            .get(..SEAL_HEADER_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(Error::Truncated)?;
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&bytes[4..]);
        Ok(SealHeader {
            key_epoch: u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            nonce,
        })
    }

    /// Writes the header into the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), Error> {
        let out = buf
            .get_mut(..SEAL_HEADER_LEN)
            .ok_or(Error::BufferTooSmall {
                needed: SEAL_HEADER_LEN,
            })?;
        out[..4].copy_from_slice(&self.key_epoch.to_be_bytes());
        out[4..].copy_from_slice(&self.nonce);
        Ok(())
    }
}

/// An AES-GCM key, 128 or 256 bits (PSP's two modes), expanded once.
#[derive(Clone)]
pub struct TunnelKey(Cipher);

#[derive(Clone)]
enum Cipher {
    Aes128(Box<Aes128Gcm>),
    Aes256(Box<Aes256Gcm>),
}

impl TunnelKey {
    /// A key from 16 (AES-128-GCM) or 32 (AES-256-GCM) bytes.
    pub fn new(key: &[u8]) -> Result<TunnelKey, Error> {
        match key.len() {
            16 => Ok(TunnelKey(Cipher::Aes128(Box::new(
                Aes128Gcm::new_from_slice(key).map_err(|_| Error::BadKeyLength(16))?,
            )))),
            32 => Ok(TunnelKey(Cipher::Aes256(Box::new(
                Aes256Gcm::new_from_slice(key).map_err(|_| Error::BadKeyLength(32))?,
            )))),
            n => Err(Error::BadKeyLength(n)),
        }
    }

    /// A key from 32 or 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(hex: &str) -> Result<TunnelKey, Error> {
        let hex = hex.trim().as_bytes();
        if !hex.len().is_multiple_of(2) {
            return Err(Error::Malformed("key: odd number of hex digits"));
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(Error::Malformed("key: not a hex digit")),
        };
        let bytes = hex
            .chunks_exact(2)
            .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
            .collect::<Result<Vec<u8>, Error>>()?;
        TunnelKey::new(&bytes)
    }

    /// Key length in bits.
    pub fn bits(&self) -> u32 {
        match self.0 {
            Cipher::Aes128(_) => 128,
            Cipher::Aes256(_) => 256,
        }
    }

    /// A public fingerprint of the key (the GCM tag of an empty message under the reserved
    /// all-ones nonce, which no sender uses: sender ids are host ids), so operators and the
    /// API can tell whether two hosts hold the same key without showing it.
    pub fn fingerprint(&self) -> [u8; 8] {
        let tag = self
            .encrypt(&[0xFF; 12], b"picnic key fingerprint", &mut [])
            .unwrap_or_default();
        let mut out = [0u8; 8];
        out.copy_from_slice(&tag[..8]);
        out
    }

    fn encrypt(&self, nonce: &[u8; 12], aad: &[u8], data: &mut [u8]) -> Result<Tag, Error> {
        let nonce = Nonce::from_slice(nonce);
        match &self.0 {
            Cipher::Aes128(c) => c.encrypt_in_place_detached(nonce, aad, data),
            Cipher::Aes256(c) => c.encrypt_in_place_detached(nonce, aad, data),
        }
        .map_err(|_| Error::TooLarge)
    }

    fn decrypt(&self, nonce: &[u8; 12], aad: &[u8], data: &mut [u8], tag: &Tag) -> bool {
        let nonce = Nonce::from_slice(nonce);
        match &self.0 {
            Cipher::Aes128(c) => c.decrypt_in_place_detached(nonce, aad, data, tag),
            Cipher::Aes256(c) => c.decrypt_in_place_detached(nonce, aad, data, tag),
        }
        .is_ok()
    }
}

impl fmt::Debug for TunnelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TunnelKey(AES-{}-GCM, redacted)", self.bits())
    }
}

/// Rewrites the outer IPv4 total length (with its header checksum), the UDP length and the
/// Geneve protocol of a packet whose UDP payload changes by `delta` bytes.
fn fix_headers(buf: &mut [u8], at: &Layout, delta: isize, protocol: u16) -> Result<(), Error> {
    let adjust = |v: u16| u16::try_from(v as isize + delta).map_err(|_| Error::TooLarge);
    let ip_bytes = &mut buf[at.ip..at.udp];
    let (mut ip, _) =
        Ipv4Header::from_slice(ip_bytes).map_err(|_| Error::Malformed("outer IPv4 header"))?;
    ip.total_len = adjust(ip.total_len)?;
    ip.header_checksum = ip.calc_header_checksum();
    let header = ip.to_bytes();
    ip_bytes
        .get_mut(..header.len())
        .ok_or(Error::BadLength)?
        .copy_from_slice(&header);
    let udp_len = u16::from_be_bytes([buf[at.udp + 4], buf[at.udp + 5]]);
    buf[at.udp + 4..at.udp + 6].copy_from_slice(&adjust(udp_len)?.to_be_bytes());
    // The UDP checksum stays 0, as encap writes it (RFC 8926 section 3.3).
    buf[at.udp + 6..at.udp + 8].copy_from_slice(&[0, 0]);
    buf[at.geneve + 2..at.geneve + 4].copy_from_slice(&protocol.to_be_bytes());
    Ok(())
}

/// Seals the plain tunnel packet `buf[..len]` (a Geneve packet carrying an Ethernet frame)
/// with `key` under `header`, in place, and returns the sealed length, `len` plus
/// [`SEAL_OVERHEAD`] (less any Ethernet padding the packet had). `buf` must have that room.
pub fn seal_in_place(
    buf: &mut [u8],
    len: usize,
    key: &TunnelKey,
    header: SealHeader,
) -> Result<usize, Error> {
    let frame = buf.get(..len).ok_or(Error::Truncated)?;
    let (decapped, at) = tunnel_layout(frame)?;
    if decapped.geneve.protocol != PROTOCOL_ETHERNET || decapped.geneve.oam {
        return Err(Error::Malformed(
            "sealed payload: only tenant Ethernet frames are sealed",
        ));
    }
    let sealed_len = at.end + SEAL_OVERHEAD;
    if buf.len() < sealed_len {
        return Err(Error::BufferTooSmall { needed: sealed_len });
    }
    fix_headers(buf, &at, SEAL_OVERHEAD as isize, PROTOCOL_SEALED)?;
    buf.copy_within(at.inner..at.end, at.inner + SEAL_HEADER_LEN);
    header.emit(&mut buf[at.inner..])?;
    let body_end = at.end + SEAL_HEADER_LEN;
    let (aad_and_body, tag_out) = buf.split_at_mut(body_end);
    let (aad, body) = aad_and_body.split_at_mut(at.inner + SEAL_HEADER_LEN);
    let tag = key.encrypt(&header.nonce, &aad[at.geneve..], body)?;
    tag_out[..TAG_LEN].copy_from_slice(&tag);
    Ok(sealed_len)
}

/// What [`open_in_place`] could not do with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// Not a sealed tunnel packet (the reason from the parser).
    Malformed(Error),
    /// The tenant has no key of this epoch (never installed, or rotated out).
    UnknownKey(u32),
    /// The tag did not verify: the packet was altered, or sealed with another key.
    AuthFailed,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Malformed(e) => write!(f, "not a sealed tunnel packet: {e}"),
            OpenError::UnknownKey(epoch) => write!(f, "no key of epoch {epoch} for this tenant"),
            OpenError::AuthFailed => write!(f, "authentication failed"),
        }
    }
}

impl std::error::Error for OpenError {}

/// The tenant (VNI) and key epoch of a sealed tunnel packet, for choosing the key before
/// [`open_in_place`]; the values are not authenticated yet.
pub fn sealed_key_of(frame: &[u8]) -> Result<(u32, u32), Error> {
    let (decapped, at) = tunnel_layout(frame)?;
    if decapped.geneve.protocol != PROTOCOL_SEALED {
        return Err(Error::Malformed("Geneve protocol: not a sealed payload"));
    }
    let header = SealHeader::parse(&frame[at.inner..at.end])?;
    Ok((decapped.geneve.vni, header.key_epoch))
}

/// Opens the sealed tunnel packet `buf[..len]` in place with the key `key_for` returns for
/// its key epoch, and returns the length of the plain tunnel packet (Geneve protocol
/// Ethernet again, [`SEAL_OVERHEAD`] bytes shorter). On failure the buffer's contents are
/// unspecified and the packet must be dropped.
pub fn open_in_place<'k>(
    buf: &mut [u8],
    len: usize,
    key_for: impl FnOnce(u32) -> Option<&'k TunnelKey>,
) -> Result<usize, OpenError> {
    let frame = buf
        .get(..len)
        .ok_or(OpenError::Malformed(Error::Truncated))?;
    let (decapped, at) = tunnel_layout(frame).map_err(OpenError::Malformed)?;
    if decapped.geneve.protocol != PROTOCOL_SEALED {
        return Err(OpenError::Malformed(Error::Malformed(
            "Geneve protocol: not a sealed payload",
        )));
    }
    if at.end - at.inner < SEAL_OVERHEAD {
        return Err(OpenError::Malformed(Error::Truncated));
    }
    let header = SealHeader::parse(&buf[at.inner..at.end]).map_err(OpenError::Malformed)?;
    let key = key_for(header.key_epoch).ok_or(OpenError::UnknownKey(header.key_epoch))?;
    let body_end = at.end - TAG_LEN;
    let tag = *Tag::from_slice(&buf[body_end..at.end]);
    let (aad, body) = buf[..body_end].split_at_mut(at.inner + SEAL_HEADER_LEN);
    if !key.decrypt(&header.nonce, &aad[at.geneve..], body, &tag) {
        return Err(OpenError::AuthFailed);
    }
    buf.copy_within(at.inner + SEAL_HEADER_LEN..body_end, at.inner);
    fix_headers(buf, &at, -(SEAL_OVERHEAD as isize), PROTOCOL_ETHERNET)
        .map_err(OpenError::Malformed)?;
    Ok(at.end - SEAL_OVERHEAD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feedback::FeedbackOption;
    use crate::geneve::GeneveRepr;
    use crate::overlay::{decap, encap, entropy_source_port, OuterHeaders};
    use core::net::Ipv4Addr;

    fn outer() -> OuterHeaders {
        OuterHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(198, 18, 0, 1),
            dst_ip: Ipv4Addr::new(198, 18, 0, 2),
            src_port: entropy_source_port(7),
            ttl: 64,
        }
    }

    fn key(byte: u8, len: usize) -> TunnelKey {
        TunnelKey::new(&vec![byte; len]).unwrap()
    }

    fn plain(inner: &[u8], geneve: &GeneveRepr) -> (Vec<u8>, usize) {
        let mut buf = vec![0u8; inner.len() + 200];
        let len = encap(&outer(), geneve, inner, &mut buf).unwrap();
        (buf, len)
    }

    #[test]
    fn round_trip_hides_the_inner_frame_and_restores_it() {
        let inner: Vec<u8> = (0..200u8).collect();
        let geneve = GeneveRepr {
            feedback: Some(FeedbackOption {
                dst_endpoint: 1,
                rate_bps: 2,
                seq: 3,
            }),
            ..GeneveRepr::ethernet(42)
        };
        for bits in [16, 32] {
            let (mut buf, len) = plain(&inner, &geneve);
            let original = buf[..len].to_vec();
            let k = key(7, bits);
            let sealed = seal_in_place(&mut buf, len, &k, SealHeader::new(3, 9, 1)).unwrap();
            assert_eq!(sealed, len + SEAL_OVERHEAD);
            let d = decap(&buf[..sealed]).unwrap();
            assert_eq!(d.geneve.protocol, PROTOCOL_SEALED);
            assert_eq!(d.geneve.vni, 42);
            assert_eq!(d.geneve.feedback, geneve.feedback);
            assert!(!d.inner.windows(16).any(|w| w == &inner[..16]));
            assert_eq!(sealed_key_of(&buf[..sealed]), Ok((42, 3)));
            let opened = open_in_place(&mut buf, sealed, |e| (e == 3).then_some(&k)).unwrap();
            assert_eq!(&buf[..opened], &original[..]);
        }
    }

    #[test]
    fn tampering_anywhere_authenticated_fails() {
        let (mut buf, len) = plain(&[0x55; 64], &GeneveRepr::ethernet(5));
        let k = key(1, 16);
        let sealed = seal_in_place(&mut buf, len, &k, SealHeader::new(1, 1, 1)).unwrap();
        let geneve_at = 14 + 20 + 8;
        // VNI, nonce, ciphertext, tag: each flip is detected. (A flipped VNI or epoch may
        // instead find no key; both drop the packet.)
        for at in [
            geneve_at + 5,
            geneve_at + 8 + 6,
            geneve_at + 8 + 20,
            sealed - 1,
        ] {
            let mut t = buf.clone();
            t[at] ^= 0x01;
            assert_eq!(
                open_in_place(&mut t, sealed, |_| Some(&k)),
                Err(OpenError::AuthFailed),
                "flip at byte {at}"
            );
        }
        let mut t = buf.clone();
        let other = key(2, 16);
        assert_eq!(
            open_in_place(&mut t, sealed, |_| Some(&other)),
            Err(OpenError::AuthFailed)
        );
        let mut t = buf.clone();
        assert_eq!(
            open_in_place(&mut t, sealed, |_| None),
            Err(OpenError::UnknownKey(1))
        );
        // The outer TTL is not authenticated (it changes in transit); fix its checksum.
        let mut t = buf.clone();
        t[14 + 8] = 3;
        t[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
        let sum = Ipv4Header::from_slice(&t[14..34])
            .unwrap()
            .0
            .calc_header_checksum();
        t[14 + 10..14 + 12].copy_from_slice(&sum.to_be_bytes());
        assert!(open_in_place(&mut t, sealed, |_| Some(&k)).is_ok());
    }

    #[test]
    fn a_changed_udp_length_fails_authentication() {
        // The outer UDP length is outside the associated data but decides where the tag is:
        // shortened (the rest taken for Ethernet padding), the packet does not open.
        let (mut buf, len) = plain(&[0x5A; 691], &GeneveRepr::ethernet(77));
        let k = key(0, 16);
        let sealed = seal_in_place(&mut buf, len, &k, SealHeader::new(0, 1, 0)).unwrap();
        let udp_len = 14 + 20 + 4;
        for (at, xor) in [(udp_len + 1, 0x20), (udp_len + 1, 0x01), (udp_len, 0x01)] {
            let mut t = buf.clone();
            t[at] ^= xor;
            let opened = open_in_place(&mut t, sealed, |_| Some(&k));
            assert!(
                matches!(opened, Err(OpenError::AuthFailed | OpenError::Malformed(_))),
                "UDP length byte {at} ^ {xor:#x}: {opened:?}"
            );
        }
    }

    #[test]
    fn refuses_what_it_cannot_seal_or_open() {
        let (mut buf, len) = plain(&[1; 10], &GeneveRepr::ethernet(5));
        let k = key(1, 32);
        assert_eq!(
            seal_in_place(&mut buf[..len + 10], len, &k, SealHeader::new(1, 1, 1)),
            Err(Error::BufferTooSmall {
                needed: len + SEAL_OVERHEAD
            })
        );
        assert!(matches!(
            open_in_place(&mut buf, len, |_| Some(&k)),
            Err(OpenError::Malformed(_))
        ));
        assert_eq!(
            TunnelKey::new(&[0; 24]).err(),
            Some(Error::BadKeyLength(24))
        );
        assert!(TunnelKey::from_hex("zz").is_err());
        assert_eq!(TunnelKey::from_hex(&"ab".repeat(16)).unwrap().bits(), 128);
        assert_eq!(TunnelKey::from_hex(&"AB".repeat(32)).unwrap().bits(), 256);
    }
}
