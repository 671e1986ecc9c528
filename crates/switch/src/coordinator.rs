//! The run loop with several workers ([`crate::workers`]): the calling thread splits the
//! switch into workers (engines, ports, frame pools), runs each on a thread of its own, and
//! coordinates: it merges their snapshots for the API every 100 ms, writes the tenants'
//! cgroup quotas every Iron period from the CPU all workers charged, and applies API changes.
//! A change pauses the workers (they return their state); a change of VM rates only is
//! applied to every worker's engine in place, anything else rebuilds the switch as the single
//! loop does ([`Switch::reconfigure`]) and splits it again.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use picnic_core::Duration;

use crate::cgroup::CpuQuota;
use crate::config::Config;
use crate::engine::{iron_quota, pacer_rate, Engine, SloReport, IRON_PERIOD};
use crate::frame::FramePool;
use crate::port::Port;
use crate::runner::{setup_thread, Command, Published, SpinWork, Switch};
use crate::worker::{Team, Worker};
use crate::workers::{assign, Mailbox, SharedBudgets};

/// Frames a worker's mailbox holds.
const MAILBOX_FRAMES: usize = 4096;

/// Why the workers were stopped.
enum Outcome {
    Stop,
    Command(Command),
}

impl Switch {
    /// [`Switch::run`] with `self.workers > 1` workers.
    pub(crate) fn run_workers(&mut self) -> anyhow::Result<()> {
        self.shared.set_config(self.cfg.clone());
        let mut cgroups = self.open_cgroups()?;
        let mut crew: Option<(Team, Vec<Worker>)> = None;
        let result = loop {
            let (team, workers) = match crew.take() {
                Some(c) => c,
                None => self.split()?,
            };
            team.pause.store(false, Ordering::SeqCst);
            let (mut workers, outcome, error) = self.run_crew(&team, workers, &mut cgroups);
            self.publish_merged(&team);
            if let Some(e) = error {
                self.join_back(workers);
                break Err(e);
            }
            match outcome {
                Outcome::Stop => {
                    self.join_back(workers);
                    break Ok(());
                }
                Outcome::Command(Command::Reconfigure(cfg, reply)) => {
                    match self.rates_in_place(&cfg, &mut workers) {
                        Some(result) => {
                            let _ = reply.send(result);
                            crew = Some((team, workers));
                        }
                        None => {
                            self.join_back(workers);
                            let _ = reply.send(self.reconfigure(*cfg));
                        }
                    }
                }
            }
        };
        self.cgroups = cgroups;
        self.release_cgroups();
        result
    }

