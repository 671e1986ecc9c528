//! The cluster's records as etcd holds them, and what a switch makes of them: sans-I/O.
//!
//! | key (under the prefix) | value (JSON)                                             |
//! |------------------------|----------------------------------------------------------|
//! | `hosts/ID`             | a `HostEntry` (id, underlay_ip, mac)                     |
//! | `tenants/NAME`         | a `TenantEntry` without `slo`                            |
//! | `slos/TENANT`          | the tenant's `Slo`, on every host it spans               |
//! | `vms/NAME`             | a `VmEntry`: the API's VM record (what the CNI plugin posts); its `port` is used on its `host` only |
//! | `switches/ID`          | a [`SwitchStatus`], under a lease: the switch of host ID is up |
//! | `keys/feedback`        | the feedback keys by epoch, a `FeedbackKeys` (previous, active, next): `picnic ctl feedback-key rotate` |

use std::collections::BTreeMap;

use picnic_core::slo::Slo;
use picnic_switch::config::{Config, FeedbackKeys, HostEntry, TenantEntry, VmEntry};
use serde::{Deserialize, Serialize};

/// What a running switch publishes about itself (`switches/ID`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchStatus {
    pub host: u32,
    /// The etcd revision of the cluster state it runs.
    pub revision: i64,
    /// Its API (`switch.api`), if it has one.
    pub api: Option<String>,
}

/// The cluster's records at one revision.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Cluster {
    pub hosts: BTreeMap<u32, HostEntry>,
    pub tenants: BTreeMap<String, TenantEntry>,
    pub slos: BTreeMap<String, Slo>,
    pub vms: BTreeMap<String, VmEntry>,
    pub switches: BTreeMap<u32, SwitchStatus>,
    /// `keys/feedback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback_key: Option<FeedbackKeys>,
}

/// The name of the feedback keys' record under `keys/`.
pub const FEEDBACK_KEY: &str = "feedback";

/// The kinds of record, by their key's first component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Host,
    Tenant,
    Slo,
    Vm,
    Switch,
    Key,
}

impl Kind {
    pub fn dir(self) -> &'static str {
        match self {
            Kind::Host => "hosts",
            Kind::Tenant => "tenants",
            Kind::Slo => "slos",
            Kind::Vm => "vms",
            Kind::Switch => "switches",
            Kind::Key => "keys",
        }
    }
    fn from_dir(dir: &str) -> Option<Kind> {
        [
            Kind::Host,
            Kind::Tenant,
            Kind::Slo,
            Kind::Vm,
            Kind::Switch,
            Kind::Key,
        ]
        .into_iter()
        .find(|k| k.dir() == dir)
    }
}

/// The key of record `name` of `kind` under `prefix`.
pub fn key(prefix: &str, kind: Kind, name: &str) -> String {
    format!("{prefix}{}/{name}", kind.dir())
}

