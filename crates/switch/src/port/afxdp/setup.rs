//! Opening an AF_XDP port: the UMEM registered, the rings sized and mapped, the receiving
//! socket bound to its queue (zero-copy where the driver offers it, else copy mode; with
//! need_wakeup) and joined to the XDP program (loaded and attached by queue 0's port), the
//! sending socket bound to the same queue sharing its UMEM, and the interface held
//! promiscuous.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::ring::{Mapping, Ring};
use super::{AfXdpOptions, AfXdpPort, BindMode, XdpMode, CHUNK_SIZE};
use crate::ebpf::{AttachFlags, PortProgram};
use crate::port::sys::{get_opt, ifindex, ifreq_named, join_promiscuous, set_opt};
use crate::port::{ifname_cstring, os_error, PortStats};

/// Largest MTU whose frames (plus Ethernet and a VLAN tag) fit a chunk after the 256 B the
/// kernel keeps in front of received data (XDP_PACKET_HEADROOM, in either bind mode).
const MAX_MTU: i32 = (CHUNK_SIZE - 256 - 18) as i32;
/// How long `open` retries binding to a queue that is still being released.
const BIND_BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(500);
/// Entries of the XDP program's XSKMAP (`MAX_QUEUES` in xdp_port.bpf.c): queues with a socket.
const MAX_QUEUES: usize = 64;
/// Socket option raising the kernel's per-`sendto` budget ([`KERNEL_TX_BATCH`]; Linux >= 6.17;
/// older kernels keep 32).
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// What every refusal to open the port adds.
const FALLBACK: &str = "; backend = \"af_packet\" works on any interface";

/// Whether an error means the caller lacks a capability.
fn is_permission(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}
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

/// A new AF_XDP socket (close-on-exec).
fn xdp_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative return is a new descriptor.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// What a failed `socket(AF_XDP)` means, in the port's context `ctx`.
fn xdp_socket_error(err: io::Error, ctx: &impl Fn(&str) -> String) -> io::Error {
    if is_permission(&err) {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            ctx("opening an AF_XDP socket needs CAP_NET_RAW (and CAP_BPF, CAP_NET_ADMIN for the XDP program): run as root"),
        )
    } else if err.raw_os_error() == Some(libc::EAFNOSUPPORT) {
        io::Error::new(
            io::ErrorKind::Unsupported,
            ctx(&format!(
                "this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS){FALLBACK}"
            )),
        )
    } else {
        os_error(err, ctx("socket(AF_XDP)"))
    }
}

