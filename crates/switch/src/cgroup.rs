//! Writing a tenant's cgroup CPU quota (Iron 3.2: the container pays for the network
//! processing done for it). cgroup v1 (`cpu.cfs_period_us` / `cpu.cfs_quota_us`, the case on
//! our machines, DESIGN.md 7) and v2 (`cpu.max`, "QUOTA PERIOD") are both handled; the
//! switch owns the group's quota while it runs and puts the allocation back when it stops.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use picnic_core::Duration;

/// The longest CFS period the kernel accepts (v1 `cpu.cfs_period_us`, v2 `cpu.max`), us.
const KERNEL_PERIOD_MAX_US: u64 = 1_000_000;

/// The smallest quota the kernel accepts, ns (1 ms).
const MIN_QUOTA_NS: i128 = 1_000_000;

/// Longest debt carried, in budgets: a tenant that keeps overrunning stays at the minimum
/// quota, and its debt is bounded so that it recovers within this many periods once it stops.
const MAX_DEBT_PERIODS: i128 = 10;

/// The CPU quota files of one cgroup, driven by the switch as the group's period clock.
///
/// Writing a quota refills the group's CFS runtime and forgives the overrun the kernel has
/// noted on each CPU (`tg_set_cfs_bandwidth`), so a switch that rewrote a 10 ms-period quota
/// every 10 ms would hand the group up to two budgets per period and cancel every throttle.
/// The switch therefore sets the kernel's period to its 1 s maximum and writes the budget of
/// each of its own periods at the period's start: that write is the period's refill (one
/// extra kernel refill a second is the residual). The overrun the kernel no longer carries
/// (a thread runs until the next tick notices its runtime is spent: up to 4 ms at HZ=250)
/// the switch carries itself: it reads the group's CPU time and pays the excess back out of
/// the next budgets, as Iron's Algorithm 1 lets a container's runtime go negative and
/// repays it in the next period.
#[derive(Debug)]
pub struct CpuQuota {
    dir: PathBuf,
    v2: bool,
    /// The accounting period the budgets are for, us (restored as the kernel's at release).
    period_us: u64,
    /// The group's CPU time and the budget it was entitled to at the last refill, ns.
    last: Option<(u64, u64)>,
    /// CPU time used beyond the budgets so far, ns (never negative: unused budget is not
    /// saved up).
    debt_ns: i128,
    /// The most CPU time a period can really use, ns: two periods on every CPU (a larger
    /// step is a thread joining with earlier run time).
    most_per_period_ns: u64,
    /// A quota was written since [`CpuQuota::open`] (which leaves the kernel's unlimited one).
    limited: bool,
}

impl CpuQuota {
    /// Opens `dir` for budgets of `period` (the switch's accounting period) and lengthens the
    /// kernel's CFS period so that only the switch's writes refill the group.
    pub fn open(dir: &Path, period: Duration) -> Result<CpuQuota> {
        let v1 = dir.join("cpu.cfs_quota_us");
        let v2 = dir.join("cpu.max");
        let v2_mode = if v1.exists() {
            false
        } else if v2.exists() {
            true
        } else {
            bail!(
                "{}: no cpu.cfs_quota_us (cgroup v1) or cpu.max (cgroup v2): is it a cgroup \
                 with the cpu controller?",
                dir.display()
            );
        };
        let period_us = (period.as_nanos() / 1_000).max(1_000);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let q = CpuQuota {
            dir: dir.to_path_buf(),
            v2: v2_mode,
            period_us,
            last: None,
            debt_ns: 0,
            most_per_period_ns: 2 * period_us * 1_000 * cpus,
            limited: false,
        };
        q.set_period(KERNEL_PERIOD_MAX_US)?;
        Ok(q)
    }

