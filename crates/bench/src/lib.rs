//! `picnic bench`: the forwarding benchmark (docs/BENCHMARKS.md, "Forwarding").
//!
//! In one invocation, on the same namespaces and the same offered traffic, it measures the raw
//! limit of each backend (AF_PACKET and AF_XDP forwarders with no logic), picnic's switch with
//! every isolation mechanism on (both backends) and with all off, a Linux bridge and Open
//! vSwitch's userspace datapath with `afxdp` ports and with ordinary ports, in two phases:
//!
//! 1. **Maximum rate** of every device, the generator at full speed (secondary: on this
//!    machine the generator is often the limit, so equal rates compare nothing).
//! 2. **Equal offered loads** (default 10%, 50% and 90% of the slowest device's maximum),
//!    the same for every device: the primary figure is the device's **CPU ns per forwarded
//!    packet** (its threads' on-CPU time plus the softirq work its receive hook adds, see
//!    [`cpu`]), which no generator limit distorts, with the one-way latency p50/p99/p99.9 of
//!    every frame (see [`sink`]) and the share of the offered frames delivered.
//!
//! See [`bed`] for the path shape and [`traffic`] for how traffic is generated and counted.

pub mod bed;
pub mod cpu;
pub mod dut;
pub mod ovs;
mod report;
pub mod sink;
pub mod traffic;
pub mod twohost;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use picnic_netns as netns;
use serde::Serialize;

use bed::{Bed, DUT_CPU};
use cpu::{CpuSample, CpuUse};
use dut::{Dut, DutKind};
use traffic::{GenControl, Offered};

/// CPU of the generator, the latency sink and the bench's own threads.
pub const GEN_CPU: usize = 0;

/// Arguments of `picnic bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// About three minutes: one run per point and shorter windows.
    #[arg(long)]
    pub quick: bool,
    /// Runs per point; the table shows the median (default 3, 1 with --quick).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Measurement window at the maximum rate and at each load, ms (default 1500, 800 with
    /// --quick).
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// How long the raw forwarders and picnic spin for work before blocking, us (picnic's
    /// `switch.spin_us`; the switch's default is 50). Spinning is CPU the device uses: at loads
    /// below its maximum it dominates the CPU per packet of a device that spins.
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// Nice value (-20..=19) of the generator, the latency sink and every thread of every
    /// device (OVS's too), the same for all: on a machine shared with other work, a negative
    /// value keeps that work from taking the device's CPU. None: inherited.
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// Offered loads, percent of the slowest measured device's maximum, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,50,90")]
    pub loads: Vec<u32>,
    /// Frame sizes on the wire, FCS included, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,1500")]
    pub sizes: Vec<usize>,
    /// Numbers of UDP flows offered, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub flows: Vec<u16>,
    /// The two-host shape: each device runs on two emulated hosts (egress and ingress,
    /// over an encapsulating underlay; see `twohost`) instead of one.
    #[arg(long)]
    pub two_host: bool,
    /// Only these devices (raw, raw_xdp, picnic, picnic_xdp, picnic_off, picnic_fast, ovs_afxdp, ovs, bridge),
    /// comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Also write the results as JSON to `bench.json` (see --json-path).
    #[arg(long)]
    pub json: bool,
    /// Where --json writes.
    #[arg(long, default_value = "bench.json")]
    pub json_path: PathBuf,
}

/// The maximum rate of one device (median over runs).
#[derive(Debug, Clone, Serialize)]
pub struct MaxPoint {
    /// Device key (`raw`, `picnic`, ...).
    pub dut: &'static str,
    /// Frame size, FCS included.
    pub size: usize,
    /// UDP flows offered.
    pub flows: u16,
    /// Frames/s that reached the sink, the generator at full speed.
    pub pps: f64,
    /// Frames/s the generator got out (its own limit when it equals `pps`).
    pub gen_pps: f64,
    /// `pps` in Gb/s of frames (FCS included, preamble and gap not).
    pub gbps: f64,
}

