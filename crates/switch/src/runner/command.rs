//! The API's side of live changes (docs/switch.md "Live changes"): a change is diffed and its
//! new VMs' ports opened on the API's thread ([`Reconfigure`], [`CommandSender`]), so that the
//! run loop only applies it; the loop is woken by an eventfd when a change arrives.

use std::sync::{mpsc, Arc, Mutex};

use super::keeper::PortKeeper;
use super::wake::CommandWake;
use super::{vm_max_frame_of, Command, PortSpec};
use crate::change::Change;
use crate::config::Config;
use crate::port::Port;

/// An API change made ready on the API's thread, so that the run loop only applies it: the
/// new config, the changes that turn `base` (the running config the API read) into it, and
/// the ports its new VMs need (`specs`), which [`CommandSender::send`] has opened (`opened`)
/// before the loop sees the change. Diffing compares whole entries and takes tens of
/// microseconds, which the neighbours' frames would otherwise wait for in their rings.
pub struct Reconfigure {
    pub(super) base: Option<Arc<Config>>,
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
    pub(super) tx: mpsc::Sender<Command>,
    pub(super) wake: Option<Arc<CommandWake>>,
    /// None: the loop has the ports opened itself.
    pub(super) keeper: Option<PortKeeper>,
    pub(super) given_up: GivenUp,
}

/// The ports removed VMs gave up, put here by the loop (a lock nobody else holds for long,
/// no system call), with when: the next change takes them to the keeper (parked, and given
/// back to a VM added on the same interface), or the loop after [`HANDOVER`].
pub(crate) type GivenUp = Arc<Mutex<Vec<(std::time::Instant, Box<dyn Port>)>>>;

/// How long given-up ports wait for a change to take them before the loop hands them to the
/// keeper itself (at a publish).
pub(super) const HANDOVER: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes the ports out of `given_up` (all, or those given up at least `age` ago).
pub(super) fn take_given_up(given_up: &GivenUp, age: std::time::Duration) -> Vec<Box<dyn Port>> {
    let mut list = given_up.lock().unwrap_or_else(|e| e.into_inner());
    let now = std::time::Instant::now();
    let (old, young) = std::mem::take(&mut *list)
        .into_iter()
        .partition::<Vec<_>, _>(|(at, _)| now.saturating_duration_since(*at) >= age);
    *list = young;
    old.into_iter().map(|(_, p)| p).collect()
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
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::port::Backend;
    use crate::runner::fake_port::{spec, Counts};
    use crate::runner::PortOpener;

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
}
