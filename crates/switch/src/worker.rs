//! One dataplane worker of several ([`crate::workers`]): a thread running the same
//! [`Driver`] as the single loop over the VM ports it owns and its own uplink socket, with its
//! own engine, frame pool and adaptive waits (Rizzo et al., per worker). Frames that belong to
//! another worker go through that worker's [`Mailbox`]; every frame handed over is repaid from
//! the receiver's pool, so each worker's pool keeps its size. Live changes come through the
//! same mailbox ([`crate::workers::Control`]) and are applied between passes.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use arc_swap::{ArcSwap, ArcSwapOption};
use picnic_core::notify::AdaptiveWait;
use picnic_core::{Duration, Instant};
use picnic_wire::overlay::decap;

use crate::accel::{AccelPort, Exchange};
use crate::change::Change;
use crate::directory::{Directory, PortIdx, UPLINK};
use crate::driver::{Driver, Io, UPLINK_READ_ROUNDS};
use crate::ebpf::KernelLink;
use crate::engine::{Engine, PortChange, SharedBudgets, Work};
use crate::frame::{Frame, FramePool};
use crate::port::{Port, WaitSet};
use crate::runner::take_named;
use crate::runner::{
    ring_wait, thread_cpu_ns, Clock, CommitClock, HandoffCounters, PortView, Published, SpinWork,
    WorkerView,
};
use crate::stats::DropReason;
use crate::workers::{Applied, Assignment, Control, Handoff, Mailbox};

/// What every worker shares: the mailboxes, the budgets and each worker's published
/// snapshot.
pub struct Team {
    pub workers: usize,
    pub mailboxes: Vec<Mailbox>,
    /// The budgets the workers' engines draw from (replaced when a live change changes a
    /// tenant's quota; the coordinator reads the charges from it).
    pub budgets: ArcSwap<SharedBudgets>,
    pub published: Vec<ArcSwapOption<Published>>,
    /// Set to make every worker return (a stop, or another worker's error).
    pub pause: AtomicBool,
    /// Each worker's thread id, once it runs (the softirq accounting tells them apart).
    pub tids: Vec<std::sync::atomic::AtomicU32>,
    /// Per worker: its part of the access link ([`crate::engine::split_link`]).
    pub link: Vec<LinkSlot>,
    /// `switch.yield_busy`: each worker yields its core after a busy iteration.
    pub yield_busy: bool,
}

/// A worker's EyeQ link receiver as the coordinator sees it: what the worker reports of its
/// active endpoints ([`picnic_core::eyeq::Aggregate`]) and the part of the access link the
/// coordinator gives it (bytes/s; 0: not given yet).
#[derive(Default)]
pub struct LinkSlot {
    pub active: std::sync::atomic::AtomicU32,
    pub guarantee: std::sync::atomic::AtomicU64,
    pub demand: std::sync::atomic::AtomicU64,
    pub reserve: std::sync::atomic::AtomicU64,
    pub part: std::sync::atomic::AtomicU64,
}

impl LinkSlot {
    fn report(&self, a: picnic_core::eyeq::Aggregate) {
        self.active.store(a.active, Ordering::Relaxed);
        self.guarantee.store(a.guarantee, Ordering::Relaxed);
        self.demand.store(a.demand, Ordering::Relaxed);
        self.reserve.store(a.reserve, Ordering::Relaxed);
    }

    /// What the worker reported last.
    pub fn reported(&self) -> picnic_core::eyeq::Aggregate {
        picnic_core::eyeq::Aggregate {
            active: self.active.load(Ordering::Relaxed),
            guarantee: self.guarantee.load(Ordering::Relaxed),
            demand: self.demand.load(Ordering::Relaxed),
            reserve: self.reserve.load(Ordering::Relaxed),
        }
    }
}

impl Team {
    /// The workers' thread ids, once every worker has started (None before).
    pub fn thread_ids(&self) -> Option<Vec<u32>> {
        let tids: Vec<u32> = self
            .tids
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .collect();
        tids.iter().all(|&t| t != 0).then_some(tids)
    }
}

