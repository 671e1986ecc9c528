//! The run loop's side of the kernel fast path (docs/switch.md "Two paths"): registers the
//! switch's AF_PACKET ports and the deployment's destinations with the programs
//! (`crate::fastpath`), and after each busy pass (at most every [`SYNC_EVERY`]) writes what
//! the engine allows each VM (`engine::fastpath`), handing VMs back to the kernel once their
//! frames have left the engines.

use std::collections::HashMap;
use std::io;

use picnic_core::{Duration, Instant};

use crate::config::Backend;
use crate::engine::fastpath::{FastArrival, FastPathWant, Handback, RingCounts, Step};
use crate::engine::Engine;
use crate::fastpath::{kernel_clock_ns, Arrivals, Destination, DestinationLimit, KernelFastPath};
use crate::frame::FramePool;
use crate::port::Port;

/// How often the loop syncs while busy; a VM waiting to be handed back keeps the loop's
/// wait this short.
const SYNC_EVERY: Duration = Duration::from_micros(100);
/// How often destinations (live changes, feedback limiters) are refreshed.
const REFRESH_EVERY: Duration = Duration::from_millis(1);
/// How often the kernel's arrivals are read into the EyeQ receivers: within each meter
/// window (at least 200 us, `engine::ingress`), so a window's rate holds its own arrivals.
const METER_EVERY: Duration = Duration::from_micros(100);
/// While the kernel forwards to local VMs at a quarter of the access link or more (within
/// [`METER_QUIET`] of such a read), the loop wakes at least this often to meter it: the link
/// may be congested, and the receivers' rates should move every window or two. Below that
/// a read when the loop wakes anyway is enough (an endpoint read late stays active until its
/// last arrival): each wake costs the loop a pass, ~20 us (in the two-host bench at 13 kpps,
/// a wake every 500 us cost 2.3x the bridge's CPU per packet).
const METER_WAKE: Duration = Duration::from_micros(500);
const METER_QUIET: Duration = Duration::from_millis(100);
/// How often the VMs' rates (receive buckets at their allotments) are written when nothing
/// else makes the loop sync.
const RATES_EVERY: Duration = Duration::from_millis(5);

/// Frames a VM port's ring may hold before the kernel drops the VM's frames to hand over
/// instead (`shedding` in fastpath.bpf.c): seven eighths of the default ring, so the
/// bound is met before the ring overflows even when the loop's count, as the kernel has it,
/// is a sync and [`RING_WRITE_STEP`] entries old.
const RING_BACKLOG: u64 = (super::idle::RING_SLOTS - super::idle::RING_SLOTS / 8) as u64;
/// Ring entries the loop takes before it tells the kernel again.
const RING_WRITE_STEP: u64 = (super::idle::RING_SLOTS / 32) as u64;

pub(crate) struct FastPathLink {
    kernel: KernelFastPath,
    handback: Handback,
    /// Per port slot: the device's ifindex once registered.
    registered: Vec<Option<u32>>,
    destinations: HashMap<(u32, [u8; 6]), Destination>,
    wants: Vec<FastPathWant>,
    rings: Vec<RingCounts>,
    next_sync: Instant,
    next_refresh: Instant,
    /// Some VM may take the fast path but has not been handed back yet.
    pending: bool,
    /// The kernel's arrival totals at the last read, the read's scratch, and what arrived
    /// since the read before.
    arrived: HashMap<(u32, std::net::Ipv4Addr, [u8; 6]), Arrivals>,
    arrivals: Vec<Arrivals>,
    fresh: Vec<FastArrival>,
    /// The kernel clock's reading at the engines' `Instant::ZERO`.
    kernel_zero_ns: u64,
    next_meter: Instant,
    /// When the kernel last forwarded to local VMs at a quarter of the link or more, as of
    /// the reads, and when the arrivals were last read.
    last_busy_arrival: Option<Instant>,
    last_read: Instant,
    /// Arrivals were metered since the last sync: the receivers' allotments, which set the
    /// VMs' receive buckets, may have moved (written at most every [`RATES_EVERY`] for that).
    metered: bool,
    next_rates: Instant,
    /// Per port slot: the ring entries last released to the kernel (`KernelFastPath::release`)
    /// and the tx epoch at which the kernel's own resumption of the VM was last seen.
    released: Vec<Option<u64>>,
    resumed_at: Vec<Option<u64>>,
    /// Per port slot: the ring entries taken as last written to the kernel (`set_ring`).
    ring_written: Vec<Option<u64>>,
    /// Frames the kernel had dropped beyond each held destination's rate (by bucket), at the
    /// last refresh.
    dest_dropped: HashMap<u32, u64>,
}

