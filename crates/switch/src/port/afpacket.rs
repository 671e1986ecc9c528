//! AF_PACKET port: the portable fast path for veths and NICs (DESIGN.md section 4, "Ports";
//! section 7 measured ~750 kpps RX with a TPACKET_V3 ring and ~430 kpps TX with sendmmsg and
//! PACKET_QDISC_BYPASS on this kernel).
//!
//! - **RX, TPACKET_V2 (default)**: a ring of fixed 2 KiB slots; the kernel hands over each
//!   frame as soon as it is written (`tp_status` per slot), so an idle port adds no delay and
//!   a blocked switch wakes per frame. This is what keeps a latency-sensitive tenant's
//!   round trip close to a kernel bridge's (measured: the V3 block timeout added ~0.6 ms per
//!   hop at low load, 2.4 ms per RPC over two switches).
//! - **RX, TPACKET_V3 (`ring = V3`)**: a ring mmapped from the socket. The kernel fills blocks of frames and
//!   hands a whole block over (`TP_STATUS_USER`) when it is full or when the block timeout
//!   expires; `recv_batch` walks the frames in place and copies each one once into a pool
//!   [`Frame`], then gives the block back. No system call per frame or per batch.
//!   Consequence: at low load a frame can wait up to the block timeout (plus timer
//!   granularity) before the switch sees it; at load blocks fill and hand over immediately.
//! - **TX**: `sendmmsg` of up to `tx_batch` frames per call, with `PACKET_QDISC_BYPASS` (the
//!   frame goes straight to the driver: the switch does its own scheduling).
//! - The socket is bound to one interface for all protocols, joins it in promiscuous mode
//!   (`PACKET_MR_PROMISC`: frames to any MAC are seen) and sets `PACKET_IGNORE_OUTGOING` so the
//!   switch does not receive its own transmissions; frames marked `PACKET_OUTGOING` are also
//!   skipped in case that option is missing.
//! - **Offloads.** A veth whose peer has transmit checksum offload and TSO on (the Linux
//!   defaults) hands over TCP/UDP frames with partial checksums (`CHECKSUM_PARTIAL`) and
//!   super-frames of up to 64 KiB. The socket sets `PACKET_VNET_HDR`, so the kernel writes a
//!   virtio-net header before every frame in the ring and the port completes checksums and
//!   segments super-frames (see the `vnet` module); sends carry a zero header. A super-frame
//!   does not fit a 2 KiB V2 slot: with `PACKET_COPY_THRESH` the kernel also queues the
//!   whole frame on the socket and marks the slot `TP_STATUS_COPY`, and the port reads it
//!   from there (recvmsg) into its super-frame buffer; the socket's receive buffer is raised
//!   to 4 MiB (SO_RCVBUFFORCE) so copies are not refused while the ring has room. The V3
//!   ring has no such copy: a super-frame longer than a block (minus its header) is truncated
//!   by the kernel and counted in [`PortStats::rx_oversize`], so V3 with offloads wants
//!   `block_size` of 128 KiB. Non-GSO frames longer than [`DATA_CAP`] (jumbo frames) are
//!   counted there too and dropped.

use std::cell::Cell;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use picnic_wire::offload::VNET_HDR_LEN;

use super::sys::{
    ifindex, interface_not_found, join_promiscuous, set_int_opt, set_opt, PACKET_COPY_THRESH,
    PACKET_VNET_HDR, SO_RCVBUFFORCE, TP_STATUS_COPY,
};
use super::vnet::{Taken, VnetRx, TX_HDR};
use super::{is_fatal_port_error, is_transient_send_error, os_error, Backend, Port, PortStats};
use crate::frame::{Frame, FramePool, DATA_CAP};

/// Slot size the kernel is told for the V3 ring (V3 packs frames of any size into a block;
/// the value only has to be valid).
const RING_FRAME_SIZE: usize = 2048;
/// Largest `vlen` sendmmsg accepts (UIO_MAXIOV).
const MAX_TX_BATCH: usize = 1024;
/// Receive buffer for the whole-frame copies of super-frames (`TP_STATUS_COPY`): about 60
/// of them may wait while the ring holds their slots.
const COPY_RCVBUF: libc::c_int = 4 << 20;
/// Smallest `max_frame` accepted: room for headers and a useful segment.
const MIN_MAX_FRAME: usize = 128;

/// The receive ring layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingVersion {
    /// Fixed slots, handed over frame by frame: lowest latency (the default).
    #[default]
    V2,
    /// Variable-size frames packed in blocks, handed over block by block: fewer cache misses
    /// at high rate, up to `block_timeout_ms` of added latency at low rate.
    V3,
}

