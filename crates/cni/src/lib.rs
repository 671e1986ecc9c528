//! picnic-cni: a CNI plugin (spec 1.0/1.1) attaching pods to a running picnic switch.
//!
//! ADD creates the pod's veth pair (the host end in the plugin's namespace, where the switch
//! runs; the other in `CNI_NETNS` as `CNI_IFNAME`), delegates addresses to the netconf's IPAM
//! plugin, and registers the pod as a VM of the network's tenant through the switch's API
//! (`POST /vms`, creating the tenant with its SLO when the switch lacks it). DEL undoes each
//! step and succeeds for what is already gone; CHECK compares the pod, its veth and the
//! switch's record with the previous result; STATUS asks whether the switch answers; GC
//! removes the network's pods that the runtime no longer lists. docs/cni.md has the netconf.

//! The plugin runs as the `picnic` binary under the name `picnic-cni` (a symlink in the
//! runtime's `CNI_PATH`), or as `picnic cni`: both call [`plugin_main`].

pub mod api;
pub mod error;
pub mod ipam;
pub mod link;
pub mod netconf;
mod plugin;

use std::io::Read;

use serde_json::Value;

use error::{code, CniError, Result};
use netconf::{Env, NetConf, SUPPORTED_VERSIONS};

/// The version this plugin answers VERSION with (its newest).
pub const CNI_VERSION: &str = "1.1.0";

/// Runs the command the `CNI_*` variables (read through `var`) name on the netconf `stdin`;
/// what to print on stdout on success (`None`: nothing).
pub fn run(var: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Result<Option<Value>> {
    let env = Env::read(var)?;
    if env.command == "VERSION" {
        return Ok(Some(serde_json::json!({
            "cniVersion": CNI_VERSION,
            "supportedVersions": SUPPORTED_VERSIONS,
        })));
    }
    let conf = NetConf::parse(stdin)?;
    match env.command.as_str() {
        "ADD" => plugin::add(&conf, &env, stdin).map(Some),
        "DEL" => plugin::del(&conf, &env, stdin).map(|()| None),
        "CHECK" => plugin::check(&conf, &env, stdin).map(|()| None),
        "STATUS" => plugin::status(&conf).map(|()| None),
        "GC" => plugin::gc(&conf, &env, stdin).map(|()| None),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_COMMAND '{other}' is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"),
        )),
    }
}

/// The `cniVersion` an error answer carries: the netconf's when it names one we speak.
pub fn answer_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| CNI_VERSION.to_string())
}

/// The plugin as a process: the netconf from stdin, the `CNI_*` variables from the
/// environment, the result or the spec's error object on stdout; the exit status.
pub fn plugin_main() -> i32 {
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => run(|name| std::env::var(name).ok(), &stdin),
        Err(e) => Err(CniError::new(
            code::IO,
            format!("cannot read the network config on stdin: {e}"),
        )),
    };
    match outcome {
        Ok(Some(result)) => println!("{result:#}"),
        Ok(None) => {}
        Err(e) => {
            println!("{:#}", e.to_json(&answer_version(&stdin)));
            eprintln!("picnic-cni: {e}");
            return 1;
        }
    }
    0
}
