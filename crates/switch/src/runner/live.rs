//! Live changes in the run loop (docs/switch.md "Live changes"): the API's new config
//! becomes in-place changes to the engines ([`crate::engine::Engine::apply_all`]); only a new
//! VM's port is opened (by a keeper thread, asked by the API's thread before the loop sees the
//! change: setting up its rings takes milliseconds that forwarding must not wait for) and
//! only a removed VM's port is given up (kept open for [`PARK`] in case a VM is added on the
//! same interface, then closed). The loop wakes no other thread in the middle of a change. A
//! list of changes is applied whole or not at all: a port that cannot be opened stops it
//! before anything changed, a change the engine refuses has the ones before it undone.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::Context;
use picnic_core::Duration;

use super::{ring_wait, tenant_ports, vm_max_frame_of, Command, PortOpener, PortSpec, Switch};
use crate::accel::Accel;
use crate::cgroup::CpuQuota;
use crate::change::Change;
use crate::config::Config;
use crate::engine::{PortChange, IRON_PERIOD};
use crate::port::{Backend, Port};

/// An API change made ready on the API's thread, so that the run loop only applies it: the
/// new config, the changes that turn `base` (the running config the API read) into it, and
/// the ports its new VMs need (`specs`), which [`CommandSender::send`] has opened (`opened`)
/// before the loop sees the change. Diffing compares whole entries and takes tens of
/// microseconds, which the neighbours' frames would otherwise wait for in their rings.
pub struct Reconfigure {
    base: Option<Arc<Config>>,
    pub(crate) cfg: Config,
    pub(crate) changes: Vec<Change>,
    pub(crate) specs: Vec<PortSpec>,
    pub(crate) opened: Vec<Box<dyn Port>>,
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
            opened: Vec::new(),
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
            opened: Vec::new(),
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
/// second against a neighbour's 2,000 frames a second, one of its frames in twenty). A
/// change's new ports are opened (by the keeper) before it is sent, and the ports removed
/// VMs gave up are taken to the keeper from here: either woke the keeper from the loop,
/// whose thread then ran in the loop's place on its CPU (60 us at the median, measured).
#[derive(Clone)]
pub struct CommandSender {
    tx: mpsc::Sender<Command>,
    wake: Option<Arc<CommandWake>>,
    /// None: the loop has the ports opened itself.
    keeper: Option<PortKeeper>,
    given_up: GivenUp,
}

/// The ports removed VMs gave up, put here by the loop (a lock nobody else holds for long,
/// no system call), with when: the next change takes them to the keeper (parked, and given
/// back to a VM added on the same interface), or the loop after [`HANDOVER`].
pub(crate) type GivenUp = Arc<Mutex<Vec<(std::time::Instant, Box<dyn Port>)>>>;

/// How long the loop may hold an answer to the API back while it has frames to handle.
const ANSWER_WITHIN: Duration = Duration::from_millis(1);

/// How long given-up ports wait for a change to take them before the loop hands them to the
/// keeper itself (at a publish).
const HANDOVER: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes the ports out of `given_up` (all, or those given up at least `age` ago).
fn take_given_up(given_up: &GivenUp, age: std::time::Duration) -> Vec<Box<dyn Port>> {
    let mut list = given_up.lock().unwrap_or_else(|e| e.into_inner());
    let now = std::time::Instant::now();
    let (old, young) = std::mem::take(&mut *list)
        .into_iter()
        .partition::<Vec<_>, _>(|(at, _)| now.saturating_duration_since(*at) >= age);
    *list = young;
    old.into_iter().map(|(_, p)| p).collect()
}

/// The eventfd that wakes the loop, and whether it was written since the loop last drained
/// it (so that the loop reads it only then, not on every wait).
pub(super) struct CommandWake {
    fd: OwnedFd,
    pending: AtomicBool,
}

impl CommandWake {
    /// Makes the loop's wait return.
    fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 we own to an eventfd we hold open.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // Set after the write: the loop drains only what was written before it saw this.
        self.pending.store(true, Ordering::Release);
    }
}

impl CommandSender {
    /// A sender that wakes nobody (for stand-ins of the run loop that block on `rx`).
    pub fn new(tx: mpsc::Sender<Command>) -> Self {
        Self {
            tx,
            wake: None,
            keeper: None,
            given_up: GivenUp::default(),
        }
    }

