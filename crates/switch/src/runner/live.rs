//! Live changes in the run loop (docs/switch.md "Live changes"): the API's new config
//! becomes in-place changes to the engines ([`crate::engine::Engine::apply_all`]); only a new
//! VM's port is opened (by a keeper thread, asked by the API's thread before the loop sees the
//! change: setting up its rings takes milliseconds that forwarding must not wait for) and
//! only a removed VM's port is given up (kept open for [`PARK`](super::keeper::PARK) in case a VM is added on the
//! same interface, then closed). The loop wakes no other thread in the middle of a change. A
//! list of changes is applied whole or not at all: a port that cannot be opened stops it
//! before anything changed, a change the engine refuses has the ones before it undone.
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::Context;
use picnic_core::Duration;

use super::command::{take_given_up, HANDOVER};
use super::keeper::PortKeeper;
use super::wake::{command_eventfd, CommandWake};
use super::{ring_wait, tenant_ports, Command, CommandSender, PortSpec, Reconfigure, Switch};
use crate::accel::Accel;
use crate::cgroup::CpuQuota;
use crate::change::Change;
use crate::config::Config;
use crate::engine::{PortChange, IRON_PERIOD};
use crate::port::Port;

/// How long the loop may hold an answer to the API back while it has frames to handle.
const ANSWER_WITHIN: Duration = Duration::from_millis(1);
/// A change waiting for the ports a helper thread opens for it.
pub(super) struct Opening {
    done: mpsc::Receiver<anyhow::Result<Vec<Box<dyn Port>>>>,
    cfg: Config,
    changes: Vec<Change>,
    reply: mpsc::Sender<anyhow::Result<()>>,
}

/// Takes the port named `name` out of `list`.
pub(crate) fn take_named(list: &mut Vec<Box<dyn Port>>, name: &str) -> Option<Box<dyn Port>> {
    let at = list.iter().position(|p| p.name() == name)?;
    Some(list.swap_remove(at))
}

impl Switch {
    /// The API's end of the loop's command queue (the loop's end replaces any earlier one).
    pub fn command_channel(&mut self) -> CommandSender {
        let (tx, rx) = mpsc::channel();
        self.commands = Some(rx);
        // An earlier channel's eventfd closes with its last sender: its number may be reused.
        self.wait_set.reset();
        // Without the eventfd a change waits for the loop's next wake-up (at most 5 ms).
        self.command_wake = command_eventfd()
            .map_err(|e| tracing::warn!("live changes wake nobody: {e}"))
            .ok()
            .map(|fd| {
                Arc::new(CommandWake {
                    fd,
                    pending: AtomicBool::new(false),
                })
            });
        let keeper = self
            .port_keeper()
            .map_err(|e| tracing::warn!("the loop opens new ports itself: {e}"))
            .ok()
            .cloned();
        CommandSender {
            tx,
            wake: self.command_wake.clone(),
            keeper,
            given_up: self.given_up.clone(),
        }
    }

    /// The descriptor that becomes readable when a command arrives, drained if it was
    /// written (the commands themselves are taken on every iteration).
    pub(super) fn command_fd(&self) -> Option<std::os::fd::RawFd> {
        let wake = self.command_wake.as_ref()?;
        let fd = wake.fd.as_raw_fd();
        if wake.pending.swap(false, Ordering::Acquire) {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a u64 we own; EAGAIN (nothing pending) is fine.
            unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        }
        Some(fd)
    }

    /// Applies the API's changes in order. A change that needs new ports has them opened on
    /// a helper thread (setting up a port's rings takes milliseconds, which forwarding must
    /// not wait for) and is applied once they are open; later changes wait for it.
    pub(super) fn apply_commands(&mut self) {
        if let Some(o) = self.opening.take() {
            match o.done.try_recv() {
                Ok(ports) => {
                    let start = std::time::Instant::now();
                    let result = ports.and_then(|ports| self.commit(o.cfg, &o.changes, ports));
                    self.commit_clock.record(start);
                    self.answer_later(o.reply, result);
                }
                Err(mpsc::TryRecvError::Empty) => {
                    self.opening = Some(o);
                    return;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    let failed = anyhow::anyhow!("opening the new ports failed");
                    self.answer_later(o.reply, Err(failed));
                }
            }
        }
        let Some(rx) = self.commands.take() else {
            return;
        };
        while self.opening.is_none() {
            let Ok(Command::Reconfigure(change, reply)) = rx.try_recv() else {
                break;
            };
            let start = std::time::Instant::now();
            match self.prepare(*change) {
                Err(e) => self.answer_later(reply, Err(e)),
                Ok(r) if r.specs.is_empty() => {
                    let changed = !r.changes.is_empty();
                    let result = self.commit(r.cfg, &r.changes, r.opened);
                    if changed {
                        self.commit_clock.record(start);
                    }
                    self.answer_later(reply, result);
                }
                Ok(r) => {
                    let (tx, done) = mpsc::channel();
                    let wake = self.command_wake.clone();
                    let closed = take_given_up(&self.given_up, std::time::Duration::ZERO);
                    let keeper = self.port_keeper();
                    if let Err(e) = keeper.and_then(|k| k.open(r.specs, closed, (tx, wake))) {
                        self.answer_later(reply, Err(e));
                        continue;
                    }
                    self.opening = Some(Opening {
                        done,
                        cfg: r.cfg,
                        changes: r.changes,
                        reply,
                    });
                }
            }
        }
        self.commands = Some(rx);
    }

