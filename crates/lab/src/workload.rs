//! Traffic workloads run inside VM namespaces: UDP flood, ON/OFF bursts, bulk TCP, an RPC
//! latency probe (UDP or TCP) and iperf3. Every workload is bounded by its stop time (and so
//! by a count); every receiver also stops at a deadline. Results are data: counters, a rate
//! time series in [`BIN_MS`] bins and, for RPC, an HDR histogram of request latencies.

use crate::cgroup::Placement;
use crate::netns;
use crate::scenario::{self, Protocol, Scenario, Workload, WorkloadKind};
use crate::topology::Topology;
use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Width of a time-series bin, ms.
pub const BIN_MS: u64 = 10;
/// How long receivers keep listening after the sender's stop time.
pub const GRACE: Duration = Duration::from_millis(200);
/// First port used by workloads; workload `i` uses `BASE_PORT + i`.
pub const BASE_PORT: u16 = 20000;
/// Poll interval of receive loops (read timeouts), so deadlines are noticed.
const POLL: Duration = Duration::from_millis(20);
/// Highest latency the histograms record, ns (60 s).
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// The measured outcome of one workload.
#[derive(Debug, Clone)]
pub struct WorkloadResult {
    /// Workload name.
    pub name: String,
    /// Tenant of its VMs, or the victim's attack group (see
    /// [`Scenario::report_group`]): the row of the report it counts in.
    pub tenant: String,
    /// Kind of traffic.
    pub kind: WorkloadKind,
    /// Packets (datagrams, requests) the sender got out of its socket.
    pub sent: u64,
    /// Packets (or responses) that arrived in time.
    pub received: u64,
    /// Application payload bytes that arrived (responses for RPC).
    pub received_bytes: u64,
    /// Length of the sending period, ns.
    pub active_ns: u64,
    /// Request latencies in ns (RPC only).
    pub latency: Option<Histogram<u64>>,
    /// Payload bytes received per [`BIN_MS`] bin since the start of the run.
    pub series: Vec<u64>,
    /// For a `transfer` that delivered every byte: ns from its start to the last byte.
    pub completion_ns: Option<u64>,
}

impl WorkloadResult {
    /// Application goodput over the sending period, bits/s.
    pub fn throughput_bps(&self) -> f64 {
        if self.active_ns == 0 {
            return 0.0;
        }
        self.received_bytes as f64 * 8.0 * 1e9 / self.active_ns as f64
    }

    /// Lost fraction: packets (or requests) sent that did not arrive (in time). TCP: 0.
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.sent.saturating_sub(self.received) as f64 / self.sent as f64
    }
}

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

