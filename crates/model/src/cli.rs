//! `picnic model ...`: the classifier, the simulator, the real prototype and the
//! figures of Rizzo et al. (ANCS 2016).

use crate::figures::{self, FigureSetup};
use crate::model::{predict, Params};
use crate::real::{measure_sync_costs, run_real, RealConfig, RealStrategy};
use crate::sim::{simulate, CostDist, SimConfig, Strategy};
use anyhow::Context;
use picnic_core::Duration;
use std::path::PathBuf;

/// Arguments of `picnic model`.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// What to run.
    #[command(subcommand)]
    pub command: ModelCommand,
}

/// Subcommands of `picnic model`.
#[derive(clap::Subcommand, Debug)]
pub enum ModelCommand {
    /// Regime (Table 1) and closed-form T and E per message (Eq. 1-4).
    Rizzo(RizzoArgs),
    /// Event-driven simulation of the same system on a virtual clock.
    Sim(SimArgs),
    /// Run the real two-thread prototype on this machine.
    Measure(MeasureArgs),
    /// Write fig4.svg / fig5.svg and their CSVs (model, simulation, real system).
    Figures(FiguresArgs),
}

/// The model parameters of §2 (costs in nanoseconds).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ParamFlags {
    /// Queue length L.
    #[arg(long, default_value_t = 256)]
    pub l: u32,
    /// Producer work per message W_P (ns).
    #[arg(long, default_value_t = 1500.0)]
    pub wp: f64,
    /// Consumer work per message W_C (ns).
    #[arg(long, default_value_t = 1100.0)]
    pub wc: f64,
    /// Producer notification threshold k_P.
    #[arg(long, default_value_t = 1)]
    pub kp: u32,
    /// Consumer notification threshold k_C.
    #[arg(long, default_value_t = 1)]
    pub kc: u32,
    /// Producer notification cost N_P (ns).
    #[arg(long, default_value_t = 2400.0)]
    pub np: f64,
    /// Consumer notification cost N_C (ns).
    #[arg(long, default_value_t = 200.0)]
    pub nc: f64,
    /// Producer start-up cost S_P (ns).
    #[arg(long, default_value_t = 3900.0)]
    pub sp: f64,
    /// Consumer start-up cost S_C (ns).
    #[arg(long, default_value_t = 200.0)]
    pub sc: f64,
}

impl From<ParamFlags> for Params {
    fn from(f: ParamFlags) -> Params {
        Params {
            l: f.l,
            wp: f.wp,
            wc: f.wc,
            kp: f.kp,
            kc: f.kc,
            np: f.np,
            nc: f.nc,
            sp: f.sp,
            sc: f.sc,
        }
    }
}

/// `picnic model rizzo`.
#[derive(clap::Args, Debug)]
pub struct RizzoArgs {
    /// Parameters.
    #[command(flatten)]
    pub params: ParamFlags,
    /// Both parties poll (regime GP).
    #[arg(long)]
    pub polling: bool,
    /// Print `{"regime": .., "t_per_msg": .., "e_per_msg": ..}`.
    #[arg(long)]
    pub json: bool,
}

/// Cost distribution for `sim`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum DistArg {
    /// Every cost equals its mean.
    Constant,
    /// Uniform within ±spread of the mean.
    Uniform,
    /// Exponential with the given mean.
    Exp,
}

/// Wait strategy for `sim` and `measure`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum StrategyArg {
    /// Block and notify (regimes FC..SS).
    Notify,
    /// Spin (GP).
    Poll,
    /// The adaptive control of §4.1.
    Adaptive,
}

/// `picnic model sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// Parameters (means).
    #[command(flatten)]
    pub params: ParamFlags,
    /// Wait strategy.
    #[arg(long, value_enum, default_value = "notify")]
    pub strategy: StrategyArg,
    /// Cost distribution.
    #[arg(long, value_enum, default_value = "constant")]
    pub dist: DistArg,
    /// Relative half-width of the uniform distribution.
    #[arg(long, default_value_t = 0.3)]
    pub spread: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Messages measured (after as many warm-up messages / 10).
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Longest slow-down of the adaptive control (ns).
    #[arg(long, default_value_t = 500_000)]
    pub max_sleep: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `picnic model measure`.
