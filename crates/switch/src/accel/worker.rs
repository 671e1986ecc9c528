//! The engine's worker threads: each takes the next admitted job the scheduler picks
//! (`sched.rs`), seals or opens its frame with the tenant's keys, measures the CPU it took on
//! the thread's clock and hands the result back to the port that submitted it, waking its
//! dataplane through an eventfd.

use std::sync::atomic::Ordering;
use std::time::Instant as StdInstant;

use picnic_core::fairnic::TokenCost;
use picnic_wire::seal::{open_in_place, seal_in_place, OpenError, SealHeader, TunnelKey};

use super::sched::Pick;
use picnic_core::{Duration, Instant};

use super::{lock, Completion, Job, KeyRing, Op, Outcome, Shared};
use crate::frame::Frame;

/// A worker's loop: until the engine stops, runs the next admitted job the scheduler picks,
/// or waits for one, and hands the result to the port that submitted it.
pub(super) fn worker(shared: &Shared) {
    loop {
        let (port, tenant, job, waited, queued_at) = {
            let mut queues = lock(&shared.queues);
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                shared.take_admitted(&mut queues);
                let now = shared.now();
                match queues.pick(now) {
                    Pick::Run {
                        tenant,
                        item: (port, job),
                        waited,
                    } => break (port, tenant, job, waited, now - waited),
                    Pick::Idle => {
                        // Counted before the last look, under the lock a port takes to wake
                        // a sleeper: a job admitted after the look finds it counted.
                        shared.sleeping.fetch_add(1, Ordering::SeqCst);
                        if shared.admitted.is_empty() {
                            queues = shared.work.wait(queues).unwrap_or_else(|e| e.into_inner());
                        }
                        shared.sleeping.fetch_sub(1, Ordering::SeqCst);
                    }
                    Pick::Paced(at) => {
                        let wait = std::time::Duration::from_nanos((at - now).as_nanos().max(1));
                        queues = shared
                            .work
                            .wait_timeout(queues, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        };
        let done = execute(shared, tenant, job, waited, queued_at);
        // A port gone (its dataplane stopped) drops the frame with the result.
        shared.deliver(port, done);
    }
}

/// Runs one job the scheduler admitted on the calling thread (a worker, or the dataplane
/// loop of an inline engine): seals or opens its frame, spins the synthetic work, counts it
/// and measures the thread CPU it took.
pub(super) fn execute(
    shared: &Shared,
    tenant: usize,
    mut job: Job,
    waited: Duration,
    queued_at: Instant,
) -> Completion {
    let start = thread_cpu_ns();
    let bytes = job.frame.len() as u64;
    let outcome = run(shared, tenant, job.op, &mut job.frame);
    if shared.job_work_ns > 0 {
        let until = start + shared.job_work_ns;
        while thread_cpu_ns() < until {
            std::hint::spin_loop();
        }
    }
    let cpu_ns = thread_cpu_ns().saturating_sub(start);
    let c = &shared.counters[tenant];
    let counter = match (outcome, job.op) {
        (Outcome::Done, Op::Seal) => &c.sealed,
        (Outcome::Done, Op::Open) => &c.opened,
        (Outcome::AuthFailed, _) => &c.auth_failed,
        (Outcome::UnknownKey, _) => &c.unknown_key,
        (Outcome::NoKey, _) => &c.no_key,
        (Outcome::Malformed, _) => &c.malformed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    c.cpu_ns.fetch_add(cpu_ns, Ordering::Relaxed);
    c.bytes.fetch_add(bytes, Ordering::Relaxed);
    Completion {
        tenant,
        op: job.op,
        frame: job.frame,
        cookie: job.cookie,
        outcome,
        cpu_ns,
        waited,
        queued_at,
    }
}

/// Gives the calling worker the switch threads' nice value and slice; a setting the kernel
/// refuses leaves the inherited one (the dataplane thread warns about the same settings).
/// Next to a real-time dataplane the workers are real-time too, one priority below it: in
/// the fair class they would wait behind every task while the dataplane is busy, and so
/// would the jobs of every tenant queued behind them (FairNIC 4.4: the engine is a resource
/// of its own, not leftover host CPU).
pub(super) fn setup_thread(nice: Option<i8>, slice_us: Option<u64>, realtime: Option<u8>) {
    if let Some(priority) = realtime.map(worker_priority) {
        if crate::sched::set_thread_realtime(priority).is_ok() {
            return;
        }
    }
    if let Some(nice) = nice {
        let _ = crate::sched::set_thread_nice(nice.into());
    }
    if let Some(us) = slice_us {
        let _ = crate::sched::set_thread_slice(us * 1000);
    }
}

/// The SCHED_FIFO priority of the workers next to a dataplane at `dataplane`: one below it
/// (the loop that feeds them and sends their results comes first), never under 1.
fn worker_priority(dataplane: u8) -> u8 {
    dataplane.saturating_sub(1).max(1)
}

/// Seals or opens `frame` in place with `tenant`'s keys.
fn run(shared: &Shared, tenant: usize, op: Op, frame: &mut Frame) -> Outcome {
    let len = frame.len();
    match op {
        Op::Seal => {
            let sending = {
                let rings = shared.keys.read().unwrap_or_else(|e| e.into_inner());
                rings.get(tenant).and_then(KeyRing::sending)
            };
            let Some((epoch, key)) = sending else {
                return Outcome::NoKey;
            };
            let counter = shared.nonce[tenant].fetch_add(1, Ordering::Relaxed);
            let header = SealHeader::new(epoch, shared.sender_id, counter);
            match seal_in_place(frame.data_and_tail_mut(), len, &key, header) {
                Ok(n) => {
                    frame.set_len(n);
                    Outcome::Done
                }
                Err(_) => Outcome::Malformed,
            }
        }
        Op::Open => {
            let rings = shared.keys.read().unwrap_or_else(|e| e.into_inner());
            let Some(ring) = rings.get(tenant) else {
                return Outcome::UnknownKey;
            };
            let result = open_in_place(frame.data_and_tail_mut(), len, |epoch| ring.key(epoch));
            match result {
                Ok(n) => {
                    frame.set_len(n);
                    Outcome::Done
                }
                Err(OpenError::AuthFailed) => Outcome::AuthFailed,
                Err(OpenError::UnknownKey(_)) => Outcome::UnknownKey,
                Err(OpenError::Malformed(_)) => Outcome::Malformed,
            }
        }
    }
}

/// The calling thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Measures the engine's token cost on this machine: the ns one seal takes at 64 and 1500
/// bytes, fitted to `per_request + per_byte * size` (tokens are ns; per_byte rounded up so
/// large jobs are never under-charged).
pub fn calibrate() -> TokenCost {
    let key = TunnelKey::new(&[0x42; 16]).expect("16-byte key");
    let time = |inner: usize| -> u64 {
        let outer = picnic_wire::overlay::OuterHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: [198, 18, 0, 1].into(),
            dst_ip: [198, 18, 0, 2].into(),
            src_port: 50000,
            ttl: 64,
        };
        let geneve = picnic_wire::GeneveRepr::ethernet(1);
        let mut plain = vec![0u8; inner + 128];
        let len = picnic_wire::encap(&outer, &geneve, &vec![0x11; inner], &mut plain)
            .expect("buffer sized for the frame");
        let mut buf = plain.clone();
        let rounds = 200u64;
        let mut best = u64::MAX;
        for _ in 0..5 {
            let start = StdInstant::now();
            for i in 0..rounds {
                buf[..len].copy_from_slice(&plain[..len]);
                let _ = seal_in_place(&mut buf, len, &key, SealHeader::new(1, 1, i));
            }
            best = best.min(start.elapsed().as_nanos() as u64 / rounds);
        }
        best.max(1)
    };
    let (small, large) = (time(64), time(1500));
    let per_byte = large.saturating_sub(small).div_ceil(1500 - 64).max(1);
    TokenCost {
        per_request: small.saturating_sub(per_byte * 64).max(1),
        per_byte,
    }
}

pub(super) fn eventfd() -> anyhow::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        anyhow::bail!("eventfd: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

pub(super) fn signal_eventfd(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a u64 we own; a full counter (EAGAIN) is fine to ignore.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

pub(super) fn drain_eventfd(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a u64 we own; EAGAIN (nothing pending) is fine.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

#[cfg(test)]
mod tests {
    use super::worker_priority;

    #[test]
    fn workers_run_one_real_time_priority_below_the_dataplane_and_never_under_one() {
        assert_eq!(worker_priority(10), 9);
        assert_eq!(worker_priority(99), 98);
        assert_eq!(worker_priority(1), 1);
    }
}
