//! Live changes in the run loop (docs/switch.md "Live changes"): the API's new config
//! becomes in-place changes to the engines ([`crate::engine::Engine::apply_all`]); only a new
//! VM's port is opened (on a helper thread: setting up its rings takes milliseconds that
//! forwarding must not wait for) and only a removed VM's port is closed. A list of changes is
//! applied whole or not at all: a port that cannot be opened stops it before anything
//! changed, a change the engine refuses has the ones before it undone.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::Context;
use picnic_core::Duration;

use super::{ring_wait, tenant_ports, vm_max_frame_of, Command, PortOpener, PortSpec, Switch};
use crate::accel::Accel;
use crate::cgroup::CpuQuota;
use crate::change::Change;
use crate::config::Config;
use crate::engine::{PortChange, IRON_PERIOD};
use crate::port::Port;

/// An API change made ready on the API's thread, so that the run loop only applies it: the
/// new config, the changes that turn `base` (the running config the API read) into it, and
/// the ports its new VMs need. Diffing compares whole entries and takes tens of
/// microseconds, which the neighbours' frames would otherwise wait for in their rings.
pub struct Reconfigure {
    base: Option<Arc<Config>>,
    pub(crate) cfg: Config,
    pub(crate) changes: Vec<Change>,
    pub(crate) specs: Vec<PortSpec>,
}

impl Reconfigure {
    /// The changes from `base` to `cfg` (already validated by the caller). Fails as
    /// [`crate::change::diff`] does: only hosts, tenants and vms change live.
    pub fn prepare(base: Arc<Config>, cfg: Config) -> anyhow::Result<Self> {
        let changes = crate::change::diff(&base, &cfg).map_err(anyhow::Error::msg)?;
        let specs = port_specs(&base, &cfg, &changes);
        Ok(Self {
            base: Some(base),
            cfg,
            changes,
            specs,
        })
    }

    /// A change to `cfg` that the run loop diffs itself, for callers that do not hold the
    /// running config (tests driving a [`Switch`] directly).
    pub fn to(cfg: Config) -> Self {
        Self {
            base: None,
            cfg,
            changes: Vec::new(),
            specs: Vec::new(),
        }
    }

    /// The new config, for a stand-in of the run loop in tests.
    pub fn into_config(self) -> Config {
        self.cfg
    }
}

/// The API's end of the run loop's command queue. Sending also wakes the loop (an eventfd in
/// its wait), so that a change is applied when it arrives; otherwise a sleeping loop found it
/// only when the next frame woke it, and that frame waited for the change (at 100 changes a
/// second against a neighbour's 2,000 frames a second, one of its frames in twenty).
#[derive(Clone)]
pub struct CommandSender {
    tx: mpsc::Sender<Command>,
    wake: Option<Arc<CommandWake>>,
}

/// The eventfd that wakes the loop, and whether it was written since the loop last drained
/// it (so that the loop reads it only then, not on every wait).
pub(super) struct CommandWake {
    fd: OwnedFd,
    pending: AtomicBool,
}

impl CommandSender {
    /// A sender that wakes nobody (for stand-ins of the run loop that block on `rx`).
    pub fn new(tx: mpsc::Sender<Command>) -> Self {
        Self { tx, wake: None }
    }

