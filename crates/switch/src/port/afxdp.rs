//! AF_XDP port: the fast path where the kernel allows it (DESIGN.md section 4, "Ports";
//! section 7 measured on veth: XDP drop 1.6-1.9 Mpps, AF_XDP RX in copy mode 1.4 Mpps, against
//! 0.75 Mpps for an AF_PACKET TPACKET_V3 ring). The socket and rings are system calls made
//! here; the XDP program is C (`crates/switch/bpf/xdp_port.bpf.c`) loaded with aya
//! ([`crate::ebpf`]).
//!
//! - **Socket and UMEM.** One AF_XDP socket bound to queue 0 of the interface in copy mode
//!   ([`AfXdpPort::open_queues`]: one per queue, each with its UMEM, for the switch's workers)
//!   (`XDP_COPY`: the only mode veth has). Its UMEM is an anonymous mapping of
//!   [`AfXdpOptions::frames`] chunks of 2 KiB: the first half feeds the fill ring (receive
//!   buffers), the second half is the transmit buffer pool. The four rings (fill, RX, TX,
//!   completion) are mmapped from the socket and each holds half the chunks, so the fill ring
//!   always has room for every receive buffer handed back.
//! - **XDP program.** `bpf_redirect_map(xskmap, ctx->rx_queue_index, XDP_PASS)`: frames of
//!   queue 0 go to the socket, anything else to the kernel stack. The XSKMAP holds the socket
//!   at key 0 (queue `q`'s socket at key `q`; the program belongs to queue 0's port). On the uplink the same program drops the frames of throttled VMs first
//!   ([`AfXdpPort::early_drop`]). It is attached with a BPF link (`BPF_LINK_CREATE`), so it is
//!   detached when the port is dropped, also when the process dies. Attach mode: [`XdpMode::Auto`]
//!   tries the driver's native XDP first (veth has it) and falls back to generic (skb) XDP,
//!   which every device supports; [`AfXdpPort::attach_mode`] says which one is in use.
//! - **RX**: descriptors are taken from the RX ring, each frame is copied once into a pool
//!   [`Frame`] (as with AF_PACKET; zero-copy UMEM frames would change the `Frame` type), and
//!   its chunk goes straight back to the fill ring.
//! - **TX**: each frame is copied into a free transmit chunk and described on the TX ring;
//!   `sendto(MSG_DONTWAIT)` makes the kernel transmit (in copy mode the kernel sends only from
//!   that call, at most its per-call budget of frames, so the port calls it until the ring is
//!   drained or no progress is made). Chunks come back through the completion ring. Frames
//!   are counted as sent when they are on the TX ring.
//! - Promiscuous: an AF_PACKET socket that receives nothing holds a `PACKET_MR_PROMISC`
//!   membership for the port's lifetime (a NIC's MAC filter would otherwise hide frames for
//!   the VMs' MACs; veths deliver everything anyway).
//! - Frames longer than a chunk minus the kernel's 256 B XDP headroom (1792 B) would be
//!   dropped by the kernel (counted in [`PortStats::rx_dropped`], like a full RX ring), so
//!   `open` refuses an interface whose MTU exceeds 1774.
//! - Needs CAP_NET_RAW, CAP_BPF and CAP_NET_ADMIN (root), and an interface without another XDP
//!   program. On failure the error says what was tried; `backend = "af_packet"` is the
//!   portable fallback.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use super::sys::{get_opt, ifindex, ifreq_named, join_promiscuous, set_opt};
use super::{ifname_cstring, is_fatal_port_error, os_error, Backend, Port, PortStats};
use crate::ebpf::{AttachFlags, EarlyDrop, PortProgram};
use crate::frame::{Frame, FramePool, DATA_CAP};

