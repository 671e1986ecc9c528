//! Port backends: where frames enter and leave the switch (DESIGN.md section 4, "Ports").
//!
//! A [`Port`] moves batches of [`Frame`]s between the kernel (or a test) and the switch,
//! never blocking; the run loop spins while there is work and then blocks on the ports'
//! descriptors in a [`WaitSet`], an epoll set kept across waits ([`wait_readable`] is the
//! one-off `ppoll` form) (Rizzo et al.: spin briefly, then block).
//! Backends: [`AfPacketPort`] for veths and NICs, [`AfXdpPort`] for the same where XDP is
//! allowed (faster), [`TapHostPort`] for the host side of a TAP device a VMM holds (AF_PACKET
//! on its netdev), [`TapPort`] for a TAP whose queue the switch holds itself,
//! [`VhostUserPort`] for a VM whose virtio-net queues the switch serves over vhost-user,
//! [`MemoryPort`] for tests and the simulator.
//! [`QueueSet`] reads several queue sockets of one interface as one port (a worker owning
//! several of the uplink's AF_XDP queues).

mod afpacket;
mod afxdp;
pub(crate) mod features;
mod memory;
mod queues;
pub(crate) mod sys;
mod tap;
mod taphost;
mod vhost_user;
mod vnet;
mod waitset;

pub use afpacket::{AfPacketOptions, AfPacketPort, RingVersion};
pub use afxdp::{AfXdpOptions, AfXdpPort, BindMode, XdpMode};
pub use memory::{MemoryPort, MemoryPortHandle};
pub use queues::QueueSet;
pub use tap::TapPort;
pub use taphost::{create_persistent_tap, tap_state, TapHostPort, TapState};
pub use vhost_user::VhostUserPort;
pub use waitset::WaitSet;

pub use crate::config::Backend;

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::frame::{Frame, FramePool};

/// Counters of one port since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PortStats {
    /// Frames handed to the switch by `recv_batch`.
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames lost before the switch saw them: the kernel RX ring was full (AF_PACKET
    /// `tp_drops`) or the memory port's queue was full.
    pub rx_dropped: u64,
    /// Received frames longer than [`crate::frame::DATA_CAP`] that are not GSO super-frames
    /// (jumbo frames), or that the kernel truncated, dropped.
    pub rx_oversize: u64,
    /// Received frames whose L4 checksum the sender left partial (transmit checksum offload,
    /// the veth/TAP default: virtio-net `NEEDS_CSUM`), completed by the port (see `vnet`).
    pub rx_csum_partial: u64,
    /// Received TSO/USO super-frames (virtio-net `gso_type`), segmented by the port.
    pub rx_gso_frames: u64,
    /// Frames made from those super-frames (also counted in `rx_frames`).
    pub rx_gso_segments: u64,
    /// Received frames dropped because their offload could not be finished: unknown GSO
    /// type, checksum offsets outside the frame, malformed headers, or a UDP segment longer
    /// than the port's frame limit.
    pub rx_offload_errors: u64,
    /// Receive ring entries the port took (whatever became of them) plus those the kernel
    /// dropped for a full ring: with the kernel fast path, what tells that every frame it
    /// handed over has left the ring (`engine::fastpath::Handback`).
    pub rx_taken: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames the kernel refused for good (too big, link down, ...), dropped.
    pub tx_errors: u64,
    /// vhost-user: descriptor chains the guest posted that could not be used (buffers outside
    /// its memory, shorter than the virtio-net header), given back unused.
    pub ring_errors: u64,
    /// AF_XDP: system calls made only to wake the kernel because a ring asked for it
    /// (need_wakeup: `sendto` to transmit, `recvfrom` to refill the driver's receive queue).
    pub kernel_wakeups: u64,
}

/// A switch port: non-blocking batched receive and send of frames.
pub trait Port: Send {
    /// The interface or port name.
    fn name(&self) -> &str;

    /// The I/O mechanism.
    fn backend(&self) -> Backend;

    /// Non-blocking: moves up to `max` received frames (taken from `pool`) onto the end of
    /// `out`; `Ok(0)` when nothing is pending. When `pool` is exhausted, reception stops and
    /// the rest stays pending (in the kernel, which drops and counts once its buffer is full).
    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize>;

    /// Non-blocking: sends frames from the front of `frames`, returning sent frames to `pool`;
    /// frames the kernel would not take now (EAGAIN/ENOBUFS) stay in `frames` for a later call.
    /// Frames refused for good are returned to `pool` and counted in
    /// [`PortStats::tx_errors`]. Returns how many were sent. An `Err` means the port itself is
    /// unusable (device gone).
    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize>;

    /// A descriptor that becomes readable when frames are pending (for poll/epoll waits), if
    /// the backend has one.
    fn raw_fd(&self) -> Option<RawFd>;

    /// Counters since the port was opened.
    fn stats(&self) -> PortStats;

    /// Readies a port a removed VM gave up for a VM added on the same interface, as if just
    /// opened with frame limit `max_frame`: what it received meanwhile is discarded and its
    /// counters start again from zero. False when it cannot be (the backend does not support
    /// it, or the interface is gone or was replaced); the caller then closes it and opens a
    /// new one. Lets the switch keep a removed VM's port open for a while (docs/switch.md
    /// "Live changes": closing and opening an AF_PACKET socket waits for three RCU grace
    /// periods, whose work lands on the neighbours' CPUs).
    fn reuse(&mut self, max_frame: usize) -> bool {
        let _ = max_frame;
        false
    }
}

