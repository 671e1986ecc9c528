//! Config parsing and validation.

use super::*;
use std::path::Path;

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

/// A vhost_user port needs an absolute socket path, and only it has one.
#[test]
fn vhost_user_ports_take_a_socket() {
    let with = |port: &str| EXAMPLE.replace("port = { ifname = \"a1\" }", port);
    let c = Config::parse(&with(
        r#"port = { ifname = "a1", backend = "vhost_user", socket = "/run/picnic/a1.sock" }"#,
    ))
    .unwrap();
    let port = c.vms[0].port.as_ref().unwrap();
    assert_eq!(port.backend, Backend::VhostUser);
    assert_eq!(
        port.socket.as_deref(),
        Some(Path::new("/run/picnic/a1.sock"))
    );
    for bad in [
        r#"port = { ifname = "a1", backend = "vhost_user" }"#,
        r#"port = { ifname = "a1", backend = "vhost_user", socket = "a1.sock" }"#,
        r#"port = { ifname = "a1", socket = "/run/picnic/a1.sock" }"#,
    ] {
        expect_field(&with(bad), "vms[0].port.socket");
    }
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

#[test]
fn duplicate_vm_names_and_ipv6_addresses_are_refused() {
    let mut c = Config::parse(EXAMPLE).unwrap();
    c.vms[1].name = "a1".into();
    let e = c.validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "config field `vms[1].name`: duplicate VM name 'a1'"
    );
    // An IPv6 address of two VMs of one tenant: configured twice, or a2 claiming a1's
    // link-local address.
    let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let mut c = Config::parse(EXAMPLE).unwrap();
    c.vms[0].ipv6 = vec![v6];
    c.vms[1].ipv6 = vec![v6];
    let e = c.validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "config field `vms[1].ipv6`: 2001:db8::1 is also VM 'a1''s address in tenant 'a'"
    );
    c.vms[1].ipv6 = vec![c.vms[0].mac.link_local()];
    assert_eq!(c.validate().unwrap_err().field, "vms[1].ipv6");
    // A VM listing its own link-local address is fine; so is the same address in another
    // tenant.
    c.vms[1].ipv6 = vec![c.vms[1].mac.link_local()];
    c.validate().unwrap();
    let mut other = c.tenants[0].clone();
    other.name = "b".into();
    other.vni = 200;
    c.tenants.push(other);
    c.vms[1].tenant = "b".into();
    c.vms[1].ipv6 = vec![v6];
    c.validate().unwrap();
}

