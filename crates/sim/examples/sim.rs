//! `cargo run --release -p picnic-sim --example sim -- SCENARIO [--out DIR] [--seed N]`:
//! the simulator without the `picnic` binary (the lead wires `picnic sim` to the same
//! [`picnic_sim::run_cli`]).
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: picnic_sim::SimArgs,
}

fn main() -> anyhow::Result<()> {
    let code = picnic_sim::run_cli(Cli::parse().args)?;
    std::process::exit(code)
}
