//! Opening an AF_PACKET port: the socket and its options (virtio-net header, copy threshold,
//! qdisc bypass), the receive ring, the sendmmsg vectors, bind and promiscuous membership.

use std::cell::Cell;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use super::{AfPacketOptions, AfPacketPort, RingVersion, COPY_RCVBUF, RING_FRAME_SIZE};
use crate::port::sys::{
    ifindex, interface_not_found, join_promiscuous, set_int_opt, set_opt, PACKET_COPY_THRESH,
    PACKET_VNET_HDR, SO_RCVBUFFORCE,
};
use crate::port::vnet::{VnetRx, TX_HDR};
use crate::port::{os_error, PortStats};

impl AfPacketPort {
    /// Opens a port on interface `ifname` (in the calling thread's network namespace): RX ring
    /// set up, bound, promiscuous, non-blocking. Needs CAP_NET_RAW.
    pub fn open(ifname: &str, opts: AfPacketOptions) -> io::Result<AfPacketPort> {
        let ctx = |what: &str| format!("af_packet port '{ifname}': {what}");
        opts.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, ctx(&e)))?;
        let index = ifindex(ifname)?;

        // Protocol 0: receive nothing until bound to the interface below, after the ring exists.
        let fd = packet_socket(ifname)?;
        let sock = fd.as_raw_fd();

        let version = match opts.ring {
            RingVersion::V2 => libc::tpacket_versions::TPACKET_V2,
            RingVersion::V3 => libc::tpacket_versions::TPACKET_V3,
        };
        set_int_opt(
            sock,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            version as libc::c_int,
        )
        .map_err(|e| os_error(e, ctx(&format!("PACKET_VERSION {:?}", opts.ring))))?;
        // Before the ring: the kernel refuses both once it exists.
        set_int_opt(sock, libc::SOL_PACKET, PACKET_VNET_HDR, 1)
            .map_err(|e| os_error(e, ctx("PACKET_VNET_HDR")))?;
        set_int_opt(sock, libc::SOL_PACKET, PACKET_COPY_THRESH, 1)
            .map_err(|e| os_error(e, ctx("PACKET_COPY_THRESH")))?;
        if set_int_opt(sock, libc::SOL_SOCKET, SO_RCVBUFFORCE, COPY_RCVBUF).is_err() {
            // Without CAP_NET_ADMIN: as much as rmem_max allows.
            let _ = set_int_opt(sock, libc::SOL_SOCKET, libc::SO_RCVBUF, COPY_RCVBUF);
        }
        // Older kernels (< 4.20) lack it; outgoing frames are then skipped by pkttype in rx.
        let _ = set_int_opt(sock, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1);

        let frames_per_block = opts.block_size / RING_FRAME_SIZE;
        let req = libc::tpacket_req3 {
            tp_block_size: opts.block_size as libc::c_uint,
            tp_block_nr: opts.block_count as libc::c_uint,
            tp_frame_size: RING_FRAME_SIZE as libc::c_uint,
            tp_frame_nr: (frames_per_block * opts.block_count) as libc::c_uint,
            tp_retire_blk_tov: opts.block_timeout_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        let req_v2 = libc::tpacket_req {
            tp_block_size: req.tp_block_size,
            tp_block_nr: req.tp_block_nr,
            tp_frame_size: req.tp_frame_size,
            tp_frame_nr: req.tp_frame_nr,
        };
        let set = match opts.ring {
            RingVersion::V2 => set_opt(sock, libc::SOL_PACKET, libc::PACKET_RX_RING, &req_v2),
            RingVersion::V3 => set_opt(sock, libc::SOL_PACKET, libc::PACKET_RX_RING, &req),
        };
        set.map_err(|e| {
            os_error(
                e,
                ctx(&format!(
                    "PACKET_RX_RING ({} blocks of {} bytes; reduce them if memory is short)",
                    opts.block_count, opts.block_size
                )),
            )
        })?;
        let ring_len = opts.block_size * opts.block_count;
        // SAFETY: maps the ring the kernel just allocated for this socket; length and flags
        // are what packet_mmap expects. The mapping is unmapped in Drop.
        let ring = unsafe {
            libc::mmap(
                ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                sock,
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(os_error(
                io::Error::last_os_error(),
                ctx("mmap of the RX ring"),
            ));
        }

        // The sending socket: never waited on (see the module doc), so freeing what it sent
        // wakes nobody. Protocol 0 and bound with protocol 0, it receives nothing.
        let tx_fd = packet_socket(ifname)?;
        let tx = tx_fd.as_raw_fd();
        set_int_opt(tx, libc::SOL_PACKET, PACKET_VNET_HDR, 1)
            .map_err(|e| os_error(e, ctx("PACKET_VNET_HDR (sending socket)")))?;
        set_int_opt(tx, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1)
            .map_err(|e| os_error(e, ctx("PACKET_QDISC_BYPASS")))?;

        let mut iovs = vec![
            libc::iovec {
                iov_base: ptr::null_mut(),
                iov_len: 0,
            };
            2 * opts.tx_batch
        ];
        // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are a valid value.
        let mut msgs: Vec<libc::mmsghdr> =
            vec![unsafe { MaybeUninit::zeroed().assume_init() }; opts.tx_batch];
        for (msg, pair) in msgs.iter_mut().zip(iovs.chunks_exact_mut(2)) {
            // The kernel only reads the header, a static.
            pair[0].iov_base = TX_HDR.as_ptr() as *mut libc::c_void;
            pair[0].iov_len = TX_HDR.len();
            msg.msg_hdr.msg_iov = pair.as_mut_ptr();
            msg.msg_hdr.msg_iovlen = 2;
        }

        // From here on the port owns the ring, so an error below unmaps it through Drop.
        let port = AfPacketPort {
            name: ifname.to_owned(),
            ifindex: index,
            fd,
            tx_fd,
            version: opts.ring,
            ring: ring.cast(),
            block_size: opts.block_size,
            block_count: opts.block_count,
            cur_block: 0,
            block_open: false,
            pkts_left: 0,
            pkt_offset: 0,
            msgs,
            iovs,
            stats: PortStats::default(),
            vnet: VnetRx::new(opts.max_frame),
            kernel_drops: Cell::new(0),
        };

        // The sending socket first: the receiving one starts taking frames once bound.
        bind_to(tx, index, 0).map_err(|e| bind_error(e, ifname, "bind (sending socket)"))?;
        bind_to(sock, index, libc::ETH_P_ALL as u16).map_err(|e| bind_error(e, ifname, "bind"))?;
        join_promiscuous(sock, index)
            .map_err(|e| os_error(e, ctx("PACKET_ADD_MEMBERSHIP promiscuous")))?;
        Ok(port)
    }
}

