//! What a runner measures per workload ([`WorkloadResult`]), the same in the lab and the
//! simulator, in time-series bins of [`BIN_MS`].

use hdrhistogram::Histogram;

use crate::file::WorkloadKind;

/// Width of a time-series bin, ms.
pub const BIN_MS: u64 = 10;

/// The measured outcome of one workload.
#[derive(Debug, Clone)]
pub struct WorkloadResult {
    /// Workload name.
    pub name: String,
    /// Tenant of its VMs, or the victim's attack group (see
    /// [`crate::Scenario::report_group`]): the row of the report it counts in.
    pub tenant: String,
    /// Kind of traffic.
    pub kind: WorkloadKind,
    /// Packets (datagrams, requests) the sender got out of its socket.
    pub sent: u64,
    /// Packets (or responses) that arrived in time.
    pub received: u64,
    /// Application payload bytes that arrived (responses for RPC).
    pub received_bytes: u64,
    /// Length of the sending period, ns.
    pub active_ns: u64,
    /// Request latencies in ns (RPC only).
    pub latency: Option<Histogram<u64>>,
    /// Payload bytes received per [`BIN_MS`] bin since the start of the run.
    pub series: Vec<u64>,
    /// For a `transfer` that delivered every byte: ns from its start to the last byte.
    pub completion_ns: Option<u64>,
}

impl WorkloadResult {
    /// Application goodput over the sending period, bits/s.
    pub fn throughput_bps(&self) -> f64 {
        if self.active_ns == 0 {
            return 0.0;
        }
        self.received_bytes as f64 * 8.0 * 1e9 / self.active_ns as f64
    }

    /// Lost fraction: packets (or requests) sent that did not arrive (in time). TCP: 0.
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.sent.saturating_sub(self.received) as f64 / self.sent as f64
    }
}