/// Ring and batching parameters of an [`AfPacketPort`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfPacketOptions {
    /// Receive ring layout.
    pub ring: RingVersion,
    /// Bytes per RX ring block; a multiple of the page size, at least 4096. Default 64 KiB.
    pub block_size: usize,
    /// Number of RX ring blocks. Default 64: a 4 MiB ring (~2,600 full-size or ~29,000
    /// 64 B frames). Many small blocks beat few large ones of the same total: the kernel
    /// drops everything while the block it wants next is still being read, and a small block
    /// is handed back sooner (measured on this VM under CPU contention: 4 x 1 MiB dropped
    /// 5-20% of a 300 kpps flood, 64 x 64 KiB none).
    pub block_count: usize,
    /// Milliseconds after which the kernel hands over a block that is not full; bounds the
    /// added latency at low load. 1 to 1000; default 1.
    pub block_timeout_ms: u32,
    /// Frames per sendmmsg call, 1 to 1024. Default 64.
    pub tx_batch: usize,
    /// Longest frame (Ethernet header included) the port segments a GSO super-frame into;
    /// at least 128, clamped to [`DATA_CAP`]. Default [`DATA_CAP`]; the switch gives VM
    /// ports the uplink MTU less the overlay's overhead.
    pub max_frame: usize,
}

impl Default for AfPacketOptions {
    fn default() -> Self {
        AfPacketOptions {
            ring: RingVersion::V2,
            block_size: 64 << 10,
            block_count: 64,
            block_timeout_ms: 1,
            tx_batch: 64,
            max_frame: DATA_CAP,
        }
    }
}

impl AfPacketOptions {
    fn validate(&self) -> Result<(), String> {
        // SAFETY: sysconf takes no pointers.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        if self.block_size < page || self.block_size % page != 0 || self.block_size > 1 << 30 {
            return Err(format!(
                "block_size {} must be a multiple of the page size {page} and at most 1 GiB",
                self.block_size
            ));
        }
        if self.block_count == 0 || self.block_count.saturating_mul(self.block_size) > 1 << 31 {
            return Err(format!(
                "block_count {} must be at least 1, with a ring of at most 2 GiB",
                self.block_count
            ));
        }
        if !(1..=1000).contains(&self.block_timeout_ms) {
            return Err(format!(
                "block_timeout_ms {} must be 1 to 1000",
                self.block_timeout_ms
            ));
        }
        if self.max_frame < MIN_MAX_FRAME {
            return Err(format!(
                "max_frame {} must be at least {MIN_MAX_FRAME}",
                self.max_frame
            ));
        }
        if !(1..=MAX_TX_BATCH).contains(&self.tx_batch) {
            return Err(format!(
                "tx_batch {} must be 1 to {MAX_TX_BATCH}",
                self.tx_batch
            ));
        }
        Ok(())
    }
}

/// A port on an AF_PACKET socket bound to one interface (see the module doc).
pub struct AfPacketPort {
    name: String,
    fd: OwnedFd,
    /// Ring layout; with V2, `cur_block` is the current slot of RING_FRAME_SIZE bytes.
    version: RingVersion,
    /// The mmapped RX ring: `block_count` blocks of `block_size` bytes.
    ring: *mut u8,
    block_size: usize,
    block_count: usize,
    /// Block the reader is in or waits for.
    cur_block: usize,
    /// Whether `cur_block` has been handed to us and is being walked.
    block_open: bool,
    /// Frames of `cur_block` not yet read.
    pkts_left: u32,
    /// Offset in `cur_block` of the next frame header.
    pkt_offset: usize,
    /// sendmmsg headers, each pointing at its pair of `iovs`: the virtio-net header, then the
    /// frame (fixed at open; the vectors never grow, so the pointers stay valid).
    msgs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    stats: PortStats,
    /// Offloads of received frames: checksum completion, segmentation.
    vnet: VnetRx,
    /// tp_drops accumulated from PACKET_STATISTICS (which resets on each read).
    kernel_drops: Cell<u64>,
}

// SAFETY: the ring mapping and the iovec/mmsghdr pointers are owned by this port alone (no
// other handle to them exists) and are only used through `&mut self`, so moving the port to
// another thread is sound.
unsafe impl Send for AfPacketPort {}

