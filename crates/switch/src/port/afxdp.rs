//! AF_XDP port: the fast path where the kernel allows it (DESIGN.md section 4, "Ports";
//! section 7 measured on veth: XDP drop 1.6-1.9 Mpps, AF_XDP RX in copy mode 1.4 Mpps, against
//! 0.75 Mpps for an AF_PACKET TPACKET_V3 ring). The socket and rings are system calls made
//! here; the XDP program is C (`crates/switch/bpf/xdp_port.bpf.c`) loaded with aya
//! ([`crate::ebpf`]).
//!
//! - **Sockets and UMEM.** One AF_XDP socket bound to queue 0 of the interface
//!   ([`AfXdpPort::open_queues`]: one per queue, each with its UMEM; the switch's uplink has
//!   one on every queue, a worker owning several reads them as one [`super::QueueSet`]), and
//!   a second one that only sends, bound to the same queue with `XDP_SHARED_UMEM` (it shares
//!   the first one's buffer pool: UMEM, fill and completion rings). The UMEM is an
//!   anonymous mapping of [`AfXdpOptions::frames`] chunks of 2 KiB: the first half feeds the
//!   fill ring (receive buffers), the second half is the transmit buffer pool. The fill, RX
//!   and completion rings are mmapped from the first socket, the TX ring from the second;
//!   each holds half the chunks, so the fill ring always has room for every receive buffer
//!   handed back.
//! - **Bind mode** ([`BindMode`]): zero-copy (`XDP_ZEROCOPY`: the driver DMAs into and out
//!   of the UMEM) where the driver offers it, else copy mode (`XDP_COPY`; veth refuses
//!   zero-copy with EOPNOTSUPP), always with `XDP_USE_NEED_WAKEUP`; each socket logs one line
//!   saying which ([`AfXdpPort::bind_mode`]).
//! - **need_wakeup** (Documentation/networking/af_xdp.rst): the port makes a system call
//!   only when a ring's `XDP_RING_NEED_WAKEUP` flag asks for one, counted in
//!   [`PortStats::kernel_wakeups`]: `sendto` for the TX ring (in copy mode the flag is always
//!   set, as only `sendto` transmits there; a zero-copy driver clears it while its NAPI loop
//!   sends) and `recvfrom` after refilling the fill ring (set by a zero-copy driver that
//!   stopped on an empty fill ring; never in copy mode). Receive readiness is unchanged:
//!   the kernel wakes the receiving socket's wait queue when it fills the RX ring, so the run
//!   loop's poll-or-block choice (`picnic_core::notify`) sees the descriptor as before.
//! - **Why two sockets**: the receiving socket is registered in the loop's epoll set for as
//!   long as the port is waited on (`WaitSet`). In copy mode the kernel sends each frame as
//!   an skb charged to the socket that sent it; freeing it (`xsk_destruct_skb`, then
//!   `sock_wfree`) wakes that socket's wait queue (`sock_def_write_space`), so on the
//!   receiving socket every frame sent ran the epoll callback with interrupts off: 12.2% of
//!   the switch's CPU under `sock_wfree` at picnic_xdp's maximum rate (perf; 1.3% after), as
//!   with AF_PACKET's second socket. Nobody waits on the sending socket: its wake-up finds
//!   an empty wait queue.
//! - **XDP program.** `bpf_redirect_map(xskmap, ctx->rx_queue_index, XDP_PASS)`: frames of
//!   queue 0 go to the socket, anything else to the kernel stack. The XSKMAP holds the socket
//!   at key 0 (queue `q`'s socket at key `q`; the program belongs to queue 0's port). On the uplink the same program drops the frames of throttled VMs first
//!   ([`AfXdpPort::early_drop`]). It is attached with a BPF link (`BPF_LINK_CREATE`), so it is
//!   detached when the port is dropped, also when the process dies. Attach mode: [`XdpMode::Auto`]
//!   tries the driver's native XDP first (veth has it) and falls back to generic (skb) XDP,
//!   which every device supports; [`AfXdpPort::attach_mode`] says which one is in use.
//! - **RX**: descriptors are taken from the RX ring, each frame is copied once into a pool
//!   [`Frame`] (as with AF_PACKET; handing out UMEM frames would change the `Frame` type, so
//!   zero-copy mode saves the kernel's copy, not this one), and its chunk goes straight back
//!   to the fill ring.
//! - **TX**: each frame is copied into a free transmit chunk and described on the TX ring;
//!   `sendto(MSG_DONTWAIT)` on the sending socket, when the TX ring asks for it, makes the
//!   kernel transmit (in copy mode the kernel sends only from that call, at most its per-call
//!   budget of frames, so the port calls it until the ring is drained or no progress is
//!   made). Chunks come back through the completion ring. Frames
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
//!
//! Split by concern: `afxdp/ring.rs` holds the UMEM mapping and the four rings shared with
//! the kernel, `afxdp/setup.rs` opens the socket (UMEM registration, ring mapping, bind, XDP
//! attach), this file is the port itself (receive, transmit, statistics).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr;

use super::sys::get_opt;
use super::{is_fatal_port_error, os_error, Backend, Port, PortStats};
use crate::ebpf::{EarlyDrop, PortProgram};
use crate::frame::{Frame, FramePool, DATA_CAP};

mod ring;
mod setup;

use ring::{umem_at, Mapping, Ring};

/// Bytes of one UMEM chunk (one frame buffer).
const CHUNK_SIZE: usize = 2048;
/// Fewest and most UMEM chunks a port may have.
const MIN_FRAMES: u32 = 64;
const MAX_FRAMES: u32 = 1 << 16;
/// Frames the kernel transmits per `sendto` in copy mode unless told otherwise
/// (`TX_BATCH_SIZE` in net/xdp/xsk.c).
const KERNEL_TX_BATCH: u32 = 32;

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

