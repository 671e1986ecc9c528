//! The scenario file: hosts, tenants with VMs and SLOs, workloads, victim and pass marks.
//! Every field is documented in docs/scenarios.md. Parsing rejects unknown fields and
//! validation names the field that is wrong.

use anyhow::{anyhow, Context, Result};
use picnic_core::{Duration, Rate};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Longest host or VM name: interface names built from it (`p-NAME`, `v-NAME`) must fit
/// the kernel's 15 characters.
pub const MAX_NAME_LEN: usize = 12;

/// A whole scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports.
    pub name: String,
    /// One line saying what the scenario shows.
    #[serde(default)]
    pub description: String,
    /// Length of a run in milliseconds; workloads stop at the latest here.
    pub duration_ms: u64,
    /// Rate of every host's access link (the shaped fabric port toward the host), Mb/s.
    #[serde(default = "default_access_link_mbps")]
    pub access_link_mbps: u64,
    /// Queue of the access link, in milliseconds at its rate (bounds the delay it can add).
    #[serde(default = "default_access_queue_ms")]
    pub access_queue_ms: u64,
    /// MTU of every link.
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// EEVDF slice, us, of every thread of the lab (switches, workloads, tools) in every
    /// mode; 0 leaves the kernel's default. See `picnic_switch::sched`.
    #[serde(default = "default_sched_slice_us")]
    pub sched_slice_us: u64,
    /// Host names.
    pub hosts: Vec<String>,
    /// The CPUs each named host's tenants and switch run on (lab only): the host's cores, as
    /// a machine of its own has. Their workload threads and the switch's threads are pinned
    /// to them (sched_setaffinity; `[picnic] cpus`, when set, places the switches instead).
    /// A host not named runs wherever the scheduler puts it.
    #[serde(default)]
    pub host_cpus: BTreeMap<String, Vec<usize>>,
    /// Tenants with their VMs and SLOs.
    pub tenants: Vec<Tenant>,
    /// Traffic to run.
    pub workloads: Vec<Workload>,
    /// The tenant whose numbers are compared against its run alone (ratios, pass marks).
    pub victim: String,
    /// Pass marks: `"METRIC OP NUMBER"`, e.g. `"victim_p99_ratio <= 1.5"`.
    #[serde(default)]
    pub pass: Vec<String>,
    /// Settings of the picnic switches in the picnic modes.
    #[serde(default)]
    pub picnic: PicnicSettings,
    /// Settings of the simulator (`picnic sim`, which checks them); the lab ignores them,
    /// so one file serves both runners.
    #[serde(default)]
    pub sim: Option<toml::Table>,
    /// VMs added, moved and removed through the control plane while the workloads run
    /// (lab with `--control etcd`, modes with attackers).
    #[serde(default)]
    pub churn: Option<Churn>,
}

/// One tenant's VMs churned through etcd (`picnic lab run --control etcd`): every
/// `interval_ms` the next of its VMs but the first is changed in turn, moved from its host
/// to the next host, then removed, then added back on its own host; after a move or an add
/// its first VM (which stays put) pings it until it answers. The churn's own attack.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Churn {
    /// The churned tenant: not the victim, no workloads, no TAP VMs, at least two VMs.
    pub tenant: String,
    /// Time between changes, ms (at least 50).
    pub interval_ms: u64,
}

/// What the churn of one run did (the lab measures it; pass marks read it as
/// `churn_changes`, `churn_unreachable` and `churn_follow_ms`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChurnOutcome {
    /// Changes made in etcd.
    pub changes: u32,
    /// Moves and adds after which the VM did not answer its tenant's first VM within 1 s.
    pub unreachable: u32,
    /// The longest time from a move's or add's write in etcd to the VM's first answer, ms.
    pub follow_ms_max: f64,
}