impl AfPacketPort {
    /// Opens a port on interface `ifname` (in the calling thread's network namespace): RX ring
    /// set up, bound, promiscuous, non-blocking. Needs CAP_NET_RAW.
    pub fn open(ifname: &str, opts: AfPacketOptions) -> io::Result<AfPacketPort> {
        let ctx = |what: &str| format!("af_packet port '{ifname}': {what}");
        opts.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, ctx(&e)))?;
        let index = ifindex(ifname)?;

        // Protocol 0: receive nothing until bound to the interface below, after the ring exists.
        // SAFETY: socket(2) takes no pointers; a non-negative return is a new descriptor that
        // we own from here on.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    ctx("opening an AF_PACKET socket needs CAP_NET_RAW: run as root"),
                ),
                _ => os_error(err, ctx("socket(AF_PACKET)")),
            });
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
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
        set_int_opt(sock, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1)
            .map_err(|e| os_error(e, ctx("PACKET_QDISC_BYPASS")))?;

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
            fd,
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

        // SAFETY: sockaddr_ll is a plain C struct for which all-zero bytes are a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { MaybeUninit::zeroed().assume_init() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
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
            let err = io::Error::last_os_error();
            return Err(if err.raw_os_error() == Some(libc::ENODEV) {
                interface_not_found(ifname)
            } else {
                os_error(err, ctx("bind"))
            });
        }
        join_promiscuous(sock, index)
            .map_err(|e| os_error(e, ctx("PACKET_ADD_MEMBERSHIP promiscuous")))?;
        Ok(port)
    }

    /// Start of ring block `i`.
    fn block(&self, i: usize) -> *mut u8 {
        // SAFETY: i < block_count, so the offset stays inside the mapping.
        unsafe { self.ring.add(i * self.block_size) }
    }

    /// The ownership word of ring block `i`, shared with the kernel.
    fn block_status(&self, i: usize) -> &AtomicU32 {
        let offset = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
            + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status);
        // SAFETY: the word lies inside block `i` of the mapping, is 4-byte aligned (blocks are
        // page aligned) and is only accessed atomically, by us and by the kernel.
        unsafe { AtomicU32::from_ptr(self.block(i).add(offset).cast()) }
    }

    /// Gives the current block back to the kernel and moves to the next one.
    fn release_block(&mut self) {
        // Release: our reads of the block happen before the kernel may overwrite it.
        self.block_status(self.cur_block)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.cur_block = (self.cur_block + 1) % self.block_count;
        self.block_open = false;
        self.pkts_left = 0;
    }
}

/// Ring waits longer than this are taken for timestamps from another clock.
const MAX_RING_WAIT_NS: u64 = 1_000_000_000;

