//! The switch's side: a thread that reads the cluster's records from etcd, watches the
//! prefix, and applies each change through the API's live-change path
//! (`picnic_switch::api::apply_live`), so only the hosts, tenants and VMs concerned change.
//!
//! The records it last applied and their revision are kept next to the state file
//! ([`cache_path`]). When etcd cannot be reached (at start, or later) the switch runs on its
//! persisted state; when etcd answers again the watcher reads the prefix at the current
//! revision and applies the difference from the records it had: the same changes as
//! replaying the events in between, without needing etcd's history (a compacted revision
//! makes no difference). A watch that etcd cancels (compaction) is such a resync too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use etcd_client::{Client, EventType, PutOptions, WatchOptions};
use picnic_switch::api::apply_live;
use picnic_switch::config::{Config, ControlSection};
use picnic_switch::runner::{CommandSender, Shared};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::cluster::{desired, key, Cluster, Kind, SwitchStatus};
use crate::store;

/// Seconds the switch's status record outlives its last keep-alive.
const LEASE_TTL: i64 = 6;
/// How often an unreachable etcd is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// The records a switch last applied, persisted with their revision.
#[derive(Default, Serialize, Deserialize)]
struct Cache {
    revision: i64,
    applied: Cluster,
}

/// Where the watcher keeps the records it applied: beside `state_file`
/// (`state.json` -> `state.etcd.json`).
pub fn cache_path(state_file: &Path) -> PathBuf {
    state_file.with_extension("etcd.json")
}

struct Watcher {
    endpoints: Vec<String>,
    prefix: String,
    api: Option<String>,
    state_file: PathBuf,
    shared: Arc<Shared>,
    commands: CommandSender,
    cache: Cache,
    /// The records at the last revision seen (ahead of `cache.applied` while a change is
    /// refused).
    latest: Cluster,
    /// The revision of `latest`.
    seen: i64,
    /// The revision whose change the switch refused last (logged once, retried).
    refused: Option<i64>,
}

