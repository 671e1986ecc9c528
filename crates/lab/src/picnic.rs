//! The picnic dataplane: one `picnic switch` per host namespace, configured from the
//! topology by the scenario crate's mapping (`picnic_scenario::switch`), run on a thread
//! that entered the host's namespace so its sockets live there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use picnic_control::watch::Watch;
use picnic_scenario::switch::dataplane_config;
use picnic_scenario::Dataplane as Kind;
use picnic_switch::accel::AccelView;
use picnic_switch::config::Config;
use picnic_switch::engine::{SloReport, Snapshot};
use picnic_switch::runner::{PortView, Shared, Switch};
use picnic_wire::overlay::ENCAP_OVERHEAD;

use crate::cgroup::{Placement, TenantGroup, SWITCH};
use crate::control::LabControl;
use crate::dataplane::{Dataplane, DataplaneFactory};
use picnic_netns::{self as netns, NsThread};
use picnic_scenario::plan::HostView;

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
    /// The group of the switch's CPU allocation (`picnic.cpu_cores`), if it has one.
    group: Option<TenantGroup>,
    running: Option<(Arc<AtomicBool>, NsThread<Result<()>>)>,
    /// What the switch publishes; kept after teardown, holding its final counters.
    shared: Option<Arc<Shared>>,
    /// On the control plane: the whole deployment, which the switch's watcher brings from
    /// etcd before setup returns.
    deployment: Option<Config>,
    /// The watcher, while the switch runs.
    watch: Option<Watch>,
}

/// How long a switch on the control plane may take to apply the deployment from etcd.
const APPLY_WITHIN: Duration = Duration::from_secs(10);

impl PicnicSwitch {
    /// A factory making a switch for every host with the isolation and schedulers of
    /// `dataplane` (a [`Kind::Picnic`]). With isolation, a tenant with `cpu_cores` has that
    /// allocation in the switch too, and its cgroup on the host is charged for the switch's
    /// work (Iron); without, the switch charges nobody. With `control`, each switch's file
    /// names only its host (`LabControl::host_config`) and the rest comes from etcd.
    pub fn factory(dataplane: Kind, control: Option<Arc<LabControl>>) -> DataplaneFactory {
        let isolated = matches!(dataplane, Kind::Picnic { isolated: true, .. });
        Arc::new(move |scenario, topo, host, placement| {
            match dataplane_config(scenario, topo, host, dataplane) {
                Ok(mut config) => {
                    if isolated {
                        charge_cgroups(&mut config, placement, &host.name);
                    }
                    let mut switch = match &control {
                        Some(c) => {
                            let mut s = PicnicSwitch::new(c.host_config(&config), isolated);
                            s.deployment = Some(config);
                            s
                        }
                        None => PicnicSwitch::new(config, isolated),
                    };
                    switch.group = placement.group(SWITCH, &host.name).cloned();
                    Box::new(switch)
                }
                Err(e) => Box::new(Failed(format!("{e:#}"))),
            }
        })
    }

    /// A switch running `config` (usually `picnic_scenario::switch::switch_config`'s, possibly adjusted, e.g. with
    /// shaped classes); `isolated` only labels its errors.
    pub fn new(config: Config, isolated: bool) -> PicnicSwitch {
        PicnicSwitch {
            isolated,
            config,
            group: None,
            running: None,
            shared: None,
            deployment: None,
            watch: None,
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
        self.shared
            .as_ref()
            .and_then(|shared| shared.latest())
            .map(|published| published.ports.clone())
            .unwrap_or_default()
    }

    /// The latest counters the switch published (every 100 ms while it runs; after
    /// teardown, its final ones). None before setup or before its first publication.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let latest = self.shared.as_ref()?.latest()?;
        Some(latest.switch.clone())
    }

