//! The network between hosts: links with a rate, a propagation delay and a bounded queue,
//! switches with a shared buffer (dynamic threshold), routing over a big switch or a
//! leaf-spine fabric with ECMP at the leaves, and ECN marking above a threshold.
//!
//! The fabric only moves [`Pkt`]s between link queues; a packet that reaches a host is handed
//! back to the caller (the host's NIC, see `host.rs`). A packet in the fabric holds its bytes
//! in an allocation of its own size, not in one of the hosts' pool frames (2 KiB each,
//! `picnic_switch::frame::FRAME_CAP`): in frames, a queue of 64-byte floods held 2 KiB per
//! packet.

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use picnic_core::Rate;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::Serialize;

use crate::event::{Event, EventQueue, Nanos};
use crate::spec::{Ecmp, SimSection, TopologyKind};

/// Which part of the network a queue is in (EyeQ 5.4: edge vs core).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Host NIC toward its switch.
    HostUp,
    /// Switch port toward a host (the access link: EyeQ's congestion point).
    Edge,
    /// Leaf-spine and spine-leaf links.
    Core,
}

impl LinkClass {
    /// Every class, in index order (`class as usize`).
    pub const ALL: [LinkClass; 3] = [LinkClass::HostUp, LinkClass::Edge, LinkClass::Core];

    /// Name in sim.json and queues.csv.
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::HostUp => "hostup",
            LinkClass::Edge => "edge",
            LinkClass::Core => "core",
        }
    }
}

/// Where a link ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum To {
    Host(u32),
    Switch(u32),
}

/// A frame in the fabric with what the fabric needs to forward it.
pub(super) struct Pkt {
    /// The frame's bytes, outer headers first.
    pub bytes: Box<[u8]>,
    /// Destination host (global index).
    pub dst: u32,
    /// Flow hash for per-flow ECMP (rotated at every switch so hops choose independently).
    pub hash: u32,
}

/// One direction of a link: a FIFO queue drained at `rate`, then `delay` in flight.
pub(super) struct Link {
    rate: Rate,
    delay: Nanos,
    to: To,
    class: LinkClass,
    /// Switch owning the (shared) buffer this queue lives in; none for a host NIC.
    owner: Option<u32>,
    cap_bytes: u64,
    cap_frames: usize,
    /// Waiting packets, the one being serialized first.
    queue: VecDeque<Pkt>,
    /// Bytes in `queue`.
    bytes: u64,
    busy: bool,
    /// Packets on the wire with their arrival time, oldest first.
    flight: VecDeque<(Nanos, Pkt)>,
}

enum SwitchKind {
    Big,
    Leaf(u32),
    Spine,
}

struct Switch {
    kind: SwitchKind,
    /// Shared buffer, bytes (none: each port only has its own bound).
    buffer: Option<u64>,
    used: u64,
}

/// Links, switches and routes of the deployment, with the fabric's own counters.
pub(super) struct Fabric {
    links: Vec<Link>,
    switches: Vec<Switch>,
    /// Per host, its NIC's link toward its switch.
    pub host_up: Vec<u32>,
    /// Per host, its switch's link toward it (the access link).
    pub host_down: Vec<u32>,
    /// Per leaf, its links to every spine.
    leaf_up: Vec<Vec<u32>>,
    /// Per spine, its links to every leaf.
    spine_down: Vec<Vec<u32>>,
    hosts_per_leaf: u32,
    ecmp: Ecmp,
    /// ECN marking threshold of switch queues, bytes.
    ecn_k: Option<u64>,
    /// Frames dropped at a full queue, per [`LinkClass`] (HostUp: the NIC transmit queue).
    pub drops: [u64; 3],
    /// ECN marks set by switches.
    pub ecn_marks: u64,
    /// Per link class, queue occupancy (bytes + 1) seen by arriving packets.
    pub queue_hist: Vec<Histogram<u64>>,
    /// Per link class, every queue's occupancy (bytes + 1) each sample.
    pub queue_sampled: Vec<Histogram<u64>>,
}

/// Time to serialize `bytes` at `rate`, ns, rounded up.
pub(super) fn ser_ns(bytes: usize, rate: Rate) -> Nanos {
    rate.time_to_send(bytes as u64).as_nanos()
}

fn histograms() -> Vec<Histogram<u64>> {
    LinkClass::ALL
        .iter()
        .map(|_| Histogram::new_with_bounds(1, 1 << 32, 2).expect("valid bounds"))
        .collect()
}

