//! The local control API: JSON over HTTP to list and change tenants, VMs and hosts live,
//! read statistics, and a Prometheus `/metrics` endpoint.
//!
//! | method and path        | what                                                     |
//! |------------------------|----------------------------------------------------------|
//! | GET /stats             | per-VM/tenant counters, queues, rates, port counters     |
//! | GET /metrics           | the same in Prometheus text format, SLO state included   |
//! | GET /slo               | per tenant with an SLO: met/violated, violations, why     |
//! | GET /config            | the running config                                        |
//! | GET /tenants, /vms, /hosts | one section of it                                    |
//! | POST /tenants, /vms, /hosts | add one (JSON body: the config entry)              |
//! | PUT /vms/NAME          | replace a VM entry (e.g. new min/max bandwidth)           |
//! | DELETE /tenants/NAME, /vms/NAME, /hosts/ID | remove one                         |
//! | GET /tenants/NAME/key  | an encrypting tenant's key epochs and fingerprints        |
//! | PUT /tenants/NAME/key  | rotate: `{"epoch", "key" (hex), "activate"}` installs a key, |
//! |                        | `{"epoch", "activate": true}` seals with an installed one   |
//!
//! Changes are validated like the config file (errors name the field) and applied by the
//! run loop between batches. Readers clone the published snapshot (an `Arc`) out of its
//! mutex and serialize it after letting go: the run loop takes that mutex to publish.

use std::io::Read;
use std::sync::{mpsc, Arc};
use std::time::Duration as StdDuration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tiny_http::{Header, Method, Response, Server};

use crate::config::{Config, HostEntry, TenantEntry, VmEntry};
use crate::engine::kind_name;
use crate::runner::{Command, Published, Shared};

/// Starts the API server on `addr` in its own thread.
pub fn spawn(
    addr: &str,
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let server = Server::http(addr)
        .map_err(|e| anyhow::anyhow!("switch.api: cannot listen on {addr}: {e}"))?;
    Ok(std::thread::Builder::new()
        .name("picnic-api".into())
        .spawn(move || {
            for mut req in server.incoming_requests() {
                let mut body = String::new();
                let _ = req.as_reader().take(1 << 20).read_to_string(&mut body);
                let (status, content_type, text) =
                    handle(req.method(), req.url(), &body, &shared, &commands);
                let header =
                    Header::from_bytes("Content-Type", content_type).expect("static header");
                let _ = req.respond(
                    Response::from_string(text)
                        .with_status_code(status)
                        .with_header(header),
                );
            }
        })?)
}

type Reply = (u16, &'static str, String);

fn json(status: u16, v: impl serde::Serialize) -> Reply {
    (
        status,
        "application/json",
        serde_json::to_string_pretty(&v).unwrap_or_default(),
    )
}
fn error(status: u16, msg: impl std::fmt::Display) -> Reply {
    json(status, serde_json::json!({ "error": msg.to_string() }))
}

fn handle(
    method: &Method,
    url: &str,
    body: &str,
    shared: &Shared,
    commands: &mpsc::Sender<Command>,
) -> Reply {
    let path: Vec<&str> = url
        .split('?')
        .next()
        .unwrap_or("")
        .trim_matches('/')
        .split('/')
        .collect();
    let config = shared.config.lock().unwrap().clone();
    let Some(config) = config else {
        return error(503, "switch starting");
    };
    match (method, path.as_slice()) {
        (Method::Get, ["stats"]) => match latest(shared) {
            Some(published) => json(200, &*published),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["slo"]) => match latest(shared) {
            Some(published) => json(200, &published.slo),
            None => error(503, "no statistics yet"),
        },
        (Method::Get, ["metrics"]) => (
            200,
            "text/plain; version=0.0.4",
            latest(shared).map(|p| metrics(&p)).unwrap_or_default(),
        ),
        (Method::Get, ["config"]) => json(200, &config),
        (Method::Get, ["tenants"]) => json(200, &config.tenants),
        (Method::Get, ["vms"]) => json(200, &config.vms),
        (Method::Get, ["hosts"]) => json(200, &config.hosts),
        (Method::Post, ["tenants"]) => change(config, commands, |c| {
            c.tenants
                .push(serde_json::from_str::<TenantEntry>(body).map_err(|e| format!("body: {e}"))?);
            Ok(())
        }),
        (Method::Post, ["vms"]) => change(config, commands, |c| {
            c.vms
                .push(serde_json::from_str::<VmEntry>(body).map_err(|e| format!("body: {e}"))?);
            Ok(())
        }),
        (Method::Post, ["hosts"]) => change(config, commands, |c| {
            c.hosts
                .push(serde_json::from_str::<HostEntry>(body).map_err(|e| format!("body: {e}"))?);
            Ok(())
        }),
        (Method::Put, ["vms", name]) => change(config, commands, |c| {
            let vm: VmEntry = serde_json::from_str(body).map_err(|e| format!("body: {e}"))?;
            let slot = c
                .vms
                .iter_mut()
                .find(|v| v.name == *name)
                .ok_or(format!("no VM '{name}'"))?;
            *slot = vm;
            Ok(())
        }),
        (Method::Delete, ["vms", name]) => change(config, commands, |c| {
            let n = c.vms.len();
            c.vms.retain(|v| v.name != *name);
            if c.vms.len() == n {
                Err(format!("no VM '{name}'"))
            } else {
                Ok(())
            }
        }),
        (Method::Get | Method::Put, ["tenants", name, "key"]) => {
            tenant_key(method, name, body, shared)
        }
        (Method::Delete, ["tenants", name]) => change(config, commands, |c| {
            if c.vms.iter().any(|v| v.tenant == *name) {
                return Err(format!("tenant '{name}' still has VMs; remove them first"));
            }
            let n = c.tenants.len();
            c.tenants.retain(|t| t.name != *name);
            if c.tenants.len() == n {
                Err(format!("no tenant '{name}'"))
            } else {
                Ok(())
            }
        }),
        (Method::Delete, ["hosts", id]) => change(config, commands, |c| {
            let id: u32 = id.parse().map_err(|_| format!("'{id}' is not a host id"))?;
            let n = c.hosts.len();
            c.hosts.retain(|h| h.id != id);
            if c.hosts.len() == n {
                Err(format!("no host {id}"))
            } else {
                Ok(())
            }
        }),
        _ => error(404, format!("no route {method} /{}", path.join("/"))),
    }
}

/// The latest published snapshot, cloned out of the mutex (a pointer copy): the lock is
/// released before the caller serializes anything.
/// The body of `PUT /tenants/NAME/key`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyChange {
    epoch: u32,
    /// 32 or 64 hex digits; absent: activate the installed `epoch`.
    key: Option<String>,
    #[serde(default)]
    activate: bool,
}