/// [`run_all`] with every workload thread (sender and receiver side) first entering its
/// tenant's cgroup of `placement` on the host of its VM, if the tenant has one.
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
        let server = netns::spawn_in_netns(&ep.to_ns, move || {
            if let Some(g) = group {
                g.enter()?;
            }
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
        let client = netns::spawn_in_netns(&ep.from_ns, move || {
            if let Some(g) = group {
                g.enter()?;
            }
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

/// Runs a tool's server in namespace `ns` from before the run starts until a second after
/// its deadline; the client side measures.
fn tool_server(
    ns: &str,
    tool: &str,
    args: &[&str],
    wait_t0: impl FnOnce() -> Result<Window>,
) -> Result<ReceiverSide> {
    let mut child = netns::exec_in(ns, tool)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| {
            format!(
                "starting the {tool} server (Debian package {})",
                netns::debian_package(tool)
            )
        })?;
    std::thread::sleep(Duration::from_millis(300));
    let window = wait_t0();
    if let Ok(w) = &window {
        sleep_until(w.deadline() + Duration::from_secs(1));
    }
    let _ = child.kill();
    let _ = child.wait();
    window.map(|_| ReceiverSide::default())
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

/// Sleeps until `t`. Timers here wake 0.1 to 1 ms late (DESIGN.md 7); paced senders send
/// everything due when they wake, so their rate holds. They do not spin: a generator
/// spinning for precision takes the cores the switches under test need (on 2 cores a
/// spinning line-rate flood raised the victim's p99 in picnic mode 4x).
fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The send time of packet `n` at `rate` per second from `start`, exact in integers.
fn nth_send_time(start: Instant, n: u64, rate: u64) -> Instant {
    start + Duration::from_nanos((n as u128 * 1_000_000_000 / rate as u128) as u64)
}

/// Datagrams per sendmmsg/recvmmsg call.
const BATCH: usize = 32;

/// Preallocated buffers and headers for sendmmsg/recvmmsg on a connected UDP socket, so a
/// flood costs one syscall per [`BATCH`] datagrams and no allocation.
struct MmsgBatch {
    bufs: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers only point into the batch's own heap buffers.
unsafe impl Send for MmsgBatch {}

impl MmsgBatch {
    /// `BATCH` buffers of `len` bytes; the headers point into them (the heap buffers never
    /// move or resize, so the pointers stay valid when the struct moves).
    fn new(len: usize) -> MmsgBatch {
        let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; len]).collect();
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let hdrs = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: an all-zero msghdr is valid (no name, no control data).
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        MmsgBatch { bufs, iovs, hdrs }
    }

    /// Sends the first `n` buffers; returns how many left.
    fn send(&mut self, sock: &UdpSocket, n: usize) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // SAFETY: hdrs[..n] point at live iovecs and buffers owned by self.
        let rc = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n.min(BATCH) as u32,
                0,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// Receives up to [`BATCH`] datagrams (blocking for the first, up to the socket's read
    /// timeout); returns their lengths through `lens`.
    fn recv(&mut self, sock: &UdpSocket, lens: &mut [usize; BATCH]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        for (h, iov) in self.hdrs.iter_mut().zip(&self.iovs) {
            h.msg_len = 0;
            h.msg_hdr.msg_iov = iov as *const libc::iovec as *mut libc::iovec;
        }
        // SAFETY: as in send; the kernel writes at most iov_len bytes per buffer.
        let rc = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for (len, h) in lens.iter_mut().zip(&self.hdrs).take(rc as usize) {
            *len = h.msg_len as usize;
        }
        Ok(rc as usize)
    }
}

/// UDP flood: datagrams of `size` bytes carrying a sequence number, sent in sendmmsg
/// batches, paced at `rate` (the batch is what is due by the clock, spinning between) or
/// unlimited, optionally gated ON/OFF.
fn udp_flood(
    ep: &Endpoints,
    size: usize,
    rate: Option<u64>,
    on_off: Option<(Duration, Duration)>,
    w: Window,
) -> Result<SenderSide> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(ep.to).context("connecting the flood socket")?;
    let mut batch = MmsgBatch::new(size);
    let mut sent = 0u64;
    // Paced mode counts packets from the start of the current ON phase (the whole window
    // without ON/OFF), so an OFF phase is not made up for with a burst when ON resumes.
    let mut phase_start = w.start;
    let mut scheduled = 0u64;
    sleep_until(w.start);
    loop {
        let now = Instant::now();
        if now >= w.stop {
            break;
        }
        let mut on_end = w.stop;
        if let Some((on, off)) = on_off {
            // EyeQ 2.2's bursty neighbour: ON at full rate, then silent.
            let period = on + off;
            while now >= phase_start + period {
                phase_start += period;
                scheduled = 0;
            }
            on_end = (phase_start + on).min(w.stop);
            if now >= on_end {
                sleep_until((phase_start + period).min(w.stop));
                continue;
            }
        }
        let n = match rate {
            None => BATCH,
            Some(rate) => {
                let due = nth_send_time(phase_start, scheduled, rate);
                if due >= on_end {
                    sleep_until(on_end);
                    continue;
                }
                if due > now {
                    sleep_until(due);
                }
                let elapsed = Instant::now()
                    .saturating_duration_since(phase_start)
                    .as_nanos();
                let due_total = (elapsed * rate as u128 / 1_000_000_000) as u64 + 1;
                (due_total.saturating_sub(scheduled) as usize).clamp(1, BATCH)
            }
        };
        for (i, buf) in batch.bufs.iter_mut().take(n).enumerate() {
            buf[..8].copy_from_slice(&(sent + i as u64).to_be_bytes());
        }
        match batch.send(&sock, n) {
            Ok(k) => {
                sent += k as u64;
                scheduled += n as u64;
            }
            // A full queue (ENOBUFS) or an ICMP error: nothing left; try again.
            Err(_) => std::thread::yield_now(),
        }
    }
    Ok(SenderSide {
        sent,
        ..Default::default()
    })
}

/// UDP sink: counts datagrams and bytes per bin, with recvmmsg batches.
fn udp_sink(sock: &UdpSocket, w: Window) -> Result<ReceiverSide> {
    let mut out = ReceiverSide {
        series: vec![0; w.bins],
        ..Default::default()
    };
    let mut batch = MmsgBatch::new(65536);
    let mut lens = [0usize; BATCH];
    while Instant::now() < w.deadline() {
        match batch.recv(sock, &mut lens) {
            Ok(k) => {
                let now = Instant::now();
                let bytes: usize = lens[..k].iter().sum();
                out.received += k as u64;
                out.bytes += bytes as u64;
                if let Some(b) = out.series.get_mut(w.bin(now)) {
                    *b += bytes as u64;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("receiving"),
        }
    }
    Ok(out)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

fn udp_echo(sock: &UdpSocket, w: Window) -> Result<ReceiverSide> {
    let mut buf = vec![0u8; 65536];
    while Instant::now() < w.deadline() {
        match sock.recv_from(&mut buf) {
            Ok((len, peer)) => {
                let _ = sock.send_to(&buf[..len], peer);
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("RPC server receiving"),
        }
    }
    Ok(ReceiverSide::default())
}

/// Request header: sequence number and send time (ns since the run's epoch).
fn encode_request(buf: &mut [u8], seq: u64, sent_ns: u64) {
    buf[..8].copy_from_slice(&seq.to_be_bytes());
    buf[8..16].copy_from_slice(&sent_ns.to_be_bytes());
}

fn decode_request(buf: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_be_bytes(buf.get(..8)?.try_into().ok()?);
    let sent = u64::from_be_bytes(buf.get(8..16)?.try_into().ok()?);
    Some((seq, sent))
}

fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).map_err(|e| anyhow!("histogram: {e}"))
}

/// Collects responses of a probe: latency per request, answered once and in time.
struct ProbeBook {
    answered: Vec<bool>,
    hist: Histogram<u64>,
    received: ReceiverSide,
    timeout_ns: u64,
}

impl ProbeBook {
    fn new(requests: usize, bins: usize, timeout: Duration) -> Result<ProbeBook> {
        Ok(ProbeBook {
            answered: vec![false; requests],
            hist: new_histogram()?,
            received: ReceiverSide {
                series: vec![0; bins],
                ..Default::default()
            },
            timeout_ns: timeout.as_nanos() as u64,
        })
    }

    fn on_response(&mut self, w: &Window, frame: &[u8], now: Instant) {
        let Some((seq, sent_ns)) = decode_request(frame) else {
            return;
        };
        let now_ns = now.saturating_duration_since(w.t0).as_nanos() as u64;
        self.on_answer(w, seq, now_ns.saturating_sub(sent_ns), now, frame.len());
    }

    /// Request `seq` was answered after `latency_ns` with `bytes` bytes, at `now`.
    fn on_answer(&mut self, w: &Window, seq: u64, latency_ns: u64, now: Instant, bytes: usize) {
        let Some(done) = self.answered.get_mut(seq as usize) else {
            return;
        };
        if *done || latency_ns > self.timeout_ns {
            return; // duplicate, or too late: the request counts as lost
        }
        *done = true;
        let _ = self.hist.record(latency_ns.clamp(1, MAX_LATENCY_NS));
        self.received.received += 1;
        self.received.bytes += bytes as u64;
        if let Some(b) = self.received.series.get_mut(w.bin(now)) {
            *b += bytes as u64;
        }
    }
}

fn request_count(rate: u64, w: &Window) -> usize {
    ((w.stop - w.start).as_nanos() * rate as u128 / 1_000_000_000 + 1) as usize
}

/// UDP RPC client: requests at a fixed rate from one thread, responses on another.
fn rpc_udp(
    ep: &Endpoints,
    size: usize,
    rate: u64,
    timeout: Duration,
    w: Window,
) -> Result<SenderSide> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(ep.to).context("connecting the RPC socket")?;
    sock.set_read_timeout(Some(POLL))?;
    let rx_sock = sock.try_clone()?;
    let count = request_count(rate, &w);
    let mut book = ProbeBook::new(count, w.bins, timeout)?;
    let rx_deadline = w.stop + timeout;
    let receiver = std::thread::spawn(move || -> Result<ProbeBook> {
        let mut buf = vec![0u8; 65536];
        while Instant::now() < rx_deadline {
            match rx_sock.recv(&mut buf) {
                Ok(len) => book.on_response(&w, &buf[..len], Instant::now()),
                Err(e) if is_timeout(&e) => {}
                // ECONNREFUSED from an ICMP error: the request is lost, keep going.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e).context("RPC client receiving"),
            }
        }
        Ok(book)
    });
    let mut buf = vec![0u8; size];
    let mut sent = 0u64;
    for n in 0..count as u64 {
        let due = nth_send_time(w.start, n, rate);
        if due >= w.stop {
            break;
        }
        sleep_until(due);
        let now_ns = Instant::now().saturating_duration_since(w.t0).as_nanos() as u64;
        encode_request(&mut buf, n, now_ns);
        if sock.send(&buf).is_ok() {
            sent += 1;
        }
    }
    let book = receiver
        .join()
        .map_err(|_| anyhow!("RPC receiver panicked"))??;
    Ok(SenderSide {
        sent,
        received: Some(book.received),
        latency: Some(book.hist),
    })
}

/// TCP RPC server: echoes fixed-size frames on one connection.
fn tcp_echo(listener: &TcpListener, size: usize, w: Window) -> Result<ReceiverSide> {
    let Some(mut conn) = accept_until(listener, w.deadline())? else {
        return Ok(ReceiverSide::default());
    };
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(POLL))?;
    let mut buf = vec![0u8; size];
    let mut filled = 0;
    while Instant::now() < w.deadline() {
        match conn.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(len) => {
                filled += len;
                if filled == size {
                    conn.write_all(&buf)?;
                    filled = 0;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("RPC server reading"),
        }
    }
    Ok(ReceiverSide::default())
}

fn accept_until(listener: &TcpListener, deadline: Instant) -> Result<Option<TcpStream>> {
    listener.set_nonblocking(true)?;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)?;
                return Ok(Some(conn));
            }
            Err(e) if is_timeout(&e) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e).context("accepting"),
        }
    }
    Ok(None)
}

