//! The two-host shape (`picnic bench --two-host`): the generator's frames cross host A's
//! device and host B's device before the sink, over an underlay veth between the hosts:
//!
//! ```text
//! gen: g0 -> host A: t0 [device] u0 -> underlay -> host B: u1 [device] t1 -> sink: s0
//! ```
//!
//! Every device runs once per host, both instances on the device CPU, and each gets the same
//! treatment of the overlay where it has one:
//!
//! - **picnic**: host 1's switch (egress engine: classify, anti-spoofing, admission, WFQ,
//!   pacing, Geneve encap) and host 2's (ingress engine: decap, per-VM queue, CPU-fair WFQ,
//!   EyeQ's receiver with feedback sent back to host 1 over the underlay, Iron), each a
//!   switch of its own in this process. Softirq accounting off on both, as in the lab's
//!   multi-host scenarios (both hosts share one kernel, whose tracepoints would charge each
//!   packet twice).
//! - **bridge**: a Linux bridge per host with a VXLAN device (VNI 100) over the underlay
//!   veth, static fdb and neighbour entries (no flooding, no ARP), host A's HTB class as in
//!   the one-host shape.
//! - **OVS**: one ovsdb-server/ovs-vswitchd pair per host, userspace tunnelling with a VXLAN
//!   port (see [`crate::ovs::OvsRole::Tunnel`]), host A's meter as in the one-host shape.
//! - **raw**: a raw forwarder per host (`t0 -> u0`, `u1 -> t1`), no overlay: the limit of
//!   two userspace hops on that backend.

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result};
use picnic_netns as netns;

use crate::bed::{
    Bed, HOST1_IP, HOST1_MAC, HOST2_IP, HOST2_MAC, PEER_TENANT_DEV, PEER_UPLINK_DEV, TENANT_DEV,
    UPLINK_DEV,
};
use crate::dut::{
    picnic_host_config, raw_forwarder, run_picnic, spawn_thread, static_fdb, Dut, DutKind,
};
use crate::ovs::{Ovs, OvsRole, TunnelEnd};

/// VXLAN network identifier of the bridges' and OVS's tunnel.
const VNI: &str = "100";

/// One emulated host of the shape: its namespace, tenant and underlay devices, its own and
/// its peer's underlay address and MAC.
struct Host<'a> {
    ns: &'a str,
    tenant: &'static str,
    underlay: &'static str,
    mac: &'static str,
    local: Ipv4Addr,
    remote: Ipv4Addr,
    remote_mac: &'static str,
    /// Host A (frames go tenant -> underlay) or host B (underlay -> tenant).
    egress: bool,
}

/// Starts `kind` on both hosts of `bed` (host B first, so host A's first frames find it).
pub fn start(kind: DutKind, bed: &Bed, spin: Duration) -> Result<Dut> {
    let peer = bed
        .peer_ns
        .as_deref()
        .context("two-host bed without host B")?;
    let a = Host {
        ns: &bed.dut_ns,
        tenant: TENANT_DEV,
        underlay: UPLINK_DEV,
        mac: HOST1_MAC,
        local: HOST1_IP.into(),
        remote: HOST2_IP.into(),
        remote_mac: HOST2_MAC,
        egress: true,
    };
    let b = Host {
        ns: peer,
        tenant: PEER_TENANT_DEV,
        underlay: PEER_UPLINK_DEV,
        mac: HOST2_MAC,
        local: HOST2_IP.into(),
        remote: HOST1_IP.into(),
        remote_mac: HOST1_MAC,
        egress: false,
    };
    let on_b = start_host(kind, &b, spin).context("host B")?;
    match start_host(kind, &a, spin).context("host A") {
        Ok(on_a) => Ok(Dut::Pair(Box::new(on_a), Box::new(on_b))),
        Err(e) => {
            let _ = on_b.stop();
            Err(e)
        }
    }
}

