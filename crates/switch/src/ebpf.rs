//! The switch's eBPF programs (docs/switch.md, "eBPF"): C sources in `crates/switch/bpf/`,
//! compiled by the build (build.rs, clang) and loaded with aya, a maintained pure-Rust loader
//! that relocates them against the running kernel's BTF.
//!
//! - `xdp_port.bpf.c`: the XDP program of every AF_XDP port. It redirects the port's frames to
//!   its socket and, on the uplink, drops the Geneve frames of VMs the switch marked throttled
//!   ([`EarlyDrop`]), counting them per VM and reason.
//! - `softirq.bpf.c`: tracepoint programs measuring the kernel's NET_RX softirq time spent on
//!   each tenant port ([`SoftirqAccounting`]), which the switch charges to the port's tenant.
//!
//! This module does the I/O (maps, system calls); what to throttle and how to charge is the
//! engine's (`engine::kernel`).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::{BtfTracePoint, Xdp, XdpFlags};
use aya::{include_bytes_aligned, Btf, Ebpf, EbpfLoader, Pod};

use crate::engine::{SoftirqDelta, XdpThrottle};
use crate::stats::SoftirqTotals;

/// The XDP program of AF_XDP ports (empty when the build had no clang).
static XDP_PORT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_port.o"));
/// The softirq accounting programs (empty when the build had no clang).
static SOFTIRQ: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/softirq.o"));

/// Slots of the programs' per-VM tables (`MAX_SLOTS` in the C sources): a VM is in slot
/// `port index`, so ports from 1024 on get no early drop or softirq accounting.
pub const MAX_SLOTS: usize = 1024;
/// Reasons counted per slot by the XDP program, in its order.
const XDP_REASONS: usize = 2;

/// Whether the build compiled the eBPF programs (it had clang). Without them AF_XDP ports,
/// early drop and softirq accounting are unavailable.
pub fn programs_built() -> bool {
    !XDP_PORT.is_empty() && !SOFTIRQ.is_empty()
}

/// The error of an aya call as an `io::Error` that keeps the kind of the system call's error
/// (so "permission denied" stays recognisable) and says what was being done.
pub(crate) fn aya_error(err: impl std::error::Error + 'static, what: &str) -> io::Error {
    let mut kind = io::ErrorKind::Other;
    let mut text = err.to_string();
    let mut source: Option<&(dyn std::error::Error + 'static)> = err.source();
    if let Some(io) = (&err as &(dyn std::error::Error + 'static)).downcast_ref::<io::Error>() {
        kind = io.kind();
    }
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            kind = io.kind();
        }
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    io::Error::new(kind, format!("{what}: {text}"))
}

/// Parses `object` and creates its maps; a clear error when the build had no clang.
pub(crate) fn load(object: &[u8], what: &str) -> io::Result<Ebpf> {
    if object.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{what}: eBPF programs were not built: install clang (scripts/setup.sh) and \
                 rebuild"
            ),
        ));
    }
    EbpfLoader::new()
        .load(object)
        .map_err(|e| aya_error(e, what))
}

/// How the XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachFlags {
    Native,
    Generic,
}

/// The XDP program of one AF_XDP port, attached to its interface with a BPF link (detached
/// when this is dropped, also when the process dies).
pub(crate) struct PortProgram {
    bpf: Ebpf,
}

impl PortProgram {
    /// Loads the program with socket `xsk` at key 0 of its XSKMAP.
    pub(crate) fn load(xsk: RawFd) -> io::Result<PortProgram> {
        let mut bpf = load(XDP_PORT, "loading the XDP program")?;
        let map = bpf.map_mut("xsks").expect("xdp_port.bpf.c defines xsks");
        let mut xsks = aya::maps::XskMap::try_from(map).map_err(|e| aya_error(e, "XSKMAP"))?;
        xsks.set(0, xsk, 0)
            .map_err(|e| aya_error(e, "adding the socket to the XSKMAP"))?;
        let prog: &mut Xdp = bpf
            .program_mut("picnic_xdp")
            .expect("xdp_port.bpf.c defines picnic_xdp")
            .try_into()
            .map_err(|e| aya_error(e, "XDP program"))?;
        prog.load()
            .map_err(|e| aya_error(e, "loading the XDP program into the kernel"))?;
        Ok(PortProgram { bpf })
    }

