//! `picnic ctl`: hosts, tenants, VMs and SLOs added, changed, moved, removed and shown,
//! cluster-wide in etcd (`--etcd URL`) or on one switch through its API (`--api SOCKET`);
//! `status` across the cluster's switches. docs/operations.md "Control plane".

mod feedback_key;
mod status;
mod target;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use picnic_control::cluster::{Cluster, Kind};
use picnic_control::store;
use picnic_core::slo::Slo;
use picnic_switch::config::{
    read_secret, ApiListen, Backend, ControlSection, HostEntry, Mac, PortEntry, TenantEntry,
    VmEntry, CONTROL_PREFIX,
};
use serde_json::Value;
use target::{kind_name, Api, Target};

#[derive(Args)]
pub struct CtlArgs {
    /// An etcd client URL of the cluster (http://HOST:PORT; repeat for several).
    #[arg(long, global = true)]
    pub etcd: Vec<String>,
    /// The cluster's key prefix in etcd (the switches' `control.prefix`).
    #[arg(long, global = true, default_value = CONTROL_PREFIX)]
    pub prefix: String,
    /// One switch's API (`switch.api`: a socket path or tcp:ADDR:PORT) instead of etcd:
    /// changes that host only.
    #[arg(long, global = true)]
    pub api: Option<String>,
    /// The bearer token of switch APIs on TCP (`switch.api_token_file`), for `--api
    /// tcp:...` and for `status` reaching switches whose API is on TCP.
    #[arg(long, global = true)]
    pub api_token_file: Option<PathBuf>,
    /// How long a change made in etcd is waited for on the switches that are up (0: not).
    #[arg(long, global = true, default_value_t = 5.0)]
    pub wait_s: f64,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand)]
pub enum CtlCommand {
    /// Hosts: the underlay address and MAC of each host's uplink.
    #[command(subcommand)]
    Host(HostCmd),
    #[command(subcommand)]
    Tenant(TenantCmd),
    #[command(subcommand)]
    Vm(VmCmd),
    /// A tenant's SLO, held on every host it spans.
    #[command(subcommand)]
    Slo(SloCmd),
    /// The cluster's hosts: which switches are up, at which revision, which tenants violate
    /// their SLO there and why (from each switch's API).
    Status,
    /// The key that authenticates feedback between hosts (etcd only).
    #[command(subcommand)]
    FeedbackKey(feedback_key::FeedbackKeyCmd),
}

#[derive(Subcommand)]
pub enum HostCmd {
    Add {
        id: u32,
        #[arg(long)]
        underlay_ip: Ipv4Addr,
        #[arg(long)]
        mac: Mac,
    },
    Set {
        id: u32,
        #[arg(long)]
        underlay_ip: Option<Ipv4Addr>,
        #[arg(long)]
        mac: Option<Mac>,
    },
    Rm {
        id: u32,
    },
    Show {
        id: Option<u32>,
    },
}

