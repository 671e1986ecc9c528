//! The series: every family is registered on every scrape, with or without samples, so that
//! the set of names is fixed (`family_names`, the dashboard's test).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;

use super::Histograms;
use crate::engine::{kind_name, VmSnapshot};
use crate::runner::Published;

type Labels<const N: usize> = [(&'static str, String); N];
/// A count (frames, bytes, events).
type Count = Counter;
/// A time, seconds (kept in ns by the switch).
type Seconds = Counter<f64, AtomicU64>;
type Level = Gauge;
type Real = Gauge<f64, AtomicU64>;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Registers a family named `picnic_NAME`.
fn family<M, const N: usize>(reg: &mut Registry, name: &str, help: &str) -> Family<Labels<N>, M>
where
    M: EncodeMetric + TypedMetric + Default + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<Labels<N>, M>::default();
    reg.register(name, help, f.clone());
    f
}

fn vm_labels(vm: &VmSnapshot) -> Labels<2> {
    [("tenant", vm.tenant.clone()), ("vm", vm.name.clone())]
}

fn vm_and(vm: &VmSnapshot, key: &'static str, value: impl Into<String>) -> Labels<3> {
    let [t, v] = vm_labels(vm);
    [t, v, (key, value.into())]
}

fn tenant(name: &str) -> Labels<1> {
    [("tenant", name.to_string())]
}

/// Every family, filled from `published`.
pub(super) fn registry(published: &Published) -> Registry {
    let mut reg = Registry::with_prefix("picnic");
    vms(&mut reg, published);
    tenants(&mut reg, published);
    switch(&mut reg, published);
    ports_and_workers(&mut reg, published);
    slo(&mut reg, published);
    reg
}

fn vms(reg: &mut Registry, p: &Published) {
    let r = &mut *reg;
    let rx_packets = family::<Count, 2>(r, "vm_rx_packets", "Frames delivered to the VM");
    let rx_bytes = family::<Count, 2>(r, "vm_rx_bytes", "Bytes delivered to the VM");
    let tx_packets = family::<Count, 2>(r, "vm_tx_packets", "Frames the VM sent into the switch");
    let tx_bytes = family::<Count, 2>(r, "vm_tx_bytes", "Bytes the VM sent into the switch");
    let cpu = family::<Seconds, 2>(
        r,
        "vm_cpu_seconds",
        "Dataplane CPU time charged for the VM's frames, both directions, I/O included",
    );
    let softirq = family::<Seconds, 2>(
        r,
        "vm_softirq_seconds",
        "Kernel NET_RX softirq time on the VM's port outside the switch's threads (eBPF)",
    );
    let drops = family::<Count, 3>(r, "vm_drops", "Frames from or to the VM dropped, by reason");
    let queue = family::<Level, 2>(
        r,
        "vm_queue_depth",
        "Frames queued for the VM (egress + ingress)",
    );
    let advertised = family::<Real, 2>(
        r,
        "vm_advertised_rate_bytes_per_second",
        "Rate advertised to the VM's senders (EyeQ R_i); absent until measured",
    );
    let applied = family::<Real, 2>(
        r,
        "vm_applied_limit_bytes_per_second",
        "Sum of the feedback-set limits applied to the VM's traffic",
    );
    let waited = family::<Count, 3>(
        r,
        "vm_waited_frames",
        "Frames of the VM that went through a shaped class's or a feedback limiter's queue",
    );
    let worker = family::<Level, 2>(
        r,
        "vm_worker",
        "The dataplane worker that owns the VM's port",
    );
    let mut wait = Histograms::default();
    let fast_rx_packets = family::<Count, 2>(
        r,
        "vm_fast_path_rx_packets",
        "Frames the kernel fast path delivered to the VM",
    );
    let fast_rx_bytes = family::<Count, 2>(
        r,
        "vm_fast_path_rx_bytes",
        "Bytes the kernel fast path delivered to the VM",
    );
    let fast_tx_packets = family::<Count, 2>(
        r,
        "vm_fast_path_tx_packets",
        "Frames of the VM the kernel fast path forwarded",
    );
    let fast_tx_bytes = family::<Count, 2>(
        r,
        "vm_fast_path_tx_bytes",
        "Bytes of the VM the kernel fast path forwarded",
    );
    let handed = family::<Count, 3>(
        r,
        "vm_fast_path_handed_over",
        "Frames the kernel fast path handed over to the engines (or dropped: reasons \
         rx_dropped, tx_dropped, tx_shed), by reason",
    );
    for vm in &p.switch.vms {
        let l = vm_labels(vm);
        let c = &vm.counters;
        rx_packets.get_or_create(&l).inc_by(c.rx_packets);
        rx_bytes.get_or_create(&l).inc_by(c.rx_bytes);
        tx_packets.get_or_create(&l).inc_by(c.tx_packets);
        tx_bytes.get_or_create(&l).inc_by(c.tx_bytes);
        cpu.get_or_create(&l).inc_by(secs(c.cost_ns));
        softirq.get_or_create(&l).inc_by(secs(c.softirq_ns));
        for (reason, n) in c.drops.iter() {
            drops
                .get_or_create(&vm_and(vm, "reason", reason.as_str()))
                .inc_by(n);
        }
        queue
            .get_or_create(&l)
            .set((vm.egress_queue + vm.ingress_queue) as i64);
        if let Some(bps) = vm.advertised_bps {
            advertised.get_or_create(&l).set(bps as f64 / 8.0);
        }
        let limits: u64 = vm.applied_limits.iter().map(|(_, r)| *r).sum();
        applied.get_or_create(&l).set(limits as f64 / 8.0);
        for (q, n) in [
            ("shaped_class", c.waited_shaped_class),
            ("limiter", c.waited_limiter),
        ] {
            waited.get_or_create(&vm_and(vm, "queue", q)).inc_by(n);
        }
        worker.get_or_create(&l).set(vm.worker as i64);
        wait.push(l.clone(), &c.ingress_wait);
        let f = &c.fast_path;
        fast_rx_packets.get_or_create(&l).inc_by(f.rx_packets);
        fast_rx_bytes.get_or_create(&l).inc_by(f.rx_bytes);
        fast_tx_packets.get_or_create(&l).inc_by(f.tx_packets);
        fast_tx_bytes.get_or_create(&l).inc_by(f.tx_bytes);
        for (reason, n) in [
            ("rx_dropped", f.rx_dropped),
            ("tx_dropped", f.tx_dropped),
            ("tx_shed", f.tx_shed),
            ("not_granted", f.handed_not_granted),
            ("tokens", f.handed_tokens),
            ("not_unicast_ipv4", f.handed_not_unicast_ipv4),
            ("spoofed", f.handed_spoofed),
            ("destination", f.handed_destination),
            ("offload", f.handed_offload),
            ("geneve_options", f.handed_geneve_options),
        ] {
            handed
                .get_or_create(&vm_and(vm, "reason", reason))
                .inc_by(n);
        }
    }
    reg.register(
        "vm_ingress_wait_seconds",
        "Time frames to the VM waited in its ingress queue, through the switch to its port",
        wait,
    );
}

fn tenants(reg: &mut Registry, p: &Published) {
    let r = &mut *reg;
    let cpu = family::<Seconds, 1>(
        r,
        "tenant_cpu_seconds",
        "Dataplane CPU time charged for the tenant's frames, summed over its VMs",
    );
    let charged = family::<Seconds, 1>(
        r,
        "tenant_cpu_charged_seconds",
        "Processing CPU charged to the tenant's quota (Iron)",
    );
    let softirq = family::<Seconds, 1>(
        r,
        "tenant_softirq_seconds",
        "Kernel softirq time on the tenant's ports charged to it (eBPF)",
    );
    let throttled = family::<Count, 1>(
        r,
        "tenant_cpu_throttle_drops",
        "Frames dropped because the tenant was over its CPU quota",
    );
    let accel_jobs = family::<Count, 2>(
        r,
        "tenant_accel_jobs",
        "Jobs of the tenant the shared encryption engine finished or refused, by outcome",
    );
    let accel_cpu = family::<Seconds, 1>(
        r,
        "tenant_accel_cpu_seconds",
        "Encryption engine worker CPU time spent on the tenant's jobs",
    );
    let accel_bytes = family::<Count, 1>(
        r,
        "tenant_accel_bytes",
        "Bytes the tenant's encryption jobs covered",
    );
    let mut accel_queue = Histograms::default();
    let mut accel_turnaround = Histograms::default();
    for t in &p.switch.tenants {
        let l = tenant(&t.name);
        cpu.get_or_create(&l).inc_by(secs(t.cost_ns));
        charged.get_or_create(&l).inc_by(secs(t.cpu_charged_ns));
        softirq.get_or_create(&l).inc_by(secs(t.softirq_ns));
        throttled.get_or_create(&l).inc_by(t.cpu_throttle_drops);
    }
    for (name, a) in p.accel.iter().flat_map(|a| &a.tenants) {
        let l = tenant(name);
        for (outcome, n) in [
            ("sealed", a.sealed),
            ("opened", a.opened),
            ("auth_failed", a.auth_failed),
            ("unknown_key", a.unknown_key),
            ("no_key", a.no_key),
            ("malformed", a.malformed),
            ("queue_full", a.queue_full),
        ] {
            let [t] = l.clone();
            accel_jobs
                .get_or_create(&[t, ("outcome", outcome.into())])
                .inc_by(n);
        }
        accel_cpu.get_or_create(&l).inc_by(secs(a.cpu_ns));
        accel_bytes.get_or_create(&l).inc_by(a.bytes);
        accel_queue.push(l.clone(), &a.latency.queue);
        accel_turnaround.push(l, &a.latency.turnaround);
    }
    reg.register(
        "tenant_accel_queue_wait_seconds",
        "Time the tenant's jobs waited in its encryption engine queue",
        accel_queue,
    );
    reg.register(
        "tenant_accel_turnaround_seconds",
        "Time the tenant's jobs took through the encryption engine, submission to result",
        accel_turnaround,
    );
}

fn switch(reg: &mut Registry, p: &Published) {
    let s = &p.switch.switch;
    let r = &mut *reg;
    let one = |r: &mut Registry, name: &str, help: &str, n: u64| {
        let c = Count::default();
        c.inc_by(n);
        r.register(name, help, c);
    };
    one(
        r,
        "uplink_rx_packets",
        "Frames received on the uplink",
        s.uplink_rx_packets,
    );
    one(
        r,
        "uplink_tx_packets",
        "Frames sent on the uplink",
        s.uplink_tx_packets,
    );
    one(
        r,
        "feedback_sent",
        "Congestion feedback messages sent",
        s.feedback_sent,
    );
    one(
        r,
        "feedback_received",
        "Congestion feedback messages received",
        s.feedback_received,
    );
    one(
        r,
        "arp_replies",
        "ARP requests of VMs the switch answered",
        s.arp_replies,
    );
    one(
        r,
        "nd_replies",
        "Neighbor Solicitations of VMs the switch answered",
        s.nd_replies,
    );
    one(
        r,
        "ecn_marked",
        "Frames marked ECN CE by a filling limiter queue",
        s.ecn_marked,
    );
    let sw_drops = family::<Count, 1>(
        r,
        "switch_drops",
        "Frames not attributable to a VM dropped, by reason",
    );
    for (reason, n) in s.drops.iter() {
        sw_drops
            .get_or_create(&[("reason", reason.as_str().into())])
            .inc_by(n);
    }
    let rejected = family::<Count, 1>(
        r,
        "feedback_rejected",
        "Congestion feedback refused before it was applied, by reason",
    );
    for (reason, n) in s.feedback_rejected.iter() {
        rejected
            .get_or_create(&[("reason", reason.into())])
            .inc_by(n);
    }
    let cpu = family::<Seconds, 1>(
        r,
        "switch_cpu_seconds",
        "Dataplane CPU time measured, by use: vms (charged to them), unattributed \
         (frames of no local VM), overhead (idle passes); they add up to the threads' time",
    );
    let unattributed = s.unattributed_ns + s.overhead_ns;
    for (use_, ns) in [
        ("vms", s.cpu_ns.saturating_sub(unattributed)),
        ("unattributed", s.unattributed_ns),
        ("overhead", s.overhead_ns),
    ] {
        cpu.get_or_create(&[("use", use_.into())]).inc_by(secs(ns));
    }
    let softirq = family::<Seconds, 1>(
        r,
        "host_softirq_seconds",
        "The host's NET_RX softirq time, by where it went: tenants (their ports, outside the \
         switch), switch (in its threads), untracked (other devices); absent while off",
    );
    if let Some(t) = &s.softirq {
        for (part, ns) in [
            ("tenants", t.attributed_ns),
            ("switch", t.switch_ns),
            ("untracked", t.untracked_ns),
        ] {
            softirq
                .get_or_create(&[("part", part.into())])
                .inc_by(secs(ns));
        }
    }
    let model = family::<Real, 1>(
        r,
        "cost_model_seconds",
        "The dataplane loop's fitted CPU cost, by term: fixed (per iteration), per_frame, \
         per_byte; absent until fitted",
    );
    if let Some(m) = &p.switch.cost_model {
        for (term, ns) in [
            ("fixed", m.fixed_ns),
            ("per_frame", m.per_frame_ns),
            ("per_byte", m.per_byte_ns),
        ] {
            model.get_or_create(&[("term", term.into())]).set(ns / 1e9);
        }
    }
    let pool_free = Level::default();
    pool_free.set(p.pool_free as i64);
    reg.register(
        "pool_free_frames",
        "Free frames in the preallocated pool (the rest are queued)",
        pool_free,
    );
    let pool_capacity = Level::default();
    pool_capacity.set(p.pool_capacity as i64);
    reg.register(
        "pool_capacity_frames",
        "Frames in the preallocated pool",
        pool_capacity,
    );
}

fn ports_and_workers(reg: &mut Registry, p: &Published) {
    let r = &mut *reg;
    let counters = [
        ("port_rx_frames", "Frames the port handed to the switch"),
        ("port_rx_bytes", "Bytes the port handed to the switch"),
        (
            "port_rx_dropped_frames",
            "Frames lost before the switch saw them (kernel ring or queue full)",
        ),
        (
            "port_rx_oversize_frames",
            "Received frames too long for the switch, dropped",
        ),
        (
            "port_rx_offload_errors",
            "Received frames whose offload could not be finished",
        ),
        (
            "port_rx_gso_frames",
            "Received TSO/USO super-frames, segmented by the port",
        ),
        (
            "port_rx_gso_segments",
            "Frames made from those super-frames (also in rx_frames)",
        ),
        (
            "port_rx_csum_partial_frames",
            "Received frames whose partial L4 checksum the port completed",
        ),
        ("port_tx_frames", "Frames sent on the port"),
        ("port_tx_bytes", "Bytes sent on the port"),
        (
            "port_tx_errors",
            "Frames the kernel refused for good, dropped",
        ),
        (
            "port_ring_errors",
            "vhost-user descriptor chains that could not be used",
        ),
        (
            "port_kernel_wakeups",
            "AF_XDP system calls made because a ring asked to wake the kernel (need_wakeup)",
        ),
    ]
    .map(|(name, help)| family::<Count, 2>(r, name, help));
    let regimes = family::<Level, 2>(
        r,
        "port_wait_regime",
        "Rizzo et al. regime of each receive ring (1 for the current one; GP while spinning)",
    );
    let decisions = family::<Count, 2>(
        r,
        "port_wait_decisions",
        "Idle passes on which each receive ring's adaptive wait chose to spin or to block",
    );
    let period = family::<Real, 2>(
        r,
        "port_producer_period_seconds",
        "Estimated time between frames from each receive ring's producer; absent until estimated",
    );
    for port in &p.ports {
        let l = [
            ("port", port.name.clone()),
            ("worker", port.worker.to_string()),
        ];
        let s = &port.stats;
        let values = [
            s.rx_frames,
            s.rx_bytes,
            s.rx_dropped,
            s.rx_oversize,
            s.rx_offload_errors,
            s.rx_gso_frames,
            s.rx_gso_segments,
            s.rx_csum_partial,
            s.tx_frames,
            s.tx_bytes,
            s.tx_errors,
            s.ring_errors,
            s.kernel_wakeups,
        ];
        for (f, n) in counters.iter().zip(values) {
            f.get_or_create(&l).inc_by(n);
        }
        if let Some(ns) = port.producer_period_ns {
            period.get_or_create(&l).set(secs(ns));
        }
        let name = ("port", port.name.clone());
        if let Some(regime) = &port.wait_regime {
            regimes
                .get_or_create(&[name.clone(), ("regime", regime.clone())])
                .set(1);
        }
        for (decision, n) in [("spin", port.wait_spins), ("block", port.wait_blocks)] {
            decisions
                .get_or_create(&[name.clone(), ("decision", decision.into())])
                .inc_by(n);
        }
    }
    let cpu = family::<Seconds, 1>(
        r,
        "worker_cpu_seconds",
        "CPU time of each dataplane worker's thread",
    );
    let handoff = family::<Count, 1>(
        r,
        "worker_handoff_frames",
        "Frames each worker handed to another (uplink frames for its VMs, frames for its \
         ports, feedback copies)",
    );
    let received = family::<Count, 1>(
        r,
        "worker_handoff_received_frames",
        "Frames other workers handed to this one",
    );
    let lost = family::<Count, 2>(
        r,
        "worker_handoff_dropped_frames",
        "Frames handed to the worker and dropped: full (its mailbox was full), stale (a live \
         change moved or removed their VM's port meanwhile)",
    );
    let commits = family::<Count, 1>(
        r,
        "worker_live_commits",
        "Live changes the worker's loop applied that changed something",
    );
    let commit_time = family::<Real, 2>(
        r,
        "worker_live_commit_seconds",
        "Time the worker's loop took to apply a live change (its frames waited meanwhile), \
         at a percentile (100: the longest) since start",
    );
    for w in &p.workers {
        let l = [("worker", w.worker.to_string())];
        cpu.get_or_create(&l).inc_by(secs(w.cpu_ns));
        handoff.get_or_create(&l).inc_by(w.handoff.out);
        received.get_or_create(&l).inc_by(w.handoff.r#in);
        for (why, n) in [("full", w.handoff.full), ("stale", w.handoff.stale)] {
            let [wl] = l.clone();
            lost.get_or_create(&[wl, ("reason", why.into())]).inc_by(n);
        }
        let c = &w.live_commits;
        commits.get_or_create(&l).inc_by(c.commits);
        if c.commits > 0 {
            for (percentile, us) in [("50", c.p50_us), ("99", c.p99_us), ("100", c.max_us)] {
                let [wl] = l.clone();
                commit_time
                    .get_or_create(&[wl, ("percentile", percentile.into())])
                    .set(us / 1e6);
            }
        }
    }
}

/// Per tenant with an SLO: whether it is met, violations by kind, and the why breakdown.
fn slo(reg: &mut Registry, p: &Published) {
    let r = &mut *reg;
    let met = family::<Level, 1>(
        r,
        "tenant_slo_met",
        "1 when the tenant's last judged SLO window met every bound, else 0",
    );
    let violated = family::<Level, 2>(
        r,
        "tenant_slo_violated",
        "1 while a bound of the tenant's SLO is in violation, by kind",
    );
    let violations = family::<Count, 2>(
        r,
        "tenant_slo_violations",
        "Violation intervals of the tenant's SLO started, by kind",
    );
    let windows = family::<Count, 1>(r, "tenant_slo_windows", "SLO windows judged");
    let violated_windows = family::<Count, 1>(
        r,
        "tenant_slo_violated_windows",
        "SLO windows in which some bound was violated",
    );
    let offered = family::<Count, 1>(
        r,
        "tenant_slo_offered_bytes",
        "Bytes of the tenant's frames the switch was to carry",
    );
    let delivered = family::<Count, 1>(
        r,
        "tenant_slo_delivered_bytes",
        "Bytes of the tenant's frames handed to their port",
    );
    let lost = family::<Count, 1>(
        r,
        "tenant_slo_lost_packets",
        "Frames of the tenant the switch should have carried and dropped",
    );
    let latency = family::<Real, 2>(
        r,
        "tenant_slo_latency_seconds",
        "Latency through the switch (entering it to its port) since the monitor started, at \
         a percentile; frames held beyond the guarantee left out",
    );
    let drops = family::<Count, 2>(
        r,
        "tenant_drops",
        "Frames of a tenant with an SLO dropped, by reason, over its VMs",
    );
    let waited = family::<Count, 2>(
        r,
        "tenant_waited_frames",
        "Frames of a tenant with an SLO that went through a shaped class or limiter queue",
    );
    let beyond = family::<Count, 1>(
        r,
        "tenant_held_beyond_guarantee_frames",
        "Frames held in a limiter allowing at least their VM's guarantee (latency not judged)",
    );
    let late = family::<Count, 2>(
        r,
        "tenant_late_frames",
        "Frames delivered later than the tenant's latency_us, by where they waited",
    );
    for t in &p.slo.tenants {
        let l = tenant(&t.tenant);
        let with = |key: &'static str, value: &str| {
            let [tl] = l.clone();
            [tl, (key, value.to_string())]
        };
        met.get_or_create(&l).set(i64::from(t.met));
        for kind in picnic_core::slo::ViolationKind::ALL {
            let name = kind_name(kind);
            violated
                .get_or_create(&with("kind", name))
                .set(i64::from(t.violated.contains(kind)));
            let started = t.violations_total.get(name).copied().unwrap_or(0);
            violations
                .get_or_create(&with("kind", name))
                .inc_by(started);
        }
        let s = &t.totals;
        windows.get_or_create(&l).inc_by(s.windows);
        violated_windows
            .get_or_create(&l)
            .inc_by(s.violated_windows);
        offered.get_or_create(&l).inc_by(s.offered_bytes);
        delivered.get_or_create(&l).inc_by(s.delivered_bytes);
        lost.get_or_create(&l).inc_by(s.lost_packets);
        for (percentile, us) in [
            ("50", s.latency_p50_us),
            ("99", s.latency_p99_us),
            ("99.9", s.latency_p999_us),
        ] {
            if let Some(us) = us {
                latency
                    .get_or_create(&with("percentile", percentile))
                    .set(us / 1e6);
            }
        }
        for (reason, n) in t.why.drops.iter().filter(|(_, n)| *n > 0) {
            drops
                .get_or_create(&with("reason", reason.as_str()))
                .inc_by(n);
        }
        waited
            .get_or_create(&with("queue", "shaped_class"))
            .inc_by(t.why.waited_shaped_class);
        waited
            .get_or_create(&with("queue", "limiter"))
            .inc_by(t.why.waited_limiter);
        beyond.get_or_create(&l).inc_by(t.why.held_beyond_guarantee);
        if let Some(w) = &t.why.late {
            for (q, n) in [
                ("ingress_queue", w.ingress_queue),
                ("egress_queue", w.egress_queue),
                ("shaped_class", w.shaped_class),
                ("limiter", w.limiter),
            ] {
                late.get_or_create(&with("queue", q)).inc_by(n);
            }
        }
    }
}
