//! A simulation spec: a lab scenario file, read unchanged, plus an optional `[sim]` table for
//! what a lab cannot do (fabric topology, 1,000 hosts by replication, flow-size traffic, a
//! processing-cost model). The `[sim]` table is removed before the lab parses the rest, so
//! the lab's validation applies as is.

use anyhow::{anyhow, bail, Context, Result};
use picnic_core::Rate;
use picnic_scenario::{Mode, Scenario};
use serde::Deserialize;
use std::path::Path;

/// Fabric shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TopologyKind {
    /// Every host on one switch (the lab's fabric bridge).
    #[default]
    BigSwitch,
    /// Leaves (ToRs) of `hosts_per_leaf` hosts, every leaf linked to every spine.
    LeafSpine,
}

/// How a leaf spreads traffic over its uplinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Ecmp {
    /// Hash of the outer headers (a flow stays on one path).
    #[default]
    PerFlow,
    /// A random uplink per packet (spraying; EyeQ 5.4's comparison).
    PerPacket,
}

/// Congestion control of the TCP model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CongestionControl {
    /// Loss-based NewReno (RFC 6582).
    #[default]
    NewReno,
    /// NewReno plus DCTCP's ECN reaction (cwnd *= 1 - alpha/2 once per window).
    Dctcp,
}

/// How the TCP model sends during fast recovery (ns-3's `TcpL4Protocol::RecoveryType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    /// Window inflation, one segment out per duplicate ACK once the inflated window allows
    /// (RFC 6582 and 6675; ns-3's `TcpClassicRecovery`): nearer ns-3's FCT tails on the
    /// leaf-spine fabric than PRR is (docs/sim.md "Fast recovery, like with like").
    #[default]
    Classic,
    /// Proportional Rate Reduction (RFC 6937, with its slow-start reduction bound): about
    /// ssthresh / RecoverFS segments out per segment delivered; ns-3's default.
    Prr,
}

impl Recovery {
    /// ns-3's recovery type of the same rule (`picnic sim ns3`).
    pub fn ns3_type(self) -> &'static str {
        match self {
            Recovery::Prr => "ns3::TcpPrrRecovery",
            Recovery::Classic => "ns3::TcpClassicRecovery",
        }
    }
}

/// Processing cost standing in for the switch's CPU: per poll of the engine (the loop's fixed
/// cost), and per packet base + per byte + per rule, times a uniform factor in
/// [1 - variance, 1 + variance]. The switch measures its own as `cost_model` (fixed ns per
/// iteration + ns per frame + ns per byte, docs/switch.md "CPU as a tenant resource");
/// `scripts/sim_cost_fit.py` turns a lab run's into this table (docs/sim.md "Cost model").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostModel {
    /// Fixed cost of one engine poll (the loop's overhead), ns.
    pub poll_ns: u64,
    /// Fixed cost per packet, ns.
    pub base_ns: u64,
    /// Cost per byte, ps (1000 = 1 ns per byte).
    pub per_byte_ps: u64,
    /// Cost per rule evaluated, ns.
    pub per_rule_ns: u64,
    /// Rules every packet evaluates.
    pub rules: u64,
    /// Relative variance of the cost (0.1 = plus or minus 10%).
    pub variance: f64,
}
impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            poll_ns: 50,
            base_ns: 200,
            per_byte_ps: 250,
            per_rule_ns: 10,
            rules: 10,
            variance: 0.1,
        }
    }
}

/// Flows between random VM pairs of a tenant with sizes drawn from a CDF (Poisson arrivals
/// at each source so that its offered load is `load` of its access link).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowTraffic {
    /// Name in reports (like a workload name).
    pub name: String,
    /// Tenant whose VMs send and receive.
    pub tenant: String,
    /// Offered load per source VM as a fraction of the access link.
    pub load: f64,
    /// `web_search`, `data_mining`, or a file of `BYTES CDF` lines.
    pub cdf: String,
    /// Start, ms.
    #[serde(default)]
    pub start_ms: u64,
    /// Stop of new arrivals, ms (default: the scenario's duration).
    pub stop_ms: Option<u64>,
}

