use super::*;

const MBPS: u64 = 1_000_000 / 8;

fn receiver() -> Receiver<u32> {
    let config = ReceiverConfig {
        capacity: 1000 * MBPS,
        ..ReceiverConfig::default()
    };
    Receiver::new(config, Instant::ZERO).unwrap()
}

fn guarantee(g: u64) -> EndpointConfig {
    EndpointConfig {
        guarantee: g,
        max_rate: None,
    }
}

#[test]
fn rcp_step_moves_towards_capacity() {
    // Under-used: increase by alpha * (1 - y/C).
    assert_eq!(rcp_step(100, 0, 1000, 500, 1), 150);
    // At capacity: unchanged.
    assert_eq!(rcp_step(100, 1000, 1000, 500, 1), 100);
    // Slight overshoot: decrease by alpha * (y - C) / C.
    assert_eq!(rcp_step(100, 1100, 1000, 500, 1), 95);
    // Large overshoot: bounded by R * C / y instead of collapsing to min_rate.
    assert_eq!(rcp_step(100, 4000, 1000, 500, 1), 25);
    // Clamped to [min_rate, C].
    assert_eq!(rcp_step(900, 0, 1000, 500, 1), 1000);
    assert_eq!(rcp_step(10, 1_000_000, 1000, 500, 5), 5);
}

#[test]
fn rx_scheduler_splits_by_guarantee_among_active_endpoints() {
    let mut rx = receiver();
    for (id, g) in [(1, 200), (2, 100), (3, 700)] {
        rx.add_endpoint(id, guarantee(g * MBPS)).unwrap();
    }
    let t = Instant::from_nanos(1);
    rx.on_packet(t, 1, (), 1500).unwrap();
    rx.on_packet(t, 2, (), 1500).unwrap();
    let c = rx.shared_capacity();
    assert_eq!(c, 900 * MBPS);
    assert_eq!(rx.endpoint(1).unwrap().allowed, c * 2 / 3);
    assert_eq!(rx.endpoint(2).unwrap().allowed, c / 3);
    assert_eq!(rx.endpoint(3).unwrap().allowed, 0);
}

#[test]
fn capped_endpoint_leaves_the_rest_to_others() {
    let mut rx = receiver();
    rx.add_endpoint(
        1,
        EndpointConfig {
            guarantee: 500 * MBPS,
            max_rate: Some(100 * MBPS),
        },
    )
    .unwrap();
    rx.add_endpoint(2, guarantee(500 * MBPS)).unwrap();
    let t = Instant::from_nanos(1);
    rx.on_packet(t, 1, (), 1500).unwrap();
    rx.on_packet(t, 2, (), 1500).unwrap();
    assert_eq!(rx.endpoint(1).unwrap().allowed, 100 * MBPS);
    assert_eq!(rx.endpoint(2).unwrap().allowed, 800 * MBPS);
}

#[test]
fn feedback_is_sampled_every_10_kb_and_sequenced() {
    let mut rx = receiver();
    rx.add_endpoint(7, guarantee(MBPS)).unwrap();
    let t = Instant::from_nanos(10);
    // The first packet of an endpoint is always sampled.
    let first = rx.on_packet(t, 7, 42u8, 1000).unwrap().unwrap();
    assert_eq!((first.endpoint, first.source, first.seq), (7, 42, 1));
    assert_eq!(first.rate, rx.shared_capacity());
    // Then one every 10 kB (within the 100 us interval).
    let sampled: Vec<u32> = (0..30)
        .filter_map(|_| rx.on_packet(t, 7, 1u8, 1000).unwrap())
        .map(|fb| fb.seq)
        .collect();
    assert_eq!(sampled, vec![2, 3, 4]);
    // After 100 us without feedback, the next packet is sampled whatever its size.
    let later = t + Duration::from_micros(100);
    assert_eq!(rx.on_packet(later, 7, 1u8, 64).unwrap().unwrap().seq, 5);
}

