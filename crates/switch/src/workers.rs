//! The worker model (DESIGN.md 4 "Workers", docs/switch.md "Workers"): N dataplane threads,
//! each running the same [`crate::driver::Driver`] over the VM ports it owns and its own
//! uplink socket, with its own [`crate::engine::Engine`] (per-VM queues, WFQ, shapers, meters
//! are per VM anyway, and every VM has exactly one owner).
//!
//! What spans workers, and how it stays correct without a lock on the per-packet path:
//! - **Tenant CPU budgets** (Iron 3.2, [`crate::engine::SharedBudgets`]): one
//!   [`picnic_core::iron::shared::SharedAccount`] per tenant with a quota for the whole host,
//!   refilled once per period by Iron's Algorithm 1 (debt carried, a leftover dropped), from
//!   which each worker takes slices ([`picnic_core::iron::shared::Slice`], CFS's and Iron's
//!   per-core `rt_remain`). Each worker settles its measured costs from its slice; what no
//!   slice covers is debt on the account. The coordinator charges the ports' softirq time to
//!   the same accounts and refills the tenants' cgroups from them.
//! - **Tenant SLOs**: a tenant's conformance must be judged on all its traffic, so the VMs of
//!   a tenant with an SLO are assigned to one worker ([`assign`]); each worker reports the
//!   SLO tenants it owns.
//! - **Frames that reach the wrong worker**: an uplink frame for a VM another worker owns, or
//!   a frame an engine queued for another worker's port, is handed over through that worker's
//!   bounded lock-free [`Mailbox`] (dropped, counted as `handoff_full`, when it is full);
//!   standalone congestion feedback is copied to every worker, whose senders all obey it.
//! - **Control**: the coordinator turns an API change into live changes, tries them on an
//!   engine of its own that mirrors the workers' directories, opens a new VM's port and places
//!   the VM ([`Assignment::place`]), then posts the changes to every worker's control queue
//!   ([`Mailbox::control`]); each applies them to its engine between passes, the owner
//!   installs the new port or gives the removed one back. No worker stops, and no frame but a
//!   removed VM's leaves a queue. Each worker publishes its snapshot through its own `arc-swap`
//!   slot and the coordinator merges them ([`crate::coordinator::merge`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use crossbeam_queue::{ArrayQueue, SegQueue};

use crate::accel::AccelPort;
use crate::change::Change;
use crate::config::Config;
use crate::directory::{Directory, PortIdx, VmIdx};
use crate::engine::{ChangeFailed, SharedBudgets};
use crate::frame::Frame;
use crate::port::Port;

/// The default number of workers: one per CPU the switch may run on, at most one per local
/// VM port (a worker without a VM would only share the uplink), at least one.
pub fn default_count(cpus: usize, vm_ports: usize) -> usize {
    cpus.min(vm_ports).max(1)
}

/// Whether `cfg` has the ports' softirq time measured and charged: while Iron runs (a tenant
/// has a CPU quota), or while the kernel fast path forwards in the senders' softirq (the
/// tracepoints are the only account of that work per tenant). Not otherwise, as they cost
/// every packet of the host (docs/switch.md "eBPF").
pub fn wants_softirq(cfg: &Config) -> bool {
    cfg.isolation.cpu_accounting
        && cfg.isolation.softirq_accounting
        && (cfg.fastpath.kernel || cfg.tenants.iter().any(|t| t.cpu_quota.is_some()))
}

/// How many workers `cfg` asks for with `vm_ports` local VM ports: `switch.workers`, else one
/// per CPU of `switch.cpus` or of the thread's affinity mask, at most one per VM port.
pub fn worker_count(cfg: &Config, vm_ports: usize) -> usize {
    // The kernel fast path runs with one worker (docs/switch.md "Two paths").
    if cfg.switch.workers.is_none() && cfg.fastpath.kernel {
        return 1;
    }
    cfg.switch.workers.unwrap_or_else(|| {
        let cpus = match &cfg.switch.cpus {
            Some(c) => c.len(),
            None => crate::sched::thread_cpus().map(|c| c.len()).unwrap_or(1),
        };
        crate::workers::default_count(cpus, vm_ports)
    })
}

