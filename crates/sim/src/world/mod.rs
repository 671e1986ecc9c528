//! One simulated deployment for one mode, driven by one [`EventQueue`]:
//!
//! - `host.rs`: hosts running the switch's own [`picnic_switch::engine::Engine`] with a
//!   processing-cost model, between their VMs' transmit rings and their NIC;
//! - `fabric.rs`: links with rate, propagation delay and buffer, switches with shared
//!   buffers, big-switch or leaf-spine routing with ECMP, ECN marking;
//! - `apps/`: the applications (UDP streams, RPC probes, TCP flows, flow arrivals);
//! - `stats.rs`: what the applications record and what a run reports ([`RunStats`]).
//!
//! This file holds the deployment ([`World`]), its event loop and the end-of-run statistics
//! it gathers from hosts, fabric and applications.

mod apps;
mod fabric;
mod host;
mod stats;
#[cfg(test)]
mod testing;

use std::collections::HashMap;

use anyhow::Result;
use picnic_scenario::{Mode, WorkloadResult};
use picnic_switch::frame::FramePool;
use picnic_switch::stats::DropReason;
use picnic_wire::overlay::ENCAP_OVERHEAD;
use rand::rngs::SmallRng;
use rand::SeedableRng;

pub use self::fabric::LinkClass;
pub use self::stats::{Conservation, ConvergenceResult, FlowRecord, RunStats, ShuffleResult};

use self::apps::{App, TcpParams};
use self::fabric::Fabric;
use self::host::{Delivery, Host, PollSchedule, VmLoc, POOL_CHUNK};
use self::stats::{convergence_results, queue_quantiles, shuffle_results, Measurements};
use crate::event::{Event, EventQueue, Nanos};
use crate::spec::{Convergence, CostModel, Spec};

/// Receivers keep counting this long after the last sender stops (the lab's grace).
const GRACE_NS: Nanos = 200_000_000;
/// Period of queue-occupancy sampling (EyeQ 5.4 samples every queue each 1 ms), ns.
pub const SAMPLE_NS: Nanos = 1_000_000;
/// Width of the fine-grained rate series (convergence plots), ns.
pub const FINE_BIN_NS: Nanos = 1_000_000;
/// Period of the progress line's check, ns of virtual time.
const TICK_NS: Nanos = 10_000_000;

/// Everything but the applications (so handlers can borrow both).
struct Net {
    queue: EventQueue,
    hosts: Vec<Host>,
    /// Per host, when it polls next.
    sched: Vec<PollSchedule>,
    fabric: Fabric,
    pool: FramePool,
    /// Most frames the pool may grow to.
    pool_budget: usize,
    rng: SmallRng,
    cost: CostModel,
    replicas: u32,
    cons: Conservation,
    /// Sends refused because the VM's ring was full.
    app_blocked: u64,
    /// Sends refused because the pool had no frame within its budget.
    pool_exhausted: u64,
    /// Frames the last host poll delivered to VMs.
    deliveries: Vec<Delivery>,
    /// Applications whose VM ring has room again.
    wake: Vec<u32>,
}

/// A simulated deployment for one mode.
pub struct World {
    net: Net,
    apps: Vec<App>,
    meas: Measurements,
    tcp: TcpParams,
    tenant_names: Vec<String>,
    /// End of the run: the scenario's duration plus the receivers' grace.
    end: Nanos,
    /// The scenario's duration.
    duration: Nanos,
    mode: String,
    convergence: Vec<Convergence>,
}

impl World {
    /// Builds the deployment of `spec` for `mode` (`picnic`, `picnic-off`, `victim-alone`)
    /// with RNG seed `seed`.
    pub fn new(spec: &Spec, mode: &Mode, seed: u64) -> Result<World> {
        let sc = &spec.scenario;
        let sim = &spec.sim;
        let access = sc.access_link();
        let queue_bytes = sc.access_queue_bytes().max(3000);
        let built = host::build_hosts(spec, mode.dataplane, queue_bytes)?;
        let total_hosts = built.hosts.len();
        let budget = total_hosts * sim.frames_per_host.unwrap_or(built.frame_budget);
        let fabric = Fabric::build(sim, total_hosts as u32, access, queue_bytes);
        let net = Net {
            queue: EventQueue::default(),
            sched: vec![PollSchedule::default(); total_hosts],
            hosts: built.hosts,
            fabric,
            pool: FramePool::new(POOL_CHUNK.min(budget)),
            pool_budget: budget,
            rng: SmallRng::seed_from_u64(seed),
            cost: sim.cost.clone(),
            replicas: sim.replicas,
            cons: Conservation::default(),
            app_blocked: 0,
            pool_exhausted: 0,
            deliveries: Vec::new(),
            wake: Vec::new(),
        };
        let duration = sc.duration_ms * 1_000_000;
        let mut world = World {
            net,
            apps: Vec::new(),
            meas: Measurements::new(sim.replicas, duration, sc.tenants.len()),
            tcp: TcpParams {
                mss: sc.mtu as usize - ENCAP_OVERHEAD - 40,
                min_rto: sim.min_rto_us * 1000,
                dupack_threshold: sim.dupack_threshold,
                cc: sim.cc,
                recovery: sim.recovery,
            },
            tenant_names: sc.tenants.iter().map(|t| t.name.clone()).collect(),
            end: duration + GRACE_NS,
            duration,
            mode: mode.name.clone(),
            convergence: sim.convergence.clone(),
        };
        let vm_locs: &[HashMap<String, VmLoc>] = &built.vm_locs;
        world.add_apps(spec, mode.attackers, vm_locs, access, seed)?;
        world.net.queue.push(0, Event::Tick);
        world.net.queue.push(0, Event::Sample);
        Ok(world)
    }

