//! The switch's TOML configuration: this host, its uplink and peers, tenants, VMs, SLOs,
//! and which isolation mechanisms are on. Validation names the offending field.

mod backend;
mod feedback_keys;
mod files;
mod mac;
#[cfg(test)]
pub(crate) mod tests;
mod validate;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use picnic_core::slo::Slo;
use picnic_core::Rate;
use serde::{Deserialize, Serialize};

pub use backend::Backend;
pub use feedback_keys::{EpochKey, FeedbackKeys};
pub use mac::Mac;
pub use validate::{ConfigError, MAX_MBPS, MAX_PACKETS};

/// Shortest and longest EEVDF slice the kernel accepts for a fair-class thread, ns
/// (`switch.slice_us`; set by [`crate::sched`]).
pub const SLICE_RANGE_NS: std::ops::RangeInclusive<u64> = 100_000..=100_000_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub switch: SwitchSection,
    pub uplink: UplinkSection,
    #[serde(default)]
    pub isolation: Isolation,
    #[serde(default)]
    pub ingress: IngressSection,
    #[serde(default)]
    pub egress: EgressSection,
    /// The shared encryption engine of tenants with `encrypt = true`.
    #[serde(default)]
    pub accel: AccelSection,
    /// The kernel fast path (docs/switch.md "Two paths").
    #[serde(default)]
    pub fastpath: FastPathSection,
    /// The cluster control plane (etcd); None: hosts, tenants and VMs come from this file,
    /// the state file and the API alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlSection>,
    /// The feedback keys by epoch, written by the control plane (its `keys/feedback` record)
    /// and kept in the state file; they replace `switch.feedback_key_file`'s key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback_keys: Option<FeedbackKeys>,
    /// Every host of the overlay, this one included (static table; the API updates it live).
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    #[serde(default)]
    pub tenants: Vec<TenantEntry>,
    /// Every VM of every host the tenants span; those on this host carry a `port`.
    #[serde(default)]
    pub vms: Vec<VmEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
    /// This host's id in `hosts`.
    pub host_id: u32,
    /// Local control API (HTTP + Prometheus `/metrics`): a Unix socket path (e.g.
    /// "/run/picnic/host1.sock", created with `api_socket_mode`), or "tcp:127.0.0.1:9101",
    /// which needs `api_token_file`. Off when absent.
    #[serde(default)]
    pub api: Option<String>,
    /// Read-only Prometheus endpoint, TCP "ADDR:PORT" (e.g. "127.0.0.1:9464"): `GET /metrics`
    /// only, no token (it changes nothing). Off when absent.
    #[serde(default)]
    pub metrics: Option<String>,
    /// File mode of the API's Unix socket: 0o600 (root only) or 0o660 (and the group).
    #[serde(default = "default_api_socket_mode")]
    pub api_socket_mode: u32,
    /// File holding the bearer token a TCP API requires (`Authorization: Bearer TOKEN`, at
    /// least 16 bytes; trailing newline ignored). Kept out of the config so `/config` and the
    /// state file never show it.
    #[serde(default)]
    pub api_token_file: Option<PathBuf>,
    /// File holding the deployment's feedback key (at least 32 bytes, trailing newline
    /// ignored; e.g. `openssl rand -hex 32`), the same on every host: feedback is then authenticated
    /// (HMAC-SHA256) and replays refused. None: feedback is only checked against the
    /// directory (from the endpoint's owner host).
    #[serde(default)]
    pub feedback_key_file: Option<PathBuf>,
    /// Where the running config is persisted (atomically) after every API change, and
    /// restored from on start: its hosts, tenants and VMs replace the config file's.
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    /// Frames in the preallocated buffer pool: the bound on memory under flood.
    #[serde(default = "default_pool")]
    pub frame_pool: usize,
    /// Frames read from a port per call.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// How long the loop spins for work before blocking on the ports' descriptors.
    #[serde(default = "default_spin_us")]
    pub spin_us: u64,
    /// Nice value of the dataplane threads (-20..=19). None: [`default_nice`].
    #[serde(default)]
    pub nice: Option<i8>,
    /// EEVDF slice of the dataplane thread, us (100..=100000; Linux 6.12+). A short slice
    /// lets the switch preempt a busy tenant thread soon after it wakes instead of waiting
    /// for that thread's default slice (see `sched.rs`). None: the kernel's default.
    #[serde(default)]
    pub slice_us: Option<u64>,
    /// Runs the dataplane threads in the real-time class, SCHED_FIFO at this priority
    /// (1..=99), as a kernel datapath runs in softirq ahead of every task: a tenant's busy
    /// thread then cannot hold the switch's core until the next scheduler tick (4 ms at
    /// HZ=250; see `sched.rs`). `nice` and `slice_us` then do not apply. The kernel stops an
    /// RT thread that polls hard for the rest of its 1 s RT period after 95% of it, so keep
    /// `spin_us` low. The encryption engine's workers then run SCHED_FIFO one priority
    /// below. None: the fair class.
    #[serde(default)]
    pub realtime_priority: Option<u8>,
    /// CPUs the dataplane thread runs on (e.g. cores kept for the dataplane). None: any.
    #[serde(default)]
    pub cpus: Option<Vec<usize>>,
    /// Dataplane workers: threads each owning a share of the VMs' ports and reading the
    /// uplink through its own socket (docs/switch.md "Workers"). None: one per CPU the switch
    /// may run on (`cpus`, else its affinity mask), at most one per local VM port, at least
    /// one. 1 is a single loop serving every port, as before workers existed.
    #[serde(default)]
    pub workers: Option<usize>,
    /// After each iteration that handled frames or engine jobs, the dataplane thread yields
    /// its core (sched_yield(2)) to any thread waiting for it: for a switch that shares its
    /// cores with tenants' vCPUs, whose woken threads then wait for an iteration of the
    /// loop's work (<= `accel.inline_budget_us` of engine jobs plus one batch), not for its
    /// whole slice. Costs a system call per busy iteration. Default false.
    #[serde(default)]
    pub yield_busy: bool,
}
/// The dataplane threads' nice value when `switch.nice` is not set.
///
/// Without the kernel fast path, every frame crosses the engines: -10 keeps them ahead of
/// the tenants' threads that share their cores, as a kernel datapath in softirq would be,
/// without SCHED_FIFO's throttling cliff (an RT thread that polls hard is stopped for the
/// rest of the 1 s RT period once it has used 95% of it).
///
/// With it, frames within their tenants' allocations are forwarded in the senders' softirq,
/// ahead of every thread, and the engines carry what must queue: +5 puts them behind the
/// tenants' threads, so a tenant's thread woken by a frame preempts the engines' work for
/// another (EEVDF: a lower weight means a later deadline) instead of waiting out its
/// slice. Measured (docs/RESULTS.md, defaults-flood with the fast path): the victim's p99
/// under the flood at 2.7x its idle value with -10, 1.6x with 0, 1.2x with +5.
pub fn default_nice(fast_path: bool) -> i8 {
    if fast_path {
        5
    } else {
        -10
    }
}

