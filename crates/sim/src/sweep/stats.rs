//! Mean and 95% confidence interval across seeds (Student's t: a sweep has few seeds).

/// Two-sided 95% critical values of Student's t for 1 to 30 degrees of freedom.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// The two-sided 95% critical value of t with `df` degrees of freedom (`df` >= 1); between
/// tabulated points the value of the smaller df, so the interval errs wide.
pub fn t95(df: usize) -> f64 {
    match df {
        0 => f64::NAN,
        1..=30 => T95[df - 1],
        31..=40 => 2.042,
        41..=60 => 2.021,
        61..=120 => 2.000,
        _ => 1.980,
    }
}

/// Mean, and the half-width of its 95% confidence interval (`t * s / sqrt(n)`, s the sample
/// standard deviation); no half-width below two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Samples.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Half-width of the 95% interval (None for n < 2).
    pub ci95: Option<f64>,
}

/// Mean and 95% interval of `xs` (None when empty).
pub fn estimate(xs: &[f64]) -> Option<Estimate> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let equal = xs.iter().all(|x| *x == xs[0]);
    let ci95 = (n >= 2).then(|| {
        if equal {
            return 0.0; // not the rounding residue of the mean
        }
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        t95(n - 1) * var.sqrt() / (n as f64).sqrt()
    });
    Some(Estimate { n, mean, ci95 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_is_students_t_over_the_sample_deviation() {
        // 1, 2, 3: mean 2, s = 1, t(2) = 4.303: half-width 4.303 / sqrt(3) = 2.4843.
        let e = estimate(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(e.n, 3);
        assert!((e.mean - 2.0).abs() < 1e-12);
        assert!((e.ci95.unwrap() - 2.484_3).abs() < 1e-4, "{e:?}");
        // Two samples 10 and 14: s = 2.828, t(1) = 12.706: 12.706 * 2.828 / 1.414 = 25.412.
        let e = estimate(&[10.0, 14.0]).unwrap();
        assert!((e.ci95.unwrap() - 25.412).abs() < 1e-3, "{e:?}");
        // Equal samples: zero width; one sample: no interval; none: nothing.
        assert_eq!(estimate(&[5.0; 4]).unwrap().ci95, Some(0.0));
        assert_eq!(estimate(&[121.023; 3]).unwrap().ci95, Some(0.0));
        assert_eq!(estimate(&[5.0]).unwrap().ci95, None);
        assert!(estimate(&[]).is_none());
        // Large samples approach the normal's 1.96 from above.
        assert_eq!(t95(30), 2.042);
        assert_eq!(t95(35), 2.042);
        assert_eq!(t95(1000), 1.980);
        assert!((1..200).all(|df| t95(df) >= t95(df + 1)));
    }
}
