//! The one error type of the crate: every parser, view and emitter returns it instead of
//! panicking, so the switch can count malformed packets by reason and drop them.

use core::fmt;

/// Why a packet could not be parsed or built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before a header (or the length a header announces) does.
    Truncated,
    /// A length field contradicts another one or the buffer (too small to hold its own header,
    /// an option running past the options area, a picnic option of the wrong size).
    BadLength,
    /// The Geneve version is not 0, the only one defined (RFC 8926 section 3.4).
    BadVersion(u8),
    /// The frame is not a Geneve tunnel packet: not Ethernet/IPv4/UDP to port 6081.
    NotGeneve,
    /// An option with the critical bit set whose class and type we do not understand; RFC 8926
    /// section 3.5 requires such a packet to be dropped.
    UnknownCriticalOption {
        /// The option's class.
        class: u16,
        /// The option's type, critical bit included.
        option_type: u8,
    },
    /// The outer IPv4 header checksum is wrong.
    BadChecksum,
    /// The outer IPv4 packet is a fragment; tunnel packets must fit the uplink MTU (see
    /// [`crate::ENCAP_OVERHEAD`]), we do not reassemble.
    Fragmented,
    /// A header field holds a value we do not accept; the text names the field.
    Malformed(&'static str),
    /// A VNI does not fit in 24 bits.
    VniOutOfRange(u32),
    /// The output buffer is too small; `needed` bytes are required.
    BufferTooSmall {
        /// Bytes the output needs.
        needed: usize,
    },
    /// The packet to build would exceed the 65535-byte IPv4 total length.
    TooLarge,
    /// An AES-GCM key must be 16 or 32 bytes; this one has that many.
    BadKeyLength(usize),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "packet truncated: buffer ends inside a header"),
            Error::BadLength => write!(f, "inconsistent length field"),
            Error::BadVersion(v) => write!(f, "unsupported Geneve version {v} (only 0 exists)"),
            Error::NotGeneve => write!(f, "not a Geneve packet (Ethernet/IPv4/UDP to port 6081)"),
            Error::UnknownCriticalOption { class, option_type } => write!(
                f,
                "unknown critical Geneve option class {class:#06x} type {option_type:#04x}"
            ),
            Error::BadChecksum => write!(f, "bad outer IPv4 header checksum"),
            Error::Fragmented => write!(
                f,
                "fragmented tunnel packet: raise the uplink MTU by the encapsulation overhead"
            ),
            Error::Malformed(what) => write!(f, "malformed {what}"),
            Error::VniOutOfRange(vni) => write!(f, "VNI {vni} does not fit in 24 bits"),
            Error::BufferTooSmall { needed } => {
                write!(f, "output buffer too small: {needed} bytes needed")
            }
            Error::TooLarge => write!(f, "packet would exceed the 65535-byte IPv4 limit"),
            Error::BadKeyLength(n) => {
                write!(
                    f,
                    "key of {n} bytes: AES-GCM keys are 16 or 32 bytes (32 or 64 hex digits)"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// Maps an etherparse length error: running out of buffer is `Truncated`, a length field that
/// contradicts another header is `BadLength`.
pub(crate) fn from_len_error(err: &etherparse::err::LenError) -> Error {
    if err.len_source == etherparse::LenSource::Slice {
        Error::Truncated
    } else {
        Error::BadLength
    }
}
