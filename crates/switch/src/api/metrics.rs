//! `GET /metrics`: a published snapshot in the Prometheus text format.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::engine::kind_name;
use crate::runner::Published;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VmLabels {
    tenant: String,
    vm: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    tenant: String,
    vm: String,
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortRegimeLabels {
    port: String,
    regime: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortDecisionLabels {
    port: String,
    decision: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantKindLabels {
    tenant: String,
    kind: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantReasonLabels {
    tenant: String,
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantQueueLabels {
    tenant: String,
    queue: String,
}

/// Renders a published snapshot in the Prometheus text format.
pub(super) fn metrics(published: &Published) -> String {
    let snap = &published.switch;
    let mut reg = Registry::with_prefix("picnic");
    let counter = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<VmLabels, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let rx_packets = counter(&mut reg, "vm_rx_packets", "Frames delivered to the VM");
    let rx_bytes = counter(&mut reg, "vm_rx_bytes", "Bytes delivered to the VM");
    let tx_packets = counter(
        &mut reg,
        "vm_tx_packets",
        "Frames the VM sent into the switch",
    );
    let tx_bytes = counter(&mut reg, "vm_tx_bytes", "Bytes the VM sent into the switch");
    let cost = counter(
        &mut reg,
        "vm_processing_ns",
        "Ingress processing CPU spent for the VM, ns",
    );
    let drops = Family::<DropLabels, Counter>::default();
    reg.register(
        "vm_drops",
        "Frames from or to the VM dropped, by reason",
        drops.clone(),
    );
    let queue = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_queue_depth",
        "Frames queued for the VM (egress + ingress)",
        queue.clone(),
    );
    let advertised = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_advertised_rate_bps",
        "Rate advertised to the VM's senders (EyeQ R_i)",
        advertised.clone(),
    );
    let applied = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_applied_limit_bps",
        "Sum of feedback-set limits applied to the VM's traffic",
        applied.clone(),
    );
    let pool_free = Gauge::<i64>::default();
    reg.register(
        "pool_free_frames",
        "Free frames in the preallocated pool (the rest are queued)",
        pool_free.clone(),
    );
    pool_free.set(published.pool_free as i64);
    let tenant_cost = Family::<TenantLabels, Counter>::default();
    reg.register(
        "tenant_cpu_charged_ns",
        "Processing CPU charged to the tenant (Iron)",
        tenant_cost.clone(),
    );
    let softirq = Family::<TenantLabels, Counter>::default();
    reg.register(
        "tenant_softirq_ns",
        "Kernel softirq time on the tenant's ports charged to it (eBPF)",
        softirq.clone(),
    );
    let throttled = Family::<TenantLabels, Counter>::default();
    reg.register(
        "tenant_cpu_throttle_drops",
        "Frames dropped because the tenant was over its CPU quota",
        throttled.clone(),
    );
    let sw_drops = Family::<ReasonLabels, Counter>::default();
    reg.register(
        "switch_drops",
        "Frames not attributable to a VM dropped, by reason",
        sw_drops.clone(),
    );
    // The kernel fast path (docs/switch.md "Two paths"): what it forwarded, what it dropped
    // before any work, and why it handed frames over to the engines.
    let fast_rx_packets = counter(
        &mut reg,
        "vm_fast_path_rx_packets",
        "Frames the kernel fast path delivered to the VM",
    );
    let fast_rx_bytes = counter(
        &mut reg,
        "vm_fast_path_rx_bytes",
        "Bytes the kernel fast path delivered to the VM",
    );
    let fast_tx_packets = counter(
        &mut reg,
        "vm_fast_path_tx_packets",
        "Frames of the VM the kernel fast path forwarded",
    );
    let fast_tx_bytes = counter(
        &mut reg,
        "vm_fast_path_tx_bytes",
        "Bytes of the VM the kernel fast path forwarded",
    );
    let fast_handed = Family::<DropLabels, Counter>::default();
    reg.register(
        "vm_fast_path_handed_over",
        "Frames the kernel fast path handed over to the engines (or dropped: reason \
         rx_dropped), by reason",
        fast_handed.clone(),
    );
    for vm in &snap.vms {
        let l = VmLabels {
            tenant: vm.tenant.clone(),
            vm: vm.name.clone(),
        };
        rx_packets.get_or_create(&l).inc_by(vm.counters.rx_packets);
        rx_bytes.get_or_create(&l).inc_by(vm.counters.rx_bytes);
        tx_packets.get_or_create(&l).inc_by(vm.counters.tx_packets);
        tx_bytes.get_or_create(&l).inc_by(vm.counters.tx_bytes);
        cost.get_or_create(&l).inc_by(vm.counters.cost_ns);
        queue
            .get_or_create(&l)
            .set((vm.egress_queue + vm.ingress_queue) as i64);
        advertised
            .get_or_create(&l)
            .set(vm.advertised_bps.unwrap_or(0) as i64);
        applied
            .get_or_create(&l)
            .set(vm.applied_limits.iter().map(|(_, r)| *r).sum::<u64>() as i64);
        let f = &vm.counters.fast_path;
        fast_rx_packets.get_or_create(&l).inc_by(f.rx_packets);
        fast_rx_bytes.get_or_create(&l).inc_by(f.rx_bytes);
        fast_tx_packets.get_or_create(&l).inc_by(f.tx_packets);
        fast_tx_bytes.get_or_create(&l).inc_by(f.tx_bytes);
        for (reason, n) in [
            ("rx_dropped", f.rx_dropped),
            ("tx_dropped", f.tx_dropped),
            ("not_granted", f.handed_not_granted),
            ("tokens", f.handed_tokens),
            ("not_unicast_ipv4", f.handed_not_unicast_ipv4),
            ("spoofed", f.handed_spoofed),
            ("destination", f.handed_destination),
            ("offload", f.handed_offload),
            ("geneve_options", f.handed_geneve_options),
        ] {
            fast_handed
                .get_or_create(&DropLabels {
                    tenant: l.tenant.clone(),
                    vm: l.vm.clone(),
                    reason: reason.into(),
                })
                .inc_by(n);
        }
        for (reason, n) in vm.counters.drops.iter() {
            drops
                .get_or_create(&DropLabels {
                    tenant: l.tenant.clone(),
                    vm: l.vm.clone(),
                    reason: reason.as_str().into(),
                })
                .inc_by(n);
        }
    }
    for t in &snap.tenants {
        let l = TenantLabels {
            tenant: t.name.clone(),
        };
        tenant_cost.get_or_create(&l).inc_by(t.cpu_charged_ns);
        softirq.get_or_create(&l).inc_by(t.softirq_ns);
        throttled.get_or_create(&l).inc_by(t.cpu_throttle_drops);
    }
    let vm_worker = Family::<VmLabels, Gauge>::default();
    reg.register(
        "vm_worker",
        "The dataplane worker that owns the VM's port",
        vm_worker.clone(),
    );
    for vm in &snap.vms {
        let l = VmLabels {
            tenant: vm.tenant.clone(),
            vm: vm.name.clone(),
        };
        vm_worker.get_or_create(&l).set(vm.worker as i64);
    }
    let worker_cpu = Family::<WorkerLabels, Counter>::default();
    reg.register(
        "worker_cpu_ns",
        "CPU time of each dataplane worker's thread, ns",
        worker_cpu.clone(),
    );
    let handoff = Family::<WorkerLabels, Counter>::default();
    reg.register(
        "worker_handoff_frames",
        "Frames each worker handed to another (uplink frames for its VMs, frames for its ports, feedback copies)",
        handoff.clone(),
    );
    for w in &published.workers {
        let l = WorkerLabels {
            worker: w.worker.to_string(),
        };
        worker_cpu.get_or_create(&l).inc_by(w.cpu_ns);
        handoff.get_or_create(&l).inc_by(w.handoff.out);
    }
    for (reason, n) in snap.switch.drops.iter() {
        sw_drops
            .get_or_create(&ReasonLabels {
                reason: reason.as_str().into(),
            })
            .inc_by(n);
    }
    let fb_rejected = Family::<ReasonLabels, Counter>::default();
    reg.register(
        "feedback_rejected",
        "Congestion feedback refused before it was applied, by reason",
        fb_rejected.clone(),
    );
    for (reason, n) in snap.switch.feedback_rejected.iter() {
        fb_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc_by(n);
    }
    let regimes = Family::<PortRegimeLabels, Gauge>::default();
    reg.register(
        "port_wait_regime",
        "Rizzo et al. regime of each receive ring (1 for the current one; GP while spinning)",
        regimes.clone(),
    );
    let decisions = Family::<PortDecisionLabels, Counter>::default();
    reg.register(
        "port_wait_decisions",
        "Idle passes on which each receive ring's adaptive wait chose to spin or to block",
        decisions.clone(),
    );
    for port in &published.ports {
        if let Some(regime) = &port.wait_regime {
            regimes
                .get_or_create(&PortRegimeLabels {
                    port: port.name.clone(),
                    regime: regime.clone(),
                })
                .set(1);
        }
        for (decision, n) in [("spin", port.wait_spins), ("block", port.wait_blocks)] {
            decisions
                .get_or_create(&PortDecisionLabels {
                    port: port.name.clone(),
                    decision: decision.into(),
                })
                .inc_by(n);
        }
    }
    slo_metrics(&mut reg, published);
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

/// Per tenant with an SLO: whether it is met, violations by kind, and the why breakdown.
fn slo_metrics(reg: &mut Registry, published: &Published) {
    let met = Family::<TenantLabels, Gauge>::default();
    reg.register(
        "tenant_slo_met",
        "1 when the tenant's last judged SLO window met every bound, else 0",
        met.clone(),
    );
    let violated = Family::<TenantKindLabels, Gauge>::default();
    reg.register(
        "tenant_slo_violated",
        "1 while a bound of the tenant's SLO is in violation, by kind",
        violated.clone(),
    );
    let violations = Family::<TenantKindLabels, Counter>::default();
    reg.register(
        "tenant_slo_violations",
        "Violation intervals of the tenant's SLO started, by kind",
        violations.clone(),
    );
    let drops = Family::<TenantReasonLabels, Counter>::default();
    reg.register(
        "tenant_drops",
        "Frames of a tenant with an SLO dropped, by reason, over its VMs",
        drops.clone(),
    );
    let waited = Family::<TenantQueueLabels, Counter>::default();
    reg.register(
        "tenant_waited_frames",
        "Frames of a tenant with an SLO that went through a shaped class or limiter queue",
        waited.clone(),
    );
    let late = Family::<TenantQueueLabels, Counter>::default();
    reg.register(
        "tenant_late_frames",
        "Frames delivered later than the tenant's latency_us, by where they waited",
        late.clone(),
    );
    for t in &published.slo.tenants {
        let tenant = || t.tenant.clone();
        met.get_or_create(&TenantLabels { tenant: tenant() })
            .set(i64::from(t.met));
        for kind in picnic_core::slo::ViolationKind::ALL {
            let l = TenantKindLabels {
                tenant: tenant(),
                kind: kind_name(kind).into(),
            };
            violated
                .get_or_create(&l)
                .set(i64::from(t.violated.contains(kind)));
            violations.get_or_create(&l).inc_by(
                t.violations_total
                    .get(kind_name(kind))
                    .copied()
                    .unwrap_or(0),
            );
        }
        for (reason, n) in t.why.drops.iter().filter(|(_, n)| *n > 0) {
            drops
                .get_or_create(&TenantReasonLabels {
                    tenant: tenant(),
                    reason: reason.as_str().into(),
                })
                .inc_by(n);
        }
        let queue = |q: &str| TenantQueueLabels {
            tenant: tenant(),
            queue: q.into(),
        };
        waited
            .get_or_create(&queue("shaped_class"))
            .inc_by(t.why.waited_shaped_class);
        waited
            .get_or_create(&queue("limiter"))
            .inc_by(t.why.waited_limiter);
        if let Some(l) = &t.why.late {
            for (q, n) in [
                ("ingress_queue", l.ingress_queue),
                ("egress_queue", l.egress_queue),
                ("shaped_class", l.shaped_class),
                ("limiter", l.limiter),
            ] {
                late.get_or_create(&queue(q)).inc_by(n);
            }
        }
    }
}
