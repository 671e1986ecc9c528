//! MAC addresses as the config writes them.

use std::fmt;
use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};

/// A MAC address written `02:00:00:00:00:01` in the config.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}
impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 6];
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(format!(
                "'{s}' is not a MAC address (want six hex bytes like 02:00:00:00:00:01)"
            ));
        }
        for (o, p) in out.iter_mut().zip(parts) {
            *o = u8::from_str_radix(p, 16)
                .map_err(|_| format!("'{s}' is not a MAC address (bad byte '{p}')"))?;
        }
        Ok(Mac(out))
    }
}
impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
impl Mac {
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
    pub const BROADCAST: Mac = Mac([0xff; 6]);

    /// The EUI-64 link-local address a host derives from this MAC (RFC 4291 appendix A,
    /// RFC 4862).
    pub fn link_local(self) -> Ipv6Addr {
        let m = self.0;
        Ipv6Addr::from([
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            m[0] ^ 0x02,
            m[1],
            m[2],
            0xff,
            0xfe,
            m[3],
            m[4],
            m[5],
        ])
    }
}
