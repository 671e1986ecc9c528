//! TAP port holding the device's queue (`backend = "tap_queue"`): the switch is the VM's side
//! of the TAP, as a VMM is, and the device's netdev is the tenant's interface (the lab moves
//! it into the tenant's namespace). A VMM's TAP is *not* opened this way: its queue is the
//! VMM's, and the switch attaches to its netdev instead (`backend = "tap"`, the `taphost`
//! module). Section 7 of DESIGN.md measured TAP read at 510-690 kpps and write at 370-610 kpps
//! on this kernel.
//!
//! The device is opened through /dev/net/tun with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`
//! (Ethernet frames after a virtio-net header, no packet-info prefix), created if no interface
//! of that name exists, attached to otherwise (a pre-created persistent TAP; the switch's
//! config creates one only with `port.create = true`, checked before this is called). A
//! device created here is not persistent: it disappears when the port is dropped (the switch
//! owns it); an existing persistent one stays. The port does not configure the link (up/down,
//! addresses, namespace): the lab or the operator does. One frame per read(2) (readv) and per
//! write(2) (writev).
//!
//! **Offloads**, as QEMU's virtio-net backend sets them: `TUNSETOFFLOAD` with checksum, TSO
//! (v4, v6, ECN) and, where the kernel has it (6.2+), USO, so the device the VM sees
//! advertises `tx-checksumming` and TSO on, the Linux defaults of a virtio NIC. The VM's
//! stack then hands over partial checksums and super-frames of up to 64 KiB, which the port
//! completes and segments (see the `vnet` module): one read per 64 KiB instead of ~45.
//! Frames are written with a zero virtio-net header (complete, not GSO).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use picnic_wire::offload::VNET_HDR_LEN;

use super::sys::ifreq_named;
use super::vnet::{VnetRx, TX_HDR};
use super::{
    ifname_cstring, is_fatal_port_error, is_transient_send_error, os_error, Backend, Port,
    PortStats,
};
use crate::frame::{Frame, FramePool, DATA_CAP};

/// Offloads the port takes from the VM (`TUNSETOFFLOAD`); USO is tried first, then dropped
/// for kernels before 6.2.
const OFFLOADS: libc::c_uint =
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
const OFFLOADS_USO: libc::c_uint = OFFLOADS | libc::TUN_F_USO4 | libc::TUN_F_USO6;

/// A port on a TAP device (see the module doc).
pub struct TapPort {
    name: String,
    fd: OwnedFd,
    stats: PortStats,
    vnet: VnetRx,
}

