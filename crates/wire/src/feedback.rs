//! picnic's Geneve option: receiver-driven congestion feedback (EyeQ section 3.3 "host-ACKs";
//! PicNIC section 2.1 "receiver-driven congestion control"; DESIGN.md section 4 "Overlay").
//!
//! A receiver that meters an endpoint's arrivals tells the sending host the rate it may send
//! to that endpoint. As EyeQ 3.3 allows, the feedback is piggybacked as a Geneve option on
//! reverse traffic when there is some, and sent in a minimum-size standalone feedback packet
//! (no inner frame) when there is none.
//!
//! # Option layout
//!
//! Option header (RFC 8926 section 3.5): class [`PICNIC_OPTION_CLASS`] (0xFFF0, the first
//! value of the IANA "Experimental Use" range 0xFFF0..=0xFFFF), type
//! [`FEEDBACK_OPTION_TYPE`] (0x01, critical bit clear: a receiver that does not know the option
//! may skip it), length 4 (16 data bytes). Data, big-endian:
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                  dst_endpoint (receiving VM id)               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                 rate_bps (advertised rate, bits/s)            |
//! |                                                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                    seq (per-endpoint sequence)                |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! # Standalone feedback packet
//!
//! A Geneve packet with the OAM bit set (RFC 8926 section 3.4: a control message, never
//! forwarded to a tenant), protocol type [`PROTOCOL_NONE`] (0x0000, not an EtherType: marks
//! "no inner frame"), the feedback option, and an empty payload. Build it with
//! [`standalone_feedback`]; recognise it with [`GeneveRepr::is_standalone_feedback`].

use crate::geneve::GeneveRepr;
use crate::Error;

/// Geneve option class used by picnic: 0xFFF0, from the IANA "Experimental Use" range
/// 0xFFF0..=0xFFFF of the Geneve Option Class registry (RFC 8926 section 7).
pub const PICNIC_OPTION_CLASS: u16 = 0xFFF0;

/// Option type of the feedback option within [`PICNIC_OPTION_CLASS`]; the critical bit (0x80)
/// is clear, so receivers that do not know it skip it.
pub const FEEDBACK_OPTION_TYPE: u8 = 0x01;

/// Bytes of feedback option data (without the 4-byte option header).
pub const FEEDBACK_DATA_LEN: usize = 16;

/// Bytes the feedback option takes in a Geneve header: 4-byte option header plus data.
pub const FEEDBACK_OPTION_LEN: usize = 4 + FEEDBACK_DATA_LEN;

/// Geneve protocol type of a standalone feedback packet: no inner frame follows.
pub const PROTOCOL_NONE: u16 = 0x0000;

/// Congestion feedback from a receiving host about one of its endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FeedbackOption {
    /// The receiving VM/endpoint the feedback is about.
    pub dst_endpoint: u32,
    /// The rate, in bits per second, the sender may send to `dst_endpoint`.
    pub rate_bps: u64,
    /// Sequence number of this feedback for `dst_endpoint`, so a sender can ignore reordered,
    /// stale feedback (compare with wrapping arithmetic).
    pub seq: u32,
}

impl FeedbackOption {
    /// Parses the option data (the bytes after the 4-byte option header); the data must be
    /// exactly [`FEEDBACK_DATA_LEN`] bytes.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        let data: &[u8; FEEDBACK_DATA_LEN] = data.try_into().map_err(|_| Error::BadLength)?;
        let [e0, e1, e2, e3, r0, r1, r2, r3, r4, r5, r6, r7, s0, s1, s2, s3] = *data;
        Ok(FeedbackOption {
            dst_endpoint: u32::from_be_bytes([e0, e1, e2, e3]),
            rate_bps: u64::from_be_bytes([r0, r1, r2, r3, r4, r5, r6, r7]),
            seq: u32::from_be_bytes([s0, s1, s2, s3]),
        })
    }

    /// Writes the option data into the first [`FEEDBACK_DATA_LEN`] bytes of `data` and returns
    /// that length.
    pub fn emit(&self, data: &mut [u8]) -> Result<usize, Error> {
        let out = data
            .get_mut(..FEEDBACK_DATA_LEN)
            .ok_or(Error::BufferTooSmall {
                needed: FEEDBACK_DATA_LEN,
            })?;
        out[0..4].copy_from_slice(&self.dst_endpoint.to_be_bytes());
        out[4..12].copy_from_slice(&self.rate_bps.to_be_bytes());
        out[12..16].copy_from_slice(&self.seq.to_be_bytes());
        Ok(FEEDBACK_DATA_LEN)
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_big_endian_in_documented_order() {
        let fb = FeedbackOption {
            dst_endpoint: 0x0102_0304,
            rate_bps: 0x1112_1314_1516_1718,
            seq: 0x2122_2324,
        };
        let mut data = [0u8; FEEDBACK_DATA_LEN];
        assert_eq!(fb.emit(&mut data), Ok(FEEDBACK_DATA_LEN));
        assert_eq!(
            data,
            [
                0x01, 0x02, 0x03, 0x04, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x21, 0x22,
                0x23, 0x24
            ]
        );
        assert_eq!(FeedbackOption::parse(&data), Ok(fb));
    }

    #[test]
    fn wrong_sizes_are_errors() {
        assert_eq!(FeedbackOption::parse(&[0; 15]), Err(Error::BadLength));
        assert_eq!(FeedbackOption::parse(&[0; 20]), Err(Error::BadLength));
        let fb = FeedbackOption {
            dst_endpoint: 1,
            rate_bps: 2,
            seq: 3,
        };
        assert_eq!(
            fb.emit(&mut [0; 8]),
            Err(Error::BufferTooSmall {
                needed: FEEDBACK_DATA_LEN
            })
        );
    }
}
