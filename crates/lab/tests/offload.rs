//! Root tests of VM transmit offloads through a picnic switch pair (issue 13, "Offloads"):
//! two hosts in network namespaces, tenant blue with veth VMs (AF_PACKET ports) and tenant
//! red with a TAP VM on h1, every VM with the Linux default offloads (transmit checksum
//! offload and TSO on, nothing changed inside the VM). They show:
//!
//! - checksum-partial UDP and TCP from a VM arrive with correct checksums: the receiving
//!   stack delivers every datagram (a UDP_SEGMENT send as its datagrams) and counts no
//!   `InCsumErrors`; the sending switch's port counted the partial checksums it completed;
//! - a bulk TCP transfer completes intact; the sending port segmented TSO super-frames
//!   (`rx_gso_frames`, `rx_gso_segments` in /stats); the goodput is printed beside a run
//!   with `ethtool -K eth0 tx off` in the sender (the old workaround) for docs/BENCHMARKS.md.
//!
//! Addresses are the lab's (198.18.0.0/15). Without root the tests print why they skip.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use picnic_lab::dataplane::Dataplane;
use picnic_lab::picnic::PicnicSwitch;
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::plan::{Topology, VmView};
use picnic_scenario::switch::switch_config;
use picnic_scenario::Scenario;
use picnic_switch::port::PortStats;

/// One test at a time: the transfer's rate is printed.
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether we are root; says why the test skips when not.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root (creates network namespaces, veths, TAPs, raw sockets)");
    }
    root
}

const SCENARIO: &str = r#"
name = "offload-test"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "blue"
access_link_mbps = 10000

[[tenants]]
name = "blue"
min_mbps = 10
vms = [{ name = "blue1", host = "h1" }, { name = "blue2", host = "h2" }]

[[tenants]]
name = "red"
min_mbps = 10
vms = [{ name = "red1", host = "h1", tap = true }, { name = "red2", host = "h2" }]

[[workloads]]
name = "idle"
kind = "rpc"
from = "blue1"
to = "blue2"
"#;

/// A testbed with a picnic switch per host (isolation on); TAP VMs attached.
struct Lab {
    topo: Topology,
    switches: Vec<PicnicSwitch>,
    _testbed: Testbed,
}

impl Lab {
    fn start() -> Lab {
        let scenario = Scenario::parse(SCENARIO).unwrap();
        let mut testbed = Testbed::new().unwrap();
        let topo = picnic_lab::topology::build(&scenario, &mut testbed, true).unwrap();
        let mut switches = Vec::new();
        for host in &topo.hosts {
            let mut cfg = switch_config(&scenario, &topo, host, true).unwrap();
            // The engines' ports complete the offloads here: on the kernel fast path the
            // frames keep their offload state to the receiving stack (docs/switch.md "Two
            // paths"; the fastpath and guest root tests cover it).
            cfg.fastpath.kernel = false;
            let mut switch = PicnicSwitch::new(cfg, true);
            switch.setup(host).unwrap();
            switches.push(switch);
        }
        picnic_lab::topology::attach_taps(&topo).unwrap();
        Lab {
            topo,
            switches,
            _testbed: testbed,
        }
    }

    fn vm(&self, name: &str) -> &VmView {
        self.topo.vm(name).unwrap()
    }

    /// The latest counters of VM `name`'s port on its host's switch.
    fn port(&self, name: &str) -> PortStats {
        let vm = self.vm(name);
        let h = self
            .topo
            .hosts
            .iter()
            .position(|h| h.name == vm.host)
            .unwrap();
        // Published every 100 ms: wait for a publication after the traffic.
        std::thread::sleep(Duration::from_millis(250));
        self.switches[h]
            .ports()
            .into_iter()
            .find(|p| p.name == vm.host_port)
            .unwrap_or_else(|| panic!("no port {}", vm.host_port))
            .stats
    }
}

