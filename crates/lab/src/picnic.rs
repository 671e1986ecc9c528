//! The picnic dataplane: one `picnic switch` per host namespace, configured from the
//! topology (every host and VM, tenants as VNIs, guarantees from the scenario), run on a
//! thread that entered the host's namespace so its sockets live there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::{anyhow, Context, Result};
use picnic_core::slo::Slo;
use picnic_switch::config::{
    AccelSection, BackendKind, Config, EgressSection, HostEntry, IngressSection, Isolation,
    PortEntry, SwitchSection, TenantEntry, UplinkSection, VmEntry,
};
use picnic_switch::engine::{SloReport, Snapshot};
use picnic_switch::runner::{PortView, Shared, Switch};
use picnic_wire::overlay::ENCAP_OVERHEAD;

use crate::cgroup::Placement;
use crate::dataplane::{Dataplane, DataplaneFactory};
use crate::netns::{self, NsThread};
use crate::scenario::Scenario;
use crate::topology::{HostView, Topology};

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
                min_bps: tenant.min_mbps * 1_000_000,
                max_bps: (tenant.max_mbps > 0).then_some(tenant.max_mbps * 1_000_000),
                latency_us: tenant.latency_p99_us.map(|us| us.ceil() as u64),
                max_loss: tenant.loss_max,
                ..Slo::default()
            }),
            encrypt: false,
            key: None,
            key_file: None,
            key_epoch: 1,
            accel_weight: 1,
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
                port: (h.index == host.index).then(|| PortEntry {
                    ifname: vm.host_port.clone(),
                    backend: if vm.tap {
                        BackendKind::Tap
                    } else {
                        BackendKind::default()
                    },
                }),
                shaped: crate::shaped::shaped_classes(scenario, topo, &vm.name),
            });
        }
    }
    let cfg = Config {
        switch: SwitchSection {
            host_id: host.index as u32 + 1,
            api: None,
            frame_pool: 16384,
            batch: 64,
            spin_us: 0,
            nice: Some(scenario.picnic.nice),
            slice_us: (scenario.sched_slice_us > 0).then_some(scenario.sched_slice_us),
            cpus: (!scenario.picnic.cpus.is_empty()).then(|| scenario.picnic.cpus.clone()),
        },
        uplink: UplinkSection {
            ifname: host.uplink.clone(),
            backend: Default::default(),
            mtu: host.mtu as usize,
            capacity_mbps: Some(host.access_link_mbps),
        },
        isolation: if isolated {
            Isolation::default()
        } else {
            Isolation::off()
        },
        ingress: IngressSection {
            capacity_mbps: host.access_link_mbps,
            ..Default::default()
        },
        egress: EgressSection::default(),
        accel: AccelSection::default(),
        hosts,
        tenants,
        vms,
    };
    cfg.validate()
        .with_context(|| format!("generated switch config for host {}", host.name))?;
    Ok(cfg)
}

/// Gives every tenant with a cgroup on `host` its allocation in the switch and the group to
/// charge (Iron 3.2).
fn charge_cgroups(config: &mut Config, placement: &Placement, host: &str) {
    for t in &mut config.tenants {
        if let Some(g) = placement.group(&t.name, host) {
            t.cpu_quota = Some(g.cores);
            t.cgroup = Some(g.dir.clone());
        }
    }
}

/// A picnic switch per host.
pub struct PicnicSwitch {
    isolated: bool,
    config: Config,
    running: Option<(Arc<AtomicBool>, NsThread<Result<()>>)>,
    /// What the switch publishes; kept after teardown, holding its final counters.
    shared: Option<Arc<Shared>>,
}

impl PicnicSwitch {
    /// A factory making a switch for every host, isolation on or off. With isolation, a
    /// tenant with `cpu_cores` has that allocation in the switch too, and its cgroup on the
    /// host is charged for the switch's work (Iron); without, the switch charges nobody.
    pub fn factory(isolated: bool) -> DataplaneFactory {
        Self::factory_with(isolated, true)
    }

