//! Root integration tests of the picnic switch (issue 3): two hosts in network namespaces,
//! tenants blue and red with one VM on each host, a `picnic switch` per host (isolation on)
//! joining the VM ports to the host's uplink over Geneve. They show:
//!
//! - same-tenant ICMP echo, ping, TCP and iperf3 across hosts; nothing across tenants;
//! - cross-tenant and spoofed frames (from a VM port and forged on the fabric) dropped,
//!   counted by reason, none delivered;
//! - malformed frames counted while a latency probe keeps running;
//! - a flow shaped to 10 Mb/s keeps its rate without raising the fast path's latency;
//! - feedback from a congested receiver lowers the sender's applied rate (EyeQ 3.3).
//!
//! Every test builds its own testbed (addresses from 198.18.0.0/15 only), sends bounded
//! traffic and tears everything down; tests run one at a time so timings do not mix.
//! Without root they print "skipped: needs root" and pass.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use etherparse::PacketBuilder;
use picnic_lab::dataplane::Dataplane;
use picnic_lab::picnic::PicnicSwitch;
use picnic_lab::{topology, workload};
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::plan::{Topology, VmView};
use picnic_scenario::switch::{switch_config, vni_of};
use picnic_scenario::{Mode, Scenario, WorkloadResult, BASE_PORT, BIN_MS};
use picnic_switch::config::{Config, Mac, ShapedClass};
use picnic_switch::engine::{Snapshot, VmSnapshot};
use picnic_switch::stats::DropReason;
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap, encap_headers_len, OuterHeaders};

/// One test at a time: each measures latency or rates on a shared 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// The lock serializing the tests, or None (after saying so) when not root.
fn root_or_skip() -> Option<MutexGuard<'static, ()>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root (creates network namespaces and raw packet sockets)");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Two hosts, tenants blue and red with a VM on each host; `top` holds `duration_ms` and
/// any other top-level field, `workloads` the workload tables.
fn scenario(top: &str, workloads: &str) -> Scenario {
    let text = format!(
        r#"
name = "switch-test"
hosts = ["h1", "h2"]
victim = "blue"
{top}

[[tenants]]
name = "blue"
min_mbps = 10
vms = [{{ name = "blue1", host = "h1" }}, {{ name = "blue2", host = "h2" }}]

[[tenants]]
name = "red"
min_mbps = 10
vms = [{{ name = "red1", host = "h1" }}, {{ name = "red2", host = "h2" }}]

{workloads}
"#
    );
    Scenario::parse(&text).unwrap()
}

/// A placeholder workload for tests that drive traffic themselves (a scenario needs one).
const IDLE: &str = r#"
[[workloads]]
name = "idle"
kind = "rpc"
from = "blue1"
to = "blue2"
"#;

/// A running testbed with a picnic switch per host. Dropping it stops the switches, then
/// deletes the namespaces.
struct Lab {
    scenario: Scenario,
    topo: Topology,
    switches: Vec<PicnicSwitch>,
    testbed: Testbed,
}

impl Lab {
    /// Builds the testbed and starts a switch per host (isolation on) with the generated
    /// config, after `adjust(host index, config)`.
    fn start(scenario: Scenario, adjust: impl Fn(usize, &mut Config)) -> Lab {
        let mut testbed = Testbed::new().unwrap();
        let topo = topology::build(&scenario, &mut testbed, false).unwrap();
        let mut lab = Lab {
            scenario,
            topo,
            switches: Vec::new(),
            testbed,
        };
        for host in lab.topo.hosts.clone() {
            let mut cfg = switch_config(&lab.scenario, &lab.topo, &host, true).unwrap();
            adjust(host.index, &mut cfg);
            cfg.validate().unwrap();
            let mut switch = PicnicSwitch::new(cfg, true);
            switch.setup(&host).unwrap();
            lab.switches.push(switch);
        }
        lab
    }

    fn vm(&self, name: &str) -> &VmView {
        self.topo.vm(name).unwrap()
    }

    /// The endpoint id the switches give VM `name` (carried in feedback).
    fn endpoint_id(&self, name: &str) -> u32 {
        let cfg = self.switches[0].config();
        cfg.vms.iter().find(|v| v.name == name).unwrap().id
    }

    /// The latest snapshot of host `h`'s switch (published every 100 ms).
    fn snapshot(&self, h: usize) -> Option<Snapshot> {
        self.switches[h].snapshot()
    }