    /// Queues the API's answer for [`Switch::answer`].
    fn answer_later(
        &mut self,
        reply: mpsc::Sender<anyhow::Result<()>>,
        result: anyhow::Result<()>,
    ) {
        if self.answers.is_empty() {
            self.answers_since = self.clock.now();
        }
        self.answers.push((reply, result));
    }

    /// Sends the queued answers: called when the loop is about to wait, or at `now` once the
    /// oldest has waited [`ANSWER_WITHIN`] (a loop that never waits). The API's thread,
    /// woken by an answer, then runs while the loop waits rather than in its place while
    /// frames arrive: answered at once, it held the loop up 36-41 us at the median (measured).
    pub(super) fn answer(&mut self, now: Option<picnic_core::Instant>) {
        if now.is_some_and(|now| now < self.answers_since + ANSWER_WITHIN) {
            return;
        }
        for (reply, result) in self.answers.drain(..) {
            let _ = reply.send(result);
        }
    }

    /// The port keeper, started on first use.
    fn port_keeper(&mut self) -> anyhow::Result<&PortKeeper> {
        if self.keeper.is_none() {
            self.keeper = Some(PortKeeper::start(self.opener.clone())?);
        }
        Ok(self.keeper.as_ref().expect("started above"))
    }

    /// Opens `specs`' ports through the keeper (a removed VM's parked port is taken back)
    /// and waits for them: for the coordinator of workers, which no frame waits for.
    pub(crate) fn open_ports(
        &mut self,
        specs: Vec<PortSpec>,
    ) -> anyhow::Result<Vec<Box<dyn Port>>> {
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let closed = take_given_up(&self.given_up, std::time::Duration::ZERO);
        self.port_keeper()?.open_now(specs, closed)
    }

    /// Closes removed VMs' ports through the keeper (AF_PACKET ones are parked first).
    pub(crate) fn close_ports(&mut self, ports: Vec<Box<dyn Port>>) {
        match self.port_keeper() {
            Ok(keeper) => keeper.close(ports),
            Err(_) => drop(ports),
        }
    }

    /// Gives up `ports` without a system call: the next change takes them to the keeper.
    fn give_up(&self, ports: Vec<Box<dyn Port>>) {
        let now = std::time::Instant::now();
        let mut list = self.given_up.lock().unwrap_or_else(|e| e.into_inner());
        list.extend(ports.into_iter().map(|p| (now, p)));
    }

    /// Hands the keeper the ports given up [`HANDOVER`] ago that no change took (at a
    /// publish).
    pub(super) fn hand_over_given_up(&mut self) {
        let closed = take_given_up(&self.given_up, HANDOVER);
        if !closed.is_empty() {
            self.close_ports(closed);
        }
    }

    /// Checks an API change against this switch. It was diffed from the config running now
    /// (the API answers one request at a time) unless a change the API gave up waiting for
    /// was applied since: then it is diffed again, here.
    pub(crate) fn prepare(&self, change: Reconfigure) -> anyhow::Result<Reconfigure> {
        let running = self.shared.config();
        if let (Some(running), Some(base)) = (running, &change.base) {
            if Arc::ptr_eq(&running, base) {
                return Ok(change);
            }
        }
        // Ports opened for the stale diff: the keeper takes back those the new one needs.
        self.give_up(change.opened);
        Reconfigure::prepare(Arc::new(self.cfg.clone()), change.cfg)
    }