/// Key rotation without loss (`accel::KeyRing`): applied at once, the run loop is not
/// involved. The key itself is never shown, only its fingerprint.
fn tenant_key(method: &Method, name: &str, body: &str, shared: &Shared) -> Reply {
    let keys = shared.accel_keys.lock().unwrap().clone();
    let Some(keys) = keys else {
        return error(404, "no tenant encrypts (set encrypt = true and a key)");
    };
    let result = match method {
        Method::Put => serde_json::from_str::<KeyChange>(body)
            .map_err(|e| anyhow::anyhow!("body: {e}"))
            .and_then(|c| match (c.key, c.activate) {
                (Some(hex), activate) => picnic_wire::seal::TunnelKey::from_hex(&hex)
                    .map_err(|e| anyhow::anyhow!("key: {e}"))
                    .and_then(|k| keys.install(name, c.epoch, k, activate)),
                (None, true) => keys.activate(name, c.epoch),
                (None, false) => Err(anyhow::anyhow!("give a key to install, or activate: true")),
            }),
        _ => Ok(()),
    };
    match result.and_then(|()| keys.describe(name)) {
        Ok(view) => json(200, view),
        Err(e) => error(400, format!("{e:#}")),
    }
}

fn latest(shared: &Shared) -> Option<Arc<Published>> {
    shared.snapshot.lock().unwrap().clone()
}