    /// Adds socket `xsk` at key `queue` of the XSKMAP: the frames of that NIC queue go to it.
    pub(crate) fn add_socket(&mut self, queue: u32, xsk: RawFd) -> io::Result<()> {
        let map = self
            .bpf
            .map_mut("xsks")
            .expect("xdp_port.bpf.c defines xsks");
        let mut xsks = aya::maps::XskMap::try_from(map).map_err(|e| aya_error(e, "XSKMAP"))?;
        xsks.set(queue, xsk, 0)
            .map_err(|e| aya_error(e, &format!("adding queue {queue}'s socket to the XSKMAP")))
    }

    /// Attaches the program to interface `index`.
    pub(crate) fn attach(&mut self, index: u32, mode: AttachFlags) -> io::Result<()> {
        let prog: &mut Xdp = self
            .bpf
            .program_mut("picnic_xdp")
            .expect("loaded")
            .try_into()
            .expect("an XDP program");
        let flags = match mode {
            AttachFlags::Native => XdpFlags::DRV_MODE,
            AttachFlags::Generic => XdpFlags::SKB_MODE,
        };
        prog.attach_to_if_index(index, flags)
            .map(|_| ())
            .map_err(|e| aya_error(e, "bpf_link_create"))
    }

    /// The maps through which the switch drops frames in this program (taken once: None
    /// afterwards).
    pub(crate) fn early_drop(&mut self) -> Option<EarlyDrop> {
        let data = |map| match map {
            aya::maps::Map::HashMap(d) | aya::maps::Map::PerCpuArray(d) => Some(d),
            _ => None,
        };
        let throttled = data(self.bpf.take_map("throttled")?)?;
        let drops = data(self.bpf.take_map("xdp_drops")?)?;
        EarlyDrop::over(throttled, drops).ok()
    }
}

/// `struct vm_key` of xdp_port.bpf.c.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct VmKey {
    vni: u32,
    mac: [u8; 6],
    pad: [u8; 2],
}
// SAFETY: plain C data without padding (4 + 6 + 2 bytes) or pointers.
unsafe impl Pod for VmKey {}

/// `struct throttle` of xdp_port.bpf.c.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ThrottleValue {
    slot: u32,
    reasons: u32,
}
// SAFETY: plain C data without padding or pointers.
unsafe impl Pod for ThrottleValue {}

/// The uplink's early drop (issue 12 item 3, Iron 3.3): which VMs' frames the XDP program
/// drops, and how many it dropped. With several workers each has its own handle on the same
/// maps ([`EarlyDrop::handle`]) and sets the entries of the VMs it owns only.
pub struct EarlyDrop {
    throttled: BpfHashMap<MapData, VmKey, ThrottleValue>,
    drops: PerCpuArray<MapData, u64>,
    /// Copies of the two maps' descriptors, for [`EarlyDrop::handle`].
    fds: [OwnedFd; 2],
    /// What this handle put in `throttled`: a map update only when a VM's state changes.
    state: HashMap<VmKey, ThrottleValue>,
    /// Per slot and reason: drops already handed to the engine. A slot's count starts when
    /// this handle first throttles it (another handle may have counted the slot's earlier
    /// VM).
    counted: Vec<Option<[u64; XDP_REASONS]>>,
}

impl EarlyDrop {
    fn over(throttled: MapData, drops: MapData) -> io::Result<EarlyDrop> {
        let fds = [
            throttled.fd().as_fd().try_clone_to_owned()?,
            drops.fd().as_fd().try_clone_to_owned()?,
        ];
        Ok(EarlyDrop {
            throttled: BpfHashMap::try_from(aya::maps::Map::HashMap(throttled))
                .map_err(|e| aya_error(e, "XDP throttle map"))?,
            drops: PerCpuArray::try_from(aya::maps::Map::PerCpuArray(drops))
                .map_err(|e| aya_error(e, "XDP drop counts"))?,
            fds,
            state: HashMap::new(),
            counted: vec![None; MAX_SLOTS],
        })
    }

    /// Another handle on the same maps, for another worker; it starts with no entries of its
    /// own.
    pub fn handle(&self) -> io::Result<EarlyDrop> {
        let map = |fd: &OwnedFd| {
            MapData::from_fd(fd.try_clone()?).map_err(|e| aya_error(e, "XDP map handle"))
        };
        EarlyDrop::over(map(&self.fds[0])?, map(&self.fds[1])?)
    }