impl FastPathLink {
    /// Loads the programs and registers `ports` (slot 0 the uplink).
    pub(crate) fn open(
        engine: &mut Engine,
        ports: &[Option<Box<dyn Port>>],
        now: Instant,
    ) -> io::Result<FastPathLink> {
        let mut link = FastPathLink {
            kernel: KernelFastPath::load()?,
            handback: Handback::default(),
            registered: Vec::new(),
            destinations: HashMap::new(),
            wants: Vec::new(),
            rings: Vec::new(),
            next_sync: now,
            next_refresh: now,
            pending: true,
            arrived: HashMap::new(),
            arrivals: Vec::new(),
            fresh: Vec::new(),
            kernel_zero_ns: kernel_clock_ns().saturating_sub(now.as_nanos()),
            next_meter: now,
            last_busy_arrival: None,
            last_read: now,
            metered: false,
            next_rates: now,
            released: Vec::new(),
            resumed_at: Vec::new(),
            ring_written: Vec::new(),
            dest_dropped: HashMap::new(),
        };
        link.refresh(engine, ports, now)?;
        engine.link_fast_path();
        Ok(link)
    }

    /// Registers ports opened and forgets ports closed since the last call, and brings the
    /// destinations up to date.
    fn refresh(
        &mut self,
        engine: &mut Engine,
        ports: &[Option<Box<dyn Port>>],
        now: Instant,
    ) -> io::Result<()> {
        self.note_destination_drops(engine, now);
        self.registered
            .resize(ports.len().max(self.registered.len()), None);
        let dir = &engine.dir;
        let host_mac = dir
            .hosts
            .get(&engine.host_id())
            .map(|h| h.mac.0)
            .unwrap_or_default();
        for (slot, port) in ports.iter().enumerate() {
            // AF_PACKET sockets: on a veth or NIC, or on the host side of a VMM's TAP.
            let port = port
                .as_ref()
                .filter(|p| matches!(p.backend(), Backend::AfPacket | Backend::Tap));
            let vm = dir.port_vm.get(slot).copied().flatten();
            match (port, self.registered[slot]) {
                (Some(p), None) => {
                    // A VM port whose VM is not known yet waits for the next refresh.
                    if slot != 0 && vm.is_none() {
                        continue;
                    }
                    let index = self.kernel.attach_device(p.name())?;
                    if let Some(fd) = p.raw_fd() {
                        self.kernel.attach_socket(fd)?;
                    }
                    if let Some(v) = vm.filter(|_| slot != 0) {
                        let vm = &dir.vms[v];
                        let vni = dir.tenants[vm.tenant].vni;
                        self.kernel
                            .set_vm_port(index, slot as u32, vni, vm.mac.0, vm.ip)?;
                    } else {
                        crate::port::features::segment_tunnels_in_software(p.name())?;
                        self.kernel.set_uplink(index, host_mac)?;
                    }
                    self.registered[slot] = Some(index);
                }
                (None, Some(index)) => {
                    self.kernel.remove_port(index);
                    self.registered[slot] = None;
                    self.handback.forget(slot as u32);
                    if let Some(r) = self.released.get_mut(slot) {
                        *r = None;
                    }
                    if let Some(r) = self.ring_written.get_mut(slot) {
                        *r = None;
                    }
                }
                _ => {}
            }
        }
        let uplink = self.registered.first().copied().flatten();
        let this = dir.hosts.get(&engine.host_id()).cloned();
        let mut want = HashMap::new();
        for (v, vm) in dir.vms.iter().enumerate() {
            let Some(tenant) = dir.tenants.get(vm.tenant).filter(|t| t.present) else {
                continue;
            };
            let dest =
                match vm.port {
                    Some(p) => self.registered.get(p).copied().flatten().map(|ifindex| {
                        Destination::Local {
                            slot: p as u32,
                            ifindex,
                        }
                    }),
                    None => match (uplink, &this, dir.hosts.get(&vm.host)) {
                        (Some(uplink_ifindex), Some(this), Some(peer)) => {
                            Some(Destination::Remote {
                                uplink_ifindex,
                                src_ip: this.underlay_ip,
                                dst_ip: peer.underlay_ip,
                                src_mac: this.mac.0,
                                dst_mac: peer.mac.0,
                                limit: engine.destination_rate(v).map(|bytes_per_sec| {
                                    DestinationLimit {
                                        bucket: v as u32,
                                        bytes_per_sec,
                                        drop_beyond: engine.destination_overflowing(v),
                                    }
                                }),
                            })
                        }
                        _ => None,
                    },
                };
            if let Some(d) = dest {
                want.insert((tenant.vni, vm.mac.0), d);
            }
        }
        for (&(vni, mac), d) in &want {
            if self.destinations.get(&(vni, mac)) != Some(d) {
                self.kernel.set_destination(vni, mac, Some(*d))?;
            }
        }
        for &(vni, mac) in self.destinations.keys() {
            if !want.contains_key(&(vni, mac)) {
                self.kernel.set_destination(vni, mac, None)?;
            }
        }
        self.destinations = want;
        Ok(())
    }

