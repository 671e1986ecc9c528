//! A CPU-bound tenant (the lab's `cpu_burn`, Iron 2.3's victim) on its host's one core.
//!
//! The simulator runs no tenant code, so the core is a fluid model, settled every Iron
//! period (10 ms) from what the host's switch did in it:
//! - the switch's work comes first: network processing runs ahead of the tenants (softirq in
//!   Iron 2.3, the switch's thread in the lab);
//! - the tenants with an allocation (`cpu_cores`) share the rest by their allocations (CFS
//!   shares), each up to its quota: its allocation, less the switch CPU the switch charged
//!   to it in the period when the switch charges tenants (picnic: Iron 3.2's cgroup
//!   charging), or the whole allocation when it does not (picnic-off);
//! - a tenant other than the burner wants its whole quota in a period in which the switch
//!   handled frames of its (network-heavy neighbours, as the lab's flood receiver and bulk
//!   sender), nothing otherwise; the burner always wants its whole quota.
//!
//! The burner's CPU in the period is counted in units of 1 ms, as the lab counts them
//! (125 bytes a unit: 1 Mb/s = 1,000 units/s), each with the wall time a unit took.

use super::super::stats::{Measurements, Slot};
use super::super::Net;
use crate::event::{Event, Nanos};

/// The accounting period: Iron's (the switch's cgroup refill), ns.
pub(in crate::world) const PERIOD_NS: Nanos = 10_000_000;
/// CPU time of one unit of work, ns (the lab's `cpu_burn` unit).
const UNIT_NS: u64 = 1_000_000;
/// Bytes a unit counts as in the throughput column (the lab's `BYTES_PER_UNIT`).
const BYTES_PER_UNIT: u64 = 125;

/// The burner on host `host`, in scenario tenant `tenant`.
pub(in crate::world) struct CpuBurn {
    pub host: u32,
    /// Its tenant in the host's engine, and in the scenario (the rate series).
    pub engine_tenant: usize,
    pub tenant: usize,
    pub slot: Slot,
    pub stop: Nanos,
    /// The switch's CPU and each tenant's charge and frames at the period's start.
    last_switch_ns: u64,
    last: Vec<(u64, u64)>,
    /// CPU toward the next unit, ns.
    partial: u64,
    /// When the unit under way started.
    unit_start: Nanos,
}

impl CpuBurn {
    pub fn new(host: u32, engine_tenant: usize, tenant: usize, slot: Slot, stop: Nanos) -> CpuBurn {
        CpuBurn {
            host,
            engine_tenant,
            tenant,
            slot,
            stop,
            last_switch_ns: 0,
            last: Vec::new(),
            partial: 0,
            unit_start: 0,
        }
    }

    /// The period that ends at `now`: the burner's CPU in it, counted in units; the next
    /// period's timer (app `a`).
    pub fn on_timer(&mut self, a: u32, now: Nanos, net: &mut Net, meas: &mut Measurements) {
        let host = &net.hosts[self.host as usize];
        let (tenants, switch_ns) = host.tenant_cpu();
        if self.last.is_empty() {
            // The first timer opens the first period.
            self.last = tenants.iter().map(|t| (t.charged_ns, t.frames)).collect();
            self.last_switch_ns = switch_ns;
            self.unit_start = now;
            net.queue.push(now + PERIOD_NS, Event::App(a, 0));
            return;
        }
        let switch = (switch_ns - self.last_switch_ns).min(PERIOD_NS);
        let mut wants: Vec<(f64, u64)> = Vec::new(); // (weight, quota) per tenant wanting CPU
        let mut mine = None;
        for (t, (cpu, last)) in tenants.iter().zip(&self.last).enumerate() {
            let Some(cores) = cpu.cores else { continue };
            let allocation = (cores * PERIOD_NS as f64) as u64;
            let charged = if host.charges_tenants() {
                cpu.charged_ns - last.0
            } else {
                0
            };
            let quota = allocation.saturating_sub(charged);
            if t == self.engine_tenant {
                mine = Some(wants.len());
            } else if cpu.frames == last.1 {
                continue;
            }
            wants.push((cores, quota));
        }
        self.last = tenants.iter().map(|t| (t.charged_ns, t.frames)).collect();
        self.last_switch_ns = switch_ns;
        let got = mine.map_or(0, |i| share_of(&wants, PERIOD_NS - switch)[i]);
        self.count(now, got, meas);
        if now + PERIOD_NS <= self.stop {
            net.queue.push(now + PERIOD_NS, Event::App(a, 0));
        }
    }

