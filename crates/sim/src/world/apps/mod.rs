//! The applications in the VMs, built from the scenario's workloads and the `[sim]` table:
//! paced UDP streams ([`UdpStream`]), RPC probes ([`RpcProbe`]), TCP flows over the TCP
//! model ([`TcpFlow`]: bulk, transfers, shuffles, flow-size traffic), Poisson flow
//! arrivals ([`FlowArrivals`]) and CPU-bound tenants on their host's core ([`CpuBurn`]). They send through their VM's ring ([`Net::vm_send`]), act on
//! timers ([`Event::App`]) and on frames the hosts deliver, and record into
//! [`Measurements`](super::stats::Measurements).

mod cpu_burn;
mod flow_arrivals;
mod rpc;
mod tcp_flow;
mod udp;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use picnic_core::Rate;
use picnic_scenario::{Protocol, Scenario, Workload, WorkloadKind};

use self::cpu_burn::CpuBurn;
use self::flow_arrivals::FlowArrivals;
use self::rpc::RpcProbe;
pub(super) use self::tcp_flow::TcpFlow;
use self::udp::UdpStream;
use super::host::{Delivery, VmLoc};
use super::{Net, World};
use crate::event::{Event, Nanos};
use crate::packet::{Addr, Kind, Meta, Proto};
use crate::spec::{CongestionControl, Recovery, Spec};
use crate::workload::{Arrivals, FlowSizes};

/// RPC timeout default, ms.
const RPC_TIMEOUT_MS: u64 = 100;

/// One application (or, for [`FlowArrivals`], a source of TCP flows).
pub(super) enum App {
    Udp(UdpStream),
    Rpc(RpcProbe),
    Tcp(Box<TcpFlow>),
    FlowGen(FlowArrivals),
    CpuBurn(CpuBurn),
}

/// Settings every TCP flow of the run shares.
#[derive(Clone, Copy, Debug)]
pub(super) struct TcpParams {
    /// Segment payload, bytes.
    pub mss: usize,
    pub min_rto: Nanos,
    pub dupack_threshold: u32,
    pub cc: CongestionControl,
    pub recovery: Recovery,
}

impl TcpParams {
    /// Segments are sent ECN-capable (DCTCP).
    fn ect(&self) -> bool {
        self.cc == CongestionControl::Dctcp
    }
}

const fn ms(m: u64) -> Nanos {
    m * 1_000_000
}

impl Net {
    /// Sends one packet of a paced application (UDP stream or RPC client) and schedules its
    /// next send `interval` later; returns whether the VM's ring took the packet.
    #[allow(clippy::too_many_arguments)]
    fn send_periodic(
        &mut self,
        now: Nanos,
        app: u32,
        kind: Kind,
        seq: u64,
        from: &VmLoc,
        to: Addr,
        proto: Proto,
        ports: (u16, u16),
        size: usize,
        interval: Nanos,
    ) -> bool {
        let meta = Meta {
            app,
            kind,
            ece: false,
            seq,
            sent_ns: now,
            sack: 0,
            sack_len: 0,
        };
        let sent = self.vm_send(now, from, to, proto, ports, size, false, &meta, false);
        self.queue.push(now + interval, Event::App(app, 0));
        sent
    }
}

