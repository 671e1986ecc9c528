//! Closed-form model of Rizzo et al., "A Study of Speed Mismatches Between
//! Communicating Virtual Machines" (ANCS 2016), section 2.
//!
//! A producer P and a consumer C share a queue of `L` slots. Semantics (the
//! simulator in [`crate::sim`] implements exactly these, so model and simulation
//! agree for constant costs):
//! - P needs a free slot to *start* a message (`W_P` of work), the message is
//!   ready when the work ends; C needs a ready message to start (`W_C`), the slot
//!   is free again when C's work ends.
//! - A party that cannot proceed blocks (or spins, in polling). P notifies a
//!   blocked C once `k_P` messages are ready; C notifies a blocked P once `k_C`
//!   slots are free. The notifier works `N` and the wake-up is delivered at the
//!   end of that work; the woken party then works `S` before it starts.
//!
//! With these semantics the batch sizes of Eq. 2 and Eq. 3 and the conditions of
//! Table 1 are exact; the FP and SPS forms follow by swapping P and C (§2.2.2,
//! §2.2.4) and the SCS form is derived from the §2.2.3 timing diagram (it
//! reduces to Eq. 4 when the tail batch `m` is zero).

use serde::{Deserialize, Serialize};

/// Operating regime of the producer/consumer pair (Table 1, plus GP for polling).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Regime {
    /// Greedy polling: both parties spin, never notify (§2.1.1).
    GP,
    /// Fast consumer: only C blocks (§2.2.1).
    FC,
    /// Fast producer: only P blocks (§2.2.2).
    FP,
    /// Slow consumer startup: P fills the queue before C starts (§2.2.3).
    SCS,
    /// Slow producer startup: C drains the queue before P restarts (§2.2.4).
    SPS,
    /// Slow startup on both sides: P and C alternate, L messages a round (§2.2.5).
    SS,
}

impl Regime {
    /// Short name as printed in the paper ("FC", "SCS", ...).
    pub fn name(self) -> &'static str {
        match self {
            Regime::GP => "GP",
            Regime::FC => "FC",
            Regime::FP => "FP",
            Regime::SCS => "SCS",
            Regime::SPS => "SPS",
            Regime::SS => "SS",
        }
    }
}

impl std::fmt::Display for Regime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The operating parameters of §2 (costs in nanoseconds).
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Queue length L.
    pub l: u32,
    /// Producer work per message W_P.
    pub wp: f64,
    /// Consumer work per message W_C.
    pub wc: f64,
    /// Ready messages at which P notifies a blocked C (k_P).
    pub kp: u32,
    /// Free slots at which C notifies a blocked P (k_C).
    pub kc: u32,
    /// Cost for P to notify C (N_P).
    pub np: f64,
    /// Cost for C to notify P (N_C).
    pub nc: f64,
    /// Cost for P to start after a notification (S_P).
    pub sp: f64,
    /// Cost for C to start after a notification (S_C).
    pub sc: f64,
}

/// Why a [`Params`] value cannot be evaluated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamError {
    /// L must be at least 1.
    EmptyQueue,
    /// k_P and k_C must lie in 1..=L.
    ThresholdOutOfRange,
    /// W_P and W_C must be positive, N and S non-negative, all finite.
    BadCost,
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParamError::EmptyQueue => "queue length L must be at least 1",
            ParamError::ThresholdOutOfRange => "thresholds k_P and k_C must lie in 1..=L",
            ParamError::BadCost => "W_P, W_C must be > 0 and N_P, N_C, S_P, S_C >= 0 (finite)",
        })
    }
}

impl std::error::Error for ParamError {}

/// Result of the closed forms: regime, time per message T and total cost per message E.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// The regime the parameters put the system in.
    pub regime: Regime,
    /// Average time between messages T (ns), the inverse of throughput.
    pub t_per_msg: f64,
    /// Total work of P and C per message E (ns), including spinning in GP.
    pub e_per_msg: f64,
}

