//! The leaf-spine case of `picnic sim ns3` (issue 34): `[[sim.flows]]` traffic (Poisson
//! arrivals, sizes from a CDF) over a leaf-spine fabric. The flows are drawn here with the
//! simulator's own streams (`workload::Arrivals`, the run's seed), so both simulators carry
//! the same flows; the program reports each flow's completion and the payload delivered
//! within the arrival window. docs/sim.md "ns-3" has the mapping and the results.

use std::fmt::Write as _;

use anyhow::{bail, Result};
use picnic_scenario::WorkloadKind;

use super::MSS;
use crate::spec::{CongestionControl, Ecmp, Recovery, Spec, TopologyKind};
use crate::workload::{Arrivals, FlowSizes};

/// The simulator's data frame on the wire: the segment, inner Ethernet/IPv4/TCP (54) and
/// Geneve's outer headers (50).
pub const SIM_DATA_FRAME: u64 = MSS as u64 + 104;
/// The simulator's ACK frame: headers and its 32 bytes of metadata.
pub const SIM_ACK_FRAME: u64 = 136;
/// ns-3's data packet on the wire: the segment, IPv4 20, TCP 32 (timestamps), PPP 2.
pub const NS3_DATA_FRAME: u64 = MSS as u64 + 54;

/// One flow of the case.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricFlow {
    /// Sender and receiver hosts (indices in the scenario's `hosts`).
    pub src: usize,
    /// See `src`.
    pub dst: usize,
    /// Start, ns.
    pub start_ns: u64,
    /// Whole segments' bytes, as the simulator sends them.
    pub bytes: u64,
    /// Completion alone on the fabric, ns: the first segment's path, the rest at the
    /// slowest hop, the last ACK's path back (frames of the simulator's sizes).
    pub ideal_ns: u64,
    /// A `[[sim.flows]]` flow (reported), not a lab `transfer`'s connection.
    pub reported: bool,
}

/// The leaf-spine case a scenario describes.
#[derive(Debug, Clone, PartialEq)]
pub struct Fabric {
    /// Hosts, and hosts per leaf.
    pub hosts: usize,
    /// See `hosts`.
    pub hosts_per_leaf: usize,
    /// Spines.
    pub spines: usize,
    /// Leaf-to-host, host NIC and leaf-spine rates, b/s.
    pub access_bps: u64,
    /// See `access_bps`.
    pub nic_bps: u64,
    /// See `access_bps`.
    pub core_bps: u64,
    /// Every switch port's bound, bytes; a host NIC's, frames.
    pub queue_bytes: u64,
    /// See `queue_bytes`.
    pub nic_queue_frames: usize,
    /// Per-link delay, ns.
    pub delay_ns: u64,
    /// Duplicate ACKs for fast retransmit, minimum RTO (us), DCTCP's marking threshold (KB).
    pub dupack_threshold: u32,
    /// See `dupack_threshold`.
    pub min_rto_us: u64,
    /// See `dupack_threshold`.
    pub dctcp_threshold_kb: Option<u64>,
    /// Fast recovery's sending rule.
    pub recovery: Recovery,
    /// Arrival window (the throughput's), ms, and the run's end (the simulator's grace
    /// included), ms.
    pub window_ms: (u64, u64),
    /// See `window_ms`.
    pub end_ms: u64,
    /// The flows, by start.
    pub flows: Vec<FabricFlow>,
}

/// The simulator's grace after the scenario's end (`world::GRACE_NS`), ms.
const GRACE_MS: u64 = 200;

fn ser_ns(bytes: u64, bps: u64) -> u64 {
    (bytes * 8 * 1_000_000_000).div_ceil(bps)
}

impl Fabric {
    /// The hop rates from `src` to `dst`, in order.
    pub fn path(&self, src: usize, dst: usize) -> Vec<u64> {
        if src / self.hosts_per_leaf == dst / self.hosts_per_leaf {
            vec![self.nic_bps, self.access_bps]
        } else {
            vec![self.nic_bps, self.core_bps, self.core_bps, self.access_bps]
        }
    }