    pub fn send(&self, command: Command) -> Result<(), mpsc::SendError<Command>> {
        self.tx.send(command)?;
        if let Some(wake) = &self.wake {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a u64 we own to an eventfd we hold open.
            unsafe { libc::write(wake.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            // Set after the write: the loop drains only what was written before it saw this.
            wake.pending.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// An eventfd for [`CommandSender`] (non-blocking, so that the loop drains it without waiting).
fn command_eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success the descriptor is ours.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The ports the VMs that `changes` add locally need, except those taking over a port
/// another VM gives up in the same change.
fn port_specs(old: &Config, cfg: &Config, changes: &[Change]) -> Vec<PortSpec> {
    let removed = |name: &str| {
        changes.iter().any(|c| {
            matches!(c, Change::RemoveVm(n)
                if old.vms.iter().any(|v| &v.name == n
                    && v.port.as_ref().is_some_and(|p| p.ifname == name)))
        })
    };
    let mut specs = Vec::new();
    for change in changes {
        let Change::AddVm(vm) = change else { continue };
        let Some(p) = vm.port.as_ref().filter(|_| vm.host == cfg.switch.host_id) else {
            continue;
        };
        if removed(&p.ifname) {
            continue;
        }
        let i = cfg.vms.iter().position(|v| v.name == vm.name).unwrap_or(0);
        specs.push(PortSpec {
            ifname: p.ifname.clone(),
            backend: p.backend,
            field: format!("vms[{i}].port.ifname"),
            max_frame: vm_max_frame_of(cfg, &vm.tenant),
        });
    }
    specs
}

/// The thread that opens new VMs' ports and closes removed ones for live changes: setting up
/// a port's rings takes milliseconds and tearing them down unmaps them, neither of which
/// forwarding waits for. Started once, so a change costs the loop a channel send, not a
/// thread's creation (tens of microseconds its neighbours' frames would wait).
pub(super) struct PortKeeper(mpsc::Sender<KeeperJob>);

enum KeeperJob {
    Open(
        Vec<PortSpec>,
        mpsc::Sender<anyhow::Result<Vec<Box<dyn Port>>>>,
    ),
    Close(Vec<Box<dyn Port>>),
}

impl PortKeeper {
    fn start(opener: PortOpener) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("picnic-ports".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        KeeperJob::Open(specs, done) => {
                            let _ = done.send(specs.iter().map(|s| opener(s)).collect());
                        }
                        KeeperJob::Close(ports) => drop(ports),
                    }
                }
            })
            .context("starting the thread that opens ports")?;
        Ok(Self(tx))
    }

    /// Opens `specs`' ports; all of them, or the first error, arrive on `done`.
    fn open(
        &self,
        specs: Vec<PortSpec>,
        done: mpsc::Sender<anyhow::Result<Vec<Box<dyn Port>>>>,
    ) -> anyhow::Result<()> {
        self.0
            .send(KeeperJob::Open(specs, done))
            .map_err(|_| anyhow::anyhow!("the thread that opens ports stopped"))
    }

    /// Closes `ports` (dropped on the keeper's thread, or here should it have stopped).
    fn close(&self, ports: Vec<Box<dyn Port>>) {
        if let Err(mpsc::SendError(KeeperJob::Close(ports))) = self.0.send(KeeperJob::Close(ports))
        {
            drop(ports);
        }
    }
}

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
        // Without the eventfd a change waits for the loop's next wake-up (at most 5 ms).
        self.command_wake = command_eventfd()
            .map_err(|e| eprintln!("picnic switch: warning: live changes wake nobody: {e}"))
            .ok()
            .map(|fd| {
                Arc::new(CommandWake {
                    fd,
                    pending: AtomicBool::new(false),
                })
            });
        CommandSender {
            tx,
            wake: self.command_wake.clone(),
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
                    let result = ports.and_then(|ports| self.commit(o.cfg, &o.changes, ports));
                    let _ = o.reply.send(result);
                }
                Err(mpsc::TryRecvError::Empty) => {
                    self.opening = Some(o);
                    return;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    let _ = o
                        .reply
                        .send(Err(anyhow::anyhow!("opening the new ports failed")));
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
            match self.prepare(*change) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok(r) if r.specs.is_empty() => {
                    let _ = reply.send(self.commit(r.cfg, &r.changes, Vec::new()));
                }
                Ok(r) => {
                    let (tx, done) = mpsc::channel();
                    if let Err(e) = self.port_keeper().and_then(|k| k.open(r.specs, tx)) {
                        let _ = reply.send(Err(e));
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

    /// The port keeper, started on first use.
    fn port_keeper(&mut self) -> anyhow::Result<&PortKeeper> {
        if self.keeper.is_none() {
            self.keeper = Some(PortKeeper::start(self.opener.clone())?);
        }
        Ok(self.keeper.as_ref().expect("started above"))
    }

    /// Checks an API change against this switch. It was diffed from the config running now
    /// (the API answers one request at a time) unless a change the API gave up waiting for
    /// was applied since: then it is diffed again, here.
    pub(crate) fn prepare(&self, change: Reconfigure) -> anyhow::Result<Reconfigure> {
        if self.workers > 1 && crate::workers::encrypts(&change.cfg) {
            anyhow::bail!(
                "tenants[].encrypt: the shared encryption engine runs with one worker only (switch.workers = {})",
                self.workers
            );
        }
        let running = self.shared.config();
        if let (Some(running), Some(base)) = (running, &change.base) {
            if Arc::ptr_eq(&running, base) {
                return Ok(change);
            }
        }
        Reconfigure::prepare(Arc::new(self.cfg.clone()), change.cfg)
    }

    /// Applies live changes, each touching only its host, tenant or VM in place, with the
    /// new VMs' ports `opened` (all opened before anything is applied: if one could not be,
    /// nothing changed). A removed VM's port is closed (dropped on a helper thread); the other
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
        if !closed.is_empty() {
            match self.port_keeper() {
                Ok(keeper) => keeper.close(closed),
                Err(_) => drop(closed),
            }
        }
        let (cfg, failed) = match applied {
            Ok(()) => (cfg, None),
            Err(e) if e.undo_failed.is_none() => return Err(e.into()),
            Err(e) => (e.running(&self.cfg, changes), Some(e)),
        };
        // Each step below costs system calls or threads: only what the change touched.
        if ports_changed {
            if let Err(e) = self.kernel.set_ports(&tenant_ports(&self.ports)) {
                eprintln!("picnic switch: warning: softirq accounting: {e}");
            }
        }
        if crate::workers::wants_softirq(&cfg) && !self.kernel.softirq_on() {
            self.kernel.start_softirq(&tenant_ports(&self.ports), &[]);
        }
        // Tenants that encrypt, and their keys, as the new config says (keys rotate here).
        if encryption_changed(&self.cfg, &cfg) {
            let accel = Accel::from_config_after(&cfg, self.accel.as_ref())?;
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
fn encryption_changed(old: &Config, new: &Config) -> bool {
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
