//! The loop's clock, its thread's CPU time and set-up, and the synthetic rule-set cost.

use std::time::Instant as StdInstant;

use anyhow::Context;
use picnic_core::Instant;

use crate::config::{default_nice, Config};
use crate::directory::TenantIdx;
use crate::engine::Work;
use crate::frame::Frame;

/// Monotonic nanoseconds since the switch started, as the engines' `now`.
#[derive(Clone, Copy)]
pub struct Clock(StdInstant);
impl Clock {
    pub fn new() -> Clock {
        Clock(StdInstant::now())
    }
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
    /// Wall-clock time at this clock's zero, ns since the UNIX epoch (feedback nonces).
    pub fn wall_at_zero_ns(&self) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (wall.as_nanos() as u64).saturating_sub(self.0.elapsed().as_nanos() as u64)
    }
}
impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// The optional synthetic rule-set cost (`ingress.work_ns`, `ingress.work_ps_per_byte`):
/// spins on the thread's CPU clock for that long and returns what it took, so the frame's
/// scheduler charge includes it. Without it, processing is the loop's own work, measured
/// per iteration ([`Engine::charge_cpu`]).
pub struct SpinWork {
    work_ns: u64,
    work_ps_per_byte: u64,
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl SpinWork {
    pub fn new(cfg: &Config) -> SpinWork {
        SpinWork {
            work_ns: cfg.ingress.work_ns,
            work_ps_per_byte: cfg.ingress.work_ps_per_byte,
        }
    }
}

impl Work for SpinWork {
    fn process(&mut self, _tenant: TenantIdx, frame: &mut Frame) -> u64 {
        let target = self.work_ns + self.work_ps_per_byte * frame.len() as u64 / 1000;
        if target == 0 {
            return 0;
        }
        let start = thread_cpu_ns();
        loop {
            let spent = thread_cpu_ns().saturating_sub(start);
            if spent >= target {
                return spent;
            }
            std::hint::spin_loop();
        }
    }
}

/// Applies `switch.nice` (unset: [`default_nice`] for a thread with or without the kernel
/// fast path), `cpus` (the CPUs this thread may use) and `switch.slice_us`, or
/// `switch.realtime_priority`, to the calling dataplane thread.
pub(crate) fn setup_thread(
    cfg: &Config,
    cpus: Option<&[usize]>,
    fast_path: bool,
) -> anyhow::Result<()> {
    if let Some(cpus) = cpus {
        crate::sched::set_thread_cpus(cpus).with_context(|| format!("switch.cpus {cpus:?}"))?;
    }
    if let Some(priority) = cfg.switch.realtime_priority {
        // Asked for explicitly: without it the isolation the config promises does not hold.
        return crate::sched::set_thread_realtime(priority).with_context(|| {
            format!("switch.realtime_priority {priority}: SCHED_FIFO needs CAP_SYS_NICE")
        });
    }
    let nice = cfg.switch.nice.unwrap_or_else(|| default_nice(fast_path));
    if let Err(e) = crate::sched::set_thread_nice(nice.into()) {
        tracing::warn!("switch.nice {nice}: {e} (running at the inherited priority)");
    }
    if let Some(us) = cfg.switch.slice_us {
        if let Err(e) = crate::sched::set_thread_slice(us * 1000) {
            tracing::warn!(
                "switch.slice_us {us}: {e} (needs Linux 6.12+; running with the kernel's slice)"
            );
        }
    }
    Ok(())
}
