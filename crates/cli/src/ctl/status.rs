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
/// runs, its API, and its tenants' SLO state from that API.
pub async fn run(target: &mut Target, view: &Cluster) -> anyhow::Result<()> {
    let revision = match target {
        Target::Api(api) => {
            println!("switch at {}:", api.0.display());
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
            Some(Ok(ApiListen::Unix(path))) => {
                for line in slo_lines(&Api(path)) {
                    println!("  {line}");
                }
            }
            Some(_) => println!("  SLO: its API is not a Unix socket here"),
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
                format!(
                    "tenant {name}: SLO violated {} (why: {})",
                    t["violated"], t["why"]
                )
            }
        })
        .collect()
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
