//! Which admitted job a free engine worker runs next (sans-I/O: every call takes `now`).
//!
//! Isolated (FairNIC 4.4): one queue per tenant of the jobs its [`super::admit::Gate`]s
//! admitted (FairNIC's limiter runs on the submit path, so these queues hold only what the
//! engine's capacity covers). Among the tenants with jobs, workers serve the one with the
//! earliest virtual start (start-time fair queueing by token cost over weight): when the
//! workers run slower than the capacity the limiter assumes (a busy host: PicNIC's variable
//! capacity), the limiter admits everyone and this order alone keeps the shares weighted,
//! and a tenant sending little is served next.
//!
//! Not isolated: one shared FIFO in arrival order and no limiter, the engine of a stack that
//! does not isolate its accelerators (FairNIC 6.4's baseline).

use std::collections::VecDeque;

use picnic_core::fairnic::TokenCost;
use picnic_core::{Duration, Instant};

use super::admit::Admitted;

/// Scale of virtual time, so that cost / weight keeps its precision.
const VSCALE: u128 = 1 << 20;

/// What a free worker should do.
pub(crate) enum Pick<T> {
    /// Run this job of `tenant`, which waited `waited` since it was submitted.
    Run {
        tenant: usize,
        item: T,
        waited: Duration,
    },
    /// Jobs are queued, but the engine's pace holds them (it ran its share of the caller's
    /// time) until this time.
    Paced(Instant),
    /// Nothing is queued.
    Idle,
}

/// The engine's queues of admitted jobs.
pub(crate) struct EngineQueues<T> {
    /// Per tenant when isolated, else one shared queue.
    queues: Vec<VecDeque<Admitted<T>>>,
    isolated: bool,
    /// Start-time fair queueing among the tenants with admitted jobs (Goyal et al.,
    /// SIGCOMM'96): per tenant the virtual start of its next job, advanced by each job's
    /// cost over its weight; `vnow` is the start tag of the job last started.
    vstart: Vec<u128>,
    vnow: u128,
    weights: Vec<u64>,
    cost: TokenCost,
    /// Scratch for `pick`, kept so picking does not allocate.
    order: Vec<usize>,
    /// An inline engine's pace ([`EngineQueues::set_pace`]): the percentage of the caller's
    /// time its jobs may take, and until when the jobs it ran hold a backlog's next one.
    pace_percent: Option<u64>,
    paced_until: Instant,
}

impl<T> EngineQueues<T> {
    /// Queues for `weights.len()` tenants (weight 0: a tenant that does not use the engine),
    /// one per tenant with `isolated`, else one shared FIFO.
    pub(crate) fn new(now: Instant, weights: &[u64], cost: TokenCost, isolated: bool) -> Self {
        let tenants = weights.len();
        let queues = if isolated { tenants } else { 1 };
        EngineQueues {
            queues: (0..queues).map(|_| VecDeque::new()).collect(),
            isolated,
            vstart: vec![0; tenants],
            vnow: 0,
            weights: weights.iter().map(|&w| w.max(1)).collect(),
            cost,
            order: Vec::with_capacity(tenants),
            pace_percent: None,
            paced_until: now,
        }
    }

    /// Paces an engine run on the caller's own thread (an inline engine, on the dataplane
    /// loop's core) at `percent` of that thread's time, over single jobs rather than over
    /// the limiter's buckets: after a job that took `d` ([`EngineQueues::ran`]), a
    /// backlogged tenant's next job waits `d * (100 - percent) / percent`, so the loop runs
    /// one backlog job, then gives its core to what else waits for it (tenants' vCPU
    /// threads sharing it) instead of running the burst its buckets saved up. A job that
    /// arrived with at most one of its tenant's queued (a light tenant's) is not held: it
    /// waits at most for the job running. The limiter still sets each tenant's rate; the
    /// pace only spreads it. Only with isolation (the shared FIFO has no limiter and no
    /// pace); 100 or more: none.
    pub(crate) fn set_pace(&mut self, percent: u64) {
        self.pace_percent = (self.isolated && (1..100).contains(&percent)).then_some(percent);
    }

