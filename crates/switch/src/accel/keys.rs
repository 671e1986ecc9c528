//! A tenant's live keys: the one it seals with and at most one other, so a key can be
//! rotated without dropping packets (PSP 3.1: a receiver accepts the current and the previous
//! key while senders move over).
//!
//! Rotation across hosts: install the new epoch everywhere without activating it (every host
//! now opens both), then activate it everywhere (hosts seal with it; packets sealed with the
//! old key before that are still opened). Installing a third epoch forgets the key that is
//! neither the sending key nor the newest.

use std::sync::Arc;

use picnic_wire::seal::TunnelKey;

use super::Shared;

/// The keys of one tenant.
#[derive(Clone, Debug, Default)]
pub struct KeyRing {
    /// The epoch new packets are sealed with.
    send: Option<u32>,
    /// At most two (epoch, key), the sending key among them.
    keys: Vec<(u32, Arc<TunnelKey>)>,
}

/// Why a key could not be installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// This epoch already holds a different key; a new key needs a new epoch.
    EpochInUse(u32),
    /// Activation of an epoch that is not installed.
    UnknownEpoch(u32),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::EpochInUse(e) => {
                write!(f, "key epoch {e} is in use: give the new key a new epoch")
            }
            KeyError::UnknownEpoch(e) => write!(f, "no key of epoch {e} is installed"),
        }
    }
}

impl std::error::Error for KeyError {}

impl KeyRing {
    /// Installs `key` as `epoch` (re-installing the same key is a no-op), and makes it the
    /// sending key when `activate` (or when there is none yet).
    pub fn install(&mut self, epoch: u32, key: TunnelKey, activate: bool) -> Result<(), KeyError> {
        if let Some((_, old)) = self.keys.iter().find(|(e, _)| *e == epoch) {
            if old.fingerprint() != key.fingerprint() {
                return Err(KeyError::EpochInUse(epoch));
            }
        } else {
            if self.keys.len() == 2 {
                let send = self.send;
                let forget = self
                    .keys
                    .iter()
                    .position(|(e, _)| Some(*e) != send)
                    .unwrap_or(0);
                self.keys.remove(forget);
            }
            self.keys.push((epoch, Arc::new(key)));
        }
        if activate || self.send.is_none() {
            self.send = Some(epoch);
        }
        Ok(())
    }

    /// Makes the installed `epoch` the sending key.
    pub fn activate(&mut self, epoch: u32) -> Result<(), KeyError> {
        if !self.keys.iter().any(|(e, _)| *e == epoch) {
            return Err(KeyError::UnknownEpoch(epoch));
        }
        self.send = Some(epoch);
        Ok(())
    }

    /// The sending key and its epoch.
    pub fn sending(&self) -> Option<(u32, Arc<TunnelKey>)> {
        let epoch = self.send?;
        self.get(epoch).map(|k| (epoch, k))
    }

    /// The key of `epoch`, if live.
    pub fn get(&self, epoch: u32) -> Option<Arc<TunnelKey>> {
        self.keys
            .iter()
            .find(|(e, _)| *e == epoch)
            .map(|(_, k)| Arc::clone(k))
    }

    /// The key of `epoch`, borrowed.
    pub fn key(&self, epoch: u32) -> Option<&TunnelKey> {
        self.keys
            .iter()
            .find(|(e, _)| *e == epoch)
            .map(|(_, k)| &**k)
    }

    /// The live epochs and which one seals, for the API.
    pub fn epochs(&self) -> (Vec<u32>, Option<u32>) {
        (self.keys.iter().map(|(e, _)| *e).collect(), self.send)
    }
}

/// The tenants' keys of a running engine, for the API thread.
#[derive(Clone)]
pub struct AccelKeys {
    pub(super) shared: Arc<Shared>,
    pub(super) names: Vec<String>,
}

impl AccelKeys {
    /// Installs `key` as `epoch` for the tenant `name`, sealing with it when `activate`
    /// (see [`KeyRing::install`]).
    pub fn install(
        &self,
        name: &str,
        epoch: u32,
        key: TunnelKey,
        activate: bool,
    ) -> anyhow::Result<()> {
        self.with_ring(name, |ring| Ok(ring.install(epoch, key, activate)?))
    }

    /// Makes the installed `epoch` the sending key of tenant `name`.
    pub fn activate(&self, name: &str, epoch: u32) -> anyhow::Result<()> {
        self.with_ring(name, |ring| Ok(ring.activate(epoch)?))
    }

    /// The live epochs of tenant `name`, the sending one, and each key's fingerprint (hex).
    pub fn describe(&self, name: &str) -> anyhow::Result<serde_json::Value> {
        self.with_ring(name, |ring| {
            let (epochs, sending) = ring.epochs();
            let keys: Vec<_> = epochs
                .iter()
                .map(|&e| {
                    let fp = ring.key(e).map(|k| k.fingerprint()).unwrap_or_default();
                    let hex: String = fp.iter().map(|b| format!("{b:02x}")).collect();
                    serde_json::json!({ "epoch": e, "fingerprint": hex })
                })
                .collect();
            Ok(serde_json::json!({ "tenant": name, "sending_epoch": sending, "keys": keys }))
        })
    }

    fn with_ring<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut KeyRing) -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        let t = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| anyhow::anyhow!("no tenant '{name}'"))?;
        let mut rings = self.shared.keys.write().unwrap_or_else(|e| e.into_inner());
        match rings.get_mut(t) {
            Some(ring) if ring.sending().is_some() => f(ring),
            _ => anyhow::bail!("tenant '{name}' does not encrypt (set encrypt = true and a key)"),
        }
    }
}
