//! The closed forms of §2 against the event-driven simulator, and the control of
//! §4.1 against pure notification, all on the virtual clock.

use picnic_core::Duration;
use picnic_model::model::{classify, predict, Params, Regime};
use picnic_model::sim::{simulate, CostDist, SimConfig, Strategy as Wait};
use proptest::prelude::*;

fn run(params: Params, strategy: Wait) -> picnic_model::sim::SimResult {
    simulate(&SimConfig {
        params,
        dist: CostDist::Constant,
        strategy,
        seed: 1,
        warmup: 2_000,
        messages: 20_000,
    })
    .unwrap()
}

fn assert_close(what: &str, model: f64, sim: f64, p: &Params) {
    let err = (model - sim).abs() / model;
    assert!(
        err < 0.05,
        "{what}: model {model} sim {sim} ({:.1}%) for {p:?}",
        err * 100.0
    );
}

/// Parameters that land in each regime (k, N, S chosen per §2.2.1 to §2.2.5).
fn regime_examples() -> Vec<(Regime, Params)> {
    let p = |l, wp, wc, kp, kc, np, nc, sp, sc| Params {
        l,
        wp,
        wc,
        kp,
        kc,
        np,
        nc,
        sp,
        sc,
    };
    vec![
        (
            Regime::FC,
            p(64, 1500.0, 1100.0, 1, 32, 2400.0, 200.0, 3900.0, 200.0),
        ),
        (
            Regime::FC,
            p(64, 2900.0, 1100.0, 4, 32, 2400.0, 200.0, 3900.0, 5300.0),
        ),
        (
            Regime::FP,
            p(64, 700.0, 1100.0, 1, 32, 2400.0, 200.0, 3900.0, 200.0),
        ),
        (
            Regime::FP,
            p(64, 300.0, 1100.0, 1, 48, 2400.0, 700.0, 9100.0, 200.0),
        ),
        (
            Regime::SCS,
            p(8, 1500.0, 1100.0, 1, 1, 2400.0, 300.0, 900.0, 20_000.0),
        ),
        (
            Regime::SPS,
            p(8, 1100.0, 1500.0, 1, 1, 300.0, 2400.0, 20_000.0, 900.0),
        ),
        (
            Regime::SS,
            p(8, 1300.0, 1100.0, 1, 2, 2400.0, 300.0, 20_000.0, 20_000.0),
        ),
        (
            Regime::SS,
            p(16, 700.0, 1100.0, 3, 5, 2400.0, 300.0, 30_000.0, 15_000.0),
        ),
    ]
}

#[test]
fn model_and_simulation_agree_in_every_regime() {
    for (regime, params) in regime_examples() {
        let pred = predict(&params, false).unwrap();
        assert_eq!(pred.regime, regime, "{params:?}");
        let sim = run(params, Wait::Notify);
        assert_close("T", pred.t_per_msg, sim.t_per_msg, &params);
        assert_close("E", pred.e_per_msg, sim.e_per_msg, &params);
        // The regime shows in who blocks: only C in FC, only P in FP, both otherwise.
        let (pb, cb) = (sim.producer_blocks > 0, sim.consumer_blocks > 0);
        let expect = match regime {
            Regime::FC => (false, true),
            Regime::FP => (true, false),
            _ => (true, true),
        };
        assert_eq!((pb, cb), expect, "{regime}: {sim:?}");
        let poll = run(params, Wait::Poll);
        let gp = predict(&params, true).unwrap();
        assert_close("T_GP", gp.t_per_msg, poll.t_per_msg, &params);
        assert_close("E_GP", gp.e_per_msg, poll.e_per_msg, &params);
    }
}

fn arb_params() -> impl Strategy<Value = Params> {
    (
        2u32..48,
        100u32..4000,
        100u32..4000,
        0u32..6000,
        0u32..6000,
        0u32..30_000,
        0u32..30_000,
    )
        .prop_flat_map(|(l, wp, wc, np, nc, sp, sc)| {
            (1..=l, 1..=l).prop_map(move |(kp, kc)| Params {
                l,
                wp: f64::from(wp) + 0.25,
                wc: f64::from(wc) + 0.5,
                kp,
                kc,
                np: f64::from(np),
                nc: f64::from(nc),
                sp: f64::from(sp) + 0.125,
                sc: f64::from(sc) + 0.375,
            })
        })
}

/// The costs as the simulator's whole-ns clock takes them.
fn in_whole_ns(p: Params) -> Params {
    Params {
        wp: p.wp.round(),
        wc: p.wc.round(),
        np: p.np.round(),
        nc: p.nc.round(),
        sp: p.sp.round(),
        sc: p.sc.round(),
        ..p
    }
}

/// Whole-ns parameters exactly on an edge of Table 1 or where a batch size of
/// Eq. 2 or Eq. 3 steps (its floor's argument is a whole number). Call it on the
/// parameters and on their mirror (FP and SPS use the swapped forms).
fn on_a_boundary(p: &Params) -> bool {
    let gap = p.wp - p.wc;
    let steps = |numerator: f64| gap > 0.0 && numerator >= 0.0 && numerator % gap == 0.0;
    p.producer_slack() == p.sc
        || p.consumer_slack() == p.sp
        || gap == 0.0
        || steps(p.sc + f64::from(p.kp - 1) * p.wc)
        || steps(f64::from(p.l - p.kc) * p.wc - p.sp - p.wc)
}

