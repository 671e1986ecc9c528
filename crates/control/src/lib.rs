//! The cluster control plane (DESIGN.md section 4, "State"): hosts, tenants, VMs and SLOs
//! as records under one etcd prefix ([`cluster`]), watched by every switch ([`watch`]) and
//! changed by `picnic ctl` through [`store`]. docs/operations.md "Control plane".

pub mod cluster;
pub mod local;
pub mod store;
pub mod watch;
