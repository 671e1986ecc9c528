//! The switch's state file: the running config, API changes included, written atomically
//! after every change and read back on start, so a restart (even after `kill -9`) brings
//! every tenant, VM and host back.
//!
//! Writing follows the usual crash-safe sequence: write a temporary file in the same
//! directory, `fsync` it, `rename` it over the state file (atomic on POSIX, rename(2)), then
//! `fsync` the directory so the rename itself is durable. A crash at any point leaves either
//! the old or the new state, never a mix.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::config::{Config, FeedbackKeys, HostEntry, TenantEntry, VmEntry};

/// What is persisted: the parts of the config the API changes. The rest (this host, its
/// uplink, isolation, queues) always comes from the config file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    /// Format version, for future changes.
    version: u32,
    hosts: Vec<HostEntry>,
    tenants: Vec<TenantEntry>,
    vms: Vec<VmEntry>,
    /// The control plane's feedback keys, so that a switch restarting while etcd is down
    /// signs and accepts what the others do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    feedback_keys: Option<FeedbackKeys>,
}

const VERSION: u32 = 1;

/// Persists `cfg`'s hosts, tenants and VMs to `path` atomically.
pub fn save(path: &Path, cfg: &Config) -> anyhow::Result<()> {
    let state = State {
        version: VERSION,
        hosts: cfg.hosts.clone(),
        tenants: cfg.tenants.clone(),
        vms: cfg.vms.clone(),
        feedback_keys: cfg.feedback_keys.clone(),
    };
    write_atomic(path, &serde_json::to_vec_pretty(&state)?)
}

/// Writes `bytes` to `path` atomically and durably (the sequence above).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    // Owner only: the state holds tenants' and feedback keys.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|_| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    drop(file);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync directory {}", dir.display()))?;
    Ok(())
}

/// `cfg` with the hosts, tenants and VMs of the state file at `path`, validated; `cfg`
/// unchanged when there is no state file yet. Errors name the file and the field.
pub fn restore(cfg: Config, path: &Path) -> anyhow::Result<Config> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(cfg),
        Err(e) => anyhow::bail!("switch.state_file: cannot read {}: {e}", path.display()),
    };
    let state: State = serde_json::from_slice(&text).map_err(|e| {
        anyhow::anyhow!(
            "switch.state_file {}: {e} (remove the file to start from the config alone)",
            path.display()
        )
    })?;
    if state.version != VERSION {
        anyhow::bail!(
            "switch.state_file {}: version {} (this switch reads version {VERSION})",
            path.display(),
            state.version
        );
    }
    let restored = Config {
        hosts: state.hosts,
        tenants: state.tenants,
        vms: state.vms,
        feedback_keys: state.feedback_keys.or_else(|| cfg.feedback_keys.clone()),
        ..cfg
    };
    restored.validate().map_err(|e| {
        anyhow::anyhow!(
            "switch.state_file {} with the config file: {e} (remove the state file to start from the config alone)",
            path.display()
        )
    })?;
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("picnic-persist-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn example() -> Config {
        Config::parse(include_str!("../../../examples/host1.toml")).unwrap()
    }

    #[test]
    fn a_saved_state_is_restored_over_the_config_file() {
        let dir = temp_dir("restore");
        let path = dir.join("state.json");
        let file_cfg = example();
        // Nothing saved yet: the config file alone.
        let same = restore(file_cfg.clone(), &path).unwrap();
        assert_eq!(same.vms.len(), file_cfg.vms.len());
        let mut changed = file_cfg.clone();
        let mut vm = changed.vms[0].clone();
        vm.name = "added".into();
        vm.id = 77;
        vm.mac = "02:00:00:00:00:77".parse().unwrap();
        vm.port.as_mut().unwrap().ifname = "added0".into();
        changed.vms.push(vm);
        changed.vms[1].min_mbps = 333;
        changed.feedback_keys = Some(crate::config::FeedbackKeys {
            active: Some(crate::config::EpochKey {
                epoch: 4,
                key: "ab".repeat(32),
            }),
            ..Default::default()
        });
        save(&path, &changed).unwrap();
        // Saved again (replacing the file) and no temporary file left behind.
        save(&path, &changed).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let back = restore(file_cfg.clone(), &path).unwrap();
        assert_eq!(back.vms.len(), file_cfg.vms.len() + 1);
        assert_eq!(back.vms.last().unwrap().name, "added");
        assert_eq!(back.vms[1].min_mbps, 333);
        assert_eq!(back.feedback_keys, changed.feedback_keys);
        // The state file holds keys: only its owner reads it.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(back.switch.host_id, file_cfg.switch.host_id);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_state_file_is_an_error_naming_it() {
        let dir = temp_dir("bad");
        let path = dir.join("state.json");
        std::fs::write(&path, "{\"version\": 1, \"hosts\": [").unwrap();
        let e = restore(example(), &path).unwrap_err().to_string();
        assert!(
            e.contains("switch.state_file") && e.contains("state.json"),
            "{e}"
        );
        // Valid JSON, but a VM of an unknown tenant.
        let mut cfg = example();
        cfg.vms[0].tenant = "nobody".into();
        let state = State {
            version: 1,
            hosts: cfg.hosts.clone(),
            tenants: cfg.tenants.clone(),
            vms: cfg.vms.clone(),
            feedback_keys: None,
        };
        std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();
        let e = restore(example(), &path).unwrap_err().to_string();
        assert!(e.contains("vms[0].tenant"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
