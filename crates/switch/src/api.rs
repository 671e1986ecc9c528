//! The local control API: JSON over HTTP to list and change tenants, VMs and hosts live,
//! read statistics, and a Prometheus `/metrics` endpoint.
//!
//! | method and path        | what                                                     |
//! |------------------------|----------------------------------------------------------|
//! | GET /stats             | per-VM/tenant counters, queues, rates, port counters     |
//! | GET /metrics           | the same in Prometheus text format, SLO state included   |
//! | GET /slo               | per tenant with an SLO: met/violated, violations, why     |
//! | GET /config            | the running config                                        |
//! | GET /tenants, /vms, /hosts | one section of it                                    |
//! | POST /tenants, /vms, /hosts | add one (JSON body: the config entry)              |
//! | PUT /vms/NAME          | replace a VM entry (e.g. new min/max bandwidth)           |
//! | PUT /tenants/NAME      | replace a tenant entry (VNI, CPU quota, cgroup, SLO)      |
//! | DELETE /tenants/NAME, /vms/NAME, /hosts/ID | remove one                         |
//! | GET /tenants/NAME/key  | an encrypting tenant's key epochs and fingerprints        |
//! | PUT /tenants/NAME/key  | rotate: `{"epoch", "key" (hex), "activate"}` installs a key, |
//! |                        | `{"epoch", "activate": true}` seals with an installed one   |
//!
//! Changes are validated like the config file and applied by the run loop between batches
//! as live changes in place (`crate::change`: only the host, tenant or VM named is
//! touched), then persisted to `switch.state_file` before the reply. Readers load the published
//! snapshot (an `Arc`, swapped without a lock) and serialize it at their own pace.
//!
//! Security (docs/switch.md "Security"): a Unix socket by default, created owner-only and
//! then given `switch.api_socket_mode`; TCP only with a bearer token (`Authorization: Bearer
//! TOKEN`, compared in constant time). Bodies above [`MAX_BODY`] and URLs above [`MAX_URL`]
//! are refused; every bad request gets a 4xx whose message names the field, header or path
//! at fault (`body.min_mbps: invalid type ...`, `config field vms[3].max_mbps: ...`).

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration as StdDuration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tiny_http::{Header, Method, Response, Server};

use crate::config::{
    read_secret, ApiListen, Config, HostEntry, SwitchSection, TenantEntry, VmEntry,
};
use crate::engine::kind_name;
use crate::runner::{Command, Published, Shared};

/// Largest request body accepted, bytes (a config entry is well under 4 KiB).
pub const MAX_BODY: usize = 64 * 1024;
/// Longest request URL accepted, bytes.
pub const MAX_URL: usize = 1024;
/// Shortest bearer token accepted, bytes.
pub const MIN_TOKEN_LEN: usize = 16;

/// The running API server.
pub struct Api {
    /// Where it listens, for messages: `unix:PATH` or `http://ADDR`.
    pub listening: String,
    pub thread: std::thread::JoinHandle<()>,
}

/// What the API needs besides the switch: its bearer token (TCP) and the state file that
/// every change is persisted to.
struct ApiState {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    token: Option<Vec<u8>>,
    state_file: Option<PathBuf>,
}

/// Starts the API server of `switch` (its `api`, `api_socket_mode`, `api_token_file`,
/// `state_file`) in its own thread.
pub fn spawn(
    switch: &SwitchSection,
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
) -> anyhow::Result<Api> {
    let Some(api) = &switch.api else {
        anyhow::bail!("switch.api: not set");
    };
    let listen = ApiListen::parse(api).map_err(|e| anyhow::anyhow!("switch.api: {e}"))?;
    let token = match (&listen, &switch.api_token_file) {
        (ApiListen::Tcp(_), None) => anyhow::bail!("switch.api_token_file: a TCP API needs one"),
        (_, Some(path)) => {
            let token = read_secret(path, "switch.api_token_file")?;
            if token.len() < MIN_TOKEN_LEN {
                anyhow::bail!(
                    "switch.api_token_file: the token has {} bytes; at least {MIN_TOKEN_LEN} are needed",
                    token.len()
                );
            }
            Some(token)
        }
        (ApiListen::Unix(_), None) => None,
    };
    let (server, listening) = match &listen {
        ApiListen::Unix(path) => (
            Server::from_listener(bind_unix(path, switch.api_socket_mode)?, None)
                .map_err(|e| anyhow::anyhow!("switch.api: {e}"))?,
            format!("unix:{}", path.display()),
        ),
        ApiListen::Tcp(addr) => {
            let server = Server::http(addr.as_str())
                .map_err(|e| anyhow::anyhow!("switch.api: cannot listen on {addr}: {e}"))?;
            let bound = server
                .server_addr()
                .to_ip()
                .map_or(addr.clone(), |a| a.to_string());
            (server, format!("http://{bound}"))
        }
    };
    let state = ApiState {
        shared,
        commands,
        token,
        state_file: switch.state_file.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("picnic-api".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                serve(&state, req);
            }
        })?;
    Ok(Api { listening, thread })
}

