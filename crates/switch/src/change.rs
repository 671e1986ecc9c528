//! Live changes (docs/switch.md "Live changes"): a new configuration from the API becomes the
//! list of in-place changes that turns the running one into it, each touching one host,
//! tenant or VM ([`crate::engine::Engine::apply`]). Nothing is rebuilt, so a change to one
//! tenant leaves every other tenant's queues, limiters and scheduler state as they were.

use crate::config::{Config, FeedbackKeys, HostEntry, TenantEntry, VmEntry};

/// One change to the directory and the engines.
#[derive(Clone, Debug)]
pub enum Change {
    /// Adds a host or changes its underlay address or MAC.
    SetHost(HostEntry),
    RemoveHost(u32),
    AddTenant(TenantEntry),
    /// Changes a tenant's VNI, CPU quota, cgroup or SLO (same name).
    SetTenant(TenantEntry),
    RemoveTenant(String),
    AddVm(VmEntry),
    /// Changes a VM's addresses, allowed EtherTypes, rates, packet rate or shaped classes
    /// (same name, id, tenant, host and port).
    SetVm(VmEntry),
    RemoveVm(String),
    /// Replaces the feedback keys (the control plane's `keys/feedback`); None: back to
    /// `switch.feedback_key_file`'s key, if any.
    SetFeedbackKeys(Option<FeedbackKeys>),
}

/// The changes from `old` to `new`, in an order that keeps every intermediate directory
/// consistent: VMs leave first, then hosts and tenants are added or changed, VMs are added
/// or changed, and tenants and hosts leave last. A VM whose id, tenant, host or port differs
/// is removed and added again; the feedback keys change last. Fails, naming the section, if
/// anything but `hosts`, `tenants`, `vms` and `feedback_keys` differs: those need a restart.
pub fn diff(old: &Config, new: &Config) -> Result<Vec<Change>, String> {
    let fixed = [
        ("switch", same(&old.switch, &new.switch)),
        ("uplink", same(&old.uplink, &new.uplink)),
        ("isolation", same(&old.isolation, &new.isolation)),
        ("ingress", same(&old.ingress, &new.ingress)),
        ("egress", same(&old.egress, &new.egress)),
        ("control", old.control == new.control),
    ];
    if let Some((name, _)) = fixed.iter().find(|(_, same)| !same) {
        return Err(format!(
            "{name}: only hosts, tenants and vms change live; restart the switch to change {name}"
        ));
    }
    let identity = |v: &VmEntry| (v.id, v.tenant.clone(), v.host, serde_json::json!(v.port));
    let mut changes = Vec::new();
    let old_vm = |name: &str| old.vms.iter().find(|v| v.name == name);
    let new_vm = |name: &str| new.vms.iter().find(|v| v.name == name);
    for o in &old.vms {
        if new_vm(&o.name).is_none_or(|n| identity(n) != identity(o)) {
            changes.push(Change::RemoveVm(o.name.clone()));
        }
    }
    for h in &new.hosts {
        if old
            .hosts
            .iter()
            .find(|o| o.id == h.id)
            .is_none_or(|o| !same(o, h))
        {
            changes.push(Change::SetHost(h.clone()));
        }
    }
    for t in &new.tenants {
        match old.tenants.iter().find(|o| o.name == t.name) {
            None => changes.push(Change::AddTenant(t.clone())),
            Some(o) if !same(o, t) => changes.push(Change::SetTenant(t.clone())),
            Some(_) => {}
        }
    }
    for n in &new.vms {
        match old_vm(&n.name) {
            Some(o) if identity(o) == identity(n) => {
                if !same(o, n) {
                    changes.push(Change::SetVm(n.clone()));
                }
            }
            _ => changes.push(Change::AddVm(n.clone())),
        }
    }
    for o in &old.tenants {
        if !new.tenants.iter().any(|t| t.name == o.name) {
            changes.push(Change::RemoveTenant(o.name.clone()));
        }
    }
    for o in &old.hosts {
        if !new.hosts.iter().any(|h| h.id == o.id) {
            changes.push(Change::RemoveHost(o.id));
        }
    }
    if old.feedback_keys != new.feedback_keys {
        changes.push(Change::SetFeedbackKeys(new.feedback_keys.clone()));
    }
    Ok(changes)
}