    /// Splits the switch into its workers: VMs assigned ([`assign`]), worker 0 takes the
    /// switch's engine, the others new ones (with the feedback key), each a share of the frame
    /// pool, its VMs' ports and its uplink socket.
    fn split(&mut self) -> anyhow::Result<(Team, Vec<Worker>)> {
        let n = self.workers;
        let now = self.clock.now();
        let assignment = assign(&self.engine.dir, n);
        let quotas: Vec<Option<Duration>> = self
            .engine
            .dir
            .tenants
            .iter()
            .map(|t| iron_quota(t).filter(|_| self.cfg.isolation.cpu_accounting))
            .collect();
        let mut budgets = SharedBudgets::new(&quotas, IRON_PERIOD, n, now);
        if let Some((rate, burst)) = pacer_rate(&self.cfg) {
            // The uplink pacer every worker's egress shares.
            budgets = budgets.with_link(rate, burst, now, n);
        }
        let budgets = Arc::new(budgets);
        let mailboxes = (0..n)
            .map(|_| Mailbox::new(MAILBOX_FRAMES))
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut ports: Vec<Option<Box<dyn Port>>> = std::mem::take(&mut self.ports);
        let mut uplinks: Vec<Option<Box<dyn Port>>> = std::iter::once(ports[0].take())
            .chain(self.extra_uplinks.drain(..).map(Some))
            .collect();
        let frames = self.cfg.switch.frame_pool;
        // The workers' pools replace the switch's (given back by `join_back`).
        self.pool = FramePool::new(0);
        let mut workers = Vec::with_capacity(n);
        for w in 0..n {
            let mut engine = if w == 0 {
                std::mem::replace(&mut self.engine, Engine::new(&self.cfg, now)?)
            } else {
                let mut e = Engine::new(&self.cfg, now)?;
                if let Some(key) = &self.feedback_key {
                    e.set_feedback_key(key, self.clock.wall_at_zero_ns())
                        .map_err(|e| anyhow::anyhow!("switch.feedback_key_file: {e}"))?;
                }
                e
            };
            engine.join_workers(budgets.clone(), w);
            let mut mine: Vec<Option<Box<dyn Port>>> = (0..ports.len()).map(|_| None).collect();
            mine[0] = uplinks.get_mut(w).and_then(Option::take);
            for p in assignment.ports_of(w) {
                mine[p] = ports[p].take();
            }
            let pool = FramePool::with_limit(frames / n, frames);
            workers.push(Worker::new(w, engine, mine, pool));
        }
        let team = Team {
            assignment,
            mailboxes,
            budgets,
            published: (0..n).map(|_| ArcSwapOption::empty()).collect(),
            pause: Default::default(),
        };
        Ok((team, workers))
    }

    /// Gives the workers' state back to the switch: ports to their places, every engine's
    /// counters folded into worker 0's, which becomes the switch's engine again. Frames queued
    /// in the workers are dropped with their pools (as a rebuild drops the old engine's).
    fn join_back(&mut self, workers: Vec<Worker>) {
        let now = self.clock.now();
        let mut engines = Vec::with_capacity(workers.len());
        let mut ports: Vec<Option<Box<dyn Port>>> = Vec::new();
        for mut w in workers {
            if ports.is_empty() {
                ports = (0..w.ports.len()).map(|_| None).collect();
            }
            for (p, port) in w.ports.iter_mut().enumerate() {
                match (p, port.take()) {
                    (_, None) => {}
                    (0, Some(up)) if w.index > 0 => self.extra_uplinks.push(up),
                    (p, Some(port)) => ports[p] = Some(port),
                }
            }
            w.engine.leave_workers(now);
            w.engine.release_frames(&mut w.pool);
            engines.push(w.engine);
        }
        let mut engines = engines.into_iter();
        let mut first = engines.next().expect("at least one worker");
        for e in engines {
            for (mine, theirs) in first.vm_counters.iter_mut().zip(&e.vm_counters) {
                mine.add_all(theirs);
            }
            first.counters.add_all(&e.counters);
        }
        self.engine = first;
        self.ports = ports;
        self.pool = FramePool::new(self.cfg.switch.frame_pool);
    }

