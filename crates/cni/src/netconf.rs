//! The network configuration on stdin (the spec's keys and picnic's) and the `CNI_*`
//! environment.

use std::path::PathBuf;

use picnic_core::slo::Slo;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{code, CniError, Result};

/// The CNI versions whose netconf and result this plugin speaks.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];

/// One picnic network: pods attached with it join `tenant` on the switch behind `socket`.
/// Unknown keys are refused (a misspelt SLO key would otherwise be lost silently).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin: String,
    /// The switch's API socket (`switch.api`).
    pub socket: PathBuf,
    /// The tenant the network's pods belong to.
    pub tenant: String,
    /// The tenant's VNI, used to create the tenant when the switch does not have it yet.
    #[serde(default)]
    pub vni: Option<u32>,
    /// The tenant's SLO, set when the plugin creates the tenant (an existing tenant's SLO is
    /// the switch's: the plugin never changes it).
    #[serde(default)]
    pub slo: Option<Slo>,
    /// Every pod's rate limits and guarantees (a `[[vms]]` entry's fields).
    #[serde(default)]
    pub pod: PodLimits,
    /// MTU of both ends of the veth; none: the kernel's default.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// The IPAM plugin to delegate addresses to (e.g. `host-local`).
    pub ipam: Option<Value>,
    #[serde(default)]
    pub dns: Option<Value>,
    #[serde(default)]
    pub capabilities: Option<Value>,
    #[serde(default)]
    pub runtime_config: RuntimeConfig,
    #[serde(default)]
    pub prev_result: Option<Value>,
    #[serde(default)]
    pub args: Option<Value>,
    /// GC: the attachments the runtime still has (libcni sends the list under both names).
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    #[serde(default, rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<Attachment>>,
}

/// A pod's attachment: its container id and interface name.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A pod's limits: `min_mbps`, `max_mbps`, `max_pps`, `min_pps` of its `[[vms]]` entry
/// (README, docs/switch.md). Absent: the switch's defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodLimits {
    pub min_mbps: Option<u64>,
    pub max_mbps: Option<u64>,
    pub max_pps: Option<u64>,
    pub min_pps: Option<u64>,
}

impl PodLimits {
    /// `self` with every field `over` sets taken from `over`.
    pub fn overridden_by(&self, over: &PodLimits) -> PodLimits {
        PodLimits {
            min_mbps: over.min_mbps.or(self.min_mbps),
            max_mbps: over.max_mbps.or(self.max_mbps),
            max_pps: over.max_pps.or(self.max_pps),
            min_pps: over.min_pps.or(self.min_pps),
        }
    }
}

/// The per-pod values a runtime passes for the capabilities the netconf declares.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    /// The `bandwidth` capability (rates in bits/s).
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// The `picnic` capability: per-pod [`PodLimits`] over the netconf's `pod`.
    #[serde(default)]
    pub picnic: Option<PodLimits>,
}

/// The `bandwidth` capability's rates (bits/s); bursts are accepted and not used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub egress_rate: Option<u64>,
}

impl NetConf {
    /// Parses stdin; the error names the key at fault.
    pub fn parse(stdin: &[u8]) -> Result<NetConf> {
        let conf: NetConf = serde_json::from_slice(stdin).map_err(|e| {
            let c = if e.is_data() {
                code::INVALID_CONFIG
            } else {
                code::DECODE
            };
            CniError::new(c, format!("network config: {e}"))
        })?;
        if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "cniVersion {} is not supported (supported: {})",
                    conf.cni_version,
                    SUPPORTED_VERSIONS.join(", ")
                ),
            ));
        }
        if conf.tenant.is_empty() {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                "network config: tenant is empty",
            ));
        }
        if !conf.socket.is_absolute() {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "network config: socket '{}' is not an absolute path",
                    conf.socket.display()
                ),
            ));
        }
        Ok(conf)
    }

    /// The pod's limits: the netconf's `pod`, then the `bandwidth` capability (the lower of
    /// its two rates becomes `max_mbps`, rounded up to whole Mb/s), then the `picnic`
    /// capability.
    pub fn pod_limits(&self) -> PodLimits {
        let mut limits = self.pod.clone();
        if let Some(bw) = &self.runtime_config.bandwidth {
            let rate = match (bw.ingress_rate, bw.egress_rate) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(bps) = rate {
                limits.max_mbps = Some(bps.div_ceil(1_000_000).max(1));
            }
        }
        match &self.runtime_config.picnic {
            Some(over) => limits.overridden_by(over),
            None => limits,
        }
    }
}

/// What the runtime says in `CNI_*` variables.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: String,
    pub container_id: String,
    /// The pod's network namespace (a path); DEL may come without it.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    /// Directories holding plugins (for the IPAM plugin).
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads the `CNI_*` variables through `var`; which are required depends on the command.
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Result<Env> {
        let command = var("CNI_COMMAND")
            .ok_or_else(|| CniError::new(code::INVALID_ENV, "CNI_COMMAND is not set"))?;
        let needs_container = !matches!(command.as_str(), "VERSION" | "STATUS" | "GC");
        let required = |name: &str| -> Result<String> {
            match var(name) {
                Some(v) if !v.is_empty() => Ok(v),
                _ if needs_container => Err(CniError::new(
                    code::INVALID_ENV,
                    format!("{name} is not set (required by {command})"),
                )),
                _ => Ok(String::new()),
            }
        };
        let container_id = required("CNI_CONTAINERID")?;
        let ifname = required("CNI_IFNAME")?;
        let netns = var("CNI_NETNS")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        if netns.is_none() && matches!(command.as_str(), "ADD" | "CHECK") {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("CNI_NETNS is not set (required by {command})"),
            ));
        }
        if needs_container {
            check_name("CNI_CONTAINERID", &container_id, usize::MAX)?;
            check_name("CNI_IFNAME", &ifname, 15)?;
        }
        let path = var("CNI_PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            path,
        })
    }
}

/// Container ids and interface names become parts of the switch's VM names and of API
/// paths: letters, digits, `_`, `.` and `-` only (the spec's container id alphabet).
fn check_name(var: &str, value: &str, max_len: usize) -> Result<()> {
    let ok = value.len() <= max_len
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && value != "."
        && value != "..";
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!(
                "{var} '{value}' must be letters, digits, '_', '.' and '-'{}",
                if max_len < usize::MAX {
                    format!(", at most {max_len} bytes")
                } else {
                    String::new()
                }
            ),
        ))
    }
}
