//! `picnic bench`: the forwarding benchmark (docs/BENCHMARKS.md, "Forwarding").
//!
//! In one invocation, on the same namespaces and the same offered traffic (64 B and 1500 B
//! frames, one and several flows), it measures the raw limit of the backend (an AF_PACKET
//! forwarder with no logic), picnic's switch with every isolation mechanism on and with all
//! off, a Linux bridge and Open vSwitch's userspace datapath with `afxdp` ports and with
//! ordinary ports. For each it prints packets/s and Gb/s at the maximum rate, CPU time per
//! packet, one-way latency p50/p99 at 50% of that maximum, and the ratios picnic/raw,
//! picnic/OVS-afxdp and picnic/bridge. See [`dut`] for the path shape and [`traffic`] for
//! how traffic is generated and counted.

pub mod dut;
pub mod traffic;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use picnic_netns as netns;
use serde::Serialize;

use dut::{Bed, Dut, DutKind};
use traffic::{GenControl, Offered};

/// Arguments of `picnic bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// About one minute: one run per point and shorter measurement windows.
    #[arg(long)]
    pub quick: bool,
    /// Runs per point; the table shows the median (default 3, 1 with --quick).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Measurement window at the maximum rate, ms (default 1500, 800 with --quick).
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Frame sizes on the wire, FCS included, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,1500")]
    pub sizes: Vec<usize>,
    /// Numbers of UDP flows offered, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub flows: Vec<u16>,
    /// Only these devices (raw, raw_xdp, picnic, picnic_xdp, picnic_off, ovs_afxdp, ovs, bridge),
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

/// One measured point (median over runs where noted).
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Device key (`raw`, `picnic`, ...).
    pub dut: &'static str,
    /// Frame size, FCS included.
    pub size: usize,
    /// UDP flows offered.
    pub flows: u16,
    /// Frames/s that reached the sink at the maximum offered rate.
    pub pps: f64,
    /// Frames/s the generator got out (its own limit when it equals `pps`).
    pub gen_pps: f64,
    /// `pps` in Gb/s of frames (FCS included, preamble and gap not).
    pub gbps: f64,
    /// CPU ns per forwarded frame of the device's own thread or process (None: the kernel
    /// bridge, whose work runs in softirq context of the sender).
    pub dut_cpu_ns_per_pkt: Option<f64>,
    /// CPU ns per forwarded frame of generator + device + ksoftirqd: the whole path's cost,
    /// comparable for every device including the bridge.
    pub path_cpu_ns_per_pkt: f64,
    /// One-way latency generator -> sink at 50% of `pps`, median, us.
    pub latency_p50_us: f64,
    /// ... 99th percentile, us.
    pub latency_p99_us: f64,
}

struct Settings {
    runs: usize,
    window: Duration,
    warmup: Duration,
    latency_window: Duration,
}