    /// Runs workloads of the scenario by name.
    fn run(&self, names: &[&str]) -> Vec<WorkloadResult> {
        let wls: Vec<_> = names
            .iter()
            .map(|n| {
                self.scenario
                    .workloads
                    .iter()
                    .find(|w| w.name == *n)
                    .unwrap()
            })
            .collect();
        workload::run_all(&self.scenario, &self.topo, &wls).unwrap()
    }

    /// Stops every switch and returns their final snapshots, host order.
    fn stop(&mut self) -> Vec<Snapshot> {
        for (host, switch) in self.topo.hosts.iter().zip(&mut self.switches) {
            switch.teardown(host).unwrap();
        }
        self.switches
            .iter()
            .map(|s| {
                s.snapshot()
                    .expect("a stopped switch publishes its counters")
            })
            .collect()
    }

    /// Tears down and checks that no namespace of this testbed is left.
    fn finish(mut self) {
        let prefix = format!("{}{}-", netns::PREFIX, self.testbed.run_id());
        self.stop();
        self.testbed.teardown().unwrap();
        let left: Vec<String> = netns::list_namespaces()
            .unwrap()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Switches first: their sockets live in the namespaces the testbed deletes.
        for (host, switch) in self.topo.hosts.iter().zip(&mut self.switches) {
            let _ = switch.teardown(host);
        }
    }
}

fn vm_snap<'a>(snap: &'a Snapshot, name: &str) -> &'a VmSnapshot {
    snap.vms.iter().find(|v| v.name == name).unwrap()
}

fn mac(s: &str) -> [u8; 6] {
    s.parse::<Mac>().unwrap().0
}

fn micros(ns: u64) -> f64 {
    ns as f64 / 1e3
}

// ---------------------------------------------------------------------------------------
// Raw frames

/// Marks frames an attacker forged: none may ever arrive at a VM.
const ATTACK: &[u8] = b"picnic-itest-ATTACK-frame";
/// Marks legitimate frames sent the same way, proving the injection path delivers.
const CONTROL: &[u8] = b"picnic-itest-CONTROL-frame";
/// UDP port the forged frames go to.
const SINK_PORT: u16 = 7777;

/// An Ethernet/IPv4/UDP frame with correct checksums.
fn udp_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    dst_port: u16,
    payload: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(src_mac, dst_mac)
        .ipv4(src_ip.octets(), dst_ip.octets(), 64)
        .udp(40000, dst_port);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).unwrap();
    v
}

/// A broadcast ARP request "who has `target_ip`, tell `sender_ip`".
fn arp_request(src_mac: [u8; 6], sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&sender_ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target_ip.octets());
    f.resize(60, 0);
    f
}

/// `frame` with its destination MAC replaced.
fn with_dst(mut frame: Vec<u8>, dst: [u8; 6]) -> Vec<u8> {
    frame[..6].copy_from_slice(&dst);
    frame
}

/// `inner` in Geneve with `vni`, as sent from underlay address `src_ip` to host `to`.
fn overlay_frame(lab: &Lab, to: usize, src_ip: Ipv4Addr, vni: u32, inner: &[u8]) -> Vec<u8> {
    let host = &lab.topo.hosts[to];
    let outer = OuterHeaders {
        src_mac: mac(&lab.topo.hosts[1 - to].uplink_mac),
        dst_mac: mac(&host.uplink_mac),
        src_ip,
        dst_ip: host.underlay_ip,
        src_port: 50000,
        ttl: 64,
    };
    let geneve = GeneveRepr::ethernet(vni);
    let mut out = vec![0u8; encap_headers_len(&geneve) + inner.len()];
    let n = encap(&outer, &geneve, inner, &mut out).unwrap();
    out.truncate(n);
    out
}

/// An AF_PACKET socket bound to one interface of the calling thread's namespace.
struct RawSocket(OwnedFd);

