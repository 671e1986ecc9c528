//! The port backends a config can ask for (`backend = "af_xdp"`); the ports themselves are
//! in [`crate::port`].

use std::fmt;

/// Which packet I/O mechanism a port uses: what the config asks for (`backend = "af_xdp"`)
/// and what a port reports; its `Display` says what it does, for the start-up report.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// AF_PACKET socket bound to an interface: mmap RX ring, sendmmsg TX (portable; veth or
    /// NIC).
    #[default]
    AfPacket,
    /// AF_XDP socket (zero-copy where the driver offers it, else copy mode), fed by an XDP
    /// redirect program (needs root and an interface without another XDP program).
    AfXdp,
    /// The host side of a TAP device a VMM holds (QEMU, libvirt, Firecracker, Cloud
    /// Hypervisor): an AF_PACKET socket on its netdev, as on a veth.
    Tap,
    /// A TAP device whose queue the switch holds itself through /dev/net/tun (it is the VM's
    /// side: the netdev is the tenant's interface, e.g. moved into a container's namespace).
    TapQueue,
    /// vhost-user: the switch listens on `port.socket`, a VMM (QEMU, Cloud Hypervisor)
    /// connects, and the switch serves the guest's virtio-net queues from its shared memory.
    VhostUser,
    /// In-process queues fed and drained through a [`crate::port::MemoryPortHandle`] (tests and
    /// benchmarks; never in a config).
    #[serde(skip)]
    Memory,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::AfPacket => {
                "af_packet (mmap rx ring, sendmmsg qdisc-bypass tx, vnet_hdr: offloads completed)"
            }
            Backend::AfXdp => "af_xdp (XDP redirect to an AF_XDP socket per queue, zero-copy where the driver offers it)",
            Backend::Tap => {
                "tap (the host side of a VMM's TAP: af_packet on its netdev, vnet_hdr: offloads \
                 completed)"
            }
            Backend::TapQueue => {
                "tap_queue (the TAP's queue held by the switch: /dev/net/tun \
                 IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, readv/writev per frame, offloads completed)"
            }
            Backend::VhostUser => {
                "vhost_user (the guest's virtio-net rings served from its shared memory over a \
                 vhost-user socket, offloads completed)"
            }
            Backend::Memory => "memory (in-process bounded queues)",
        })
    }
}