/// `cfg` with `change` made to its hosts, tenants or VMs: what the running config is after
/// part of a change list was applied (a failed change reports it).
pub fn apply_to(cfg: &mut Config, change: &Change) {
    fn put<T>(list: &mut Vec<T>, item: &T, same: impl Fn(&T) -> bool)
    where
        T: Clone,
    {
        match list.iter_mut().find(|x| same(x)) {
            Some(x) => *x = item.clone(),
            None => list.push(item.clone()),
        }
    }
    match change {
        Change::SetHost(h) => put(&mut cfg.hosts, h, |x| x.id == h.id),
        Change::RemoveHost(id) => cfg.hosts.retain(|h| h.id != *id),
        Change::AddTenant(t) | Change::SetTenant(t) => {
            put(&mut cfg.tenants, t, |x| x.name == t.name)
        }
        Change::RemoveTenant(name) => cfg.tenants.retain(|t| &t.name != name),
        Change::AddVm(v) | Change::SetVm(v) => put(&mut cfg.vms, v, |x| x.name == v.name),
        Change::RemoveVm(name) => cfg.vms.retain(|v| &v.name != name),
        Change::SetFeedbackKeys(keys) => cfg.feedback_keys = keys.clone(),
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::SetHost(h) => write!(f, "set host {}", h.id),
            Change::RemoveHost(id) => write!(f, "remove host {id}"),
            Change::AddTenant(t) => write!(f, "add tenant '{}'", t.name),
            Change::SetTenant(t) => write!(f, "change tenant '{}'", t.name),
            Change::RemoveTenant(name) => write!(f, "remove tenant '{name}'"),
            Change::AddVm(v) => write!(f, "add VM '{}'", v.name),
            Change::SetVm(v) => write!(f, "change VM '{}'", v.name),
            Change::RemoveVm(name) => write!(f, "remove VM '{name}'"),
            Change::SetFeedbackKeys(keys) => write!(
                f,
                "set feedback keys ({})",
                keys.as_ref().map_or("none".into(), |k| k.describe())
            ),
        }
    }
}

/// Whether two entries are equal, compared by their serialized form (the entries hold
/// floats: SLOs, shaped classes).
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::EXAMPLE;

    /// Changes compare by their Debug form (the entries hold floats and are not `Eq`).
    fn show(changes: Vec<Change>) -> String {
        format!("{changes:?}")
    }

    #[test]
    fn each_edit_is_one_change_and_identity_edits_remove_and_add() {
        let old = Config::parse(EXAMPLE).unwrap();
        assert!(diff(&old, &old).unwrap().is_empty());
        // A guarantee: one SetVm.
        let mut new = old.clone();
        new.vms[0].min_mbps = 300;
        assert_eq!(
            show(diff(&old, &new).unwrap()),
            show(vec![Change::SetVm(new.vms[0].clone())])
        );
        // A tenant with a VM added; its SLO set.
        let mut added = old.clone();
        let mut t = added.tenants[0].clone();
        t.name = "b".into();
        t.vni = 200;
        added.tenants.push(t.clone());
        let mut vm = added.vms[0].clone();
        vm.name = "b1".into();
        vm.id = 9;
        vm.tenant = "b".into();
        vm.port = Some(crate::config::PortEntry {
            ifname: "b1".into(),
            backend: Default::default(),
            create: false,
            socket: None,
            cpus: Vec::new(),
        });
        added.vms.push(vm.clone());
        assert_eq!(
            show(diff(&old, &added).unwrap()),
            show(vec![
                Change::AddTenant(t.clone()),
                Change::AddVm(vm.clone())
            ])
        );
        // ... and removed again: the VM first, the tenant last.
        assert_eq!(
            show(diff(&added, &old).unwrap()),
            show(vec![
                Change::RemoveVm("b1".into()),
                Change::RemoveTenant("b".into())
            ])
        );
        // Moving a VM to another port is a remove and an add.
        let mut moved = added.clone();
        moved.vms[2].port.as_mut().unwrap().ifname = "b1x".into();
        assert_eq!(
            show(diff(&added, &moved).unwrap()),
            show(vec![
                Change::RemoveVm("b1".into()),
                Change::AddVm(moved.vms[2].clone())
            ])
        );
        // Hosts: a new address is a SetHost; a removed host goes last.
        let mut hosts = old.clone();
        hosts.hosts[1].underlay_ip = [198, 19, 0, 9].into();
        assert_eq!(
            show(diff(&old, &hosts).unwrap()),
            show(vec![Change::SetHost(hosts.hosts[1].clone())])
        );
        // Anything outside hosts, tenants and vms is refused, naming the section.
        let mut iso = old.clone();
        iso.isolation.cpu_fair = !iso.isolation.cpu_fair;
        assert!(diff(&old, &iso).unwrap_err().starts_with("isolation:"));
    }

    /// Making a diff's changes to the old config gives the new one (by what diff compares).
    #[test]
    fn applying_the_changes_to_the_old_config_gives_the_new_one() {
        let old = Config::parse(EXAMPLE).unwrap();
        let mut new = old.clone();
        new.vms.remove(0);
        new.vms[0].min_mbps += 7;
        let mut t = new.tenants[0].clone();
        t.name = "b".into();
        t.vni = 300;
        new.tenants.push(t);
        new.hosts[1].underlay_ip = [198, 19, 0, 9].into();
        let mut made = old.clone();
        for c in diff(&old, &new).unwrap() {
            apply_to(&mut made, &c);
        }
        assert!(diff(&made, &new).unwrap().is_empty());
        assert!(!diff(&old, &new).unwrap().is_empty());
    }
}