/// Bytes of one UMEM chunk (one frame buffer).
const CHUNK_SIZE: usize = 2048;
/// Fewest and most UMEM chunks a port may have.
const MIN_FRAMES: u32 = 64;
const MAX_FRAMES: u32 = 1 << 16;
/// Frames the kernel transmits per `sendto` in copy mode unless told otherwise
/// (`TX_BATCH_SIZE` in net/xdp/xsk.c).
const KERNEL_TX_BATCH: u32 = 32;
/// Largest MTU whose frames (plus Ethernet and a VLAN tag) fit a chunk after the 256 B the
/// kernel keeps in front of received data in copy mode (XDP_PACKET_HEADROOM).
const MAX_MTU: i32 = (CHUNK_SIZE - 256 - 18) as i32;
/// How long `open` retries binding to a queue that is still being released.
const BIND_BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(500);
/// Socket option raising that budget (Linux >= 6.17; older kernels keep 32).
/// Entries of the XDP program's XSKMAP (`MAX_QUEUES` in xdp_port.bpf.c): queues with a socket.
const MAX_QUEUES: usize = 64;
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// How the XDP program is attached to the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// Native first, generic if the driver refuses (the default).
    #[default]
    Auto,
    /// The driver's own XDP hook (`XDP_FLAGS_DRV_MODE`): veth and most NIC drivers.
    Native,
    /// Generic XDP after the skb is built (`XDP_FLAGS_SKB_MODE`): any device, slower.
    Generic,
}

impl std::fmt::Display for XdpMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            XdpMode::Auto => "auto",
            XdpMode::Native => "native",
            XdpMode::Generic => "generic (skb)",
        })
    }
}

/// UMEM and attach parameters of an [`AfXdpPort`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfXdpOptions {
    /// UMEM chunks of 2 KiB, half for receiving and half for sending; a power of two from 64
    /// to 65536. Default 4096 (8 MiB per port; 2048-entry rings).
    pub frames: u32,
    /// Attach mode of the XDP program.
    pub mode: XdpMode,
}

impl Default for AfXdpOptions {
    fn default() -> Self {
        AfXdpOptions {
            frames: 4096,
            mode: XdpMode::Auto,
        }
    }
}

impl AfXdpOptions {
    fn validate(&self) -> Result<(), String> {
        if !self.frames.is_power_of_two() || !(MIN_FRAMES..=MAX_FRAMES).contains(&self.frames) {
            return Err(format!(
                "frames {} must be a power of two from {MIN_FRAMES} to {MAX_FRAMES}",
                self.frames
            ));
        }
        Ok(())
    }
}

