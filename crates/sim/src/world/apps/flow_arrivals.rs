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
    fn each_arrival_starts_a_tagged_flow_to_another_vm_and_sets_the_next() {
        let mut w = world(FLOWS, "picnic-off");
        let tcp = w.tcp;
        let sources: Vec<usize> = (0..w.apps.len())
            .filter(|&a| matches!(w.apps[a], App::FlowGen(_)))
            .collect();
        assert_eq!(sources.len(), 3, "one source per VM of the tenant");
        let before = w.net.queue.processed;
        for &source in &sources {
            let a = source as u32;
            let App::FlowGen(g) = &mut w.apps[source] else {
                unreachable!()
            };
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..100 {
                let now = 10_000_000 + i;
                let flow = g
                    .on_timer(a, now, &mut w.net, &tcp, 999)
                    .expect("before stop");
                assert_eq!(flow.src.host, g.vms[g.src].host);
                assert_ne!(flow.dst.host, flow.src.host);
                seen.insert(flow.dst.host);
                assert_eq!(flow.tag.as_deref(), Some("web"));
                assert_eq!((flow.start, flow.stop), (now, 999));
                assert_eq!(flow.bytes % tcp.mss as u64, 0);
                assert!(flow.bytes > 0);
            }
            assert_eq!(seen.len(), 2, "both other VMs drawn");
            let now = 100_000_000;
            assert!(
                g.on_timer(a, now, &mut w.net, &tcp, 999).is_none(),
                "stopped"
            );
        }
        assert_eq!(w.net.queue.processed, before);
        // Every call before the stop set one next arrival later than its `now` (plus each
        // source's first arrival, set when the world was built).
        let mut next = [0; 3];
        while let Some((t, ev)) = w.net.queue.pop() {
            if let Event::App(a, 0) = ev {
                if let Some(i) = sources.iter().position(|&s| s == a as usize) {
                    assert!(t > 10_000_000, "{t}");
                    next[i] += 1;
                }
            }
        }
        assert_eq!(next, [101; 3]);
    }
}
