//! Figures 4 and 5 of Rizzo et al. (ANCS 2016) on this machine: per-message time
//! (and cost) as W_P sweeps around a fixed W_C, from the model, the simulator
//! and the real prototype, plus the §4.1 control against notification and polling.

use crate::model::{predict, Params};
use crate::real::{measure_sync_costs, run_real, RealConfig, RealResult, RealStrategy, SyncCosts};
use crate::sim::{simulate, CostDist, SimConfig, Strategy};
use anyhow::Context;
use picnic_core::Duration;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where and how to draw the figures.
#[derive(Clone, Debug)]
pub struct FigureSetup {
    /// Output directory (must exist).
    pub out: PathBuf,
    /// Queue length L.
    pub l: u32,
    /// Fixed consumer work W_C (ns).
    pub wc: u64,
    /// Wall-clock bound of each real run.
    pub time_limit: std::time::Duration,
}

/// Model parameters with this machine's measured N and S on both sides (the
/// prototype is symmetric: both sides notify with an eventfd write).
pub fn measured_params(l: u32, wp: f64, wc: f64, kp: u32, kc: u32, sync: &SyncCosts) -> Params {
    Params {
        l,
        wp,
        wc,
        kp,
        kc,
        np: sync.notify,
        nc: sync.notify,
        sp: sync.wake,
        sc: sync.wake,
    }
}

/// Model parameters from the notification sweep: per side, the median over the
/// runs where that side notified for at least 1% of the messages (rare
/// notifications come from preemption, not from the regime) of the mean N and S seen in the run;
/// the ping-pong measurement `fallback` where a side never notified.
fn pooled_sync(setup: &FigureSetup, runs: &[RealResult], fallback: &SyncCosts) -> Params {
    let median = |pick: &dyn Fn(&RealResult) -> Option<f64>, default: f64| {
        let mut v: Vec<f64> = runs.iter().filter_map(pick).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(default)
    };
    let by_producer = |r: &RealResult| r.producer_notifies * 100 >= r.messages;
    let by_consumer = |r: &RealResult| r.consumer_notifies * 100 >= r.messages;
    Params {
        l: setup.l,
        wp: setup.wc as f64,
        wc: setup.wc as f64,
        kp: 1,
        kc: 1,
        np: median(&|r| by_producer(r).then_some(r.np), fallback.notify),
        sc: median(&|r| by_producer(r).then_some(r.sc), fallback.wake),
        nc: median(&|r| by_consumer(r).then_some(r.nc), fallback.notify),
        sp: median(&|r| by_consumer(r).then_some(r.sp), fallback.wake),
    }
}

/// Longest slow-down of the control in the figures.
const MAX_SLEEP: Duration = Duration::from_micros(500);

/// Points of the W_P sweep: 0.2 W_C .. 2.7 W_C (15 points).
fn sweep(wc: u64) -> Vec<u64> {
    (0..15).map(|i| wc * (2 + i * 25 / 14) / 10).collect()
}

