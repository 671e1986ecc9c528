//! Flow-size distributions for flow-size traffic: the standard web-search (DCTCP, Alizadeh
//! et al. 2010) and data-mining (VL2, Greenberg et al. 2009) CDFs, or a file of
//! `BYTES CDF` lines.

use anyhow::{bail, Context, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Segment size the standard CDFs are written in (bytes per packet in the originals).
const CDF_PACKET: f64 = 1460.0;
/// Web search: (packets, cumulative probability).
const WEB_SEARCH: &[(f64, f64)] = &[
    (6.0, 0.0),
    (6.0, 0.15),
    (13.0, 0.2),
    (19.0, 0.3),
    (33.0, 0.4),
    (53.0, 0.53),
    (133.0, 0.6),
    (667.0, 0.7),
    (1333.0, 0.8),
    (3333.0, 0.9),
    (6667.0, 0.97),
    (20000.0, 1.0),
];
/// Data mining: (packets, cumulative probability).
const DATA_MINING: &[(f64, f64)] = &[
    (1.0, 0.0),
    (1.0, 0.5),
    (2.0, 0.6),
    (3.0, 0.7),
    (7.0, 0.8),
    (267.0, 0.9),
    (2107.0, 0.95),
    (66667.0, 0.99),
    (666667.0, 1.0),
];

/// A piecewise-linear CDF of flow sizes in bytes.
#[derive(Debug, Clone)]
pub struct FlowSizes {
    points: Vec<(f64, f64)>,
}

impl FlowSizes {
    /// `web_search`, `data_mining`, or a path to a `BYTES CDF` file.
    pub fn load(name: &str) -> Result<FlowSizes> {
        let points = match name {
            "web_search" => WEB_SEARCH
                .iter()
                .map(|&(p, c)| (p * CDF_PACKET, c))
                .collect(),
            "data_mining" => DATA_MINING
                .iter()
                .map(|&(p, c)| (p * CDF_PACKET, c))
                .collect(),
            path => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading flow-size CDF {path}"))?;
                Self::parse(&text).with_context(|| format!("flow-size CDF {path}"))?
            }
        };
        Ok(FlowSizes { points })
    }

    fn parse(text: &str) -> Result<Vec<(f64, f64)>> {
        let mut points = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut it = line.split_whitespace().map(str::parse::<f64>);
            let (Some(Ok(size)), Some(Ok(cdf)), None) = (it.next(), it.next(), it.next()) else {
                bail!("line {}: expected `BYTES CDF`", i + 1);
            };
            if let Some(&(s, c)) = points.last() {
                if size < s || cdf < c {
                    bail!("line {}: sizes and probabilities must not decrease", i + 1);
                }
            }
            if !(size >= 1.0 && (0.0..=1.0).contains(&cdf)) {
                bail!("line {}: size >= 1 and CDF in [0, 1] required", i + 1);
            }
            points.push((size, cdf));
        }
        if points.last().is_none_or(|&(_, c)| c < 1.0) {
            bail!("the CDF must end at 1");
        }
        Ok(points)
    }

    /// Mean flow size in bytes.
    pub fn mean(&self) -> f64 {
        let mut mean = self.points[0].0 * self.points[0].1;
        for w in self.points.windows(2) {
            mean += (w[0].0 + w[1].0) / 2.0 * (w[1].1 - w[0].1);
        }
        mean
    }

    /// Draws a flow size in bytes (inverse transform, linear between points).
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.gen();
        let mut prev = (self.points[0].0, 0.0);
        for &(s, c) in &self.points {
            if u <= c {
                let f = if c > prev.1 {
                    (u - prev.1) / (c - prev.1)
                } else {
                    1.0
                };
                return (prev.0 + f * (s - prev.0)).max(1.0) as u64;
            }
            prev = (s, c);
        }
        prev.0 as u64
    }
}

/// One flow of flow-size traffic: when it starts (ns), the destination (an index into the
/// tenant's VMs) and its bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Start, ns.
    pub at: u64,
    /// Destination VM, an index into the tenant's VMs.
    pub dst: usize,
    /// Bytes (at least 1).
    pub bytes: u64,
}

/// The Poisson arrivals of one source VM: exponential gaps of mean `mean_gap_ns` from
/// `start`, destinations uniform over the tenant's other VMs, sizes from a CDF. Each source
/// draws from its own stream, seeded from the run's seed and the source's place, so the
/// ns-3 generator draws the same flows as a simulation with that seed.
#[derive(Debug, Clone)]
pub struct Arrivals {
    rng: SmallRng,
    at: f64,
    mean_gap_ns: f64,
    src: usize,
    vms: usize,
}

impl Arrivals {
    /// Source `src` of `vms` VMs of `[[sim.flows]]` number `traffic` in replica `replica`.
    pub fn new(
        seed: u64,
        traffic: usize,
        replica: u32,
        src: usize,
        vms: usize,
        start_ns: u64,
        mean_gap_ns: f64,
    ) -> Arrivals {
        let place = ((traffic as u64) << 48) ^ ((replica as u64) << 24) ^ src as u64;
        Arrivals {
            rng: SmallRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ place),
            at: start_ns as f64,
            mean_gap_ns,
            src,
            vms,
        }
    }

    /// The next flow.
    pub fn next(&mut self, sizes: &FlowSizes) -> Arrival {
        self.at += -self.mean_gap_ns * (1.0 - self.rng.gen::<f64>()).ln();
        let dst = loop {
            let d = self.rng.gen_range(0..self.vms);
            if d != self.src {
                break d;
            }
        };
        let bytes = sizes.sample(&mut self.rng).max(1);
        Arrival {
            at: self.at as u64 + 1,
            dst,
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn web_search_mean_is_about_1_6_mb_and_samples_follow_it() {
        let w = FlowSizes::load("web_search").unwrap();
        assert!((1.5e6..1.8e6).contains(&w.mean()), "{}", w.mean());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let n = 200_000;
        let avg = (0..n).map(|_| w.sample(&mut rng) as f64).sum::<f64>() / n as f64;
        assert!((avg / w.mean() - 1.0).abs() < 0.05, "{avg}");
        assert!(FlowSizes::parse("10 0.5\n5 1\n").is_err());
        assert!(FlowSizes::parse("10 0.5\n").is_err());
        assert_eq!(FlowSizes::parse("1 0\n100 1 # x\n").unwrap().len(), 2);
    }
}
