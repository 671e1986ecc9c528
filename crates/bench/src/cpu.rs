//! What a device's forwarding costs in CPU time, read around a measurement window.
//!
//! Every device is charged the same way ([`CpuSample`]):
//!
//! - **its threads**: the on-CPU time (`/proc/.../schedstat`, first field: the scheduler's
//!   `sum_exec_runtime`, ns precision, brought up to date at every tick and context switch,
//!   so up to 4 ms behind for a thread running at the moment it is read) of every thread of the device: the forwarding threads
//!   of the raw forwarders and of picnic (every thread of this process that is not the bench's
//!   own, see [`register_bench_thread`]), every thread of ovs-vswitchd; none for the bridge.
//!   Softirq work run in a thread's context (the sink's receive of what it sends, run when its
//!   send re-enables bottom halves) is part of that time on this kernel (no
//!   `CONFIG_IRQ_TIME_ACCOUNTING`).
//! - **softirq on the generator's CPU**: the `softirq` column of CPU 0 in `/proc/stat`. That
//!   is the kernel work the device's receive hook adds to each frame the generator sends (the
//!   TPACKET copy into an AF_PACKET ring, XDP redirect and copy into an AF_XDP UMEM, and for
//!   the bridge the whole forwarding and the sink's receive), run in the generator's softirq
//!   or in ksoftirqd/0, plus any other softirq work on that CPU meanwhile (other traffic on the
//!   machine; an idle-window baseline was tried and removed: its own sampling error was as
//!   large as what it took off). It is tick-sampled (250 Hz here), so it carries a sampling
//!   error: about +-2% of a CPU over a 1.5 s window.
//! - **ksoftirqd on the device's CPU**: packet work deferred there (ns precise).

use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};

/// Threads of this process that belong to the bench (main, generator, sink, watchers), not
/// to a device under test.
static BENCH_THREADS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// Marks the calling thread as the bench's own: its CPU time is not the device's.
pub fn register_bench_thread() {
    let tid = gettid();
    let mut v = BENCH_THREADS.lock().unwrap_or_else(|e| e.into_inner());
    if !v.contains(&tid) {
        v.push(tid);
    }
}

/// The calling thread's kernel id.
pub fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// Scheduler time of a set of threads, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    /// On a CPU (`/proc/.../schedstat` field 1).
    pub on_cpu: u64,
    /// Runnable but waiting for a CPU, other tasks running there (field 2, run delay).
    pub waiting: u64,
}

/// Scheduler times of one task (`/proc/<path>/schedstat`).
pub fn schedstat(path: &str) -> Result<ThreadTimes> {
    let text = std::fs::read_to_string(format!("/proc/{path}/schedstat"))
        .with_context(|| format!("reading /proc/{path}/schedstat"))?;
    let mut f = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    match (f.next().flatten(), f.next().flatten()) {
        (Some(on_cpu), Some(waiting)) => Ok(ThreadTimes { on_cpu, waiting }),
        _ => Err(anyhow!("unexpected /proc/{path}/schedstat")),
    }
}

/// Sum of the scheduler times of every thread of process `pid` (`self` for this one),
/// skipping the tids in `skip`.
pub fn threads_ns(pid: &str, skip: &[u64]) -> ThreadTimes {
    tids(pid, skip)
        .into_iter()
        .filter_map(|tid| schedstat(&format!("{pid}/task/{tid}")).ok())
        .fold(ThreadTimes::default(), |a, t| ThreadTimes {
            on_cpu: a.on_cpu + t.on_cpu,
            waiting: a.waiting + t.waiting,
        })
}

/// Scheduler times of this process's threads that are not the bench's own: the device's
/// threads when the device runs in this process.
pub fn device_threads_ns() -> ThreadTimes {
    threads_ns("self", &bench_threads())
}

/// The `softirq` time of `cpu` in `/proc/stat`, ns (tick-sampled, USER_HZ resolution).
pub fn softirq_ns(cpu: usize) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let name = format!("cpu{cpu}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
        .ok_or_else(|| anyhow!("no {name} in /proc/stat"))?;
    // cpuN user nice system idle iowait irq softirq ...
    let ticks: u64 = line
        .split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| anyhow!("short {name} line in /proc/stat"))?;
    Ok(ticks * 1_000_000_000 / ticks_per_second())
}

