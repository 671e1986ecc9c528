//! picnic-wire: packet formats, parsed and emitted without panics on any bytes.
//!
//! - [`geneve`]: the Geneve overlay header (RFC 8926), a checked zero-copy view and a
//!   `parse`/`emit` representation in the style of smoltcp's `wire/`.
//! - [`feedback`]: picnic's Geneve option carrying receiver-driven congestion feedback, and
//!   standalone feedback packets.
//! - [`overlay`]: allocation-free encapsulation and decapsulation over Ethernet/IPv4/UDP 6081.
//! - [`seal`]: PSP-like AES-GCM sealing of a tunnel packet's inner frame with per-tenant keys.
//! - [`offload`]: a VM's transmit offloads finished in software: the virtio-net header,
//!   partial checksum completion and TSO/USO segmentation.
//! - [`mod@classify`]: the cheap classification of a tenant frame done before scheduling.
//! - [`ndp`]: IPv6 Neighbor Solicitations parsed and the Neighbor Advertisements answering
//!   them written (the switch answers neighbour discovery as it answers ARP).
//!
//! Ethernet, IPv4, IPv6, UDP, TCP and ARP come from [`etherparse`], re-exported so users
//! share its version.

pub mod classify;
pub mod ecn;
pub mod error;
pub mod feedback;
pub mod geneve;
pub mod ndp;
pub mod offload;
pub mod overlay;
pub mod seal;

pub use classify::{classify, ArpSummary, FrameSummary, Network, Ports};
pub use error::Error;
pub use etherparse;
pub use feedback::{FeedbackAuth, FeedbackOption};
pub use geneve::{standalone_feedback, GeneveOption, GenevePacket, GeneveRepr};
pub use overlay::{
    decap, encap, encap_headers, encap_headers_len, entropy_source_port, Decapped, OuterHeaders,
    ENCAP_OVERHEAD,
};