/// A slow flow to an endpoint advertising its whole allotment is sampled for feedback once
/// per quiet interval, not once per packet; when the endpoint's rate changes or it is
/// congested, every `feedback_interval` again.
#[test]
fn a_quiet_endpoint_is_fed_back_once_per_quiet_interval() {
    let config = ReceiverConfig {
        capacity: 1000 * MBPS,
        quiet_feedback_interval: Some(Duration::from_millis(10)),
        // Interval samples only: no byte samples.
        feedback_units: u64::MAX,
        ..ReceiverConfig::default()
    };
    let mut rx = Receiver::new(config, Instant::ZERO).unwrap();
    rx.add_endpoint(7, guarantee(100 * MBPS)).unwrap();
    rx.add_endpoint(8, guarantee(100 * MBPS)).unwrap();
    // Packets to each of `eps` every `gap_ns` in [from, to) ms; the times of feedback for
    // the first.
    let mut run = |eps: &[u32], from: u64, to: u64, gap_ns: u64, units: u64| -> Vec<u64> {
        let mut fed = Vec::new();
        for t in (from * 1_000_000..to * 1_000_000).step_by(gap_ns as usize) {
            for &ep in eps {
                let fb = rx.on_packet(Instant::from_nanos(t), ep, (), units).unwrap();
                if fb.is_some() && ep == eps[0] {
                    fed.push(t);
                }
            }
        }
        fed
    };
    // 64 B every 500 us for 50 ms: the first packet, then one per 10 ms (without the quiet
    // interval: every packet, 100).
    let slow = run(&[7], 0, 50, 500_000, 64);
    assert_eq!(slow, [0, 10_000_000, 20_000_000, 30_000_000, 40_000_000]);
    // Endpoint 8 becomes active at 50 ms (7's refresh is due then too): 7's share halves,
    // RCP advertises the new rate from the window's end, and 7's next packet carries it;
    // then quiet again.
    let changed = run(&[7, 8], 50, 60, 500_000, 64);
    assert_eq!(changed, [50_000_000, 50_500_000]);
    // A flood of 1.3x the link: RCP advertises below the allotment, and the flood's packets
    // are sampled every 100 us again.
    let flood = run(&[7], 60, 62, 10_000, 1500);
    let gaps: Vec<u64> = flood.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(flood.len() >= 15, "{flood:?}");
    assert!(gaps.iter().skip(2).all(|&g| g <= 110_000), "{gaps:?}");
}

/// A quiet endpoint whose feedback leaves capped by another resource is not quiet: it is
/// sampled every `feedback_interval` while capped, so its senders hear within one when the
/// cap lifts; once its own rate is sent again it is quiet again.
#[test]
fn an_endpoint_whose_feedback_is_capped_elsewhere_is_not_quiet() {
    let config = ReceiverConfig {
        capacity: 1000 * MBPS,
        quiet_feedback_interval: Some(Duration::from_millis(10)),
        feedback_interval: Some(Duration::from_millis(1)),
        feedback_units: u64::MAX,
        ..ReceiverConfig::default()
    };
    let mut rx = Receiver::new(config, Instant::ZERO).unwrap();
    rx.add_endpoint(7, guarantee(100 * MBPS)).unwrap();
    // 64 B every 500 us; the feedback times in [from, to) ms, each reported capped while
    // `capped`.
    let mut run = |from: u64, to: u64, capped: bool| -> Vec<u64> {
        let mut fed = Vec::new();
        for t in (from * 1_000_000..to * 1_000_000).step_by(500_000) {
            if rx
                .on_packet(Instant::from_nanos(t), 7, (), 64)
                .unwrap()
                .is_some()
            {
                fed.push(t / 1_000_000);
                if capped {
                    rx.fed_back_capped(7);
                }
            }
        }
        fed
    };
    assert_eq!(run(0, 20, false), [0, 10], "quiet: every 10 ms");
    assert_eq!(
        run(20, 25, true),
        [20, 21, 22, 23, 24],
        "capped: every 1 ms"
    );
    // The cap lifted: the next sample, 1 ms on, carries the full rate; quiet from then.
    assert_eq!(run(25, 50, false), [25, 35, 45]);
}