/// The CPU each of `workers` workers is pinned to: one of `switch.cpus` each when it lists
/// one per worker; else none, and every worker may run on all of `switch.cpus` (or anywhere).
pub fn pinned_cpus(cfg: &Config, workers: usize) -> Vec<Option<usize>> {
    match &cfg.switch.cpus {
        Some(cpus) if cpus.len() >= workers => cpus[..workers].iter().copied().map(Some).collect(),
        _ => vec![None; workers],
    }
}

/// Which worker owns each port: `owner[p]` for every port index (the uplink, which every
/// worker reads through its own socket, is listed as worker 0's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub owner: Vec<usize>,
    /// The CPU each worker is pinned to, if it is ([`pinned_cpus`]): one entry per worker.
    pub cpus: Vec<Option<usize>>,
}

impl Assignment {
    /// Every port on worker 0 (the single-loop switch).
    pub fn single(ports: usize) -> Assignment {
        Assignment {
            owner: vec![0; ports],
            cpus: vec![None],
        }
    }

    /// How many workers share the ports.
    pub fn workers(&self) -> usize {
        self.cpus.len()
    }

    /// The ports worker `w` owns, the uplink excluded.
    pub fn ports_of(&self, w: usize) -> impl Iterator<Item = PortIdx> + '_ {
        (1..self.owner.len()).filter(move |&p| self.owner[p] == w)
    }

    /// The workers that may serve VMs on `cpus` (their vCPUs): those pinned to one of them;
    /// every worker when none is (no affinity asked, or no worker on those CPUs).
    fn serving(&self, cpus: &[usize]) -> Vec<usize> {
        let on: Vec<usize> = (0..self.workers())
            .filter(|&w| self.cpus[w].is_some_and(|c| cpus.contains(&c)))
            .collect();
        if on.is_empty() {
            (0..self.workers()).collect()
        } else {
            on
        }
    }

    /// Places the VM a live change added on `port` (in `dir`, which has it) and returns its
    /// worker: with its tenant's other VMs when the tenant has an SLO (one monitor sees all its
    /// traffic), else on the worker serving its CPUs with the least guarantee, then the fewest
    /// VMs, then the lowest index, as [`assign`] places VMs at start. The other VMs stay where
    /// they are.
    pub fn place(&mut self, dir: &Directory, port: PortIdx) -> usize {
        self.owner.resize(dir.port_count().max(port + 1), 0);
        let vm = dir.port_vm[port];
        let tenant = vm.map(|v| dir.vms[v].tenant);
        let others = || dir.local_vms().filter(move |&(_, p)| p != port);
        let with_tenant = tenant
            .filter(|&t| dir.tenants[t].slo.is_some())
            .and_then(|t| others().find(|&(v, _)| dir.vms[v].tenant == t))
            .map(|(_, p)| self.owner[p]);
        let w = with_tenant.unwrap_or_else(|| {
            let mut load = vec![(0u64, 0usize); self.workers()];
            for (v, p) in others() {
                let l = &mut load[self.owner[p].min(self.workers() - 1)];
                l.0 += dir.vms[v].min_bps.max(1);
                l.1 += 1;
            }
            let cpus = vm.map_or(&[][..], |v| &dir.vms[v].cpus);
            self.serving(cpus)
                .into_iter()
                .min_by_key(|&w| (load[w].0, load[w].1, w))
                .expect("at least one worker")
        });
        self.owner[port] = w;
        w
    }
}