impl Team {
    /// Wakes every worker (after setting `pause`).
    pub fn kick_all(&self) {
        for m in &self.mailboxes {
            m.kick();
        }
    }
}

/// One worker's state; it goes back to the switch when the workers stop.
pub struct Worker {
    pub index: usize,
    pub engine: Engine,
    /// Which worker owns each port, as of the last live change this worker applied.
    pub assignment: Assignment,
    /// By port index: the ports this worker owns ([`UPLINK`]: its own uplink socket, if any).
    pub ports: Vec<Option<Box<dyn Port>>>,
    pub pool: FramePool,
    waits: Vec<(AdaptiveWait, u64)>,
    /// Uplink frames handed over by other workers, read before this worker's own socket.
    inbound: Vec<Frame>,
    /// Frames read per port and round (`switch.batch`).
    batch: usize,
    /// Frames owed back to each worker.
    owed: Vec<u64>,
    handoff: HandoffCounters,
    /// How long applying each live change held this worker up.
    commit_clock: CommitClock,
    /// The uplink's XDP early drop for this worker's VMs (none without an AF_XDP uplink).
    pub kernel: KernelLink,
    /// The worker's blocking wait, kept across waits; reset at every live change.
    wait_set: WaitSet,
    /// This worker's port into the shared encryption engine, when a tenant encrypts, and
    /// its exchange buffers.
    pub accel: Option<AccelPort>,
    accel_scratch: Exchange,
}

impl Worker {
    pub fn new(
        index: usize,
        engine: Engine,
        assignment: Assignment,
        ports: Vec<Option<Box<dyn Port>>>,
        pool: FramePool,
    ) -> Worker {
        Worker {
            index,
            engine,
            assignment,
            ports,
            pool,
            waits: Vec::new(),
            inbound: Vec::new(),
            batch: 1,
            owed: Vec::new(),
            handoff: HandoffCounters::default(),
            commit_clock: CommitClock::default(),
            kernel: KernelLink::default(),
            wait_set: WaitSet::new(),
            accel: None,
            accel_scratch: Exchange::default(),
        }
    }