/// The aggregate counts an endpoint from its first packet until 100 ms without
/// any (not only while it is in the 1 ms active set), with the demand of a hungry one.
#[test]
fn the_aggregate_counts_recent_endpoints_and_their_demands() {
    let mut rx = Receiver::new(ReceiverConfig::default(), Instant::ZERO).unwrap();
    rx.add_endpoint(1u32, guarantee(100 * MBPS)).unwrap();
    rx.add_endpoint(2u32, guarantee(300 * MBPS)).unwrap();
    let idle = rx.aggregate(Instant::ZERO);
    assert_eq!(
        (idle.active, idle.guarantee, idle.reserve),
        (0, 0, 400 * MBPS)
    );
    let mut now = Instant::ZERO;
    for _ in 0..10 {
        now += Duration::from_micros(200);
        let _ = rx.on_packet(now, 1, (), 400_000);
        rx.on_timeout(now);
    }
    let busy = rx.aggregate(now);
    assert_eq!((busy.active, busy.guarantee), (1, 100 * MBPS));
    assert_eq!(
        busy.demand,
        u64::MAX,
        "more than its share: it may want its max"
    );
    // Out of the active set after 1 ms, still counted until 100 ms.
    let later = now + Duration::from_millis(50);
    rx.on_timeout(later);
    assert_eq!(rx.aggregate(later).active, 1);
    assert_eq!(rx.aggregate(now + Duration::from_millis(100)).active, 0);
}

#[test]
fn a_single_endpoint_uses_the_solo_headroom_and_a_second_brings_the_full_one_back() {
    let config = ReceiverConfig {
        capacity: 1000 * MBPS,
        solo_headroom_permille: 10,
        ..ReceiverConfig::default()
    };
    let mut rx = Receiver::new(config, Instant::ZERO).unwrap();
    rx.add_endpoint(1u32, guarantee(100 * MBPS)).unwrap();
    let mut now = Instant::ZERO;
    // Endpoint 1, alone on the receiver, gets more than the link: allowed 99% of it.
    for _ in 0..50 {
        now += Duration::from_micros(200);
        let _ = rx.on_packet(now, 1, (), 400_000);
        rx.on_timeout(now);
    }
    assert_eq!(rx.endpoint(1).unwrap().allowed, 990 * MBPS);
    // A second endpoint is added (idle yet): the 10% headroom is back at once.
    rx.add_endpoint(2u32, guarantee(100 * MBPS)).unwrap();
    assert_eq!(rx.shared_capacity(), 900 * MBPS);
    assert_eq!(rx.endpoint(1).unwrap().allowed, 900 * MBPS);
    // Removed again: the solo headroom returns.
    rx.remove_endpoint(2).unwrap();
    assert_eq!(rx.shared_capacity(), 990 * MBPS);
}

#[test]
fn unknown_endpoint_and_bad_config_are_errors() {
    let mut rx = receiver();
    assert_eq!(
        rx.on_packet(Instant::ZERO, 9, (), 100),
        Err(EyeqError::UnknownEndpoint)
    );
    assert!(rx.add_endpoint(1, guarantee(0)).is_err());
    rx.add_endpoint(1, guarantee(1)).unwrap();
    assert_eq!(
        rx.add_endpoint(1, guarantee(1)),
        Err(EyeqError::DuplicateEndpoint)
    );
    let bad = ReceiverConfig {
        headroom_permille: 1000,
        ..ReceiverConfig::default()
    };
    assert!(Receiver::<u32>::new(bad, Instant::ZERO).is_err());
}

#[test]
fn idle_endpoint_leaves_the_active_set() {
    let mut rx = receiver();
    rx.add_endpoint(1, guarantee(MBPS)).unwrap();
    rx.add_endpoint(2, guarantee(MBPS)).unwrap();
    rx.on_packet(Instant::from_nanos(1), 1, (), 1500).unwrap();
    rx.on_packet(Instant::from_nanos(1), 2, (), 1500).unwrap();
    let mut t = Instant::ZERO;
    while t < Instant::ZERO + Duration::from_millis(2) {
        t = rx.poll_at().unwrap();
        rx.on_packet(t, 1, (), 1500).unwrap();
        rx.on_timeout(t);
    }
    assert!(!rx.endpoint(2).unwrap().active);
    assert_eq!(rx.endpoint(2).unwrap().allowed, 0);
    assert_eq!(rx.endpoint(1).unwrap().allowed, rx.shared_capacity());
}

