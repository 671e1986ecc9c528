//! TAP port: how VMs attach (QEMU and Firecracker use TAP; DESIGN.md section 4, "Ports").
//! Section 7 measured TAP read at 510-690 kpps and write at 370-610 kpps on this kernel.
//!
//! The device is opened through /dev/net/tun with `IFF_TAP | IFF_NO_PI` (plain Ethernet
//! frames, no packet-info prefix), created if no interface of that name exists, attached to
//! otherwise (as QEMU does with a pre-created persistent TAP). A device created here is not
//! persistent: it disappears when the port is dropped. The port does not configure the link
//! (up/down, addresses, namespace): the lab or the operator does. One frame per read(2) and
//! per write(2); the tun driver has no batched interface without IFF_VNET_HDR tricks.
//! Without IFF_VNET_HDR the kernel never hands over offloaded super-frames or partial
//! checksums, so frames here are always complete.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::sys::ifreq_named;
use super::{
    ifname_cstring, is_fatal_port_error, is_transient_send_error, os_error, Backend, Port,
    PortStats,
};
use crate::frame::{Frame, FramePool};

/// A port on a TAP device (see the module doc).
#[derive(Debug)]
pub struct TapPort {
    name: String,
    fd: OwnedFd,
    stats: PortStats,
}

impl TapPort {
    /// Creates TAP device `ifname`, or attaches to the existing one, in the calling thread's
    /// network namespace; non-blocking. Needs CAP_NET_ADMIN unless the TAP is owned by the
    /// caller.
    pub fn open(ifname: &str) -> io::Result<TapPort> {
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
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
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
                         (IFF_TAP|IFF_NO_PI)",
                    ),
                ),
                _ => os_error(err, ctx("TUNSETIFF")),
            });
        }
        // SAFETY: the kernel leaves a NUL-terminated name in `ifr_name` (zeroed beyond it).
        let actual = unsafe { CStr::from_ptr(ifr.ifr_name.as_ptr()) };
        Ok(TapPort {
            name: actual.to_string_lossy().into_owned(),
            fd,
            stats: PortStats::default(),
        })
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::Tap
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        let mut n = 0;
        let mut spare: Option<Frame> = None;
        let result = loop {
            if n >= max {
                break Ok(n);
            }
            let Some(mut frame) = spare.take().or_else(|| pool.get()) else {
                break Ok(n);
            };
            let buf = frame.buf_for_rx();
            // SAFETY: reads at most `buf.len()` bytes into the exclusively borrowed `buf`.
            let ret =
                unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if ret > 0 {
                frame.set_len(ret as usize);
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += ret as u64;
                out.push(frame);
                n += 1;
                continue;
            }
            spare = Some(frame);
            if ret == 0 {
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
            // SAFETY: writes `data.len()` bytes from the live slice `data`.
            let ret = unsafe { libc::write(self.fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
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