    /// Runs the workers until a stop, a worker's error or an API change; returns their state,
    /// why they stopped and the first error.
    fn run_crew(
        &self,
        team: &Team,
        workers: Vec<Worker>,
        cgroups: &mut [Option<(std::path::PathBuf, CpuQuota)>],
    ) -> (Vec<Worker>, Outcome, Option<anyhow::Error>) {
        let batch = self.cfg.switch.batch;
        let spin = Duration::from_micros(self.cfg.switch.spin_us);
        let n = workers.len();
        // Each worker on a CPU of its own when `switch.cpus` lists enough, else on all of them.
        let cpus_of = |w: usize| -> Option<Vec<usize>> {
            let cpus = self.cfg.switch.cpus.as_ref()?;
            Some(if cpus.len() >= n {
                vec![cpus[w]]
            } else {
                cpus.clone()
            })
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .into_iter()
                .map(|mut w| {
                    let cpus = cpus_of(w.index);
                    let mut work = SpinWork::new(&self.cfg);
                    let (stop, clock, cfg) = (&*self.stop, self.clock, &self.cfg);
                    std::thread::Builder::new()
                        .name(format!("picnic-w{}", w.index))
                        .spawn_scoped(s, move || {
                            let r = setup_thread(cfg, cpus.as_deref())
                                .and_then(|_| w.run(team, stop, clock, batch, spin, &mut work));
                            (w, r)
                        })
                        .expect("spawn a worker thread")
                })
                .collect();
            let outcome = self.coordinate(team, cgroups, &handles);
            team.pause.store(true, Ordering::SeqCst);
            team.kick_all();
            let mut back = Vec::with_capacity(n);
            let mut error = None;
            for h in handles {
                let (w, r) = h.join().expect("a worker panicked");
                if let Err(e) = r {
                    error.get_or_insert(e.context(format!("worker {}", w.index)));
                }
                back.push(w);
            }
            (back, outcome, error)
        })
    }

    /// The coordinator's loop while the workers run.
    fn coordinate<T>(
        &self,
        team: &Team,
        cgroups: &mut [Option<(std::path::PathBuf, CpuQuota)>],
        handles: &[std::thread::ScopedJoinHandle<'_, T>],
    ) -> Outcome {
        let start = self.clock.now();
        let (mut next_publish, mut next_period) = (start, start + IRON_PERIOD);
        let mut charged_before: Vec<u64> = team
            .budgets
            .charged
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        loop {
            if self.stop.load(Ordering::Relaxed) || handles.iter().any(|h| h.is_finished()) {
                return Outcome::Stop;
            }
            let now = self.clock.now();
            if now >= next_publish {
                next_publish = now + Duration::from_millis(100);
                self.publish_merged(team);
            }
            if now >= next_period {
                next_period = now + IRON_PERIOD;
                self.refill_cgroups(team, cgroups, &mut charged_before);
            }
            // Without cgroups to refill, the coordinator wakes only to publish.
            if cgroups.iter().all(Option::is_none) {
                next_period = next_publish;
            }
            let wait = std::time::Duration::from_nanos(
                (next_publish.min(next_period).saturating_since(now)).as_nanos(),
            );
            match &self.commands {
                Some(rx) => match rx.recv_timeout(wait) {
                    Ok(cmd) => return Outcome::Command(cmd),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
                },
                None => std::thread::sleep(wait),
            }
        }
    }

    /// Iron 3.2 with several workers: each tenant's cgroup gets its allocation minus the switch
    /// CPU every worker charged to it in the period that ended.
    fn refill_cgroups(
        &self,
        team: &Team,
        cgroups: &mut [Option<(std::path::PathBuf, CpuQuota)>],
        charged_before: &mut [u64],
    ) {
        for (t, tenant) in self.cfg.tenants.iter().enumerate() {
            let total = team.budgets.charged[t].load(Ordering::Relaxed);
            let used = total - charged_before[t];
            charged_before[t] = total;
            let (Some(Some((_, group))), Some(cores)) = (cgroups.get_mut(t), tenant.cpu_quota)
            else {
                continue;
            };
            let allocation = (IRON_PERIOD.as_nanos() as f64 * cores) as u64;
            let quota = Duration::from_nanos(allocation.saturating_sub(used));
            if let Err(e) = group.refill(quota, Duration::ZERO) {
                eprintln!("picnic switch: warning: {e:#}");
            }
        }
    }

    /// A live change that opens or closes no port, applied to every worker's engine in place
    /// (each holds the whole directory; no other tenant's state is touched, as in the single
    /// loop); None when it needs ports opened or closed, which the switch does with the
    /// workers joined.
    fn rates_in_place(
        &mut self,
        cfg: &Config,
        workers: &mut [Worker],
    ) -> Option<anyhow::Result<()>> {
        if let Err(e) = cfg.validate() {
            return Some(Err(e.into()));
        }
        let changes = match crate::change::diff(&self.cfg, cfg) {
            Ok(c) => c,
            Err(e) => return Some(Err(anyhow::Error::msg(e))),
        };
        let ports = |c: &crate::change::Change| {
            matches!(
                c,
                crate::change::Change::AddVm(_) | crate::change::Change::RemoveVm(_)
            )
        };
        if changes.iter().any(ports) || crate::workers::encrypts(cfg) {
            return None;
        }
        let now = self.clock.now();
        for w in workers.iter_mut() {
            for change in &changes {
                if let Err(e) = w.engine.apply(now, change, &mut w.pool) {
                    return Some(Err(anyhow::Error::msg(e)));
                }
            }
        }
        self.shared.set_config(cfg.clone());
        self.cfg = cfg.clone();
        Some(Ok(()))
    }

    /// The workers and their VMs, for the start-up report ([`Switch::describe_ports`]).
    pub(crate) fn describe_workers(&self, lines: &mut Vec<String>) {
        if self.workers > 1 {
            let assignment = crate::workers::assign(&self.engine.dir, self.workers);
            let dir = &self.engine.dir;
            for w in 0..self.workers {
                let vms: Vec<&str> = assignment
                    .ports_of(w)
                    .filter_map(|p| dir.port_vm[p].map(|v| dir.vms[v].name.as_str()))
                    .collect();
                lines.push(format!("worker {w}: VMs {vms:?}"));
            }
            if self.extra_uplinks.is_empty() {
                lines.push("uplink: one socket, read by worker 0, which hands the other workers their frames".into());
            }
        }
    }

    /// Publishes the merge of every worker's latest snapshot.
    fn publish_merged(&self, team: &Team) {
        let parts: Vec<Arc<Published>> = team
            .published
            .iter()
            .filter_map(|p| p.load_full())
            .collect();
        if !parts.is_empty() {
            self.shared
                .publish(merge(&parts, self.cfg.switch.frame_pool));
        }
    }
}