#[derive(Subcommand)]
pub enum TenantCmd {
    Add {
        name: String,
        /// Geneve VNI (24 bits), unique in the cluster.
        #[arg(long)]
        vni: u32,
        /// CPU allocation per host, cores.
        #[arg(long)]
        cpu_quota: Option<f64>,
    },
    Set {
        name: String,
        #[arg(long)]
        vni: Option<u32>,
        #[arg(long)]
        cpu_quota: Option<f64>,
    },
    Rm {
        name: String,
    },
    Show {
        name: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum VmCmd {
    Add {
        name: String,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        host: u32,
        #[arg(long)]
        mac: Mac,
        #[arg(long)]
        ip: Ipv4Addr,
        /// Endpoint id, unique in the cluster; default: one above the highest.
        #[arg(long)]
        id: Option<u32>,
        /// Its port on its host: the interface name (default: the VM's name).
        #[arg(long)]
        port: Option<String>,
        #[arg(long, default_value = "af_packet")]
        backend: String,
        #[arg(long)]
        min_mbps: Option<u64>,
        #[arg(long)]
        max_mbps: Option<u64>,
    },
    Set {
        name: String,
        #[arg(long)]
        min_mbps: Option<u64>,
        #[arg(long)]
        max_mbps: Option<u64>,
        #[arg(long)]
        max_pps: Option<u64>,
        #[arg(long)]
        ip: Option<Ipv4Addr>,
    },
    /// Re-homes the VM on HOST (etcd only): its old host gives its port up, the new one
    /// opens `--port` (default: the same interface name), every host sends to it there.
    Move {
        name: String,
        host: u32,
        #[arg(long)]
        port: Option<String>,
    },
    Rm {
        name: String,
    },
    Show {
        name: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum SloCmd {
    /// Sets the tenant's SLO (fields not given: no bound).
    Set {
        tenant: String,
        #[arg(long)]
        min_mbps: Option<u64>,
        #[arg(long)]
        max_mbps: Option<u64>,
        #[arg(long)]
        latency_us: Option<u64>,
        /// The percentile `latency_us` bounds.
        #[arg(long)]
        percentile: Option<f64>,
        /// Largest fraction of packets lost, in [0, 1].
        #[arg(long)]
        max_loss: Option<f64>,
    },
    Rm {
        tenant: String,
    },
    Show {
        tenant: Option<String>,
    },
}

/// Runs `picnic ctl`; the exit code.
pub fn run(args: CtlArgs) -> i32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(execute(args)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("picnic ctl: error: {e:#}");
            2
        }
    }
}

async fn execute(args: CtlArgs) -> anyhow::Result<()> {
    let token = match &args.api_token_file {
        Some(path) => Some(
            String::from_utf8(read_secret(path, "--api-token-file")?)
                .context("--api-token-file: not UTF-8")?,
        ),
        None => None,
    };
    let mut target = match (&args.api, args.etcd.is_empty()) {
        (Some(_), false) => bail!("give --etcd (the cluster) or --api (one switch), not both"),
        (None, true) => bail!("give --etcd URL (the cluster) or --api SOCKET (one switch)"),
        (Some(listen), true) => Target::Api(Api {
            listen: ApiListen::parse(listen).map_err(|e| anyhow::anyhow!("--api {e}"))?,
            token: token.clone(),
        }),
        (None, false) => {
            for url in &args.etcd {
                ControlSection::check_endpoint(url).map_err(|e| anyhow::anyhow!("--etcd {e}"))?;
            }
            if !args.prefix.starts_with('/') || !args.prefix.ends_with('/') {
                bail!("--prefix '{}': must start and end with '/'", args.prefix);
            }
            Target::Etcd {
                client: Box::new(store::connect(&args.etcd).await?),
                prefix: args.prefix.clone(),
                snap: Default::default(),
            }
        }
    };
    if let CtlCommand::FeedbackKey(cmd) = &args.command {
        let Target::Etcd { client, prefix, .. } = &mut target else {
            bail!("feedback-key is cluster-wide: give --etcd, not one switch's --api");
        };
        let wait = Duration::from_secs_f64(args.wait_s);
        return feedback_key::run(client, prefix, cmd, wait).await;
    }
    let view = match &target {
        Target::Etcd { .. } => format!("etcd {}", args.etcd.join(",")),
        Target::Api(api) => format!("the switch's API at {api}"),
    };
    let view = target
        .view()
        .await
        .with_context(|| format!("reading {view}"))?;
    let edit = match args.command {
        CtlCommand::Status => return status::run(&mut target, &view, token).await,
        CtlCommand::Host(cmd) => host(&view, cmd)?,
        CtlCommand::Tenant(cmd) => tenant(&view, cmd)?,
        CtlCommand::Vm(cmd) => vm(&view, cmd, matches!(target, Target::Etcd { .. }))?,
        CtlCommand::Slo(cmd) => slo(&view, cmd)?,
        CtlCommand::FeedbackKey(_) => unreachable!("answered above"),
    };
    let Some(Edit {
        kind,
        name,
        value,
        create,
    }) = edit
    else {
        return Ok(());
    };
    let revision = target.write(&view, kind, &name, value, create).await?;
    match &mut target {
        Target::Api(api) => println!("ok: applied on {api}"),
        Target::Etcd { client, prefix, .. } => {
            println!("ok: revision {revision}");
            if args.wait_s > 0.0 {
                let wait = Duration::from_secs_f64(args.wait_s);
                status::wait_for(client, prefix, revision, wait).await?;
            }
        }
    }
    Ok(())
}

/// One record to write: Some value (new if `create`), or None to remove it.
struct Edit {
    kind: Kind,
    name: String,
    value: Option<Value>,
    create: bool,
}

impl Edit {
    fn put(
        kind: Kind,
        name: impl ToString,
        v: impl serde::Serialize,
        create: bool,
    ) -> anyhow::Result<Option<Edit>> {
        Ok(Some(Edit {
            kind,
            name: name.to_string(),
            value: Some(serde_json::to_value(v)?),
            create,
        }))
    }
    fn rm(kind: Kind, name: impl ToString) -> anyhow::Result<Option<Edit>> {
        Ok(Some(Edit {
            kind,
            name: name.to_string(),
            value: None,
            create: false,
        }))
    }
}

/// Prints `v` as JSON (a show); no edit.
fn show(v: impl serde::Serialize) -> anyhow::Result<Option<Edit>> {
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(None)
}

fn one<T>(found: Option<&T>, kind: Kind, name: impl std::fmt::Display) -> anyhow::Result<&T> {
    found.with_context(|| format!("no {} '{name}'", kind_name(kind)))
}

fn host(view: &Cluster, cmd: HostCmd) -> anyhow::Result<Option<Edit>> {
    let k = Kind::Host;
    match cmd {
        HostCmd::Add {
            id,
            underlay_ip,
            mac,
        } => {
            if view.hosts.contains_key(&id) {
                bail!("host {id} exists already (picnic ctl host set)");
            }
            if let Some(h) = view.hosts.values().find(|h| h.underlay_ip == underlay_ip) {
                bail!("--underlay-ip {underlay_ip}: host {} has it", h.id);
            }
            Edit::put(
                k,
                id,
                HostEntry {
                    id,
                    underlay_ip,
                    mac,
                },
                true,
            )
        }
        HostCmd::Set {
            id,
            underlay_ip,
            mac,
        } => {
            let mut h = one(view.hosts.get(&id), k, id)?.clone();
            h.underlay_ip = underlay_ip.unwrap_or(h.underlay_ip);
            h.mac = mac.unwrap_or(h.mac);
            Edit::put(k, id, h, false)
        }
        HostCmd::Rm { id } => {
            one(view.hosts.get(&id), k, id)?;
            if let Some(v) = view.vms.values().find(|v| v.host == id) {
                bail!(
                    "host {id} still has VM '{}': move or remove its VMs first",
                    v.name
                );
            }
            Edit::rm(k, id)
        }
        HostCmd::Show { id: Some(id) } => show(one(view.hosts.get(&id), k, id)?),
        HostCmd::Show { id: None } => show(view.hosts.values().collect::<Vec<_>>()),
    }
}

fn tenant(view: &Cluster, cmd: TenantCmd) -> anyhow::Result<Option<Edit>> {
    let k = Kind::Tenant;
    let check = |name: &str, vni: u32, quota: Option<f64>| -> anyhow::Result<()> {
        if vni == 0 || vni >= 1 << 24 {
            bail!("--vni {vni}: must be in 1..=16777215 (24 bits)");
        }
        if let Some(t) = view
            .tenants
            .values()
            .find(|t| t.vni == vni && t.name != name)
        {
            bail!("--vni {vni}: tenant '{}' has it", t.name);
        }
        if quota.is_some_and(|q| !(q > 0.0 && q.is_finite())) {
            bail!("--cpu-quota: must be a positive number of cores");
        }
        Ok(())
    };
    match cmd {
        TenantCmd::Add {
            name,
            vni,
            cpu_quota,
        } => {
            if view.tenants.contains_key(&name) {
                bail!("tenant '{name}' exists already (picnic ctl tenant set)");
            }
            check(&name, vni, cpu_quota)?;
            // Defaults as the config file gives them.
            let mut t: TenantEntry =
                serde_json::from_value(serde_json::json!({"name": name, "vni": vni}))?;
            t.cpu_quota = cpu_quota;
            Edit::put(k, name, t, true)
        }
        TenantCmd::Set {
            name,
            vni,
            cpu_quota,
        } => {
            let mut t = one(view.tenants.get(&name), k, &name)?.clone();
            t.vni = vni.unwrap_or(t.vni);
            t.cpu_quota = cpu_quota.or(t.cpu_quota);
            check(&name, t.vni, t.cpu_quota)?;
            Edit::put(k, name, t, false)
        }
        TenantCmd::Rm { name } => {
            one(view.tenants.get(&name), k, &name)?;
            if let Some(v) = view.vms.values().find(|v| v.tenant == name) {
                bail!(
                    "tenant '{name}' still has VM '{}': remove its VMs first",
                    v.name
                );
            }
            if view.slos.contains_key(&name) {
                bail!("tenant '{name}' has an SLO: picnic ctl slo rm {name} first");
            }
            Edit::rm(k, name)
        }
        TenantCmd::Show { name: Some(name) } => show(one(view.tenants.get(&name), k, &name)?),
        TenantCmd::Show { name: None } => show(view.tenants.values().collect::<Vec<_>>()),
    }
}

/// Checks an interface name for a port.
fn ifname(name: &str) -> anyhow::Result<String> {
    if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
        bail!("port '{name}': an interface name has 1..=15 bytes (give --port)");
    }
    Ok(name.to_string())
}

fn vm(view: &Cluster, cmd: VmCmd, etcd: bool) -> anyhow::Result<Option<Edit>> {
    let k = Kind::Vm;
    let host_known = |host: u32| -> anyhow::Result<()> {
        if !view.hosts.contains_key(&host) {
            bail!("--host {host}: no such host (picnic ctl host add)");
        }
        Ok(())
    };
    match cmd {
        VmCmd::Add {
            name,
            tenant,
            host,
            mac,
            ip,
            id,
            port,
            backend,
            min_mbps,
            max_mbps,
        } => {
            if view.vms.contains_key(&name) {
                bail!("VM '{name}' exists already (picnic ctl vm set, or vm move)");
            }
            if !view.tenants.contains_key(&tenant) {
                bail!("--tenant {tenant}: no such tenant (picnic ctl tenant add)");
            }
            host_known(host)?;
            let id = id.unwrap_or_else(|| view.vms.values().map(|v| v.id).max().unwrap_or(0) + 1);
            if let Some(v) = view.vms.values().find(|v| v.id == id) {
                bail!("--id {id}: VM '{}' has it", v.name);
            }
            if let Some(v) = view.vms.values().find(|v| v.mac == mac) {
                bail!("--mac {mac}: VM '{}' has it", v.name);
            }
            let backend = serde_json::from_value(Value::String(backend.clone()))
                .ok()
                .filter(|b| *b != Backend::VhostUser)
                .with_context(|| {
                    format!("--backend {backend}: one of af_packet, af_xdp, tap, tap_queue (a vhost_user port's socket is set in the config or through the API)")
                })?;
            let mut vm: VmEntry = serde_json::from_value(serde_json::json!({
                "name": name, "id": id, "tenant": tenant, "host": host, "mac": mac, "ip": ip,
            }))?;
            vm.min_mbps = min_mbps.unwrap_or(vm.min_mbps);
            vm.max_mbps = max_mbps;
            vm.port = Some(port_entry(
                ifname(port.as_deref().unwrap_or(&name))?,
                backend,
            ));
            Edit::put(k, name, vm, true)
        }
        VmCmd::Set {
            name,
            min_mbps,
            max_mbps,
            max_pps,
            ip,
        } => {
            let mut vm = one(view.vms.get(&name), k, &name)?.clone();
            vm.min_mbps = min_mbps.unwrap_or(vm.min_mbps);
            vm.max_mbps = max_mbps.or(vm.max_mbps);
            vm.max_pps = max_pps.or(vm.max_pps);
            vm.ip = ip.unwrap_or(vm.ip);
            if vm.max_mbps.is_some_and(|m| m < vm.min_mbps) {
                bail!(
                    "--max-mbps: below its guarantee (--min-mbps {})",
                    vm.min_mbps
                );
            }
            Edit::put(k, name, vm, false)
        }
        VmCmd::Move { name, host, port } => {
            if !etcd {
                bail!("vm move spans hosts: give --etcd (the cluster), not one switch's --api");
            }
            let mut vm = one(view.vms.get(&name), k, &name)?.clone();
            host_known(host)?;
            if vm.host == host {
                bail!("VM '{name}' is on host {host} already");
            }
            let backend = vm.port.as_ref().map_or(Backend::default(), |p| p.backend);
            let old = vm.port.as_ref().map(|p| p.ifname.clone());
            let new = port.or(old).unwrap_or_else(|| name.clone());
            vm.port = Some(port_entry(ifname(&new)?, backend));
            vm.host = host;
            Edit::put(k, name, vm, false)
        }
        VmCmd::Rm { name } => {
            one(view.vms.get(&name), k, &name)?;
            Edit::rm(k, name)
        }
        VmCmd::Show { name: Some(name) } => show(one(view.vms.get(&name), k, &name)?),
        VmCmd::Show { name: None } => show(view.vms.values().collect::<Vec<_>>()),
    }
}

fn port_entry(ifname: String, backend: Backend) -> PortEntry {
    PortEntry {
        ifname,
        backend,
        socket: None,
        create: false,
        cpus: Vec::new(),
    }
}

fn slo(view: &Cluster, cmd: SloCmd) -> anyhow::Result<Option<Edit>> {
    let k = Kind::Slo;
    match cmd {
        SloCmd::Set {
            tenant,
            min_mbps,
            max_mbps,
            latency_us,
            percentile,
            max_loss,
        } => {
            if !view.tenants.contains_key(&tenant) {
                bail!("no tenant '{tenant}' (picnic ctl tenant add)");
            }
            let mut slo = Slo::default();
            slo.min_bps = min_mbps.unwrap_or(0) * 1_000_000;
            slo.max_bps = max_mbps.map(|m| m * 1_000_000);
            slo.latency_us = latency_us;
            slo.latency_percentile = percentile.unwrap_or(slo.latency_percentile);
            slo.max_loss = max_loss;
            slo.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
            let create = !view.slos.contains_key(&tenant);
            Edit::put(k, tenant, slo, create)
        }
        SloCmd::Rm { tenant } => {
            one(view.slos.get(&tenant), k, &tenant)?;
            Edit::rm(k, tenant)
        }
        SloCmd::Show { tenant: Some(t) } => show(one(view.slos.get(&t), k, &t)?),
        SloCmd::Show { tenant: None } => show(&view.slos),
    }
}

/// How long [`status::wait_for`] polls between reads.
const POLL: Duration = Duration::from_millis(50);

/// Seconds since `t`, for messages.
fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests;
