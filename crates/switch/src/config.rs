//! The switch's TOML configuration: this host, its uplink and peers, tenants, VMs, SLOs,
//! and which isolation mechanisms are on. Validation names the offending field.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use picnic_core::slo::Slo;
use serde::{Deserialize, Serialize};

pub use crate::port::Backend;

/// A MAC address written `02:00:00:00:00:01` in the config.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}
impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 6];
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(format!(
                "'{s}' is not a MAC address (want six hex bytes like 02:00:00:00:00:01)"
            ));
        }
        for (o, p) in out.iter_mut().zip(parts) {
            *o = u8::from_str_radix(p, 16)
                .map_err(|_| format!("'{s}' is not a MAC address (bad byte '{p}')"))?;
        }
        Ok(Mac(out))
    }
}
impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
impl Mac {
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
    pub const BROADCAST: Mac = Mac([0xff; 6]);
}

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
    /// Nice value of the dataplane thread (-20..=19). On a host whose tenants share the
    /// switch's cores, a negative value keeps the switch ahead of them as a kernel datapath in
    /// softirq would be, without SCHED_FIFO's throttling cliff (an RT thread that polls hard
    /// is stopped for the rest of the 1 s RT period once it has used 95% of it). None: inherit.
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
    /// `spin_us` low. None: the fair class.
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
    #[serde(default)]
    pub backend: Backend,
    /// MTU of the underlay; tenant MTU must leave room for the Geneve encapsulation.
    #[serde(default = "default_mtu")]
    pub mtu: usize,
    /// Transmit capacity of the uplink in Mb/s: the egress WFQ is paced to it so the scheduler,
    /// not a FIFO further down, decides whose frame goes next. None: unpaced.
    #[serde(default)]
    pub capacity_mbps: Option<u64>,
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
    /// Worker threads of the engine.
    pub workers: usize,
    /// Jobs each tenant's queue holds; a frame arriving at a full queue is dropped
    /// (`accel_busy`).
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
            queue_jobs: 256,
            capacity_percent: 90,
            per_job_ns: None,
            per_byte_ps: None,
            job_work_ns: 0,
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

#[derive(Clone, Debug, Serialize, Deserialize)]
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
fn default_min_mbps() -> u64 {
    100
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortEntry {
    pub ifname: String,
    #[serde(default)]
    pub backend: Backend,
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

/// A config that failed validation, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config field `{}`: {}", self.field, self.problem)
    }
}
impl std::error::Error for ConfigError {}

/// Largest rate a config field takes, Mb/s (10 Tb/s): rates become bits/s in u64 and then
/// cost and cap arithmetic, which must not overflow.
pub const MAX_MBPS: u64 = 10_000_000;
/// Largest queue bound, packets, and frame pool (2^20 frames: 2 GiB of buffers).
pub const MAX_PACKETS: usize = 1 << 20;

/// Checks that a rate field is in 1..=[`MAX_MBPS`].
fn check_mbps(field: impl Into<String>, mbps: u64) -> Result<(), ConfigError> {
    if (1..=MAX_MBPS).contains(&mbps) {
        Ok(())
    } else {
        Err(err(field, format!("must be in 1..={MAX_MBPS} (Mb/s)")))
    }
}