/// How the lab runs its picnic switches.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PicnicSettings {
    /// Nice value of the switch threads (`switch.nice`). None: the switch's default
    /// (`picnic_switch::config::default_nice`).
    pub nice: Option<i8>,
    /// CPUs the switch threads run on; empty: wherever the scheduler puts them.
    pub cpus: Vec<usize>,
    /// CPU the switch of each host is given, in cores: a cgroup quota on its threads, the
    /// same in every picnic mode (a host gives its dataplane a fixed budget). None: whatever
    /// the scheduler gives it.
    pub cpu_cores: Option<f64>,
    /// Runs the switch threads SCHED_FIFO at this priority (`switch.realtime_priority`), as
    /// the bridge's softirq datapath runs ahead of every task, in every picnic mode alike.
    /// Not with `cpu_cores` (a CFS quota does not bound a real-time thread).
    pub realtime_priority: Option<u8>,
    /// Dataplane workers of each switch (`switch.workers`). None: the switch's default, one
    /// per CPU it may run on (`cpus`, else all), at most one per local VM.
    pub workers: Option<usize>,
    /// Whether each switch's loop yields its core after each busy iteration
    /// (`switch.yield_busy`): for switches that share their cores with tenants' threads.
    pub yield_busy: bool,
    /// Worker threads of each switch's shared encryption engine (`accel.workers`); 0: none,
    /// the loop runs the jobs (inline).
    pub accel_workers: usize,
    /// Share of the workers' time the engine's limiter admits (`accel.capacity_percent`):
    /// lower it to make the engine, not the link, the scarce resource.
    pub accel_capacity_percent: u64,
    /// Synthetic CPU per engine job, ns (`accel.job_work_ns`): a slower accelerator.
    pub accel_job_work_ns: u64,
    /// Fraction of each access link EyeQ's receivers hold back (`ingress.headroom`, EyeQ
    /// 3.2). None: the switch's default (0.1).
    pub headroom: Option<f64>,
}

impl Default for PicnicSettings {
    fn default() -> Self {
        PicnicSettings {
            nice: None,
            cpus: Vec::new(),
            cpu_cores: None,
            realtime_priority: None,
            workers: None,
            yield_busy: false,
            accel_workers: 2,
            accel_capacity_percent: 90,
            accel_job_work_ns: 0,
            headroom: None,
        }
    }
}

/// A tenant: its VMs and its SLO.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Tenant name.
    pub name: String,
    /// Guaranteed bandwidth, Mb/s (the weight of EyeQ's receiver allocation).
    #[serde(default)]
    pub min_mbps: u64,
    /// Bandwidth cap, Mb/s; 0 means the access link.
    #[serde(default)]
    pub max_mbps: u64,
    /// SLO: p99 request latency bound in microseconds.
    pub latency_p99_us: Option<f64>,
    /// SLO: largest tolerated loss fraction (0.0 to 1.0).
    pub loss_max: Option<f64>,
    /// CPU quota of the tenant's workload threads, in cores (e.g. 0.5): they run in a
    /// cgroup with this CFS quota (the lab's `cgroup` module); none leaves them unconfined.
    pub cpu_cores: Option<f64>,
    /// CPUs the tenant's workload threads run on, on every host (its VMs' vCPUs, pinned as a
    /// cloud host pins them, so that tenants meet only in the switch); before a host's
    /// `host_cpus`. Empty: the host's CPUs, if pinned, else wherever the scheduler puts
    /// them. Lab only.
    #[serde(default)]
    pub cpus: Vec<usize>,
    /// Seal the tenant's overlay traffic in the switches' shared encryption engine (a key
    /// derived from the tenant's index, for the lab only).
    #[serde(default)]
    pub encrypt: bool,
    /// The tenant's packet program in every switch's WebAssembly sandbox (inline `wat`
    /// text and budgets, as a switch config's `[tenants.offload]`).
    #[serde(default)]
    pub offload: Option<picnic_switch::offload::OffloadEntry>,
    /// The tenant's VMs.
    pub vms: Vec<Vm>,
}

impl Tenant {
    /// `min_mbps` as a rate.
    pub fn min_rate(&self) -> Rate {
        Rate::from_mbps(self.min_mbps)
    }

    /// `max_mbps` as a rate; none when 0 (the access link).
    pub fn max_rate(&self) -> Option<Rate> {
        (self.max_mbps > 0).then(|| Rate::from_mbps(self.max_mbps))
    }
}

/// A VM (or container) of a tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    /// VM name, unique in the scenario.
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Attach through a TAP device, as QEMU and Firecracker VMs are (picnic modes; the
    /// Linux-bridge modes use a veth pair).
    #[serde(default)]
    pub tap: bool,
}