impl RawSocket {
    /// `receive`: get every frame of the interface (with a 50 ms read timeout); otherwise
    /// send only.
    fn open(dev: &str, receive: bool) -> io::Result<RawSocket> {
        let proto = if receive {
            (libc::ETH_P_ALL as u16).to_be()
        } else {
            0
        };
        let name = std::ffi::CString::new(dev).unwrap();
        // SAFETY: plain syscalls with valid arguments; the fd is owned right away.
        unsafe {
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                proto as i32,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let sock = RawSocket(OwnedFd::from_raw_fd(fd));
            let ifindex = libc::if_nametoindex(name.as_ptr());
            if ifindex == 0 {
                return Err(io::Error::last_os_error());
            }
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex as i32;
            if libc::bind(
                fd,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if receive {
                let tv = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 50_000,
                };
                if libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as u32,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(sock)
        }
    }

    fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next frame arriving on the interface (not one it sends), or None on timeout.
    fn recv_incoming(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: buf and the address struct are valid for the lengths given.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            let n = unsafe {
                libc::recvfrom(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if sll.sll_pkttype != libc::PACKET_OUTGOING {
                return Ok(Some(n as usize));
            }
        }
    }
}

/// Sends `frames` from interface `dev` of namespace `ns`, `gap` apart.
fn inject(ns: &str, dev: &str, frames: Vec<Vec<u8>>, gap: Duration) {
    let dev = dev.to_owned();
    netns::in_netns(ns, move || -> io::Result<()> {
        let sock = RawSocket::open(&dev, false)?;
        for f in &frames {
            sock.send(f)?;
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
        }
        Ok(())
    })
    .unwrap()
    .unwrap();
}

/// Frames carrying the [`ATTACK`] and [`CONTROL`] markers seen arriving at a VM.
#[derive(Debug, Default, Clone, Copy)]
struct Sniffed {
    attack: u64,
    control: u64,
}

/// Counts marked frames arriving at `vm` until `stop` is set.
struct Sniffer(netns::NsThread<io::Result<Sniffed>>);

impl Sniffer {
    fn start(vm: &VmView, stop: Arc<AtomicBool>) -> Sniffer {
        let (ready_tx, ready_rx) = mpsc::channel();
        let dev = vm.dev.clone();
        let thread = netns::spawn_in_netns(&vm.ns, move || -> io::Result<Sniffed> {
            let sock = RawSocket::open(&dev, true)?;
            // A bound sink: arriving datagrams draw no ICMP error back to their source.
            let _sink = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, SINK_PORT))?;
            let _ = ready_tx.send(());
            let mut seen = Sniffed::default();
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                if let Some(n) = sock.recv_incoming(&mut buf)? {
                    let frame = &buf[..n];
                    let has = |m: &[u8]| frame.windows(m.len()).any(|w| w == m);
                    seen.attack += has(ATTACK) as u64;
                    seen.control += has(CONTROL) as u64;
                }
            }
            Ok(seen)
        })
        .unwrap();
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("sniffer started");
        Sniffer(thread)
    }

    fn join(self) -> Sniffed {
        self.0.join().unwrap().unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// ICMP echo, ping and TCP

/// Sends `count` ICMP echo requests from namespace `ns` to `dst` with a raw socket, each
/// waiting up to 500 ms for its reply; returns how many were answered.
fn icmp_echo(ns: &str, dst: Ipv4Addr, count: u16) -> u16 {
    netns::in_netns(ns, move || -> io::Result<u16> {
        // SAFETY: plain syscalls with valid arguments; the fd is owned right away.
        let sock = unsafe {
            let fd = libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMP,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: valid option struct and length.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        to.sin_family = libc::AF_INET as u16;
        to.sin_addr.s_addr = u32::from(dst).to_be();
        let id = (std::process::id() & 0xffff) as u16;
        let mut answered = 0;
        for seq in 0..count {
            let mut pkt = [0u8; 24];
            pkt[0] = 8; // echo request
            pkt[4..6].copy_from_slice(&id.to_be_bytes());
            pkt[6..8].copy_from_slice(&seq.to_be_bytes());
            pkt[8..].copy_from_slice(b"picnic-icmp-echo");
            let sum = internet_checksum(&pkt);
            pkt[2..4].copy_from_slice(&sum.to_be_bytes());
            // SAFETY: valid buffer and address.
            let rc = unsafe {
                libc::sendto(
                    sock.as_raw_fd(),
                    pkt.as_ptr().cast(),
                    pkt.len(),
                    0,
                    (&to as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            let deadline = Instant::now() + Duration::from_millis(500);
            let mut buf = [0u8; 1500];
            while Instant::now() < deadline {
                // SAFETY: valid buffer.
                let n =
                    unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 20 {
                    continue;
                }
                let icmp = &buf[((buf[0] & 0xf) as usize * 4)..n as usize];
                let from = Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]);
                if from == dst
                    && icmp.len() >= 8
                    && icmp[0] == 0
                    && icmp[4..6] == id.to_be_bytes()
                    && icmp[6..8] == seq.to_be_bytes()
                {
                    answered += 1;
                    break;
                }
            }
        }
        Ok(answered)
    })
    .unwrap()
    .unwrap()
}

fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Runs the `ping` tool in `ns`; returns the replies it reports.
fn ping(ns: &str, dst: Ipv4Addr, count: u32) -> u32 {
    let out = netns::exec_in(ns, "ping")
        .args([
            "-n",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            "0.05",
            "-W",
            "1",
        ])
        .arg(dst.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // "5 packets transmitted, 5 received, 0% packet loss, time 201ms"
    text.lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected ping output: {text}"))
}

/// Echoes `chunks` chunks of 16 KiB over one TCP connection from `client` to `server`;
/// returns the bytes that came back intact, or the client's error.
fn tcp_echo(client: &VmView, server: &VmView, port: u16, chunks: usize) -> io::Result<usize> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let give_up = Arc::new(AtomicBool::new(false));
    let client_done = give_up.clone();
    let srv = netns::spawn_in_netns(&server.ns, move || -> io::Result<()> {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
        listener.set_nonblocking(true)?;
        let _ = ready_tx.send(());
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        && Instant::now() < deadline
                        && !give_up.load(Ordering::Relaxed) =>
                {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = vec![0u8; 16384];
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            stream.write_all(&buf[..n])?;
        }
    })
    .unwrap();
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let addr = SocketAddr::V4(SocketAddrV4::new(server.ip, port));
    let result = netns::in_netns(&client.ns, move || -> io::Result<usize> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut echoed = 0;
        let mut back = vec![0u8; 16384];
        for i in 0..chunks {
            let chunk: Vec<u8> = (0..16384).map(|j| (i * 7 + j * 13) as u8).collect();
            s.write_all(&chunk)?;
            s.read_exact(&mut back)?;
            if back != chunk {
                return Err(io::Error::other(format!("chunk {i} came back altered")));
            }
            echoed += chunk.len();
        }
        s.shutdown(std::net::Shutdown::Write)?;
        Ok(echoed)
    })
    .unwrap();
    client_done.store(true, Ordering::Relaxed);
    let served = srv.join().unwrap();
    if result.is_ok() {
        served.unwrap();
    }
    result
}

// ---------------------------------------------------------------------------------------
// The tests

const IPERF: &str = r#"
[[workloads]]
name = "blue-iperf"
kind = "iperf3"
from = "blue1"
to = "blue2"
stop_ms = 2000

[[workloads]]
name = "red-iperf"
kind = "iperf3"
from = "red1"
to = "red2"
stop_ms = 2000
"#;

#[test]
fn same_tenant_ping_tcp_and_iperf3_cross_hosts_other_tenants_unreachable() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let lab = Lab::start(scenario("duration_ms = 2000", IPERF), |_, _| {});
    let have_ping = netns::have_tool("ping");
    for (a, b) in [("blue1", "blue2"), ("red1", "red2")] {
        let (a, b) = (lab.vm(a), lab.vm(b));
        assert_eq!(
            icmp_echo(&a.ns, b.ip, 5),
            5,
            "ICMP echo {} -> {}",
            a.name,
            b.name
        );
        if have_ping {
            assert_eq!(ping(&a.ns, b.ip, 5), 5, "ping {} -> {}", a.name, b.name);
        }
        let echoed = tcp_echo(a, b, 9000, 64).unwrap();
        assert_eq!(echoed, 64 * 16384);
        println!(
            "{} -> {}: 5/5 ICMP echo{}, {} KiB TCP echoed intact",
            a.name,
            b.name,
            if have_ping { ", ping 5/5" } else { "" },
            echoed / 1024
        );
    }
    if !have_ping {
        println!("ping part skipped: `ping` is not installed (Debian package iputils-ping)");
    }
    // Across tenants there is no path, not even ARP: nothing answers.
    for (a, b) in [("blue1", "red2"), ("red1", "blue2"), ("blue1", "red1")] {
        let (a, b) = (lab.vm(a), lab.vm(b));
        assert_eq!(
            icmp_echo(&a.ns, b.ip, 2),
            0,
            "{} reached {}",
            a.name,
            b.name
        );
        assert!(
            tcp_echo(a, b, 9001, 1).is_err(),
            "TCP {} -> {} connected",
            a.name,
            b.name
        );
    }
    if netns::have_tool("iperf3") {
        // Both tenants at once, as in the issue's "done when".
        let r = lab.run(&["blue-iperf", "red-iperf"]);
        for w in &r {
            println!(
                "iperf3 {} (iperf3 -c <vm> -t 2.0 -P 1 -J, isolation on): {:.1} Mb/s",
                w.name,
                w.throughput_bps() / 1e6
            );
            assert!(
                w.throughput_bps() > 1e6,
                "{} moved {} bytes",
                w.name,
                w.received_bytes
            );
        }
    } else {
        println!("iperf3 part skipped: `iperf3` is not installed (Debian package iperf3)");
    }
    lab.finish();
}

#[test]
fn cross_tenant_and_spoofed_frames_are_dropped_counted_and_never_delivered() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let mut lab = Lab::start(scenario("duration_ms = 1000", IDLE), |_, _| {});
    let (blue1, blue2, red1, red2) = (
        lab.vm("blue1").clone(),
        lab.vm("blue2").clone(),
        lab.vm("red1").clone(),
        lab.vm("red2").clone(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let sniffers: Vec<(String, Sniffer)> = [&blue1, &blue2, &red2]
        .into_iter()
        .map(|vm| (vm.name.clone(), Sniffer::start(vm, stop.clone())))
        .collect();

    // From red1's own port.
    const N: usize = 10;
    let (r1mac, b1mac) = (mac(&red1.mac), mac(&blue1.mac));
    let to = |dst: &VmView, src_mac, src_ip, payload: &[u8]| {
        udp_frame(src_mac, mac(&dst.mac), src_ip, dst.ip, SINK_PORT, payload)
    };
    let mut frames = Vec::new();
    for _ in 0..N {
        // Cross-tenant, to a VM on the other host and to one on the same host.
        frames.push(to(&blue2, r1mac, red1.ip, ATTACK));
        frames.push(to(&blue1, r1mac, red1.ip, ATTACK));
        // Spoofed source MAC (blue1's), then spoofed source IP, to red1's own tenant.
        frames.push(to(&red2, b1mac, red1.ip, ATTACK));
        frames.push(to(&red2, r1mac, blue2.ip, ATTACK));
        // Broadcast data: not forwarded.
        frames.push(with_dst(to(&red2, r1mac, red1.ip, ATTACK), [0xff; 6]));
    }
    // ARP: claiming blue1's address, and asking for a VM of another tenant.
    frames.push(arp_request(r1mac, blue1.ip, red2.ip));
    frames.push(arp_request(r1mac, red1.ip, blue2.ip));
    // The same path delivers well-formed same-tenant frames.
    for _ in 0..5 {
        frames.push(to(&red2, r1mac, red1.ip, CONTROL));
    }
    inject(&red1.ns, &red1.dev, frames, Duration::from_micros(200));

    // Forged on the fabric towards host 2: red's VNI to a blue VM, an unknown VNI, blue's
    // VNI from an underlay address that is no host; and a well-formed control frame.
    let h1_ip = lab.topo.hosts[0].underlay_ip;
    let stranger = Ipv4Addr::new(198, 19, 0, 99);
    let inner = |payload: &[u8]| to(&blue2, b1mac, blue1.ip, payload);
    let mut frames = Vec::new();
    for _ in 0..N {
        frames.push(overlay_frame(&lab, 1, h1_ip, vni_of(1), &inner(ATTACK)));
        frames.push(overlay_frame(&lab, 1, h1_ip, 999, &inner(ATTACK)));
        frames.push(overlay_frame(&lab, 1, stranger, vni_of(0), &inner(ATTACK)));
    }
    for _ in 0..5 {
        frames.push(overlay_frame(&lab, 1, h1_ip, vni_of(0), &inner(CONTROL)));
    }
    let fabric_port = lab.topo.hosts[1].fabric_port.clone();
    inject(
        &lab.topo.fabric_ns,
        &fabric_port,
        frames,
        Duration::from_micros(200),
    );

    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<(String, Sniffed)> = sniffers
        .into_iter()
        .map(|(name, s)| (name, s.join()))
        .collect();
    let snaps = lab.stop();
    println!("arrived at the VMs: {seen:?}");
    for (name, s) in &seen {
        assert_eq!(s.attack, 0, "{name} received forged frames");
    }
    let control = |n: &str| seen.iter().find(|(name, _)| name == n).unwrap().1.control;
    assert_eq!(control("red2"), 5, "control frames from red1's port");
    assert_eq!(control("blue2"), 5, "control frames forged on the fabric");

    let d = &vm_snap(&snaps[0], "red1").counters.drops;
    println!("h1 red1 drops: {:?}", d.iter().collect::<Vec<_>>());
    assert_eq!(d.get(DropReason::UnknownDestination), 2 * N as u64 + 1);
    assert_eq!(d.get(DropReason::Spoofed), 2 * N as u64 + 1);
    assert_eq!(d.get(DropReason::Multicast), N as u64);
    let d = &snaps[1].switch.drops;
    println!("h2 switch drops: {:?}", d.iter().collect::<Vec<_>>());
    // Red's VNI with blue1's source: no red VM lives on host 1 with that MAC, so the
    // inner-source check drops it before the destination lookup.
    assert_eq!(d.get(DropReason::Spoofed), N as u64);
    assert_eq!(d.get(DropReason::UnknownDestination), 0);
    assert_eq!(d.get(DropReason::UnknownVni), N as u64);
    assert_eq!(d.get(DropReason::UnknownHost), N as u64);
    // Nothing else reached the blue VMs through the switches.
    assert_eq!(vm_snap(&snaps[0], "blue1").counters.rx_packets, 0);
    assert_eq!(vm_snap(&snaps[1], "blue2").counters.rx_packets, 5);
    lab.finish();
}

const PROBE: &str = r#"
[[workloads]]
name = "probe"
kind = "rpc"
from = "blue1"
to = "blue2"
rate_pps = 1000
timeout_ms = 200
"#;

#[test]
fn malformed_frames_are_counted_while_traffic_continues() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let mut lab = Lab::start(scenario("duration_ms = 1500", PROBE), |_, _| {});
    let blue1 = lab.vm("blue1").clone();
    let b1mac = mac(&blue1.mac);
    let good = udp_frame(b1mac, [2, 0, 0, 0, 0, 9], blue1.ip, blue1.ip, 9, b"x");
    // From a VM port: an IPv4 header cut short, and one with a bad header length.
    let mut from_vm = Vec::new();
    const N: usize = 50;
    for _ in 0..N {
        from_vm.push(good[..24].to_vec());
        let mut bad_ihl = good.clone();
        bad_ihl[14] = 0x42;
        from_vm.push(bad_ihl);
    }
    // On the uplink: Geneve of an unknown version, a truncated outer IPv4 header, and a
    // plain UDP packet that is no overlay traffic at all.
    let h1_ip = lab.topo.hosts[0].underlay_ip;
    let blue2 = lab.vm("blue2").clone();
    let inner = udp_frame(b1mac, mac(&blue2.mac), blue1.ip, blue2.ip, 9, b"x");
    let geneve = overlay_frame(&lab, 1, h1_ip, vni_of(0), &inner);
    let mut from_fabric = Vec::new();
    for _ in 0..N {
        let mut bad_version = geneve.clone();
        bad_version[42] |= 0x40;
        from_fabric.push(bad_version);
        from_fabric.push(geneve[..20].to_vec());
        let mut not_overlay = geneve.clone();
        not_overlay[36..38].copy_from_slice(&9999u16.to_be_bytes());
        from_fabric.push(not_overlay);
    }

    let scenario = lab.scenario.clone();
    let topo = lab.topo.clone();
    let probe = std::thread::spawn(move || {
        let wl = &scenario.workloads[0];
        workload::run_all(&scenario, &topo, &[wl])
            .unwrap()
            .remove(0)
    });
    std::thread::sleep(Duration::from_millis(300));
    let fabric_ns = lab.topo.fabric_ns.clone();
    let fabric_port = lab.topo.hosts[1].fabric_port.clone();
    let gap = Duration::from_millis(5);
    let fab = std::thread::spawn(move || inject(&fabric_ns, &fabric_port, from_fabric, gap));
    inject(&blue1.ns, &blue1.dev, from_vm, gap);
    fab.join().unwrap();
    let r = probe.join().unwrap();
    let snaps = lab.stop();

    let h = r.latency.as_ref().unwrap();
    println!(
        "probe during malformed frames: {} sent, {} answered, p50 {:.0} us, p99 {:.0} us",
        r.sent,
        r.received,
        micros(h.value_at_quantile(0.5)),
        micros(h.value_at_quantile(0.99))
    );
    assert!(r.sent >= 1400, "probe sent {}", r.sent);
    assert!(
        r.received as f64 >= 0.98 * r.sent as f64,
        "probe lost {} of {}",
        r.sent - r.received,
        r.sent
    );
    let d = &vm_snap(&snaps[0], "blue1").counters.drops;
    assert_eq!(d.get(DropReason::Malformed), 2 * N as u64, "h1 blue1");
    let d = &snaps[1].switch.drops;
    println!("h2 switch drops: {:?}", d.iter().collect::<Vec<_>>());
    assert_eq!(d.get(DropReason::Malformed), 2 * N as u64, "h2 uplink");
    assert_eq!(d.get(DropReason::NotOverlay), N as u64, "h2 uplink");
    lab.finish();
}

/// Rate the shaped class is held to, Mb/s.
const SHAPED_MBPS: f64 = 10.0;
/// UDP payload of the shaped flow.
const SHAPED_SIZE: usize = 1200;

#[test]
fn shaped_flow_keeps_its_rate_without_raising_fast_path_latency() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    // The flood offers ~4x the shaped rate; the probe shares the VM's port and the path.
    let flood = format!(
        r#"{PROBE}
[[workloads]]
name = "bulk"
kind = "udp_flood"
from = "blue1"
to = "blue2"
size = {SHAPED_SIZE}
rate_pps = 4000
"#
    );
    let mut lab = Lab::start(scenario("duration_ms = 1500", &flood), |h, cfg| {
        if h == 0 {
            let blue1 = cfg.vms.iter_mut().find(|v| v.name == "blue1").unwrap();
            blue1.shaped.push(ShapedClass {
                dst_ip: None,
                protocol: Some(17),
                // Workload i listens on BASE_PORT + i.
                dst_port: Some(BASE_PORT + 1),
                rate_mbps: SHAPED_MBPS,
            });
        }
    });
    // Latency on this shared machine has outliers of its own: a second measurement is
    // taken before a rise is believed (the bound holds in one of two paired runs).
    let q = |h: &hdrhistogram::Histogram<u64>, p| h.value_at_quantile(p);
    let mut attempt = 0;
    let bulk = loop {
        attempt += 1;
        let alone = lab.run(&["probe"]).remove(0);
        let mut both = lab.run(&["probe", "bulk"]);
        let bulk = both.pop().unwrap();
        let probe = both.pop().unwrap();
        let (a, b) = (alone.latency.unwrap(), probe.latency.as_ref().unwrap());
        println!(
            "attempt {attempt}: fast path alone: p50 {:.0} us p99 {:.0} us; beside the shaped flow: p50 {:.0} us p99 {:.0} us, {} of {} answered",
            micros(q(&a, 0.5)),
            micros(q(&a, 0.99)),
            micros(q(b, 0.5)),
            micros(q(b, 0.99)),
            probe.received,
            probe.sent
        );
        let answered = probe.received as f64 >= 0.98 * probe.sent as f64;
        let within = |p| q(b, p) <= 3 * q(&a, p) + 1_000_000;
        if answered && within(0.5) && within(0.99) {
            break bulk;
        }
        assert!(
            attempt < 2,
            "fast path suffered beside the shaped flow: {} of {} answered, p50 {:.0} -> {:.0} us, p99 {:.0} -> {:.0} us",
            probe.received,
            probe.sent,
            micros(q(&a, 0.5)),
            micros(q(b, 0.5)),
            micros(q(&a, 0.99)),
            micros(q(b, 0.99))
        );
    };
    let snaps = lab.stop();

    // Delivered rate in steady state (after the first 300 ms, before the stop), counted
    // in the bytes the shaper meters: the frame plus its encapsulation.
    let wire_per_datagram = (SHAPED_SIZE + 42 + encap_headers_len(&GeneveRepr::ethernet(1))) as f64;
    let (from, to) = (300 / BIN_MS as usize, 1500 / BIN_MS as usize);
    let payload: u64 = bulk.series[from..to].iter().sum();
    let secs = (to - from) as f64 * BIN_MS as f64 / 1e3;
    let mbps = payload as f64 / SHAPED_SIZE as f64 * wire_per_datagram * 8.0 / secs / 1e6;
    println!(
        "shaped flow: offered {:.1} Mb/s of payload, delivered {mbps:.2} Mb/s on the wire (shaped to {SHAPED_MBPS})",
        bulk.sent as f64 * SHAPED_SIZE as f64 * 8.0 / 1.5 / 1e6
    );
    assert!(
        (mbps - SHAPED_MBPS).abs() <= 0.1 * SHAPED_MBPS,
        "shaped flow delivered {mbps:.2} Mb/s"
    );
    let d = &vm_snap(&snaps[0], "blue1").counters.drops;
    assert!(
        d.get(DropReason::ShapedQueueFull) > 0,
        "the excess is dropped in the class's own queue"
    );
    assert_eq!(d.get(DropReason::EgressQueueFull), 0);
    lab.finish();
}

