//! Hosts: each runs the switch's own [`Engine`], built from the scenario's switch config, between
//! its VMs' transmit rings and its NIC. A poll feeds the engine what arrived, lets it work at
//! the modelled CPU cost ([`CostModel`]) and moves what it left: tunnel frames onto the
//! host's uplink, tenant frames to the applications. The CPU is busy for that cost, so the
//! next poll comes later when the CPU is the bottleneck.

use std::collections::{HashMap, VecDeque};

use anyhow::{anyhow, Context, Result};
use picnic_core::Instant;
use picnic_scenario::plan::Topology;
use picnic_scenario::switch::dataplane_config;
use picnic_scenario::Dataplane;
use picnic_switch::directory::{PortIdx, TenantIdx, UPLINK};
use picnic_switch::driver::{Driver, Io};
use picnic_switch::engine::{Engine, Work};
use picnic_switch::frame::{Frame, FramePool};
use rand::rngs::SmallRng;
use rand::Rng;

use super::fabric::{Fabric, Pkt};
use super::Net;
use crate::event::{Event, EventQueue, Nanos};
use crate::packet::{self, Addr, Meta, Proto};
use crate::spec::{CostModel, Spec};

/// Frames a VM's transmit ring holds (its virtio/veth ring toward the switch).
pub(super) const VM_RING: usize = 256;
/// Host NIC receive ring, frames.
pub(super) const NIC_RX_RING: usize = 1024;
/// Frames the pool grows by when it runs dry (until the budget).
pub(super) const POOL_CHUNK: usize = 4096;
/// Free frames kept for an engine poll (feedback frames), while under the budget.
const POLL_RESERVE: usize = 256;

/// A VM's place: host, engine port, addresses.
#[derive(Clone, Copy, Debug)]
pub(super) struct VmLoc {
    /// Host (global index over replicas).
    pub host: u32,
    /// The VM's port on its host's engine.
    pub port: usize,
    pub addr: Addr,
    /// Tenant index in the scenario.
    pub tenant: usize,
}

/// A VM's transmit ring toward the engine, and the applications waiting for room in it.
struct VmRing {
    ring: VecDeque<Frame>,
    waiting: Vec<u32>,
}

/// One host: its engine, the rings around it and its CPU's schedule.
pub(super) struct Host {
    pub engine: Engine,
    /// Replica the host belongs to.
    replica: u32,
    /// Per engine port (the uplink's slot unused).
    ports: Vec<VmRing>,
    nic_rx: VecDeque<Frame>,
    /// Share of a core the switch is given (`[picnic] cpu_cores`, at most 1): a poll's
    /// CPU time takes 1/share of wall time.
    cpu_share: f64,
    /// The switch's run-loop policy, taking `batch` frames per port and poll.
    driver: Driver,
    /// CPU time the switch has spent, ns (its polls' modelled cost).
    cpu_ns: u64,
    /// The switch charges its work to the tenants' CPU allocations (Iron 3.2).
    charges_tenants: bool,
}

/// When a host polls next. Kept apart from [`Host`], whose engine spans kilobytes, in one
/// small array ([`Net::sched`]): the checks most events make (is this poll stale, is one due
/// sooner than a wake-up) then touch a few bytes of it, not a cold host.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PollSchedule {
    /// Generation of the scheduled poll (stale polls are skipped).
    pub gen: u32,
    /// When the next poll is scheduled, if one is.
    pending: Option<Nanos>,
    /// The CPU is busy with the last poll's work until then.
    busy_until: Nanos,
}

/// A tenant's CPU as its host's switch sees it ([`Host::tenant_cpu`]).
pub(super) struct TenantCpu {
    /// Its allocation on the host (`cpu_cores`), if any.
    pub cores: Option<f64>,
    /// Switch CPU split to its VMs on the host so far, ns.
    pub charged_ns: u64,
    /// Frames of its VMs on the host the switch handled so far.
    pub frames: u64,
}

/// The processing-cost model as the engine's [`Work`]: what the host CPU spends per packet.
struct CostWork<'a> {
    model: &'a CostModel,
    rng: &'a mut SmallRng,
    total: u64,
}

