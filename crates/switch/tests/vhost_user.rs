//! The vhost-user port against a VMM played by the test (rust-vmm's frontend side of the
//! protocol, the guest's memory a memfd the test writes its rings into, as a guest driver
//! would): frames the guest posts on its transmit ring reach the switch and their descriptors
//! come back used; a chain pointing outside the guest's memory is handed back and counted,
//! never followed; a port the switch does not read leaves the guest's descriptors in its
//! ring (backpressure); frames for a guest with no receive buffer wait, and go into the
//! first buffer it posts, after a virtio-net header; a second VMM connects after the first
//! went. No root needed.

mod common;

use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{Port, VhostUserPort};
use vhost::vhost_user::Frontend;
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const MEM_SIZE: u64 = 0x10_0000;
const QUEUE_SIZE: u16 = 16;
/// Ring layout in guest memory: (descriptor table, available ring, used ring) per queue.
const RX_RING: (u64, u64, u64) = (0x0000, 0x1000, 0x2000);
const TX_RING: (u64, u64, u64) = (0x3000, 0x4000, 0x5000);
const HDR_LEN: usize = 12;
const VRING_DESC_F_WRITE: u16 = 2;
const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VIRTIO_NET_F_MQ: u64 = 1 << 22;

/// Queue `q`'s ring layout: pair k's receive queue is 2k, its transmit queue 2k + 1.
fn ring(q: usize) -> (u64, u64, u64) {
    let base = q as u64 * 0x3000;
    (base, base + 0x1000, base + 0x2000)
}

/// The VMM's side: the connection, the guest's memory, each queue's kick and call.
struct Vmm {
    /// Kept open: dropping it is the VMM going away.
    _connection: Frontend,
    mem: GuestMemoryMmap,
    kicks: Vec<EventFd>,
    calls: Vec<EventFd>,
}

impl Vmm {
    fn connect(socket: &Path) -> Vmm {
        Vmm::connect_pairs(socket, 1)
    }

