//! One simulated deployment: hosts running the switch's own [`Engine`] with a processing-cost
//! model, NIC queues, links with rate, propagation delay and buffer, fabric switches with
//! shared buffers and ECMP, and the applications; all driven by one [`EventQueue`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use picnic_core::Instant;
use picnic_lab::picnic::switch_config;
use picnic_lab::scenario::{Protocol, WorkloadKind};
use picnic_lab::topology::Topology;
use picnic_lab::workload::{WorkloadResult, BIN_MS};
use picnic_switch::directory::{TenantIdx, UPLINK};
use picnic_switch::engine::{Engine, Work};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::stats::DropReason;
use picnic_wire::overlay::ENCAP_OVERHEAD;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::event::{Event, EventQueue, Nanos};
use crate::packet::{self, Addr, Kind, Meta, Proto};
use crate::spec::{CostModel, Ecmp, Spec, TopologyKind};
use crate::tcp::{TcpReceiver, TcpSender};
use crate::workload::FlowSizes;

/// Frames a VM's transmit ring holds (its virtio/veth ring toward the switch).
const VM_RING: usize = 256;
/// Host NIC receive ring, frames.
const NIC_RX_RING: usize = 1024;
/// Fixed cost of one engine poll (loop overhead), ns.
const POLL_OVERHEAD_NS: u64 = 50;
/// Receivers keep counting this long after the last sender stops (the lab's grace).
const GRACE_NS: Nanos = 200_000_000;
/// RPC timeout default, ms.
const RPC_TIMEOUT_MS: u64 = 100;
/// Frames the pool grows by when it runs dry (until the budget).
const POOL_CHUNK: usize = 4096;
/// Free frames kept for an engine poll (feedback frames), while under the budget.
const POLL_RESERVE: usize = 256;
/// Period of queue-occupancy sampling (EyeQ 5.4 samples every queue each 1 ms), ns.
pub const SAMPLE_NS: Nanos = 1_000_000;
/// Width of the fine-grained rate series (convergence plots), ns.
pub const FINE_BIN_NS: Nanos = 1_000_000;

/// Where a link ends.
#[derive(Clone, Copy, Debug)]
enum To {
    Host(u32),
    Switch(u32),
}

/// Which part of the network a queue is in (EyeQ 5.4: edge vs core).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Host NIC toward its switch.
    HostUp,
    /// Switch port toward a host (the access link: EyeQ's congestion point).
    Edge,
    /// Leaf-spine and spine-leaf links.
    Core,
}
const CLASSES: [LinkClass; 3] = [LinkClass::HostUp, LinkClass::Edge, LinkClass::Core];

/// A frame in the fabric with what the fabric needs to forward it.
struct Pkt {
    frame: Frame,
    dst: u32,
    hash: u32,
}

struct Link {
    rate_bps: u64,
    delay: Nanos,
    to: To,
    class: LinkClass,
    /// Switch owning the (shared) buffer this queue lives in.
    owner: Option<u32>,
    cap_bytes: u64,
    cap_frames: usize,
    queue: VecDeque<Pkt>,
    bytes: u64,
    busy: bool,
    flight: VecDeque<(Nanos, Pkt)>,
}

enum SwitchKind {
    Big,
    Leaf(u32),
    Spine,
}

struct Switch {
    kind: SwitchKind,
    buffer: Option<u64>,
    used: u64,
}

struct Fabric {
    links: Vec<Link>,
    switches: Vec<Switch>,
    host_up: Vec<u32>,
    host_down: Vec<u32>,
    leaf_up: Vec<Vec<u32>>,
    spine_down: Vec<Vec<u32>>,
    hosts_per_leaf: u32,
    ecmp: Ecmp,
    ecn_k: Option<u64>,
}

/// A VM's place: host, engine port, addresses.
#[derive(Clone, Copy, Debug)]
struct VmLoc {
    host: u32,
    port: usize,
    addr: Addr,
    tenant: usize,
}

struct Port {
    ring: VecDeque<Frame>,
    waiting: Vec<u32>,
}

struct Host {
    engine: Engine,
    replica: u32,
    ports: Vec<Port>,
    nic_rx: VecDeque<Frame>,
    busy_until: Nanos,
    gen: u32,
    pending: Option<Nanos>,
    batch: usize,
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

/// A frame that reached a VM.
struct Delivery {
    meta: Meta,
    ce: bool,
    len: usize,
}

/// Counters proving conservation: every frame is created, delivered, dropped with a reason,
/// or still somewhere in the deployment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Conservation {
    /// Frames built by applications.
    pub app_created: u64,
    /// Standalone feedback frames built by the engines.
    pub feedback_created: u64,
    /// Frames that reached an application.
    pub delivered: u64,
    /// Standalone feedback frames consumed by the engines.
    pub feedback_consumed: u64,
    /// Frames dropped by the engines, by reason (NoBuffer excluded: no frame existed).
    pub engine_drops: std::collections::BTreeMap<String, u64>,
    /// Frames dropped by fabric queues (buffer full), by link class.
    pub fabric_drops: std::collections::BTreeMap<String, u64>,
    /// Frames dropped at a full NIC receive ring.
    pub nic_rx_drops: u64,
    /// Frames dropped at a full NIC transmit queue.
    pub nic_tx_drops: u64,
    /// Frames still held somewhere at the end (the pool's missing frames).
    pub in_flight: u64,
    /// Whether created == delivered + consumed + drops + in flight.
    pub balanced: bool,
}

/// One shuffle job's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ShuffleResult {
    /// Job tag (`shuffle-TENANT`).
    pub job: String,
    /// Flows (ordered pairs x connections x replicas).
    pub flows: u64,
    /// Flows that completed.
    pub completed: u64,
    /// Completion of the job (its last flow), ms after its start; none if some flow did not
    /// complete.
    pub completion_ms: Option<f64>,
    /// Median flow completion time, ms.
    pub median_fct_ms: f64,
}

/// One convergence measurement's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ConvergenceResult {
    /// Tenant watched.
    pub tenant: String,
    /// Allocation, Mb/s.
    pub target_mbps: f64,
    /// Time from the disturbance to the first 1 ms bin whose `hold_ms` window mean is
    /// within the tolerance (the rate reaches its allocation; it may leave again), ms.
    pub reached_ms: Option<f64>,
    /// Time from the disturbance to the first 1 ms bin from which on (until `until_ms`) the
    /// mean rate over every `hold_ms` window is within the tolerance of the target, ms; none
    /// if never.
    pub converged_ms: Option<f64>,
    /// Mean rate from convergence (or the disturbance) to `until_ms`, Mb/s.
    pub settled_mbps: f64,
    /// Share of 1 ms bins from convergence to `until_ms` within the tolerance (how steady
    /// the rate is at 1 ms).
    pub in_band_share: f64,
}

