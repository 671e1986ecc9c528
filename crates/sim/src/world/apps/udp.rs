//! A paced UDP stream (the lab's `udp_flood` and `on_off`): one datagram every `interval`
//! until `stop`, silent in the off part of each on/off period; the receiver counts what
//! arrives.

use super::super::host::{Delivery, VmLoc};
use super::super::stats::{Measurements, Slot};
use super::super::Net;
use crate::event::{Event, Nanos};
use crate::packet::{Kind, Proto};

/// Source port of every stream.
const SRC_PORT: u16 = 30000;

/// A UDP stream from `src` to `dst`.
pub(in crate::world) struct UdpStream {
    pub src: VmLoc,
    pub dst: VmLoc,
    pub slot: Slot,
    /// Payload per datagram, bytes.
    pub size: usize,
    /// Time between datagrams, ns.
    pub interval: Nanos,
    pub stop: Nanos,
    /// On/off pattern: (start, on, off), ns; sends only in the first `on` of each period.
    pub on_off: Option<(Nanos, Nanos, Nanos)>,
    /// Datagrams sent so far.
    pub seq: u64,
    /// Receiver port, the lab's (shaped classes match on it).
    pub port: u16,
}

impl UdpStream {
    /// Sends the next datagram (app `a`) and sets the next timer, or in an off phase sets
    /// the timer to the next on phase.
    pub fn on_timer(&mut self, a: u32, now: Nanos, net: &mut Net, meas: &mut Measurements) {
        if now >= self.stop {
            return;
        }
        if let Some((start, on, off)) = self.on_off {
            let period = on + off;
            let phase = (now - start) % period.max(1);
            if phase >= on {
                let next = now - phase + period;
                net.queue.push(next, Event::App(a, 0));
                return;
            }
        }
        self.seq += 1;
        let ports = (SRC_PORT, self.port);
        let (from, to) = (self.src, self.dst.addr);
        let (seq, size, interval) = (self.seq, self.size, self.interval);
        if net.send_periodic(
            now,
            a,
            Kind::Data,
            seq,
            &from,
            to,
            Proto::Udp,
            ports,
            size,
            interval,
        ) {
            meas.result(self.slot).sent += 1;
        }
    }

    /// A datagram arrived at the receiver.
    pub fn on_receive(&mut self, now: Nanos, d: &Delivery, meas: &mut Measurements) {
        if d.meta.kind == Kind::Data {
            meas.count_rx(self.slot, self.dst.tenant, now, self.size as u64, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::{run, workload, world};

    /// 1,000 datagrams/s of 200 B from 100 to 200 ms, of `kind` with `extra` fields.
    fn stream(kind: &str, extra: &[&str]) -> String {
        let mut fields = vec![
            "rate_pps = 1000",
            "size = 200",
            "start_ms = 100",
            "stop_ms = 200",
        ];
        fields.extend(extra);
        workload("u", kind, "a", "b", &fields)
    }

    #[test]
    fn a_stream_sends_one_datagram_per_interval_until_it_stops() {
        let mut w = world(&stream("udp_flood", &[]), "picnic-off");
        run(&mut w);
        let r = &w.meas.results[0][0];
        // 1 ms apart from 100 ms to 199 ms, all delivered over an idle 1 Gb/s network.
        assert_eq!(
            (r.sent, r.received, r.received_bytes),
            (100, 100, 100 * 200)
        );
        // In the lab's 10 ms bins: 10 per bin from 100 ms (arrivals a few us after sending).
        assert_eq!(
            &r.series[9..21],
            &[0, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 0]
        );
    }

    #[test]
    fn an_on_off_stream_is_silent_in_its_off_phases() {
        let text = stream("on_off", &["on_ms = 10", "off_ms = 30"]);
        let mut w = world(&text, "picnic-off");
        run(&mut w);
        let r = &w.meas.results[0][0];
        // On in [100, 110), [140, 150), [180, 190) ms: 3 x 10 datagrams.
        assert_eq!((r.sent, r.received), (30, 30));
        let busy: Vec<usize> = (0..r.series.len()).filter(|&b| r.series[b] > 0).collect();
        assert_eq!(busy, [10, 14, 18]);
    }
}
