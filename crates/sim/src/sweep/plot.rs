//! One SVG per metric of a merged sweep: the metric's mean against the first parameter's
//! levels, one line per mode and combination of the other parameters, each point with its
//! 95% interval as an error bar; a log scale when the values span more than 20x.

use std::path::Path;

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{Row, Sweep};

/// `plot-METRIC.svg` in `dir` for every metric (nothing without parameters).
pub fn plots(dir: &Path, sweep: &Sweep, rows: &[Row]) -> Result<()> {
    let Some(first) = sweep.params.first() else {
        return Ok(());
    };
    let xs: Vec<&String> = first.levels.iter().map(|(l, _)| l).collect();
    for (k, metric) in sweep.file.metrics.iter().enumerate() {
        // Series: (label, points (x index, mean, half-width)).
        let mut series: Vec<(String, Pts)> = Vec::new();
        for r in rows {
            let Some(e) = r.values[k] else { continue };
            let mut name: Vec<String> = sweep.params[1..]
                .iter()
                .zip(&r.labels[1..])
                .map(|(p, l)| format!("{}={l}", p.name))
                .collect();
            name.push(r.mode.clone());
            let name = name.join(" ");
            let x = xs.iter().position(|l| **l == r.labels[0]).unwrap_or(0) as f64;
            let point = (x, e.mean, e.ci95.unwrap_or(0.0));
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pts)) => pts.push(point),
                None => series.push((name, vec![point])),
            }
        }
        let all = series.iter().flat_map(|(_, p)| p.iter());
        let lo = all.clone().map(|p| p.1 - p.2).fold(f64::MAX, f64::min);
        let hi = all.map(|p| p.1 + p.2).fold(f64::MIN, f64::max);
        if series.is_empty() || !lo.is_finite() || !hi.is_finite() {
            continue;
        }
        let file: String = metric
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.join(format!("plot-{file}.svg"));
        let title = format!("{}: {metric} (mean, 95% CI over seeds)", sweep.name);
        let x_range = -0.3..(xs.len() as f64 - 0.7);
        let root = SVGBackend::new(&path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(&title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        let label = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                xs.get(i as usize)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            }
        };
        let min_pos = series
            .iter()
            .flat_map(|(_, p)| p.iter())
            .map(|p| p.1 - p.2)
            .filter(|v| *v > 0.0)
            .fold(f64::MAX, f64::min);
        if lo > 0.0 && hi / lo > 20.0 {
            let mut chart =
                builder.build_cartesian_2d(x_range, (min_pos * 0.8..hi * 1.25).log_scale())?;
            chart
                .configure_mesh()
                .x_labels(xs.len())
                .x_label_formatter(&label)
                .x_desc(first.name.as_str())
                .y_desc(metric.as_str())
                .draw()?;
            draw(&mut chart, &series, xs.len())?;
        } else {
            let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.01).max(1e-9);
            let mut chart = builder.build_cartesian_2d(x_range, (lo - pad)..(hi + pad))?;
            chart
                .configure_mesh()
                .x_labels(xs.len())
                .x_label_formatter(&label)
                .x_desc(first.name.as_str())
                .y_desc(metric.as_str())
                .draw()?;
            draw(&mut chart, &series, xs.len())?;
        }
        root.present()?;
    }
    Ok(())
}

type Pts = Vec<(f64, f64, f64)>;

fn draw<'a, 'b, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, Y>>,
    series: &[(String, Pts)],
    levels: usize,
) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
    'b: 'a,
{
    let n = series.len().max(1) as f64;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // Offset each series a little so error bars do not hide each other.
        let dx = (i as f64 - (n - 1.0) / 2.0) * 0.25 / n * if levels > 1 { 1.0 } else { 0.0 };
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0 + dx, p.1)),
                color.stroke_width(2),
            ))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|p| {
            PathElement::new(
                vec![(p.0 + dx, p.1 - p.2), (p.0 + dx, p.1 + p.2)],
                color.stroke_width(2),
            )
        }))?;
        chart.draw_series(
            pts.iter()
                .map(|p| Circle::new((p.0 + dx, p.1), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
