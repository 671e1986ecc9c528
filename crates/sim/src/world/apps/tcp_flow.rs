//! One TCP connection over the TCP model (`crate::tcp`): the lab's `tcp_bulk`, `iperf3` and
//! `transfer` flows, shuffle connections and flow-size traffic. The sender sends what its
//! window allows (waiting for room in its VM ring), the receiver ACKs every segment with a
//! SACK hint and echoes CE; a finished flow records its completion.

use std::sync::Arc;

use super::super::host::{Delivery, VmLoc};
use super::super::stats::{FlowRecord, Measurements, Slot};
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
    pub src: VmLoc,
    pub dst: VmLoc,
    pub slot: Slot,
    pub sender: TcpSender,
    receiver: TcpReceiver,
    mss: usize,
    pub start: Nanos,
    /// The sender sends nothing from then on.
    pub stop: Nanos,
    /// Flows with a tag are recorded in flows.csv (shuffles, flow-size traffic).
    pub tag: Option<Arc<str>>,
    /// Bytes to send (0: unlimited).
    pub bytes: u64,
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
        sender.recovery = tcp.recovery;
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
            sack_len: 0,
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
                let block = self.receiver.sack_block(d.meta.seq);
                let meta = Meta {
                    app: a,
                    kind: Kind::Ack,
                    ece: d.ce,
                    seq: ack,
                    sent_ns: d.meta.sent_ns,
                    sack: block.start,
                    sack_len: (block.end - block.start).min(u16::MAX.into()) as u16,
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
                if let Some(seq) = self.sender.on_ack(
                    now,
                    m.seq,
                    m.sack..m.sack + u64::from(m.sack_len),
                    m.ece,
                    m.sent_ns,
                ) {
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
            meas.flows.push(FlowRecord {
                tag: tag.to_string(),
                bytes: self.bytes,
                fct_us: (now - self.start) as f64 / 1e3,
                src: self.src.host,
                dst: self.dst.host,
                start_ns: self.start,
            });
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

#[cfg(test)]
mod tests {
    use super::super::super::testing::{run, workload, world};
    use super::super::App;
    use super::*;

    #[test]
    fn a_transfer_delivers_its_bytes_and_completes_when_its_last_flow_does() {
        let fields = ["flows = 3", "bytes = 100000", "start_ms = 10"];
        let mut w = world(&workload("x", "transfer", "a", "b", &fields), "picnic-off");
        run(&mut w);
        // MSS 1390 (1500 - 70 of Geneve - 40 of IPv4/TCP): 72 segments per flow.
        assert_eq!(w.tcp.mss, 1390);
        let r = &w.meas.results[0][0];
        assert_eq!(r.received_bytes, 3 * 72 * 1390);
        let flows: Vec<&TcpFlow> = w
            .apps
            .iter()
            .filter_map(|a| match a {
                App::Tcp(t) => Some(&**t),
                _ => None,
            })
            .collect();
        assert_eq!(flows.len(), 3);
        assert!(flows
            .iter()
            .all(|t| t.finished && t.sender.retransmits == 0));
        assert_eq!(
            w.meas.transfer_flows_left.values().collect::<Vec<_>>(),
            [&0]
        );
        // 3 x 100 KB over 1 Gb/s takes at least 2.4 ms; idle, well under 50 ms.
        let done = r.completion_ns.expect("completed");
        assert!(done > 2_400_000 && done < 50_000_000, "{done} ns");
        assert_eq!(r.active_ns, done);
        assert!(
            w.meas.flows.is_empty(),
            "untagged flows are not in flows.csv"
        );
    }

    #[test]
    fn a_lab_transfer_completes_with_its_last_flow_and_tagged_flows_go_to_flows_csv() {
        let mut meas = Measurements::new(1, 1_000_000_000, 1);
        let kind = picnic_scenario::WorkloadKind::Transfer;
        let slot = meas.add_result(0, "x", "t", kind, 1, false);
        meas.transfer_flows_left.insert(slot, 3);
        let vm = VmLoc {
            host: 0,
            port: 1,
            addr: crate::packet::Addr {
                mac: [0; 6],
                ip: [0; 4],
            },
            tenant: 0,
        };
        let tcp = TcpParams {
            mss: 1000,
            min_rto: 1,
            dupack_threshold: 3,
            cc: crate::spec::CongestionControl::NewReno,
            recovery: crate::spec::Recovery::Classic,
        };
        let flow = TcpFlow::new(vm, vm, slot, Some(5), (10, 1000), &tcp);
        flow.record_completion(300, &mut meas);
        flow.record_completion(200, &mut meas);
        assert_eq!(
            meas.result(slot).completion_ns,
            None,
            "two of three flows done"
        );
        flow.record_completion(400, &mut meas);
        assert_eq!(meas.result(slot).completion_ns, Some(390));
        assert_eq!(meas.result(slot).active_ns, 390);
        assert!(meas.flows.is_empty());
        let mut tagged = TcpFlow::new(vm, vm, slot, Some(5), (10, 1000), &tcp);
        tagged.tag = Some("web".into());
        tagged.record_completion(2010, &mut meas);
        let rec = &meas.flows[..];
        assert_eq!(rec.len(), 1);
        assert_eq!(
            (rec[0].tag.as_str(), rec[0].bytes, rec[0].fct_us),
            ("web", 5000, 2.0)
        );
        assert_eq!(
            (rec[0].src, rec[0].dst, rec[0].start_ns),
            (vm.host, vm.host, 10)
        );
        assert_eq!(
            meas.transfer_flows_left[&slot], 0,
            "a tagged flow is no transfer's"
        );
    }

    #[test]
    fn a_bulk_flow_sends_nothing_after_its_stop() {
        let fields = ["start_ms = 10", "stop_ms = 100"];
        let mut w = world(&workload("x", "tcp_bulk", "a", "b", &fields), "picnic-off");
        run(&mut w);
        let r = &w.meas.results[0][0];
        let App::Tcp(t) = &w.apps[0] else {
            panic!("a TCP flow")
        };
        assert!(!t.finished, "an unlimited flow never finishes");
        // What it sent arrived: by 100 ms at most the link's goodput (1390 of 1494 wire
        // bytes a segment: 930 Mb/s), after 100 ms only what the 2 ms access queue held.
        assert_eq!(r.received_bytes, t.receiver.rcv_next * 1390);
        let mbps = r.series[1..10].iter().sum::<u64>() as f64 * 8.0 / 90e-3 / 1e6;
        assert!(mbps > 850.0 && mbps <= 930.5, "{mbps} Mb/s");
        assert!(
            r.series[10] > 0 && r.series[10] <= 2 * 125_000,
            "{:?}",
            r.series
        );
        assert!(r.series[11..].iter().all(|&b| b == 0), "{:?}", r.series);
        assert_eq!(src_port(0), 40000);
        assert_eq!(src_port(20001), 40001);
    }
}