    /// The switch's latest SLO report (as `GET /slo`), with the same timing as `snapshot`.
    pub fn slo_report(&self) -> Option<SloReport> {
        let latest = self.shared.as_ref()?.latest()?;
        Some(latest.slo.clone())
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
        let group = self.group.clone();
        let controlled = self.deployment.is_some();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = netns::spawn_in_netns(&host.ns, move || -> Result<()> {
            let opened = match &group {
                Some(g) => g.enter().and_then(|()| Switch::open(config)),
                None => Switch::open(config),
            };
            let mut switch = match opened {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return Err(e);
                }
            };
            // Made here: the loop's port keeper opens new ports in the host's namespace.
            let commands = controlled.then(|| switch.command_channel());
            let _ = ready_tx.send(Ok((switch.stop_flag(), switch.shared(), commands)));
            switch.run()
        })?;
        let mode = if self.isolated {
            "isolated"
        } else {
            "unisolated"
        };
        match ready_rx.recv() {
            Ok(Ok((stop, shared, commands))) => {
                self.running = Some((stop, thread));
                self.shared = Some(shared.clone());
                if let (Some(full), Some(commands)) = (&self.deployment, commands) {
                    // Spawned from the lab's thread: it reaches etcd on the lab's loopback.
                    self.watch = Some(picnic_control::watch::spawn(
                        &self.config,
                        shared.clone(),
                        commands,
                    )?);
                    wait_applied(&shared, full)
                        .with_context(|| format!("picnic switch on {}", host.name))?;
                }
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
                    .map(|t| (t.name.clone(), t.cost_ns + t.softirq_ns))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn tenants_served_in_full(&self) -> Vec<String> {
        let Some(snap) = self.snapshot() else {
            return Vec::new();
        };
        snap.tenants
            .iter()
            .filter(|t| {
                snap.vms.iter().filter(|v| v.tenant == t.name).all(|v| {
                    let c = &v.counters;
                    c.drops.total() + c.fast_path.tx_shed + c.fast_path.tx_dropped == 0
                })
            })
            .map(|t| t.name.clone())
            .collect()
    }

    fn tenant_slo(&self) -> Vec<(String, picnic_scenario::SwitchSlo)> {
        self.slo_report()
            .map(|r| {
                r.tenants
                    .iter()
                    .map(|t| {
                        let judged = picnic_scenario::SwitchSlo {
                            windows: t.totals.windows,
                            violated_windows: t.totals.violated_windows,
                        };
                        (t.tenant.clone(), judged)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn teardown(&mut self, host: &HostView) -> Result<()> {
        self.watch.take();
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
            let latest = self.shared.as_ref().and_then(|s| s.latest());
            for line in latest.iter().flat_map(|p| worker_lines(p, &host.uplink)) {
                eprintln!("[picnic {}] {line}", host.name);
            }
            // How long the loop stopped forwarding for each live change it made.
            let workers = latest.iter().flat_map(|p| &p.workers);
            for w in workers.filter(|w| w.live_commits.commits > 0) {
                let c = &w.live_commits;
                eprintln!(
                    "[picnic {}] worker {} live changes {}: loop held p50 {:.0} p99 {:.0} max {:.0} us",
                    host.name, w.worker, c.commits, c.p50_us, c.p99_us, c.max_us
                );
            }
            let accel = latest.as_ref().and_then(|p| p.accel.as_ref());
            for line in accel.into_iter().flat_map(accel_lines) {
                eprintln!("[picnic {}] {line}", host.name);
            }
        }
        Ok(())
    }
}

/// Waits until the switch runs every host, tenant and VM of `full` (brought by its watcher).
fn wait_applied(shared: &Shared, full: &Config) -> Result<()> {
    let start = Instant::now();
    loop {
        let missing: Vec<String> = match shared.config() {
            Some(running) => {
                let hosts = full
                    .hosts
                    .iter()
                    .filter(|h| !running.hosts.iter().any(|r| r.id == h.id))
                    .map(|h| format!("host {}", h.id));
                let tenants = full
                    .tenants
                    .iter()
                    .filter(|t| !running.tenants.iter().any(|r| r.name == t.name))
                    .map(|t| format!("tenant {}", t.name));
                let vms = full
                    .vms
                    .iter()
                    .filter(|v| !running.vms.iter().any(|r| r.name == v.name))
                    .map(|v| format!("VM {}", v.name));
                hosts.chain(tenants).chain(vms).collect()
            }
            None => vec!["its config".into()],
        };
        if missing.is_empty() {
            return Ok(());
        }
        if start.elapsed() > APPLY_WITHIN {
            bail!(
                "did not apply the deployment from etcd within {} s; missing {}",
                APPLY_WITHIN.as_secs(),
                missing.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
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
            let late = t.why.late.map_or(String::new(), |l| {
                format!(
                    "; late in ingress queue {}, egress queue {}, shaped class {}, limiter {}",
                    l.ingress_queue, l.egress_queue, l.shaped_class, l.limiter
                )
            });
            format!(
                "slo {:<8} through switch p50 {} p99 {} p99.9 {} us, delivered {} lost {} \
                 ({:.3}%), windows violated {}/{} {:?}, held beyond guarantee {}{late}",
                t.tenant,
                us(s.latency_p50_us),
                us(s.latency_p99_us),
                us(s.latency_p999_us),
                s.delivered_packets,
                s.lost_packets,
                s.loss_fraction * 100.0,
                s.violated_windows,
                s.windows,
                t.violations_total
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .collect::<Vec<_>>(),
                t.why.held_beyond_guarantee,
            )
        })
        .collect()
}

/// One line per dataplane worker of a switch with several: its VMs, the frames it read
/// from its own uplink queues, its thread's CPU and the frames it handed to other workers
/// (uplink frames for their VMs) or took from them.
fn worker_lines(p: &picnic_switch::runner::Published, uplink: &str) -> Vec<String> {
    if p.workers.len() < 2 {
        return Vec::new();
    }
    p.workers
        .iter()
        .map(|w| {
            let uplink_rx: u64 = p
                .ports
                .iter()
                .filter(|port| port.worker == w.worker && port.name == uplink)
                .map(|port| port.stats.rx_frames)
                .sum();
            format!(
                "worker {} [{}] uplink rx {uplink_rx} cpu {:.1} ms handoff out {} in {} full {}",
                w.worker,
                w.vms.join(" "),
                w.cpu_ns as f64 / 1e6,
                w.handoff.out,
                w.handoff.r#in,
                w.handoff.full,
            )
        })
        .collect()
}

/// One line per tenant of the shared encryption engine: jobs, refusals, worker CPU, and how
/// long its jobs waited in its queue and took through the engine (submission to result).
fn accel_lines(view: &AccelView) -> Vec<String> {
    let us = |h: &picnic_switch::stats::WaitHistogram, q| {
        h.quantile_us(q).map_or("-".into(), |v| format!("<{v}"))
    };
    view.tenants
        .iter()
        .map(|(name, t)| {
            format!(
                "accel {name:<8} sealed {} opened {} refused {} cpu {:.1} ms, queue p50 {} p99 {} us, \
                 turnaround p50 {} p99 {} max {} us",
                t.sealed,
                t.opened,
                t.queue_full,
                t.cpu_ns as f64 / 1e6,
                us(&t.latency.queue, 0.5),
                us(&t.latency.queue, 0.99),
                us(&t.latency.turnaround, 0.5),
                us(&t.latency.turnaround, 0.99),
                us(&t.latency.turnaround, 1.0),
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
            let k = &v.counters.fast_path;
            format!(
                "{:<10} tx {:>8} rx {:>8} cost {:>6.1} ms softirq {:>6.1} ms ingress wait p99 < {} us limits {:?} waited in limiter {} drops [{}] kernel tx {} rx {} dropped {} shed {} handed over {} (tokens {}, offload {}) resumed {}",
                v.name,
                v.counters.tx_packets,
                v.counters.rx_packets,
                v.counters.cost_ns as f64 / 1e6,
                v.counters.softirq_ns as f64 / 1e6,
                v.counters.ingress_wait.quantile_us(0.99).unwrap_or(0),
                v.applied_limits.iter().map(|(d, r)| (*d, r / 1_000_000)).collect::<Vec<_>>(),
                v.counters.waited_limiter,
                drops(&v.counters.drops),
                k.tx_packets,
                k.rx_packets,
                k.tx_dropped + k.rx_dropped,
                k.tx_shed,
                k.handed_not_granted
                    + k.handed_tokens
                    + k.handed_not_unicast_ipv4
                    + k.handed_spoofed
                    + k.handed_destination
                    + k.handed_offload
                    + k.handed_geneve_options,
                k.handed_tokens,
                k.handed_offload,
                k.tx_resumed,
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
