//! What the switch will read from the file system, checked without devices: the files the
//! config names (API token, feedback key, tenant keys, offload programs), the state file's
//! directory and the tenants' cgroups. `picnic switch --check` and the switch's start both
//! run it, so a file that would fail at start fails the check, naming the field the same way.

use std::path::Path;

use super::{read_secret, Config, ConfigError};
use crate::api::MIN_TOKEN_LEN;
use crate::engine::feedback::MIN_KEY_LEN;

fn err(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// A secret file of at least `min` bytes (trailing newline ignored, as the switch reads it).
fn check_secret(field: &str, path: &Path, min: usize, what: &str) -> Result<(), ConfigError> {
    let bytes = read_secret(path, field).map_err(|e| {
        // read_secret names the field itself; keep only the problem.
        let text = e.to_string();
        let problem = text
            .strip_prefix(&format!("{field}: "))
            .unwrap_or(&text)
            .to_string();
        err(field, problem)
    })?;
    if bytes.len() < min {
        return Err(err(
            field,
            format!(
                "{}: the {what} has {} bytes; at least {min} are needed",
                path.display(),
                bytes.len()
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// Checks every file and directory the switch will use at start, in config order; the
    /// first problem is the error, naming its field (`tenants[1].key_file`).
    pub fn check_files(&self) -> Result<(), ConfigError> {
        let s = &self.switch;
        if let Some(path) = &s.api_token_file {
            check_secret("switch.api_token_file", path, MIN_TOKEN_LEN, "bearer token")?;
        }
        if let Some(path) = &s.feedback_key_file {
            check_secret(
                "switch.feedback_key_file",
                path,
                MIN_KEY_LEN,
                "feedback key",
            )?;
        }
        if let Some(path) = &s.state_file {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(err(
                    "switch.state_file",
                    format!(
                        "{}: its directory {} does not exist (the state is written there)",
                        path.display(),
                        dir.display()
                    ),
                ));
            }
            if path.is_dir() {
                return Err(err(
                    "switch.state_file",
                    format!("{} is a directory", path.display()),
                ));
            }
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if let Some(path) = &t.key_file {
                let field = format!("tenants[{i}].key_file");
                let hex = std::fs::read_to_string(path)
                    .map_err(|e| err(&field, format!("cannot read {}: {e}", path.display())))?;
                picnic_wire::seal::TunnelKey::from_hex(&hex)
                    .map_err(|e| err(&field, format!("{}: {e}", path.display())))?;
            }
            if let Some(o) = &t.offload {
                let (field, source) = match &o.program {
                    Some(path) => ("program", format!("{}: ", path.display())),
                    None => ("wat", String::new()),
                };
                let field = format!("tenants[{i}].offload.{field}");
                o.code().map_err(|e| err(&field, e.to_string()))?;
                crate::offload::check(o).map_err(|e| err(&field, format!("{source}{e:#}")))?;
            }
            if let (Some(dir), true) = (&t.cgroup, self.isolation.cpu_accounting) {
                let field = format!("tenants[{i}].cgroup");
                if !dir.is_dir() {
                    return Err(err(
                        field,
                        format!(
                            "{} is not a directory (create the cgroup first)",
                            dir.display()
                        ),
                    ));
                }
                if !dir.join("cpu.cfs_quota_us").exists() && !dir.join("cpu.max").exists() {
                    return Err(err(
                        field,
                        format!(
                            "{}: no cpu.cfs_quota_us (cgroup v1) or cpu.max (cgroup v2): is it a \
                             cgroup with the cpu controller?",
                            dir.display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
