//! Live changes (docs/switch.md "Live changes"): the API's new config becomes in-place
//! changes to the engines ([`crate::engine::Engine::apply_all`]), applied by the coordinator
//! ([`crate::coordinator`]) on its engine and then by every worker between passes. Only a new
//! VM's port is opened (by a keeper thread, asked by the API's thread before the coordinator
//! sees the change: setting up its rings takes milliseconds) and only a removed VM's port is
//! given up (kept open for [`PARK`](super::keeper::PARK) in case a VM is added on the same
//! interface, then closed). A list of changes is applied whole or not at all: a port that
//! cannot be opened stops it before anything changed, a change the engine refuses has the
//! ones before it undone.
use std::sync::{mpsc, Arc};

use anyhow::Context;

use super::command::{take_given_up, HANDOVER};
use super::keeper::PortKeeper;
use super::{CommandSender, PortSpec, Reconfigure, Switch};
use crate::cgroup::CpuQuota;
use crate::config::Config;
use crate::engine::IRON_PERIOD;
use crate::port::Port;

/// Takes the port named `name` out of `list`.
pub(crate) fn take_named(list: &mut Vec<Box<dyn Port>>, name: &str) -> Option<Box<dyn Port>> {
    let at = list.iter().position(|p| p.name() == name)?;
    Some(list.swap_remove(at))
}

impl Switch {
    /// The API's end of the coordinator's command queue (replaces any earlier one).
    pub fn command_channel(&mut self) -> CommandSender {
        let (tx, rx) = mpsc::channel();
        self.commands = Some(rx);
        let keeper = self
            .port_keeper()
            .map_err(|e| tracing::warn!("the coordinator opens new ports itself: {e}"))
            .ok()
            .cloned();
        CommandSender {
            tx,
            keeper,
            given_up: self.given_up.clone(),
        }
    }

    /// The port keeper, started on first use.
    fn port_keeper(&mut self) -> anyhow::Result<&PortKeeper> {
        if self.keeper.is_none() {
            self.keeper = Some(PortKeeper::start(self.opener.clone())?);
        }
        Ok(self.keeper.as_ref().expect("started above"))
    }

    /// Opens `specs`' ports through the keeper (a removed VM's parked port is taken back)
    /// and waits for them: for the coordinator, which no frame waits for.
    pub(crate) fn open_ports(
        &mut self,
        specs: Vec<PortSpec>,
    ) -> anyhow::Result<Vec<Box<dyn Port>>> {
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let closed = take_given_up(&self.given_up, std::time::Duration::ZERO);
        self.port_keeper()?.open_now(specs, closed)
    }

    /// Closes removed VMs' ports through the keeper (AF_PACKET ones are parked first).
    pub(crate) fn close_ports(&mut self, ports: Vec<Box<dyn Port>>) {
        match self.port_keeper() {
            Ok(keeper) => keeper.close(ports),
            Err(_) => drop(ports),
        }
    }

    /// Gives up `ports` opened for a stale change: the next change takes them to the keeper.
    fn give_up(&self, ports: Vec<Box<dyn Port>>) {
        let now = std::time::Instant::now();
        let mut list = self.given_up.lock().unwrap_or_else(|e| e.into_inner());
        list.extend(ports.into_iter().map(|p| (now, p)));
    }

    /// Hands the keeper the ports given up [`HANDOVER`] ago that no change took (at a
    /// publish).
    pub(crate) fn hand_over_given_up(&mut self) {
        let closed = take_given_up(&self.given_up, HANDOVER);
        if !closed.is_empty() {
            self.close_ports(closed);
        }
    }

    /// Checks an API change against this switch. It was diffed from the config running now
    /// (the API answers one request at a time) unless a change the API gave up waiting for
    /// was applied since: then it is diffed again, here.
    pub(crate) fn prepare(&self, change: Reconfigure) -> anyhow::Result<Reconfigure> {
        let running = self.shared.config();
        if let (Some(running), Some(base)) = (running, &change.base) {
            if Arc::ptr_eq(&running, base) {
                return Ok(change);
            }
        }
        // Ports opened for the stale diff: the keeper takes back those the new one needs.
        self.give_up(change.opened);
        Reconfigure::prepare(Arc::new(self.cfg.clone()), change.cfg)
    }

    /// After a live change: each tenant slot charges the cgroup its tenant names now; a
    /// cgroup no longer charged gets back the allocation `old` gave it.
    pub(crate) fn sync_cgroups(&mut self, old: &Config) -> anyhow::Result<()> {
        let tenants = &self.engine.dir.tenants;
        let want: Vec<Option<std::path::PathBuf>> = tenants
            .iter()
            .map(|t| {
                (t.present && self.cfg.isolation.cpu_accounting)
                    .then(|| t.cgroup.clone())
                    .flatten()
            })
            .collect();
        self.cgroups
            .resize_with(want.len().max(self.cgroups.len()), || None);
        for (slot, want) in want.into_iter().enumerate() {
            let have = self.cgroups[slot].as_ref().map(|(p, _)| p);
            if have == want.as_ref() {
                continue;
            }
            self.release_cgroup(slot, old);
            if let Some(dir) = want {
                let group = CpuQuota::open(&dir, IRON_PERIOD)
                    .with_context(|| format!("cgroup {}", dir.display()))?;
                self.cgroups[slot] = Some((dir, group));
            }
        }
        Ok(())
    }
}

/// Whether the shared encryption engine's inputs differ between `old` and `new`: which
/// tenants encrypt (in config order: the engine's weights follow it), their keys and
/// weights, or the engine's section.
pub(crate) fn encryption_changed(old: &Config, new: &Config) -> bool {
    let encrypting = |c: &Config| c.tenants.iter().any(|t| t.encrypt);
    if !encrypting(old) && !encrypting(new) {
        return false;
    }
    let inputs = |c: &Config| {
        c.tenants
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.encrypt,
                    t.key.clone(),
                    t.key_file.clone(),
                    t.key_epoch,
                    t.accel_weight,
                )
            })
            .collect::<Vec<_>>()
    };
    inputs(old) != inputs(new) || serde_json::json!(old.accel) != serde_json::json!(new.accel)
}
