//! Addresses come from a standard IPAM plugin (`host-local`, `static`, ...), run as the spec's
//! delegation says: the binary named by `ipam.type`, found in `CNI_PATH`, given the same
//! netconf on stdin and the same environment.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::error::{code, CniError, Result};
use crate::netconf::Env;

/// The IPAM plugin's binary for `ipam`.
fn binary(ipam: &Value, env: &Env) -> Result<PathBuf> {
    let kind = ipam["type"].as_str().ok_or_else(|| {
        CniError::new(code::INVALID_CONFIG, "network config: ipam.type is missing")
    })?;
    if kind.is_empty() || kind.contains('/') {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("network config: ipam.type '{kind}' is not a plugin name"),
        ));
    }
    env.path
        .iter()
        .map(|dir| dir.join(kind))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                format!("IPAM plugin '{kind}' is not in CNI_PATH ({:?})", env.path),
            )
        })
}

/// Runs the IPAM plugin for `command` (ADD, DEL, CHECK, GC) with `stdin`; its result for ADD.
pub fn delegate(command: &str, ipam: &Value, env: &Env, stdin: &[u8]) -> Result<Value> {
    delegate_for(command, ipam, env, stdin, None)
}

/// As [`delegate`], for the attachment `of` (container id, interface name) instead of the
/// one in the environment (GC's DEL of an attachment the runtime no longer lists).
pub fn delegate_for(
    command: &str,
    ipam: &Value,
    env: &Env,
    stdin: &[u8],
    of: Option<(&str, &str)>,
) -> Result<Value> {
    let path = binary(ipam, env)?;
    let mut cmd = Command::new(&path);
    if let Some((container_id, ifname)) = of {
        cmd.env("CNI_CONTAINERID", container_id)
            .env("CNI_IFNAME", ifname);
    }
    let mut child = cmd
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CniError::new(code::IO, format!("{}: {e}", path.display())))?;
    // The plugin may exit before reading everything (a refusal); its answer says why.
    let _ = child.stdin.take().map(|mut s| s.write_all(stdin));
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::new(code::IO, format!("{}: {e}", path.display())))?;
    let answer: Option<Value> = serde_json::from_slice(&out.stdout).ok();
    if !out.status.success() {
        let (c, msg) = match &answer {
            Some(v) => (
                v["code"].as_u64().unwrap_or(code::IO as u64) as u32,
                v["msg"].as_str().unwrap_or("").to_string(),
            ),
            None => (
                code::IO,
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ),
        };
        return Err(CniError::new(
            c,
            format!("IPAM plugin {} ({command}): {msg}", path.display()),
        ));
    }
    Ok(answer.unwrap_or(Value::Null))
}