/// One snapshot of several workers': a VM's counters summed over the workers that counted
/// them (its frames may be handled by another worker before they reach its own), its queues
/// and rates from the worker that owns it; tenants' and switch counters summed; ports, SLO
/// tenants and workers listed from each.
pub fn merge(parts: &[Arc<Published>], frames: usize) -> Published {
    let mut switch = parts[0].switch.clone();
    let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
    for (i, vm) in switch.vms.iter().enumerate() {
        by_name.insert(vm.name.clone(), i);
    }
    for (w, part) in parts.iter().enumerate().skip(1) {
        for vm in &part.switch.vms {
            let Some(&i) = by_name.get(&vm.name) else {
                continue;
            };
            let mine = &mut switch.vms[i];
            mine.counters.add_all(&vm.counters);
            if vm.worker == w {
                mine.egress_queue = vm.egress_queue;
                mine.ingress_queue = vm.ingress_queue;
                mine.advertised_bps = vm.advertised_bps;
                mine.applied_limits = vm.applied_limits.clone();
            }
        }
        for (mine, theirs) in switch.tenants.iter_mut().zip(&part.switch.tenants) {
            mine.cost_ns += theirs.cost_ns;
            mine.cpu_throttle_drops += theirs.cpu_throttle_drops;
            mine.cpu_charged_ns += theirs.cpu_charged_ns;
            mine.softirq_ns += theirs.softirq_ns;
        }
        switch.switch.add_all(&part.switch.switch);
    }
    let slo = SloReport {
        tenants: parts
            .iter()
            .flat_map(|p| p.slo.tenants.iter().cloned())
            .collect(),
        ..parts[0].slo.clone()
    };
    Published {
        switch,
        ports: parts.iter().flat_map(|p| p.ports.iter().cloned()).collect(),
        pool_free: parts.iter().map(|p| p.pool_free).sum(),
        pool_capacity: frames,
        workers: parts
            .iter()
            .flat_map(|p| p.workers.iter().cloned())
            .collect(),
        slo,
        accel: None,
    }
}
