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

#[cfg(test)]
mod tests {
    use super::super::super::testing::{run, workload, world};

    const PROBE: &str = r#"
[[workloads]]
name = "p"
kind = "rpc"
from = "a"
to = "b"
rate_pps = 500
size = 100
start_ms = 100
stop_ms = 200
timeout_ms = 1
"#;

    #[test]
    fn every_request_on_an_idle_network_is_answered_and_timed() {
        let mut w = world(PROBE, "picnic-off");
        run(&mut w);
        let r = &w.meas.results[0][0];
        assert_eq!((r.sent, r.received, r.received_bytes), (50, 50, 50 * 100));
        let h = r.latency.as_ref().unwrap();
        assert_eq!(h.len(), 50);
        // Two links each way, 1 us of propagation each, plus serialization and the hosts'
        // processing; nothing queues, so every round trip takes about as long.
        let (min, max) = (h.min(), h.max());
        assert!(min > 4_000 && max < 20_000, "{min}..{max} ns");
        assert!(max - min < 1_000, "{min}..{max} ns: something queued");
    }

    #[test]
    fn responses_later_than_the_timeout_count_as_lost() {
        // A flood at 2.2 Gb/s into b's 1 Gb/s access link (2 ms of buffer) without
        // isolation: the requests that are not dropped wait about 2 ms there.
        let fields = [
            "rate_pps = 200000",
            "size = 1400",
            "start_ms = 50",
            "stop_ms = 250",
        ];
        let flood = workload("f", "udp_flood", "c", "b", &fields);
        let answered = |timeout_ms: u64| {
            let probe = PROBE.replace("timeout_ms = 1\n", &format!("timeout_ms = {timeout_ms}\n"));
            let mut w = world(&format!("{probe}{flood}"), "picnic-off");
            run(&mut w);
            assert!(
                w.net.fabric.drops[1] > 0,
                "the flood overflows b's access link"
            );
            let r = &w.meas.results[0][0];
            assert_eq!(r.sent, 50);
            let h = r.latency.as_ref().unwrap();
            assert_eq!(h.len(), r.received, "only timely responses are timed");
            (r.received, h.min(), h.max())
        };
        // With 100 ms to wait, some come back, all later than 1 ms.
        let (received, min, max) = answered(100);
        assert!(received > 0, "no request survived the flood");
        assert!(min > 1_000_000 && max < 100_000_000, "{min}..{max} ns");
        // With 1 ms, the same responses are lost.
        assert_eq!(answered(1).0, 0);
    }
}
