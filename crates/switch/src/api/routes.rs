//! The routes: one handler per resource (stats, SLO, metrics, config sections, tenants,
//! VMs, hosts, a tenant's key and offload program), each change applied through the run loop.

use std::sync::{mpsc, Arc};
use std::time::Duration as StdDuration;

use tiny_http::Method;
use tracing::{info, warn};

use super::metrics::{metrics, Format};
use super::{error, json, parse_body, ApiState, Reply};
use crate::change::Change;
use crate::config::{Config, HostEntry, TenantEntry, VmEntry};
use crate::runner::{Command, CommandSender, Reconfigure, Shared};

/// A refused change: its status and a message naming the field or path.
type Refusal = (u16, String);

fn not_found(what: String) -> Refusal {
    (404, what)
}

/// Where a request came from, for the log of changes: the listener and the peer's
/// address when it has one, and its `User-Agent`.
pub(super) struct Origin {
    pub from: String,
    pub agent: String,
}

/// As [`route`], answering `/metrics` in the classic format.
#[cfg(test)]
pub(super) fn handle(state: &ApiState, method: &Method, url: &str, body: &str) -> Reply {
    let origin = Origin {
        from: "test".into(),
        agent: "-".into(),
    };
    route(state, method, url, body, Format::Classic, &origin)
}