impl Lab {
    /// Frames of VM `name` its host's switch dropped so far (any reason).
    fn drops(&self, name: &str) -> u64 {
        let vm = self.vm(name);
        let h = self
            .topo
            .hosts
            .iter()
            .position(|h| h.name == vm.host)
            .unwrap();
        let snap = self.switches[h].snapshot().unwrap();
        let v = snap.vms.iter().find(|v| v.name == name).unwrap();
        v.counters.drops.total()
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

/// Counter `name` of protocol `proto` ("Tcp:", "Udp:") in namespace `ns`'s /proc/net/snmp.
fn snmp(ns: &str, proto: &'static str, name: &'static str) -> u64 {
    netns::in_netns(ns, move || {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
        let mut lines = snmp.lines().filter(|l| l.starts_with(proto));
        let names = lines.next().unwrap().split_whitespace();
        let values = lines.next().unwrap().split_whitespace();
        names
            .zip(values)
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.parse().unwrap())
            .unwrap()
    })
    .unwrap()
}

/// `(TcpInCsumErrors, UdpInCsumErrors)` of namespace `ns`.
fn csum_errors(ns: &str) -> (u64, u64) {
    (
        snmp(ns, "Tcp:", "InCsumErrors"),
        snmp(ns, "Udp:", "InCsumErrors"),
    )
}

/// The offloads of `vm`'s interface as ethtool shows them (empty without ethtool).
fn features(vm: &VmView) -> String {
    netns::exec_in(&vm.ns, "ethtool")
        .args(["-k", &vm.dev])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Sends `bytes` over one TCP connection from `client` to `server`; returns the seconds
/// the sender took (write, shutdown, server's close) and whether all arrived intact.
fn tcp_bulk(client: &VmView, server: &VmView, port: u16, bytes: usize) -> (f64, bool) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = netns::spawn_in_netns(&server.ns, move || {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
        listener.set_nonblocking(true)?;
        let _ = ready_tx.send(());
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut conn = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        };
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut buf = vec![0u8; 1 << 16];
        let (mut got, mut intact) = (0usize, true);
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok::<_, std::io::Error>(intact && got == bytes);
            }
            intact &= buf[..n]
                .iter()
                .enumerate()
                .all(|(i, &x)| x == pattern(got + i));
            got += n;
        }
    })
    .unwrap();
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let addr = SocketAddrV4::new(server.ip, port);
    let secs = netns::in_netns(&client.ns, move || {
        let mut conn = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let data: Vec<u8> = (0..bytes).map(pattern).collect();
        let start = Instant::now();
        conn.write_all(&data).unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).unwrap();
        start.elapsed().as_secs_f64()
    })
    .unwrap();
    let intact = srv.join().unwrap().unwrap();
    (secs, intact)
}

