//! The `picnic` binary's config errors: a bad switch config (`picnic switch --check`) or
//! scenario (`picnic lab run`) fails with exit code 2 and a message naming the field.
//! Needs no root: both are rejected before anything is opened.

use std::path::PathBuf;
use std::process::{Command, Output};

const EXAMPLE: &str = include_str!("../../../examples/host1.toml");
const SCENARIO: &str = include_str!("../../../scenarios/ingress-flood.toml");

/// Writes `text` to a file of its own in the temp directory.
fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("picnic-cli-test-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn picnic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_picnic"))
        .args(args)
        .output()
        .unwrap()
}

/// `picnic switch --check` of a config with `text`: (exit code, stdout, stderr).
fn check_switch(name: &str, text: &str) -> (Option<i32>, String, String) {
    let path = temp_file(name, text);
    let result = check_switch_path(path.to_str().unwrap());
    let _ = std::fs::remove_file(&path);
    result
}

/// `picnic switch --config <path> --check`: (exit code, stdout, stderr).
fn check_switch_path(path: &str) -> (Option<i32>, String, String) {
    let out = picnic(&["switch", "--config", path, "--check"]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `text` with `from` replaced by `to` (which must occur).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the example no longer contains {from:?}"
    );
    text.replacen(from, to, 1)
}

#[test]
fn the_shipped_switch_config_checks_ok() {
    let (code, stdout, stderr) = check_switch("ok.toml", EXAMPLE);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(
        stdout.contains("ok (2 tenants, 4 VMs, 2 hosts)"),
        "{stdout}"
    );
}

#[test]
fn switch_config_errors_name_the_field() {
    let cases = [
        // Validation.
        (edit(EXAMPLE, "vni = 100", "vni = 0"), "tenants[0].vni"),
        (
            edit(
                EXAMPLE,
                "tenant = \"blue\"\nhost = 2",
                "tenant = \"green\"\nhost = 2",
            ),
            "vms[2].tenant",
        ),
        (edit(EXAMPLE, "mtu = 1500", "mtu = 600"), "uplink.mtu"),
        (
            edit(EXAMPLE, "headroom = 0.1", "headroom = 1.5"),
            "ingress.headroom",
        ),
        (
            edit(EXAMPLE, "host_id = 1", "host_id = 9"),
            "switch.host_id",
        ),
        (
            edit(EXAMPLE, "rate_mbps = 10.0", "rate_mbps = 0.0"),
            "vms[0].shaped[0].rate_mbps",
        ),
        (
            edit(EXAMPLE, "min_mbps = 300", "min_mbps = 0"),
            "vms[0].min_mbps",
        ),
        // Parsing: unknown field, wrong type, bad MAC (the error quotes the line).
        (edit(EXAMPLE, "batch = 64", "batches = 64"), "batches"),
        (
            edit(EXAMPLE, "frame_pool = 16384", "frame_pool = \"many\""),
            "frame_pool = \"many\"",
        ),
        (
            edit(EXAMPLE, "mac = \"02:00:00:00:00:03\"", "mac = \"02:00:00\""),
            "mac = \"02:00:00\"",
        ),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let (code, _, stderr) = check_switch(&format!("bad{i}.toml"), text);
        assert_eq!(code, Some(2), "case {field}: {stderr}");
        assert!(
            stderr.contains(field),
            "the error should name `{field}`: {stderr}"
        );
        println!("{field}: {}", stderr.trim());
    }
}

#[test]
fn a_missing_config_file_is_named() {
    let (code, _, stderr) = check_switch_path("/nonexistent/picnic-host.toml");
    assert_eq!(code, Some(2));
    assert!(stderr.contains("/nonexistent/picnic-host.toml"), "{stderr}");
}

#[test]
fn scenario_errors_name_the_field() {
    let cases = [
        (
            edit(SCENARIO, "duration_ms = ", "duration_ms = 0 #"),
            "duration_ms",
        ),
        (
            edit(SCENARIO, "victim = ", "victim = \"nobody\" #"),
            "victim",
        ),
        (edit(SCENARIO, "kind = ", "kind = \"teleport\" #"), "kind"),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let path = temp_file(&format!("scenario{i}.toml"), text);
        let out = picnic(&["lab", "run", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {field}: {stderr}");
        assert!(
            stderr.contains(field),
            "the error should name `{field}`: {stderr}"
        );
        println!("{field}: {}", stderr.trim());
    }
}
