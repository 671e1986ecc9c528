//! `picnic sim ns3 SCENARIO.toml`: writes an ns-3 program (Python, for PyPI's `ns3`
//! package: `from ns import ns`) from a scenario file, so the same work runs in ns-3 with
//! nothing tuned by hand for either side (issue 34). Two cases: here the single bottleneck,
//! `tcp_bulk` and `transfer` (incast) workloads from any hosts to VMs on one receiver host,
//! whose access link is the bottleneck; and a scenario with `[[sim.flows]]`, the leaf-spine
//! fabric (`ns3/fabric.rs`). Everything else is refused with the reason. docs/sim.md "ns-3"
//! has the status.
//!
//! The mapping: one ns-3 node per scenario host and one for the fabric switch; each sender
//! host's link to the switch at `sim.nic_mbps`, the switch's port toward the receiver at
//! `access_link_mbps` with a FIFO of `access_queue_ms` of bytes (a RED queue marking ECN at
//! `sim.ecn_threshold_kb` with `cc = "dctcp"`), `sim.link_delay_ns` per link; TCP NewReno or
//! DCTCP, segment size the simulator's MSS (1390 B: 1500 less Geneve and IPv4/TCP), initial
//! window 10, minimum RTO `sim.min_rto_us`, buffers large enough not to limit; one
//! BulkSend/PacketSink pair per connection, started and stopped as the workload. What ns-3
//! does not carry: the Geneve outer headers (ns-3's packets are 70 B shorter on the wire)
//! and everything of the switch (the comparison is with isolation off, `picnic-off`).
//! The program prints one JSON object: per workload its connections' goodput over its
//! active period (the lab's and the simulator's definition) and a transfer's completion
//! (its last connection's last byte at the receiver) and per-connection FCTs, the aggregate, Jain's index, the
//! senders' retransmission timeouts and retransmitted segments, and the bottleneck queue's
//! occupancy sampled every 1 ms (quantile, KB).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Result};
use picnic_scenario::WorkloadKind;

use crate::spec::{CongestionControl, Recovery, Spec, TopologyKind};

/// The simulator's TCP payload per segment: 1500 less 70 B of Geneve and 40 B of IPv4/TCP.
pub const MSS: u32 = 1390;

/// Arguments of `picnic sim ns3`.
#[derive(Debug, Clone, clap::Args)]
pub struct Ns3Args {
    /// Scenario file (single bottleneck: tcp_bulk workloads into one host; or a leaf-spine
    /// fabric with [[sim.flows]]).
    pub scenario: PathBuf,
    /// Where to write the program (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// ns-3's RngRun, and the seed the fabric case's flows are drawn with (the simulator's
    /// `--seed`).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One TCP connection of the program.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// Workload name.
    pub workload: String,
    /// Bytes it sends: a `transfer`'s whole segments, as the simulator sends them (0: a
    /// `tcp_bulk`, until its stop).
    pub bytes: u64,
    /// Index of the sender host in the scenario's `hosts`.
    pub sender: usize,
    /// Port on the receiver.
    pub port: u16,
    /// Start and stop, ms.
    pub start_ms: u64,
    /// See `start_ms`.
    pub stop_ms: u64,
}

/// The single-bottleneck case a scenario describes, or why it is not one.
#[derive(Debug, Clone, PartialEq)]
pub struct Bottleneck {
    /// Receiver host's name.
    pub receiver: String,
    /// Every host's name (the receiver's index is `receiver_index`).
    pub hosts: Vec<String>,
    /// Index of the receiver in `hosts`.
    pub receiver_index: usize,
    /// Bottleneck rate, Mb/s.
    pub access_mbps: u64,
    /// Bottleneck FIFO, bytes.
    pub queue_bytes: u64,
    /// Sender links, Mb/s.
    pub nic_mbps: u64,
    /// Per-link delay, ns.
    pub link_delay_ns: u64,
    /// DCTCP with an ECN threshold (KB) instead of NewReno.
    pub dctcp_threshold_kb: Option<u64>,
    /// Minimum RTO, us.
    pub min_rto_us: u64,
    /// Fast recovery's sending rule.
    pub recovery: Recovery,
    /// Run length, ms.
    pub duration_ms: u64,
    /// Connections.
    pub flows: Vec<Flow>,
}