impl Cluster {
    /// Sets (value Some) or deletes (None) the record at `key`. Err names the key and what
    /// is wrong with it; the cluster is then unchanged. Keys outside the prefix's kinds are
    /// ignored (Ok).
    pub fn set(&mut self, prefix: &str, key: &str, value: Option<&[u8]>) -> Result<(), String> {
        let Some((kind, name)) = key
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once('/'))
            .and_then(|(dir, name)| Some((Kind::from_dir(dir)?, name)))
        else {
            return Ok(());
        };
        let bad = |e: String| format!("{key}: {e}");
        let id = || name.parse::<u32>().map_err(|_| bad("not a host id".into()));
        fn parse<T: serde::de::DeserializeOwned>(v: &[u8]) -> Result<T, String> {
            serde_json::from_slice(v).map_err(|e| e.to_string())
        }
        match (kind, value) {
            (Kind::Host, Some(v)) => {
                let h: HostEntry = parse(v).map_err(bad)?;
                if h.id != id()? {
                    return Err(bad(format!("holds host {}", h.id)));
                }
                self.hosts.insert(h.id, h);
            }
            (Kind::Host, None) => {
                self.hosts.remove(&id()?);
            }
            (Kind::Tenant, Some(v)) => {
                let t: TenantEntry = parse(v).map_err(bad)?;
                if t.name != name {
                    return Err(bad(format!("holds tenant '{}'", t.name)));
                }
                if t.slo.is_some() {
                    return Err(bad(format!("has an slo: it belongs in slos/{name}")));
                }
                self.tenants.insert(t.name.clone(), t);
            }
            (Kind::Tenant, None) => {
                self.tenants.remove(name);
            }
            (Kind::Slo, Some(v)) => {
                let s: Slo = parse(v).map_err(bad)?;
                s.validate().map_err(|e| bad(e.to_string()))?;
                self.slos.insert(name.to_string(), s);
            }
            (Kind::Slo, None) => {
                self.slos.remove(name);
            }
            (Kind::Vm, Some(v)) => {
                let vm: VmEntry = parse(v).map_err(bad)?;
                if vm.name != name {
                    return Err(bad(format!("holds VM '{}'", vm.name)));
                }
                self.vms.insert(vm.name.clone(), vm);
            }
            (Kind::Vm, None) => {
                self.vms.remove(name);
            }
            (Kind::Switch, Some(v)) => {
                let s: SwitchStatus = parse(v).map_err(bad)?;
                self.switches.insert(id()?, s);
            }
            (Kind::Switch, None) => {
                self.switches.remove(&id()?);
            }
            (Kind::Key, _) if name != FEEDBACK_KEY => {
                return Err(bad(format!(
                    "no such key record (only keys/{FEEDBACK_KEY})"
                )))
            }
            (Kind::Key, Some(v)) => {
                let k: FeedbackKeys = parse(v).map_err(bad)?;
                k.validate()
                    .map_err(|(field, e)| bad(format!("{field}: {e}")))?;
                self.feedback_key = Some(k);
            }
            (Kind::Key, None) => self.feedback_key = None,
        }
        Ok(())
    }

    /// Whether the records a switch applies are the same in both (switch statuses aside).
    pub fn same_deployment(&self, other: &Cluster) -> bool {
        let json = |c: &Cluster| {
            serde_json::to_value((&c.hosts, &c.tenants, &c.slos, &c.vms, &c.feedback_key)).ok()
        };
        json(self) == json(other)
    }
}

impl Cluster {
    /// The records of a deployment whose hosts run `configs` (each host's full config, as
    /// the lab makes them): every host and tenant, each tenant's SLO under `slos/`, each VM
    /// as its own host has it (with its port). A tenant's `cpu_quota` and `cgroup` are its
    /// charge on one host (Iron 3.2): they stay in that host's file (see [`desired`]).
    pub fn from_configs(configs: &[Config]) -> Cluster {
        let mut c = Cluster::default();
        for cfg in configs {
            for h in &cfg.hosts {
                c.hosts.insert(h.id, h.clone());
            }
            for t in &cfg.tenants {
                let mut t = t.clone();
                if let Some(slo) = t.slo.take() {
                    c.slos.insert(t.name.clone(), slo);
                }
                t.cpu_quota = None;
                t.cgroup = None;
                c.tenants.insert(t.name.clone(), t);
            }
            for v in cfg.vms.iter().filter(|v| v.host == cfg.switch.host_id) {
                c.vms.insert(v.name.clone(), v.clone());
            }
        }
        c
    }
}