/// Assigns the local VMs' ports to workers pinned to `cpus` (one entry per worker, None for
/// an unpinned one). VMs are placed one by one, heaviest guarantee first (ties in config
/// order), each on the worker with the least guarantee so far (then the fewest VMs, then the
/// lowest index) among those serving its CPUs, as OVS places PMD rx queues by load and
/// `pmd-rxq-affinity`. The VMs of a tenant with an SLO are placed together, as one unit
/// weighing their sum, so one worker's monitor sees all the tenant's traffic. Deterministic.
pub fn assign(dir: &Directory, cpus: Vec<Option<usize>>) -> Assignment {
    let mut assignment = Assignment {
        owner: vec![0; dir.port_count()],
        cpus,
    };
    if assignment.cpus.is_empty() {
        assignment.cpus.push(None);
    }
    // Units: (weight, ports), in config order of their first VM.
    let mut units: Vec<(u64, Vec<PortIdx>)> = Vec::new();
    let mut unit_of_tenant: Vec<Option<usize>> = vec![None; dir.tenants.len()];
    for (v, p) in dir.local_vms() {
        let vm = &dir.vms[v];
        let weight = vm.min_bps.max(1);
        let together = dir.tenants[vm.tenant].slo.is_some();
        match unit_of_tenant[vm.tenant].filter(|_| together) {
            Some(u) => {
                units[u].0 += weight;
                units[u].1.push(p);
            }
            None => {
                if together {
                    unit_of_tenant[vm.tenant] = Some(units.len());
                }
                units.push((weight, vec![p]));
            }
        }
    }
    // Stable: equal weights keep config order.
    units.sort_by_key(|u| std::cmp::Reverse(u.0));
    let mut load = vec![(0u64, 0usize); assignment.workers()];
    for (weight, ports) in units {
        let cpus: Vec<usize> = ports
            .iter()
            .filter_map(|&p| dir.port_vm[p])
            .flat_map(|v| dir.vms[v].cpus.iter().copied())
            .collect();
        let w = assignment
            .serving(&cpus)
            .into_iter()
            .min_by_key(|&w| (load[w].0, load[w].1, w))
            .expect("at least one worker");
        load[w].0 += weight;
        load[w].1 += ports.len();
        for p in ports {
            assignment.owner[p] = w;
        }
    }
    assignment
}

/// A frame handed from one worker to another.
pub enum Handoff {
    /// Received on the sender's uplink socket, for a VM the receiver owns: the receiver's
    /// engine takes it as if read from its own uplink socket.
    Uplink(Frame),
    /// A frame to transmit on a port the receiver owns, for the VM (slot and generation) the
    /// sender's directory has there: a frame for a VM removed meanwhile never reaches a VM
    /// added later on the same port.
    Tx(PortIdx, (VmIdx, u32), Frame),
    /// A frame to transmit on the uplink, from a worker without an uplink socket of its own
    /// (fewer NIC queues than workers, a TAP uplink) to worker 0, which has one.
    UplinkTx(Frame),
    /// A copy of a frame carrying congestion feedback, for the receiver's senders.
    Feedback(Frame),
}

/// Live changes for one worker ([`Mailbox::control`]): the changes from the running config
/// `old`, the ports of new VMs placed on this worker, every port's owner afterwards and, when
/// the tenants' quotas changed, the new CPU budgets.
pub struct Control {
    pub old: Arc<Config>,
    pub changes: Arc<Vec<Change>>,
    pub ports: Vec<Box<dyn Port>>,
    pub owner: Arc<Vec<usize>>,
    pub budgets: Option<Arc<SharedBudgets>>,
    /// A new shared encryption engine's port for this worker (`Some(None)`: no engine now).
    pub accel: Option<Option<AccelPort>>,
    pub reply: mpsc::Sender<Applied>,
}

/// A worker's answer to a [`Control`]: whether its engine took the changes, and the ports it
/// gave up (removed VMs', for the coordinator to close).
pub struct Applied {
    pub worker: usize,
    pub result: Result<(), ChangeFailed>,
    pub closed: Vec<Box<dyn Port>>,
}

