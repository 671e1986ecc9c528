//! The Grafana dashboard (packaging/grafana/picnic-switch.json) names only series the switch
//! exports: every `picnic_*` name in its queries and variables is a family `/metrics`
//! registers (a histogram's with `_bucket`, `_sum` or `_count`). crates/cli/tests/metrics.rs
//! runs its queries through a real Prometheus.

use std::collections::BTreeSet;

use picnic_switch::api::metrics::family_names;

const DASHBOARD: &str = include_str!("../../../packaging/grafana/picnic-switch.json");

/// Every string in `v`, depth first.
fn strings<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match v {
        serde_json::Value::String(s) => out.push(s),
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// The `picnic_*` metric names in a query.
fn metric_names(query: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("picnic_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.push(&tail[..end]);
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_series_the_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let exported: BTreeSet<String> = family_names().into_iter().collect();
    assert!(
        exported.contains("picnic_vm_rx_bytes_total"),
        "{exported:?}"
    );
    let mut all = Vec::new();
    strings(&dashboard, &mut all);
    let mut checked = BTreeSet::new();
    for s in all {
        for name in metric_names(s) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|f| exported.contains(*f))
                .unwrap_or(name);
            assert!(
                exported.contains(family),
                "the dashboard queries {name}, which the switch does not export"
            );
            checked.insert(name);
        }
    }
    // Each panel has queries; together they cover what an operator watches.
    let panels = dashboard["panels"].as_array().unwrap();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert!(!metric_names(expr).is_empty(), "{expr}");
        }
    }
    for needed in [
        "picnic_vm_rx_bytes_total",
        "picnic_vm_drops_total",
        "picnic_tenant_cpu_charged_seconds_total",
        "picnic_tenant_slo_met",
        "picnic_tenant_slo_violated",
        "picnic_tenant_drops_total",
        "picnic_vm_ingress_wait_seconds_bucket",
    ] {
        assert!(checked.contains(needed), "the dashboard lacks {needed}");
    }
}
