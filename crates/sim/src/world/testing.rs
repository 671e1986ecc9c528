//! A small deployment for unit tests: three hosts on one 1 Gb/s big switch, one tenant `t`
//! with VM `a` on h1, `b` on h2 and `c` on h3; the test adds workloads and `[sim]` fields.

use picnic_scenario::Mode;

use super::World;
use crate::spec::Spec;

const BASE: &str = r#"
name = "unit"
duration_ms = 300
access_link_mbps = 1000
access_queue_ms = 2
hosts = ["h1", "h2", "h3"]
victim = "t"

[[tenants]]
name = "t"
min_mbps = 100
vms = [{ name = "a", host = "h1" }, { name = "b", host = "h2" }, { name = "c", host = "h3" }]
"#;

/// The deployment of the base scenario plus `extra` (TOML), in `mode`, seed 1.
pub(super) fn world(extra: &str, mode: &str) -> World {
    let spec = Spec::parse(&format!("{BASE}{extra}")).expect("a valid test scenario");
    World::new(&spec, &Mode::named(mode).expect("a known mode"), 1).expect("a deployment")
}

/// A `[[workloads]]` table: `name` of `kind` from VM `from` to VM `to`, plus `fields`
/// (`key = value` lines).
pub(super) fn workload(name: &str, kind: &str, from: &str, to: &str, fields: &[&str]) -> String {
    let head = format!("name = \"{name}\"\nkind = \"{kind}\"\nfrom = \"{from}\"\nto = \"{to}\"");
    format!("\n[[workloads]]\n{head}\n{}\n", fields.join("\n"))
}

/// Runs `world` to its end, without progress lines.
pub(super) fn run(world: &mut World) -> super::RunStats {
    world.run(&mut |_| {})
}