/// Binds the API's Unix socket at `path` with file mode `mode`: created under a umask that
/// leaves it owner-only, so it is never reachable by others, then set to `mode`. A socket
/// left by a killed switch is replaced; any other file there is an error.
fn bind_unix(path: &Path, mode: u32) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| anyhow::anyhow!("switch.api: cannot replace {}: {e}", path.display()))?,
        Ok(_) => anyhow::bail!("switch.api: {} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("switch.api: cannot create {}: {e}", dir.display()))?;
    }
    // SAFETY: umask only swaps the process's file mode mask; restored right after the bind.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener =
        bound.map_err(|e| anyhow::anyhow!("switch.api: cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| anyhow::anyhow!("switch.api: cannot chmod {}: {e}", path.display()))?;
    Ok(listener)
}

/// Answers one request.
fn serve(state: &ApiState, mut req: tiny_http::Request) {
    let (status, content_type, text) = reply_to(state, &mut req);
    let header = Header::from_bytes("Content-Type", content_type).expect("static header");
    let _ = req.respond(
        Response::from_string(text)
            .with_status_code(status)
            .with_header(header),
    );
}

/// Size limits, then the bearer token (TCP), then the route.
fn reply_to(state: &ApiState, req: &mut tiny_http::Request) -> Reply {
    if req.url().len() > MAX_URL {
        return error(414, format!("url: longer than {MAX_URL} bytes"));
    }
    if let Some(token) = &state.token {
        let presented = req
            .headers()
            .iter()
            .find(|h| h.field.equiv("Authorization"))
            .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
            .map(str::as_bytes);
        if !presented.is_some_and(|p| constant_time_eq(p, token)) {
            return error(
                401,
                "header Authorization: missing or wrong bearer token (`Authorization: Bearer TOKEN`)",
            );
        }
    }
    if req.body_length().is_some_and(|n| n > MAX_BODY) {
        return error(413, format!("body: larger than {MAX_BODY} bytes"));
    }
    let mut body = Vec::new();
    if req
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
        .is_err()
    {
        return error(400, "body: could not be read");
    }
    if body.len() > MAX_BODY {
        return error(413, format!("body: larger than {MAX_BODY} bytes"));
    }
    match String::from_utf8(body) {
        Ok(body) => handle(state, req.method(), req.url(), &body),
        Err(_) => error(400, "body: not UTF-8"),
    }
}

/// Compares without an early exit on the first differing byte (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

type Reply = (u16, &'static str, String);

fn json(status: u16, v: impl serde::Serialize) -> Reply {
    (
        status,
        "application/json",
        serde_json::to_string_pretty(&v).unwrap_or_default(),
    )
}
fn error(status: u16, msg: impl std::fmt::Display) -> Reply {
    json(status, serde_json::json!({ "error": msg.to_string() }))
}

/// Parses a JSON body as `T`; the error names the field that failed (`body.min_mbps: ...`).
fn parse_body<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, String> {
    let de = &mut serde_json::Deserializer::from_str(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "body".to_string()
        } else {
            format!("body.{path}")
        };
        format!("{field}: {}", e.inner())
    })
}

/// A refused change: its status and a message naming the field or path.
type Refusal = (u16, String);

fn not_found(what: String) -> Refusal {
    (404, what)
}

fn handle(state: &ApiState, method: &Method, url: &str, body: &str) -> Reply {
    let path: Vec<&str> = url
        .split('?')
        .next()
        .unwrap_or("")
        .trim_matches('/')
        .split('/')
        .collect();
    let shared = &*state.shared;
    let Some(config) = shared.config() else {
        return error(503, "switch starting");
    };
    let bad = |e: String| (400, e);
    match (method, path.as_slice()) {
        (Method::Get, ["stats"]) => match latest(shared) {
            Some(published) => json(200, &*published),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["slo"]) => match latest(shared) {
            Some(published) => json(200, &published.slo),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["metrics"]) => (
            200,
            "text/plain; version=0.0.4",
            latest(shared).map(|p| metrics(&p)).unwrap_or_default(),
        ),
        (Method::Get, ["config"]) => json(200, &redacted(&config)),
        (Method::Get, ["tenants"]) => json(200, &redacted(&config).tenants),
        (Method::Get, ["vms"]) => json(200, &config.vms),
        (Method::Get, ["hosts"]) => json(200, &config.hosts),
        (Method::Post, ["tenants"]) => change(state, &config, |c| {
            c.tenants
                .push(parse_body::<TenantEntry>(body).map_err(bad)?);
            Ok(())
        }),
        (Method::Post, ["vms"]) => change(state, &config, |c| {
            c.vms.push(parse_body::<VmEntry>(body).map_err(bad)?);
            Ok(())
        }),
        (Method::Post, ["hosts"]) => change(state, &config, |c| {
            c.hosts.push(parse_body::<HostEntry>(body).map_err(bad)?);
            Ok(())
        }),
        (Method::Put, ["vms", name]) => change(state, &config, |c| {
            let vm: VmEntry = parse_body(body).map_err(bad)?;
            if vm.name != *name {
                return Err(bad(format!(
                    "body.name: '{}' differs from the path's VM '{name}' (delete and add to rename)",
                    vm.name
                )));
            }
            let slot = c
                .vms
                .iter_mut()
                .find(|v| v.name == *name)
                .ok_or_else(|| not_found(format!("path: no VM '{name}'")))?;
            *slot = vm;
            Ok(())
        }),
        (Method::Put, ["tenants", name]) => change(state, &config, |c| {
            let tenant: TenantEntry = parse_body(body).map_err(bad)?;
            if tenant.name != *name {
                return Err(bad(format!(
                    "body.name: '{}' differs from the path's tenant '{name}' (delete and add to rename)",
                    tenant.name
                )));
            }
            let slot = c
                .tenants
                .iter_mut()
                .find(|t| t.name == *name)
                .ok_or_else(|| not_found(format!("path: no tenant '{name}'")))?;
            *slot = tenant;
            Ok(())
        }),
        (Method::Delete, ["vms", name]) => change(state, &config, |c| {
            let n = c.vms.len();
            c.vms.retain(|v| v.name != *name);
            if c.vms.len() == n {
                return Err(not_found(format!("path: no VM '{name}'")));
            }
            Ok(())
        }),
        (Method::Get | Method::Put, ["tenants", name, "key"]) => {
            tenant_key(method, name, body, shared)
        }
        (Method::Put, ["tenants", name, "offload"]) => change(state, &config, |c| {
            let entry: crate::offload::OffloadEntry = parse_body(body).map_err(bad)?;
            // A path would have the switch read (and quote in errors) any file it can.
            if entry.program.is_some() {
                return Err(bad(
                    "body.program: the API takes the program's text (wat); files are for the config"
                        .into(),
                ));
            }
            entry
                .validate()
                .map_err(|(field, problem)| bad(format!("body.{field}: {problem}")))?;
            crate::offload::check(&entry).map_err(|e| bad(format!("body: {e:#}")))?;
            tenant_mut(c, name)?.offload = Some(entry);
            Ok(())
        }),
        (Method::Delete, ["tenants", name, "offload"]) => change(state, &config, |c| {
            match tenant_mut(c, name)?.offload.take() {
                Some(_) => Ok(()),
                None => Err(not_found(format!("path: tenant '{name}' has no program"))),
            }
        }),
        (Method::Delete, ["tenants", name]) => change(state, &config, |c| {
            if c.vms.iter().any(|v| v.tenant == *name) {
                return Err((
                    409,
                    format!("path: tenant '{name}' still has VMs; remove them first"),
                ));
            }
            let n = c.tenants.len();
            c.tenants.retain(|t| t.name != *name);
            if c.tenants.len() == n {
                return Err(not_found(format!("path: no tenant '{name}'")));
            }
            Ok(())
        }),
        (Method::Delete, ["hosts", id]) => change(state, &config, |c| {
            let id: u32 = id
                .parse()
                .map_err(|_| bad(format!("path: '{id}' is not a host id")))?;
            let n = c.hosts.len();
            c.hosts.retain(|h| h.id != id);
            if c.hosts.len() == n {
                return Err(not_found(format!("path: no host {id}")));
            }
            Ok(())
        }),
        _ => error(404, format!("path: no route {method} /{}", path.join("/"))),
    }
}

