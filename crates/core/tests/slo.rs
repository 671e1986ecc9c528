//! SLO parsing/validation and windowed conformance monitoring, on a virtual clock.

use picnic_core::slo::{
    Slo, SloMonitor, SloMonitorConfig, SloState, ViolationKind, DEFAULT_LATENCY_PERCENTILE,
};
use picnic_core::{Duration, Instant};
use proptest::prelude::*;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;
/// Bytes per millisecond at 20, 10, 8 and 5 Mb/s.
const MBPS20: u64 = 2_500;
const MBPS10: u64 = 1_250;
const MBPS8: u64 = 1_000;
const MBPS5: u64 = 625;

fn at_ms(ms: u64) -> Instant {
    Instant::from_nanos(ms * MS)
}

fn parse(toml_text: &str) -> Result<Slo, String> {
    toml::from_str::<Slo>(toml_text).map_err(|e| e.to_string())
}

/// A monitor with 100 ms windows starting at t = 0.
fn monitor(slo: Slo) -> SloMonitor {
    SloMonitor::new(slo, SloMonitorConfig::default(), Instant::ZERO).unwrap()
}

fn min_10mbps() -> Slo {
    Slo {
        min_bps: 10_000_000,
        ..Slo::default()
    }
}

/// One tick per millisecond in `[from_ms, to_ms)`, as a switch would drive it: fire due
/// timers, then record the bytes offered and delivered in that millisecond.
fn run_ms(
    m: &mut SloMonitor,
    from_ms: u64,
    to_ms: u64,
    offered_per_ms: u64,
    delivered_per_ms: u64,
) {
    for t in from_ms..to_ms {
        let now = at_ms(t);
        if m.poll_at().is_some_and(|due| due <= now) {
            m.on_timeout(now);
        }
        m.record_offered(now, offered_per_ms);
        m.record_delivered(now, 1, delivered_per_ms);
    }
}

/// 1000 latency samples spread over the 100 ms window starting at `window_ms`:
/// `slow` of them take `slow_ns`, the rest `fast_ns`.
fn latency_window(m: &mut SloMonitor, window_ms: u64, slow: u64, slow_ns: u64, fast_ns: u64) {
    for i in 0..1_000 {
        let now = Instant::from_nanos(window_ms * MS + i * 100 * US);
        m.record_latency(now, if i < slow { slow_ns } else { fast_ns });
    }
}

fn violated(kind: ViolationKind) -> impl Fn(SloState) -> bool {
    move |state| matches!(state, SloState::Violated(kinds) if kinds.contains(kind))
}

// ---------------------------------------------------------------- parsing and validation

#[test]
fn a_full_slo_parses_from_toml() {
    let slo = parse(
        r#"
        min_bps = 100_000_000
        max_bps = 1_000_000_000
        pps_share = 0.25
        latency_us = 200
        latency_percentile = 99.9
        max_loss = 0.001
        "#,
    )
    .unwrap();
    assert_eq!(
        slo,
        Slo {
            min_bps: 100_000_000,
            max_bps: Some(1_000_000_000),
            pps_share: Some(0.25),
            latency_us: Some(200),
            latency_percentile: 99.9,
            max_loss: Some(0.001),
        }
    );
}

#[test]
fn omitted_fields_mean_no_bound_and_percentile_defaults_to_p99() {
    assert_eq!(parse("").unwrap(), Slo::default());
    let slo = parse("latency_us = 50").unwrap();
    assert_eq!(slo.latency_percentile, DEFAULT_LATENCY_PERCENTILE);
    assert_eq!(slo.min_bps, 0);
    assert_eq!(slo.max_bps, None);
}

#[test]
fn an_slo_embeds_in_a_larger_config_table() {
    #[derive(Debug, serde::Deserialize)]
    struct Tenant {
        name: String,
        slo: Slo,
    }
    let t: Tenant =
        toml::from_str("name = \"victim\"\n[slo]\nmin_bps = 5\nmax_bps = 10\n").unwrap();
    assert_eq!(t.name, "victim");
    assert_eq!(t.slo.max_bps, Some(10));

    let bad = toml::from_str::<Tenant>("name = \"v\"\n[slo]\nmin_bps = 20\nmax_bps = 10\n");
    assert!(bad
        .unwrap_err()
        .to_string()
        .contains("max_bps must be >= min_bps"));
}

