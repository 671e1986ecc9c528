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
