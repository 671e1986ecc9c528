//! CPU placement of tenant workloads through cgroups: a tenant with `cpu_cores` gets a
//! cgroup with that CFS quota, and shares in proportion to it, on every host it has VMs on
//! (a container's group is local to its host), and every workload thread of the tenant moves itself into the group of the
//! host its VM is on when it starts (threads it spawns inherit it), so runs are repeatable
//! on 2 cores. A picnic switch with CPU accounting charges the group of its own host for
//! the work it does for the tenant (Iron).
//!
//! cgroup v1 (`/sys/fs/cgroup/cpu/`, the case on our machines, DESIGN.md 7): a group per
//! tenant under `picnic-lab/`, `cpu.cfs_period_us` / `cpu.cfs_quota_us`, threads written
//! to `tasks`. cgroup v2 where its cpu controller is enabled (`cpu.max`): v2 only lets one
//! process's threads sit in different groups inside a threaded subtree of the process's own
//! domain, so the lab process moves into `picnic-lab/<run>` (a threaded domain) and each
//! tenant group below it is `threaded`; the process moves back before the groups go.
//! Groups are named like the run's namespaces (`pn-<pid>x<n>-...`); groups of dead runs
//! are removed at the next start.

use anyhow::{anyhow, bail, Context, Result};
use picnic_netns as netns;
use picnic_scenario::Scenario;
use std::path::{Path, PathBuf};

/// Root of the cgroup file system.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Folder of the lab's groups inside a hierarchy.
const LAB_DIR: &str = "picnic-lab";
/// CFS period of the tenants' quotas, us (the kernel's default).
pub const PERIOD_US: u64 = 100_000;
/// CFS period of a switch's quota (`[picnic] cpu_cores`), us. A quota runs its group at full
/// speed until the period's share is used, then stops it for the rest: at 100 ms a quarter
/// core forwards for 25 ms and stops for 75, so in its bursts it drains the tenants' rings
/// at a whole core's rate, which no sender sharing the other core keeps up with, and the
/// switch, not the senders, is no longer what runs out. At 10 ms its bursts last 2.5 ms and
/// the rings hold what the senders queued in between.
pub const SWITCH_PERIOD_US: u64 = 10_000;

/// Which cgroup interface the machine offers for CPU quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1 with the cpu controller mounted here (e.g. `/sys/fs/cgroup/cpu`).
    V1(PathBuf),
    /// cgroup v2 (unified) with the cpu controller available at its root.
    V2(PathBuf),
}

impl Hierarchy {
    /// Finds the cpu controller: v1 `cpu` (or `cpu,cpuacct`) mount first, then v2.
    pub fn detect() -> Result<Hierarchy> {
        for dir in ["cpu", "cpu,cpuacct"] {
            let p = Path::new(CGROUP_ROOT).join(dir);
            if p.join("cpu.cfs_quota_us").exists() {
                return Ok(Hierarchy::V1(p));
            }
        }
        let root = Path::new(CGROUP_ROOT);
        let controllers =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "cpu") {
            return Ok(Hierarchy::V2(root.to_owned()));
        }
        bail!(
            "a tenant sets `cpu_cores` but no cgroup cpu controller is available (neither \
             v1 {CGROUP_ROOT}/cpu nor v2 with `cpu` in {CGROUP_ROOT}/cgroup.controllers): \
             mount one or remove `cpu_cores` from the scenario"
        )
    }

    fn lab_dir(&self) -> PathBuf {
        match self {
            Hierarchy::V1(p) | Hierarchy::V2(p) => p.join(LAB_DIR),
        }
    }
}

/// CFS quota in us per `period_us` for `cores` cores (at least 1 ms, the kernel's floor).
pub fn quota_us(cores: f64, period_us: u64) -> u64 {
    ((cores * period_us as f64).round() as u64).max(1000)
}

/// The CFS period of the group of `tenant` ([`SWITCH`] for a switch's), us.
fn period_us(tenant: &str) -> u64 {
    if tenant == SWITCH {
        SWITCH_PERIOD_US
    } else {
        PERIOD_US
    }
}

