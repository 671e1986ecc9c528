//! A dataplane thread's port into the shared engine: the FairNIC gate its jobs pass
//! (`admit.rs`), and the results of its jobs (see the module doc of `accel`).

use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use picnic_core::Instant;

use super::admit::{Admitted, Gate};
use super::{lock, sched, worker, Completion, Exchange, InlineRun, Job, Shared};
use crate::engine::Engine;
use crate::frame::{Frame, FramePool};

/// One dataplane thread's way into the engine: its FairNIC gate, and the results of its jobs.
pub struct AccelPort {
    pub(super) index: usize,
    pub(super) shared: Arc<Shared>,
    pub(super) gate: Gate<Job>,
    pub(super) results: Receiver<Completion>,
    pub(super) inline: bool,
    pub(super) inline_budget: std::time::Duration,
    pub(super) inline_wait: std::time::Duration,
}

impl AccelPort {
    /// Submits a job through this port's gate (FairNIC's limiter: admitted now, or held in
    /// the port until the limiter's time); gives it back (counted as `queue_full`) when its
    /// tenant has `queue_jobs` outstanding (all tenants' together without isolation) or is
    /// unknown, and when the limiter refuses it with an error (never run).
    pub fn submit(&mut self, job: Job) -> Result<(), Job> {
        self.offer(job)?;
        let now = self.shared.now();
        let mut refused = Vec::new();
        self.admit(now, &mut refused);
        refused.into_iter().next().map_or(Ok(()), Err)
    }

    /// Counts `job` outstanding and queues it in the gate, or gives it back.
    fn offer(&mut self, job: Job) -> Result<(), Job> {
        let s = &*self.shared;
        let tenant = job.tenant;
        let (Some(n), Some(c)) = (s.outstanding.get(tenant), s.counters.get(tenant)) else {
            return Err(job);
        };
        n.fetch_add(1, Ordering::Relaxed);
        let all = s.outstanding_all.fetch_add(1, Ordering::Relaxed);
        let full = if s.isolated {
            n.load(Ordering::Relaxed) > s.depth
        } else {
            all >= s.depth * s.outstanding.len()
        };
        if full {
            self.release(tenant);
            c.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(job);
        }
        let size = job.frame.len() as u64;
        let at = s.now();
        match self.gate.offer(tenant, size, at, job) {
            Ok(()) => Ok(()),
            Err(job) => {
                self.release(tenant);
                Err(job)
            }
        }
    }