/// Everything a mode's run measured besides the lab's workload results.
#[derive(Debug, Clone, Serialize)]
pub struct RunStats {
    /// Mode name.
    pub mode: String,
    /// Hosts simulated.
    pub hosts: usize,
    /// Events processed.
    pub events: u64,
    /// Wall time of the run, s (not part of summary.json: it varies between runs).
    pub wall_s: f64,
    /// Events per second of wall time (one core).
    pub events_per_sec: f64,
    /// Simulated time, s.
    pub sim_s: f64,
    /// Frame accounting.
    pub conservation: Conservation,
    /// Sends refused because the VM's ring was full (backpressure, not loss).
    pub app_blocked: u64,
    /// Sends refused because the frame pool was empty.
    pub pool_exhausted: u64,
    /// ECN marks set by fabric switches.
    pub ecn_marks: u64,
    /// TCP model segments sent again, and retransmission timeouts, over all connections.
    pub tcp_retransmits: u64,
    /// See `tcp_retransmits`.
    pub tcp_timeouts: u64,
    /// Queue occupancy seen by arriving packets per link class: (quantile, KB).
    pub queue_kb: std::collections::BTreeMap<String, Vec<(f64, f64)>>,
    /// Occupancy of every queue sampled each 1 ms ([`SAMPLE_NS`]), per link class (EyeQ
    /// 5.4's measure; idle queues count as empty): (quantile, KB).
    pub queue_sampled_kb: std::collections::BTreeMap<String, Vec<(f64, f64)>>,
    /// Shuffles: per job, flows, flows completed and the job's completion time (its last
    /// flow's), ms.
    pub shuffles: Vec<ShuffleResult>,
    /// Convergence measurements of the spec (`[[sim.convergence]]`).
    pub convergence: Vec<ConvergenceResult>,
    /// Completed flows: (tag, bytes, completion time us); written to flows.csv.
    #[serde(skip)]
    pub flows: Vec<(String, u64, f64)>,
    /// Flows started but not completed.
    pub unfinished_flows: u64,
    /// Per tenant, received payload bytes per [`FINE_BIN_NS`] bin (all replicas); written
    /// to rates.csv.
    #[serde(skip)]
    pub fine_series: std::collections::BTreeMap<String, Vec<u64>>,
}

struct UdpApp {
    src: VmLoc,
    dst: VmLoc,
    replica: u32,
    res: usize,
    proto: Proto,
    size: usize,
    interval: Nanos,
    stop: Nanos,
    on_off: Option<(Nanos, Nanos, Nanos)>,
    seq: u64,
    /// Receiver port, the lab's (shaped classes match on it).
    port: u16,
}

struct RpcApp {
    client: VmLoc,
    server: VmLoc,
    replica: u32,
    res: usize,
    proto: Proto,
    size: usize,
    interval: Nanos,
    stop: Nanos,
    timeout: Nanos,
    seq: u64,
    /// Server port, the lab's.
    port: u16,
}

struct TcpApp {
    src: VmLoc,
    dst: VmLoc,
    replica: u32,
    res: usize,
    sender: TcpSender,
    receiver: TcpReceiver,
    mss: usize,
    start: Nanos,
    stop: Nanos,
    tag: Option<Arc<str>>,
    bytes: u64,
    gen: u32,
    timer: Option<Nanos>,
    finished: bool,
    /// Receiver port: the lab's for a scenario workload (shaped classes match on it).
    port: u16,
}

struct FlowGenApp {
    vms: Arc<Vec<VmLoc>>,
    src: usize,
    replica: u32,
    res: usize,
    mean_gap_ns: f64,
    sizes: Arc<FlowSizes>,
    stop: Nanos,
    tag: Arc<str>,
}

enum App {
    Udp(UdpApp),
    Rpc(RpcApp),
    Tcp(Box<TcpApp>),
    FlowGen(FlowGenApp),
}

/// Everything but the applications (so handlers can borrow both).
struct Net {
    queue: EventQueue,
    hosts: Vec<Host>,
    fabric: Fabric,
    pool: FramePool,
    /// Most frames the pool may grow to.
    pool_budget: usize,
    rng: SmallRng,
    cost: CostModel,
    replicas: u32,
    cons: Conservation,
    app_blocked: u64,
    pool_exhausted: u64,
    ecn_marks: u64,
    queue_hist: Vec<Histogram<u64>>,
    /// Per link class, every queue's occupancy each [`SAMPLE_NS`].
    queue_sampled: Vec<Histogram<u64>>,
    scratch: Vec<Frame>,
    deliveries: Vec<Delivery>,
    wake: Vec<u32>,
}

/// A simulated deployment for one mode.
pub struct World {
    net: Net,
    apps: Vec<App>,
    /// Per replica, per result slot.
    results: Vec<Vec<WorkloadResult>>,
    fine: Vec<Vec<u64>>,
    tenant_names: Vec<String>,
    flows: Vec<(String, u64, f64)>,
    /// Flows of each lab `transfer` (replica, result slot) still sending: its completion is
    /// when the last one finishes, as in the lab.
    transfer_flows_left: BTreeMap<(u32, usize), u32>,
    mss: usize,
    min_rto: Nanos,
    dupack_threshold: u32,
    cc: crate::spec::CongestionControl,
    end: Nanos,
    duration: Nanos,
    mode: String,
    convergence: Vec<crate::spec::Convergence>,
}

fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let m: picnic_switch::config::Mac = s.parse().map_err(|e: String| anyhow!(e))?;
    Ok(m.0)
}

fn ser_ns(bytes: usize, rate_bps: u64) -> Nanos {
    (bytes as u64 * 8 * 1_000_000_000).div_ceil(rate_bps.max(1))
}

