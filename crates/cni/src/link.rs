//! The pod's veth pair, through iproute2's `ip`: the host end stays in the plugin's network
//! namespace (where the switch runs and opens it as the pod's port), the other end goes into
//! the pod's namespace as `CNI_IFNAME` with its addresses and routes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::error::{code, CniError, Result};

/// The host end's name for a pod's interface: `pc` and 12 hex digits of a hash of the
/// container id and interface name (15 bytes at most, the kernel's limit; stable, so DEL finds
/// it from the same variables).
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    // FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id.bytes().chain([0]).chain(ifname.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("pc{:012x}", h >> 16)
}

/// An open network namespace (`CNI_NETNS`).
pub struct Netns {
    file: File,
    path: String,
}

impl Netns {
    pub fn open(path: &Path) -> Result<Netns> {
        let file = File::open(path).map_err(|e| {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("network namespace {}: {e}", path.display()),
            )
        })?;
        Ok(Netns {
            file,
            path: path.display().to_string(),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// `ip args...` run inside this namespace.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let fd = self.file.as_raw_fd();
        let mut cmd = Command::new("ip");
        cmd.args(args);
        // SAFETY: setns(2) is async-signal-safe and only moves the child, between fork and
        // exec, into the namespace whose descriptor the parent holds open.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        run(cmd, args)
    }
}

/// `ip args...` in the plugin's own namespace.
pub fn ip(args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(cmd, args)
}

fn run(mut cmd: Command, args: &[&str]) -> Result<String> {
    let out = cmd
        .output()
        .map_err(|e| CniError::new(code::IO, format!("cannot run ip (iproute2): {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let hint = if stderr.contains("Operation not permitted") {
            " (the plugin needs CAP_NET_ADMIN: run it as root)"
        } else {
            ""
        };
        return Err(
            CniError::new(code::IO, format!("`ip {}` failed{hint}", args.join(" ")))
                .with_details(stderr),
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the link `name` exists in the namespace `ns` (the plugin's own when `None`).
pub fn exists(ns: Option<&Netns>, name: &str) -> Result<bool> {
    Ok(link_json(ns, name)?.is_some())
}

/// `ip -j link show dev name` as JSON; `None` when there is no such link.
pub fn link_json(ns: Option<&Netns>, name: &str) -> Result<Option<Value>> {
    let args = ["-j", "link", "show", "dev", name];
    let shown = match ns {
        Some(ns) => ns.ip(&args),
        None => ip(&args),
    };
    match shown {
        Ok(out) => {
            let v: Value = serde_json::from_str(&out).map_err(|e| {
                CniError::new(code::IO, format!("`ip -j link show dev {name}`: {e}"))
            })?;
            Ok(v.as_array().and_then(|a| a.first()).cloned())
        }
        Err(e) if e.details.contains("does not exist") => Ok(None),
        Err(e) => Err(e),
    }
}

/// The pair: `host` here, up; `pod` in `ns` with `mtu` (both ends), not yet up. Returns the
/// MACs (host, pod).
pub fn create_veth(
    host: &str,
    ns: &Netns,
    pod: &str,
    mtu: Option<u32>,
) -> Result<(String, String)> {
    let mut args = vec!["link", "add", host];
    let mtu_text = mtu.map(|m| m.to_string());
    if let Some(m) = &mtu_text {
        args.extend(["mtu", m]);
    }
    args.extend(["type", "veth", "peer", "name", pod, "netns", ns.path()]);
    if let Some(m) = &mtu_text {
        args.extend(["mtu", m]);
    }
    ip(&args)?;
    ip(&["link", "set", "dev", host, "up"])?;
    let mac = |ns: Option<&Netns>, name: &str| -> Result<String> {
        link_json(ns, name)?
            .and_then(|l| l["address"].as_str().map(str::to_string))
            .ok_or_else(|| CniError::new(code::IO, format!("link {name} has no MAC")))
    };
    Ok((mac(None, host)?, mac(Some(ns), pod)?))
}

/// Deletes the link `name` here (a veth takes its peer with it); absent is fine.
pub fn delete(name: &str) -> Result<()> {
    match ip(&["link", "del", "dev", name]) {
        Err(e) if !e.details.contains("Cannot find device") => Err(e),
        _ => Ok(()),
    }
}