impl CostModel {
    /// Cost in ns of processing a packet of `len` bytes.
    pub fn cost(&self, len: usize, rng: &mut SmallRng) -> u64 {
        let mean =
            self.base_ns + self.per_byte_ps * len as u64 / 1000 + self.per_rule_ns * self.rules;
        if self.variance == 0.0 {
            return mean;
        }
        let f = 1.0 + self.variance * (rng.gen::<f64>() * 2.0 - 1.0);
        (mean as f64 * f) as u64
    }
}

impl Work for CostWork<'_> {
    fn process(&mut self, _tenant: TenantIdx, frame: &mut Frame) -> u64 {
        let c = self.model.cost(frame.len(), self.rng);
        self.total += c;
        c
    }
}

/// A frame that reached a VM, as its application sees it.
pub(super) struct Delivery {
    pub meta: Meta,
    /// It arrived marked Congestion Experienced.
    pub ce: bool,
}

/// The deployment's hosts (replica-major within each lab host: host `i` of replica `r` is
/// `i * replicas + r`), each replica's VMs by name, and the largest per-host frame budget.
pub(super) struct BuiltHosts {
    pub hosts: Vec<Host>,
    pub vm_locs: Vec<HashMap<String, VmLoc>>,
    pub frame_budget: usize,
}

fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let m: picnic_switch::config::Mac = s.parse().map_err(|e: String| anyhow!(e))?;
    Ok(m.0)
}

/// Builds every host of every replica with the scenario's switch config for `dataplane`; `queue_bytes` is an access link's buffer (for the budget).
pub(super) fn build_hosts(
    spec: &Spec,
    dataplane: Dataplane,
    queue_bytes: u64,
) -> Result<BuiltHosts> {
    let sc = &spec.scenario;
    let sim = &spec.sim;
    let replicas = sim.replicas;
    let total_hosts = sc.hosts.len() * replicas as usize;
    let mut frame_budget = 0;
    let mut hosts: Vec<Option<Host>> = (0..total_hosts).map(|_| None).collect();
    let mut vm_locs = Vec::new();
    for r in 0..replicas {
        let run_id = format!("r{r}");
        let topo = Topology::plan(sc, &run_id, &|role| format!("sim-{run_id}-{role}"));
        let mut locs = HashMap::new();
        for hv in &topo.hosts {
            let mut cfg = dataplane_config(sc, &topo, hv, dataplane)?;
            cfg.switch.nice = None;
            // A tenant's CPU allocation on a host where it has VMs, as the lab gives it (its
            // cgroup there): the switch charges its work against it (Iron 3.2).
            for (t, tenant) in cfg.tenants.iter_mut().zip(&sc.tenants) {
                if hv.vms.iter().any(|v| v.tenant == tenant.name) {
                    t.cpu_quota = tenant.cpu_cores;
                }
            }
            let engine = Engine::new(&cfg, Instant::ZERO)
                .with_context(|| format!("engine of host {}", hv.name))?;
            let g = hv.index as u32 * replicas + r;
            for vm in &hv.vms {
                let port = engine
                    .dir
                    .vms
                    .iter()
                    .find(|v| v.name == vm.name)
                    .and_then(|v| v.port)
                    .ok_or_else(|| anyhow!("VM {} has no port", vm.name))?;
                let addr = Addr {
                    mac: parse_mac(&vm.mac)?,
                    ip: vm.ip.octets(),
                };
                let tenant = vm.tenant_index;
                locs.insert(
                    vm.name.clone(),
                    VmLoc {
                        host: g,
                        port,
                        addr,
                        tenant,
                    },
                );
            }
            frame_budget = frame_budget.max(host_frame_budget(
                &cfg,
                hv.vms.len(),
                sim.nic_queue_frames,
                queue_bytes,
            ));
            let ports = (0..engine.dir.port_count())
                .map(|_| VmRing {
                    ring: VecDeque::new(),
                    waiting: Vec::new(),
                })
                .collect();
            hosts[g as usize] = Some(Host {
                engine,
                replica: r,
                ports,
                nic_rx: VecDeque::new(),
                cpu_share: sc.picnic.cpu_cores.map_or(1.0, |c| c.min(1.0)),
                driver: Driver::new(cfg.switch.batch),
                cpu_ns: 0,
                charges_tenants: cfg.isolation.cpu_accounting,
            });
        }
        vm_locs.push(locs);
    }
    let hosts = hosts
        .into_iter()
        .map(|h| h.expect("every host built"))
        .collect();
    Ok(BuiltHosts {
        hosts,
        vm_locs,
        frame_budget,
    })
}

