//! Stand-alone `picnic model` until the lead wires it into the `picnic` binary:
//! `cargo run -p picnic-model --release --example model -- figures --out DIR`.

use clap::Parser;

/// `picnic model` as its own program.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: picnic_model::ModelArgs,
}

fn main() -> anyhow::Result<()> {
    picnic_model::run_cli(Cli::parse().args)
}
