//! One TCP connection over the TCP model (`crate::tcp`): the lab's `tcp_bulk`, `iperf3` and
//! `transfer` flows, shuffle connections and flow-size traffic. The sender sends what its
//! window allows (waiting for room in its VM ring), the receiver ACKs every segment with a
//! SACK hint and echoes CE; a finished flow records its completion.

use std::sync::Arc;

use super::super::host::{Delivery, VmLoc};
use super::super::stats::{Measurements, Slot};
use super::super::Net;
use super::TcpParams;
use crate::event::{Event, Nanos};
use crate::packet::{Kind, Meta, Proto};
use crate::tcp::{TcpReceiver, TcpSender};

/// Receiver port of the simulator's own TCP flows and shuffles (no lab workload behind them).
const SIM_TCP_PORT: u16 = 5001;

/// Sender's port of connection (application) `a`.
fn src_port(a: u32) -> u16 {
    40000 + (a % 20000) as u16
}

/// A connection from `src` to `dst`.
pub(in crate::world) struct TcpFlow {
    src: VmLoc,
    dst: VmLoc,
    slot: Slot,
    pub sender: TcpSender,
    receiver: TcpReceiver,
    mss: usize,
    start: Nanos,
    /// The sender sends nothing from then on.
    stop: Nanos,
    /// Flows with a tag are recorded in flows.csv (shuffles, flow-size traffic).
    pub tag: Option<Arc<str>>,
    /// Bytes to send (0: unlimited).
    bytes: u64,
    /// Generation of the armed retransmission timer.
    gen: u32,
    /// When the armed retransmission timer fires.
    timer: Option<Nanos>,
    /// Every segment has been acknowledged.
    pub finished: bool,
    /// Receiver port: the lab's for a scenario workload (shaped classes match on it).
    pub port: u16,
}

impl TcpFlow {
    /// A flow of `segments` segments (none: until `stop`), sending from `span.0` to
    /// `span.1`.
    pub fn new(
        src: VmLoc,
        dst: VmLoc,
        slot: Slot,
        segments: Option<u64>,
        span: (Nanos, Nanos),
        tcp: &TcpParams,
    ) -> TcpFlow {
        let mut sender = TcpSender::new(tcp.cc, segments, tcp.min_rto);
        sender.dupack_threshold = tcp.dupack_threshold;
        TcpFlow {
            src,
            dst,
            slot,
            sender,
            receiver: TcpReceiver::default(),
            mss: tcp.mss,
            start: span.0,
            stop: span.1,
            tag: None,
            bytes: segments.unwrap_or(0) * tcp.mss as u64,
            gen: 0,
            timer: None,
            finished: false,
            port: SIM_TCP_PORT,
        }
    }

    /// Sends segment `seq` (app `a`); false if the VM ring or the pool refused it.
    fn send_segment(&self, a: u32, seq: u64, now: Nanos, net: &mut Net, ect: bool) -> bool {
        let meta = Meta {
            app: a,
            kind: Kind::Data,
            ece: false,
            seq,
            sent_ns: now,
            sack: 0,
        };
        let ports = (src_port(a), self.port);
        let to = self.dst.addr;
        net.vm_send(
            now,
            &self.src,
            to,
            Proto::Tcp,
            ports,
            self.mss,
            ect,
            &meta,
            true,
        )
    }

    /// Sends what the window allows (`ect`: ECN-capable), then arms the retransmission
    /// timer if it is due sooner than the armed one.
    pub fn send(&mut self, a: u32, now: Nanos, net: &mut Net, ect: bool) {
        while now < self.stop {
            let Some(seq) = self.sender.next_to_send() else {
                break;
            };
            if !self.send_segment(a, seq, now, net, ect) {
                break;
            }
            self.sender.on_sent(now, seq);
        }
        if let Some(d) = self.sender.rto_deadline {
            if self.timer.is_none_or(|s| s > d) {
                self.gen += 1;
                self.timer = Some(d);
                net.queue.push(d, Event::App(a, self.gen));
            }
        }
    }

    /// The retransmission timer of generation `gen` fires (stale generations are ignored).
    pub fn on_timer(&mut self, a: u32, gen: u32, now: Nanos, net: &mut Net, ect: bool) {
        if gen != self.gen {
            return;
        }
        self.timer = None;
        self.sender.on_timeout(now);
        self.send(a, now, net, ect);
    }

    /// A segment reaches the receiver (it ACKs) or an ACK reaches the sender (it sends on,
    /// or records the flow's completion).
    pub fn on_receive(
        &mut self,
        a: u32,
        now: Nanos,
        d: &Delivery,
        net: &mut Net,
        meas: &mut Measurements,
        ect: bool,
    ) {
        match d.meta.kind {
            Kind::Data => {
                let (ack, newly) = self.receiver.on_data(d.meta.seq);
                let meta = Meta {
                    app: a,
                    kind: Kind::Ack,
                    ece: d.ce,
                    seq: ack,
                    sent_ns: d.meta.sent_ns,
                    sack: d.meta.seq,
                };
                let ports = (self.port, src_port(a));
                let to = self.src.addr;
                net.vm_send(now, &self.dst, to, Proto::Tcp, ports, 0, ect, &meta, false);
                if newly > 0 {
                    let bytes = newly * self.mss as u64;
                    meas.count_rx(self.slot, self.dst.tenant, now, bytes, 0);
                }
            }
            Kind::Ack => {
                let m = &d.meta;
                if let Some(seq) = self.sender.on_ack(now, m.seq, m.sack, m.ece, m.sent_ns) {
                    if self.send_segment(a, seq, now, net, ect) {
                        self.sender.on_sent(now, seq);
                    }
                }
                if self.sender.done() && !self.finished {
                    self.finished = true;
                    self.record_completion(now, meas);
                    return;
                }
                self.send(a, now, net, ect);
            }
            _ => {}
        }
    }

    /// A tagged flow goes to flows.csv; the last flow of a lab transfer completes it.
    fn record_completion(&self, now: Nanos, meas: &mut Measurements) {
        if let Some(tag) = &self.tag {
            let fct_us = (now - self.start) as f64 / 1e3;
            meas.flows.push((tag.to_string(), self.bytes, fct_us));
        } else if let Some(left) = meas.transfer_flows_left.get_mut(&self.slot) {
            // The lab times the last byte's arrival; its ACK is here half an RTT later.
            *left -= 1;
            if *left == 0 {
                let r = meas.result(self.slot);
                r.completion_ns = Some(now - self.start);
                r.active_ns = (now - self.start).max(1);
            }
        }
    }
}