    /// [`PicnicSwitch::factory`] with the schedulers' cost chosen: `cpu_fair` false makes
    /// them byte-fair (the comparison of the `picnic-bytes` mode).
    pub fn factory_with(isolated: bool, cpu_fair: bool) -> DataplaneFactory {
        Arc::new(move |scenario, topo, host, placement| {
            match switch_config(scenario, topo, host, isolated) {
                Ok(mut config) => {
                    config.isolation.cpu_fair &= cpu_fair;
                    if isolated {
                        charge_cgroups(&mut config, placement, &host.name);
                    }
                    Box::new(PicnicSwitch::new(config, isolated))
                }
                Err(e) => Box::new(Failed(format!("{e:#}"))),
            }
        })
    }

    /// A switch running `config` (usually [`switch_config`]'s, possibly adjusted, e.g. with
    /// shaped classes); `isolated` only labels its errors.
    pub fn new(config: Config, isolated: bool) -> PicnicSwitch {
        PicnicSwitch {
            isolated,
            config,
            running: None,
            shared: None,
        }
    }

    /// The config the switch runs.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ports' counters as last published (uplink first, then the local VMs' ports):
    /// every 100 ms while the switch runs, the final ones after teardown. Empty before the
    /// first publication.
    pub fn ports(&self) -> Vec<PortView> {
        let Some(shared) = self.shared.as_ref() else {
            return Vec::new();
        };
        let Ok(latest) = shared.snapshot.lock() else {
            return Vec::new();
        };
        latest
            .as_ref()
            .map(|published| published.ports.clone())
            .unwrap_or_default()
    }

    /// The latest counters the switch published (every 100 ms while it runs; after
    /// teardown, its final ones). None before setup or before its first publication.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let shared = self.shared.as_ref()?;
        let latest = shared.snapshot.lock().ok()?;
        latest.as_ref().map(|published| published.switch.clone())
    }

    /// The switch's latest SLO report (as `GET /slo`), with the same timing as `snapshot`.
    pub fn slo_report(&self) -> Option<SloReport> {
        let shared = self.shared.as_ref()?;
        let latest = shared.snapshot.lock().ok()?;
        latest.as_ref().map(|published| published.slo.clone())
    }
}

