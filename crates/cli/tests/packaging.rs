//! packaging/: the default config passes `picnic switch --check` (with the directories the
//! unit creates), and the systemd unit passes `systemd-analyze verify` (skipped, saying so,
//! where systemd-analyze is absent). Needs no root.

use std::process::Command;

const CONFIG: &str = include_str!("../../../packaging/switch.toml");
const UNIT: &str = include_str!("../../../packaging/picnic-switch.service");

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("picnic-pkg-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_packaged_config_checks_ok() {
    let dir = temp_dir("config");
    // systemd creates /run/picnic and /var/lib/picnic (RuntimeDirectory, StateDirectory).
    for (d, made_by) in [
        ("/run/picnic", "RuntimeDirectory=picnic"),
        ("/var/lib/picnic", "StateDirectory=picnic"),
    ] {
        assert!(CONFIG.contains(d) && UNIT.contains(made_by), "{d}");
    }
    let text = CONFIG
        .replace("/run/picnic", dir.to_str().unwrap())
        .replace("/var/lib/picnic", dir.to_str().unwrap());
    let path = dir.join("switch.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_picnic"))
        .args(["switch", "--check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok (0 tenants, 0 VMs, 1 hosts)"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: systemd-analyze not found");
        return;
    }
    assert!(UNIT.contains("--config /etc/picnic/switch.toml"));
    let dir = temp_dir("unit");
    let path = dir.join("picnic-switch.service");
    std::fs::write(
        &path,
        UNIT.replace("/usr/local/bin/picnic", env!("CARGO_BIN_EXE_picnic")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    // A bad value is only a warning: any output fails the test.
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}