/// A directory of its own for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("picnic-config-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn check_files_names_the_field_of_a_file_that_would_fail_at_start() {
    let dir = temp_dir("files");
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let c = Config::parse(EXAMPLE).unwrap();
    c.check_files().unwrap();
    let check = |edit: &dyn Fn(&mut Config)| {
        let mut c = c.clone();
        edit(&mut c);
        c.validate().unwrap();
        c.check_files()
    };
    // The token: at least 16 bytes once the trailing newline is gone.
    let token = write("token", b"0123456789abcdef\n");
    let short = write("short", b"0123456789abcde\r\n");
    assert_eq!(
        check(&|c| c.switch.api_token_file = Some(token.clone())),
        Ok(())
    );
    let e = check(&|c| c.switch.api_token_file = Some(short.clone())).unwrap_err();
    assert_eq!(e.field, "switch.api_token_file");
    assert!(
        e.problem
            .ends_with("the bearer token has 15 bytes; at least 16 are needed"),
        "{e}"
    );
    let e = check(&|c| c.switch.api_token_file = Some(dir.join("none"))).unwrap_err();
    assert_eq!(e.field, "switch.api_token_file");
    assert!(e.problem.starts_with("cannot read"), "{e}");
    // The feedback key: 32 bytes.
    let key = write("fb", &[7; 32]);
    assert_eq!(
        check(&|c| c.switch.feedback_key_file = Some(key.clone())),
        Ok(())
    );
    let e = check(&|c| c.switch.feedback_key_file = Some(short.clone())).unwrap_err();
    assert_eq!(e.field, "switch.feedback_key_file");
    // The state file: its directory must exist (the file itself need not).
    let state = dir.join("state.json");
    assert_eq!(
        check(&|c| c.switch.state_file = Some(state.clone())),
        Ok(())
    );
    let e = check(&|c| c.switch.state_file = Some(dir.join("no/state.json"))).unwrap_err();
    assert_eq!(e.field, "switch.state_file");
    let e = check(&|c| c.switch.state_file = Some(dir.clone())).unwrap_err();
    assert_eq!(e.field, "switch.state_file");
    // A tenant's key file must hold a key.
    let tenant_key = write("t.key", b"00112233445566778899aabbccddeeff\n");
    let with_key = |path: PathBuf| {
        move |c: &mut Config| {
            c.tenants[0].encrypt = true;
            c.tenants[0].key_file = Some(path.clone());
        }
    };
    assert_eq!(check(&with_key(tenant_key)), Ok(()));
    let e = check(&with_key(token.clone())).unwrap_err();
    assert_eq!(e.field, "tenants[0].key_file");
    // An offload program must load, from a file or inline.
    let good = "(module (func (export \"egress\") (param i32) (result i32) i32.const 0))";
    let program = write("p.wat", good.as_bytes());
    let bad = write("bad.wat", b"(module (func");
    let with_program = |program: Option<PathBuf>, wat: Option<&str>| {
        let wat = wat.map(String::from);
        move |c: &mut Config| {
            c.tenants[0].offload = Some(crate::offload::OffloadEntry {
                program: program.clone(),
                wat: wat.clone(),
                ..toml::from_str("wat = \"\"").unwrap()
            });
        }
    };
    assert_eq!(check(&with_program(Some(program), None)), Ok(()));
    assert_eq!(check(&with_program(None, Some(good))), Ok(()));
    let e = check(&with_program(Some(bad), None)).unwrap_err();
    assert_eq!(e.field, "tenants[0].offload.program");
    let e = check(&with_program(Some(dir.join("none.wat")), None)).unwrap_err();
    assert_eq!(e.field, "tenants[0].offload.program");
    let e = check(&with_program(None, Some("(module"))).unwrap_err();
    assert_eq!(e.field, "tenants[0].offload.wat");
    // A cgroup must be a directory with the cpu controller's quota file.
    let group = dir.join("group");
    std::fs::create_dir_all(&group).unwrap();
    let with_cgroup = |path: PathBuf| {
        move |c: &mut Config| {
            c.tenants[0].cpu_quota = Some(0.5);
            c.tenants[0].cgroup = Some(path.clone());
        }
    };
    let e = check(&with_cgroup(group.clone())).unwrap_err();
    assert_eq!(e.field, "tenants[0].cgroup");
    assert!(e.problem.contains("cpu controller"), "{e}");
    std::fs::write(group.join("cpu.max"), "max 100000\n").unwrap();
    assert_eq!(check(&with_cgroup(group.clone())), Ok(()));
    let e = check(&with_cgroup(dir.join("none"))).unwrap_err();
    assert_eq!(
        (
            e.field.as_str(),
            e.problem
                .ends_with("is not a directory (create the cgroup first)")
        ),
        ("tenants[0].cgroup", true)
    );
    // Without CPU accounting the cgroup is not used, so not checked.
    let e = check(&|c| {
        with_cgroup(dir.join("none"))(c);
        c.isolation.cpu_accounting = false;
    });
    assert_eq!(e, Ok(()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_control_section_is_checked_naming_the_field() {
    let with =
        |control: &str| EXAMPLE.replace("[uplink]", &format!("[control]\n{control}\n[uplink]"));
    let state = |t: String| t.replace("host_id = 1", "host_id = 1\nstate_file = \"/tmp/s.json\"");
    let ok = Config::parse(&state(with(
        r#"etcd = ["http://127.0.0.1:2379", "http://etcd2:2379"]"#,
    )))
    .unwrap();
    let c = ok.control.unwrap();
    assert_eq!((c.etcd.len(), c.prefix.as_str()), (2, "/picnic/"));
    for (control, field) in [
        ("etcd = []", "control.etcd"),
        (r#"etcd = ["127.0.0.1:2379"]"#, "control.etcd[0]"),
        (
            r#"etcd = ["http://a:1", "https://b:2379"]"#,
            "control.etcd[1]",
        ),
        (r#"etcd = ["http://a"]"#, "control.etcd[0]"),
        (r#"etcd = ["http://a:0"]"#, "control.etcd[0]"),
        (
            "etcd = [\"http://a:1\"]\nprefix = \"picnic\"",
            "control.prefix",
        ),
        ("etcd = [\"http://a:1\"]\nport = 3", "port"),
    ] {
        expect_field(&state(with(control)), field);
    }
    // Without a state file: nothing to run on while etcd is down.
    let e = Config::parse(&with(r#"etcd = ["http://a:1"]"#))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`control`") && e.contains("state_file"), "{e}");
}
