//! ADD, DEL, CHECK, STATUS and GC.

use std::net::IpAddr;

use serde_json::{json, Value};

use crate::api::Api;
use crate::error::{code, CniError, Result};
use crate::ipam;
use crate::link::{self, Netns};
use crate::netconf::{Env, NetConf};

/// Prefix of the switch's VM names for pods this plugin attached.
const VM_PREFIX: &str = "cni:";

/// The switch's name for the pod's VM: `cni:CONTAINERID:IFNAME` (neither has a `:`).
fn vm_name(container_id: &str, ifname: &str) -> String {
    format!("{VM_PREFIX}{container_id}:{ifname}")
}

/// The attachment (container id, interface name) a VM name of [`vm_name`] stands for.
fn attachment_of(vm_name: &str) -> Option<(&str, &str)> {
    vm_name.strip_prefix(VM_PREFIX)?.rsplit_once(':')
}

fn ipam_of(conf: &NetConf) -> Result<&Value> {
    conf.ipam.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "network config: ipam is missing (picnic delegates addresses to an IPAM plugin, \
             e.g. {\"type\": \"host-local\", ...})",
        )
    })
}

/// The switch's record of `name`, if it has one.
fn find_vm(api: &Api, name: &str) -> Result<Option<Value>> {
    let vms = api.get_json("/vms")?;
    Ok(vms
        .as_array()
        .and_then(|vms| vms.iter().find(|v| v["name"] == name))
        .cloned())
}

/// Removes the VM `name` from the switch; one already gone is fine.
fn remove_vm(api: &Api, name: &str) -> Result<()> {
    let answer = api.delete(&format!("/vms/{name}"))?;
    if answer.ok() || answer.status == 404 {
        Ok(())
    } else {
        Err(answer.refusal(&format!("removing VM '{name}'")))
    }
}

pub fn add(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<Value> {
    let ipam = ipam_of(conf)?;
    let api = Api::new(&conf.socket);
    // Ask the switch first: if it is not there, nothing is created.
    let config = api.get_json("/config")?;
    let host_id = config["switch"]["host_id"]
        .as_u64()
        .ok_or_else(|| CniError::new(code::IO, "the switch's /config has no switch.host_id"))?;
    check_tenant(conf, &config)?;
    let netns = Netns::open(env.netns.as_deref().expect("ADD has CNI_NETNS"))?;
    let name = vm_name(&env.container_id, &env.ifname);
    let host = link::host_ifname(&env.container_id, &env.ifname);

    // A repeated ADD, or the leftovers of one interrupted: start afresh.
    if link::exists(None, &host)? || find_vm(&api, &name)?.is_some() {
        remove_vm(&api, &name)?;
        link::delete(&host)?;
        ipam::delegate("DEL", ipam, env, stdin)?;
    }

    let addresses = ipam::delegate("ADD", ipam, env, stdin)?;
    let attached = attach(conf, env, &api, &netns, host_id, &name, &host, &addresses);
    if attached.is_err() {
        // Undo whatever was made, so a failed ADD leaves nothing behind.
        let _ = remove_vm(&api, &name);
        let _ = link::delete(&host);
        let _ = ipam::delegate("DEL", ipam, env, stdin);
    }
    attached
}

/// The tenant must be on the switch, or the netconf must say how to create it.
fn check_tenant(conf: &NetConf, config: &Value) -> Result<()> {
    let existing = config["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == conf.tenant.as_str()));
    match (existing, conf.vni) {
        (Some(t), Some(vni)) if t["vni"].as_u64() != Some(u64::from(vni)) => Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "network config: vni {vni} differs from tenant '{}''s VNI {} on the switch",
                conf.tenant, t["vni"]
            ),
        )),
        (None, None) => Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "network config: the switch has no tenant '{}'; give its vni (and slo) to create it",
                conf.tenant
            ),
        )),
        _ => Ok(()),
    }
}

/// Creates the tenant with the netconf's VNI and SLO unless the switch has it (another pod's
/// ADD may have created it meanwhile).
fn ensure_tenant(conf: &NetConf, api: &Api) -> Result<()> {
    let has_tenant = |api: &Api| -> Result<bool> {
        let tenants = api.get_json("/tenants")?;
        Ok(tenants
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["name"] == conf.tenant.as_str())))
    };
    if has_tenant(api)? {
        return Ok(());
    }
    let mut tenant = json!({ "name": conf.tenant, "vni": conf.vni });
    if let Some(slo) = &conf.slo {
        tenant["slo"] = serde_json::to_value(slo).expect("an SLO serializes");
    }
    let answer = api.post("/tenants", &tenant)?;
    if answer.ok() || has_tenant(api)? {
        return Ok(());
    }
    Err(answer.refusal(&format!("tenant '{}'", conf.tenant)))
}

