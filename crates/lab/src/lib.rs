//! picnic-lab: the testbed builder and traffic workloads of `picnic lab` (DESIGN.md 5).
//!
//! A scenario file (`picnic_scenario`, shared with the simulator) describes hosts, tenants
//! with VMs and SLOs, and workloads. [`topology`] builds its plan in network namespaces
//! (`picnic_netns`): a fabric namespace with a bridge whose host-facing ports are shaped to
//! the access-link rate, a namespace per host running a [`dataplane`], a namespace per VM.
//! [`workload`] drives real traffic between VMs and [`run`] runs a scenario in several
//! modes, reported by the scenario crate's report.

pub mod cgroup;
pub mod churn;
pub mod control;
pub mod cpu_burn;
pub mod dataplane;
pub mod picnic;
pub mod plot;
pub mod run;
pub mod topology;
pub mod workload;

pub use control::Control;
pub use dataplane::{Dataplane, DataplaneFactory, LinuxBridge};
pub use run::{exit_code, run_loaded, run_scenario, Outcome, RunOptions};