    /// Runs until `stop` or the team's `pause` is set; a port error ends it.
    pub fn run(
        &mut self,
        team: &Team,
        stop: &AtomicBool,
        clock: Clock,
        batch: usize,
        spin: Duration,
        work: &mut SpinWork,
    ) -> anyhow::Result<()> {
        let mut driver = Driver::new(batch);
        self.batch = batch;
        let mailbox = &team.mailboxes[self.index];
        // SAFETY: gettid has no arguments and cannot fail.
        team.tids[self.index].store(unsafe { libc::gettid() } as u32, Ordering::Relaxed);
        self.owed.resize(team.workers, 0);
        if self.waits.len() != self.ports.len() {
            self.waits = (0..self.ports.len())
                .map(|_| (ring_wait(spin), 0))
                .collect();
        }
        let mut next_publish = clock.now();
        let mut next_link = next_publish;
        let mut idle = crate::runner::IdlePolicy::default();
        let mut fds = Vec::new();
        // The directory the uplink frames are routed with; it changes only at a live change.
        let mut dir = self.engine.dir.clone();
        self.wait_set.reset();
        let mut cpu_mark = thread_cpu_ns();
        while !stop.load(Ordering::Relaxed) && !team.pause.load(Ordering::Relaxed) {
            let now = clock.now();
            // Iron 3.1, per worker: this thread's CPU since the last pass, charged to the VMs
            // whose frames it handled; the workers' charges add up to the switch's.
            let cpu_now = thread_cpu_ns();
            self.engine.charge_cpu(now, cpu_now - cpu_mark);
            cpu_mark = cpu_now;
            // Iron 3.3: this worker's throttled VMs into the uplink's XDP map.
            self.kernel.tick(&mut self.engine, now);
            if now >= next_publish {
                next_publish = now + Duration::from_millis(100);
                team.published[self.index].store(Some(Arc::new(self.publish(now))));
            }
            if now >= next_link && team.workers > 1 {
                // Once a millisecond: this worker's receiver reported, its part taken.
                next_link = now + Duration::from_millis(1);
                let slot = &team.link[self.index];
                if let Some(a) = self.engine.link_aggregate(now) {
                    slot.report(a);
                }
                match slot.part.load(Ordering::Relaxed) {
                    0 => {}
                    part => self.engine.set_link_share(part),
                }
            }
            let mut mail = 0;
            while let Some(control) = mailbox.take_control() {
                self.on_control(now, control, spin);
                dir = self.engine.dir.clone();
                mail += 1;
            }
            mail += self.take_mail(now, team);
            let mut io = WorkerIo {
                me: self.index,
                ports: &mut self.ports,
                waits: &mut self.waits,
                work: &mut *work,
                team,
                owner: &self.assignment.owner,
                dir: &dir,
                inbound: &mut self.inbound,
                handoff: &mut self.handoff,
            };
            let mut busy = driver
                .iterate(now, &mut self.engine, &mut io, &mut self.pool)?
                .busy()
                + mail;
            // The shared engine, as in the single loop: frames set aside go to it through this
            // worker's port, their results come back and leave in this pass.
            if let Some(port) = self.accel.as_mut() {
                let scratch = &mut self.accel_scratch;
                busy += port.exchange(&mut self.engine, now, &mut self.pool, scratch);
                cpu_mark += scratch.inline_cpu_ns();
                if scratch.finished() > 0 {
                    let mut io = WorkerIo {
                        me: self.index,
                        ports: &mut self.ports,
                        waits: &mut self.waits,
                        work: &mut *work,
                        team,
                        owner: &self.assignment.owner,
                        dir: &dir,
                        inbound: &mut self.inbound,
                        handoff: &mut self.handoff,
                    };
                    let at = clock.now();
                    busy += driver.finish(at, &mut self.engine, &mut io, &mut self.pool)?;
                }
            }
            if busy > 0 {
                if team.yield_busy {
                    crate::sched::yield_now();
                }
                idle.worked(&mut self.waits, busy, clock.now() - now);
                continue;
            }
            if idle.spin(now, &mut self.waits) {
                continue;
            }
            if !mailbox.sleep() {
                continue;
            }
            let until = self
                .engine
                .poll_at()
                .map(|t| t - now)
                .unwrap_or(Duration::from_millis(5));
            let mut timeout = until.min(Duration::from_millis(5));
            // Jobs the engine's limiter admits later (or its pace holds): back by then.
            if let Some(wake) = self.accel.as_ref().and(self.accel_scratch.wake_in()) {
                timeout = timeout.min(Duration::from_nanos(wake.as_nanos() as u64));
            }
            fds.clear();
            fds.push(mailbox.wake_fd());
            fds.extend(self.accel.as_ref().map(|p| p.notify_fd().as_raw_fd()));
            fds.extend(
                (0..self.ports.len())
                    .filter(|&p| self.engine.rx_ready(now, p, batch))
                    .filter_map(|p| self.ports[p].as_ref().and_then(|port| port.raw_fd())),
            );
            let woke = self
                .wait_set
                .wait(&fds, std::time::Duration::from_nanos(timeout.as_nanos()));
            mailbox.awake();
            woke?;
        }
        let now = clock.now();
        self.kernel.release(&mut self.engine, now);
        self.engine.leave_workers(now);
        team.published[self.index].store(Some(Arc::new(self.publish(now))));
        Ok(())
    }