/// bind(2) of AF_XDP socket `sock` to `addr`.
fn bind_xdp(sock: RawFd, addr: &libc::sockaddr_xdp) -> io::Result<()> {
    // SAFETY: `addr` is a live sockaddr_xdp and the length passed is its size.
    let ret = unsafe {
        libc::bind(
            sock,
            (addr as *const libc::sockaddr_xdp).cast(),
            size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    /// namespace): UMEM and rings set up, socket bound as `opts.bind` says, XDP program attached
    /// as `opts.mode` says. Needs root (CAP_NET_RAW, CAP_BPF, CAP_NET_ADMIN).
    pub fn open(ifname: &str, opts: AfXdpOptions) -> io::Result<AfXdpPort> {
        Self::open_queue(ifname, opts, 0, None)
    }

    /// Opens one port per receive queue of `ifname` (queues 0.., at most `MAX_QUEUES`):
    /// queue 0's port attaches the XDP program, which sends each other queue's frames to its
    /// own socket (RSS spreads flows over the queues). Every queue gets one, as a queue without
    /// a socket would pass its frames to the kernel stack, past the switch.
    pub fn open_queues(ifname: &str, opts: AfXdpOptions) -> io::Result<Vec<AfXdpPort>> {
        let mut first = Self::open(ifname, opts)?;
        let queues = rx_queues(first._promisc.as_raw_fd(), &ifname_cstring(ifname)?)
            .unwrap_or(1)
            .clamp(1, MAX_QUEUES);
        let mut ports = Vec::new();
        let mode = first.mode;
        for q in 1..queues {
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
                    "MTU {mtu} is too large for AF_XDP's {CHUNK_SIZE} B frames (at most {MAX_MTU}){FALLBACK}"
                )),
            ));
        }

        let fd = xdp_socket().map_err(|e| xdp_socket_error(e, &ctx))?;
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
        // The receiving socket has no TX ring: the sending socket has it (see the module doc).
        let half = opts.frames / 2;
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
        ] {
            set_opt(sock, libc::SOL_XDP, opt, &half)
                .map_err(|e| os_error(e, ctx(&format!("{what} of {half} entries"))))?;
        }
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
        addr.sxdp_ifindex = index;
        addr.sxdp_queue_id = queue;
        let bind = bind_queue(sock, &mut addr, opts.bind).map_err(|(tried, err)| {
            let hint = match err.raw_os_error() {
                Some(libc::EBUSY) => {
                    " (the queue already has an AF_XDP socket: another switch or OVS afxdp port?)"
                }
                Some(libc::ENETDOWN) => " (interface down: set it up first)",
                Some(libc::EOPNOTSUPP) => " (the driver has no zero-copy AF_XDP)",
                _ => "",
            };
            os_error(
                err,
                ctx(&format!(
                    "bind in {tried} mode to queue {queue}{hint}{FALLBACK}"
                )),
            )
        })?;

        // The sending socket: the same queue and UMEM (its buffer pool, so its fill and
        // completion rings too), a TX ring of its own; nobody waits on it.
        let tx_fd = xdp_socket().map_err(|e| xdp_socket_error(e, &ctx))?;
        let tx_sock = tx_fd.as_raw_fd();
        set_opt(tx_sock, libc::SOL_XDP, libc::XDP_TX_RING, &half).map_err(|e| {
            os_error(
                e,
                ctx(&format!("XDP_TX_RING of {half} entries (sending socket)")),
            )
        })?;
        // More frames per transmit call than the default 32 (kernels without it ignore it).
        let _ = set_opt(
            tx_sock,
            libc::SOL_XDP,
            XDP_MAX_TX_SKB_BUDGET,
            &(half as i32),
        );
        let tx_off: libc::xdp_mmap_offsets =
            get_opt(tx_sock, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS)
                .map_err(|e| os_error(e, ctx("XDP_MMAP_OFFSETS (sending socket)")))?;
        let tx = Ring::map(tx_sock, &tx_off.tx, half, libc::XDP_PGOFF_TX_RING)
            .map_err(map_err("TX ring"))?;
        // Mode flags (copy, zero-copy, need_wakeup) are the first socket's: a sharing socket
        // may not give any.
        addr.sxdp_flags = libc::XDP_SHARED_UMEM;
        addr.sxdp_shared_umem_fd = sock as u32;
        bind_xdp(tx_sock, &addr).map_err(|e| {
            os_error(
                e,
                ctx(&format!(
                    "bind of the sending socket to queue {queue}, sharing the UMEM{FALLBACK}"
                )),
            )
        })?;

        let bpf_err = |what: &str| {
            let what = what.to_owned();
            move |e: io::Error| {
                if is_permission(&e) {
                    io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        ctx(&format!("{what}: the XDP program needs CAP_BPF and CAP_NET_ADMIN: run as root{FALLBACK}")),
                    )
                } else {
                    os_error(e, ctx(&format!("{what}{FALLBACK}")))
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
        tracing::info!(
            port = ifname,
            queue,
            bind = %bind,
            need_wakeup = true,
            xdp = %mode,
            "af_xdp socket bound in {bind} mode with need_wakeup"
        );
        let mut port = AfXdpPort {
            name: ifname.to_owned(),
            program,
            mode,
            bind,
            rx,
            tx,
            fill,
            completion,
            fd,
            tx_fd,
            umem,
            _promisc: promisc,
            tx_free,
            stats: PortStats::default(),
        };
        // An empty fill ring may have stopped a zero-copy driver before it was filled.
        port.wake_fill()?;
        Ok(port)
    }
}

/// Binds socket `sock` to `addr`'s queue with need_wakeup, as `want` says: for
/// [`BindMode::Auto`] zero-copy first, then copy mode if the driver refuses (EOPNOTSUPP:
/// no zero-copy AF_XDP, as veth; EINVAL). Returns the mode bound, as the kernel reports it
/// (`XDP_OPTIONS`), or the mode tried last and its error. need_wakeup is in every kernel with
/// BPF links (5.4 against 5.9), which the XDP program needs anyway.
fn bind_queue(
    sock: RawFd,
    addr: &mut libc::sockaddr_xdp,
    want: BindMode,
) -> Result<BindMode, (BindMode, io::Error)> {
    let tries: &[BindMode] = match want {
        BindMode::Auto => &[BindMode::ZeroCopy, BindMode::Copy],
        BindMode::ZeroCopy => &[BindMode::ZeroCopy],
        BindMode::Copy => &[BindMode::Copy],
    };
    let mut last = None;
    for &mode in tries {
        addr.sxdp_flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                _ => libc::XDP_COPY,
            };
        match bind_retrying_busy(sock, addr) {
            Ok(()) => {
                let opts: libc::xdp_options =
                    get_opt(sock, libc::SOL_XDP, libc::XDP_OPTIONS).map_err(|e| (mode, e))?;
                return Ok(if opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0 {
                    BindMode::ZeroCopy
                } else {
                    BindMode::Copy
                });
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                last = Some((mode, e));
            }
            Err(e) => return Err((mode, e)),
        }
    }
    Err(last.expect("at least one mode tried"))
}

/// bind(2) of `sock` to `addr`, retrying a busy queue for up to [`BIND_BUSY_RETRY`]: a socket
/// closed just before (a restarted switch) frees its queue from a kernel work item, shortly
/// after close(2).
fn bind_retrying_busy(sock: RawFd, addr: &libc::sockaddr_xdp) -> io::Result<()> {
    let started = std::time::Instant::now();
    loop {
        match bind_xdp(sock, addr) {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY) && started.elapsed() < BIND_BUSY_RETRY =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            done => return done,
        }
    }
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