/// A shuffle (EyeQ 5.3): every VM of `tenant` sends `bytes` to every other VM of it, all at
/// `start_ms`, over the TCP model; the report gives each tenant's completion time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shuffle {
    /// Tenant running the shuffle.
    pub tenant: String,
    /// Bytes per ordered VM pair.
    pub bytes: u64,
    /// Parallel TCP connections per ordered pair, each carrying `bytes / connections`
    /// (EyeQ 5.3's job P_i opens i).
    #[serde(default = "one")]
    pub connections: u32,
    /// Start, ms.
    #[serde(default)]
    pub start_ms: u64,
}

fn one() -> u32 {
    1
}

/// A convergence measurement (EyeQ 5.x: how fast a tenant's received rate settles at its
/// allocation after a burst starts), over the 1 ms rate series of all replicas summed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Convergence {
    /// Tenant whose received rate is watched.
    pub tenant: String,
    /// When the disturbance starts, ms (the clock of the measurement starts here).
    pub after_ms: u64,
    /// The tenant's allocation, Mb/s (summed over replicas).
    pub target_mbps: f64,
    /// Relative band around the target that counts as converged.
    #[serde(default = "ten_percent")]
    pub tolerance: f64,
    /// Window the rate is averaged over: converged at the first 1 ms bin from which on
    /// every `hold_ms`-bin mean stays within the band.
    #[serde(default = "five")]
    pub hold_ms: u64,
    /// End of the disturbance, ms (default: the scenario's end); the share of 1 ms bins in
    /// the band is counted from convergence to here.
    pub until_ms: Option<u64>,
}

fn ten_percent() -> f64 {
    0.1
}

fn five() -> u64 {
    5
}

/// The `[sim]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// Copies of the scenario's hosts, tenants and workloads sharing one fabric (the way to
    /// 1,000 hosts: the lab's per-scenario limits hold per copy). Copies are results'
    /// repetitions in the report.
    pub replicas: u32,
    /// Fabric shape.
    pub topology: TopologyKind,
    /// Hosts under each leaf (leaf_spine).
    pub hosts_per_leaf: u32,
    /// Spine switches (leaf_spine).
    pub spines: u32,
    /// Host-facing over spine-facing capacity of a leaf (leaf_spine); sets the rate of each
    /// leaf-spine link to hosts_per_leaf * access / (spines * oversubscription).
    pub oversubscription: f64,
    /// ECMP at the leaves.
    pub ecmp: Ecmp,
    /// Propagation delay of every link, ns.
    pub link_delay_ns: u64,
    /// Shared buffer of each switch, KB (dynamic threshold, alpha 1).
    pub switch_buffer_kb: u64,
    /// ECN marking threshold of switch queues, KB (none: no marking).
    pub ecn_threshold_kb: Option<u64>,
    /// Host NIC transmit queue, frames.
    pub nic_queue_frames: usize,
    /// Rate of a host's NIC toward the fabric, Mb/s. The lab shapes only the fabric's port
    /// toward each host (`access_link_mbps`); the host-to-fabric side is a fast veth, so
    /// by default the congestion point is the receiver's access link, as in the lab.
    pub nic_mbps: u64,
    /// Frame budget per host (the deployment's pool holds hosts x this at most). Frames are
    /// allocated on demand, so memory follows the frames in use, not the budget. Default:
    /// derived from every queue a host's frames can sit in (VM rings, the engine's queue
    /// bounds, NIC rings, its access-link queue in minimum-size frames).
    pub frames_per_host: Option<usize>,
    /// Packets/s of a flood without `rate_pps` (the lab's floods go as fast as a CPU can).
    pub flood_pps: u64,
    /// Per-packet processing-cost model of every host's engines.
    pub cost: CostModel,
    /// TCP model congestion control.
    pub cc: CongestionControl,
    /// Minimum retransmission timeout of the TCP model, us.
    pub min_rto_us: u64,
    /// Duplicate ACKs that trigger fast retransmit in the TCP model (EyeQ 5.4 raises it
    /// for per-packet ECMP).
    pub dupack_threshold: u32,
    /// Fast recovery's sending rule of the TCP model, `classic` (default) or `prr`.
    pub recovery: Recovery,
    /// Modes to run (`picnic`, `picnic-off`, `victim-alone`).
    pub modes: Vec<String>,
    /// Flow-size traffic.
    pub flows: Vec<FlowTraffic>,
    /// Shuffles.
    pub shuffles: Vec<Shuffle>,
    /// Convergence measurements.
    pub convergence: Vec<Convergence>,
}

