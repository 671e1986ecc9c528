//! `picnic ctl status`, and waiting for the switches to apply a change.

use std::time::{Duration, Instant};

use anyhow::bail;
use picnic_control::cluster::Cluster;
use picnic_control::store;
use picnic_switch::config::ApiListen;
use serde_json::Value;

use super::target::{Api, Target};
use super::{since, POLL};

/// Prints every host: its switch up or not (its status record in etcd), the revision it
/// runs, its API, and its tenants' SLO state from that API (on TCP with `token`).
pub async fn run(target: &mut Target, view: &Cluster, token: Option<String>) -> anyhow::Result<()> {
    let revision = match target {
        Target::Api(api) => {
            println!("switch at {api}:");
            for line in slo_lines(api) {
                println!("  {line}");
            }
            return Ok(());
        }
        Target::Etcd { snap, .. } => snap.revision,
    };
    println!("etcd revision {revision}");
    let mut ids: Vec<u32> = view
        .hosts
        .keys()
        .chain(view.switches.keys())
        .copied()
        .collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        let ip = view
            .hosts
            .get(&id)
            .map_or("(no host record)".into(), |h| h.underlay_ip.to_string());
        let Some(s) = view.switches.get(&id) else {
            println!("host {id} {ip}: switch down (no status in etcd)");
            continue;
        };
        let api = s.api.as_deref().unwrap_or("-");
        println!(
            "host {id} {ip}: switch up, revision {}, api {api}",
            s.revision
        );
        match s.api.as_deref().map(ApiListen::parse) {
            Some(Ok(ApiListen::Tcp(addr))) if token.is_none() => {
                println!("  SLO: its API is on tcp:{addr}: give --api-token-file")
            }
            Some(Ok(listen)) => {
                let api = Api {
                    listen,
                    token: token.clone(),
                };
                for line in slo_lines(&api) {
                    println!("  {line}");
                }
            }
            Some(Err(e)) => println!("  SLO: its API '{}': {e}", s.api.as_deref().unwrap_or("")),
            None => println!("  SLO: the switch has no API"),
        }
    }
    Ok(())
}

/// One line per tenant with an SLO: met, or the bounds violated and why.
fn slo_lines(api: &Api) -> Vec<String> {
    let report = match api.get("/slo") {
        Ok(v) => v,
        Err(e) => return vec![format!("SLO: unknown ({e:#})")],
    };
    let tenants = report["tenants"].as_array().cloned().unwrap_or_default();
    if tenants.is_empty() {
        return vec!["SLO: no tenant with an SLO here".into()];
    }
    tenants
        .iter()
        .map(|t| {
            let name = t["tenant"].as_str().unwrap_or("?");
            if t["met"] == Value::Bool(true) {
                format!("tenant {name}: SLO met")
            } else {
                let violated = match &t["violated"] {
                    Value::Array(kinds) => kinds
                        .iter()
                        .map(|k| k.as_str().map_or(k.to_string(), str::to_string))
                        .collect::<Vec<_>>()
                        .join(", "),
                    other => other.to_string(),
                };
                format!(
                    "tenant {name}: SLO violated ({violated}) in the last window; why: {}",
                    why(&t["why"])
                )
            }
        })
        .collect()
}

/// A tenant's `why` (GET /slo) in words: where its late frames waited, what the switch
/// dropped of its frames and why, and what it held back; each only if not zero.
pub(super) fn why(why: &Value) -> String {
    let counts = |v: &Value, label: &str| -> Vec<String> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter(|(_, n)| n.as_u64().is_some_and(|n| n > 0))
            .map(|(k, n)| format!("{label} {} {n}", k.replace('_', " ")))
            .collect()
    };
    let mut parts = counts(&why["late"], "late in");
    parts.extend(counts(&why["drops"], "dropped"));
    for (field, label) in [
        (
            "waited_limiter",
            "held by the destination's limiter (EyeQ feedback)",
        ),
        ("waited_shaped_class", "queued in a shaped class"),
    ] {
        if let Some(n) = why[field].as_u64().filter(|n| *n > 0) {
            parts.push(format!("{label} {n}"));
        }
    }
    if parts.is_empty() {
        "nothing late, dropped or held in this switch (frames since it started)".into()
    } else {
        format!("{} (frames since it started)", parts.join(", "))
    }
}

/// Waits until every switch that is up reports `revision` or later; Err names those that
/// did not within `wait`.
pub async fn wait_for(
    client: &mut etcd_client::Client,
    prefix: &str,
    revision: i64,
    wait: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let snap = store::load(client, prefix).await?;
        let behind: Vec<String> = snap
            .cluster
            .switches
            .values()
            .filter(|s| s.revision < revision)
            .map(|s| format!("host {} (at revision {})", s.host, s.revision))
            .collect();
        if snap.cluster.switches.is_empty() {
            println!("no switch is up to apply it");
            return Ok(());
        }
        if behind.is_empty() {
            let hosts: Vec<String> = snap.cluster.switches.keys().map(u32::to_string).collect();
            println!(
                "applied by the switches of hosts [{}] in {:.2} s",
                hosts.join(", "),
                since(start)
            );
            return Ok(());
        }
        if start.elapsed() >= wait {
            bail!(
                "written at revision {revision}, but not applied within {:.1} s by {} (its log says why)",
                wait.as_secs_f64(),
                behind.join(", ")
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
