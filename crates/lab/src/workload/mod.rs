//! Traffic workloads run inside VM namespaces: UDP flood, ON/OFF bursts, bulk TCP and
//! transfers, an RPC latency probe (UDP or TCP), a CPU burn, and the external tools iperf3,
//! sockperf and memcached. Every workload is bounded by its stop time (and so by a count);
//! every receiver also stops at a deadline. Results are data: counters, a rate time series
//! in [`BIN_MS`] bins and, for RPC, an HDR histogram of request latencies.
//!
//! This file runs the workloads (receivers first, then senders from a common epoch) and
//! dispatches each kind to its sides: `pacing` schedules sends, `udp` floods and sinks,
//! `tcp` bulk flows and sinks, `rpc` the latency probe, `tools` the external tools.

mod pacing;
mod rpc;
mod tcp;
mod tools;
mod udp;

use self::rpc::{rpc_tcp, rpc_udp, tcp_echo, udp_echo};
use self::tcp::{tcp_bulk, tcp_sink};
use self::tools::{iperf3_client, memcached_client, sockperf_client, tool_server};
use self::udp::{udp_flood, udp_sink};
use crate::cgroup::{Placement, TenantGroup};
use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use picnic_netns as netns;
use picnic_scenario::plan::Topology;
use picnic_scenario::{self as scenario, Protocol, Scenario, Workload, WorkloadKind};
use picnic_scenario::{WorkloadResult, BASE_PORT, BIN_MS};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long receivers keep listening after the sender's stop time.
pub const GRACE: Duration = Duration::from_millis(200);
/// Poll interval of receive loops (read timeouts), so deadlines are noticed.
const POLL: Duration = Duration::from_millis(20);
/// Highest latency the histograms record, ns (60 s).
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// Where a workload runs, resolved from the topology.
#[derive(Debug, Clone)]
struct Endpoints {
    from_ns: String,
    to_ns: String,
    to: SocketAddrV4,
}

/// Offsets of a workload relative to the run's epoch `t0`.
#[derive(Debug, Clone, Copy)]
struct Window {
    t0: Instant,
    start: Instant,
    stop: Instant,
    bins: usize,
}

impl Window {
    fn deadline(&self) -> Instant {
        self.stop + GRACE
    }
    fn bin(&self, now: Instant) -> usize {
        (now.saturating_duration_since(self.t0).as_millis() as u64 / BIN_MS) as usize
    }
}

/// Runs `workloads` (all from `scenario`) over `topo` and returns their results in the
/// same order. Receivers start first; once all are listening the run's epoch is set 50 ms
/// ahead and the senders start at their offsets from it.
pub fn run_all(
    scenario: &Scenario,
    topo: &Topology,
    workloads: &[&Workload],
) -> Result<Vec<WorkloadResult>> {
    run_placed(scenario, topo, workloads, &Placement::none())
}

/// Moves the calling workload thread into its tenant's cgroup and onto its CPUs.
fn enter(group: Option<TenantGroup>, cpus: &[usize]) -> Result<()> {
    if let Some(g) = group {
        g.enter()?;
    }
    if !cpus.is_empty() {
        picnic_switch::sched::set_thread_cpus(cpus)
            .with_context(|| format!("pinning a workload thread to CPUs {cpus:?}"))?;
    }
    Ok(())
}

