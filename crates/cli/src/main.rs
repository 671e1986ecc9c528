//! The one `picnic` binary.

use clap::{Parser, Subcommand};

mod ctl;
mod lab_cmd;
mod switch_cmd;

#[derive(Parser)]
#[command(
    name = "picnic",
    version,
    about = "A predictable virtualized NIC: a userspace virtual switch that keeps each tenant within its SLO"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one host's dataplane from a TOML config.
    Switch(switch_cmd::SwitchArgs),
    /// The cluster's command line: hosts, tenants, VMs and SLOs in etcd or on one switch.
    Ctl(ctl::CtlArgs),
    /// Prove isolation on this machine with real traffic in network namespaces.
    #[command(subcommand)]
    Lab(lab_cmd::LabCommand),
    /// Closed-form models next to simulation and measurement (Rizzo et al. speed mismatch).
    Model(picnic_model::ModelArgs),
    /// Discrete-event simulation of a lab scenario at any scale, on the same engine code.
    Sim(picnic_sim::SimCommand),
    /// Forwarding benchmark: picnic against the raw AF_PACKET limit, a Linux bridge and OVS.
    Bench(picnic_bench::BenchArgs),
    /// The CNI plugin (CNI_* variables, netconf on stdin); runtimes run it through a symlink
    /// named picnic-cni in their CNI_PATH (docs/cni.md).
    Cni,
}

fn main() {
    // Installed as the CNI plugin `picnic-cni`, runtimes exec it with no arguments.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name() == Some("picnic-cni".as_ref()) {
        std::process::exit(picnic_cni::plugin_main());
    }
    let cli = Cli::parse();
    let code = match cli.command {
        // Errors are logged by the switch's subscriber.
        Command::Switch(args) => match switch_cmd::run(args) {
            Ok(()) => 0,
            Err(_) => 2,
        },
        Command::Lab(cmd) => lab_cmd::run(cmd),
        Command::Ctl(args) => ctl::run(args),
        Command::Sim(args) => match picnic_sim::run_command(args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("picnic sim: error: {e:#}");
                2
            }
        },
        Command::Bench(args) => match picnic_bench::run_cli(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("picnic bench: error: {e:#}");
                2
            }
        },
        Command::Cni => picnic_cni::plugin_main(),
        Command::Model(args) => match picnic_model::run_cli(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("picnic model: error: {e:#}");
                2
            }
        },
    };
    std::process::exit(code);
}