#[test]
fn each_invalid_field_is_rejected_with_a_message_naming_it() {
    let cases = [
        ("min_bps = 20\nmax_bps = 10", "max_bps must be >= min_bps"),
        ("max_bps = 0", "max_bps must be > 0"),
        ("min_bps = -1", "min_bps"),
        ("pps_share = 0.0", "pps_share must be"),
        ("pps_share = -2.0", "pps_share must be"),
        ("pps_share = nan", "pps_share must be"),
        ("pps_share = inf", "pps_share must be"),
        ("latency_us = 0", "latency_us must be > 0"),
        (
            "latency_us = 10\nlatency_percentile = 0.0",
            "latency_percentile must be in (0, 100]",
        ),
        (
            "latency_us = 10\nlatency_percentile = 100.5",
            "latency_percentile must be in (0, 100]",
        ),
        (
            "latency_us = 10\nlatency_percentile = nan",
            "latency_percentile must be in (0, 100]",
        ),
        (
            "latency_percentile = 99.0",
            "latency_percentile needs latency_us",
        ),
        ("max_loss = -0.1", "max_loss must be a fraction in [0, 1]"),
        ("max_loss = 1.5", "max_loss must be a fraction in [0, 1]"),
        ("max_loss = nan", "max_loss must be a fraction in [0, 1]"),
        ("min_mbps = 10", "unknown field `min_mbps`"),
    ];
    for (text, expected) in cases {
        let err = parse(text).expect_err(text);
        assert!(
            err.contains(expected),
            "{text:?}: {err:?} lacks {expected:?}"
        );
    }
}

