//! The scenario -> switch config mapping: the config of `picnic switch` on every host of a
//! planned topology (every host and VM, tenants as VNIs, guarantees and shaped classes from
//! the scenario), used by the lab's switches and the simulator's engines alike. A workload
//! with `shaped_mbps` gets its own shaped egress class (PicNIC 2.1: a VM's rate-limited flow
//! has its own queue so it never blocks the VM's fast-path traffic).

use anyhow::{anyhow, Context, Result};
use picnic_core::slo::Slo;
use picnic_core::Rate;
use picnic_switch::config::{
    Backend, Config, EgressSection, HostEntry, IngressSection, Isolation, PortEntry, ShapedClass,
    SwitchSection, TenantEntry, UplinkSection, VmEntry,
};

use crate::mode::Dataplane;
use crate::plan::{HostView, Topology};
use crate::Scenario;

/// VNI of the scenario's tenant number `t`.
pub fn vni_of(t: usize) -> u32 {
    100 + t as u32
}

/// The switch config of `host` in `topo`, with every isolation mechanism on or off.
pub fn switch_config(
    scenario: &Scenario,
    topo: &Topology,
    host: &HostView,
    isolated: bool,
) -> Result<Config> {
    // `[picnic] cpus` places every switch; else a pinned host's switch runs on its cores.
    let switch_cpus = if scenario.picnic.cpus.is_empty() {
        scenario.cpus_of_host(&host.name)
    } else {
        &scenario.picnic.cpus
    };
    let hosts = topo
        .hosts
        .iter()
        .map(|h| {
            Ok(HostEntry {
                id: h.index as u32 + 1,
                underlay_ip: h.underlay_ip,
                mac: h.uplink_mac.parse().map_err(|e| anyhow!("{e}"))?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let tenants = scenario
        .tenants
        .iter()
        .enumerate()
        .map(|(t, tenant)| TenantEntry {
            name: tenant.name.clone(),
            vni: vni_of(t),
            cpu_quota: None,
            cgroup: None,
            // Every tenant's SLO runs in the switch, so its own view (latency through the
            // switch, loss by reason) is printed beside the lab's end-to-end figures.
            slo: Some(Slo {
                min_bps: tenant.min_rate().bps(),
                max_bps: tenant.max_rate().map(Rate::bps),
                latency_us: tenant.latency_p99_us.map(|us| us.ceil() as u64),
                max_loss: tenant.loss_max,
                ..Slo::default()
            }),
            encrypt: tenant.encrypt,
            // A lab key, the same on every host: not a secret.
            key: tenant
                .encrypt
                .then(|| format!("{:032x}", 0x5eed_u128 << 64 | t as u128)),
            key_file: None,
            key_epoch: 1,
            accel_weight: 1,
            offload: tenant.offload.clone(),
        })
        .collect();
    let mut vms = Vec::new();
    for h in &topo.hosts {
        for vm in &h.vms {
            let tenant = &scenario.tenants[vm.tenant_index];
            vms.push(VmEntry {
                name: vm.name.clone(),
                id: vms.len() as u32 + 1,
                tenant: vm.tenant.clone(),
                host: h.index as u32 + 1,
                mac: vm.mac.parse().map_err(|e| anyhow!("{e}"))?,
                ip: vm.ip,
                min_mbps: tenant.min_mbps.max(1),
                max_mbps: (tenant.max_mbps > 0).then_some(tenant.max_mbps),
                max_pps: None,
                min_pps: None,
                ipv6: Vec::new(),
                allow_ethertypes: Vec::new(),
                port: (h.index == host.index).then(|| PortEntry {
                    ifname: vm.host_port.clone(),
                    // The lab's TAP VMs: the switch holds the queue and the lab moves the
                    // netdev into the VM's namespace.
                    create: false,
                    socket: None,
                    backend: if vm.tap {
                        Backend::TapQueue
                    } else {
                        Backend::default()
                    },
                    // The VM's vCPUs, for pinned workers to serve it there.
                    cpus: if switch_cpus.is_empty() {
                        Vec::new()
                    } else {
                        scenario.cpus_of_vm(&vm.name).to_vec()
                    },
                }),
                shaped: shaped_classes(scenario, topo, &vm.name),
            });
        }
    }
    let cfg = Config {
        switch: SwitchSection {
            host_id: host.index as u32 + 1,
            api: None,
            metrics: None,
            api_socket_mode: 0o600,
            api_token_file: None,
            feedback_key_file: None,
            state_file: None,
            frame_pool: 16384,
            batch: 64,
            spin_us: 0,
            nice: scenario.picnic.nice,
            slice_us: (scenario.sched_slice_us > 0 && scenario.picnic.realtime_priority.is_none())
                .then_some(scenario.sched_slice_us),
            realtime_priority: scenario.picnic.realtime_priority,
            cpus: (!switch_cpus.is_empty()).then(|| switch_cpus.to_vec()),
            workers: scenario.picnic.workers,
            yield_busy: scenario.picnic.yield_busy,
        },
        uplink: UplinkSection {
            ifname: host.uplink.clone(),
            backend: Default::default(),
            mtu: host.mtu as usize,
            capacity_mbps: Some(host.access_link_mbps),
        },
        isolation: if isolated {
            Isolation {
                // The softirq programs see every packet of the kernel, and the lab's kernel
                // holds every emulated host: with N hosts each packet would pay N switches'
                // programs (~535 ns each, docs/BENCHMARKS.md) where a real host pays one.
                // Multi-host scenarios charge the switches' own work only, unless the kernel
                // fast path forwards (see `dataplane_config`).
                softirq_accounting: topo.hosts.len() == 1,
                ..Isolation::default()
            }
        } else {
            Isolation::off()
        },
        ingress: {
            let default = IngressSection::default();
            IngressSection {
                capacity_mbps: host.access_link_mbps,
                headroom: scenario.picnic.headroom.unwrap_or(default.headroom),
                ..default
            }
        },
        egress: EgressSection::default(),
        accel: picnic_switch::config::AccelSection {
            workers: scenario.picnic.accel_workers,
            capacity_percent: scenario.picnic.accel_capacity_percent,
            job_work_ns: scenario.picnic.accel_job_work_ns,
            ..Default::default()
        },
        // Set per mode (`dataplane_config`): on in `picnic` (the switch's default), off in
        // `picnic-engines` and `picnic-off`.
        fastpath: Default::default(),
        control: None,
        feedback_keys: None,
        hosts,
        tenants,
        vms,
    };
    cfg.validate()
        .with_context(|| format!("generated switch config for host {}", host.name))?;
    Ok(cfg)
}

/// The switch config of `host` for `dataplane`: picnic's with its isolation and scheduler
/// cost; [`Dataplane::Bridge`] where a runner has no bridge (the simulator) is the engine
/// with every isolation mechanism off (see [`crate::mode`]).
pub fn dataplane_config(
    scenario: &Scenario,
    topo: &Topology,
    host: &HostView,
    dataplane: Dataplane,
) -> Result<Config> {
    let (isolated, cpu_fair, kernel_fastpath) = match dataplane {
        Dataplane::Bridge => (false, true, false),
        Dataplane::Picnic {
            isolated,
            cpu_fair,
            kernel_fastpath,
        } => (isolated, cpu_fair, kernel_fastpath),
    };
    let mut config = switch_config(scenario, topo, host, isolated)?;
    config.isolation.cpu_fair &= cpu_fair;
    config.fastpath.kernel = kernel_fastpath;
    // The fast path's work is in the softirq: its only account per tenant, which Iron needs
    // where a tenant has a CPU allocation (cpu-steal: without it the flood crossed h1's
    // kernel uncharged, the victim 0.88x). Each packet then pays every emulated host's
    // programs, picnic's side alone, so only there: in incast (4 hosts) it cost the shares
    // 0.093 -> 0.10 and convergence 10 -> 1100 ms (one batch each).
    config.isolation.softirq_accounting |=
        isolated && kernel_fastpath && scenario.tenants.iter().any(|t| t.cpu_cores.is_some());
    Ok(config)
}

/// The shaped classes of VM `vm`: one per workload sent from it with `shaped_mbps`,
/// matching its packets exactly (receiver IP, IP protocol, receiver port). Pure; for the
/// `shaped` field of the VM's entry in the switch config. Workloads whose receiver is not
/// in `topo` are skipped (a validated scenario has none).
pub fn shaped_classes(scenario: &Scenario, topo: &Topology, vm: &str) -> Vec<ShapedClass> {
    scenario
        .workloads
        .iter()
        .filter(|w| w.from == vm)
        .filter_map(|w| {
            let rate_mbps = w.shaped_mbps?;
            Some(ShapedClass {
                dst_ip: Some(topo.vm(&w.to)?.ip),
                protocol: Some(w.ip_protocol()),
                dst_port: Some(w.port(scenario)?),
                rate_mbps,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scenario;

    #[test]
    fn a_shaped_workload_becomes_an_exact_class_of_its_sender() {
        let s = Scenario::parse(
            r#"
name = "t"
duration_ms = 1000
hosts = ["h1", "h2"]
victim = "v"
[[tenants]]
name = "v"
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }, { name = "c", host = "h2" }]
[[workloads]]
name = "fast"
kind = "tcp_bulk"
from = "a"
to = "b"
[[workloads]]
name = "slow"
kind = "udp_flood"
from = "a"
to = "c"
shaped_mbps = 10
"#,
        )
        .unwrap();
        let topo = Topology::plan(&s, "t", &|role| role.to_owned());
        let classes = shaped_classes(&s, &topo, "a");
        assert_eq!(classes.len(), 1);
        let c = &classes[0];
        assert_eq!(c.dst_ip, Some(topo.vm("c").unwrap().ip));
        assert_eq!(c.protocol, Some(17));
        assert_eq!(c.dst_port, Some(crate::BASE_PORT + 1));
        assert_eq!(c.rate_mbps, 10.0);
        assert!(shaped_classes(&s, &topo, "b").is_empty());
    }

    #[test]
    fn lab_switches_take_the_worker_default_unless_the_scenario_sets_a_count() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/cpu-fair.toml");
        let mut s = Scenario::load(&path).unwrap();
        s.picnic.workers = None; // the file's own count aside
        let topo = Topology::plan(&s, "t", &|role| role.to_string());
        for host in &topo.hosts {
            let cfg = switch_config(&s, &topo, host, true).unwrap();
            assert_eq!(cfg.switch.workers, None, "the switch's default count");
        }
        s.picnic.workers = Some(1);
        let cfg = switch_config(&s, &topo, &topo.hosts[0], true).unwrap();
        assert_eq!(cfg.switch.workers, Some(1));
    }

    #[test]
    fn a_pinned_host_runs_its_switch_on_its_cores_unless_picnic_cpus_places_every_switch() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/cpu-steal.toml");
        let mut s = Scenario::load(&path).unwrap();
        let topo = Topology::plan(&s, "t", &|role| role.to_string());
        let cpus = |s: &Scenario| -> Vec<Option<Vec<usize>>> {
            topo.hosts
                .iter()
                .map(|h| switch_config(s, &topo, h, true).unwrap().switch.cpus)
                .collect()
        };
        assert_eq!(
            cpus(&s),
            [Some(vec![1]), Some(vec![0])],
            "h1 on CPU 1, h2 on CPU 0"
        );
        s.picnic.cpus = vec![0];
        assert_eq!(cpus(&s), [Some(vec![0]), Some(vec![0])]);
        s.picnic.cpus.clear();
        s.host_cpus.clear();
        assert_eq!(
            cpus(&s),
            [None, None],
            "unpinned: wherever the scheduler puts them"
        );
    }

    #[test]
    fn accel_hog_encrypts_both_tenants_with_one_key_per_tenant_on_every_host() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/accel-hog.toml");
        let s = Scenario::load(&path).unwrap();
        let topo = Topology::plan(&s, "t", &|role| role.to_string());
        let configs: Vec<Config> = topo
            .hosts
            .iter()
            .map(|h| switch_config(&s, &topo, h, true).unwrap())
            .collect();
        for cfg in &configs {
            assert!(cfg
                .tenants
                .iter()
                .all(|t| t.encrypt && t.load_key().is_ok()));
            // Real AES-GCM is the scarce resource, not synthetic work.
            assert_eq!(
                (
                    cfg.accel.workers,
                    cfg.accel.job_work_ns,
                    cfg.accel.capacity_percent
                ),
                (0, 0, 2)
            );
        }
        let key = |c: &Config, t: usize| c.tenants[t].key.clone().unwrap();
        assert_eq!(key(&configs[0], 0), key(&configs[1], 0));
        assert_ne!(key(&configs[0], 0), key(&configs[0], 1));
        let off = switch_config(&s, &topo, &topo.hosts[0], false).unwrap();
        assert!(
            !off.isolation.accel,
            "picnic-off runs the engine as one FIFO"
        );
    }

    #[test]
    fn offload_hog_attaches_the_hogs_program_on_every_host_with_its_budget_only_isolated() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scenarios/offload-hog.toml");
        let s = Scenario::load(&path).unwrap();
        let topo = Topology::plan(&s, "t", &|role| role.to_string());
        for isolated in [true, false] {
            for h in &topo.hosts {
                let cfg = switch_config(&s, &topo, h, isolated).unwrap();
                assert!(cfg.tenants[0].offload.is_none());
                let program = cfg.tenants[1].offload.as_ref().unwrap();
                assert_eq!(program.fuel_per_period, 50_000);
                picnic_switch::offload::check(program).unwrap();
                assert_eq!(cfg.isolation.offload, isolated);
            }
        }
    }
}