    /// A job of `tenant` is no longer outstanding.
    fn release(&self, tenant: usize) {
        let s = &*self.shared;
        if let Some(n) = s.outstanding.get(tenant) {
            n.fetch_sub(1, Ordering::Relaxed);
            s.outstanding_all.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Passes what the gate's limiter grants at `now` to the engine (waking a sleeping
    /// worker); jobs it refuses with an error go to `refused`. Returns when the first job
    /// held back may pass.
    fn admit(&mut self, now: Instant, refused: &mut Vec<Job>) -> Option<Instant> {
        let s = &*self.shared;
        let me = self.index;
        let mut any = false;
        let first = refused.len();
        let next = self.gate.admit(
            now,
            s.limiter.as_ref(),
            |a| {
                any = true;
                s.admitted.push(Admitted {
                    tenant: a.tenant,
                    size: a.size,
                    at: a.at,
                    fresh: a.fresh,
                    item: (me, a.item),
                });
            },
            |t, job, e| {
                tracing::debug!("accel limiter refused a job of tenant {t}: {e}");
                if let Some(c) = s.counters.get(t) {
                    c.refused.fetch_add(1, Ordering::Relaxed);
                }
                refused.push(job);
            },
        );
        for job in &refused[first..] {
            self.release(job.tenant);
        }
        // The lock only to wake a worker that sleeps (it looks at the queue under it first).
        if any && s.sleeping.load(Ordering::SeqCst) > 0 {
            let _guard = lock(&s.queues);
            s.work.notify_one();
        }
        next
    }

    /// Moves every finished job of this port into `out` (never blocks).
    pub fn completions(&self, out: &mut Vec<Completion>) {
        let outlet = &self.shared.outlets[self.index];
        outlet.notified.store(false, Ordering::Release);
        worker::drain_eventfd(&outlet.notify);
        let first = out.len();
        while let Ok(c) = self.results.try_recv() {
            out.push(c);
        }
        self.took_back(&out[first..]);
    }

    /// Whether the engine has no workers and its ports run the jobs.
    pub fn is_inline(&self) -> bool {
        self.inline
    }

    /// Inline engine: runs on the calling thread the admitted jobs in FairNIC's order
    /// (per-tenant queues, start-time fair queueing, the pace), until none may start or
    /// `budget` is spent (at least one job runs); the results of this port's jobs go into
    /// `out`, other ports' to them. No hand-off to another thread: the job runs when the
    /// dataplane loop, which has the CPU, gets to it.
    pub fn run_inline(&self, budget: std::time::Duration, out: &mut Vec<Completion>) -> InlineRun {
        let start = StdInstant::now();
        let first = out.len();
        let mut run = InlineRun::default();
        let s = &*self.shared;
        loop {
            let now = s.now();
            let pick = {
                let mut queues = lock(&s.queues);
                s.take_admitted(&mut queues);
                queues.pick(now)
            };
            match pick {
                sched::Pick::Run {
                    tenant,
                    item: (port, job),
                    waited,
                } => {
                    let done = worker::execute(s, tenant, job, waited, now - waited);
                    let cpu = picnic_core::Duration::from_nanos(done.cpu_ns);
                    let cap = picnic_core::Duration::from_nanos(self.inline_wait.as_nanos() as u64);
                    lock(&s.queues).ran(s.now(), cpu, cap);
                    run.jobs += 1;
                    run.cpu_ns += done.cpu_ns;
                    if port == self.index {
                        out.push(done);
                    } else {
                        s.deliver(port, done);
                    }
                    if start.elapsed() >= budget {
                        break;
                    }
                }
                sched::Pick::Paced(at) => {
                    run.wake_in = Some(std::time::Duration::from_nanos(
                        (at - now).as_nanos().max(1),
                    ));
                    break;
                }
                sched::Pick::Idle => break,
            }
        }
        self.took_back(&out[first..]);
        run
    }

    /// Accounts for results the dataplane took back: its tenants' outstanding jobs and their
    /// latency through the engine.
    fn took_back(&self, done: &[Completion]) {
        if done.is_empty() {
            return;
        }
        let now = self.shared.now();
        for c in done {
            self.release(c.tenant);
        }
        let mut latency = lock(&self.shared.latency);
        for c in done {
            if let Some(l) = latency.get_mut(c.tenant) {
                l.queue.record(c.waited.as_nanos());
                l.turnaround
                    .record(now.saturating_since(c.queued_at).as_nanos());
            }
        }
    }

    /// Jobs `tenant` may still submit before it is full: the depth less its jobs not yet
    /// taken back (held, queued, running or finished) through any port. Unbounded without
    /// isolation (one shared FIFO: no tenant's room of its own).
    pub fn room(&self, tenant: usize) -> usize {
        match self.shared.outstanding.get(tenant) {
            Some(n) if self.shared.isolated => {
                self.shared.depth.saturating_sub(n.load(Ordering::Relaxed))
            }
            _ => usize::MAX,
        }
    }

    /// A descriptor that becomes readable when this port's results wait, for the
    /// dataplane's poll(2).
    pub fn notify_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.shared.outlets[self.index].notify.as_fd()
    }

    /// Hands the frames `engine` set aside to the engine and the finished ones back to it;
    /// returns how many frames moved. Called by the dataplane loop every iteration.
    pub fn exchange(
        &mut self,
        engine: &mut Engine,
        now: Instant,
        pool: &mut FramePool,
        scratch: &mut Exchange,
    ) -> usize {
        engine.take_accel_jobs(&mut scratch.jobs);
        let mut moved = scratch.jobs.len();
        for job in scratch.jobs.drain(..) {
            if let Err(job) = self.offer(job) {
                engine.on_accel_refused(now, job, pool);
            }
        }
        // The held jobs the limiter grants now pass with the new ones; the caller comes
        // back for the rest when told, no sooner than `inline_wait` (a hog held to its
        // share then costs a wake-up a period, not one a job).
        let held = self.admit(self.shared.now(), &mut scratch.refused);
        for job in scratch.refused.drain(..) {
            engine.on_accel_refused(now, job, pool);
        }
        let held = held.map(|at| {
            let after = at.saturating_since(self.shared.now()).as_nanos().max(1);
            std::time::Duration::from_nanos(after).max(self.inline_wait)
        });
        scratch.inline = if self.inline {
            self.run_inline(self.inline_budget, &mut scratch.done)
        } else {
            self.completions(&mut scratch.done);
            InlineRun::default()
        };
        scratch.wake_in = match (held, scratch.inline.wake_in) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        moved += scratch.done.len();
        scratch.finished = scratch.done.len();
        for done in scratch.done.drain(..) {
            engine.on_accel_done(now, done, pool);
        }
        // FairNIC 5.2's back-pressure to a tenant's VFs: its VMs' ports are read only while
        // its queue has room for what a read brings (Engine::rx_ready).
        engine.set_accel_room(
            self.shared.depth,
            (0..self.shared.outstanding.len()).map(|t| self.room(t)),
        );
        moved
    }

    /// Gives back every frame this port holds: jobs its gate holds, its jobs admitted and not
    /// started (stop the engine's workers first), its results not taken back.
    pub fn shutdown(mut self, out: &mut Vec<Frame>) {
        let mut jobs = Vec::new();
        self.gate.drain_into(&mut jobs);
        out.extend(jobs.drain(..).map(|j| j.frame));
        let me = self.index;
        let mut mine = Vec::new();
        {
            let mut queues = lock(&self.shared.queues);
            self.shared.take_admitted(&mut queues);
            queues.drain_into(&mut mine, |(port, _)| *port != me);
        }
        out.extend(mine.into_iter().map(|(_, j)| j.frame));
        while let Ok(c) = self.results.try_recv() {
            out.push(c.frame);
        }
    }
}
