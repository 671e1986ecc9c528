//! The picnic dataplane (DESIGN.md section 4): packet buffers and port backends, the
//! sans-I/O egress and ingress engines, config, the run loop, the control API and metrics.

pub mod accel;
pub mod api;
pub mod cgroup;
pub mod change;
pub mod config;
mod coordinator;
pub mod directory;
pub mod driver;
pub mod ebpf;
pub mod engine;
pub mod fastpath;
pub mod frame;
pub mod offload;
pub mod persist;
pub mod port;
pub mod runner;
pub mod sched;
pub mod stats;
pub mod worker;
pub mod workers;
