//! The deployment's feedback keys by epoch (docs/switch.md "Rotating the feedback key"): the
//! `[feedback_keys]` section, which the control plane writes from its `keys/feedback` record
//! and the state file keeps. Like a tenant's keys (PSP 3.1), a receiver accepts every epoch
//! listed (the previous, the active and a staged next) and a sender signs with the active
//! one, so the key rotates while feedback flows.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::feedback::MIN_KEY_LEN;

/// One epoch's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochKey {
    /// Which key this is: senders put it in the authentication option.
    pub epoch: u32,
    /// The key, hex (at least 32 bytes: 64 digits).
    pub key: String,
}

impl EpochKey {
    /// The key's bytes; Err says what is wrong with its hex.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        let hex = self.key.as_bytes();
        if hex.len() % 2 != 0 {
            return Err("an odd number of hex digits".into());
        }
        let digit = |c: u8| (c as char).to_digit(16).ok_or("not hex");
        let bytes = hex
            .chunks(2)
            .map(|p| Ok((digit(p[0])? * 16 + digit(p[1])?) as u8))
            .collect::<Result<Vec<u8>, &str>>()?;
        if bytes.len() < MIN_KEY_LEN {
            return Err(format!(
                "{} bytes; at least {MIN_KEY_LEN} are needed",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    /// The first 8 bytes of the key's SHA-256, hex: names the key without showing it.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.bytes().unwrap_or_default());
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The keys a host holds. Epochs grow: `previous` < `active` < `next`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackKeys {
    /// The key feedback is signed with; None: this host neither signs its feedback nor
    /// requires a signature on what it receives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<EpochKey>,
    /// The key active before: still accepted, from hosts that have not moved over yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<EpochKey>,
    /// A staged key: accepted, so that hosts may start signing with it in any order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<EpochKey>,
}

impl FeedbackKeys {
    /// Every key held, oldest first.
    pub fn all(&self) -> impl Iterator<Item = &EpochKey> {
        [&self.previous, &self.active, &self.next]
            .into_iter()
            .flatten()
    }

    /// Err: (the field under `feedback_keys`, what is wrong).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let named = [
            ("previous", &self.previous),
            ("active", &self.active),
            ("next", &self.next),
        ];
        let mut last: Option<u32> = None;
        for (name, key) in named {
            let Some(k) = key else { continue };
            k.bytes().map_err(|e| (format!("{name}.key"), e))?;
            if last.is_some_and(|l| k.epoch <= l) {
                return Err((
                    format!("{name}.epoch"),
                    "epochs must grow: previous < active < next".into(),
                ));
            }
            last = Some(k.epoch);
        }
        Ok(())
    }

    /// The keys with their material hidden (for `/config` and logs): epochs and fingerprints.
    pub fn redacted(&self) -> FeedbackKeys {
        let hide = |k: &Option<EpochKey>| {
            k.as_ref().map(|k| EpochKey {
                epoch: k.epoch,
                key: format!("(redacted; fingerprint {})", k.fingerprint()),
            })
        };
        FeedbackKeys {
            active: hide(&self.active),
            previous: hide(&self.previous),
            next: hide(&self.next),
        }
    }

    /// "active N, previous N, next N" for logs.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (name, k) in [
            ("active", &self.active),
            ("previous", &self.previous),
            ("next", &self.next),
        ] {
            if let Some(k) = k {
                parts.push(format!("{name} epoch {} ({})", k.epoch, k.fingerprint()));
            }
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(epoch: u32, byte: u8) -> Option<EpochKey> {
        Some(EpochKey {
            epoch,
            key: format!("{byte:02x}").repeat(32),
        })
    }

    #[test]
    fn keys_are_hex_of_32_bytes_and_epochs_grow() {
        let ok = FeedbackKeys {
            previous: key(1, 1),
            active: key(2, 2),
            next: key(3, 3),
        };
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(ok.all().map(|k| k.epoch).collect::<Vec<_>>(), [1, 2, 3]);
        let bad = |k: FeedbackKeys| k.validate().unwrap_err().0;
        let short = FeedbackKeys {
            active: Some(EpochKey {
                epoch: 1,
                key: "ab".repeat(31),
            }),
            ..Default::default()
        };
        assert_eq!(bad(short), "active.key");
        let not_hex = FeedbackKeys {
            next: Some(EpochKey {
                epoch: 1,
                key: "zz".repeat(32),
            }),
            ..Default::default()
        };
        assert_eq!(bad(not_hex), "next.key");
        let backwards = FeedbackKeys {
            previous: key(3, 1),
            active: key(2, 2),
            next: None,
        };
        assert_eq!(bad(backwards), "active.epoch");
        // Redacted: no key material, the same fingerprint.
        let shown = serde_json::to_string(&ok.redacted()).unwrap();
        assert!(!shown.contains(&"02".repeat(32)), "{shown}");
        assert!(shown.contains(&ok.active.as_ref().unwrap().fingerprint()));
    }
}