#[test]
fn bounds_at_the_edges_of_their_ranges_are_accepted() {
    for text in [
        "latency_us = 1\nlatency_percentile = 100.0",
        "max_loss = 0.0",
        "max_loss = 1.0",
        "min_bps = 10\nmax_bps = 10",
        "pps_share = 3.0",
    ] {
        parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}

#[test]
fn validate_and_monitor_creation_reject_invalid_values_built_in_code() {
    let slo = Slo {
        max_loss: Some(2.0),
        ..Slo::default()
    };
    assert_eq!(slo.validate().unwrap_err().field, "max_loss");
    let err = SloMonitor::new(slo, SloMonitorConfig::default(), Instant::ZERO)
        .err()
        .unwrap();
    assert_eq!(err.field, "max_loss");

    let zero_window = SloMonitorConfig {
        window: Duration::ZERO,
        ..SloMonitorConfig::default()
    };
    let err = SloMonitor::new(Slo::default(), zero_window, Instant::ZERO)
        .err()
        .unwrap();
    assert_eq!(err.field, "window");
    for digits in [0, 6] {
        let config = SloMonitorConfig {
            latency_significant_digits: digits,
            ..SloMonitorConfig::default()
        };
        let err = SloMonitor::new(Slo::default(), config, Instant::ZERO)
            .err()
            .unwrap();
        assert_eq!(err.field, "latency_significant_digits");
    }
}

#[test]
fn an_slo_round_trips_through_toml() {
    for slo in [
        Slo::default(),
        parse("min_bps = 1\nmax_bps = 2\npps_share = 0.5\nlatency_us = 3\nlatency_percentile = 99.9\nmax_loss = 0.01").unwrap(),
    ] {
        let text = toml::to_string(&slo).unwrap();
        assert_eq!(parse(&text).unwrap(), slo, "{text}");
    }
}

// ---------------------------------------------------------------- bandwidth

#[test]
fn a_tenant_receiving_above_its_min_is_met() {
    let mut m = monitor(min_10mbps());
    run_ms(&mut m, 0, 1_000, MBPS20, MBPS20);
    assert_eq!(m.state(at_ms(1_000)), SloState::Met);
    let s = m.summary(at_ms(1_000));
    assert!(s.slo_met);
    assert_eq!(s.windows, 10);
    assert_eq!(s.throughput_bps, 20e6);
    assert_eq!(s.checks.len(), 1);
    assert_eq!(
        (
            s.checks[0].name.as_str(),
            s.checks[0].value,
            s.checks[0].pass
        ),
        ("min_bps", 20e6, true)
    );
}

#[test]
fn falling_below_min_while_offering_more_is_a_violation_from_window_start_to_recovery() {
    let mut m = monitor(min_10mbps());
    run_ms(&mut m, 0, 530, MBPS20, MBPS20);
    // Delivery drops to 5 Mb/s at 530 ms: window [500, 600) gets 9.5 Mb/s.
    run_ms(&mut m, 530, 600, MBPS20, MBPS5);
    assert_eq!(
        m.state(at_ms(599)),
        SloState::Met,
        "window [500, 600) not judged before it ends"
    );
    assert!(violated(ViolationKind::MinBandwidth)(m.state(at_ms(600))));
    let open: Vec<_> = m.open_violations().cloned().collect();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].started_at, at_ms(500));
    assert_eq!(open[0].ended_at, None);
    assert_eq!(open[0].worst_value, 9.5e6);

    // Recovers at 830 ms: window [800, 900) gets 15.5 Mb/s.
    run_ms(&mut m, 600, 830, MBPS20, MBPS5);
    run_ms(&mut m, 830, 1_000, MBPS20, MBPS20);
    assert_eq!(m.state(at_ms(900)), SloState::Met);
    assert_eq!(m.open_violations().count(), 0);
    let closed: Vec<_> = m.closed_violations().cloned().collect();
    assert_eq!(closed.len(), 1);
    let v = &closed[0];
    assert_eq!(v.kind, ViolationKind::MinBandwidth);
    assert_eq!((v.started_at, v.ended_at), (at_ms(500), Some(at_ms(800))));
    assert_eq!((v.worst_value, v.bound), (5e6, 10e6));

    let s = m.summary(at_ms(1_000));
    assert!(!s.slo_met);
    assert_eq!((s.windows, s.violated_windows), (10, 3));
    assert_eq!(s.violations, closed);
    assert_eq!(
        (s.checks[0].value, s.checks[0].bound, s.checks[0].pass),
        (5e6, 10e6, false)
    );
}

#[test]
fn offering_less_than_min_is_not_a_violation() {
    let mut m = monitor(min_10mbps());
    run_ms(&mut m, 0, 500, MBPS5, MBPS5);
    run_ms(&mut m, 500, 1_000, MBPS8, MBPS8);
    assert_eq!(m.state(at_ms(1_000)), SloState::Met);
    let s = m.summary(at_ms(1_000));
    assert!(s.slo_met);
    assert!(
        s.checks.is_empty(),
        "min never applied, so no check: {:?}",
        s.checks
    );

    // Offering exactly the minimum makes it apply.
    let mut m = monitor(min_10mbps());
    run_ms(&mut m, 0, 100, MBPS10, MBPS5);
    assert!(violated(ViolationKind::MinBandwidth)(m.state(at_ms(100))));
}

#[test]
fn delivering_above_max_is_a_violation() {
    let mut m = monitor(Slo {
        max_bps: Some(10_000_000),
        ..Slo::default()
    });
    run_ms(&mut m, 0, 100, MBPS10, MBPS10);
    run_ms(&mut m, 100, 300, MBPS20, MBPS20);
    run_ms(&mut m, 300, 400, MBPS10, MBPS10);
    assert_eq!(m.state(at_ms(400)), SloState::Met);
    let v = m.closed_violations().next().unwrap().clone();
    assert_eq!(v.kind, ViolationKind::MaxBandwidth);
    assert_eq!((v.started_at, v.ended_at), (at_ms(100), Some(at_ms(300))));
    assert_eq!((v.worst_value, v.bound), (20e6, 10e6));
}