    /// The caller ran a job that ended at `now` and took `cpu` of its thread's CPU (paced
    /// engines). The CPU, not the time: a thread preempted in a job has not run it longer.
    /// The pause it owes is at most `max_pause` (a cap on what any one job can hold back).
    pub(crate) fn ran(&mut self, now: Instant, cpu: Duration, max_pause: Duration) {
        if let Some(p) = self.pace_percent {
            let off = Duration::from_nanos(cpu.as_nanos() * (100 - p) / p);
            // A caller back late (its wake-up, a busy core) is owed up to half a pause: its
            // next one is shorter, never skipped (no two backlog jobs back to back).
            let late = Duration::from_nanos(off.as_nanos() / 2);
            self.paced_until = (self.paced_until.max(now - late) + off).min(now + max_pause);
        }
    }

    /// Queues an admitted job (the gates bound each tenant's jobs, so no queue here is
    /// bounded); gives it back for an unknown tenant.
    pub(crate) fn push(&mut self, job: Admitted<T>) -> Result<(), T> {
        let q = if self.isolated { job.tenant } else { 0 };
        match (self.queues.get_mut(q), self.vstart.get_mut(job.tenant)) {
            (Some(queue), Some(v)) => {
                if queue.is_empty() {
                    // A tenant coming back from idle starts now: no credit for idle time.
                    *v = (*v).max(self.vnow);
                }
                queue.push_back(job);
                Ok(())
            }
            _ => Err(job.item),
        }
    }

    /// Empties every queue into `out`, those `keep` returns false for (the engine is
    /// stopping, or a gate takes its jobs back).
    pub(crate) fn drain_into(&mut self, out: &mut Vec<T>, keep: impl Fn(&T) -> bool) {
        for q in &mut self.queues {
            let (gone, stay): (VecDeque<_>, VecDeque<_>) =
                std::mem::take(q).into_iter().partition(|a| !keep(&a.item));
            *q = stay;
            out.extend(gone.into_iter().map(|a| a.item));
        }
    }

    /// Jobs queued for `tenant` (all tenants' when not isolated).
    pub(crate) fn queued(&self, tenant: usize) -> usize {
        let q = if self.isolated { tenant } else { 0 };
        self.queues.get(q).map_or(0, VecDeque::len)
    }