/// The config a switch runs once the cluster went from `before` (what it applied last) to
/// `after`: `running` with every record of `after` set and every record `before` had and
/// `after` has not removed. Entries that came from elsewhere (the config file, the API, the
/// CNI plugin) stay. A tenant carries its SLO from `slos/`, and this host's `cpu_quota` and
/// `cgroup` for it where its record has none; a VM of another host carries no port; this
/// host's own entry is never removed. The feedback keys are etcd's once it has had some.
pub fn desired(running: &Config, before: &Cluster, after: &Cluster) -> Config {
    let mut cfg = running.clone();
    let this = cfg.switch.host_id;
    if after.feedback_key.is_some() || before.feedback_key.is_some() {
        cfg.feedback_keys = after.feedback_key.clone();
    }
    cfg.vms
        .retain(|v| after.vms.contains_key(&v.name) || !before.vms.contains_key(&v.name));
    cfg.tenants
        .retain(|t| after.tenants.contains_key(&t.name) || !before.tenants.contains_key(&t.name));
    cfg.hosts.retain(|h| {
        h.id == this || after.hosts.contains_key(&h.id) || !before.hosts.contains_key(&h.id)
    });
    for h in after.hosts.values() {
        put(&mut cfg.hosts, h.clone(), |x| x.id == h.id);
    }
    for t in after.tenants.values() {
        let mut t = t.clone();
        t.slo = after.slos.get(&t.name).cloned();
        if let Some(here) = cfg.tenants.iter().find(|x| x.name == t.name) {
            t.cpu_quota = t.cpu_quota.or(here.cpu_quota);
            t.cgroup = t.cgroup.clone().or_else(|| here.cgroup.clone());
        }
        let name = t.name.clone();
        put(&mut cfg.tenants, t, |x| x.name == name);
    }
    for v in after.vms.values() {
        let mut v = v.clone();
        if v.host != this {
            v.port = None;
        }
        let name = v.name.clone();
        put(&mut cfg.vms, v, |x| x.name == name);
    }
    cfg
}