// ---------------------------------------------------------------- latency and loss

#[test]
fn latency_percentile_bound_is_judged_per_window() {
    let mut m = monitor(Slo {
        latency_us: Some(100),
        latency_percentile: 99.0,
        ..Slo::default()
    });
    latency_window(&mut m, 0, 20, 500 * US, 50 * US); // 2% above: violated
    latency_window(&mut m, 100, 5, 500 * US, 50 * US); // 0.5% above: met
    latency_window(&mut m, 200, 10, 500 * US, 50 * US); // exactly 1% above: met
    latency_window(&mut m, 300, 11, 500 * US, 50 * US); // 1.1% above: violated
    latency_window(&mut m, 400, 1_000, 100 * US, 0); // all exactly at the bound: met
    let state = m.state(at_ms(500));
    assert_eq!(state, SloState::Met);

    let closed: Vec<_> = m.closed_violations().cloned().collect();
    assert_eq!(closed.len(), 2);
    assert_eq!(
        (closed[0].started_at, closed[0].ended_at),
        (at_ms(0), Some(at_ms(100)))
    );
    assert_eq!(
        (closed[1].started_at, closed[1].ended_at),
        (at_ms(300), Some(at_ms(400)))
    );
    for v in &closed {
        assert_eq!(v.kind, ViolationKind::Latency);
        assert_eq!(v.bound, 100.0);
        assert!(
            (v.worst_value - 500.0).abs() <= 5.0,
            "p99 ~500 us, got {}",
            v.worst_value
        );
    }

    let s = m.summary(at_ms(500));
    assert_eq!(s.latency_samples, 5_000);
    let p50 = s.latency_p50_us.unwrap();
    assert!((p50 - 50.0).abs() <= 0.05, "p50 {p50}");
    let check = &s.checks[0];
    assert_eq!(
        (check.name.as_str(), check.bound, check.pass),
        ("latency_p99_us", 100.0, false)
    );
}

#[test]
fn a_met_latency_window_never_reports_a_value_above_its_bound() {
    // Samples just under the bound share a histogram bucket with values above it.
    let mut m = monitor(Slo {
        latency_us: Some(100),
        latency_percentile: 99.9,
        ..Slo::default()
    });
    latency_window(&mut m, 0, 1_000, 100 * US - 1, 0);
    let s = m.summary(at_ms(100));
    assert!(s.slo_met);
    let check = &s.checks[0];
    assert_eq!(check.name, "latency_p99.9_us");
    assert!(
        check.value <= check.bound && check.value >= 99.0,
        "{check:?}"
    );
}

#[test]
fn loss_bound_is_judged_per_window() {
    let mut m = monitor(Slo {
        max_loss: Some(0.01),
        ..Slo::default()
    });
    let window = |m: &mut SloMonitor, start_ms: u64, delivered: u64, lost: u64| {
        m.record_delivered(at_ms(start_ms + 10), delivered, delivered * 1_000);
        m.record_lost(at_ms(start_ms + 20), lost);
    };
    window(&mut m, 0, 1_000, 5); // 0.5%: met
    window(&mut m, 100, 1_000, 20); // 1.96%: violated
    window(&mut m, 200, 990, 10); // exactly 1%: met
    window(&mut m, 300, 0, 3); // 100%: violated
    assert!(violated(ViolationKind::Loss)(m.state(at_ms(400))));

    let closed: Vec<_> = m.closed_violations().cloned().collect();
    assert_eq!(closed.len(), 1);
    assert_eq!(
        (closed[0].started_at, closed[0].ended_at),
        (at_ms(100), Some(at_ms(200)))
    );
    assert_eq!(closed[0].worst_value, 20.0 / 1_020.0);
    assert_eq!(closed[0].bound, 0.01);
    let open: Vec<_> = m.open_violations().cloned().collect();
    assert_eq!(
        (open[0].started_at, open[0].ended_at, open[0].worst_value),
        (at_ms(300), None, 1.0)
    );

    let s = m.summary(at_ms(400));
    assert_eq!((s.delivered_packets, s.lost_packets), (2_990, 38));
    assert_eq!(s.loss_fraction, 38.0 / 3_028.0);
    assert_eq!(s.violations.len(), 2, "closed and open");
    assert_eq!(s.violations[1].ended_at, None);
}