/// Whether an error means the caller lacks a capability.
fn is_permission(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

/// A memory mapping unmapped on drop.
struct Mapping {
    addr: *mut u8,
    len: usize,
}

impl Mapping {
    /// mmap(2) of `len` bytes; `fd` None for anonymous memory.
    fn new(len: usize, fd: Option<RawFd>, offset: libc::off_t) -> io::Result<Mapping> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY: a fresh mapping chosen by the kernel; nothing else refers to it.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr: addr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly this mapping; nothing refers to it afterwards.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// One single-producer single-consumer ring shared with the kernel: a producer index, a
/// consumer index and `size` descriptors of type `T` (`xdp_desc` for RX/TX, `u64` chunk
/// addresses for fill/completion). We are the producer of fill and TX and the consumer of RX
/// and completion.
struct Ring<T> {
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    descs: *mut T,
    size: u32,
    /// Our copy of the index we own (the producer's for fill/TX, the consumer's for RX and
    /// completion), published with a release store.
    local: u32,
    /// Last seen value of the index the kernel owns.
    remote: u32,
}

impl<T: Copy> Ring<T> {
    /// Maps the ring at page offset `pgoff` of socket `fd`, laid out as `off` says.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * size_of::<T>();
        let map = Mapping::new(len, Some(fd), pgoff)?;
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the mapping; the
        // indices are 4-byte aligned u32s only accessed atomically (by us and the kernel).
        let (producer, consumer, descs) = unsafe {
            (
                map.addr.add(off.producer as usize) as *const AtomicU32,
                map.addr.add(off.consumer as usize) as *const AtomicU32,
                map.addr.add(off.desc as usize) as *mut T,
            )
        };
        // A fresh ring: both indices are 0.
        Ok(Ring {
            _map: map,
            producer,
            consumer,
            descs,
            size,
            local: 0,
            remote: 0,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.consumer }
    }

    /// Descriptor slot of index `i`.
    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: the masked index is below `size`, so the slot is inside the mapping.
        unsafe { self.descs.add((i & (self.size - 1)) as usize) }
    }

    // Producer side (fill, TX): `local` is the producer index, `remote` the consumer's.

    /// Free slots, refreshing the kernel's consumer index when fewer than `want` are known.
    fn free(&mut self, want: u32) -> u32 {
        let known = self.size - self.local.wrapping_sub(self.remote);
        if known >= want {
            return known;
        }
        // Acquire: the kernel's reads of the slots it consumed happen before we reuse them.
        self.remote = self.consumer().load(Ordering::Acquire);
        self.size - self.local.wrapping_sub(self.remote)
    }

    /// Writes the next descriptor (the caller checked `free`).
    fn push(&mut self, value: T) {
        // SAFETY: the slot is free (not yet published), so the kernel does not read it.
        unsafe { ptr::write_volatile(self.slot(self.local), value) };
        self.local = self.local.wrapping_add(1);
    }

    /// Publishes the pushed descriptors to the kernel.
    fn submit(&self) {
        // Release: our descriptor writes happen before the kernel sees the new index.
        self.producer().store(self.local, Ordering::Release);
    }

    /// Descriptors the kernel has not consumed yet (producer side).
    fn in_flight(&self) -> u32 {
        self.local
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    // Consumer side (RX, completion): `local` is the consumer index, `remote` the producer's.

    /// Descriptors ready to be read, refreshing the kernel's producer index.
    fn ready(&mut self) -> u32 {
        // Acquire: the kernel's descriptor (and frame data) writes happen before we read them.
        self.remote = self.producer().load(Ordering::Acquire);
        self.remote.wrapping_sub(self.local)
    }

    /// Reads the next ready descriptor (the caller checked `ready`).
    fn pop(&mut self) -> T {
        // SAFETY: the slot was published by the kernel and is not reused until we release it.
        let value = unsafe { ptr::read_volatile(self.slot(self.local)) };
        self.local = self.local.wrapping_add(1);
        value
    }

    /// Gives the read descriptors' slots back to the kernel.
    fn release(&self) {
        // Release: our reads happen before the kernel may overwrite the slots.
        self.consumer().store(self.local, Ordering::Release);
    }
}

/// A port on an AF_XDP socket bound to queue 0 of one interface (see the module doc).
pub struct AfXdpPort {
    name: String,
    /// The XDP program and its link (queue 0's port; None on the others); dropped first, so
    /// the program is detached before the
    /// socket goes away.
    program: Option<PortProgram>,
    mode: XdpMode,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    completion: Ring<u64>,
    fd: OwnedFd,
    umem: Mapping,
    _promisc: OwnedFd,
    /// UMEM addresses of the transmit chunks not on the TX ring.
    tx_free: Vec<u64>,
    stats: PortStats,
}

// SAFETY: the raw pointers point into mappings the port owns; the port is used by one thread
// at a time (`Port` needs `&mut self` for all ring access).
unsafe impl Send for AfXdpPort {}

/// The MTU of interface `name`, asked through socket `fd`.
fn interface_mtu(fd: RawFd, name: &std::ffi::CStr) -> io::Result<i32> {
    let mut req = ifreq_named(name);
    // SAFETY: `req` is a live ifreq with a NUL-terminated name (checked shorter than
    // IFNAMSIZ); SIOCGIFMTU writes only its MTU field.
    let ret = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU filled the union's MTU member.
    Ok(unsafe { req.ifr_ifru.ifru_mtu })
}

/// The receive queues of interface `name` (ethtool's channels: rx or combined, whichever the
/// driver reports), asked through socket `fd`; sysfs would show the mounting namespace's
/// interfaces, not the thread's.
fn rx_queues(fd: RawFd, name: &std::ffi::CStr) -> io::Result<usize> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    // struct ethtool_channels: cmd, then max_rx, max_tx, max_other, max_combined, rx_count,
    // tx_count, other_count, combined_count.
    let mut channels = [0u32; 9];
    channels[0] = ETHTOOL_GCHANNELS;
    let mut req = ifreq_named(name);
    req.ifr_ifru.ifru_data = channels.as_mut_ptr().cast();
    // SAFETY: `req` names the interface and points at `channels`, a live ethtool_channels the
    // kernel writes within.
    let ret = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(channels[5].max(channels[8]) as usize)
}

/// An AF_PACKET socket that receives nothing (protocol 0) and keeps interface `index`
/// promiscuous while it is open.
fn promiscuous_holder(index: u32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative return is a new descriptor.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    join_promiscuous(fd.as_raw_fd(), index)?;
    Ok(fd)
}

impl AfXdpPort {
    /// Opens a port on queue 0 of interface `ifname` (in the calling thread's network
    /// namespace): UMEM and rings set up, socket bound in copy mode, XDP program attached
    /// as `opts.mode` says. Needs root (CAP_NET_RAW, CAP_BPF, CAP_NET_ADMIN).
    pub fn open(ifname: &str, opts: AfXdpOptions) -> io::Result<AfXdpPort> {
        Self::open_queue(ifname, opts, 0, None)
    }

    /// Opens one port per receive queue of `ifname`, at most `max` (queues 0..): queue 0's
    /// port attaches the XDP program, which sends each other queue's frames to its own socket
    /// (RSS spreads flows over the queues). Fewer ports than `max` when the interface has
    /// fewer queues.
    pub fn open_queues(ifname: &str, opts: AfXdpOptions, max: usize) -> io::Result<Vec<AfXdpPort>> {
        let mut first = Self::open(ifname, opts)?;
        let queues = rx_queues(first._promisc.as_raw_fd(), &ifname_cstring(ifname)?)
            .unwrap_or(1)
            .clamp(1, MAX_QUEUES);
        let mut ports = Vec::new();
        let mode = first.mode;
        for q in 1..max.min(queues) {
            let program = first
                .program
                .as_mut()
                .expect("queue 0's port has the program");
            ports.push(Self::open_queue(
                ifname,
                opts,
                q as u32,
                Some((program, mode)),
            )?);
        }
        ports.insert(0, first);
        Ok(ports)
    }

    /// Opens a port on `queue`; with `program`, the socket joins that program's XSKMAP instead
    /// of loading one.
    fn open_queue(
        ifname: &str,
        opts: AfXdpOptions,
        queue: u32,
        program: Option<(&mut PortProgram, XdpMode)>,
    ) -> io::Result<AfXdpPort> {
        let ctx = |what: &str| format!("af_xdp port '{ifname}': {what}");
        let fallback = "; backend = \"af_packet\" works on any interface";
        opts.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, ctx(&e)))?;
        let cname = ifname_cstring(ifname)?;
        let index = ifindex(ifname)?;

        let promisc = promiscuous_holder(index).map_err(|e| {
            if is_permission(&e) {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    ctx("needs CAP_NET_RAW, CAP_BPF and CAP_NET_ADMIN: run as root"),
                )
            } else {
                os_error(e, ctx("PACKET_ADD_MEMBERSHIP promiscuous"))
            }
        })?;
        let mtu = interface_mtu(promisc.as_raw_fd(), &cname)
            .map_err(|e| os_error(e, ctx("SIOCGIFMTU")))?;
        if mtu > MAX_MTU {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                ctx(&format!(
                    "MTU {mtu} is too large for AF_XDP copy mode's {CHUNK_SIZE} B frames (at most {MAX_MTU}){fallback}"
                )),
            ));
        }

        // SAFETY: socket(2) takes no pointers; a non-negative return is a new descriptor.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let err = io::Error::last_os_error();
            return Err(if is_permission(&err) {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    ctx("opening an AF_XDP socket needs CAP_NET_RAW (and CAP_BPF, CAP_NET_ADMIN for the XDP program): run as root"),
                )
            } else if err.raw_os_error() == Some(libc::EAFNOSUPPORT) {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    ctx(&format!(
                        "this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS){fallback}"
                    )),
                )
            } else {
                os_error(err, ctx("socket(AF_XDP)"))
            });
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sock = fd.as_raw_fd();

        let umem_len = opts.frames as usize * CHUNK_SIZE;
        let umem = Mapping::new(umem_len, None, 0)
            .map_err(|e| os_error(e, ctx(&format!("mmap of a {umem_len}-byte UMEM"))))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.addr as u64,
            len: umem_len as u64,
            chunk_size: CHUNK_SIZE as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        set_opt(sock, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg).map_err(|e| {
            os_error(
                e,
                ctx("XDP_UMEM_REG (locked memory: needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK)"),
            )
        })?;
        let half = opts.frames / 2;
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            set_opt(sock, libc::SOL_XDP, opt, &half)
                .map_err(|e| os_error(e, ctx(&format!("{what} of {half} entries"))))?;
        }
        // More frames per transmit call than the default 32 (kernels without it ignore it).
        let _ = set_opt(sock, libc::SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &(half as i32));
        let off: libc::xdp_mmap_offsets = get_opt(sock, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS)
            .map_err(|e| os_error(e, ctx("XDP_MMAP_OFFSETS")))?;
        let map_err =
            |what: &'static str| move |e| os_error(e, ctx(&format!("mmap of the {what}")));
        let mut fill = Ring::<u64>::map(
            sock,
            &off.fr,
            half,
            libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
        )
        .map_err(map_err("fill ring"))?;
        let completion = Ring::<u64>::map(
            sock,
            &off.cr,
            half,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
        )
        .map_err(map_err("completion ring"))?;
        let rx =
            Ring::map(sock, &off.rx, half, libc::XDP_PGOFF_RX_RING).map_err(map_err("RX ring"))?;
        let tx =
            Ring::map(sock, &off.tx, half, libc::XDP_PGOFF_TX_RING).map_err(map_err("TX ring"))?;

        // Every receive chunk starts on the fill ring; the others are free to transmit from.
        for i in 0..half {
            fill.push(u64::from(i) * CHUNK_SIZE as u64);
        }
        fill.submit();
        let tx_free: Vec<u64> = (half..opts.frames)
            .map(|i| u64::from(i) * CHUNK_SIZE as u64)
            .collect();

        // SAFETY: sockaddr_xdp is a plain C struct for which all-zero bytes are a valid value.
        let mut addr: libc::sockaddr_xdp = unsafe { MaybeUninit::zeroed().assume_init() };
        addr.sxdp_family = libc::AF_XDP as u16;
        addr.sxdp_flags = libc::XDP_COPY;
        addr.sxdp_ifindex = index;
        addr.sxdp_queue_id = queue;
        // A socket closed just before (a restarted switch) frees its queue from a kernel work
        // item, shortly after close(2): retry a busy queue for up to BIND_BUSY_RETRY.
        let started = std::time::Instant::now();
        loop {
            // SAFETY: `addr` is a live sockaddr_xdp and the length passed is its size.
            let ret = unsafe {
                libc::bind(
                    sock,
                    (&addr as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if ret == 0 {
                break;
            }
            let err = io::Error::last_os_error();
            let busy = err.raw_os_error() == Some(libc::EBUSY);
            if busy && started.elapsed() < BIND_BUSY_RETRY {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            let hint = match err.raw_os_error() {
                Some(libc::EBUSY) => {
                    " (the queue already has an AF_XDP socket: another switch or OVS afxdp port?)"
                }
                Some(libc::ENETDOWN) => " (interface down: set it up first)",
                _ => "",
            };
            return Err(os_error(
                err,
                ctx(&format!(
                    "bind in copy mode to queue {queue}{hint}{fallback}"
                )),
            ));
        }

        let bpf_err = |what: &str| {
            let what = what.to_owned();
            move |e: io::Error| {
                if is_permission(&e) {
                    io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        ctx(&format!("{what}: the XDP program needs CAP_BPF and CAP_NET_ADMIN: run as root{fallback}")),
                    )
                } else {
                    os_error(e, ctx(&format!("{what}{fallback}")))
                }
            }
        };
        let (program, mode) = match program {
            Some((shared, mode)) => {
                shared
                    .add_socket(queue, sock)
                    .map_err(bpf_err("the XDP program's socket map"))?;
                (None, mode)
            }
            None => {
                let mut program = PortProgram::load(sock).map_err(bpf_err("the XDP program"))?;
                let mode = attach(&mut program, index, opts.mode).map_err(|(tried, e)| {
                    let hint = match e.raw_os_error() {
                        Some(libc::EBUSY) | Some(libc::EEXIST) => {
                            " (the interface already has an XDP program: see `ip link show`)"
                        }
                        _ => "",
                    };
                    bpf_err(&format!("attaching the XDP program in {tried} mode{hint}"))(e)
                })?;
                (Some(program), mode)
            }
        };
        Ok(AfXdpPort {
            name: ifname.to_owned(),
            program,
            mode,
            rx,
            tx,
            fill,
            completion,
            fd,
            umem,
            _promisc: promisc,
            tx_free,
            stats: PortStats::default(),
        })
    }

    /// The uplink's early drop: the maps through which the switch makes this port's XDP
    /// program drop the frames of throttled VMs (taken once; None afterwards).
    pub fn early_drop(&mut self) -> Option<EarlyDrop> {
        self.program.as_mut()?.early_drop()
    }

    /// The attach mode in use: [`XdpMode::Native`] or [`XdpMode::Generic`].
    pub fn attach_mode(&self) -> XdpMode {
        self.mode
    }

    /// Moves the chunks the kernel has finished sending back to the free list.
    fn reclaim_completions(&mut self) {
        let n = self.completion.ready();
        for _ in 0..n {
            let addr = self.completion.pop();
            self.tx_free.push(addr);
        }
        if n > 0 {
            self.completion.release();
        }
    }

    /// Makes the kernel transmit the TX ring: one `sendto` per kernel budget until the ring is
    /// drained or a call makes no progress (device busy; the next send retries).
    fn kick(&mut self) -> io::Result<()> {
        let max_calls = self.tx.size / KERNEL_TX_BATCH + 2;
        for _ in 0..max_calls {
            let before = self.tx.in_flight();
            if before == 0 {
                break;
            }
            // SAFETY: sendto with no buffer and no address only wakes the socket's transmit.
            let ret = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    ptr::null(),
                    0,
                )
            };
            if ret < 0 {
                let err = io::Error::last_os_error();
                if is_fatal_port_error(&err) {
                    return Err(os_error(err, format!("af_xdp port '{}': send", self.name)));
                }
                // EAGAIN (budget used up or device busy), EBUSY, ENOBUFS, ENETDOWN: the frames
                // stay on the ring for the next call.
            }
            if self.tx.in_flight() >= before {
                break;
            }
        }
        Ok(())
    }
}