    /// The drops counted in `slot` so far, per reason.
    fn totals(&self, slot: u32) -> [u64; XDP_REASONS] {
        std::array::from_fn(|reason| {
            let at = slot * XDP_REASONS as u32 + reason as u32;
            self.drops
                .get(&at, 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0)
        })
    }

    /// Makes the program drop exactly the frames of `want` (the engine's current set): one
    /// map update per VM whose state changed, none otherwise.
    pub fn apply(&mut self, want: &[XdpThrottle]) -> io::Result<()> {
        let key = |t: &XdpThrottle| VmKey {
            vni: t.vni,
            mac: t.mac,
            pad: [0; 2],
        };
        let stale: Vec<VmKey> = self
            .state
            .keys()
            .filter(|k| !want.iter().any(|t| key(t) == **k))
            .copied()
            .collect();
        for k in stale {
            match self.throttled.remove(&k) {
                Ok(()) => {}
                // Already gone: nothing to undo.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(aya_error(e, "XDP throttle map delete")),
            }
            self.state.remove(&k);
        }
        for t in want.iter().filter(|t| (t.slot as usize) < MAX_SLOTS) {
            let value = ThrottleValue {
                slot: t.slot,
                reasons: t.reasons,
            };
            let k = key(t);
            if self.state.get(&k) != Some(&value) {
                let slot = t.slot as usize;
                if self.counted[slot].is_none() {
                    self.counted[slot] = Some(self.totals(t.slot));
                }
                self.throttled
                    .insert(k, value, 0)
                    .map_err(|e| aya_error(e, "XDP throttle map update"))?;
                self.state.insert(k, value);
            }
        }
        Ok(())
    }

    /// The drops counted since the last call in `slots` (the VMs this handle's engine owns),
    /// as (slot, reason index, frames); only slots this handle throttled are read. A slot
    /// no longer in `slots` is forgotten: its next VM may be counted by another handle.
    pub fn new_drops(&mut self, slots: &[u32], out: &mut Vec<(u32, usize, u64)>) {
        out.clear();
        for (slot, counted) in self.counted.iter_mut().enumerate() {
            if counted.is_some() && !slots.contains(&(slot as u32)) {
                *counted = None;
            }
        }
        for &slot in slots.iter().filter(|&&s| (s as usize) < MAX_SLOTS) {
            if self.counted[slot as usize].is_none() {
                continue;
            }
            let totals = self.totals(slot);
            let seen = self.counted[slot as usize].as_mut().expect("checked");
            for (reason, (&total, seen)) in totals.iter().zip(seen.iter_mut()).enumerate() {
                if total > *seen {
                    out.push((slot, reason, total - *seen));
                    *seen = total;
                }
            }
        }
    }
}

/// `struct config` of softirq.bpf.c.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SoftirqConfig {
    switch_tids: [u32; MAX_SWITCH_THREADS],
}

/// `MAX_SWITCH_THREADS` of softirq.bpf.c: dataplane threads the programs tell apart.
pub const MAX_SWITCH_THREADS: usize = 16;
// SAFETY: plain C data without padding or pointers.
unsafe impl Pod for SoftirqConfig {}

/// `struct usage` of softirq.bpf.c.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    ns: [u64; 2],
    packets: [u64; 2],
    kthread_ns: [u64; 2],
    switch_ns: u64,
    switch_packets: u64,
}
// SAFETY: plain C data of u64s.
unsafe impl Pod for Usage {}

// SAFETY: `struct totals` of softirq.bpf.c, plain C data of u64s (`SoftirqTotals` is
// repr(C) in that order).
unsafe impl Pod for SoftirqTotals {}

