//! Geneve (RFC 8926): a zero-copy view over a Geneve header and its options, and a
//! high-level representation with `parse`/`emit`, modelled on smoltcp's `wire/`.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Ver|  Opt Len  |O|C|    Rsvd.  |          Protocol Type        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |        Virtual Network Identifier (VNI)       |    Reserved   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                    Variable-Length Options                    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//!
//! Option (RFC 8926 section 3.5):
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |          Option Class         |      Type     |R|R|R| Length  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                 Variable-Length Option Data                   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! Opt Len and option Length count 4-byte words; an option's Length excludes its own 4-byte
//! header. The high bit of an option's Type is its critical bit.

use crate::feedback::{
    FeedbackAuth, FeedbackOption, FEEDBACK_AUTH_DATA_LEN, FEEDBACK_AUTH_OPTION_TYPE,
    FEEDBACK_DATA_LEN, FEEDBACK_OPTION_LEN, FEEDBACK_OPTION_TYPE, PICNIC_OPTION_CLASS,
    PROTOCOL_NONE,
};
use crate::Error;

/// UDP destination port of Geneve (RFC 8926 section 3.3).
pub const GENEVE_UDP_PORT: u16 = 6081;

/// Protocol type of an Ethernet inner frame ("Transparent Ethernet Bridging").
pub const PROTOCOL_ETHERNET: u16 = 0x6558;

/// Length of the fixed Geneve header, before the options.
pub const GENEVE_HEADER_LEN: usize = 8;

/// Largest options area Opt Len can express (63 words).
pub const MAX_OPTIONS_LEN: usize = 63 * 4;

/// Largest VNI (24 bits).
pub const MAX_VNI: u32 = 0x00FF_FFFF;

/// Critical bit of an option's Type field.
const OPTION_CRITICAL: u8 = 0x80;
const OPTION_HEADER_LEN: usize = 4;
const FLAG_OAM: u8 = 0x80;
const FLAG_CRITICAL: u8 = 0x40;

/// A read-only view of a Geneve header, its options and its payload, over any byte buffer.
///
/// Only [`GenevePacket::new_checked`] creates one, so every accessor is infallible: the
/// version is 0, the options area lies within the buffer and every option lies within the
/// options area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenevePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> GenevePacket<T> {
    /// Validates `buffer` as a Geneve packet (header, options area, each option's length) and
    /// wraps it. Options are checked for structure only; [`GeneveRepr::parse`] also refuses
    /// unknown critical options.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let bytes = buffer.as_ref();
        let Some(&[first, ..]) = bytes.get(..GENEVE_HEADER_LEN) else {
            return Err(Error::Truncated);
        };
        let version = first >> 6;
        if version != 0 {
            return Err(Error::BadVersion(version));
        }
        let header_len = GENEVE_HEADER_LEN + usize::from(first & 0x3F) * 4;
        let Some(mut options) = bytes.get(GENEVE_HEADER_LEN..header_len) else {
            return Err(Error::Truncated);
        };
        while let Some((header, rest)) = options.split_first_chunk::<OPTION_HEADER_LEN>() {
            let data_len = usize::from(header[3] & 0x1F) * 4;
            options = rest.get(data_len..).ok_or(Error::BadLength)?;
        }
        // The area is a multiple of 4 and so is every option, so nothing can be left over.
        Ok(GenevePacket { buffer })
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn fixed(&self) -> [u8; GENEVE_HEADER_LEN] {
        // new_checked guaranteed at least GENEVE_HEADER_LEN bytes.
        let mut fixed = [0u8; GENEVE_HEADER_LEN];
        fixed.copy_from_slice(&self.bytes()[..GENEVE_HEADER_LEN]);
        fixed
    }

    /// Length of the header including options: where the payload starts.
    pub fn header_len(&self) -> usize {
        GENEVE_HEADER_LEN + usize::from(self.fixed()[0] & 0x3F) * 4
    }

    /// The O bit: the packet is a control message, not tenant data (RFC 8926 section 3.4).
    pub fn oam(&self) -> bool {
        self.fixed()[1] & FLAG_OAM != 0
    }

    /// The C bit: at least one option is critical.
    pub fn critical(&self) -> bool {
        self.fixed()[1] & FLAG_CRITICAL != 0
    }

    /// Protocol type of the payload (an EtherType; [`PROTOCOL_ETHERNET`] for Ethernet frames,
    /// [`PROTOCOL_NONE`] for picnic's standalone feedback).
    pub fn protocol(&self) -> u16 {
        let f = self.fixed();
        u16::from_be_bytes([f[2], f[3]])
    }

    /// The 24-bit Virtual Network Identifier: the tenant.
    pub fn vni(&self) -> u32 {
        let f = self.fixed();
        u32::from_be_bytes([0, f[4], f[5], f[6]])
    }

    /// The options, in order.
    pub fn options(&self) -> GeneveOptions<'_> {
        GeneveOptions {
            remaining: &self.bytes()[GENEVE_HEADER_LEN..self.header_len()],
        }
    }

    /// The bytes after the header and options (the inner frame).
    pub fn payload(&self) -> &[u8] {
        &self.bytes()[self.header_len()..]
    }
}