impl Bottleneck {
    /// Reads the case from a spec, refusing what the generator does not cover.
    pub fn from_spec(spec: &Spec) -> Result<Bottleneck> {
        let s = &spec.scenario;
        let sim = &spec.sim;
        if sim.replicas != 1 || sim.topology != TopologyKind::BigSwitch {
            bail!("the ns-3 generator covers one fabric switch without replicas (sim.replicas = 1, topology = \"big_switch\")");
        }
        if !sim.flows.is_empty() || !sim.shuffles.is_empty() {
            bail!("the ns-3 generator covers `tcp_bulk` workloads only, not [[sim.flows]] or [[sim.shuffles]]");
        }
        let vm_host = |vm: &str| -> Result<String> {
            s.tenants
                .iter()
                .flat_map(|t| &t.vms)
                .find(|v| v.name == vm)
                .map(|v| v.host.clone())
                .ok_or_else(|| anyhow::anyhow!("no VM {vm:?}"))
        };
        let mut receivers = BTreeSet::new();
        let mut flows = Vec::new();
        let mut port = picnic_scenario::BASE_PORT;
        for w in &s.workloads {
            let bytes = match w.kind {
                WorkloadKind::TcpBulk => 0,
                WorkloadKind::Transfer => {
                    w.bytes.unwrap_or(0).div_ceil(MSS as u64).max(1) * MSS as u64
                }
                _ => bail!(
                    "workload `{}`: the ns-3 generator covers `tcp_bulk` and `transfer` only (one bottleneck, incast), not {:?}",
                    w.name,
                    w.kind
                ),
            };
            let from = vm_host(&w.from)?;
            let to = vm_host(&w.to)?;
            if from == to {
                bail!(
                    "workload `{}`: sender and receiver on one host never cross the bottleneck",
                    w.name
                );
            }
            receivers.insert(to);
            let sender = s.hosts.iter().position(|h| *h == from).unwrap_or(0);
            for _ in 0..w.flows.unwrap_or(1) {
                flows.push(Flow {
                    workload: w.name.clone(),
                    bytes,
                    sender,
                    port,
                    start_ms: w.start_ms,
                    stop_ms: w.stop_ms(s),
                });
                port += 1;
            }
        }
        if receivers.len() != 1 {
            bail!(
                "the single-bottleneck case needs every workload into one host; these go to {receivers:?}"
            );
        }
        let receiver = receivers.into_iter().next().unwrap_or_default();
        let receiver_index = s.hosts.iter().position(|h| *h == receiver).unwrap_or(0);
        let dctcp_threshold_kb = match sim.cc {
            CongestionControl::Dctcp => Some(sim.ecn_threshold_kb.ok_or_else(|| {
                anyhow::anyhow!("cc = \"dctcp\" needs sim.ecn_threshold_kb for ns-3's RED marking")
            })?),
            CongestionControl::NewReno => None,
        };
        Ok(Bottleneck {
            receiver,
            hosts: s.hosts.clone(),
            receiver_index,
            access_mbps: s.access_link_mbps,
            queue_bytes: s.access_link_mbps * s.access_queue_ms * 1000 / 8,
            nic_mbps: sim.nic_mbps,
            link_delay_ns: sim.link_delay_ns,
            dctcp_threshold_kb,
            min_rto_us: sim.min_rto_us,
            recovery: sim.recovery,
            duration_ms: s.duration_ms,
            flows,
        })
    }
}

