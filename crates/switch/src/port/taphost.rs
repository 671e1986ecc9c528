//! The host side of a TAP device a VMM holds: how picnic serves VMs (`backend = "tap"`;
//! docs/switch.md "Attaching a VM").
//!
//! A TAP device has two ends: the queue (a file descriptor on /dev/net/tun), which the VMM
//! holds and moves the guest's virtio-net rings through (QEMU `-netdev tap,ifname=..`,
//! libvirt `<interface type='ethernet'>`, Firecracker `host_dev_name`, Cloud Hypervisor
//! `tap=`), and the netdev, an ordinary host interface. A switch attaches to the netdev, as
//! a Linux bridge or Open vSwitch does: frames the guest sends are *received* on the netdev,
//! frames the switch *transmits* on it go to the guest. So the port is the AF_PACKET port of
//! veths and NICs ([`AfPacketPort`], with `PACKET_VNET_HDR`: the guest's partial checksums
//! and TSO super-frames arrive with their virtio-net header and are finished by the port),
//! reporting itself as [`Backend::Tap`].
//!
//! Before it opens, the device is checked: it exists (else: start the VM, create it, or set
//! `create`), it is a TAP (the `tun` driver with bus `tap`, from `ETHTOOL_GDRVINFO`: a TUN
//! device carries no Ethernet frames, a veth should use `af_packet`) and it is up (whoever
//! creates a TAP brings it up: libvirt does, `ip link set DEV up` otherwise).
//!
//! With `create`, a missing TAP is created *persistent* (`TUNSETPERSIST`, no queue held) and
//! brought up: a VMM started later attaches to it, and it survives the switch (a switch
//! restart does not take the guest's link away). picnic never deletes a TAP: `ip tuntap del
//! dev NAME mode tap` does.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::sys::ifreq_named;
use super::{ifname_cstring, os_error, AfPacketOptions, AfPacketPort, Backend, Port, PortStats};
use crate::frame::{Frame, FramePool};

/// What a device of some name is, as far as attaching to it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapState {
    /// No interface of that name in this network namespace.
    Missing,
    /// An interface that is not a TAP: its driver, and for the `tun` driver its bus
    /// (`tun` for a TUN device).
    NotTap,
    /// A TAP device, administratively up or not.
    Tap { up: bool },
}

/// The `struct ethtool_drvinfo` of `<linux/ethtool.h>`.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

const ETHTOOL_GDRVINFO: u32 = 0x3;

/// A datagram socket to ask interface ioctls on (any socket of the namespace will do).
pub(super) fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative return is ours.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The NUL-terminated string at the start of `bytes`.
fn c_str(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// What interface `ifname` of the calling thread's network namespace is (see [`TapState`]).
pub fn tap_state(ifname: &str) -> io::Result<TapState> {
    let cname = ifname_cstring(ifname)?;
    let sock = ioctl_socket()?;
    let mut ifr = ifreq_named(&cname);
    // SAFETY: SIOCGIFFLAGS reads and writes one ifreq, which `ifr` is.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENODEV) | Some(libc::ENXIO) => Ok(TapState::Missing),
            _ => Err(os_error(err, format!("'{ifname}': SIOCGIFFLAGS"))),
        };
    }
    // SAFETY: the kernel filled `ifru_flags` for SIOCGIFFLAGS.
    let up = unsafe { ifr.ifr_ifru.ifru_flags } & libc::IFF_UP as libc::c_short != 0;
    // No driver information (e.g. loopback): certainly not a TAP.
    match driver_info(ifname) {
        Some(info) if c_str(&info.driver) == b"tun" && c_str(&info.bus_info) == b"tap" => {
            Ok(TapState::Tap { up })
        }
        _ => Ok(TapState::NotTap),
    }
}

/// Interface `ifname`'s driver information (ETHTOOL_GDRVINFO); None if it has none.
fn driver_info(ifname: &str) -> Option<EthtoolDrvinfo> {
    let cname = ifname_cstring(ifname).ok()?;
    let sock = ioctl_socket().ok()?;
    // SAFETY: all-zero bytes are a valid EthtoolDrvinfo (plain C data).
    let mut info: EthtoolDrvinfo = unsafe { MaybeUninit::zeroed().assume_init() };
    info.cmd = ETHTOOL_GDRVINFO;
    let mut ifr = ifreq_named(&cname);
    ifr.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO writes one ethtool_drvinfo through
    // `ifru_data`, which points at `info`, live for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) } < 0 {
        return None;
    }
    Some(info)
}

/// Whether interface `ifname` is one end of a veth pair.
pub(super) fn is_veth(ifname: &str) -> bool {
    driver_info(ifname).is_some_and(|info| c_str(&info.driver) == b"veth")
}