/// [`run_all`] with every workload thread (sender and receiver side) first entering its
/// tenant's cgroup of `placement` on the host of its VM, if the tenant has one, and onto
/// its VM's CPUs (the tenant's `cpus`, else the host's `host_cpus`), if any; threads and
/// tools it starts inherit both.
pub fn run_placed(
    scenario: &Scenario,
    topo: &Topology,
    workloads: &[&Workload],
    placement: &Placement,
) -> Result<Vec<WorkloadResult>> {
    let group_of = |wl: &Workload, vm: &str| {
        let tenant = scenario.tenant_of(&wl.from)?;
        let host = scenario.host_of(vm)?;
        placement.group(&tenant.name, host).cloned()
    };
    let bins = ((scenario.duration_ms + GRACE.as_millis() as u64) / BIN_MS + 1) as usize;
    let mut servers = Vec::new();
    for wl in workloads {
        let index = scenario
            .workloads
            .iter()
            .position(|w| w.name == wl.name)
            .ok_or_else(|| anyhow!("workload {} is not in the scenario", wl.name))?;
        let ep = endpoints(topo, wl, BASE_PORT + index as u16)?;
        let (t0_tx, t0_rx) = mpsc::channel::<Instant>();
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let wl_owned = (*wl).clone();
        let stop_ms = wl.stop_ms(scenario);
        let ep2 = ep.clone();
        let group = group_of(wl, &wl.to);
        let cpus = scenario.cpus_of_vm(&wl.to).to_vec();
        let server = netns::spawn_in_netns(&ep.to_ns, move || {
            enter(group, &cpus)?;
            serve(&wl_owned, &ep2, stop_ms, bins, ready_tx, t0_rx)
        })?;
        servers.push((ep, server, ready_rx, t0_tx));
    }
    for (i, (_, _, ready, _)) in servers.iter().enumerate() {
        if ready.recv_timeout(Duration::from_secs(5)).is_err() {
            bail!("receiver of workload {} did not start", workloads[i].name);
        }
    }
    let t0 = Instant::now() + Duration::from_millis(50);
    let mut clients = Vec::new();
    for (wl, (ep, server, _, t0_tx)) in workloads.iter().zip(servers) {
        let _ = t0_tx.send(t0);
        let window = Window {
            t0,
            start: t0 + Duration::from_millis(wl.start_ms),
            stop: t0 + Duration::from_millis(wl.stop_ms(scenario)),
            bins,
        };
        let wl_owned = (*wl).clone();
        let ep2 = ep.clone();
        let group = group_of(wl, &wl.from);
        let cpus = scenario.cpus_of_vm(&wl.from).to_vec();
        let client = netns::spawn_in_netns(&ep.from_ns, move || {
            enter(group, &cpus)?;
            send(&wl_owned, &ep2, window)
        })?;
        clients.push((server, client, window));
    }
    let mut results = Vec::new();
    for (wl, (server, client, window)) in workloads.iter().zip(clients) {
        let sent = client
            .join()?
            .with_context(|| format!("sender of workload {}", wl.name))?;
        let recv = server
            .join()?
            .with_context(|| format!("receiver of workload {}", wl.name))?;
        results.push(merge(wl, scenario.report_group(wl), sent, recv, window));
    }
    Ok(results)
}

/// The namespaces and receiver address of `wl`, its receiver listening on `port`.
fn endpoints(topo: &Topology, wl: &Workload, port: u16) -> Result<Endpoints> {
    let from = topo
        .vm(&wl.from)
        .ok_or_else(|| anyhow!("no VM {} in the topology", wl.from))?;
    let to = topo
        .vm(&wl.to)
        .ok_or_else(|| anyhow!("no VM {} in the topology", wl.to))?;
    Ok(Endpoints {
        from_ns: from.ns.clone(),
        to_ns: to.ns.clone(),
        to: SocketAddrV4::new(to.ip, port),
    })
}

/// What the sending side measured.
#[derive(Default)]
struct SenderSide {
    sent: u64,
    /// RPC and iperf3 measure at the client: filled there.
    received: Option<ReceiverSide>,
    latency: Option<Histogram<u64>>,
}

/// What the receiving side measured.
#[derive(Default)]
struct ReceiverSide {
    received: u64,
    bytes: u64,
    series: Vec<u64>,
    /// When the last expected byte arrived (transfers that completed).
    done_at: Option<Instant>,
}

/// Combines both sides' measurements of `wl` into its result.
fn merge(
    wl: &Workload,
    tenant: String,
    sent: SenderSide,
    recv: ReceiverSide,
    window: Window,
) -> WorkloadResult {
    let recv = sent.received.unwrap_or(recv);
    let completion_ns = recv
        .done_at
        .map(|t| t.saturating_duration_since(window.start).as_nanos() as u64);
    WorkloadResult {
        name: wl.name.clone(),
        tenant,
        kind: wl.kind,
        sent: sent.sent,
        received: recv.received,
        received_bytes: recv.bytes,
        // A completed transfer was active until its last byte, not until its stop time.
        active_ns: completion_ns
            .unwrap_or((window.stop - window.start).as_nanos() as u64)
            .max(1),
        latency: sent.latency,
        series: recv.series,
        completion_ns,
    }
}

