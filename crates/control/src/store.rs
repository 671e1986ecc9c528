//! etcd access for the switch's watcher and `picnic ctl`: read the prefix whole, write one
//! record only if nobody changed it meanwhile (a transaction comparing its revision).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};

use crate::cluster::{key, Cluster, Kind};

/// How long connecting, and then each request, may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Connects to `endpoints` (`http://HOST:PORT`); the error names them.
pub async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(TIMEOUT)
        .with_timeout(TIMEOUT)
        // A dead etcd is found within seconds even while nothing changes.
        .with_keep_alive(Duration::from_secs(1), TIMEOUT)
        .with_keep_alive_while_idle(true);
    Client::connect(endpoints, Some(options))
        .await
        .with_context(|| format!("etcd {}", endpoints.join(",")))
}

/// The prefix's records at one revision, with each key's revision (for [`put`] and
/// [`delete`]) and the records that could not be read.
#[derive(Default)]
pub struct Snapshot {
    pub cluster: Cluster,
    pub revision: i64,
    pub versions: BTreeMap<String, i64>,
    pub errors: Vec<String>,
}

/// Reads every record under `prefix`.
pub async fn load(client: &mut Client, prefix: &str) -> anyhow::Result<Snapshot> {
    let resp = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .context("etcd get")?;
    let mut snap = Snapshot {
        revision: resp.header().map_or(0, |h| h.revision()),
        ..Default::default()
    };
    for kv in resp.kvs() {
        let Ok(k) = kv.key_str() else { continue };
        match snap.cluster.set(prefix, k, Some(kv.value())) {
            Ok(()) => {
                snap.versions.insert(k.to_string(), kv.mod_revision());
            }
            Err(e) => snap.errors.push(e),
        }
    }
    Ok(snap)
}

/// What a write expects of the record: that it does not exist, or is still at this revision.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    Absent,
    At(i64),
}

/// Writes `value` (JSON) as record `name` of `kind` if it is as `expect`ed; Err says it is not.
pub async fn put(
    client: &mut Client,
    prefix: &str,
    kind: Kind,
    name: &str,
    value: &impl serde::Serialize,
    expect: Expect,
) -> anyhow::Result<i64> {
    let k = key(prefix, kind, name);
    let text = serde_json::to_string(value)?;
    commit(
        client,
        &k,
        expect,
        TxnOp::put(k.clone(), text, None::<PutOptions>),
    )
    .await
}

/// Removes record `name` of `kind` if it is still at revision `at`.
pub async fn delete(
    client: &mut Client,
    prefix: &str,
    kind: Kind,
    name: &str,
    at: i64,
) -> anyhow::Result<i64> {
    let k = key(prefix, kind, name);
    commit(client, &k, Expect::At(at), TxnOp::delete(k.clone(), None)).await
}

async fn commit(client: &mut Client, k: &str, expect: Expect, op: TxnOp) -> anyhow::Result<i64> {
    let compare = match expect {
        Expect::Absent => Compare::create_revision(k, CompareOp::Equal, 0),
        Expect::At(rev) => Compare::mod_revision(k, CompareOp::Equal, rev),
    };
    let resp = client
        .txn(Txn::new().when([compare]).and_then([op]))
        .await
        .context("etcd txn")?;
    if !resp.succeeded() {
        match expect {
            Expect::Absent => bail!("{k} exists already"),
            Expect::At(_) => bail!("{k} changed meanwhile (or was removed); try again"),
        }
    }
    Ok(resp.header().map_or(0, |h| h.revision()))
}

/// Writes every record of `cluster` (hosts, tenants, SLOs, VMs) as new: Err if one exists.
/// The revision of the last write.
pub async fn put_all(client: &mut Client, prefix: &str, cluster: &Cluster) -> anyhow::Result<i64> {
    let mut revision = 0;
    for h in cluster.hosts.values() {
        revision = put(
            client,
            prefix,
            Kind::Host,
            &h.id.to_string(),
            h,
            Expect::Absent,
        )
        .await?;
    }
    for t in cluster.tenants.values() {
        revision = put(client, prefix, Kind::Tenant, &t.name, t, Expect::Absent).await?;
    }
    for (tenant, slo) in &cluster.slos {
        revision = put(client, prefix, Kind::Slo, tenant, slo, Expect::Absent).await?;
    }
    for v in cluster.vms.values() {
        revision = put(client, prefix, Kind::Vm, &v.name, v, Expect::Absent).await?;
    }
    Ok(revision)
}