#[test]
fn an_idle_receiver_has_no_deadline_until_traffic_arrives_and_after_it_went_idle() {
    let mut rx = receiver();
    rx.add_endpoint(1, guarantee(MBPS)).unwrap();
    assert_eq!(rx.poll_at(), None, "nothing received yet");
    rx.on_packet(Instant::from_nanos(10), 1, (), 1500).unwrap();
    let first = rx.poll_at().expect("a window with traffic must close");
    rx.on_timeout(first);
    assert!(rx.endpoint(1).unwrap().active);
    // Silence: windows keep closing until the endpoint has been idle `idle_after`.
    let mut t = first;
    while let Some(next) = rx.poll_at() {
        assert!(next > t);
        t = next;
        rx.on_timeout(t);
    }
    assert!(!rx.endpoint(1).unwrap().active);
    assert!(t >= Instant::from_nanos(10) + ReceiverConfig::default().idle_after);
}

/// Sends `packets` 1500-byte packets from each of `sources` to endpoint 1, spread over the
/// window starting at `start`, and closes that window.
fn one_window(rx: &mut Receiver<u32>, start: Instant, sources: &[u32], packets: u64) -> Instant {
    let window = rx.config().window;
    let step = window.as_nanos() / (packets * sources.len() as u64 + 1);
    let mut t = start;
    for _ in 0..packets {
        for &s in sources {
            t += Duration::from_nanos(step);
            rx.on_packet(t, 1, s, 1500).unwrap();
        }
    }
    let end = start + window;
    rx.on_timeout(end);
    end
}

#[test]
fn a_lone_senders_burst_does_not_collapse_its_rate() {
    // One sender (its limiter at C_i), whose queue drains into the link at twice C_i for
    // five windows: each RCP step would halve the rate (R * C / y), to C_i / 32.
    let mut rx = receiver();
    rx.add_endpoint(1, guarantee(MBPS)).unwrap();
    let c = rx.shared_capacity();
    let twice_c = c * 2 * 200 / 1_000_000 / 1500; // packets per 200 us window
    let mut t = Instant::ZERO;
    for _ in 0..5 {
        t = one_window(&mut rx, t, &[7], twice_c);
        let ep = rx.endpoint(1).unwrap();
        assert_eq!(ep.allowed, c);
        assert!(ep.advertised >= c * 3 / 4, "{} < 3/4 of {c}", ep.advertised);
    }
}

#[test]
fn senders_that_appear_while_overloaded_start_at_a_fair_share_and_stay_near_it() {
    // Eight senders start at once, 1.5 C_i together: the first window's step alone would
    // advertise 3/4 of C_i to each (6 C_i in all).
    let mut rx = receiver();
    rx.add_endpoint(1, guarantee(MBPS)).unwrap();
    let c = rx.shared_capacity();
    let sources: Vec<u32> = (1..=8).collect();
    let per_window = c * 3 / 2 * 200 / 1_000_000 / 1500 / 8;
    let t = one_window(&mut rx, Instant::ZERO, &sources, per_window);
    let t = one_window(&mut rx, t, &sources, per_window);
    let fair = c / 8;
    assert!(
        rx.endpoint(1).unwrap().advertised <= fair,
        "{:?}",
        rx.endpoint(1)
    );
    // Overloaded on: RCP goes below C_i / 8 (senders that overshoot their rate), but not
    // under 3/4 of it.
    let mut t = t;
    for _ in 0..20 {
        t = one_window(&mut rx, t, &sources, per_window);
        let r = rx.endpoint(1).unwrap().advertised;
        assert!(
            r >= fair * 3 / 4 && r <= fair,
            "{r} outside [3/4, 1] of {fair}"
        );
    }
}

/// A small deterministic generator for the arrival patterns below (no dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

fn sorted_stats(rx: &Receiver<u32>) -> Vec<(u32, EndpointStats)> {
    let mut v: Vec<_> = rx.endpoints().collect();
    v.sort_by_key(|(id, _)| *id);
    v
}

/// Closes `rx`'s windows as an owner busy until `busy_until` and then idle until `now`
/// would with a timer at `poll_at`: a window that ended while it was busy late, when it was
/// done, each later one at its end.
fn timer_closes(rx: &mut Receiver<u32>, busy_until: Instant, now: Instant) {
    if rx.poll_at().is_some_and(|at| at <= busy_until) {
        rx.on_timeout(busy_until);
    }
    while let Some(at) = rx.poll_at().filter(|&at| at <= now) {
        rx.on_timeout(at);
    }
}