/// TCP RPC client: one outstanding request; a request not answered within the timeout
/// counts as lost and its late response is skipped. Ticks missed while waiting are skipped,
/// not sent in a burst.
fn rpc_tcp(
    ep: &Endpoints,
    size: usize,
    rate: u64,
    timeout: Duration,
    w: Window,
) -> Result<SenderSide> {
    let mut conn = TcpStream::connect_timeout(&ep.to.into(), Duration::from_secs(2))
        .context("connecting the RPC client")?;
    conn.set_nodelay(true)?;
    let count = request_count(rate, &w);
    let mut book = ProbeBook::new(count, w.bins, timeout)?;
    let mut req = vec![0u8; size];
    let mut rx = vec![0u8; size];
    let mut filled = 0;
    let mut sent = 0u64;
    let mut n = 0u64;
    loop {
        let due = nth_send_time(w.start, n, rate);
        if due >= w.stop || n as usize >= count {
            break;
        }
        sleep_until(due);
        let sent_at = Instant::now();
        encode_request(
            &mut req,
            n,
            sent_at.saturating_duration_since(w.t0).as_nanos() as u64,
        );
        conn.write_all(&req).context("RPC client sending")?;
        sent += 1;
        let give_up = sent_at + timeout;
        // Read frames until this request's response arrives or the timeout passes.
        'wait: while Instant::now() < give_up {
            conn.set_read_timeout(Some(
                (give_up - Instant::now()).max(Duration::from_micros(100)),
            ))?;
            match conn.read(&mut rx[filled..]) {
                Ok(0) => bail!("RPC server closed the connection"),
                Ok(len) => {
                    filled += len;
                    if filled == size {
                        filled = 0;
                        book.on_response(&w, &rx, Instant::now());
                        if decode_request(&rx).map(|(s, _)| s) == Some(n) {
                            break 'wait;
                        }
                    }
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e).context("RPC client receiving"),
            }
        }
        n += 1;
        while nth_send_time(w.start, n, rate) < Instant::now() {
            n += 1;
        }
    }
    Ok(SenderSide {
        sent,
        received: Some(book.received),
        latency: Some(book.hist),
    })
}

