//! Rotating the feedback key (docs/switch.md "Rotating the feedback key"): the control
//! plane's records step by step, learnt by the hosts in every order, lose no feedback; a
//! retired or unknown epoch and a forged tag are refused and counted.

use picnic_core::{Duration, Instant};
use picnic_wire::feedback::FeedbackOption;

use super::{check, FeedbackAuthState};
use crate::change::Change;
use crate::config::{EpochKey, FeedbackKeys};
use crate::directory::UPLINK;
use crate::engine::feedback_tests::{
    feedback_packet, limited_frames, HOST1_IP, HOST2_IP, KEY, WALL_AT_ZERO_NS,
};
use crate::engine::tests::Host;
use crate::frame::FramePool;
use crate::stats::FeedbackReject;

fn key(epoch: u32) -> Option<EpochKey> {
    Some(EpochKey {
        epoch,
        key: format!("{:02x}", epoch as u8 + 0x10).repeat(32),
    })
}

fn keys(previous: Option<u32>, active: Option<u32>, next: Option<u32>) -> FeedbackKeys {
    FeedbackKeys {
        previous: previous.and_then(key),
        active: active.and_then(key),
        next: next.and_then(key),
    }
}

/// What `picnic ctl feedback-key rotate` writes, twice from epoch 1: stage, then activate.
fn rotations() -> Vec<FeedbackKeys> {
    vec![
        keys(None, Some(1), None),
        keys(None, Some(1), Some(2)),
        keys(Some(1), Some(2), None),
        keys(Some(1), Some(2), Some(3)),
        keys(Some(2), Some(3), None),
    ]
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            all.push(q);
        }
    }
    all
}

/// Three hosts 198.19.0.1..=3 each with VM id `10 + host` of VNI 100 (feedback is about the
/// sender's own VM, as the directory check wants).
fn directory() -> crate::directory::Directory {
    let mut cfg = crate::engine::tests::config(1, 1000);
    cfg.hosts.push(crate::config::HostEntry {
        id: 3,
        underlay_ip: [198, 19, 0, 3].into(),
        mac: "02:00:00:00:01:03".parse().unwrap(),
    });
    cfg.vms.truncate(1);
    cfg.vms[0].port = None;
    for host in 1..=3u32 {
        let mut vm = cfg.vms[0].clone();
        (vm.name, vm.id, vm.host) = (format!("r{host}"), 10 + host, host);
        vm.mac = format!("02:00:00:00:0a:0{host}").parse().unwrap();
        vm.ip = [198, 18, 10, host as u8].into();
        cfg.vms.push(vm);
    }
    cfg.vms.remove(0);
    let engine = crate::engine::Engine::new(&cfg, Instant::ZERO).unwrap();
    engine.dir
}

/// Every host sends one feedback to every other at `now`; the refusals.
fn exchange(
    dir: &crate::directory::Directory,
    hosts: &mut [FeedbackAuthState],
    now: Instant,
) -> Vec<(usize, usize, FeedbackReject)> {
    let ip = |h: usize| std::net::Ipv4Addr::new(198, 19, 0, h as u8 + 1);
    let mut refused = Vec::new();
    for from in 0..hosts.len() {
        for to in (0..hosts.len()).filter(|&t| t != from) {
            let fb = FeedbackOption {
                dst_endpoint: 11 + from as u32,
                rate_bps: 1_000_000,
                seq: 1,
            };
            let auth = hosts[from].sign(now, ip(from), ip(to), 100, &fb);
            if let Err(r) = check(
                dir,
                &mut hosts[to],
                now,
                ip(from),
                ip(to),
                100,
                &fb,
                auth.as_ref(),
            ) {
                refused.push((from, to, r));
            }
        }
    }
    refused
}

fn host_at(record: &FeedbackKeys) -> FeedbackAuthState {
    let mut s = FeedbackAuthState::default();
    s.set_file_key(None, WALL_AT_ZERO_NS).unwrap();
    s.install(Some(record)).unwrap();
    s
}