/// How the socket shares frames with the driver (the bind flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BindMode {
    /// Zero-copy if the driver offers it, copy mode otherwise (the default; veth: copy).
    #[default]
    Auto,
    /// `XDP_ZEROCOPY`: the driver receives into and sends from the UMEM itself; refused
    /// by drivers without AF_XDP support (veth).
    ZeroCopy,
    /// `XDP_COPY`: the kernel copies each frame between its buffers and the UMEM; every
    /// driver.
    Copy,
}

impl std::fmt::Display for BindMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BindMode::Auto => "auto",
            BindMode::ZeroCopy => "zero-copy",
            BindMode::Copy => "copy",
        })
    }
}

/// UMEM, bind and attach parameters of an [`AfXdpPort`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfXdpOptions {
    /// UMEM chunks of 2 KiB, half for receiving and half for sending; a power of two from 64
    /// to 65536. Default 4096 (8 MiB per port; 2048-entry rings).
    pub frames: u32,
    /// Attach mode of the XDP program.
    pub mode: XdpMode,
    /// Zero-copy or copy mode ([`BindMode::Auto`]: zero-copy where the driver offers it).
    pub bind: BindMode,
}

impl Default for AfXdpOptions {
    fn default() -> Self {
        AfXdpOptions {
            frames: 4096,
            mode: XdpMode::Auto,
            bind: BindMode::Auto,
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

/// A port on an AF_XDP socket bound to queue 0 of one interface (see the module doc).
pub struct AfXdpPort {
    name: String,
    /// The XDP program and its link (queue 0's port; None on the others); dropped first, so
    /// the program is detached before the
    /// socket goes away.
    program: Option<PortProgram>,
    mode: XdpMode,
    /// [`BindMode::ZeroCopy`] or [`BindMode::Copy`]: what the bind got.
    bind: BindMode,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    completion: Ring<u64>,
    /// The receiving socket: fill, RX and completion rings, the descriptor the loop waits on.
    fd: OwnedFd,
    /// The sending socket: the TX ring (see the module doc).
    tx_fd: OwnedFd,
    umem: Mapping,
    _promisc: OwnedFd,
    /// UMEM addresses of the transmit chunks not on the TX ring.
    tx_free: Vec<u64>,
    stats: PortStats,
}

// SAFETY: the raw pointers point into mappings the port owns; the port is used by one thread
// at a time (`Port` needs `&mut self` for all ring access).
unsafe impl Send for AfXdpPort {}

impl AfXdpPort {
    /// The uplink's early drop: the maps through which the switch makes this port's XDP
    /// program drop the frames of throttled VMs (taken once; None afterwards).
    pub fn early_drop(&mut self) -> Option<EarlyDrop> {
        self.program.as_mut()?.early_drop()
    }

    /// The attach mode in use: [`XdpMode::Native`] or [`XdpMode::Generic`].
    pub fn attach_mode(&self) -> XdpMode {
        self.mode
    }

    /// The bind mode in use: [`BindMode::ZeroCopy`] or [`BindMode::Copy`].
    pub fn bind_mode(&self) -> BindMode {
        self.bind
    }

    /// Whether the kernel asks, through the TX ring, to be woken to transmit: always in copy
    /// mode (the kernel sets the flag when the ring is made and nothing clears it: only
    /// `sendto` transmits there), in zero-copy mode while the driver is not already sending.
    pub fn tx_needs_wakeup(&self) -> bool {
        self.tx.needs_wakeup()
    }

    /// Wakes the driver to refill its receive queue from the fill ring when it asked
    /// (zero-copy mode: it stopped on an empty fill ring; in copy mode the kernel copies into
    /// fill-ring chunks as frames arrive and never asks).
    pub(super) fn wake_fill(&mut self) -> io::Result<()> {
        if !self.fill.needs_wakeup() {
            return Ok(());
        }
        self.stats.kernel_wakeups += 1;
        // SAFETY: recvfrom with no buffer and no address only runs the socket's wake-up.
        let ret = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if is_fatal_port_error(&err) {
                return Err(os_error(
                    err,
                    format!("af_xdp port '{}': wake-up", self.name),
                ));
            }
        }
        Ok(())
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

    /// Makes the kernel transmit the TX ring when it asks to be woken (need_wakeup): one
    /// `sendto` per kernel budget until the ring is drained, a call makes no progress (device
    /// busy, or a zero-copy driver sending on its own time; the next send retries) or the
    /// kernel no longer asks.
    fn kick(&mut self) -> io::Result<()> {
        let max_calls = self.tx.size / KERNEL_TX_BATCH + 2;
        for _ in 0..max_calls {
            let before = self.tx.in_flight();
            if before == 0 || !self.tx.needs_wakeup() {
                break;
            }
            self.stats.kernel_wakeups += 1;
            // SAFETY: sendto with no buffer and no address only wakes the socket's transmit.
            let ret = unsafe {
                libc::sendto(
                    self.tx_fd.as_raw_fd(),
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
            self.wake_fill()?;
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
        let kernel = |fd: &OwnedFd| {
            get_opt::<libc::xdp_statistics>(fd.as_raw_fd(), libc::SOL_XDP, libc::XDP_STATISTICS)
                .ok()
        };
        let rx_dropped =
            kernel(&self.fd).map_or(0, |s| s.rx_dropped + s.rx_ring_full + s.rx_invalid_descs);
        let tx_invalid = kernel(&self.tx_fd).map_or(0, |s| s.tx_invalid_descs);
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