/// The softirq accounting programs, attached to their tracepoints while this lives.
pub struct SoftirqAccounting {
    _bpf: Ebpf,
    config: Array<MapData, SoftirqConfig>,
    ports: BpfHashMap<MapData, u64, u32>,
    usage: PerCpuArray<MapData, Usage>,
    totals: PerCpuArray<MapData, SoftirqTotals>,
    /// Per thread: tracked ports' softirq ns run in its context.
    task_ns: PerCpuHashMap<MapData, u32, u64>,
    /// Per thread asked about at the last [`SoftirqAccounting::new_in_threads`]: its
    /// `task_ns` then.
    task_seen: rustc_hash::FxHashMap<u32, u64>,
    /// The network namespace of the thread that opened it (its nsfs inode number, the
    /// kernel's `ns.inum`): the switch's, where its ports are.
    netns: u64,
    /// Tracked slots and what was already handed to the engine.
    seen: Vec<(u32, Usage)>,
}

impl SoftirqAccounting {
    /// Loads and attaches the programs (tp_btf: needs the kernel's BTF and root).
    pub fn open() -> io::Result<SoftirqAccounting> {
        let mut bpf = load(SOFTIRQ, "loading the softirq accounting programs")?;
        let btf = Btf::from_sys_fs().map_err(|e| aya_error(e, "reading the kernel's BTF"))?;
        for (prog, tracepoint) in [
            ("picnic_softirq_entry", "softirq_entry"),
            ("picnic_softirq_exit", "softirq_exit"),
            ("picnic_netif_receive_skb", "netif_receive_skb"),
        ] {
            let p: &mut BtfTracePoint = bpf
                .program_mut(prog)
                .expect("softirq.bpf.c defines it")
                .try_into()
                .map_err(|e| aya_error(e, prog))?;
            p.load(tracepoint, &btf)
                .map_err(|e| aya_error(e, &format!("loading {prog}")))?;
            p.attach()
                .map_err(|e| aya_error(e, &format!("attaching {prog} to {tracepoint}")))?;
        }
        let take = |bpf: &mut Ebpf, name: &str| {
            bpf.take_map(name)
                .ok_or_else(|| io::Error::other(format!("softirq.bpf.c has no map {name}")))
        };
        let config =
            Array::try_from(take(&mut bpf, "config")?).map_err(|e| aya_error(e, "config"))?;
        let ports =
            BpfHashMap::try_from(take(&mut bpf, "ports")?).map_err(|e| aya_error(e, "ports"))?;
        let usage =
            PerCpuArray::try_from(take(&mut bpf, "usage")?).map_err(|e| aya_error(e, "usage"))?;
        let totals =
            PerCpuArray::try_from(take(&mut bpf, "totals")?).map_err(|e| aya_error(e, "totals"))?;
        let task_ns = PerCpuHashMap::try_from(take(&mut bpf, "task_ns")?)
            .map_err(|e| aya_error(e, "task_ns"))?;
        let netns = std::fs::metadata("/proc/thread-self/ns/net")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .map_err(|e| io::Error::new(e.kind(), format!("/proc/thread-self/ns/net: {e}")))?;
        Ok(SoftirqAccounting {
            _bpf: bpf,
            config,
            ports,
            usage,
            totals,
            task_ns,
            task_seen: Default::default(),
            netns,
            seen: Vec::new(),
        })
    }

    /// Tells the programs which thread is the switch's dataplane (its softirq time is its own
    /// measured CPU time, not charged again).
    pub fn set_switch_thread(&mut self, tid: u32) -> io::Result<()> {
        self.set_switch_threads(&[tid])
    }

    /// As [`Self::set_switch_thread`] for several workers' threads (each measures its own
    /// thread's CPU time); at most [`MAX_SWITCH_THREADS`] are told apart.
    pub fn set_switch_threads(&mut self, tids: &[u32]) -> io::Result<()> {
        let mut config = SoftirqConfig {
            switch_tids: [0; MAX_SWITCH_THREADS],
        };
        for (slot, &tid) in config.switch_tids.iter_mut().zip(tids) {
            *slot = tid;
        }
        self.config
            .set(0, config, 0)
            .map_err(|e| aya_error(e, "softirq config"))
    }

