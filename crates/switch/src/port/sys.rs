//! System-call helpers shared by the socket-based port backends (AF_PACKET, AF_XDP, TAP):
//! socket options, interface lookup, promiscuous membership.

use std::ffi::CStr;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::RawFd;

use super::ifname_cstring;

/// Sets an integer socket option.
pub(super) fn set_int_opt(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    set_opt(fd, level, opt, &value)
}

/// Sets a socket option from a plain value or C struct.
pub(super) fn set_opt<T>(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` points at a live `T` of `size_of::<T>()` bytes, read by the kernel only.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reads a socket option into a plain C struct; errors if the kernel wrote fewer bytes.
pub(super) fn get_opt<T>(fd: RawFd, level: libc::c_int, opt: libc::c_int) -> io::Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` has room for `len` bytes and `len` is live.
    let ret = unsafe { libc::getsockopt(fd, level, opt, value.as_mut_ptr().cast(), &mut len) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<T>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("kernel returned {len} bytes, expected {}", size_of::<T>()),
        ));
    }
    // SAFETY: zero-initialised and then fully written by the kernel; T is plain C data.
    Ok(unsafe { value.assume_init() })
}

/// The error for an interface that does not exist, telling the operator what to do.
pub(super) fn interface_not_found(ifname: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("interface '{ifname}' not found: create it or fix the port's ifname"),
    )
}

/// The interface index of `ifname` in the calling thread's network namespace.
pub(crate) fn ifindex(ifname: &str) -> io::Result<u32> {
    let cname = ifname_cstring(ifname)?;
    // SAFETY: `cname` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(interface_not_found(ifname));
    }
    Ok(index)
}

/// An all-zero `ifreq` naming interface `name` (checked shorter than IFNAMSIZ by
/// `ifname_cstring`, so the name stays NUL-terminated).
pub(super) fn ifreq_named(name: &CStr) -> libc::ifreq {
    // SAFETY: ifreq is a plain C struct (and union) for which all-zero bytes are valid.
    let mut req: libc::ifreq = unsafe { MaybeUninit::zeroed().assume_init() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name.to_bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

/// Makes AF_PACKET socket `fd` hold a `PACKET_MR_PROMISC` membership of interface `index`:
/// the interface stays promiscuous while the socket is open.
pub(super) fn join_promiscuous(fd: RawFd, index: u32) -> io::Result<()> {
    // SAFETY: packet_mreq is a plain C struct for which all-zero bytes are a valid value.
    let mut mreq: libc::packet_mreq = unsafe { MaybeUninit::zeroed().assume_init() };
    mreq.mr_ifindex = index as libc::c_int;
    mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
    set_opt(fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
}

/// `PACKET_VNET_HDR` (linux/if_packet.h): frames are read and written after a
/// `struct virtio_net_hdr`. Not in the libc crate.
pub(super) const PACKET_VNET_HDR: libc::c_int = 15;
/// `PACKET_COPY_THRESH` (linux/if_packet.h): a frame too big for its TPACKET_V2 slot is also
/// queued whole on the socket (`TP_STATUS_COPY`). Not in the libc crate.
pub(super) const PACKET_COPY_THRESH: libc::c_int = 7;
/// `TP_STATUS_COPY` (linux/if_packet.h). Not in the libc crate.
pub(super) const TP_STATUS_COPY: u32 = 1 << 1;
/// `SO_RCVBUFFORCE` (asm-generic/socket.h): SO_RCVBUF beyond `rmem_max`, for
/// CAP_NET_ADMIN. Not in the libc crate for Linux.
pub(super) const SO_RCVBUFFORCE: libc::c_int = 33;
