//! Who may send congestion feedback, and its authentication (DESIGN.md 4 "Overlay"; the
//! trust model is in docs/switch.md "Security").
//!
//! Feedback lowers a sender's limiter towards one destination endpoint (EyeQ 3.3), so it is
//! a lever over other tenants' traffic. Before anything is applied the engine checks, in
//! this order, and drops and counts what fails ([`FeedbackReject`]):
//! 1. **forged**: the feedback's endpoint is a VM of the packet's VNI whose owning host (the
//!    directory's `host`) is the host the packet comes from (outer source address). Only the
//!    receiver of a flow may slow it down.
//! 2. **unauthenticated**: with a per-deployment key, the packet carries the authentication
//!    option and its tag, HMAC-SHA256 (RFC 2104) truncated to 128 bits (RFC 4868 2.6),
//!    matches (compared in constant time). Without it any underlay node that can forge an
//!    owner's source address passes step 1.
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

/// The deployment's feedback key and this host's nonce and replay state.
pub struct FeedbackAuthState {
    mac: Hmac<Sha256>,
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

impl FeedbackAuthState {
    /// Fails when the key is shorter than [`MIN_KEY_LEN`].
    pub fn new(key: &[u8], wall_at_zero_ns: u64) -> Result<FeedbackAuthState, String> {
        if key.len() < MIN_KEY_LEN {
            return Err(format!(
                "the feedback key has {} bytes; at least {MIN_KEY_LEN} are needed",
                key.len()
            ));
        }
        let mac = Hmac::<Sha256>::new_from_slice(key).map_err(|e| e.to_string())?;
        Ok(FeedbackAuthState {
            mac,
            wall_at_zero_ns,
            last_nonce: 0,
            lane: 0,
            windows: HashMap::new(),
        })
    }

    /// Signs in nonce lane `lane` (a worker's index; 0 for a single loop), at most 255.
    pub fn set_lane(&mut self, lane: u8) {
        self.lane = u64::from(lane);
    }

    fn wall_secs(&self, now: Instant) -> u64 {
        (self.wall_at_zero_ns + now.as_nanos()) / 1_000_000_000
    }

    fn tag(&self, message: &[u8]) -> [u8; FEEDBACK_TAG_LEN] {
        let mut mac = self.mac.clone();
        mac.update(message);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; FEEDBACK_TAG_LEN];
        tag.copy_from_slice(&full[..FEEDBACK_TAG_LEN]);
        tag
    }

    /// Authenticates feedback this host sends: a fresh nonce (the time in seconds above the
    /// lane and a 24-bit counter, always growing) and its tag.
    pub fn sign(
        &mut self,
        now: Instant,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        vni: u32,
        fb: &FeedbackOption,
    ) -> FeedbackAuth {
        let nonce = (self.last_nonce + 1).max((self.wall_secs(now) << 32) | (self.lane << 24));
        self.last_nonce = nonce;
        let tag = self.tag(&FeedbackAuth::message(src_ip, dst_ip, vni, fb, nonce));
        FeedbackAuth { nonce, tag }
    }

    /// Checks the tag, then the nonce's time and window; only a valid tag moves the window.
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
        let mut mac = self.mac.clone();
        mac.update(&FeedbackAuth::message(src_ip, dst_ip, vni, fb, auth.nonce));
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
/// underlay address `src_ip` to this host (`my_ip`). `auth` is the key state, if the
/// deployment has a key.
#[allow(clippy::too_many_arguments)]
pub fn check(
    dir: &Directory,
    auth_state: Option<&mut FeedbackAuthState>,
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
    if let Some(state) = auth_state {
        state.verify(now, from_host, src_ip, my_ip, vni, fb, auth)?;
    }
    if fb.rate_bps == 0 || fb.rate_bps > MAX_FEEDBACK_BPS {
        return Err(FeedbackReject::OutOfRange);
    }
    Ok(())
}