impl Params {
    /// Checks the constraints the model needs (L >= 1, 1 <= k <= L, sane costs).
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.l == 0 {
            return Err(ParamError::EmptyQueue);
        }
        if !(1..=self.l).contains(&self.kp) || !(1..=self.l).contains(&self.kc) {
            return Err(ParamError::ThresholdOutOfRange);
        }
        let work_ok = [self.wp, self.wc].iter().all(|w| w.is_finite() && *w > 0.0);
        let sync_ok = [self.np, self.nc, self.sp, self.sc]
            .iter()
            .all(|c| c.is_finite() && *c >= 0.0);
        if !(work_ok && sync_ok) {
            return Err(ParamError::BadCost);
        }
        Ok(())
    }

    /// Left column of Table 1: `(L - k_P) W_P - W_C`, compared with S_C.
    pub fn producer_slack(&self) -> f64 {
        f64::from(self.l - self.kp) * self.wp - self.wc
    }

    /// Right column of Table 1: `(L - k_C) W_C - W_P`, compared with S_P.
    pub fn consumer_slack(&self) -> f64 {
        f64::from(self.l - self.kc) * self.wc - self.wp
    }

    /// The parameters with the roles of P and C swapped (the symmetry of §2.2.2, §2.2.4).
    pub fn swapped(&self) -> Params {
        Params {
            l: self.l,
            wp: self.wc,
            wc: self.wp,
            kp: self.kc,
            kc: self.kp,
            np: self.nc,
            nc: self.np,
            sp: self.sc,
            sc: self.sp,
        }
    }
}

/// Table 1: the notification regime for valid parameters. A tie `W_P == W_C`
/// counts as a fast consumer (FC/SCS); both sides give the same lockstep limit.
pub fn classify(p: &Params) -> Result<Regime, ParamError> {
    p.validate()?;
    let producer_ok = p.producer_slack() > p.sc; // C starts before P fills the queue
    let consumer_ok = p.consumer_slack() > p.sp; // P restarts before C drains the queue
    Ok(if p.wc <= p.wp {
        match (producer_ok, consumer_ok) {
            (true, _) => Regime::FC,
            (false, true) => Regime::SCS,
            (false, false) => Regime::SS,
        }
    } else {
        match (producer_ok, consumer_ok) {
            (_, true) => Regime::FP,
            (true, false) => Regime::SPS,
            (false, false) => Regime::SS,
        }
    })
}

/// Eq. 1 to 4 (and their P/C mirrors): regime, T and E. `polling` selects GP.
pub fn predict(p: &Params, polling: bool) -> Result<Prediction, ParamError> {
    p.validate()?;
    if polling {
        // Eq. 1; with a single slot P and C cannot overlap, so they alternate.
        let t = if p.l == 1 {
            p.wp + p.wc
        } else {
            p.wp.max(p.wc)
        };
        return Ok(Prediction {
            regime: Regime::GP,
            t_per_msg: t,
            e_per_msg: 2.0 * t,
        });
    }
    let regime = classify(p)?;
    let (t, e) = match regime {
        Regime::FC => fast_consumer(p),
        Regime::FP => fast_consumer(&p.swapped()),
        Regime::SCS => slow_consumer_startup(p),
        Regime::SPS => slow_consumer_startup(&p.swapped()),
        Regime::SS => slow_startups(p, 0.0),
        Regime::GP => unreachable!("classify never returns GP"),
    };
    Ok(Prediction {
        regime,
        t_per_msg: t,
        e_per_msg: e,
    })
}

/// §2.2.1, Eq. 2: batch m per notification, T = W_P + N_P/m, E = W_P + W_C + (N_P + S_C)/m.
fn fast_consumer(p: &Params) -> (f64, f64) {
    let gap = p.wp - p.wc;
    if gap <= 0.0 {
        // Lockstep limit (m -> infinity, end of §2.2.2).
        return (p.wp, p.wp + p.wc);
    }
    let m = ((p.sc + f64::from(p.kp - 1) * p.wc) / gap).floor() + f64::from(p.kp);
    (p.wp + p.np / m, p.wp + p.wc + (p.np + p.sc) / m)
}

