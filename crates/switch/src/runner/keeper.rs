//! The thread that opens new VMs' ports and closes removed ones for live changes
//! (docs/switch.md "Live changes"), and the removed VMs' AF_PACKET ports it keeps open
//! ([`ParkedPorts`]) in case a VM is added on the same interface.

use std::sync::{mpsc, Arc};

use anyhow::Context;

use super::wake::CommandWake;
use super::{PortOpener, PortSpec};
use crate::port::{Backend, Port};

/// How long a removed VM's AF_PACKET port stays open for a VM added on the same interface:
/// longer than a delete and a re-add by an API client take (a VM removed and added on the
/// same port within one change keeps its port without this), short enough that a port given
/// up for good is closed soon. Closing and opening such a socket each wait for RCU grace periods (three for a VM
/// removed and added back), whose work lands on the CPUs the neighbours run on
/// (docs/switch.md "Live changes"); a port taken back costs none.
pub(super) const PARK: std::time::Duration = std::time::Duration::from_secs(2);

/// The ports removed VMs gave up, kept open for [`PARK`] in case a VM is added on the same
/// interface ([`Port::reuse`]); only AF_PACKET ports, the backend that supports it.
#[derive(Default)]
pub(super) struct ParkedPorts(Vec<(std::time::Instant, Box<dyn Port>)>);

impl ParkedPorts {
    /// Keeps `ports` from `now`; returns the ones to close now (other backends, and a port
    /// parked earlier under the same name).
    pub(super) fn park(
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
    pub(super) fn take(
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
    pub(super) fn expired(&mut self, now: std::time::Instant) -> Vec<Box<dyn Port>> {
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
    pub(super) fn next_expiry(&self) -> Option<std::time::Instant> {
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
    pub(super) fn start(opener: PortOpener) -> anyhow::Result<Self> {
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
    pub(super) fn open(
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
    pub(super) fn open_now(
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
    pub(super) fn close(&self, ports: Vec<Box<dyn Port>>) {
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
#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Instant;

    use super::*;
    use crate::runner::fake_port::{spec, Counts};
    use crate::runner::wake::command_eventfd;

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
