//! Runs the forwarding benchmark without the `picnic` binary:
//! `cargo run --release -p picnic-bench --example bench -- [--quick] [--json]`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: picnic_bench::BenchArgs,
}

fn main() {
    if let Err(e) = picnic_bench::run_cli(Cli::parse().args) {
        eprintln!("picnic bench: error: {e:#}");
        std::process::exit(2);
    }
}
