//! picnic-core: the sans-I/O isolation mechanisms.
//!
//! Every mechanism here is a plain struct fed with packet descriptors and `now`,
//! returning decisions. No sockets, threads or clock reads (DESIGN.md section 2).

pub mod slo;
pub mod time;

pub use time::{Duration, Instant};
