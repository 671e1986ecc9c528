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
//! [`crate::geneve::standalone_feedback`]; recognise it with
//! [`crate::GeneveRepr::is_standalone_feedback`].
//!
//! # Authentication option
//!
//! In deployments with a feedback key, type [`FEEDBACK_AUTH_OPTION_TYPE`] (0x02, not
//! critical), length 7 (28 data bytes), big-endian: the key epoch (4 bytes: which of the
//! deployment's keys signed, as PSP's SPI names a key, PSP 3.1), the nonce (8) and the tag
//! (16), HMAC-SHA256 truncated to 128 bits over [`FeedbackAuth::message`]. The epoch lets
//! the key rotate while feedback flows: a receiver holds more than one key and picks the
//! one the sender names.

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

/// Option type of the feedback authentication option within [`PICNIC_OPTION_CLASS`].
pub const FEEDBACK_AUTH_OPTION_TYPE: u8 = 0x02;

/// Bytes of feedback authentication option data: key epoch (4), nonce (8) and truncated
/// tag (16).
pub const FEEDBACK_AUTH_DATA_LEN: usize = 28;

/// Bytes of the truncated HMAC-SHA256 tag.
pub const FEEDBACK_TAG_LEN: usize = 16;

/// Bytes of the message a feedback tag is computed over (see [`FeedbackAuth::message`]).
pub const FEEDBACK_AUTH_MESSAGE_LEN: usize = 8 + 4 + 4 + 4 + FEEDBACK_DATA_LEN + 4 + 8;

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

/// Authentication of the feedback option in the same Geneve header (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FeedbackAuth {
    /// Which of the deployment's feedback keys computed the tag.
    pub epoch: u32,
    /// Never repeated by the sending host; the receiver refuses nonces it has seen.
    pub nonce: u64,
    /// HMAC-SHA256 of [`FeedbackAuth::message`], truncated.
    pub tag: [u8; FEEDBACK_TAG_LEN],
}

impl FeedbackAuth {
    /// Parses the option data; it must be exactly [`FEEDBACK_AUTH_DATA_LEN`] bytes.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        let data: &[u8; FEEDBACK_AUTH_DATA_LEN] = data.try_into().map_err(|_| Error::BadLength)?;
        let (epoch, rest) = data.split_at(4);
        let (nonce, tag) = rest.split_at(8);
        Ok(FeedbackAuth {
            epoch: u32::from_be_bytes(epoch.try_into().map_err(|_| Error::BadLength)?),
            nonce: u64::from_be_bytes(nonce.try_into().map_err(|_| Error::BadLength)?),
            tag: tag.try_into().map_err(|_| Error::BadLength)?,
        })
    }

    /// Writes the option data into the first [`FEEDBACK_AUTH_DATA_LEN`] bytes of `data`.
    pub fn emit(&self, data: &mut [u8]) -> Result<usize, Error> {
        let out = data
            .get_mut(..FEEDBACK_AUTH_DATA_LEN)
            .ok_or(Error::BufferTooSmall {
                needed: FEEDBACK_AUTH_DATA_LEN,
            })?;
        out[..4].copy_from_slice(&self.epoch.to_be_bytes());
        out[4..12].copy_from_slice(&self.nonce.to_be_bytes());
        out[12..].copy_from_slice(&self.tag);
        Ok(FEEDBACK_AUTH_DATA_LEN)
    }

    /// The bytes a tag covers: the label `picnicfb`, the sending and receiving hosts'
    /// underlay IPv4 addresses (so feedback cannot be replayed to another host), the VNI, the
    /// feedback option's data, the key epoch and the nonce, all big-endian.
    pub fn message(
        src_ip: core::net::Ipv4Addr,
        dst_ip: core::net::Ipv4Addr,
        vni: u32,
        feedback: &FeedbackOption,
        epoch: u32,
        nonce: u64,
    ) -> [u8; FEEDBACK_AUTH_MESSAGE_LEN] {
        let mut m = [0u8; FEEDBACK_AUTH_MESSAGE_LEN];
        m[..8].copy_from_slice(b"picnicfb");
        m[8..12].copy_from_slice(&src_ip.octets());
        m[12..16].copy_from_slice(&dst_ip.octets());
        m[16..20].copy_from_slice(&vni.to_be_bytes());
        // FEEDBACK_DATA_LEN bytes always fit.
        let _ = feedback.emit(&mut m[20..20 + FEEDBACK_DATA_LEN]);
        let at = 20 + FEEDBACK_DATA_LEN;
        m[at..at + 4].copy_from_slice(&epoch.to_be_bytes());
        m[at + 4..].copy_from_slice(&nonce.to_be_bytes());
        m
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
    fn auth_option_round_trips_and_message_binds_every_field() {
        let auth = FeedbackAuth {
            epoch: 0x0a0b_0c0d,
            nonce: 0x0102_0304_0506_0708,
            tag: [9; FEEDBACK_TAG_LEN],
        };
        let mut data = [0u8; FEEDBACK_AUTH_DATA_LEN];
        assert_eq!(auth.emit(&mut data), Ok(FEEDBACK_AUTH_DATA_LEN));
        assert_eq!(data[..12], [10, 11, 12, 13, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(FeedbackAuth::parse(&data), Ok(auth));
        assert_eq!(FeedbackAuth::parse(&data[..20]), Err(Error::BadLength));
        let fb = FeedbackOption {
            dst_endpoint: 1,
            rate_bps: 2,
            seq: 3,
        };
        let (a, b) = ([198, 19, 0, 1].into(), [198, 19, 0, 2].into());
        let m = FeedbackAuth::message(a, b, 7, &fb, 1, 5);
        assert_eq!(&m[..8], b"picnicfb");
        // Every field changes the message.
        for other in [
            FeedbackAuth::message(b, a, 7, &fb, 1, 5),
            FeedbackAuth::message(a, b, 8, &fb, 1, 5),
            FeedbackAuth::message(a, b, 7, &FeedbackOption { seq: 4, ..fb }, 1, 5),
            FeedbackAuth::message(a, b, 7, &fb, 2, 5),
            FeedbackAuth::message(a, b, 7, &fb, 1, 6),
        ] {
            assert_ne!(m, other);
        }
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
