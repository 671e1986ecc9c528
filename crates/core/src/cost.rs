//! The measured per-frame cost model of a dataplane loop (Iron 3.1; PicNIC 2.2: capacity
//! varies with packet size and rules, so it is measured, not configured).
//!
//! A switch measures CPU time per loop iteration, not per frame. To split an iteration's
//! time over the tenants whose frames it handled (Iron's per-batch split,
//! [`crate::iron::split_batch_cost`]) it needs to know how much of that time is a fixed
//! per-iteration overhead (system calls that return nothing, the wait, bookkeeping), how
//! much each frame costs and how much each byte costs (copies, checksums). [`CostFit`] learns
//! these three figures online by least squares over recent iterations: each iteration is one
//! observation `cpu_ns ~ fixed + per_packet * packets + per_byte * bytes`.

use crate::iron::{BatchCost, PacketCostModel};
use crate::Duration;

/// Weight of the newest observation: sums decay by `1 - 1/DECAY` per observation, so the
/// fit follows the last few thousand iterations.
const DECAY: f64 = 4096.0;

/// Online least-squares fit of the loop's cost model.
#[derive(Clone, Debug, Default)]
pub struct CostFit {
    /// Decayed sums of x_i * x_j for x = (1, packets, bytes).
    xx: [[f64; 3]; 3],
    /// Decayed sums of x_i * cpu_ns.
    xy: [f64; 3],
    fitted: Option<Coefficients>,
    observations: u64,
}

/// The fitted model, ns.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Coefficients {
    pub fixed_ns: f64,
    pub per_packet_ns: f64,
    pub per_byte_ns: f64,
}

impl CostFit {
    pub fn new() -> CostFit {
        CostFit::default()
    }

    /// Adds one iteration: `packets` frames of `bytes` total handled in `cpu_ns`.
    pub fn observe(&mut self, packets: u64, bytes: u64, cpu_ns: u64) {
        let x = [1.0, packets as f64, bytes as f64];
        let keep = 1.0 - 1.0 / DECAY;
        for i in 0..3 {
            for j in 0..3 {
                self.xx[i][j] = self.xx[i][j] * keep + x[i] * x[j];
            }
            self.xy[i] = self.xy[i] * keep + x[i] * cpu_ns as f64;
        }
        self.observations += 1;
        // Refitting is a 3x3 solve: cheap, but not needed every iteration.
        if self.observations.is_multiple_of(64) || self.fitted.is_none() {
            self.fitted = self.solve();
        }
    }

    /// The current model, once the observations determine one.
    pub fn coefficients(&self) -> Option<Coefficients> {
        self.fitted
    }

    /// How to split an iteration of `cpu_ns` (Iron 3.1): its fixed part evenly per frame,
    /// the rest by per-packet and per-byte weight (picoseconds, so sub-ns byte costs count).
    /// Before a fit exists, every frame pays the same.
    pub fn split_model(&self, cpu_ns: u64) -> (BatchCost, PacketCostModel) {
        let Some(c) = self.fitted else {
            return (
                BatchCost {
                    total: Duration::from_nanos(cpu_ns),
                    fixed_overhead: Duration::ZERO,
                },
                PacketCostModel::EVEN,
            );
        };
        let batch = BatchCost {
            total: Duration::from_nanos(cpu_ns),
            fixed_overhead: Duration::from_nanos((c.fixed_ns.round() as u64).min(cpu_ns)),
        };
        let model = PacketCostModel {
            per_packet: (c.per_packet_ns * 1000.0).round() as u64,
            per_byte: (c.per_byte_ns * 1000.0).round() as u64,
        };
        (batch, model)
    }

    /// Least squares with non-negative coefficients (NNLS): of the models on every subset of
    /// the three terms (the others fixed at zero), the one with non-negative coefficients
    /// that fits the observations best. That is the constrained optimum, so the model moves
    /// continuously with the observations. Taking the first non-negative model of a fixed
    /// list of fallbacks did not: when the full model came out with a negative term (frames
    /// of a kind cheaper than the model says, iterations whose frame count never varies), a
    /// coefficient that was only noise decided by its sign between dropping the per-byte term
    /// and dropping the fixed one, and a CPU-fair share moved 40% with it
    /// (docs/BENCHMARKS.md "The cost model's fit").
    fn solve(&self) -> Option<Coefficients> {
        const SUBSETS: [&[usize]; 7] = [&[0, 1, 2], &[0, 1], &[0, 2], &[1, 2], &[0], &[1], &[2]];
        // Squared residuals up to a constant: c' X'X c - 2 c' X'y.
        let objective = |c: &[f64; 3]| {
            let mut q = 0.0;
            for i in 0..3 {
                for j in 0..3 {
                    q += c[i] * self.xx[i][j] * c[j];
                }
                q -= 2.0 * c[i] * self.xy[i];
            }
            q
        };
        let c = SUBSETS
            .iter()
            .filter_map(|s| solve_subset(&self.xx, &self.xy, s))
            .filter(|c| c.iter().all(|&v| v >= 0.0))
            .min_by(|a, b| objective(a).total_cmp(&objective(b)))?;
        Some(Coefficients {
            fixed_ns: c[0],
            per_packet_ns: c[1],
            per_byte_ns: c[2],
        })
    }
}