/// One device at one offered load (median over runs, metric by metric).
#[derive(Debug, Clone, Serialize)]
pub struct LoadPoint {
    pub dut: &'static str,
    pub size: usize,
    pub flows: u16,
    /// Percent of the slowest device's maximum.
    pub load_pct: u32,
    /// Frames/s offered (the same for every device).
    pub offered_pps: f64,
    /// Frames/s the generator got out.
    pub gen_pps: f64,
    /// Frames/s that reached the sink.
    pub delivered_pps: f64,
    /// CPU ns per delivered frame: threads + softirq.
    pub cpu_ns_per_pkt: f64,
    /// ... of which the device's threads.
    pub threads_ns_per_pkt: f64,
    /// ... of which softirq (the generator CPU's and ksoftirqd on the
    /// device's CPU).
    pub softirq_ns_per_pkt: f64,
    /// Percent of the window the device's threads were runnable but waited for their CPU
    /// (other tasks ran there): where it is high, latency measures the machine's other load.
    pub cpu_wait_pct: f64,
    /// One-way latency generator -> sink of every frame in the window, us.
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Frames in the latency histogram.
    pub latency_samples: u64,
}

struct Settings {
    runs: usize,
    window: Duration,
    warmup: Duration,
    /// Nice value of the generator, the sink and every device thread.
    nice: Option<i32>,
}