    /// Tells the engine which held destinations the kernel still drops frames to (their
    /// senders still flood them), so it keeps them held.
    fn note_destination_drops(&mut self, engine: &mut Engine, now: Instant) {
        let held: Vec<u32> = self
            .destinations
            .values()
            .filter_map(|d| match d {
                Destination::Remote { limit: Some(l), .. } if l.drop_beyond => Some(l.bucket),
                _ => None,
            })
            .collect();
        for bucket in held {
            let dropped = self.kernel.destination_dropped(bucket);
            let before = self.dest_dropped.insert(bucket, dropped).unwrap_or(0);
            if dropped > before {
                engine.kernel_dropped_for(bucket as usize, now, dropped - before);
            }
        }
    }

    /// Before a pass: what the kernel forwarded to local VMs since the last read, metered by
    /// the EyeQ receivers (EyeQ 3.2), at most every [`METER_EVERY`].
    pub(crate) fn meter(&mut self, engine: &mut Engine, now: Instant, pool: &mut FramePool) {
        if now < self.next_meter {
            return;
        }
        self.next_meter = now + METER_EVERY;
        if !self.kernel.arrivals(&mut self.arrivals) {
            self.last_read = now;
            return;
        }
        self.fresh.clear();
        for a in &self.arrivals {
            let key = (a.slot, a.src_ip, a.src_mac);
            // Totals since the pair entered the map (an evicted pair starts from zero).
            let (wire_bytes, packets, dropped) = match self.arrived.get(&key) {
                Some(b) if a.packets >= b.packets => (
                    a.bytes.saturating_sub(b.bytes),
                    a.packets - b.packets,
                    a.dropped.saturating_sub(b.dropped),
                ),
                _ => (a.bytes, a.packets, a.dropped),
            };
            if packets > 0 {
                self.fresh.push(FastArrival {
                    slot: a.slot as usize,
                    from: a.src_ip,
                    src_mac: a.src_mac,
                    wire_bytes,
                    dropped,
                    last: Instant::from_nanos(a.last_ns.saturating_sub(self.kernel_zero_ns)),
                });
            }
        }
        if !self.fresh.is_empty() {
            let bytes: u64 = self.fresh.iter().map(|a| a.wire_bytes).sum();
            let elapsed = now.saturating_since(self.last_read).as_nanos().max(1);
            let rate = u128::from(bytes) * 1_000_000_000 / u128::from(elapsed);
            if rate * 4 >= u128::from(engine.access_link_bytes_per_sec()) {
                self.last_busy_arrival = Some(now);
            }
            self.metered = true;
            engine.meter_fast_arrivals(now, &self.fresh, pool);
        }
        self.last_read = now;
        self.arrived.clear();
        self.arrived.extend(
            self.arrivals
                .iter()
                .map(|a| ((a.slot, a.src_ip, a.src_mac), *a)),
        );
    }