impl Fabric {
    /// The fabric of `sim` for `hosts` hosts: access links at `access` with
    /// `queue_bytes` of buffer, host NICs at `sim.nic_mbps` with `sim.nic_queue_frames`.
    pub fn build(sim: &SimSection, hosts: u32, access: Rate, queue_bytes: u64) -> Fabric {
        let delay = sim.link_delay_ns;
        let nic = sim.nic_rate();
        let buffer = (sim.switch_buffer_kb > 0).then_some(sim.switch_buffer_kb * 1000);
        let mut f = Fabric {
            links: Vec::new(),
            switches: Vec::new(),
            host_up: Vec::new(),
            host_down: Vec::new(),
            leaf_up: Vec::new(),
            spine_down: Vec::new(),
            hosts_per_leaf: sim.hosts_per_leaf.max(1),
            ecmp: sim.ecmp,
            ecn_k: sim.ecn_threshold_kb.map(|k| k * 1000),
            drops: [0; 3],
            ecn_marks: 0,
            queue_hist: histograms(),
            queue_sampled: histograms(),
        };
        // A switch port is bounded in bytes (and by its switch's buffer), a NIC in frames.
        let link = |f: &mut Fabric, rate, to, class, owner: Option<u32>| {
            f.links.push(Link {
                rate,
                delay,
                to,
                class,
                owner,
                cap_bytes: if owner.is_some() {
                    queue_bytes
                } else {
                    u64::MAX
                },
                cap_frames: if owner.is_some() {
                    usize::MAX
                } else {
                    sim.nic_queue_frames
                },
                queue: VecDeque::new(),
                bytes: 0,
                busy: false,
                flight: VecDeque::new(),
            });
            (f.links.len() - 1) as u32
        };
        let switch = |kind| Switch {
            kind,
            buffer,
            used: 0,
        };
        match sim.topology {
            TopologyKind::BigSwitch => {
                f.switches.push(switch(SwitchKind::Big));
                for h in 0..hosts {
                    let up = link(&mut f, nic, To::Switch(0), LinkClass::HostUp, None);
                    let down = link(&mut f, access, To::Host(h), LinkClass::Edge, Some(0));
                    f.host_up.push(up);
                    f.host_down.push(down);
                }
            }
            TopologyKind::LeafSpine => {
                let leaves = hosts.div_ceil(f.hosts_per_leaf);
                let spines = sim.spines;
                let core = Rate::from_bps(
                    (f.hosts_per_leaf as f64 * access.bps() as f64
                        / (spines as f64 * sim.oversubscription)) as u64,
                );
                for l in 0..leaves {
                    f.switches.push(switch(SwitchKind::Leaf(l)));
                }
                for _ in 0..spines {
                    f.switches.push(switch(SwitchKind::Spine));
                }
                for h in 0..hosts {
                    let l = h / f.hosts_per_leaf;
                    let up = link(&mut f, nic, To::Switch(l), LinkClass::HostUp, None);
                    let down = link(&mut f, access, To::Host(h), LinkClass::Edge, Some(l));
                    f.host_up.push(up);
                    f.host_down.push(down);
                }
                for l in 0..leaves {
                    let ups = (0..spines)
                        .map(|s| {
                            let to = To::Switch(leaves + s);
                            link(&mut f, core, to, LinkClass::Core, Some(l))
                        })
                        .collect();
                    f.leaf_up.push(ups);
                }
                for s in 0..spines {
                    let downs = (0..leaves)
                        .map(|l| {
                            let to = To::Switch(l);
                            link(&mut f, core, to, LinkClass::Core, Some(leaves + s))
                        })
                        .collect();
                    f.spine_down.push(downs);
                }
            }
        }
        f
    }

    /// Packets queued or in flight on any link.
    pub fn held(&self) -> u64 {
        self.links
            .iter()
            .map(|l| (l.queue.len() + l.flight.len()) as u64)
            .sum()
    }

    /// Records every queue's occupancy (host NIC queues included) in its class.
    pub fn sample_queues(&mut self) {
        for link in &self.links {
            let _ = self.queue_sampled[link.class as usize].record(link.bytes + 1);
        }
    }

