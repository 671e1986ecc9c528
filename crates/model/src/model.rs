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
//!
//! The parameters and Table 1 ([`classify`]) live in `picnic_core::notify`, beside the
//! adaptive wait the switch uses, and are re-exported here.

pub use picnic_core::notify::{classify, ParamError, Params, Regime};
use serde::{Deserialize, Serialize};

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