/// Runs both sweeps, printing progress, and writes fig4/fig5 PNG and CSV files.
pub fn write_figures(setup: &FigureSetup) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    eprintln!("[model] measuring N and S (eventfd) ...");
    let sync = measure_sync_costs(300)?;
    eprintln!("[model] N = {:.0} ns, S = {:.0} ns", sync.notify, sync.wake);
    let wps = sweep(setup.wc);
    // Median (by T) of three runs: the machine is shared, single runs are noisy.
    let real = |wp: u64, strategy: RealStrategy| -> anyhow::Result<RealResult> {
        let config = RealConfig {
            l: setup.l,
            wp,
            wc: setup.wc,
            kp: 1,
            kc: 1,
            strategy,
            messages: 200_000,
            time_limit: setup.time_limit,
        };
        let mut runs = [run_real(&config)?, run_real(&config)?, run_real(&config)?];
        runs.sort_by(|a, b| a.t_per_msg.total_cmp(&b.t_per_msg));
        Ok(runs[1])
    };
    let sim = |params: Params, strategy: Strategy| {
        simulate(&SimConfig {
            params,
            dist: CostDist::Uniform { spread: 0.3 },
            strategy,
            seed: 42,
            warmup: 5_000,
            messages: 50_000,
        })
        .map_err(anyhow::Error::msg)
    };

    // Figure 4: the real system first, then the model and the simulator with the
    // N and S it measured (§3.3: "we have then used the measured parameters").
    let mut real4 = Vec::with_capacity(wps.len());
    for (i, &wp) in wps.iter().enumerate() {
        let r = real(wp, RealStrategy::Notify)?;
        eprintln!(
            "[model] fig4 real {}/{}: W_P={wp} T {:.0} E {:.0} ns/msg, N_P {:.0} N_C {:.0} S_P {:.0} S_C {:.0} ns ({:.1}s)",
            i + 1,
            wps.len(),
            r.t_per_msg,
            r.e_per_msg,
            r.np,
            r.nc,
            r.sp,
            r.sc,
            started.elapsed().as_secs_f64()
        );
        real4.push(r);
    }
    let in_run = pooled_sync(setup, &real4, &sync);
    eprintln!(
        "[model] in-run N_P {:.0} N_C {:.0} S_P {:.0} S_C {:.0} ns (median over the sweep)",
        in_run.np, in_run.nc, in_run.sp, in_run.sc
    );
    let at = |wp: u64| Params {
        wp: wp as f64,
        ..in_run
    };
    let mut csv4 = String::from(
        "wp_ns,wc_ns,regime,model_t_ns,sim_t_ns,real_t_ns,model_e_ns,sim_e_ns,real_e_ns\n",
    );
    let mut fig4: [Vec<(f64, f64)>; 4] = Default::default();
    for (&wp, r) in wps.iter().zip(&real4) {
        let model = predict(&at(wp), false).map_err(anyhow::Error::msg)?;
        let gp = predict(&at(wp), true).map_err(anyhow::Error::msg)?;
        let s = sim(at(wp), Strategy::Notify)?;
        writeln!(
            csv4,
            "{wp},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1}",
            setup.wc,
            model.regime,
            model.t_per_msg,
            s.t_per_msg,
            r.t_per_msg,
            model.e_per_msg,
            s.e_per_msg,
            r.e_per_msg
        )?;
        let x = wp as f64 / 1e3;
        for (series, y) in
            fig4.iter_mut()
                .zip([model.t_per_msg, s.t_per_msg, r.t_per_msg, gp.t_per_msg])
        {
            series.push((x, y / 1e3));
        }
        eprintln!(
            "[model] fig4 W_P={wp} {}: T model {:.0} sim {:.0} real {:.0} ns",
            model.regime, model.t_per_msg, s.t_per_msg, r.t_per_msg
        );
    }
    write(&setup.out.join("fig4.csv"), &csv4)?;
    let title4 = format!(
        "Fig. 4: T vs W_P, W_C={:.1}us L={} N_P={:.1} N_C={:.1} S_P={:.1} S_C={:.1} us",
        setup.wc as f64 / 1e3,
        setup.l,
        in_run.np / 1e3,
        in_run.nc / 1e3,
        in_run.sp / 1e3,
        in_run.sc / 1e3
    );
    let names4 = [
        "model (notification)",
        "simulation",
        "real system",
        "polling bound T_GP",
    ];
    plot(
        &setup.out.join("fig4.svg"),
        &[(&title4, "T (us/msg)", &fig4, &names4)],
    )?;

    // Figure 5: control vs notification vs polling, real and simulated.
    let mut csv5 = String::from("wp_ns,wc_ns,source,strategy,t_ns,e_ns\n");
    let mut t5: [Vec<(f64, f64)>; 6] = Default::default();
    let mut e5: [Vec<(f64, f64)>; 6] = Default::default();
    let names5 = [
        "notify (real)",
        "poll (real)",
        "control (real)",
        "notify (sim)",
        "poll (sim)",
        "control (sim)",
    ];
    for (i, &wp) in wps.iter().enumerate() {
        let params = at(wp);
        let adaptive = RealStrategy::Adaptive {
            params,
            max_sleep: MAX_SLEEP,
        };
        let runs = [
            real(wp, RealStrategy::Notify)?,
            real(wp, RealStrategy::Poll)?,
            real(wp, adaptive)?,
        ]
        .map(|r| (r.t_per_msg, r.e_per_msg));
        let sims = [
            sim(params, Strategy::Notify)?,
            sim(params, Strategy::Poll)?,
            sim(
                params,
                Strategy::Adaptive {
                    max_sleep: MAX_SLEEP,
                },
            )?,
        ]
        .map(|s| (s.t_per_msg, s.e_per_msg));
        let x = wp as f64 / 1e3;
        for (k, (t, e)) in runs.iter().chain(sims.iter()).enumerate() {
            let (source, strategy) = names5[k].split_once(" (").unwrap_or((names5[k], ""));
            writeln!(
                csv5,
                "{wp},{},{},{},{t:.1},{e:.1}",
                setup.wc,
                strategy.trim_end_matches(')'),
                source
            )?;
            t5[k].push((x, t / 1e3));
            e5[k].push((x, e / 1e3));
        }
        eprintln!(
            "[model] fig5 {}/{}: W_P={wp} real T/E notify {:.0}/{:.0} poll {:.0}/{:.0} control {:.0}/{:.0} ns ({:.1}s)",
            i + 1,
            wps.len(),
            runs[0].0,
            runs[0].1,
            runs[1].0,
            runs[1].1,
            runs[2].0,
            runs[2].1,
            started.elapsed().as_secs_f64()
        );
    }
    write(&setup.out.join("fig5.csv"), &csv5)?;
    let title_a = format!(
        "Fig. 5a: time per message vs W_P, W_C = {:.1} us",
        setup.wc as f64 / 1e3
    );
    let title_b = "Fig. 5b: CPU cost per message (P + C) vs W_P".to_string();
    plot(
        &setup.out.join("fig5.svg"),
        &[
            (&title_a, "T (us/msg)", &t5, &names5),
            (&title_b, "E (us/msg)", &e5, &names5),
        ],
    )?;
    eprintln!(
        "[model] wrote fig4/fig5 .svg/.csv to {} in {:.1}s",
        setup.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

type Panel<'a> = (&'a str, &'a str, &'a [Vec<(f64, f64)>], &'a [&'a str]);

