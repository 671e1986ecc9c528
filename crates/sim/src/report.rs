//! Running every mode of a spec and writing the lab's outputs (summary.json, timeseries.csv,
//! latency.csv through `picnic_scenario`'s report, so the keys are the lab's) plus the simulator's
//! own: sim.json (events/s, wall time, conservation, queues), queues.csv, flows.csv,
//! rates.csv (1 ms bins) and SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use picnic_scenario::{write_outputs, Mode, ModeReport, Summary};
use plotters::prelude::*;

use crate::spec::Spec;
use crate::world::{RunStats, World, FINE_BIN_NS};

/// What a simulation run produced.
pub struct Outcome {
    /// The lab's summary (also out/summary.json).
    pub summary: Summary,
    /// Per-mode lab reports.
    pub modes: Vec<ModeReport>,
    /// Per-mode simulator statistics (also out/sim.json).
    pub stats: Vec<RunStats>,
    /// The side-by-side table.
    pub table: String,
}

/// Runs every mode of `spec` with `seed`; writes outputs to `out` when given; progress lines
/// on stderr when `progress`.
pub fn run(spec: &Spec, seed: u64, out: Option<&Path>, progress: bool) -> Result<Outcome> {
    let name = spec.scenario.name.clone();
    let mut say = |msg: &str| {
        if progress {
            eprintln!("[sim {name}] {msg}");
        }
    };
    let mut reports = Vec::new();
    let mut stats = Vec::new();
    for name in &spec.sim.modes {
        let mode = Mode::named(name)?;
        say(&format!(
            "mode {name}: {} hosts ({} replicas), {:?}, {} ms, seed {seed}",
            spec.total_hosts(),
            spec.sim.replicas,
            spec.sim.topology,
            spec.scenario.duration_ms
        ));
        let mut world = World::new(spec, &mode, seed)?;
        let s = world.run(&mut say);
        say(&format!(
            "mode {name}: {:.1} M events in {:.2} s wall = {:.2} M events/s; frames balanced: {}; pool exhausted {}",
            s.events as f64 / 1e6,
            s.wall_s,
            s.events_per_sec / 1e6,
            s.conservation.balanced,
            s.pool_exhausted
        ));
        for line in extra_lines(&s) {
            say(&format!("mode {name}: {line}"));
        }
        let mut report =
            ModeReport::new(&spec.scenario, name, mode.attackers, world.take_results())?;
        report.add_cpu_share_error(&spec.scenario, &[world.tenant_cpu_ns()], &[]);
        report.add_switch_slo(&spec.scenario, &[world.tenant_slo()]);
        reports.push(report);
        stats.push(s);
    }
    let summary = Summary::new(&spec.scenario, &reports, None)?;
    let table = summary.table();
    if progress {
        eprintln!("{table}");
    }
    if let Some(dir) = out {
        write_outputs(dir, &summary, &reports)?;
        write_sim_outputs(dir, &stats)?;
        plots(dir, &reports, &stats).context("plotting")?;
        eyeq_plots(dir, spec, &stats).context("plotting")?;
        say(&format!("wrote {}", dir.display()));
    }
    Ok(Outcome {
        summary,
        modes: reports,
        stats,
        table,
    })
}

/// The simulator's own results of a mode in words: convergence, shuffle completions, sampled
/// queue occupancy per link class.
pub fn extra_lines(s: &RunStats) -> Vec<String> {
    let mut lines = Vec::new();
    for c in &s.convergence {
        lines.push(format!(
            "convergence of {} to {:.0} Mb/s: reached after {}, stays in the band after {} (then mean {:.1} Mb/s, {:.0}% of 1 ms bins within the band)",
            c.tenant,
            c.target_mbps,
            c.reached_ms
                .map_or("never".to_owned(), |ms| format!("{ms:.0} ms")),
            c.converged_ms
                .map_or("never".to_owned(), |ms| format!("{ms:.0} ms")),
            c.settled_mbps,
            c.in_band_share * 100.0
        ));
    }
    for j in &s.shuffles {
        lines.push(format!(
            "{}: {}/{} flows done, job completion {}, median flow {:.1} ms",
            j.job,
            j.completed,
            j.flows,
            j.completion_ms
                .map_or("unfinished".to_owned(), |ms| format!("{ms:.1} ms")),
            j.median_fct_ms
        ));
    }
    for (class, pts) in &s.queue_sampled_kb {
        let q: Vec<String> = pts
            .iter()
            .map(|(q, kb)| format!("p{}={kb:.1}", q * 100.0))
            .collect();
        lines.push(format!(
            "queue KB sampled each 1 ms, {class}: {}",
            q.join(" ")
        ));
    }
    lines
}

fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// sim.json, queues.csv, flows.csv and rates.csv.
pub fn write_sim_outputs(dir: &Path, stats: &[RunStats]) -> Result<()> {
    write(dir, "sim.json", &serde_json::to_string_pretty(stats)?)?;
    let mut q = String::from("mode,sample,class,quantile,queue_kb\n");
    let mut f = String::from("mode,tag,bytes,fct_us,src,dst,start_ns\n");
    let mut r = String::from("mode,tenant,t_ms,mbps\n");
    for s in stats {
        for (sample, per_class) in [("arrival", &s.queue_kb), ("1ms", &s.queue_sampled_kb)] {
            for (class, points) in per_class {
                for (quantile, kb) in points {
                    let _ = writeln!(q, "{},{sample},{class},{quantile},{kb:.3}", s.mode);
                }
            }
        }
        for r in &s.flows {
            let _ = writeln!(
                f,
                "{},{},{},{:.1},{},{},{}",
                s.mode, r.tag, r.bytes, r.fct_us, r.src, r.dst, r.start_ns
            );
        }
        for (tenant, bins) in &s.fine_series {
            for (i, b) in bins.iter().enumerate() {
                let mbps = *b as f64 * 8.0 / (FINE_BIN_NS as f64 / 1e9) / 1e6;
                let _ = writeln!(
                    r,
                    "{},{tenant},{},{mbps:.3}",
                    s.mode,
                    i as u64 * FINE_BIN_NS / 1_000_000
                );
            }
        }
    }
    write(dir, "queues.csv", &q)?;
    write(dir, "flows.csv", &f)?;
    write(dir, "rates.csv", &r)
}

type Series = (String, Vec<(f64, f64)>);

/// A line chart of `series` into an SVG file.
pub fn line_plot(path: &Path, title: &str, x: &str, y: &str, series: &[Series]) -> Result<()> {
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(a, b) in pts {
        x0 = x0.min(a);
        x1 = x1.max(a);
        y1 = y1.max(b);
    }
    if x0 >= x1 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.05 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, 0.0..y1)?;
    chart.configure_mesh().x_desc(x).y_desc(y).draw()?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plots(dir: &Path, modes: &[ModeReport], stats: &[RunStats]) -> Result<()> {
    // Throughput per tenant (first replica), the lab's 10 ms bins.
    let mut ts = Vec::new();
    for m in modes {
        let Some(rep) = m.repetitions.first() else {
            continue;
        };
        let mut per: std::collections::BTreeMap<&str, Vec<u64>> = Default::default();
        for r in rep {
            let acc = per.entry(&r.tenant).or_default();
            acc.resize(acc.len().max(r.series.len()), 0);
            for (a, b) in acc.iter_mut().zip(&r.series) {
                *a += b;
            }
        }
        for (tenant, bins) in per {
            let bin_ms = picnic_scenario::BIN_MS as f64;
            let pts = bins
                .iter()
                .enumerate()
                .map(|(i, b)| (i as f64 * bin_ms, *b as f64 * 8.0 / (bin_ms * 1e3)))
                .collect();
            ts.push((format!("{} {tenant}", m.name), pts));
        }
    }
    line_plot(
        &dir.join("timeseries.svg"),
        "throughput per tenant (replica 0)",
        "ms",
        "Mb/s",
        &ts,
    )?;
    let mut lat = Vec::new();
    for m in modes {
        for (tenant, h) in &m.latency {
            let pts = (0..=100)
                .map(|i| {
                    let q = i as f64 / 100.0;
                    (h.value_at_quantile(q) as f64 / 1e3, q)
                })
                .collect();
            lat.push((format!("{} {tenant}", m.name), pts));
        }
    }
    if !lat.is_empty() {
        line_plot(
            &dir.join("latency.svg"),
            "request latency CDF",
            "us",
            "fraction",
            &lat,
        )?;
    }
    let queues: Vec<Series> = stats
        .iter()
        .flat_map(|s| {
            s.queue_sampled_kb.iter().map(move |(class, pts)| {
                (
                    format!("{} {class}", s.mode),
                    pts.iter().map(|&(q, kb)| (q, kb)).collect(),
                )
            })
        })
        .collect();
    if !queues.is_empty() {
        line_plot(
            &dir.join("queues.svg"),
            "queue occupancy sampled each 1 ms, by link class",
            "quantile",
            "KB",
            &queues,
        )?;
    }
    let rates: Vec<Series> = stats
        .iter()
        .flat_map(|s| {
            s.fine_series.iter().map(move |(tenant, bins)| {
                let bin_ms = FINE_BIN_NS as f64 / 1e6;
                let pts = bins
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (i as f64 * bin_ms, *b as f64 * 8.0 / (bin_ms * 1e3)))
                    .collect();
                (format!("{} {tenant}", s.mode), pts)
            })
        })
        .collect();
    if !rates.is_empty() {
        line_plot(
            &dir.join("rates.svg"),
            "received rate per tenant, 1 ms bins",
            "ms",
            "Mb/s",
            &rates,
        )?;
    }
    Ok(())
}