impl std::fmt::Debug for TapPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapPort")
            .field("name", &self.name)
            .field("fd", &self.fd)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl TapPort {
    /// Creates TAP device `ifname`, or attaches to the existing one, in the calling thread's
    /// network namespace; non-blocking; offloads on. Super-frames from the VM are segmented
    /// into frames of at most `max_frame` bytes (Ethernet header included; at most
    /// [`DATA_CAP`]). Needs CAP_NET_ADMIN unless the TAP is owned by the caller.
    pub fn open(ifname: &str, max_frame: usize) -> io::Result<TapPort> {
        let cname = ifname_cstring(ifname)?;
        let ctx = |what: &str| format!("tap port '{ifname}': {what}");
        let path = c"/dev/net/tun";
        // SAFETY: `path` is a valid NUL-terminated string; a non-negative return is a new
        // descriptor that we own from here on.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENODEV) => io::Error::new(
                    io::ErrorKind::NotFound,
                    ctx(
                        "/dev/net/tun missing: the kernel needs tun support and the device node \
                         (mknod /dev/net/tun c 10 200)",
                    ),
                ),
                Some(libc::EACCES) | Some(libc::EPERM) => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    ctx("opening /dev/net/tun was refused: run as root"),
                ),
                _ => os_error(err, ctx("open /dev/net/tun")),
            });
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let mut ifr = ifreq_named(&cname);
        ifr.ifr_ifru.ifru_flags =
            (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which `ifr` is.
        let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                // os_error keeps the errno's kind (ResourceBusy).
                Some(libc::EBUSY) => os_error(
                    err,
                    ctx(
                        "TAP device is busy: another process (a VM or another switch) has it \
                         open",
                    ),
                ),
                Some(libc::EPERM) | Some(libc::EACCES) => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    ctx(
                        "creating or attaching a TAP device needs CAP_NET_ADMIN (run as root) \
                         or a persistent TAP owned by this user",
                    ),
                ),
                Some(libc::EINVAL) => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    ctx(
                        "an interface of this name exists and is not a single-queue TAP device \
                         (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR)",
                    ),
                ),
                _ => os_error(err, ctx("TUNSETIFF")),
            });
        }
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int, which `hdr_len` is.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            return Err(os_error(io::Error::last_os_error(), ctx("TUNSETVNETHDRSZ")));
        }
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        let set = |flags: libc::c_uint| unsafe {
            libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, flags as libc::c_ulong)
        };
        if set(OFFLOADS_USO) < 0 && set(OFFLOADS) < 0 {
            return Err(os_error(io::Error::last_os_error(), ctx("TUNSETOFFLOAD")));
        }
        // SAFETY: the kernel leaves a NUL-terminated name in `ifr_name` (zeroed beyond it).
        let actual = unsafe { CStr::from_ptr(ifr.ifr_name.as_ptr()) };
        Ok(TapPort {
            name: actual.to_string_lossy().into_owned(),
            fd,
            stats: PortStats::default(),
            vnet: VnetRx::new(max_frame),
        })
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::TapQueue
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        let mut n = 0;
        let mut spare: Option<Frame> = None;
        let mut hdr = [0u8; VNET_HDR_LEN];
        let result = loop {
            n += self.vnet.drain(pool, out, max - n, &mut self.stats);
            if n >= max || self.vnet.busy() {
                break Ok(n);
            }
            let Some(mut frame) = spare.take().or_else(|| pool.get()) else {
                break Ok(n);
            };
            // The header, then the frame into the pool frame; what does not fit (a
            // super-frame) continues in the super-frame buffer after its first DATA_CAP bytes.
            let overflow = &mut self.vnet.buf_mut()[DATA_CAP..];
            let (overflow_ptr, overflow_len) = (overflow.as_mut_ptr(), overflow.len());
            let buf = frame.buf_for_rx();
            let iov = [
                libc::iovec {
                    iov_base: hdr.as_mut_ptr().cast(),
                    iov_len: VNET_HDR_LEN,
                },
                libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                },
                libc::iovec {
                    iov_base: overflow_ptr.cast(),
                    iov_len: overflow_len,
                },
            ];
            // SAFETY: the three buffers are live, exclusively borrowed and as long as said.
            let ret = unsafe { libc::readv(self.fd.as_raw_fd(), iov.as_ptr(), 3) };
            if ret >= VNET_HDR_LEN as isize {
                let len = ret as usize - VNET_HDR_LEN;
                if len <= DATA_CAP {
                    frame.set_len(len);
                    let before = out.len();
                    self.vnet
                        .take_frame(&hdr, frame, pool, out, &mut self.stats);
                    n += out.len() - before;
                } else {
                    let super_frame = self.vnet.buf_mut();
                    super_frame[..DATA_CAP].copy_from_slice(frame.buf_for_rx());
                    spare = Some(frame);
                    self.vnet
                        .take_buffered(&hdr, len, pool, out, &mut self.stats);
                }
                continue;
            }
            spare = Some(frame);
            if ret >= 0 {
                break Ok(n);
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => break Ok(n),
                // The frame did not fit the buffer: tun discards it and reports the short copy.
                Some(libc::EFAULT) | Some(libc::EINVAL) | Some(libc::EMSGSIZE) => {
                    self.stats.rx_oversize += 1;
                }
                _ => break Err(os_error(err, format!("tap port '{}': read", self.name))),
            }
        };
        if let Some(frame) = spare {
            pool.put(frame);
        }
        result
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        let mut sent = 0;
        // Frames at the front that were sent or refused for good: both leave `frames`.
        let mut done = 0;
        let mut result = Ok(());
        for frame in frames.iter() {
            let data = frame.data();
            let iov = [
                libc::iovec {
                    iov_base: TX_HDR.as_ptr() as *mut libc::c_void,
                    iov_len: TX_HDR.len(),
                },
                libc::iovec {
                    iov_base: data.as_ptr() as *mut libc::c_void,
                    iov_len: data.len(),
                },
            ];
            // SAFETY: the kernel only reads the two live buffers, as long as said.
            let ret = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
            if ret >= 0 {
                sent += 1;
                done += 1;
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += data.len() as u64;
                continue;
            }
            let err = io::Error::last_os_error();
            if is_transient_send_error(&err) {
                break;
            }
            if is_fatal_port_error(&err) {
                result = Err(os_error(err, format!("tap port '{}': write", self.name)));
                break;
            }
            // Refused for good (too big, link down): drop it, as a NIC would.
            done += 1;
            self.stats.tx_errors += 1;
        }
        for frame in frames.drain(..done) {
            pool.put(frame);
        }
        result.map(|()| sent)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
