//! The testbed: its namespaces, links, device names and addresses.
//!
//! Two path shapes, the same for every device of a run:
//!
//! - **one host** (the default): `gen` namespace (device `g0`) --veth--> `dut` namespace
//!   (tenant port `t0`, uplink `u0`) --veth--> `sink` namespace (device `s0`). The device
//!   under test forwards `t0 -> u0` and nothing else differs between runs. picnic is
//!   measured as one host's switch with the generator as its local VM and the sink as the
//!   fabric: its egress engine (classify, anti-spoofing, admission, WFQ, pacing, Geneve
//!   encap) is one forwarding pass, as the raw forwarder's, the bridge's and OVS's are.
//! - **two hosts** (`--two-host`, see [`crate::twohost`]): `gen` --veth--> host A (`t0`,
//!   `u0`) --underlay veth--> host B (`u1`, `t1`) --veth--> `sink`: each device runs twice,
//!   once per host, and the frames cross an encapsulating and a decapsulating pass.

use anyhow::Result;
use picnic_netns::{self as netns, Testbed};
use picnic_switch::config::Mac;

/// Generator device (sender namespace).
pub const GEN_DEV: &str = "g0";
/// Tenant port of the device under test.
pub const TENANT_DEV: &str = "t0";
/// Uplink of the device under test.
pub const UPLINK_DEV: &str = "u0";
/// Sink device (receiver namespace).
pub const SINK_DEV: &str = "s0";
/// Two-host shape: host B's uplink (the underlay peer of `u0`) and its tenant port (the
/// sink's peer).
pub const PEER_UPLINK_DEV: &str = "u1";
pub const PEER_TENANT_DEV: &str = "t1";
/// Underlay MACs of hosts 1 (`u0`) and 2 (`u1`).
pub const HOST1_MAC: &str = "02:00:00:00:00:01";
pub const HOST2_MAC: &str = "02:00:00:00:00:02";
/// Underlay addresses of hosts 1 and 2.
pub const HOST1_IP: [u8; 4] = [198, 18, 0, 1];
pub const HOST2_IP: [u8; 4] = [198, 18, 0, 2];
/// MTU of every link: room for 1500 B tenant frames plus picnic's encapsulation.
pub const LINK_MTU: u32 = 1600;
/// CPU the device under test is pinned to (the generator gets CPU 0).
pub const DUT_CPU: usize = 1;

/// The tenant VM (the generator) and the remote VM its frames go to.
pub const VM_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 1];
pub const VM_IP: [u8; 4] = [10, 0, 0, 1];
pub const REMOTE_MAC: [u8; 6] = [0x02, 0, 0, 0, 2, 1];
pub const REMOTE_IP: [u8; 4] = [10, 0, 0, 2];

/// The namespaces and links of one bench run.
pub struct Bed {
    pub gen_ns: String,
    /// The device's namespace (host A in the two-host shape).
    pub dut_ns: String,
    /// Host B's namespace in the two-host shape.
    pub peer_ns: Option<String>,
    pub sink_ns: String,
    _testbed: Testbed,
}

impl Bed {
    /// Builds the namespaces and veth pairs of the one-host shape, or of the two-host shape
    /// with `two_host`; tx checksum offload off on every device but the sink's (userspace
    /// forwarders pass frames as they are, DESIGN.md 7).
    pub fn new(two_host: bool) -> Result<Bed> {
        let mut tb = Testbed::new()?;
        let gen_ns = tb.add_namespace("bgen")?;
        let dut_ns = tb.add_namespace(if two_host { "bhosta" } else { "bdut" })?;
        let peer_ns = if two_host {
            Some(tb.add_namespace("bhostb")?)
        } else {
            None
        };
        let sink_ns = tb.add_namespace("bsink")?;
        let mac = |b: [u8; 6]| Mac(b).to_string();
        let mut links = vec![
            (&gen_ns, GEN_DEV, mac(VM_MAC)),
            (&dut_ns, TENANT_DEV, "02:00:00:00:00:0a".to_string()),
            (&dut_ns, UPLINK_DEV, HOST1_MAC.to_string()),
        ];
        netns::add_veth(&gen_ns, GEN_DEV, &dut_ns, TENANT_DEV)?;
        let last_hop = match &peer_ns {
            None => (&dut_ns, UPLINK_DEV),
            Some(peer) => {
                netns::add_veth(&dut_ns, UPLINK_DEV, peer, PEER_UPLINK_DEV)?;
                links.push((peer, PEER_UPLINK_DEV, HOST2_MAC.to_string()));
                links.push((peer, PEER_TENANT_DEV, "02:00:00:00:00:0b".to_string()));
                (peer, PEER_TENANT_DEV)
            }
        };
        netns::add_veth(last_hop.0, last_hop.1, &sink_ns, SINK_DEV)?;
        for (ns, dev, mac) in &links {
            netns::configure_link(ns, dev, mac, LINK_MTU)?;
            netns::tx_offload_off(ns, dev)?;
        }
        netns::configure_link(&sink_ns, SINK_DEV, "02:00:00:00:00:99", LINK_MTU)?;
        Ok(Bed {
            gen_ns,
            dut_ns,
            peer_ns,
            sink_ns,
            _testbed: tb,
        })
    }
}
