//! The access link shared by several workers' EyeQ receivers (docs/switch.md "Workers").
//! Each worker's link receiver meters only its own VMs (their uplink frames reach their
//! owner), so each alone would hand out the whole link, and together twice it. Instead each
//! receiver gets a part of the link: every worker reports its active endpoints taken
//! together ([`Engine::link_aggregate`]: the endpoints that received recently, the sum of
//! their guarantees B_i and of their demands), the coordinator splits the link among the workers as EyeQ's RX
//! scheduler splits it among endpoints (3.2: by guarantee over the active set, made work
//! conserving by water-filling the demands, [`split_link`]), and each worker gives its
//! receiver its part ([`Engine::set_link_share`]); the receiver then allocates that among its
//! own endpoints as before. Nothing on the per-packet path: a worker reports and reads its
//! part once a millisecond, the coordinator splits once per Iron period.

use picnic_core::eyeq::Aggregate;

use super::Engine;

impl Engine {
    /// This engine's link receiver's recently receiving endpoints taken together at `now`
    /// (None without feedback), its meter windows closed up to `now` first (they are closed
    /// when read, [`Engine::catch_up`]).
    pub fn link_aggregate(&mut self, now: picnic_core::Instant) -> Option<Aggregate> {
        self.catch_up(now);
        self.ingress.link().map(|r| r.aggregate(now))
    }

    /// The access link's raw capacity this engine's receiver was configured with, bytes/s.
    pub fn link_capacity(&self) -> Option<u64> {
        self.ingress.link().map(|r| r.config().capacity)
    }

    /// Gives this engine's link receiver `bytes` per second of the access link (its part
    /// when several workers share it); a change reallocates its endpoints at once. Call it
    /// after [`Engine::link_aggregate`] at the same time (the windows that ended before are
    /// closed with the old part, as their timers would have).
    pub fn set_link_share(&mut self, bytes: u64) {
        if let Some(r) = self.ingress.link_mut() {
            if r.config().capacity != bytes.max(1) {
                let _ = r.set_capacity(bytes.max(1));
            }
        }
    }
}

/// Splits a link of `capacity` among workers whose receivers report `parts`. Workers with
/// recently receiving endpoints share it by guarantee, water-filled: one whose demand is
/// below its weighted share gets its demand plus a quarter (room to grow before the next
/// split), the rest goes to the others by weight, and what nobody wants is spread by weight
/// so the parts add up to the link. A worker with no receiving endpoint gets, provisionally,
/// the part it would have by its VMs' guarantees (`reserve`) if they started, so a VM that
/// starts receiving is not held to a sliver until the next split. Each receiver keeps its
/// headroom of its part (its endpoints are every local VM, so it uses the solo headroom only
/// on a host with a single local VM, as the single loop does).
pub fn split_link(capacity: u64, parts: &[Aggregate]) -> Vec<u64> {
    let active_weight: u128 = parts.iter().map(|p| p.guarantee as u128).sum();
    let mut share = vec![0u128; parts.len()];
    let c = capacity as u128;
    if active_weight == 0 {
        return vec![capacity; parts.len()];
    }
    let mut settled: Vec<bool> = parts.iter().map(|p| p.guarantee == 0).collect();
    let mut remaining = c;
    let mut weight = active_weight;
    let mut changed = true;
    while changed && weight > 0 {
        changed = false;
        for (i, p) in parts.iter().enumerate() {
            if settled[i] {
                continue;
            }
            let fair = remaining * p.guarantee as u128 / weight;
            let want = p.demand as u128 + p.demand as u128 / 4;
            if want < fair {
                share[i] = want;
                settled[i] = true;
                remaining -= want;
                weight -= p.guarantee as u128;
                changed = true;
            }
        }
    }
    // The rest to the unsettled by weight, or, when every worker is settled, to all
    // receiving ones by weight.
    for (i, p) in parts.iter().enumerate() {
        let taker = p.guarantee > 0 && (weight == 0 || !settled[i]);
        if taker {
            let over = if weight > 0 { weight } else { active_weight };
            share[i] += remaining * p.guarantee as u128 / over;
        }
    }
    parts
        .iter()
        .zip(share)
        .map(|(p, s)| {
            let s = if p.guarantee == 0 {
                c * p.reserve as u128 / (active_weight + p.reserve as u128).max(1)
            } else {
                s
            };
            s.min(c).max(1) as u64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(active: u32, guarantee: u64, demand: u64) -> Aggregate {
        Aggregate {
            active,
            guarantee,
            demand,
            reserve: guarantee.max(1),
        }
    }

    #[test]
    fn hungry_workers_share_the_link_by_guarantee() {
        let c = 1_000_000;
        let parts = [part(2, 100, u64::MAX), part(2, 300, u64::MAX)];
        assert_eq!(split_link(c, &parts), vec![250_000, 750_000]);
    }

    #[test]
    fn a_light_worker_keeps_its_demand_and_a_quarter_and_the_rest_goes_on() {
        let c = 1_000_000;
        let parts = [part(2, 100, 100_000), part(2, 100, u64::MAX)];
        let s = split_link(c, &parts);
        assert_eq!(s, vec![125_000, 875_000]);
        assert_eq!(s.iter().sum::<u64>(), c);
    }

    #[test]
    fn what_nobody_wants_is_spread_so_the_parts_add_up_to_the_link() {
        let c = 1_000_000;
        let s = split_link(c, &[part(2, 100, 80_000), part(2, 100, 40_000)]);
        assert_eq!(s.iter().sum::<u64>(), c);
        assert!(s[0] > s[1] && s[1] >= 50_000, "{s:?}");
    }

    #[test]
    fn an_idle_worker_gets_the_part_its_vms_would_have() {
        let c = 1_000_000;
        let idle = Aggregate {
            active: 0,
            guarantee: 0,
            demand: 0,
            reserve: 100,
        };
        let s = split_link(c, &[part(1, 300, u64::MAX), idle]);
        assert_eq!(s, vec![c, 250_000]);
        // Nobody active: everyone may take the whole link until the next split.
        assert_eq!(split_link(c, &[idle, idle]), vec![c, c]);
    }
}
