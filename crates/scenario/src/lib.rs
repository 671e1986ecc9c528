//! picnic-scenario: one scenario model under both runners of a scenario, the lab
//! (`picnic lab`, namespaces and real traffic) and the simulator (`picnic sim`, the
//! switch's engines on a virtual clock). Pure: nothing here touches the network.
//!
//! - [`file`] (and `validate.rs`): the scenario file (hosts, tenants with VMs and SLOs,
//!   workloads, victim, pass marks; docs/scenarios.md) and its validation;
//! - [`check`]: the pass-mark grammar;
//! - [`mode`]: the modes a scenario runs in ([`Mode`], the same in both runners);
//! - [`plan`]: the testbed as data (names, MACs, addresses);
//! - [`switch`]: the scenario -> switch config mapping;
//! - [`results`]: what a runner measures per workload ([`WorkloadResult`]);
//! - [`metrics`], [`shares`], [`summary`] (and `table.rs`), [`files`]: the report, per-tenant
//!   and scenario metrics, summary.json, the side-by-side table and the CSVs.
//!
//! A lab run and a simulated run of the same file so give a summary with the same keys.

pub mod check;
pub mod file;
pub mod files;
pub mod metrics;
pub mod mode;
pub mod plan;
pub mod results;
pub mod shares;
pub mod summary;
pub mod switch;
mod table;
mod validate;

pub use check::Check;
pub use file::{
    Churn, ChurnOutcome, PicnicSettings, Protocol, Scenario, Tenant, Vm, Workload, WorkloadKind,
    BASE_PORT, DEFAULT_RPC_RATE, DEFAULT_SIZE, DEFAULT_TIMEOUT_MS, MAX_NAME_LEN,
};
pub use files::write_outputs;
pub use metrics::{ModeReport, SwitchSlo, TenantMetrics};
pub use mode::{Dataplane, Mode};
pub use results::{WorkloadResult, BIN_MS};
pub use summary::Summary;

#[cfg(test)]
mod tests;