/// convergence.svg (each `[[sim.convergence]]` tenant's 1 ms rate per mode from 20 ms before
/// the disturbance to 100 ms after, with its target) and shuffles.svg (CDF of each shuffle
/// job's flow completion times per mode, EyeQ 5.3's Figure 8).
fn eyeq_plots(dir: &Path, spec: &Spec, stats: &[RunStats]) -> Result<()> {
    let bin_ms = FINE_BIN_NS as f64 / 1e6;
    let mut conv: Vec<Series> = Vec::new();
    for c in &spec.sim.convergence {
        let (from, to) = (
            c.after_ms.saturating_sub(20) as f64,
            c.after_ms as f64 + 100.0,
        );
        for s in stats {
            let Some(bins) = s.fine_series.get(&c.tenant) else {
                continue;
            };
            let pts = bins
                .iter()
                .enumerate()
                .map(|(i, b)| (i as f64 * bin_ms, *b as f64 * 8.0 / (bin_ms * 1e3)))
                .filter(|(t, _)| (from..=to).contains(t))
                .collect();
            conv.push((format!("{} {}", s.mode, c.tenant), pts));
        }
        conv.push((
            format!("{} target", c.tenant),
            vec![(from, c.target_mbps), (to, c.target_mbps)],
        ));
    }
    if !conv.is_empty() {
        line_plot(
            &dir.join("convergence.svg"),
            "received rate, 1 ms bins, around the burst",
            "ms",
            "Mb/s",
            &conv,
        )?;
    }
    let mut cdfs: Vec<Series> = Vec::new();
    for s in stats {
        for j in &s.shuffles {
            let mut fcts: Vec<f64> = s
                .flows
                .iter()
                .filter(|r| r.tag == j.job)
                .map(|r| r.fct_us / 1e3)
                .collect();
            fcts.sort_by(f64::total_cmp);
            let n = j.flows.max(1) as f64;
            let pts = fcts
                .iter()
                .enumerate()
                .map(|(i, ms)| (*ms, (i + 1) as f64 / n))
                .collect();
            cdfs.push((format!("{} {}", s.mode, j.job), pts));
        }
    }
    if !cdfs.is_empty() {
        line_plot(
            &dir.join("shuffles.svg"),
            "shuffle flow completion times (CDF per job)",
            "ms",
            "fraction of flows",
            &cdfs,
        )?;
    }
    Ok(())
}