/// Solves the normal equations restricted to the variables in `vars` (others zero).
fn solve_subset(xx: &[[f64; 3]; 3], xy: &[f64; 3], vars: &[usize]) -> Option<[f64; 3]> {
    let n = vars.len();
    let mut a = [[0.0f64; 4]; 3];
    for (r, &i) in vars.iter().enumerate() {
        for (c, &j) in vars.iter().enumerate() {
            a[r][c] = xx[i][j];
        }
        a[r][n] = xy[i];
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..n {
        let pivot = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        a.swap(col, pivot);
        let scale = a[col][col];
        if scale.abs() < 1e-9 * (1.0 + xx[vars[col]][vars[col]].abs()) {
            return None;
        }
        let pivot_row = a[col];
        for (r, row) in a.iter_mut().enumerate().take(n) {
            if r != col {
                let f = row[col] / scale;
                for (x, p) in row.iter_mut().zip(pivot_row).skip(col).take(n + 1 - col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; 3];
    for (r, &i) in vars.iter().enumerate() {
        out[i] = a[r][n] / a[r][r];
    }
    out.iter().all(|v| v.is_finite()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(fixed: f64, per_packet: f64, per_byte: f64, p: u64, b: u64) -> u64 {
        (fixed + per_packet * p as f64 + per_byte * b as f64).round() as u64
    }

    #[test]
    fn recovers_a_three_part_model_from_mixed_iterations() {
        let mut fit = CostFit::new();
        // Iterations with varying frame counts and sizes, as a loop under mixed load sees.
        for k in 0..5_000u64 {
            let p = k % 37;
            let small = (k * 7) % (p + 1);
            let b = small * 64 + (p - small) * 1500;
            fit.observe(p, b, exact(800.0, 450.0, 0.25, p, b));
        }
        let c = fit.coefficients().unwrap();
        assert!((c.fixed_ns - 800.0).abs() < 5.0, "{c:?}");
        assert!((c.per_packet_ns - 450.0).abs() < 2.0, "{c:?}");
        assert!((c.per_byte_ns - 0.25).abs() < 0.005, "{c:?}");
        let (batch, model) = fit.split_model(10_000);
        assert_eq!(batch.fixed_overhead.as_nanos(), 800);
        assert_eq!(model.per_packet, 450_000);
        assert_eq!(model.per_byte, 250);
    }

    #[test]
    fn sizes_that_never_vary_give_a_per_packet_model_without_negative_terms() {
        let mut fit = CostFit::new();
        for k in 0..2_000u64 {
            let p = k % 20;
            fit.observe(p, p * 64, exact(300.0, 1_000.0, 0.0, p, 0));
        }
        let c = fit.coefficients().unwrap();
        assert!(c.fixed_ns >= 0.0 && c.per_packet_ns >= 0.0 && c.per_byte_ns >= 0.0);
        // Bytes and packets are collinear here: whatever the split between them, a 64 B
        // frame must cost its measured 1,000 ns.
        let frame = c.per_packet_ns + 64.0 * c.per_byte_ns;
        assert!((frame - 1_000.0).abs() < 5.0, "{c:?}");
        assert!((c.fixed_ns - 300.0).abs() < 5.0, "{c:?}");
    }

    /// A saturated loop: every iteration reads 64 frames and delivers 32, a varying number of
    /// them large, and sends 0-6 small frames that cost it next to nothing (the switch's
    /// feedback, in the engine test that found this). The full model has a negative per-frame
    /// term, so some term must go; which one is for the data to say, and eight iterations
    /// more or less of one kind must not change the answer.
    fn saturated_loop(extra_large: u64) -> CostFit {
        let mut fit = CostFit::new();
        let iteration = |fit: &mut CostFit, large: u64, cheap: u64| {
            let delivered = large * 1442 + (32 - large) * 106;
            let (p, b) = (96 + cheap, 52_736 + delivered + cheap * 70);
            fit.observe(
                p,
                b,
                exact(300.0 + 500.0 * 96.0, 0.0, 0.5, 0, 52_736 + delivered),
            );
        };
        for k in 0..5_250u64 {
            iteration(&mut fit, k % 5, (k / 5) % 7);
        }
        // Eight iterations with many cheap frames, with many large frames or with none.
        for _ in 0..8 {
            iteration(&mut fit, extra_large, 10);
        }
        for k in 0..56u64 {
            iteration(&mut fit, k % 5, (k / 5) % 7);
        }
        fit
    }

    #[test]
    fn a_few_iterations_more_of_one_kind_do_not_swing_the_model() {
        let (a, b) = (saturated_loop(4), saturated_loop(0));
        let cost = |fit: &CostFit, bytes: f64| {
            let c = fit.coefficients().unwrap();
            c.per_packet_ns + c.per_byte_ns * bytes
        };
        for bytes in [106.0, 1442.0] {
            let (x, y) = (cost(&a, bytes), cost(&b, bytes));
            assert!(
                (x - y).abs() <= 0.02 * y,
                "a {bytes} B frame: {x:.1} ns against {y:.1} ns\n{:?}\n{:?}",
                a.coefficients(),
                b.coefficients()
            );
        }
        // The per-byte cost is the one the iterations determine: it stays.
        let c = a.coefficients().unwrap();
        assert!((c.per_byte_ns - 0.5).abs() < 0.05, "{c:?}");
    }

    #[test]
    fn without_a_fit_every_frame_pays_the_same() {
        let fit = CostFit::new();
        let (batch, model) = fit.split_model(900);
        assert_eq!(batch.fixed_overhead, Duration::ZERO);
        assert_eq!(model, PacketCostModel::EVEN);
    }
}