/// The tenant `name` of `c`, to change.
fn tenant_mut<'c>(c: &'c mut Config, name: &str) -> Result<&'c mut TenantEntry, Refusal> {
    c.tenants
        .iter_mut()
        .find(|t| t.name == name)
        .ok_or_else(|| not_found(format!("path: no tenant '{name}'")))
}

/// The latest published snapshot: an `Arc` load, no lock (see [`Shared`]).
/// The config as the API shows it: tenants' keys left out (`key_file` paths stay).
fn redacted(config: &Config) -> Config {
    let mut c = config.clone();
    for t in &mut c.tenants {
        t.key = t.key.as_ref().map(|_| "(redacted)".to_string());
    }
    c
}

/// The body of `PUT /tenants/NAME/key`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyChange {
    epoch: u32,
    /// 32 or 64 hex digits; absent: activate the installed `epoch`.
    key: Option<String>,
    #[serde(default)]
    activate: bool,
}

/// Key rotation without loss (`accel::KeyRing`), applied at once by the engine's key
/// rings (the run loop is not involved) and not persisted: update the config's key too.
/// Keys are never shown, only their fingerprints.
fn tenant_key(method: &Method, name: &str, body: &str, shared: &Shared) -> Reply {
    let Some(keys) = shared.accel_keys() else {
        return error(
            404,
            "path: no tenant encrypts (set encrypt = true and a key)",
        );
    };
    let result = match method {
        Method::Put => parse_body::<KeyChange>(body)
            .map_err(|e| anyhow::anyhow!(e))
            .and_then(|c| match (c.key, c.activate) {
                (Some(hex), activate) => picnic_wire::seal::TunnelKey::from_hex(&hex)
                    .map_err(|e| anyhow::anyhow!("body.key: {e}"))
                    .and_then(|k| keys.install(name, c.epoch, k, activate)),
                (None, true) => keys.activate(name, c.epoch),
                (None, false) => Err(anyhow::anyhow!(
                    "body.key: give a key to install, or \"activate\": true"
                )),
            }),
        _ => Ok(()),
    };
    match result.and_then(|()| keys.describe(name)) {
        Ok(view) => json(200, view),
        Err(e) => error(400, format!("{e:#}")),
    }
}

fn latest(shared: &Shared) -> Option<Arc<Published>> {
    shared.latest()
}