impl World {
    /// Adds every application of the spec, replica by replica (`attackers`: include the
    /// scenario's attack workloads and other tenants' flows and shuffles), each with its
    /// first timer; flow-size traffic draws from streams of the run's `seed`.
    pub(super) fn add_apps(
        &mut self,
        spec: &Spec,
        attackers: bool,
        vm_locs: &[HashMap<String, VmLoc>],
        access: Rate,
        seed: u64,
    ) -> Result<()> {
        let sc = &spec.scenario;
        let sim = &spec.sim;
        for (r, locs) in vm_locs.iter().enumerate() {
            let r = r as u32;
            for wl in &sc.workloads {
                if attackers || !sc.is_attack(wl) {
                    self.add_workload(sc, wl, r, locs, spec.sim.flood_pps)?;
                }
            }
            for (i, f) in sim.flows.iter().enumerate() {
                if !attackers && f.tenant != sc.victim {
                    continue;
                }
                let t = sc.tenants.iter().find(|t| t.name == f.tenant);
                let t = t.expect("validated");
                let vms: Arc<Vec<VmLoc>> = Arc::new(t.vms.iter().map(|v| locs[&v.name]).collect());
                let sizes = Arc::new(FlowSizes::load(&f.cdf)?);
                let (start, stop) = (ms(f.start_ms), ms(f.stop_ms.unwrap_or(sc.duration_ms)));
                let kind = WorkloadKind::TcpBulk;
                let slot = self
                    .meas
                    .add_result(r, &f.name, &f.tenant, kind, stop - start, false);
                // Poisson arrivals: mean gap = mean size / (load * access rate).
                let mean_gap_ns = sizes.mean() * 8.0 * 1e9 / (f.load * access.bps() as f64);
                let tag: Arc<str> = Arc::from(f.name.as_str());
                for src in 0..vms.len() {
                    let mut arrivals =
                        Arrivals::new(seed, i, r, src, vms.len(), start, mean_gap_ns);
                    let next = arrivals.next(&sizes);
                    let app = FlowArrivals {
                        vms: vms.clone(),
                        src,
                        slot,
                        arrivals,
                        next,
                        sizes: sizes.clone(),
                        stop,
                        tag: tag.clone(),
                    };
                    if next.at < stop {
                        self.spawn(App::FlowGen(app), next.at);
                    } else {
                        self.apps.push(App::FlowGen(app));
                    }
                }
            }
            for sh in &sim.shuffles {
                if !attackers && sh.tenant != sc.victim {
                    continue;
                }
                let t = sc.tenants.iter().find(|t| t.name == sh.tenant);
                let t = t.expect("validated");
                let start = ms(sh.start_ms);
                let name = format!("shuffle-{}", sh.tenant);
                let active = self.duration - start;
                let kind = WorkloadKind::TcpBulk;
                let slot = self
                    .meas
                    .add_result(r, &name, &sh.tenant, kind, active, false);
                let tag: Arc<str> = Arc::from(name.as_str());
                let segs = (sh.bytes / sh.connections as u64).div_ceil(self.tcp.mss as u64);
                for a in &t.vms {
                    for b in t.vms.iter().filter(|b| b.name != a.name) {
                        for _ in 0..sh.connections {
                            let (src, dst) = (locs[&a.name], locs[&b.name]);
                            let span = (start, self.duration);
                            let segs = Some(segs.max(1));
                            let mut flow = TcpFlow::new(src, dst, slot, segs, span, &self.tcp);
                            flow.tag = Some(tag.clone());
                            self.spawn(App::Tcp(Box::new(flow)), start);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds the applications of lab workload `wl` in replica `r`; `flood_pps` is the rate
    /// of a flood without one.
    fn add_workload(
        &mut self,
        sc: &Scenario,
        wl: &Workload,
        r: u32,
        locs: &HashMap<String, VmLoc>,
        flood_pps: u64,
    ) -> Result<()> {
        // The report row, as in the lab: a victim's own attack workloads apart.
        let row = sc.report_group(wl);
        let port = wl.port(sc).expect("a scenario's own workload");
        let (src, dst) = (locs[&wl.from], locs[&wl.to]);
        let (start, stop) = (ms(wl.start_ms), ms(wl.stop_ms(sc)));
        // Probes record each request's latency, a CPU burner each unit's wall time.
        let probe = matches!(
            wl.kind,
            WorkloadKind::Rpc
                | WorkloadKind::Sockperf
                | WorkloadKind::Memcached
                | WorkloadKind::CpuBurn
        );
        let slot = self
            .meas
            .add_result(r, &wl.name, &row, wl.kind, stop - start, probe);
        match wl.kind {
            WorkloadKind::UdpFlood | WorkloadKind::OnOff => {
                let pps = wl.rate_pps.unwrap_or(flood_pps).max(1);
                let on_off = (wl.kind == WorkloadKind::OnOff)
                    .then(|| (start, ms(wl.on_ms.unwrap_or(1)), ms(wl.off_ms.unwrap_or(0))));
                let app = UdpStream {
                    src,
                    dst,
                    slot,
                    size: wl.size(),
                    interval: 1_000_000_000 / pps,
                    stop,
                    on_off,
                    seq: 0,
                    port,
                };
                self.spawn(App::Udp(app), start);
            }
            // sockperf and memcached probes are request/response at a rate too.
            WorkloadKind::Rpc | WorkloadKind::Sockperf | WorkloadKind::Memcached => {
                let rate = wl.rate_pps.unwrap_or(1000).max(1);
                let proto = match wl.protocol {
                    Some(Protocol::Tcp) => Proto::Tcp,
                    _ => Proto::Udp,
                };
                let app = RpcProbe {
                    client: src,
                    server: dst,
                    slot,
                    proto,
                    size: wl.size(),
                    interval: 1_000_000_000 / rate,
                    stop,
                    timeout: ms(wl.timeout_ms.unwrap_or(RPC_TIMEOUT_MS)),
                    seq: 0,
                    port,
                };
                self.spawn(App::Rpc(app), start);
            }
            WorkloadKind::TcpBulk | WorkloadKind::Iperf3 | WorkloadKind::Transfer => {
                // A transfer sends a fixed number of bytes per flow; bulk runs to stop.
                let segments = (wl.kind == WorkloadKind::Transfer)
                    .then(|| wl.bytes.unwrap_or(0).div_ceil(self.tcp.mss as u64).max(1));
                if segments.is_some() {
                    self.meas.transfer_flows_left.insert(slot, wl.flows());
                }
                for _ in 0..wl.flows() {
                    let span = (start, stop);
                    let mut flow = TcpFlow::new(src, dst, slot, segments, span, &self.tcp);
                    flow.port = port;
                    self.spawn(App::Tcp(Box::new(flow)), start);
                }
            }
            WorkloadKind::CpuBurn => {
                let host = &self.net.hosts[src.host as usize];
                let dir = &host.engine.dir;
                let vm = dir.vms.iter().find(|v| v.name == wl.from);
                let engine_tenant = vm.expect("the workload's VM is on its host").tenant;
                if dir.tenants[engine_tenant].cpu_quota.is_none() {
                    anyhow::bail!(
                        "workload {}: cpu_burn needs its tenant's CPU allocation (cpu_cores)",
                        wl.name
                    );
                }
                let app = CpuBurn::new(src.host, engine_tenant, src.tenant, slot, stop);
                self.spawn(App::CpuBurn(app), start);
            }
        }
        Ok(())
    }

    /// Adds `app` with its first timer at `at`.
    fn spawn(&mut self, app: App, at: Nanos) {
        let a = self.apps.len() as u32;
        self.apps.push(app);
        self.net.queue.push(at, Event::App(a, 0));
    }

    /// Application `a`'s timer fires (`gen`: the generation it was set with).
    pub(super) fn app_timer(&mut self, a: u32, gen: u32, now: Nanos) {
        let Some(app) = self.apps.get_mut(a as usize) else {
            return;
        };
        match app {
            App::Udp(u) => u.on_timer(a, now, &mut self.net, &mut self.meas),
            App::Rpc(c) => c.on_timer(a, now, &mut self.net, &mut self.meas),
            App::Tcp(t) => t.on_timer(a, gen, now, &mut self.net, self.tcp.ect()),
            App::CpuBurn(b) => b.on_timer(a, now, &mut self.net, &mut self.meas),
            App::FlowGen(g) => {
                if let Some(flow) = g.on_timer(a, now, &mut self.net, &self.tcp, self.end) {
                    let id = self.apps.len() as u32;
                    self.apps.push(App::Tcp(Box::new(flow)));
                    self.tcp_send(id, now);
                }
            }
        }
    }

    /// After a host poll: every frame it delivered goes to its application, then TCP flows
    /// whose VM ring has room again send.
    pub(super) fn after_poll(&mut self, now: Nanos) {
        let deliveries = std::mem::take(&mut self.net.deliveries);
        for d in &deliveries {
            self.app_receive(now, d);
        }
        self.net.deliveries = deliveries;
        self.net.deliveries.clear();
        while let Some(a) = self.net.wake.pop() {
            self.tcp_send(a, now);
        }
    }

    /// TCP flow `a` sends what its window allows (nothing if `a` is not a TCP flow).
    fn tcp_send(&mut self, a: u32, now: Nanos) {
        if let Some(App::Tcp(t)) = self.apps.get_mut(a as usize) {
            t.send(a, now, &mut self.net, self.tcp.ect());
        }
    }

    fn app_receive(&mut self, now: Nanos, d: &Delivery) {
        let a = d.meta.app;
        let Some(app) = self.apps.get_mut(a as usize) else {
            return;
        };
        match app {
            App::Udp(u) => u.on_receive(now, d, &mut self.meas),
            App::Rpc(c) => c.on_receive(now, d, &mut self.net, &mut self.meas),
            App::Tcp(t) => t.on_receive(a, now, d, &mut self.net, &mut self.meas, self.tcp.ect()),
            App::FlowGen(_) | App::CpuBurn(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run, workload, world};

    #[test]
    fn a_shuffle_runs_its_connections_on_every_ordered_pair_to_completion() {
        let shuffle = r#"
[[sim.shuffles]]
tenant = "t"
bytes = 200000
connections = 2
start_ms = 10
"#;
        let idle = workload("u", "udp_flood", "a", "b", &["rate_pps = 1"]);
        let mut w = world(&format!("{idle}{shuffle}"), "picnic-off");
        let stats = run(&mut w);
        // 3 VMs: 6 ordered pairs x 2 connections, each 100 KB = 72 segments of 1390 B.
        let flow_bytes = 72 * 1390;
        assert_eq!(stats.flows.len(), 12);
        assert!(stats
            .flows
            .iter()
            .all(|f| f.tag == "shuffle-t" && f.bytes == flow_bytes));
        let job = &stats.shuffles[..];
        assert_eq!(job.len(), 1);
        assert_eq!(
            (job[0].job.as_str(), job[0].flows, job[0].completed),
            ("shuffle-t", 12, 12)
        );
        let last = stats.flows.iter().map(|f| f.fct_us).fold(0.0, f64::max);
        assert_eq!(job[0].completion_ms, Some(last / 1e3));
        assert_eq!(stats.unfinished_flows, 0);
        let row = &w.meas.results[0][1];
        assert_eq!(
            (row.name.as_str(), row.received_bytes),
            ("shuffle-t", 12 * flow_bytes)
        );
    }

    #[test]
    fn the_victim_alone_runs_without_attack_workloads() {
        let two = workload("mine", "udp_flood", "a", "b", &["rate_pps = 1"])
            + &workload(
                "attack",
                "udp_flood",
                "c",
                "b",
                &["rate_pps = 1", "attack = true"],
            );
        let names = |mode| {
            let w = world(&two, mode);
            assert_eq!(w.apps.len(), w.meas.results[0].len());
            w.meas.results[0]
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("picnic-off"), ["mine", "attack"]);
        assert_eq!(names("victim-alone"), ["mine"]);
    }
}