/// The start of `len` bytes at UMEM address `addr`, if they lie inside the UMEM.
fn umem_at(umem: &Mapping, addr: u64, len: usize) -> Option<*mut u8> {
    let at = usize::try_from(addr).ok()?;
    (at.checked_add(len)? <= umem.len).then(|| {
        // SAFETY: `at + len` is inside the mapping (checked above).
        unsafe { umem.addr.add(at) }
    })
}

/// Attaches with `mode`, trying native then generic for [`XdpMode::Auto`]; on failure gives
/// the mode(s) tried and the last error.
fn attach(
    program: &mut PortProgram,
    index: u32,
    mode: XdpMode,
) -> Result<XdpMode, (String, io::Error)> {
    match mode {
        XdpMode::Native => program
            .attach(index, AttachFlags::Native)
            .map(|()| XdpMode::Native)
            .map_err(|e| ("native".into(), e)),
        XdpMode::Generic => program
            .attach(index, AttachFlags::Generic)
            .map(|()| XdpMode::Generic)
            .map_err(|e| ("generic (skb)".into(), e)),
        XdpMode::Auto => match program.attach(index, AttachFlags::Native) {
            Ok(()) => Ok(XdpMode::Native),
            Err(native) if is_permission(&native) => Err(("native".into(), native)),
            Err(native) => program
                .attach(index, AttachFlags::Generic)
                .map(|()| XdpMode::Generic)
                .map_err(|e| (format!("native ({native}), then generic (skb)"), e)),
        },
    }
}

