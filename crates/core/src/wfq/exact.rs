//! Exact rational accumulation: `acc += cost * numerator / denominator` with the
//! remainder carried, so virtual-time tags and cap pacing never drift, however
//! many packets pass (Firecracker rate_limiter style exactness, DESIGN.md 2).

/// A value `whole + frac / denominator`, with `frac < denominator`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Exact {
    pub(crate) whole: u128,
    frac: u64,
}

impl Exact {
    pub(crate) const fn from_whole(whole: u128) -> Self {
        Exact { whole, frac: 0 }
    }
}

/// The ratio `numerator / denominator`, split as `quotient + rest / denominator`
/// once so the per-packet step needs only a multiply and (usually) a 64-bit divide.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Ratio {
    quotient: u128,
    rest: u64,
    denominator: u64,
}

impl Ratio {
    /// `numerator / denominator`; `denominator` must be non-zero (callers check).
    pub(crate) fn new(numerator: u128, denominator: u64) -> Self {
        let d = denominator as u128;
        Ratio {
            quotient: numerator / d,
            rest: (numerator % d) as u64,
            denominator,
        }
    }

    /// `cost * numerator / denominator` as a whole part and a remainder.
    fn scale(&self, cost: u64, frac: u64) -> (u128, u64) {
        let whole = (cost as u128).saturating_mul(self.quotient);
        let spill = cost as u128 * self.rest as u128 + frac as u128;
        let (q, r) = if spill <= u64::MAX as u128 {
            let s = spill as u64;
            ((s / self.denominator) as u128, s % self.denominator)
        } else {
            (
                spill / self.denominator as u128,
                (spill % self.denominator as u128) as u64,
            )
        };
        (whole.saturating_add(q), r)
    }

    /// `acc += cost * numerator / denominator`, saturating at `u128::MAX`.
    pub(crate) fn add(&self, acc: &mut Exact, cost: u64) {
        let (whole, frac) = self.scale(cost, acc.frac);
        acc.whole = acc.whole.saturating_add(whole);
        acc.frac = frac;
    }

    /// `acc -= cost * numerator / denominator`, saturating at zero.
    pub(crate) fn sub(&self, acc: &mut Exact, cost: u64) {
        let (mut whole, frac) = self.scale(cost, 0);
        let mut new_frac = acc.frac;
        if new_frac < frac {
            new_frac += self.denominator - frac;
            whole = whole.saturating_add(1);
        } else {
            new_frac -= frac;
        }
        match acc.whole.checked_sub(whole) {
            Some(w) => {
                *acc = Exact {
                    whole: w,
                    frac: new_frac,
                }
            }
            None => *acc = Exact::default(),
        }
    }
}

/// Adds a signed amount of cost (`diff`) through `ratio`.
pub(crate) fn apply_signed(ratio: &Ratio, acc: &mut Exact, diff: i128) {
    let magnitude = diff.unsigned_abs().min(u64::MAX as u128) as u64;
    if diff >= 0 {
        ratio.add(acc, magnitude);
    } else {
        ratio.sub(acc, magnitude);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirds_accumulate_without_drift_and_undo_exactly() {
        let third = Ratio::new(1, 3);
        let mut acc = Exact::default();
        for _ in 0..3_000_000 {
            third.add(&mut acc, 1);
        }
        assert_eq!(acc, Exact::from_whole(1_000_000));
        third.sub(&mut acc, 2);
        third.add(&mut acc, 2);
        assert_eq!(acc, Exact::from_whole(1_000_000));
        third.sub(&mut acc, u64::MAX);
        assert_eq!(acc, Exact::default());
    }

    #[test]
    fn huge_numerators_use_the_wide_path() {
        let r = Ratio::new(1u128 << 64, 7);
        let mut acc = Exact::default();
        for _ in 0..7 {
            r.add(&mut acc, 1_000_000);
        }
        assert_eq!(acc.whole, 1_000_000u128 << 64);
    }
}