/// What kind of traffic a workload sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// UDP datagrams of `size` bytes at `rate_pps` (or as fast as possible).
    UdpFlood,
    /// A UDP flood switched on for `on_ms` and off for `off_ms`, repeatedly.
    OnOff,
    /// `flows` TCP connections sending as fast as they can; measures goodput.
    TcpBulk,
    /// Request/response at `rate_pps` with per-request latency (the victim probe).
    Rpc,
    /// iperf3 TCP with `flows` parallel streams (needs the iperf3 package).
    Iperf3,
    /// `flows` TCP connections each sending exactly `bytes` and closing; records when the
    /// last byte arrived (the completion time of a shuffle, EyeQ 5.3).
    Transfer,
    /// sockperf ping-pong at `rate_pps` with `size`-byte messages (UDP, or TCP with
    /// `protocol = "tcp"`); every round trip's latency from its full log (needs the
    /// sockperf package).
    Sockperf,
    /// A memcached server (needs the memcached package) and picnic's client: `get` of a
    /// `size`-byte value at `rate_pps` over one TCP connection, one request outstanding.
    Memcached,
    /// No traffic: CPU-bound work in units of 1 ms of CPU, each unit's wall time recorded as
    /// its latency (Iron 2.3's victim; `to` must be `from`); the lab's `cpu_burn` module.
    CpuBurn,
}

impl WorkloadKind {
    /// Whether it measures request latency (the probes a victim runs).
    pub fn is_probe(self) -> bool {
        matches!(
            self,
            WorkloadKind::Rpc
                | WorkloadKind::Sockperf
                | WorkloadKind::Memcached
                | WorkloadKind::CpuBurn
        )
    }
}

/// Transport of an RPC probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// One UDP datagram per request and response.
    #[default]
    Udp,
    /// One TCP connection, one outstanding request at a time.
    Tcp,
}

/// One traffic source between two VMs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Workload name, unique in the scenario.
    pub name: String,
    /// Kind of traffic.
    pub kind: WorkloadKind,
    /// Sending VM.
    pub from: String,
    /// Receiving VM (same tenant as `from`).
    pub to: String,
    /// Start offset from the beginning of the run, ms.
    #[serde(default)]
    pub start_ms: u64,
    /// Stop offset, ms; defaults to the scenario's duration.
    pub stop_ms: Option<u64>,
    /// UDP payload / RPC request and response size in bytes.
    pub size: Option<usize>,
    /// Packets (or requests) per second; absent means unlimited for floods.
    pub rate_pps: Option<u64>,
    /// Parallel TCP connections (tcp_bulk, iperf3).
    pub flows: Option<u32>,
    /// ON period of an on_off workload, ms.
    pub on_ms: Option<u64>,
    /// OFF period of an on_off workload, ms.
    pub off_ms: Option<u64>,
    /// RPC transport.
    pub protocol: Option<Protocol>,
    /// RPC timeout in ms after which a request counts as lost (default 100).
    pub timeout_ms: Option<u64>,
    /// Bytes each connection of a `transfer` sends.
    pub bytes: Option<u64>,
    /// Shape this workload's packets (sender to receiver) to this rate in its own egress
    /// class of the picnic switch, Mb/s (PicNIC 2.1); see [`crate::switch::shaped_classes`].
    pub shaped_mbps: Option<f64>,
    /// Whether the workload is part of the attack, left out of victim-alone modes.
    /// Default: true unless it belongs to the victim tenant.
    pub attack: Option<bool>,
}

fn default_access_link_mbps() -> u64 {
    1000
}
fn default_sched_slice_us() -> u64 {
    100
}
fn default_access_queue_ms() -> u64 {
    10
}
fn default_mtu() -> u32 {
    1500
}

/// Default UDP payload size.
pub const DEFAULT_SIZE: usize = 64;
/// Default RPC rate, requests per second.
pub const DEFAULT_RPC_RATE: u64 = 1000;
/// Default RPC timeout, ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 100;
/// First port used by workloads; workload `i` uses `BASE_PORT + i`.
pub const BASE_PORT: u16 = 20000;