/// A new non-blocking AF_PACKET raw socket of protocol 0 (it receives nothing until bound with
/// a protocol).
fn packet_socket(ifname: &str) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative return is a new descriptor that we
    // own from here on.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        let err = io::Error::last_os_error();
        let ctx = |what: &str| format!("af_packet port '{ifname}': {what}");
        return Err(match err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => io::Error::new(
                io::ErrorKind::PermissionDenied,
                ctx("opening an AF_PACKET socket needs CAP_NET_RAW: run as root"),
            ),
            _ => os_error(err, ctx("socket(AF_PACKET)")),
        });
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Binds packet socket `sock` to interface `index` for `protocol` (host order; 0: sending
/// only, no frame is delivered to the socket).
fn bind_to(sock: libc::c_int, index: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is a plain C struct for which all-zero bytes are a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { MaybeUninit::zeroed().assume_init() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol.to_be();
    addr.sll_ifindex = index as libc::c_int;
    // SAFETY: `addr` is a live sockaddr_ll and the length passed is its size.
    let ret = unsafe {
        libc::bind(
            sock,
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn bind_error(err: io::Error, ifname: &str, what: &str) -> io::Error {
    if err.raw_os_error() == Some(libc::ENODEV) {
        interface_not_found(ifname)
    } else {
        os_error(err, format!("af_packet port '{ifname}': {what}"))
    }
}