impl SimSection {
    /// `nic_mbps` as a rate.
    pub fn nic_rate(&self) -> Rate {
        Rate::from_mbps(self.nic_mbps)
    }
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            replicas: 1,
            topology: TopologyKind::BigSwitch,
            hosts_per_leaf: 16,
            spines: 4,
            oversubscription: 1.0,
            ecmp: Ecmp::PerFlow,
            link_delay_ns: 1000,
            switch_buffer_kb: 4096,
            ecn_threshold_kb: None,
            nic_queue_frames: 256,
            nic_mbps: 10_000,
            frames_per_host: None,
            flood_pps: 100_000,
            cost: CostModel::default(),
            cc: CongestionControl::NewReno,
            min_rto_us: 5000,
            dupack_threshold: 3,
            recovery: Recovery::Classic,
            modes: vec!["picnic".into(), "picnic-off".into(), "victim-alone".into()],
            flows: Vec::new(),
            shuffles: Vec::new(),
            convergence: Vec::new(),
        }
    }
}

/// A scenario with its simulation extras.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The lab scenario, validated by the lab.
    pub scenario: Scenario,
    /// The `[sim]` table (defaults when absent).
    pub sim: SimSection,
}

impl Spec {
    /// Reads a scenario file.
    pub fn load(path: &Path) -> Result<Spec> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading scenario {}", path.display()))?;
        Spec::parse(&text).with_context(|| format!("scenario {}", path.display()))
    }

    /// Parses scenario text: the `[sim]` table, then the rest as a lab scenario.
    pub fn parse(text: &str) -> Result<Spec> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| anyhow!("{e}"))?;
        let sim = match table.remove("sim") {
            Some(v) => v
                .try_into::<SimSection>()
                .map_err(|e| anyhow!("table `sim`: {e}"))?,
            None => SimSection::default(),
        };
        let lab_text = toml::to_string(&table)?;
        let scenario = Scenario::parse(&lab_text)?;
        let spec = Spec { scenario, sim };
        spec.validate()?;
        Ok(spec)
    }

    fn validate(&self) -> Result<()> {
        let s = &self.sim;
        if s.replicas == 0 || s.replicas > 10_000 {
            bail!("field `sim.replicas`: must be between 1 and 10000");
        }
        if s.topology == TopologyKind::LeafSpine && (s.hosts_per_leaf == 0 || s.spines == 0) {
            bail!("field `sim.hosts_per_leaf`/`sim.spines`: must be positive for leaf_spine");
        }
        if !(s.oversubscription > 0.0 && s.oversubscription.is_finite()) {
            bail!("field `sim.oversubscription`: must be a positive number");
        }
        if !(0.0..1.0).contains(&s.cost.variance) {
            bail!("field `sim.cost.variance`: must be in [0, 1)");
        }
        if s.frames_per_host.is_some_and(|f| f < 16)
            || s.nic_queue_frames == 0
            || s.flood_pps == 0
            || s.nic_mbps == 0
        {
            bail!("fields `sim.frames_per_host` (>= 16), `sim.nic_queue_frames`, `sim.flood_pps`, `sim.nic_mbps` (> 0)");
        }
        if s.dupack_threshold == 0 {
            bail!("field `sim.dupack_threshold`: must be positive");
        }
        if s.modes.is_empty() {
            bail!("field `sim.modes`: needs at least one mode");
        }
        // The shared encryption engine (FairNIC 4.4 in the switch, `picnic_switch::accel`)
        // runs its jobs on threads and real time, which a simulated host does not model:
        // an encrypted tenant's frames would go to it and never come back.
        if let Some(t) = self.scenario.tenants.iter().find(|t| t.encrypt) {
            bail!(
                "tenant `{}`: `encrypt = true` needs the switches' shared encryption engine, \
                 which the simulator does not model; run this scenario in the lab (`picnic lab run`)",
                t.name
            );
        }
        for m in &s.modes {
            Mode::named(m).context("field `sim.modes`")?;
        }
        let tenant = |name: &str, field: &str| {
            self.scenario
                .tenants
                .iter()
                .find(|t| t.name == name)
                .filter(|t| t.vms.len() >= 2)
                .map(|_| ())
                .ok_or_else(|| anyhow!("field `{field}`: no tenant {name:?} with 2 or more VMs"))
        };
        for (i, f) in s.flows.iter().enumerate() {
            tenant(&f.tenant, &format!("sim.flows[{i}].tenant"))?;
            if !(f.load > 0.0 && f.load <= 2.0) {
                bail!("field `sim.flows[{i}].load`: must be in (0, 2]");
            }
            crate::workload::FlowSizes::load(&f.cdf)
                .with_context(|| format!("field `sim.flows[{i}].cdf`"))?;
        }
        for (i, sh) in s.shuffles.iter().enumerate() {
            tenant(&sh.tenant, &format!("sim.shuffles[{i}].tenant"))?;
            if sh.bytes == 0 || sh.connections == 0 || sh.connections > 64 {
                bail!("fields `sim.shuffles[{i}].bytes` (> 0), `connections` (1 to 64)");
            }
        }
        for (i, c) in s.convergence.iter().enumerate() {
            if !self.scenario.tenants.iter().any(|t| t.name == c.tenant) {
                bail!(
                    "field `sim.convergence[{i}].tenant`: no tenant {:?}",
                    c.tenant
                );
            }
            if !(c.target_mbps > 0.0 && c.tolerance > 0.0 && c.tolerance < 1.0 && c.hold_ms > 0)
                || c.after_ms >= c.until_ms.unwrap_or(self.scenario.duration_ms)
                || c.until_ms.is_some_and(|u| u > self.scenario.duration_ms)
            {
                bail!("field `sim.convergence[{i}]`: target_mbps > 0, tolerance in (0, 1), hold_ms > 0, after_ms < until_ms <= duration_ms");
            }
        }
        Ok(())
    }

    /// Hosts in the whole simulated deployment.
    pub fn total_hosts(&self) -> usize {
        self.scenario.hosts.len() * self.sim.replicas as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_scenarios_parse_unchanged_and_sim_extras_are_checked() {
        for f in ["ingress-flood.toml", "bursty-udp.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scenarios")
                .join(f);
            let spec = Spec::load(&path).unwrap();
            assert_eq!(spec.sim.replicas, 1);
        }
        let base = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/ingress-flood.toml"),
        )
        .unwrap();
        let with = format!("{base}\n[sim]\nreplicas = 3\ntopology = \"leaf_spine\"\n");
        let spec = Spec::parse(&with).unwrap();
        assert_eq!(spec.total_hosts(), 9);
        let bad = format!("{base}\n[sim]\nreplicas = 0\n");
        assert!(Spec::parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("sim.replicas"));
        let unknown = format!("{base}\n[sim]\nbogus = 1\n");
        assert!(Spec::parse(&unknown).is_err());
    }

    #[test]
    fn an_encrypted_tenant_is_refused_by_name_not_simulated_as_total_loss() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/accel-hog.toml");
        let err = format!("{:#}", Spec::load(&path).unwrap_err());
        assert!(
            err.contains("tenant `victim`") && err.contains("encrypt"),
            "{err}"
        );
    }
}