/// One Geneve option, borrowed from the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GeneveOption<'a> {
    /// Option class (namespace of the type).
    pub class: u16,
    /// Option type, critical bit included.
    pub option_type: u8,
    /// Option data, a multiple of 4 bytes.
    pub data: &'a [u8],
}

impl GeneveOption<'_> {
    /// Whether a receiver that does not understand this option must drop the packet.
    pub fn is_critical(&self) -> bool {
        self.option_type & OPTION_CRITICAL != 0
    }
}

/// Iterator over the options of a checked [`GenevePacket`].
#[derive(Clone, Debug)]
pub struct GeneveOptions<'a> {
    remaining: &'a [u8],
}

impl<'a> Iterator for GeneveOptions<'a> {
    type Item = GeneveOption<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let (header, rest) = self.remaining.split_first_chunk::<OPTION_HEADER_LEN>()?;
        let data_len = usize::from(header[3] & 0x1F) * 4;
        // The packet was checked, so `get` only fails on a bug; stop rather than panic.
        let data = rest.get(..data_len)?;
        self.remaining = &rest[data_len..];
        Some(GeneveOption {
            class: u16::from_be_bytes([header[0], header[1]]),
            option_type: header[2],
            data,
        })
    }
}

/// The meaning of a Geneve header as picnic uses it.
///
/// Parsing keeps the first picnic feedback and feedback authentication options, skips unknown
/// non-critical options and refuses unknown critical ones (RFC 8926 section 3.5.1); emitting
/// writes only those two options, so `parse(emit(x)) == x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GeneveRepr {
    /// The tenant (24 bits).
    pub vni: u32,
    /// Protocol type of the payload ([`PROTOCOL_ETHERNET`] or [`PROTOCOL_NONE`]).
    pub protocol: u16,
    /// The O bit: a control message rather than tenant data.
    pub oam: bool,
    /// The C bit as received (set by the sender when a critical option is present); our own
    /// feedback option is not critical.
    pub critical: bool,
    /// picnic's congestion feedback, when the packet carries some.
    pub feedback: Option<FeedbackOption>,
    /// The authentication of `feedback`, in deployments with a feedback key.
    pub feedback_auth: Option<FeedbackAuth>,
}

impl GeneveRepr {
    /// A header for a tenant's Ethernet frame, without feedback.
    pub fn ethernet(vni: u32) -> Self {
        GeneveRepr {
            vni,
            protocol: PROTOCOL_ETHERNET,
            oam: false,
            critical: false,
            feedback: None,
            feedback_auth: None,
        }
    }