/// Most descriptors [`wait_readable`] polls without allocating.
/// Joins AF_PACKET socket `fd` to fanout group `group` in hash mode: the kernel spreads the
/// interface's frames over the group's sockets by flow hash, so a flow stays on one socket
/// (one worker) and its frames in order.
pub fn join_fanout(fd: RawFd, group: u16) -> io::Result<()> {
    let arg = libc::c_int::from(group) | ((libc::PACKET_FANOUT_HASH as libc::c_int) << 16);
    sys::set_opt(fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
}

const POLL_STACK_FDS: usize = 32;

/// Blocks until one of `fds` is readable (or reports an error/hang-up, which the next receive
/// will surface) or `timeout` passes: the blocking half of the run loop's spin-then-block wait.
/// Returns whether a descriptor is ready; `Ok(false)` on timeout or when a signal interrupted
/// the wait. Uses ppoll(2), so sub-millisecond timeouts are honoured (up to timer slack).
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<bool> {
    let mut on_stack = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; POLL_STACK_FDS];
    let mut on_heap = Vec::new();
    let pollfds: &mut [libc::pollfd] = if fds.len() <= POLL_STACK_FDS {
        &mut on_stack[..fds.len()]
    } else {
        on_heap.resize(fds.len(), on_stack[0]);
        &mut on_heap
    };
    for (p, &fd) in pollfds.iter_mut().zip(fds) {
        *p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let ts = timespec(timeout);
    // SAFETY: `pollfds` is a valid, exclusively borrowed array of `pollfds.len()` entries and
    // `ts` a valid timespec; a null signal mask leaves the mask unchanged.
    let ret = unsafe {
        libc::ppoll(
            pollfds.as_mut_ptr(),
            pollfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    wait_outcome(ret)
}

/// A wait's timeout as the kernel takes it.
fn timespec(timeout: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    }
}

/// What a wait system call's return says: a descriptor is ready, or not (timeout, or a signal
/// interrupted the wait), or an error (errno read here, right after the call).
fn wait_outcome(ret: libc::c_int) -> io::Result<bool> {
    if ret < 0 {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(err)
        };
    }
    Ok(ret > 0)
}

/// Checks an interface name and makes it a C string: non-empty, shorter than IFNAMSIZ, no NUL
/// or '/'.
fn ifname_cstring(ifname: &str) -> io::Result<std::ffi::CString> {
    if ifname.is_empty()
        || ifname.len() >= libc::IFNAMSIZ
        || ifname
            .bytes()
            .any(|b| b == 0 || b == b'/' || b.is_ascii_whitespace())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "invalid interface name '{ifname}': 1 to {} bytes, no '/', NUL or whitespace",
                libc::IFNAMSIZ - 1
            ),
        ));
    }
    std::ffi::CString::new(ifname).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Wraps an OS error with what was being done, keeping its kind.
fn os_error(err: io::Error, context: impl fmt::Display) -> io::Error {
    io::Error::new(err.kind(), format!("{context}: {err}"))
}

/// Sends `frames` on `port`, the uplink if `uplink`. A VM port whose device went away
/// (moved to another namespace or deleted, as a migrating VM's interface is before the
/// control plane removes the VM here) drops the frames it was given, logged: the switch goes
/// on serving its other ports. The uplink's failure is the switch's (Err).
pub fn send_or_drop(
    port: &mut dyn Port,
    uplink: bool,
    frames: &mut Vec<Frame>,
    pool: &mut FramePool,
) -> anyhow::Result<()> {
    match port.send_batch(frames, pool) {
        Ok(_) => Ok(()),
        Err(e) if !uplink => {
            tracing::warn!(
                port = port.name(),
                dropped = frames.len(),
                "send failed ({e}); frames dropped until a live change removes or reopens the port"
            );
            frames.drain(..).for_each(|f| pool.put(f));
            Ok(())
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("send on {}", port.name()))),
    }
}

/// Whether a send error only means "not now" (the frame should be retried later).
fn is_transient_send_error(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::ENOBUFS) | Some(libc::EINTR)
    )
}

/// Whether a send error means the device itself is gone (the port is unusable).
fn is_fatal_port_error(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::ENXIO) | Some(libc::ENODEV) | Some(libc::EBADF) | Some(libc::EBADFD)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked() {
        assert!(ifname_cstring("veth0").is_ok());
        assert!(ifname_cstring("fifteen-chars-x").is_ok());
        for bad in ["", "sixteen-chars-xx", "a/b", "a b", "a\0b"] {
            let err = ifname_cstring(bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn wait_readable_times_out_on_nothing() {
        assert!(!wait_readable(&[], Duration::ZERO).unwrap());
    }

    #[test]
    fn backend_display_names_the_mechanism() {
        assert!(Backend::AfPacket.to_string().contains("sendmmsg"));
        assert!(Backend::AfXdp.to_string().starts_with("af_xdp"));
        assert!(Backend::Tap.to_string().starts_with("tap"));
        assert!(Backend::TapQueue.to_string().starts_with("tap_queue"));
        assert!(Backend::Memory.to_string().starts_with("memory"));
    }
}