/// The ns-3 program for `spec`, with ns-3's `RngRun` = `seed`.
pub fn generate(spec: &Spec, seed: u64) -> Result<String> {
    if !spec.sim.flows.is_empty() {
        return fabric::generate(spec, seed);
    }
    let b = Bottleneck::from_spec(spec)?;
    let mut p = String::new();
    let _ = writeln!(
        p,
        "#!/usr/bin/env python3\n\"\"\"ns-3 program written by `picnic sim ns3` from scenario {:?}.\n\nSingle bottleneck: {} TCP connections into host {} over a {} Mb/s link with a\n{} B FIFO{}. Prints one JSON object (per-workload goodput and transfer completion,
aggregate, Jain's index, timeouts, retransmissions, queue).\nRun with PyPI's ns3 package: python3 THIS.py\n\"\"\"",
        spec.scenario.name,
        b.flows.len(),
        b.receiver,
        b.access_mbps,
        b.queue_bytes,
        match b.dctcp_threshold_kb {
            Some(k) => format!(" (RED marking ECN from {k} KB, DCTCP)"),
            None => " (NewReno)".into(),
        }
    );
    let flows: Vec<String> = b
        .flows
        .iter()
        .map(|f| {
            format!(
                "    ({:?}, {}, {}, {}, {}, {}),",
                f.workload, f.sender, f.port, f.start_ms, f.stop_ms, f.bytes
            )
        })
        .collect();
    let _ = write!(
        p,
        r#"
import json
import sys

from ns import ns
import cppyy

# The bottleneck queue's bytes sampled every 1 ms (EyeQ 5.4's measure, the simulator's
# `queue_sampled_kb`), in C++: ns-3 events cannot call Python.
cppyy.cppdef("""
namespace picnic_probe {{
std::vector<uint32_t> samples;
void Sample(ns3::Ptr<ns3::QueueDisc> q, ns3::Time every, ns3::Time until) {{
  samples.push_back(q->GetNBytes());
  if (ns3::Simulator::Now() + every <= until)
    ns3::Simulator::Schedule(every, &Sample, q, every, until);
}}
// Retransmission timeouts (entries into CA_LOSS) and retransmitted segments of the senders.
uint64_t timeouts = 0, retransmissions = 0;
void OnCongState(ns3::TcpSocketState::TcpCongState_t from, ns3::TcpSocketState::TcpCongState_t to) {{
  if (to == ns3::TcpSocketState::CA_LOSS && from != ns3::TcpSocketState::CA_LOSS) timeouts++;
}}
void OnRetransmission(ns3::Ptr<const ns3::Packet>, const ns3::TcpHeader&, const ns3::Address&,
                      const ns3::Address&, ns3::Ptr<const ns3::TcpSocketBase>) {{
  retransmissions++;
}}
void WatchNow(ns3::Ptr<ns3::Application> app) {{
  ns3::Ptr<ns3::Socket> s = ns3::DynamicCast<ns3::BulkSendApplication>(app)->GetSocket();
  s->TraceConnectWithoutContext("CongState", ns3::MakeCallback(&OnCongState));
  s->TraceConnectWithoutContext("Retransmission", ns3::MakeCallback(&OnRetransmission));
}}
// A BulkSend's socket exists once the application has started.
void Watch(ns3::Ptr<ns3::Application> app, ns3::Time at) {{
  ns3::Simulator::Schedule(at, &WatchNow, app);
}}
// When each sink has received its connection's bytes (a transfer's completion), ns.
std::vector<uint64_t> received, target;
std::vector<int64_t> done_ns;
void OnRx(uint32_t i, ns3::Ptr<const ns3::Packet> p, const ns3::Address&) {{
  received[i] += p->GetSize();
  if (target[i] > 0 && received[i] >= target[i] && done_ns[i] < 0)
    done_ns[i] = ns3::Simulator::Now().GetNanoSeconds();
}}
void WatchSink(ns3::Ptr<ns3::Application> sink, uint64_t bytes) {{
  uint32_t i = received.size();
  received.push_back(0);
  target.push_back(bytes);
  done_ns.push_back(-1);
  sink->TraceConnectWithoutContext("Rx", ns3::MakeBoundCallback(&OnRx, i));
}}
}}
""")

HOSTS = {hosts:?}
RECEIVER = {receiver}
ACCESS_MBPS = {access}
QUEUE_BYTES = {queue}
NIC_MBPS = {nic}
DELAY_NS = {delay}
DCTCP_THRESHOLD_KB = {dctcp}
MIN_RTO_US = {rto}
RECOVERY = "{recovery}"
DURATION_MS = {duration}
SEGMENT = {mss}
# (workload, sender host index, receiver port, start ms, stop ms, bytes: 0 until stop) per
# connection
FLOWS = [
{flows}
]


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
    cd("ns3::TcpSocketBase::Sack", ns.BooleanValue(True))
    cd("ns3::TcpSocketBase::MinRto", ns.TimeValue(ns.MicroSeconds(MIN_RTO_US)))
    cd("ns3::TcpL4Protocol::RecoveryType", ns.TypeIdValue(ns.TypeId.LookupByName(RECOVERY)))
    if DCTCP_THRESHOLD_KB is not None:
        cd("ns3::TcpSocketBase::UseEcn", ns.StringValue("On"))

    nodes = ns.NodeContainer()
    nodes.Create(len(HOSTS))
    switch = ns.NodeContainer()
    switch.Create(1)
    ns.InternetStackHelper().InstallAll()

    p2p = ns.PointToPointHelper()
    p2p.SetChannelAttribute("Delay", ns.TimeValue(ns.NanoSeconds(DELAY_NS)))
    # The device's own queue holds one packet: the queue that counts is the qdisc below.
    p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", ns.StringValue("1p"))
    addresses = ns.Ipv4AddressHelper()
    receiver_addr = None
    bottleneck = None
    for i in range(len(HOSTS)):
        rate = ACCESS_MBPS if i == RECEIVER else NIC_MBPS
        p2p.SetDeviceAttribute("DataRate", ns.StringValue("%dMbps" % rate))
        pair = ns.NodeContainer()
        pair.Add(switch.Get(0))
        pair.Add(nodes.Get(i))
        devs = p2p.Install(pair)
        tch = ns.TrafficControlHelper()
        if i == RECEIVER and DCTCP_THRESHOLD_KB is not None:
            k = max(1, DCTCP_THRESHOLD_KB * 1000 // (SEGMENT + 40))
            tch.SetRootQueueDisc("ns3::RedQueueDisc",
                                 "MaxSize", ns.StringValue("%dB" % QUEUE_BYTES),
                                 "UseEcn", ns.BooleanValue(True),
                                 "UseHardDrop", ns.BooleanValue(False),
                                 "MeanPktSize", ns.UintegerValue(SEGMENT + 40),
                                 "QW", ns.DoubleValue(1.0),
                                 "MinTh", ns.DoubleValue(k),
                                 "MaxTh", ns.DoubleValue(k))
        else:
            size = QUEUE_BYTES if i == RECEIVER else 256 * 1500
            tch.SetRootQueueDisc("ns3::FifoQueueDisc",
                                 "MaxSize", ns.StringValue("%dB" % size))
        qdiscs = tch.Install(devs)
        if i == RECEIVER:
            bottleneck = qdiscs.Get(0)  # the switch's side: toward the receiver
        addresses.SetBase(ns.Ipv4Address("10.%d.%d.0" % (i // 250, i % 250 + 1)),
                          ns.Ipv4Mask("255.255.255.0"))
        ifaces = addresses.Assign(devs)
        if i == RECEIVER:
            receiver_addr = ifaces.GetAddress(1)
    ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()

    sinks = []
    for (name, sender, port, start_ms, stop_ms, size) in FLOWS:
        any_addr = ns.InetSocketAddress(ns.Ipv4Address.GetAny(), port)
        sink = ns.PacketSinkHelper("ns3::TcpSocketFactory", any_addr.ConvertTo())
        sink_app = sink.Install(nodes.Get(RECEIVER))
        sink_app.Start(ns.MilliSeconds(0))
        cppyy.gbl.picnic_probe.WatchSink(sink_app.Get(0), size)
        to = ns.InetSocketAddress(receiver_addr, port)
        bulk = ns.BulkSendHelper("ns3::TcpSocketFactory", to.ConvertTo())
        bulk.SetAttribute("MaxBytes", ns.UintegerValue(size))
        bulk.SetAttribute("SendSize", ns.UintegerValue(SEGMENT))
        app = bulk.Install(nodes.Get(sender))
        app.Start(ns.MilliSeconds(start_ms))
        app.Stop(ns.MilliSeconds(stop_ms))
        cppyy.gbl.picnic_probe.Watch(app.Get(0), ns.MilliSeconds(start_ms) + ns.NanoSeconds(1))
        sinks.append((name, start_ms, stop_ms, sink_app.Get(0)))

    cppyy.gbl.picnic_probe.Sample(bottleneck, ns.MilliSeconds(1), ns.MilliSeconds(DURATION_MS))
    ns.Simulator.Stop(ns.MilliSeconds(DURATION_MS))
    ns.Simulator.Run()
    per_flow = []
    per_workload = {{}}
    for i, (name, start_ms, stop_ms, app) in enumerate(sinks):
        rx = ns.DynamicCast[ns.PacketSink](app).GetTotalRx()
        mbps = rx * 8 / ((stop_ms - start_ms) / 1000.0) / 1e6
        per_flow.append(mbps)
        w = per_workload.setdefault(name, {{"connections": 0, "bytes": 0, "mbps": 0.0}})
        w["connections"] += 1
        w["bytes"] += rx
        w["mbps"] += mbps
        if FLOWS[i][5] > 0:
            done = int(cppyy.gbl.picnic_probe.done_ns[i])
            w.setdefault("fct_ms", []).append(done / 1e6 - start_ms if done >= 0 else None)
    for w in per_workload.values():
        if "fct_ms" in w:
            # A transfer completes with its last connection (the lab's completion_ms).
            w["completion_ms"] = None if None in w["fct_ms"] else max(w["fct_ms"])
    samples = sorted(int(x) for x in cppyy.gbl.picnic_probe.samples)
    queue_kb = [[q, samples[min(len(samples) - 1, int(q * len(samples)))] / 1000.0]
                for q in (0.5, 0.9, 0.99, 0.999, 1.0)] if samples else []
    ns.Simulator.Destroy()
    total = sum(per_flow)
    squares = sum(x * x for x in per_flow)
    jain = total * total / (len(per_flow) * squares) if squares > 0 else 0.0
    json.dump({{"simulator": "ns-3", "bottleneck_mbps": ACCESS_MBPS, "aggregate_mbps": total,
               "jain": jain, "flows_mbps": per_flow, "workloads": per_workload,
               "timeouts": int(cppyy.gbl.picnic_probe.timeouts),
               "retransmissions": int(cppyy.gbl.picnic_probe.retransmissions),
               "bottleneck_queue_kb_sampled_1ms": queue_kb}},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
"#,
        hosts = b.hosts,
        receiver = b.receiver_index,
        access = b.access_mbps,
        queue = b.queue_bytes,
        nic = b.nic_mbps,
        delay = b.link_delay_ns,
        dctcp = b
            .dctcp_threshold_kb
            .map_or("None".to_string(), |k| k.to_string()),
        rto = b.min_rto_us,
        recovery = b.recovery.ns3_type(),
        duration = b.duration_ms,
        mss = MSS,
        flows = flows.join("\n"),
        seed = seed,
    );
    Ok(p)
}

/// Runs `picnic sim ns3`.
pub fn run_cli(args: Ns3Args) -> Result<i32> {
    let spec = Spec::load(&args.scenario)?;
    let program = generate(&spec, args.seed)?;
    match &args.out {
        Some(path) => std::fs::write(path, program)?,
        None => print!("{program}"),
    }
    Ok(0)
}

mod fabric;

#[cfg(test)]
#[path = "ns3_tests.rs"]
pub(crate) mod tests;
