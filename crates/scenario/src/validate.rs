//! Validation of a parsed scenario: cross-references and ranges, each error naming the
//! field that is wrong (docs/scenarios.md documents every field).

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeSet;

use crate::check::Check;
use crate::file::{Scenario, Workload, WorkloadKind, DEFAULT_RPC_RATE, MAX_NAME_LEN};

/// Fails, naming `field`, when `cpus` lists a CPU this machine (`online` CPUs) lacks.
fn check_cpus(cpus: &[usize], online: usize, field: &str) -> Result<()> {
    match cpus.iter().find(|&&c| c >= online) {
        Some(cpu) => bail!("{field}: CPU {cpu} does not exist (this machine has {online})"),
        None => Ok(()),
    }
}

impl Scenario {
    /// Checks cross-references and ranges; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        if self.picnic.nice.is_some_and(|n| !(-20..=19).contains(&n)) {
            bail!("field `picnic.nice`: must be in -20..=19");
        }
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(c) = self.picnic.cpu_cores {
            if !(0.01..=1024.0).contains(&c) {
                bail!("field `picnic.cpu_cores`: must be between 0.01 and 1024 cores");
            }
        }
        if let Some(h) = self.picnic.headroom {
            if !(0.0..0.9).contains(&h) {
                bail!("field `picnic.headroom`: must be a fraction in [0, 0.9)");
            }
        }
        if let Some(p) = self.picnic.realtime_priority {
            if !(1..=99).contains(&p) {
                bail!("field `picnic.realtime_priority`: must be in 1..=99");
            }
            if self.picnic.cpu_cores.is_some() {
                bail!(
                    "field `picnic.realtime_priority`: a CFS quota (`picnic.cpu_cores`) does not \
                     bound a real-time switch; use one or the other"
                );
            }
        }
        check_cpus(&self.picnic.cpus, online, "field `picnic.cpus`")?;
        if self.sched_slice_us != 0
            && !self
                .sched_slice_us
                .checked_mul(1000)
                .is_some_and(|ns| picnic_switch::config::SLICE_RANGE_NS.contains(&ns))
        {
            bail!("field `sched_slice_us`: 0 (kernel default) or 100..=100000");
        }
        if self.name.trim().is_empty() {
            bail!("field `name`: must not be empty");
        }
        if self.duration_ms == 0 || self.duration_ms > 600_000 {
            bail!("field `duration_ms`: must be between 1 and 600000");
        }
        if self.access_link_mbps == 0 || self.access_link_mbps > 100_000 {
            bail!("field `access_link_mbps`: must be between 1 and 100000");
        }
        if self.access_queue_ms == 0 || self.access_queue_ms > 1000 {
            bail!("field `access_queue_ms`: must be between 1 and 1000");
        }
        // The switch's frame buffers bound it (picnic_switch's `uplink.mtu` check).
        if !(576..=1900).contains(&self.mtu) {
            bail!(
                "field `mtu`: must be between 576 and 1900 (picnic's switch has no jumbo frames)"
            );
        }
        if self.hosts.is_empty() || self.hosts.len() > 250 {
            bail!("field `hosts`: needs 1 to 250 hosts");
        }
        let mut hosts = BTreeSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            check_name(h).with_context(|| format!("field `hosts[{i}]`"))?;
            if !hosts.insert(h.as_str()) {
                bail!("field `hosts[{i}]`: duplicate host {h:?}");
            }
        }
        for (host, cpus) in &self.host_cpus {
            let at = format!("field `host_cpus.{host}`");
            if !hosts.contains(host.as_str()) {
                bail!("{at}: no host named {host:?} in `hosts`");
            }
            if cpus.is_empty() {
                bail!("{at}: needs at least one CPU");
            }
            check_cpus(cpus, online, &at)?;
        }
        if self.tenants.is_empty() || self.tenants.len() > 250 {
            bail!("field `tenants`: needs 1 to 250 tenants");
        }
        let mut tenants = BTreeSet::new();
        let mut vms = BTreeSet::new();
        for (t, tenant) in self.tenants.iter().enumerate() {
            let at = |field: &str| format!("field `tenants[{t}].{field}`");
            if tenant.name.trim().is_empty() || !tenants.insert(tenant.name.as_str()) {
                bail!(
                    "{}: empty or duplicate tenant {:?}",
                    at("name"),
                    tenant.name
                );
            }
            if tenant.max_mbps != 0 && tenant.max_mbps < tenant.min_mbps {
                bail!("{}: smaller than min_mbps", at("max_mbps"));
            }
            if tenant.min_mbps > self.access_link_mbps {
                bail!("{}: larger than access_link_mbps", at("min_mbps"));
            }
            if let Some(l) = tenant.latency_p99_us {
                if !(l > 0.0 && l.is_finite()) {
                    bail!("{}: must be a positive number", at("latency_p99_us"));
                }
            }
            if let Some(l) = tenant.loss_max {
                if !(0.0..=1.0).contains(&l) {
                    bail!("{}: must be between 0 and 1", at("loss_max"));
                }
            }
            if let Some(c) = tenant.cpu_cores {
                if !(0.01..=1024.0).contains(&c) {
                    bail!("{}: must be between 0.01 and 1024 cores", at("cpu_cores"));
                }
            }
            check_cpus(&tenant.cpus, online, &at("cpus"))?;
            if tenant.vms.is_empty() || tenant.vms.len() > 250 {
                bail!("{}: needs 1 to 250 VMs", at("vms"));
            }
            for (v, vm) in tenant.vms.iter().enumerate() {
                check_name(&vm.name).with_context(|| at(&format!("vms[{v}].name")))?;
                if !vms.insert(vm.name.as_str()) {
                    bail!(
                        "{}: duplicate VM {:?}",
                        at(&format!("vms[{v}].name")),
                        vm.name
                    );
                }
                if !hosts.contains(vm.host.as_str()) {
                    bail!(
                        "{}: no host named {:?} in `hosts`",
                        at(&format!("vms[{v}].host")),
                        vm.host
                    );
                }
            }
        }
        if !tenants.contains(self.victim.as_str()) {
            bail!("field `victim`: no tenant named {:?}", self.victim);
        }
        if self.workloads.is_empty() {
            bail!("field `workloads`: needs at least one workload");
        }
        let mut names = BTreeSet::new();
        for (w, wl) in self.workloads.iter().enumerate() {
            self.validate_workload(wl)
                .map_err(|e| anyhow!("field `workloads[{w}].{e}"))?;
            if !names.insert(wl.name.as_str()) {
                bail!(
                    "field `workloads[{w}].name`: duplicate workload {:?}",
                    wl.name
                );
            }
        }
        if let Some(churn) = &self.churn {
            self.validate_churn(churn)
                .map_err(|e| anyhow!("field `churn.{e}"))?;
        }
        for (i, p) in self.pass.iter().enumerate() {
            let check = Check::parse(p).with_context(|| format!("field `pass[{i}]`"))?;
            if let Some((tenant, _)) = check.metric.split_once('.') {
                if !tenants.contains(tenant) {
                    bail!("field `pass[{i}]`: no tenant named {tenant:?}");
                }
            }
        }
        Ok(())
    }

    /// Validates the churn; errors start with the field name (without the prefix).
    fn validate_churn(&self, churn: &crate::Churn) -> Result<()> {
        let Some(t) = self.tenants.iter().find(|t| t.name == churn.tenant) else {
            bail!("tenant`: no tenant named {:?}", churn.tenant);
        };
        if t.name == self.victim {
            bail!("tenant`: the victim's VMs are not churned");
        }
        if t.vms.len() < 2 || self.hosts.len() < 2 {
            bail!("tenant`: needs two VMs (the first stays, the others move) and two hosts");
        }
        if t.vms.iter().any(|v| v.tap) {
            bail!("tenant`: its VMs move between hosts as veth pairs: no `tap`");
        }
        if let Some(w) = self.workloads.iter().find(|w| {
            [&w.from, &w.to]
                .iter()
                .any(|vm| t.vms.iter().any(|v| &v.name == *vm))
        }) {
            bail!(
                "tenant`: workload {:?} would lose its VM; a churned tenant has none",
                w.name
            );
        }
        if churn.interval_ms < 50 {
            bail!("interval_ms`: at least 50 (each change is pinged for up to 1 s)");
        }
        Ok(())
    }

    /// Validates one workload; errors start with the field name (without the prefix).
    fn validate_workload(&self, wl: &Workload) -> Result<()> {
        use WorkloadKind::*;
        if wl.name.trim().is_empty() {
            bail!("name`: must not be empty");
        }
        let from = self
            .tenant_of(&wl.from)
            .ok_or_else(|| anyhow!("from`: no VM named {:?}", wl.from))?;
        let to = self
            .tenant_of(&wl.to)
            .ok_or_else(|| anyhow!("to`: no VM named {:?}", wl.to))?;
        if from.name != to.name {
            bail!(
                "to`: VM {:?} belongs to tenant {:?}, not to {:?} like `from`",
                wl.to,
                to.name,
                from.name
            );
        }
        if (wl.from == wl.to) != (wl.kind == CpuBurn) {
            bail!("to`: must be `from` for cpu_burn, another VM for every other kind");
        }
        let stop = wl.stop_ms(self);
        if stop > self.duration_ms {
            bail!("stop_ms`: after the scenario's duration_ms");
        }
        if wl.start_ms >= stop {
            bail!("start_ms`: must be before stop_ms");
        }
        let allowed: &[&str] = match wl.kind {
            UdpFlood => &["size", "rate_pps"],
            OnOff => &["size", "rate_pps", "on_ms", "off_ms"],
            TcpBulk | Iperf3 => &["flows"],
            Rpc => &["size", "rate_pps", "protocol", "timeout_ms"],
            Transfer => &["flows", "bytes"],
            Sockperf => &["size", "rate_pps", "protocol"],
            Memcached => &["size", "rate_pps", "timeout_ms"],
            CpuBurn => &[],
        };
        let given = [
            ("size", wl.size.is_some()),
            ("rate_pps", wl.rate_pps.is_some()),
            ("flows", wl.flows.is_some()),
            ("on_ms", wl.on_ms.is_some()),
            ("off_ms", wl.off_ms.is_some()),
            ("protocol", wl.protocol.is_some()),
            ("timeout_ms", wl.timeout_ms.is_some()),
            ("bytes", wl.bytes.is_some()),
        ];
        for (field, present) in given {
            if present && !allowed.contains(&field) {
                bail!("{field}`: not a parameter of kind {:?}", wl.kind);
            }
        }
        if let Some(size) = wl.size {
            let min = match wl.kind {
                Rpc => 16,
                Sockperf => 14, // sockperf's own header
                Memcached => 1,
                _ => 8,
            };
            if size < min || size > self.mtu as usize - 28 {
                bail!("size`: must be between {min} and mtu - 28");
            }
        }
        if wl.rate_pps == Some(0) || wl.rate_pps > Some(10_000_000) {
            bail!("rate_pps`: must be between 1 and 10000000");
        }
        if wl.kind.is_probe()
            && (stop - wl.start_ms) * wl.rate_pps.unwrap_or(DEFAULT_RPC_RATE) > 10_000_000_000
        {
            bail!("rate_pps`: more than 10 million requests in one run");
        }
        if wl.kind == Sockperf && stop - wl.start_ms < 2000 {
            // It measures whole seconds less its ~0.85 s start.
            bail!("stop_ms`: sockperf needs at least 2000 ms after start_ms");
        }
        if wl.flows == Some(0) || wl.flows > Some(128) {
            bail!("flows`: must be between 1 and 128");
        }
        if wl.kind == OnOff {
            for (field, v) in [("on_ms", wl.on_ms), ("off_ms", wl.off_ms)] {
                if v.unwrap_or(0) == 0 {
                    bail!("{field}`: required for on_off and must be > 0");
                }
            }
        }
        if wl.timeout_ms == Some(0) || wl.timeout_ms > Some(10_000) {
            bail!("timeout_ms`: must be between 1 and 10000");
        }
        if wl.kind == Transfer && !(1..=1 << 40).contains(&wl.bytes.unwrap_or(0)) {
            bail!("bytes`: required for transfer, 1 to 2^40");
        }
        if let Some(r) = wl.shaped_mbps {
            if !(r > 0.0 && r <= self.access_link_mbps as f64) {
                bail!("shaped_mbps`: must be > 0 and at most access_link_mbps");
            }
        }
        Ok(())
    }
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        bail!("{name:?}: names are 1 to {MAX_NAME_LEN} characters of a-z, 0-9 and _");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::file::{Scenario, DEFAULT_SIZE};
    use std::path::Path;

    const BASE: &str = r#"