/// Replaces the item of `list` that `same` finds, or appends `item`.
fn put<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
    match list.iter_mut().find(|x| same(x)) {
        Some(x) => *x = item,
        None => list.push(item),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use picnic_switch::change::{diff, Change};

    const P: &str = "/picnic/";

    fn base() -> Config {
        Config::parse(
            r#"
[switch]
host_id = 1
state_file = "/tmp/never-written.json"
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[tenants]]
name = "local"
vni = 9
[[vms]]
name = "cni1"
id = 900
tenant = "local"
host = 1
mac = "02:00:00:00:09:00"
ip = "198.18.9.0"
port = { ifname = "cni1" }
"#,
        )
        .unwrap()
    }

    fn put_json(c: &mut Cluster, key: &str, v: serde_json::Value) {
        c.set(P, &format!("{P}{key}"), Some(v.to_string().as_bytes()))
            .unwrap();
    }

    fn vm(name: &str, id: u32, host: u32) -> serde_json::Value {
        serde_json::json!({
            "name": name, "id": id, "tenant": "t", "host": host,
            "mac": format!("02:00:00:00:00:{id:02x}"), "ip": format!("198.18.0.{id}"),
            "port": { "ifname": name },
        })
    }

    fn cluster() -> Cluster {
        let mut c = Cluster::default();
        for id in 1..=3 {
            put_json(
                &mut c,
                &format!("hosts/{id}"),
                serde_json::json!({"id": id, "underlay_ip": format!("198.19.0.{id}"),
                    "mac": format!("02:00:00:00:01:0{id}")}),
            );
        }
        put_json(
            &mut c,
            "tenants/t",
            serde_json::json!({"name": "t", "vni": 100}),
        );
        put_json(&mut c, "vms/a", vm("a", 1, 1));
        put_json(&mut c, "vms/b", vm("b", 2, 2));
        c
    }

    fn names(changes: &[Change]) -> Vec<String> {
        changes.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn the_cluster_is_added_to_what_the_host_has_and_remote_vms_lose_their_port() {
        let run = base();
        let cfg = desired(&run, &Cluster::default(), &cluster());
        cfg.validate().unwrap();
        assert_eq!(cfg.hosts.len(), 3);
        // The CNI plugin's VM and tenant stay.
        assert!(cfg.vms.iter().any(|v| v.name == "cni1"));
        assert!(cfg.tenants.iter().any(|t| t.name == "local"));
        let a = cfg.vms.iter().find(|v| v.name == "a").unwrap();
        let b = cfg.vms.iter().find(|v| v.name == "b").unwrap();
        assert_eq!(a.port.as_ref().unwrap().ifname, "a");
        assert!(b.port.is_none(), "b is on host 2");
        // Applying the same state again changes nothing.
        assert!(diff(&cfg, &desired(&cfg, &cluster(), &cluster()))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_moved_vm_leaves_its_old_host_and_each_edit_is_one_change() {
        let before = cluster();
        let on1 = desired(&base(), &Cluster::default(), &before);
        let mut after = before.clone();
        put_json(&mut after, "vms/a", vm("a", 1, 3));
        let next = desired(&on1, &before, &after);
        next.validate().unwrap();
        // Host 1 gives a's port up and knows it on host 3.
        assert_eq!(
            names(&diff(&on1, &next).unwrap()),
            ["remove VM 'a'", "add VM 'a'"]
        );
        let a = next.vms.iter().find(|v| v.name == "a").unwrap();
        assert_eq!((a.host, a.port.is_none()), (3, true));
        // An SLO is a change to its tenant.
        let mut slo = after.clone();
        put_json(&mut slo, "slos/t", serde_json::json!({"latency_us": 500}));
        let with_slo = desired(&next, &after, &slo);
        assert_eq!(
            names(&diff(&next, &with_slo).unwrap()),
            ["change tenant 't'"]
        );
        let t = with_slo.tenants.iter().find(|t| t.name == "t").unwrap();
        assert!(t.slo.is_some());
    }

    #[test]
    fn records_removed_from_etcd_go_and_local_ones_stay() {
        let before = cluster();
        let on1 = desired(&base(), &Cluster::default(), &before);
        let mut after = before.clone();
        after.set(P, "/picnic/vms/b", None).unwrap();
        after.set(P, "/picnic/hosts/2", None).unwrap();
        // Host 1's record removed from etcd: host 1 keeps its own entry.
        after.set(P, "/picnic/hosts/1", None).unwrap();
        let next = desired(&on1, &before, &after);
        next.validate().unwrap();
        assert_eq!(
            names(&diff(&on1, &next).unwrap()),
            ["remove VM 'b'", "remove host 2"]
        );
        assert!(next.vms.iter().any(|v| v.name == "cni1"));
        assert!(next.hosts.iter().any(|h| h.id == 1));
    }

    #[test]
    fn a_deployment_of_full_configs_becomes_records_and_a_hosts_charge_stays_local() {
        // Host 1's full config as the lab makes it: tenant t charged to a cgroup here.
        let mut full = desired(&base(), &Cluster::default(), &cluster());
        let t = full.tenants.iter_mut().find(|t| t.name == "t").unwrap();
        t.cpu_quota = Some(0.5);
        t.cgroup = Some("/sys/fs/cgroup/t".into());
        t.slo = Some(Slo {
            latency_us: Some(500),
            ..Slo::default()
        });
        let records = Cluster::from_configs(&[full.clone()]);
        // Host 1's own VMs only (b is host 2's); the SLO under slos/, no charge in etcd.
        assert_eq!(
            records.vms.keys().collect::<Vec<_>>(),
            ["a", "cni1"],
            "{:?}",
            records.vms.keys()
        );
        assert_eq!(records.hosts.len(), 3);
        let t = &records.tenants["t"];
        assert_eq!(
            (t.cpu_quota, t.cgroup.is_none(), t.slo.is_none()),
            (None, true, true)
        );
        assert_eq!(records.slos["t"].latency_us, Some(500));
        // The host's file names itself and its charge; etcd gives the rest.
        let mut own = base();
        own.tenants
            .push(full.tenants.iter().find(|t| t.name == "t").unwrap().clone());
        let next = desired(&own, &Cluster::default(), &records);
        next.validate().unwrap();
        let t = next.tenants.iter().find(|t| t.name == "t").unwrap();
        assert_eq!(t.cpu_quota, Some(0.5));
        assert_eq!(
            t.cgroup.as_deref(),
            Some(std::path::Path::new("/sys/fs/cgroup/t"))
        );
        assert_eq!(t.slo.as_ref().unwrap().latency_us, Some(500));
        // A quota set in etcd is etcd's; the cgroup stays the host's.
        let mut set = records.clone();
        set.tenants.get_mut("t").unwrap().cpu_quota = Some(2.0);
        let t = desired(&next, &records, &set);
        let t = t.tenants.iter().find(|t| t.name == "t").unwrap();
        assert_eq!((t.cpu_quota, t.cgroup.is_some()), (Some(2.0), true));
    }

    #[test]
    fn the_feedback_key_record_becomes_the_hosts_keys_and_leaves_with_it() {
        let before = cluster();
        let on1 = desired(&base(), &Cluster::default(), &before);
        assert!(on1.feedback_keys.is_none());
        let mut after = before.clone();
        let record = serde_json::json!({
            "active": {"epoch": 1, "key": "11".repeat(32)},
            "next": {"epoch": 2, "key": "22".repeat(32)},
        });
        put_json(&mut after, "keys/feedback", record);
        assert!(!after.same_deployment(&before));
        let next = desired(&on1, &before, &after);
        next.validate().unwrap();
        let keys = next.feedback_keys.as_ref().unwrap();
        assert_eq!(keys.all().map(|k| k.epoch).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(
            names(&diff(&on1, &next).unwrap()),
            [format!("set feedback keys ({})", keys.describe())]
        );
        // Removed from etcd: gone here too.
        let mut gone = after.clone();
        gone.set(P, "/picnic/keys/feedback", None).unwrap();
        assert!(desired(&next, &after, &gone).feedback_keys.is_none());
        // A bad record is refused naming the key; other names under keys/ too.
        let short = serde_json::json!({"active": {"epoch": 1, "key": "11"}});
        let e = after
            .set(
                P,
                "/picnic/keys/feedback",
                Some(short.to_string().as_bytes()),
            )
            .unwrap_err();
        assert!(
            e.contains("keys/feedback") && e.contains("active.key"),
            "{e}"
        );
        let e = after.set(P, "/picnic/keys/other", Some(b"{}")).unwrap_err();
        assert!(e.contains("only keys/feedback"), "{e}");
        assert_eq!(after.feedback_key.as_ref().unwrap().all().count(), 2);
    }

    #[test]
    fn bad_records_are_refused_naming_the_key() {
        let mut c = cluster();
        let e = c
            .set(
                P,
                "/picnic/vms/x",
                Some(vm("y", 7, 1).to_string().as_bytes()),
            )
            .unwrap_err();
        assert!(e.contains("/picnic/vms/x") && e.contains("'y'"), "{e}");
        let e = c.set(P, "/picnic/hosts/one", None).unwrap_err();
        assert!(e.contains("not a host id"), "{e}");
        let e = c
            .set(
                P,
                "/picnic/tenants/t",
                Some(br#"{"name":"t","vni":1,"slo":{}}"#),
            )
            .unwrap_err();
        assert!(e.contains("slos/t"), "{e}");
        let e = c.set(P, "/picnic/vms/a", Some(b"{")).unwrap_err();
        assert!(e.starts_with("/picnic/vms/a:"), "{e}");
        // Nothing changed, and keys of no kind are ignored.
        assert!(c.same_deployment(&cluster()));
        c.set(P, "/picnic/other/x", Some(b"?")).unwrap();
        c.set(P, "/elsewhere/vms/a", None).unwrap();
        assert!(c.same_deployment(&cluster()));
    }
}