    /// A flow's completion alone on the fabric, ns.
    pub fn ideal_ns(&self, src: usize, dst: usize, bytes: u64) -> u64 {
        let segs = bytes.div_ceil(MSS as u64);
        let fwd = self.path(src, dst);
        let back = self.path(dst, src);
        let slowest = fwd.iter().copied().min().unwrap_or(1);
        let first: u64 = fwd
            .iter()
            .map(|&r| self.delay_ns + ser_ns(SIM_DATA_FRAME, r))
            .sum();
        let ack: u64 = back
            .iter()
            .map(|&r| self.delay_ns + ser_ns(SIM_ACK_FRAME, r))
            .sum();
        first + (segs - 1) * ser_ns(SIM_DATA_FRAME, slowest) + ack
    }

    /// Reads the case from a spec with seed `seed`, refusing what ns-3 cannot carry alike.
    pub fn from_spec(spec: &Spec, seed: u64) -> Result<Fabric> {
        let s = &spec.scenario;
        let sim = &spec.sim;
        if sim.replicas != 1 || sim.topology != TopologyKind::LeafSpine {
            bail!("the ns-3 fabric case is one leaf-spine fabric without replicas (sim.replicas = 1, topology = \"leaf_spine\")");
        }
        if sim.ecmp != Ecmp::PerPacket {
            bail!("ns-3's global routing spreads over equal-cost paths per packet only: set sim.ecmp = \"per_packet\"");
        }
        if sim.switch_buffer_kb != 0 {
            bail!("ns-3 has no shared switch buffer with a dynamic threshold: set sim.switch_buffer_kb = 0 (every port its own bound)");
        }
        if !sim.shuffles.is_empty() {
            bail!("the ns-3 fabric case covers [[sim.flows]] and `transfer` workloads, not [[sim.shuffles]]");
        }
        let access_bps = s.access_link_mbps * 1_000_000;
        let hpl = sim.hosts_per_leaf as usize;
        let mut f = Fabric {
            hosts: s.hosts.len(),
            hosts_per_leaf: hpl,
            spines: sim.spines as usize,
            access_bps,
            nic_bps: sim.nic_mbps * 1_000_000,
            core_bps: (hpl as f64 * access_bps as f64 / (sim.spines as f64 * sim.oversubscription))
                as u64,
            queue_bytes: s.access_queue_bytes().max(3000),
            nic_queue_frames: sim.nic_queue_frames,
            delay_ns: sim.link_delay_ns,
            dupack_threshold: sim.dupack_threshold,
            min_rto_us: sim.min_rto_us,
            recovery: sim.recovery,
            dctcp_threshold_kb: match sim.cc {
                CongestionControl::Dctcp => Some(sim.ecn_threshold_kb.ok_or_else(|| {
                    anyhow::anyhow!(
                        "cc = \"dctcp\" needs sim.ecn_threshold_kb for ns-3's RED marking"
                    )
                })?),
                CongestionControl::NewReno => None,
            },
            window_ms: (u64::MAX, 0),
            end_ms: s.duration_ms + GRACE_MS,
            flows: Vec::new(),
        };
        let host_of = |vm: &str| -> Result<usize> {
            let v = s.tenants.iter().flat_map(|t| &t.vms).find(|v| v.name == vm);
            let h = v.ok_or_else(|| anyhow::anyhow!("no VM {vm:?}"))?;
            Ok(s.hosts.iter().position(|x| *x == h.host).unwrap_or(0))
        };
        let mut flows = Vec::new();
        for w in &s.workloads {
            if w.kind != WorkloadKind::Transfer {
                bail!("workload `{}`: the ns-3 fabric case takes `transfer` workloads beside [[sim.flows]], not {:?}", w.name, w.kind);
            }
            let bytes = w.bytes.unwrap_or(0).div_ceil(MSS as u64).max(1) * MSS as u64;
            let (src, dst) = (host_of(&w.from)?, host_of(&w.to)?);
            for _ in 0..w.flows.unwrap_or(1) {
                flows.push((src, dst, w.start_ms * 1_000_000, bytes, false));
            }
        }
        for (i, t) in sim.flows.iter().enumerate() {
            let tenant = s
                .tenants
                .iter()
                .find(|x| x.name == t.tenant)
                .expect("validated");
            let vms: Vec<usize> = tenant
                .vms
                .iter()
                .map(|v| host_of(&v.name))
                .collect::<Result<_>>()?;
            let sizes = FlowSizes::load(&t.cdf)?;
            // The simulator's arrival rate (world/apps): mean size over load x access rate.
            let mean_gap_ns = sizes.mean() * 8.0 * 1e9 / (t.load * access_bps as f64);
            let (start, stop) = (t.start_ms, t.stop_ms.unwrap_or(s.duration_ms));
            f.window_ms = (f.window_ms.0.min(start), f.window_ms.1.max(stop));
            for src in 0..vms.len() {
                let mut arrivals =
                    Arrivals::new(seed, i, 0, src, vms.len(), start * 1_000_000, mean_gap_ns);
                loop {
                    let a = arrivals.next(&sizes);
                    if a.at >= stop * 1_000_000 {
                        break;
                    }
                    let bytes = a.bytes.div_ceil(MSS as u64) * MSS as u64;
                    flows.push((vms[src], vms[a.dst], a.at, bytes, true));
                }
            }
        }
        if !flows.iter().any(|x| x.4) {
            bail!("the ns-3 fabric case needs [[sim.flows]] traffic");
        }
        flows.sort_by_key(|x| (x.2, x.0));
        f.flows = flows
            .into_iter()
            .map(|(src, dst, start_ns, bytes, reported)| FabricFlow {
                src,
                dst,
                start_ns,
                bytes,
                ideal_ns: f.ideal_ns(src, dst, bytes),
                reported,
            })
            .collect();
        Ok(f)
    }
}