/// TCP sink: accepts up to `flows` connections and counts what they deliver: until the
/// stop time, or with `expected` (a transfer) all bytes until the deadline, noting when
/// the `expected`-th byte arrived.
fn tcp_sink(
    listener: &TcpListener,
    flows: u32,
    expected: Option<u64>,
    w: Window,
) -> Result<ReceiverSide> {
    let mut readers = Vec::new();
    for _ in 0..flows {
        let Some(mut conn) = accept_until(listener, w.deadline())? else {
            break;
        };
        conn.set_read_timeout(Some(POLL))?;
        readers.push(std::thread::spawn(move || -> ReceiverSide {
            let mut out = ReceiverSide {
                series: vec![0; w.bins],
                ..Default::default()
            };
            let mut buf = vec![0u8; 1 << 16];
            while Instant::now() < w.deadline() {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(len) => {
                        let now = Instant::now();
                        if now <= w.stop || expected.is_some() {
                            out.bytes += len as u64;
                            out.done_at = Some(now);
                        }
                        if let Some(b) = out.series.get_mut(w.bin(now)) {
                            *b += len as u64;
                        }
                    }
                    Err(e) if is_timeout(&e) => {}
                    Err(_) => break,
                }
            }
            out
        }));
    }
    let mut total = ReceiverSide {
        series: vec![0; w.bins],
        ..Default::default()
    };
    for r in readers {
        let part = r.join().map_err(|_| anyhow!("TCP reader panicked"))?;
        total.bytes += part.bytes;
        total.done_at = total.done_at.max(part.done_at);
        for (t, p) in total.series.iter_mut().zip(&part.series) {
            *t += p;
        }
    }
    if expected.is_none_or(|e| total.bytes < e) {
        total.done_at = None;
    }
    Ok(total)
}

