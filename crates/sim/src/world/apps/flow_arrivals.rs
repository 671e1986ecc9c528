//! Flow-size traffic (`[[sim.flows]]`): from one VM of a tenant, TCP flows to random other
//! VMs of it, Poisson arrivals with sizes drawn from a CDF, until `stop`.

use std::sync::Arc;

use super::super::host::VmLoc;
use super::super::stats::Slot;
use super::super::Net;
use super::{TcpFlow, TcpParams};
use crate::event::{Event, Nanos};
use crate::workload::{Arrival, Arrivals, FlowSizes};

/// The flow source on VM `vms[src]`.
pub(in crate::world) struct FlowArrivals {
    /// Every VM of the tenant.
    pub vms: Arc<Vec<VmLoc>>,
    pub src: usize,
    pub slot: Slot,
    /// The source's arrivals (its own random stream: `workload::Arrivals`).
    pub arrivals: Arrivals,
    /// The flow its timer is set for.
    pub next: Arrival,
    pub sizes: Arc<FlowSizes>,
    pub stop: Nanos,
    /// Tag of the flows in flows.csv.
    pub tag: Arc<str>,
}

impl FlowArrivals {
    /// The flow `next` arrives (app `a`): sets the timer for the one after it, if before
    /// `stop`, and returns the new flow, which runs until `end` at the latest.
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
        let this = self.next;
        self.next = self.arrivals.next(&self.sizes);
        if self.next.at < self.stop {
            net.queue.push(self.next.at.max(now), Event::App(a, 0));
        }
        let segs = this.bytes.div_ceil(tcp.mss as u64);
        let (src, dst) = (self.vms[self.src], self.vms[this.dst]);
        let mut flow = TcpFlow::new(src, dst, self.slot, Some(segs), (now, end), tcp);
        flow.tag = Some(self.tag.clone());
        Some(flow)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::world;
    use super::super::App;
    use super::*;

    const FLOWS: &str = r#"
[[workloads]]
name = "u"
kind = "udp_flood"
from = "a"
to = "b"
rate_pps = 1

[[sim.flows]]
name = "web"
tenant = "t"
load = 0.5
cdf = "data_mining"
start_ms = 10
stop_ms = 100
"#;

    #[test]
    fn each_arrival_starts_the_sources_next_drawn_flow_and_sets_the_next() {
        let mut w = world(FLOWS, "picnic-off");
        let tcp = w.tcp;
        let sources: Vec<usize> = (0..w.apps.len())
            .filter(|&a| matches!(w.apps[a], App::FlowGen(_)))
            .collect();
        assert_eq!(sources.len(), 3, "one source per VM of the tenant");
        // Drain the first arrivals the world set, then count the timers each call sets.
        while w.net.queue.pop().is_some() {}
        for (i, &source) in sources.iter().enumerate() {
            let a = source as u32;
            let App::FlowGen(g) = &mut w.apps[source] else {
                unreachable!()
            };
            // The source's own stream, seed 1, traffic 0, replica 0: what ns-3 is given.
            let mean_gap = g.sizes.mean() * 8.0 * 1e9 / (0.5 * 1e9);
            let mut same = Arrivals::new(1, 0, 0, i, 3, 10_000_000, mean_gap);
            let mut expect = same.next(&g.sizes);
            assert_eq!(g.next, expect);
            let (mut seen, mut timers) = (std::collections::BTreeSet::new(), 0);
            for k in 0..100 {
                let now = 10_000_000 + k;
                let flow = g
                    .on_timer(a, now, &mut w.net, &tcp, 999)
                    .expect("before stop");
                assert_eq!(flow.src.host, g.vms[g.src].host);
                assert_eq!(flow.dst.host, g.vms[expect.dst].host);
                assert_eq!(flow.bytes, expect.bytes.div_ceil(1390) * 1390);
                seen.insert(flow.dst.host);
                assert_eq!(flow.tag.as_deref(), Some("web"));
                assert_eq!((flow.start, flow.stop), (now, 999));
                expect = same.next(&g.sizes);
                timers += (expect.at < 100_000_000) as usize;
            }
            assert_eq!(seen.len(), 2, "both other VMs drawn");
            let mut set = 0;
            while let Some((t, ev)) = w.net.queue.pop() {
                assert!(matches!(ev, Event::App(x, 0) if x == a) && t >= 10_000_000);
                set += 1;
            }
            assert_eq!(set, timers, "a timer for each next arrival before the stop");
            assert!(
                g.on_timer(a, 100_000_000, &mut w.net, &tcp, 999).is_none(),
                "stopped"
            );
        }
    }
}