    /// Puts a packet on link `l`'s queue, or drops it (counted) when the queue's bound or
    /// its switch's free buffer is exceeded.
    pub fn enqueue(&mut self, l: u32, mut pkt: Pkt, now: Nanos, queue: &mut EventQueue) {
        let link = &mut self.links[l as usize];
        let len = pkt.bytes.len() as u64;
        let mut fits = link.bytes + len <= link.cap_bytes && link.queue.len() < link.cap_frames;
        if let Some(o) = link.owner {
            let sw = &self.switches[o as usize];
            if let Some(b) = sw.buffer {
                // Dynamic threshold (alpha = 1): a port may hold at most the free buffer.
                fits &= sw.used + len <= b && link.bytes + len <= b - sw.used;
            }
        }
        let class = link.class;
        if !fits {
            self.drops[class as usize] += 1;
            return;
        }
        let _ = self.queue_hist[class as usize].record(link.bytes + 1);
        if let (Some(k), Some(_)) = (self.ecn_k, link.owner) {
            if link.bytes > k && picnic_wire::ecn::mark_ce(&mut pkt.bytes) {
                self.ecn_marks += 1;
            }
        }
        link.bytes += len;
        if let Some(o) = link.owner {
            self.switches[o as usize].used += len;
        }
        link.queue.push_back(pkt);
        if !link.busy {
            link.busy = true;
            let at = now + ser_ns(len as usize, link.rate);
            queue.push(at, Event::LinkTxDone(l));
        }
    }

    /// Link `l` finished serializing its head packet: it goes in flight, the next starts.
    pub fn tx_done(&mut self, l: u32, now: Nanos, queue: &mut EventQueue) {
        let link = &mut self.links[l as usize];
        let Some(pkt) = link.queue.pop_front() else {
            link.busy = false;
            return;
        };
        let len = pkt.bytes.len() as u64;
        link.bytes -= len;
        if let Some(o) = link.owner {
            self.switches[o as usize].used -= len;
        }
        link.flight.push_back((now + link.delay, pkt));
        queue.push(now + link.delay, Event::LinkArrive(l));
        match link.queue.front() {
            Some(next) => {
                let at = now + ser_ns(next.bytes.len(), link.rate);
                queue.push(at, Event::LinkTxDone(l));
            }
            None => link.busy = false,
        }
    }

    /// The oldest packet in flight on link `l` arrives: a switch forwards it to its next
    /// link; at a host, `(host, bytes)` is returned for its NIC.
    pub fn arrive(
        &mut self,
        l: u32,
        now: Nanos,
        queue: &mut EventQueue,
        rng: &mut SmallRng,
    ) -> Option<(u32, Box<[u8]>)> {
        let link = &mut self.links[l as usize];
        let (_, mut pkt) = link.flight.pop_front()?;
        match link.to {
            To::Host(h) => Some((h, pkt.bytes)),
            To::Switch(s) => {
                let next = self.route(s, &pkt, rng);
                pkt.hash = pkt.hash.rotate_left(7);
                self.enqueue(next, pkt, now, queue);
                None
            }
        }
    }

