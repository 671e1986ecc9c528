//! `picnic lab run --control etcd`: the picnic modes' hosts built from a real etcd (issue 33,
//! docs/operations.md "Control plane"). The lab starts a single-member etcd on loopback,
//! puts the deployment into it with the records `picnic ctl` writes, and gives every switch
//! a config naming only itself, the etcd endpoint and its tenants' CPU charge on that host;
//! each switch's watcher (`picnic_control::watch`) applies the rest as live changes.

use std::path::PathBuf;

use anyhow::{Context, Result};
use picnic_control::cluster::Cluster;
use picnic_control::local::LocalEtcd;
use picnic_control::store;
use picnic_scenario::plan::Topology;
use picnic_scenario::switch::dataplane_config;
use picnic_scenario::{Dataplane as Kind, Scenario};
use picnic_switch::config::{Config, ControlSection, CONTROL_PREFIX};

/// Where the lab's hosts get their deployment from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Control {
    /// Every host's config lists the whole deployment.
    #[default]
    Files,
    /// A real etcd the lab starts for each picnic run.
    Etcd,
}

/// One run's etcd, holding the deployment; stopped and its data removed on drop.
pub struct LabControl {
    etcd: Option<LocalEtcd>,
    dir: PathBuf,
}

impl LabControl {
    /// Starts etcd for run `run_id` and puts every host, tenant, SLO and VM of `scenario` on
    /// `topo` (as `dataplane` configures them) into it.
    pub fn start(
        scenario: &Scenario,
        topo: &Topology,
        dataplane: Kind,
        run_id: &str,
    ) -> Result<LabControl> {
        let dir = std::env::temp_dir().join(format!("picnic-lab-control-{run_id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut control = LabControl { etcd: None, dir };
        let etcd = LocalEtcd::start(&control.dir.join("etcd"))?;
        let configs = topo
            .hosts
            .iter()
            .map(|h| dataplane_config(scenario, topo, h, dataplane))
            .collect::<Result<Vec<_>>>()?;
        let records = Cluster::from_configs(&configs);
        control.block(async {
            let mut client = store::connect(&etcd.endpoints()).await?;
            store::put_all(&mut client, CONTROL_PREFIX, &records).await
        })?;
        control.etcd = Some(etcd);
        Ok(control)
    }

    /// Runs `f` to completion on a runtime of its own.
    fn block<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(f)
    }

    /// The etcd endpoints.
    pub fn endpoints(&self) -> Vec<String> {
        self.etcd.iter().flat_map(LocalEtcd::endpoints).collect()
    }

    /// What host `full`'s switch runs from its file: `full` (its whole deployment) cut to
    /// itself, the control plane and the tenants charged to a cgroup on this host (Iron
    /// 3.2's charge is the host's, `Cluster::from_configs`); its state in the run's directory.
    pub fn host_config(&self, full: &Config) -> Config {
        let mut cfg = full.clone();
        let me = cfg.switch.host_id;
        cfg.hosts.retain(|h| h.id == me);
        cfg.vms.clear();
        cfg.tenants.retain(|t| t.cgroup.is_some());
        cfg.switch.state_file = Some(self.dir.join(format!("host{me}.state.json")));
        cfg.control = Some(ControlSection {
            etcd: self.endpoints(),
            prefix: CONTROL_PREFIX.into(),
        });
        cfg
    }
}

impl Drop for LabControl {
    fn drop(&mut self) {
        self.etcd.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