/// The most dataplane workers a switch runs.
pub const MAX_WORKERS: usize = 64;

fn default_api_socket_mode() -> u32 {
    0o600
}
fn default_pool() -> usize {
    16384
}
fn default_batch() -> usize {
    64
}
fn default_spin_us() -> u64 {
    50
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UplinkSection {
    pub ifname: String,
    /// None (the default): AF_XDP where the device and the build allow it, else AF_PACKET
    /// with a log line saying why ([`crate::runner::open_uplinks`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// MTU of the underlay; tenant MTU must leave room for the Geneve encapsulation.
    #[serde(default = "default_mtu")]
    pub mtu: usize,
    /// Transmit capacity of the uplink in Mb/s: the egress WFQ is paced to it so the scheduler,
    /// not a FIFO further down, decides whose frame goes next. None: unpaced.
    #[serde(default)]
    pub capacity_mbps: Option<u64>,
}
impl UplinkSection {
    /// `capacity_mbps` as a rate.
    pub fn capacity(&self) -> Option<Rate> {
        self.capacity_mbps.map(Rate::from_mbps)
    }
}
fn default_mtu() -> usize {
    1500
}

/// Each isolation mechanism can be switched off (the lab compares on vs off).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Isolation {
    /// Source MAC/IP check on tenant ports (policy, always cheap).
    pub anti_spoofing: bool,
    /// Egress WFQ over tenants/VMs weighted by min guarantee, capped by max.
    pub egress_wfq: bool,
    /// Sender-side admission control: per-destination limiters set by receiver feedback (EyeQ 3.3).
    pub admission: bool,
    /// Ingress per-VM queues and CPU-fair WFQ on measured cost (PicNIC).
    pub ingress_wfq: bool,
    /// Receiver rate meters, RX scheduler, RCP and feedback (EyeQ 3.2-3.4).
    pub feedback: bool,
    /// Per-tenant processing-CPU accounting with quota/period throttling (Iron 3).
    pub cpu_accounting: bool,
    /// With `cpu_accounting`: the kernel's softirq time on each tenant port, measured with
    /// eBPF on tracepoints, is charged to the tenant too (docs/switch.md "eBPF"). When the
    /// programs cannot load the switch says so in one line and charges its own work only.
    pub softirq_accounting: bool,
    /// Both schedulers share each frame's dominant resource, its measured CPU or its link
    /// time (PicNIC's CPU-fair WFQ); off: they share bytes.
    pub cpu_fair: bool,
    /// The shared encryption engine's per-tenant queues and FairNIC limiter (FairNIC 4.4);
    /// off: one FIFO for every tenant's jobs.
    pub accel: bool,
    /// Tenants' offload programs get a fuel budget per 10 ms period and their CPU is charged
    /// to the tenant; off: a run only has its per-packet fuel (a sandbox without FairNIC's
    /// rate limit or Iron's accounting).
    pub offload: bool,
}
impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            anti_spoofing: true,
            egress_wfq: true,
            admission: true,
            ingress_wfq: true,
            feedback: true,
            cpu_accounting: true,
            softirq_accounting: true,
            cpu_fair: true,
            accel: true,
            offload: true,
        }
    }
}
impl Isolation {
    /// Everything off but anti-spoofing and tenant separation (which are correctness, not isolation).
    pub fn off() -> Self {
        Isolation {
            anti_spoofing: true,
            egress_wfq: false,
            admission: false,
            ingress_wfq: false,
            feedback: false,
            cpu_accounting: false,
            softirq_accounting: false,
            cpu_fair: false,
            accel: false,
            offload: false,
        }
    }
}