impl Dataplane for PicnicSwitch {
    fn setup(&mut self, host: &HostView) -> Result<()> {
        // The overlay adds its headers: tenants get a smaller MTU so TCP never black-holes.
        // Their offloads stay at the Linux defaults: the switch's ports complete partial
        // checksums and segment TSO super-frames.
        let tenant_mtu = (host.mtu as usize - ENCAP_OVERHEAD).to_string();
        for vm in &host.vms {
            // A TAP VM's interface is still the TAP in the host namespace here; it keeps
            // these settings when it moves into the VM.
            let (ns, dev) = if vm.tap {
                (&host.ns, &vm.host_port)
            } else {
                (&vm.ns, &vm.dev)
            };
            netns::ip(ns, &["link", "set", dev, "mtu", &tenant_mtu])?;
        }
        let config = self.config.clone();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = netns::spawn_in_netns(&host.ns, move || -> Result<()> {
            let mut switch = match Switch::open(config) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok((switch.stop_flag(), switch.shared())));
            switch.run()
        })?;
        let mode = if self.isolated {
            "isolated"
        } else {
            "unisolated"
        };
        match ready_rx.recv() {
            Ok(Ok((stop, shared))) => {
                self.running = Some((stop, thread));
                self.shared = Some(shared);
            }
            Ok(Err(e)) => return Err(anyhow!("picnic switch on {} ({mode}): {e}", host.name)),
            Err(_) => {
                return Err(anyhow!(
                    "picnic switch thread on {} exited during start",
                    host.name
                ))
            }
        }
        Ok(())
    }

    fn tenant_cpu_ns(&self) -> Vec<(String, u64)> {
        self.snapshot()
            .map(|s| {
                s.tenants
                    .iter()
                    .map(|t| (t.name.clone(), t.cost_ns))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn teardown(&mut self, host: &HostView) -> Result<()> {
        if let Some((stop, thread)) = self.running.take() {
            stop.store(true, Ordering::Relaxed);
            thread
                .join()?
                .with_context(|| format!("picnic switch on {}", host.name))?;
            if let Some(snap) = self.snapshot() {
                for line in summary_lines(&snap) {
                    eprintln!("[picnic {}] {line}", host.name);
                }
            }
            if let Some(report) = self.slo_report() {
                for line in slo_lines(&report) {
                    eprintln!("[picnic {}] {line}", host.name);
                }
            }
        }
        Ok(())
    }
}

/// One line per tenant with traffic through this switch: its SLO as the switch judges it
/// (latency through the switch, loss, windows violated).
fn slo_lines(report: &SloReport) -> Vec<String> {
    let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
    report
        .tenants
        .iter()
        .filter(|t| t.totals.delivered_packets + t.totals.lost_packets > 0)
        .map(|t| {
            let s = &t.totals;
            format!(
                "slo {:<8} through switch p50 {} p99 {} p99.9 {} us, delivered {} lost {} \
                 ({:.3}%), windows violated {}/{}",
                t.tenant,
                us(s.latency_p50_us),
                us(s.latency_p99_us),
                us(s.latency_p999_us),
                s.delivered_packets,
                s.lost_packets,
                s.loss_fraction * 100.0,
                s.violated_windows,
                s.windows
            )
        })
        .collect()
}

/// A dataplane whose config could not be made; fails at setup with the reason.
struct Failed(String);
impl Dataplane for Failed {
    fn setup(&mut self, _host: &HostView) -> Result<()> {
        Err(anyhow!("{}", self.0))
    }
    fn teardown(&mut self, _host: &HostView) -> Result<()> {
        Ok(())
    }
}

/// One line per VM and one for the switch: what it forwarded and dropped, and why.
fn summary_lines(snap: &Snapshot) -> Vec<String> {
    let drops = |d: &picnic_switch::stats::Drops| {
        d.iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{}={n}", r.as_str()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut lines: Vec<String> = snap
        .vms
        .iter()
        .map(|v| {
            format!(
                "{:<10} tx {:>8} rx {:>8} cost {:>6.1} ms ingress wait p99 < {} us limits {:?} waited in limiter {} drops [{}]",
                v.name,
                v.counters.tx_packets,
                v.counters.rx_packets,
                v.counters.cost_ns as f64 / 1e6,
                v.counters.ingress_wait.quantile_us(0.99).unwrap_or(0),
                v.applied_limits.iter().map(|(d, r)| (*d, r / 1_000_000)).collect::<Vec<_>>(),
                v.counters.waited_limiter,
                drops(&v.counters.drops)
            )
        })
        .collect();
    let s = &snap.switch;
    lines.push(format!(
        "switch     uplink rx {} tx {} feedback sent {} received {} drops [{}] cpu {:.1} ms \
         (VMs {:.1}, unattributed {:.1}, idle loop {:.1}) model {}",
        s.uplink_rx_packets,
        s.uplink_tx_packets,
        s.feedback_sent,
        s.feedback_received,
        drops(&s.drops),
        s.cpu_ns as f64 / 1e6,
        snap.vms.iter().map(|v| v.counters.cost_ns).sum::<u64>() as f64 / 1e6,
        s.unattributed_ns as f64 / 1e6,
        s.overhead_ns as f64 / 1e6,
        snap.cost_model.as_ref().map_or("-".into(), |m| format!(
            "{:.0} ns/iteration + {:.0} ns/frame + {:.2} ns/byte",
            m.fixed_ns, m.per_frame_ns, m.per_byte_ns
        )),
    ));
    lines
}
