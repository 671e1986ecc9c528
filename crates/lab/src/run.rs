//! Running a scenario in several modes and reporting it side by side.

use crate::cgroup::{Placement, SWITCH};
use crate::churn::ChurnRun;
use crate::control::{Control, LabControl};
use crate::dataplane::{Dataplane, DataplaneFactory, LinuxBridge};
use crate::picnic::PicnicSwitch;
use crate::topology;
use crate::workload;
use anyhow::{bail, Context, Result};
use picnic_netns::{self as netns, Testbed};
use picnic_scenario::plan::HostView;
use picnic_scenario::{
    ChurnOutcome, Dataplane as Kind, Mode, ModeReport, Scenario, Summary, SwitchSlo,
};
use picnic_scenario::{WorkloadKind, WorkloadResult};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The lab's dataplane of a mode: a Linux bridge per host for [`Kind::Bridge`], picnic
/// switches otherwise, taking their deployment from `control` if given.
fn dataplane_of(mode: &Mode, control: Option<Arc<LabControl>>) -> DataplaneFactory {
    match mode.dataplane {
        Kind::Bridge => LinuxBridge::factory(),
        picnic @ Kind::Picnic { .. } => PicnicSwitch::factory(picnic, control),
    }
}

/// Whether the mode's dataplane opens TAP devices, so VMs that ask for one get it (else a
/// veth pair): picnic's does.
fn opens_taps(mode: &Mode) -> bool {
    matches!(mode.dataplane, Kind::Picnic { .. })
}

/// Options of [`run_scenario`].
#[derive(Clone)]
pub struct RunOptions {
    /// Modes in run order.
    pub modes: Vec<Mode>,
    /// Directory for summary.json and the CSVs.
    pub out: Option<PathBuf>,
    /// Repetitions of each mode (results are merged).
    pub repeat: u32,
    /// Mode whose checks decide the verdict (default: the first mode with attackers).
    pub judge: Option<String>,
    /// Print progress lines to stderr.
    pub progress: bool,
    /// Where the picnic modes' switches get the deployment from.
    pub control: Control,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            modes: vec![
                Mode::picnic(),
                Mode::picnic_off(),
                Mode::bridge(),
                Mode::picnic_alone(),
                Mode::victim_alone(),
            ],
            out: None,
            repeat: 1,
            judge: None,
            progress: true,
            control: Control::Files,
        }
    }
}

/// What a run produced.
pub struct Outcome {
    /// The summary (also written to `out/summary.json`).
    pub summary: Summary,
    /// Per-mode results.
    pub modes: Vec<ModeReport>,
    /// The side-by-side table.
    pub table: String,
}

impl Outcome {
    /// Whether every pass mark held.
    pub fn pass(&self) -> bool {
        self.summary.pass
    }
}

/// Exit code for the CLI: 0 all pass marks held, 1 some failed, 2 the run failed.
pub fn exit_code(result: &Result<Outcome>) -> i32 {
    match result {
        Ok(o) if o.pass() => 0,
        Ok(_) => 1,
        Err(_) => 2,
    }
}

/// Tools a scenario needs, checked before anything is built.
pub fn required_tools(scenario: &Scenario) -> Vec<&'static str> {
    let mut tools = vec!["ip", "tc", "bridge"];
    for (kind, tool) in [
        (WorkloadKind::Iperf3, "iperf3"),
        (WorkloadKind::Sockperf, "sockperf"),
        (WorkloadKind::Memcached, "memcached"),
    ] {
        if scenario.workloads.iter().any(|w| w.kind == kind) {
            tools.push(tool);
        }
    }
    tools
}

/// Loads the scenario at `path`, runs it in every mode of `opts` (`repeat` rounds of every
/// mode, a fresh testbed each time), prints the table and writes the outputs.
pub fn run_scenario(path: &Path, opts: &RunOptions) -> Result<Outcome> {
    run_loaded(&Scenario::load(path)?, opts)
}