    /// Reads the header of a checked packet. Fails on unknown critical options and on a picnic
    /// feedback option of the wrong length.
    pub fn parse<T: AsRef<[u8]>>(packet: &GenevePacket<T>) -> Result<Self, Error> {
        let (mut feedback, mut feedback_auth) = (None, None);
        for option in packet.options() {
            let ours = option.class == PICNIC_OPTION_CLASS;
            if ours && option.option_type == FEEDBACK_OPTION_TYPE {
                let parsed = FeedbackOption::parse(option.data)?;
                feedback.get_or_insert(parsed);
            } else if ours && option.option_type == FEEDBACK_AUTH_OPTION_TYPE {
                let parsed = FeedbackAuth::parse(option.data)?;
                feedback_auth.get_or_insert(parsed);
            } else if option.is_critical() {
                return Err(Error::UnknownCriticalOption {
                    class: option.class,
                    option_type: option.option_type,
                });
            }
        }
        Ok(GeneveRepr {
            vni: packet.vni(),
            protocol: packet.protocol(),
            oam: packet.oam(),
            critical: packet.critical(),
            feedback,
            feedback_auth,
        })
    }

    /// Bytes [`GeneveRepr::emit`] writes: the fixed header plus options.
    pub fn buffer_len(&self) -> usize {
        GENEVE_HEADER_LEN + self.options_len()
    }

    fn options_len(&self) -> usize {
        let feedback = if self.feedback.is_some() {
            FEEDBACK_OPTION_LEN
        } else {
            0
        };
        let auth = if self.feedback_auth.is_some() {
            OPTION_HEADER_LEN + FEEDBACK_AUTH_DATA_LEN
        } else {
            0
        };
        feedback + auth
    }

    /// Whether this is the header of a standalone feedback packet (see
    /// [`crate::standalone_feedback`]): feedback and no inner frame.
    pub fn is_standalone_feedback(&self) -> bool {
        self.protocol == PROTOCOL_NONE && self.feedback.is_some()
    }

    /// Writes the header and options into the start of `buf` and returns their length
    /// ([`GeneveRepr::buffer_len`]); the payload goes right after. Reserved bits are zero.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        if self.vni > MAX_VNI {
            return Err(Error::VniOutOfRange(self.vni));
        }
        let len = self.buffer_len();
        let out = buf
            .get_mut(..len)
            .ok_or(Error::BufferTooSmall { needed: len })?;
        let opt_words = (self.options_len() / 4) as u8;
        let mut flags = 0;
        if self.oam {
            flags |= FLAG_OAM;
        }
        if self.critical {
            flags |= FLAG_CRITICAL;
        }
        let [p0, p1] = self.protocol.to_be_bytes();
        let [_, v0, v1, v2] = self.vni.to_be_bytes();
        out[..GENEVE_HEADER_LEN].copy_from_slice(&[opt_words, flags, p0, p1, v0, v1, v2, 0]);
        let [c0, c1] = PICNIC_OPTION_CLASS.to_be_bytes();
        let mut at = GENEVE_HEADER_LEN;
        if let Some(feedback) = &self.feedback {
            let option = &mut out[at..];
            let data_words = (FEEDBACK_DATA_LEN / 4) as u8;
            option[..OPTION_HEADER_LEN].copy_from_slice(&[
                c0,
                c1,
                FEEDBACK_OPTION_TYPE,
                data_words,
            ]);
            at += OPTION_HEADER_LEN + feedback.emit(&mut option[OPTION_HEADER_LEN..])?;
        }
        if let Some(auth) = &self.feedback_auth {
            let option = &mut out[at..];
            let data_words = (FEEDBACK_AUTH_DATA_LEN / 4) as u8;
            option[..OPTION_HEADER_LEN].copy_from_slice(&[
                c0,
                c1,
                FEEDBACK_AUTH_OPTION_TYPE,
                data_words,
            ]);
            auth.emit(&mut option[OPTION_HEADER_LEN..])?;
        }
        Ok(len)
    }
}

