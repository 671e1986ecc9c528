//! Proxy ARP: the switch answers a VM's ARP request for another VM of its tenant itself, from
//! the directory, so no broadcast leaves the host.

use etherparse::{ArpHardwareId, ArpOperation, ArpPacket, EtherType, Ethernet2Header};

use super::Engine;
use crate::directory::{PortIdx, VmIdx};
use crate::frame::{Frame, FramePool};

impl Engine {
    /// Turns an ARP request for tenant VM `target` into the reply and sends it back.
    pub(super) fn answer_arp(
        &mut self,
        mut frame: Frame,
        port: PortIdx,
        pool: &mut FramePool,
        req: &picnic_wire::classify::ArpSummary,
        target: VmIdx,
    ) {
        let t = &self.dir.vms[target];
        let reply = ArpPacket::new(
            ArpHardwareId::ETHERNET,
            EtherType::IPV4,
            ArpOperation::REPLY,
            &t.mac.0,
            &t.ip.octets(),
            &req.sender_mac,
            &req.sender_ip.octets(),
        );
        let eth = Ethernet2Header {
            source: t.mac.0,
            destination: req.sender_mac,
            ether_type: EtherType::ARP,
        };
        let Ok(reply) = reply else {
            return pool.put(frame);
        };
        let bytes = reply.to_bytes();
        let buf = frame.buf_for_rx();
        buf[..14].copy_from_slice(&eth.to_bytes());
        buf[14..14 + bytes.len()].copy_from_slice(&bytes);
        // Pad to the Ethernet minimum.
        let len = (14 + bytes.len()).max(60);
        buf[14 + bytes.len()..len].fill(0);
        frame.set_len(len);
        self.counters.arp_replies += 1;
        self.tx[port].push(frame);
    }
}