/// Bulk TCP client: `flows` connections writing as fast as they can until the stop time,
/// or each exactly `bytes` (a transfer) and then closing.
fn tcp_bulk(ep: &Endpoints, flows: u32, bytes: Option<u64>, w: Window) -> Result<SenderSide> {
    sleep_until(w.start);
    let mut writers = Vec::new();
    for _ in 0..flows {
        let mut conn = TcpStream::connect_timeout(&ep.to.into(), Duration::from_secs(2))
            .context("connecting a bulk TCP flow")?;
        conn.set_write_timeout(Some(POLL))?;
        writers.push(std::thread::spawn(move || {
            let buf = vec![0x5au8; 1 << 16];
            let mut left = bytes.unwrap_or(u64::MAX);
            while left > 0 && Instant::now() < w.stop {
                let chunk = &buf[..buf.len().min(left.try_into().unwrap_or(usize::MAX))];
                match conn.write(chunk) {
                    Ok(n) => left -= n as u64,
                    Err(e) if is_timeout(&e) => {}
                    Err(_) => break,
                }
            }
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }));
    }
    for wr in writers {
        wr.join().map_err(|_| anyhow!("TCP writer panicked"))?;
    }
    Ok(SenderSide::default())
}

/// iperf3 client with `flows` streams; its JSON report gives bytes received and a 100 ms
/// interval series (spread evenly over the 10 ms bins).
fn iperf3_client(ep: &Endpoints, flows: u32, w: Window) -> Result<SenderSide> {
    sleep_until(w.start);
    let secs = (w.stop - w.start).as_secs_f64().max(0.1);
    let out = netns::exec_in(&ep.from_ns, "iperf3")
        .args([
            "-c",
            &ep.to.ip().to_string(),
            "-p",
            &ep.to.port().to_string(),
            "-t",
            &format!("{secs:.1}"),
            "-P",
            &flows.to_string(),
            "-i",
            "0.1",
            "-J",
        ])
        .output()
        .context("running iperf3 (Debian package iperf3)")?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow!(
            "iperf3 output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(err) = json.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {err}");
    }
    let bytes = json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    let mut series = vec![0u64; w.bins];
    let offset = (w.start - w.t0).as_millis() as u64;
    for iv in json["intervals"].as_array().into_iter().flatten() {
        let start_ms = (iv["sum"]["start"].as_f64().unwrap_or(0.0) * 1000.0) as u64 + offset;
        let end_ms = (iv["sum"]["end"].as_f64().unwrap_or(0.0) * 1000.0) as u64 + offset;
        let b = iv["sum"]["bytes"].as_u64().unwrap_or(0);
        let (first, last) = ((start_ms / BIN_MS) as usize, (end_ms / BIN_MS) as usize);
        let n = (last.saturating_sub(first)).max(1) as u64;
        for bin in series.iter_mut().skip(first).take(n as usize) {
            *bin += b / n;
        }
    }
    Ok(SenderSide {
        sent: 0,
        received: Some(ReceiverSide {
            received: 0,
            bytes,
            series,
            done_at: None,
        }),
        latency: None,
    })
}

