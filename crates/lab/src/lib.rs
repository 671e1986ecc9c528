//! picnic-lab: the testbed builder and traffic workloads of `picnic lab` (DESIGN.md 5).
//!
//! A scenario file ([`scenario`]) describes hosts, tenants with VMs and SLOs, and
//! workloads. [`topology`] builds it in network namespaces ([`netns`]): a fabric namespace
//! with a bridge whose host-facing ports are shaped to the access-link rate, a namespace
//! per host running a [`dataplane`], a namespace per VM. [`workload`] drives real traffic
//! between VMs and [`run`] runs a scenario in several modes, reported by [`report`].

pub mod cgroup;
pub mod cpu_burn;
pub mod dataplane;
pub mod netns;
pub mod picnic;
pub mod plot;
pub mod report;
pub mod run;
pub mod scenario;
pub mod shaped;
pub mod topology;
pub mod workload;

pub use dataplane::{Dataplane, DataplaneFactory, LinuxBridge};
pub use run::{exit_code, run_loaded, run_scenario, Mode, Outcome, RunOptions};
pub use scenario::Scenario;
pub use topology::{HostView, Topology, VmView};
