//! The egress engine's uplink pacer: holds the root WFQ to the uplink's capacity, so the
//! scheduler, not a FIFO downstream, decides who goes first. One loop paces with a bucket of
//! its own; with several workers each worker borrows from the host's one link bucket
//! (`SharedBudgets::link`) through a token cache of its own.
//!
//! A leaf: it knows buckets only; when and at what rate egress is paced is the egress
//! engine's (`pacer_rate`, `Egress::share_pacer`).

use std::sync::Arc;

use picnic_core::bucket::TokenBucket;
use picnic_core::pool::{SharedBucket, TokenCache};
use picnic_core::Instant;

/// Paces the WFQ to the uplink: a bucket of its own, or with several workers a token cache of
/// the link's bucket every worker borrows from (EyeQ 4: the total tokens, a local count per
/// CPU borrowing only when it runs out).
pub(super) enum Pacer {
    Own(TokenBucket),
    Shared(Arc<SharedBucket>, TokenCache),
}

impl Pacer {
    /// A pacer borrowing from the host's `link` bucket `chunk` bytes at a time.
    pub(super) fn shared(link: &Arc<SharedBucket>, chunk: u64) -> Pacer {
        Pacer::Shared(link.clone(), TokenCache::new(chunk))
    }

    /// Takes a sent frame's `bytes` (debt when short).
    pub(super) fn force_consume(&mut self, now: Instant, bytes: u64) {
        match self {
            Pacer::Own(b) => {
                b.force_consume(now, bytes);
            }
            Pacer::Shared(link, cache) => cache.charge(now, link, bytes),
        }
    }

    /// Whether a frame may leave now.
    pub(super) fn has_tokens(&self, now: Instant) -> bool {
        match self {
            Pacer::Own(b) => b.available(now) > 0,
            Pacer::Shared(link, cache) => !cache.exhausted(now, link),
        }
    }

    /// Returns the link tokens a shared pacer's cache holds (its worker stops).
    pub(super) fn release(&mut self, now: Instant) {
        if let Pacer::Shared(link, cache) = self {
            cache.release(now, link);
        }
    }
}