/// A running watcher; dropping it stops the watcher (its status record then expires).
pub struct Watch {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Closing the channel ends the watcher at its next await.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the watcher of `cfg.control` for the switch whose state is `shared` and whose run
/// loop takes `commands`, until the returned [`Watch`] is dropped. Its connections to etcd
/// are made in the network namespace of the calling thread. Errors only on an unreadable
/// cache file; etcd being unreachable is not an error (the switch runs on its persisted
/// state).
pub fn spawn(cfg: &Config, shared: Arc<Shared>, commands: CommandSender) -> anyhow::Result<Watch> {
    let Some(control) = cfg.control.clone() else {
        bail!("control: not configured");
    };
    let Some(state_file) = cfg.switch.state_file.clone() else {
        bail!("control: needs switch.state_file");
    };
    let path = cache_path(&state_file);
    let cache: Cache = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            anyhow::anyhow!(
                "control: {}: {e} (remove it to resync from etcd)",
                path.display()
            )
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Cache::default(),
        Err(e) => bail!("control: cannot read {}: {e}", path.display()),
    };
    let ControlSection { etcd, prefix } = control;
    info!(etcd = %etcd.join(","), %prefix, revision = cache.revision, "control plane: watching etcd");
    let mut watcher = Watcher {
        endpoints: etcd,
        prefix,
        api: cfg.switch.api.clone(),
        state_file,
        shared,
        commands,
        latest: cache.applied.clone(),
        seen: cache.revision,
        refused: None,
        cache,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("picnic-control".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            rt.block_on(async {
                tokio::select! {
                    _ = watcher.run() => {}
                    _ = stopped => {}
                }
            });
        })?;
    Ok(Watch {
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl Watcher {
    /// Sessions with etcd, one after the other, for ever.
    async fn run(&mut self) {
        let mut down = false;
        loop {
            let e = self.session(&mut down).await.unwrap_err();
            if !down {
                warn!(
                    etcd = %self.endpoints.join(","),
                    error = %format!("{e:#}"),
                    revision = self.cache.revision,
                    "control plane: etcd unreachable or the watch ended; running on the persisted state, retrying every 1 s"
                );
                down = true;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// One connection: read the prefix, apply what changed since the revision applied, then
    /// watch. Returns only with the error that ended it.
    async fn session(&mut self, down: &mut bool) -> anyhow::Result<()> {
        let mut client = store::connect(&self.endpoints).await?;
        let snap = store::load(&mut client, &self.prefix).await?;
        for e in &snap.errors {
            warn!(from = "etcd", error = %e, "control plane: record ignored");
        }
        let from = self.cache.revision;
        self.latest = snap.cluster;
        self.sync(snap.revision);
        info!(
            from_revision = from,
            revision = self.cache.revision,
            resumed = *down,
            "control plane: caught up with etcd"
        );
        *down = false;
        let lease = client.lease_grant(LEASE_TTL, None).await?.id();
        let (mut keeper, mut acks) = client.lease_keep_alive(lease).await?;
        self.publish(&mut client, lease).await?;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(snap.revision + 1);
        let mut watch = client.watch(self.prefix.clone(), Some(options)).await?;
        let mut tick = tokio::time::interval(Duration::from_secs(LEASE_TTL as u64 / 3));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    keeper.keep_alive().await?;
                    // A refused change is tried again (a port may exist by now).
                    if self.refused.is_some() && self.sync(self.seen) {
                        self.publish(&mut client, lease).await?;
                    }
                }
                ack = acks.message() => {
                    if !matches!(ack?, Some(a) if a.ttl() > 0) {
                        bail!("the switch's lease expired");
                    }
                }
                msg = watch.message() => {
                    let Some(resp) = msg? else { bail!("etcd ended the watch") };
                    if resp.canceled() {
                        bail!(
                            "watch canceled ({}; compacted at {}): resyncing",
                            resp.cancel_reason(),
                            resp.compact_revision()
                        );
                    }
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let Ok(k) = kv.key_str() else { continue };
                        let value = (ev.event_type() == EventType::Put).then(|| kv.value());
                        if let Err(e) = self.latest.set(&self.prefix, k, value) {
                            warn!(from = "etcd", error = %e, "control plane: record ignored");
                        }
                    }
                    let revision = resp.header().map_or(self.seen, |h| h.revision());
                    if self.sync(revision) {
                        self.publish(&mut client, lease).await?;
                    }
                }
            }
        }
    }

    /// Applies `latest` (at `revision`) over what was applied. True when the deployment
    /// changed and was applied; a refused change is logged once and tried again.
    fn sync(&mut self, revision: i64) -> bool {
        self.seen = revision;
        if self.cache.applied.same_deployment(&self.latest) {
            self.cache.revision = revision;
            self.refused = None;
            return false;
        }
        let running = loop {
            // Set once the switch runs, before the API answers.
            match self.shared.config() {
                Some(c) => break c,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let next = desired(&running, &self.cache.applied, &self.latest);
        match apply_live(&self.commands, running, next, Some(&self.state_file)) {
            Ok(applied) => {
                info!(from = "etcd", revision, changes = %applied.changes, "live change applied");
                if let Some(e) = applied.persist_error {
                    warn!(error = %e, "applied, but not persisted to switch.state_file");
                }
                self.cache.applied = self.latest.clone();
                self.cache.revision = revision;
                self.refused = None;
                self.save();
                true
            }
            Err((_, e)) => {
                if self.refused != Some(revision) {
                    warn!(from = "etcd", revision, error = %e, "live change refused; tried again every 2 s and with the next change in etcd");
                }
                self.refused = Some(revision);
                false
            }
        }
    }

    fn save(&self) {
        let path = cache_path(&self.state_file);
        let written = serde_json::to_vec(&self.cache)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| picnic_switch::persist::write_atomic(&path, &bytes));
        if let Err(e) = written {
            warn!(error = %format!("{e:#}"), "control plane: cannot persist the records applied");
        }
    }

    /// Puts this switch's status (`switches/ID`) under its lease.
    async fn publish(&self, client: &mut Client, lease: i64) -> anyhow::Result<()> {
        let Some(running) = self.shared.config() else {
            return Ok(());
        };
        let host = running.switch.host_id;
        let status = SwitchStatus {
            host,
            revision: self.cache.revision,
            api: self.api.clone(),
        };
        client
            .put(
                key(&self.prefix, Kind::Switch, &host.to_string()),
                serde_json::to_string(&status)?,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await?;
        Ok(())
    }
}