    /// Tracks exactly `ports`: (ifindex in this namespace, slot). Counters of slots that stay
    /// carry on.
    pub fn set_ports(&mut self, ports: &[(u32, u32)]) -> io::Result<()> {
        let keys: Vec<u64> = self.ports.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = self.ports.remove(&k);
        }
        let mut seen = Vec::with_capacity(ports.len());
        for &(ifindex, slot) in ports.iter().filter(|(_, s)| (*s as usize) < MAX_SLOTS) {
            self.ports
                .insert((self.netns << 32) | u64::from(ifindex), slot, 0)
                .map_err(|e| aya_error(e, "softirq port map update"))?;
            let base = self.read_usage(slot).unwrap_or_default();
            seen.push((slot, base));
        }
        self.seen = seen;
        Ok(())
    }

    fn read_usage(&self, slot: u32) -> Option<Usage> {
        let values = self.usage.get(&slot, 0).ok()?;
        Some(values.iter().fold(Usage::default(), |mut a, u| {
            for d in 0..2 {
                a.ns[d] += u.ns[d];
                a.packets[d] += u.packets[d];
                a.kthread_ns[d] += u.kthread_ns[d];
            }
            a.switch_ns += u.switch_ns;
            a.switch_packets += u.switch_packets;
            a
        }))
    }

    /// What each tracked port's softirq work grew by since the last call.
    pub fn new_usage(&mut self, out: &mut Vec<SoftirqDelta>) {
        out.clear();
        for i in 0..self.seen.len() {
            let (slot, before) = self.seen[i];
            let Some(now) = self.read_usage(slot) else {
                continue;
            };
            let d = |a: u64, b: u64| a.saturating_sub(b);
            let delta = SoftirqDelta {
                slot,
                from_vm_ns: d(now.ns[0], before.ns[0]),
                to_vm_ns: d(now.ns[1], before.ns[1]),
                packets: d(
                    now.packets[0] + now.packets[1],
                    before.packets[0] + before.packets[1],
                ),
                kthread_ns: d(
                    now.kthread_ns[0] + now.kthread_ns[1],
                    before.kthread_ns[0] + before.kthread_ns[1],
                ),
                in_switch_ns: d(now.switch_ns, before.switch_ns),
            };
            self.seen[i].1 = now;
            if delta.from_vm_ns + delta.to_vm_ns + delta.in_switch_ns + delta.packets > 0 {
                out.push(delta);
            }
        }
    }

    /// For each group of threads, the tracked ports' softirq time run in its threads'
    /// contexts since the last call (a thread seen for the first time counts from 0).
    /// Threads not in `groups` are forgotten.
    pub fn new_in_threads(&mut self, groups: &[Vec<u32>], out: &mut Vec<u64>) {
        out.clear();
        let mut seen = rustc_hash::FxHashMap::default();
        for tids in groups {
            let mut sum = 0;
            for &tid in tids {
                let now: u64 = self
                    .task_ns
                    .get(&tid, 0)
                    .map(|per_cpu| per_cpu.iter().sum())
                    .unwrap_or(0);
                let before = self.task_seen.get(&tid).copied().unwrap_or(0);
                sum += now.saturating_sub(before);
                seen.insert(tid, now);
            }
            out.push(sum);
        }
        self.task_seen = seen;
    }

    /// All NET_RX softirq time so far, summed over the CPUs.
    pub fn totals(&self) -> SoftirqTotals {
        let Ok(values) = self.totals.get(&0, 0) else {
            return SoftirqTotals::default();
        };
        values.iter().fold(SoftirqTotals::default(), |mut a, t| {
            a.net_rx_ns += t.net_rx_ns;
            a.windows += t.windows;
            a.attributed_ns += t.attributed_ns;
            a.switch_ns += t.switch_ns;
            a.untracked_ns += t.untracked_ns;
            a.packets += t.packets;
            a
        })
    }
}

/// The runner's side of the programs: moves the engine's throttle set into the uplink's XDP
/// map, the XDP drop counts and the ports' softirq time into the engine. Everything is
/// optional: a switch without an AF_XDP uplink has no early drop, one whose softirq programs
/// did not load has no softirq accounting.
#[derive(Default)]
pub struct KernelLink {
    early_drop: Option<EarlyDrop>,
    /// With several workers: this worker's index and which worker owns each port; the link
    /// then throttles and counts the VMs of this worker only.
    worker: Option<(usize, Vec<usize>)>,
    softirq: Option<SoftirqAccounting>,
    throttles: Vec<XdpThrottle>,
    drops: Vec<(u32, usize, u64)>,
    slots: Vec<u32>,
    deltas: Vec<SoftirqDelta>,
    next_softirq_read: picnic_core::Instant,
    /// The softirq accounting could not be started at a live change (reported once).
    softirq_failed: bool,
}

