//! The modes a scenario runs in, the same in the lab and the simulator: which dataplane
//! joins each host's VMs to its uplink, and whether the attack runs.
//!
//! A victim-alone mode runs the victim's own workloads only (not its `attack = true` ones)
//! and is what an attacked mode's ratios divide by: `picnic` and `picnic-off` by
//! `picnic-alone` (the victim alone through isolated picnic switches), `bridge` by
//! `victim-alone` (the victim alone over a forwarder without isolation). The lab's
//! forwarder without isolation is a Linux bridge per host; the simulator has no kernel
//! bridge, so there [`Dataplane::Bridge`] is the switch's engine with every isolation
//! mechanism off (forwarding only): `bridge` equals `picnic-off`, and `victim-alone` is the
//! victim alone through unisolated engines. Without the mode of its own dataplane an
//! attacked mode divides by the first victim-alone mode that ran.

use anyhow::{bail, Result};

/// What joins the VM ports of a host to its uplink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataplane {
    /// No isolation: a Linux bridge (lab), the engine with isolation off (simulator).
    Bridge,
    /// picnic switches.
    Picnic {
        /// Every isolation mechanism on (else forwarding and policy only).
        isolated: bool,
        /// CPU-fair schedulers (PicNIC's); false makes them byte-fair
        /// (`isolation.cpu_fair = false`).
        cpu_fair: bool,
        /// The kernel fast path (`fastpath.kernel`, docs/switch.md "Two paths").
        kernel_fastpath: bool,
    },
}

/// One way of running a scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mode {
    /// Name shown in the table and used as key in summary.json.
    pub name: String,
    /// False runs only the victim's workloads (a "victim alone" baseline).
    pub attackers: bool,
    /// The dataplane of every host.
    pub dataplane: Dataplane,
}

/// Every mode by name, in the default run order.
pub const MODES: &[&str] = &[
    "picnic",
    "picnic-off",
    "picnic-bytes",
    "bridge",
    "picnic-alone",
    "victim-alone",
    "picnic-engines",
    "picnic-engines-alone",
];

/// picnic as configured by default: every isolation mechanism, CPU-fair schedulers and the
/// kernel fast path (docs/switch.md "Two paths").
const PICNIC: Dataplane = Dataplane::Picnic {
    isolated: true,
    cpu_fair: true,
    kernel_fastpath: true,
};

/// picnic with the kernel fast path off: every frame through the user-space engines (measured
/// beside the default, issue 30).
const PICNIC_ENGINES: Dataplane = Dataplane::Picnic {
    isolated: true,
    cpu_fair: true,
    kernel_fastpath: false,
};

impl Mode {
    fn new(name: &str, attackers: bool, dataplane: Dataplane) -> Mode {
        Mode {
            name: name.to_owned(),
            attackers,
            dataplane,
        }
    }

    /// picnic switches with every isolation mechanism and the kernel fast path.
    pub fn picnic() -> Mode {
        Mode::new("picnic", true, PICNIC)
    }

    /// picnic switches with isolation off (forwarding and policy only, in the engines: the
    /// fast path's allocations are the mechanisms' own).
    pub fn picnic_off() -> Mode {
        let off = Dataplane::Picnic {
            isolated: false,
            cpu_fair: true,
            kernel_fastpath: false,
        };
        Mode::new("picnic-off", true, off)
    }

    /// picnic switches with every isolation mechanism but byte-fair schedulers instead of
    /// CPU-fair ones (PicNIC's comparison).
    pub fn picnic_bytes() -> Mode {
        let bytes = Dataplane::Picnic {
            isolated: true,
            cpu_fair: false,
            kernel_fastpath: true,
        };
        Mode::new("picnic-bytes", true, bytes)
    }

    /// A forwarder without isolation, all workloads.
    pub fn bridge() -> Mode {
        Mode::new("bridge", true, Dataplane::Bridge)
    }

    /// The victim alone through isolated picnic switches.
    pub fn picnic_alone() -> Mode {
        Mode::new("picnic-alone", false, PICNIC)
    }

    /// picnic switches with every isolation mechanism and the kernel fast path off.
    pub fn picnic_engines() -> Mode {
        Mode::new("picnic-engines", true, PICNIC_ENGINES)
    }

    /// The victim alone through picnic switches with the kernel fast path off.
    pub fn picnic_engines_alone() -> Mode {
        Mode::new("picnic-engines-alone", false, PICNIC_ENGINES)
    }

    /// The victim alone over a forwarder without isolation.
    pub fn victim_alone() -> Mode {
        Mode::new("victim-alone", false, Dataplane::Bridge)
    }

    /// The mode called `name` (one of [`MODES`]).
    pub fn named(name: &str) -> Result<Mode> {
        Ok(match name {
            "picnic" => Mode::picnic(),
            "picnic-off" => Mode::picnic_off(),
            "picnic-bytes" => Mode::picnic_bytes(),
            "bridge" => Mode::bridge(),
            "picnic-alone" => Mode::picnic_alone(),
            "victim-alone" => Mode::victim_alone(),
            "picnic-engines" => Mode::picnic_engines(),
            "picnic-engines-alone" => Mode::picnic_engines_alone(),
            other => bail!("unknown mode {other:?} (one of {})", MODES.join(", ")),
        })
    }

    /// Whether the hosts run picnic switches with every isolation mechanism on.
    pub fn isolated(&self) -> bool {
        matches!(self.dataplane, Dataplane::Picnic { isolated: true, .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_mode_is_known_and_victim_alone_is_the_unisolated_baseline() {
        for name in MODES {
            assert_eq!(Mode::named(name).unwrap().name, *name);
        }
        assert!(Mode::named("picnic-noiso").is_err());
        let alone = Mode::victim_alone();
        assert!(!alone.attackers && !alone.isolated());
        assert_eq!(alone.dataplane, Mode::bridge().dataplane);
        assert!(Mode::picnic_alone().isolated() && !Mode::picnic_alone().attackers);
        assert!(!Mode::picnic_off().isolated() && Mode::picnic_bytes().isolated());
    }
}