/// Runs the benchmark as the arguments say; prints progress and the tables to stdout.
pub fn run_cli(args: BenchArgs) -> Result<()> {
    netns::preflight(&["ip", "tc", "bridge", "ethtool", "taskset"])?;
    let window =
        Duration::from_millis(
            args.window_ms
                .unwrap_or(if args.quick { 800 } else { 1500 }),
        );
    let settings = Settings {
        runs: args.runs.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        window,
        warmup: Duration::from_millis(if args.quick { 200 } else { 300 }),
        nice: args.nice,
    };
    for &s in &args.sizes {
        if !(64..=1518).contains(&s) {
            bail!("--sizes: {s} is not a frame size in 64..=1518");
        }
    }
    if args.flows.contains(&0) {
        bail!("--flows: counts must be at least 1");
    }
    if args.loads.iter().any(|&l| l == 0 || l > 100) {
        bail!("--loads: percentages must be 1 to 100");
    }
    let kinds: Vec<DutKind> = DutKind::ALL
        .into_iter()
        .filter(|k| args.only.is_empty() || args.only.iter().any(|o| o == k.key()))
        .collect();
    if kinds.is_empty() {
        bail!("--only: no such device (raw, raw_xdp, picnic, picnic_xdp, picnic_off, picnic_fast, ovs_afxdp, ovs, bridge)");
    }
    if kinds
        .iter()
        .any(|k| matches!(k, DutKind::Ovs | DutKind::OvsAfxdp))
    {
        ovs::ensure_ovs()?;
    }
    // The bench's own threads (and the `ip` and OVS tools it runs) stay off the device's CPU.
    cpu::register_bench_thread();
    traffic::pin_current_thread(GEN_CPU)?;
    let started = Instant::now();
    println!(
        "picnic bench: {} shape, {} devices x sizes {:?} x flows {:?} x {} run(s), {} ms windows, loads {:?}% of the slowest; generator and sink on CPU {GEN_CPU}, device{} on CPU {DUT_CPU}",
        if args.two_host { "two-host" } else { "one-host" },
        kinds.len(),
        args.sizes,
        args.flows,
        settings.runs,
        settings.window.as_millis(),
        args.loads,
        if args.two_host { " (both hosts)" } else { "" },
    );
    println!("phase 1: maximum rate, generator at full speed");
    let mut maxima = Vec::new();
    for &kind in &kinds {
        maxima.extend(max_device(kind, &args, &settings)?);
    }
    println!("phase 2: equal offered loads");
    let mut loads = Vec::new();
    for &kind in &kinds {
        loads.extend(load_device(kind, &args, &settings, &maxima)?);
    }
    println!();
    report::print(&maxima, &loads, &args);
    if args.json {
        let shape = if args.two_host {
            "two-host"
        } else {
            "one-host"
        };
        let json = report::json(&maxima, &loads, settings.runs, settings.window, shape);
        std::fs::write(&args.json_path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", args.json_path.display()))?;
        println!("wrote {}", args.json_path.display());
    }
    println!("total {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn offered(size: usize, flows: u16) -> Offered {
    Offered {
        size,
        flows,
        src: (bed::VM_MAC, bed::VM_IP),
        dst: (bed::REMOTE_MAC, bed::REMOTE_IP),
    }
}

/// Starts `kind` on a fresh testbed, runs `body` for every size and flow count, stops it.
fn with_device<T>(
    kind: DutKind,
    args: &BenchArgs,
    mut body: impl FnMut(&Bed, &Dut, usize, u16) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let bed = Bed::new(args.two_host)?;
    let spin = Duration::from_micros(args.spin_us);
    let dut = if args.two_host {
        twohost::start(kind, &bed, spin)
    } else {
        Dut::start(kind, &bed, spin)
    }
    .with_context(|| format!("starting {}", kind.describe()))?;
    let mut out = Vec::new();
    let mut result = Ok(());
    'outer: for &size in &args.sizes {
        for &flows in &args.flows {
            match body(&bed, &dut, size, flows) {
                Ok(v) => out.extend(v),
                Err(e) => {
                    result = Err(e);
                    break 'outer;
                }
            }
        }
    }
    let summary = dut.stop()?;
    if !summary.is_empty() {
        println!("  ({summary})");
    }
    result.map(|()| out)
}

/// Phase 1 for one device: its maximum rate at every size and flow count.
fn max_device(kind: DutKind, args: &BenchArgs, s: &Settings) -> Result<Vec<MaxPoint>> {
    with_device(kind, args, |bed, _dut, size, flows| {
        let mut runs = Vec::new();
        for _ in 0..s.runs {
            runs.push(with_generator(
                bed,
                s.nice,
                offered(size, flows),
                0,
                |ctl| measure_max(kind, bed, size, flows, s, ctl),
            )?);
        }
        let m = |f: &dyn Fn(&MaxPoint) -> f64| median(runs.iter().map(f).collect());
        let p = MaxPoint {
            pps: m(&|p| p.pps),
            gen_pps: m(&|p| p.gen_pps),
            gbps: m(&|p| p.gbps),
            ..runs[0].clone()
        };
        println!(
            "  {:<36} {:>4} B {:>2} flow(s): max {:>5.0} kpps ({:>5.2} Gb/s; generator {:>4.0} kpps)",
            kind.describe(),
            size,
            flows,
            p.pps / 1e3,
            p.gbps,
            p.gen_pps / 1e3,
        );
        Ok(vec![p])
    })
}

/// Phase 2 for one device: CPU per packet and latency at each offered load.
fn load_device(
    kind: DutKind,
    args: &BenchArgs,
    s: &Settings,
    maxima: &[MaxPoint],
) -> Result<Vec<LoadPoint>> {
    with_device(kind, args, |bed, dut, size, flows| {
        let slowest = maxima
            .iter()
            .filter(|m| m.size == size && m.flows == flows)
            .map(|m| m.pps)
            .fold(f64::INFINITY, f64::min);
        let mut out = Vec::new();
        for &pct in &args.loads {
            let rate = (slowest * f64::from(pct) / 100.0).max(1.0);
            let mut runs = Vec::new();
            for _ in 0..s.runs {
                runs.push(with_generator(
                    bed,
                    s.nice,
                    offered(size, flows),
                    rate as u64,
                    |ctl| measure_load(kind, bed, dut, (size, flows, pct), rate, s, ctl),
                )?);
            }
            let p = median_load(runs);
            println!(
                "  {:<36} {:>4} B {:>2} flow(s) {:>3}% ({:>4.0} kpps): delivered {:>5.1}%, CPU {:>5.0} ns/pkt ({:>5.0} threads + {:>5.0} softirq), waited for CPU {:>4.1}%, latency p50 {:>6.1} us p99 {:>7.1} us p99.9 {:>7.1} us",
                kind.describe(),
                size,
                flows,
                pct,
                rate / 1e3,
                100.0 * p.delivered_pps / p.offered_pps,
                p.cpu_ns_per_pkt,
                p.threads_ns_per_pkt,
                p.softirq_ns_per_pkt,
                p.cpu_wait_pct,
                p.p50_us,
                p.p99_us,
                p.p999_us,
            );
            out.push(p);
        }
        Ok(out)
    })
}

/// Runs `body` while a generator offers `offered` at `rate_pps` (0: full speed) on CPU
/// [`GEN_CPU`], every frame timestamped when paced.
fn with_generator<T>(
    bed: &Bed,
    nice: Option<i32>,
    offered: Offered,
    rate_pps: u64,
    body: impl FnOnce(&Arc<GenControl>) -> Result<T>,
) -> Result<T> {
    let ctl = Arc::new(GenControl::default());
    ctl.rate_pps.store(rate_pps, Ordering::Relaxed);
    ctl.stamp.store(rate_pps > 0, Ordering::Relaxed);
    let c = ctl.clone();
    let gen = netns::spawn_in_netns(&bed.gen_ns, move || -> Result<()> {
        traffic::pin_current_thread(GEN_CPU)?;
        if let Some(n) = nice {
            cpu::set_nice(0, n)?;
        }
        traffic::generate(bed::GEN_DEV, offered, c)
    })?;
    let result = body(&ctl);
    ctl.stop.store(true, Ordering::Relaxed);
    let gen_result = gen.join();
    let value = result?;
    gen_result??;
    Ok(value)
}

/// The sink's receive counter and the moment it was read (the middle of the `ip` call, so
/// rates are not skewed by its run time).
fn sink_count(bed: &Bed) -> Result<(u64, Instant)> {
    let before = Instant::now();
    let n = traffic::rx_packets(&bed.sink_ns, bed::SINK_DEV)?;
    Ok((n, before + before.elapsed() / 2))
}

/// Waits out the warm-up and checks that frames reach the sink; returns its counter.
fn warm_up(kind: DutKind, bed: &Bed, s: &Settings, ctl: &GenControl) -> Result<u64> {
    let before = traffic::rx_packets(&bed.sink_ns, bed::SINK_DEV)?;
    std::thread::sleep(s.warmup);
    let after = traffic::rx_packets(&bed.sink_ns, bed::SINK_DEV)?;
    if after <= before {
        bail!(
            "{}: no frames reached the sink during warm-up (generator sent {})",
            kind.describe(),
            ctl.sent.load(Ordering::Relaxed)
        );
    }
    Ok(after)
}

/// One run of phase 1: frames reaching the sink over the window at the generator's full rate.
fn measure_max(
    kind: DutKind,
    bed: &Bed,
    size: usize,
    flows: u16,
    s: &Settings,
    ctl: &GenControl,
) -> Result<MaxPoint> {
    warm_up(kind, bed, s, ctl)?;
    let (sent0, g0) = (ctl.sent.load(Ordering::Relaxed), Instant::now());
    let (rx0, t0) = sink_count(bed)?;
    std::thread::sleep(s.window);
    let (rx1, t1) = sink_count(bed)?;
    let sent1 = ctl.sent.load(Ordering::Relaxed);
    let pps = rx1.saturating_sub(rx0) as f64 / (t1 - t0).as_secs_f64();
    let gen_elapsed = g0.elapsed().as_secs_f64();
    Ok(MaxPoint {
        dut: kind.key(),
        size,
        flows,
        pps,
        gen_pps: sent1.saturating_sub(sent0) as f64 / gen_elapsed,
        gbps: pps * size as f64 * 8.0 / 1e9,
    })
}

/// One run of phase 2: the device's CPU over the window and the latency of every frame.
#[allow(clippy::too_many_arguments)]
fn measure_load(
    kind: DutKind,
    bed: &Bed,
    dut: &Dut,
    (size, flows, load_pct): (usize, u16, u32),
    rate: f64,
    s: &Settings,
    ctl: &GenControl,
) -> Result<LoadPoint> {
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (r, st) = (recording.clone(), stop.clone());
    let nice = s.nice;
    let sink = netns::spawn_in_netns(&bed.sink_ns, move || {
        traffic::pin_current_thread(GEN_CPU)?;
        if let Some(n) = nice {
            cpu::set_nice(0, n)?;
        }
        sink::latency_sink(bed::SINK_DEV, r, st)
    })?;
    // (frames delivered and the generator's rate, both per s; CPU used per s)
    let measured = (|| -> Result<(f64, f64, CpuUse)> {
        warm_up(kind, bed, s, ctl)?;
        let ksoftirqd = cpu::ksoftirqd_pid(DUT_CPU);
        let sample = || cpu::sample(dut.threads_ns(), GEN_CPU, ksoftirqd.as_deref());
        let (rx0, t0) = sink_count(bed)?;
        let (c0, cpu0, sent0): (Instant, CpuSample, u64) =
            (Instant::now(), sample(), ctl.sent.load(Ordering::Relaxed));
        recording.store(true, Ordering::Relaxed);
        std::thread::sleep(s.window);
        recording.store(false, Ordering::Relaxed);
        let (cpu1, sent1) = (sample(), ctl.sent.load(Ordering::Relaxed));
        let cpu_secs = c0.elapsed().as_secs_f64();
        let (rx1, t1) = sink_count(bed)?;
        let used = cpu0.until(&cpu1);
        Ok((
            rx1.saturating_sub(rx0) as f64 / (t1 - t0).as_secs_f64(),
            sent1.saturating_sub(sent0) as f64 / cpu_secs,
            CpuUse {
                threads: used.threads / cpu_secs,
                softirq: used.softirq / cpu_secs,
                waiting: used.waiting / cpu_secs,
            },
        ))
    })();
    stop.store(true, Ordering::Relaxed);
    let hist = sink.join()??;
    let (delivered_pps, gen_pps, per_s) = measured?;
    let per = |ns_per_s: f64| ns_per_s / delivered_pps.max(1.0);
    let us = |q: f64| {
        if hist.is_empty() {
            f64::NAN
        } else {
            hist.value_at_quantile(q) as f64 / 1e3
        }
    };
    Ok(LoadPoint {
        dut: kind.key(),
        size,
        flows,
        load_pct,
        offered_pps: rate,
        gen_pps,
        delivered_pps,
        cpu_ns_per_pkt: per(per_s.total()),
        threads_ns_per_pkt: per(per_s.threads),
        softirq_ns_per_pkt: per(per_s.softirq),
        cpu_wait_pct: per_s.waiting / 1e7,
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        latency_samples: hist.len(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The point whose every metric is the median over `runs` (non-empty).
fn median_load(runs: Vec<LoadPoint>) -> LoadPoint {
    let m = |f: &dyn Fn(&LoadPoint) -> f64| median(runs.iter().map(f).collect());
    LoadPoint {
        gen_pps: m(&|p| p.gen_pps),
        delivered_pps: m(&|p| p.delivered_pps),
        cpu_ns_per_pkt: m(&|p| p.cpu_ns_per_pkt),
        threads_ns_per_pkt: m(&|p| p.threads_ns_per_pkt),
        softirq_ns_per_pkt: m(&|p| p.softirq_ns_per_pkt),
        cpu_wait_pct: m(&|p| p.cpu_wait_pct),
        p50_us: m(&|p| p.p50_us),
        p99_us: m(&|p| p.p99_us),
        p999_us: m(&|p| p.p999_us),
        latency_samples: m(&|p| p.latency_samples as f64) as u64,
        ..runs[0].clone()
    }
}