/// Draws one or more panels stacked vertically; series 0..3 solid, 3.. thinner.
fn plot(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    // SVG: text needs no font files, so the figures draw on any machine.
    let root = SVGBackend::new(path, (1000, 560 * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let colors = [RED, BLUE, BLACK, MAGENTA, CYAN, GREEN];
    for (area, (title, ylabel, series, names)) in
        root.split_evenly((panels.len(), 1)).iter().zip(panels)
    {
        let xmax = series.iter().flatten().map(|p| p.0).fold(0.0, f64::max) * 1.05;
        // Clip at twice the 90th percentile so a few preempted runs (shared
        // machine) do not flatten the rest; the CSVs keep every value.
        let mut ys: Vec<f64> = series.iter().flatten().map(|p| p.1).collect();
        ys.sort_by(f64::total_cmp);
        let p90 = ys.get(ys.len() * 9 / 10).copied().unwrap_or(1.0);
        let ymax = ys.last().copied().unwrap_or(1.0).min(2.0 * p90) * 1.1;
        let mut builder = ChartBuilder::on(area);
        builder.margin(15);
        builder
            .caption(*title, ("sans-serif", 22))
            .x_label_area_size(45)
            .y_label_area_size(60);
        let mut chart = builder.build_cartesian_2d(0.0..xmax.max(1e-3), 0.0..ymax.max(1e-3))?;
        chart
            .configure_mesh()
            .x_desc("W_P (us)")
            .y_desc(*ylabel)
            .draw()?;
        for (k, (pts, name)) in series.iter().zip(names.iter()).enumerate() {
            let color = colors[k % colors.len()];
            let width = if k < 3 { 2 } else { 1 };
            let clipped = pts.iter().map(|&(x, y)| (x, y.min(ymax)));
            let drawn =
                chart.draw_series(LineSeries::new(clipped.clone(), color.stroke_width(width)))?;
            drawn.label(*name).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
            });
            chart.draw_series(clipped.map(|p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