/// sockperf ping-pong client. sockperf runs whole seconds and leaves its start out of the
/// measurement (a 400 ms warm-up and its start-up, about 0.85 s in all here); its full log
/// holds every measured round trip, which all go into the histogram, binned by send time
/// counted back from the end of its run. Loss = 1 - received / sent over its measured
/// period.
fn sockperf_client(ep: &Endpoints, wl: &Workload, w: Window) -> Result<SenderSide> {
    sleep_until(w.start);
    let secs = (w.stop - w.start).as_secs().max(1);
    let rate = wl.rate_pps.unwrap_or(scenario::DEFAULT_RPC_RATE);
    let log = std::env::temp_dir().join(format!(
        "picnic-sockperf-{}-{}.csv",
        std::process::id(),
        ep.to.port()
    ));
    let mut cmd = netns::exec_in(&ep.from_ns, "sockperf");
    cmd.args([
        "ping-pong".to_string(),
        "-i".to_string(),
        ep.to.ip().to_string(),
        "-p".to_string(),
        ep.to.port().to_string(),
        format!("--mps={rate}"),
        "-t".to_string(),
        secs.to_string(),
        format!("--msg-size={}", wl.size()),
        "--full-rtt".to_string(),
        "--full-log".to_string(),
        log.display().to_string(),
    ]);
    if wl.protocol.unwrap_or_default() == Protocol::Tcp {
        cmd.arg("--tcp");
    }
    let out = cmd
        .output()
        .context("running sockperf (Debian package sockperf)")?;
    let full_log = std::fs::read_to_string(&log);
    let _ = std::fs::remove_file(&log);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "sockperf failed: {}{}",
            stdout.lines().last().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (sent, received) = sockperf_counts(&stdout)?;
    let round_trips = sockperf_round_trips(&full_log.context("reading sockperf's full log")?)?;
    let mut hist = new_histogram()?;
    let mut series = vec![0u64; w.bins];
    let run_end = w.start + Duration::from_secs(secs);
    let last_tx = round_trips.last().map_or(0.0, |&(tx, _)| tx);
    for &(tx, rtt_us) in &round_trips {
        let _ = hist.record(((rtt_us * 1e3) as u64).clamp(1, MAX_LATENCY_NS));
        let at = run_end
            .checked_sub(Duration::from_secs_f64((last_tx - tx).max(0.0)))
            .unwrap_or(w.start);
        if let Some(b) = series.get_mut(w.bin(at)) {
            *b += wl.size() as u64;
        }
    }
    Ok(SenderSide {
        sent,
        received: Some(ReceiverSide {
            received,
            bytes: received * wl.size() as u64,
            series,
            done_at: None,
        }),
        latency: Some(hist),
    })
}