impl std::fmt::Debug for AfXdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfXdpPort")
            .field("name", &self.name)
            .field("fd", &self.fd)
            .field("mode", &self.mode)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Port for AfXdpPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::AfXdp
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        let max = max.min(pool.available()).min(u32::MAX as usize) as u32;
        let ready = self.rx.ready().min(max);
        // Always true (the fill ring has a slot for every receive chunk); checked anyway.
        let ready = ready.min(self.fill.free(ready));
        let mut n = 0;
        for _ in 0..ready {
            let desc = self.rx.pop();
            let len = desc.len as usize;
            match (umem_at(&self.umem, desc.addr, len), pool.get()) {
                (Some(data), Some(mut frame)) if len <= DATA_CAP => {
                    // SAFETY: `data..data + len` is inside the UMEM and the chunk is ours until
                    // it goes back on the fill ring below.
                    frame.fill_from(unsafe { std::slice::from_raw_parts(data, len) });
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += len as u64;
                    out.push(frame);
                    n += 1;
                }
                (_, frame) => {
                    // A frame the kernel could not have written (too long or outside the
                    // UMEM); `max` keeps the pool from running dry in between.
                    if let Some(frame) = frame {
                        pool.put(frame);
                    }
                    self.stats.rx_oversize += 1;
                }
            }
            // The chunk's start: in aligned mode the address is the chunk plus an offset.
            self.fill.push(desc.addr & !(CHUNK_SIZE as u64 - 1));
        }
        if ready > 0 {
            self.rx.release();
            self.fill.submit();
        }
        Ok(n)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        self.reclaim_completions();
        let room = (frames.len().min(self.tx_free.len()) as u32)
            .min(self.tx.free(frames.len() as u32)) as usize;
        let chunks = self.tx_free.len() - room;
        for (frame, addr) in frames.drain(..room).zip(self.tx_free.drain(chunks..)) {
            let len = frame.len();
            match umem_at(&self.umem, addr, len) {
                Some(dst) if len <= CHUNK_SIZE => {
                    // SAFETY: `dst..dst + len` is inside the UMEM, in a free chunk the kernel
                    // does not read until it is on the TX ring.
                    unsafe { ptr::copy_nonoverlapping(frame.data().as_ptr(), dst, len) };
                    self.tx.push(libc::xdp_desc {
                        addr,
                        len: len as u32,
                        options: 0,
                    });
                    self.stats.tx_frames += 1;
                    self.stats.tx_bytes += len as u64;
                }
                // Never happens (a frame is at most one chunk); the chunk is lost if it did.
                _ => self.stats.tx_errors += 1,
            }
            pool.put(frame);
        }
        if room > 0 {
            self.tx.submit();
        }
        self.kick()?;
        Ok(room)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        let kernel = get_opt::<libc::xdp_statistics>(
            self.fd.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
        )
        .ok();
        let (rx_dropped, tx_invalid) = kernel.map_or((0, 0), |s| {
            (
                s.rx_dropped + s.rx_ring_full + s.rx_invalid_descs,
                s.tx_invalid_descs,
            )
        });
        PortStats {
            rx_dropped: self.stats.rx_dropped + rx_dropped,
            tx_errors: self.stats.tx_errors + tx_invalid,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        assert!(AfXdpOptions::default().validate().is_ok());
        for frames in [0, 32, 100, 1 << 17] {
            let opts = AfXdpOptions {
                frames,
                ..Default::default()
            };
            assert!(opts.validate().is_err(), "{frames}");
        }
    }

    #[test]
    fn missing_interface_is_named() {
        let err = AfXdpPort::open("pn-no-such-if", AfXdpOptions::default()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("'pn-no-such-if' not found"),
            "{err}"
        );
    }
}