    /// Applies the coordinator's live changes to this worker's engine (the frames of a removed
    /// VM's queues go back to this worker's pool), installs the new ports placed here, gives
    /// up removed VMs' ports, takes the new owners and budgets, and answers.
    fn on_control(&mut self, now: Instant, control: Control, spin: Duration) {
        let start = std::time::Instant::now();
        let Control {
            old,
            changes,
            ports: mut opened,
            owner,
            budgets,
            accel,
            reply,
        } = control;
        // A new shared engine (the old one's workers stopped): this worker's jobs in the old
        // one come back to its pool.
        if let Some(port) = accel {
            let mut frames = Vec::new();
            if let Some(old) = std::mem::replace(&mut self.accel, port) {
                old.shutdown(&mut frames);
            }
            frames.into_iter().for_each(|f| self.pool.put(f));
        }
        let mut closed = Vec::new();
        // Ports leave (their descriptors closed by the coordinator after the answer) and
        // come: numbers the wait registered may name other files from here on.
        self.wait_set.reset();
        let (ports, waits) = (&mut self.ports, &mut self.waits);
        let result = self
            .engine
            .apply_all(now, &old, &changes, &mut self.pool, |port, change| {
                match (port, change) {
                    (PortChange::Closed(slot), _) => {
                        closed.extend(ports.get_mut(slot).and_then(Option::take));
                    }
                    (PortChange::Opened(slot), Change::AddVm(vm)) => {
                        let name = &vm.port.as_ref().expect("local VM").ifname;
                        if ports.len() <= slot {
                            ports.resize_with(slot + 1, || None);
                        }
                        ports[slot] =
                            take_named(&mut opened, name).or_else(|| take_named(&mut closed, name));
                        waits.resize_with(ports.len(), || (ring_wait(spin), 0));
                        waits[slot] = (ring_wait(spin), 0);
                    }
                    _ => {}
                }
            });
        let slots = self.engine.dir.port_count();
        if self.ports.len() < slots {
            self.ports.resize_with(slots, || None);
        }
        self.waits
            .resize_with(self.ports.len(), || (ring_wait(spin), 0));
        self.assignment.owner = owner.to_vec();
        self.kernel.set_owner(&owner);
        if let Some(budgets) = budgets {
            // After the changes: the engine's caches are sized for the tenants it has now.
            self.engine.leave_workers(now);
            self.engine.join_workers(budgets, self.index);
        }
        closed.append(&mut opened);
        let changed = !changes.is_empty();
        let _ = reply.send(Applied {
            worker: self.index,
            result,
            closed,
        });
        if changed {
            self.commit_clock.record(start);
        }
    }

    /// Takes what other workers handed over: uplink frames wait for the next uplink read,
    /// frames for this worker's ports join their transmit queues, feedback copies are applied.
    /// Repays what is owed and takes back what was repaid. Returns the frames taken.
    fn take_mail(&mut self, now: Instant, team: &Team) -> usize {
        let mailbox = &team.mailboxes[self.index];
        let mut n = 0;
        // Uplink frames wait here no deeper than the driver reads in one pass; the rest stay
        // in the mailbox, which drops (`handoff_full`) when the owner cannot keep up.
        let room = UPLINK_READ_ROUNDS * self.batch;
        while self.inbound.len() < room {
            let Some((from, h)) = mailbox.take() else {
                break;
            };
            n += 1;
            self.owed[from] += 1;
            match h {
                Handoff::Uplink(f) => self.inbound.push(f),
                // Only while it still holds the VM the sender queued the frame for (a live
                // change may have removed it, or not reached this worker yet).
                Handoff::Tx(p, vm, f) if self.holds(p, vm) => self.engine.tx_queue(p).push(f),
                Handoff::Tx(_, _, f) => {
                    self.handoff.stale += 1;
                    self.pool.put(f);
                }
                Handoff::UplinkTx(f) => self.engine.tx_queue(UPLINK).push(f),
                Handoff::Feedback(f) => self.engine.on_feedback_copy(now, f, &mut self.pool),
            }
        }
        self.handoff.r#in += n as u64;
        for (w, owed) in self.owed.iter_mut().enumerate() {
            while *owed > 0 {
                let Some(f) = self.pool.get() else { break };
                if let Err(f) = team.mailboxes[w].repay(f) {
                    self.pool.put(f);
                    break;
                }
                *owed -= 1;
            }
        }
        while let Some(f) = mailbox.repaid() {
            self.pool.put(f);
        }
        n
    }

    /// Whether this worker has port `p` open for VM `vm` (slot, generation).
    fn holds(&self, p: PortIdx, vm: (usize, u32)) -> bool {
        let dir = &self.engine.dir;
        self.ports.get(p).is_some_and(Option::is_some)
            && dir.port_vm.get(p) == Some(&Some(vm.0))
            && dir.vms[vm.0].generation == vm.1
    }

