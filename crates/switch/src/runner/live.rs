//! Live changes in the run loop (docs/switch.md "Live changes"): the API's new config
//! becomes in-place changes to the engines ([`crate::engine::Engine::apply`]); only a new
//! VM's port is opened (on a helper thread: setting up its rings takes milliseconds that
//! forwarding must not wait for) and only a removed VM's port is closed.

use std::sync::mpsc;

use anyhow::Context;
use picnic_core::Duration;

use super::{open_port, ring_wait, tenant_ports, vm_max_frame_of, Command, Switch};
use crate::accel::Accel;
use crate::cgroup::CpuQuota;
use crate::change::Change;
use crate::config::{Backend, Config};
use crate::engine::{PortChange, IRON_PERIOD};
use crate::port::Port;

/// A port to open for a new VM: interface, backend, config field, largest frame.
pub(super) type PortSpec = (String, Backend, String, usize);

/// A change waiting for the ports a helper thread opens for it.
pub(super) struct Opening {
    done: mpsc::Receiver<anyhow::Result<Vec<Box<dyn Port>>>>,
    cfg: Config,
    changes: Vec<Change>,
    reply: mpsc::Sender<anyhow::Result<()>>,
}

impl Switch {
    /// Applies the API's changes in order. A change that needs new ports has them opened on
    /// a helper thread (setting up a port's rings takes milliseconds, which forwarding must
    /// not wait for) and is applied once they are open; later changes wait for it.
    pub(super) fn apply_commands(&mut self) {
        if let Some(o) = self.opening.take() {
            match o.done.try_recv() {
                Ok(ports) => {
                    let result = ports.and_then(|ports| self.commit(o.cfg, &o.changes, ports));
                    let _ = o.reply.send(result);
                }
                Err(mpsc::TryRecvError::Empty) => {
                    self.opening = Some(o);
                    return;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    let _ = o
                        .reply
                        .send(Err(anyhow::anyhow!("opening the new ports failed")));
                }
            }
        }
        let Some(rx) = self.commands.take() else {
            return;
        };
        while self.opening.is_none() {
            let Ok(Command::Reconfigure(cfg, reply)) = rx.try_recv() else {
                break;
            };
            match self.prepare(*cfg) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok((cfg, changes, specs)) if specs.is_empty() => {
                    let _ = reply.send(self.commit(cfg, &changes, Vec::new()));
                }
                Ok((cfg, changes, specs)) => {
                    let (tx, done) = mpsc::channel();
                    std::thread::spawn(move || {
                        let ports = specs
                            .iter()
                            .map(|(ifname, backend, field, max_frame)| {
                                open_port(ifname, *backend, field, *max_frame)
                            })
                            .collect();
                        let _ = tx.send(ports);
                    });
                    self.opening = Some(Opening {
                        done,
                        cfg,
                        changes,
                        reply,
                    });
                }
            }
        }
        self.commands = Some(rx);
    }

    /// Checks a new config and turns it into live changes ([`crate::change::diff`]), with
    /// the ports its new VMs need opened (interface, backend, config field, largest frame).
    fn prepare(&self, cfg: Config) -> anyhow::Result<(Config, Vec<Change>, Vec<PortSpec>)> {
        cfg.validate()?;
        let changes = crate::change::diff(&self.cfg, &cfg).map_err(anyhow::Error::msg)?;
        let mut specs = Vec::new();
        for change in &changes {
            let Change::AddVm(vm) = change else { continue };
            let Some(p) = vm.port.as_ref().filter(|_| vm.host == cfg.switch.host_id) else {
                continue;
            };
            if self.port_index(&p.ifname).is_some() {
                continue;
            }
            let i = cfg.vms.iter().position(|v| v.name == vm.name).unwrap_or(0);
            let field = format!("vms[{i}].port.ifname");
            specs.push((
                p.ifname.clone(),
                p.backend,
                field,
                vm_max_frame_of(&cfg, &vm.tenant),
            ));
        }
        Ok((cfg, changes, specs))
    }

    /// Applies live changes, each touching only its host, tenant or VM in place, with the
    /// new VMs' ports `opened` (all opened before anything is applied: if one could not be,
    /// nothing changed). A removed VM's port is closed (dropped on a helper thread); the other
    /// ports, their rings and their waits are not touched.
    fn commit(
        &mut self,
        cfg: Config,
        changes: &[Change],
        mut opened: Vec<Box<dyn Port>>,
    ) -> anyhow::Result<()> {
        let now = self.clock.now();
        let spin = Duration::from_micros(cfg.switch.spin_us);
        let mut closed: Vec<Box<dyn Port>> = Vec::new();
        // XDP drops counted so far belong to the VMs in their slots now.
        self.kernel.publish(&mut self.engine, now);
        for change in changes {
            let port = self
                .engine
                .apply(now, change, &mut self.pool)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            match (port, change) {
                (Some(PortChange::Closed(slot)), _) => {
                    closed.extend(self.ports.get_mut(slot).and_then(Option::take));
                }
                (Some(PortChange::Opened(slot)), Change::AddVm(vm)) => {
                    let name = &vm.port.as_ref().expect("local VM").ifname;
                    let take = |list: &mut Vec<Box<dyn Port>>| {
                        let at = list.iter().position(|p| p.name() == name)?;
                        Some(list.swap_remove(at))
                    };
                    let port = take(&mut opened).or_else(|| take(&mut closed));
                    if self.ports.len() <= slot {
                        self.ports.resize_with(slot + 1, || None);
                    }
                    self.ports[slot] = port;
                    self.waits
                        .resize_with(self.ports.len(), || (ring_wait(spin), 0));
                    self.waits[slot] = (ring_wait(spin), 0);
                }
                _ => {}
            }
        }
        if !closed.is_empty() {
            std::thread::spawn(move || drop(closed));
        }
        if let Err(e) = self.kernel.set_ports(&tenant_ports(&self.ports)) {
            eprintln!("picnic switch: warning: softirq accounting: {e}");
        }
        // Tenants that encrypt, and their keys, as the new config says (keys rotate here).
        let accel = Accel::from_config_after(&cfg, self.accel.as_ref())?;
        self.set_accel(accel);
        let old = std::mem::replace(&mut self.cfg, cfg);
        self.shared.set_config(self.cfg.clone());
        self.sync_cgroups(&old)
    }

    /// Applies a new config at once, opening its new ports on this thread (the workers'
    /// coordinator, whose workers are paused meanwhile).
    pub(crate) fn reconfigure(&mut self, cfg: Config) -> anyhow::Result<()> {
        let (cfg, changes, specs) = self.prepare(cfg)?;
        let opened = specs
            .iter()
            .map(|(ifname, backend, field, max_frame)| {
                open_port(ifname, *backend, field, *max_frame)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.commit(cfg, &changes, opened)
    }

    /// After a live change: each tenant slot charges the cgroup its tenant names now; a
    /// cgroup no longer charged gets back the allocation `old` gave it.
    fn sync_cgroups(&mut self, old: &Config) -> anyhow::Result<()> {
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