/// v1 `cpu.shares` for an allocation of `cores` cores: 1024 a core, as Kubernetes maps CPU
/// requests, so that under contention the fair scheduler splits the machine in proportion to
/// the allocations and every tenant gets its quota (equal default shares would give a
/// 0.65-core tenant a third of what two 0.4-core neighbours and it compete for).
pub fn shares(cores: f64) -> u64 {
    ((cores * 1024.0).round() as u64).clamp(2, 262_144)
}

/// v2 `cpu.weight` for `cores` cores: 100 a core (the default weight is one core's).
pub fn weight(cores: f64) -> u64 {
    ((cores * 100.0).round() as u64).clamp(1, 10_000)
}

/// The kernel's CFS bandwidth slice, us: the runtime a CPU's queue takes from a group's pool
/// at a time (default 5 ms).
const BANDWIDTH_SLICE: &str = "/proc/sys/kernel/sched_cfs_bandwidth_slice_us";
/// The slice the lab runs with while tenants have CPU budgets.
const FINE_SLICE_US: u64 = 1_000;

/// A finer CFS bandwidth slice for the length of a run, restored when dropped. With 5 ms
/// slices, a group's budget of a few ms per 10 ms period is taken whole by the first CPU a
/// thread runs on and stranded there when it moves (measured in cpu-steal: the victim used
/// 5.8 ms of its 6.5 ms a period, 6.2 ms with 1 ms slices). A host setting, the same in
/// every mode.
#[derive(Debug)]
pub struct FineBandwidthSlice {
    restore_us: u64,
}

impl FineBandwidthSlice {
    /// Sets the slice to 1 ms if some tenant of `scenario` (or its switch) has `cpu_cores` and the slice is
    /// coarser; None otherwise, or with a warning if it cannot be changed.
    pub fn for_scenario(scenario: &Scenario) -> Option<FineBandwidthSlice> {
        if scenario.tenants.iter().all(|t| t.cpu_cores.is_none())
            && scenario.picnic.cpu_cores.is_none()
        {
            return None;
        }
        let current: u64 = std::fs::read_to_string(BANDWIDTH_SLICE)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        if current <= FINE_SLICE_US {
            return None;
        }
        match std::fs::write(BANDWIDTH_SLICE, FINE_SLICE_US.to_string()) {
            Ok(()) => {
                eprintln!(
                    "[lab {}] kernel.sched_cfs_bandwidth_slice_us {current} -> {FINE_SLICE_US} \
                     for this run (tenant CPU budgets of a few ms a period)",
                    scenario.name
                );
                Some(FineBandwidthSlice {
                    restore_us: current,
                })
            }
            Err(e) => {
                eprintln!(
                    "picnic lab: warning: {BANDWIDTH_SLICE}: {e} (tenant CPU budgets keep the \
                     kernel's {current} us slices)"
                );
                None
            }
        }
    }
}

impl Drop for FineBandwidthSlice {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(BANDWIDTH_SLICE, self.restore_us.to_string()) {
            eprintln!("picnic lab: warning: restoring {BANDWIDTH_SLICE}: {e}");
        }
    }
}

/// The v2 `cpu.max` line for `cores` cores per `period_us`.
pub fn cpu_max_line(cores: f64, period_us: u64) -> String {
    format!("{} {period_us}", quota_us(cores, period_us))
}

/// The name a switch's group goes by in [`Placement`] (no tenant name has brackets).
pub const SWITCH: &str = "[switch]";

/// One tenant's group on one host, or ([`SWITCH`]) the group of the host's switch.
#[derive(Debug, Clone)]
pub struct TenantGroup {
    /// Tenant name, or [`SWITCH`].
    pub tenant: String,
    /// Host name.
    pub host: String,
    /// The tenant's allocation, cores.
    pub cores: f64,
    /// The group's folder.
    pub dir: PathBuf,
    /// File a thread id is written to (`tasks` in v1, `cgroup.threads` in v2).
    threads_file: PathBuf,
}