fn err(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        problem: problem.into(),
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

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(256..=MAX_PACKETS).contains(&self.switch.frame_pool) {
            return Err(err(
                "switch.frame_pool",
                format!("must be in 256..={MAX_PACKETS} frames"),
            ));
        }
        if self.switch.nice.is_some_and(|n| !(-20..=19).contains(&n)) {
            return Err(err("switch.nice", "must be in -20..=19"));
        }
        if self.switch.slice_us.is_some_and(|us| {
            !us.checked_mul(1000)
                .is_some_and(|ns| crate::sched::SLICE_RANGE_NS.contains(&ns))
        }) {
            return Err(err("switch.slice_us", "must be in 100..=100000"));
        }
        if let Some(p) = self.switch.realtime_priority {
            if !(1..=99).contains(&p) {
                return Err(err("switch.realtime_priority", "must be in 1..=99"));
            }
            if self.switch.slice_us.is_some() {
                return Err(err(
                    "switch.realtime_priority",
                    "a real-time dataplane has no fair-class slice: leave out slice_us",
                ));
            }
        }
        if self.switch.cpus.as_ref().is_some_and(|c| c.is_empty()) {
            return Err(err(
                "switch.cpus",
                "must list at least one CPU (or be left out)",
            ));
        }
        if self
            .switch
            .workers
            .is_some_and(|w| !(1..=MAX_WORKERS).contains(&w))
        {
            return Err(err(
                "switch.workers",
                format!("must be in 1..={MAX_WORKERS} (or left out: one per CPU)"),
            ));
        }
        if let Some(api) = &self.switch.api {
            match ApiListen::parse(api) {
                Err(e) => return Err(err("switch.api", e)),
                Ok(ApiListen::Tcp(_)) if self.switch.api_token_file.is_none() => {
                    return Err(err(
                        "switch.api_token_file",
                        "a TCP API needs a bearer token file (or use a Unix socket path)",
                    ))
                }
                Ok(_) => {}
            }
        }
        if !matches!(self.switch.api_socket_mode, 0o600 | 0o660) {
            return Err(err(
                "switch.api_socket_mode",
                "must be 0o600 (owner) or 0o660 (owner and group)",
            ));
        }
        if self.switch.batch == 0 || self.switch.batch > 1024 {
            return Err(err("switch.batch", "must be in 1..=1024"));
        }
        if !(0.0..0.9).contains(&self.ingress.headroom) {
            return Err(err("ingress.headroom", "must be a fraction in [0, 0.9)"));
        }
        if !(0.0..0.9).contains(&self.ingress.solo_headroom) {
            return Err(err(
                "ingress.solo_headroom",
                "must be a fraction in [0, 0.9)",
            ));
        }
        if self.accel.workers == 0 || self.accel.workers > 64 {
            return Err(err("accel.workers", "must be in 1..=64"));
        }
        if !(1..=65_536).contains(&self.accel.queue_jobs) {
            return Err(err(
                "accel.queue_jobs",
                "must be in 1..=65536 (bounded memory)",
            ));
        }
        if self.accel.job_work_ns > 1_000_000 {
            return Err(err("accel.job_work_ns", "must be at most 1000000 (1 ms)"));
        }
        if self
            .accel
            .per_job_ns
            .is_some_and(|n| n == 0 || n > 1_000_000)
            || self.accel.per_byte_ps.is_some_and(|p| p > 1_000_000)
        {
            return Err(err(
                "accel.per_job_ns",
                "per_job_ns must be in 1..=1000000 and per_byte_ps at most 1000000",
            ));
        }
        if !(1..=100).contains(&self.accel.capacity_percent) {
            return Err(err("accel.capacity_percent", "must be in 1..=100"));
        }
        if self.accel.per_job_ns.is_some() != self.accel.per_byte_ps.is_some() {
            return Err(err(
                "accel.per_job_ns",
                "give both per_job_ns and per_byte_ps, or neither (measured at start)",
            ));
        }
        check_mbps("ingress.capacity_mbps", self.ingress.capacity_mbps)?;
        if let Some(mbps) = self.uplink.capacity_mbps {
            check_mbps("uplink.capacity_mbps", mbps)?;
        }
        check_mbps("egress.min_rate_mbps", self.egress.min_rate_mbps)?;
        for (field, packets) in [
            ("ingress.queue_packets", self.ingress.queue_packets),
            ("egress.queue_packets", self.egress.queue_packets),
            (
                "egress.shaped_queue_packets",
                self.egress.shaped_queue_packets,
            ),
        ] {
            if !(1..=MAX_PACKETS).contains(&packets) {
                return Err(err(field, format!("must be in 1..={MAX_PACKETS} packets")));
            }
        }
        if self.uplink.mtu < 576 + picnic_wire::overlay::ENCAP_OVERHEAD {
            return Err(err(
                "uplink.mtu",
                "too small to carry encapsulated tenant frames",
            ));
        }
        let mut host_ids = HashSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            if !host_ids.insert(h.id) {
                return Err(err(
                    format!("hosts[{i}].id"),
                    format!("duplicate host id {}", h.id),
                ));
            }
        }
        if !host_ids.contains(&self.switch.host_id) {
            return Err(err(
                "switch.host_id",
                format!("host {} is not listed in [[hosts]]", self.switch.host_id),
            ));
        }
        let mut tenants = HashMap::new();
        let mut vnis = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.vni == 0 || t.vni >= 1 << 24 {
                return Err(err(format!("tenants[{i}].vni"), "must be in 1..2^24"));
            }
            if !vnis.insert(t.vni) {
                return Err(err(
                    format!("tenants[{i}].vni"),
                    format!("duplicate VNI {}", t.vni),
                ));
            }
            if tenants.insert(t.name.as_str(), i).is_some() {
                return Err(err(
                    format!("tenants[{i}].name"),
                    format!("duplicate tenant '{}'", t.name),
                ));
            }
            if let Some(q) = t.cpu_quota {
                if !(q > 0.0 && q <= 64.0) {
                    return Err(err(
                        format!("tenants[{i}].cpu_quota"),
                        "must be > 0 (fraction of a core)",
                    ));
                }
            }
            if let Some(Err(e)) = t.slo.as_ref().map(Slo::validate) {
                return Err(err(format!("tenants[{i}].slo.{}", e.field), e.message));
            }
            if t.encrypt && t.key.is_some() == t.key_file.is_some() {
                return Err(err(
                    format!("tenants[{i}].key"),
                    "encrypt = true needs exactly one of key (hex) and key_file",
                ));
            }
            if let Some(Err(e)) = t.key.as_deref().map(picnic_wire::seal::TunnelKey::from_hex) {
                return Err(err(format!("tenants[{i}].key"), e.to_string()));
            }
            if t.accel_weight == 0 {
                return Err(err(format!("tenants[{i}].accel_weight"), "must be > 0"));
            }
            if let Some(Err((field, problem))) = t.offload.as_ref().map(|o| o.validate()) {
                return Err(err(format!("tenants[{i}].offload.{field}"), problem));
            }
            if t.cgroup.is_some() && t.cpu_quota.is_none() {
                return Err(err(
                    format!("tenants[{i}].cgroup"),
                    "needs tenants[].cpu_quota (the allocation the switch charges against)",
                ));
            }
        }
        let mut ids = HashSet::new();
        let mut macs = HashSet::new();
        let mut ifnames = HashSet::new();
        for (i, v) in self.vms.iter().enumerate() {
            let f = |name: &str| format!("vms[{i}].{name}");
            if !tenants.contains_key(v.tenant.as_str()) {
                return Err(err(f("tenant"), format!("unknown tenant '{}'", v.tenant)));
            }
            if !host_ids.contains(&v.host) {
                return Err(err(f("host"), format!("unknown host {}", v.host)));
            }
            if !ids.insert(v.id) {
                return Err(err(f("id"), format!("duplicate VM id {}", v.id)));
            }
            if v.mac.is_multicast() {
                return Err(err(f("mac"), "must be a unicast MAC"));
            }
            if !macs.insert((v.tenant.as_str(), v.mac)) {
                return Err(err(
                    f("mac"),
                    format!("duplicate MAC {} in tenant '{}'", v.mac, v.tenant),
                ));
            }
            if v.max_pps == Some(0) {
                return Err(err(f("max_pps"), "must be > 0 (omit it for no limit)"));
            }
            if let Some(min) = v.min_pps {
                if min == 0 || min > 1_000_000_000 {
                    return Err(err(
                        f("min_pps"),
                        "must be between 1 and 1000000000 (omit it for no guarantee)",
                    ));
                }
                if v.max_pps.is_some_and(|max| max < min) {
                    return Err(err(f("min_pps"), "must not exceed max_pps"));
                }
            }
            check_mbps(f("min_mbps"), v.min_mbps)?;
            if let Some(max) = v.max_mbps {
                check_mbps(f("max_mbps"), max)?;
                if max < v.min_mbps {
                    return Err(err(f("max_mbps"), "must be >= min_mbps"));
                }
            }
            match (&v.port, v.host == self.switch.host_id) {
                (Some(p), true) => {
                    if p.ifname.is_empty() || p.ifname.len() > 15 {
                        return Err(err(
                            f("port.ifname"),
                            "must be an interface name of 1..=15 bytes",
                        ));
                    }
                    if !ifnames.insert(p.ifname.as_str()) || p.ifname == self.uplink.ifname {
                        return Err(err(
                            f("port.ifname"),
                            format!("'{}' is used by another port", p.ifname),
                        ));
                    }
                }
                (None, true) => return Err(err(f("port"), "a VM on this host needs a port")),
                (Some(_), false) => {
                    return Err(err(f("port"), "only VMs on this host have a port here"))
                }
                (None, false) => {}
            }
            if let Some(t) = v
                .allow_ethertypes
                .iter()
                .find(|&&t| t < 0x0600 || matches!(t, 0x0800 | 0x86dd | 0x0806))
            {
                return Err(err(
                    f("allow_ethertypes"),
                    format!(
                        "{t:#06x}: list EtherTypes >= 0x0600 other than IPv4, IPv6 and ARP (those are always checked)"
                    ),
                ));
            }
            if let Some(a) = v
                .ipv6
                .iter()
                .find(|a| a.is_multicast() || a.is_unspecified())
            {
                return Err(err(f("ipv6"), format!("{a} is not a unicast address")));
            }
            for (j, s) in v.shaped.iter().enumerate() {
                if !(s.rate_mbps > 0.0 && s.rate_mbps <= MAX_MBPS as f64) {
                    return Err(err(
                        format!("vms[{i}].shaped[{j}].rate_mbps"),
                        format!("must be > 0 and at most {MAX_MBPS}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The entry of this host.
    pub fn this_host(&self) -> &HostEntry {
        self.hosts
            .iter()
            .find(|h| h.id == self.switch.host_id)
            .expect("validated")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const EXAMPLE: &str = r#"
[switch]
host_id = 1
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[hosts]]
id = 2
underlay_ip = "198.19.0.2"
mac = "02:00:00:00:01:02"
[[tenants]]
name = "a"
vni = 100
[[vms]]
name = "a1"
id = 1
tenant = "a"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "a1" }
[[vms]]
name = "a2"
id = 2
tenant = "a"
host = 2
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
"#;

    #[test]
    fn shipped_example_is_valid() {
        let c = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        assert_eq!(c.vms.iter().filter(|v| v.port.is_some()).count(), 2);
    }

    #[test]
    fn example_parses() {
        let c = Config::parse(EXAMPLE).unwrap();
        assert_eq!(c.vms.len(), 2);
        assert!(c.isolation.feedback);
        assert_eq!(c.this_host().underlay_ip, Ipv4Addr::new(198, 19, 0, 1));
    }

    #[test]
    fn af_xdp_backend_parses() {
        let text = EXAMPLE.replace(
            "port = { ifname = \"a1\" }",
            "port = { ifname = \"a1\", backend = \"af_xdp\" }",
        );
        let c = Config::parse(&text).unwrap();
        let port = c.vms[0].port.as_ref().unwrap();
        assert_eq!(port.backend, Backend::AfXdp);
    }

    fn expect_field(text: &str, field: &str) {
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains(field), "error '{e}' should name '{field}'");
    }

    #[test]
    fn errors_name_the_field() {
        expect_field(&EXAMPLE.replace("vni = 100", "vni = 0"), "tenants[0].vni");
        expect_field(
            &EXAMPLE.replace("tenant = \"a\"\nhost = 2", "tenant = \"zz\"\nhost = 2"),
            "vms[1].tenant",
        );
        expect_field(
            &EXAMPLE.replace("02:00:00:00:00:02", "02:00:00:00:00"),
            "mac",
        );
        expect_field(
            &EXAMPLE.replace("port = { ifname = \"a1\" }", ""),
            "vms[0].port",
        );
        expect_field(
            &EXAMPLE.replace("host_id = 1", "host_id = 7"),
            "switch.host_id",
        );
        expect_field(&EXAMPLE.replace("[uplink]", "[uplink]\nspeed = 3"), "speed");
        expect_field(
            &format!("{EXAMPLE}\n[ingress]\nheadroom = 2.0\n"),
            "ingress.headroom",
        );
    }

    /// Values that validated but overflowed when the engine turned them into bits/s or bytes
    /// (a panic with overflow checks, silently wrong weights and caps without), or that no
    /// machine can hold. Seen writing the fuzz targets; the api_body target hit `max_mbps`
    /// (docs/fuzzing.md, seed `fuzz/seeds/api_body/crash-max-mbps-overflow`).
    #[test]
    fn out_of_range_numbers_are_refused_naming_the_field() {
        let vm = "port = { ifname = \"a1\" }";
        for (text, field) in [
            (
                EXAMPLE.replace(vm, &format!("{vm}\nmin_mbps = 20000000000000")),
                "vms[0].min_mbps",
            ),
            (
                EXAMPLE.replace(vm, &format!("{vm}\nmax_mbps = 9223372036854775807")),
                "vms[0].max_mbps",
            ),
            (
                EXAMPLE.replace(vm, &format!("{vm}\nshaped = [{{ rate_mbps = inf }}]")),
                "vms[0].shaped[0].rate_mbps",
            ),
            (
                format!("{EXAMPLE}\n[ingress]\ncapacity_mbps = 18446744073710\n"),
                "ingress.capacity_mbps",
            ),
            (
                format!("{EXAMPLE}\n[ingress]\nqueue_packets = 4294967296\n"),
                "ingress.queue_packets",
            ),
            (
                format!("{EXAMPLE}\n[egress]\nmin_rate_mbps = 0\n"),
                "egress.min_rate_mbps",
            ),
            (
                format!("{EXAMPLE}\n[egress]\nshaped_queue_packets = 9007199254740993\n"),
                "egress.shaped_queue_packets",
            ),
            (
                EXAMPLE.replace("ifname = \"up0\"", "ifname = \"up0\"\ncapacity_mbps = 0"),
                "uplink.capacity_mbps",
            ),
            (
                EXAMPLE.replace("host_id = 1", "host_id = 1\nframe_pool = 1099511627776"),
                "switch.frame_pool",
            ),
            (
                EXAMPLE.replace(vm, &format!("{vm}\nmin_pps = 0")),
                "vms[0].min_pps",
            ),
            (
                EXAMPLE.replace(vm, &format!("{vm}\nmax_pps = 1000\nmin_pps = 2000")),
                "vms[0].min_pps",
            ),
            // 18446744073709652 * 1000 wraps to 100384 ns, inside the range: it was accepted.
            (
                EXAMPLE.replace("host_id = 1", "host_id = 1\nslice_us = 18446744073709652"),
                "switch.slice_us",
            ),
            (
                EXAMPLE.replace("host_id = 1", "host_id = 1\nrealtime_priority = 100"),
                "switch.realtime_priority",
            ),
            (
                EXAMPLE.replace(
                    "host_id = 1",
                    "host_id = 1\nrealtime_priority = 10\nslice_us = 200",
                ),
                "switch.realtime_priority",
            ),
        ] {
            expect_field(&text, field);
        }
    }

    #[test]
    fn a_tenant_slo_parses_and_a_bad_one_is_named() {
        let with_slo = |slo: &str| EXAMPLE.replace("vni = 100", &format!("vni = 100\nslo = {slo}"));
        let c = Config::parse(&with_slo(
            "{ min_bps = 1_000_000, max_bps = 5_000_000, latency_us = 500, latency_percentile = 99.9, max_loss = 0.001 }",
        ))
        .unwrap();
        let slo = c.tenants[0].slo.as_ref().unwrap();
        assert_eq!((slo.min_bps, slo.max_bps), (1_000_000, Some(5_000_000)));
        assert_eq!((slo.latency_us, slo.latency_percentile), (Some(500), 99.9));
        assert_eq!(slo.max_loss, Some(0.001));
        assert!(Config::parse(EXAMPLE).unwrap().tenants[0].slo.is_none());
        // In a file: the message names the SLO field, the error points at the tenant's line.
        for (slo, field) in [
            ("{ min_bps = 20, max_bps = 10 }", "max_bps"),
            ("{ max_loss = 1.5 }", "max_loss"),
            ("{ latency_us = 0 }", "latency_us"),
            ("{ latency_percentile = 99.0 }", "latency_percentile"),
            ("{ max_los = 0.1 }", "max_los"),
        ] {
            let e = Config::parse(&with_slo(slo)).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("slo = {"), "{slo}: {e}");
        }
        // Built in code (the lab, the bench): validation names the full path.
        let mut c = Config::parse(EXAMPLE).unwrap();
        c.tenants[0].slo = Some(Slo {
            max_loss: Some(2.0),
            ..Slo::default()
        });
        assert_eq!(c.validate().unwrap_err().field, "tenants[0].slo.max_loss");
    }
}