name = "t"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "v"
pass = ["victim_p99_ratio <= 1.5", "v.loss <= 0"]

[[tenants]]
name = "v"
min_mbps = 10
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }]

[[tenants]]
name = "x"
vms = [{ name = "c", host = "h1" }, { name = "d", host = "h2" }]

[[workloads]]
name = "probe"
kind = "rpc"
from = "a"
to = "b"
"#;

    fn err(text: &str) -> String {
        format!("{:#}", Scenario::parse(text).unwrap_err())
    }

    fn with_workload(extra: &str) -> String {
        format!("{BASE}\n[[workloads]]\n{extra}")
    }

    #[test]
    fn shipped_scenarios_parse() {
        for file in [
            "ingress-flood.toml",
            "bursty-udp.toml",
            "egress-shaped.toml",
            "incast.toml",
            "shuffle-priority.toml",
            "memcached-bursts.toml",
            "pps-flood.toml",
            "cpu-steal.toml",
            "cpu-fair.toml",
            "accel-hog.toml",
            "offload-hog.toml",
            "defaults-flood.toml",
            "defaults-bursts.toml",
            "defaults-tcp.toml",
        ] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scenarios")
                .join(file);
            let s = Scenario::load(&path).unwrap();
            assert!(s.workloads.len() >= 2, "{file}");
        }
    }

    /// 18446744073709652 us is 100384 ns after wrapping: it was accepted as a valid slice.
    #[test]
    fn a_slice_that_overflows_in_ns_is_refused() {
        let e = err(&BASE.replace(
            "duration_ms = 1000",
            "duration_ms = 1000\nsched_slice_us = 18446744073709652",
        ));
        assert!(e.contains("sched_slice_us"), "{e}");
    }

    #[test]
    fn defaults_apply() {
        let s = Scenario::parse(BASE).unwrap();
        assert_eq!(s.access_link_mbps, 1000);
        assert_eq!(s.workloads[0].stop_ms(&s), 1000);
        assert_eq!(s.workloads[0].size(), DEFAULT_SIZE);
        assert_eq!(s.tenant_of("d").unwrap().name, "x");
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = err(&BASE.replace("duration_ms = 1000", "duration_ms = 1000\nspeed = 3"));
        assert!(e.contains("speed"), "{e}");
        let e = err(&with_workload(
            "name = \"w\"\nkind = \"udp_flood\"\nfrom = \"c\"\nto = \"d\"\nrate = 5",
        ));
        assert!(e.contains("rate"), "{e}");
        let e = err(&with_workload(
            "name = \"w\"\nkind = \"tornado\"\nfrom = \"c\"\nto = \"d\"",
        ));
        assert!(e.contains("tornado"), "{e}");
    }

    #[test]
    fn validation_errors_name_the_field() {
        let cases = [
            (
                BASE.replace("victim = \"v\"", "victim = \"nobody\""),
                "`victim`",
            ),
            (
                BASE.replace(
                    "{ name = \"b\", host = \"h2\" }",
                    "{ name = \"b\", host = \"h9\" }",
                ),
                "`tenants[0].vms[1].host`",
            ),
            (
                BASE.replace("duration_ms = 1000", "duration_ms = 0"),
                "`duration_ms`",
            ),
            (BASE.replace("\"h2\"]", "\"H 2\"]"), "`hosts[1]`"),
            (
                format!("{BASE}\n[picnic]\nheadroom = 0.95\n"),
                "`picnic.headroom`",
            ),
            (
                BASE.replace("\"v.loss <= 0\"", "\"v.loss ~ 0\""),
                "`pass[1]`",
            ),
            (
                BASE.replace("\"v.loss <= 0\"", "\"w.loss <= 0\""),
                "`pass[1]`",
            ),
            (
                BASE.replace("\"v.loss <= 0\"", "\"speed <= 0\""),
                "`pass[1]`",
            ),
            (
                with_workload("name = \"w\"\nkind = \"rpc\"\nfrom = \"a\"\nto = \"d\""),
                "`workloads[1].to`",
            ),
            (
                with_workload("name = \"w\"\nkind = \"udp_flood\"\nfrom = \"zz\"\nto = \"d\""),
                "`workloads[1].from`",
            ),
            (
                with_workload(
                    "name = \"w\"\nkind = \"udp_flood\"\nfrom = \"c\"\nto = \"d\"\nflows = 2",
                ),
                "`workloads[1].flows`",
            ),
            (
                // sockperf measures whole seconds after a ~0.85 s start (BASE runs 1 s).
                with_workload("name = \"w\"\nkind = \"sockperf\"\nfrom = \"c\"\nto = \"d\""),
                "`workloads[1].stop_ms`",
            ),
            (
                with_workload(
                    "name = \"w\"\nkind = \"memcached\"\nfrom = \"c\"\nto = \"d\"\nprotocol = \"udp\"",
                ),
                "`workloads[1].protocol`",
            ),
            (
                with_workload(
                    "name = \"w\"\nkind = \"on_off\"\nfrom = \"c\"\nto = \"d\"\non_ms = 5",
                ),
                "`workloads[1].off_ms`",
            ),
            (
                with_workload(
                    "name = \"w\"\nkind = \"udp_flood\"\nfrom = \"c\"\nto = \"d\"\nstop_ms = 2000",
                ),
                "`workloads[1].stop_ms`",
            ),
            (
                with_workload(
                    "name = \"w\"\nkind = \"udp_flood\"\nfrom = \"c\"\nto = \"d\"\nsize = 9000",
                ),
                "`workloads[1].size`",
            ),
            (
                with_workload("name = \"probe\"\nkind = \"udp_flood\"\nfrom = \"c\"\nto = \"d\""),
                "`workloads[1].name`",
            ),
        ];
        for (text, field) in cases {
            let e = err(&text);
            assert!(e.contains(field), "expected {field} in: {e}");
        }
    }

    #[test]
    fn a_churn_names_a_tenant_it_can_move_without_breaking_a_workload() {
        let churn = |tenant: &str, ms: u64| {
            format!("{BASE}\n[churn]\ntenant = \"{tenant}\"\ninterval_ms = {ms}")
        };
        let s = Scenario::parse(&churn("x", 100)).unwrap();
        assert_eq!(s.churn.unwrap().tenant, "x");
        for (text, why) in [
            (churn("y", 100), "no tenant named"),
            (churn("v", 100), "the victim's VMs"),
            (churn("x", 10), "`churn.interval_ms`"),
            (
                format!("{}\n[[workloads]]\nname = \"f\"\nkind = \"udp_flood\"\nfrom = \"c\"\nto = \"d\"", churn("x", 100)),
                "workload \"f\" would lose its VM",
            ),
            (churn("x", 100).replace("name = \"d\", host = \"h2\"", "name = \"d\", host = \"h2\", tap = true"), "no `tap`"),
        ] {
            let e = err(&text);
            assert!(e.contains(why), "expected {why:?} in: {e}");
        }
    }

    #[test]
    fn attack_flags_and_report_groups() {
        let text = with_workload(
            "name = \"side\"\nkind = \"udp_flood\"\nfrom = \"a\"\nto = \"b\"\nattack = true\nshaped_mbps = 10",
        );
        let text = format!(
            "{text}\n[[workloads]]\nname = \"x1\"\nkind = \"tcp_bulk\"\nfrom = \"c\"\nto = \"d\""
        );
        let s = Scenario::parse(&text).unwrap();
        let [probe, side, x1] = &s.workloads[..] else {
            panic!("three workloads");
        };
        assert!(!s.is_attack(probe) && s.is_attack(side) && s.is_attack(x1));
        assert_eq!(s.report_group(probe), "v");
        assert_eq!(s.report_group(side), "v/attack");
        assert_eq!(s.report_group(x1), "x");
        let rows: Vec<String> = s.report_groups().into_iter().map(|r| r.0).collect();
        assert_eq!(rows, ["v", "v/attack", "x"]);
        assert_eq!(side.ip_protocol(), 17);
        assert_eq!(x1.ip_protocol(), 6);
        assert_eq!(x1.port(&s), Some(crate::BASE_PORT + 2));
    }

    #[test]
    fn transfers_cpu_quotas_and_shaping_are_validated() {
        let transfer = "name = \"t\"\nkind = \"transfer\"\nfrom = \"c\"\nto = \"d\"";
        assert!(Scenario::parse(&with_workload(&format!(
            "{transfer}\nbytes = 1000\nflows = 2"
        )))
        .is_ok());
        let cases = [
            (with_workload(transfer), "`workloads[1].bytes`"),
            (
                with_workload(&format!("{transfer}\nbytes = 10\nsize = 64")),
                "`workloads[1].size`",
            ),
            (
                with_workload(&format!("{transfer}\nbytes = 10\nshaped_mbps = 0")),
                "`workloads[1].shaped_mbps`",
            ),
            (
                BASE.replace("min_mbps = 10", "min_mbps = 10\ncpu_cores = 0"),
                "`tenants[0].cpu_cores`",
            ),
        ];
        for (text, field) in cases {
            let e = err(&text);
            assert!(e.contains(field), "expected {field} in: {e}");
        }
        let s = Scenario::parse(&BASE.replace("min_mbps = 10", "min_mbps = 10\ncpu_cores = 0.5"))
            .unwrap();
        assert_eq!(s.tenants[0].cpu_cores, Some(0.5));
    }

    #[test]
    fn host_and_tenant_cpus_name_hosts_of_the_scenario_and_cpus_of_the_machine() {
        let pinned = |cpus: &str| {
            BASE.replace(
                "hosts = [\"h1\", \"h2\"]",
                &format!("hosts = [\"h1\", \"h2\"]\nhost_cpus = {cpus}"),
            )
        };
        let s = Scenario::parse(&pinned("{ h1 = [0] }")).unwrap();
        assert_eq!(s.cpus_of_host("h1"), [0]);
        assert!(s.cpus_of_host("h2").is_empty());
        assert_eq!((s.cpus_of_vm("a"), s.cpus_of_vm("b")), (&[0][..], &[][..]));
        // A tenant's own CPUs (its VMs' vCPUs) come before its hosts'.
        let s = Scenario::parse(
            &pinned("{ h1 = [0] }").replace("min_mbps = 10", "min_mbps = 10\ncpus = [0]"),
        )
        .unwrap();
        assert_eq!((s.cpus_of_vm("a"), s.cpus_of_vm("b")), (&[0][..], &[0][..]));
        let e = err(&BASE.replace(
            "min_mbps = 10",
            &format!("min_mbps = 10\ncpus = [{}]", 1 << 20),
        ));
        assert!(e.contains("`tenants[0].cpus`: CPU"), "{e}");
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        for (cpus, message) in [
            ("{ h9 = [0] }".to_string(), "`host_cpus.h9`: no host named"),
            (
                "{ h1 = [] }".to_string(),
                "`host_cpus.h1`: needs at least one CPU",
            ),
            (format!("{{ h2 = [{online}] }}"), "`host_cpus.h2`: CPU"),
        ] {
            let e = err(&pinned(&cpus));
            assert!(e.contains(message), "expected {message} in: {e}");
        }
    }
}