/// How often the ports' softirq time is read and charged: Iron's period.
const SOFTIRQ_READ_PERIOD: picnic_core::Duration = crate::engine::IRON_PERIOD;

impl KernelLink {
    /// The link for a switch with the uplink's early drop (if its port has one) and, when
    /// `softirq` is on, softirq accounting of `ports` (name, slot). A softirq accounting that
    /// cannot load is reported in one line and left off.
    pub fn open(early_drop: Option<EarlyDrop>, softirq: bool, ports: &[(String, u32)]) -> Self {
        let softirq = if softirq {
            match SoftirqAccounting::open() {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(
                        "softirq accounting off: {e} (tenants are charged for \
                         the switch's own work only)"
                    );
                    None
                }
            }
        } else {
            None
        };
        let mut link = KernelLink {
            early_drop,
            softirq,
            ..Default::default()
        };
        if let Err(e) = link.set_ports(ports) {
            tracing::warn!("softirq accounting off: {e}");
            link.softirq = None;
        }
        link
    }

    /// Starts the softirq accounting of `ports` when it is off, as a start-up config with a
    /// CPU quota would have (a live change gave a tenant the switch's first quota); called on
    /// the dataplane thread. A failure is reported once and leaves it off.
    pub fn start_softirq(&mut self, ports: &[(String, u32)], workers: &[u32]) {
        if self.softirq.is_some() || self.softirq_failed {
            return;
        }
        let started = SoftirqAccounting::open().and_then(|s| {
            self.softirq = Some(s);
            self.set_ports(ports)
        });
        match started {
            Ok(()) => {
                match workers {
                    [] => self.set_dataplane_thread(),
                    tids => self.set_dataplane_threads(tids),
                }
                tracing::info!("softirq accounting (eBPF tracepoints): on");
            }
            Err(e) => {
                tracing::warn!(
                    "softirq accounting off: {e} (tenants are charged for the \
                     switch's own work only)"
                );
                self.softirq = None;
                self.softirq_failed = true;
            }
        }
    }

    /// The link of worker `index` among several: a handle of its own on the early drop's
    /// maps, for the VMs of the ports `owner` gives it (softirq time is the coordinator's). A
    /// handle that cannot be made is reported in one line and leaves that worker without
    /// early drop (its VMs' frames are then dropped in the switch).
    pub fn for_worker(&self, index: usize, owner: &[usize]) -> KernelLink {
        let early_drop = self.early_drop.as_ref().and_then(|e| {
            e.handle()
                .map_err(|e| tracing::warn!("worker {index}: early drop off: {e}"))
                .ok()
        });
        KernelLink {
            early_drop,
            worker: Some((index, owner.to_vec())),
            ..Default::default()
        }
    }

    /// A worker's link after a live change moved ports: the new owner of each.
    pub fn set_owner(&mut self, owner: &[usize]) {
        if let Some((_, mine)) = self.worker.as_mut() {
            mine.clear();
            mine.extend_from_slice(owner);
        }
    }

    /// Whether a link of `worker` (see the field) throttles and counts the VM on port `slot`.
    fn owns(worker: &Option<(usize, Vec<usize>)>, slot: usize) -> bool {
        worker
            .as_ref()
            .is_none_or(|(me, owner)| owner.get(slot) == Some(me))
    }

    /// When a worker stops: its last drop counts into its engine, its VMs' entries out of the
    /// map (the switch's own handle, which takes over, did not make them).
    pub fn release(&mut self, engine: &mut crate::engine::Engine, now: picnic_core::Instant) {
        self.publish(engine, now);
        if let Some(early) = self.early_drop.as_mut() {
            if let Err(e) = early.apply(&[]) {
                tracing::warn!("early drop: {e}");
            }
        }
    }

    /// Whether the uplink drops throttled VMs' frames in XDP.
    pub fn early_drop_on(&self) -> bool {
        self.early_drop.is_some()
    }

    /// Whether the ports' softirq time is measured and charged.
    pub fn softirq_on(&self) -> bool {
        self.softirq.is_some()
    }

    /// Tracks the softirq time of `ports` (interface name in this namespace, slot); after a
    /// reconfiguration too.
    pub fn set_ports(&mut self, ports: &[(String, u32)]) -> io::Result<()> {
        let Some(s) = self.softirq.as_mut() else {
            return Ok(());
        };
        let mut tracked = Vec::with_capacity(ports.len());
        for (name, slot) in ports {
            let Ok(cname) = std::ffi::CString::new(name.as_str()) else {
                continue;
            };
            // SAFETY: `cname` is a NUL-terminated string that outlives the call.
            let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
            if index != 0 {
                tracked.push((index, *slot));
            }
        }
        s.set_ports(&tracked)
    }

    /// Marks the calling thread as the switch's dataplane thread.
    pub fn set_dataplane_thread(&mut self) {
        if let Some(s) = self.softirq.as_mut() {
            // SAFETY: gettid has no arguments and cannot fail.
            let tid = unsafe { libc::gettid() } as u32;
            if let Err(e) = s.set_switch_thread(tid) {
                tracing::warn!("softirq accounting: {e}");
            }
        }
    }

    /// Marks the workers' threads `tids` as the switch's dataplane (several workers).
    pub fn set_dataplane_threads(&mut self, tids: &[u32]) {
        if let Some(s) = self.softirq.as_mut() {
            if let Err(e) = s.set_switch_threads(tids) {
                tracing::warn!("softirq accounting: {e}");
            }
        }
    }

    /// Per loop iteration: the engine's throttle set into the XDP map (a system call only
    /// for a VM whose state changed) and, once per Iron period, the ports' softirq time into
    /// the engine.
    pub fn tick(&mut self, engine: &mut crate::engine::Engine, now: picnic_core::Instant) {
        self.tick_early_drop(engine, now);
        self.charge_softirq(engine, now);
    }

    /// The engine's throttle set into the XDP map (a system call only for a VM whose state
    /// changed).
    fn tick_early_drop(&mut self, engine: &mut crate::engine::Engine, now: picnic_core::Instant) {
        if self.early_drop.is_some() {
            engine.xdp_throttles(now, &mut self.throttles);
            let worker = &self.worker;
            self.throttles
                .retain(|t| Self::owns(worker, t.slot as usize));
            let early = self.early_drop.as_mut().expect("checked");
            if let Err(e) = early.apply(&self.throttles) {
                tracing::warn!("early drop off: {e}");
                self.early_drop = None;
            }
        }
    }

    /// Once per Iron period, the ports' softirq time into the engine. The coordinator of
    /// several workers calls only this: its workers drive the early drop, each for its VMs.
    pub fn charge_softirq(
        &mut self,
        engine: &mut crate::engine::Engine,
        now: picnic_core::Instant,
    ) {
        if let Some(s) = self.softirq.as_mut() {
            if now >= self.next_softirq_read {
                self.next_softirq_read = now + SOFTIRQ_READ_PERIOD;
                s.new_usage(&mut self.deltas);
                for d in &self.deltas {
                    engine.charge_softirq(now, d);
                }
            }
        }
    }

    /// For each group of threads (a tenant cgroup's), the tracked ports' softirq time the
    /// kernel ran in their time slices since the last call; zeros without softirq
    /// accounting (nothing is then charged for ports' softirq work, nothing credited).
    pub fn softirq_in_threads(&mut self, groups: &[Vec<u32>], out: &mut Vec<u64>) {
        match self.softirq.as_mut() {
            Some(s) => s.new_in_threads(groups, out),
            None => {
                out.clear();
                out.resize(groups.len(), 0);
            }
        }
    }

    /// When publishing (and before the engine is replaced): the XDP drop counts into the
    /// engine's drop counters, the host's softirq totals into its switch counters.
    pub fn publish(&mut self, engine: &mut crate::engine::Engine, now: picnic_core::Instant) {
        if self.early_drop.is_some() {
            self.slots.clear();
            let worker = &self.worker;
            let owned = engine.dir.local_vms().map(|(_, p)| p);
            self.slots
                .extend(owned.filter(|&p| Self::owns(worker, p)).map(|p| p as u32));
            let early = self.early_drop.as_mut().expect("checked");
            early.new_drops(&self.slots, &mut self.drops);
            for &(slot, reason, n) in &self.drops {
                engine.on_xdp_drops(now, slot as usize, reason, n);
            }
        }
        if let Some(s) = self.softirq.as_ref() {
            engine.counters.softirq = Some(s.totals());
        }
    }
}