    /// After a pass: hands VMs back to the kernel, or takes them away, as the engine allows.
    /// `busy`: the pass handled frames (a hand-over may have happened).
    pub(crate) fn sync(
        &mut self,
        engine: &mut Engine,
        ports: &[Option<Box<dyn Port>>],
        now: Instant,
        busy: bool,
    ) -> io::Result<()> {
        if now >= self.next_refresh {
            self.next_refresh = now + REFRESH_EVERY;
            self.refresh(engine, ports, now)?;
        }
        let rates_due = self.metered && now >= self.next_rates;
        if !(busy || self.pending || rates_due) || now < self.next_sync {
            return Ok(());
        }
        self.next_sync = now + SYNC_EVERY;
        self.next_rates = now + RATES_EVERY;
        self.metered = false;
        engine.fast_path_wants(now, &mut self.wants);
        // A VM that may take no kernel path (its tenant encrypts or runs an offload program)
        // and whose grant already says so needs no map read: without this a busy loop read
        // every port's maps each sync for nothing (accel-hog: 41k bpf calls/s a switch,
        // +4 us a pass, +12 us on the encrypted victim's p50).
        let any_engaged = self.wants.iter().any(|w| engaged(w, &self.handback));
        self.rings.clear();
        for (slot, port) in ports.iter().enumerate() {
            let mut r = if any_engaged {
                self.kernel.handover(slot as u32)
            } else {
                RingCounts::default()
            };
            r.taken = port.as_ref().map_or(0, |p| p.stats().rx_taken);
            self.rings.push(r);
        }
        self.pending = false;
        for want in &self.wants {
            if self
                .registered
                .get(want.slot as usize)
                .copied()
                .flatten()
                .is_none()
            {
                continue;
            }
            let slot = want.slot as usize;
            if self.released.len() <= slot {
                self.released.resize(slot + 1, None);
                self.resumed_at.resize(slot + 1, None);
                self.ring_written.resize(slot + 1, None);
            }
            // How far behind on the VM's ring the loop is: the kernel drops the VM's frames
            // to hand over, instead of handing them over, once the ring is about full. The
            // count is written once it moved by RING_WRITE_STEP (a map write per sync per
            // busy VM otherwise).
            let taken = self.rings.get(slot).map_or(0, |r| r.taken);
            if self.ring_written[slot].is_none_or(|w| taken < w || taken - w >= RING_WRITE_STEP) {
                self.kernel.set_ring(want.slot, taken, RING_BACKLOG)?;
                self.ring_written[slot] = Some(taken);
            }
            if !engaged(want, &self.handback) {
                continue;
            }
            let (epochs, kernel_resumed) = self.kernel.epochs(want.slot);
            // The kernel resumed the VM itself: its limiters here are done, as at a hand-back
            // (its destinations' kernel buckets already pace it).
            if kernel_resumed && self.resumed_at[slot] != Some(epochs.tx) {
                self.resumed_at[slot] = Some(epochs.tx);
                engine.fast_path_resumes_tx(slot);
            }
            // Nothing of the VM held here after every entry taken so far: the kernel may
            // resume it at its next frame (a VM sending faster than this loop syncs never
            // meets a grant of its current epoch).
            if want.tx && want.idle && self.released[slot] != Some(taken) {
                self.kernel.release(want.slot, taken)?;
                self.released[slot] = Some(taken);
            }
            let resumed = !self.handback.in_force(want.slot, epochs) && !kernel_resumed;
            if let Step::Write(grant) = self.handback.step(*want, epochs, &self.rings) {
                if resumed && grant.want.tx {
                    // Back from the engines: one budget per destination across both paths.
                    for bucket in engine.fast_path_resumes_tx(want.slot as usize) {
                        self.kernel.spend_destination_burst(bucket)?;
                    }
                }
                self.kernel.write_grant(&grant)?;
            }
            // A grant for epochs the kernel has moved past is no grant: keep syncing until
            // one is written in a quiet moment. A VM with frames queued here waits for them
            // instead: the passes that send them sync (busy), the one that empties its queues
            // included; polling for it meanwhile cost a pass every 100 us (a TCP sender paced
            // by a receiver's feedback: 1.4 s of CPU in pps-flood's 3 s against 0.4 s).
            if (want.tx || want.rx) && want.idle && !self.handback.in_force(want.slot, epochs) {
                self.pending = true;
            }
        }
        Ok(())
    }

    /// Reads the program's counters of every VM port into the engine (/stats, SLOs).
    pub(crate) fn publish(&self, engine: &mut Engine, now: Instant) {
        for (slot, registered) in self.registered.iter().enumerate().skip(1) {
            if registered.is_some() {
                engine.note_fast_path(now, slot, self.kernel.counters(slot as u32));
            }
        }
    }

    /// How long the loop may wait: short while a VM waits to be handed back, and at most
    /// [`METER_WAKE`] while the kernel forwards much to local VMs (its arrivals are metered).
    pub(crate) fn wait_cap(&self, now: Instant) -> Option<Duration> {
        if self.pending {
            Some(SYNC_EVERY)
        } else if self
            .last_busy_arrival
            .is_some_and(|t| now.saturating_since(t) < METER_QUIET)
        {
            Some(METER_WAKE)
        } else {
            None
        }
    }
}

/// Whether a VM's kernel side needs the sync's reads: it may take the fast path, the kernel
/// drops for it, or the grant last written still says either.
fn engaged(want: &FastPathWant, handback: &Handback) -> bool {
    want.tx || want.rx || want.tx_drop || want.rx_drop || !handback.holds_nothing(want.slot)
}