/// Lazy closing leaves the state per-window timers leave: the same arrivals (bursts, floods,
/// slow RPCs, silences of many windows and of many `idle_after`s) fed to a receiver whose
/// windows are closed by a timer and to one caught up only before its packets and reads
/// give the same feedback, measured rates, active sets, allocations and advertised rates at
/// every packet and every read. Before each, the owner was busy for a random while (up to
/// the event; a timer due then fires late) and idle for the rest.
#[test]
fn windows_closed_lazily_leave_the_state_timers_leave() {
    // The switch's window at 200 Mb/s, and a short window with a long idle time (many
    // empty windows at a fixed point, which catching up skips).
    let shapes = [(605, 1_000), (50, 3_000)];
    for seed in 1..=20u64 {
        let (window_us, idle_us) = shapes[seed as usize % 2];
        // Senders come and go (the fair start and floor follow their count), a few or more
        // than the receiver tells apart.
        let sources = [4, 24][seed as usize / 2 % 2];
        let config = ReceiverConfig {
            capacity: 200 * MBPS,
            window: Duration::from_micros(window_us),
            feedback_interval: Some(Duration::from_micros(window_us)),
            idle_after: Duration::from_micros(idle_us),
            min_rate: MBPS,
            ..ReceiverConfig::default()
        };
        let mut timed = Receiver::new(config, Instant::ZERO).unwrap();
        let mut lazy = Receiver::new(config, Instant::ZERO).unwrap();
        for (id, g) in [(1u32, 50), (2, 100), (3, 20)] {
            timed.add_endpoint(id, guarantee(g * MBPS)).unwrap();
            lazy.add_endpoint(id, guarantee(g * MBPS)).unwrap();
        }
        let mut rng = Lcg(seed);
        let mut now = Instant::ZERO;
        for step in 0..3_000 {
            let last = now;
            // Gaps from back to back to several ms, so windows end between packets by the
            // dozen, and endpoints go idle and come back.
            now += Duration::from_nanos(match rng.next(10) {
                0..=5 => rng.next(20_000),
                6..=8 => rng.next(1_000_000),
                _ => rng.next(6_000_000),
            });
            let busy_until = (last + Duration::from_nanos(rng.next(2_000_000))).min(now);
            timer_closes(&mut timed, busy_until, now);
            lazy.catch_up(busy_until, now);
            if rng.next(8) == 0 {
                // A read (metrics, the aggregate) at a time of its own.
                assert_eq!(timed.aggregate(now), lazy.aggregate(now), "seed {seed}");
            } else {
                let ep = 1 + rng.next(3) as u32;
                let source = rng.next(sources);
                let units = 64 + rng.next(1_500);
                let a = timed.on_packet(now, ep, source, units).unwrap();
                let b = lazy.on_packet(now, ep, source, units).unwrap();
                assert_eq!(a, b, "seed {seed} step {step}: feedback");
            }
            assert_eq!(
                sorted_stats(&timed),
                sorted_stats(&lazy),
                "seed {seed} step {step} at {now:?}"
            );
        }
    }
}

/// A sender that stops counting while empty windows are skipped (its last packet a horizon
/// ago, its endpoint still active through another) is not counted when a new one comes: the
/// new sender of an overloaded endpoint gets the fair start (C_i / 2) after a caught-up
/// silence as after a timer's closes.
#[test]
fn a_sender_gone_during_a_caught_up_silence_is_not_counted_at_the_next_onset() {
    let mut timed = receiver();
    let mut lazy = receiver();
    timed.add_endpoint(1, guarantee(MBPS)).unwrap();
    lazy.add_endpoint(1, guarantee(MBPS)).unwrap();
    let c = timed.shared_capacity();
    let mut last = Instant::ZERO;
    let mut packet = |at_ns: u64, source: u32| {
        let now = Instant::from_nanos(at_ns);
        // Idle between packets: the timer closes every window at its end.
        timer_closes(&mut timed, last, now);
        lazy.catch_up(last, now);
        last = now;
        let a = timed.on_packet(now, 1, source, 1500).unwrap();
        let b = lazy.on_packet(now, 1, source, 1500).unwrap();
        assert_eq!(a, b, "feedback at {now:?}");
        assert_eq!(sorted_stats(&timed), sorted_stats(&lazy), "at {now:?}");
        (timed.endpoint(1).unwrap(), lazy.endpoint(1).unwrap())
    };
    // Senders 1 and 2 under C_i until 400 us, then 2 alone until 1.6 ms.
    for k in 0..8 {
        packet(50_000 * k, 1);
        packet(50_000 * k + 25_000, 2);
    }
    for k in 8..=32 {
        packet(50_000 * k, 2);
    }
    // Quiet until 2.5 ms: sender 1 leaves the count (2 ms horizon) at 2.4 ms, the endpoint
    // stays active (1 ms idle time) until 2.6 ms. Then sender 3 and 2 together overload it
    // (1.5 C_i).
    let per_window = c * 3 / 2 * 200 / 1_000_000 / 1500;
    let step = 100_000 / per_window;
    for k in 0..per_window {
        packet(2_500_000 + step * k, 2 + k as u32 % 2);
    }
    let (timed_ep, lazy_ep) = packet(2_610_000, 3);
    assert!(timed_ep.advertised <= c / 2, "{timed_ep:?}");
    assert_eq!(timed_ep, lazy_ep);
}