impl TenantGroup {
    /// Moves the calling thread into the group (threads it spawns later inherit it).
    pub fn enter(&self) -> Result<()> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        write(&self.threads_file, &tid.to_string())
            .with_context(|| format!("placing a thread of tenant {}", self.tenant))
    }
}

/// The groups of one run; removed when dropped.
#[derive(Debug)]
pub struct Placement {
    hierarchy: Option<Hierarchy>,
    /// v2: the run's threaded domain, and the group the process came from.
    v2_domain: Option<(PathBuf, PathBuf)>,
    groups: Vec<TenantGroup>,
}

impl Placement {
    /// No placement (no tenant sets `cpu_cores`).
    pub fn none() -> Placement {
        Placement {
            hierarchy: None,
            v2_domain: None,
            groups: Vec::new(),
        }
    }

    /// Creates a group per tenant with `cpu_cores` and host it has VMs on, and one per host
    /// for its switch with `picnic.cpu_cores`, named after `run_id`; nothing when nobody
    /// asks for one. Removes groups of dead runs first.
    pub fn create(scenario: &Scenario, run_id: &str) -> Result<Placement> {
        let mut wanted: Vec<(&str, &str, f64)> = Vec::new();
        if let Some(cores) = scenario.picnic.cpu_cores {
            wanted.extend(scenario.hosts.iter().map(|h| (SWITCH, h.as_str(), cores)));
        }
        for t in &scenario.tenants {
            let Some(cores) = t.cpu_cores else { continue };
            for h in &scenario.hosts {
                if t.vms.iter().any(|v| &v.host == h) {
                    wanted.push((t.name.as_str(), h.as_str(), cores));
                }
            }
        }
        if wanted.is_empty() {
            return Ok(Placement::none());
        }
        let hierarchy = Hierarchy::detect()?;
        cleanup_stale(&hierarchy)?;
        let lab = hierarchy.lab_dir();
        mkdir(&lab)?;
        let mut placement = Placement {
            hierarchy: Some(hierarchy.clone()),
            v2_domain: None,
            groups: Vec::new(),
        };
        let run_dir = lab.join(format!("{}{run_id}", netns::PREFIX));
        match &hierarchy {
            Hierarchy::V1(_) => {
                for (i, (tenant, host, cores)) in wanted.iter().enumerate() {
                    let dir = lab.join(format!("{}{run_id}-t{i}", netns::PREFIX));
                    mkdir(&dir)?;
                    placement.groups.push(TenantGroup {
                        tenant: tenant.to_string(),
                        host: host.to_string(),
                        cores: *cores,
                        threads_file: dir.join("tasks"),
                        dir: dir.clone(),
                    });
                    let period = period_us(tenant);
                    write(&dir.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(
                        &dir.join("cpu.cfs_quota_us"),
                        &quota_us(*cores, period).to_string(),
                    )?;
                    write(&dir.join("cpu.shares"), &shares(*cores).to_string())?;
                }
            }
            Hierarchy::V2(root) => {
                write(&root.join("cgroup.subtree_control"), "+cpu")?;
                write(&lab.join("cgroup.subtree_control"), "+cpu")?;
                mkdir(&run_dir)?;
                let home = own_v2_group(root)?;
                write(
                    &run_dir.join("cgroup.procs"),
                    &std::process::id().to_string(),
                )?;
                placement.v2_domain = Some((run_dir.clone(), home));
                write(&run_dir.join("cgroup.subtree_control"), "+cpu")?;
                for (i, (tenant, host, cores)) in wanted.iter().enumerate() {
                    let dir = run_dir.join(format!("t{i}"));
                    mkdir(&dir)?;
                    placement.groups.push(TenantGroup {
                        tenant: tenant.to_string(),
                        host: host.to_string(),
                        cores: *cores,
                        threads_file: dir.join("cgroup.threads"),
                        dir: dir.clone(),
                    });
                    write(&dir.join("cgroup.type"), "threaded")?;
                    write(
                        &dir.join("cpu.max"),
                        &cpu_max_line(*cores, period_us(tenant)),
                    )?;
                    write(&dir.join("cpu.weight"), &weight(*cores).to_string())?;
                }
            }
        }
        Ok(placement)
    }

    /// The group of `tenant` on `host`, if it has one.
    pub fn group(&self, tenant: &str, host: &str) -> Option<&TenantGroup> {
        self.groups
            .iter()
            .find(|g| g.tenant == tenant && g.host == host)
    }

    /// Every group, in creation order.
    pub fn groups(&self) -> &[TenantGroup] {
        &self.groups
    }

    /// Moves every thread back out and removes the groups.
    pub fn remove(&mut self) -> Result<()> {
        let Some(h) = &self.hierarchy else {
            return Ok(());
        };
        let mut first_err = None;
        let parent_tasks = match h {
            Hierarchy::V1(p) => Some(p.join("tasks")),
            Hierarchy::V2(_) => None,
        };
        for g in self.groups.drain(..).rev() {
            // v1: threads still inside (a stuck workload) go back to the root group.
            if let Some(root_tasks) = &parent_tasks {
                for tid in std::fs::read_to_string(&g.threads_file)
                    .unwrap_or_default()
                    .lines()
                {
                    let _ = write(root_tasks, tid);
                }
            }
            if let Err(e) = rmdir(&g.dir) {
                first_err.get_or_insert(e);
            }
        }
        if let Some((run_dir, home)) = self.v2_domain.take() {
            let back = write(&home.join("cgroup.procs"), &std::process::id().to_string())
                .and_then(|()| rmdir(&run_dir));
            if let Err(e) = back {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("picnic lab: removing cgroups: {e:#}");
        }
    }
}

/// The v2 group the process is in (`0::/path` in /proc/self/cgroup).
fn own_v2_group(root: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| anyhow!("/proc/self/cgroup has no cgroup v2 entry"))?;
    Ok(root.join(rel.trim_start_matches('/')))
}

/// Removes lab groups whose creating process is gone (`pn-<pid>x<n>-...` names only).
pub fn cleanup_stale(h: &Hierarchy) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(h.lab_dir()) else {
        return Ok(removed);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let with_role = format!("{name}-");
        let Some(pid) = netns::creator_pid(&with_role) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        // v2 run folders hold the tenant groups: children go first.
        if let Ok(children) = std::fs::read_dir(&dir) {
            for c in children.flatten().filter(|c| c.path().is_dir()) {
                rmdir(&c.path())?;
            }
        }
        rmdir(&dir)?;
        removed.push(dir);
    }
    Ok(removed)
}

