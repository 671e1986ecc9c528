//! Writing a tenant's cgroup CPU quota (Iron 3.2: the container pays for the network
//! processing done for it). cgroup v1 (`cpu.cfs_period_us` / `cpu.cfs_quota_us`, the case on
//! our machines, DESIGN.md 7) and v2 (`cpu.max`, "QUOTA PERIOD") are both handled; the
//! switch owns the group's quota while it runs and puts the allocation back when it stops.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use picnic_core::Duration;

/// The CPU quota files of one cgroup.
#[derive(Debug)]
pub struct CpuQuota {
    dir: PathBuf,
    v2: bool,
    period_us: u64,
    /// The last quota written, us (writes are skipped when it does not change).
    last_us: Option<u64>,
}

impl CpuQuota {
    /// Opens `dir` and sets its CFS period to `period` (the switch's accounting period).
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
        let q = CpuQuota {
            dir: dir.to_path_buf(),
            v2: v2_mode,
            period_us: (period.as_nanos() / 1_000).max(1_000),
            last_us: None,
        };
        if !q.v2 {
            // v1 refuses a period below the current quota: lift the quota limit first.
            q.write("cpu.cfs_quota_us", "-1")?;
            q.write("cpu.cfs_period_us", &q.period_us.to_string())?;
        }
        Ok(q)
    }

    /// Sets the quota for each period.
    pub fn set(&mut self, quota: Duration) -> Result<()> {
        let us = (quota.as_nanos() / 1_000).max(1_000);
        if self.last_us == Some(us) {
            return Ok(());
        }
        if self.v2 {
            self.write("cpu.max", &format!("{us} {}", self.period_us))?;
        } else {
            self.write("cpu.cfs_quota_us", &us.to_string())?;
        }
        self.last_us = Some(us);
        Ok(())
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
    fn v1_sets_the_period_then_quotas_in_microseconds() {
        let g = fake_group(&[("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        let read = |f: &str| fs::read_to_string(g.path().join(f)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "10000");
        q.set(Duration::from_micros(4_200)).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "4200");
        // Below cgroup v1's 1 ms minimum the minimum is written.
        q.set(Duration::from_micros(10)).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "1000");
    }

    #[test]
    fn v2_writes_quota_and_period_to_cpu_max() {
        let g = fake_group(&[("cpu.max", "max 100000")]);
        let mut q = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap();
        q.set(Duration::from_millis(5)).unwrap();
        assert_eq!(
            fs::read_to_string(g.path().join("cpu.max")).unwrap(),
            "5000 10000"
        );
    }

    #[test]
    fn a_directory_without_quota_files_is_refused_with_the_reason() {
        let g = fake_group(&[]);
        let e = CpuQuota::open(g.path(), Duration::from_millis(10)).unwrap_err();
        assert!(format!("{e:#}").contains("cpu controller"), "{e:#}");
    }
}