#[test]
fn violations_started_counts_every_interval_and_the_window_grid_is_visible() {
    let config = SloMonitorConfig {
        max_closed_violations: 0,
        ..SloMonitorConfig::default()
    };
    let mut m = SloMonitor::new(min_10mbps(), config, Instant::ZERO).unwrap();
    assert_eq!(m.window(), Duration::from_millis(100));
    assert_eq!(m.window_start(), Instant::ZERO);
    // Violated, violated (same interval), met, violated: two intervals.
    for (k, delivered) in [MBPS5, MBPS5, MBPS20, MBPS5].into_iter().enumerate() {
        let k = k as u64;
        run_ms(&mut m, k * 100, (k + 1) * 100, MBPS20, delivered);
    }
    m.on_timeout(at_ms(400));
    assert_eq!(m.window_start(), at_ms(400));
    assert_eq!(m.violations_started(ViolationKind::MinBandwidth), 2);
    assert_eq!(m.violations_started(ViolationKind::Loss), 0);
    assert_eq!(m.dropped_violations(), 1, "kept none, still counted");
}

// ---------------------------------------------------------------- timers, memory, summary

#[test]
fn an_idle_gap_closes_open_violations_at_the_next_window_and_stops_timers() {
    let mut m = monitor(min_10mbps());
    assert_eq!(m.poll_at(), None, "nothing to judge yet");
    run_ms(&mut m, 0, 200, MBPS20, MBPS5);
    assert_eq!(m.poll_at(), Some(at_ms(200)));
    m.on_timeout(at_ms(200));
    assert!(violated(ViolationKind::MinBandwidth)(m.state(at_ms(200))));
    assert_eq!(
        m.poll_at(),
        Some(at_ms(300)),
        "an open violation keeps the timer armed"
    );

    assert_eq!(m.state(at_ms(10_050)), SloState::Met);
    let v = m.closed_violations().next().unwrap();
    assert_eq!((v.started_at, v.ended_at), (at_ms(0), Some(at_ms(200))));
    assert_eq!(m.poll_at(), None);
    assert_eq!(m.summary(at_ms(10_050)).windows, 100);

    // Judging restarts on the same window grid.
    run_ms(&mut m, 10_050, 10_100, MBPS20, MBPS5);
    assert_eq!(m.poll_at(), Some(at_ms(10_100)));
}

#[test]
fn closed_violations_are_bounded_dropping_the_oldest() {
    let config = SloMonitorConfig {
        max_closed_violations: 3,
        ..SloMonitorConfig::default()
    };
    let mut m = SloMonitor::new(min_10mbps(), config, Instant::ZERO).unwrap();
    for k in 0..20 {
        let delivered = if k % 2 == 0 { MBPS5 } else { MBPS20 };
        run_ms(&mut m, k * 100, (k + 1) * 100, MBPS20, delivered);
    }
    let s = m.summary(at_ms(2_000));
    assert_eq!(s.dropped_violations, 7);
    let starts: Vec<_> = s.violations.iter().map(|v| v.started_at).collect();
    assert_eq!(starts, [at_ms(1_400), at_ms(1_600), at_ms(1_800)]);
    assert_eq!(s.violated_windows, 10);

    let mut keep_none = SloMonitor::new(
        min_10mbps(),
        SloMonitorConfig {
            max_closed_violations: 0,
            ..config
        },
        Instant::ZERO,
    )
    .unwrap();
    run_ms(&mut keep_none, 0, 100, MBPS20, MBPS5);
    run_ms(&mut keep_none, 100, 200, MBPS20, MBPS20);
    let s = keep_none.summary(at_ms(200));
    assert_eq!((s.violations.len(), s.dropped_violations), (0, 1));
}