    /// This worker's snapshot: its VMs (every VM shows the worker that owns it), its ports,
    /// and the SLOs of the tenants whose VMs it owns.
    fn publish(&mut self, now: Instant) -> Published {
        self.kernel.publish(&mut self.engine, now);
        // The receivers' meter windows are closed when read: the advertised rates as of now.
        self.engine.catch_up(now);
        let assignment = &self.assignment;
        let mut switch = self.engine.snapshot();
        switch
            .switch
            .drops
            .add_n(DropReason::HandoffFull, self.handoff.full);
        let mut slo = self.engine.slo_report(now);
        let dir = &self.engine.dir;
        let owner_of = |name: &str| {
            dir.vms
                .iter()
                .find(|v| v.name == name)
                .and_then(|v| v.port)
                .and_then(|p| assignment.owner.get(p).copied())
        };
        for vm in &mut switch.vms {
            vm.worker = owner_of(&vm.name).unwrap_or(0);
        }
        slo.tenants.retain(|t| {
            let mut owners = dir
                .local_vms()
                .filter(|&(v, _)| dir.tenants[dir.vms[v].tenant].name == t.tenant)
                .map(|(_, p)| assignment.owner.get(p).copied().unwrap_or(0));
            owners.next().unwrap_or(0) == self.index
        });
        let ports = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().map(|p| (i, p)))
            .map(|(i, p)| {
                let wait = self.waits.get(i).map(|(w, _)| w);
                let decisions = wait.map(|w| w.counts()).unwrap_or_default();
                PortView {
                    name: p.name().to_string(),
                    backend: p.backend().to_string(),
                    worker: self.index,
                    stats: p.stats(),
                    wait_regime: wait.and_then(|w| w.regime()).map(|r| r.to_string()),
                    wait_spins: decisions.spins,
                    wait_blocks: decisions.blocks,
                    producer_period_ns: wait.and_then(|w| w.peer_period()).map(|d| d.as_nanos()),
                }
            })
            .collect();
        let workers = vec![WorkerView {
            worker: self.index,
            vms: assignment
                .ports_of(self.index)
                .filter_map(|p| dir.port_vm[p].map(|v| dir.vms[v].name.clone()))
                .collect(),
            cpu_ns: switch.switch.cpu_ns,
            handoff: self.handoff.clone(),
            live_commits: self.commit_clock.view(),
        }];
        Published {
            switch,
            ports,
            pool_free: self.pool.available(),
            pool_capacity: self.pool.capacity(),
            workers,
            slo,
            accel: None,
        }
    }
}

/// Where an uplink frame goes: the port of the local VM it is for (None: the receiving
/// worker handles it, e.g. malformed or standalone feedback), and whether it carries
/// feedback every worker's senders need.
pub fn uplink_target(dir: &Directory, data: &[u8]) -> (Option<PortIdx>, bool) {
    let Ok(d) = decap(data) else {
        return (None, false);
    };
    let feedback = d.geneve.feedback.is_some();
    let port = dir
        .tenant_by_vni(d.geneve.vni)
        .filter(|_| d.inner.len() >= 14)
        .and_then(|t| {
            let dst = crate::config::Mac(d.inner[0..6].try_into().expect("length checked"));
            dir.vm_by_mac(t, dst)
        })
        .and_then(|v| dir.vms[v].port);
    (port, feedback)
}

/// A worker's ports as the driver's [`Io`]: frames read for, or queued to, another worker's
/// VM go to its mailbox.
struct WorkerIo<'a> {
    me: usize,
    ports: &'a mut [Option<Box<dyn Port>>],
    waits: &'a mut [(AdaptiveWait, u64)],
    work: &'a mut SpinWork,
    team: &'a Team,
    /// Which worker owns each port.
    owner: &'a [usize],
    dir: &'a Directory,
    inbound: &'a mut Vec<Frame>,
    handoff: &'a mut HandoffCounters,
}