/// Access link of every host in the feedback test, Mb/s.
const LINK_MBPS: u64 = 20;

#[test]
fn feedback_from_a_congested_receiver_lowers_the_senders_rate() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    // ~64 Mb/s of payload at a receiver whose access link carries 20.
    let blast = r#"
[[workloads]]
name = "blast"
kind = "udp_flood"
from = "blue1"
to = "blue2"
size = 1000
rate_pps = 8000
"#;
    let top = format!("duration_ms = 1500\naccess_link_mbps = {LINK_MBPS}");
    let mut lab = Lab::start(scenario(&top, blast), |h, cfg| {
        if h == 0 {
            // Host 1's link towards the fabric is not shaped in the testbed: let it send
            // as fast as it likes, so only feedback can slow it down.
            cfg.uplink.capacity_mbps = Some(1000);
        }
    });
    let blue2_id = lab.endpoint_id("blue2");
    let scenario = lab.scenario.clone();
    let topo = lab.topo.clone();
    let blast = std::thread::spawn(move || {
        let wl = &scenario.workloads[0];
        workload::run_all(&scenario, &topo, &[wl])
            .unwrap()
            .remove(0)
    });
    // Watch host 1's limiter towards blue2 while the blast runs.
    let mut limits = Vec::new();
    while !blast.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(snap) = lab.snapshot(0) {
            let applied = vm_snap(&snap, "blue1").applied_limits.clone();
            if let Some((_, bps)) = applied.iter().find(|(d, _)| *d == blue2_id) {
                limits.push(*bps);
            }
        }
    }
    let r = blast.join().unwrap();
    let snaps = lab.stop();
    println!(
        "blast: {:.1} Mb/s offered, {:.1} Mb/s delivered; h1 limits towards blue2 (Mb/s): {:?}; feedback sent by h2 {}, received by h1 {}",
        r.sent as f64 * 8000.0 / 1.5 / 1e6,
        r.throughput_bps() / 1e6,
        limits.iter().map(|b| b / 1_000_000).collect::<Vec<_>>(),
        snaps[1].switch.feedback_sent,
        snaps[0].switch.feedback_received
    );
    assert!(snaps[1].switch.feedback_sent > 0, "h2 sent no feedback");
    assert!(snaps[0].switch.feedback_received > 0, "h1 got no feedback");
    let lowest = limits.iter().min().copied();
    assert!(
        lowest.is_some_and(|l| l < LINK_MBPS * 1_000_000),
        "no limit below the {LINK_MBPS} Mb/s link applied at the sender: {limits:?}"
    );
    // The excess now waits (and overflows) at the sender, not in the fabric.
    let d = &vm_snap(&snaps[0], "blue1").counters.drops;
    assert!(d.get(DropReason::ShapedQueueFull) > 0);
    lab.finish();
}

#[test]
fn tap_vms_carry_tcp_rpc_through_picnic_and_veth_over_bridges() {
    let Some(_serial) = root_or_skip() else {
        return;
    };
    let text = r#"
name = "tap-test"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "blue"

[[tenants]]
name = "blue"
min_mbps = 10
vms = [{ name = "blue1", host = "h1", tap = true }, { name = "blue2", host = "h2" }]

[[workloads]]
name = "probe"
kind = "rpc"
protocol = "tcp"
from = "blue1"
to = "blue2"
rate_pps = 500
"#;
    let scenario = Scenario::parse(text).unwrap();
    let opts = picnic_lab::RunOptions {
        modes: vec![Mode::picnic(), Mode::bridge()],
        progress: false,
        ..Default::default()
    };
    let out = picnic_lab::run_loaded(&scenario, &opts).unwrap();
    for mode in ["picnic", "bridge"] {
        let blue = &out.summary.modes[mode]["blue"];
        assert_eq!(blue.loss, 0.0, "{mode}\n{}", out.table);
        assert!(
            blue.p99_us.is_some_and(|p| p > 0.0),
            "{mode}\n{}",
            out.table
        );
    }
    // The TAP went into the VM's namespace and away with it.
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains("v-blue1"));
}