    /// Sends `command`, its new ports opened first; a port that cannot be opened is answered
    /// on its reply here, and the loop never sees the change.
    pub fn send(&self, mut command: Command) -> Result<(), mpsc::SendError<Command>> {
        if let (Some(keeper), Command::Reconfigure(change, reply)) = (&self.keeper, &mut command) {
            let closed = take_given_up(&self.given_up, std::time::Duration::ZERO);
            if change.specs.is_empty() {
                if !closed.is_empty() {
                    keeper.close(closed);
                }
            } else {
                match keeper.open_now(std::mem::take(&mut change.specs), closed) {
                    Ok(ports) => change.opened = ports,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return Ok(());
                    }
                }
            }
        }
        self.tx.send(command)?;
        if let Some(wake) = &self.wake {
            wake.wake();
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
            create: p.create,
            socket: p.socket.clone(),
            field: format!("vms[{i}].port.ifname"),
            max_frame: vm_max_frame_of(cfg, &vm.tenant),
        });
    }
    specs
}

/// How long a removed VM's AF_PACKET port stays open for a VM added on the same interface:
/// longer than a delete and a re-add by an API client take (a VM removed and added on the
/// same port within one change keeps its port without this), short enough that a port given
/// up for good is closed soon. Closing and opening such a socket each wait for RCU grace periods (three for a VM
/// removed and added back), whose work lands on the CPUs the neighbours run on
/// (docs/switch.md "Live changes"); a port taken back costs none.
pub(crate) const PARK: std::time::Duration = std::time::Duration::from_secs(2);

/// The ports removed VMs gave up, kept open for [`PARK`] in case a VM is added on the same
/// interface ([`Port::reuse`]); only AF_PACKET ports, the backend that supports it.
#[derive(Default)]
pub(crate) struct ParkedPorts(Vec<(std::time::Instant, Box<dyn Port>)>);

impl ParkedPorts {
    /// Keeps `ports` from `now`; returns the ones to close now (other backends, and a port
    /// parked earlier under the same name).
    pub(crate) fn park(
        &mut self,
        ports: Vec<Box<dyn Port>>,
        now: std::time::Instant,
    ) -> Vec<Box<dyn Port>> {
        let mut close = Vec::new();
        for port in ports {
            if port.backend() != Backend::AfPacket {
                close.push(port);
                continue;
            }
            if let Some(i) = self.0.iter().position(|(_, p)| p.name() == port.name()) {
                close.push(self.0.swap_remove(i).1);
            }
            self.0.push((now, port));
        }
        close
    }

    /// The parked port for `spec`, readied as if just opened; a parked port of that name
    /// that cannot be reused goes to `close`.
    pub(crate) fn take(
        &mut self,
        spec: &PortSpec,
        close: &mut Vec<Box<dyn Port>>,
    ) -> Option<Box<dyn Port>> {
        let i = self
            .0
            .iter()
            .position(|(_, p)| p.name() == spec.ifname && p.backend() == spec.backend)?;
        let mut port = self.0.swap_remove(i).1;
        if port.reuse(spec.max_frame) {
            return Some(port);
        }
        close.push(port);
        None
    }