    /// Applies live changes, each touching only its host, tenant or VM in place, with the
    /// new VMs' ports `opened` (all opened before anything is applied: if one could not be,
    /// nothing changed). A removed VM's port goes to the keeper (parked, then closed); the other
    /// ports, their rings and their waits are not touched. When the engine refuses a change,
    /// the ones before it are undone and the error says so.
    fn commit(
        &mut self,
        cfg: Config,
        changes: &[Change],
        mut opened: Vec<Box<dyn Port>>,
    ) -> anyhow::Result<()> {
        let now = self.clock.now();
        let spin = Duration::from_micros(cfg.switch.spin_us);
        let mut closed: Vec<Box<dyn Port>> = Vec::new();
        // Ports leave and come: a descriptor the wait registered may be closed from here on
        // (the keeper closes given-up ports) and its number reused by a new port.
        self.wait_set.reset();
        // XDP drops counted so far belong to the VMs in their slots now.
        self.kernel.publish(&mut self.engine, now);
        let (ports, waits) = (&mut self.ports, &mut self.waits);
        let mut ports_changed = false;
        let applied = self.engine.apply_all(
            now,
            &self.cfg,
            changes,
            &mut self.pool,
            |port, change| match (port, change) {
                (PortChange::Closed(slot), _) => {
                    closed.extend(ports.get_mut(slot).and_then(Option::take));
                    ports_changed = true;
                }
                (PortChange::Opened(slot), Change::AddVm(vm)) => {
                    ports_changed = true;
                    let name = &vm.port.as_ref().expect("local VM").ifname;
                    let port =
                        take_named(&mut opened, name).or_else(|| take_named(&mut closed, name));
                    if ports.len() <= slot {
                        ports.resize_with(slot + 1, || None);
                    }
                    ports[slot] = port;
                    waits.resize_with(ports.len(), || (ring_wait(spin), 0));
                    waits[slot] = (ring_wait(spin), 0);
                }
                _ => {}
            },
        );
        // Not to the keeper from here: waking it would hold up the loop, and the frames in
        // its rings with it.
        self.give_up(closed);
        let (cfg, failed) = match applied {
            Ok(()) => (cfg, None),
            Err(e) if e.undo_failed.is_none() => return Err(e.into()),
            Err(e) => (e.running(&self.cfg, changes), Some(e)),
        };
        // Each step below costs system calls or threads: only what the change touched.
        if ports_changed {
            if let Err(e) = self.kernel.set_ports(&tenant_ports(&self.ports)) {
                tracing::warn!("softirq accounting: {e}");
            }
        }
        if crate::workers::wants_softirq(&cfg) && !self.kernel.softirq_on() {
            self.kernel.start_softirq(&tenant_ports(&self.ports), &[]);
        }
        // Tenants that encrypt, and their keys, as the new config says (keys rotate here).
        if encryption_changed(&self.cfg, &cfg) {
            let accel = Accel::from_config_after(&cfg, self.accel.as_ref(), 1)?;
            self.set_accel(accel);
        }
        let old = std::mem::replace(&mut self.cfg, cfg);
        self.shared.set_config(self.cfg.clone());
        self.sync_cgroups(&old)?;
        failed.map_or(Ok(()), |e| Err(e.into()))
    }

    /// After a live change: each tenant slot charges the cgroup its tenant names now; a
    /// cgroup no longer charged gets back the allocation `old` gave it.
    pub(crate) fn sync_cgroups(&mut self, old: &Config) -> anyhow::Result<()> {
        let tenants = &self.engine.dir.tenants;
        let want: Vec<Option<std::path::PathBuf>> = tenants
            .iter()
            .map(|t| {
                (t.present && self.cfg.isolation.cpu_accounting)
                    .then(|| t.cgroup.clone())
                    .flatten()
            })
            .collect();
        self.cgroups
            .resize_with(want.len().max(self.cgroups.len()), || None);
        for (slot, want) in want.into_iter().enumerate() {
            let have = self.cgroups[slot].as_ref().map(|(p, _)| p);
            if have == want.as_ref() {
                continue;
            }
            self.release_cgroup(slot, old);
            if let Some(dir) = want {
                let group = CpuQuota::open(&dir, IRON_PERIOD)
                    .with_context(|| format!("cgroup {}", dir.display()))?;
                self.cgroups[slot] = Some((dir, group));
            }
        }
        Ok(())
    }
}

/// Whether the shared encryption engine's inputs differ between `old` and `new`: which
/// tenants encrypt (in config order: the engine's weights follow it), their keys and
/// weights, or the engine's section.
pub(crate) fn encryption_changed(old: &Config, new: &Config) -> bool {
    let encrypting = |c: &Config| c.tenants.iter().any(|t| t.encrypt);
    if !encrypting(old) && !encrypting(new) {
        return false;
    }
    let inputs = |c: &Config| {
        c.tenants
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.encrypt,
                    t.key.clone(),
                    t.key_file.clone(),
                    t.key_epoch,
                    t.accel_weight,
                )
            })
            .collect::<Vec<_>>()
    };
    inputs(old) != inputs(new) || serde_json::json!(old.accel) != serde_json::json!(new.accel)
}
