//! The edits `picnic ctl` makes of the records it read, and what it refuses.

use super::*;

const P: &str = "/picnic/";

fn cluster() -> Cluster {
    let mut c = Cluster::default();
    let mut put = |key: &str, v: Value| {
        c.set(P, &format!("{P}{key}"), Some(v.to_string().as_bytes()))
            .unwrap()
    };
    put(
        "hosts/1",
        serde_json::json!({"id": 1, "underlay_ip": "198.19.0.1", "mac": "02:00:00:00:01:01"}),
    );
    put(
        "hosts/2",
        serde_json::json!({"id": 2, "underlay_ip": "198.19.0.2", "mac": "02:00:00:00:01:02"}),
    );
    put("tenants/t", serde_json::json!({"name": "t", "vni": 100}));
    put(
        "vms/a",
        serde_json::json!({"name": "a", "id": 7, "tenant": "t", "host": 1,
        "mac": "02:00:00:00:00:07", "ip": "198.18.0.7", "port": {"ifname": "tap-a"}}),
    );
    c
}

fn err(e: anyhow::Result<Option<Edit>>) -> String {
    match e {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

fn value(e: anyhow::Result<Option<Edit>>) -> (Kind, String, Value, bool) {
    let e = e.unwrap().unwrap();
    (e.kind, e.name, e.value.unwrap(), e.create)
}

fn add_vm(name: &str, mac: &str, id: Option<u32>) -> VmCmd {
    VmCmd::Add {
        name: name.into(),
        tenant: "t".into(),
        host: 2,
        mac: mac.parse().unwrap(),
        ip: "198.18.0.9".parse().unwrap(),
        id,
        port: None,
        backend: "af_packet".into(),
        min_mbps: None,
        max_mbps: Some(500),
    }
}

#[test]
fn a_vm_gets_the_next_id_and_its_name_as_port_and_clashes_are_refused() {
    let c = cluster();
    let (kind, name, v, create) = value(vm(&c, add_vm("b", "02:00:00:00:00:08", None), true));
    assert_eq!((kind, name.as_str(), create), (Kind::Vm, "b", true));
    assert_eq!(
        (v["id"].as_u64(), v["port"]["ifname"].as_str()),
        (Some(8), Some("b"))
    );
    assert_eq!(
        (v["min_mbps"].as_u64(), v["max_mbps"].as_u64()),
        (Some(100), Some(500))
    );
    // The record is the API's VM entry: it parses as one.
    serde_json::from_value::<VmEntry>(v).unwrap();
    assert!(err(vm(&c, add_vm("a", "02:00:00:00:00:08", None), true)).contains("exists already"));
    assert!(err(vm(&c, add_vm("b", "02:00:00:00:00:07", None), true)).contains("--mac"));
    assert!(err(vm(&c, add_vm("b", "02:00:00:00:00:08", Some(7)), true)).contains("--id 7: VM 'a'"));
    assert!(err(vm(
        &c,
        add_vm("a-very-long-vm-name", "02:00:00:00:00:08", None),
        true
    ))
    .contains("15 bytes"));
}

#[test]
fn a_move_keeps_the_port_name_unless_given_and_needs_etcd_and_another_host() {
    let c = cluster();
    let mv = |host, port: Option<&str>| VmCmd::Move {
        name: "a".into(),
        host,
        port: port.map(String::from),
    };
    let (_, _, v, create) = value(vm(&c, mv(2, None), true));
    assert_eq!(
        (v["host"].as_u64(), v["port"]["ifname"].as_str(), create),
        (Some(2), Some("tap-a"), false)
    );
    let (_, _, v, _) = value(vm(&c, mv(2, Some("tap-a2")), true));
    assert_eq!(v["port"]["ifname"], "tap-a2");
    assert!(err(vm(&c, mv(1, None), true)).contains("on host 1 already"));
    assert!(err(vm(&c, mv(3, None), true)).contains("--host 3"));
    assert!(err(vm(&c, mv(2, None), false)).contains("--etcd"));
}

#[test]
fn tenants_hosts_and_slos_are_checked_against_the_cluster() {
    let c = cluster();
    let add = |name: &str, vni| TenantCmd::Add {
        name: name.into(),
        vni,
        cpu_quota: None,
    };
    assert!(err(tenant(&c, add("u", 100))).contains("tenant 't' has it"));
    assert!(err(tenant(&c, add("u", 1 << 24))).contains("24 bits"));
    assert!(err(tenant(&c, TenantCmd::Rm { name: "t".into() })).contains("still has VM 'a'"));
    assert!(err(host(&c, HostCmd::Rm { id: 1 })).contains("still has VM 'a'"));
    let (kind, name, _, _) = value(Ok(host(&c, HostCmd::Rm { id: 2 }).unwrap().map(|mut e| {
        e.value = Some(Value::Null);
        e
    })));
    assert_eq!((kind, name.as_str()), (Kind::Host, "2"));
    let slo = |tenant: &str, percentile| SloCmd::Set {
        tenant: tenant.into(),
        min_mbps: Some(10),
        max_mbps: None,
        latency_us: Some(500),
        percentile,
        max_loss: None,
    };
    let (kind, _, v, create) = value(super::slo(&c, slo("t", Some(99.0))));
    assert_eq!(
        (kind, v["min_bps"].as_u64(), create),
        (Kind::Slo, Some(10_000_000), true)
    );
    assert!(err(super::slo(&c, slo("t", Some(120.0)))).contains("latency_percentile"));
    assert!(err(super::slo(&c, slo("x", None))).contains("no tenant 'x'"));
}

#[test]
fn status_says_why_in_words_leaving_out_zeros() {
    let report = serde_json::json!({
        "late": {"ingress_queue": 0, "egress_queue": 12, "shaped_class": 0, "limiter": 3},
        "drops": {"ingress_queue_full": 40},
        "waited_limiter": 9, "waited_shaped_class": 0, "held_beyond_guarantee": 0,
    });
    assert_eq!(
        status::why(&report),
        "late in egress queue 12, late in limiter 3, dropped ingress queue full 40, \
         held by the destination's limiter (EyeQ feedback) 9 (frames since it started)"
    );
    let quiet = serde_json::json!({"late": null, "drops": {}, "waited_limiter": 0});
    assert!(status::why(&quiet).starts_with("nothing late"));
}
