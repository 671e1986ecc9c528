//! Who may send congestion feedback, and its authentication (DESIGN.md 4 "Overlay"; the
//! trust model is in docs/switch.md "Security").
//!
//! Feedback lowers a sender's limiter towards one destination endpoint (EyeQ 3.3), so it is
//! a lever over other tenants' traffic. Before anything is applied the engine checks, in
//! this order, and drops and counts what fails ([`FeedbackReject`]):
//! 1. **forged**: the feedback's endpoint is a VM of the packet's VNI whose owning host (the
//!    directory's `host`) is the host the packet comes from (outer source address). Only the
//!    receiver of a flow may slow it down.
//! 2. **unknown epoch**, **unauthenticated**: with a per-deployment key, the packet carries
//!    the authentication option, this host holds the key of its epoch (the previous, active
//!    or staged next: [`FeedbackAuthState`]), and its tag, HMAC-SHA256 (RFC 2104) truncated
//!    to 128 bits (RFC 4868 2.6), matches (compared in constant time). Without it any
//!    underlay node that can forge an owner's source address passes step 1.
//! 3. **replayed**: with a key, the nonce's timestamp (its high 32 bits, seconds) lies within
//!    [`MAX_CLOCK_SKEW_SECS`] of this host's clock and the nonce was not seen before from that
//!    host: a 64-nonce sliding window per host and nonce lane (RFC 4303 3.4.3; a host's workers
//!    sign in lanes of their own, bits 24..32 of the nonce).
//! 4. **out of range**: the rate is in 1 b/s..=[`MAX_FEEDBACK_BPS`].

use std::collections::HashMap;
use std::net::Ipv4Addr;

use hmac::{Hmac, Mac as _};
use picnic_core::Instant;
use picnic_wire::feedback::{FeedbackAuth, FeedbackOption, FEEDBACK_TAG_LEN};
use sha2::Sha256;

use crate::config::FeedbackKeys;
use crate::directory::Directory;
use crate::stats::FeedbackReject;

/// Highest rate feedback may carry, bits/s (10 Tb/s): beyond any link, and far from where
/// limiter arithmetic could overflow.
pub const MAX_FEEDBACK_BPS: u64 = 10_000_000_000_000;

/// How far a nonce's timestamp may be from this host's clock, s. Authenticated feedback
/// older than this is refused even by a window that was just reset (a restart).
pub const MAX_CLOCK_SKEW_SECS: u64 = 10;

/// Shortest feedback key accepted, bytes (HMAC-SHA256's output length, RFC 2104 section 3).
pub const MIN_KEY_LEN: usize = 32;

/// Nonces remembered per sending host below the highest seen.
const REPLAY_WINDOW: u64 = 64;

/// The deployment's feedback keys by epoch and this host's nonce and replay state.
///
/// Rotation (docs/switch.md "Rotating the feedback key"; PSP 3.1 for tenants' keys): a
/// receiver accepts every epoch it holds, the previous, the active and a staged next, and a
/// sender signs with the active one and names its epoch. The control plane stages a new
/// epoch on every host before any host activates it, so hosts may move over in any order.
/// Installing keys keeps the nonces and replay windows: nonces never repeat across epochs.
#[derive(Default)]
pub struct FeedbackAuthState {
    /// The keys accepted, by epoch: at most the previous, the active and the next.
    keys: Vec<(u32, Hmac<Sha256>)>,
    /// The epoch this host signs with; None: it neither signs nor requires a signature.
    active: Option<u32>,
    /// `switch.feedback_key_file`'s key, epoch [`FILE_EPOCH`], active while the control
    /// plane gives no keys.
    file_key: Option<Hmac<Sha256>>,
    /// Whether the keys came from the control plane (the config's `feedback_keys`).
    from_control: bool,
    /// Wall-clock time at the engines' `Instant::ZERO`, ns since the UNIX epoch: the engine
    /// stays sans-I/O, the caller reads the clock once.
    wall_at_zero_ns: u64,
    /// The last nonce this host sent.
    last_nonce: u64,
    /// This worker's nonce lane (bits 24..32 of its nonces): the workers of a host sign
    /// independently, so each has its own nonce space and replay window at the receivers.
    lane: u64,
    /// Per sending host id and lane: (highest nonce accepted, bitmap of the ones below it).
    windows: HashMap<(u32, u64), (u64, u64)>,
}

