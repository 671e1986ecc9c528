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
//!   frame goes straight to the driver: the switch does its own scheduling), on a second
//!   socket that only sends. The receiving socket is registered in the loop's epoll set for as
//!   long as the port is waited on (`WaitSet`), and the kernel frees every sent frame's buffer
//!   against its socket, waking that socket's wait queue (`sock_def_write_space`): on the
//!   receiving socket that ran the epoll callback for every frame sent, 12.5% of the
//!   switch's CPU at its maximum rate (perf, issue 13). Nobody waits on the sending socket.
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

//!
//! Split by concern: `afpacket/setup.rs` opens the socket and maps the ring,
//! `afpacket/ring.rs` walks the receive ring (V2 slots, V3 blocks, whole-frame copies), the
//! virtio-net header is handled in `vnet.rs`, and this file is the port (send path,
//! statistics).

use std::cell::Cell;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::vnet::VnetRx;
use super::{is_fatal_port_error, is_transient_send_error, os_error, Backend, Port, PortStats};
use crate::frame::{Frame, FramePool, DATA_CAP};

mod ring;
mod setup;

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
    /// The interface the socket is bound to (a name can later name another one).
    ifindex: u32,
    /// The receiving socket: the ring, statistics, the descriptor the loop waits on.
    fd: OwnedFd,
    /// The sending socket (see the module doc).
    tx_fd: OwnedFd,
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
        Ok(self.recv_v3(pool, out, max))
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
                    self.tx_fd.as_raw_fd(),
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

    fn reuse(&mut self, max_frame: usize) -> bool {
        self.reset_for_reuse(max_frame)
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
            rx_taken: self.stats.rx_taken + self.kernel_drops.get(),
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