    /// The ports parked for [`PARK`] or longer at `now`, taken out.
    pub(crate) fn expired(&mut self, now: std::time::Instant) -> Vec<Box<dyn Port>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.0.len() {
            if now.saturating_duration_since(self.0[i].0) >= PARK {
                out.push(self.0.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        out
    }

    /// When the next parked port expires.
    pub(crate) fn next_expiry(&self) -> Option<std::time::Instant> {
        self.0.iter().map(|(since, _)| *since + PARK).min()
    }
}

/// The thread that opens new VMs' ports and closes removed ones for live changes: setting up
/// a port's rings takes milliseconds and tearing them down unmaps them, neither of which
/// forwarding waits for. Started once, so a change costs the loop a channel send, not a
/// thread's creation (tens of microseconds its neighbours' frames would wait). A removed
/// VM's AF_PACKET port is parked for [`PARK`] and given back to a VM added on the same
/// interface meanwhile instead of a new socket ([`ParkedPorts`]).
#[derive(Clone)]
pub(crate) struct PortKeeper(mpsc::Sender<KeeperJob>);

/// Opened ports (or the first error), and what to wake once they are sent.
type Opened = (
    mpsc::Sender<anyhow::Result<Vec<Box<dyn Port>>>>,
    Option<Arc<CommandWake>>,
);

enum KeeperJob {
    /// Ports to open, after parking the ports removed VMs gave up meanwhile.
    Open(Vec<PortSpec>, Vec<Box<dyn Port>>, Opened),
    Close(Vec<Box<dyn Port>>),
}

impl PortKeeper {
    fn start(opener: PortOpener) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("picnic-ports".into())
            .spawn(move || keep_ports(&rx, &opener))
            .context("starting the thread that opens ports")?;
        Ok(Self(tx))
    }

    /// Opens `specs`' ports; all of them, or the first error, arrive on `done.0`, and then
    /// `done.1` wakes the run loop, so that it applies the change between frames rather than
    /// just before the frame that next wakes it.
    fn open(
        &self,
        specs: Vec<PortSpec>,
        closed: Vec<Box<dyn Port>>,
        done: Opened,
    ) -> anyhow::Result<()> {
        self.0
            .send(KeeperJob::Open(specs, closed, done))
            .map_err(|_| anyhow::anyhow!("the thread that opens ports stopped"))
    }

    /// Opens `specs`' ports, after parking `closed`, and waits for them.
    fn open_now(
        &self,
        specs: Vec<PortSpec>,
        closed: Vec<Box<dyn Port>>,
    ) -> anyhow::Result<Vec<Box<dyn Port>>> {
        let (tx, done) = mpsc::channel();
        self.open(specs, closed, (tx, None))?;
        done.recv()
            .map_err(|_| anyhow::anyhow!("the thread that opens ports stopped"))?
    }

    /// Closes `ports` (parked or dropped on the keeper's thread, or dropped here should it
    /// have stopped).
    fn close(&self, ports: Vec<Box<dyn Port>>) {
        if let Err(mpsc::SendError(KeeperJob::Close(ports))) = self.0.send(KeeperJob::Close(ports))
        {
            drop(ports);
        }
    }
}

/// The keeper's thread: opens (or takes back from the parked ones) and parks ports as asked,
/// and closes parked ports once they expire, until the switch drops its end.
fn keep_ports(rx: &mpsc::Receiver<KeeperJob>, opener: &PortOpener) {
    let mut parked = ParkedPorts::default();
    loop {
        let job = match parked.next_expiry() {
            Some(at) => {
                let wait = at.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(wait) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
            None => match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            },
        };
        let mut close = parked.expired(std::time::Instant::now());
        match job {
            Some(KeeperJob::Open(specs, closed, (done, wake))) => {
                close.extend(parked.park(closed, std::time::Instant::now()));
                let ports = specs
                    .iter()
                    .map(|s| match parked.take(s, &mut close) {
                        Some(port) => Ok(port),
                        None => opener(s),
                    })
                    .collect();
                let _ = done.send(ports);
                if let Some(wake) = wake {
                    wake.wake();
                }
            }
            Some(KeeperJob::Close(ports)) => {
                close.extend(parked.park(ports, std::time::Instant::now()));
            }
            None => {}
        }
        // After the answer: closing waits for RCU grace periods.
        drop(close);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    use super::*;
    use crate::frame::{Frame, FramePool};
    use crate::port::PortStats;

    /// A port that says it is AF_PACKET (or not) and whether it can be reused, and counts
    /// its reuses and drops.
    struct Fake {
        name: String,
        backend: Backend,
        reusable: bool,
        reused: Arc<AtomicUsize>,
        dropped: Arc<AtomicUsize>,
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Port for Fake {
        fn name(&self) -> &str {
            &self.name
        }
        fn backend(&self) -> Backend {
            self.backend
        }
        fn recv_batch(
            &mut self,
            _: &mut FramePool,
            _: &mut Vec<Frame>,
            _: usize,
        ) -> std::io::Result<usize> {
            Ok(0)
        }
        fn send_batch(&mut self, _: &mut Vec<Frame>, _: &mut FramePool) -> std::io::Result<usize> {
            Ok(0)
        }
        fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
        fn stats(&self) -> PortStats {
            PortStats::default()
        }
        fn reuse(&mut self, max_frame: usize) -> bool {
            assert_eq!(max_frame, 1500);
            self.reused.fetch_add(1, Ordering::SeqCst);
            self.reusable
        }
    }

    #[derive(Default)]
    struct Counts {
        reused: Arc<AtomicUsize>,
        dropped: Arc<AtomicUsize>,
    }

    impl Counts {
        fn port(&self, name: &str, backend: Backend, reusable: bool) -> Box<dyn Port> {
            Box::new(Fake {
                name: name.into(),
                backend,
                reusable,
                reused: self.reused.clone(),
                dropped: self.dropped.clone(),
            })
        }
        fn reused(&self) -> usize {
            self.reused.load(Ordering::SeqCst)
        }
        fn dropped(&self) -> usize {
            self.dropped.load(Ordering::SeqCst)
        }
    }

    fn spec(ifname: &str) -> PortSpec {
        PortSpec {
            ifname: ifname.into(),
            backend: Backend::AfPacket,
            create: false,
            socket: None,
            field: "vms[0].port.ifname".into(),
            max_frame: 1500,
        }
    }

    #[test]
    fn a_parked_af_packet_port_is_given_back_by_name_until_it_expires() {
        let c = Counts::default();
        let mut parked = ParkedPorts::default();
        let t0 = Instant::now();
        let close = parked.park(
            vec![
                c.port("b1", Backend::AfPacket, true),
                c.port("t1", Backend::Tap, true),
            ],
            t0,
        );
        assert_eq!(close.len(), 1, "only AF_PACKET ports are parked");
        assert_eq!(close[0].name(), "t1");
        drop(close);
        let mut close = Vec::new();
        assert!(parked.take(&spec("b2"), &mut close).is_none());
        let tap = PortSpec {
            backend: Backend::Tap,
            ..spec("b1")
        };
        assert!(parked.take(&tap, &mut close).is_none(), "another backend");
        let port = parked.take(&spec("b1"), &mut close).expect("parked");
        assert_eq!((port.name(), c.reused(), close.len()), ("b1", 1, 0));
        assert!(parked.take(&spec("b1"), &mut close).is_none(), "taken once");

        // Parked again: expires PARK later, not before.
        assert!(parked.park(vec![port], t0).is_empty());
        assert_eq!(parked.next_expiry(), Some(t0 + PARK));
        assert!(parked
            .expired(t0 + PARK - std::time::Duration::from_millis(1))
            .is_empty());
        let gone = parked.expired(t0 + PARK);
        assert_eq!(gone.len(), 1);
        assert_eq!(parked.next_expiry(), None);
        drop(gone);
        assert_eq!(c.dropped(), 2);
    }

    #[test]
    fn a_port_that_cannot_be_reused_is_closed_and_a_second_of_the_same_name_replaces_the_first() {
        let c = Counts::default();
        let mut parked = ParkedPorts::default();
        let t0 = Instant::now();
        assert!(parked
            .park(vec![c.port("b1", Backend::AfPacket, false)], t0)
            .is_empty());
        let mut close = Vec::new();
        assert!(parked.take(&spec("b1"), &mut close).is_none());
        assert_eq!(
            (c.reused(), close.len()),
            (1, 1),
            "tried, then to be closed"
        );
        drop(close);
        assert_eq!(parked.next_expiry(), None);

        assert!(parked
            .park(vec![c.port("b1", Backend::AfPacket, true)], t0)
            .is_empty());
        let close = parked.park(vec![c.port("b1", Backend::AfPacket, true)], t0);
        assert_eq!(close.len(), 1, "the older one is closed");
        drop(close);
        assert_eq!(c.dropped(), 2);
        assert!(parked.take(&spec("b1"), &mut Vec::new()).is_some());
    }

    /// The keeper's thread opens a port once: closed and asked for again, it gives the same
    /// one back instead of opening another; so too when the port comes with the request (the
    /// run loop hands removed VMs' ports over with the next opening).
    #[test]
    fn the_keeper_gives_a_closed_port_back_instead_of_opening_a_new_one() {
        let c = Arc::new(Counts::default());
        let opened = Arc::new(AtomicUsize::new(0));
        let (c2, opened2) = (c.clone(), opened.clone());
        let opener: PortOpener = Arc::new(move |s: &PortSpec| {
            opened2.fetch_add(1, Ordering::SeqCst);
            Ok(c2.port(&s.ifname, s.backend, true))
        });
        let keeper = PortKeeper::start(opener).unwrap();
        let open = |keeper: &PortKeeper, closed| {
            let (tx, rx) = mpsc::channel();
            keeper.open(vec![spec("b1")], closed, (tx, None)).unwrap();
            rx.recv().unwrap().unwrap()
        };
        let ports = open(&keeper, Vec::new());
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        keeper.close(ports);
        let ports = open(&keeper, Vec::new());
        assert_eq!(ports.len(), 1);
        assert_eq!((opened.load(Ordering::SeqCst), c.reused()), (1, 1));
        let ports = open(&keeper, ports);
        assert_eq!(ports.len(), 1);
        assert_eq!((opened.load(Ordering::SeqCst), c.reused()), (1, 2));
        assert_eq!(c.dropped(), 0, "nothing closed");
        drop(ports);
        drop(keeper);
    }

    /// A sender with a keeper over `opener`, and the loop's end of its queue.
    fn sender(opener: PortOpener) -> (CommandSender, mpsc::Receiver<Command>) {
        let (tx, rx) = mpsc::channel();
        let mut sender = CommandSender::new(tx);
        sender.keeper = Some(PortKeeper::start(opener).unwrap());
        (sender, rx)
    }

    /// A change adding a VM on port `ifname` (only its port matters here).
    fn adding(ifname: &str) -> Box<Reconfigure> {
        let cfg = Config::parse(include_str!("../../../../examples/host1.toml")).unwrap();
        let mut change = Reconfigure::to(cfg);
        change.specs = vec![spec(ifname)];
        Box::new(change)
    }

    /// The loop gets a change with its new ports open, and the ports a removed VM gave up go
    /// to the keeper with the next change, which takes one back instead of opening another.
    /// The loop opens nothing and wakes no other thread.
    #[test]
    fn the_api_side_opens_new_ports_and_takes_given_up_ones_to_the_keeper() {
        let c = Arc::new(Counts::default());
        let opened = Arc::new(AtomicUsize::new(0));
        let (c2, opened2) = (c.clone(), opened.clone());
        let (sender, rx) = sender(Arc::new(move |s: &PortSpec| {
            opened2.fetch_add(1, Ordering::SeqCst);
            Ok(c2.port(&s.ifname, s.backend, true))
        }));
        let (reply, _) = mpsc::channel();
        sender
            .send(Command::Reconfigure(adding("b1"), reply.clone()))
            .unwrap();
        let Command::Reconfigure(change, _) = rx.recv().unwrap();
        assert!(change.specs.is_empty());
        assert_eq!(change.opened.len(), 1);
        assert_eq!(change.opened[0].name(), "b1");
        // The loop removes b1's VM: its port is given up, then b1 is added back.
        let now = std::time::Instant::now();
        sender
            .given_up
            .lock()
            .unwrap()
            .extend(change.opened.into_iter().map(|p| (now, p)));
        sender
            .send(Command::Reconfigure(adding("b1"), reply))
            .unwrap();
        let Command::Reconfigure(change, _) = rx.recv().unwrap();
        assert_eq!(change.opened.len(), 1);
        assert_eq!((opened.load(Ordering::SeqCst), c.reused()), (1, 1));
        assert!(sender.given_up.lock().unwrap().is_empty());
        assert_eq!(c.dropped(), 0);
    }

    /// A port that cannot be opened is answered on the change's reply, and the loop never
    /// sees the change.
    #[test]
    fn a_port_that_cannot_be_opened_keeps_the_change_from_the_loop() {
        let (sender, rx) = sender(Arc::new(|s: &PortSpec| {
            anyhow::bail!("{}: no such interface", s.field)
        }));
        let (reply, answer) = mpsc::channel();
        sender
            .send(Command::Reconfigure(adding("b9"), reply))
            .unwrap();
        let e = answer.recv().unwrap().unwrap_err();
        assert_eq!(e.to_string(), "vms[0].port.ifname: no such interface");
        assert!(rx.try_recv().is_err());
    }

    /// Given-up ports no change took are the loop's to hand over after [`HANDOVER`], not
    /// before.
    #[test]
    fn given_up_ports_wait_for_a_change_until_the_handover() {
        let c = Counts::default();
        let given_up = GivenUp::default();
        let now = std::time::Instant::now();
        given_up.lock().unwrap().extend([
            (now - HANDOVER, c.port("b1", Backend::AfPacket, true)),
            (now, c.port("b2", Backend::AfPacket, true)),
        ]);
        let old = take_given_up(&given_up, HANDOVER);
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].name(), "b1");
        let all = take_given_up(&given_up, std::time::Duration::ZERO);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].name(), "b2");
        assert!(given_up.lock().unwrap().is_empty());
    }

    /// The keeper wakes the run loop once the ports it opened are sent, so that the loop
    /// applies the change at once rather than just before whatever frame woke it next.
    #[test]
    fn the_keeper_wakes_the_loop_when_the_ports_are_open() {
        let c = Arc::new(Counts::default());
        let c2 = c.clone();
        let opener: PortOpener =
            Arc::new(move |s: &PortSpec| Ok(c2.port(&s.ifname, s.backend, true)));
        let keeper = PortKeeper::start(opener).unwrap();
        let wake = Arc::new(CommandWake {
            fd: command_eventfd().unwrap(),
            pending: AtomicBool::new(false),
        });
        let fd = wake.fd.as_raw_fd();
        let quiet = std::time::Duration::ZERO;
        assert!(!crate::port::wait_readable(&[fd], quiet).unwrap());
        let (tx, rx) = mpsc::channel();
        keeper
            .open(vec![spec("b1")], Vec::new(), (tx, Some(wake.clone())))
            .unwrap();
        let ports = rx.recv().unwrap().unwrap();
        let woken = std::time::Duration::from_secs(5);
        assert!(crate::port::wait_readable(&[fd], woken).unwrap());
        drop(ports);
    }
}