/// The kernel fast path (docs/switch.md "Two paths", DESIGN.md 4): frames of tenants within
/// their allocations forwarded by eBPF in the sender's softirq, the rest by the engines.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FastPathSection {
    /// Forward in the kernel what needs no queueing (on by default: with it the lab's
    /// scenarios hold their marks but defaults-bursts and ingress-flood, and with the
    /// engines alone four more fail; docs/RESULTS.md "Current state"). Needs AF_PACKET
    /// ports (the uplink then defaults to AF_PACKET), root and a build with the eBPF programs, else the switch says `kernel fast
    /// path off: <why>` and runs without it; runs with one dataplane worker (the default
    /// when it is on; an explicit `switch.workers` > 1 turns it off).
    pub kernel: bool,
}

impl Default for FastPathSection {
    fn default() -> Self {
        FastPathSection { kernel: true }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngressSection {
    /// Receive capacity C of this host's access link in Mb/s (EyeQ's congestion point).
    pub capacity_mbps: u64,
    /// Fraction of C held back (EyeQ: 10%).
    pub headroom: f64,
    /// Fraction of C held back on a host with a single local VM (the smaller of this and
    /// `headroom`): the headroom keeps the access link's queue short for the other VMs'
    /// traffic, and a VM alone on its host has none to protect, so it gets nearly the whole
    /// link.
    pub solo_headroom: f64,
    /// Per-VM ingress queue bound in packets (overflow drops only that VM's packets).
    pub queue_packets: usize,
    /// Synthetic per-packet processing cost in ns, so the engine can be made the bottleneck
    /// (heavy production rule sets; PicNIC's variable capacity).
    pub work_ns: u64,
    /// Extra synthetic cost per byte in ns/1000 (e.g. 500 = 0.5 ns per byte).
    pub work_ps_per_byte: u64,
    /// Processing per poll of the ingress engine before the loop reads its ports again, us.
    pub poll_budget_us: u64,
}
impl IngressSection {
    /// `capacity_mbps` as a rate.
    pub fn capacity(&self) -> Rate {
        Rate::from_mbps(self.capacity_mbps)
    }
}
impl Default for IngressSection {
    fn default() -> Self {
        IngressSection {
            capacity_mbps: 1000,
            headroom: 0.1,
            solo_headroom: 0.01,
            queue_packets: 256,
            work_ns: 0,
            work_ps_per_byte: 0,
            poll_budget_us: 100,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressSection {
    /// Per-VM fast-path queue bound in packets; when full the VM's port is not read (backpressure).
    pub queue_packets: usize,
    /// Per shaped class / per limited destination queue bound in packets (excess is dropped).
    pub shaped_queue_packets: usize,
    /// Lowest rate a feedback-driven limiter decays to, Mb/s.
    pub min_rate_mbps: u64,
}
impl EgressSection {
    /// `min_rate_mbps` as a rate.
    pub fn min_rate(&self) -> Rate {
        Rate::from_mbps(self.min_rate_mbps)
    }
}
impl Default for EgressSection {
    fn default() -> Self {
        EgressSection {
            queue_packets: 512,
            shaped_queue_packets: 256,
            min_rate_mbps: 1,
        }
    }
}

/// The shared engine that seals and opens encrypted tenants' tunnel packets (`accel`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccelSection {
    /// Worker threads of the engine; 0: none, the dataplane loop runs the jobs itself
    /// (inline, within `inline_budget_us` an iteration, in FairNIC's order): for a host
    /// that has no core to give the engine, where a worker would wait for one.
    pub workers: usize,
    /// Inline engine (`workers = 0`): engine time the loop spends in an iteration before it
    /// goes back to its ports, us (it runs at least one job).
    pub inline_budget_us: u64,
    /// When FairNIC's limiter holds a loop's jobs (any engine: admission is on the loops'
    /// submit path), the loop sleeps at least this long before it comes back for them, us
    /// (the limiter's buckets are made this deep, so no token is lost meanwhile): a hog held
    /// to its share then costs the loop a wake-up per this period, not one per job.
    pub inline_wait_us: u64,
    /// Jobs each tenant may have outstanding in the engine; a frame arriving beyond them is
    /// dropped (`accel_busy`).
    pub queue_jobs: usize,
    /// Share of the workers' time the FairNIC limiter admits, percent (1..=100).
    pub capacity_percent: u64,
    /// Token cost of a job: fixed ns and ps per byte. Measured at start when absent.
    pub per_job_ns: Option<u64>,
    pub per_byte_ps: Option<u64>,
    /// Synthetic extra CPU per job, ns (spun on the worker, charged like the real work), so
    /// the engine can be made the scarce resource as a slower accelerator would be, the
    /// counterpart of `ingress.work_ns`. 0: none.
    pub job_work_ns: u64,
}
impl Default for AccelSection {
    fn default() -> Self {
        AccelSection {
            workers: 2,
            inline_budget_us: 20,
            inline_wait_us: 500,
            queue_jobs: 256,
            capacity_percent: 90,
            per_job_ns: None,
            per_byte_ps: None,
            job_work_ns: 0,
        }
    }
}

/// `[control]`: the etcd cluster the switch watches (crate picnic-control; docs/operations.md
/// "Control plane"). Its hosts, tenants, VMs and SLOs are applied as live changes; what
/// this file and the API add besides stays. Needs `switch.state_file`: with etcd
/// unreachable the switch runs on its persisted state and catches up when etcd returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    /// etcd client URLs, `http://HOST:PORT` (e.g. `["http://127.0.0.1:2379"]`).
    pub etcd: Vec<String>,
    /// The key prefix of this cluster's records: starts and ends with `/`.
    #[serde(default = "default_control_prefix")]
    pub prefix: String,
}
/// The default `control.prefix`.
pub const CONTROL_PREFIX: &str = "/picnic/";
fn default_control_prefix() -> String {
    CONTROL_PREFIX.into()
}

impl ControlSection {
    /// Checks an etcd endpoint URL: `http://HOST:PORT`; the problem otherwise.
    pub fn check_endpoint(url: &str) -> Result<(), String> {
        if url.starts_with("https://") {
            return Err(format!(
                "'{url}': TLS is not built in; use http:// on a loopback or management network"
            ));
        }
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(format!("'{url}' is not http://HOST:PORT"));
        };
        match rest.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && !host.contains('/')
                    && port.parse::<u16>().is_ok_and(|p| p > 0) =>
            {
                Ok(())
            }
            _ => Err(format!(
                "'{url}' is not http://HOST:PORT (e.g. http://127.0.0.1:2379)"
            )),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    pub id: u32,
    /// Underlay address of the host's uplink (outer IPv4 source/destination).
    pub underlay_ip: Ipv4Addr,
    /// Underlay MAC of the host's uplink (static: the lab fabric is one L2 segment).
    pub mac: Mac,
}

/// `Default` is a tenant without settings (a removed tenant's slot in the directory); a
/// config's tenants take their defaults from serde.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    pub name: String,
    /// Geneve VNI identifying the tenant on the wire (24 bits).
    pub vni: u32,
    /// The tenant's CPU allocation on this host in cores (Iron): the switch's work for its
    /// frames counts against it every 10 ms period; when used up, its frames are dropped
    /// before any work (its ports are not read). None = unlimited.
    #[serde(default)]
    pub cpu_quota: Option<f64>,
    /// The tenant's cgroup on this host (v1 `/sys/fs/cgroup/cpu/...` or v2 directory): with
    /// `cpu_quota`, the switch sets its CPU quota every period to the allocation minus the
    /// switch work done for the tenant in the last period, so the tenant's own tasks and its
    /// network processing together stay within the allocation (Iron 3.2).
    #[serde(default)]
    pub cgroup: Option<std::path::PathBuf>,
    /// The tenant's SLO on this host (`picnic_core::slo::Slo`: min/max bandwidth, latency at a
    /// percentile, loss; `pps_share` is accepted and not judged), held to over 100 ms windows
    /// on the switch's delivery path and reported by `GET /slo` and `/metrics`. None: not
    /// monitored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<Slo>,
    /// Seal the tenant's overlay traffic (AES-GCM, `picnic_wire::seal`) in the shared engine;
    /// its frames from other hosts must be sealed too. Needs `key` or `key_file`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
    /// The tenant's key, 32 or 64 hex digits (AES-128 or AES-256-GCM). The API shows it
    /// redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A file holding the key in hex, read when the switch starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<std::path::PathBuf>,
    /// The epoch of that key (rotations through the API install further epochs).
    #[serde(default = "default_key_epoch")]
    pub key_epoch: u32,
    /// The tenant's weight in the shared engine (its base is its share of the capacity).
    #[serde(default = "default_accel_weight")]
    pub accel_weight: u64,
    /// The tenant's packet program in the WebAssembly sandbox (`crate::offload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<crate::offload::OffloadEntry>,
}
fn default_key_epoch() -> u32 {
    1
}
fn default_accel_weight() -> u64 {
    1
}

impl TenantEntry {
    /// The tenant's key from `key` or `key_file`.
    pub fn load_key(&self) -> anyhow::Result<picnic_wire::seal::TunnelKey> {
        let hex = match (&self.key, &self.key_file) {
            (Some(k), None) => k.clone(),
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("tenant '{}': key_file {}: {e}", self.name, path.display())
            })?,
            _ => anyhow::bail!(
                "tenant '{}': give exactly one of key and key_file",
                self.name
            ),
        };
        picnic_wire::seal::TunnelKey::from_hex(&hex)
            .map_err(|e| anyhow::anyhow!("tenant '{}': key: {e}", self.name))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmEntry {
    pub name: String,
    /// Deployment-wide endpoint id, carried in feedback.
    pub id: u32,
    pub tenant: String,
    /// The host that owns this VM.
    pub host: u32,
    pub mac: Mac,
    pub ip: Ipv4Addr,
    /// IPv6 addresses the VM may send from (anti-spoofing), besides its link-local
    /// address derived from `mac` (EUI-64, RFC 4291 appendix A), which is always allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6: Vec<Ipv6Addr>,
    /// EtherTypes beyond IPv4, IPv6 and ARP the VM may send (e.g. 0x88b5); anti-spoofing
    /// drops every other one (default deny; the source MAC is still checked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_ethertypes: Vec<u16>,
    /// Guaranteed bandwidth (the WFQ weight and the EyeQ B_i), Mb/s.
    #[serde(default = "default_min_mbps")]
    pub min_mbps: u64,
    /// Cap, Mb/s; none = line rate.
    #[serde(default)]
    pub max_mbps: Option<u64>,
    /// Packets per second the VM may send into the switch and receive from it (each
    /// direction); the excess waits in the VM's own ring or is dropped before any work.
    #[serde(default)]
    pub max_pps: Option<u64>,
    /// Packets per second the VM is guaranteed to send through a saturated switch (PicNIC's
    /// packet-rate SLO dimension), reserved on top of its weighted share: while under it,
    /// its port is read whatever its tenant's share of the loop, and its queued frames are
    /// processed before the egress scheduler's turn. Its tenant's CPU allocation
    /// (`cpu_quota`) still bounds it; the guarantees of a host must fit what its switch
    /// can process. Needs `isolation.egress_wfq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_pps: Option<u64>,
    /// The local port (only for VMs on this host).
    #[serde(default)]
    pub port: Option<PortEntry>,
    /// Egress classes shaped to a rate in their own queue (PicNIC 2.1).
    #[serde(default)]
    pub shaped: Vec<ShapedClass>,
}
impl VmEntry {
    /// `min_mbps` as a rate.
    pub fn min_rate(&self) -> Rate {
        Rate::from_mbps(self.min_mbps)
    }
    /// `max_mbps` as a rate.
    pub fn max_rate(&self) -> Option<Rate> {
        self.max_mbps.map(Rate::from_mbps)
    }
}
fn default_min_mbps() -> u64 {
    100
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortEntry {
    pub ifname: String,
    /// `af_packet` (default: a veth or NIC), `af_xdp`, `tap` (the host side of a TAP a VMM
    /// holds: QEMU, libvirt, Firecracker, Cloud Hypervisor), `tap_queue` (a TAP whose queue
    /// the switch holds, its netdev being the tenant's interface) or `vhost_user` (the switch
    /// serves the VM's virtio-net queues on `socket`, `ifname` only names the port);
    /// docs/switch.md "Attaching a VM".
    #[serde(default)]
    pub backend: Backend,
    /// With `vhost_user` (and only then): the Unix socket the switch listens on for the VMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<std::path::PathBuf>,
    /// Only with `tap` or `tap_queue`: create the TAP if it is missing (otherwise it must
    /// exist). With `tap` it is created persistent and up, for a VMM to attach to, and
    /// outlives the switch; with `tap_queue` the switch owns it and it goes when the switch
    /// stops. picnic never deletes a TAP that exists when it starts.
    #[serde(default, skip_serializing_if = "is_false")]
    pub create: bool,
    /// The CPUs of the VM's vCPUs. With the workers pinned one per CPU (`switch.cpus`), the
    /// port is served by a worker on one of them, so the switch's work for the VM runs on the
    /// VM's own cores and not on its neighbours' (as Open vSwitch's `pmd-rxq-affinity`;
    /// Iron 3: the host CPU spent for a tenant comes out of that tenant's share). Empty, or
    /// no worker on these CPUs: placed by load like any VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<usize>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Traffic of a VM matching every given field is shaped to `rate_mbps` in its own queue.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapedClass {
    #[serde(default)]
    pub dst_ip: Option<Ipv4Addr>,
    /// IP protocol number (6 TCP, 17 UDP).
    #[serde(default)]
    pub protocol: Option<u8>,
    #[serde(default)]
    pub dst_port: Option<u16>,
    pub rate_mbps: f64,
}
impl ShapedClass {
    /// `rate_mbps` as a rate.
    pub fn rate(&self) -> Rate {
        Rate::from_mbps_f64(self.rate_mbps)
    }
}

/// Where the control API listens (`switch.api`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiListen {
    /// A Unix socket at this path (the default form).
    Unix(PathBuf),
    /// A TCP address; requests need the bearer token.
    Tcp(String),
}

impl ApiListen {
    /// Parses `switch.api`: `tcp:ADDR:PORT`, `unix:PATH`, or an absolute path.
    pub fn parse(text: &str) -> Result<ApiListen, String> {
        if let Some(addr) = text.strip_prefix("tcp:") {
            return match addr.parse::<std::net::SocketAddr>() {
                Ok(_) => Ok(ApiListen::Tcp(addr.to_string())),
                Err(_) => Err(format!("'{addr}' is not an IP address and port")),
            };
        }
        let path = text.strip_prefix("unix:").unwrap_or(text);
        if path.starts_with('/') {
            Ok(ApiListen::Unix(PathBuf::from(path)))
        } else {
            Err(format!(
                "'{text}' is neither a socket path (/run/picnic/api.sock) nor tcp:ADDR:PORT"
            ))
        }
    }
}

/// Reads a secret (feedback key, API token) from `path`, without a trailing newline; the
/// error names the config `field`.
pub fn read_secret(path: &Path, field: &str) -> anyhow::Result<Vec<u8>> {
    let mut bytes = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("{field}: cannot read {}: {e}", path.display()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    Ok(bytes)
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let cfg: Config =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("invalid config: {e}"))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The entry of this host.
    pub fn this_host(&self) -> &HostEntry {
        self.hosts
            .iter()
            .find(|h| h.id == self.switch.host_id)
            .expect("validated")
    }
}