/// Catching up a long silence takes a few steps, not one per window: a receiver with a 1 ns
/// window and a one-second idle time, read after ten seconds, is done at once, with its
/// endpoint out of the active set and its rates back to zero.
#[test]
fn catching_up_a_long_silence_takes_a_few_steps() {
    let config = ReceiverConfig {
        window: Duration::from_nanos(1),
        idle_after: Duration::from_secs(1),
        ..ReceiverConfig::default()
    };
    let mut rx = Receiver::new(config, Instant::ZERO).unwrap();
    rx.add_endpoint(1u32, guarantee(MBPS)).unwrap();
    rx.on_packet(Instant::from_nanos(10), 1, (), 1500).unwrap();
    let t = Instant::ZERO + Duration::from_secs(10);
    let started = std::time::Instant::now();
    rx.catch_up(Instant::from_nanos(10), t);
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    let ep = rx.endpoint(1).unwrap();
    assert!(!ep.active);
    assert_eq!((ep.allowed, ep.advertised, ep.measured), (0, 0, 0));
    assert_eq!(rx.poll_at(), None);
    // Half a second after a packet: still active, its rate at its allotment.
    rx.on_packet(t, 1, (), 1500).unwrap();
    rx.catch_up(t, t + Duration::from_millis(500));
    let ep = rx.endpoint(1).unwrap();
    assert!(ep.active);
    assert_eq!(ep.advertised, ep.allowed);
}

/// Arrivals counted on another path (a kernel fast path) and read every 1.5 ms, longer than
/// the 1 ms active set: with their own last arrival the overloaded endpoint stays active and
/// RCP holds its rate down; counted as packets at the reads, it is taken for idle at each
/// read and restarts fresh at its whole allotment.
#[test]
fn arrivals_read_late_keep_an_overloaded_endpoint_active() {
    // (advertised, allotted) of endpoint 1 after each read.
    let run = |late_reads_as_packets: bool| -> Vec<(u64, u64)> {
        let mut rx = receiver();
        rx.add_endpoint(1, guarantee(100 * MBPS)).unwrap();
        rx.add_endpoint(2, guarantee(100 * MBPS)).unwrap();
        let mut seen = Vec::new();
        // Endpoint 1 receives at the link's rate (twice its half), endpoint 2 at a quarter
        // of it; read every 1.5 ms, the last arrival just before each read.
        for read in 1..=40u64 {
            let now = Instant::from_nanos(read * 1_500_000);
            let last = Instant::from_nanos(read * 1_500_000 - 10_000);
            let link = 1000 * MBPS * 3 / 2000; // 1.5 ms of the link
            let reads = [(1, link), (2, link / 4)];
            if !late_reads_as_packets {
                for (ep, _) in reads {
                    rx.received_until(ep, last);
                }
            }
            for (ep, units) in reads {
                rx.on_packet(now, ep, (), units).unwrap();
            }
            let stats = rx.endpoint(1).unwrap();
            seen.push((stats.advertised, stats.allowed));
        }
        seen
    };
    let kept = run(false);
    let restarted = run(true);
    // Kept active: RCP holds it at most at its fair floor, 3/4 of its allotment, from the
    // tenth read on.
    assert!(
        kept[10..].iter().all(|&(r, c)| r <= c * 3 / 4),
        "kept: {kept:?}"
    );
    // Without the arrival times it restarts at its whole allotment at most reads.
    let fresh = restarted[10..].iter().filter(|&&(r, c)| r >= c).count();
    assert!(fresh >= 20, "restarted: {restarted:?}");
}
