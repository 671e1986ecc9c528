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
        (edit(EXAMPLE, "mtu = 1500", "mtu = 9000"), "uplink.mtu"),
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
fn the_switch_logs_with_time_and_level_or_as_json() {
    let path = "/nonexistent/picnic-host.toml";
    let (_, _, text) = check_switch_path(path);
    let (time, rest) = text.trim().split_once(' ').unwrap();
    assert!(time.starts_with("20") && time.ends_with('Z'), "{text}");
    assert!(rest.trim_start().starts_with("ERROR"), "{text}");
    let out = picnic(&[
        "switch",
        "--log-format",
        "json",
        "--check",
        "--config",
        path,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let line: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(line["level"], "ERROR");
    assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
    assert!(line["message"].as_str().unwrap().contains(path), "{line}");
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

#[test]
fn duplicate_names_and_ids_are_refused_by_check() {
    let cases = [
        (
            edit(EXAMPLE, "name = \"red1\"", "name = \"blue1\""),
            "vms[1].name",
            "duplicate VM name 'blue1'",
        ),
        (
            edit(EXAMPLE, "id = 2\ntenant", "id = 1\ntenant"),
            "vms[1].id",
            "duplicate VM id 1",
        ),
        (
            edit(EXAMPLE, "name = \"red\"", "name = \"blue\""),
            "tenants[1].name",
            "duplicate tenant 'blue'",
        ),
        (
            edit(EXAMPLE, "vni = 200", "vni = 100"),
            "tenants[1].vni",
            "duplicate VNI 100",
        ),
    ];
    for (i, (text, field, problem)) in cases.iter().enumerate() {
        let (code, _, stderr) = check_switch(&format!("dup{i}.toml"), text);
        assert_eq!(code, Some(2), "case {field}: {stderr}");
        assert!(
            stderr.contains(&format!("config field `{field}`: {problem}")),
            "{stderr}"
        );
    }
}

/// A directory of its own in the temp directory for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("picnic-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn check_reads_the_files_the_switch_would_read() {
    let dir = temp_dir("files");
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    };
    let missing = dir.join("missing").display().to_string();
    let token = file("token", b"0123456789abcdef0123\n");
    let short_token = file("short-token", b"0123456789abcde\n"); // 15 bytes and a newline
    let key = file("feedback.key", &[b'k'; 32]);
    let short_key = file("short.key", &[b'k'; 31]);
    let tenant_key = file("blue.key", b"00112233445566778899aabbccddeeff\n");
    let bad_tenant_key = file("bad.key", b"not hex at all\n");
    let program = file(
        "prog.wat",
        include_bytes!("../../../examples/offload/acl.wat"),
    );
    let bad_program = file("bad.wat", b"(module (func $nope");
    let cgroup = dir.join("cgroup");
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cpu.max"), "max 100000\n").unwrap();
    let not_a_cgroup = dir.display().to_string();
    let cgroup = cgroup.display().to_string();
    let state = dir.join("state.json").display().to_string();
    let state_elsewhere = dir.join("nowhere/state.json").display().to_string();

    let switch = |lines: &str| edit(EXAMPLE, "spin_us = 50", &format!("spin_us = 50\n{lines}"));
    let blue = |lines: &str| edit(EXAMPLE, "vni = 100", &format!("vni = 100\n{lines}"));
    let tcp = |file: &str| {
        switch(&format!("api_token_file = \"{file}\"\n")).replacen(
            "api = \"/run/picnic/host1.sock\"",
            "api = \"tcp:127.0.0.1:9101\"",
            1,
        )
    };
    let feedback = |file: &str| switch(&format!("feedback_key_file = \"{file}\""));
    let state_file = |file: &str| switch(&format!("state_file = \"{file}\""));
    let key_file = |file: &str| blue(&format!("encrypt = true\nkey_file = \"{file}\""));
    let offload = |file: &str| blue(&format!("offload = {{ program = \"{file}\" }}"));
    let cgroup_at = |dir: &str| blue(&format!("cpu_quota = 0.5\ncgroup = \"{dir}\""));

    let good = [
        tcp(&token),
        feedback(&key),
        state_file(&state),
        key_file(&tenant_key),
        offload(&program),
        cgroup_at(&cgroup),
    ];
    for (i, text) in good.iter().enumerate() {
        let (code, _, stderr) = check_switch(&format!("files-ok{i}.toml"), text);
        assert_eq!(code, Some(0), "case {i}: {stderr}\n{text}");
    }
    let bad = [
        (tcp(&missing), "switch.api_token_file", "cannot read"),
        (
            tcp(&short_token),
            "switch.api_token_file",
            "has 15 bytes; at least 16",
        ),
        (
            feedback(&missing),
            "switch.feedback_key_file",
            "cannot read",
        ),
        (
            feedback(&short_key),
            "switch.feedback_key_file",
            "has 31 bytes; at least 32",
        ),
        (
            state_file(&state_elsewhere),
            "switch.state_file",
            "does not exist",
        ),
        (key_file(&missing), "tenants[0].key_file", "cannot read"),
        (key_file(&bad_tenant_key), "tenants[0].key_file", "bad.key"),
        (offload(&missing), "tenants[0].offload.program", "missing"),
        (
            offload(&bad_program),
            "tenants[0].offload.program",
            "bad.wat",
        ),
        (cgroup_at(&missing), "tenants[0].cgroup", "not a directory"),
        (
            cgroup_at(&not_a_cgroup),
            "tenants[0].cgroup",
            "cpu controller",
        ),
    ];
    for (i, (text, field, problem)) in bad.iter().enumerate() {
        let (code, _, stderr) = check_switch(&format!("files-bad{i}.toml"), text);
        assert_eq!(code, Some(2), "case {field}: {stderr}");
        assert!(
            stderr.contains(&format!("config field `{field}`: ")) && stderr.contains(problem),
            "case {i}: the error should name `{field}` and say {problem:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