/// The epoch of `switch.feedback_key_file`'s key (the control plane's epochs start at 1).
pub const FILE_EPOCH: u32 = 0;

fn mac_of(key: &[u8]) -> Result<Hmac<Sha256>, String> {
    if key.len() < MIN_KEY_LEN {
        return Err(format!(
            "the feedback key has {} bytes; at least {MIN_KEY_LEN} are needed",
            key.len()
        ));
    }
    Hmac::<Sha256>::new_from_slice(key).map_err(|e| e.to_string())
}

impl FeedbackAuthState {
    /// A state holding `key` as the key file's (epoch [`FILE_EPOCH`], active). Fails when
    /// the key is shorter than [`MIN_KEY_LEN`].
    pub fn new(key: &[u8], wall_at_zero_ns: u64) -> Result<FeedbackAuthState, String> {
        let mut state = FeedbackAuthState::default();
        state.set_file_key(Some(key), wall_at_zero_ns)?;
        Ok(state)
    }

    /// Sets the wall clock and the key file's key, which is used while the control plane
    /// gives no keys.
    pub fn set_file_key(&mut self, key: Option<&[u8]>, wall_at_zero_ns: u64) -> Result<(), String> {
        self.wall_at_zero_ns = wall_at_zero_ns;
        self.file_key = key.map(mac_of).transpose()?;
        if !self.from_control {
            self.install(None)?;
        }
        Ok(())
    }

    /// Holds `keys` (the control plane's), or the key file's key when None. All or nothing:
    /// a bad key changes nothing.
    pub fn install(&mut self, keys: Option<&FeedbackKeys>) -> Result<(), String> {
        let (held, active) = match keys {
            Some(k) => {
                let held = k
                    .all()
                    .map(|e| Ok((e.epoch, mac_of(&e.bytes()?)?)))
                    .collect::<Result<Vec<_>, String>>()?;
                (held, k.active.as_ref().map(|e| e.epoch))
            }
            None => match &self.file_key {
                Some(mac) => (vec![(FILE_EPOCH, mac.clone())], Some(FILE_EPOCH)),
                None => (Vec::new(), None),
            },
        };
        self.keys = held;
        self.active = active;
        self.from_control = keys.is_some();
        Ok(())
    }

    /// The epochs held, oldest first, and the one this host signs with.
    pub fn epochs(&self) -> (Vec<u32>, Option<u32>) {
        (self.keys.iter().map(|(e, _)| *e).collect(), self.active)
    }

    /// Whether feedback must carry a valid signature: this host has an active key.
    pub fn required(&self) -> bool {
        self.active.is_some()
    }

    /// Signs in nonce lane `lane` (a worker's index; 0 for a single loop), at most 255.
    pub fn set_lane(&mut self, lane: u8) {
        self.lane = u64::from(lane);
    }

    fn wall_secs(&self, now: Instant) -> u64 {
        (self.wall_at_zero_ns + now.as_nanos()) / 1_000_000_000
    }

