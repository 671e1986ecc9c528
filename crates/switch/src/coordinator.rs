//! The run loop with several workers ([`crate::workers`]): the calling thread splits the
//! switch into workers (engines, ports, frame pools), runs each on a thread of its own, and
//! coordinates: it merges their snapshots for the API every 100 ms, writes the tenants'
//! cgroup quotas every Iron period from the CPU all workers charged, and applies API changes
//! without stopping anyone: it opens a new VM's port itself, tries the changes on an engine of
//! its own that mirrors the workers' directories (so a change the engines refuse reaches no
//! worker), places the new VM and posts the changes to every worker's control queue
//! ([`crate::workers::Control`]). With softirq accounting on, it reads the ports' softirq
//! time every Iron period and charges it to the tenants' shared budgets through its engine.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use picnic_core::Duration;

use crate::accel::{Accel, AccelPort};
use crate::change::Change;
use crate::engine::{
    pacer_rate, tenant_quotas, Engine, PortChange, SharedBudgets, SloReport, IRON_PERIOD,
};
use crate::frame::FramePool;
use crate::port::Port;
use crate::runner::{
    encryption_changed, setup_thread, take_named, Command, Published, Reconfigure, SpinWork, Switch,
};
use crate::worker::{Team, Worker};
use crate::workers::{assign, pinned_cpus, Assignment, Control, Mailbox};

/// Frames a worker's mailbox holds.
const MAILBOX_FRAMES: usize = 4096;