/// Clock ticks per second of /proc CPU times.
fn ticks_per_second() -> u64 {
    // SAFETY: sysconf takes no pointers.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as u64
}

/// Pid of `ksoftirqd/<cpu>`.
pub fn ksoftirqd_pid(cpu: usize) -> Option<String> {
    let want = format!("ksoftirqd/{cpu}");
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == want)
        })
}

/// Sets the nice value of thread `tid` (0: the calling thread).
pub fn set_nice(tid: u64, nice: i32) -> Result<()> {
    // SAFETY: setpriority takes no pointers; on Linux PRIO_PROCESS with a tid is that thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        return Err(anyhow!(
            "setpriority({tid}, {nice}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Tids of process `pid` (`self` for this one) not in `skip`.
pub fn tids(pid: &str, skip: &[u64]) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|tid| !skip.contains(tid))
        .collect()
}

/// The bench's own threads.
pub fn bench_threads() -> Vec<u64> {
    BENCH_THREADS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Cumulative CPU counters of one device, read at the edges of a window.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    /// Scheduler times of the device's threads (0 for the bridge).
    pub threads: ThreadTimes,
    /// `/proc/stat` softirq ns of the generator's CPU.
    pub gen_softirq: u64,
    /// On-CPU ns of ksoftirqd on the device's CPU.
    pub dut_ksoftirqd: u64,
}

/// The CPU a device used over a window, split by where it ran (ns).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CpuUse {
    pub threads: f64,
    pub softirq: f64,
    /// Time the device's threads were runnable but waited for a CPU (not CPU use: the share
    /// of its CPU that other tasks took while it had work).
    pub waiting: f64,
}

impl CpuUse {
    pub fn total(&self) -> f64 {
        self.threads + self.softirq
    }
}

impl CpuSample {
    /// What was used between `self` and `later`.
    pub fn until(&self, later: &CpuSample) -> CpuUse {
        let gen_softirq = later.gen_softirq.saturating_sub(self.gen_softirq) as f64;
        CpuUse {
            threads: later.threads.on_cpu.saturating_sub(self.threads.on_cpu) as f64,
            waiting: later.threads.waiting.saturating_sub(self.threads.waiting) as f64,
            softirq: gen_softirq + later.dut_ksoftirqd.saturating_sub(self.dut_ksoftirqd) as f64,
        }
    }
}

/// Reads a device's counters: `threads` are its threads' scheduler times.
pub fn sample(threads: ThreadTimes, gen_cpu: usize, dut_ksoftirqd: Option<&str>) -> CpuSample {
    CpuSample {
        threads,
        gen_softirq: softirq_ns(gen_cpu).unwrap_or(0),
        dut_ksoftirqd: dut_ksoftirqd
            .and_then(|p| schedstat(p).ok())
            .map_or(0, |t| t.on_cpu),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_time_grows_and_bench_threads_are_skipped() {
        let me = format!("self/task/{}", gettid());
        let a = schedstat(&me).unwrap().on_cpu;
        // Spin 20 ms, then sleep: the kernel updates the running total at ticks and switches.
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        let b = schedstat(&me).unwrap().on_cpu;
        assert!(b > a, "schedstat did not advance: {a} -> {b}");
        let all = threads_ns("self", &[]).on_cpu;
        let without_me = threads_ns("self", &[gettid()]).on_cpu;
        assert!(all >= without_me + b, "{all} < {without_me} + {b}");
    }

    #[test]
    fn softirq_column_reads_and_cpu_use_is_the_difference() {
        softirq_ns(0).unwrap();
        let t = |on_cpu, waiting| ThreadTimes { on_cpu, waiting };
        let a = CpuSample {
            threads: t(100, 5),
            gen_softirq: 1_000,
            dut_ksoftirqd: 10,
        };
        let b = CpuSample {
            threads: t(600, 50),
            gen_softirq: 3_000,
            dut_ksoftirqd: 30,
        };
        let u = a.until(&b);
        assert_eq!(u.threads, 500.0);
        assert_eq!(u.waiting, 45.0);
        assert_eq!(u.softirq, 2_000.0 + 20.0);
        assert_eq!(u.total(), 2_520.0);
    }
}