#[derive(clap::Args, Debug)]
pub struct MeasureArgs {
    /// Queue length L.
    #[arg(long, default_value_t = 256)]
    pub l: u32,
    /// Producer spin work per message W_P (ns).
    #[arg(long, default_value_t = 1500)]
    pub wp: u64,
    /// Consumer spin work per message W_C (ns).
    #[arg(long, default_value_t = 1100)]
    pub wc: u64,
    /// Producer notification threshold k_P.
    #[arg(long, default_value_t = 1)]
    pub kp: u32,
    /// Consumer notification threshold k_C.
    #[arg(long, default_value_t = 1)]
    pub kc: u32,
    /// Wait strategy.
    #[arg(long, value_enum, default_value = "notify")]
    pub strategy: StrategyArg,
    /// Messages to send (the run also stops after --millis).
    #[arg(long, default_value_t = 50_000)]
    pub messages: u64,
    /// Wall-clock bound of the run (ms).
    #[arg(long, default_value_t = 500)]
    pub millis: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `picnic model figures`.
#[derive(clap::Args, Debug)]
pub struct FiguresArgs {
    /// Output directory for fig4.svg, fig4.csv, fig5.svg, fig5.csv.
    #[arg(long)]
    pub out: PathBuf,
    /// Queue length L used in both figures.
    #[arg(long, default_value_t = 256)]
    pub l: u32,
    /// Fixed consumer work W_C (ns); W_P is swept around it.
    #[arg(long, default_value_t = 1100)]
    pub wc: u64,
    /// Wall-clock bound of each real run (ms).
    #[arg(long, default_value_t = 200)]
    pub millis: u64,
}

/// Entry point of `picnic model`.
pub fn run_cli(args: ModelArgs) -> anyhow::Result<()> {
    match args.command {
        ModelCommand::Rizzo(a) => {
            let pred = predict(&a.params.into(), a.polling).map_err(anyhow::Error::msg)?;
            if a.json {
                println!("{}", serde_json::to_string(&pred)?);
            } else {
                println!(
                    "regime {}  T = {:.1} ns/msg ({:.3} Mmsg/s)  E = {:.1} ns/msg",
                    pred.regime,
                    pred.t_per_msg,
                    1e3 / pred.t_per_msg,
                    pred.e_per_msg
                );
            }
        }
        ModelCommand::Sim(a) => {
            let dist = match a.dist {
                DistArg::Constant => CostDist::Constant,
                DistArg::Uniform => CostDist::Uniform { spread: a.spread },
                DistArg::Exp => CostDist::Exponential,
            };
            let strategy = match a.strategy {
                StrategyArg::Notify => Strategy::Notify,
                StrategyArg::Poll => Strategy::Poll,
                StrategyArg::Adaptive => Strategy::Adaptive {
                    max_sleep: Duration::from_nanos(a.max_sleep),
                },
            };
            let cfg = SimConfig {
                params: a.params.into(),
                dist,
                strategy,
                seed: a.seed,
                warmup: a.messages / 10,
                messages: a.messages,
            };
            let r = simulate(&cfg).map_err(anyhow::Error::msg)?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "T = {:.1} ns/msg  E = {:.1} ns/msg  producer blocks {}  consumer blocks {}",
                    r.t_per_msg, r.e_per_msg, r.producer_blocks, r.consumer_blocks
                );
            }
        }
        ModelCommand::Measure(a) => {
            let sync = measure_sync_costs(200)?;
            let strategy = match a.strategy {
                StrategyArg::Notify => RealStrategy::Notify,
                StrategyArg::Poll => RealStrategy::Poll,
                StrategyArg::Adaptive => RealStrategy::Adaptive {
                    params: figures::measured_params(
                        a.l,
                        a.wp as f64,
                        a.wc as f64,
                        a.kp,
                        a.kc,
                        &sync,
                    ),
                    max_sleep: Duration::from_micros(500),
                },
            };
            let cfg = RealConfig {
                l: a.l,
                wp: a.wp,
                wc: a.wc,
                kp: a.kp,
                kc: a.kc,
                strategy,
                messages: a.messages,
                time_limit: std::time::Duration::from_millis(a.millis),
            };
            let r = run_real(&cfg)?;
            let params = figures::measured_params(a.l, a.wp as f64, a.wc as f64, a.kp, a.kc, &sync);
            let model = predict(&params, matches!(a.strategy, StrategyArg::Poll))
                .map_err(anyhow::Error::msg)?;
            if a.json {
                let v = serde_json::json!({ "sync": sync, "real": r, "model": model });
                println!("{v}");
            } else {
                println!(
                    "N (eventfd write waking a thread) = {:.0} ns, S (start-up after it) = {:.0} ns, wake latency = {:.0} ns",
                    sync.notify, sync.wake, sync.wake_latency
                );
                println!(
                    "real: {} msgs  T = {:.1} ns/msg  E = {:.1} ns/msg  notifications P->C {} C->P {}",
                    r.messages, r.t_per_msg, r.e_per_msg, r.producer_notifies, r.consumer_notifies
                );
                println!(
                    "model with measured N, S ({}, no control): T = {:.1} ns/msg  E = {:.1} ns/msg",
                    model.regime, model.t_per_msg, model.e_per_msg
                );
            }
        }
        ModelCommand::Figures(a) => {
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            figures::write_figures(&FigureSetup {
                out: a.out,
                l: a.l,
                wc: a.wc,
                time_limit: std::time::Duration::from_millis(a.millis),
            })?;
        }
    }
    Ok(())
}