/// CLOCK_REALTIME now, ns (the clock of the kernel's ring timestamps).
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl AfPacketPort {
    /// TPACKET_V2 receive: walk the fixed slots while the kernel has handed them over.
    fn recv_v2(&mut self, pool: &mut FramePool, out: &mut Vec<Frame>, max: usize) -> usize {
        let slots = self.block_size * self.block_count / RING_FRAME_SIZE;
        let mut n = 0;
        // The kernel stamps each slot (CLOCK_REALTIME) when it fills it: how long a frame
        // waited in the ring is part of its latency through the switch.
        let read_at = realtime_ns();
        loop {
            n += self.vnet.drain(pool, out, max - n, &mut self.stats);
            if n >= max || self.vnet.busy() {
                break;
            }
            // SAFETY: cur_block < slots, so the slot lies inside the mapping.
            let slot = unsafe { self.ring.add(self.cur_block * RING_FRAME_SIZE) };
            // SAFETY: tp_status is the slot's first, 4-byte aligned word, shared with the kernel
            // and only accessed atomically.
            let status = unsafe { AtomicU32::from_ptr(slot.cast()) };
            // Acquire: the kernel's writes of the slot happen before we read them.
            let st = status.load(Ordering::Acquire);
            if st & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the slot is ours (TP_STATUS_USER) and starts with its header, followed by
            // the sockaddr_ll at TPACKET2_HDRLEN - sizeof(sockaddr_ll).
            let (hdr, pkttype) = unsafe {
                let hdr = ptr::read(slot as *const libc::tpacket2_hdr);
                let sll_at = libc::TPACKET2_HDRLEN - size_of::<libc::sockaddr_ll>();
                let sll = ptr::read(slot.add(sll_at) as *const libc::sockaddr_ll);
                (hdr, sll.sll_pkttype)
            };
            let data_at = hdr.tp_mac as usize;
            let snaplen = hdr.tp_snaplen as usize;
            let ours = pkttype != libc::PACKET_OUTGOING;
            let before = out.len();
            let mut taken = Taken::Done;
            if st & TP_STATUS_COPY != 0 {
                // Too big for the slot: the whole frame waits on the socket, in slot order.
                self.recv_copy(ours, pool, out);
            } else if data_at < VNET_HDR_LEN || data_at + snaplen > RING_FRAME_SIZE {
                self.stats.rx_oversize += 1;
            } else if ours {
                if snaplen < hdr.tp_len as usize {
                    self.stats.rx_oversize += 1;
                } else {
                    // SAFETY: the header and `data_at..data_at + snaplen` are inside the slot
                    // (checked above), which is ours until handed back below.
                    let (vh, bytes) = unsafe {
                        (
                            std::slice::from_raw_parts(
                                slot.add(data_at - VNET_HDR_LEN),
                                VNET_HDR_LEN,
                            ),
                            std::slice::from_raw_parts(slot.add(data_at), snaplen),
                        )
                    };
                    taken = self.vnet.take_slice(vh, bytes, pool, out, &mut self.stats);
                }
            }
            if taken == Taken::NoFrame {
                break;
            }
            let stamped = hdr.tp_sec as u64 * 1_000_000_000 + hdr.tp_nsec as u64;
            let wait = read_at.saturating_sub(stamped);
            // A timestamp from another clock (a delivery time left on the skb) is no wait.
            if stamped > 0 && wait < MAX_RING_WAIT_NS {
                for f in &mut out[before..] {
                    f.set_ring_wait(wait);
                }
            }
            n += out.len() - before;
            // Release: our reads of the slot happen before the kernel may overwrite it.
            status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.cur_block = (self.cur_block + 1) % slots;
        }
        n
    }

    /// Reads the whole-frame copy the kernel queued for a `TP_STATUS_COPY` slot into the
    /// super-frame buffer and takes it (or discards it when `ours` is false).
    fn recv_copy(&mut self, ours: bool, pool: &mut FramePool, out: &mut Vec<Frame>) {
        let mut vh = [0u8; VNET_HDR_LEN];
        let buf = self.vnet.buf_mut();
        let mut iov = [
            libc::iovec {
                iov_base: vh.as_mut_ptr().cast(),
                iov_len: VNET_HDR_LEN,
            },
            libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            },
        ];
        // SAFETY: msghdr is a plain C struct for which all-zero bytes are a valid value.
        let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        // SAFETY: `msg` points at two live, exclusively borrowed buffers of the lengths said.
        let ret = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if !ours {
            return;
        }
        if ret < VNET_HDR_LEN as isize {
            // The copy was not there (cannot happen while the socket receives nothing else).
            self.stats.rx_dropped += 1;
        } else if msg.msg_flags & libc::MSG_TRUNC != 0 {
            self.stats.rx_oversize += 1;
        } else {
            let len = ret as usize - VNET_HDR_LEN;
            self.vnet
                .take_buffered(&vh, len, pool, out, &mut self.stats);
        }
    }
}

impl std::fmt::Debug for AfPacketPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacketPort")
            .field("name", &self.name)
            .field("fd", &self.fd)
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Drop for AfPacketPort {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; nothing refers to it afterwards.
        unsafe { libc::munmap(self.ring.cast(), self.block_size * self.block_count) };
    }
}

/// Offset of the sockaddr_ll that follows each tpacket3_hdr in the ring (TPACKET_ALIGN).
const SLL_OFFSET: usize = (size_of::<libc::tpacket3_hdr>() + libc::TPACKET_ALIGNMENT - 1)
    & !(libc::TPACKET_ALIGNMENT - 1);