fn start_host(kind: DutKind, h: &Host, spin: Duration) -> Result<Dut> {
    match kind {
        DutKind::Raw | DutKind::RawXdp => {
            let xdp = kind == DutKind::RawXdp;
            let devs = if h.egress {
                (h.tenant, h.underlay)
            } else {
                (h.underlay, h.tenant)
            };
            spawn_thread(h.ns, move |stop, tid| {
                raw_forwarder(xdp, spin, devs, stop, tid)
            })
        }
        DutKind::PicnicOn | DutKind::PicnicOff | DutKind::PicnicXdp | DutKind::PicnicFast => {
            let cfg = picnic_host_config(kind, spin, if h.egress { 1 } else { 2 })?;
            spawn_thread(h.ns, move |stop, tid| run_picnic(cfg, stop, tid))
        }
        DutKind::Bridge => {
            vxlan_bridge(h)?;
            Ok(Dut::Kernel(h.ns.to_owned()))
        }
        DutKind::Ovs | DutKind::OvsAfxdp => {
            let end = TunnelEnd {
                tenant: h.tenant,
                underlay: h.underlay,
                underlay_mac: h.mac.to_owned(),
                local: h.local,
                remote: h.remote,
                remote_mac: h.remote_mac.to_owned(),
                egress: h.egress,
            };
            Ok(Dut::Ovs(Ovs::start(
                h.ns,
                kind == DutKind::OvsAfxdp,
                &OvsRole::Tunnel(end),
            )?))
        }
    }
}

/// A Linux bridge joining the tenant device and a VXLAN device over the underlay.
fn vxlan_bridge(h: &Host) -> Result<()> {
    let (local, remote) = (h.local.to_string(), h.remote.to_string());
    netns::add_address(h.ns, h.underlay, &format!("{local}/24"))?;
    netns::ip(
        h.ns,
        &[
            "neigh",
            "replace",
            &remote,
            "lladdr",
            h.remote_mac,
            "dev",
            h.underlay,
            "nud",
            "permanent",
        ],
    )?;
    netns::ip(
        h.ns,
        &[
            "link", "add", "vx0", "type", "vxlan", "id", VNI, "local", &local, "remote", &remote,
            "dev", h.underlay, "dstport", "4789",
        ],
    )?;
    netns::link_up(h.ns, "vx0")?;
    netns::add_bridge(h.ns, "br0")?;
    netns::enslave(h.ns, h.tenant, "br0")?;
    netns::enslave(h.ns, "vx0", "br0")?;
    // The remote VM is behind the tunnel on host A and behind the tenant port on host B.
    static_fdb(h.ns, if h.egress { "vx0" } else { h.tenant })?;
    if h.egress {
        // As in the one-host shape: an HTB class on the uplink that does not bind.
        netns::shape_htb(h.ns, h.underlay, 100_000, 4 << 20)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_configs_put_each_vm_on_its_own_host() {
        for kind in [DutKind::PicnicOn, DutKind::PicnicOff, DutKind::PicnicXdp] {
            let spin = Duration::from_micros(50);
            let h1 = picnic_host_config(kind, spin, 1).unwrap();
            let h2 = picnic_host_config(kind, spin, 2).unwrap();
            let port = |c: &picnic_switch::config::Config, vm: usize| {
                c.vms[vm]
                    .port
                    .as_ref()
                    .map(|p| (p.ifname.clone(), p.backend))
            };
            assert_eq!((h1.switch.host_id, h2.switch.host_id), (1, 2));
            assert_eq!(
                (h1.uplink.ifname.as_str(), h2.uplink.ifname.as_str()),
                (UPLINK_DEV, PEER_UPLINK_DEV)
            );
            assert_eq!(port(&h1, 0).map(|p| p.0), Some(TENANT_DEV.to_string()));
            assert_eq!(port(&h1, 1), None);
            assert_eq!(port(&h2, 0), None);
            assert_eq!(port(&h2, 1).map(|p| p.0), Some(PEER_TENANT_DEV.to_string()));
            assert_eq!(port(&h1, 0).map(|p| p.1), port(&h2, 1).map(|p| p.1));
            assert_eq!(h1.isolation.feedback, kind != DutKind::PicnicOff);
            assert!(!h1.isolation.softirq_accounting && !h2.isolation.softirq_accounting);
        }
    }
}
