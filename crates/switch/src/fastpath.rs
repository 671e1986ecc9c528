//! The kernel fast path's programs and maps (docs/switch.md "Two paths"): `bpf/fastpath.bpf.c`
//! loaded with aya, its hop attached to the tc ingress of every port's device (tcx) and its
//! gate to every AF_PACKET socket of the switch. This module does the I/O; what the fast path
//! may do for each VM, and when a VM is handed back to the kernel, is the engine's
//! (`engine::fastpath`).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{BorrowedFd, RawFd};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::tc::{SchedClassifierLinkId, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, SocketFilter, TcAttachType};
use aya::util::KernelVersion;
use aya::{include_bytes_aligned, Ebpf, Pod};

use crate::ebpf::{aya_error, load as load_object, MAX_SLOTS};
use crate::engine::fastpath::{Epochs, Grant, RingCounts};
use crate::stats::FastPathCounters;

/// The fast path's programs (empty when the build had no clang).
static FASTPATH: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fastpath.o"));

const PORT_VM: u32 = 1;
const PORT_UPLINK: u32 = 2;
const DEST_LOCAL: u32 = 1;
const DEST_REMOTE: u32 = 2;
const CTL_TX: u32 = 1;
const CTL_RX: u32 = 2;
const CTL_RX_DROP: u32 = 4;
const CTL_TX_DROP: u32 = 8;

