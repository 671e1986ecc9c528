//! `picnic sim`: a deterministic discrete-event simulator that runs the switch's own sans-I/O
//! engines (`picnic_switch::engine::Engine`) on a virtual clock, from one host to thousands
//! (DESIGN.md section 2). It reads the lab's scenario files unchanged (plus an optional
//! `[sim]` table, see [`spec`]) and writes the lab's outputs (summary.json with the same
//! keys, timeseries.csv, latency.csv) plus sim.json, queues.csv, flows.csv, rates.csv and
//! SVG plots, so one scenario can be compared lab vs simulation. docs/sim.md has the details.

pub mod event;
pub mod ns3;
pub mod packet;
pub mod report;
pub mod spec;
pub mod sweep;
pub mod tcp;
pub mod workload;
pub mod world;

use std::path::PathBuf;

use anyhow::Result;

/// Arguments of `picnic sim`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Scenario file (the lab's format, optionally with a `[sim]` table).
    pub scenario: PathBuf,
    /// Directory for summary.json, CSVs and plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the simulation's random numbers (same seed, same results).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Runs `picnic sim`: every mode of the scenario, the side-by-side table on stderr, outputs
/// in `--out`. Exit code as the lab's: 0 all pass marks held, 1 some failed.
pub fn run_cli(args: SimArgs) -> Result<i32> {
    let spec = spec::Spec::load(&args.scenario)?;
    let outcome = report::run(&spec, args.seed, args.out.as_deref(), true)?;
    Ok(if outcome.summary.pass { 0 } else { 1 })
}

/// `picnic sim`: a scenario run (`picnic sim SCENARIO.toml`) or a subcommand
/// (`picnic sim sweep SWEEP.toml`).
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SimCommand {
    /// A subcommand instead of a scenario.
    #[command(subcommand)]
    pub sub: Option<SimSub>,
    /// One scenario's run.
    #[command(flatten)]
    pub run: Option<SimArgs>,
}

/// Subcommands of `picnic sim`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimSub {
    /// Scenario x parameter x seed grid, in-process or on Ray, resumable, merged into one
    /// table with 95% confidence intervals across seeds (docs/sim.md "Sweeps").
    Sweep(sweep::SweepArgs),
    /// Write an ns-3 program (Python, PyPI's `ns3`) for a single-bottleneck or leaf-spine scenario
    /// (docs/sim.md "ns-3").
    Ns3(ns3::Ns3Args),
}

/// Runs `picnic sim ...`; a sweep's single-case worker is this binary's `sim sweep`.
pub fn run_command(cmd: SimCommand) -> Result<i32> {
    match (cmd.sub, cmd.run) {
        (Some(SimSub::Sweep(args)), _) => sweep::run_cli(args, &sweep::default_worker()?),
        (Some(SimSub::Ns3(args)), _) => ns3::run_cli(args),
        (None, Some(args)) => run_cli(args),
        (None, None) => anyhow::bail!("a scenario file or `sweep SWEEP.toml`"),
    }
}
