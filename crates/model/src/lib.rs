//! Producer/consumer speed mismatches after Rizzo, Garzarella, Lettieri, Maffione,
//! "A Study of Speed Mismatches Between Communicating Virtual Machines" (ANCS 2016):
//! the closed-form model ([`model`]), an event-driven simulator ([`sim`]), a real
//! two-thread prototype ([`real`]) and the `picnic model` command line ([`cli`]). The
//! parameters, Table 1 and the adaptive wait control of §4.1 are sans-I/O code in
//! `picnic_core::notify`; the simulator and the prototype run that same control.

pub mod cli;
pub mod figures;
pub mod model;
pub mod real;
pub mod sim;
pub use cli::{run_cli, ModelArgs};