    /// The next job, if any may start now.
    pub(crate) fn pick(&mut self, now: Instant) -> Pick<T> {
        if !self.isolated {
            return match self.queues[0].pop_front() {
                Some(a) => Pick::Run {
                    tenant: a.tenant,
                    waited: now.saturating_since(a.at),
                    item: a.item,
                },
                None => Pick::Idle,
            };
        };
        // Tenants with work, in order of virtual start: the engine goes to them in proportion
        // to their weights, by cost, whatever the limiter admitted.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend((0..self.queues.len()).filter(|&t| !self.queues[t].is_empty()));
        order.sort_by_key(|&t| self.vstart[t]);
        let paced = self.pace_percent.is_some() && self.paced_until > now;
        // A backlog's job waits out the pace; a light tenant's does not.
        let first = order
            .iter()
            .copied()
            .find(|&t| !paced || self.queues[t].front().is_some_and(|a| a.fresh));
        let held = !order.is_empty();
        self.order = order;
        match first {
            Some(t) => {
                let a = self.queues[t].pop_front().expect("non-empty above");
                self.vnow = self.vstart[t];
                self.vstart[t] += (self.cost.of(a.size) as u128) * VSCALE / self.weights[t] as u128;
                Pick::Run {
                    tenant: t,
                    waited: now.saturating_since(a.at),
                    item: a.item,
                }
            }
            None if held => Pick::Paced(self.paced_until),
            None => Pick::Idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::admit::{Gate, Limiter};
    use super::*;

    /// How a tenant offers jobs in [`run`].
    #[derive(Clone, Copy)]
    enum Load {
        /// Keeps this many jobs queued.
        Backlog(usize),
        /// One job every so often (an RPC tenant well under its share).
        Every(Duration),
        Idle,
    }

    /// A discrete-time engine: one submitter's gate and 2 workers that each run twice the
    /// tokens per second the limiter admits in total (FairNIC sets the limit below what the
    /// unit sustains). Returns per tenant: tokens served, jobs served, worst wait from
    /// submission to start.
    fn run(
        isolated: bool,
        weights: &[u64],
        sizes: &[u64],
        load: &[Load],
        millis: u64,
    ) -> Vec<(u64, u64, Duration)> {
        let cost = TokenCost {
            per_request: 500,
            per_byte: 1,
        };
        let workers = 2;
        let limiter = isolated.then(|| {
            Limiter::new(Instant::ZERO, weights, 1, CAPACITY, cost, Duration::ZERO).unwrap()
        });
        let mut gate: Gate<()> = Gate::new(weights.len());
        let mut q: EngineQueues<()> = EngineQueues::new(Instant::ZERO, weights, cost, isolated);
        let worker_rate = SPEED.with(|s| s.get()) * CAPACITY / 100 / workers as u64;
        let mut busy_until = vec![Instant::ZERO; workers];
        let mut next_arrival = vec![Instant::ZERO; weights.len()];
        // Per tenant: jobs submitted and not started (the accel's per-tenant bound).
        let mut outstanding = vec![0usize; weights.len()];
        let mut out = vec![(0u64, 0u64, Duration::ZERO); weights.len()];
        let step = Duration::from_nanos(100);
        let mut now = Instant::ZERO;
        let end = Instant::ZERO + Duration::from_millis(millis);
        while now < end {
            for (t, l) in load.iter().enumerate() {
                match *l {
                    Load::Backlog(n) => {
                        while outstanding[t] < n {
                            gate.offer(t, sizes[t], now, ()).unwrap();
                            outstanding[t] += 1;
                        }
                    }
                    Load::Every(period) if next_arrival[t] <= now => {
                        gate.offer(t, sizes[t], now, ()).unwrap();
                        outstanding[t] += 1;
                        next_arrival[t] = now + period;
                    }
                    _ => {}
                }
            }
            gate.admit(
                now,
                limiter.as_ref(),
                |a| assert!(q.push(a).is_ok()),
                |_, _, e| panic!("{e}"),
            );
            for busy in busy_until.iter_mut() {
                if *busy > now {
                    continue;
                }
                if let Pick::Run { tenant, waited, .. } = q.pick(now) {
                    let tokens = cost.of(sizes[tenant]);
                    *busy = now + Duration::from_nanos(tokens * NANOS / worker_rate);
                    outstanding[tenant] -= 1;
                    out[tenant].0 += tokens;
                    out[tenant].1 += 1;
                    out[tenant].2 = out[tenant].2.max(waited);
                }
            }
            now += step;
        }
        out
    }

    const NANOS: u64 = 1_000_000_000;
    thread_local! {
        /// Workers' speed in percent of the capacity the limiter admits (FairNIC sets the
        /// limit below what the unit sustains: 200 by default).
        static SPEED: std::cell::Cell<u64> = const { std::cell::Cell::new(200) };
    }
    /// Tokens/s the limiter admits (a token is a ns of a worker at half speed).
    const CAPACITY: u64 = 2_000_000_000;

    #[test]
    fn small_tenant_gets_its_weighted_share_against_a_bulk_hog() {
        // Tenant 0 hogs with 1500-byte jobs, tenant 1 with 64-byte jobs; weights 1:1 and 1:3.
        for (weights, want) in [([1u64, 1], 0.5), ([1, 3], 0.75)] {
            let load = [Load::Backlog(64), Load::Backlog(64)];
            let out = run(true, &weights, &[1500, 64], &load, 100);
            let total = (out[0].0 + out[1].0) as f64;
            let share = out[1].0 as f64 / total;
            assert!(
                (share - want).abs() <= 0.1 * want,
                "weights {weights:?}: small tenant got {share:.3} of the engine, want {want}"
            );
            // The engine ran at (not above) its capacity.
            let rate = total / 0.1;
            assert!(rate <= 1.02 * CAPACITY as f64, "{rate} tokens/s");
            assert!(rate >= 0.9 * CAPACITY as f64, "{rate} tokens/s");
        }
    }

    #[test]
    fn shares_stay_weighted_when_the_workers_are_slower_than_assumed() {
        // A busy host: the workers sustain half the capacity, so the limiter admits both
        // tenants all the time and the fair order alone decides.
        SPEED.with(|s| s.set(50));
        let load = [Load::Backlog(64), Load::Backlog(64)];
        let out = run(true, &[1, 3], &[1500, 64], &load, 100);
        SPEED.with(|s| s.set(200));
        let share = out[1].0 as f64 / (out[0].0 + out[1].0) as f64;
        assert!(
            (share - 0.75).abs() <= 0.075,
            "small tenant got {share:.3}, want 0.75"
        );
    }

    #[test]
    fn small_jobs_wait_little_with_isolation_and_long_behind_a_shared_fifo() {
        // The small tenant sends a job every 20 us, well under its half of the engine.
        let load = [Load::Backlog(64), Load::Every(Duration::from_micros(20))];
        let fair = run(true, &[1, 1], &[1500, 64], &load, 50);
        let fifo = run(false, &[1, 1], &[1500, 64], &load, 50);
        assert!(fair[1].1 >= 2400 && fifo[1].1 >= 2400, "{fair:?} {fifo:?}");
        // Isolated: it waits at most for a worker to finish one hog job (1 us) plus steps.
        assert!(
            fair[1].2 <= Duration::from_micros(2),
            "isolated small-job wait {:?}",
            fair[1].2
        );
        // Shared FIFO: it waits behind the hog's backlog of 63 jobs on 2 workers.
        assert!(
            fifo[1].2 >= Duration::from_micros(20),
            "fifo wait {:?} vs isolated {:?}",
            fifo[1].2,
            fair[1].2
        );
    }

    #[test]
    fn a_tenant_alone_gets_the_whole_engine() {
        // Tenant 1 is idle: tenant 0 (weight 1 of 4) steals the rest from the overflow pool.
        let out = run(
            true,
            &[1, 3],
            &[1500, 64],
            &[Load::Backlog(64), Load::Idle],
            100,
        );
        let rate = out[0].0 as f64 / 0.1;
        assert!(
            rate >= 0.9 * CAPACITY as f64,
            "alone: {rate} tokens/s of {CAPACITY} (its base is 25%)"
        );
        assert_eq!(out[1].1, 0);
    }

    /// What [`paced_run`] saw.
    #[derive(Debug)]
    struct PacedRun {
        /// Tokens (= ns of the caller's CPU) the engine ran per tenant.
        tokens: [u64; 2],
        /// The light tenant's jobs run, and the longest any of them waited.
        light_jobs: u64,
        light_worst_wait: Duration,
        /// The most backlog jobs run back to back (no other job and no pause between).
        longest_burst: u32,
        /// The shortest pause between two backlog jobs.
        shortest_gap: Duration,
    }

    /// An inline engine as `Accel` builds one (one "worker", the loop; 20% of
    /// its time; 20 us jobs; buckets 500 us deep), on a virtual clock: tenant 0 keeps 64
    /// jobs queued, tenant 1 sends one job every 1 ms (an RPC). The caller runs a job
    /// whenever one is admitted, and when told to wait it comes back `late` after the time
    /// it was given (its wake-up). `pace`: 20, or None for no pace.
    fn paced_run(pace: Option<u64>, late: Duration, millis: u64) -> PacedRun {
        let job = Duration::from_micros(20);
        let cost = TokenCost {
            per_request: job.as_nanos(),
            per_byte: 0,
        };
        let limiter = Limiter::new(
            Instant::ZERO,
            &[1, 1],
            1,
            200_000_000,
            cost,
            Duration::from_micros(500),
        )
        .unwrap();
        let mut gate: Gate<()> = Gate::new(2);
        let mut q: EngineQueues<()> = EngineQueues::new(Instant::ZERO, &[1, 1], cost, true);
        let mut hog_outstanding = 0usize;
        if let Some(p) = pace {
            q.set_pace(p);
        }
        let period = Duration::from_millis(1);
        let mut next_light = Instant::ZERO + Duration::from_micros(333);
        let mut run = PacedRun {
            tokens: [0; 2],
            light_jobs: 0,
            light_worst_wait: Duration::ZERO,
            longest_burst: 0,
            shortest_gap: Duration::from_secs(1),
        };
        let (mut burst, mut last_hog_end) = (0u32, None::<Instant>);
        let mut now = Instant::ZERO;
        let end = Instant::ZERO + Duration::from_millis(millis);
        while now < end {
            // Arrivals up to now, each at its own time.
            while next_light <= now {
                gate.offer(1, 64, next_light, ()).unwrap();
                next_light += period;
            }
            while hog_outstanding < 64 {
                gate.offer(0, 1400, now, ()).unwrap();
                hog_outstanding += 1;
            }
            let held_until = gate.admit(
                now,
                Some(&limiter),
                |a| assert!(q.push(a).is_ok()),
                |_, _, e| panic!("{e}"),
            );
            match q.pick(now) {
                Pick::Run { tenant, waited, .. } => {
                    if tenant == 0 {
                        hog_outstanding -= 1;
                        match last_hog_end {
                            Some(e) if e == now => burst += 1,
                            Some(e) => {
                                run.shortest_gap = run.shortest_gap.min(now - e);
                                burst = 1;
                            }
                            None => burst = 1,
                        }
                        run.longest_burst = run.longest_burst.max(burst);
                    } else {
                        run.light_jobs += 1;
                        run.light_worst_wait = run.light_worst_wait.max(waited);
                        last_hog_end = None;
                    }
                    now += job;
                    run.tokens[tenant] += job.as_nanos();
                    if tenant == 0 {
                        last_hog_end = Some(now);
                    }
                    q.ran(now, job, Duration::from_micros(500));
                }
                // The caller sleeps until the pace ends, or until the limiter admits a job
                // it holds (at least 500 us, as `AccelPort::exchange` asks), or until the
                // light tenant's next job wakes it (a frame on its port), and comes back
                // late.
                Pick::Paced(at) => now = at.min(next_light) + late,
                Pick::Idle => {
                    let wake = held_until.map(|at| at.max(now + Duration::from_micros(500)));
                    now = wake.map_or(next_light, |w| w.min(next_light)) + late
                }
            }
        }
        run
    }

    #[test]
    fn a_paced_inline_engine_runs_one_backlog_job_at_a_time_at_its_capacity() {
        let unpaced = paced_run(None, Duration::ZERO, 100);
        for late in [Duration::ZERO, Duration::from_micros(15)] {
            let r = paced_run(Some(20), late, 100);
            // A backlog's jobs do not run back to back: after each, the caller's core is free
            // for at least half the pause its CPU owes (80 us a 20 us job at 20%). Only the
            // first two of a backlog arrived as a light tenant's do (at most one queued).
            assert!(r.longest_burst <= 2, "late {late:?}: {r:?}");
            assert!(
                r.shortest_gap >= Duration::from_micros(40),
                "late {late:?}: {r:?}"
            );
            // The light tenant's jobs are not held: each waits at most for the job running
            // (and the caller's lateness).
            assert!(r.light_jobs >= 99, "late {late:?}: {r:?}");
            assert!(
                r.light_worst_wait <= Duration::from_micros(20) + late,
                "late {late:?}: {r:?}"
            );
            // And the pace costs the engine no throughput: the limiter, not the pace, sets
            // the rate (a caller back late is owed up to half a pause).
            let (total, before) = (
                r.tokens[0] + r.tokens[1],
                unpaced.tokens[0] + unpaced.tokens[1],
            );
            assert!(
                total * 10 >= before * 9,
                "late {late:?}: {total} ns of jobs paced, {before} unpaced: {r:?}"
            );
        }
    }

    #[test]
    fn without_the_pace_a_backlog_runs_its_buckets_burst_back_to_back() {
        // The same engine unpaced: whenever the caller comes back (here for the light
        // tenant's job), the hog's bucket has filled and its jobs run back to back, so a
        // vCPU thread sharing the core waits for all of them.
        let r = paced_run(None, Duration::ZERO, 100);
        assert!(r.longest_burst >= 3, "{r:?}");
        assert!(r.light_worst_wait <= Duration::from_micros(20), "{r:?}");
    }
}