/// §2.2.3: a round is L + m messages with m from Eq. 3; P is idle from filling the
/// queue until C's notification, so the round lasts
/// `(m + k_P) W_P + k_C W_C + N_P + S_P + N_C + S_C`.
fn slow_consumer_startup(p: &Params) -> (f64, f64) {
    let gap = p.wp - p.wc;
    if gap <= 0.0 {
        return (p.wp, p.wp + p.wc);
    }
    // Eq. 3 rewritten: floor(((L-k_C)W_C - S_P - W_P)/(W_P-W_C)) + 1.
    let m = ((f64::from(p.l - p.kc) * p.wc - p.sp - p.wc) / gap)
        .floor()
        .max(0.0);
    slow_startups(p, m)
}

/// Eq. 4 generalised to a round of L + m messages (m = 0 is regime SS).
fn slow_startups(p: &Params, m: f64) -> (f64, f64) {
    let sync = p.np + p.sp + p.nc + p.sc;
    let msgs = f64::from(p.l) + m;
    let t = ((m + f64::from(p.kp)) * p.wp + f64::from(p.kc) * p.wc + sync) / msgs;
    (t, p.wp + p.wc + sync / msgs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Params {
        Params {
            l: 64,
            wp: 1500.0,
            wc: 1100.0,
            kp: 1,
            kc: 32,
            np: 2400.0,
            nc: 200.0,
            sp: 3900.0,
            sc: 200.0,
        }
    }

    #[test]
    fn paper_example_is_fast_consumer_with_eq2_batch() {
        let p = base();
        let pr = predict(&p, false).unwrap();
        assert_eq!(pr.regime, Regime::FC);
        // m = floor(200 / 400) + 1 = 1: every message pays a notification.
        assert!((pr.t_per_msg - (1500.0 + 2400.0)).abs() < 1e-9);
        assert!((pr.e_per_msg - (2600.0 + 2600.0)).abs() < 1e-9);
    }

    #[test]
    fn polling_is_max_of_work() {
        let pr = predict(&base(), true).unwrap();
        assert_eq!(pr.regime, Regime::GP);
        assert_eq!(pr.t_per_msg, 1500.0);
        assert_eq!(pr.e_per_msg, 3000.0);
    }

    #[test]
    fn swapping_twice_is_identity_and_mirrors_the_regime() {
        let mut p = base();
        p.wp = 700.0;
        assert_eq!(p.swapped().swapped(), p);
        let mirrored = |r| match r {
            Regime::FC => Regime::FP,
            Regime::FP => Regime::FC,
            Regime::SCS => Regime::SPS,
            Regime::SPS => Regime::SCS,
            other => other,
        };
        assert_eq!(
            classify(&p.swapped()).unwrap(),
            mirrored(classify(&p).unwrap())
        );
    }

    #[test]
    fn scs_with_empty_tail_equals_eq4() {
        let p = Params {
            l: 4,
            wp: 1000.0,
            wc: 500.0,
            kp: 1,
            kc: 1,
            np: 10.0,
            nc: 10.0,
            sp: 5000.0,
            sc: 5000.0,
        };
        assert_eq!(classify(&p).unwrap(), Regime::SS);
        let pr = predict(&p, false).unwrap();
        let eq4 = (1000.0 + 500.0 + 10_020.0) / 4.0;
        assert!((pr.t_per_msg - eq4).abs() < 1e-9);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let mut p = base();
        p.kc = 65;
        assert_eq!(classify(&p), Err(ParamError::ThresholdOutOfRange));
        p = base();
        p.l = 0;
        assert_eq!(predict(&p, false), Err(ParamError::EmptyQueue));
        p = base();
        p.wc = 0.0;
        assert_eq!(predict(&p, true), Err(ParamError::BadCost));
        p = base();
        p.np = f64::NAN;
        assert_eq!(classify(&p), Err(ParamError::BadCost));
    }
}
