//! Where `picnic ctl` reads and writes records: the cluster's etcd, or one switch's API (its
//! Unix socket). Both show the records as a [`Cluster`] and take one record at a time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{bail, Context};
use picnic_control::cluster::{key, Cluster, Kind};
use picnic_control::store::{self, Expect};
use picnic_switch::config::{ApiListen, Config, TenantEntry};
use serde_json::Value;

/// A switch's control API: on its Unix socket, or on TCP with the bearer token.
pub struct Api {
    pub listen: ApiListen,
    pub token: Option<String>,
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match &self.listen {
            ApiListen::Unix(path) => write!(f, "{}", path.display()),
            ApiListen::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

/// A connection to an API.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

impl Api {
    fn connect(&self) -> anyhow::Result<Box<dyn Stream>> {
        let timeout = Some(Duration::from_secs(10));
        Ok(match &self.listen {
            ApiListen::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(timeout)?;
                Box::new(s)
            }
            ApiListen::Tcp(addr) => {
                let addr = addr.parse()?;
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                s.set_read_timeout(timeout)?;
                Box::new(s)
            }
        })
    }

    /// One request; Ok with the status and the body's JSON (Null if none).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let socket = self.to_string();
        let mut stream = self
            .connect()
            .with_context(|| format!("the switch's API at {socket}"))?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let auth = self
            .token
            .as_ref()
            .map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: picnic\r\nConnection: close\r\nUser-Agent: picnic-ctl/{}\r\n\
             {auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            env!("CARGO_PKG_VERSION"),
            body.len()
        )?;
        let mut raw = String::new();
        stream
            .read_to_string(&mut raw)
            .with_context(|| format!("reading the answer of {socket}"))?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{method} {path}: not an HTTP answer from {socket}"))?;
        Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
    }

    /// GET `path`, which must answer 200.
    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        match self.request("GET", path, None)? {
            (200, v) => Ok(v),
            (status, v) => bail!(
                "GET {path}: HTTP {status}: {}",
                v["error"].as_str().unwrap_or("?")
            ),
        }
    }
}

/// The cluster's etcd (with the revision of each record read) or one switch's API.
pub enum Target {
    Etcd {
        client: Box<etcd_client::Client>,
        prefix: String,
        snap: store::Snapshot,
    },
    Api(Api),
}

impl Target {
    /// Reads every record, from etcd or from the switch's running config.
    pub async fn view(&mut self) -> anyhow::Result<Cluster> {
        match self {
            Target::Etcd {
                client,
                prefix,
                snap,
            } => {
                *snap = store::load(client, prefix).await?;
                for e in &snap.errors {
                    eprintln!("picnic ctl: warning: {e}");
                }
                Ok(snap.cluster.clone())
            }
            Target::Api(api) => {
                let cfg: Config =
                    serde_json::from_value(api.get("/config")?).context("the switch's /config")?;
                let mut c = Cluster {
                    hosts: cfg.hosts.into_iter().map(|h| (h.id, h)).collect(),
                    vms: cfg.vms.into_iter().map(|v| (v.name.clone(), v)).collect(),
                    ..Default::default()
                };
                for mut t in cfg.tenants {
                    if let Some(slo) = t.slo.take() {
                        c.slos.insert(t.name.clone(), slo);
                    }
                    c.tenants.insert(t.name.clone(), t);
                }
                Ok(c)
            }
        }
    }

    /// Writes (Some) or removes (None) record `name` of `kind`: new (`create`) or replacing
    /// the one [`Target::view`] read. `view` is what it read (a tenant's SLO goes with it
    /// through the API). Ok with the etcd revision written (0 through the API).
    pub async fn write(
        &mut self,
        view: &Cluster,
        kind: Kind,
        name: &str,
        value: Option<Value>,
        create: bool,
    ) -> anyhow::Result<i64> {
        match self {
            Target::Etcd {
                client,
                prefix,
                snap,
            } => {
                let at = || {
                    snap.versions
                        .get(&key(prefix, kind, name))
                        .copied()
                        .with_context(|| format!("no {} '{name}'", kind_name(kind)))
                };
                match value {
                    Some(v) => {
                        let expect = if create {
                            Expect::Absent
                        } else {
                            Expect::At(at()?)
                        };
                        store::put(client, prefix, kind, name, &v, expect).await
                    }
                    None => store::delete(client, prefix, kind, name, at()?).await,
                }
            }
            Target::Api(api) => {
                let dir = kind.dir();
                let (method, path, body) = match (kind, value) {
                    (Kind::Slo, v) => {
                        let mut t: TenantEntry = view
                            .tenants
                            .get(name)
                            .cloned()
                            .with_context(|| format!("no tenant '{name}'"))?;
                        t.slo = v.map(serde_json::from_value).transpose()?;
                        (
                            "PUT",
                            format!("/tenants/{name}"),
                            Some(serde_json::to_value(t)?),
                        )
                    }
                    (_, None) => ("DELETE", format!("/{dir}/{name}"), None),
                    (_, Some(mut v)) => {
                        // A VM of another host has no port on this one.
                        if kind == Kind::Vm {
                            let cfg = api.get("/config")?;
                            if v["host"] != cfg["switch"]["host_id"] {
                                v["port"] = Value::Null;
                            }
                        }
                        if kind == Kind::Tenant {
                            if v.get("key").is_some() {
                                bail!("tenant '{name}' has a key: change it in the switch's config file");
                            }
                            if let Some(slo) = view.slos.get(name) {
                                v["slo"] = serde_json::to_value(slo)?;
                            }
                        }
                        match create {
                            true => ("POST", format!("/{dir}"), Some(v)),
                            false => ("PUT", format!("/{dir}/{name}"), Some(v)),
                        }
                    }
                };
                match api.request(method, &path, body.as_ref())? {
                    (200, _) => Ok(0),
                    (status, v) => bail!(
                        "the switch refused {method} {path} (HTTP {status}): {}",
                        v["error"].as_str().unwrap_or("?")
                    ),
                }
            }
        }
    }
}

/// A kind of record as the user names it.
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Host => "host",
        Kind::Tenant => "tenant",
        Kind::Slo => "SLO for tenant",
        Kind::Vm => "VM",
        Kind::Switch => "switch",
        Kind::Key => "key record",
    }
}