impl Workload {
    /// Stop offset in ms (explicit or the scenario's duration).
    pub fn stop_ms(&self, scenario: &Scenario) -> u64 {
        self.stop_ms.unwrap_or(scenario.duration_ms)
    }
    /// Payload size in bytes.
    pub fn size(&self) -> usize {
        self.size.unwrap_or(DEFAULT_SIZE)
    }
    /// Number of parallel flows.
    pub fn flows(&self) -> u32 {
        self.flows.unwrap_or(1)
    }
    /// The UDP or TCP port its receiver listens on: [`BASE_PORT`] plus
    /// the workload's index in `scenario.workloads`.
    pub fn port(&self, scenario: &Scenario) -> Option<u16> {
        let index = scenario
            .workloads
            .iter()
            .position(|w| w.name == self.name)?;
        Some(BASE_PORT + index as u16)
    }
    /// IP protocol number of its packets (6 TCP, 17 UDP; 0 for a workload without any).
    pub fn ip_protocol(&self) -> u8 {
        use WorkloadKind::*;
        match self.kind {
            CpuBurn => 0,
            UdpFlood | OnOff => 17,
            Rpc | Sockperf if self.protocol.unwrap_or_default() == Protocol::Udp => 17,
            Rpc | Sockperf | Memcached | TcpBulk | Iperf3 | Transfer => 6,
        }
    }
}

impl Scenario {
    /// `access_link_mbps` as a rate.
    pub fn access_link(&self) -> Rate {
        Rate::from_mbps(self.access_link_mbps)
    }

    /// The CPUs host `host`'s tenants and switch are pinned to (`host_cpus`; empty: none).
    pub fn cpus_of_host(&self, host: &str) -> &[usize] {
        self.host_cpus.get(host).map_or(&[], Vec::as_slice)
    }

    /// The CPUs VM `vm`'s workload threads are pinned to: its tenant's `cpus`, else its
    /// host's `host_cpus` (empty: none).
    pub fn cpus_of_vm(&self, vm: &str) -> &[usize] {
        match self.tenant_of(vm) {
            Some(t) if !t.cpus.is_empty() => &t.cpus,
            _ => self.host_of(vm).map_or(&[], |h| self.cpus_of_host(h)),
        }
    }

    /// The access link's queue, bytes: `access_queue_ms` at its rate.
    pub fn access_queue_bytes(&self) -> u64 {
        self.access_link()
            .bytes_in(Duration::from_millis(self.access_queue_ms))
    }

    /// Reads, parses and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading scenario {}", path.display()))?;
        Scenario::parse(&text).with_context(|| format!("scenario {}", path.display()))
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str) -> Result<Scenario> {
        let scenario: Scenario = toml::from_str(text).map_err(|e| anyhow!("{e}"))?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// The tenant owning VM `vm`.
    pub fn host_of(&self, vm: &str) -> Option<&str> {
        self.tenants
            .iter()
            .flat_map(|t| &t.vms)
            .find(|v| v.name == vm)
            .map(|v| v.host.as_str())
    }

    pub fn tenant_of(&self, vm: &str) -> Option<&Tenant> {
        self.tenants
            .iter()
            .find(|t| t.vms.iter().any(|v| v.name == vm))
    }

    /// Whether workload `w` is part of the attack (left out when the victim runs alone):
    /// its `attack` field, or else whether it belongs to a tenant other than the victim.
    pub fn is_attack(&self, w: &Workload) -> bool {
        w.attack.unwrap_or_else(|| {
            self.tenant_of(&w.from)
                .is_none_or(|t| t.name != self.victim)
        })
    }

    /// The report row workload `w` counts in: its tenant's name, except for the victim's
    /// own attack workloads (`attack = true`), which count in `VICTIM/attack` so the
    /// victim's figures stay those of the traffic the attack must not disturb.
    pub fn report_group(&self, w: &Workload) -> String {
        let tenant = self.tenant_of(&w.from).map_or("", |t| t.name.as_str());
        if tenant == self.victim && self.is_attack(w) {
            format!("{tenant}/attack")
        } else {
            tenant.to_owned()
        }
    }

    /// Report rows in order, each with the tenant whose SLO applies: every tenant, and
    /// after the victim its `VICTIM/attack` group when it has attack workloads.
    pub fn report_groups(&self) -> Vec<(String, &Tenant)> {
        let mut rows = Vec::new();
        for t in &self.tenants {
            rows.push((t.name.clone(), t));
            if t.name == self.victim
                && self.workloads.iter().any(|w| {
                    self.report_group(w) != t.name
                        && self.tenant_of(&w.from).is_some_and(|o| o.name == t.name)
                })
            {
                rows.push((format!("{}/attack", t.name), t));
            }
        }
        rows
    }
}
