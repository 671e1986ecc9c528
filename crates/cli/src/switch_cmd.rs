//! `picnic switch`: run one host's dataplane.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::Context;
use picnic_switch::config::Config;
use picnic_switch::persist;
use picnic_switch::runner::Switch;

#[derive(clap::Args)]
pub struct SwitchArgs {
    /// The host's TOML config (see docs/switch.md and examples/host1.toml).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Only validate the config, and the files, directories and cgroups it names, and exit
    /// (no device is opened).
    #[arg(long)]
    pub check: bool,
    /// Log lines as text (time, level, message, fields) or as one JSON object each.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sends the switch's log events to stderr (for journald under systemd), info and above,
/// each line with its time (UTC) and level.
fn init_logs(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => logs.try_init(),
        LogFormat::Json => logs.json().flatten_event(true).try_init(),
    };
}

pub fn run(args: SwitchArgs) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let result = run_switch(args);
    if let Err(e) = &result {
        tracing::error!("{e:#}");
    }
    result
}

fn run_switch(args: SwitchArgs) -> anyhow::Result<()> {
    let mut cfg = Config::load(&args.config)?;
    // The hosts, tenants and VMs the API last left, if the switch ran before.
    if let Some(state) = cfg.switch.state_file.clone() {
        cfg = persist::restore(cfg, &state)?;
    }
    // The files and directories it will use, named by field as validation names them: the
    // same check runs before a start, so what passes --check does not fail there instead.
    cfg.check_files()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    if args.check {
        println!(
            "{}: ok ({} tenants, {} VMs, {} hosts)",
            args.config.display(),
            cfg.tenants.len(),
            cfg.vms.len(),
            cfg.hosts.len()
        );
        return Ok(());
    }
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!("picnic switch opens raw packet sockets and TAP devices: run it as root (or with CAP_NET_RAW and CAP_NET_ADMIN)");
    }
    let section = cfg.switch.clone();
    let controlled = cfg.control.is_some().then(|| cfg.clone());
    let mut switch = Switch::open(cfg).context("starting the switch")?;
    for line in switch.describe_ports() {
        tracing::info!("{line}");
    }
    let stop = switch.stop_flag();
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    // One channel for the API and the control plane (a second would replace the first).
    let commands =
        (section.api.is_some() || controlled.is_some()).then(|| switch.command_channel());
    if let Some(commands) = commands.clone().filter(|_| section.api.is_some()) {
        let api = picnic_switch::api::spawn(&section, switch.shared(), commands)?;
        tracing::info!("API on {} (/stats, /slo, /metrics, /config)", api.listening);
    }
    // Watches until the switch stops.
    let _watch = match (&controlled, commands) {
        (Some(cfg), Some(commands)) => Some(picnic_control::watch::spawn(
            cfg,
            switch.shared(),
            commands,
        )?),
        _ => None,
    };
    if let Some(addr) = &section.metrics {
        let metrics = picnic_switch::api::spawn_metrics(addr, switch.shared())?;
        tracing::info!("metrics on {}", metrics.listening);
    }
    tracing::info!("running (Ctrl-C to stop)");
    switch.run()?;
    let _ = stop.load(Ordering::Relaxed);
    tracing::info!("stopped, ports released");
    Ok(())
}