#[test]
fn checksum_partial_udp_and_tcp_from_vms_arrive_with_correct_checksums() {
    if !is_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::start();
    for (from, to) in [("blue1", "blue2"), ("red1", "red2")] {
        let (a, b) = (lab.vm(from), lab.vm(to));
        let f = features(a);
        assert!(
            f.is_empty() || f.contains("tx-checksumming: on"),
            "{from}: offloads at the default:\n{f}"
        );
        let errors_before = csum_errors(&b.ns);
        let port_before = lab.port(from);
        // 20 datagrams, then one send of 3 x 1000 bytes with UDP_SEGMENT (USO: one UDP_L4
        // super-frame where the device takes it); the receiving kernel drops any datagram
        // with a bad checksum.
        let dst = SocketAddrV4::new(b.ip, 7000);
        let rx = netns::spawn_in_netns(&b.ns, move || {
            let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7000)).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut buf = [0u8; 2048];
            let mut got = 0;
            let mut sizes = Vec::new();
            while got < 23 {
                match sock.recv(&mut buf) {
                    Ok(n) => sizes.push(n),
                    Err(_) => break,
                }
                got += 1;
            }
            sizes
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        netns::in_netns(&a.ns, move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            for i in 0..20u8 {
                sock.send_to(&[i; 1000], dst).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            let gso_size: libc::c_int = 1000;
            // SAFETY: UDP_SEGMENT reads one int, which `gso_size` is.
            let ret = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_UDP,
                    libc::UDP_SEGMENT,
                    (&gso_size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(ret, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
            sock.send_to(&[7u8; 3000], dst).unwrap();
        })
        .unwrap();
        let sizes = rx.join().unwrap();
        let datagrams = sizes.len();
        let (_, intact) = tcp_bulk(a, b, 7001, 64 << 10);
        let port = lab.port(from);
        let completed = port.rx_csum_partial - port_before.rx_csum_partial;
        let uso = port.rx_gso_frames - port_before.rx_gso_frames;
        println!(
            "{from} -> {to}: {datagrams}/23 datagrams, 64 KiB TCP intact {intact}, {completed} \
             partial checksums completed and {uso} super-frames segmented by {from}'s port"
        );
        assert_eq!(datagrams, 23, "{from} -> {to}: every datagram delivered");
        assert!(
            sizes.iter().all(|&n| n == 1000),
            "{from} -> {to}: the USO send arrived as 1000-byte datagrams: {sizes:?}"
        );
        assert!(intact, "{from} -> {to}: TCP intact");
        assert_eq!(
            csum_errors(&b.ns),
            errors_before,
            "{to}: no TcpInCsumErrors/UdpInCsumErrors"
        );
        assert!(
            completed >= 20,
            "{from}: the datagrams arrived partial and were completed ({port:?})"
        );
        assert_eq!(port.rx_offload_errors, 0);
    }
}

/// Bytes of the bulk transfer.
const BULK: usize = 32 << 20;

#[test]
fn tcp_transfer_with_default_offloads_completes_and_is_segmented_by_the_switch() {
    if !is_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::start();
    let mut lines = Vec::new();
    for (from, to, port) in [("blue1", "blue2", 7100), ("red1", "red2", 7200)] {
        let (a, b) = (lab.vm(from), lab.vm(to));
        let before = lab.port(from);
        let run = |port| {
            let (drops, rexmit) = (
                lab.drops(from) + lab.drops(to),
                snmp(&a.ns, "Tcp:", "RetransSegs"),
            );
            let (secs, intact) = tcp_bulk(a, b, port, BULK);
            let mbps = BULK as f64 * 8.0 / secs / 1e6;
            let lost = lab.drops(from) + lab.drops(to) - drops;
            let rexmit = snmp(&a.ns, "Tcp:", "RetransSegs") - rexmit;
            (mbps, intact, lost, rexmit)
        };
        let (on_mbps, on_intact, on_lost, on_rexmit) = run(port);
        let after = lab.port(from);
        assert!(on_intact, "{from} -> {to}: 32 MiB intact with offloads on");
        let (frames, segments) = (
            after.rx_gso_frames - before.rx_gso_frames,
            after.rx_gso_segments - before.rx_gso_segments,
        );
        assert!(
            frames > 0,
            "{from}: TSO super-frames arrived and were segmented"
        );
        assert!(
            segments > frames,
            "{from}: each super-frame made several segments ({frames} -> {segments})"
        );
        assert_eq!(after.rx_offload_errors, 0);
        // The old workaround, for comparison: checksum offload (and with it TSO) off.
        netns::tx_offload_off(&a.ns, &a.dev).unwrap();
        let (off_mbps, off_intact, off_lost, off_rexmit) = run(port + 1);
        assert!(off_intact, "{from} -> {to}: intact with tx off");
        lines.push(format!(
            "{from} -> {to} ({}): offloads on {on_mbps:.0} Mb/s ({frames} super-frames -> \
             {segments} segments, {on_lost} dropped by the switches, {on_rexmit} retransmitted); \
             tx off {off_mbps:.0} Mb/s ({off_lost} dropped, {off_rexmit} retransmitted)",
            if a.tap { "TAP" } else { "veth" },
        ));
    }
    for l in lines {
        println!("{l}");
    }
}