#[test]
fn summary_serializes_with_the_lab_check_shape() {
    let mut m = monitor(Slo {
        min_bps: 10_000_000,
        max_bps: Some(30_000_000),
        latency_us: Some(100),
        max_loss: Some(0.0),
        ..Slo::default()
    });
    run_ms(&mut m, 0, 1_000, MBPS20, MBPS20);
    latency_window(&mut m, 1_000, 0, 0, 40 * US);
    let s = m.summary(at_ms(1_100));
    assert!(s.slo_met);
    let names: Vec<_> = s.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["min_bps", "max_bps", "latency_p99_us", "max_loss"]);
    assert!(s.checks.iter().all(|c| c.pass));

    let json = serde_json::to_value(&s).unwrap();
    let check = json["checks"][0].as_object().unwrap();
    let mut keys: Vec<_> = check.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["bound", "name", "pass", "value"]);
    assert_eq!(json["slo_met"], true);
    let p99 = json["latency_p99_us"].as_f64().unwrap();
    assert!((40.0..=40.05).contains(&p99), "p99 {p99}");
}

proptest! {
    /// Whatever the sequence of good and bad windows, the reported violations are exactly the
    /// maximal runs of bad windows, aligned to window boundaries.
    #[test]
    fn violations_are_the_maximal_runs_of_violating_windows(bad in proptest::collection::vec(any::<bool>(), 1..40)) {
        let mut m = monitor(min_10mbps());
        for (k, &is_bad) in bad.iter().enumerate() {
            let k = k as u64;
            run_ms(&mut m, k * 100, (k + 1) * 100, MBPS20, if is_bad { MBPS5 } else { MBPS20 });
        }
        let end = bad.len() as u64 * 100;
        let s = m.summary(at_ms(end));

        let mut expected = Vec::new();
        let mut run_start = None;
        for (k, &is_bad) in bad.iter().enumerate() {
            let t = at_ms(k as u64 * 100);
            match (is_bad, run_start) {
                (true, None) => run_start = Some(t),
                (false, Some(start)) => { expected.push((start, Some(t))); run_start = None; }
                _ => {}
            }
        }
        if let Some(start) = run_start {
            expected.push((start, None));
        }
        let got: Vec<_> = s.violations.iter().map(|v| (v.started_at, v.ended_at)).collect();
        prop_assert_eq!(got, expected);
        prop_assert_eq!(s.violated_windows, bad.iter().filter(|&&b| b).count() as u64);
        prop_assert_eq!(s.slo_met, !bad.contains(&true));
        prop_assert_eq!(m.state(at_ms(end)) == SloState::Met, !bad.last().unwrap());
    }
}

/// One arbitrary observation: (kind 0..4, step in ns, value, whether `value` is used unreduced).
type Op = (u8, u64, u64, bool);

/// The SLO the arbitrary-observation tests judge: every bound set.
fn every_bound() -> Slo {
    Slo {
        min_bps: 10_000_000,
        max_bps: Some(20_000_000),
        latency_us: Some(100),
        max_loss: Some(0.01),
        ..Slo::default()
    }
}

/// Feeds `ops` to `m` from t = 0, each at the previous timestamp plus its step (minus it when
/// the step is a multiple of 7, as timestamps from several cores go back).
/// Returns the last timestamp used and the latest one, which is how far the monitor's windows
/// have moved: observations older than the current window count in it.
fn replay(m: &mut SloMonitor, ops: &[Op]) -> (Instant, Instant) {
    let (mut now, mut latest) = (Instant::ZERO, Instant::ZERO);
    for &(op, step_ns, value, huge) in ops {
        let step = Duration::from_nanos(step_ns);
        now = if step_ns % 7 == 0 {
            now - step
        } else {
            now + step
        };
        latest = latest.max(now);
        let value = if huge { value } else { value % 100_000 };
        match op {
            0 => m.record_offered(now, value),
            1 => m.record_delivered(now, value % 64, value),
            2 => m.record_lost(now, value),
            _ => m.record_latency(now, value),
        }
    }
    (now, latest)
}