/// Runs an already loaded scenario; see [`run_scenario`].
pub fn run_loaded(scenario: &Scenario, opts: &RunOptions) -> Result<Outcome> {
    netns::preflight(&required_tools(scenario))?;
    let churned_picnic = opts
        .modes
        .iter()
        .any(|m| m.attackers && matches!(m.dataplane, Kind::Picnic { .. }));
    if scenario.churn.is_some() && churned_picnic && opts.control != Control::Etcd {
        bail!(
            "scenario {} churns VMs through the control plane: run it with --control etcd",
            scenario.name
        );
    }
    set_lab_slice(scenario);
    let _bandwidth_slice = crate::cgroup::FineBandwidthSlice::for_scenario(scenario);
    let say = |msg: String| {
        if opts.progress {
            eprintln!("[lab {}] {msg}", scenario.name);
        }
    };
    // Rounds, not blocks: each round runs every mode once, so the runs a ratio compares
    // (a mode against the victim alone) are minutes apart at most, whatever the machine's
    // drift over the whole run.
    let repeat = opts.repeat.max(1);
    let mut runs: Vec<ModeRuns> = opts.modes.iter().map(|_| ModeRuns::default()).collect();
    for round in 0..repeat {
        for (mode, mode_runs) in opts.modes.iter().zip(&mut runs) {
            say(format!("mode {} run {}/{}", mode.name, round + 1, repeat));
            let (results, tenant_cpu, served, tenant_slo, churn) =
                run_mode(scenario, mode, opts.control, &say)
                    .with_context(|| format!("mode {}", mode.name))?;
            for r in &results {
                say(format!(
                    "  {:<12} {:>9.1} Mb/s  loss {:.3}%{}",
                    r.name,
                    r.throughput_bps() / 1e6,
                    r.loss() * 100.0,
                    r.latency
                        .as_ref()
                        .filter(|h| !h.is_empty())
                        .map(|h| format!("  p99 {:.1} us", h.value_at_quantile(0.99) as f64 / 1e3))
                        .unwrap_or_default()
                ));
            }
            if let Some(c) = &churn {
                say(format!(
                    "  churn: {} changes, {} VMs not answering within 1 s, slowest to answer {:.0} ms",
                    c.changes, c.unreachable, c.follow_ms_max
                ));
            }
            mode_runs.churn.push(churn);
            mode_runs.cpu.push(tenant_cpu);
            mode_runs.served.push(served);
            mode_runs.slo.push(tenant_slo);
            mode_runs.results.push(results);
        }
    }
    let mut reports = Vec::new();
    for (mode, mode_runs) in opts.modes.iter().zip(runs) {
        let mut report = ModeReport::new(scenario, &mode.name, mode.attackers, mode_runs.results)?;
        report.add_cpu_share_error(scenario, &mode_runs.cpu, &mode_runs.served);
        report.add_switch_slo(scenario, &mode_runs.slo);
        report.add_churn(&mode_runs.churn);
        reports.push(report);
    }
    let summary = Summary::new(scenario, &reports, opts.judge.as_deref())?;
    let table = summary.table();
    if opts.progress {
        eprintln!("{table}");
    }
    if let Some(dir) = &opts.out {
        picnic_scenario::write_outputs(dir, &summary, &reports)?;
        let plots = crate::plot::write_plots(dir, scenario, &reports)?;
        say(format!(
            "wrote {} and {} plots (.svg) in {}",
            dir.join("summary.json").display(),
            plots.len(),
            dir.display()
        ));
    }
    Ok(Outcome {
        summary,
        modes: reports,
        table,
    })
}

/// Gives the calling thread, and so every thread and tool the lab starts from it, the
/// scenario's EEVDF slice. The same in every mode: a property of the host, not of picnic.
fn set_lab_slice(scenario: &Scenario) {
    if scenario.sched_slice_us == 0 {
        return;
    }
    if let Err(e) = picnic_switch::sched::set_thread_slice(scenario.sched_slice_us * 1000) {
        eprintln!(
            "picnic lab: warning: sched_slice_us {}: {e} (needs Linux 6.12+; running with the kernel's slice)",
            scenario.sched_slice_us
        );
    }
}

/// Dataplanes of a testbed; torn down (before the namespaces go) when dropped.
struct Dataplanes(Vec<(HostView, Box<dyn Dataplane>)>);

impl Drop for Dataplanes {
    fn drop(&mut self) {
        for (host, dp) in &mut self.0 {
            if let Err(e) = dp.teardown(host) {
                eprintln!("picnic lab: dataplane teardown on {}: {e:#}", host.name);
            }
        }
    }
}

/// One run of a mode: the workloads' results, the CPU the dataplanes charged each tenant
/// (ns), the tenants none of whose frames they dropped, and what they judged of each
/// tenant's SLO (summed over hosts; empty for kernel bridges), and what the churn did if it
/// ran.
pub type ModeRun = (
    Vec<WorkloadResult>,
    BTreeMap<String, u64>,
    BTreeSet<String>,
    BTreeMap<String, SwitchSlo>,
    Option<ChurnOutcome>,
);