    /// Hands the group its entitlement `budget` for the switch period starting now, less the
    /// debt of earlier overruns, plus what the group gained back, at least the kernel's 1 ms
    /// minimum, or nothing when the debt leaves less than half of that; returns the quota
    /// written (zero: none). Call once per period, even when the budget is unchanged: the
    /// write is the refill.
    ///
    /// `credit` is the ports' softirq work the kernel ran in the group's threads during the
    /// period that ends (the scheduler charged it to them; the switch charges it to the
    /// ports' tenants): it is taken off the group's use, and what it frees beyond the debt is
    /// gained back in the next budget (Iron's Algorithm 2).
    pub fn refill(&mut self, budget: Duration, credit: Duration) -> Result<Duration> {
        let used = self.used_ns()?;
        let mut gained: i128 = 0;
        if let Some((used_before, entitled)) = self.last {
            // Threads that left the group take their time with them: never a negative use.
            // A period's use can be no more than every CPU for the whole period (and some
            // slack for a late refill): a larger step is a thread that joined with the run
            // time it had before, so that period's overrun is unknown and not charged.
            let step = used.saturating_sub(used_before);
            let credit = credit.as_nanos() as i128;
            let overrun = if step > self.most_per_period_ns {
                0
            } else {
                step as i128 - credit - entitled as i128
            };
            let balance = self.debt_ns + overrun;
            if balance < 0 {
                gained = (-balance).min(credit);
            }
            let cap = MAX_DEBT_PERIODS * budget.as_nanos().max(1_000_000) as i128;
            self.debt_ns = balance.clamp(0, cap);
        }
        // The entitlement of the period starting now: its budget and what was gained back.
        self.last = Some((used, budget.as_nanos() + gained as u64));
        let left = budget.as_nanos() as i128 - self.debt_ns + gained;
        if left < MIN_QUOTA_NS / 2 && self.limited {
            // Nothing (or less than half the kernel's minimum) left: no refill this period.
            // The group stays throttled once what it has is spent, and the kernel keeps its
            // overrun on the books because nothing was written. Not before a first quota is
            // written: the group would keep the unlimited quota `open` left it (a first
            // refill that found the group's allocation spent did, for the whole run).
            return Ok(Duration::ZERO);
        }
        let quota_ns = left.max(MIN_QUOTA_NS) as u64;
        self.write_quota(quota_ns / 1_000, KERNEL_PERIOD_MAX_US)?;
        self.limited = true;
        Ok(Duration::from_nanos(quota_ns))
    }

