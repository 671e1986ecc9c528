//! Behaviour of the hierarchical weighted fair scheduler (`picnic_core::wfq`):
//! bounded-lag fairness for every cost kind and tree shape, hierarchy, CPU
//! fairness with measured cost and settlement, caps, bounded buffers, live
//! changes. Everything runs on a virtual clock.

mod caps;
mod changes;
mod harness;
mod sharing;