/// Everything of ADD after the addresses: the veth, the pod's addresses and routes, the
/// switch's tenant and VM; the result.
#[allow(clippy::too_many_arguments)]
fn attach(
    conf: &NetConf,
    env: &Env,
    api: &Api,
    netns: &Netns,
    host_id: u64,
    name: &str,
    host: &str,
    addresses: &Value,
) -> Result<Value> {
    let ips = addresses["ips"].as_array().cloned().unwrap_or_default();
    let mut ipv4 = None;
    let mut ipv6 = Vec::new();
    for ip in &ips {
        let cidr = ip["address"].as_str().unwrap_or("");
        match cidr
            .split('/')
            .next()
            .and_then(|a| a.parse::<IpAddr>().ok())
        {
            Some(IpAddr::V4(a)) if ipv4.is_none() => ipv4 = Some(a),
            Some(IpAddr::V4(a)) => {
                return Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("IPAM gave a second IPv4 address {a}: a picnic pod has one"),
                ))
            }
            Some(IpAddr::V6(a)) => ipv6.push(a),
            None => {
                return Err(CniError::new(
                    code::IO,
                    format!("IPAM result: '{cidr}' is not an address/prefix"),
                ))
            }
        }
    }
    let ipv4 = ipv4.ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "IPAM gave no IPv4 address: a picnic pod needs one (and may have IPv6 besides)",
        )
    })?;

    let pod = env.ifname.as_str();
    let (host_mac, pod_mac) = link::create_veth(host, netns, pod, conf.mtu)?;
    netns.ip(&["link", "set", "dev", pod, "up"])?;
    for ip in &ips {
        let cidr = ip["address"].as_str().unwrap_or("");
        if cidr.contains(':') {
            // The switch answers neighbour solicitations itself and consumes the probes of
            // duplicate address detection, which would only hold the address back a second.
            netns.ip(&["-6", "addr", "add", cidr, "dev", pod, "nodad"])?;
        } else {
            netns.ip(&["addr", "add", cidr, "dev", pod])?;
        }
    }
    let routes = addresses["routes"].as_array().cloned().unwrap_or_default();
    for route in &routes {
        let dst = route["dst"].as_str().unwrap_or("");
        let v6 = dst.contains(':');
        // A route without gw goes through the gateway of its family, else on the link.
        let gw = route["gw"].as_str().map(str::to_string).or_else(|| {
            ips.iter()
                .filter(|ip| ip["address"].as_str().unwrap_or("").contains(':') == v6)
                .find_map(|ip| ip["gateway"].as_str().map(str::to_string))
        });
        let mut args = vec![if v6 { "-6" } else { "-4" }, "route", "add", dst];
        if let Some(gw) = &gw {
            args.extend(["via", gw]);
        }
        args.extend(["dev", pod]);
        netns.ip(&args)?;
    }

    ensure_tenant(conf, api)?;
    let mut vm = json!({
        "name": name,
        "tenant": conf.tenant,
        "host": host_id,
        "mac": pod_mac,
        "ip": ipv4,
        "ipv6": ipv6,
        "port": { "ifname": host },
    });
    let limits = conf.pod_limits();
    for (key, value) in [
        ("min_mbps", limits.min_mbps),
        ("max_mbps", limits.max_mbps),
        ("max_pps", limits.max_pps),
        ("min_pps", limits.min_pps),
    ] {
        if let Some(v) = value {
            vm[key] = v.into();
        }
    }
    register(api, &mut vm)?;

    let ips: Vec<Value> = ips
        .into_iter()
        .map(|mut ip| {
            ip["interface"] = 1.into();
            ip
        })
        .collect();
    let mut result = json!({
        "cniVersion": conf.cni_version,
        "interfaces": [
            { "name": host, "mac": host_mac },
            { "name": pod, "mac": pod_mac, "sandbox": netns.path() },
        ],
        "ips": ips,
        "routes": routes,
    });
    if let Some(dns) = addresses.get("dns").or(conf.dns.as_ref()) {
        result["dns"] = dns.clone();
    }
    Ok(result)
}