impl WorkerIo<'_> {
    /// Posts `h` to worker `to`; a full mailbox drops the frame (counted).
    fn post(&mut self, to: usize, h: Handoff, pool: &mut FramePool) {
        match self.team.mailboxes[to].post(self.me, h) {
            Ok(()) => self.handoff.out += 1,
            Err(
                Handoff::Uplink(f)
                | Handoff::Tx(_, _, f)
                | Handoff::UplinkTx(f)
                | Handoff::Feedback(f),
            ) => {
                self.handoff.full += 1;
                pool.put(f);
            }
        }
    }

    /// Sorts the frames `rx[from..]` read from this worker's uplink socket: those for another
    /// worker's VMs are handed over, feedback is copied to every other worker.
    fn route_uplink(&mut self, rx: &mut Vec<Frame>, from: usize, pool: &mut FramePool) {
        let workers = self.team.workers;
        let mut i = from;
        while i < rx.len() {
            let (port, feedback) = uplink_target(self.dir, rx[i].data());
            let owner = port.map_or(self.me, |p| self.owner.get(p).copied().unwrap_or(self.me));
            if feedback {
                for w in (0..workers).filter(|&w| w != owner) {
                    let Some(mut copy) = pool.get() else { break };
                    if copy.fill_from(rx[i].data()) {
                        self.post(w, Handoff::Feedback(copy), pool);
                    } else {
                        pool.put(copy);
                    }
                }
            }
            if owner != self.me {
                let f = rx.swap_remove(i);
                self.post(owner, Handoff::Uplink(f), pool);
            } else {
                i += 1;
            }
        }
    }
}

impl Io for WorkerIo<'_> {
    fn recv(
        &mut self,
        now: Instant,
        port: PortIdx,
        pool: &mut FramePool,
        rx: &mut Vec<Frame>,
        max: usize,
    ) -> anyhow::Result<usize> {
        let before = rx.len();
        if port == UPLINK {
            let take = self.inbound.len().min(max);
            rx.extend(self.inbound.drain(..take));
        }
        let start = rx.len();
        let room = max - (start - before);
        let mut full = false;
        if let Some(p) = self.ports[port].as_mut().filter(|_| room > 0) {
            let n = p
                .recv_batch(pool, rx, room)
                .with_context(|| format!("receive on {}", p.name()))?;
            full = n == room;
            if n > 0 {
                let (wait, seen) = &mut self.waits[port];
                *seen += n as u64;
                wait.observe(now, *seen);
                if port == UPLINK && self.team.workers > 1 {
                    self.route_uplink(rx, start, pool);
                }
            }
        }
        // A full read keeps the driver reading this port, even when frames were handed over.
        let kept = rx.len() - before;
        Ok(if full || room == 0 {
            kept.max(max)
        } else {
            kept
        })
    }

    fn send(
        &mut self,
        port: PortIdx,
        queue: &mut Vec<Frame>,
        pool: &mut FramePool,
    ) -> anyhow::Result<()> {
        match self.ports[port].as_mut() {
            Some(p) => crate::port::send_or_drop(p.as_mut(), port == UPLINK, queue, pool)?,
            None if port == UPLINK && self.me != 0 => {
                for f in queue.drain(..) {
                    self.post(0, Handoff::UplinkTx(f), pool);
                }
            }
            None => {
                let owner = self.owner.get(port).copied().unwrap_or(self.me);
                let vm = self.dir.port_vm.get(port).copied().flatten();
                match vm.filter(|_| owner != self.me) {
                    Some(v) => {
                        let vm = (v, self.dir.vms[v].generation);
                        for f in queue.drain(..) {
                            self.post(owner, Handoff::Tx(port, vm, f), pool);
                        }
                    }
                    // No VM there any more, or its port not yet open here: nowhere to send.
                    None => {
                        self.handoff.stale += queue.len() as u64;
                        queue.drain(..).for_each(|f| pool.put(f));
                    }
                }
            }
        }
        Ok(())
    }

    fn work(&mut self) -> &mut dyn Work {
        self.work
    }
}