    /// Runs to the end of the scenario plus the receivers' grace; `progress` gets a line
    /// about every 2 s of wall time.
    pub fn run(&mut self, progress: &mut dyn FnMut(&str)) -> RunStats {
        let wall = std::time::Instant::now();
        let mut last = wall;
        while let Some(t) = self.net.queue.peek_time() {
            if t > self.end {
                break;
            }
            let (now, ev) = self.net.queue.pop().expect("peeked");
            match ev {
                Event::HostPoll(h, gen) => {
                    if self.net.sched[h as usize].gen == gen {
                        self.net.host_poll(h, now);
                        self.after_poll(now);
                    }
                }
                Event::LinkTxDone(l) => self.net.fabric.tx_done(l, now, &mut self.net.queue),
                Event::LinkArrive(l) => self.net.link_arrive(l, now),
                Event::App(a, gen) => self.app_timer(a, gen, now),
                Event::Tick => {
                    if last.elapsed().as_secs_f64() >= 2.0 {
                        last = std::time::Instant::now();
                        progress(&self.progress_line(now, wall.elapsed().as_secs_f64()));
                    }
                    self.net.queue.push(now + TICK_NS, Event::Tick);
                    self.drop_stale_polls();
                }
                Event::Sample => {
                    self.net.fabric.sample_queues();
                    if now + SAMPLE_NS <= self.duration {
                        self.net.queue.push(now + SAMPLE_NS, Event::Sample);
                    }
                }
            }
        }
        let wall_s = wall.elapsed().as_secs_f64();
        self.stats(wall_s)
    }

    /// Drops the polls a wake-up superseded. Each waited in the queue until its time (mostly
    /// an engine deadline 10-100 ms ahead) to be popped and skipped: at 1,002 hosts under
    /// ingress-flood 784 k of the 786 k pending events at 300 ms were such polls, and the
    /// queue's buckets grew with them (docs/sim.md "Performance"). The others keep their
    /// order, and those due within the run count as processed, as popping them did, so a
    /// run's events and results are unchanged.
    fn drop_stale_polls(&mut self) {
        let (sched, end) = (&self.net.sched, self.end);
        let mut due = 0;
        self.net.queue.retain(|at, ev| match *ev {
            Event::HostPoll(h, gen) if sched[h as usize].gen != gen => {
                due += u64::from(at <= end);
                false
            }
            _ => true,
        });
        self.net.queue.processed += due;
    }

    fn progress_line(&self, now: Nanos, secs: f64) -> String {
        let events = self.net.queue.processed as f64;
        format!(
            "mode {} t={:.0}/{} ms  {:.1} M events  {:.2} M events/s  pool free {}",
            self.mode,
            now as f64 / 1e6,
            self.duration / 1_000_000,
            events / 1e6,
            events / secs / 1e6,
            self.net.pool.available()
        )
    }

    /// The lab's workload results, one list per replica (the report's repetitions), taken
    /// out of the run rather than copied: their latency histograms are 213 KB each, 710 MB
    /// for the 3,334 of the 10,000-host run.
    pub fn take_results(&mut self) -> Vec<Vec<WorkloadResult>> {
        std::mem::take(&mut self.meas.results)
    }

    /// CPU the hosts' engines charged each tenant (their modelled poll time, split by
    /// `Engine::charge_cpu` as in the real switch), ns, summed over hosts and replicas.
    pub fn tenant_cpu_ns(&self) -> std::collections::BTreeMap<String, u64> {
        let mut cpu = std::collections::BTreeMap::new();
        for h in &self.net.hosts {
            for t in h.engine.snapshot().tenants {
                *cpu.entry(t.name).or_default() += t.cost_ns;
            }
        }
        cpu
    }

