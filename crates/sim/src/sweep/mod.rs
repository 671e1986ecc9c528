//! `picnic sim sweep SWEEP.toml`: a scenario x parameter x seed grid, run in-process or as
//! Ray tasks, resumable (every finished case is a record in `OUT/cases/`, skipped on a
//! rerun while its scenario and seed are unchanged), merged into one CSV table with the mean
//! and a 95% confidence interval across seeds. docs/sim.md "Sweeps" has the format.

pub mod grid;
pub mod plot;
pub mod stats;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use grid::{Case, Sweep};

use crate::spec::Spec;

/// What a metric name in `metrics` may be.
pub const METRICS_DOC: &str = "TENANT.FIELD or victim.FIELD with FIELD one of throughput_mbps, p50_us, p99_us, p999_us, loss, completion_ms; victim_p50_ratio, victim_p99_ratio, victim_p999_ratio, victim_throughput_ratio (attacked modes, against the victim alone); the scenario's metrics (share_error, cpu_share_error, ...); sim.events, sim.wall_s, sim.events_per_sec, sim.tcp_retransmits, sim.tcp_timeouts, sim.pool_exhausted";

/// The Ray driver the project ships (scripts/sim_sweep_ray.py), carried in the binary so a
/// sweep needs no checkout; written to `OUT/.ray/` before it runs.
pub const RAY_DRIVER: &str = include_str!("../../../../scripts/sim_sweep_ray.py");

/// Arguments of `picnic sim sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Sweep file (docs/sim.md "Sweeps").
    pub sweep: PathBuf,
    /// Output directory: cases/ (one record per finished case), summary.csv, cases.csv
    /// (default: out/sweep/NAME).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run the cases as tasks on Ray (a local Ray unless --ray-address), through
    /// scripts/sim_sweep_ray.py; needs a Python with Ray (scripts/setup_ray.sh).
    #[arg(long)]
    pub ray: bool,
    /// Address of an existing Ray cluster (implies --ray); the binary, the sweep file and its
    /// scenario must be at the same paths on every node.
    #[arg(long)]
    pub ray_address: Option<String>,
    /// Python interpreter with Ray (default: the `[ray]` table's, else $PICNIC_PYTHON, else
    /// python3).
    #[arg(long)]
    pub python: Option<String>,
    /// Run in-process even when the sweep file has a `[ray]` table.
    #[arg(long, conflicts_with_all = ["ray", "ray_address"])]
    pub local: bool,
    /// Cases run at once in-process.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Add an override to the sweep's `set` table (repeatable): `--set sim.replicas=24`.
    /// It changes the cases' fingerprints, so give it an --out of its own.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// List the cases (id, fingerprint, done or not) and exit.
    #[arg(long)]
    pub list: bool,
    /// Run one case and print its record (JSON) on stdout: what a Ray task runs. With --out
    /// the record is also written there.
    #[arg(long)]
    pub case: Option<String>,
}

/// One mode's metrics in a case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModeMetrics {
    /// Mode name.
    pub mode: String,
    /// Metric name to value (absent when the run did not produce it).
    pub metrics: BTreeMap<String, f64>,
}

/// Metrics that depend on the machine, not the simulation: they differ between two runs of
/// one case.
pub const WALL_CLOCK_METRICS: [&str; 2] = ["sim.wall_s", "sim.events_per_sec"];

impl ModeMetrics {
    /// The metrics without [`WALL_CLOCK_METRICS`]: the same for the same case and seed,
    /// whichever runner ran it.
    pub fn simulated(&self) -> BTreeMap<String, f64> {
        let mut m = self.metrics.clone();
        for k in WALL_CLOCK_METRICS {
            m.remove(k);
        }
        m
    }
}

/// A finished case: `OUT/cases/ID.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// Case id.
    pub id: String,
    /// The case's fingerprint when it ran (scenario text and seed).
    pub fingerprint: String,
    /// Seed.
    pub seed: u64,
    /// (param, level) pairs.
    pub params: Vec<(String, String)>,
    /// Wall time of the case, s.
    pub wall_s: f64,
    /// Per mode, in run order.
    pub modes: Vec<ModeMetrics>,
}