/// The ns-3 program of the fabric case of `spec`, flows drawn with `seed`.
pub fn generate(spec: &Spec, seed: u64) -> Result<String> {
    let f = Fabric::from_spec(spec, seed)?;
    let mut flows = String::new();
    for x in &f.flows {
        let _ = writeln!(
            flows,
            "    ({}, {}, {}, {}, {}, {}),",
            x.src,
            x.dst,
            x.start_ns,
            x.bytes,
            x.ideal_ns,
            if x.reported { "True" } else { "False" }
        );
    }
    let dctcp = f
        .dctcp_threshold_kb
        .map_or("None".into(), |k| k.to_string());
    Ok(format!(
        r#"#!/usr/bin/env python3
"""ns-3 program written by `picnic sim ns3` from scenario {name:?} (seed {seed}).

Leaf-spine: {hosts} hosts, {hpl} per leaf, {spines} spines; {n} TCP flows drawn with the
simulator's streams. Prints one JSON object: per flow (src, dst, start ns, bytes, ideal ns,
fct ns or null), the payload delivered within the arrival window, timeouts, retransmissions.
Run with PyPI's ns3 package: python3 THIS.py
"""
import json
import sys

from ns import ns
import cppyy

cppyy.cppdef("""
namespace picnic_fabric {{
std::vector<int64_t> first_ns, done_ns;
std::vector<uint32_t> target;
uint64_t delivered = 0, at_start = 0, at_stop = 0, timeouts = 0, retransmissions = 0;
void OnTx(uint32_t i, ns3::Ptr<const ns3::Packet> p, const ns3::TcpHeader&, ns3::Ptr<const ns3::TcpSocketBase>) {{
  if (p->GetSize() > 0 && first_ns[i] < 0) first_ns[i] = ns3::Simulator::Now().GetNanoSeconds();
}}
// The ACK of the last byte at the sender: the simulator's completion.
void OnAck(uint32_t i, ns3::SequenceNumber32, ns3::SequenceNumber32 ack) {{
  if (ack.GetValue() >= target[i] + 1 && done_ns[i] < 0) done_ns[i] = ns3::Simulator::Now().GetNanoSeconds();
}}
void OnCongState(ns3::TcpSocketState::TcpCongState_t from, ns3::TcpSocketState::TcpCongState_t to) {{
  if (to == ns3::TcpSocketState::CA_LOSS && from != ns3::TcpSocketState::CA_LOSS) timeouts++;
}}
void OnRetx(ns3::Ptr<const ns3::Packet>, const ns3::TcpHeader&, const ns3::Address&,
            const ns3::Address&, ns3::Ptr<const ns3::TcpSocketBase>) {{ retransmissions++; }}
// A sender: connects at its start and writes its bytes as the send buffer frees, never
// closing (ns-3 3.44's BulkSend closes after its last byte, and a SACK arriving in
// FIN_WAIT crashed TcpTxBuffer::Update on this case).
std::vector<ns3::Ptr<ns3::Socket>> sockets;
std::vector<uint32_t> left;
void Fill(uint32_t i, ns3::Ptr<ns3::Socket> s) {{
  while (left[i] > 0) {{
    uint32_t n = std::min(left[i], s->GetTxAvailable());
    if (n == 0 || s->Send(ns3::Create<ns3::Packet>(n)) <= 0) break;
    left[i] -= n;
  }}
}}
void OnConnected(uint32_t i, ns3::Ptr<ns3::Socket> s) {{ Fill(i, s); }}
void OnSendRoom(uint32_t i, ns3::Ptr<ns3::Socket> s, uint32_t) {{ Fill(i, s); }}
void StartNow(ns3::Ptr<ns3::Node> node, ns3::Ipv4Address to, uint16_t port, uint32_t i) {{
  ns3::Ptr<ns3::Socket> s = ns3::Socket::CreateSocket(node, ns3::TcpSocketFactory::GetTypeId());
  s->TraceConnectWithoutContext("Tx", ns3::MakeBoundCallback(&OnTx, i));
  s->TraceConnectWithoutContext("HighestRxAck", ns3::MakeBoundCallback(&OnAck, i));
  s->TraceConnectWithoutContext("CongState", ns3::MakeCallback(&OnCongState));
  s->TraceConnectWithoutContext("Retransmission", ns3::MakeCallback(&OnRetx));
  s->Bind();
  s->SetConnectCallback(ns3::MakeBoundCallback(&OnConnected, i),
                        ns3::MakeNullCallback<void, ns3::Ptr<ns3::Socket>>());
  s->SetSendCallback(ns3::MakeBoundCallback(&OnSendRoom, i));
  s->Connect(ns3::InetSocketAddress(to, port));
  sockets[i] = s;
}}
void Flow(ns3::Ptr<ns3::Node> node, ns3::Ipv4Address to, uint16_t port, uint32_t bytes, ns3::Time at) {{
  uint32_t i = target.size();
  target.push_back(bytes);
  left.push_back(bytes);
  first_ns.push_back(-1);
  done_ns.push_back(-1);
  sockets.push_back(nullptr);
  ns3::Simulator::Schedule(at, &StartNow, node, to, port, i);
}}
void OnRx(ns3::Ptr<const ns3::Packet> p, const ns3::Address&) {{ delivered += p->GetSize(); }}
void WatchSink(ns3::Ptr<ns3::Application> sink) {{
  sink->TraceConnectWithoutContext("Rx", ns3::MakeCallback(&OnRx));
}}
void Mark(bool stop) {{ if (stop) at_stop = delivered; else at_start = delivered; }}
void MarkAt(ns3::Time start, ns3::Time stop) {{
  ns3::Simulator::Schedule(start, &Mark, false);
  ns3::Simulator::Schedule(stop, &Mark, true);
}}
}}
""")

HOSTS = {hosts}
HOSTS_PER_LEAF = {hpl}
SPINES = {spines}
ACCESS_BPS = {access}
NIC_BPS = {nic}
CORE_BPS = {core}
QUEUE_BYTES = {queue}
NIC_QUEUE_FRAMES = {nicq}
DELAY_NS = {delay}
DUPACK = {dupack}
MIN_RTO_US = {rto}
RECOVERY = "{recovery}"
DCTCP_THRESHOLD_KB = {dctcp}
WINDOW_MS = {window:?}
END_MS = {end}
SEGMENT = {mss}
# ns-3 carries no Geneve: its links run slower by its data frame over the simulator's
# ({ns3_frame} / {sim_frame} B), so a full segment takes as long on either side; its
# queues hold as many full segments (IPv4 bytes, less the device's two packets).
SCALE = {ns3_frame} / {sim_frame}
# (src host, dst host, start ns, bytes, ideal ns, reported) per flow
FLOWS = [
{flows}]


def rate(bps):
    return ns.StringValue("%dbps" % int(bps * SCALE))


def main():
    ns.RngSeedManager.SetSeed(1)
    ns.RngSeedManager.SetRun({seed})
    cd = ns.Config.SetDefault
    tcp = "ns3::TcpDctcp" if DCTCP_THRESHOLD_KB is not None else "ns3::TcpNewReno"
    cd("ns3::TcpL4Protocol::SocketType", ns.TypeIdValue(ns.TypeId.LookupByName(tcp)))
    cd("ns3::TcpSocket::SegmentSize", ns.UintegerValue(SEGMENT))
    cd("ns3::TcpSocket::InitialCwnd", ns.UintegerValue(10))
    cd("ns3::TcpSocket::SndBufSize", ns.UintegerValue(1 << 26))
    cd("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(1 << 26))
    cd("ns3::TcpSocket::DelAckCount", ns.UintegerValue(1))
    # The simulator has no handshake: a lost SYN waits no longer than a lost segment.
    cd("ns3::TcpSocket::ConnTimeout", ns.TimeValue(ns.MicroSeconds(MIN_RTO_US)))
    cd("ns3::TcpSocketBase::Sack", ns.BooleanValue(True))
    cd("ns3::TcpSocketBase::ReTxThreshold", ns.UintegerValue(DUPACK))
    cd("ns3::TcpSocketBase::MinRto", ns.TimeValue(ns.MicroSeconds(MIN_RTO_US)))
    cd("ns3::TcpL4Protocol::RecoveryType", ns.TypeIdValue(ns.TypeId.LookupByName(RECOVERY)))
    cd("ns3::Ipv4GlobalRouting::RandomEcmpRouting", ns.BooleanValue(True))
    if DCTCP_THRESHOLD_KB is not None:
        cd("ns3::TcpSocketBase::UseEcn", ns.StringValue("On"))

    leaves = (HOSTS + HOSTS_PER_LEAF - 1) // HOSTS_PER_LEAF
    hosts = ns.NodeContainer()
    hosts.Create(HOSTS)
    switches = ns.NodeContainer()
    switches.Create(leaves + SPINES)
    ns.InternetStackHelper().InstallAll()
    p2p = ns.PointToPointHelper()
    p2p.SetChannelAttribute("Delay", ns.TimeValue(ns.NanoSeconds(DELAY_NS)))
    p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", ns.StringValue("1p"))
    addresses = ns.Ipv4AddressHelper()
    port_bytes = max(1, QUEUE_BYTES * (SEGMENT + 52) // (SEGMENT + 104) - 2 * (SEGMENT + 52))
    nets = [0]

    def link(a, b, rate_ab, rate_ba, queue_a, queue_b):
        pair = ns.NodeContainer()
        pair.Add(a)
        pair.Add(b)
        devs = p2p.Install(pair)
        devs.Get(0).SetAttribute("DataRate", rate(rate_ab))
        devs.Get(1).SetAttribute("DataRate", rate(rate_ba))
        for i, q in ((0, queue_a), (1, queue_b)):
            tch = ns.TrafficControlHelper()
            if q.endswith("B") and DCTCP_THRESHOLD_KB is not None:
                k = max(1, DCTCP_THRESHOLD_KB * 1000 // (SEGMENT + 52))
                tch.SetRootQueueDisc("ns3::RedQueueDisc", "MaxSize", ns.StringValue(q),
                                     "UseEcn", ns.BooleanValue(True),
                                     "UseHardDrop", ns.BooleanValue(False),
                                     "MeanPktSize", ns.UintegerValue(SEGMENT + 52),
                                     "QW", ns.DoubleValue(1.0),
                                     "MinTh", ns.DoubleValue(k), "MaxTh", ns.DoubleValue(k))
            else:
                tch.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize", ns.StringValue(q))
            one = ns.NetDeviceContainer()
            one.Add(devs.Get(i))
            tch.Install(one)
        n = nets[0]
        nets[0] += 1
        addresses.SetBase(ns.Ipv4Address("10.%d.%d.0" % (n // 250, n % 250 + 1)),
                          ns.Ipv4Mask("255.255.255.0"))
        return addresses.Assign(devs)

    host_addr = []
    nic_q = "%dp" % max(1, NIC_QUEUE_FRAMES - 2)
    port_q = "%dB" % port_bytes
    for h in range(HOSTS):
        leaf = switches.Get(h // HOSTS_PER_LEAF)
        ifaces = link(hosts.Get(h), leaf, NIC_BPS, ACCESS_BPS, nic_q, port_q)
        host_addr.append(ifaces.GetAddress(0))
    for l in range(leaves):
        for s in range(SPINES):
            link(switches.Get(l), switches.Get(leaves + s), CORE_BPS, CORE_BPS, port_q, port_q)
    ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()

    probe = cppyy.gbl.picnic_fabric
    for i, (src, dst, start_ns, size, ideal_ns, reported) in enumerate(FLOWS):
        port = 10000 + i % 50000
        any_addr = ns.InetSocketAddress(ns.Ipv4Address.GetAny(), port)
        sink = ns.PacketSinkHelper("ns3::TcpSocketFactory", any_addr.ConvertTo()).Install(hosts.Get(dst))
        sink.Start(ns.NanoSeconds(0))
        probe.WatchSink(sink.Get(0))
        probe.Flow(hosts.Get(src), host_addr[dst], port, size, ns.NanoSeconds(start_ns))
    probe.MarkAt(ns.MilliSeconds(WINDOW_MS[0]), ns.MilliSeconds(WINDOW_MS[1]))
    ns.Simulator.Stop(ns.MilliSeconds(END_MS))
    ns.Simulator.Run()
    out = []
    for i, (src, dst, start_ns, size, ideal_ns, reported) in enumerate(FLOWS):
        if not reported:
            continue
        first, done = int(probe.first_ns[i]), int(probe.done_ns[i])
        out.append([src, dst, start_ns, size, ideal_ns, done - first if done >= 0 and first >= 0 else None])
    window_s = (WINDOW_MS[1] - WINDOW_MS[0]) / 1000.0
    delivered = int(probe.at_stop) - int(probe.at_start)
    ns.Simulator.Destroy()
    json.dump({{"simulator": "ns-3", "window_ms": WINDOW_MS,
               "aggregate_mbps": delivered * 8 / window_s / 1e6,
               "timeouts": int(probe.timeouts), "retransmissions": int(probe.retransmissions),
               "flows": out}}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
"#,
        name = spec.scenario.name,
        seed = seed,
        hosts = f.hosts,
        hpl = f.hosts_per_leaf,
        spines = f.spines,
        n = f.flows.len(),
        access = f.access_bps,
        nic = f.nic_bps,
        core = f.core_bps,
        queue = f.queue_bytes,
        nicq = f.nic_queue_frames,
        delay = f.delay_ns,
        dupack = f.dupack_threshold,
        rto = f.min_rto_us,
        recovery = f.recovery.ns3_type(),
        dctcp = dctcp,
        window = f.window_ms,
        end = f.end_ms,
        mss = MSS,
        ns3_frame = NS3_DATA_FRAME,
        sim_frame = SIM_DATA_FRAME,
        flows = flows,
    ))
}

#[cfg(test)]
#[path = "fabric_tests.rs"]
mod tests;