impl Port for AfPacketPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::AfPacket
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        if self.version == RingVersion::V2 {
            return Ok(self.recv_v2(pool, out, max));
        }
        let mut n = 0;
        loop {
            n += self.vnet.drain(pool, out, max - n, &mut self.stats);
            if n >= max || self.vnet.busy() {
                break;
            }
            if !self.block_open {
                // Acquire: the kernel's writes of the block happen before we read them.
                let status = self.block_status(self.cur_block).load(Ordering::Acquire);
                if status & libc::TP_STATUS_USER == 0 {
                    break;
                }
                let desc = self.block(self.cur_block) as *const libc::tpacket_block_desc;
                // SAFETY: the block is ours (TP_STATUS_USER) and starts with its descriptor.
                let bh = unsafe { ptr::read(ptr::addr_of!((*desc).hdr.bh1)) };
                self.block_open = true;
                self.pkts_left = bh.num_pkts;
                self.pkt_offset = bh.offset_to_first_pkt as usize;
                if self.pkts_left == 0 {
                    self.release_block();
                }
                continue;
            }
            let block = self.block(self.cur_block);
            // Defensive bounds check on what the kernel wrote, so a bad offset can never make
            // us read outside the block.
            if self.pkt_offset + SLL_OFFSET + size_of::<libc::sockaddr_ll>() > self.block_size {
                self.stats.rx_dropped += u64::from(self.pkts_left);
                self.release_block();
                continue;
            }
            // SAFETY: in bounds (checked above) and the block is ours; the headers are at
            // TPACKET_ALIGNMENT-aligned offsets, enough for their fields.
            let (hdr, pkttype) = unsafe {
                let at = block.add(self.pkt_offset);
                let hdr = ptr::read(at as *const libc::tpacket3_hdr);
                let sll = ptr::read(at.add(SLL_OFFSET) as *const libc::sockaddr_ll);
                (hdr, sll.sll_pkttype)
            };
            let data_at = self.pkt_offset + hdr.tp_mac as usize;
            let snaplen = hdr.tp_snaplen as usize;
            if data_at + snaplen > self.block_size {
                self.stats.rx_dropped += u64::from(self.pkts_left);
                self.release_block();
                continue;
            }
            if pkttype != libc::PACKET_OUTGOING {
                if snaplen < hdr.tp_len as usize || (hdr.tp_mac as usize) < VNET_HDR_LEN {
                    self.stats.rx_oversize += 1;
                } else {
                    // SAFETY: `data_at..data_at + snaplen` is inside the block (checked above)
                    // and the virtio-net header right before it, after the frame's own header.
                    let (vh, bytes) = unsafe {
                        (
                            std::slice::from_raw_parts(
                                block.add(data_at - VNET_HDR_LEN),
                                VNET_HDR_LEN,
                            ),
                            std::slice::from_raw_parts(block.add(data_at), snaplen),
                        )
                    };
                    let before = out.len();
                    if self.vnet.take_slice(vh, bytes, pool, out, &mut self.stats) == Taken::NoFrame
                    {
                        break;
                    }
                    n += out.len() - before;
                }
            }
            self.pkts_left -= 1;
            self.pkt_offset += hdr.tp_next_offset as usize;
            if self.pkts_left == 0 {
                self.release_block();
            }
        }
        Ok(n)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        let mut sent = 0;
        while !frames.is_empty() {
            let batch = frames.len().min(self.msgs.len());
            for (pair, frame) in self.iovs.chunks_exact_mut(2).zip(frames.iter()) {
                pair[1].iov_base = frame.data().as_ptr() as *mut libc::c_void;
                pair[1].iov_len = frame.len();
            }
            // SAFETY: the first `batch` headers point at iovec pairs that point at the static
            // virtio-net header and the live data of the first `batch` frames, which are not touched until the call returns; the
            // socket is bound, so no destination address is needed.
            let ret = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.msgs.as_mut_ptr(),
                    batch as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if ret > 0 {
                let ret = ret as usize;
                for frame in frames.drain(..ret) {
                    self.stats.tx_frames += 1;
                    self.stats.tx_bytes += frame.len() as u64;
                    pool.put(frame);
                }
                sent += ret;
                continue;
            }
            let err = io::Error::last_os_error();
            if is_transient_send_error(&err) {
                break;
            }
            if is_fatal_port_error(&err) {
                return Err(os_error(
                    err,
                    format!("af_packet port '{}': send", self.name),
                ));
            }
            // Refused for good (too big, link down): drop the first frame, as a NIC would.
            self.stats.tx_errors += 1;
            pool.put(frames.remove(0));
        }
        Ok(sent)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        // SAFETY: tpacket_stats_v3 is a plain C struct for which all-zero bytes are valid.
        let mut st: libc::tpacket_stats_v3 = unsafe { MaybeUninit::zeroed().assume_init() };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: `st` and `len` are live and `len` is the size of `st`.
        let ret = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if ret == 0 {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(st.tp_drops));
        }
        PortStats {
            rx_dropped: self.stats.rx_dropped + self.kernel_drops.get(),
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        assert!(AfPacketOptions::default().validate().is_ok());
        let bad = [
            AfPacketOptions {
                block_size: 1000,
                ..Default::default()
            },
            AfPacketOptions {
                block_count: 0,
                ..Default::default()
            },
            AfPacketOptions {
                block_timeout_ms: 0,
                ..Default::default()
            },
            AfPacketOptions {
                tx_batch: 0,
                ..Default::default()
            },
            AfPacketOptions {
                tx_batch: 2000,
                ..Default::default()
            },
        ];
        for opts in bad {
            assert!(opts.validate().is_err(), "{opts:?}");
        }
    }

    #[test]
    fn missing_interface_is_named() {
        let err = AfPacketPort::open("pn-no-such-if", AfPacketOptions::default()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("'pn-no-such-if' not found"),
            "{err}"
        );
    }
}
