//! An open-loop RPC probe (the lab's `rpc`, and its `sockperf` and `memcached` probes): a
//! request of `size` bytes every `interval` until `stop`; the server answers each at once;
//! a response later than `timeout` counts as lost, as the lab's probe does.

use super::super::host::{Delivery, VmLoc};
use super::super::stats::{Measurements, Slot};
use super::super::Net;
use crate::event::Nanos;
use crate::packet::{Kind, Meta, Proto};

/// Source port of every probe's client.
const CLIENT_PORT: u16 = 30001;

/// An RPC client on `client` and its server on `server`.
pub(in crate::world) struct RpcProbe {
    pub client: VmLoc,
    pub server: VmLoc,
    pub slot: Slot,
    /// UDP, or TCP framing (one segment per request, never retransmitted).
    pub proto: Proto,
    /// Request and response payload, bytes.
    pub size: usize,
    /// Time between requests, ns.
    pub interval: Nanos,
    pub stop: Nanos,
    pub timeout: Nanos,
    /// Requests sent so far.
    pub seq: u64,
    /// Server port, the lab's.
    pub port: u16,
}

impl RpcProbe {
    /// Sends the next request (app `a`) and sets the next timer.
    pub fn on_timer(&mut self, a: u32, now: Nanos, net: &mut Net, meas: &mut Measurements) {
        if now >= self.stop {
            return;
        }
        self.seq += 1;
        let ports = (CLIENT_PORT, self.port);
        let (from, to) = (self.client, self.server.addr);
        let (seq, proto, size, interval) = (self.seq, self.proto, self.size, self.interval);
        if net.send_periodic(
            now,
            a,
            Kind::Request,
            seq,
            &from,
            to,
            proto,
            ports,
            size,
            interval,
        ) {
            meas.result(self.slot).sent += 1;
        }
    }

    /// The server answers a request; the client records a timely response's latency.
    pub fn on_receive(&mut self, now: Nanos, d: &Delivery, net: &mut Net, meas: &mut Measurements) {
        match d.meta.kind {
            Kind::Request => {
                let meta = Meta {
                    kind: Kind::Response,
                    ..d.meta
                };
                let (from, to, ports) = (&self.server, self.client.addr, (self.port, CLIENT_PORT));
                net.vm_send(
                    now, from, to, self.proto, ports, self.size, false, &meta, false,
                );
            }
            Kind::Response => {
                let latency = now - d.meta.sent_ns;
                if latency <= self.timeout {
                    if let Some(h) = meas.result(self.slot).latency.as_mut() {
                        let _ = h.record(latency.max(1));
                    }
                    let (tenant, size) = (self.client.tenant, self.size as u64);
                    meas.count_rx(self.slot, tenant, now, size, 1);
                }
            }
            _ => {}
        }
    }
}