/// The Geneve header of a standalone feedback packet for tenant `vni`: OAM bit set, protocol
/// [`PROTOCOL_NONE`], the feedback option; send it with an empty payload, for example
/// `encap(&outer, &standalone_feedback(vni, fb), &[], out)`.
pub fn standalone_feedback(vni: u32, feedback: FeedbackOption) -> GeneveRepr {
    GeneveRepr {
        vni,
        protocol: PROTOCOL_NONE,
        oam: true,
        critical: false,
        feedback: Some(feedback),
        feedback_auth: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feedback() -> FeedbackOption {
        FeedbackOption {
            dst_endpoint: 7,
            rate_bps: 1_000_000_000,
            seq: 42,
        }
    }

    #[test]
    fn emits_rfc_layout() {
        let repr = GeneveRepr {
            feedback: Some(feedback()),
            ..GeneveRepr::ethernet(0x12_3456)
        };
        let mut buf = [0u8; 64];
        let len = repr.emit(&mut buf).unwrap();
        assert_eq!(len, 28);
        // Ver 0, Opt Len 5 words, no flags, protocol 0x6558, VNI, reserved.
        assert_eq!(buf[..8], [5, 0, 0x65, 0x58, 0x12, 0x34, 0x56, 0]);
        // Option header: class 0xFFF0, type 1, length 4 words.
        assert_eq!(buf[8..12], [0xFF, 0xF0, 0x01, 4]);
        let packet = GenevePacket::new_checked(&buf[..len]).unwrap();
        assert_eq!(packet.header_len(), 28);
        assert!(packet.payload().is_empty());
        assert_eq!(GeneveRepr::parse(&packet), Ok(repr));
    }

    #[test]
    fn unknown_options_skipped_unless_critical() {
        // Header with two options: an unknown non-critical one (1 data word) then feedback.
        let mut buf = vec![0u8, 0, 0x65, 0x58, 0, 0, 9, 0];
        buf.extend_from_slice(&[0x01, 0x02, 0x03, 1, 0xAA, 0xBB, 0xCC, 0xDD]);
        buf.extend_from_slice(&[0xFF, 0xF0, 0x01, 4]);
        let mut data = [0u8; FEEDBACK_DATA_LEN];
        feedback().emit(&mut data).unwrap();
        buf.extend_from_slice(&data);
        buf[0] = ((buf.len() - GENEVE_HEADER_LEN) / 4) as u8;
        buf.extend_from_slice(b"inner");

        let packet = GenevePacket::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.options().count(), 2);
        assert_eq!(packet.payload(), b"inner");
        let repr = GeneveRepr::parse(&packet).unwrap();
        assert_eq!(repr.vni, 9);
        assert_eq!(repr.feedback, Some(feedback()));

        // Same unknown option with the critical bit: the packet must be dropped.
        buf[10] = 0x83;
        let packet = GenevePacket::new_checked(&buf[..]).unwrap();
        assert_eq!(
            GeneveRepr::parse(&packet),
            Err(Error::UnknownCriticalOption {
                class: 0x0102,
                option_type: 0x83
            })
        );
    }

    #[test]
    fn structural_errors() {
        assert_eq!(
            GenevePacket::new_checked(&[0u8; 7][..]),
            Err(Error::Truncated)
        );
        assert_eq!(
            GenevePacket::new_checked(&[0x40u8, 0, 0, 0, 0, 0, 0, 0][..]),
            Err(Error::BadVersion(1))
        );
        // Opt Len 1 word but no option bytes.
        assert_eq!(
            GenevePacket::new_checked(&[1u8, 0, 0, 0, 0, 0, 0, 0][..]),
            Err(Error::Truncated)
        );
        // Opt Len 1 word holding an option header that announces 1 data word.
        assert_eq!(
            GenevePacket::new_checked(&[1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0][..]),
            Err(Error::BadLength)
        );
        // A picnic feedback option with 1 data word instead of 4.
        let buf = [2u8, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xF0, 0x01, 1, 0, 0, 0, 0];
        let packet = GenevePacket::new_checked(&buf[..]).unwrap();
        assert_eq!(GeneveRepr::parse(&packet), Err(Error::BadLength));
    }

    #[test]
    fn emit_errors() {
        let mut buf = [0u8; 64];
        assert_eq!(
            GeneveRepr::ethernet(MAX_VNI + 1).emit(&mut buf),
            Err(Error::VniOutOfRange(MAX_VNI + 1))
        );
        let repr = GeneveRepr {
            feedback: Some(feedback()),
            ..GeneveRepr::ethernet(1)
        };
        assert_eq!(
            repr.emit(&mut buf[..20]),
            Err(Error::BufferTooSmall { needed: 28 })
        );
    }
}
