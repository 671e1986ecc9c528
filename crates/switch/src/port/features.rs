//! Device offload features the kernel fast path depends on (docs/switch.md "Two paths").
//!
//! The fast path encapsulates a VM's TCP super-frame (TSO) for another host in the kernel
//! and sends it to the uplink whole, as a Geneve super-frame (`SKB_GSO_UDP_TUNNEL`). A NIC
//! segments it on the wire; a veth uplink would pass it on whole, and the receiving host's
//! switch could not take a tunnelled super-frame from its socket (the virtio-net header has
//! no tunnel GSO). With a veth uplink's tunnel segmentation off, the kernel segments it
//! itself when it leaves, on the sending VM's CPU, as it does for a NIC without that
//! offload.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsRawFd;

use super::sys::ifreq_named;
use super::taphost::{ioctl_socket, is_veth};
use super::{ifname_cstring, os_error};

const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_SFEATURES: u32 = 0x3b;
const ETH_SS_FEATURES: u32 = 4;
const ETH_GSTRING_LEN: usize = 32;

/// `struct ethtool_sset_info` asking for one string set's length.
#[repr(C)]
struct SsetInfo {
    cmd: u32,
    reserved: u32,
    sset_mask: u64,
    len: u32,
}

/// The features turned off on a virtual uplink.
const TUNNEL_SEGMENTATION: [&str; 2] = ["tx-udp_tnl-segmentation", "tx-udp_tnl-csum-segmentation"];

/// Turns off the tunnel segmentation features of interface `ifname` if it is a veth (see the
/// module doc). Features the device does not have are left alone.
pub fn segment_tunnels_in_software(ifname: &str) -> io::Result<()> {
    if !is_veth(ifname) {
        return Ok(());
    }
    let cname = ifname_cstring(ifname)?;
    let sock = ioctl_socket()?;
    let ethtool = |data: *mut libc::c_void, what: &str| -> io::Result<()> {
        let mut ifr = ifreq_named(&cname);
        ifr.ifr_ifru.ifru_data = data.cast();
        // SAFETY: SIOCETHTOOL reads and writes the ethtool command `data` points at, which
        // the caller keeps alive and sized for the command for the whole call.
        if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) } < 0 {
            return Err(os_error(
                io::Error::last_os_error(),
                format!("'{ifname}': {what}"),
            ));
        }
        Ok(())
    };
    let mut info = SsetInfo {
        cmd: ETHTOOL_GSSET_INFO,
        reserved: 0,
        sset_mask: 1 << ETH_SS_FEATURES,
        len: 0,
    };
    ethtool((&mut info as *mut SsetInfo).cast(), "ETHTOOL_GSSET_INFO")?;
    let count = info.len as usize;
    // struct ethtool_gstrings: cmd, string_set, len, then `len` names of 32 bytes.
    let mut strings = vec![0u8; 12 + count * ETH_GSTRING_LEN];
    strings[0..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
    strings[4..8].copy_from_slice(&ETH_SS_FEATURES.to_ne_bytes());
    strings[8..12].copy_from_slice(&(count as u32).to_ne_bytes());
    ethtool(strings.as_mut_ptr().cast(), "ETHTOOL_GSTRINGS")?;
    let bits: Vec<usize> = strings[12..]
        .chunks(ETH_GSTRING_LEN)
        .enumerate()
        .filter(|(_, name)| {
            CStr::from_bytes_until_nul(name).is_ok_and(|n| {
                TUNNEL_SEGMENTATION
                    .iter()
                    .any(|t| n.to_bytes() == t.as_bytes())
            })
        })
        .map(|(bit, _)| bit)
        .collect();
    if bits.is_empty() {
        return Ok(());
    }
    // struct ethtool_sfeatures: cmd, size, then `size` blocks of (valid, requested).
    let blocks = count.div_ceil(32);
    let mut set = vec![0u32; 2 + 2 * blocks];
    set[0] = ETHTOOL_SFEATURES;
    set[1] = blocks as u32;
    for bit in bits {
        set[2 + 2 * (bit / 32)] |= 1 << (bit % 32);
    }
    ethtool(set.as_mut_ptr().cast(), "ETHTOOL_SFEATURES")
}
