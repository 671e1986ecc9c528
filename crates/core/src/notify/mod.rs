//! Producer/consumer notification control after Rizzo, Garzarella, Lettieri, Maffione,
//! "A Study of Speed Mismatches Between Communicating Virtual Machines" (ANCS 2016).
//!
//! A producer P and a consumer C share a queue of `L` slots (a port's receive ring: the
//! kernel produces, the switch consumes). A party that cannot proceed either polls the
//! queue or blocks and lets its peer notify it, which costs the notifier N and the woken
//! party S (§2). This module holds the parameters and the Table 1 regimes ([`classify`])
//! and the adaptive wait built on them ([`AdaptiveWait`]); the closed forms for T and E,
//! the simulator and the two-thread prototype live in `picnic-model`.

mod wait;

pub use wait::{AdaptiveWait, Role, WaitConfig, WaitCounts, WaitDecision};

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

impl Params {
    /// A receive ring of `l` slots between a producer and a consumer with the notification
    /// (N = 3 us) and wake-up (S = 3.5 us) costs measured on the lab machines (`picnic model
    /// measure`: N 1.6-7.3 us, S 2.8-3.7 us); the work times W_P = 10 us and W_C = 1 us are
    /// first guesses that [`AdaptiveWait`] replaces with estimates as items flow.
    pub fn measured_ring(l: u32) -> Params {
        Params {
            l,
            wp: 10_000.0,
            wc: 1_000.0,
            kp: 1,
            kc: 1,
            np: 3_000.0,
            nc: 3_000.0,
            sp: 3_500.0,
            sc: 3_500.0,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// L = 4, k = 1: the (L - k) W - W slacks are 3 W_P - W_C and 3 W_C - W_P.
    fn at(wp: f64, wc: f64, sp: f64, sc: f64) -> Params {
        Params {
            l: 4,
            wp,
            wc,
            kp: 1,
            kc: 1,
            np: 100.0,
            nc: 100.0,
            sp,
            sc,
        }
    }

    #[test]
    fn every_row_of_table1() {
        // W_C < W_P: producer slack 2100, consumer slack 1700.
        assert_eq!(classify(&at(1000.0, 900.0, 200.0, 200.0)), Ok(Regime::FC));
        assert_eq!(
            classify(&at(1000.0, 900.0, 1000.0, 3000.0)),
            Ok(Regime::SCS)
        );
        assert_eq!(classify(&at(1000.0, 900.0, 2000.0, 3000.0)), Ok(Regime::SS));
        // W_C > W_P: producer slack 1700, consumer slack 2100.
        assert_eq!(classify(&at(900.0, 1000.0, 200.0, 200.0)), Ok(Regime::FP));
        assert_eq!(
            classify(&at(900.0, 1000.0, 3000.0, 1000.0)),
            Ok(Regime::SPS)
        );
        assert_eq!(classify(&at(900.0, 1000.0, 3000.0, 2000.0)), Ok(Regime::SS));
    }

    #[test]
    fn swapping_twice_is_identity_and_mirrors_the_regime() {
        let mirrored = |r| match r {
            Regime::FC => Regime::FP,
            Regime::FP => Regime::FC,
            Regime::SCS => Regime::SPS,
            Regime::SPS => Regime::SCS,
            other => other,
        };
        for p in [
            at(1000.0, 900.0, 200.0, 200.0),
            at(1000.0, 900.0, 1000.0, 3000.0),
            at(700.0, 1500.0, 6000.0, 100.0),
        ] {
            assert_eq!(p.swapped().swapped(), p);
            assert_eq!(
                classify(&p.swapped()).unwrap(),
                mirrored(classify(&p).unwrap())
            );
        }
    }

    #[test]
    fn bad_parameters_are_errors() {
        let mut p = at(1000.0, 900.0, 0.0, 0.0);
        p.kc = 5;
        assert_eq!(classify(&p), Err(ParamError::ThresholdOutOfRange));
        p.kc = 1;
        p.l = 0;
        assert_eq!(classify(&p), Err(ParamError::EmptyQueue));
        p.l = 4;
        p.wc = 0.0;
        assert_eq!(classify(&p), Err(ParamError::BadCost));
        p.wc = 900.0;
        p.np = f64::NAN;
        assert_eq!(classify(&p), Err(ParamError::BadCost));
    }
}