/// Receiver side of a workload, run inside the receiving VM's namespace.
fn serve(
    wl: &Workload,
    ep: &Endpoints,
    stop_ms: u64,
    bins: usize,
    ready: mpsc::Sender<()>,
    t0: mpsc::Receiver<Instant>,
) -> Result<ReceiverSide> {
    let bind = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ep.to.port());
    let wait_t0 = |ready: mpsc::Sender<()>| -> Result<Window> {
        let _ = ready.send(());
        let t0 = t0.recv().map_err(|_| anyhow!("run aborted"))?;
        Ok(Window {
            t0,
            start: t0,
            stop: t0 + Duration::from_millis(stop_ms),
            bins,
        })
    };
    match wl.kind {
        WorkloadKind::UdpFlood | WorkloadKind::OnOff => {
            let sock = UdpSocket::bind(bind).context("binding the UDP sink")?;
            sock.set_read_timeout(Some(POLL))?;
            udp_sink(&sock, wait_t0(ready)?)
        }
        WorkloadKind::Rpc => match wl.protocol.unwrap_or_default() {
            Protocol::Udp => {
                let sock = UdpSocket::bind(bind).context("binding the RPC server")?;
                sock.set_read_timeout(Some(POLL))?;
                udp_echo(&sock, wait_t0(ready)?)
            }
            Protocol::Tcp => {
                let listener = TcpListener::bind(bind).context("binding the RPC server")?;
                tcp_echo(&listener, wl.size(), wait_t0(ready)?)
            }
        },
        WorkloadKind::TcpBulk => {
            let listener = TcpListener::bind(bind).context("binding the TCP sink")?;
            tcp_sink(&listener, wl.flows(), None, wait_t0(ready)?)
        }
        WorkloadKind::Transfer => {
            let listener = TcpListener::bind(bind).context("binding the transfer sink")?;
            let expected = wl.bytes.unwrap_or(0) * wl.flows() as u64;
            tcp_sink(&listener, wl.flows(), Some(expected), wait_t0(ready)?)
        }
        WorkloadKind::Iperf3 => {
            let port = ep.to.port().to_string();
            tool_server(&ep.to_ns, "iperf3", &["-s", "-1", "-p", &port], || {
                wait_t0(ready)
            })
        }
        WorkloadKind::Sockperf => {
            let port = ep.to.port().to_string();
            let mut args = vec!["server", "-i", "0.0.0.0", "-p", &port];
            if wl.protocol.unwrap_or_default() == Protocol::Tcp {
                args.push("--tcp");
            }
            tool_server(&ep.to_ns, "sockperf", &args, || wait_t0(ready))
        }
        WorkloadKind::CpuBurn => {
            wait_t0(ready)?;
            Ok(ReceiverSide::default())
        }
        WorkloadKind::Memcached => {
            let port = ep.to.port().to_string();
            // -U 0: no UDP listener; -u root: memcached refuses to run as root otherwise.
            let args = [
                "-u", "root", "-l", "0.0.0.0", "-p", &port, "-U", "0", "-t", "1",
            ];
            tool_server(&ep.to_ns, "memcached", &args, || wait_t0(ready))
        }
    }
}

/// Sender side of a workload, run inside the sending VM's namespace.
fn send(wl: &Workload, ep: &Endpoints, w: Window) -> Result<SenderSide> {
    match wl.kind {
        WorkloadKind::UdpFlood => udp_flood(ep, wl.size(), wl.rate_pps, None, w),
        WorkloadKind::OnOff => {
            let on = Duration::from_millis(wl.on_ms.unwrap_or(1));
            let off = Duration::from_millis(wl.off_ms.unwrap_or(1));
            udp_flood(ep, wl.size(), wl.rate_pps, Some((on, off)), w)
        }
        WorkloadKind::TcpBulk => tcp_bulk(ep, wl.flows(), None, w),
        WorkloadKind::Transfer => tcp_bulk(ep, wl.flows(), wl.bytes, w),
        WorkloadKind::Rpc => {
            let rate = wl.rate_pps.unwrap_or(scenario::DEFAULT_RPC_RATE);
            let timeout =
                Duration::from_millis(wl.timeout_ms.unwrap_or(scenario::DEFAULT_TIMEOUT_MS));
            match wl.protocol.unwrap_or_default() {
                Protocol::Udp => rpc_udp(ep, wl.size(), rate, timeout, w),
                Protocol::Tcp => rpc_tcp(ep, wl.size(), rate, timeout, w),
            }
        }
        WorkloadKind::Iperf3 => iperf3_client(ep, wl.flows(), w),
        WorkloadKind::Sockperf => sockperf_client(ep, wl, w),
        WorkloadKind::CpuBurn => {
            let rounds = crate::cpu_burn::rounds_per_unit();
            let mut hist = new_histogram()?;
            let units = crate::cpu_burn::burn(rounds, w.start, w.stop, &mut hist)?;
            Ok(SenderSide {
                sent: units,
                received: Some(ReceiverSide {
                    received: units,
                    bytes: units * crate::cpu_burn::BYTES_PER_UNIT,
                    series: vec![0; w.bins],
                    ..Default::default()
                }),
                latency: Some(hist),
            })
        }
        WorkloadKind::Memcached => {
            let rate = wl.rate_pps.unwrap_or(scenario::DEFAULT_RPC_RATE);
            let timeout =
                Duration::from_millis(wl.timeout_ms.unwrap_or(scenario::DEFAULT_TIMEOUT_MS));
            memcached_client(ep, wl.size(), rate, timeout, w)
        }
    }
}

/// Whether a socket error only means the read or write timed out (or was interrupted).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// An empty latency histogram, 1 ns to [`MAX_LATENCY_NS`] at 3 significant digits.
fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).map_err(|e| anyhow!("histogram: {e}"))
}