/// Runs one case in-process.
pub fn run_case(case: &Case) -> Result<Record> {
    let spec = Spec::parse(&case.scenario_text)?;
    let start = Instant::now();
    let outcome = crate::report::run(&spec, case.seed, None, false)?;
    let wall_s = start.elapsed().as_secs_f64();
    let summary = &outcome.summary;
    let mut modes = Vec::new();
    for (i, mode) in summary.mode_order.iter().enumerate() {
        let mut m = BTreeMap::new();
        if let Some(tenants) = summary.modes.get(mode) {
            for (tenant, t) in tenants {
                let mut put = |field: &str, v: Option<f64>| {
                    if let Some(v) = v.filter(|v| v.is_finite()) {
                        m.insert(format!("{tenant}.{field}"), v);
                        if *tenant == summary.victim {
                            m.insert(format!("victim.{field}"), v);
                        }
                    }
                };
                put("throughput_mbps", Some(t.throughput_bps / 1e6));
                put("p50_us", t.p50_us);
                put("p99_us", t.p99_us);
                put("p999_us", t.p999_us);
                put("loss", Some(t.loss));
                put("completion_ms", t.completion_ms);
            }
        }
        if let Some(r) = summary.ratios.get(mode) {
            for (k, v) in [
                ("victim_p50_ratio", r.victim_p50_ratio),
                ("victim_p99_ratio", r.victim_p99_ratio),
                ("victim_p999_ratio", r.victim_p999_ratio),
                ("victim_throughput_ratio", r.victim_throughput_ratio),
            ] {
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    m.insert(k.into(), v);
                }
            }
        }
        if let Some(metrics) = summary.metrics.get(mode) {
            for (k, v) in metrics {
                if v.is_finite() {
                    m.insert(k.clone(), *v);
                }
            }
        }
        if let Some(s) = outcome.stats.get(i) {
            m.insert("sim.events".into(), s.events as f64);
            m.insert("sim.wall_s".into(), s.wall_s);
            m.insert("sim.events_per_sec".into(), s.events_per_sec);
            m.insert("sim.tcp_retransmits".into(), s.tcp_retransmits as f64);
            m.insert("sim.tcp_timeouts".into(), s.tcp_timeouts as f64);
            m.insert("sim.pool_exhausted".into(), s.pool_exhausted as f64);
        }
        modes.push(ModeMetrics {
            mode: mode.clone(),
            metrics: m,
        });
    }
    Ok(Record {
        id: case.id.clone(),
        fingerprint: case.fingerprint.clone(),
        seed: case.seed,
        params: case.labels.clone(),
        wall_s,
        modes,
    })
}

fn record_path(out: &Path, id: &str) -> PathBuf {
    out.join("cases").join(format!("{id}.json"))
}

