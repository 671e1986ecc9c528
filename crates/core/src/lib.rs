//! picnic-core: the sans-I/O isolation mechanisms.
//!
//! Every mechanism here is a plain struct fed with packet descriptors and `now`,
//! returning decisions. No sockets, threads or clock reads (DESIGN.md section 2).

pub mod eyeq;
pub mod fairnic;
pub mod iron;
pub mod slo;
pub mod time;
pub mod wfq;

pub use time::{Duration, Instant};
