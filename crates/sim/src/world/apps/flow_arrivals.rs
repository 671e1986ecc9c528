//! Flow-size traffic (`[[sim.flows]]`): from one VM of a tenant, TCP flows to random other
//! VMs of it, Poisson arrivals with sizes drawn from a CDF, until `stop`.

use std::sync::Arc;

use rand::Rng;

use super::super::host::VmLoc;
use super::super::stats::Slot;
use super::super::Net;
use super::{TcpFlow, TcpParams};
use crate::event::{Event, Nanos};
use crate::workload::FlowSizes;

/// The flow source on VM `vms[src]`.
pub(in crate::world) struct FlowArrivals {
    /// Every VM of the tenant.
    pub vms: Arc<Vec<VmLoc>>,
    pub src: usize,
    pub slot: Slot,
    /// Mean time between arrivals, ns.
    pub mean_gap_ns: f64,
    pub sizes: Arc<FlowSizes>,
    pub stop: Nanos,
    /// Tag of the flows in flows.csv.
    pub tag: Arc<str>,
}

impl FlowArrivals {
    /// A flow arrives (app `a`): sets the next arrival and returns the new flow, which runs
    /// until `end` at the latest.
    pub fn on_timer(
        &mut self,
        a: u32,
        now: Nanos,
        net: &mut Net,
        tcp: &TcpParams,
        end: Nanos,
    ) -> Option<TcpFlow> {
        if now >= self.stop {
            return None;
        }
        let dst = loop {
            let d = net.rng.gen_range(0..self.vms.len());
            if d != self.src {
                break d;
            }
        };
        let bytes = self.sizes.sample(&mut net.rng).max(1);
        let gap = -self.mean_gap_ns * (1.0 - net.rng.gen::<f64>()).ln();
        net.queue.push(now + gap as u64 + 1, Event::App(a, 0));
        let segs = bytes.div_ceil(tcp.mss as u64);
        let (src, dst) = (self.vms[self.src], self.vms[dst]);
        let mut flow = TcpFlow::new(src, dst, self.slot, Some(segs), (now, end), tcp);
        flow.tag = Some(self.tag.clone());
        Some(flow)
    }
}
