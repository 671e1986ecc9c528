//! Config parsing and validation.

use super::*;

pub(crate) const EXAMPLE: &str = r#"
[switch]
host_id = 1
[uplink]
ifname = "up0"
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[hosts]]
id = 2
underlay_ip = "198.19.0.2"
mac = "02:00:00:00:01:02"
[[tenants]]
name = "a"
vni = 100
[[vms]]
name = "a1"
id = 1
tenant = "a"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
port = { ifname = "a1" }
[[vms]]
name = "a2"
id = 2
tenant = "a"
host = 2
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
"#;

#[test]
fn shipped_example_is_valid() {
    let c = Config::parse(include_str!("../../../../examples/host1.toml")).unwrap();
    assert_eq!(c.vms.iter().filter(|v| v.port.is_some()).count(), 2);
}

#[test]
fn example_parses() {
    let c = Config::parse(EXAMPLE).unwrap();
    assert_eq!(c.vms.len(), 2);
    assert!(c.isolation.feedback);
    assert_eq!(c.this_host().underlay_ip, Ipv4Addr::new(198, 19, 0, 1));
}

#[test]
fn af_xdp_backend_parses() {
    let text = EXAMPLE.replace(
        "port = { ifname = \"a1\" }",
        "port = { ifname = \"a1\", backend = \"af_xdp\" }",
    );
    let c = Config::parse(&text).unwrap();
    let port = c.vms[0].port.as_ref().unwrap();
    assert_eq!(port.backend, Backend::AfXdp);
}

fn expect_field(text: &str, field: &str) {
    let e = Config::parse(text).unwrap_err().to_string();
    assert!(e.contains(field), "error '{e}' should name '{field}'");
}

#[test]
fn errors_name_the_field() {
    expect_field(&EXAMPLE.replace("vni = 100", "vni = 0"), "tenants[0].vni");
    expect_field(
        &EXAMPLE.replace("tenant = \"a\"\nhost = 2", "tenant = \"zz\"\nhost = 2"),
        "vms[1].tenant",
    );
    expect_field(
        &EXAMPLE.replace("02:00:00:00:00:02", "02:00:00:00:00"),
        "mac",
    );
    expect_field(
        &EXAMPLE.replace("port = { ifname = \"a1\" }", ""),
        "vms[0].port",
    );
    // A VM's CPUs name the pinned workers that serve it: without pinned workers, an error.
    expect_field(
        &EXAMPLE.replace(
            "port = { ifname = \"a1\" }",
            "port = { ifname = \"a1\", cpus = [1] }",
        ),
        "vms[0].port.cpus",
    );
    expect_field(
        &EXAMPLE.replace("host_id = 1", "host_id = 7"),
        "switch.host_id",
    );
    expect_field(&EXAMPLE.replace("[uplink]", "[uplink]\nspeed = 3"), "speed");
    expect_field(
        &format!("{EXAMPLE}\n[ingress]\nheadroom = 2.0\n"),
        "ingress.headroom",
    );
}

/// Values that validated but overflowed when the engine turned them into bits/s or bytes
/// (a panic with overflow checks, silently wrong weights and caps without), or that no
/// machine can hold. Seen writing the fuzz targets; the api_body target hit `max_mbps`
/// (docs/fuzzing.md, seed `fuzz/seeds/api_body/crash-max-mbps-overflow`).
#[test]
fn out_of_range_numbers_are_refused_naming_the_field() {
    let vm = "port = { ifname = \"a1\" }";
    for (text, field) in [
        (
            EXAMPLE.replace(vm, &format!("{vm}\nmin_mbps = 20000000000000")),
            "vms[0].min_mbps",
        ),
        (
            EXAMPLE.replace(vm, &format!("{vm}\nmax_mbps = 9223372036854775807")),
            "vms[0].max_mbps",
        ),
        (
            EXAMPLE.replace(vm, &format!("{vm}\nshaped = [{{ rate_mbps = inf }}]")),
            "vms[0].shaped[0].rate_mbps",
        ),
        (
            format!("{EXAMPLE}\n[ingress]\ncapacity_mbps = 18446744073710\n"),
            "ingress.capacity_mbps",
        ),
        (
            format!("{EXAMPLE}\n[ingress]\nqueue_packets = 4294967296\n"),
            "ingress.queue_packets",
        ),
        (
            format!("{EXAMPLE}\n[egress]\nmin_rate_mbps = 0\n"),
            "egress.min_rate_mbps",
        ),
        (
            format!("{EXAMPLE}\n[egress]\nshaped_queue_packets = 9007199254740993\n"),
            "egress.shaped_queue_packets",
        ),
        (
            EXAMPLE.replace("ifname = \"up0\"", "ifname = \"up0\"\ncapacity_mbps = 0"),
            "uplink.capacity_mbps",
        ),
        (
            EXAMPLE.replace("host_id = 1", "host_id = 1\nframe_pool = 1099511627776"),
            "switch.frame_pool",
        ),
        (
            EXAMPLE.replace(vm, &format!("{vm}\nmin_pps = 0")),
            "vms[0].min_pps",
        ),
        (
            EXAMPLE.replace(vm, &format!("{vm}\nmax_pps = 1000\nmin_pps = 2000")),
            "vms[0].min_pps",
        ),
        // 18446744073709652 * 1000 wraps to 100384 ns, inside the range: it was accepted.
        (
            EXAMPLE.replace("host_id = 1", "host_id = 1\nslice_us = 18446744073709652"),
            "switch.slice_us",
        ),
        (
            EXAMPLE.replace("host_id = 1", "host_id = 1\nrealtime_priority = 100"),
            "switch.realtime_priority",
        ),
        (
            EXAMPLE.replace(
                "host_id = 1",
                "host_id = 1\nrealtime_priority = 10\nslice_us = 200",
            ),
            "switch.realtime_priority",
        ),
    ] {
        expect_field(&text, field);
    }
}

#[test]
fn a_tenant_slo_parses_and_a_bad_one_is_named() {
    let with_slo = |slo: &str| EXAMPLE.replace("vni = 100", &format!("vni = 100\nslo = {slo}"));
    let c = Config::parse(&with_slo(
        "{ min_bps = 1_000_000, max_bps = 5_000_000, latency_us = 500, latency_percentile = 99.9, max_loss = 0.001 }",
    ))
    .unwrap();
    let slo = c.tenants[0].slo.as_ref().unwrap();
    assert_eq!((slo.min_bps, slo.max_bps), (1_000_000, Some(5_000_000)));
    assert_eq!((slo.latency_us, slo.latency_percentile), (Some(500), 99.9));
    assert_eq!(slo.max_loss, Some(0.001));
    assert!(Config::parse(EXAMPLE).unwrap().tenants[0].slo.is_none());
    // In a file: the message names the SLO field, the error points at the tenant's line.
    for (slo, field) in [
        ("{ min_bps = 20, max_bps = 10 }", "max_bps"),
        ("{ max_loss = 1.5 }", "max_loss"),
        ("{ latency_us = 0 }", "latency_us"),
        ("{ latency_percentile = 99.0 }", "latency_percentile"),
        ("{ max_los = 0.1 }", "max_los"),
    ] {
        let e = Config::parse(&with_slo(slo)).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains("slo = {"), "{slo}: {e}");
    }
    // Built in code (the lab, the bench): validation names the full path.
    let mut c = Config::parse(EXAMPLE).unwrap();
    c.tenants[0].slo = Some(Slo {
        max_loss: Some(2.0),
        ..Slo::default()
    });
    assert_eq!(c.validate().unwrap_err().field, "tenants[0].slo.max_loss");
}