/// Messages sent and received in sockperf's measured period, from its summary line
/// `[Valid Duration] RunTime=0.549 sec; SentMessages=550; ReceivedMessages=550`.
fn sockperf_counts(stdout: &str) -> Result<(u64, u64)> {
    let line = stdout
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .ok_or_else(|| anyhow!("sockperf printed no [Valid Duration] summary"))?;
    let field = |name: &str| -> Result<u64> {
        line.split(';')
            .find_map(|part| part.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("sockperf summary without {name}: {line}"))
    };
    Ok((field("SentMessages=")?, field("ReceivedMessages=")?))
}

/// (send time in s, round trip in us) of every row of sockperf's `--full-log`, whose rows
/// read `packet, txTime(sec), rxTime(sec), rtt(usec)` between separator lines.
fn sockperf_round_trips(log: &str) -> Result<Vec<(f64, f64)>> {
    let mut rows = Vec::new();
    for line in log.lines() {
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        if cols.len() != 4 || cols[0].parse::<u64>().is_err() {
            continue; // header, summary and separator lines
        }
        let tx = cols[1].parse::<f64>();
        let rtt = cols[3].parse::<f64>();
        match (tx, rtt) {
            (Ok(tx), Ok(rtt)) if rtt >= 0.0 => rows.push((tx, rtt)),
            _ => bail!("sockperf full log: unreadable row `{line}`"),
        }
    }
    Ok(rows)
}

