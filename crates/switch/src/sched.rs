//! Scheduler settings of the calling thread: nice value, EEVDF slice and CPU placement.
//!
//! On a host whose tenants share the switch's cores, a packet waits for every thread on its
//! path (the switch, the tenant's socket owner) to be scheduled. Linux's fair scheduler
//! (EEVDF, 6.6+) lets a runnable thread run for its slice (about 3 ms on small machines)
//! before a newly woken one with an earlier deadline preempts it, so a flooding neighbour's
//! busy thread can hold a core for that long while the victim's packet waits. Since 6.12 a
//! thread may ask for a shorter slice (`sched_setattr` with `sched_runtime` for
//! SCHED_OTHER, 100 us to 100 ms): it then gets an earlier deadline when it wakes, which is
//! the behaviour a kernel datapath gets from softirq. Both settings are inherited by threads
//! and processes started afterwards.

use std::io;

use crate::config::SLICE_RANGE_NS;

/// Sets the calling thread's nice value (-20..=19).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: plain syscall on the calling thread (setpriority with a thread id applies to
    // that thread on Linux).
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, thread_id(), nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks for an EEVDF slice of `slice_ns` for the calling thread, keeping its nice value.
/// Fails with the kernel's error on kernels before 6.12 (EINVAL) or out of range values.
pub fn set_thread_slice(slice_ns: u64) -> io::Result<()> {
    if !SLICE_RANGE_NS.contains(&slice_ns) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("slice {slice_ns} ns is outside the kernel's 100 us..100 ms"),
        ));
    }
    /// `struct sched_attr` of include/uapi/linux/sched/types.h (version 1, 56 bytes).
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
        util_min: u32,
        util_max: u32,
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: thread_nice()?,
        priority: 0,
        runtime: slice_ns,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: `attr` is a valid sched_attr whose size field matches its layout; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Puts the calling thread in the real-time class, SCHED_FIFO at `priority` (1..=99), with
/// SCHED_RESET_ON_FORK so threads it starts (the encryption engine's workers, tools) are back
/// in the fair class. Needs CAP_SYS_NICE (or an RLIMIT_RTPRIO allowing the priority).
pub fn set_thread_realtime(priority: u8) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority.into(),
    };
    // SAFETY: plain syscall on the calling thread (pid 0) with a valid sched_param.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives up the calling thread's CPU to any runnable thread the scheduler would rather run
/// (sched_yield(2)); returns at once when there is none.
pub fn yield_now() {
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe { libc::sched_yield() };
}

/// Sets the calling thread's timer slack (prctl PR_SET_TIMERSLACK), ns: how late the kernel
/// may end its timed waits to batch wake-ups (50 us by default for a normal thread).
pub fn set_timer_slack(ns: u64) -> io::Result<()> {
    // SAFETY: plain prctl on the calling thread with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Restricts the calling thread to the listed CPUs (a dataplane on cores of its own).
pub fn set_thread_cpus(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it (indices are checked
    // against its size first); pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &cpu in cpus {
            if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("CPU {cpu} is beyond the affinity mask"),
                ));
            }
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// CPUs the calling thread may run on.
pub fn thread_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: as above; sched_getaffinity fills the set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..8 * std::mem::size_of::<libc::cpu_set_t>())
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

fn thread_id() -> libc::id_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as libc::id_t }
}

fn thread_nice() -> io::Result<i32> {
    // getpriority returns -1 both as a value and as an error: errno tells them apart.
    // SAFETY: errno is thread-local; getpriority has no preconditions.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, thread_id());
        if n == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_outside_the_kernel_range_is_refused_before_the_syscall() {
        assert_eq!(
            set_thread_slice(50_000).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            set_thread_slice(200_000_000).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_thread_can_be_placed_on_one_cpu() {
        std::thread::spawn(|| {
            let all = thread_cpus().unwrap();
            set_thread_cpus(&all[..1]).unwrap();
            assert_eq!(thread_cpus().unwrap(), &all[..1]);
            assert!(set_thread_cpus(&[100_000]).is_err());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_short_slice_is_what_the_scheduler_reports_and_keeps_the_nice_value() {
        // Runs in its own thread so the test harness's other threads are untouched.
        std::thread::spawn(|| {
            let before = thread_nice().unwrap();
            match set_thread_slice(100_000) {
                // Kernels before 6.12 reject sched_runtime for fair threads.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
                r => r.unwrap(),
            }
            assert_eq!(thread_nice().unwrap(), before);
            let sched = std::fs::read_to_string("/proc/thread-self/sched").unwrap();
            let slice = sched
                .lines()
                .find(|l| l.starts_with("se.slice"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().parse::<u64>().unwrap());
            assert_eq!(slice, Some(100_000), "{sched}");
        })
        .join()
        .unwrap();
    }
}