    /// What the hosts' engines judged of each tenant's SLO by the end of the run (their SLO
    /// monitors, as the real switch's `GET /slo`), summed over hosts and replicas.
    pub fn tenant_slo(&mut self) -> std::collections::BTreeMap<String, picnic_scenario::SwitchSlo> {
        let end = picnic_core::Instant::from_nanos(self.end);
        let mut slo = std::collections::BTreeMap::new();
        for h in &mut self.net.hosts {
            for t in h.engine.slo_report(end).tenants {
                let sum: &mut picnic_scenario::SwitchSlo = slo.entry(t.tenant).or_default();
                sum.windows += t.totals.windows;
                sum.violated_windows += t.totals.violated_windows;
            }
        }
        slo
    }
}

impl Net {
    /// The oldest packet in flight on link `l` arrives at a switch (forwarded) or a host.
    fn link_arrive(&mut self, l: u32, now: Nanos) {
        let arrived = self.fabric.arrive(l, now, &mut self.queue, &mut self.rng);
        if let Some((h, bytes)) = arrived {
            self.nic_receive(h, bytes, now);
        }
    }
}

impl World {
    /// The run's statistics after `wall_s` seconds of wall time.
    fn stats(&self, wall_s: f64) -> RunStats {
        let net = &self.net;
        let mut cons = net.cons.clone();
        for h in &net.hosts {
            let snap = h.engine.snapshot();
            cons.feedback_created += snap.switch.feedback_sent;
            cons.feedback_consumed += snap.switch.feedback_received;
            let drops = snap
                .vms
                .iter()
                .map(|v| &v.counters.drops)
                .chain([&snap.switch.drops]);
            for d in drops {
                for (reason, n) in d
                    .iter()
                    .filter(|(r, n)| *n > 0 && *r != DropReason::NoBuffer)
                {
                    *cons
                        .engine_drops
                        .entry(reason.as_str().to_owned())
                        .or_default() += n;
                }
            }
        }
        let drops = net.fabric.drops;
        cons.nic_tx_drops = drops[LinkClass::HostUp as usize];
        for class in [LinkClass::Edge, LinkClass::Core] {
            let n = drops[class as usize];
            if n > 0 {
                cons.fabric_drops.insert(class.name().to_owned(), n);
            }
        }
        // Frames out of the pool (rings, engine queues) and packets in the fabric.
        cons.in_flight = (net.pool.capacity() - net.pool.available()) as u64 + net.fabric.held();
        let out = cons.delivered
            + cons.feedback_consumed
            + cons.engine_drops.values().sum::<u64>()
            + cons.fabric_drops.values().sum::<u64>()
            + cons.nic_rx_drops
            + cons.nic_tx_drops
            + cons.in_flight;
        cons.balanced = cons.app_created + cons.feedback_created == out;
        let unfinished = self
            .tcp_apps()
            .filter(|t| t.tag.is_some() && !t.finished)
            .count() as u64;
        let m = &self.meas;
        RunStats {
            mode: self.mode.clone(),
            hosts: net.hosts.len(),
            events: net.queue.processed,
            wall_s,
            events_per_sec: net.queue.processed as f64 / wall_s.max(1e-9),
            sim_s: self.end as f64 / 1e9,
            conservation: cons,
            app_blocked: net.app_blocked,
            pool_exhausted: net.pool_exhausted,
            ecn_marks: net.fabric.ecn_marks,
            tcp_retransmits: self.tcp_apps().map(|t| t.sender.retransmits).sum(),
            tcp_timeouts: self.tcp_apps().map(|t| t.sender.timeouts).sum(),
            queue_kb: queue_quantiles(&net.fabric.queue_hist),
            queue_sampled_kb: queue_quantiles(&net.fabric.queue_sampled),
            shuffles: self.shuffle_results(),
            convergence: convergence_results(
                &self.convergence,
                &self.tenant_names,
                &m.fine,
                self.duration,
            ),
            flows: m.flows.clone(),
            unfinished_flows: unfinished,
            fine_series: self
                .tenant_names
                .iter()
                .cloned()
                .zip(m.fine.iter().cloned())
                .filter(|(_, s)| s.iter().any(|&b| b > 0))
                .collect(),
        }
    }

    fn tcp_apps(&self) -> impl Iterator<Item = &apps::TcpFlow> {
        self.apps.iter().filter_map(|a| match a {
            App::Tcp(t) => Some(&**t),
            _ => None,
        })
    }

    fn shuffle_results(&self) -> Vec<ShuffleResult> {
        let tags = self.tcp_apps().filter_map(|t| t.tag.as_deref());
        shuffle_results(tags, &self.meas.flows)
    }
}
