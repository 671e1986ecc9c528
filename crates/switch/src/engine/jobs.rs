//! What the engines hand the shared encryption engine ([`crate::accel`]) and take back: a
//! [`Job`] (a frame and what to do with it) and its [`Completion`]. Plain data, so the
//! engines stay sans-I/O and the threaded engine above them imports these from here.

use picnic_core::{Duration, Instant};
use serde::Serialize;

use crate::frame::Frame;

/// What to do with a frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Seal a plain tunnel packet with the tenant's sending key.
    Seal,
    /// Open a sealed tunnel packet with the tenant's key of its epoch.
    Open,
}

/// A frame for the engine. `cookie` is the caller's, given back with the result.
pub struct Job {
    pub tenant: usize,
    pub op: Op,
    pub frame: Frame,
    pub cookie: u64,
}

/// How a job ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Sealed or opened: the frame holds the result.
    Done,
    /// Open: the tag did not verify (tampered, or sealed with another key).
    AuthFailed,
    /// Open: the tenant has no live key of the packet's epoch.
    UnknownKey,
    /// Seal: the tenant has no key.
    NoKey,
    /// Not a tunnel packet the engine can seal or open.
    Malformed,
}

/// A finished job.
pub struct Completion {
    pub tenant: usize,
    pub op: Op,
    pub frame: Frame,
    pub cookie: u64,
    pub outcome: Outcome,
    /// Worker CPU the job took, ns (charged to the tenant).
    pub cpu_ns: u64,
    /// Time the job waited in its tenant's queue.
    pub waited: Duration,
    /// When it was queued (the engine's clock), for its turnaround.
    pub(crate) queued_at: Instant,
}
