//! The local control API: JSON over HTTP to list and change tenants, VMs and hosts live,
//! read statistics, and a Prometheus `/metrics` endpoint.
//!
//! | method and path        | what                                                     |
//! |------------------------|----------------------------------------------------------|
//! | GET /stats             | per-VM/tenant counters, queues, rates, port counters     |
//! | GET /metrics           | the same as Prometheus series (docs/operations.md); OpenMetrics |
//! |                        | when the `Accept` header asks for it                    |
//! | GET /slo               | per tenant with an SLO: met/violated, violations, why     |
//! | GET /config            | the running config                                        |
//! | GET /tenants, /vms, /hosts | one section of it                                    |
//! | POST /tenants, /vms, /hosts | add one (JSON body: the config entry)              |
//! | PUT /vms/NAME          | replace a VM entry (e.g. new min/max bandwidth)           |
//! | PUT /hosts/ID          | replace a host entry (underlay address, MAC)              |
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

pub mod metrics;
mod routes;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tiny_http::{Header, Response, Server};

use crate::config::{read_secret, ApiListen, SwitchSection};
use crate::runner::{CommandSender, Shared};
use metrics::Format;
#[cfg(test)]
use routes::handle;
pub use routes::{apply_live, Applied};
use routes::{route, Origin};

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
    commands: CommandSender,
    token: Option<Vec<u8>>,
    state_file: Option<PathBuf>,
}

/// Starts the API server of `switch` (its `api`, `api_socket_mode`, `api_token_file`,
/// `state_file`) in its own thread.
pub fn spawn(
    switch: &SwitchSection,
    shared: Arc<Shared>,
    commands: CommandSender,
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

/// Starts the read-only metrics listener on `switch.metrics` (TCP `ADDR:PORT`): `GET
/// /metrics` and nothing else, without a token, for a Prometheus server to scrape.
pub fn spawn_metrics(addr: &str, shared: Arc<Shared>) -> anyhow::Result<Api> {
    let server = Server::http(addr)
        .map_err(|e| anyhow::anyhow!("switch.metrics: cannot listen on {addr}: {e}"))?;
    let listening = server
        .server_addr()
        .to_ip()
        .map_or(addr.to_string(), |a| format!("http://{a}/metrics"));
    let thread = std::thread::Builder::new()
        .name("picnic-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let format = Format::negotiate(header(&req, "Accept"));
                let path = req.url().split('?').next().unwrap_or("");
                let reply = match (req.method(), path, shared.latest()) {
                    (tiny_http::Method::Get, "/metrics", Some(p)) => {
                        (200, format.content_type(), metrics::metrics(&p, format))
                    }
                    (tiny_http::Method::Get, "/metrics", None) => error(503, "no statistics yet"),
                    _ => error(404, "path: this listener serves GET /metrics only"),
                };
                respond(req, reply);
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
    let reply = reply_to(state, &mut req);
    respond(req, reply);
}

fn respond(req: tiny_http::Request, (status, content_type, text): Reply) {
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
    let format = Format::negotiate(header(req, "Accept"));
    let origin = Origin {
        from: req
            .remote_addr()
            .map_or("unix socket".into(), |a| format!("tcp {a}")),
        agent: header(req, "User-Agent").unwrap_or("-").to_string(),
    };
    match String::from_utf8(body) {
        Ok(body) => route(state, req.method(), req.url(), &body, format, &origin),
        Err(_) => error(400, "body: not UTF-8"),
    }
}

/// The value of the request's header `name`, if any.
fn header<'r>(req: &'r tiny_http::Request, name: &'static str) -> Option<&'r str> {
    req.headers()
        .iter()
        .find(|h| h.field.equiv(name))
        .map(|h| h.value.as_str())
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