/// POSTs the VM with the lowest id above every id the switch knows (VM ids are
/// deployment-wide; the switch lists every host's VMs). Another ADD may take that id between
/// the two requests: then the switch refuses it as a duplicate and the next one is tried.
fn register(api: &Api, vm: &mut Value) -> Result<()> {
    const TRIES: usize = 5;
    for _ in 0..TRIES {
        let vms = api.get_json("/vms")?;
        let top = vms
            .as_array()
            .map(|vms| {
                vms.iter()
                    .filter_map(|v| v["id"].as_u64())
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        vm["id"] = (top + 1).into();
        let answer = api.post("/vms", vm)?;
        if answer.ok() {
            return Ok(());
        }
        if !answer.body.contains("duplicate VM id") {
            return Err(answer.refusal(&format!("VM '{}'", vm["name"])));
        }
    }
    Err(CniError::new(
        code::TRY_AGAIN,
        format!("no free VM id after {TRIES} tries (other pods being added at once)"),
    ))
}

pub fn del(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let api = Api::new(&conf.socket);
    let name = vm_name(&env.container_id, &env.ifname);
    // The switch first, so it stops using the port before the port goes. If it does not
    // answer, the local parts are still removed and the error asks the runtime to retry.
    let switch = remove_vm(&api, &name);
    link::delete(&link::host_ifname(&env.container_id, &env.ifname))?;
    if let Some(ipam) = &conf.ipam {
        ipam::delegate("DEL", ipam, env, stdin)?;
    }
    switch
}

pub fn check(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "CHECK needs prevResult in the network config",
        )
    })?;
    ipam::delegate("CHECK", ipam_of(conf)?, env, stdin)?;
    let drift = |what: String| CniError::new(code::DRIFT, what);
    let pod = env.ifname.as_str();
    let host = link::host_ifname(&env.container_id, &env.ifname);
    let netns = Netns::open(env.netns.as_deref().expect("CHECK has CNI_NETNS"))?;

    // The pod's end: its MAC, up, every address of the result.
    let expected_mac = prev["interfaces"]
        .as_array()
        .and_then(|is| {
            is.iter()
                .find(|i| i["name"] == pod && i["sandbox"].is_string())
        })
        .and_then(|i| i["mac"].as_str())
        .ok_or_else(|| drift(format!("prevResult has no interface {pod} in a sandbox")))?;
    let link = link::link_json(Some(&netns), pod)?
        .ok_or_else(|| drift(format!("the pod has no interface {pod}")))?;
    if link["address"] != expected_mac {
        return Err(drift(format!(
            "{pod}'s MAC is {}, ADD gave it {expected_mac}",
            link["address"]
        )));
    }
    if !is_up(&link) {
        return Err(drift(format!("{pod} is down in the pod")));
    }
    let shown: Value = serde_json::from_str(&netns.ip(&["-j", "addr", "show", "dev", pod])?)
        .map_err(|e| CniError::new(code::IO, format!("`ip -j addr show dev {pod}`: {e}")))?;
    let present: Vec<String> = shown[0]["addr_info"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| format!("{}/{}", i["local"].as_str().unwrap_or(""), i["prefixlen"]))
                .collect()
        })
        .unwrap_or_default();
    for ip in prev["ips"].as_array().into_iter().flatten() {
        let cidr = ip["address"].as_str().unwrap_or("");
        if !present.iter().any(|p| p == cidr) {
            return Err(drift(format!("{pod} lacks its address {cidr}")));
        }
    }

    // The host's end, up.
    let host_link = link::link_json(None, &host)?
        .ok_or_else(|| drift(format!("the host end {host} of the pod's veth is gone")))?;
    if !is_up(&host_link) {
        return Err(drift(format!("the host end {host} is down")));
    }

    // The switch's record: this pod, its MAC and addresses, on this port, in this tenant.
    let api = Api::new(&conf.socket);
    let name = vm_name(&env.container_id, &env.ifname);
    let vm =
        find_vm(&api, &name)?.ok_or_else(|| drift(format!("the switch has no VM '{name}'")))?;
    let ipv4 = prev["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| !a.contains(':'))
        .and_then(|a| a.split('/').next())
        .unwrap_or("");
    for (field, got, want) in [
        ("tenant", &vm["tenant"], conf.tenant.as_str()),
        ("mac", &vm["mac"], expected_mac),
        ("ip", &vm["ip"], ipv4),
        ("port.ifname", &vm["port"]["ifname"], host.as_str()),
    ] {
        if got.as_str().map(|g| g.eq_ignore_ascii_case(want)) != Some(true) {
            return Err(drift(format!(
                "the switch's VM '{name}' has {field} {got}, the pod {want}"
            )));
        }
    }
    Ok(())
}

fn is_up(link: &Value) -> bool {
    link["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == "UP"))
}

pub fn status(conf: &NetConf) -> Result<()> {
    Api::new(&conf.socket)
        .get_json("/vms")
        .map(drop)
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, e.msg).with_details(e.details))
}

/// Removes the pods of this network's tenant that the plugin attached and the runtime no
/// longer lists (`cni.dev/valid-attachments`; none listed: all), with their veths and
/// addresses (IPAM DEL: host-local has no GC of its own); then the IPAM plugin's GC.
pub fn gc(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let ipam = ipam_of(conf)?;
    let valid = conf
        .valid_attachments
        .as_ref()
        .or(conf.attachments.as_ref())
        .cloned()
        .unwrap_or_default();
    let api = Api::new(&conf.socket);
    let vms = api.get_json("/vms")?;
    for vm in vms.as_array().into_iter().flatten() {
        let name = vm["name"].as_str().unwrap_or("");
        let Some((container_id, ifname)) = attachment_of(name) else {
            continue;
        };
        let listed = valid
            .iter()
            .any(|a| a.container_id == container_id && a.ifname == ifname);
        if vm["tenant"] != conf.tenant.as_str() || listed {
            continue;
        }
        remove_vm(&api, name)?;
        link::delete(&link::host_ifname(container_id, ifname))?;
        ipam::delegate_for("DEL", ipam, env, stdin, Some((container_id, ifname)))?;
    }
    ipam::delegate("GC", ipam, env, stdin)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_name_gives_back_its_attachment() {
        let name = vm_name("cnitool-0e92.2a6-b", "eth0");
        assert_eq!(name, "cni:cnitool-0e92.2a6-b:eth0");
        assert_eq!(attachment_of(&name), Some(("cnitool-0e92.2a6-b", "eth0")));
        assert_eq!(attachment_of("red1"), None);
    }
}