/// One mode's repetitions, gathered over the rounds.
#[derive(Default)]
struct ModeRuns {
    results: Vec<Vec<WorkloadResult>>,
    cpu: Vec<BTreeMap<String, u64>>,
    served: Vec<BTreeSet<String>>,
    slo: Vec<BTreeMap<String, SwitchSlo>>,
    churn: Vec<Option<ChurnOutcome>>,
}

/// Builds a testbed, sets up `mode`'s dataplane on every host (picnic's from a fresh etcd
/// with [`Control::Etcd`]), runs the workloads (all, or the victim's only) and tears
/// everything down.
pub fn run_mode(
    scenario: &Scenario,
    mode: &Mode,
    control: Control,
    say: &dyn Fn(String),
) -> Result<ModeRun> {
    let mut testbed = Testbed::new()?;
    let vm_count: usize = scenario.tenants.iter().map(|t| t.vms.len()).sum();
    say(format!(
        "  building testbed {}: {} hosts, {} VMs, access links {} Mb/s",
        testbed.run_id(),
        scenario.hosts.len(),
        vm_count,
        scenario.access_link_mbps
    ));
    let taps = opens_taps(mode);
    let topo = topology::build(scenario, &mut testbed, taps)?;
    let placement = Placement::create(scenario, testbed.run_id())?;
    let lab_control = match (control, mode.dataplane) {
        (Control::Etcd, picnic @ Kind::Picnic { .. }) => {
            let c = LabControl::start(scenario, &topo, picnic, testbed.run_id())?;
            say(format!(
                "  control plane: etcd at {}, the deployment put into it",
                c.endpoints().join(",")
            ));
            Some(Arc::new(c))
        }
        _ => None,
    };
    let factory = dataplane_of(mode, lab_control.clone());
    for g in placement.groups() {
        let who = match g.tenant.as_str() {
            SWITCH => "the switch".to_string(),
            tenant => format!("tenant {tenant}"),
        };
        say(format!(
            "  {who} limited to {} cores on {} (cgroup)",
            g.cores, g.host
        ));
    }
    let mut dataplanes = Dataplanes(Vec::new());
    for host in &topo.hosts {
        let mut dp = factory(scenario, &topo, host, &placement);
        dp.setup(host)
            .with_context(|| format!("dataplane setup on host {}", host.name))?;
        dataplanes.0.push((host.clone(), dp));
    }
    if taps {
        topology::attach_taps(&topo)?;
    }
    let workloads: Vec<_> = scenario
        .workloads
        .iter()
        .filter(|w| mode.attackers || !scenario.is_attack(w))
        .collect();
    say(format!(
        "  running {} workloads for {} ms",
        workloads.len(),
        scenario.duration_ms
    ));
    let churn = match (&scenario.churn, &lab_control) {
        (Some(churn), Some(control)) if mode.attackers => {
            say(format!(
                "  churning tenant {}'s VMs through etcd every {} ms",
                churn.tenant, churn.interval_ms
            ));
            Some(ChurnRun::start(scenario, churn, &topo, control.clone())?)
        }
        (Some(_), None) if mode.attackers => {
            say("  no churn: this dataplane has no control plane".into());
            None
        }
        _ => None,
    };
    let results = workload::run_placed(scenario, &topo, &workloads, &placement);
    let churned = churn.map(ChurnRun::finish).transpose();
    let (results, churned) = (results?, churned?);
    let mut tenant_cpu = BTreeMap::new();
    let mut tenant_slo: BTreeMap<String, SwitchSlo> = BTreeMap::new();
    // Served in full: every host that charged the tenant dropped none of its frames.
    let mut served = BTreeSet::new();
    let mut dropped = BTreeSet::new();
    for (_, dp) in &dataplanes.0 {
        let in_full = dp.tenants_served_in_full();
        for (tenant, ns) in dp.tenant_cpu_ns() {
            if in_full.contains(&tenant) {
                served.insert(tenant.clone());
            } else {
                dropped.insert(tenant.clone());
            }
            *tenant_cpu.entry(tenant).or_insert(0) += ns;
        }
        for (tenant, judged) in dp.tenant_slo() {
            let sum = tenant_slo.entry(tenant).or_default();
            sum.windows += judged.windows;
            sum.violated_windows += judged.violated_windows;
        }
    }
    // The switches give the groups their allocations back when they stop.
    drop(dataplanes);
    drop(lab_control);
    drop(placement);
    testbed.teardown()?;
    say("  torn down".into());
    let served = served.difference(&dropped).cloned().collect();
    Ok((results, tenant_cpu, served, tenant_slo, churned))
}