/// Answers one request; `/metrics` in `format`.
pub(super) fn route(
    state: &ApiState,
    method: &Method,
    url: &str,
    body: &str,
    format: Format,
    origin: &Origin,
) -> Reply {
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
    let request = Request {
        line: format!("{method} /{}", path.join("/")),
        origin,
    };
    match (method, path.as_slice()) {
        (Method::Get, ["stats"]) => match shared.latest() {
            Some(published) => json(200, &*published),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["slo"]) => match shared.latest() {
            Some(published) => json(200, &published.slo),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["metrics"]) => match shared.latest() {
            Some(published) => (200, format.content_type(), metrics(&published, format)),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["config"]) => json(200, redacted(&config)),
        (Method::Get, ["tenants"]) => json(200, &redacted(&config).tenants),
        (Method::Get, ["vms"]) => json(200, &config.vms),
        (Method::Get, ["hosts"]) => json(200, &config.hosts),
        (Method::Post, ["tenants"]) => change(state, &config, &request, |c| {
            c.tenants
                .push(parse_body::<TenantEntry>(body).map_err(bad)?);
            Ok(())
        }),
        (Method::Post, ["vms"]) => change(state, &config, &request, |c| {
            c.vms.push(parse_body::<VmEntry>(body).map_err(bad)?);
            Ok(())
        }),
        (Method::Post, ["hosts"]) => change(state, &config, &request, |c| {
            c.hosts.push(parse_body::<HostEntry>(body).map_err(bad)?);
            Ok(())
        }),
        (Method::Put, ["vms", name]) => change(state, &config, &request, |c| {
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
        (Method::Put, ["hosts", id]) => change(state, &config, &request, |c| {
            let host: HostEntry = parse_body(body).map_err(bad)?;
            if id.parse() != Ok(host.id) {
                return Err(bad(format!(
                    "body.id: {} differs from the path's host '{id}'",
                    host.id
                )));
            }
            let slot = c
                .hosts
                .iter_mut()
                .find(|h| h.id == host.id)
                .ok_or_else(|| not_found(format!("path: no host {id}")))?;
            *slot = host;
            Ok(())
        }),
        (Method::Put, ["tenants", name]) => change(state, &config, &request, |c| {
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
        (Method::Delete, ["vms", name]) => change(state, &config, &request, |c| {
            let n = c.vms.len();
            c.vms.retain(|v| v.name != *name);
            if c.vms.len() == n {
                return Err(not_found(format!("path: no VM '{name}'")));
            }
            Ok(())
        }),
        (Method::Get | Method::Put, ["tenants", name, "key"]) => {
            tenant_key(method, name, body, shared, &request)
        }
        (Method::Put, ["tenants", name, "offload"]) => change(state, &config, &request, |c| {
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
        (Method::Delete, ["tenants", name, "offload"]) => change(state, &config, &request, |c| {
            match tenant_mut(c, name)?.offload.take() {
                Some(_) => Ok(()),
                None => Err(not_found(format!("path: tenant '{name}' has no program"))),
            }
        }),
        (Method::Delete, ["tenants", name]) => change(state, &config, &request, |c| {
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
        (Method::Delete, ["hosts", id]) => change(state, &config, &request, |c| {
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

/// The config as the API shows it: tenants' and feedback keys left out (`key_file` paths
/// stay; feedback keys show their epochs and fingerprints).
fn redacted(config: &Config) -> Config {
    let mut c = config.clone();
    for t in &mut c.tenants {
        t.key = t.key.as_ref().map(|_| "(redacted)".to_string());
    }
    c.feedback_keys = c.feedback_keys.as_ref().map(|k| k.redacted());
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
fn tenant_key(method: &Method, name: &str, body: &str, shared: &Shared, req: &Request) -> Reply {
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
    if *method == Method::Put {
        let (from, agent) = (&req.origin.from, &req.origin.agent);
        match &result {
            Ok(()) => info!(%from, %agent, request = %req.line, "key change applied"),
            Err(e) => {
                warn!(%from, %agent, request = %req.line, error = %format!("{e:#}"), "key change refused")
            }
        }
    }
    match result.and_then(|()| keys.describe(name)) {
        Ok(view) => json(200, view),
        Err(e) => error(400, format!("{e:#}")),
    }
}

/// A change's request line and origin, for the log.
struct Request<'a> {
    line: String,
    origin: &'a Origin,
}

/// Applies `edit` to a copy of the config, validates it, hands it to the run loop and, once
/// applied, persists it to the state file before answering. Logs what changed and from
/// where, or why it was refused.
fn change(
    state: &ApiState,
    running: &Arc<Config>,
    req: &Request,
    edit: impl FnOnce(&mut Config) -> Result<(), Refusal>,
) -> Reply {
    let (from, agent) = (&req.origin.from, &req.origin.agent);
    let reply = apply(state, running, edit);
    match reply {
        Ok((reply, changes)) => {
            info!(%from, %agent, request = %req.line, %changes, status = reply.0, "live change applied");
            reply
        }
        Err((status, e)) => {
            warn!(%from, %agent, request = %req.line, status, error = %e, "live change refused");
            error(status, e)
        }
    }
}

/// What a change did, one clause per host, tenant or VM (keys left out).
fn describe(changes: &[Change]) -> String {
    let entry = |v: serde_json::Result<String>| v.unwrap_or_default();
    let tenant = |t: &TenantEntry| {
        let mut t = t.clone();
        t.key = t.key.as_ref().map(|_| "(redacted)".to_string());
        entry(serde_json::to_string(&t))
    };
    let clauses: Vec<String> = changes
        .iter()
        .map(|c| match c {
            Change::SetHost(h) => format!("set host {}", entry(serde_json::to_string(h))),
            Change::RemoveHost(id) => format!("remove host {id}"),
            Change::AddTenant(t) => format!("add tenant {}", tenant(t)),
            Change::SetTenant(t) => format!("set tenant {}", tenant(t)),
            Change::RemoveTenant(name) => format!("remove tenant {name}"),
            Change::AddVm(v) => format!("add vm {}", entry(serde_json::to_string(v))),
            Change::SetVm(v) => format!("set vm {}", entry(serde_json::to_string(v))),
            Change::RemoveVm(name) => format!("remove vm {name}"),
            Change::SetFeedbackKeys(_) => c.to_string(),
        })
        .collect();
    if clauses.is_empty() {
        "nothing".into()
    } else {
        clauses.join("; ")
    }
}

/// [`change`]'s work: Ok with the reply and what changed once applied (a 500 if it could not
/// be persisted), Err with the refusal's status and message.
fn apply(
    state: &ApiState,
    running: &Arc<Config>,
    edit: impl FnOnce(&mut Config) -> Result<(), Refusal>,
) -> Result<(Reply, String), Refusal> {
    let mut config = (**running).clone();
    edit(&mut config)?;
    let applied = apply_live(
        &state.commands,
        running.clone(),
        config,
        state.state_file.as_deref(),
    )?;
    let reply = match applied.persist_error {
        Some(e) => error(
            500,
            format!("applied, but not persisted to switch.state_file: {e}"),
        ),
        None => json(200, serde_json::json!({ "ok": true })),
    };
    Ok((reply, applied.changes))
}

/// What [`apply_live`] did.
pub struct Applied {
    /// One clause per host, tenant or VM changed ("nothing" when none).
    pub changes: String,
    /// Applied, but the state file could not be written: why.
    pub persist_error: Option<String>,
}

/// The live-change path the API and the control plane share: validates `config`, turns the
/// change from `running` into in-place changes, hands them to the run loop, waits until they
/// are applied and persists the result to `state_file`. Err: the status and why it was refused.
pub fn apply_live(
    commands: &CommandSender,
    running: Arc<Config>,
    config: Config,
    state_file: Option<&std::path::Path>,
) -> Result<Applied, (u16, String)> {
    config.validate().map_err(|e| (400, e.to_string()))?;
    // Diffed here, not on the dataplane (docs/switch.md "Live changes").
    let change = match Reconfigure::prepare(running, config.clone()) {
        Ok(change) => change,
        Err(e) => return Err((400, format!("{e:#}"))),
    };
    let changes = describe(&change.changes);
    let (tx, rx) = mpsc::channel();
    if commands
        .send(Command::Reconfigure(Box::new(change), tx))
        .is_err()
    {
        return Err((503, "switch is stopping".into()));
    }
    match rx.recv_timeout(StdDuration::from_secs(5)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err((400, format!("{e:#}"))),
        Err(_) => return Err((504, "the switch did not apply the change in time".into())),
    }
    let persist_error = state_file
        .and_then(|path| crate::persist::save(path, &config).err())
        .map(|e| format!("{e:#}"));
    Ok(Applied {
        changes,
        persist_error,
    })
}