fn mkdir(p: &Path) -> Result<()> {
    match std::fs::create_dir(p) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(anyhow!("creating cgroup {}: {e}", p.display()))
        }
        _ => Ok(()),
    }
}

fn rmdir(p: &Path) -> Result<()> {
    std::fs::remove_dir(p).with_context(|| format!("removing cgroup {}", p.display()))
}

fn write(p: &Path, value: &str) -> Result<()> {
    std::fs::write(p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_scale_with_cores_and_respect_the_floor() {
        assert_eq!(quota_us(0.5, PERIOD_US), 50_000);
        assert_eq!(quota_us(2.0, PERIOD_US), 200_000);
        assert_eq!(quota_us(0.001, PERIOD_US), 1000);
        assert_eq!(quota_us(0.05, SWITCH_PERIOD_US), 1000);
        assert_eq!(cpu_max_line(0.25, PERIOD_US), "25000 100000");
        assert_eq!(period_us(SWITCH), SWITCH_PERIOD_US);
        assert_eq!(cpu_max_line(0.25, period_us(SWITCH)), "2500 10000");
        assert_eq!(shares(0.65), 666);
        assert_eq!(shares(0.4), 410);
        assert_eq!(weight(0.65), 65);
        assert_eq!(weight(1.0), 100);
    }

    #[test]
    fn stale_names_parse_like_namespaces() {
        // A v1 tenant group and a v2 run folder both carry the creator pid.
        assert_eq!(netns::creator_pid("pn-77x3-t0-"), Some("77"));
        assert_eq!(netns::creator_pid("pn-77x3-"), Some("77"));
        assert_eq!(netns::creator_pid("other-"), None);
    }
}
