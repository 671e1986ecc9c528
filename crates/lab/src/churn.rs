//! A scenario's `[churn]`: VMs added, moved and removed through etcd while the workloads
//! run (issue 33), as an operator's `picnic ctl vm move|rm|add` would, with the same
//! records. Each move first moves the VM's port (the veth's host end) to the new host's
//! namespace, as a migrated VM's interface arrives before the control plane re-homes it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use etcd_client::Client;
use picnic_control::cluster::{key, Kind};
use picnic_control::store::{self, Expect};
use picnic_netns as netns;
use picnic_scenario::plan::{HostView, Topology, VmView};
use picnic_scenario::{Churn, ChurnOutcome, Scenario};
use picnic_switch::config::{VmEntry, CONTROL_PREFIX};

use crate::control::LabControl;

/// How long a moved or added VM has to answer its tenant's first VM.
pub const FOLLOW_WITHIN: Duration = Duration::from_secs(1);

/// Where a churned VM is: its port's host (index into the topology's hosts), and whether
/// etcd has it.
#[derive(Clone, Copy)]
struct Place {
    host: usize,
    in_etcd: bool,
}

/// The churn running on a thread of its own.
pub struct ChurnRun {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<ChurnOutcome>>,
}

impl ChurnRun {
    /// Starts churning `churn.tenant`'s VMs on `topo` through `control`.
    pub fn start(
        scenario: &Scenario,
        churn: &Churn,
        topo: &Topology,
        control: Arc<LabControl>,
    ) -> Result<ChurnRun> {
        let tenant = scenario
            .tenants
            .iter()
            .find(|t| t.name == churn.tenant)
            .context("churn.tenant")?;
        let view = |name: &str| topo.vm(name).cloned().context("churned VM not built");
        let anchor = view(&tenant.vms[0].name)?;
        let vms: Vec<VmView> = tenant.vms[1..]
            .iter()
            .map(|v| view(&v.name))
            .collect::<Result<_>>()?;
        let hosts = topo.hosts.clone();
        let interval = Duration::from_millis(churn.interval_ms);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("picnic-churn".into())
            .spawn(move || run(&control, &hosts, &anchor, &vms, interval, &stopped))?;
        Ok(ChurnRun { stop, thread })
    }

    /// Stops after the change under way; what the churn did.
    pub fn finish(self) -> Result<ChurnOutcome> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the churn thread panicked"))?
    }
}

fn run(
    control: &LabControl,
    hosts: &[HostView],
    anchor: &VmView,
    vms: &[VmView],
    interval: Duration,
    stop: &AtomicBool,
) -> Result<ChurnOutcome> {
    let home = |vm: &VmView| hosts.iter().position(|h| h.name == vm.host).unwrap_or(0);
    let mut places: Vec<Place> = vms
        .iter()
        .map(|v| Place {
            host: home(v),
            in_etcd: true,
        })
        .collect();
    // One client for the whole churn, as an operator's session would keep.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut client = rt.block_on(store::connect(&control.endpoints()))?;
    // The records as the lab put them: an add puts the VM's back.
    let originals: Vec<VmEntry> = rt.block_on(async {
        let snap = store::load(&mut client, CONTROL_PREFIX).await?;
        vms.iter()
            .map(|v| {
                snap.cluster
                    .vms
                    .get(&v.name)
                    .cloned()
                    .with_context(|| format!("VM {} is not in etcd", v.name))
            })
            .collect::<Result<_>>()
    })?;
    let mut change = |name: &str, record: Option<&VmEntry>| {
        rt.block_on(write(&mut client, name, record))
            .with_context(|| format!("churn: VM {name}"))
    };
    let mut out = ChurnOutcome::default();
    let start = Instant::now();
    for step in 0.. {
        // A steady rate: change k starts at k intervals, or after change k-1 if that took longer.
        let due = start + interval * step;
        while Instant::now() < due {
            if stop.load(Ordering::Relaxed) {
                return Ok(out);
            }
            std::thread::sleep(Duration::from_millis(5).min(due - Instant::now()));
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(out);
        }
        let i = step as usize % vms.len();
        let (vm, place) = (&vms[i], places[i]);
        let mut record = originals[i].clone();
        let follow = match (place.in_etcd, place.host == home(vm)) {
            // At home: moves to the next host.
            (true, true) => {
                let to = (place.host + 1) % hosts.len();
                move_port(vm, &hosts[place.host], &hosts[to])?;
                record.host = to as u32 + 1;
                places[i] = Place {
                    host: to,
                    in_etcd: true,
                };
                change(&vm.name, Some(&record))?;
                true
            }
            // Moved: removed (its port stays where it is).
            (true, false) => {
                places[i].in_etcd = false;
                change(&vm.name, None)?;
                false
            }
            // Removed: added back at home.
            (false, _) => {
                if place.host != home(vm) {
                    move_port(vm, &hosts[place.host], &hosts[home(vm)])?;
                }
                places[i] = Place {
                    host: home(vm),
                    in_etcd: true,
                };
                change(&vm.name, Some(&record))?;
                true
            }
        };
        out.changes += 1;
        if follow {
            let written = Instant::now();
            if answers(anchor, vm) {
                let ms = written.elapsed().as_secs_f64() * 1e3;
                out.follow_ms_max = out.follow_ms_max.max(ms);
            } else {
                out.unreachable += 1;
            }
        }
    }
    Ok(out)
}

/// Moves `vm`'s port from host `from`'s namespace to host `to`'s, up there.
fn move_port(vm: &VmView, from: &HostView, to: &HostView) -> Result<()> {
    netns::ip(
        &from.ns,
        &["link", "set", "dev", &vm.host_port, "netns", &to.ns],
    )?;
    netns::ip(&to.ns, &["link", "set", "dev", &vm.host_port, "up"])?;
    Ok(())
}

/// Puts (Some) or removes (None) VM `name`'s record, as `picnic ctl` does: only if it is as
/// the churn left it.
async fn write(client: &mut Client, name: &str, record: Option<&VmEntry>) -> Result<i64> {
    let p = CONTROL_PREFIX;
    let snap = store::load(client, p).await?;
    let at = snap.versions.get(&key(p, Kind::Vm, name)).copied();
    match (record, at) {
        (Some(r), Some(at)) => store::put(client, p, Kind::Vm, name, r, Expect::At(at)).await,
        (Some(r), None) => store::put(client, p, Kind::Vm, name, r, Expect::Absent).await,
        (None, Some(at)) => store::delete(client, p, Kind::Vm, name, at).await,
        (None, None) => Err(anyhow!("VM {name} is not in etcd to remove")),
    }
}

/// Whether `vm` answers a ping from `anchor` within [`FOLLOW_WITHIN`] (echo requests every
/// 20 ms until the first reply).
fn answers(anchor: &VmView, vm: &VmView) -> bool {
    let deadline = FOLLOW_WITHIN.as_secs().to_string();
    let ip = vm.ip.to_string();
    netns::cmd(
        "ip",
        &[
            "netns", "exec", &anchor.ns, "ping", "-q", "-c", "1", "-i", "0.02", "-w", &deadline,
            &ip,
        ],
    )
    .is_ok()
}