    /// Counts `cpu_ns` of work done in the period ending at `now`: each unit it completes,
    /// with its wall time (the period's units spread evenly over it).
    fn count(&mut self, now: Nanos, cpu_ns: u64, meas: &mut Measurements) {
        let period_start = now - PERIOD_NS;
        let mut done = 0;
        let mut used = 0;
        while self.partial + (cpu_ns - used) >= UNIT_NS {
            used += UNIT_NS - self.partial;
            self.partial = 0;
            // The unit ends when the period's CPU reaches it, CPU spread evenly in the period.
            let end = period_start + (used as u128 * PERIOD_NS as u128 / cpu_ns as u128) as u64;
            if let Some(h) = meas.result(self.slot).latency.as_mut() {
                let _ = h.record((end - self.unit_start).max(1));
            }
            self.unit_start = end;
            done += 1;
        }
        self.partial += cpu_ns - used;
        if done > 0 {
            meas.count_rx(self.slot, self.tenant, now, done * BYTES_PER_UNIT, done);
            meas.result(self.slot).sent += done;
        }
    }
}

/// CFS with bandwidth limits as water-filling: `capacity` ns shared in proportion to each
/// claimant's weight, none above its quota, what a capped one leaves going to the others.
fn share_of(wants: &[(f64, u64)], capacity: u64) -> Vec<u64> {
    let mut got = vec![0u64; wants.len()];
    let mut open: Vec<usize> = (0..wants.len()).collect();
    let mut left = capacity;
    while !open.is_empty() && left > 0 {
        let weight: f64 = open.iter().map(|&i| wants[i].0).sum();
        let mut capped = Vec::new();
        for &i in &open {
            let fair = (left as f64 * wants[i].0 / weight) as u64;
            if wants[i].1 - got[i] <= fair {
                capped.push(i);
            }
        }
        if capped.is_empty() {
            for &i in &open {
                got[i] += (left as f64 * wants[i].0 / weight) as u64;
            }
            break;
        }
        for &i in &capped {
            left -= wants[i].1 - got[i];
            got[i] = wants[i].1;
        }
        open.retain(|i| !capped.contains(i));
    }
    got
}

#[cfg(test)]
mod tests {
    use picnic_scenario::Mode;

    use super::share_of;
    use crate::spec::Spec;
    use crate::world::World;

    /// Iron 2.3 in small: a burner with 0.65 of h1's core beside a neighbour with 0.15 whose
    /// VM on h1 receives a flood from h2; units the burner did in `mode`.
    fn burner_units(mode: &str) -> u64 {
        let scenario = r#"
name = "steal"
duration_ms = 500
access_link_mbps = 1000
hosts = ["h1", "h2"]
victim = "burner"
[sim]
flood_pps = 800000
[[tenants]]
name = "burner"
cpu_cores = 0.65
vms = [{ name = "b", host = "h1" }]
[[tenants]]
name = "n"
cpu_cores = 0.15
vms = [{ name = "n1", host = "h2" }, { name = "n2", host = "h1" }]
[[workloads]]
name = "work"
kind = "cpu_burn"
from = "b"
to = "b"
[[workloads]]
name = "flood"
kind = "udp_flood"
from = "n1"
to = "n2"
size = 64
"#;
        let spec = Spec::parse(scenario).expect("a valid scenario");
        let mut w = World::new(&spec, &Mode::named(mode).expect("a mode"), 1).expect("built");
        w.run(&mut |_| {});
        let row = w.meas.results[0].iter().find(|r| r.name == "work");
        row.expect("the burner's row").received
    }

    #[test]
    fn the_switch_work_a_neighbour_causes_comes_out_of_its_allocation_not_the_burners() {
        // 0.65 of the 500 ms in 1 ms units.
        let entitled = 0.65 * 500.0;
        let (charged, uncharged) = (burner_units("picnic"), burner_units("picnic-off"));
        let alone = burner_units("victim-alone") as f64;
        assert!((alone - entitled).abs() <= 1.0, "alone {alone}");
        assert!(
            charged as f64 >= 0.97 * alone,
            "charged {charged}, alone {alone}"
        );
        assert!(uncharged as f64 <= 0.9 * alone, "uncharged {uncharged}");
    }

    #[test]
    fn the_core_goes_by_weight_and_what_a_capped_tenant_leaves_goes_to_the_others() {
        // All fit: each gets its quota.
        assert_eq!(share_of(&[(0.65, 650), (0.15, 150)], 1000), [650, 150]);
        // 700 left after the switch, nobody's quota under its fair part: by weight.
        assert_eq!(
            share_of(&[(0.65, 650), (0.15, 150), (0.15, 150)], 700),
            [478, 110, 110]
        );
        // The neighbours charged for the switch's work down to 50 each: the burner gets
        // what they leave, up to its quota.
        assert_eq!(
            share_of(&[(0.65, 650), (0.15, 50), (0.15, 50)], 700),
            [600, 50, 50]
        );
        assert_eq!(
            share_of(&[(0.65, 650), (0.15, 50), (0.15, 50)], 1000),
            [650, 50, 50]
        );
        // Nothing left.
        assert_eq!(share_of(&[(0.65, 650)], 0), [0]);
    }
}