impl World {
    /// Builds the deployment of `spec` for `mode` (`picnic`, `picnic-off`, `victim-alone`)
    /// with RNG seed `seed`.
    pub fn new(spec: &Spec, mode: &str, seed: u64) -> Result<World> {
        let sc = &spec.scenario;
        let sim = &spec.sim;
        let isolated = mode == "picnic";
        let attackers = mode != "victim-alone";
        let replicas = sim.replicas;
        let per = sc.hosts.len() as u32;
        let total_hosts = (per * replicas) as usize;
        let access_bps = sc.access_link_mbps * 1_000_000;
        let queue_bytes = (access_bps / 8 * sc.access_queue_ms / 1000).max(3000);
        let mut derived_budget = 0;
        let mut hosts: Vec<Option<Host>> = (0..total_hosts).map(|_| None).collect();
        let mut vm_locs: Vec<std::collections::HashMap<String, VmLoc>> = Vec::new();
        for r in 0..replicas {
            let topo = Topology::plan_detached(sc, &format!("r{r}"));
            let mut locs = std::collections::HashMap::new();
            for hv in &topo.hosts {
                let mut cfg = switch_config(sc, &topo, hv, isolated)?;
                cfg.switch.nice = None;
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
                    locs.insert(
                        vm.name.clone(),
                        VmLoc {
                            host: g,
                            port,
                            addr: Addr {
                                mac: parse_mac(&vm.mac)?,
                                ip: vm.ip.octets(),
                            },
                            tenant: vm.tenant_index,
                        },
                    );
                }
                derived_budget = derived_budget.max(host_frame_budget(
                    &cfg,
                    hv.vms.len(),
                    sim.nic_queue_frames,
                    queue_bytes,
                ));
                let ports = (0..engine.dir.port_count())
                    .map(|_| Port {
                        ring: VecDeque::new(),
                        waiting: Vec::new(),
                    })
                    .collect();
                hosts[g as usize] = Some(Host {
                    engine,
                    replica: r,
                    ports,
                    nic_rx: VecDeque::new(),
                    busy_until: 0,
                    gen: 0,
                    pending: None,
                    batch: cfg.switch.batch,
                });
            }
            vm_locs.push(locs);
        }
        let hosts: Vec<Host> = hosts
            .into_iter()
            .map(|h| h.expect("every host built"))
            .collect();
        let budget = total_hosts * sim.frames_per_host.unwrap_or(derived_budget);
        let fabric = build_fabric(spec, total_hosts as u32, access_bps, queue_bytes);
        let mut net = Net {
            queue: EventQueue::default(),
            hosts,
            fabric,
            pool: FramePool::new(POOL_CHUNK.min(budget)),
            pool_budget: budget,
            rng: SmallRng::seed_from_u64(seed),
            cost: sim.cost.clone(),
            replicas,
            cons: Conservation::default(),
            app_blocked: 0,
            pool_exhausted: 0,
            ecn_marks: 0,
            queue_hist: CLASSES
                .iter()
                .map(|_| Histogram::new_with_bounds(1, 1 << 32, 2).expect("valid bounds"))
                .collect(),
            queue_sampled: CLASSES
                .iter()
                .map(|_| Histogram::new_with_bounds(1, 1 << 32, 2).expect("valid bounds"))
                .collect(),
            scratch: Vec::new(),
            deliveries: Vec::new(),
            wake: Vec::new(),
        };
        let duration = sc.duration_ms * 1_000_000;
        let bins = (sc.duration_ms / BIN_MS + 1) as usize;
        let mss = sc.mtu as usize - ENCAP_OVERHEAD - 40;
        let ms = |m: u64| m * 1_000_000;
        let victim = sc.victim.as_str();
        let mut apps = Vec::new();
        let mut results: Vec<Vec<WorkloadResult>> = (0..replicas).map(|_| Vec::new()).collect();
        let mut transfer_flows_left = BTreeMap::new();
        let result =
            |name: &str, tenant: &str, kind, active_ns: u64, latency: bool| WorkloadResult {
                name: name.to_owned(),
                tenant: tenant.to_owned(),
                kind,
                sent: 0,
                received: 0,
                received_bytes: 0,
                active_ns,
                latency: latency.then(|| {
                    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
                }),
                series: vec![0; bins],
                completion_ns: None,
            };
        for r in 0..replicas {
            let locs = &vm_locs[r as usize];
            for wl in &sc.workloads {
                if !attackers && sc.is_attack(wl) {
                    continue;
                }
                // The report row, as in the lab: a victim's own attack workloads apart.
                let row = sc.report_group(wl);
                let port = wl.port(sc).expect("a scenario's own workload");
                let (src, dst) = (locs[&wl.from], locs[&wl.to]);
                let (start, stop) = (ms(wl.start_ms), ms(wl.stop_ms(sc)));
                let res = results[r as usize].len();
                let proto = match wl.protocol {
                    Some(Protocol::Tcp) => Proto::Tcp,
                    _ => Proto::Udp,
                };
                let first = apps.len() as u32;
                match wl.kind {
                    WorkloadKind::CpuBurn => anyhow::bail!(
                        "workload {}: cpu_burn needs the tenants' CPU, which the simulator \
                         does not model (run the scenario in the lab)",
                        wl.name
                    ),
                    WorkloadKind::UdpFlood | WorkloadKind::OnOff => {
                        results[r as usize].push(result(
                            &wl.name,
                            &row,
                            wl.kind,
                            stop - start,
                            false,
                        ));
                        let pps = wl.rate_pps.unwrap_or(sim.flood_pps).max(1);
                        let on_off = (wl.kind == WorkloadKind::OnOff).then(|| {
                            (start, ms(wl.on_ms.unwrap_or(1)), ms(wl.off_ms.unwrap_or(0)))
                        });
                        apps.push(App::Udp(UdpApp {
                            src,
                            dst,
                            replica: r,
                            res,
                            proto: Proto::Udp,
                            size: wl.size(),
                            interval: 1_000_000_000 / pps,
                            stop,
                            on_off,
                            seq: 0,
                            port,
                        }));
                    }
                    // sockperf and memcached probes are request/response at a rate too.
                    WorkloadKind::Rpc | WorkloadKind::Sockperf | WorkloadKind::Memcached => {
                        results[r as usize].push(result(
                            &wl.name,
                            &row,
                            wl.kind,
                            stop - start,
                            true,
                        ));
                        let rate = wl.rate_pps.unwrap_or(1000).max(1);
                        apps.push(App::Rpc(RpcApp {
                            client: src,
                            server: dst,
                            replica: r,
                            res,
                            proto,
                            size: wl.size(),
                            interval: 1_000_000_000 / rate,
                            stop,
                            timeout: ms(wl.timeout_ms.unwrap_or(RPC_TIMEOUT_MS)),
                            seq: 0,
                            port,
                        }));
                    }
                    WorkloadKind::TcpBulk | WorkloadKind::Iperf3 | WorkloadKind::Transfer => {
                        results[r as usize].push(result(
                            &wl.name,
                            &row,
                            wl.kind,
                            stop - start,
                            false,
                        ));
                        // A transfer sends a fixed number of bytes per flow; bulk runs to stop.
                        let segments = (wl.kind == WorkloadKind::Transfer)
                            .then(|| wl.bytes.unwrap_or(0).div_ceil(mss as u64).max(1));
                        if segments.is_some() {
                            transfer_flows_left.insert((r, res), wl.flows());
                        }
                        for _ in 0..wl.flows() {
                            let mut app = TcpApp::new(
                                src,
                                dst,
                                r,
                                res,
                                sim.cc,
                                segments,
                                sim.min_rto_us * 1000,
                                sim.dupack_threshold,
                                mss,
                                start,
                                stop,
                                None,
                            );
                            app.port = port;
                            apps.push(App::Tcp(Box::new(app)));
                        }
                    }
                }
                for a in first..apps.len() as u32 {
                    net.queue.push(start, Event::App(a, 0));
                }
            }
            for f in &sim.flows {
                if !attackers && f.tenant != victim {
                    continue;
                }
                let t = sc
                    .tenants
                    .iter()
                    .find(|t| t.name == f.tenant)
                    .expect("validated");
                let vms: Arc<Vec<VmLoc>> = Arc::new(t.vms.iter().map(|v| locs[&v.name]).collect());
                let sizes = Arc::new(FlowSizes::load(&f.cdf)?);
                let (start, stop) = (ms(f.start_ms), ms(f.stop_ms.unwrap_or(sc.duration_ms)));
                let res = results[r as usize].len();
                results[r as usize].push(result(
                    &f.name,
                    &f.tenant,
                    WorkloadKind::TcpBulk,
                    stop - start,
                    false,
                ));
                // Poisson arrivals: mean gap = mean size / (load * access rate).
                let mean_gap_ns = sizes.mean() * 8.0 * 1e9 / (f.load * access_bps as f64);
                let tag: Arc<str> = Arc::from(f.name.as_str());
                for src in 0..vms.len() {
                    let a = apps.len() as u32;
                    apps.push(App::FlowGen(FlowGenApp {
                        vms: vms.clone(),
                        src,
                        replica: r,
                        res,
                        mean_gap_ns,
                        sizes: sizes.clone(),
                        stop,
                        tag: tag.clone(),
                    }));
                    let jitter = (net.rng.gen::<f64>() * mean_gap_ns) as u64;
                    net.queue.push(start + jitter, Event::App(a, 0));
                }
            }
            for sh in &sim.shuffles {
                if !attackers && sh.tenant != victim {
                    continue;
                }
                let t = sc
                    .tenants
                    .iter()
                    .find(|t| t.name == sh.tenant)
                    .expect("validated");
                let start = ms(sh.start_ms);
                let res = results[r as usize].len();
                let name = format!("shuffle-{}", sh.tenant);
                results[r as usize].push(result(
                    &name,
                    &sh.tenant,
                    WorkloadKind::TcpBulk,
                    duration - start,
                    false,
                ));
                let tag: Arc<str> = Arc::from(name.as_str());
                let conns = sh.connections as u64;
                let segs = (sh.bytes / conns).div_ceil(mss as u64).max(1);
                for a in &t.vms {
                    for b in t.vms.iter().filter(|b| b.name != a.name) {
                        for _ in 0..conns {
                            let id = apps.len() as u32;
                            apps.push(App::Tcp(Box::new(TcpApp::new(
                                locs[&a.name],
                                locs[&b.name],
                                r,
                                res,
                                sim.cc,
                                Some(segs),
                                sim.min_rto_us * 1000,
                                sim.dupack_threshold,
                                mss,
                                start,
                                duration,
                                Some(tag.clone()),
                            ))));
                            net.queue.push(start, Event::App(id, 0));
                        }
                    }
                }
            }
        }
        net.queue.push(0, Event::Tick);
        net.queue.push(0, Event::Sample);
        Ok(World {
            convergence: sim.convergence.clone(),
            net,
            apps,
            results,
            fine: vec![vec![0; (duration / FINE_BIN_NS + 1) as usize]; sc.tenants.len()],
            tenant_names: sc.tenants.iter().map(|t| t.name.clone()).collect(),
            flows: Vec::new(),
            transfer_flows_left,
            mss,
            min_rto: sim.min_rto_us * 1000,
            dupack_threshold: sim.dupack_threshold,
            cc: sim.cc,
            end: duration + GRACE_NS,
            duration,
            mode: mode.to_owned(),
        })
    }

    /// Runs to the end of the scenario plus the receivers' grace; `progress` gets a line
    /// about every `progress_every` of wall time.
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
                    if self.net.hosts[h as usize].gen == gen {
                        self.net.host_poll(h, now);
                        self.after_poll(now);
                    }
                }
                Event::LinkTxDone(l) => self.net.link_tx_done(l, now),
                Event::LinkArrive(l) => self.net.link_arrive(l, now),
                Event::App(a, gen) => self.app_timer(a, gen, now),
                Event::Tick => {
                    let elapsed = last.elapsed();
                    if elapsed.as_secs_f64() >= 2.0 {
                        last = std::time::Instant::now();
                        let secs = wall.elapsed().as_secs_f64();
                        progress(&format!(
                            "mode {} t={:.0}/{} ms  {:.1} M events  {:.2} M events/s  pool free {}",
                            self.mode,
                            now as f64 / 1e6,
                            self.duration / 1_000_000,
                            self.net.queue.processed as f64 / 1e6,
                            self.net.queue.processed as f64 / secs / 1e6,
                            self.net.pool.available()
                        ));
                    }
                    self.net.queue.push(now + 10_000_000, Event::Tick);
                }
                Event::Sample => {
                    self.net.sample_queues();
                    if now + SAMPLE_NS <= self.duration {
                        self.net.queue.push(now + SAMPLE_NS, Event::Sample);
                    }
                }
            }
        }
        let wall_s = wall.elapsed().as_secs_f64();
        self.stats(wall_s)
    }

    /// The lab's workload results, one list per replica (the report's repetitions).
    pub fn results(&self) -> Vec<Vec<WorkloadResult>> {
        self.results.clone()
    }

    fn stats(&self, wall_s: f64) -> RunStats {
        let mut cons = self.net.cons.clone();
        for h in &self.net.hosts {
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
        cons.in_flight = (self.net.pool.capacity() - self.net.pool.available()) as u64;
        let out = cons.delivered
            + cons.feedback_consumed
            + cons.engine_drops.values().sum::<u64>()
            + cons.fabric_drops.values().sum::<u64>()
            + cons.nic_rx_drops
            + cons.nic_tx_drops
            + cons.in_flight;
        cons.balanced = cons.app_created + cons.feedback_created == out;
        let quantiles = [0.5, 0.9, 0.99, 0.999, 1.0];
        let per_class = |hists: &[Histogram<u64>]| {
            CLASSES
                .iter()
                .zip(hists)
                .filter(|(_, h)| !h.is_empty())
                .map(|(c, h)| {
                    (
                        format!("{c:?}").to_lowercase(),
                        quantiles
                            .iter()
                            // Recorded as max(bytes, 1): one byte is an empty queue.
                            .map(|&q| (q, (h.value_at_quantile(q) as f64 - 1.0).max(0.0) / 1000.0))
                            .collect(),
                    )
                })
                .collect()
        };
        let queue_kb = per_class(&self.net.queue_hist);
        let queue_sampled_kb = per_class(&self.net.queue_sampled);
        let unfinished = self
            .apps
            .iter()
            .filter(|a| matches!(a, App::Tcp(t) if t.tag.is_some() && !t.finished))
            .count() as u64;
        RunStats {
            mode: self.mode.clone(),
            hosts: self.net.hosts.len(),
            events: self.net.queue.processed,
            wall_s,
            events_per_sec: self.net.queue.processed as f64 / wall_s.max(1e-9),
            sim_s: self.end as f64 / 1e9,
            conservation: cons,
            app_blocked: self.net.app_blocked,
            pool_exhausted: self.net.pool_exhausted,
            ecn_marks: self.net.ecn_marks,
            tcp_retransmits: self.tcp_apps().map(|t| t.sender.retransmits).sum(),
            tcp_timeouts: self.tcp_apps().map(|t| t.sender.timeouts).sum(),
            queue_kb,
            queue_sampled_kb,
            shuffles: self.shuffle_results(),
            convergence: self.convergence_results(),
            flows: self.flows.clone(),
            unfinished_flows: unfinished,
            fine_series: self
                .tenant_names
                .iter()
                .cloned()
                .zip(self.fine.iter().cloned())
                .filter(|(_, s)| s.iter().any(|&b| b > 0))
                .collect(),
        }
    }

    fn shuffle_results(&self) -> Vec<ShuffleResult> {
        let mut jobs: std::collections::BTreeMap<&str, (u64, Vec<f64>)> = Default::default();
        for t in self.tcp_apps() {
            if let Some(tag) = t.tag.as_deref().filter(|g| g.starts_with("shuffle-")) {
                jobs.entry(tag).or_default().0 += 1;
            }
        }
        for (tag, _, fct_us) in &self.flows {
            if let Some(j) = jobs.get_mut(tag.as_str()) {
                j.1.push(fct_us / 1e3);
            }
        }
        jobs.into_iter()
            .map(|(job, (flows, mut fcts))| {
                fcts.sort_by(f64::total_cmp);
                let completed = fcts.len() as u64;
                ShuffleResult {
                    job: job.to_owned(),
                    flows,
                    completed,
                    completion_ms: (completed == flows).then(|| fcts.last().copied()).flatten(),
                    median_fct_ms: fcts.get(fcts.len() / 2).copied().unwrap_or(0.0),
                }
            })
            .collect()
    }

    fn convergence_results(&self) -> Vec<ConvergenceResult> {
        let bin_ms = FINE_BIN_NS as f64 / 1e6;
        let mbps = |bytes: u64| bytes as f64 * 8.0 / (bin_ms * 1e3);
        self.convergence
            .iter()
            .map(|c| {
                let until = c.until_ms.map_or(self.duration, |u| u * 1_000_000);
                let series = self
                    .tenant_names
                    .iter()
                    .position(|n| *n == c.tenant)
                    .map(|i| &self.fine[i][..(until / FINE_BIN_NS) as usize])
                    .unwrap_or(&[]);
                let first = (c.after_ms as f64 / bin_ms) as usize;
                let hold = ((c.hold_ms as f64 / bin_ms).ceil() as usize).max(1);
                let in_band = |r: f64| (r / c.target_mbps - 1.0).abs() <= c.tolerance;
                let window_ok = |b: usize| {
                    in_band(series[b..b + hold].iter().map(|&x| mbps(x)).sum::<f64>() / hold as f64)
                };
                // Converged from the first bin after which every window stays in the band.
                let last = series.len().saturating_sub(hold - 1);
                let mut at = None;
                for b in (first..last).rev() {
                    if !window_ok(b) {
                        break;
                    }
                    at = Some(b);
                }
                let reached = (first..last).find(|&b| window_ok(b));
                let rest = &series[at.unwrap_or(first).min(series.len())..];
                let n = rest.len().max(1) as f64;
                ConvergenceResult {
                    tenant: c.tenant.clone(),
                    target_mbps: c.target_mbps,
                    reached_ms: reached.map(|b| (b - first) as f64 * bin_ms),
                    converged_ms: at.map(|b| (b - first) as f64 * bin_ms),
                    settled_mbps: rest.iter().map(|&b| mbps(b)).sum::<f64>() / n,
                    in_band_share: rest.iter().filter(|&&b| in_band(mbps(b))).count() as f64 / n,
                }
            })
            .collect()
    }

    fn tcp_apps(&self) -> impl Iterator<Item = &TcpApp> {
        self.apps.iter().filter_map(|a| match a {
            App::Tcp(t) => Some(&**t),
            _ => None,
        })
    }

    fn after_poll(&mut self, now: Nanos) {
        let deliveries = std::mem::take(&mut self.net.deliveries);
        for d in &deliveries {
            self.app_receive(now, d);
        }
        self.net.deliveries = deliveries;
        self.net.deliveries.clear();
        while let Some(a) = self.net.wake.pop() {
            if let Some(App::Tcp(_)) = self.apps.get(a as usize) {
                self.tcp_send(a, now);
            }
        }
    }

    fn count_rx(
        &mut self,
        replica: u32,
        res: usize,
        tenant: usize,
        now: Nanos,
        bytes: u64,
        packets: u64,
    ) {
        let r = &mut self.results[replica as usize][res];
        r.received += packets;
        r.received_bytes += bytes;
        let bin = ((now / 1_000_000 / BIN_MS) as usize).min(r.series.len() - 1);
        r.series[bin] += bytes;
        let fine = &mut self.fine[tenant];
        let bin = ((now / FINE_BIN_NS) as usize).min(fine.len() - 1);
        fine[bin] += bytes;
    }

    fn app_timer(&mut self, a: u32, gen: u32, now: Nanos) {
        let Some(app) = self.apps.get_mut(a as usize) else {
            return;
        };
        match app {
            App::Udp(u) => {
                if now >= u.stop {
                    return;
                }
                if let Some((start, on, off)) = u.on_off {
                    let period = on + off;
                    let phase = (now - start) % period.max(1);
                    if phase >= on {
                        let next = now - phase + period;
                        self.net.queue.push(next, Event::App(a, 0));
                        return;
                    }
                }
                u.seq += 1;
                let ports = (30000, u.port);
                let (from, to) = (u.src, u.dst.addr);
                if self.net.send_periodic(
                    now,
                    a,
                    Kind::Data,
                    u.seq,
                    &from,
                    to,
                    u.proto,
                    ports,
                    u.size,
                    u.interval,
                ) {
                    self.results[u.replica as usize][u.res].sent += 1;
                }
            }
            App::Rpc(c) => {
                if now >= c.stop {
                    return;
                }
                c.seq += 1;
                let ports = (30001, c.port);
                let (from, to) = (c.client, c.server.addr);
                if self.net.send_periodic(
                    now,
                    a,
                    Kind::Request,
                    c.seq,
                    &from,
                    to,
                    c.proto,
                    ports,
                    c.size,
                    c.interval,
                ) {
                    self.results[c.replica as usize][c.res].sent += 1;
                }
            }
            App::Tcp(t) => {
                if gen != t.gen {
                    return;
                }
                t.timer = None;
                t.sender.on_timeout(now);
                self.tcp_send(a, now);
            }
            App::FlowGen(g) => {
                if now >= g.stop {
                    return;
                }
                let dst = loop {
                    let d = self.net.rng.gen_range(0..g.vms.len());
                    if d != g.src {
                        break d;
                    }
                };
                let bytes = g.sizes.sample(&mut self.net.rng).max(1);
                let gap = -g.mean_gap_ns * (1.0 - self.net.rng.gen::<f64>()).ln();
                let (src, dst, replica, res, tag) =
                    (g.vms[g.src], g.vms[dst], g.replica, g.res, g.tag.clone());
                self.net.queue.push(now + gap as u64 + 1, Event::App(a, 0));
                let id = self.apps.len() as u32;
                let segs = bytes.div_ceil(self.mss as u64);
                self.apps.push(App::Tcp(Box::new(TcpApp::new(
                    src,
                    dst,
                    replica,
                    res,
                    self.cc,
                    Some(segs),
                    self.min_rto,
                    self.dupack_threshold,
                    self.mss,
                    now,
                    self.end,
                    Some(tag),
                ))));
                self.tcp_send(id, now);
            }
        }
    }

    fn tcp_send(&mut self, a: u32, now: Nanos) {
        let App::Tcp(t) = &mut self.apps[a as usize] else {
            return;
        };
        let ect = self.cc == crate::spec::CongestionControl::Dctcp;
        let ports = (40000 + (a % 20000) as u16, t.port);
        while now < t.stop {
            let Some(seq) = t.sender.next_to_send() else {
                break;
            };
            let meta = Meta {
                app: a,
                kind: Kind::Data,
                ece: false,
                seq,
                sent_ns: now,
                sack: 0,
            };
            if !self.net.vm_send(
                now,
                &t.src,
                t.dst.addr,
                Proto::Tcp,
                ports,
                t.mss,
                ect,
                &meta,
                true,
            ) {
                break;
            }
            t.sender.on_sent(now, seq);
        }
        if let Some(d) = t.sender.rto_deadline {
            if t.timer.is_none_or(|s| s > d) {
                t.gen += 1;
                t.timer = Some(d);
                self.net.queue.push(d, Event::App(a, t.gen));
            }
        }
    }

    fn app_receive(&mut self, now: Nanos, d: &Delivery) {
        let a = d.meta.app;
        let Some(app) = self.apps.get_mut(a as usize) else {
            return;
        };
        match (app, d.meta.kind) {
            (App::Udp(u), Kind::Data) => {
                let (r, res, t, size) = (u.replica, u.res, u.dst.tenant, u.size as u64);
                self.count_rx(r, res, t, now, size, 1);
            }
            (App::Rpc(c), Kind::Request) => {
                let meta = Meta {
                    kind: Kind::Response,
                    ..d.meta
                };
                self.net.vm_send(
                    now,
                    &c.server,
                    c.client.addr,
                    c.proto,
                    (c.port, 30001),
                    c.size,
                    false,
                    &meta,
                    false,
                );
            }
            (App::Rpc(c), Kind::Response) => {
                let latency = now - d.meta.sent_ns;
                if latency <= c.timeout {
                    let (r, res, t, size) = (c.replica, c.res, c.client.tenant, c.size as u64);
                    if let Some(h) = self.results[r as usize][res].latency.as_mut() {
                        let _ = h.record(latency.max(1));
                    }
                    self.count_rx(r, res, t, now, size, 1);
                }
            }
            (App::Tcp(t), Kind::Data) => {
                let (ack, newly) = t.receiver.on_data(d.meta.seq);
                let meta = Meta {
                    app: a,
                    kind: Kind::Ack,
                    ece: d.ce,
                    seq: ack,
                    sent_ns: d.meta.sent_ns,
                    sack: d.meta.seq,
                };
                let ports = (t.port, 40000 + (a % 20000) as u16);
                let (src, dst, mss) = (t.dst, t.src.addr, t.mss as u64);
                let (r, res, tenant) = (t.replica, t.res, t.dst.tenant);
                let ect = self.cc == crate::spec::CongestionControl::Dctcp;
                self.net
                    .vm_send(now, &src, dst, Proto::Tcp, ports, 0, ect, &meta, false);
                if newly > 0 {
                    self.count_rx(r, res, tenant, now, newly * mss, 0);
                }
            }
            (App::Tcp(t), Kind::Ack) => {
                let _ = d.len;
                if let Some(seq) =
                    t.sender
                        .on_ack(now, d.meta.seq, d.meta.sack, d.meta.ece, d.meta.sent_ns)
                {
                    let meta = Meta {
                        app: a,
                        kind: Kind::Data,
                        ece: false,
                        seq,
                        sent_ns: now,
                        sack: 0,
                    };
                    let ect = self.cc == crate::spec::CongestionControl::Dctcp;
                    let ports = (40000 + (a % 20000) as u16, t.port);
                    if self.net.vm_send(
                        now,
                        &t.src,
                        t.dst.addr,
                        Proto::Tcp,
                        ports,
                        t.mss,
                        ect,
                        &meta,
                        true,
                    ) {
                        t.sender.on_sent(now, seq);
                    }
                }
                if t.sender.done() && !t.finished {
                    t.finished = true;
                    if let Some(tag) = &t.tag {
                        self.flows
                            .push((tag.to_string(), t.bytes, (now - t.start) as f64 / 1e3));
                    } else if let Some(left) = self.transfer_flows_left.get_mut(&(t.replica, t.res))
                    {
                        // The lab times the last byte's arrival; its ACK is here half an RTT
                        // later.
                        *left -= 1;
                        if *left == 0 {
                            let r = &mut self.results[t.replica as usize][t.res];
                            r.completion_ns = Some(now - t.start);
                            r.active_ns = (now - t.start).max(1);
                        }
                    }
                    return;
                }
                self.tcp_send(a, now);
            }
            _ => {}
        }
    }
}