/// Runs the benchmark as the arguments say; prints progress and the table to stdout.
pub fn run_cli(args: BenchArgs) -> Result<()> {
    netns::preflight(&["ip", "tc", "bridge", "ethtool", "taskset"])?;
    let settings = Settings {
        runs: args.runs.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        window: Duration::from_millis(args.window_ms.unwrap_or(if args.quick {
            800
        } else {
            1500
        })),
        warmup: Duration::from_millis(if args.quick { 200 } else { 300 }),
        latency_window: Duration::from_millis(if args.quick { 400 } else { 700 }),
    };
    for &s in &args.sizes {
        if !(64..=1518).contains(&s) {
            bail!("--sizes: {s} is not a frame size in 64..=1518");
        }
    }
    if args.flows.contains(&0) {
        bail!("--flows: counts must be at least 1");
    }
    let kinds: Vec<DutKind> = DutKind::ALL
        .into_iter()
        .filter(|k| args.only.is_empty() || args.only.iter().any(|o| o == k.key()))
        .collect();
    if kinds.is_empty() {
        bail!("--only: no such device (raw, raw_xdp, picnic, picnic_xdp, picnic_off, ovs_afxdp, ovs, bridge)");
    }
    if kinds
        .iter()
        .any(|k| matches!(k, DutKind::Ovs | DutKind::OvsAfxdp))
    {
        dut::ensure_ovs()?;
    }
    let started = Instant::now();
    println!(
        "picnic bench: {} devices x sizes {:?} x flows {:?} x {} run(s), {} ms windows; generator on CPU 0, device on CPU {}",
        kinds.len(),
        args.sizes,
        args.flows,
        settings.runs,
        settings.window.as_millis(),
        dut::DUT_CPU
    );
    let mut points = Vec::new();
    for kind in kinds {
        points.extend(bench_device(kind, &args, &settings)?);
    }
    println!();
    print_table(&points, &args);
    if args.json {
        let json = to_json(&points, &args, &settings);
        std::fs::write(&args.json_path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", args.json_path.display()))?;
        println!("wrote {}", args.json_path.display());
    }
    println!("total {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Measures every size and flow count through one device, on a fresh testbed.
fn bench_device(kind: DutKind, args: &BenchArgs, s: &Settings) -> Result<Vec<Point>> {
    let bed = Bed::new()?;
    let dut = Dut::start(kind, &bed).with_context(|| format!("starting {}", kind.describe()))?;
    let mut points = Vec::new();
    let mut result = Ok(());
    'outer: for &size in &args.sizes {
        for &flows in &args.flows {
            let offered = Offered {
                size,
                flows,
                src: (dut::VM_MAC, dut::VM_IP),
                dst: (dut::REMOTE_MAC, dut::REMOTE_IP),
            };
            let mut runs = Vec::new();
            for _ in 0..s.runs {
                match measure(kind, &bed, &dut, offered, s) {
                    Ok(p) => runs.push(p),
                    Err(e) => {
                        result = Err(e);
                        break 'outer;
                    }
                }
            }
            let p = median_point(runs);
            println!(
                "  {:<34} {:>4} B {:>2} flow(s): {:>7.0} kpps ({:>5.2} Gb/s; generator {:>4.0} kpps), latency p50 {:>6.1} us p99 {:>7.1} us",
                kind.describe(),
                size,
                flows,
                p.pps / 1e3,
                p.gbps,
                p.gen_pps / 1e3,
                p.latency_p50_us,
                p.latency_p99_us
            );
            points.push(p);
        }
    }
    let summary = dut.stop(&bed)?;
    if !summary.is_empty() {
        println!("  ({summary})");
    }
    result.map(|()| points)
}

/// CPU ns used so far by the generator thread, the device and the softirq threads.
struct CpuSample {
    generator: u64,
    dut: Option<u64>,
    softirq: u64,
}

fn sample_cpu(gen_tid: u64, dut: &Dut, softirq_pids: &[String]) -> CpuSample {
    CpuSample {
        generator: traffic::cpu_ns(&format!("self/task/{gen_tid}")).unwrap_or(0),
        dut: dut.cpu_ns(),
        softirq: softirq_pids
            .iter()
            .filter_map(|p| traffic::cpu_ns(p).ok())
            .sum(),
    }
}

/// One run: the maximum rate over a window, then latency at half that rate.
fn measure(kind: DutKind, bed: &Bed, dut: &Dut, offered: Offered, s: &Settings) -> Result<Point> {
    let ctl = Arc::new(GenControl::default());
    let c = ctl.clone();
    let gen = netns::spawn_in_netns(&bed.gen_ns, move || -> Result<()> {
        traffic::pin_current_thread(0)?;
        traffic::generate(dut::GEN_DEV, offered, c)
    })?;
    let result = measure_with(kind, bed, dut, offered, s, &ctl);
    ctl.stop.store(true, Ordering::Relaxed);
    let gen_result = gen.join();
    let point = result?;
    gen_result??;
    Ok(point)
}

fn measure_with(
    kind: DutKind,
    bed: &Bed,
    dut: &Dut,
    offered: Offered,
    s: &Settings,
    ctl: &Arc<GenControl>,
) -> Result<Point> {
    let rx = || traffic::rx_packets(&bed.sink_ns, dut::SINK_DEV);
    let softirq = traffic::ksoftirqd_pids();
    let before_warmup = rx()?;
    std::thread::sleep(s.warmup);
    let gen_tid = ctl.tid.load(Ordering::Relaxed);
    let rx0 = rx()?;
    if rx0 <= before_warmup {
        bail!(
            "{}: no frames reached the sink during warm-up (generator sent {})",
            kind.describe(),
            ctl.sent.load(Ordering::Relaxed)
        );
    }
    let t0 = Instant::now();
    let sent0 = ctl.sent.load(Ordering::Relaxed);
    let cpu0 = sample_cpu(gen_tid, dut, &softirq);
    std::thread::sleep(s.window);
    let rx1 = rx()?;
    let elapsed = t0.elapsed().as_secs_f64();
    let sent1 = ctl.sent.load(Ordering::Relaxed);
    let cpu1 = sample_cpu(gen_tid, dut, &softirq);
    let forwarded = (rx1 - rx0).max(1) as f64;
    let pps = forwarded / elapsed;
    let dut_cpu = cpu0
        .dut
        .zip(cpu1.dut)
        .map(|(a, b)| b.saturating_sub(a) as f64 / forwarded);
    let path_cpu = (cpu1.generator - cpu0.generator
        + cpu1.dut.unwrap_or(0).saturating_sub(cpu0.dut.unwrap_or(0))
        + cpu1.softirq.saturating_sub(cpu0.softirq)) as f64
        / forwarded;

    // Latency at half the measured maximum: every frame carries its send time.
    ctl.rate_pps
        .store((pps / 2.0).max(1.0) as u64, Ordering::Relaxed);
    ctl.stamp.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let sink = netns::spawn_in_netns(&bed.sink_ns, move || {
        traffic::latency_sink(dut::SINK_DEV, st)
    })?;
    std::thread::sleep(s.latency_window);
    stop.store(true, Ordering::Relaxed);
    let hist = sink.join()??;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    Ok(Point {
        dut: kind.key(),
        size: offered.size,
        flows: offered.flows,
        pps,
        gen_pps: (sent1 - sent0) as f64 / elapsed,
        gbps: pps * offered.size as f64 * 8.0 / 1e9,
        dut_cpu_ns_per_pkt: dut_cpu,
        path_cpu_ns_per_pkt: path_cpu,
        latency_p50_us: if hist.is_empty() { f64::NAN } else { us(0.5) },
        latency_p99_us: if hist.is_empty() { f64::NAN } else { us(0.99) },
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The point whose every metric is the median over `runs` (non-empty).
fn median_point(runs: Vec<Point>) -> Point {
    let m = |f: &dyn Fn(&Point) -> f64| median(runs.iter().map(f).collect());
    Point {
        pps: m(&|p| p.pps),
        gen_pps: m(&|p| p.gen_pps),
        gbps: m(&|p| p.gbps),
        dut_cpu_ns_per_pkt: runs[0]
            .dut_cpu_ns_per_pkt
            .map(|_| m(&|p| p.dut_cpu_ns_per_pkt.unwrap_or(0.0))),
        path_cpu_ns_per_pkt: m(&|p| p.path_cpu_ns_per_pkt),
        latency_p50_us: m(&|p| p.latency_p50_us),
        latency_p99_us: m(&|p| p.latency_p99_us),
        ..runs[0].clone()
    }
}

fn find<'a>(points: &'a [Point], dut: &str, size: usize, flows: u16) -> Option<&'a Point> {
    points
        .iter()
        .find(|p| p.dut == dut && p.size == size && p.flows == flows)
}

/// Ratios of picnic (isolation on, AF_PACKET and AF_XDP ports) to its references, where both
/// were measured.
fn ratios(points: &[Point], size: usize, flows: u16) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    for (name, this, peer) in [
        ("picnic/raw", "picnic", "raw"),
        ("picnic/ovs_afxdp", "picnic", "ovs_afxdp"),
        ("picnic/ovs", "picnic", "ovs"),
        ("picnic/bridge", "picnic", "bridge"),
        ("picnic/picnic_off", "picnic", "picnic_off"),
        ("picnic_xdp/raw_xdp", "picnic_xdp", "raw_xdp"),
        ("picnic_xdp/ovs_afxdp", "picnic_xdp", "ovs_afxdp"),
        ("picnic_xdp/ovs", "picnic_xdp", "ovs"),
        ("picnic_xdp/bridge", "picnic_xdp", "bridge"),
        ("picnic_xdp/picnic", "picnic_xdp", "picnic"),
        ("raw_xdp/raw", "raw_xdp", "raw"),
    ] {
        if let (Some(a), Some(b)) = (
            find(points, this, size, flows),
            find(points, peer, size, flows),
        ) {
            out.insert(name, a.pps / b.pps);
        }
    }
    out
}

fn print_table(points: &[Point], args: &BenchArgs) {
    println!("| frame | flows | device | kpps | Gb/s | gen kpps | device CPU ns/pkt | path CPU ns/pkt | p50 us @50% | p99 us @50% |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &size in &args.sizes {
        for &flows in &args.flows {
            for p in points.iter().filter(|p| p.size == size && p.flows == flows) {
                println!(
                    "| {} B | {} | {} | {:.0} | {:.2} | {:.0} | {} | {:.0} | {:.1} | {:.1} |",
                    size,
                    flows,
                    p.dut,
                    p.pps / 1e3,
                    p.gbps,
                    p.gen_pps / 1e3,
                    p.dut_cpu_ns_per_pkt
                        .map_or("-".to_string(), |c| format!("{c:.0}")),
                    p.path_cpu_ns_per_pkt,
                    p.latency_p50_us,
                    p.latency_p99_us
                );
            }
        }
    }
    println!();
    for &size in &args.sizes {
        for &flows in &args.flows {
            let r = ratios(points, size, flows);
            if !r.is_empty() {
                let text: Vec<String> = r.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
                println!("ratios {size} B, {flows} flow(s): {}", text.join(", "));
            }
        }
    }
}

fn to_json(points: &[Point], args: &BenchArgs, s: &Settings) -> serde_json::Value {
    let mut sizes = serde_json::Map::new();
    for &size in &args.sizes {
        let mut by_flows = serde_json::Map::new();
        let mut top = serde_json::Map::new();
        for (i, &flows) in args.flows.iter().enumerate() {
            let mut entry = serde_json::Map::new();
            for p in points.iter().filter(|p| p.size == size && p.flows == flows) {
                entry.insert(format!("{}_pps", p.dut), p.pps.round().into());
                entry.insert(
                    format!("{}_detail", p.dut),
                    serde_json::to_value(p).unwrap_or_default(),
                );
            }
            entry.insert(
                "ratios".into(),
                serde_json::to_value(ratios(points, size, flows)).unwrap_or_default(),
            );
            if i == 0 {
                // The per-size keys (`raw_pps`, ...) are those of the first flow count.
                for (k, v) in &entry {
                    if k.ends_with("_pps") || k == "ratios" {
                        top.insert(k.clone(), v.clone());
                    }
                }
            }
            by_flows.insert(flows.to_string(), entry.into());
        }
        top.insert("flows".into(), by_flows.into());
        sizes.insert(size.to_string(), top.into());
    }
    serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "runs": s.runs,
        "window_ms": s.window.as_millis() as u64,
        "frame_sizes": sizes,
    })
}