/// How long the coordinator waits for the workers to answer a live change.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Switch {
    /// [`Switch::run`] with `self.workers > 1` workers.
    pub(crate) fn run_workers(&mut self) -> anyhow::Result<()> {
        self.shared.set_config(self.cfg.clone());
        self.cgroups = self.open_cgroups()?;
        let (team, workers, assignment) = self.split()?;
        let (workers, error) = self.run_crew(&team, workers, assignment);
        self.publish_merged(&team);
        self.join_back(workers);
        self.release_cgroups();
        error.map_or(Ok(()), Err)
    }

    /// The tenants' Iron allocations as the coordinator's engine has them (index = tenant).
    fn quotas(&self) -> Vec<Option<Duration>> {
        tenant_quotas(&self.engine.dir, self.cfg.isolation.cpu_accounting)
    }

    /// Splits the switch into its workers: VMs assigned ([`assign`]), worker 0 takes the
    /// switch's engine, the others new ones (with the feedback key), each a share of the frame
    /// pool, its VMs' ports and its uplink socket. The switch keeps a new engine for the same
    /// config, which mirrors the workers' directories through live changes.
    fn split(&mut self) -> anyhow::Result<(Team, Vec<Worker>, Assignment)> {
        let n = self.workers;
        let now = self.clock.now();
        let assignment = assign(&self.engine.dir, pinned_cpus(&self.cfg, n));
        let mut budgets = SharedBudgets::new(&self.quotas(), IRON_PERIOD, n, now);
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
            // Every engine with the key file's key and the wall clock (the config's keys
            // it has from `Engine::new`).
            let mut e = Engine::new(&self.cfg, now)?;
            e.set_feedback_key(self.feedback_key.as_deref(), self.clock.wall_at_zero_ns())
                .map_err(|e| anyhow::anyhow!("switch.feedback_key_file: {e}"))?;
            let mut engine = if w == 0 {
                std::mem::replace(&mut self.engine, e)
            } else {
                e
            };
            engine.join_workers(budgets.clone(), w);
            if w == 0 {
                // The coordinator's engine charges the ports' softirq time to the budgets.
                self.engine.join_workers(budgets.clone(), n);
            }
            let mut mine: Vec<Option<Box<dyn Port>>> = (0..ports.len()).map(|_| None).collect();
            mine[0] = uplinks.get_mut(w).and_then(Option::take);
            for p in assignment.ports_of(w) {
                mine[p] = ports[p].take();
            }
            // Every frame in some worker's pool: worker 0 takes the remainder.
            let share = frames / n + if w == 0 { frames % n } else { 0 };
            let pool = FramePool::with_limit(share, frames);
            let mut worker = Worker::new(w, engine, assignment.clone(), mine, pool);
            worker.kernel = self.kernel.for_worker(w, &assignment.owner);
            // Every worker submits to the shared engine through its own port.
            worker.accel = self.accel.as_mut().and_then(|a| a.port(w));
            workers.push(worker);
        }
        let team = Team {
            workers: n,
            mailboxes,
            budgets: ArcSwap::new(budgets),
            published: (0..n).map(|_| ArcSwapOption::empty()).collect(),
            pause: Default::default(),
            tids: (0..n).map(|_| Default::default()).collect(),
            link: (0..n).map(|_| Default::default()).collect(),
            yield_busy: self.cfg.switch.yield_busy,
        };
        Ok((team, workers, assignment))
    }

    /// Gives the workers' state back to the switch when they stop: ports to their places,
    /// every engine's counters folded into worker 0's, which becomes the switch's engine again.
    fn join_back(&mut self, workers: Vec<Worker>) {
        let now = self.clock.now();
        let mut engines = Vec::with_capacity(workers.len());
        let mut ports: Vec<Option<Box<dyn Port>>> = Vec::new();
        for mut w in workers {
            if ports.len() < w.ports.len() {
                ports.resize_with(w.ports.len(), || None);
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

    /// Runs the workers until a stop or a worker's error, applying API changes meanwhile;
    /// returns their state and the first error.
    fn run_crew(
        &mut self,
        team: &Team,
        workers: Vec<Worker>,
        mut assignment: Assignment,
    ) -> (Vec<Worker>, Option<anyhow::Error>) {
        let batch = self.cfg.switch.batch;
        let spin = Duration::from_micros(self.cfg.switch.spin_us);
        let n = workers.len();
        // Each worker on a CPU of its own when `switch.cpus` lists enough, else on all of them.
        let cpus_of: Vec<Option<Vec<usize>>> = (0..n)
            .map(|w| match assignment.cpus[w] {
                Some(cpu) => Some(vec![cpu]),
                None => self.cfg.switch.cpus.clone(),
            })
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .into_iter()
                .map(|mut w| {
                    let cpus = cpus_of[w.index].clone();
                    let mut work = SpinWork::new(&self.cfg);
                    let (stop, clock, cfg) = (self.stop.clone(), self.clock, self.cfg.clone());
                    std::thread::Builder::new()
                        .name(format!("picnic-w{}", w.index))
                        .spawn_scoped(s, move || {
                            let r = setup_thread(&cfg, cpus.as_deref(), false)
                                .and_then(|_| w.run(team, &stop, clock, batch, spin, &mut work));
                            (w, r)
                        })
                        .expect("spawn a worker thread")
                })
                .collect();
            self.coordinate(team, &mut assignment, &handles);
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
            (back, error)
        })
    }

    /// The coordinator's loop while the workers run: until a stop or a worker's end.
    fn coordinate<T>(
        &mut self,
        team: &Team,
        assignment: &mut Assignment,
        handles: &[std::thread::ScopedJoinHandle<'_, T>],
    ) {
        let start = self.clock.now();
        let (mut next_publish, mut next_period) = (start, start + IRON_PERIOD);
        let commands = self.commands.take();
        let mut threads_told = false;
        loop {
            // Every worker measures its own thread's CPU, softirq work run in it included:
            // the programs must not charge that again.
            if !threads_told {
                if let Some(tids) = team.thread_ids() {
                    self.kernel.set_dataplane_threads(&tids);
                    threads_told = true;
                }
            }
            if self.stop.load(Ordering::Relaxed) || handles.iter().any(|h| h.is_finished()) {
                break;
            }
            let now = self.clock.now();
            if now >= next_publish {
                next_publish = now + Duration::from_millis(100);
                self.publish_merged(team);
            }
            if now >= next_period {
                next_period = now + IRON_PERIOD;
                // Iron 3.1: the ports' softirq time, charged to their tenants' budgets.
                self.kernel.charge_softirq(&mut self.engine, now);
                self.refill_cgroups();
                self.split_access_link(team);
            }
            // Without cgroups to refill or softirq time to charge, the coordinator wakes only
            // to publish.
            let link_shared = self.engine.link_capacity().is_some();
            if self.cgroups.iter().all(Option::is_none) && !self.kernel.softirq_on() && !link_shared
            {
                next_period = next_publish;
            }
            let wait = std::time::Duration::from_nanos(
                (next_publish.min(next_period).saturating_since(now)).as_nanos(),
            );
            match &commands {
                Some(rx) => match rx.recv_timeout(wait) {
                    Ok(Command::Reconfigure(cfg, reply)) => {
                        let _ = reply.send(self.live_change(team, assignment, *cfg));
                    }
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
                },
                None => std::thread::sleep(wait),
            }
        }
        self.commands = commands;
    }

    /// Applies an API change while the workers run (see the module doc): nothing reaches a
    /// worker unless every new port opened and the coordinator's engine took every change.
    fn live_change(
        &mut self,
        team: &Team,
        assignment: &mut Assignment,
        change: Reconfigure,
    ) -> anyhow::Result<()> {
        let Reconfigure {
            cfg,
            changes,
            specs,
            opened: sent,
            ..
        } = self.prepare(change)?;
        // Opened by the API's thread, or here (by the port keeper, which may give back a
        // removed VM's port): setting up a port's rings takes milliseconds, no worker waits.
        let mut opened = self.open_ports(specs)?;
        opened.extend(sent);
        let now = self.clock.now();
        // A VM moved to a port another VM gives up in this change stays with that port's owner.
        let dir = &self.engine.dir;
        let given_up: Vec<(String, usize)> = changes
            .iter()
            .filter_map(|c| match c {
                Change::RemoveVm(name) => {
                    let v = dir.vm_named(name)?;
                    let p = dir.vms[v].port?;
                    let ifname = self
                        .cfg
                        .vms
                        .iter()
                        .find(|e| &e.name == name)?
                        .port
                        .as_ref()?;
                    Some((ifname.ifname.clone(), assignment.owner.get(p).copied()?))
                }
                _ => None,
            })
            .collect();
        // Tenants that encrypt, and their keys, as the new config says: a new engine with a
        // port per worker, built before anything changes (a key that cannot be read stops
        // the change here).
        let new_accel = if encryption_changed(&self.cfg, &cfg) {
            Some(Accel::from_config_after(
                &cfg,
                self.accel.as_ref(),
                team.workers,
            )?)
        } else {
            None
        };
        let mut added: Vec<(usize, String)> = Vec::new();
        self.engine.apply_all(
            now,
            &self.cfg,
            &changes,
            &mut FramePool::new(0),
            |port, change| {
                if let (PortChange::Opened(slot), Change::AddVm(vm)) = (port, change) {
                    added.push((slot, vm.port.as_ref().expect("local VM").ifname.clone()));
                }
            },
        )?;
        let n = team.workers;
        let mut placed: Vec<Vec<Box<dyn Port>>> = (0..n).map(|_| Vec::new()).collect();
        for (slot, ifname) in added {
            let w = match given_up.iter().find(|(name, _)| *name == ifname) {
                Some(&(_, w)) => {
                    assignment.owner.resize(self.engine.dir.port_count(), 0);
                    assignment.owner[slot] = w;
                    w
                }
                None => assignment.place(&self.engine.dir, slot),
            };
            placed[w].extend(take_named(&mut opened, &ifname));
        }
        assignment
            .owner
            .resize(self.engine.dir.port_count().max(assignment.owner.len()), 0);
        let budgets = team
            .budgets
            .load()
            .after_change(&self.quotas(), IRON_PERIOD, n, now)
            .map(Arc::new);
        let (old, changes) = (Arc::new(self.cfg.clone()), Arc::new(changes));
        let owner = Arc::new(assignment.owner.clone());
        // The old engine's workers stop first, so that each worker's port gives back every
        // frame of its jobs when it takes the new one.
        let mut old_accel = None;
        let mut accel_ports: Option<Vec<Option<AccelPort>>> = None;
        if let Some(mut accel) = new_accel {
            if let Some(old) = self.accel.as_mut() {
                old.stop();
            }
            accel_ports = Some(
                (0..n)
                    .map(|w| accel.as_mut().and_then(|a| a.port(w)))
                    .collect(),
            );
            self.shared.set_accel_keys(accel.as_ref().map(Accel::keys));
            old_accel = std::mem::replace(&mut self.accel, accel);
        }
        let (tx, answers) = mpsc::channel();
        for (w, ports) in placed.into_iter().enumerate() {
            team.mailboxes[w].control(Control {
                old: old.clone(),
                changes: changes.clone(),
                ports,
                owner: owner.clone(),
                budgets: budgets.clone(),
                accel: accel_ports.as_mut().map(|p| p[w].take()),
                reply: tx.clone(),
            });
        }
        let mut failed = Vec::new();
        let mut closed = Vec::new();
        for _ in 0..n {
            match answers.recv_timeout(ANSWER_WAIT) {
                Ok(a) => {
                    closed.extend(a.closed);
                    if let Err(e) = a.result {
                        failed.push(format!("worker {}: {e}", a.worker));
                    }
                }
                Err(_) => {
                    failed.push("a worker did not answer (it stopped)".into());
                    break;
                }
            }
        }
        if !closed.is_empty() {
            self.close_ports(closed);
        }
        // The workers took their jobs back from the old engine: nothing of theirs is left.
        if let Some(old) = old_accel {
            old.shutdown(&mut Vec::new());
        }
        if let Some(b) = budgets {
            self.engine.leave_workers(now);
            self.engine.join_workers(b.clone(), n);
            team.budgets.store(b);
        }
        let old = std::mem::replace(&mut self.cfg, cfg);
        self.shared.set_config(self.cfg.clone());
        if let Err(e) = self.kernel.set_ports(&self.vm_ports()) {
            tracing::warn!("softirq accounting: {e}");
        }
        if crate::workers::wants_softirq(&self.cfg) {
            let tids = team.thread_ids().unwrap_or_default();
            self.kernel.start_softirq(&self.vm_ports(), &tids);
        }
        self.sync_cgroups(&old)?;
        if !failed.is_empty() {
            anyhow::bail!(
                "the coordinator's engine took the change but {}: that worker's engine may differ from the running config",
                failed.join("; ")
            );
        }
        Ok(())
    }

    /// EyeQ's RX scheduler across the workers' link receivers: each gets its part of the
    /// access link by what it reported ([`crate::engine::split_link`]).
    fn split_access_link(&self, team: &Team) {
        let Some(capacity) = self.engine.link_capacity() else {
            return;
        };
        let parts: Vec<_> = team.link.iter().map(|l| l.reported()).collect();
        let split = crate::engine::split_link(capacity, &parts);
        for (slot, part) in team.link.iter().zip(split) {
            slot.part.store(part, Ordering::Relaxed);
        }
    }

    /// The local VMs' ports (interface, slot) as the coordinator's engine has them.
    fn vm_ports(&self) -> Vec<(String, u32)> {
        let dir = &self.engine.dir;
        self.cfg
            .vms
            .iter()
            .filter_map(|vm| {
                let slot = dir.vms[dir.vm_named(&vm.name)?].port?;
                Some((vm.port.as_ref()?.ifname.clone(), slot as u32))
            })
            .collect()
    }

    /// Iron 3.2 with several workers, as with one loop: each tenant's cgroup gets its
    /// allocation minus the switch CPU every worker (and the ports' softirq time, charged
    /// here) charged to its one account since the last refill (the coordinator's engine has
    /// joined the workers' accounts), and the softirq work the kernel ran in the group's
    /// threads is credited ([`crate::runner::refill_cgroups`]).
    fn refill_cgroups(&mut self) {
        let mut quotas = Vec::new();
        self.engine.cgroup_quotas(self.clock.now(), &mut quotas);
        crate::runner::refill_cgroups(&mut self.cgroups, &quotas, &mut self.kernel);
    }

    /// The workers and their VMs, for the start-up report ([`Switch::describe_ports`]).
    pub(crate) fn describe_workers(&self, lines: &mut Vec<String>) {
        if self.workers > 1 {
            let cpus = crate::workers::pinned_cpus(&self.cfg, self.workers);
            let assignment = crate::workers::assign(&self.engine.dir, cpus);
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

    /// Publishes the merge of every worker's latest snapshot, and the softirq time the
    /// coordinator's engine charged.
    fn publish_merged(&mut self, team: &Team) {
        let mut parts: Vec<Arc<Published>> = team
            .published
            .iter()
            .filter_map(|p| p.load_full())
            .collect();
        if self.kernel.softirq_on() && !parts.is_empty() {
            let now = self.clock.now();
            self.kernel.publish(&mut self.engine, now);
            let mut switch = self.engine.snapshot();
            // Its VMs belong to no worker's queues: only their softirq counters count.
            switch.vms.iter_mut().for_each(|v| v.worker = usize::MAX);
            parts.push(Arc::new(Published {
                switch,
                ports: Vec::new(),
                pool_free: 0,
                pool_capacity: 0,
                accel: None,
                workers: Vec::new(),
                slo: SloReport {
                    tenants: Vec::new(),
                    ..parts[0].slo.clone()
                },
            }));
        }
        if !parts.is_empty() {
            let mut merged = merge(&parts, self.cfg.switch.frame_pool);
            merged.accel = self.accel.as_ref().map(|a| a.view(&self.cfg));
            self.shared.publish(merged);
        }
    }
}

/// One snapshot of several workers': a VM's counters summed over the workers that counted
/// them (its frames may be handled by another worker before they reach its own), its queues
/// and rates from the worker that owns it; tenants' and switch counters summed (a tenant's
/// use of the shared engine too: each worker counts the jobs of its own port); ports, SLO
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
            if let (Some(mine), Some(theirs)) = (&mut mine.accel, &theirs.accel) {
                mine.add(theirs);
            }
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