    fn tag(mac: &Hmac<Sha256>, message: &[u8]) -> [u8; FEEDBACK_TAG_LEN] {
        let mut mac = mac.clone();
        mac.update(message);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; FEEDBACK_TAG_LEN];
        tag.copy_from_slice(&full[..FEEDBACK_TAG_LEN]);
        tag
    }

    /// Authenticates feedback this host sends with the active key (None without one): its
    /// epoch, a fresh nonce (the time in seconds above the lane and a 24-bit counter, always
    /// growing) and the tag.
    pub fn sign(
        &mut self,
        now: Instant,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        vni: u32,
        fb: &FeedbackOption,
    ) -> Option<FeedbackAuth> {
        let epoch = self.active?;
        let (_, mac) = self.keys.iter().find(|(e, _)| *e == epoch)?;
        let nonce = (self.last_nonce + 1).max((self.wall_secs(now) << 32) | (self.lane << 24));
        let tag = Self::tag(
            mac,
            &FeedbackAuth::message(src_ip, dst_ip, vni, fb, epoch, nonce),
        );
        self.last_nonce = nonce;
        Some(FeedbackAuth { epoch, nonce, tag })
    }

    /// Checks the epoch and the tag, then the nonce's time and window; only a valid tag moves
    /// the window.
    #[allow(clippy::too_many_arguments)]
    fn verify(
        &mut self,
        now: Instant,
        from_host: u32,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        vni: u32,
        fb: &FeedbackOption,
        auth: Option<&FeedbackAuth>,
    ) -> Result<(), FeedbackReject> {
        let auth = auth.ok_or(FeedbackReject::Unauthenticated)?;
        let (_, mac) = self
            .keys
            .iter()
            .find(|(e, _)| *e == auth.epoch)
            .ok_or(FeedbackReject::UnknownEpoch)?;
        let mut mac = mac.clone();
        let message = FeedbackAuth::message(src_ip, dst_ip, vni, fb, auth.epoch, auth.nonce);
        mac.update(&message);
        mac.verify_truncated_left(&auth.tag)
            .map_err(|_| FeedbackReject::Unauthenticated)?;
        if (auth.nonce >> 32).abs_diff(self.wall_secs(now)) > MAX_CLOCK_SKEW_SECS {
            return Err(FeedbackReject::Replayed);
        }
        let lane = (auth.nonce >> 24) & 0xff;
        let (top, seen) = self.windows.entry((from_host, lane)).or_insert((0, 0));
        if auth.nonce > *top {
            let shift = auth.nonce - *top;
            *seen = if shift >= REPLAY_WINDOW {
                1
            } else {
                (*seen << shift) | 1
            };
            *top = auth.nonce;
            return Ok(());
        }
        let behind = *top - auth.nonce;
        if behind >= REPLAY_WINDOW || *seen & (1 << behind) != 0 {
            return Err(FeedbackReject::Replayed);
        }
        *seen |= 1 << behind;
        Ok(())
    }
}

/// Every check of the module docs, in order, for feedback `fb` in a packet of VNI `vni` from
/// underlay address `src_ip` to this host (`my_ip`). `auth_state` is this host's keys; the
/// signature is checked when it has an active key.
#[allow(clippy::too_many_arguments)]
pub fn check(
    dir: &Directory,
    auth_state: &mut FeedbackAuthState,
    now: Instant,
    src_ip: Ipv4Addr,
    my_ip: Ipv4Addr,
    vni: u32,
    fb: &FeedbackOption,
    auth: Option<&FeedbackAuth>,
) -> Result<(), FeedbackReject> {
    let from_host = dir.host_by_underlay(src_ip).ok_or(FeedbackReject::Forged)?;
    let owned = dir.vm_by_id(fb.dst_endpoint).is_some_and(|v| {
        let vm = &dir.vms[v];
        vm.host == from_host && dir.tenants[vm.tenant].vni == vni
    });
    if !owned {
        return Err(FeedbackReject::Forged);
    }
    if auth_state.required() {
        auth_state.verify(now, from_host, src_ip, my_ip, vni, fb, auth)?;
    }
    if fb.rate_bps == 0 || fb.rate_bps > MAX_FEEDBACK_BPS {
        return Err(FeedbackReject::OutOfRange);
    }
    Ok(())
}

#[cfg(test)]
#[path = "feedback_rotation_tests.rs"]
mod rotation_tests;