/// Frames one host can hold at once (the default per-host pool budget): its VMs' transmit
/// rings and the engine's per-VM queue bounds, the shaped/limited queues, the NIC rings, and
/// its access-link queue filled with minimum-size frames.
fn host_frame_budget(
    cfg: &picnic_switch::config::Config,
    vms: usize,
    nic_queue_frames: usize,
    queue_bytes: u64,
) -> usize {
    vms * (VM_RING
        + cfg.egress.queue_packets
        + cfg.egress.shaped_queue_packets
        + cfg.ingress.queue_packets)
        + nic_queue_frames
        + NIC_RX_RING
        + (queue_bytes / 64) as usize
}

impl Net {
    /// Schedules host `h`'s poll at `now` or when its CPU is free, unless one is due sooner.
    fn wake_host(&mut self, h: u32, now: Nanos) {
        let sched = &mut self.sched[h as usize];
        let at = now.max(sched.busy_until);
        if sched.pending.is_none_or(|p| p > at) {
            sched.gen += 1;
            sched.pending = Some(at);
            self.queue.push(at, Event::HostPoll(h, sched.gen));
        }
    }

    /// A VM sends a frame built from `meta` into its transmit ring. False when the ring is
    /// full (the application is woken when there is room if `wait`), the pool has no frame
    /// or the frame cannot be built.
    #[allow(clippy::too_many_arguments)]
    pub fn vm_send(
        &mut self,
        now: Nanos,
        from: &VmLoc,
        to: Addr,
        proto: Proto,
        ports: (u16, u16),
        payload: usize,
        ect: bool,
        meta: &Meta,
        wait: bool,
    ) -> bool {
        let port = &mut self.hosts[from.host as usize].ports[from.port];
        if port.ring.len() >= VM_RING {
            if wait && !port.waiting.contains(&meta.app) {
                port.waiting.push(meta.app);
            }
            self.app_blocked += 1;
            return false;
        }
        let Some(mut frame) = self.take_frame() else {
            self.pool_exhausted += 1;
            return false;
        };
        let port = &mut self.hosts[from.host as usize].ports[from.port];
        if !packet::build(&mut frame, from.addr, to, proto, ports, payload, ect, meta) {
            self.pool.put(frame);
            return false;
        }
        port.ring.push_back(frame);
        self.cons.app_created += 1;
        self.wake_host(from.host, now);
        true
    }

    /// Grows the pool by up to `want` frames when fewer are free, within the budget.
    fn reserve_frames(&mut self, want: usize) {
        let room = self.pool_budget.saturating_sub(self.pool.capacity());
        if self.pool.available() < want && room > 0 {
            self.pool.grow(POOL_CHUNK.max(want).min(room));
        }
    }

    /// A free frame, growing the pool when it is dry and under the budget.
    fn take_frame(&mut self) -> Option<Frame> {
        self.reserve_frames(1);
        self.pool.get()
    }

    /// A packet off the fabric reaches host `h`'s NIC: dropped (counted) when the receive
    /// ring is full or no frame is left within the pool's budget (also counted as
    /// `pool_exhausted`), else copied into a frame with CE copied to the inner header
    /// (RFC 6040) and the host woken.
    pub fn nic_receive(&mut self, h: u32, mut bytes: Box<[u8]>, now: Nanos) {
        if self.hosts[h as usize].nic_rx.len() >= NIC_RX_RING {
            self.cons.nic_rx_drops += 1;
            return;
        }
        let Some(mut frame) = self.take_frame() else {
            self.pool_exhausted += 1;
            self.cons.nic_rx_drops += 1;
            return;
        };
        packet::copy_ce_in(&mut bytes);
        let fits = frame.fill_from(&bytes);
        debug_assert!(fits, "a fabric packet came from a frame");
        self.hosts[h as usize].nic_rx.push_back(frame);
        self.wake_host(h, now);
    }

