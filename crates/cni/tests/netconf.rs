//! The plugin's answers that need no switch and no privileges: VERSION, the spec's error
//! objects for malformed input, the pod's limits from netconf and runtime config.

use picnic_cni::error::code;
use picnic_cni::netconf::{NetConf, PodLimits};
use serde_json::json;

fn env(command: &str) -> impl Fn(&str) -> Option<String> {
    let command = command.to_string();
    move |name: &str| match name {
        "CNI_COMMAND" => Some(command.clone()),
        "CNI_CONTAINERID" => Some("c1".into()),
        "CNI_IFNAME" => Some("eth0".into()),
        "CNI_NETNS" => Some("/var/run/netns/none-such".into()),
        "CNI_PATH" => Some("/nonexistent".into()),
        _ => None,
    }
}

fn conf(extra: serde_json::Value) -> Vec<u8> {
    let mut c = json!({
        "cniVersion": "1.0.0",
        "name": "red",
        "type": "picnic-cni",
        "socket": "/nonexistent/picnic.sock",
        "tenant": "red",
        "vni": 100,
        "ipam": { "type": "host-local", "subnet": "198.18.0.0/24" },
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    serde_json::to_vec(&c).unwrap()
}

#[test]
fn version_lists_the_spec_versions_spoken() {
    let out = picnic_cni::run(env("VERSION"), b"{\"cniVersion\":\"1.1.0\"}")
        .unwrap()
        .unwrap();
    assert_eq!(out["cniVersion"], "1.1.0");
    assert_eq!(out["supportedVersions"], json!(["1.0.0", "1.1.0"]));
}

#[test]
fn malformed_input_gets_the_spec_error_codes() {
    let cases: [(&[u8], u32, &str); 5] = [
        (b"{not json", code::DECODE, "network config"),
        (
            &conf(json!({ "tennant": "x" })),
            code::INVALID_CONFIG,
            "unknown field `tennant`",
        ),
        (
            &conf(json!({ "cniVersion": "0.3.1" })),
            code::INCOMPATIBLE_VERSION,
            "0.3.1",
        ),
        (
            &conf(json!({ "slo": { "max_loss": 2.0 } })),
            code::INVALID_CONFIG,
            "max_loss",
        ),
        (
            &conf(json!({ "pod": { "max_mbs": 5 } })),
            code::INVALID_CONFIG,
            "max_mbs",
        ),
    ];
    for (stdin, want, text) in cases {
        let e = picnic_cni::run(env("ADD"), stdin).unwrap_err();
        assert_eq!(e.code, want, "{e}");
        assert!(e.msg.contains(text), "{e}");
        let object = e.to_json(&picnic_cni::answer_version(stdin));
        assert_eq!(object["code"], want);
        assert!(object["cniVersion"].is_string() && object["msg"].is_string());
    }
}

#[test]
fn a_missing_switch_socket_is_an_error_to_retry_and_creates_nothing() {
    // ADD asks the switch before anything else: no namespace, veth or address is touched.
    let e = picnic_cni::run(env("ADD"), &conf(json!({}))).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN, "{e}");
    assert!(e.msg.contains("/nonexistent/picnic.sock"), "{e}");
    let e = picnic_cni::run(env("STATUS"), &conf(json!({}))).unwrap_err();
    assert_eq!(e.code, code::NOT_AVAILABLE, "{e}");
}

#[test]
fn missing_or_odd_environment_is_named() {
    let no_ifname = |name: &str| match name {
        "CNI_IFNAME" => None,
        other => env("ADD")(other),
    };
    let e = picnic_cni::run(no_ifname, &conf(json!({}))).unwrap_err();
    assert_eq!(
        (e.code, e.msg.contains("CNI_IFNAME")),
        (code::INVALID_ENV, true),
        "{e}"
    );
    let slashed = |name: &str| match name {
        "CNI_CONTAINERID" => Some("../x".into()),
        other => env("DEL")(other),
    };
    let e = picnic_cni::run(slashed, &conf(json!({}))).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV, "{e}");
    let e = picnic_cni::run(env("FROB"), &conf(json!({}))).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV, "{e}");
}

#[test]
fn pod_limits_come_from_netconf_then_bandwidth_then_picnic_capability() {
    let c = NetConf::parse(&conf(json!({
        "pod": { "min_mbps": 50, "max_mbps": 900, "max_pps": 20000 },
        "runtimeConfig": {
            "bandwidth": { "ingressRate": 300_000_001u64, "egressRate": 400_000_000u64 },
            "picnic": { "max_pps": 5000 },
            "portMappings": [],
        },
    })))
    .unwrap();
    assert_eq!(
        c.pod_limits(),
        PodLimits {
            min_mbps: Some(50),
            max_mbps: Some(301),
            max_pps: Some(5000),
            min_pps: None,
        }
    );
}

#[test]
fn gc_reads_the_valid_attachments_under_both_names_libcni_sends() {
    let list = json!([{ "containerID": "c1", "ifname": "eth0" }]);
    let c = NetConf::parse(&conf(json!({
        "cni.dev/valid-attachments": list,
        "cni.dev/attachments": list,
    })))
    .unwrap();
    let valid = c.valid_attachments.unwrap();
    assert_eq!(
        (valid[0].container_id.as_str(), valid[0].ifname.as_str()),
        ("c1", "eth0")
    );
    assert_eq!(c.attachments.unwrap().len(), 1);
}

#[test]
fn the_example_netconf_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cni");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let c = NetConf::parse(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(c.plugin, "picnic-cni", "{}", path.display());
        assert!(c.ipam.is_some() && c.slo.is_some(), "{}", path.display());
    }
}