/// Table 1 written out as its inequalities.
fn table1(p: &Params) -> Regime {
    let a = p.producer_slack() > p.sc;
    let b = p.consumer_slack() > p.sp;
    if p.wc <= p.wp {
        if a {
            Regime::FC
        } else if b {
            Regime::SCS
        } else {
            Regime::SS
        }
    } else if b {
        Regime::FP
    } else if a {
        Regime::SPS
    } else {
        Regime::SS
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random parameters: the simulator lands within 5% of the closed forms.
    #[test]
    fn model_matches_simulation_on_random_parameters(p in arb_params()) {
        // The simulator's clock counts whole ns, so both sides take the costs rounded
        // as it rounds them; a case exactly on a boundary is decided by event order.
        let p = in_whole_ns(p);
        prop_assume!(!on_a_boundary(&p) && !on_a_boundary(&p.swapped()));
        let pred = predict(&p, false).unwrap();
        let sim = simulate(&SimConfig {
            params: p, dist: CostDist::Constant, strategy: Wait::Notify,
            seed: 7, warmup: 1_000, messages: 8_000,
        }).unwrap();
        let tol = |x: f64| 0.05 * x;
        prop_assert!((pred.t_per_msg - sim.t_per_msg).abs() < tol(pred.t_per_msg),
            "{:?}: model {:?} sim {:?}", p, pred, sim);
        prop_assert!((pred.e_per_msg - sim.e_per_msg).abs() < tol(pred.e_per_msg),
            "{:?}: model {:?} sim {:?}", p, pred, sim);
    }

    /// Around the S_C boundary (left column of Table 1) the regime flips exactly
    /// where the inequality does.
    #[test]
    fn classifier_flips_at_the_startup_boundaries(p in arb_params(), eps in 1.0f64..50.0) {
        let mut q = p;
        let sc_edge = q.producer_slack();
        if sc_edge > eps {
            q.sc = sc_edge - eps;
            prop_assert_eq!(classify(&q).unwrap(), table1(&q));
            let below = classify(&q).unwrap();
            q.sc = sc_edge + eps;
            let above = classify(&q).unwrap();
            prop_assert_eq!(above, table1(&q));
            if q.wc <= q.wp {
                prop_assert_eq!(below, Regime::FC);
                prop_assert!(above == Regime::SCS || above == Regime::SS);
            } else {
                prop_assert!(below == Regime::FP || below == Regime::SPS);
                prop_assert!(above == Regime::FP || above == Regime::SS);
            }
        }
        let mut r = p;
        let sp_edge = r.consumer_slack();
        if sp_edge > eps {
            r.sp = sp_edge - eps;
            let below = classify(&r).unwrap();
            prop_assert_eq!(below, table1(&r));
            r.sp = sp_edge + eps;
            let above = classify(&r).unwrap();
            prop_assert_eq!(above, table1(&r));
            if r.wc > r.wp {
                prop_assert_eq!(below, Regime::FP);
                prop_assert!(above == Regime::SPS || above == Regime::SS);
            } else {
                prop_assert!(below == Regime::FC || below == Regime::SCS);
                prop_assert!(above == Regime::FC || above == Regime::SS);
            }
        }
    }

    /// Around W_P = W_C the classifier switches between the fast-consumer and
    /// fast-producer columns, and the swapped system is the mirror image.
    #[test]
    fn classifier_flips_at_equal_speeds_and_is_symmetric(p in arb_params(), eps in 0.5f64..20.0) {
        let mut q = p;
        q.wp = q.wc + eps;
        prop_assert!(matches!(classify(&q).unwrap(), Regime::FC | Regime::SCS | Regime::SS));
        q.wp = (q.wc - eps).max(0.1);
        prop_assert!(matches!(classify(&q).unwrap(), Regime::FP | Regime::SPS | Regime::SS));
        let mirror = |r| match r {
            Regime::FC => Regime::FP, Regime::FP => Regime::FC,
            Regime::SCS => Regime::SPS, Regime::SPS => Regime::SCS, o => o,
        };
        if p.wp != p.wc {
            prop_assert_eq!(classify(&p.swapped()).unwrap(), mirror(classify(&p).unwrap()));
            let a = predict(&p, false).unwrap();
            let b = predict(&p.swapped(), false).unwrap();
            prop_assert!((a.t_per_msg - b.t_per_msg).abs() < 1e-6 * a.t_per_msg);
        }
    }
}

/// Figure 5 in the simulator: the control never does worse than notification, in
/// time or cost per message, across a W_P sweep at W_C = 1.1us.
#[test]
fn control_never_worse_than_notification_in_simulation() {
    for l in [8u32, 256] {
        for wp in (2..=30).map(|i| f64::from(i) * 100.0) {
            let params = Params {
                l,
                wp,
                wc: 1100.0,
                kp: 1,
                kc: l / 2,
                np: 2400.0,
                nc: 2400.0,
                sp: 6000.0,
                sc: 6000.0,
            };
            let notify = run(params, Wait::Notify);
            let ctrl = run(
                params,
                Wait::Adaptive {
                    max_sleep: Duration::from_micros(500),
                },
            );
            let poll = run(params, Wait::Poll);
            assert!(
                ctrl.t_per_msg <= notify.t_per_msg * 1.01,
                "T wp={wp} l={l}: {ctrl:?} vs {notify:?}"
            );
            assert!(
                ctrl.e_per_msg <= notify.e_per_msg * 1.01,
                "E wp={wp} l={l}: {ctrl:?} vs {notify:?}"
            );
            if l == 256 {
                // With a long queue the control reaches polling throughput at a lower cost.
                assert!(
                    ctrl.t_per_msg <= poll.t_per_msg * 1.05,
                    "T wp={wp}: {ctrl:?} vs {poll:?}"
                );
                assert!(
                    ctrl.e_per_msg <= poll.e_per_msg,
                    "E wp={wp}: {ctrl:?} vs {poll:?}"
                );
            }
        }
    }
}