    /// CPU time the group's threads have used, ns: v2's `cpu.stat` `usage_usec`; v1's cpu
    /// controller keeps none (that is cpuacct's, not always mounted beside it), so the sum of
    /// the scheduler's run time of the threads in `tasks`.
    fn used_ns(&self) -> Result<u64> {
        if self.v2 {
            let stat = self.read("cpu.stat")?;
            let usec = stat
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .with_context(|| {
                    format!("{}: no usage_usec", self.dir.join("cpu.stat").display())
                })?;
            return Ok(usec * 1_000);
        }
        let tasks = self.read("tasks")?;
        Ok(tasks
            .lines()
            .filter_map(|tid| {
                // A thread may exit between the two reads: it then counts nothing.
                let stat = fs::read_to_string(format!("/proc/{}/schedstat", tid.trim())).ok()?;
                stat.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum())
    }

    /// The group's threads (v1 `tasks`, v2 `cgroup.threads`).
    pub fn threads(&self) -> Result<Vec<u32>> {
        let list = self.read(if self.v2 { "cgroup.threads" } else { "tasks" })?;
        Ok(list.lines().filter_map(|t| t.trim().parse().ok()).collect())
    }

    fn read(&self, file: &str) -> Result<String> {
        let path = self.dir.join(file);
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Gives the group back a plain quota of `allocation` per accounting period (the switch
    /// stops driving it).
    pub fn release(&mut self, allocation: Duration) -> Result<()> {
        let us = (allocation.as_nanos() / 1_000).max(1_000);
        self.set_period(self.period_us)?;
        self.write_quota(us, self.period_us)
    }

    fn set_period(&self, period_us: u64) -> Result<()> {
        if self.v2 {
            return Ok(()); // cpu.max carries the period with every quota
        }
        // v1 refuses a period below the current quota: lift the quota limit first.
        self.write("cpu.cfs_quota_us", "-1")?;
        self.write("cpu.cfs_period_us", &period_us.to_string())
    }

    fn write_quota(&self, us: u64, period_us: u64) -> Result<()> {
        if self.v2 {
            self.write("cpu.max", &format!("{us} {period_us}"))
        } else {
            self.write("cpu.cfs_quota_us", &us.to_string())
        }
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        fs::write(&path, value).with_context(|| format!("writing {value} to {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory standing in for a cgroup, removed when dropped.
    struct FakeGroup(PathBuf);
    impl FakeGroup {
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for FakeGroup {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn fake_group(files: &[(&str, &str)]) -> FakeGroup {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "picnic-cgroup-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        for (f, v) in files {
            fs::write(dir.join(f), v).unwrap();
        }
        FakeGroup(dir)
    }

    #[test]
    fn v1_budgets_are_refills_under_a_1s_kernel_period_and_release_restores_the_period() {
        let g = fake_group(&[
            ("cpu.cfs_quota_us", "-1"),
            ("cpu.cfs_period_us", "100000"),
            ("tasks", ""),
        ]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        let read = |f: &str| fs::read_to_string(g.path().join(f)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "1000000");
        q.refill(Duration::from_micros(4_200), Duration::ZERO)
            .unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "4200");
        // Below cgroup v1's 1 ms minimum the minimum is written...
        q.refill(Duration::from_micros(700), Duration::ZERO)
            .unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "1000");
        // ...and below half of it nothing: no refill this period.
        q.refill(Duration::from_micros(10), Duration::ZERO).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "1000");
        q.release(Duration::from_millis(3)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "10000");
        assert_eq!(read("cpu.cfs_quota_us"), "3000");
    }

    /// A group whose first period's allocation the switch's work already spent still gets a
    /// quota: without one it kept the unlimited quota `open` leaves, period after period.
    #[test]
    fn the_first_refill_limits_the_group_even_with_nothing_left() {
        let g = fake_group(&[("cpu.max", "max 100000"), ("cpu.stat", "usage_usec 0\n")]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        let read = || fs::read_to_string(g.path().join("cpu.max")).unwrap();
        assert!(read().starts_with("max "), "unlimited after open");
        assert_eq!(
            q.refill(Duration::from_micros(10), Duration::ZERO).unwrap(),
            Duration::from_millis(1)
        );
        assert_eq!(
            read(),
            "1000 1000000",
            "the kernel's minimum, not unlimited"
        );
        // From then on, nothing left is no refill.
        assert_eq!(
            q.refill(Duration::from_micros(10), Duration::ZERO).unwrap(),
            Duration::ZERO
        );
        assert_eq!(read(), "1000 1000000");
    }

    #[test]
    fn v2_writes_quota_and_period_to_cpu_max() {
        let g = fake_group(&[("cpu.max", "max 100000"), ("cpu.stat", "usage_usec 0\n")]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        let read = || fs::read_to_string(g.path().join("cpu.max")).unwrap();
        q.refill(Duration::from_millis(5), Duration::ZERO).unwrap();
        assert_eq!(read(), "5000 1000000");
        q.release(Duration::from_millis(3)).unwrap();
        assert_eq!(read(), "3000 10000");
    }

    #[test]
    fn overruns_are_paid_back_out_of_the_next_budgets_and_unused_budget_is_not_saved() {
        let g = fake_group(&[("cpu.max", "max 100000"), ("cpu.stat", "usage_usec 0\n")]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        let used =
            |us: u64| fs::write(g.path().join("cpu.stat"), format!("usage_usec {us}\n")).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(q.refill(ms(3), Duration::ZERO).unwrap(), ms(3));
        // 7 ms used on a 3 ms budget (a tick's overrun): 4 ms of debt, nothing left: no
        // refill this period.
        used(7_000);
        assert_eq!(q.refill(ms(3), Duration::ZERO).unwrap(), Duration::ZERO);
        // 1 ms used (what was left in the group): 2 ms of debt, 1 ms of budget left.
        used(8_000);
        assert_eq!(q.refill(ms(3), Duration::ZERO).unwrap(), ms(1));
        // 1 ms used: debt paid, the full budget again.
        used(9_000);
        assert_eq!(q.refill(ms(3), Duration::ZERO).unwrap(), ms(3));
        // Nothing used for a period: no credit beyond the budget.
        assert_eq!(q.refill(ms(3), Duration::ZERO).unwrap(), ms(3));
        // A thread joining with a second of earlier run time is no overrun.
        used(1_009_000);
        assert_eq!(q.refill(ms(3), Duration::ZERO).unwrap(), ms(3));
        assert_eq!(
            fs::read_to_string(g.path().join("cpu.max")).unwrap(),
            "3000 1000000"
        );
    }

    #[test]
    fn softirq_run_for_the_ports_in_the_groups_threads_is_taken_off_its_use_and_gained_back() {
        let g = fake_group(&[
            ("cpu.max", "max 100000"),
            ("cpu.stat", "usage_usec 0\n"),
            ("cgroup.threads", "41\n42\n"),
        ]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        assert_eq!(q.threads().unwrap(), vec![41, 42]);
        let used =
            |us: u64| fs::write(g.path().join("cpu.stat"), format!("usage_usec {us}\n")).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(q.refill(ms(3), ms(0)).unwrap(), ms(3));
        // 5 ms used, 2 ms of it the kernel's softirq work for the ports (charged by the switch
        // to their tenants): the group's own use was its 3 ms, no debt.
        used(5_000);
        assert_eq!(q.refill(ms(3), ms(2)).unwrap(), ms(3));
        // Its 3 ms used, 1 ms of it softirq work for the ports: 1 ms gained back.
        used(8_000);
        assert_eq!(q.refill(ms(3), ms(1)).unwrap(), ms(4));
        // A credit first pays a debt: 8 ms used on an entitlement of 4 with 1 ms of softirq
        // work leaves 3 ms of debt and no refill; then 4 ms used with 2 ms of softirq work is
        // 2 ms of its own against 3: 2 ms of debt left, 1 ms of budget (without the credit
        // it would have been 4 ms of debt and no refill again).
        used(16_000);
        assert_eq!(q.refill(ms(3), ms(1)).unwrap(), Duration::ZERO);
        used(20_000);
        assert_eq!(q.refill(ms(3), ms(2)).unwrap(), ms(1));
        // Idle with no credit: the plain budget, nothing saved up.
        assert_eq!(q.refill(ms(3), ms(0)).unwrap(), ms(3));
    }

    #[test]
    fn a_directory_without_quota_files_is_refused_with_the_reason() {
        let g = fake_group(&[]);
        let e = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap_err();
        assert!(format!("{e:#}").contains("cpu controller"), "{e:#}");
    }
}