/// Counters per slot, in `fastpath.bpf.c`'s order.
const COUNTERS: usize = 15;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PortEntry {
    kind: u32,
    slot: u32,
    vni: u32,
    ip: u32,
    mac: [u8; 6],
    pad: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct DestKey {
    vni: u32,
    mac: [u8; 6],
    pad: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Dest {
    kind: u32,
    slot: u32,
    ifindex: u32,
    limited: u32,
    src_ip: u32,
    dst_ip: u32,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    bucket: u32,
    drop_beyond: u32,
    burst_ns: u32,
    ps_per_byte: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct ArrivalKey {
    slot: u32,
    src_ip: u32,
    src_mac: [u8; 6],
    pad: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ArrivalCounts {
    bytes: u64,
    packets: u64,
    dropped: u64,
    last_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Ctl {
    flags: u32,
    pad: u32,
    tx_epoch: u64,
    rx_epoch: u64,
    tx_ps_per_byte: u64,
    tx_ns_per_packet: u64,
    rx_ps_per_byte: u64,
    rx_ns_per_packet: u64,
    burst_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct State {
    tx_epoch: u64,
    rx_epoch: u64,
    tat: [u64; 4],
    tx_resumed: u64,
    shedding: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Ring {
    taken: u64,
    limit: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Handover {
    handed: u64,
    tapped: u64,
}

// SAFETY: plain C structs of integers with explicit padding, as the program declares them.
unsafe impl Pod for PortEntry {}
unsafe impl Pod for DestKey {}
unsafe impl Pod for Dest {}
unsafe impl Pod for Ctl {}
unsafe impl Pod for State {}
unsafe impl Pod for Handover {}
unsafe impl Pod for Ring {}
unsafe impl Pod for ArrivalKey {}
unsafe impl Pod for ArrivalCounts {}

/// Remote destinations with a feedback limiter in the kernel (`fp_dest_tat`'s size): one
/// bucket per VM of the directory below it.
pub const MAX_DEST_BUCKETS: usize = 65536;

/// What arrived from the uplink in the kernel for one local VM from one sending VM, since
/// the program was loaded (totals; the caller takes differences).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrivals {
    /// The receiving VM's slot.
    pub slot: u32,
    /// The sending host's tunnel address and the sending VM's MAC.
    pub src_ip: Ipv4Addr,
    pub src_mac: [u8; 6],
    /// Encapsulated bytes and frames; of the frames, those dropped before any work.
    pub bytes: u64,
    pub packets: u64,
    pub dropped: u64,
    /// When the last of them arrived, on [`kernel_clock_ns`]'s clock.
    pub last_ns: u64,
}

/// The kernel's clock as the programs read it (`bpf_ktime_get_ns`: CLOCK_MONOTONIC), ns.
pub fn kernel_clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A destination the fast path may forward to, by (VNI, MAC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A local VM: its slot (port index) and its port's device.
    Local { slot: u32, ifindex: u32 },
    /// A VM on another host: the tunnel's addresses, and the rate its receiver asked for
    /// (EyeQ 3.3), if any: frames within it are forwarded here, frames beyond it go to the
    /// engines, whose limiter paces them.
    Remote {
        uplink_ifindex: u32,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        limit: Option<DestinationLimit>,
    },
}

/// A remote destination's feedback limiter in the kernel: its bucket (below
/// [`MAX_DEST_BUCKETS`]; the directory's VM index) and its rate, bytes/s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DestinationLimit {
    pub bucket: u32,
    pub bytes_per_sec: u64,
    /// The engines' limiter of it overflows: frames beyond the rate are dropped in the
    /// kernel, on the sender's CPU, instead of handed over (Iron 3.3).
    pub drop_beyond: bool,
}

/// How long a VM's token buckets may run ahead: 1 ms, what a timer waking late must not lose
/// (DESIGN.md 7), as the engines' buckets (`burst_for`).
const BURST_NS: u64 = 1_000_000;

/// How far a remote destination's bucket (the rate its receiver asked for, EyeQ 3.3) may run
/// ahead: 300 us. The kernel checks it at each frame, on its clock, so no late timer needs
/// the engines' 1 ms; and what a bucket lets through at once lands in the receiver's access
/// queue together with every other sender's. Measured with `picnic lab run <file> --modes
/// picnic,picnic-alone --repeat 3` (2026-11-29), the victim's p99 under attack: on/off bursts
/// at 3x the link (defaults-bursts) 94, 69, 88 us in three batches against 112, 100, 111 us
/// with 1 ms; 32 TCP streams (defaults-tcp) 65 against 111 us. At 100 us a VM sending in
/// batches went over it at every batch and lived in the engines (the fastpath root test's
/// flood: 2,468 frames through the kernel, 10,314 through the engines; 300 us and 1 ms
/// both about 8,000 and 6,000).
const DEST_BURST_NS: u64 = 300_000;

/// The loaded programs and their maps.
pub struct KernelFastPath {
    bpf: Ebpf,
    ports: BpfHashMap<MapData, u32, PortEntry>,
    dests: BpfHashMap<MapData, DestKey, Dest>,
    ctl: Array<MapData, Ctl>,
    state: Array<MapData, State>,
    handover: Array<MapData, Handover>,
    counts: PerCpuArray<MapData, u64>,
    arrivals: PerCpuHashMap<MapData, ArrivalKey, ArrivalCounts>,
    arrival_seq: PerCpuArray<MapData, u64>,
    /// `fp_arrival_seq` summed over CPUs at the last walk of `arrivals`.
    arrivals_read_at: std::cell::Cell<Option<u64>>,
    dest_tat: Array<MapData, u64>,
    released: Array<MapData, u64>,
    ring: Array<MapData, Ring>,
    dest_dropped: Array<MapData, u64>,
    /// Devices the hop is attached to, by ifindex, with their links.
    attached: std::collections::HashMap<u32, SchedClassifierLinkId>,
}

impl KernelFastPath {
    /// Loads the programs and creates their maps (nothing attached yet).
    pub fn load() -> io::Result<KernelFastPath> {
        let mut bpf = load_object(FASTPATH, "loading the kernel fast path")?;
        for (name, socket) in [("picnic_hop", false), ("picnic_gate", true)] {
            let prog = bpf.program_mut(name).expect("fastpath.bpf.c defines it");
            let loaded = if socket {
                let p: &mut SocketFilter = prog.try_into().map_err(|e| aya_error(e, name))?;
                p.load()
            } else {
                let p: &mut SchedClassifier = prog.try_into().map_err(|e| aya_error(e, name))?;
                p.load()
            };
            loaded.map_err(|e| aya_error(e, &format!("loading {name} into the kernel")))?;
        }
        let mut take = |name: &str| {
            bpf.take_map(name)
                .ok_or_else(|| io::Error::other(format!("fastpath.bpf.c has no map {name}")))
        };
        let ports =
            BpfHashMap::try_from(take("fp_ports")?).map_err(|e| aya_error(e, "fp_ports"))?;
        let dests =
            BpfHashMap::try_from(take("fp_dests")?).map_err(|e| aya_error(e, "fp_dests"))?;
        let ctl = Array::try_from(take("fp_ctl")?).map_err(|e| aya_error(e, "fp_ctl"))?;
        let state = Array::try_from(take("fp_state")?).map_err(|e| aya_error(e, "fp_state"))?;
        let handover =
            Array::try_from(take("fp_handover")?).map_err(|e| aya_error(e, "fp_handover"))?;
        let counts =
            PerCpuArray::try_from(take("fp_counts")?).map_err(|e| aya_error(e, "fp_counts"))?;
        let arrivals = PerCpuHashMap::try_from(take("fp_arrivals")?)
            .map_err(|e| aya_error(e, "fp_arrivals"))?;
        let arrival_seq = PerCpuArray::try_from(take("fp_arrival_seq")?)
            .map_err(|e| aya_error(e, "fp_arrival_seq"))?;
        let dest_tat =
            Array::try_from(take("fp_dest_tat")?).map_err(|e| aya_error(e, "fp_dest_tat"))?;
        let released =
            Array::try_from(take("fp_released")?).map_err(|e| aya_error(e, "fp_released"))?;
        let ring = Array::try_from(take("fp_ring")?).map_err(|e| aya_error(e, "fp_ring"))?;
        let dest_dropped = Array::try_from(take("fp_dest_dropped")?)
            .map_err(|e| aya_error(e, "fp_dest_dropped"))?;
        Ok(KernelFastPath {
            bpf,
            ports,
            dests,
            ctl,
            state,
            handover,
            counts,
            arrivals,
            arrival_seq,
            arrivals_read_at: std::cell::Cell::new(None),
            dest_tat,
            released,
            ring,
            dest_dropped,
            attached: std::collections::HashMap::new(),
        })
    }

    /// The tc program (`picnic_hop`), loaded.
    fn hop(&mut self) -> &mut SchedClassifier {
        self.bpf
            .program_mut("picnic_hop")
            .expect("loaded")
            .try_into()
            .expect("a tc program")
    }

    /// Attaches the hop to device `ifname`'s tc ingress, before any program already there;
    /// returns the device's ifindex. Frames of a device not yet registered ([`KernelFastPath::set_vm_port`],
    /// [`KernelFastPath::set_uplink`]) pass as without the fast path.
    ///
    /// First, because a VM's device may come from another host's switch (a migration moves
    /// the device between namespaces, and a tcx link stays with its device): that switch's
    /// hop, which no longer knows the device, passes its frames, and a pass ends the chain,
    /// so a hop attached after it never saw them (the cluster test's moved VM was
    /// unreachable).
    pub fn attach_device(&mut self, ifname: &str) -> io::Result<u32> {
        let ifindex = crate::port::sys::ifindex(ifname)?;
        if self.attached.contains_key(&ifindex) {
            return Ok(ifindex);
        }
        let prog = self.hop();
        let tcx = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
        let attached = if tcx {
            prog.attach_with_options(
                ifname,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::first()),
            )
        } else {
            prog.attach(ifname, TcAttachType::Ingress)
        };
        let link = attached.map_err(|e| {
            aya_error(
                e,
                &format!("attaching the fast path to {ifname}'s tc ingress"),
            )
        })?;
        self.attached.insert(ifindex, link);
        Ok(ifindex)
    }

    /// Attaches the gate to AF_PACKET socket `fd`: from then on it gets only the frames the
    /// hop hands over (and every frame of unregistered devices).
    pub fn attach_socket(&mut self, fd: RawFd) -> io::Result<()> {
        let prog: &mut SocketFilter = self
            .bpf
            .program_mut("picnic_gate")
            .expect("loaded")
            .try_into()
            .expect("a socket filter");
        // SAFETY: the caller's socket stays open while the switch runs (the port owns it).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let link = prog
            .attach(fd)
            .map_err(|e| aya_error(e, "attaching the fast path's gate to a socket"))?;
        // Kept attached for the socket's life: closing the socket releases it.
        prog.take_link(link)
            .map(std::mem::forget)
            .map_err(|e| aya_error(e, "keeping the gate's link"))
    }

    /// Registers a VM's port device: from then on the hop decides for its frames. Its slot's
    /// hand-over counts start again from zero, as its new socket's ring does.
    pub fn set_vm_port(
        &mut self,
        ifindex: u32,
        slot: u32,
        vni: u32,
        mac: [u8; 6],
        ip: Ipv4Addr,
    ) -> io::Result<()> {
        let entry = PortEntry {
            kind: PORT_VM,
            slot,
            vni,
            ip: u32::from_ne_bytes(ip.octets()),
            mac,
            pad: [0; 2],
        };
        self.handover
            .set(slot, Handover::default(), 0)
            .map_err(|e| aya_error(e, "fp_handover"))?;
        self.release(slot, 0)?;
        self.set_ring(slot, 0, 0)?;
        self.ports
            .insert(ifindex, entry, 0)
            .map_err(|e| aya_error(e, "fp_ports"))
    }

    /// Registers the uplink's device (slot 0) with this host's MAC.
    pub fn set_uplink(&mut self, ifindex: u32, mac: [u8; 6]) -> io::Result<()> {
        let entry = PortEntry {
            kind: PORT_UPLINK,
            mac,
            ..Default::default()
        };
        self.ports
            .insert(ifindex, entry, 0)
            .map_err(|e| aya_error(e, "fp_ports"))
    }

    /// Unregisters a device and detaches the hop from it: its frames pass as without the
    /// fast path again, here or in the namespace the device moved to.
    pub fn remove_port(&mut self, ifindex: u32) {
        let _ = self.ports.remove(&ifindex);
        if let Some(link) = self.attached.remove(&ifindex) {
            // A device already gone took its link with it.
            let _ = self.hop().detach(link);
        }
    }

    /// Sets (or with None removes) the destination (VNI, MAC).
    pub fn set_destination(
        &mut self,
        vni: u32,
        mac: [u8; 6],
        dest: Option<Destination>,
    ) -> io::Result<()> {
        let key = DestKey {
            vni,
            mac,
            pad: [0; 2],
        };
        let Some(dest) = dest else {
            let _ = self.dests.remove(&key);
            return Ok(());
        };
        let value = match dest {
            Destination::Local { slot, ifindex } => Dest {
                kind: DEST_LOCAL,
                slot,
                ifindex,
                ..Default::default()
            },
            Destination::Remote {
                uplink_ifindex,
                src_ip,
                dst_ip,
                src_mac,
                dst_mac,
                limit,
            } => {
                // A limiter whose bucket cannot be kept here: every frame to the engines.
                let bucketed = limit.filter(|l| (l.bucket as usize) < MAX_DEST_BUCKETS);
                Dest {
                    kind: DEST_REMOTE,
                    slot: 0,
                    ifindex: uplink_ifindex,
                    limited: u32::from(limit.is_some() && bucketed.is_none()),
                    src_ip: u32::from_ne_bytes(src_ip.octets()),
                    dst_ip: u32::from_ne_bytes(dst_ip.octets()),
                    src_mac,
                    dst_mac,
                    bucket: bucketed.map_or(0, |l| l.bucket),
                    drop_beyond: u32::from(bucketed.is_some_and(|l| l.drop_beyond)),
                    burst_ns: DEST_BURST_NS as u32,
                    ps_per_byte: bucketed.map_or(0, |l| {
                        crate::engine::fastpath::ps_per_byte(l.bytes_per_sec.max(1))
                    }),
                }
            }
        };
        self.dests
            .insert(key, value, 0)
            .map_err(|e| aya_error(e, "fp_dests"))
    }

    /// Takes the burst of a remote destination's bucket (`DestinationLimit::bucket`): frames
    /// to it pass at its rate from now, as they left the engines' limiter. A frame the
    /// kernel admits between the read and the write keeps the later of the two times.
    pub fn spend_destination_burst(&mut self, bucket: u32) -> io::Result<()> {
        if bucket as usize >= MAX_DEST_BUCKETS {
            return Ok(());
        }
        let spent = kernel_clock_ns() + DEST_BURST_NS;
        let tat = self.dest_tat.get(&bucket, 0).unwrap_or(0);
        if tat >= spent {
            return Ok(());
        }
        self.dest_tat
            .set(bucket, spent, 0)
            .map_err(|e| aya_error(e, "fp_dest_tat"))
    }

    /// Writes a VM's grant.
    pub fn write_grant(&mut self, grant: &Grant) -> io::Result<()> {
        let w = &grant.want;
        let flags = if w.tx { CTL_TX } else { 0 }
            | if w.rx { CTL_RX } else { 0 }
            | if w.rx_drop { CTL_RX_DROP } else { 0 }
            | if w.tx_drop { CTL_TX_DROP } else { 0 };
        let ctl = Ctl {
            flags,
            pad: 0,
            tx_epoch: grant.epochs.tx,
            rx_epoch: grant.epochs.rx,
            tx_ps_per_byte: w.tx_ps_per_byte,
            tx_ns_per_packet: w.tx_ns_per_packet,
            rx_ps_per_byte: w.rx_ps_per_byte,
            rx_ns_per_packet: w.rx_ns_per_packet,
            burst_ns: BURST_NS,
        };
        self.ctl
            .set(w.slot, ctl, 0)
            .map_err(|e| aya_error(e, "fp_ctl"))
    }

    /// A VM's epochs as the kernel keeps them, and whether the kernel has resumed the VM's
    /// frames itself at the current tx epoch (see [`KernelFastPath::release`]).
    pub fn epochs(&self, slot: u32) -> (Epochs, bool) {
        self.state
            .get(&slot, 0)
            .map(|s| {
                let epochs = Epochs {
                    tx: s.tx_epoch,
                    rx: s.rx_epoch,
                };
                (epochs, s.tx_resumed == s.tx_epoch + 1)
            })
            .unwrap_or_default()
    }

    /// Tells the kernel that the switch has taken `taken` entries of VM port `slot`'s ring
    /// and, after handling them, holds nothing of the VM: at the next frame that finds every
    /// frame it handed over taken, the kernel resumes the VM's frames itself (if the VM may
    /// send on the fast path at all), without waiting for a grant of its current epoch.
    pub fn release(&mut self, slot: u32, taken: u64) -> io::Result<()> {
        self.released
            .set(slot, taken, 0)
            .map_err(|e| aya_error(e, "fp_released"))
    }

    /// The entries of the ring of port `slot` taken so far, and how many may wait in it
    /// before the VM's frames to hand over are dropped at its port instead (0: no bound).
    pub fn set_ring(&mut self, slot: u32, taken: u64, limit: u64) -> io::Result<()> {
        self.ring
            .set(slot, Ring { taken, limit }, 0)
            .map_err(|e| aya_error(e, "fp_ring"))
    }

    /// Frames dropped beyond remote destination `bucket`'s rate so far.
    pub fn destination_dropped(&self, bucket: u32) -> u64 {
        if bucket as usize >= MAX_DEST_BUCKETS {
            return 0;
        }
        self.dest_dropped.get(&bucket, 0).unwrap_or(0)
    }

    /// A port's hand-over counts (`taken` left 0 for the caller to fill).
    pub fn handover(&self, slot: u32) -> RingCounts {
        self.handover
            .get(&slot, 0)
            .map(|h| RingCounts {
                handed: h.handed,
                tapped: h.tapped,
                taken: 0,
            })
            .unwrap_or_default()
    }

    /// Every (receiving VM, sending VM) pair's arrivals in the kernel, summed over CPUs,
    /// into `out` (replaced), if any arrived since the last call; false (and `out` left as
    /// it was) if none did. The map is LRU: a pair evicted starts again from zero.
    pub fn arrivals(&self, out: &mut Vec<Arrivals>) -> bool {
        let seq = self
            .arrival_seq
            .get(&0, 0)
            .map_or(0, |v| v.iter().sum::<u64>());
        if self.arrivals_read_at.replace(Some(seq)) == Some(seq) {
            return false;
        }
        out.clear();
        for entry in self.arrivals.iter() {
            let Ok((key, per_cpu)) = entry else {
                continue;
            };
            let mut a = Arrivals {
                slot: key.slot,
                src_ip: Ipv4Addr::from(key.src_ip.to_ne_bytes()),
                src_mac: key.src_mac,
                bytes: 0,
                packets: 0,
                dropped: 0,
                last_ns: 0,
            };
            for c in per_cpu.iter() {
                a.bytes += c.bytes;
                a.packets += c.packets;
                a.dropped += c.dropped;
                a.last_ns = a.last_ns.max(c.last_ns);
            }
            out.push(a);
        }
        true
    }

    /// A slot's counters, summed over CPUs.
    pub fn counters(&self, slot: u32) -> FastPathCounters {
        let mut out = [0; COUNTERS];
        if (slot as usize) < MAX_SLOTS {
            for (i, o) in out.iter_mut().enumerate() {
                let at = slot * COUNTERS as u32 + i as u32;
                if let Ok(v) = self.counts.get(&at, 0) {
                    *o = v.iter().sum();
                }
            }
        }
        counters_from_kernel(&out)
    }
}

/// The program's counters, in `fastpath.bpf.c`'s order (frames and bytes each way, drops,
/// then the reasons frames were handed over), as the switch's statistics name them.
fn counters_from_kernel(c: &[u64; COUNTERS]) -> FastPathCounters {
    FastPathCounters {
        tx_packets: c[0],
        tx_bytes: c[1],
        rx_packets: c[2],
        rx_bytes: c[3],
        rx_dropped: c[4],
        handed_not_granted: c[5],
        handed_tokens: c[6],
        handed_not_unicast_ipv4: c[7],
        handed_spoofed: c[8],
        handed_destination: c[9],
        handed_offload: c[10],
        handed_geneve_options: c[11],
        tx_dropped: c[12],
        tx_resumed: c[13],
        tx_shed: c[14],
    }
}