/// Receiver port of the simulator's own TCP flows and shuffles (no lab workload behind them).
const SIM_TCP_PORT: u16 = 5001;

impl TcpApp {
    #[allow(clippy::too_many_arguments)]
    fn new(
        src: VmLoc,
        dst: VmLoc,
        replica: u32,
        res: usize,
        cc: crate::spec::CongestionControl,
        segments: Option<u64>,
        min_rto: Nanos,
        dupack_threshold: u32,
        mss: usize,
        start: Nanos,
        stop: Nanos,
        tag: Option<Arc<str>>,
    ) -> TcpApp {
        TcpApp {
            src,
            dst,
            replica,
            res,
            sender: {
                let mut s = TcpSender::new(cc, segments, min_rto);
                s.dupack_threshold = dupack_threshold;
                s
            },
            receiver: TcpReceiver::default(),
            mss,
            start,
            stop,
            tag,
            bytes: segments.unwrap_or(0) * mss as u64,
            gen: 0,
            timer: None,
            finished: false,
            port: SIM_TCP_PORT,
        }
    }
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

fn build_fabric(spec: &Spec, hosts: u32, access_bps: u64, queue_bytes: u64) -> Fabric {
    let sim = &spec.sim;
    let delay = sim.link_delay_ns;
    let nic_bps = sim.nic_mbps * 1_000_000;
    let buffer = (sim.switch_buffer_kb > 0).then_some(sim.switch_buffer_kb * 1000);
    let mut f = Fabric {
        links: Vec::new(),
        switches: Vec::new(),
        host_up: Vec::new(),
        host_down: Vec::new(),
        leaf_up: Vec::new(),
        spine_down: Vec::new(),
        hosts_per_leaf: sim.hosts_per_leaf.max(1),
        ecmp: sim.ecmp,
        ecn_k: sim.ecn_threshold_kb.map(|k| k * 1000),
    };
    let link = |f: &mut Fabric, rate_bps, to, class, owner: Option<u32>| {
        f.links.push(Link {
            rate_bps,
            delay,
            to,
            class,
            owner,
            cap_bytes: if owner.is_some() {
                queue_bytes
            } else {
                u64::MAX
            },
            cap_frames: if owner.is_some() {
                usize::MAX
            } else {
                sim.nic_queue_frames
            },
            queue: VecDeque::new(),
            bytes: 0,
            busy: false,
            flight: VecDeque::new(),
        });
        (f.links.len() - 1) as u32
    };
    match sim.topology {
        TopologyKind::BigSwitch => {
            f.switches.push(Switch {
                kind: SwitchKind::Big,
                buffer,
                used: 0,
            });
            for h in 0..hosts {
                let up = link(&mut f, nic_bps, To::Switch(0), LinkClass::HostUp, None);
                let down = link(&mut f, access_bps, To::Host(h), LinkClass::Edge, Some(0));
                f.host_up.push(up);
                f.host_down.push(down);
            }
        }
        TopologyKind::LeafSpine => {
            let leaves = hosts.div_ceil(f.hosts_per_leaf);
            let spines = sim.spines;
            let core_bps = (f.hosts_per_leaf as f64 * access_bps as f64
                / (spines as f64 * sim.oversubscription)) as u64;
            for l in 0..leaves {
                f.switches.push(Switch {
                    kind: SwitchKind::Leaf(l),
                    buffer,
                    used: 0,
                });
            }
            for _ in 0..spines {
                f.switches.push(Switch {
                    kind: SwitchKind::Spine,
                    buffer,
                    used: 0,
                });
            }
            for h in 0..hosts {
                let l = h / f.hosts_per_leaf;
                let up = link(&mut f, nic_bps, To::Switch(l), LinkClass::HostUp, None);
                let down = link(&mut f, access_bps, To::Host(h), LinkClass::Edge, Some(l));
                f.host_up.push(up);
                f.host_down.push(down);
            }
            for l in 0..leaves {
                let ups = (0..spines)
                    .map(|s| {
                        link(
                            &mut f,
                            core_bps,
                            To::Switch(leaves + s),
                            LinkClass::Core,
                            Some(l),
                        )
                    })
                    .collect();
                f.leaf_up.push(ups);
            }
            for s in 0..spines {
                let downs = (0..leaves)
                    .map(|l| {
                        link(
                            &mut f,
                            core_bps,
                            To::Switch(l),
                            LinkClass::Core,
                            Some(leaves + s),
                        )
                    })
                    .collect();
                f.spine_down.push(downs);
            }
        }
    }
    f
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
        };
        let sent = self.vm_send(now, from, to, proto, ports, size, false, &meta, false);
        self.queue.push(now + interval, Event::App(app, 0));
        sent
    }

    /// Schedules host `h`'s poll at `now` or when its CPU is free, unless one is due sooner.
    fn wake_host(&mut self, h: u32, now: Nanos) {
        let host = &mut self.hosts[h as usize];
        let at = now.max(host.busy_until);
        if host.pending.is_none_or(|p| p > at) {
            host.gen += 1;
            host.pending = Some(at);
            self.queue.push(at, Event::HostPoll(h, host.gen));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn vm_send(
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

    fn host_poll(&mut self, h: u32, now: Nanos) {
        self.reserve_frames(POLL_RESERVE);
        let t = Instant::from_nanos(now);
        let host = &mut self.hosts[h as usize];
        host.pending = None;
        let batch = host.batch;
        let mut cost = POLL_OVERHEAD_NS;
        let n = host.nic_rx.len().min(batch);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.extend(host.nic_rx.drain(..n));
        // Header parsing and table lookups before queueing: cheap, a fraction of the base.
        cost += n as u64 * self.cost.base_ns / 4;
        host.engine
            .on_frames(t, UPLINK, &mut scratch, &mut self.pool);
        let mut more = !host.nic_rx.is_empty();
        for p in 1..host.ports.len() {
            if host.ports[p].ring.is_empty() {
                continue;
            }
            if !host.engine.rx_ready(t, p, batch) {
                continue;
            }
            let k = host.ports[p].ring.len().min(batch);
            scratch.extend(host.ports[p].ring.drain(..k));
            cost += k as u64 * self.cost.base_ns / 4;
            host.engine.on_frames(t, p, &mut scratch, &mut self.pool);
            more |= !host.ports[p].ring.is_empty();
            self.wake.append(&mut host.ports[p].waiting);
        }
        self.scratch = scratch;
        let mut work = CostWork {
            model: &self.cost,
            rng: &mut self.rng,
            total: 0,
        };
        let done = host.engine.poll(t, batch, &mut work, &mut self.pool);
        cost += work.total;
        let replica = host.replica;
        let mut out = std::mem::take(host.engine.tx_queue(UPLINK));
        for mut frame in out.drain(..) {
            cost += self.cost.cost(frame.len(), &mut self.rng);
            packet::copy_ecn_out(frame.data_mut());
            let local = packet::host_of_mac(&frame.data()[..6]);
            let dst = local * self.replicas + replica;
            let hash = packet::outer_flow_hash(frame.data());
            let up = self.fabric.host_up[h as usize];
            self.enqueue(up, Pkt { frame, dst, hash }, now);
        }
        let host = &mut self.hosts[h as usize];
        *host.engine.tx_queue(UPLINK) = out;
        for p in 1..host.ports.len() {
            for frame in host.engine.tx_queue(p).drain(..) {
                if let Some((meta, ce)) = packet::parse(frame.data()) {
                    self.deliveries.push(Delivery {
                        meta,
                        ce,
                        len: frame.len(),
                    });
                }
                self.cons.delivered += 1;
                self.pool.put(frame);
            }
        }
        host.busy_until = now + cost;
        let next = if more || done > 0 {
            Some(host.busy_until)
        } else {
            host.engine
                .poll_at()
                .map(|p| p.as_nanos().max(host.busy_until))
        };
        if let Some(at) = next {
            host.gen += 1;
            host.pending = Some(at);
            self.queue.push(at, Event::HostPoll(h, host.gen));
        }
    }

    /// Records every fabric queue's occupancy (host NIC queues included) in its class.
    fn sample_queues(&mut self) {
        for link in &self.fabric.links {
            let _ = self.queue_sampled[link.class as usize].record(link.bytes + 1);
        }
    }

    /// Puts a packet on link `l`'s queue (or drops it, counted, when the buffer is full).
    fn enqueue(&mut self, l: u32, mut pkt: Pkt, now: Nanos) {
        let link = &mut self.fabric.links[l as usize];
        let len = pkt.frame.len() as u64;
        let mut fits = link.bytes + len <= link.cap_bytes && link.queue.len() < link.cap_frames;
        if let Some(o) = link.owner {
            let sw = &self.fabric.switches[o as usize];
            if let Some(b) = sw.buffer {
                // Dynamic threshold (alpha = 1): a port may hold at most the free buffer.
                fits &= sw.used + len <= b && link.bytes + len <= b - sw.used;
            }
        }
        let class = link.class;
        if !fits {
            let key = match class {
                LinkClass::HostUp => {
                    self.cons.nic_tx_drops += 1;
                    self.pool.put(pkt.frame);
                    return;
                }
                LinkClass::Edge => "edge",
                LinkClass::Core => "core",
            };
            *self.cons.fabric_drops.entry(key.into()).or_default() += 1;
            self.pool.put(pkt.frame);
            return;
        }
        let _ = self.queue_hist[class as usize].record(link.bytes + 1);
        if let (Some(k), Some(_)) = (self.fabric.ecn_k, link.owner) {
            if link.bytes > k && packet::mark_ce(pkt.frame.data_mut()) {
                self.ecn_marks += 1;
            }
        }
        link.bytes += len;
        if let Some(o) = link.owner {
            self.fabric.switches[o as usize].used += len;
        }
        link.queue.push_back(pkt);
        if !link.busy {
            link.busy = true;
            let at = now + ser_ns(len as usize, link.rate_bps);
            self.queue.push(at, Event::LinkTxDone(l));
        }
    }

    fn link_tx_done(&mut self, l: u32, now: Nanos) {
        let link = &mut self.fabric.links[l as usize];
        let Some(pkt) = link.queue.pop_front() else {
            link.busy = false;
            return;
        };
        let len = pkt.frame.len() as u64;
        link.bytes -= len;
        if let Some(o) = link.owner {
            self.fabric.switches[o as usize].used -= len;
        }
        link.flight.push_back((now + link.delay, pkt));
        self.queue.push(now + link.delay, Event::LinkArrive(l));
        match link.queue.front() {
            Some(next) => {
                let at = now + ser_ns(next.frame.len(), link.rate_bps);
                self.queue.push(at, Event::LinkTxDone(l));
            }
            None => link.busy = false,
        }
    }

    fn link_arrive(&mut self, l: u32, now: Nanos) {
        let link = &mut self.fabric.links[l as usize];
        let Some((_, mut pkt)) = link.flight.pop_front() else {
            return;
        };
        match link.to {
            To::Host(h) => {
                let host = &mut self.hosts[h as usize];
                if host.nic_rx.len() >= NIC_RX_RING {
                    self.cons.nic_rx_drops += 1;
                    self.pool.put(pkt.frame);
                    return;
                }
                packet::copy_ce_in(pkt.frame.data_mut());
                host.nic_rx.push_back(pkt.frame);
                self.wake_host(h, now);
            }
            To::Switch(s) => {
                let next = self.route(s, &pkt);
                pkt.hash = pkt.hash.rotate_left(7);
                self.enqueue(next, pkt, now);
            }
        }
    }

    fn route(&mut self, s: u32, pkt: &Pkt) -> u32 {
        let f = &self.fabric;
        let dst_leaf = pkt.dst / f.hosts_per_leaf;
        match f.switches[s as usize].kind {
            SwitchKind::Big => f.host_down[pkt.dst as usize],
            SwitchKind::Leaf(l) if l == dst_leaf => f.host_down[pkt.dst as usize],
            SwitchKind::Leaf(l) => {
                let ups = &f.leaf_up[l as usize];
                let i = match f.ecmp {
                    Ecmp::PerFlow => pkt.hash as usize % ups.len(),
                    Ecmp::PerPacket => self.rng.gen_range(0..ups.len()),
                };
                ups[i]
            }
            SwitchKind::Spine => {
                let spine = s as usize - f.leaf_up.len();
                f.spine_down[spine][dst_leaf as usize]
            }
        }
    }
}