    /// Host `h` polls its engine: one iteration of the switch's own run-loop policy
    /// ([`Driver::iterate`]) over the host's NIC and VM rings ([`HostIo`]) at the modelled
    /// cost. The CPU is busy until `now` + the cost (stretched when the switch has less
    /// than a core); the next poll is then when this one found work, or at the engine's
    /// deadline after one that found none.
    pub fn host_poll(&mut self, h: u32, now: Nanos) {
        self.reserve_frames(POLL_RESERVE);
        let t = Instant::from_nanos(now);
        let host = &mut self.hosts[h as usize];
        let sched = &mut self.sched[h as usize];
        sched.pending = None;
        let mut io = HostIo {
            host: h,
            replica: host.replica,
            replicas: self.replicas,
            now,
            rings: &mut host.ports,
            nic_rx: &mut host.nic_rx,
            cost: self.cost.poll_ns,
            nic_more: false,
            vm_more: false,
            work: CostWork {
                model: &self.cost,
                rng: &mut self.rng,
                total: 0,
            },
            wake: &mut self.wake,
            fabric: &mut self.fabric,
            queue: &mut self.queue,
            deliveries: &mut self.deliveries,
            delivered: 0,
        };
        let pass = host
            .driver
            .iterate(t, &mut host.engine, &mut io, &mut self.pool)
            .expect("the simulator's rings and links do not fail");
        let cost = io.cost + io.work.total;
        self.cons.delivered += io.delivered;
        let more = io.nic_more || io.vm_more;
        // The modelled time of this poll is charged like the switch charges its measured
        // loop time: split over the VMs whose frames it handled (Iron 3.1).
        host.engine.charge_cpu(t, cost);
        host.cpu_ns += cost;
        sched.busy_until = now + (cost as f64 / host.cpu_share) as Nanos;
        // As the switch's loop (`runner`, `worker`): after a pass that received or processed
        // anything it passes again, and it sleeps only after a pass that found nothing
        // (`Engine::note_empty_pass`, where the EyeQ receivers' idle time starts). A pass
        // that only received (feedback, a frame for a limiter or a full queue) is work too.
        let next = if more || pass.busy() > 0 {
            Some(sched.busy_until)
        } else {
            host.engine
                .poll_at()
                .map(|p| p.as_nanos().max(sched.busy_until))
        };
        if let Some(at) = next {
            sched.gen += 1;
            sched.pending = Some(at);
            self.queue.push(at, Event::HostPoll(h, sched.gen));
        }
    }
}

impl Host {
    /// Per tenant of the engine, its CPU on this host; and the switch's CPU so far, ns.
    pub fn tenant_cpu(&self) -> (Vec<TenantCpu>, u64) {
        let dir = &self.engine.dir;
        let mut out: Vec<TenantCpu> = dir
            .tenants
            .iter()
            .map(|t| TenantCpu {
                cores: t.cpu_quota,
                charged_ns: 0,
                frames: 0,
            })
            .collect();
        for (v, vm) in dir.vms.iter().enumerate().filter(|(_, v)| v.port.is_some()) {
            let c = &self.engine.vm_counters[v];
            let t = &mut out[vm.tenant];
            t.charged_ns += c.cost_ns;
            t.frames += c.rx_packets + c.tx_packets;
        }
        (out, self.cpu_ns)
    }

    /// Whether the switch charges its work to the tenants' allocations.
    pub fn charges_tenants(&self) -> bool {
        self.charges_tenants
    }
}

/// A host's NIC and VM rings as the driver's [`Io`]. Reading costs the work before
/// queueing (header parsing and table lookups, a quarter of the base cost per frame);
/// a frame sent to the uplink costs a packet's processing, has its inner ECN copied out
/// (RFC 6040) and goes to the fabric; a frame sent to a VM port reaches its application.
struct HostIo<'a> {
    host: u32,
    replica: u32,
    replicas: u32,
    now: Nanos,
    rings: &'a mut [VmRing],
    nic_rx: &'a mut VecDeque<Frame>,
    /// Modelled CPU time of the poll so far besides the engines' processing, ns.
    cost: u64,
    /// Frames stayed in the NIC ring after the last read.
    nic_more: bool,
    /// Frames stayed in a VM ring that was read.
    vm_more: bool,
    work: CostWork<'a>,
    wake: &'a mut Vec<u32>,
    fabric: &'a mut Fabric,
    queue: &'a mut EventQueue,
    deliveries: &'a mut Vec<Delivery>,
    /// Frames handed to VMs.
    delivered: u64,
}

