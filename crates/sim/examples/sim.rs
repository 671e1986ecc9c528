//! `cargo run --release -p picnic-sim --example sim -- SCENARIO [--out DIR] [--seed N]`, or
//! `-- ns3 SCENARIO` / `-- sweep SWEEP` (in-process only: Ray's workers run `picnic sim
//! sweep`): `picnic sim` without the `picnic` binary (the lead
//! wires `picnic sim` to the same [`picnic_sim::run_command`]).
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: picnic_sim::SimCommand,
}

fn main() -> anyhow::Result<()> {
    let code = picnic_sim::run_command(Cli::parse().cmd)?;
    std::process::exit(code)
}