    /// Connects with `pairs` queue pairs (more than one: `VIRTIO_NET_F_MQ` acknowledged).
    fn connect_pairs(socket: &Path, pairs: usize) -> Vmm {
        let frontend = Frontend::connect(socket, 2 * pairs as u64).expect("connect to the port");
        // SAFETY: memfd_create takes a valid C string; a non-negative return is ours.
        let fd = unsafe { libc::memfd_create(c"picnic-guest".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(MEM_SIZE).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            MEM_SIZE as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        let host = mem.get_host_address(GuestAddress(0)).unwrap() as u64;
        let region =
            VhostUserMemoryRegionInfo::from_guest_region(mem.find_region(GuestAddress(0)).unwrap())
                .unwrap();

        frontend.set_owner().unwrap();
        let offered = frontend.get_features().unwrap();
        assert_ne!(offered & VIRTIO_F_VERSION_1, 0, "VERSION_1 offered");
        let mq = if pairs > 1 { VIRTIO_NET_F_MQ } else { 0 };
        assert_eq!(offered & mq, mq, "MQ offered");
        // Without PROTOCOL_FEATURES the rings run once the features are set.
        frontend.set_features(VIRTIO_F_VERSION_1 | mq).unwrap();
        frontend.set_mem_table(&[region]).unwrap();
        let kicks: Vec<_> = (0..2 * pairs).map(|_| EventFd::new(0).unwrap()).collect();
        let calls: Vec<_> = (0..2 * pairs)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        for (q, (desc, avail, used)) in (0..2 * pairs).map(|q| (q, ring(q))) {
            frontend.set_vring_num(q, QUEUE_SIZE).unwrap();
            frontend
                .set_vring_addr(
                    q,
                    &VringConfigData {
                        queue_max_size: QUEUE_SIZE,
                        queue_size: QUEUE_SIZE,
                        flags: 0,
                        desc_table_addr: host + desc,
                        used_ring_addr: host + used,
                        avail_ring_addr: host + avail,
                        log_addr: None,
                    },
                )
                .unwrap();
            frontend.set_vring_base(q, 0).unwrap();
            frontend.set_vring_call(q, &calls[q]).unwrap();
            frontend.set_vring_kick(q, &kicks[q]).unwrap();
        }
        Vmm {
            _connection: frontend,
            mem,
            kicks,
            calls,
        }
    }

    /// Posts descriptor `index` (`addr`, `len`, `flags`) on ring `ring` as its next available
    /// entry, and kicks queue `q`.
    fn post(&self, q: usize, ring: (u64, u64, u64), index: u16, addr: u64, len: u32, flags: u16) {
        let (desc, avail, _) = ring;
        let d = desc + u64::from(index) * 16;
        self.mem.write_obj(addr, GuestAddress(d)).unwrap();
        self.mem.write_obj(len, GuestAddress(d + 8)).unwrap();
        self.mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
        self.mem.write_obj(0u16, GuestAddress(d + 14)).unwrap();
        let idx: u16 = self.mem.read_obj(GuestAddress(avail + 2)).unwrap();
        let slot = avail + 4 + u64::from(idx % QUEUE_SIZE) * 2;
        self.mem.write_obj(index, GuestAddress(slot)).unwrap();
        self.mem
            .write_obj(idx.wrapping_add(1), GuestAddress(avail + 2))
            .unwrap();
        self.kicks[q].write(1).unwrap();
    }

    /// How many descriptors ring `ring` has handed back, and the length of the last.
    fn used(&self, ring: (u64, u64, u64)) -> (u16, u32) {
        let used = ring.2;
        let idx: u16 = self.mem.read_obj(GuestAddress(used + 2)).unwrap();
        let last = u64::from(idx.wrapping_sub(1) % QUEUE_SIZE);
        let len: u32 = self
            .mem
            .read_obj(GuestAddress(used + 4 + last * 8 + 4))
            .unwrap();
        (idx, len)
    }
}

fn frame(tag: u8) -> Vec<u8> {
    let mut f = vec![tag; 60];
    f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
    f
}

/// Reads the port until `n` frames came or a second passed.
fn recv(port: &mut VhostUserPort, pool: &mut FramePool, n: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1);
    while out.len() < n && Instant::now() < deadline {
        port.recv_batch(pool, &mut out, 64).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

#[test]
fn a_vmm_on_the_port_exchanges_frames_through_the_rings() {
    let dir = std::env::temp_dir().join(format!("picnic-vhost-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vm.sock");
    let mut port = VhostUserPort::open("vm1", &socket, 1514).unwrap();
    let mut pool = FramePool::new(64);
    let vmm = Vmm::connect(&socket);

    // The guest transmits a frame: the switch gets it, the descriptor comes back used and
    // the guest is told (its call eventfd).
    let tx = TX_RING;
    let f1 = frame(0xa1);
    vmm.mem
        .write_slice(&[0; HDR_LEN], GuestAddress(0x10000))
        .unwrap();
    vmm.mem
        .write_slice(&f1, GuestAddress(0x10000 + HDR_LEN as u64))
        .unwrap();
    vmm.post(1, tx, 0, 0x10000, (HDR_LEN + f1.len()) as u32, 0);
    let got = recv(&mut port, &mut pool, 1);
    assert_eq!(got.len(), 1, "{:?}", port.stats());
    assert_eq!(got[0].data(), &f1[..]);
    assert_eq!(vmm.used(tx).0, 1);
    assert!(vmm.calls[1].read().is_ok(), "the guest was notified");
    got.into_iter().for_each(|f| pool.put(f));

    // A chain outside the guest's memory is handed back unused and counted, never followed.
    vmm.post(1, tx, 1, 0xf000_0000, 100, 0);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1);
    while port.stats().ring_errors == 0 && Instant::now() < deadline {
        port.recv_batch(&mut pool, &mut got, 64).unwrap();
    }
    assert!(got.is_empty());
    assert_eq!(port.stats().ring_errors, 1);
    assert_eq!(vmm.used(tx).0, 2);

    // Backpressure: while the switch does not read the port, the guest's frames stay in its
    // ring (nothing used: its queue fills); read, they come in order.
    for (i, tag) in [(2u16, 0xb2u8), (3, 0xb3)] {
        let at = 0x10000 + u64::from(i) * 0x1000;
        vmm.mem
            .write_slice(&[0; HDR_LEN], GuestAddress(at))
            .unwrap();
        vmm.mem
            .write_slice(&frame(tag), GuestAddress(at + HDR_LEN as u64))
            .unwrap();
        vmm.post(1, tx, i, at, (HDR_LEN + 60) as u32, 0);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(vmm.used(tx).0, 2, "unread: still the guest's");
    let got = recv(&mut port, &mut pool, 2);
    assert_eq!(
        got.iter().map(|f| f.data()[20]).collect::<Vec<_>>(),
        [0xb2, 0xb3]
    );
    assert_eq!(vmm.used(tx).0, 4);
    got.into_iter().for_each(|f| pool.put(f));

    // The guest posted no receive buffer: a frame for it waits in the switch's queue.
    let mut queue = vec![pool.get().unwrap()];
    let f2 = frame(0xc4);
    queue[0].fill_from(&f2);
    assert_eq!(port.send_batch(&mut queue, &mut pool).unwrap(), 0);
    assert_eq!(queue.len(), 1, "waiting, not dropped");
    assert_eq!(port.stats().tx_errors, 0);
    // A buffer too small for it costs that buffer and the frame (counted), the next takes
    // the next frame with its virtio-net header (num_buffers 1).
    let rx = RX_RING;
    vmm.post(0, rx, 0, 0x30000, 20, VRING_DESC_F_WRITE);
    assert_eq!(port.send_batch(&mut queue, &mut pool).unwrap(), 0);
    assert_eq!((queue.len(), port.stats().tx_errors), (0, 1));
    assert_eq!(vmm.used(rx), (1, 0));
    queue.push(pool.get().unwrap());
    queue[0].fill_from(&f2);
    vmm.post(0, rx, 1, 0x31000, 2048, VRING_DESC_F_WRITE);
    assert_eq!(port.send_batch(&mut queue, &mut pool).unwrap(), 1);
    assert_eq!(vmm.used(rx), (2, (HDR_LEN + f2.len()) as u32));
    let mut written = vec![0u8; HDR_LEN + f2.len()];
    vmm.mem
        .read_slice(&mut written, GuestAddress(0x31000))
        .unwrap();
    assert_eq!(&written[..HDR_LEN], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(&written[HDR_LEN..], &f2[..]);
    assert!(vmm.calls[0].read().is_ok());
    assert_eq!(port.stats().tx_frames, 1);

    // The VMM goes; the port forgets its rings and a new one connects.
    drop(vmm);
    let deadline = Instant::now() + Duration::from_secs(2);
    while port.connected() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!port.connected());
    let _again = Vmm::connect(&socket);
    let deadline = Instant::now() + Duration::from_secs(2);
    while port.connections() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(port.connections(), 2);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two queue pairs (`VIRTIO_NET_F_MQ`): the switch reads the second pair's transmit queue,
/// and spreads frames to the guest over both receive queues by flow, each flow's frames on
/// one queue.
#[test]
fn a_vmm_with_two_queue_pairs_is_served_on_both() {
    let dir = std::env::temp_dir().join(format!("picnic-vhost-mq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vm.sock");
    let mut port = VhostUserPort::open("vm1", &socket, 1514).unwrap();
    let mut pool = FramePool::new(64);
    let vmm = Vmm::connect_pairs(&socket, 2);

    // The guest transmits on pair 1 (queue 3).
    let f1 = frame(0xa1);
    vmm.mem
        .write_slice(&[0; HDR_LEN], GuestAddress(0x10000))
        .unwrap();
    vmm.mem
        .write_slice(&f1, GuestAddress(0x10000 + HDR_LEN as u64))
        .unwrap();
    vmm.post(3, ring(3), 0, 0x10000, (HDR_LEN + f1.len()) as u32, 0);
    let got = recv(&mut port, &mut pool, 1);
    assert_eq!(got.len(), 1, "{:?}", port.stats());
    assert_eq!(got[0].data(), &f1[..]);
    assert_eq!(vmm.used(ring(3)).0, 1);
    assert!(
        vmm.calls[3].read().is_ok(),
        "the guest was notified on queue 3"
    );
    got.into_iter().for_each(|f| pool.put(f));

    // A full ring of buffers on each receive queue (0 and 2); eight flows, two frames each.
    let buf = |q: usize, i: u16| 0x40000 + q as u64 * 0x10000 + u64::from(i) * 0x800;
    for q in [0, 2] {
        for i in 0..QUEUE_SIZE {
            vmm.post(q, ring(q), i, buf(q, i), 0x800, VRING_DESC_F_WRITE);
        }
    }
    let mut frames: Vec<Frame> = (0..16u8)
        .map(|i| {
            let mut f = pool.get().unwrap();
            f.fill_from(&common::udp(10 + i % 8, 2, 100));
            f
        })
        .collect();
    let sent = port.send_batch(&mut frames, &mut pool).unwrap();
    assert_eq!((sent, frames.len()), (16, 0), "{:?}", port.stats());
    // Which queue each flow (its source address's last byte) landed on.
    let mut flows = std::collections::HashMap::new();
    for q in [0, 2] {
        let (used, _) = vmm.used(ring(q));
        assert!(used > 0, "queue {q} took none of the 8 flows");
        assert!(
            vmm.calls[q].read().is_ok(),
            "the guest was notified on queue {q}"
        );
        for i in 0..used {
            let entry = ring(q).2 + 4 + u64::from(i) * 8;
            let id: u32 = vmm.mem.read_obj(GuestAddress(entry)).unwrap();
            let mut head = [0u8; HDR_LEN + 30];
            let at = GuestAddress(buf(q, id as u16));
            vmm.mem.read_slice(&mut head, at).unwrap();
            let src = head[HDR_LEN + 29];
            assert_eq!(
                *flows.entry(src).or_insert(q),
                q,
                "flow {src} on two queues"
            );
        }
    }
    assert_eq!(flows.len(), 8);
    drop(vmm);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cap of the VM in the backpressure test (`max_pps`: its packet budget, which holds for
/// traffic to a VM on the same host too), and the UDP frames it sends.
const CAP_PPS: u64 = 1200;
const UDP_PAYLOAD: usize = 1000;
const GUEST_IP: [u8; 4] = [198, 18, 6, 2];
const GUEST_MAC: [u8; 6] = [2, 0, 0, 0, 6, 2];
const CTR_IP: [u8; 4] = [198, 18, 6, 3];
const CTR_MAC: [u8; 6] = [2, 0, 0, 0, 6, 3];
const SINK_PORT: u16 = 9000;

const CAP_CONFIG: &str = r#"
[switch]
host_id = 1
workers = 1
[uplink]
ifname = "pnvup"
backend = "af_packet"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "t"
vni = 100
[[vms]]
name = "guest"
id = 1
tenant = "t"
host = 1
mac = "02:00:00:00:06:02"
ip = "198.18.6.2"
max_pps = 1200
port = { ifname = "pnvu0", backend = "vhost_user", socket = "@SOCKET@" }
[[vms]]
name = "ctr"
id = 2
tenant = "t"
host = 1
mac = "02:00:00:00:06:03"
ip = "198.18.6.3"
port = { ifname = "pnvv0" }
"#;

/// What the VMM's guest managed to send while offering a rate.
struct Offered {
    posted: u64,
    /// Times the guest found its transmit ring full (its driver would stop its queue).
    ring_full: u64,
}

impl Vmm {
    /// Offers `frame` on the transmit ring at `pps` for `how_long`, one buffer per ring
    /// slot, reusing a slot once the switch gave it back; a full ring waits.
    fn offer(&self, frame: &[u8], pps: u64, how_long: Duration) -> Offered {
        let gap = Duration::from_nanos(1_000_000_000 / pps);
        let mut offered = Offered {
            posted: 0,
            ring_full: 0,
        };
        let start = Instant::now();
        let mut next = start;
        let mut was_full = false;
        while start.elapsed() < how_long {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_micros(100)));
                continue;
            }
            let avail: u16 = self.mem.read_obj(GuestAddress(TX_RING.1 + 2)).unwrap();
            let used = self.used(TX_RING).0;
            if avail.wrapping_sub(used) >= QUEUE_SIZE {
                offered.ring_full += u64::from(!was_full);
                was_full = true;
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            was_full = false;
            let slot = avail % QUEUE_SIZE;
            let at = 0x10000 + u64::from(slot) * 0x1000;
            self.mem
                .write_slice(&[0; HDR_LEN], GuestAddress(at))
                .unwrap();
            self.mem
                .write_slice(frame, GuestAddress(at + HDR_LEN as u64))
                .unwrap();
            self.post(1, TX_RING, slot, at, (HDR_LEN + frame.len()) as u32, 0);
            offered.posted += 1;
            next += gap;
        }
        offered
    }
}

/// PicNIC's backpressure to the VM (issue 31): a VM on vhost-user offered UDP at twice its
/// cap (`max_pps`) gets its cap, and the rest waits in its own transmit ring (its driver
/// would stop its queue), not dropped in the switch: every frame it managed to post reaches
/// the container. Root: the switch's uplink and the container are veths in namespaces.
#[test]
fn root_a_vm_offered_twice_its_cap_gets_its_cap_with_no_drops_in_the_switch() {
    use picnic_switch::config::Config;
    use picnic_switch::runner::Switch;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    if !common::is_root() {
        return;
    }
    let host = common::Netns::new();
    let ctr = common::Netns::new();
    host.veth_pair("pnvup", "pnvfab");
    host.ip("link add pnvv0 type veth peer name pnvc0");
    host.ip(&format!("link set pnvc0 netns {}", ctr.name));
    host.ip("link set pnvv0 up");
    ctr.ip("link set pnvc0 address 02:00:00:00:06:03 up");
    ctr.ip("addr add 198.18.6.3/24 dev pnvc0");
    let dir = std::env::temp_dir().join(format!("picnic-vhost-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vm.sock");
    let config = CAP_CONFIG.replace("@SOCKET@", &socket.to_string_lossy());

    let sink = ctr.enter(|| {
        std::net::UdpSocket::bind((std::net::Ipv4Addr::from(CTR_IP), SINK_PORT)).unwrap()
    });
    sink.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let receiver = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut frames, mut buf) = (0u64, [0u8; 2048]);
            while !done.load(Ordering::Relaxed) {
                if sink.recv(&mut buf).is_ok() {
                    frames += 1;
                }
            }
            frames
        })
    };
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2(GUEST_MAC, CTR_MAC)
        .ipv4(GUEST_IP, CTR_IP, 64)
        .udp(5000, SINK_PORT)
        .write(&mut frame, &[7u8; UDP_PAYLOAD])
        .unwrap();
    let window = Duration::from_secs(2);

    let (offered, published) = host.enter(|| {
        let mut switch = Switch::open(Config::parse(&config).unwrap()).expect("switch");
        let (stop, shared) = (switch.stop_flag(), switch.shared());
        let dataplane = std::thread::spawn(move || switch.run());
        let vmm = Vmm::connect(&socket);
        let offered = vmm.offer(&frame, 2 * CAP_PPS, window);
        // What the guest posted drains at the cap.
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        dataplane.join().unwrap().expect("the switch ran");
        (offered, shared.latest().expect("a snapshot"))
    });
    done.store(true, Ordering::Relaxed);
    let received = receiver.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    let guest = published
        .switch
        .vms
        .iter()
        .find(|v| v.name == "guest")
        .expect("the guest VM");
    let pps = offered.posted * 1000 / window.as_millis() as u64;
    println!(
        "offered {} frames/s for {window:?}: the guest posted {} ({pps}/s), found its ring \
         full {} times; the container got {received}; the guest's drops in the switch: {}",
        2 * CAP_PPS,
        offered.posted,
        offered.ring_full,
        guest.counters.drops.total()
    );
    assert!(
        (CAP_PPS * 3 / 4..=CAP_PPS * 5 / 4).contains(&pps),
        "the guest got {pps} frames/s, its cap is {CAP_PPS}"
    );
    assert!(offered.ring_full > 0, "the guest never saw a full ring");
    assert_eq!(guest.counters.drops.total(), 0, "no drops in the switch");
    assert_eq!(received, offered.posted, "every frame posted was delivered");
}