/// Writes a record atomically (a crash mid-write leaves no half record to skip on).
pub fn write_record(out: &Path, r: &Record) -> Result<()> {
    let path = record_path(out, &r.id);
    let dir = path.parent().unwrap_or(out);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{}.tmp", r.id));
    std::fs::write(&tmp, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// The case's record in `out` when it exists and was made from the same scenario and seed.
pub fn finished(out: &Path, case: &Case) -> Option<Record> {
    let text = std::fs::read_to_string(record_path(out, &case.id)).ok()?;
    let r: Record = serde_json::from_str(&text).ok()?;
    (r.fingerprint == case.fingerprint).then_some(r)
}

/// A merged row: one parameter combination and mode, over its seeds.
#[derive(Debug, Clone)]
pub struct Row {
    /// Level labels in parameter order.
    pub labels: Vec<String>,
    /// Mode.
    pub mode: String,
    /// Seeds with a record.
    pub seeds: usize,
    /// Per metric of the sweep's list, its estimate (None: no seed produced it).
    pub values: Vec<Option<stats::Estimate>>,
}

/// Merges records into rows: per parameter combination (grid order), per mode (run order),
/// each metric's mean and 95% interval over the seeds that produced it.
pub fn merge(sweep: &Sweep, modes: &[String], records: &BTreeMap<String, Record>) -> Vec<Row> {
    let mut rows = Vec::new();
    for combo in sweep.cases.chunks(sweep.file.seeds.len()) {
        let labels: Vec<String> = combo[0].labels.iter().map(|(_, l)| l.clone()).collect();
        let recs: Vec<&Record> = combo.iter().filter_map(|c| records.get(&c.id)).collect();
        for mode in modes {
            let per_mode: Vec<&ModeMetrics> = recs
                .iter()
                .filter_map(|r| r.modes.iter().find(|m| &m.mode == mode))
                .collect();
            let values = sweep
                .file
                .metrics
                .iter()
                .map(|metric| {
                    let xs: Vec<f64> = per_mode
                        .iter()
                        .filter_map(|m| m.metrics.get(metric).copied())
                        .collect();
                    stats::estimate(&xs)
                })
                .collect();
            rows.push(Row {
                labels: labels.clone(),
                mode: mode.clone(),
                seeds: per_mode.len(),
                values,
            });
        }
    }
    rows
}

fn num(v: f64) -> String {
    // Shortest text that reads back to the same number.
    format!("{v}")
}

/// summary.csv: the parameters, mode, seeds, then `METRIC_mean`, `METRIC_ci95` (half-width of
/// the 95% interval; empty below two seeds) and `METRIC_n` per metric.
pub fn summary_csv(sweep: &Sweep, rows: &[Row]) -> String {
    let mut s = String::new();
    let mut head: Vec<String> = sweep.params.iter().map(|p| p.name.clone()).collect();
    head.push("mode".into());
    head.push("seeds".into());
    for m in &sweep.file.metrics {
        head.push(format!("{m}_mean"));
        head.push(format!("{m}_ci95"));
        head.push(format!("{m}_n"));
    }
    let _ = writeln!(s, "{}", head.join(","));
    for r in rows {
        let mut cells: Vec<String> = r.labels.iter().map(|l| csv_cell(l)).collect();
        cells.push(r.mode.clone());
        cells.push(r.seeds.to_string());
        for v in &r.values {
            match v {
                Some(e) => {
                    cells.push(num(e.mean));
                    cells.push(e.ci95.map(num).unwrap_or_default());
                    cells.push(e.n.to_string());
                }
                None => cells.extend([String::new(), String::new(), "0".into()]),
            }
        }
        let _ = writeln!(s, "{}", cells.join(","));
    }
    s
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// cases.csv: every record's value of every listed metric (long form).
pub fn cases_csv(sweep: &Sweep, records: &BTreeMap<String, Record>) -> String {
    let mut s = String::new();
    let mut head: Vec<String> = vec!["case".into()];
    head.extend(sweep.params.iter().map(|p| p.name.clone()));
    head.extend(["seed", "mode", "metric", "value"].map(String::from));
    let _ = writeln!(s, "{}", head.join(","));
    for c in &sweep.cases {
        let Some(r) = records.get(&c.id) else {
            continue;
        };
        for m in &r.modes {
            for metric in &sweep.file.metrics {
                if let Some(v) = m.metrics.get(metric) {
                    let mut cells = vec![c.id.clone()];
                    cells.extend(c.labels.iter().map(|(_, l)| csv_cell(l)));
                    cells.extend([c.seed.to_string(), m.mode.clone(), metric.clone(), num(*v)]);
                    let _ = writeln!(s, "{}", cells.join(","));
                }
            }
        }
    }
    s
}

fn sig(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

/// The merged table in Markdown: `mean ± half-width` per metric.
pub fn markdown(sweep: &Sweep, rows: &[Row]) -> String {
    let mut s = String::new();
    let mut head: Vec<String> = sweep.params.iter().map(|p| p.name.clone()).collect();
    head.push("mode".into());
    head.push("seeds".into());
    head.extend(sweep.file.metrics.iter().cloned());
    let _ = writeln!(s, "| {} |", head.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(head.len()));
    for r in rows {
        let mut cells = r.labels.clone();
        cells.push(r.mode.clone());
        cells.push(r.seeds.to_string());
        for v in &r.values {
            cells.push(match v {
                Some(e) => match e.ci95 {
                    Some(ci) => format!("{} ± {}", sig(e.mean), sig(ci)),
                    None => sig(e.mean),
                },
                None => "-".into(),
            });
        }
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    s
}

/// How the pending cases run.
enum Runner {
    Local {
        jobs: usize,
    },
    Ray {
        address: Option<String>,
        python: String,
    },
}

/// Runs `picnic sim sweep`; `worker` is the command that runs one case as
/// `WORKER SWEEP --case ID` (the `picnic sim sweep` of this binary). Exit code: 0 every case
/// finished, 1 some did not.
pub fn run_cli(args: SweepArgs, worker: &[String]) -> Result<i32> {
    let extra = args
        .set
        .iter()
        .map(|a| grid::parse_set(a))
        .collect::<Result<Vec<_>>>()?;
    let sweep = Sweep::load_with(&args.sweep, &extra)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join("sweep").join(&sweep.name));
    let say = |msg: &str| eprintln!("[sweep {}] {msg}", sweep.name);

    if let Some(id) = &args.case {
        let case = sweep.case(id)?;
        let r = run_case(case)?;
        if args.out.is_some() {
            write_record(&out, &r)?;
        }
        println!("{}", serde_json::to_string(&r)?);
        return Ok(0);
    }
    if args.list {
        for c in &sweep.cases {
            let done = if finished(&out, c).is_some() {
                "done"
            } else {
                "to run"
            };
            println!("{}\t{}\t{done}", c.id, c.fingerprint);
        }
        return Ok(0);
    }

    let modes = sweep.modes()?;
    let ray_table = sweep.file.ray.clone();
    let runner = if !args.local && (args.ray || args.ray_address.is_some() || ray_table.is_some()) {
        let t = ray_table.unwrap_or_default();
        Runner::Ray {
            address: args.ray_address.clone().or(t.address),
            python: args
                .python
                .clone()
                .or(t.python)
                .or_else(|| std::env::var("PICNIC_PYTHON").ok())
                .unwrap_or_else(|| "python3".into()),
        }
    } else {
        Runner::Local {
            jobs: args.jobs.max(1),
        }
    };

    let pending: Vec<&Case> = sweep
        .cases
        .iter()
        .filter(|c| finished(&out, c).is_none())
        .collect();
    let shape: Vec<String> = sweep
        .params
        .iter()
        .map(|p| format!("{} {}", p.levels.len(), p.name))
        .collect();
    say(&format!(
        "{} cases ({}{} seeds), modes {}; {} finished earlier in {}, {} to run {}",
        sweep.cases.len(),
        shape.iter().map(|s| format!("{s} x ")).collect::<String>(),
        sweep.file.seeds.len(),
        modes.join(","),
        sweep.cases.len() - pending.len(),
        out.display(),
        pending.len(),
        match &runner {
            Runner::Local { jobs } => format!("in-process ({jobs} at a time)"),
            Runner::Ray { address, .. } => format!(
                "on Ray ({})",
                address
                    .as_deref()
                    .unwrap_or("a local Ray started for this sweep")
            ),
        }
    ));
    std::fs::create_dir_all(out.join("cases"))
        .with_context(|| format!("creating {}", out.display()))?;

    let start = Instant::now();
    if !pending.is_empty() {
        match &runner {
            Runner::Local { jobs } => run_local(&sweep, &pending, &out, *jobs),
            Runner::Ray { address, python } => {
                run_ray(&args, &pending, &out, worker, address.as_deref(), python)?
            }
        }
    }

    let mut records = BTreeMap::new();
    let mut missing = Vec::new();
    for c in &sweep.cases {
        match finished(&out, c) {
            Some(r) => {
                records.insert(c.id.clone(), r);
            }
            None => missing.push(c.id.clone()),
        }
    }
    let rows = merge(&sweep, &modes, &records);
    std::fs::write(out.join("summary.csv"), summary_csv(&sweep, &rows))?;
    std::fs::write(out.join("cases.csv"), cases_csv(&sweep, &records))?;
    if let Err(e) = plot::plots(&out, &sweep, &rows) {
        say(&format!("plotting: {e:#}"));
    }
    println!("{}", markdown(&sweep, &rows));
    say(&format!(
        "{} of {} cases finished ({} this run, {:.1} s wall); wrote {}/summary.csv, cases.csv and plot-*.svg",
        records.len(),
        sweep.cases.len(),
        pending.len() - missing.len().min(pending.len()),
        start.elapsed().as_secs_f64(),
        out.display()
    ));
    if missing.is_empty() {
        Ok(0)
    } else {
        say(&format!(
            "not finished ({}): {}; run the same command again to run only these",
            missing.len(),
            missing.join(" ")
        ));
        Ok(1)
    }
}

fn run_local(sweep: &Sweep, pending: &[&Case], out: &Path, jobs: usize) {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(0usize);
    let total = pending.len();
    std::thread::scope(|s| {
        for _ in 0..jobs.min(total) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = pending.get(i) else {
                    break;
                };
                let result = run_case(case).and_then(|r| write_record(out, &r).map(|()| r));
                let mut d = done.lock().unwrap_or_else(|e| e.into_inner());
                *d += 1;
                match result {
                    Ok(r) => eprintln!(
                        "[sweep {}] {}/{total} {} in {:.1} s",
                        sweep.name, *d, case.id, r.wall_s
                    ),
                    Err(e) => eprintln!(
                        "[sweep {}] {}/{total} {} failed: {e:#}",
                        sweep.name, *d, case.id
                    ),
                }
            });
        }
    });
}

fn run_ray(
    args: &SweepArgs,
    pending: &[&Case],
    out: &Path,
    worker: &[String],
    address: Option<&str>,
    python: &str,
) -> Result<()> {
    let dir = out.join(".ray");
    std::fs::create_dir_all(&dir)?;
    let driver = dir.join("sim_sweep_ray.py");
    std::fs::write(&driver, RAY_DRIVER)?;
    let ids: String = pending.iter().map(|c| format!("{}\n", c.id)).collect();
    let list = dir.join("pending.txt");
    std::fs::write(&list, ids)?;
    let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("{}", p.display()));
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&driver)
        .arg("--sweep")
        .arg(abs(&args.sweep)?)
        .arg("--out")
        .arg(abs(out)?)
        .arg("--cases")
        .arg(abs(&list)?);
    if let Some(a) = address {
        cmd.arg("--address").arg(a);
    }
    cmd.arg("--").args(worker);
    for s in &args.set {
        cmd.arg("--set").arg(s);
    }
    let status = cmd
        .status()
        .with_context(|| format!("starting {python} {}", driver.display()))?;
    match status.code() {
        Some(0) | Some(1) => Ok(()), // 1: some cases failed; the merge says which
        _ => bail!(
            "the Ray driver ({python} {}) exited with {status}{}",
            driver.display(),
            if status.code() == Some(3) {
                ": no Ray in this Python (bash scripts/setup_ray.sh, then --python target/venv-ray/bin/python)"
            } else {
                ""
            }
        ),
    }
}

/// The command that runs one case of a sweep with this binary, as `picnic sim sweep`.
pub fn default_worker() -> Result<Vec<String>> {
    let exe = std::env::current_exe().map_err(|e| anyhow!("locating this binary: {e}"))?;
    Ok(vec![
        exe.to_string_lossy().into_owned(),
        "sim".into(),
        "sweep".into(),
    ])
}

#[cfg(test)]
mod tests;