/// The case proptest shrank `arbitrary_observations_keep_violations_well_formed` to (kept in
/// slo.proptest-regressions). Timestamps climb to exactly 900 ms, moving the current window
/// to [900, 1000), then go back; a packet lost "at" 386 ms therefore counts in [900, 1000),
/// which with nothing delivered breaks `max_loss`. That window is judged at 1000 ms and the
/// first idle one ends at 1100 ms, after the last timestamp (98.8 ms) plus 1 s: idleness is
/// measured from the latest timestamp seen, not the last one given.
#[test]
fn arbitrary_observations_regression_a_stale_loss_counts_in_the_latest_window() {
    let ops: [Op; 11] = [
        (0, 178596797, 0, false),
        (0, 28064843, 0, false),
        (0, 131235884, 0, false),
        (0, 286622013, 0, false),
        (0, 154079221, 0, false),
        (0, 121401242, 0, false),
        (0, 65582188, 0, false),
        (0, 46338817, 0, false),
        (0, 197985382, 0, false),
        (2, 203933681, 1, false),
        (0, 287332745, 15422490523282, false),
    ];
    let mut m = monitor(every_bound());
    let (last, latest) = replay(&mut m, &ops);
    assert_eq!(
        (last, latest),
        (Instant::from_nanos(98_827_187), at_ms(900))
    );
    assert_eq!(m.poll_at(), Some(at_ms(1_000)));

    let a_second_after_the_last = last + Duration::from_secs(1);
    assert!(violated(ViolationKind::Loss)(
        m.state(a_second_after_the_last)
    ));
    let open: Vec<_> = m.open_violations().cloned().collect();
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].kind, open[0].started_at, open[0].worst_value),
        (ViolationKind::Loss, at_ms(900), 1.0)
    );

    assert_eq!(
        m.state(at_ms(1_100)),
        SloState::Met,
        "[1000, 1100) was idle"
    );
    assert_eq!(m.poll_at(), None);
    let s = m.summary(latest + Duration::from_secs(1));
    assert_eq!((s.windows, s.violated_windows), (19, 1));
    assert_eq!((s.lost_packets, s.offered_bytes), (1, 23_282));
    let v = &s.violations[0];
    assert_eq!((v.started_at, v.ended_at), (at_ms(900), Some(at_ms(1_000))));
    assert!(!s.slo_met);
}

proptest! {
    /// Arbitrary observations (huge values, out-of-order and far-apart timestamps) never panic,
    /// and each kind's violations stay ordered, disjoint and on window boundaries.
    #[test]
    fn arbitrary_observations_keep_violations_well_formed(
        ops in proptest::collection::vec((0u8..4, 0u64..300_000_000, any::<u64>(), any::<bool>()), 1..200)
    ) {
        let mut m = monitor(every_bound());
        let (_, latest) = replay(&mut m, &ops);
        // A second after the latest timestamp (not the last one: a stale timestamp counts in
        // the current window, which the latest one chose), at least one idle window has ended.
        let end = latest + Duration::from_secs(1);
        let s = m.summary(end);
        prop_assert_eq!(m.state(end), SloState::Met, "an idle window closes everything");
        prop_assert_eq!(s.windows, end.as_nanos() / (100 * MS), "every ended window is counted");
        prop_assert!(s.violated_windows <= s.windows);
        for kind in ViolationKind::ALL {
            let mut last_end = Instant::ZERO;
            for v in s.violations.iter().filter(|v| v.kind == kind) {
                let ended = v.ended_at.unwrap();
                prop_assert!(v.started_at >= last_end && ended > v.started_at);
                prop_assert_eq!(v.started_at.as_nanos() % (100 * MS), 0);
                prop_assert_eq!(ended.as_nanos() % (100 * MS), 0);
                last_end = ended;
            }
        }
        prop_assert_eq!(s.slo_met, s.checks.iter().all(|c| c.pass));
    }
}
