//! picnic-core: the sans-I/O isolation mechanisms.
//!
//! Every mechanism here is a plain struct fed with packet descriptors and `now`,
//! returning decisions. No sockets, threads or clock reads (DESIGN.md section 2).

/// Token buckets and shapers (EyeQ 4, FairNIC 4.4, PicNIC 2.1).
pub mod bucket;
/// The measured per-frame cost model of a dataplane loop (Iron 3.1).
pub mod cost;
pub mod eyeq;
pub mod fairnic;
pub mod iron;
/// Per-endpoint windowed rate meters with EWMA (EyeQ 3.2).
pub mod meter;
pub mod notify;
/// A lock-free token bucket shared by dataplane workers and their per-worker token caches
/// (EyeQ 4, FairNIC 4.4).
pub mod pool;
/// Data rates in bits per second.
pub mod rate;
pub mod slo;
pub mod time;
pub mod wfq;

pub use rate::Rate;
pub use time::{Duration, Instant};
