//! EyeQ receiver-driven rate control (Jeyakumar et al., NSDI 2013, sections 3.2 to 3.4).
//!
//! Congestion at a receiving resource (the host's access link, or the ingress engine's
//! processing budget as in PicNIC) is detected at the receiver and enforced at the senders:
//!
//! - [`Receiver`] (the "REM") meters every local endpoint over short windows, splits the
//!   resource's capacity among the active endpoints by their guarantees (the RX scheduler),
//!   runs one RCP-style controller per endpoint and samples packets to send [`Feedback`]
//!   (the advertised rate `R_i`) back to their sources.
//! - [`Sender`] (the "SEM") keeps one rate per congested destination, set by that feedback,
//!   halved when the receiver goes silent and dropped when idle. It only decides rates; the
//!   switch shapes traffic with a token bucket at [`Sender::rate_for`].
//!
//! All rates are in *units per second*: bytes/s when the resource is a link, processing-cost
//! units/s (for example nanoseconds of engine time per second) when it is the ingress engine.
//! Receiver and senders must agree on the unit.

mod receiver;
mod sender;

pub use receiver::{
    Aggregate, EndpointConfig, EndpointStats, Feedback, Receiver, ReceiverConfig, AGGREGATE_RECENT,
};
pub use sender::{FeedbackOutcome, LimiterStats, Sender, SenderConfig};

/// Errors of the EyeQ mechanisms: configuration mistakes and calls naming unknown endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EyeqError {
    /// A configuration field is out of range; the string names the field and the rule.
    InvalidConfig(&'static str),
    /// The endpoint is not registered with the receiver; add it with `add_endpoint` first.
    UnknownEndpoint,
    /// `add_endpoint` was called for an id that is already registered.
    DuplicateEndpoint,
}

impl core::fmt::Display for EyeqError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EyeqError::InvalidConfig(what) => write!(f, "invalid EyeQ configuration: {what}"),
            EyeqError::UnknownEndpoint => {
                write!(f, "unknown endpoint: register it with add_endpoint first")
            }
            EyeqError::DuplicateEndpoint => write!(f, "endpoint is already registered"),
        }
    }
}

impl std::error::Error for EyeqError {}