    /// The link switch `s` sends `pkt` on: down to its host, or up a leaf's uplink chosen by
    /// ECMP (flow hash, or `rng` per packet), or down from a spine to the host's leaf.
    fn route(&self, s: u32, pkt: &Pkt, rng: &mut SmallRng) -> u32 {
        let dst_leaf = pkt.dst / self.hosts_per_leaf;
        match self.switches[s as usize].kind {
            SwitchKind::Big => self.host_down[pkt.dst as usize],
            SwitchKind::Leaf(l) if l == dst_leaf => self.host_down[pkt.dst as usize],
            SwitchKind::Leaf(l) => {
                let ups = &self.leaf_up[l as usize];
                let i = match self.ecmp {
                    Ecmp::PerFlow => pkt.hash as usize % ups.len(),
                    Ecmp::PerPacket => rng.gen_range(0..ups.len()),
                };
                ups[i]
            }
            SwitchKind::Spine => {
                let spine = s as usize - self.leaf_up.len();
                self.spine_down[spine][dst_leaf as usize]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{self, Addr, Kind, Meta, Proto};
    use picnic_switch::frame::FramePool;
    use rand::SeedableRng;

    const GBPS: Rate = Rate::from_gbps(1);

    /// `[sim]` defaults (10 Gb/s NICs, 1 us links, 4 MB shared buffers) with `f` applied.
    fn sim(f: impl FnOnce(&mut SimSection)) -> SimSection {
        let mut s = SimSection::default();
        f(&mut s);
        s
    }

    /// A packet of `len` bytes of zeros to host `dst`.
    fn pkt(len: usize, dst: u32, hash: u32) -> Pkt {
        Pkt {
            bytes: vec![0; len].into(),
            dst,
            hash,
        }
    }

    /// Runs the fabric's events until none is left; every arrival at a host as (time, host).
    fn drain(f: &mut Fabric, q: &mut EventQueue) -> Vec<(Nanos, u32)> {
        let mut rng = SmallRng::seed_from_u64(0);
        let mut arrivals = Vec::new();
        while let Some((now, ev)) = q.pop() {
            match ev {
                Event::LinkTxDone(l) => f.tx_done(l, now, q),
                Event::LinkArrive(l) => {
                    if let Some((h, _)) = f.arrive(l, now, q, &mut rng) {
                        arrivals.push((now, h));
                    }
                }
                other => panic!("not a fabric event: {other:?}"),
            }
        }
        arrivals
    }

    #[test]
    fn a_link_serializes_back_to_back_at_its_rate_then_adds_its_delay() {
        let mut f = Fabric::build(&sim(|_| {}), 2, GBPS, 1_000_000);
        let mut q = EventQueue::default();
        let down = f.host_down[1];
        for _ in 0..3 {
            let p = pkt(1250, 1, 0);
            f.enqueue(down, p, 0, &mut q);
        }
        // 1250 B at 1 Gb/s is 10 us each, then 1 us of propagation.
        let arrivals = drain(&mut f, &mut q);
        assert_eq!(arrivals, vec![(11_000, 1), (21_000, 1), (31_000, 1)]);
        assert_eq!(f.links[down as usize].bytes, 0);
        assert_eq!(f.switches[0].used, 0);
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn a_packet_crosses_nic_switch_and_access_link_in_the_sum_of_their_times() {
        let mut f = Fabric::build(&sim(|_| {}), 2, GBPS, 1_000_000);
        let mut q = EventQueue::default();
        let p = pkt(1250, 1, 0);
        f.enqueue(f.host_up[0], p, 5_000, &mut q);
        // NIC 10 Gb/s: 1 us + 1 us delay; access 1 Gb/s: 10 us + 1 us delay.
        assert_eq!(drain(&mut f, &mut q), vec![(18_000, 1)]);
    }

    #[test]
    fn leaf_spine_paths_take_two_core_hops_at_the_core_rate() {
        // 4 hosts, 2 per leaf, 4 spines: core links at 2 x 1 Gb/s / 4 = 500 Mb/s.
        let s = sim(|s| {
            s.topology = TopologyKind::LeafSpine;
            s.hosts_per_leaf = 2;
            s.spines = 4;
        });
        let mut f = Fabric::build(&s, 4, GBPS, 1_000_000);
        assert_eq!(
            (f.switches.len(), f.leaf_up.len(), f.spine_down.len()),
            (6, 2, 4)
        );
        let mut q = EventQueue::default();
        let far = pkt(1250, 3, 0);
        f.enqueue(f.host_up[0], far, 0, &mut q);
        let near = pkt(1250, 1, 0);
        f.enqueue(f.host_up[0], near, 0, &mut q);
        // Near (same leaf): NIC 1 us behind the first, +1 us, access 10 + 1 us = 14 us.
        // Far: NIC 1 + 1, core 20 + 1, core 20 + 1, access 10 + 1 = 55 us.
        let arrivals = drain(&mut f, &mut q);
        assert_eq!(arrivals, vec![(14_000, 1), (55_000, 3)]);
    }

    #[test]
    fn a_switch_port_drops_beyond_its_byte_bound() {
        let s = sim(|s| s.switch_buffer_kb = 0);
        let mut f = Fabric::build(&s, 2, GBPS, 3000);
        let mut q = EventQueue::default();
        let down = f.host_down[1];
        for _ in 0..4 {
            let p = pkt(1000, 1, 0);
            f.enqueue(down, p, 0, &mut q);
        }
        assert_eq!(f.drops, [0, 1, 0]);
        assert_eq!(f.held(), 3, "the dropped packet is gone");
        assert_eq!(drain(&mut f, &mut q).len(), 3);
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn a_nic_queue_drops_beyond_its_frame_bound() {
        let s = sim(|s| s.nic_queue_frames = 2);
        let mut f = Fabric::build(&s, 2, GBPS, 1_000_000);
        let mut q = EventQueue::default();
        for _ in 0..3 {
            let p = pkt(64, 1, 0);
            f.enqueue(f.host_up[0], p, 0, &mut q);
        }
        assert_eq!(f.drops, [1, 0, 0]);
        assert_eq!(drain(&mut f, &mut q).len(), 2);
    }

    #[test]
    fn a_port_of_a_shared_buffer_holds_at_most_the_free_buffer() {
        // 4,000 B shared: port 1 stops at 2,000 B (2,000 + 1,000 > 4,000 - 2,000); port 0
        // then gets 1,000 B of the 2,000 left.
        let s = sim(|s| s.switch_buffer_kb = 4);
        let mut f = Fabric::build(&s, 2, GBPS, 1_000_000);
        let mut q = EventQueue::default();
        for dst in [1, 1, 1, 0, 0] {
            let p = pkt(1000, dst, 0);
            f.enqueue(f.host_down[dst as usize], p, 0, &mut q);
        }
        assert_eq!(f.links[f.host_down[1] as usize].bytes, 2000);
        assert_eq!(f.links[f.host_down[0] as usize].bytes, 1000);
        assert_eq!(f.switches[0].used, 3000);
        assert_eq!(f.drops, [0, 2, 0]);
    }

    #[test]
    fn switches_mark_ect_frames_ce_above_the_threshold_and_nothing_else() {
        let s = sim(|s| s.ecn_threshold_kb = Some(1));
        let mut f = Fabric::build(&s, 2, GBPS, 1_000_000);
        let mut q = EventQueue::default();
        let addr = |i| Addr {
            mac: [2, 0, 0, 0, 0, i],
            ip: [10, 0, 0, i],
        };
        let meta = Meta {
            app: 0,
            kind: Kind::Data,
            ece: false,
            seq: 0,
            sent_ns: 0,
            sack: 0,
            sack_len: 0,
        };
        // 1,000-byte IPv4/UDP frames; the third and fourth find 2,000 and 3,000 B queued.
        let mut pool = FramePool::new(1);
        let mut send = |f: &mut Fabric, link: u32, ect: bool| {
            let mut frame = pool.get().unwrap();
            assert!(packet::build(
                &mut frame,
                addr(1),
                addr(2),
                Proto::Udp,
                (1, 2),
                958,
                ect,
                &meta
            ));
            assert_eq!(frame.len(), 1000);
            let bytes = frame.data().into();
            pool.put(frame);
            f.enqueue(
                link,
                Pkt {
                    bytes,
                    dst: 1,
                    hash: 0,
                },
                0,
                &mut q,
            );
        };
        let down = f.host_down[1];
        for ect in [true, true, true, false] {
            send(&mut f, down, ect);
        }
        // A host NIC never marks, however full.
        let up = f.host_up[0];
        for _ in 0..3 {
            send(&mut f, up, true);
        }
        assert_eq!(f.ecn_marks, 1);
        let ce: Vec<bool> = f.links[down as usize]
            .queue
            .iter()
            .map(|p| packet::parse(&p.bytes).unwrap().1)
            .collect();
        assert_eq!(ce, [false, false, true, false]);
    }

    fn leaf_spine(ecmp: Ecmp) -> Fabric {
        let s = sim(|s| {
            s.topology = TopologyKind::LeafSpine;
            s.hosts_per_leaf = 2;
            s.spines = 4;
            s.ecmp = ecmp;
        });
        Fabric::build(&s, 4, GBPS, 1_000_000)
    }

    #[test]
    fn per_flow_ecmp_picks_the_uplink_by_the_flow_hash() {
        let f = leaf_spine(Ecmp::PerFlow);
        let mut rng = SmallRng::seed_from_u64(0);
        for hash in [0, 1, 2, 3, 7, 0x8000_0001, u32::MAX] {
            let p = pkt(64, 3, hash);
            let up = f.route(0, &p, &mut rng);
            assert_eq!(up, f.leaf_up[0][hash as usize % 4], "hash {hash:#x}");
            // Same hash, same uplink: a flow stays on one path.
            assert_eq!(f.route(0, &p, &mut rng), up);
            // The destination's own leaf sends it down; a spine to the destination's leaf.
            assert_eq!(f.route(1, &p, &mut rng), f.host_down[3]);
            assert_eq!(f.route(2 + 3, &p, &mut rng), f.spine_down[3][1]);
        }
    }

    #[test]
    fn per_packet_ecmp_sprays_from_the_rng_so_a_seed_repeats_its_choices() {
        let f = leaf_spine(Ecmp::PerPacket);
        let p = pkt(64, 3, 42);
        let choices = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..64)
                .map(|_| f.route(0, &p, &mut rng))
                .collect::<Vec<_>>()
        };
        let a = choices(1);
        assert_eq!(a, choices(1));
        assert_ne!(a, choices(2));
        for up in &f.leaf_up[0] {
            assert!(a.contains(up), "uplink {up} never chosen in {a:?}");
        }
    }
}
