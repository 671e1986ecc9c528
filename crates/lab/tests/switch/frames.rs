//! Frames and tools the tests send and watch with: raw sockets, forged frames, sniffers,
//! ICMP, ping and a TCP echo.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::lab::*;
use etherparse::PacketBuilder;
use picnic_netns::{self as netns};
use picnic_scenario::plan::VmView;
use picnic_wire::geneve::GeneveRepr;
use picnic_wire::overlay::{encap, encap_headers_len, OuterHeaders};

/// Marks frames an attacker forged: none may ever arrive at a VM.
pub(crate) const ATTACK: &[u8] = b"picnic-itest-ATTACK-frame";
/// Marks legitimate frames sent the same way, proving the injection path delivers.
pub(crate) const CONTROL: &[u8] = b"picnic-itest-CONTROL-frame";
/// UDP port the forged frames go to.
pub(crate) const SINK_PORT: u16 = 7777;

/// An Ethernet/IPv4/UDP frame with correct checksums.
pub(crate) fn udp_frame(
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
pub(crate) fn arp_request(src_mac: [u8; 6], sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Vec<u8> {
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
pub(crate) fn with_dst(mut frame: Vec<u8>, dst: [u8; 6]) -> Vec<u8> {
    frame[..6].copy_from_slice(&dst);
    frame
}

/// `inner` in Geneve with `vni`, as sent from underlay address `src_ip` to host `to`.
pub(crate) fn overlay_frame(
    lab: &Lab,
    to: usize,
    src_ip: Ipv4Addr,
    vni: u32,
    inner: &[u8],
) -> Vec<u8> {
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
pub(crate) struct RawSocket(OwnedFd);

impl RawSocket {
    /// `receive`: get every frame of the interface (with a 50 ms read timeout); otherwise
    /// send only.
    pub(crate) fn open(dev: &str, receive: bool) -> io::Result<RawSocket> {
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

    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next frame arriving on the interface (not one it sends), or None on timeout.
    pub(crate) fn recv_incoming(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
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
pub(crate) fn inject(ns: &str, dev: &str, frames: Vec<Vec<u8>>, gap: Duration) {
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
pub(crate) struct Sniffed {
    pub(crate) attack: u64,
    pub(crate) control: u64,
}

/// Counts marked frames arriving at `vm` until `stop` is set.
pub(crate) struct Sniffer(netns::NsThread<io::Result<Sniffed>>);

impl Sniffer {
    pub(crate) fn start(vm: &VmView, stop: Arc<AtomicBool>) -> Sniffer {
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

    pub(crate) fn join(self) -> Sniffed {
        self.0.join().unwrap().unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// ICMP echo, ping and TCP

/// Sends `count` ICMP echo requests from namespace `ns` to `dst` with a raw socket, each
/// waiting up to 500 ms for its reply; returns how many were answered.
pub(crate) fn icmp_echo(ns: &str, dst: Ipv4Addr, count: u16) -> u16 {
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

pub(crate) fn internet_checksum(data: &[u8]) -> u16 {
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
pub(crate) fn ping(ns: &str, dst: Ipv4Addr, count: u32) -> u32 {
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
pub(crate) fn tcp_echo(
    client: &VmView,
    server: &VmView,
    port: u16,
    chunks: usize,
) -> io::Result<usize> {
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