/// A worker's inbox: a bounded lock-free queue other workers post frames to, the frames it
/// is owed back (every frame handed over is repaid from the receiver's pool, so each pool keeps
/// its size), the coordinator's live changes, and an eventfd that wakes it from its wait when
/// it sleeps.
pub struct Mailbox {
    inbox: ArrayQueue<(usize, Handoff)>,
    control: SegQueue<Control>,
    returns: ArrayQueue<Frame>,
    wake: OwnedFd,
    sleeping: AtomicBool,
    /// Set after every write to `wake`: the worker reads (clears) the eventfd only when it
    /// was written, not after every wait.
    kicked: AtomicBool,
}

impl Mailbox {
    /// A mailbox holding up to `capacity` frames in flight.
    pub fn new(capacity: usize) -> std::io::Result<Mailbox> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mailbox {
            inbox: ArrayQueue::new(capacity.max(1)),
            returns: ArrayQueue::new(capacity.max(1)),
            control: SegQueue::new(),
            // SAFETY: `fd` is a fresh descriptor owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
            kicked: AtomicBool::new(false),
        })
    }

    /// Posts a frame from worker `from`; gives it back when the inbox is full.
    pub fn post(&self, from: usize, h: Handoff) -> Result<(), Handoff> {
        self.inbox.push((from, h)).map_err(|(_, h)| h)?;
        if self.sleeping.load(Ordering::SeqCst) {
            self.kick();
        }
        Ok(())
    }

    /// The next frame handed to this worker, with the worker that sent it.
    pub fn take(&self) -> Option<(usize, Handoff)> {
        self.inbox.pop()
    }

    /// Repays a frame to this mailbox's worker; gives it back when the queue is full.
    pub fn repay(&self, frame: Frame) -> Result<(), Frame> {
        self.returns.push(frame)
    }

    /// Posts live changes for this worker and wakes it.
    pub fn control(&self, c: Control) {
        self.control.push(c);
        self.kick();
    }

    /// The next live changes posted for this worker.
    pub fn take_control(&self) -> Option<Control> {
        self.control.pop()
    }

    /// A frame repaid to this worker.
    pub fn repaid(&self) -> Option<Frame> {
        self.returns.pop()
    }

    /// The descriptor that becomes readable when a frame is posted while the worker sleeps.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Announces that the worker is about to block: returns false (and stays awake) when a
    /// frame is already waiting, so no post can be missed between the check and the wait.
    pub fn sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        if !self.inbox.is_empty() || !self.control.is_empty() {
            self.sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The worker woke: clears the flag, and the eventfd's count when it was written since
    /// the last clear (one `read` system call saved on every other wake-up, issue 13). A kick
    /// whose write lands after the check sets `kicked` after it, so the next wake clears it;
    /// until then the eventfd stays readable and the wait returns at once, never longer.
    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        if !self.kicked.swap(false, Ordering::SeqCst) {
            return;
        }
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a u64 we own; the fd is non-blocking.
        unsafe {
            libc::read(
                self.wake.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Wakes the worker (an API change, a stop request).
    pub fn kick(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 we own; the fd is non-blocking (a full counter
        // means the worker is already due to wake).
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // After the write: `awake` seeing the flag finds the count to clear.
        self.kicked.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn dir_with(vms: &[(&str, &str, u64)], slo_tenant: Option<&str>) -> Directory {
        let mut cfg = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        let template = cfg.vms[0].clone();
        cfg.vms.clear();
        let mut tenants: Vec<&str> = vms.iter().map(|v| v.1).collect();
        tenants.dedup();
        let tmpl_tenant = cfg.tenants[0].clone();
        cfg.tenants = tenants
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut t = tmpl_tenant.clone();
                t.name = name.to_string();
                t.vni = 100 + i as u32;
                if Some(*name) != slo_tenant {
                    t.slo = None;
                }
                t
            })
            .collect();
        for (i, (name, tenant, mbps)) in vms.iter().enumerate() {
            let mut v = template.clone();
            v.name = name.to_string();
            v.tenant = tenant.to_string();
            v.id = 1 + i as u32;
            v.mac = crate::config::Mac([2, 0, 0, 0, 0, i as u8 + 1]);
            v.ip = std::net::Ipv4Addr::new(198, 18, 0, i as u8 + 1);
            v.min_mbps = *mbps;
            v.host = cfg.switch.host_id;
            let mut port = v.port.clone().unwrap();
            port.ifname = format!("vm{i}");
            v.port = Some(port);
            cfg.vms.push(v);
        }
        Directory::from_config(&cfg)
    }

    #[test]
    fn the_default_is_one_worker_per_cpu_at_most_one_per_vm_port() {
        assert_eq!(default_count(2, 5), 2);
        assert_eq!(default_count(16, 3), 3);
        assert_eq!(default_count(8, 0), 1);
        assert_eq!(default_count(0, 4), 1);
    }

    #[test]
    fn vms_go_heaviest_first_to_the_least_loaded_worker() {
        let dir = dir_with(
            &[
                ("a", "t1", 100),
                ("b", "t1", 300),
                ("c", "t2", 100),
                ("d", "t2", 100),
                ("e", "t2", 100),
            ],
            None,
        );
        let a = assign(&dir, vec![None; 2]);
        // b (300) -> 0; then a, c, d, e (100 each, config order) -> 1, 1, 1, then 0 (300 vs 300: fewer VMs).
        assert_eq!(a.owner, vec![0, 1, 0, 1, 1, 0]);
        assert_eq!(a.ports_of(0).collect::<Vec<_>>(), vec![2, 5]);
        assert_eq!(a.ports_of(1).collect::<Vec<_>>(), vec![1, 3, 4]);
        // One worker owns everything; more workers than VMs leave some without a VM.
        assert!(assign(&dir, vec![None]).owner.iter().all(|&w| w == 0));
        let wide = assign(&dir, vec![None; 8]);
        let mut used: Vec<usize> = wide.owner[1..].to_vec();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), 5, "each VM on a worker of its own");
    }

    #[test]
    fn a_tenant_with_an_slo_stays_on_one_worker() {
        let dir = dir_with(
            &[
                ("a", "gold", 100),
                ("b", "gold", 100),
                ("c", "bulk", 150),
                ("d", "bulk", 150),
            ],
            Some("gold"),
        );
        let a = assign(&dir, vec![None; 2]);
        // gold (200, one unit) first on 0, c (150) on 1, d (150) on 1 (150 < 200).
        assert_eq!(a.owner, vec![0, 0, 0, 1, 1]);
        // Without the SLO, gold's VMs are placed one by one: c 0, d 1, a 0, b 1.
        let dir = dir_with(
            &[
                ("a", "gold", 100),
                ("b", "gold", 100),
                ("c", "bulk", 150),
                ("d", "bulk", 150),
            ],
            None,
        );
        assert_eq!(assign(&dir, vec![None; 2]).owner, vec![0, 0, 1, 0, 1]);
    }

    #[test]
    fn a_vm_is_served_by_a_worker_pinned_to_its_own_cpus() {
        let mut dir = dir_with(
            &[
                ("v1", "victim", 15),
                ("a1", "att1", 15),
                ("v2", "victim", 15),
                ("a2", "att2", 15),
            ],
            Some("victim"),
        );
        for (v, cpu) in [(0, 1), (1, 0), (2, 1), (3, 0)] {
            dir.vms[v].cpus = vec![cpu];
        }
        // By load alone the victim's unit (30) would take worker 0; its vCPU is worker 1's.
        let mut pinned = assign(&dir, vec![Some(0), Some(1)]);
        assert_eq!(pinned.owner, vec![0, 1, 0, 1, 0]);
        assert_eq!(pinned.cpus, vec![Some(0), Some(1)]);
        // Unpinned workers place by load.
        assert_eq!(assign(&dir, vec![None; 2]).owner, vec![0, 0, 1, 0, 1]);
        // A VM whose CPUs no worker is on is placed by load among all workers: a1 on worker
        // 0, which has less guarantee than the victim's worker 1.
        dir.vms[1].cpus = vec![7];
        assert_eq!(assign(&dir, vec![Some(0), Some(1)]).owner[2], 0);
        // A VM placed by a live change goes to a worker on its CPUs, even the busier one.
        dir.vms[3].cpus = vec![1];
        assert_eq!(pinned.place(&dir, 4), 1);
        dir.vms[3].cpus = vec![0];
        assert_eq!(pinned.place(&dir, 4), 0);
    }

    #[test]
    fn a_mailbox_wakes_a_sleeping_worker_and_is_bounded() {
        let m = Mailbox::new(2).unwrap();
        let mut pool = crate::frame::FramePool::new(4);
        assert!(m.sleep());
        assert!(m.post(1, Handoff::Uplink(pool.get().unwrap())).is_ok());
        assert!(crate::port::wait_readable(&[m.wake_fd()], std::time::Duration::ZERO).unwrap());
        m.awake();
        assert!(!crate::port::wait_readable(&[m.wake_fd()], std::time::Duration::ZERO).unwrap());
        assert!(!m.sleep(), "a frame is waiting: do not block");
        assert!(m
            .post(1, Handoff::Tx(3, (2, 0), pool.get().unwrap()))
            .is_ok());
        assert!(m.post(1, Handoff::Feedback(pool.get().unwrap())).is_err());
        assert!(matches!(m.take(), Some((1, Handoff::Uplink(_)))));
        assert!(matches!(m.take(), Some((1, Handoff::Tx(3, (2, 0), _)))));
        assert!(m.take().is_none());
    }

    /// The eventfd is read only after a kick, and a wake-up nobody kicked leaves the next
    /// kick's wake intact.
    #[test]
    fn a_mailbox_clears_its_eventfd_only_after_a_kick() {
        let m = Mailbox::new(2).unwrap();
        let readable =
            || crate::port::wait_readable(&[m.wake_fd()], std::time::Duration::ZERO).unwrap();
        m.awake();
        assert!(!readable());
        m.kick();
        m.kick();
        assert!(readable());
        m.awake();
        assert!(!readable(), "one clear takes every kick since the last");
        m.awake();
        m.kick();
        assert!(readable(), "an unkicked wake-up did not eat the next kick");
        m.awake();
        assert!(!readable());
    }

    /// A VM added live goes to the worker with the least guarantee, or to its tenant's other
    /// VMs' worker when the tenant has an SLO; the VMs already placed stay.
    #[test]
    fn a_vm_added_live_goes_to_the_lightest_worker_or_its_slo_tenants() {
        let dir = dir_with(
            &[
                ("a", "t", 100),
                ("b", "t", 300),
                ("c", "u", 100),
                ("d", "u", 10),
            ],
            Some("u"),
        );
        // a and b on their own workers, the SLO tenant u's c and d together.
        let start = assign(&dir, vec![None; 2]);
        let (a, b, c, d) = (1, 2, 3, 4);
        let mut placed = start.clone();
        placed.owner[a] = 0;
        placed.owner[b] = 1;
        placed.owner[c] = 0;
        // d is "new": tenant u has an SLO, so it joins c.
        assert_eq!(placed.place(&dir, d), 0);
        // Without the SLO tenant rule, the lighter worker (1 has b's 300, 0 has a and c's
        // 200) takes it.
        let plain = dir_with(
            &[
                ("a", "t", 100),
                ("b", "t", 300),
                ("c", "u", 100),
                ("d", "u", 10),
            ],
            None,
        );
        let mut placed2 = placed.clone();
        assert_eq!(placed2.place(&plain, d), 0);
        placed2.owner[c] = 1;
        assert_eq!(placed2.place(&plain, d), 0, "0: 100, 1: 400");
        assert_eq!(&placed2.owner[..4], &[placed.owner[0], 0, 1, 1]);
    }
}
