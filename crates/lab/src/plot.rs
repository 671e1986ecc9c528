//! Plots of a run, as SVG files a person can open in a browser: the victim's latency CDF
//! with every mode on one log-x plot, and per-tenant received rate over time per mode with
//! the attack start marked (DESIGN.md 5: "plots (latency CDF, per-tenant rate over time)").
//!
//! SVG needs no font files (the viewer draws the text), so plots work on a fresh machine
//! without system fonts; plotters' bitmap backend would need a TTF for every label.

use anyhow::{anyhow, Context, Result};
use picnic_scenario::ModeReport;
use picnic_scenario::Scenario;
use picnic_scenario::BIN_MS;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Width and height of every plot, pixels.
const SIZE: (u32, u32) = (900, 540);

/// One named line of a plot: (x, y) points in x order.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Legend label.
    pub label: String,
    /// Points.
    pub points: Vec<(f64, f64)>,
}

/// Points of a latency CDF from a histogram in ns: (latency in us, cumulative fraction),
/// one point per distinct recorded value (so the curve is exact, not sampled).
pub fn cdf_points(hist: &hdrhistogram::Histogram<u64>) -> Vec<(f64, f64)> {
    let total = hist.len();
    if total == 0 {
        return Vec::new();
    }
    let mut seen = 0u64;
    hist.iter_recorded()
        .map(|v| {
            seen += v.count_at_value();
            (
                hist.highest_equivalent(v.value_iterated_to()) as f64 / 1e3,
                seen as f64 / total as f64,
            )
        })
        .collect()
}

/// Per-tenant received rate of one repetition of a mode: (t in ms, Mb/s) per [`BIN_MS`].
pub fn rate_lines(mode: &ModeReport, repetition: usize) -> Vec<Line> {
    let mut per_tenant: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in mode.repetitions.get(repetition).into_iter().flatten() {
        let acc = per_tenant.entry(&r.tenant).or_default();
        acc.resize(acc.len().max(r.series.len()), 0);
        for (a, b) in acc.iter_mut().zip(&r.series) {
            *a += b;
        }
    }
    per_tenant
        .into_iter()
        .map(|(tenant, bins)| Line {
            label: tenant.to_owned(),
            points: bins
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    (
                        (i as u64 * BIN_MS) as f64,
                        *b as f64 * 8.0 / (BIN_MS as f64 * 1e3),
                    )
                })
                .collect(),
        })
        .collect()
}

/// When the first workload the victim-alone mode leaves out starts, ms (the attack start).
pub fn attack_start_ms(scenario: &Scenario) -> Option<u64> {
    scenario
        .workloads
        .iter()
        .filter(|w| scenario.is_attack(w))
        .map(|w| w.start_ms)
        .min()
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// Draws a log-x CDF of latencies (us) with one line per entry of `lines`.
pub fn draw_cdf(path: &Path, title: &str, lines: &[Line]) -> Result<()> {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if hi > 0.0 {
        (lo.max(0.1) / 1.2, hi * 1.2)
    } else {
        (1.0, 10.0)
    };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("request latency (us, log scale)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(plot_err)?;
    for (i, line) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba().stroke_width(2);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), color))
            .map_err(plot_err)?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)
}

/// Draws rates (Mb/s) over time (ms), one line per tenant, with a dashed vertical marker
/// at `marker_ms` (the attack start) when given.
pub fn draw_rates(path: &Path, title: &str, lines: &[Line], marker_ms: Option<u64>) -> Result<()> {
    let t_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(BIN_MS as f64, f64::max);
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc(format!("time since run start (ms, {BIN_MS} ms bins)"))
        .y_desc("received Mb/s")
        .draw()
        .map_err(plot_err)?;
    for (i, line) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba().stroke_width(2);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), color))
            .map_err(plot_err)?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    if let Some(t) = marker_ms {
        let t = t as f64;
        let dashes = (0..40).map(|k| {
            let (a, b) = (y_max * k as f64 / 40.0, y_max * (k as f64 + 0.5) / 40.0);
            PathElement::new(vec![(t, a), (t, b)], BLACK.stroke_width(1))
        });
        chart
            .draw_series(dashes)
            .map_err(plot_err)?
            .label("attack start")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)
}

/// Writes `latency_cdf.svg` (the victim's latency CDF, one line per mode; only when the
/// victim has latencies) and `rate_MODE.svg` per mode (first repetition) into `dir`.
/// Returns the files written.
pub fn write_plots(dir: &Path, scenario: &Scenario, modes: &[ModeReport]) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let cdfs: Vec<Line> = modes
        .iter()
        .filter_map(|m| {
            let h = m.latency.get(&scenario.victim)?;
            Some(Line {
                label: m.name.clone(),
                points: cdf_points(h),
            })
        })
        .collect();
    if !cdfs.is_empty() {
        let path = dir.join("latency_cdf.svg");
        let title = format!(
            "{}: latency CDF of {} (all modes)",
            scenario.name, scenario.victim
        );
        draw_cdf(&path, &title, &cdfs).with_context(|| format!("{}", path.display()))?;
        written.push(path);
    }
    for m in modes {
        let path = dir.join(format!("rate_{}.svg", m.name));
        let title = format!("{}: per-tenant rate, mode {}", scenario.name, m.name);
        let marker = attack_start_ms(scenario).filter(|_| m.attackers);
        draw_rates(&path, &title, &rate_lines(m, 0), marker)
            .with_context(|| format!("{}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_is_monotone_and_ends_at_one() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for us in [100u64, 100, 200, 5000] {
            h.record(us * 1000).unwrap();
        }
        let pts = cdf_points(&h);
        assert_eq!(pts.len(), 3);
        assert!((pts[0].1 - 0.5).abs() < 1e-9);
        assert!((pts[0].0 - 100.0).abs() < 0.2, "{pts:?}");
        assert!(pts.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert_eq!(pts.last().unwrap().1, 1.0);
    }

    #[test]
    fn plots_are_svg_with_labels() {
        let dir = std::env::temp_dir().join(format!("picnic-lab-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cdf = dir.join("cdf.svg");
        let lines = [Line {
            label: "bridge".into(),
            points: vec![(50.0, 0.5), (900.0, 1.0)],
        }];
        draw_cdf(&cdf, "t", &lines).unwrap();
        let svg = std::fs::read_to_string(&cdf).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("bridge"), "{svg}");
        let rates = dir.join("rates.svg");
        draw_rates(&rates, "t", &lines, Some(100)).unwrap();
        let svg = std::fs::read_to_string(&rates).unwrap();
        assert!(svg.contains("attack start"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
