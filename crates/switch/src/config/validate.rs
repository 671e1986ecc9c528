//! Validation: every field checked against its range and its neighbours, the error naming
//! the field at fault (`vms[3].max_mbps`), so a file, the API and code-built configs are
//! refused the same way.

use std::collections::{HashMap, HashSet};
use std::fmt;

use picnic_core::slo::Slo;

use super::{ApiListen, Backend, Config, MAX_WORKERS};

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

/// Ethernet header and one VLAN tag: a frame's bytes beyond its MTU.
const MAX_L2_HEADER: usize = 18;

fn err(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        problem: problem.into(),
    }
}

impl Config {
    /// Checks the switch section, the other sections, hosts, tenants and VMs in that order;
    /// the first problem found is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_switch()?;
        self.validate_sections()?;
        if let Some(keys) = &self.feedback_keys {
            keys.validate()
                .map_err(|(field, problem)| err(format!("feedback_keys.{field}"), problem))?;
        }
        let host_ids = self.validate_hosts()?;
        let tenants = self.validate_tenants()?;
        self.validate_vms(&host_ids, &tenants)
    }

    /// `[switch]`: pool, scheduling, workers, API.
    fn validate_switch(&self) -> Result<(), ConfigError> {
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
                .is_some_and(|ns| super::SLICE_RANGE_NS.contains(&ns))
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
        if let Some(addr) = &self.switch.metrics {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return Err(err(
                    "switch.metrics",
                    format!("'{addr}' is not an IP address and port (127.0.0.1:9464)"),
                ));
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
        Ok(())
    }

    /// `[ingress]`, `[egress]`, `[accel]`, `[uplink]`: fractions, rates, queue bounds, MTU.
    fn validate_sections(&self) -> Result<(), ConfigError> {
        if let Some(c) = &self.control {
            self.validate_control(c)?;
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
        if self.accel.workers > 64 {
            return Err(err(
                "accel.workers",
                "must be in 0..=64 (0: the dataplane loop runs the jobs)",
            ));
        }
        if self.accel.inline_budget_us > 10_000 {
            return Err(err("accel.inline_budget_us", "must be at most 10000"));
        }
        if self.accel.inline_wait_us > 10_000 {
            return Err(err("accel.inline_wait_us", "must be at most 10000"));
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
        // A frame longer than a buffer's data is dropped as oversize by the ports: with a
        // larger MTU the switch would lose every full-sized frame (TCP at 9000: 1.8 of a
        // 50 Mb/s link, docs/switch.md "MTU").
        let max_mtu = crate::frame::DATA_CAP - MAX_L2_HEADER;
        if self.uplink.mtu > max_mtu {
            return Err(err(
                "uplink.mtu",
                format!(
                    "at most {max_mtu}: the switch's frame buffers hold {} bytes of a frame \
                     (jumbo frames are not supported)",
                    crate::frame::DATA_CAP
                ),
            ));
        }
        Ok(())
    }

    /// `[control]`: endpoints, prefix, and the state file it needs.
    fn validate_control(&self, c: &super::ControlSection) -> Result<(), ConfigError> {
        if c.etcd.is_empty() {
            return Err(err(
                "control.etcd",
                "give at least one etcd URL (http://HOST:PORT)",
            ));
        }
        for (i, url) in c.etcd.iter().enumerate() {
            super::ControlSection::check_endpoint(url)
                .map_err(|e| err(format!("control.etcd[{i}]"), e))?;
        }
        if !c.prefix.starts_with('/') || !c.prefix.ends_with('/') || c.prefix.len() < 2 {
            return Err(err(
                "control.prefix",
                "must start and end with '/' (e.g. \"/picnic/\")",
            ));
        }
        if self.switch.state_file.is_none() {
            return Err(err(
                "control",
                "needs switch.state_file: with etcd unreachable the switch runs on its persisted state",
            ));
        }
        Ok(())
    }

    /// `[[hosts]]`: unique ids, this host among them. Returns the ids.
    fn validate_hosts(&self) -> Result<HashSet<u32>, ConfigError> {
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
        Ok(host_ids)
    }

    /// `[[tenants]]`: unique names and VNIs, quotas, SLOs, keys, offload. Returns the names.
    fn validate_tenants(&self) -> Result<HashSet<&str>, ConfigError> {
        let mut tenants = HashSet::new();
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
            if !tenants.insert(t.name.as_str()) {
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
        Ok(tenants)
    }

    /// `[[vms]]`: known tenant and host, unique ids and MACs, rates, ports, filters.
    fn validate_vms(
        &self,
        host_ids: &HashSet<u32>,
        tenants: &HashSet<&str>,
    ) -> Result<(), ConfigError> {
        let mut ids = HashSet::new();
        let mut macs = HashSet::new();
        let mut ifnames = HashSet::new();
        let mut names = HashSet::new();
        let mut ipv6 = HashMap::new();
        for (i, v) in self.vms.iter().enumerate() {
            let f = |name: &str| format!("vms[{i}].{name}");
            if !names.insert(v.name.as_str()) {
                return Err(err(f("name"), format!("duplicate VM name '{}'", v.name)));
            }
            if !tenants.contains(v.tenant.as_str()) {
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
                    if p.create && !matches!(p.backend, Backend::Tap | Backend::TapQueue) {
                        return Err(err(
                            f("port.create"),
                            "only a TAP is created (backend = \"tap\" or \"tap_queue\"); a \
                             veth or NIC must exist",
                        ));
                    }
                    match (p.backend == Backend::VhostUser, &p.socket) {
                        (true, None) => {
                            return Err(err(
                                f("port.socket"),
                                "backend = \"vhost_user\" needs the socket path the VMM \
                                 connects to",
                            ))
                        }
                        (true, Some(path)) if !path.is_absolute() => {
                            return Err(err(f("port.socket"), "must be an absolute path"))
                        }
                        (false, Some(_)) => {
                            return Err(err(
                                f("port.socket"),
                                "only a vhost_user port has a socket",
                            ))
                        }
                        _ => {}
                    }
                    if !p.cpus.is_empty() && self.switch.cpus.is_none() {
                        return Err(err(
                            f("port.cpus"),
                            "needs switch.cpus: only workers pinned to CPUs serve a VM's CPUs",
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
            // Every IPv6 address (configured or link-local) names one VM of its tenant: the
            // switch answers neighbour solicitations for it from the directory.
            for a in std::iter::once(v.mac.link_local()).chain(v.ipv6.iter().copied()) {
                match ipv6.insert((v.tenant.as_str(), a), i) {
                    Some(j) if j != i => {
                        return Err(err(
                            f("ipv6"),
                            format!(
                                "{a} is also VM '{}''s address in tenant '{}'",
                                self.vms[j].name, v.tenant
                            ),
                        ))
                    }
                    _ => {}
                }
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
}