/// Sets interface `ifname` administratively up.
fn set_up(ifname: &str) -> io::Result<()> {
    let cname = ifname_cstring(ifname)?;
    let sock = ioctl_socket()?;
    let mut ifr = ifreq_named(&cname);
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write one ifreq, which `ifr` is.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            return Err(io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Creates TAP device `ifname` persistent (no queue held: a VMM attaches later) with virtio-net
/// headers, and brings it up. Fails with `AlreadyExists` when an interface of that name exists
/// (`IFF_TUN_EXCL`): a device picnic did not create is never taken over here.
pub fn create_persistent_tap(ifname: &str) -> io::Result<()> {
    let cname = ifname_cstring(ifname)?;
    let ctx = |what: &str| format!("creating TAP '{ifname}': {what}");
    // SAFETY: a valid NUL-terminated path; a non-negative return is ours.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(os_error(
            io::Error::last_os_error(),
            ctx("open /dev/net/tun"),
        ));
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut ifr = ifreq_named(&cname);
    ifr.ifr_ifru.ifru_flags =
        (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_TUN_EXCL)
            as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which `ifr` is.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) } < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::EBUSY) | Some(libc::EEXIST) => io::Error::new(
                io::ErrorKind::AlreadyExists,
                ctx("an interface of this name exists"),
            ),
            Some(libc::EPERM) | Some(libc::EACCES) => io::Error::new(
                io::ErrorKind::PermissionDenied,
                ctx("needs CAP_NET_ADMIN (run as root)"),
            ),
            _ => os_error(err, ctx("TUNSETIFF")),
        });
    }
    // SAFETY: TUNSETPERSIST takes its flag by value.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } < 0 {
        return Err(os_error(io::Error::last_os_error(), ctx("TUNSETPERSIST")));
    }
    // Our queue goes with `fd`; the persistent device stays, without carrier until a VMM
    // attaches.
    drop(fd);
    set_up(ifname).map_err(|e| os_error(e, ctx("setting it up")))
}

/// A port on the host side of a TAP device (see the module doc).
#[derive(Debug)]
pub struct TapHostPort {
    inner: AfPacketPort,
}

impl TapHostPort {
    /// Attaches to the host side of TAP `ifname` in the calling thread's network namespace:
    /// checks it exists, is a TAP and is up; with `create`, a missing TAP is created
    /// persistent and up first ([`create_persistent_tap`]) and a down one brought up. Needs
    /// root (CAP_NET_RAW for the socket, CAP_NET_ADMIN to create).
    pub fn open(ifname: &str, create: bool, opts: AfPacketOptions) -> io::Result<TapHostPort> {
        let ctx = |what: &str| format!("TAP '{ifname}': {what}");
        let mut state = tap_state(ifname)?;
        if state == TapState::Missing && create {
            match create_persistent_tap(ifname) {
                // Made meanwhile by someone else (a VMM starting): attach to it below.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                other => other?,
            }
            state = tap_state(ifname)?;
        }
        match state {
            TapState::Missing => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    ctx(
                        "not found: start the VM first (QEMU -netdev tap,ifname=NAME creates it), \
                         create it (ip tuntap add dev NAME mode tap; ip link set NAME up), or \
                         set port.create = true",
                    ),
                ))
            }
            TapState::NotTap => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    ctx(
                        "the interface is not a TAP device (a veth or NIC takes backend = \
                         \"af_packet\"; a TUN device carries no Ethernet frames)",
                    ),
                ))
            }
            TapState::Tap { up: false } if create => {
                set_up(ifname).map_err(|e| os_error(e, ctx("setting it up")))?;
            }
            TapState::Tap { up: false } => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    ctx(
                        "the TAP is down: bring it up (ip link set NAME up; libvirt does), or set \
                         port.create = true for picnic to",
                    ),
                ))
            }
            TapState::Tap { up: true } => {}
        }
        let inner = AfPacketPort::open(ifname, opts).map_err(|e| os_error(e, ctx("attach")))?;
        Ok(TapHostPort { inner })
    }
}

impl Port for TapHostPort {
    fn name(&self) -> &str {
        self.inner.name()
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
        self.inner.recv_batch(pool, out, max)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        self.inner.send_batch(frames, pool)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        self.inner.raw_fd()
    }

    fn stats(&self) -> PortStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_missing_devices_are_told_apart_from_taps() {
        assert_eq!(tap_state("pn-no-such-tap").unwrap(), TapState::Missing);
        assert_eq!(tap_state("lo").unwrap(), TapState::NotTap);
        assert!(tap_state("bad/name").is_err());
    }

    #[test]
    fn a_missing_tap_is_named_with_what_to_do() {
        let err =
            TapHostPort::open("pn-no-such-tap", false, AfPacketOptions::default()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(
            msg.contains("'pn-no-such-tap'") && msg.contains("port.create"),
            "{msg}"
        );
    }
}