/// Applies `edit` to a copy of the config, validates it and hands it to the run loop.
fn change(
    mut config: Config,
    commands: &mpsc::Sender<Command>,
    edit: impl FnOnce(&mut Config) -> Result<(), String>,
) -> Reply {
    if let Err(e) = edit(&mut config) {
        return error(400, e);
    }
    if let Err(e) = config.validate() {
        return error(400, e);
    }
    let (tx, rx) = mpsc::channel();
    if commands
        .send(Command::Reconfigure(Box::new(config), tx))
        .is_err()
    {
        return error(503, "switch is stopping");
    }
    match rx.recv_timeout(StdDuration::from_secs(5)) {
        Ok(Ok(())) => json(200, serde_json::json!({ "ok": true })),
        Ok(Err(e)) => error(400, format!("{e:#}")),
        Err(_) => error(504, "the switch did not apply the change in time"),
    }
}

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
fn metrics(published: &Published) -> String {
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
    for (reason, n) in snap.switch.drops.iter() {
        sw_drops
            .get_or_create(&ReasonLabels {
                reason: reason.as_str().into(),
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

#[cfg(test)]
mod tests {
    use etherparse::PacketBuilder;
    use picnic_core::{Duration, Instant};

    use super::*;
    use crate::engine::{Engine, Work};
    use crate::frame::{Frame, FramePool};

    struct NoWork;
    impl Work for NoWork {
        fn process(&mut self, _tenant: usize, _frame: &mut Frame) -> u64 {
            0
        }
    }

    fn udp(src: ([u8; 6], [u8; 4]), dst: ([u8; 6], [u8; 4])) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2(src.0, dst.0)
            .ipv4(src.1, dst.1, 64)
            .udp(40000, 7)
            .write(&mut out, &[0u8; 100])
            .unwrap();
        out
    }

    /// The shipped example (blue and red hold SLOs) after 300 ms in which blue1 sent only
    /// spoofed frames and red1 a steady flow to red2.
    fn shared() -> Shared {
        let cfg = Config::parse(include_str!("../../../examples/host1.toml")).unwrap();
        let mut engine = Engine::new(&cfg, Instant::ZERO).unwrap();
        let mut pool = FramePool::new(1024);
        let blue1 = ([2, 0, 0, 0, 0, 1], [198, 18, 0, 1]);
        let red1 = ([2, 0, 0, 0, 0, 2], [198, 18, 0, 2]);
        let spoofed = udp(
            (blue1.0, [10, 0, 0, 9]),
            ([2, 0, 0, 0, 0, 3], [198, 18, 0, 3]),
        );
        let to_red2 = udp(red1, ([2, 0, 0, 0, 0, 4], [198, 18, 0, 4]));
        for ms in 0..300 {
            let now = Instant::ZERO + Duration::from_millis(ms);
            for (port, bytes) in [(1, &spoofed), (2, &to_red2)] {
                let mut f = pool.get().unwrap();
                assert!(f.fill_from(bytes));
                engine.on_frames(now, port, &mut vec![f], &mut pool);
            }
            engine.poll(now, 64, &mut NoWork, &mut pool);
            for f in engine.tx_queue(0).drain(..) {
                pool.put(f);
            }
        }
        let now = Instant::ZERO + Duration::from_millis(300);
        let shared = Shared::default();
        *shared.config.lock().unwrap() = Some(cfg);
        *shared.snapshot.lock().unwrap() = Some(Arc::new(Published {
            switch: engine.snapshot(),
            ports: Vec::new(),
            pool_free: pool.available(),
            pool_capacity: pool.capacity(),
            slo: engine.slo_report(now),
        }));
        shared
    }

    fn get(shared: &Shared, url: &str) -> Reply {
        let (tx, _rx) = mpsc::channel();
        handle(&Method::Get, url, "", shared, &tx)
    }

    #[test]
    fn get_slo_shows_each_tenants_state_violations_and_why() {
        let shared = shared();
        let (status, _, body) = get(&shared, "/slo");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["window_ms"], 100);
        let blue = &v["tenants"][0];
        assert_eq!(blue["tenant"], "blue");
        assert_eq!(blue["met"], false);
        assert_eq!(blue["violated"], serde_json::json!(["loss"]));
        assert_eq!(blue["open_violations"][0]["kind"], "loss");
        assert_eq!(blue["open_violations"][0]["started_at"], 0);
        assert_eq!(
            blue["open_violations"][0]["ended_at"],
            serde_json::Value::Null
        );
        assert_eq!(blue["violations_total"]["loss"], 1);
        assert_eq!(blue["why"]["drops"]["spoofed"], 300);
        assert_eq!(blue["totals"]["lost_packets"], 300);
        assert_eq!(blue["slo"]["latency_percentile"], 99.9);
        let red = &v["tenants"][1];
        assert_eq!(
            (red["tenant"].as_str(), red["met"].as_bool()),
            (Some("red"), Some(true))
        );
        assert_eq!(red["violated"], serde_json::json!([]));
        assert_eq!(red["totals"]["delivered_packets"], 300);
        assert_eq!(red["window"]["start_ns"], 300_000_000);

        // /stats is unchanged by it; the lock is free again after both.
        let (status, _, stats) = get(&shared, "/stats");
        assert_eq!(status, 200);
        assert!(!serde_json::from_str::<serde_json::Value>(&stats).unwrap()["slo"].is_object());
        assert!(shared.snapshot.try_lock().is_ok());
    }

    #[test]
    fn metrics_carry_the_slo_state_per_tenant() {
        let (status, _, text) = get(&shared(), "/metrics");
        assert_eq!(status, 200);
        for line in [
            "picnic_tenant_slo_met{tenant=\"blue\"} 0",
            "picnic_tenant_slo_met{tenant=\"red\"} 1",
            "picnic_tenant_slo_violated{tenant=\"blue\",kind=\"loss\"} 1",
            "picnic_tenant_slo_violations_total{tenant=\"blue\",kind=\"loss\"} 1",
            "picnic_tenant_slo_violations_total{tenant=\"red\",kind=\"loss\"} 0",
            "picnic_tenant_drops_total{tenant=\"blue\",reason=\"spoofed\"} 300",
            "picnic_tenant_waited_frames_total{tenant=\"red\",queue=\"limiter\"} 0",
            "picnic_tenant_late_frames_total{tenant=\"red\",queue=\"egress_queue\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn a_tenant_with_a_bad_slo_is_refused_naming_the_field() {
        let (tx, _rx) = mpsc::channel();
        let body = r#"{"name": "green", "vni": 300, "slo": {"min_bps": 10, "max_loss": 2.0}}"#;
        let (status, _, text) = handle(&Method::Post, "/tenants", body, &shared(), &tx);
        assert_eq!(status, 400);
        assert!(text.contains("max_loss must be a fraction"), "{text}");
    }
}