/// Applies `edit` to a copy of the config, validates it, hands it to the run loop and, once
/// applied, persists it to the state file before answering.
fn change(
    state: &ApiState,
    running: &Config,
    edit: impl FnOnce(&mut Config) -> Result<(), Refusal>,
) -> Reply {
    let mut config = running.clone();
    if let Err((status, e)) = edit(&mut config) {
        return error(status, e);
    }
    if let Err(e) = config.validate() {
        return error(400, e);
    }
    let (tx, rx) = mpsc::channel();
    if state
        .commands
        .send(Command::Reconfigure(Box::new(config.clone()), tx))
        .is_err()
    {
        return error(503, "switch is stopping");
    }
    match rx.recv_timeout(StdDuration::from_secs(5)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return error(400, format!("{e:#}")),
        Err(_) => return error(504, "the switch did not apply the change in time"),
    }
    if let Some(path) = &state.state_file {
        if let Err(e) = crate::persist::save(path, &config) {
            return error(
                500,
                format!("applied, but not persisted to switch.state_file: {e:#}"),
            );
        }
    }
    json(200, serde_json::json!({ "ok": true }))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VmLabels {
    tenant: String,
    vm: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    tenant: String,
    vm: String,
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortRegimeLabels {
    port: String,
    regime: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortDecisionLabels {
    port: String,
    decision: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantKindLabels {
    tenant: String,
    kind: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantReasonLabels {
    tenant: String,
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantQueueLabels {
    tenant: String,
    queue: String,
}

/// Renders a published snapshot in the Prometheus text format.
fn metrics(published: &Published) -> String {
    let snap = &published.switch;
    let mut reg = Registry::with_prefix("picnic");
    let counter = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<VmLabels, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let rx_packets = counter(&mut reg, "vm_rx_packets", "Frames delivered to the VM");
    let rx_bytes = counter(&mut reg, "vm_rx_bytes", "Bytes delivered to the VM");
    let tx_packets = counter(
        &mut reg,
        "vm_tx_packets",
        "Frames the VM sent into the switch",
    );
    let tx_bytes = counter(&mut reg, "vm_tx_bytes", "Bytes the VM sent into the switch");
    let cost = counter(
        &mut reg,
        "vm_processing_ns",
        "Ingress processing CPU spent for the VM, ns",
    );
    let drops = Family::<DropLabels, Counter>::default();
    reg.register(
        "vm_drops",
        "Frames from or to the VM dropped, by reason",
        drops.clone(),
    );
    let queue = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_queue_depth",
        "Frames queued for the VM (egress + ingress)",
        queue.clone(),
    );
    let advertised = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_advertised_rate_bps",
        "Rate advertised to the VM's senders (EyeQ R_i)",
        advertised.clone(),
    );
    let applied = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_applied_limit_bps",
        "Sum of feedback-set limits applied to the VM's traffic",
        applied.clone(),
    );
    let pool_free = Gauge::<i64>::default();
    reg.register(
        "pool_free_frames",
        "Free frames in the preallocated pool (the rest are queued)",
        pool_free.clone(),
    );
    pool_free.set(published.pool_free as i64);
    let tenant_cost = Family::<TenantLabels, Counter>::default();
    reg.register(
        "tenant_cpu_charged_ns",
        "Processing CPU charged to the tenant (Iron)",
        tenant_cost.clone(),
    );
    let softirq = Family::<TenantLabels, Counter>::default();
    reg.register(
        "tenant_softirq_ns",
        "Kernel softirq time on the tenant's ports charged to it (eBPF)",
        softirq.clone(),
    );
    let throttled = Family::<TenantLabels, Counter>::default();
    reg.register(
        "tenant_cpu_throttle_drops",
        "Frames dropped because the tenant was over its CPU quota",
        throttled.clone(),
    );
    let sw_drops = Family::<ReasonLabels, Counter>::default();
    reg.register(
        "switch_drops",
        "Frames not attributable to a VM dropped, by reason",
        sw_drops.clone(),
    );
    for vm in &snap.vms {
        let l = VmLabels {
            tenant: vm.tenant.clone(),
            vm: vm.name.clone(),
        };
        rx_packets.get_or_create(&l).inc_by(vm.counters.rx_packets);
        rx_bytes.get_or_create(&l).inc_by(vm.counters.rx_bytes);
        tx_packets.get_or_create(&l).inc_by(vm.counters.tx_packets);
        tx_bytes.get_or_create(&l).inc_by(vm.counters.tx_bytes);
        cost.get_or_create(&l).inc_by(vm.counters.cost_ns);
        queue
            .get_or_create(&l)
            .set((vm.egress_queue + vm.ingress_queue) as i64);
        advertised
            .get_or_create(&l)
            .set(vm.advertised_bps.unwrap_or(0) as i64);
        applied
            .get_or_create(&l)
            .set(vm.applied_limits.iter().map(|(_, r)| *r).sum::<u64>() as i64);
        for (reason, n) in vm.counters.drops.iter() {
            drops
                .get_or_create(&DropLabels {
                    tenant: l.tenant.clone(),
                    vm: l.vm.clone(),
                    reason: reason.as_str().into(),
                })
                .inc_by(n);
        }
    }
    for t in &snap.tenants {
        let l = TenantLabels {
            tenant: t.name.clone(),
        };
        tenant_cost.get_or_create(&l).inc_by(t.cpu_charged_ns);
        softirq.get_or_create(&l).inc_by(t.softirq_ns);
        throttled.get_or_create(&l).inc_by(t.cpu_throttle_drops);
    }
    let vm_worker = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_worker",
        "The dataplane worker that owns the VM's port",
        vm_worker.clone(),
    );
    for vm in &snap.vms {
        let l = VmLabels {
            tenant: vm.tenant.clone(),
            vm: vm.name.clone(),
        };
        vm_worker.get_or_create(&l).set(vm.worker as i64);
    }
    let worker_cpu = Family::<WorkerLabels, Counter>::default();
    reg.register(
        "worker_cpu_ns",
        "CPU time of each dataplane worker's thread, ns",
        worker_cpu.clone(),
    );
    let handoff = Family::<WorkerLabels, Counter>::default();
    reg.register(
        "worker_handoff_frames",
        "Frames each worker handed to another (uplink frames for its VMs, frames for its ports, feedback copies)",
        handoff.clone(),
    );
    for w in &published.workers {
        let l = WorkerLabels {
            worker: w.worker.to_string(),
        };
        worker_cpu.get_or_create(&l).inc_by(w.cpu_ns);
        handoff.get_or_create(&l).inc_by(w.handoff.out);
    }
    for (reason, n) in snap.switch.drops.iter() {
        sw_drops
            .get_or_create(&ReasonLabels {
                reason: reason.as_str().into(),
            })
            .inc_by(n);
    }
    let fb_rejected = Family::<ReasonLabels, Counter>::default();
    reg.register(
        "feedback_rejected",
        "Congestion feedback refused before it was applied, by reason",
        fb_rejected.clone(),
    );
    for (reason, n) in snap.switch.feedback_rejected.iter() {
        fb_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc_by(n);
    }
    let regimes = Family::<PortRegimeLabels, Gauge>::default();
    reg.register(
        "port_wait_regime",
        "Rizzo et al. regime of each receive ring (1 for the current one; GP while spinning)",
        regimes.clone(),
    );
    let decisions = Family::<PortDecisionLabels, Counter>::default();
    reg.register(
        "port_wait_decisions",
        "Idle passes on which each receive ring's adaptive wait chose to spin or to block",
        decisions.clone(),
    );
    for port in &published.ports {
        if let Some(regime) = &port.wait_regime {
            regimes
                .get_or_create(&PortRegimeLabels {
                    port: port.name.clone(),
                    regime: regime.clone(),
                })
                .set(1);
        }
        for (decision, n) in [("spin", port.wait_spins), ("block", port.wait_blocks)] {
            decisions
                .get_or_create(&PortDecisionLabels {
                    port: port.name.clone(),
                    decision: decision.into(),
                })
                .inc_by(n);
        }
    }
    slo_metrics(&mut reg, published);
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

/// Per tenant with an SLO: whether it is met, violations by kind, and the why breakdown.
fn slo_metrics(reg: &mut Registry, published: &Published) {
    let met = Family::<TenantLabels, Gauge>::default();
    reg.register(
        "tenant_slo_met",
        "1 when the tenant's last judged SLO window met every bound, else 0",
        met.clone(),
    );
    let violated = Family::<TenantKindLabels, Gauge>::default();
    reg.register(
        "tenant_slo_violated",
        "1 while a bound of the tenant's SLO is in violation, by kind",
        violated.clone(),
    );
    let violations = Family::<TenantKindLabels, Counter>::default();
    reg.register(
        "tenant_slo_violations",
        "Violation intervals of the tenant's SLO started, by kind",
        violations.clone(),
    );
    let drops = Family::<TenantReasonLabels, Counter>::default();
    reg.register(
        "tenant_drops",
        "Frames of a tenant with an SLO dropped, by reason, over its VMs",
        drops.clone(),
    );
    let waited = Family::<TenantQueueLabels, Counter>::default();
    reg.register(
        "tenant_waited_frames",
        "Frames of a tenant with an SLO that went through a shaped class or limiter queue",
        waited.clone(),
    );
    let late = Family::<TenantQueueLabels, Counter>::default();
    reg.register(
        "tenant_late_frames",
        "Frames delivered later than the tenant's latency_us, by where they waited",
        late.clone(),
    );
    for t in &published.slo.tenants {
        let tenant = || t.tenant.clone();
        met.get_or_create(&TenantLabels { tenant: tenant() })
            .set(i64::from(t.met));
        for kind in picnic_core::slo::ViolationKind::ALL {
            let l = TenantKindLabels {
                tenant: tenant(),
                kind: kind_name(kind).into(),
            };
            violated
                .get_or_create(&l)
                .set(i64::from(t.violated.contains(kind)));
            violations.get_or_create(&l).inc_by(
                t.violations_total
                    .get(kind_name(kind))
                    .copied()
                    .unwrap_or(0),
            );
        }
        for (reason, n) in t.why.drops.iter().filter(|(_, n)| *n > 0) {
            drops
                .get_or_create(&TenantReasonLabels {
                    tenant: tenant(),
                    reason: reason.as_str().into(),
                })
                .inc_by(n);
        }
        let queue = |q: &str| TenantQueueLabels {
            tenant: tenant(),
            queue: q.into(),
        };
        waited
            .get_or_create(&queue("shaped_class"))
            .inc_by(t.why.waited_shaped_class);
        waited
            .get_or_create(&queue("limiter"))
            .inc_by(t.why.waited_limiter);
        if let Some(l) = &t.why.late {
            for (q, n) in [
                ("ingress_queue", l.ingress_queue),
                ("egress_queue", l.egress_queue),
                ("shaped_class", l.shaped_class),
                ("limiter", l.limiter),
            ] {
                late.get_or_create(&queue(q)).inc_by(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use etherparse::PacketBuilder;
    use picnic_core::{Duration, Instant};

    use super::*;
    use crate::engine::{Engine, Work};
    use crate::frame::{Frame, FramePool};

    struct NoWork;
    impl Work for NoWork {
        fn process(&mut self, _tenant: usize, _frame: &mut Frame) -> u64 {
            0
        }
    }

    fn udp(src: ([u8; 6], [u8; 4]), dst: ([u8; 6], [u8; 4])) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2(src.0, dst.0)
            .ipv4(src.1, dst.1, 64)
            .udp(40000, 7)
            .write(&mut out, &[0u8; 100])
            .unwrap();
        out
    }

    /// The shipped example (blue and red hold SLOs) after 300 ms in which blue1 sent only
    /// spoofed frames and red1 a steady flow to red2.
    fn shared() -> Shared {
        let cfg = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        let mut engine = Engine::new(&cfg, Instant::ZERO).unwrap();
        let mut pool = FramePool::new(1024);
        let blue1 = ([2, 0, 0, 0, 0, 1], [198, 18, 0, 1]);
        let red1 = ([2, 0, 0, 0, 0, 2], [198, 18, 0, 2]);
        let spoofed = udp(
            (blue1.0, [10, 0, 0, 9]),
            ([2, 0, 0, 0, 0, 3], [198, 18, 0, 3]),
        );
        let to_red2 = udp(red1, ([2, 0, 0, 0, 0, 4], [198, 18, 0, 4]));
        for ms in 0..300 {
            let now = Instant::ZERO + Duration::from_millis(ms);
            for (port, bytes) in [(1, &spoofed), (2, &to_red2)] {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(bytes));
                engine.on_frames(now, port, &mut vec![f], &mut pool);
            }
            engine.poll(now, 64, &mut NoWork, &mut pool);
            for f in engine.tx_queue(0).drain(..) {
                pool.put(f);
            }
        }
        let now = Instant::ZERO + Duration::from_millis(300);
        let shared = Shared::default();
        shared.set_config(cfg);
        shared.publish(Published {
            switch: engine.snapshot(),
            ports: Vec::new(),
            pool_free: pool.available(),
            pool_capacity: pool.capacity(),
            accel: None,
            workers: Vec::new(),
            slo: engine.slo_report(now),
        });
        shared
    }

    /// The API's state over `shared`, with a stand-in for the run loop that applies every
    /// change (publishes the new config) and says so.
    fn api_state(shared: Shared, state_file: Option<PathBuf>) -> ApiState {
        let shared = Arc::new(shared);
        let (commands, rx) = mpsc::channel::<Command>();
        let applied = shared.clone();
        std::thread::spawn(move || {
            for Command::Reconfigure(cfg, reply) in rx {
                applied.set_config(*cfg);
                let _ = reply.send(Ok(()));
            }
        });
        ApiState {
            shared,
            commands,
            token: None,
            state_file,
        }
    }

    fn get(shared: &Shared, url: &str) -> Reply {
        let state = api_state(Shared::default(), None);
        state.shared.set_config((*shared.config().unwrap()).clone());
        if let Some(p) = shared.latest() {
            state.shared.publish((*p).clone());
        }
        handle(&state, &Method::Get, url, "")
    }

    #[test]
    fn get_slo_shows_each_tenants_state_violations_and_why() {
        let shared = shared();
        let (status, _, body) = get(&shared, "/slo");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["window_ms"], 100);
        let blue = &v["tenants"][0];
        assert_eq!(blue["tenant"], "blue");
        assert_eq!(blue["met"], false);
        assert_eq!(blue["violated"], serde_json::json!(["loss"]));
        assert_eq!(blue["open_violations"][0]["kind"], "loss");
        assert_eq!(blue["open_violations"][0]["started_at"], 0);
        assert_eq!(
            blue["open_violations"][0]["ended_at"],
            serde_json::Value::Null
        );
        assert_eq!(blue["violations_total"]["loss"], 1);
        assert_eq!(blue["why"]["drops"]["spoofed"], 300);
        assert_eq!(blue["totals"]["lost_packets"], 300);
        assert_eq!(blue["slo"]["latency_percentile"], 99.9);
        let red = &v["tenants"][1];
        assert_eq!(
            (red["tenant"].as_str(), red["met"].as_bool()),
            (Some("red"), Some(true))
        );
        assert_eq!(red["violated"], serde_json::json!([]));
        assert_eq!(red["totals"]["delivered_packets"], 300);
        assert_eq!(red["window"]["start_ns"], 300_000_000);

        // /stats is unchanged by it.
        let (status, _, stats) = get(&shared, "/stats");
        assert_eq!(status, 200);
        assert!(!serde_json::from_str::<serde_json::Value>(&stats).unwrap()["slo"].is_object());
    }

    /// A writer that blocks (a scrape whose client reads slowly) until told to go on.
    struct StalledClient {
        started: mpsc::Sender<()>,
        go_on: mpsc::Receiver<()>,
        stalled: bool,
    }
    impl std::io::Write for StalledClient {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.stalled {
                self.stalled = true;
                let _ = self.started.send(());
                let _ = self.go_on.recv();
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_scrape_does_not_hold_up_the_dataplanes_publish() {
        let shared = Arc::new(shared());
        let (started_tx, started) = mpsc::channel();
        let (go_on, go_on_rx) = mpsc::channel();
        // A scrape that took the snapshot and is stuck serializing it to its client.
        let scrape = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let snapshot = latest(&shared).unwrap();
                let client = StalledClient {
                    started: started_tx,
                    go_on: go_on_rx,
                    stalled: false,
                };
                serde_json::to_writer(client, &*snapshot).unwrap();
                snapshot.switch.host_id
            })
        };
        started.recv().unwrap();
        // Meanwhile the dataplane publishes, from another thread, without waiting for it.
        let (done_tx, done) = mpsc::channel();
        let publisher = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut next = (*shared.latest().unwrap()).clone();
                next.switch.host_id = 42;
                shared.publish(next);
                done_tx.send(()).unwrap();
            })
        };
        // Generous: a publish that waited for the scrape would never finish, it is held.
        assert!(
            done.recv_timeout(StdDuration::from_secs(30)).is_ok(),
            "publish blocked behind a held scrape"
        );
        publisher.join().unwrap();
        assert_eq!(latest(&shared).unwrap().switch.host_id, 42);
        go_on.send(()).unwrap();
        // The scrape finished with the snapshot it started with.
        assert_eq!(scrape.join().unwrap(), 1);
    }

    #[test]
    fn metrics_carry_the_slo_state_per_tenant() {
        let (status, _, text) = get(&shared(), "/metrics");
        assert_eq!(status, 200);
        for line in [
            "picnic_tenant_slo_met{tenant=\"blue\"} 0",
            "picnic_tenant_slo_met{tenant=\"red\"} 1",
            "picnic_tenant_slo_violated{tenant=\"blue\",kind=\"loss\"} 1",
            "picnic_tenant_slo_violations_total{tenant=\"blue\",kind=\"loss\"} 1",
            "picnic_tenant_slo_violations_total{tenant=\"red\",kind=\"loss\"} 0",
            "picnic_tenant_drops_total{tenant=\"blue\",reason=\"spoofed\"} 300",
            "picnic_tenant_waited_frames_total{tenant=\"red\",queue=\"limiter\"} 0",
            "picnic_tenant_late_frames_total{tenant=\"red\",queue=\"egress_queue\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn a_tenant_with_a_bad_slo_is_refused_naming_the_field() {
        let body = r#"{"name": "green", "vni": 300, "slo": {"min_bps": 10, "max_loss": 2.0}}"#;
        let state = api_state(shared(), None);
        let (status, _, text) = handle(&state, &Method::Post, "/tenants", body);
        assert_eq!(status, 400);
        assert!(text.contains("max_loss must be a fraction"), "{text}");
    }

    #[test]
    fn an_offload_program_is_attached_checked_and_detached() {
        let state = api_state(shared(), None);
        let name = state.shared.config().unwrap().tenants[0].name.clone();
        let url = format!("/tenants/{name}/offload");
        let put = |body: &str| handle(&state, &Method::Put, &url, body);
        let acl = include_str!("../../../examples/offload/acl.wat");
        let body = serde_json::json!({ "wat": acl, "fuel_per_packet": 5000 }).to_string();
        let (status, _, text) = put(&body);
        assert_eq!(status, 200, "{text}");
        let entry = state.shared.config().unwrap().tenants[0]
            .offload
            .clone()
            .unwrap();
        assert_eq!((entry.fuel_per_packet, entry.memory_kib), (5000, 1024));
        for (body, field) in [
            (r#"{"program": "/etc/passwd"}"#, "body.program"),
            (r#"{"wat": "(module)"}"#, "neither `egress` nor `ingress`"),
            (r#"{"wat": "(module", "memory_kib": 1}"#, "body: program"),
            (
                r#"{"wat": "(module)", "fuel_per_packet": 0}"#,
                "body.fuel_per_packet",
            ),
        ] {
            let (status, _, text) = put(body);
            assert_eq!(status, 400, "{body}: {text}");
            assert!(text.contains(field), "{body}: {text}");
        }
        let delete = || handle(&state, &Method::Delete, &url, "");
        assert_eq!(delete().0, 200);
        assert!(state.shared.config().unwrap().tenants[0].offload.is_none());
        assert_eq!(delete().0, 404);
        let (status, _, _) = handle(&state, &Method::Put, "/tenants/nobody/offload", &body);
        assert_eq!(status, 404);
    }

    /// A VM entry for the example's tenant blue on host 2, as JSON with `extra` fields.
    fn vm_json(extra: &str) -> String {
        format!(
            r#"{{"name": "blue9", "id": 9, "tenant": "blue", "host": 2, "mac": "02:00:00:00:00:09", "ip": "198.18.0.9"{extra}}}"#
        )
    }

    #[test]
    fn every_bad_request_is_a_4xx_naming_the_field() {
        let state = api_state(shared(), None);
        let cases: [(Method, &str, String, u16, &str); 13] = [
            (
                Method::Post,
                "/vms",
                vm_json(r#", "min_mbps": "fast""#),
                400,
                "body.min_mbps",
            ),
            (
                Method::Post,
                "/vms",
                vm_json(r#", "colour": 1"#),
                400,
                "colour",
            ),
            (
                Method::Post,
                "/vms",
                r#"{"name": "x"}"#.into(),
                400,
                "missing field `id`",
            ),
            (
                Method::Post,
                "/vms",
                vm_json("").replace("02:00:00:00:00:09", "zz"),
                400,
                "body.mac",
            ),
            (Method::Post, "/vms", "[1, 2".into(), 400, "body"),
            (
                Method::Post,
                "/vms",
                vm_json("").replace("\"id\": 9", "\"id\": 1"),
                400,
                "vms[4].id",
            ),
            (Method::Put, "/vms/nobody", vm_json(""), 400, "body.name"),
            (
                Method::Put,
                "/vms/blue9",
                vm_json(""),
                404,
                "path: no VM 'blue9'",
            ),
            (
                Method::Put,
                "/tenants/blue",
                r#"{"name": "red", "vni": 7}"#.into(),
                400,
                "body.name",
            ),
            (
                Method::Put,
                "/tenants/green",
                r#"{"name": "green", "vni": 7}"#.into(),
                404,
                "path: no tenant 'green'",
            ),
            (
                Method::Delete,
                "/tenants/blue",
                String::new(),
                409,
                "path: tenant 'blue'",
            ),
            (
                Method::Delete,
                "/hosts/two",
                String::new(),
                400,
                "path: 'two'",
            ),
            (
                Method::Patch,
                "/vms",
                String::new(),
                404,
                "path: no route PATCH /vms",
            ),
        ];
        for (method, url, body, status, names) in cases {
            let (got, _, text) = handle(&state, &method, url, &body);
            assert_eq!(got, status, "{method} {url} {body}: {text}");
            assert!(
                text.contains(names),
                "{method} {url}: '{text}' should name '{names}'"
            );
        }
        // Nothing was applied; a good request still is.
        assert_eq!(state.shared.config().unwrap().vms.len(), 4);
        let (status, _, text) = handle(&state, &Method::Post, "/vms", &vm_json(""));
        assert_eq!(status, 200, "{text}");
        assert_eq!(state.shared.config().unwrap().vms.len(), 5);
    }

    #[test]
    fn every_applied_change_is_persisted_before_the_reply() {
        let dir = std::env::temp_dir().join(format!("picnic-api-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let _ = std::fs::remove_file(&path);
        let state = api_state(shared(), Some(path.clone()));
        let (status, _, _) = handle(&state, &Method::Post, "/vms", &vm_json(""));
        assert_eq!(status, 200);
        let (status, _, _) = handle(&state, &Method::Delete, "/vms/red2", "");
        assert_eq!(status, 200);
        // A refused change leaves the file alone.
        let (status, _, _) = handle(&state, &Method::Delete, "/vms/red2", "");
        assert_eq!(status, 404);
        let file_cfg = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        let restored = crate::persist::restore(file_cfg, &path).unwrap();
        let names: Vec<&str> = restored.vms.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["blue1", "red1", "blue2", "blue9"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Sends one raw HTTP/1.1 request on `stream`; returns (status, body).
    fn http<S: std::io::Read + std::io::Write>(
        mut stream: S,
        request_line: &str,
        headers: &str,
        body: &[u8],
    ) -> (u16, String) {
        let head = format!(
            "{request_line} HTTP/1.1\r\nHost: picnic\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        let _ = stream.write_all(body);
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    fn section(api: &str, token_file: Option<&Path>) -> SwitchSection {
        let mut cfg = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        cfg.switch.api = Some(api.into());
        cfg.switch.api_token_file = token_file.map(Path::to_path_buf);
        cfg.switch
    }

    #[test]
    fn the_unix_socket_is_owner_only_and_bodies_are_bounded() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::net::UnixStream;
        let dir = std::env::temp_dir().join(format!("picnic-api-unix-{}", std::process::id()));
        let path = dir.join("api.sock");
        // A socket left behind by a killed switch is replaced.
        std::fs::create_dir_all(&dir).unwrap();
        drop(UnixListener::bind(&path).unwrap());
        let state = api_state(shared(), None);
        let api = spawn(
            &section(path.to_str().unwrap(), None),
            state.shared.clone(),
            state.commands.clone(),
        )
        .unwrap();
        assert_eq!(api.listening, format!("unix:{}", path.display()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let connect = || UnixStream::connect(&path).unwrap();
        let (status, body) = http(connect(), "GET /stats", "", b"");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"host_id\": 1"));
        let big = vec![b' '; MAX_BODY + 1];
        let (status, body) = http(connect(), "POST /vms", "", &big);
        assert_eq!(status, 413);
        assert!(body.contains("body: larger than 65536 bytes"), "{body}");
        let (status, body) = http(connect(), "POST /vms", "", &[0xff, 0xfe]);
        assert_eq!(
            (status, body.contains("body: not UTF-8")),
            (400, true),
            "{body}"
        );
        let long = format!("GET /{}", "x".repeat(MAX_URL));
        assert_eq!(http(connect(), &long, "", b"").0, 414);
        // Anything but a socket at the path is left alone and refused.
        let file = dir.join("not-a-socket");
        std::fs::write(&file, "keep").unwrap();
        let e = spawn(
            &section(file.to_str().unwrap(), None),
            state.shared.clone(),
            state.commands.clone(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("switch.api") && e.contains("not a socket"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tcp_needs_the_bearer_token() {
        use std::net::TcpStream;
        let dir = std::env::temp_dir().join(format!("picnic-api-tcp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "s3cret-token-0123456789\n").unwrap();
        // Without a token file: refused, by validation and by spawn.
        let mut cfg = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        cfg.switch.api = Some("tcp:127.0.0.1:0".into());
        assert_eq!(cfg.validate().unwrap_err().field, "switch.api_token_file");
        let state = api_state(shared(), None);
        assert!(spawn(&cfg.switch, state.shared.clone(), state.commands.clone()).is_err());
        std::fs::write(dir.join("short"), "abc").unwrap();
        let e = spawn(
            &section("tcp:127.0.0.1:0", Some(&dir.join("short"))),
            state.shared.clone(),
            state.commands.clone(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("switch.api_token_file"), "{e}");
        let api = spawn(
            &section("tcp:127.0.0.1:0", Some(&token_file)),
            state.shared.clone(),
            state.commands.clone(),
        )
        .unwrap();
        let addr = api.listening.strip_prefix("http://").unwrap().to_string();
        let connect = || TcpStream::connect(&addr).unwrap();
        for headers in [
            "",
            "Authorization: Bearer wrong-token-0123456789\r\n",
            "Authorization: s3cret-token-0123456789\r\n",
        ] {
            let (status, body) = http(connect(), "GET /config", headers, b"");
            assert_eq!(status, 401, "{headers}: {body}");
            assert!(body.contains("header Authorization"), "{body}");
        }
        let (status, body) = http(
            connect(),
            "GET /config",
            "Authorization: Bearer s3cret-token-0123456789\r\n",
            b"",
        );
        assert_eq!(status, 200, "{body}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_rotation_installs_then_activates_and_never_shows_a_key() {
        let mut cfg = (*shared().config().unwrap()).clone();
        let t = &mut cfg.tenants[0];
        let name = t.name.clone();
        t.encrypt = true;
        t.key = Some("00112233445566778899aabbccddeeff".into());
        cfg.accel.workers = 1;
        cfg.accel.per_job_ns = Some(400);
        cfg.accel.per_byte_ps = Some(1000);
        let accel = crate::accel::Accel::from_config(&cfg).unwrap().unwrap();
        let state = api_state(Shared::default(), None);
        state.shared.set_config(cfg);
        state.shared.set_accel_keys(Some(accel.keys()));
        let url = format!("/tenants/{name}/key");
        let put = |body: &str| handle(&state, &Method::Put, &url, body);
        let new_key = "ffeeddccbbaa99887766554433221100";
        let (status, _, body) = put(&format!(r#"{{"epoch": 2, "key": "{new_key}"}}"#));
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["sending_epoch"], 1, "installed, not yet sealing: {v}");
        assert_eq!(v["keys"].as_array().unwrap().len(), 2);
        let (status, _, body) = put(r#"{"epoch": 2, "activate": true}"#);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["sending_epoch"], 2, "{v}");
        assert!(!body.contains(new_key), "a key is shown: {body}");
        // Refusals name what is wrong.
        for (body, want) in [
            (r#"{"epoch": 3, "key": "zz"}"#, "body.key"),
            (r#"{"epoch": 3}"#, "body.key"),
            (
                r#"{"epoch": 2, "key": "00000000000000000000000000000000"}"#,
                "epoch 2 is in use",
            ),
            (r#"{"epoch": 9, "activate": true}"#, "no key of epoch 9"),
        ] {
            let (status, _, text) = put(body);
            assert_eq!(status, 400, "{body}: {text}");
            assert!(text.contains(want), "{body}: {text}");
        }
        let (status, _, text) = handle(&state, &Method::Get, "/tenants/nobody/key", "");
        assert_eq!(status, 400, "{text}");
        let (_, _, config) = handle(&state, &Method::Get, "/config", "");
        assert!(
            config.contains("(redacted)") && !config.contains("00112233"),
            "{config}"
        );
    }
}