impl Io for HostIo<'_> {
    fn recv(
        &mut self,
        _now: Instant,
        port: PortIdx,
        _pool: &mut FramePool,
        rx: &mut Vec<Frame>,
        max: usize,
    ) -> anyhow::Result<usize> {
        let base = self.work.model.base_ns;
        if port == UPLINK {
            let n = self.nic_rx.len().min(max);
            rx.extend(self.nic_rx.drain(..n));
            self.cost += n as u64 * base / 4;
            self.nic_more = !self.nic_rx.is_empty();
            return Ok(n);
        }
        let vm = &mut self.rings[port];
        if vm.ring.is_empty() {
            return Ok(0);
        }
        let k = vm.ring.len().min(max);
        rx.extend(vm.ring.drain(..k));
        self.cost += k as u64 * base / 4;
        self.vm_more |= !vm.ring.is_empty();
        self.wake.append(&mut vm.waiting);
        Ok(k)
    }

    fn send(
        &mut self,
        port: PortIdx,
        queue: &mut Vec<Frame>,
        pool: &mut FramePool,
    ) -> anyhow::Result<()> {
        if port != UPLINK {
            for frame in queue.drain(..) {
                if let Some((meta, ce)) = packet::parse(frame.data()) {
                    self.deliveries.push(Delivery { meta, ce });
                }
                self.delivered += 1;
                pool.put(frame);
            }
            return Ok(());
        }
        for mut frame in queue.drain(..) {
            self.cost += self.work.model.cost(frame.len(), self.work.rng);
            packet::copy_ecn_out(frame.data_mut());
            let local = packet::host_of_mac(&frame.data()[..6]);
            let dst = local * self.replicas + self.replica;
            let hash = packet::outer_flow_hash(frame.data());
            let up = self.fabric.host_up[self.host as usize];
            let pkt = Pkt {
                bytes: frame.data().into(),
                dst,
                hash,
            };
            pool.put(frame);
            self.fabric.enqueue(up, pkt, self.now, self.queue);
        }
        Ok(())
    }

    fn work(&mut self) -> &mut dyn Work {
        &mut self.work
    }

    /// An empty ring is skipped before the engine is asked (most VM rings are empty in a
    /// pass; the engine's `rx_ready` was 11% of the time at 300 hosts, its first touch of a
    /// host's state). Reading an empty ring has no effect, so results are unchanged.
    fn maybe_ready(&self, port: PortIdx) -> bool {
        if port == UPLINK {
            !self.nic_rx.is_empty()
        } else {
            !self.rings[port].ring.is_empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::apps::App;
    use super::super::testing;
    use super::*;
    use crate::packet::Kind;
    use picnic_switch::driver::UPLINK_READ_ROUNDS;
    use rand::SeedableRng;

    #[test]
    fn the_cost_model_is_base_plus_bytes_plus_rules_within_its_variance() {
        let mut model = CostModel {
            poll_ns: 50,
            base_ns: 200,
            per_byte_ps: 250,
            per_rule_ns: 10,
            rules: 10,
            variance: 0.0,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        // 200 + 1000 B x 0.25 ns + 10 rules x 10 ns.
        assert_eq!(model.cost(1000, &mut rng), 550);
        assert_eq!(model.cost(0, &mut rng), 300);
        // Without variance no random number is drawn (the run's other draws stay put).
        assert_eq!(rng.gen::<u64>(), SmallRng::seed_from_u64(1).gen::<u64>());
        model.variance = 0.1;
        let draw = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..1000)
                .map(|_| model.cost(1000, &mut rng))
                .collect::<Vec<u64>>()
        };
        let costs = draw(2);
        let (min, max) = (costs.iter().min().unwrap(), costs.iter().max().unwrap());
        assert!(
            *min >= 495 && *max <= 605,
            "{min}..{max} outside 550 +- 10%"
        );
        assert!(
            *min < 500 && *max > 600,
            "{min}..{max} does not span the variance"
        );
        let repeat = draw(2);
        assert_eq!(costs, repeat, "same seed, same costs");
    }

    const ONE_STREAM: &str = r#"
[[workloads]]
name = "u"
kind = "udp_flood"
from = "a"
to = "b"
rate_pps = 1
"#;

    #[test]
    fn a_full_vm_ring_refuses_sends_and_a_poll_wakes_the_app_that_waited() {
        let mut w = testing::world(ONE_STREAM, "picnic-off");
        let App::Udp(u) = &w.apps[0] else {
            panic!("the stream")
        };
        let (src, to) = (u.src, u.dst.addr);
        let meta = |app| Meta {
            app,
            kind: Kind::Data,
            ece: false,
            seq: 0,
            sent_ns: 0,
            sack: 0,
            sack_len: 0,
        };
        let net = &mut w.net;
        let send = |net: &mut Net, app, wait| {
            net.vm_send(
                0,
                &src,
                to,
                Proto::Udp,
                (1, 2),
                100,
                false,
                &meta(app),
                wait,
            )
        };
        for _ in 0..VM_RING {
            assert!(send(net, 7, true));
        }
        assert!(!send(net, 7, true));
        assert!(!send(net, 7, true));
        assert!(!send(net, 8, false));
        assert_eq!((net.app_blocked, net.cons.app_created), (3, VM_RING as u64));
        let host = &net.hosts[src.host as usize];
        assert_eq!(
            host.ports[src.port].waiting,
            [7],
            "registered once, 8 did not wait"
        );
        assert_eq!(
            net.sched[src.host as usize].pending,
            Some(0),
            "one poll due now"
        );

        net.host_poll(src.host, 0);
        let host = &net.hosts[src.host as usize];
        let batch = host.driver.batch();
        assert_eq!(host.ports[src.port].ring.len(), VM_RING - batch);
        assert_eq!(net.wake, [7]);
        // Busy at least for the loop overhead and the pre-queue work of the batch.
        let least = net.cost.poll_ns + batch as u64 * net.cost.base_ns / 4;
        let sched = &net.sched[src.host as usize];
        assert!(sched.busy_until >= least, "{} < {least}", sched.busy_until);
        assert_eq!(
            sched.pending,
            Some(sched.busy_until),
            "more to do: next poll when free"
        );
    }

    /// As the switch's loop, a host passes again after a pass that only received (a frame
    /// the engine drops: nothing processed) and sleeps only after a pass that found nothing,
    /// where the engine notes that its idle time starts (the EyeQ receivers' meter windows
    /// that end after it are closed as at their ends, not late).
    #[test]
    fn a_pass_that_only_received_is_followed_by_one_more_before_the_host_sleeps() {
        let mut w = testing::world(ONE_STREAM, "picnic");
        let net = &mut w.net;
        net.nic_receive(1, vec![0; 64].into(), 100);
        net.host_poll(1, 100);
        let sched = net.sched[1];
        assert_eq!(
            sched.pending,
            Some(sched.busy_until),
            "it received: one more pass"
        );
        net.host_poll(1, sched.busy_until);
        let sched = net.sched[1];
        assert!(
            sched.pending.map_or(true, |p| p > sched.busy_until),
            "an empty pass: asleep until the engine's deadline, not {:?}",
            sched.pending
        );
    }

    #[test]
    fn a_full_nic_ring_drops_and_one_poll_is_scheduled_for_a_burst() {
        let mut w = testing::world(ONE_STREAM, "picnic-off");
        let net = &mut w.net;
        for _ in 0..=NIC_RX_RING {
            net.nic_receive(1, vec![0; 64].into(), 100);
        }
        assert_eq!(net.cons.nic_rx_drops, 1);
        let host = &net.hosts[1];
        assert_eq!(host.nic_rx.len(), NIC_RX_RING);
        assert_eq!((net.sched[1].gen, net.sched[1].pending), (1, Some(100)));
        net.host_poll(1, 100);
        let host = &net.hosts[1];
        // The switch's policy: the uplink ring is read several batches deep per poll.
        let read = UPLINK_READ_ROUNDS * host.driver.batch();
        assert_eq!(host.nic_rx.len(), NIC_RX_RING - read);
    }
}