/// memcached client: stores one `size`-byte value, then `get`s it at `rate` over one TCP
/// connection with one request outstanding (a late answer counts as lost; ticks missed
/// while waiting are skipped, as in the TCP RPC probe).
fn memcached_client(
    ep: &Endpoints,
    size: usize,
    rate: u64,
    timeout: Duration,
    w: Window,
) -> Result<SenderSide> {
    let mut conn = TcpStream::connect_timeout(&ep.to.into(), Duration::from_secs(2))
        .context("connecting to memcached")?;
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut set = format!("set picnic 0 0 {size}\r\n").into_bytes();
    set.extend(std::iter::repeat_n(b'x', size));
    set.extend_from_slice(b"\r\n");
    conn.write_all(&set)
        .context("storing the value in memcached")?;
    let mut reply = [0u8; 8];
    conn.read_exact(&mut reply)
        .context("memcached did not answer the set")?;
    if &reply != b"STORED\r\n" {
        bail!(
            "memcached answered the set with `{}`",
            String::from_utf8_lossy(&reply).trim()
        );
    }
    // VALUE picnic 0 SIZE\r\n DATA \r\n END\r\n
    let answer_len = format!("VALUE picnic 0 {size}\r\n").len() + size + 2 + 5;
    let count = request_count(rate, &w);
    let mut book = ProbeBook::new(count, w.bins, timeout)?;
    let mut rx = vec![0u8; answer_len];
    let mut sent = 0u64;
    let mut n = 0u64;
    sleep_until(w.start);
    loop {
        let due = nth_send_time(w.start, n, rate);
        if due >= w.stop || n as usize >= count {
            break;
        }
        sleep_until(due);
        let sent_at = Instant::now();
        conn.write_all(b"get picnic\r\n")
            .context("memcached client sending")?;
        sent += 1;
        let give_up = sent_at + timeout;
        let mut filled = 0;
        while filled < answer_len && Instant::now() < give_up {
            conn.set_read_timeout(Some(
                (give_up - Instant::now()).max(Duration::from_micros(100)),
            ))?;
            match conn.read(&mut rx[filled..]) {
                Ok(0) => bail!("memcached closed the connection"),
                Ok(len) => filled += len,
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e).context("memcached client receiving"),
            }
        }
        if filled < answer_len {
            // Timed out: the rest of this answer would be read as the next one's.
            bail!("memcached did not answer within {timeout:?}; the connection is out of step");
        }
        if !rx.ends_with(b"END\r\n") {
            bail!(
                "memcached answered `{}`",
                String::from_utf8_lossy(&rx).trim()
            );
        }
        let now = Instant::now();
        book.on_answer(&w, n, (now - sent_at).as_nanos() as u64, now, answer_len);
        n += 1;
        while nth_send_time(w.start, n, rate) < Instant::now() {
            n += 1;
        }
    }
    Ok(SenderSide {
        sent,
        received: Some(book.received),
        latency: Some(book.hist),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockperf_output_is_read() {
        let stdout = "sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=1001; ReceivedMessages=1001\n\
                      sockperf: [Valid Duration] RunTime=0.549 sec; SentMessages=550; ReceivedMessages=548\n";
        assert_eq!(sockperf_counts(stdout).unwrap(), (550, 548));
        assert!(sockperf_counts("sockperf: error").is_err());
        let log = "sockperf: ---> <MIN> observation =   10.776\n\
                   ------------------------------\n\
                   packet, txTime(sec), rxTime(sec), rtt(usec)\n\
                   0, 2.401662625, 2.401721663, 59.038\n\
                   1, 2.402662628, 2.402723149, 60.521\n\
                   ------------------------------\n";
        assert_eq!(
            sockperf_round_trips(log).unwrap(),
            vec![(2.401662625, 59.038), (2.402662628, 60.521)]
        );
        assert!(sockperf_round_trips("7, x, y, z\n").is_err());
    }

    #[test]
    fn send_times_are_exact() {
        let t = Instant::now();
        assert_eq!(nth_send_time(t, 3, 1000) - t, Duration::from_millis(3));
        assert_eq!(
            nth_send_time(t, 1, 3) - t,
            Duration::from_nanos(333_333_333)
        );
    }

    #[test]
    fn probe_counts_late_and_duplicate_responses_as_lost() {
        let t0 = Instant::now();
        let w = Window {
            t0,
            start: t0,
            stop: t0 + Duration::from_secs(1),
            bins: 200,
        };
        let mut book = ProbeBook::new(3, w.bins, Duration::from_millis(10)).unwrap();
        let mut frame = [0u8; 16];
        encode_request(&mut frame, 0, 0);
        book.on_response(&w, &frame, t0 + Duration::from_micros(50));
        book.on_response(&w, &frame, t0 + Duration::from_micros(60));
        encode_request(&mut frame, 1, 0);
        book.on_response(&w, &frame, t0 + Duration::from_millis(20));
        encode_request(&mut frame, 7, 0);
        book.on_response(&w, &frame, t0 + Duration::from_micros(50));
        assert_eq!(book.received.received, 1);
        assert_eq!(book.hist.len(), 1);
        assert!((49_000..=51_000).contains(&book.hist.value_at_quantile(0.5)));
    }
}