/// Two rotations, each step learnt by the three hosts in every order (the control plane
/// starts a step once every host applied the one before): after each host learns, every
/// host's feedback reaches every other, and none is refused.
#[test]
fn a_rotation_in_any_order_across_hosts_loses_no_feedback() {
    let dir = directory();
    let records = rotations();
    let orders = permutations(3);
    let mut now = Instant::ZERO + Duration::from_secs(1);
    let mut exchanged = 0;
    for step in 1..records.len() {
        for order in &orders {
            let mut hosts: Vec<_> = (0..3).map(|_| host_at(&records[step - 1])).collect();
            for &h in order {
                hosts[h].install(Some(&records[step])).unwrap();
                now += Duration::from_millis(1);
                let refused = exchange(&dir, &mut hosts, now);
                assert!(
                    refused.is_empty(),
                    "step {step}, order {order:?}: {refused:?}"
                );
                exchanged += 6;
            }
            // The step done, every host signs with the record's active epoch.
            let active = records[step].active.as_ref().map(|k| k.epoch);
            assert!(hosts.iter().all(|h| h.epochs().1 == active));
        }
    }
    assert_eq!(exchanged, 4 * 6 * 3 * 6);
    // Without the staged step a host that activates first is refused by those that have not
    // learnt the key yet: why the control plane stages before it activates.
    let mut hosts: Vec<_> = (0..3).map(|_| host_at(&records[0])).collect();
    hosts[0].install(Some(&records[2])).unwrap();
    let refused = exchange(&dir, &mut hosts, now + Duration::from_millis(1));
    assert_eq!(
        refused,
        [
            (0, 1, FeedbackReject::UnknownEpoch),
            (0, 2, FeedbackReject::UnknownEpoch)
        ]
    );
}

/// A host at epoch 3 (2 the previous) through the live-change path: feedback signed with
/// retired epoch 1 or never-staged epoch 9 is refused as an unknown epoch, a tag forged for
/// epoch 3 as unauthenticated, and neither is applied; epochs 2 and 3 are. With the control
/// plane's keys gone, the key file's key (epoch 0) is back.
#[test]
fn retired_and_unknown_epochs_and_forged_tags_are_refused_and_counted() {
    let mut h1 = Host::new(1, 1000);
    h1.engine
        .set_feedback_key(Some(KEY), WALL_AT_ZERO_NS)
        .unwrap();
    let t = Instant::ZERO + Duration::from_secs(1);
    let mut pool = FramePool::new(16);
    let at_3 = keys(Some(2), Some(3), None);
    let change = Change::SetFeedbackKeys(Some(at_3));
    h1.engine.apply(t, &change, &mut pool).unwrap();
    assert_eq!(h1.engine.feedback_epochs(), (vec![2, 3], Some(3)));
    // Host 2 signing as of `record`, its nonces growing.
    let mut seq = 0;
    let mut signer = host_at(&keys(None, Some(1), None));
    let mut send = |h1: &mut Host, record: &FeedbackKeys| {
        seq += 1;
        signer.install(Some(record)).unwrap();
        let fb = FeedbackOption {
            dst_endpoint: 3,
            rate_bps: 1_000_000,
            seq,
        };
        let now = t + Duration::from_millis(u64::from(seq));
        let auth = signer.sign(now, HOST2_IP.into(), HOST1_IP.into(), 100, &fb);
        h1.inject(
            now,
            UPLINK,
            &feedback_packet(HOST2_IP, 100, 3, 1_000_000, seq, auth),
        );
    };
    send(&mut h1, &keys(None, Some(1), None));
    send(&mut h1, &keys(None, Some(9), None));
    // Epoch 3 named, but another key: the tag does not match.
    let mut forged = keys(None, Some(3), None);
    forged.active.as_mut().unwrap().key = "ee".repeat(32);
    send(&mut h1, &forged);
    let r = h1.engine.counters.feedback_rejected.clone();
    assert_eq!((r.unknown_epoch, r.unauthenticated), (2, 1));
    assert_eq!(
        limited_frames(&mut h1, t),
        0,
        "refused feedback was applied"
    );
    send(&mut h1, &keys(None, Some(2), None));
    send(&mut h1, &keys(Some(2), Some(3), None));
    let r = h1.engine.counters.feedback_rejected.clone();
    assert_eq!((r.unknown_epoch, r.unauthenticated, r.replayed), (2, 1, 0));
    assert_eq!(h1.engine.counters.feedback_received, 5);
    assert!(limited_frames(&mut h1, t) > 0, "epochs 2 and 3 are applied");
    // The record removed: back to the key file's key.
    let back = Change::SetFeedbackKeys(None);
    h1.engine.apply(t, &back, &mut pool).unwrap();
    assert_eq!(h1.engine.feedback_epochs(), (vec![0], Some(0)));
    // A bad key changes nothing.
    let mut bad = keys(None, Some(4), None);
    bad.active.as_mut().unwrap().key = "ab".into();
    assert!(h1
        .engine
        .apply(t, &Change::SetFeedbackKeys(Some(bad)), &mut pool)
        .is_err());
    assert_eq!(h1.engine.feedback_epochs(), (vec![0], Some(0)));
}
