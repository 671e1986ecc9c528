//! The run loop's per-iteration policy, sans-I/O: which ports are read and how far, the
//! engines' poll, and what is sent or dropped. Given `now` and an [`Io`] that moves frames,
//! one [`Driver::iterate`] is one pass of the loop. The real run loop ([`crate::runner`])
//! drives it with its ports; the simulator with its modelled VM rings and NIC, so both run
//! the same policy.

use picnic_core::Instant;

use crate::directory::{PortIdx, UPLINK};
use crate::engine::{Engine, Work};
use crate::frame::{Frame, FramePool};
use crate::stats::DropReason;

/// Batches read from the uplink per iteration (one from each tenant port).
pub const UPLINK_READ_ROUNDS: usize = 8;

/// Batches a port's transmit queue may hold after a send before its oldest frames are
/// dropped.
pub const TX_QUEUE_BATCHES: usize = 4;

/// What moves frames between the engines and the world: ports in the switch, modelled rings
/// and links in the simulator.
pub trait Io {
    /// Reads up to `max` frames that arrived on `port` into `rx`; returns how many.
    fn recv(
        &mut self,
        now: Instant,
        port: PortIdx,
        pool: &mut FramePool,
        rx: &mut Vec<Frame>,
        max: usize,
    ) -> anyhow::Result<usize>;

    /// Sends frames from the front of `queue` out of `port`, removing those it sent.
    fn send(
        &mut self,
        port: PortIdx,
        queue: &mut Vec<Frame>,
        pool: &mut FramePool,
    ) -> anyhow::Result<()>;

    /// The per-frame processing the engines charge to a frame's tenant (the switch's
    /// synthetic rule-set cost, the simulator's cost model).
    fn work(&mut self) -> &mut dyn Work;

    /// False only when `port` certainly has nothing to read (the simulator's empty rings), so
    /// [`Driver::iterate`] skips it without asking the engine ([`Engine::rx_ready`] is pure:
    /// skipping it changes nothing). Ports that cannot tell cheaply keep the default, true.
    fn maybe_ready(&self, _port: PortIdx) -> bool {
        true
    }
}

/// What one iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pass {
    /// Frames read from the ports.
    pub received: usize,
    /// Frames the engines' schedulers processed.
    pub processed: usize,
}

impl Pass {
    /// Frames received plus processed: 0 when the iteration found nothing to do.
    pub fn busy(&self) -> usize {
        self.received + self.processed
    }
}

/// One iteration's policy, with the receive buffer it reuses.
pub struct Driver {
    batch: usize,
    rx: Vec<Frame>,
    /// Start of the last pass, if it found nothing to do.
    idle_since: Option<Instant>,
}

impl Driver {
    /// A driver reading and processing up to `batch` frames per port and direction.
    pub fn new(batch: usize) -> Driver {
        Driver {
            batch,
            rx: Vec::with_capacity(batch),
            idle_since: None,
        }
    }

    /// Frames read per port and round, and processed per direction, per iteration.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// One iteration at `now`: every port whose engine has room for a batch is read (a VM
    /// port held back stays in its ring: backpressure), the engines run their schedulers,
    /// and every transmit queue is sent. The time from a pass that found nothing to do to
    /// the next pass is the loop's idle time (whether it spun or blocked).
    pub fn iterate(
        &mut self,
        now: Instant,
        engine: &mut Engine,
        io: &mut impl Io,
        pool: &mut FramePool,
    ) -> anyhow::Result<Pass> {
        let batch = self.batch;
        if let Some(since) = self.idle_since.take() {
            engine.note_idle(now, now.saturating_since(since).as_nanos());
        }
        let mut pass = Pass::default();
        for p in 0..engine.dir.port_count() {
            if !io.maybe_ready(p) || !engine.rx_ready(now, p, batch) {
                continue;
            }
            // The shared uplink ring is drained further than it is processed: reading and
            // classifying is cheap, and overload must land in per-VM queues (dropping only
            // the guilty VM's frames), not overflow the ring for everyone (PicNIC 2.2).
            let rounds = if p == UPLINK { UPLINK_READ_ROUNDS } else { 1 };
            for _ in 0..rounds {
                let n = io.recv(now, p, pool, &mut self.rx, batch)?;
                if n > 0 {
                    engine.on_frames(now, p, &mut self.rx, pool);
                    pass.received += n;
                }
                if n < batch {
                    break;
                }
            }
        }
        pass.processed = engine.poll(now, batch, io.work(), pool);
        self.transmit(engine, io, pool)?;
        if pass.busy() == 0 {
            engine.note_empty_pass(now);
            self.idle_since = Some(now);
        }
        Ok(pass)
    }

    /// After the shared engine's results came back within the iteration (an inline engine
    /// ran its jobs after [`Driver::iterate`]): the engines' poll and every transmit queue
    /// once more, so a frame sealed or opened in this iteration leaves now, not with the
    /// next one, which may start only after the loop gave its core away (`yield_busy`) or
    /// ran the engine's next jobs. Returns the frames the engines processed.
    pub fn finish(
        &mut self,
        now: Instant,
        engine: &mut Engine,
        io: &mut impl Io,
        pool: &mut FramePool,
    ) -> anyhow::Result<usize> {
        let processed = engine.poll(now, self.batch, io.work(), pool);
        self.transmit(engine, io, pool)?;
        Ok(processed)
    }

    /// Sends every transmit queue, the local VMs' ports first and the uplink last. A port
    /// that cannot keep up must not make memory grow: beyond [`TX_QUEUE_BATCHES`] batches its
    /// oldest frames are dropped.
    ///
    /// The uplink goes last because a frame delivered to a VM usually comes with a standalone
    /// feedback frame for its sender's host (EyeQ samples about one per meter window, so
    /// about one per frame at low rates), and a send on the uplink runs the receiving host's
    /// whole receive path and wake-up inside the system call (4-32 us in the lab, issue 13):
    /// sent first, that feedback delayed every delivered frame by it.
    fn transmit(
        &mut self,
        engine: &mut Engine,
        io: &mut impl Io,
        pool: &mut FramePool,
    ) -> anyhow::Result<()> {
        let limit = self.batch * TX_QUEUE_BATCHES;
        let ports = engine.dir.port_count();
        for p in (1..ports).chain((ports > 0).then_some(UPLINK)) {
            let q = engine.tx_queue(p);
            if q.is_empty() {
                continue;
            }
            io.send(p, q, pool)?;
            let q = engine.tx_queue(p);
            if q.len() > limit {
                let excess = q.len() - limit;
                for f in q.drain(..excess) {
                    pool.put(f);
                }
                for _ in 0..excess {
                    engine.counters.drops.add(DropReason::TxQueueFull);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::{config, udp, NoWork, A1, A2, IP_A1, IP_A2};
    use std::collections::VecDeque;

    /// Ports as queues of frames to receive; a port in `stalled` sends nothing.
    struct FakeIo {
        inbox: Vec<VecDeque<Vec<u8>>>,
        reads: Vec<usize>,
        stalled: Option<PortIdx>,
        /// The ports sent on, in order.
        sent: Vec<PortIdx>,
        work: NoWork,
    }

    impl FakeIo {
        fn new(ports: usize) -> FakeIo {
            FakeIo {
                inbox: vec![VecDeque::new(); ports],
                reads: vec![0; ports],
                stalled: None,
                sent: Vec::new(),
                work: NoWork,
            }
        }
    }

    impl Io for FakeIo {
        fn recv(
            &mut self,
            _now: Instant,
            port: PortIdx,
            pool: &mut FramePool,
            rx: &mut Vec<Frame>,
            max: usize,
        ) -> anyhow::Result<usize> {
            self.reads[port] += 1;
            let mut n = 0;
            while n < max {
                let Some(bytes) = self.inbox[port].pop_front() else {
                    break;
                };
                let mut f = pool.get().expect("a free frame");
                assert!(f.fill_from(&bytes));
                rx.push(f);
                n += 1;
            }
            Ok(n)
        }

        fn send(
            &mut self,
            port: PortIdx,
            queue: &mut Vec<Frame>,
            pool: &mut FramePool,
        ) -> anyhow::Result<()> {
            self.sent.push(port);
            if self.stalled != Some(port) {
                for f in queue.drain(..) {
                    pool.put(f);
                }
            }
            Ok(())
        }

        fn work(&mut self) -> &mut dyn Work {
            &mut self.work
        }
    }

    fn host1() -> (Engine, FramePool, PortIdx) {
        let engine = Engine::new(&config(1, 1000), Instant::ZERO).unwrap();
        let a1 = engine.dir.vms.iter().find(|v| v.name == "a1").unwrap();
        let port = a1.port.unwrap();
        (engine, FramePool::new(4096), port)
    }

    #[test]
    fn the_uplink_is_read_eight_batches_deep_a_vm_port_one_batch() {
        let (mut engine, mut pool, a1) = host1();
        let mut io = FakeIo::new(engine.dir.port_count());
        io.inbox[UPLINK].extend((0..100).map(|_| vec![0u8; 60]));
        let frame = udp(A1, A2, IP_A1, IP_A2, 7, 100);
        io.inbox[a1].extend((0..10).map(|_| frame.clone()));
        let mut driver = Driver::new(4);
        let pass = driver
            .iterate(Instant::ZERO, &mut engine, &mut io, &mut pool)
            .unwrap();
        assert_eq!(io.reads[UPLINK], UPLINK_READ_ROUNDS);
        assert_eq!(io.inbox[UPLINK].len(), 100 - 4 * UPLINK_READ_ROUNDS);
        assert_eq!((io.reads[a1], io.inbox[a1].len()), (1, 6));
        assert_eq!(pass.received, 4 * UPLINK_READ_ROUNDS + 4);
        // A nearly empty uplink ring ends its rounds at the first short read.
        io.inbox[UPLINK].truncate(5);
        io.reads[UPLINK] = 0;
        driver
            .iterate(Instant::ZERO, &mut engine, &mut io, &mut pool)
            .unwrap();
        assert_eq!((io.reads[UPLINK], io.inbox[UPLINK].len()), (2, 0));
    }

    /// A frame queued for the uplink after the pass (an inline engine's sealed result,
    /// handed back by `AccelPort::exchange` after `iterate`) leaves with `finish`, in the same
    /// iteration: not with the next one, after the loop yielded its core.
    #[test]
    fn finish_sends_what_the_engine_handed_back_after_the_pass() {
        let (mut engine, mut pool, _) = host1();
        let mut io = FakeIo::new(engine.dir.port_count());
        let mut driver = Driver::new(4);
        driver
            .iterate(Instant::ZERO, &mut engine, &mut io, &mut pool)
            .unwrap();
        let mut sealed = pool.get().unwrap();
        assert!(sealed.fill_from(&udp(A1, A2, IP_A1, IP_A2, 7, 100)));
        engine.tx_queue(UPLINK).push(sealed);
        assert!(io.sent.is_empty());
        driver
            .finish(Instant::ZERO, &mut engine, &mut io, &mut pool)
            .unwrap();
        assert_eq!(io.sent, vec![UPLINK]);
        assert!(engine.tx_queue(UPLINK).is_empty());
    }

    /// A frame for a local VM is handed to its port before the uplink's queue (its sender's
    /// feedback) is sent, and every queue is still sent in the same pass.
    #[test]
    fn local_ports_are_sent_before_the_uplink() {
        let (mut engine, mut pool, a1) = host1();
        let mut io = FakeIo::new(engine.dir.port_count());
        for p in [UPLINK, a1] {
            let f = pool.get().unwrap();
            engine.tx_queue(p).push(f);
        }
        let mut driver = Driver::new(4);
        driver
            .iterate(Instant::ZERO, &mut engine, &mut io, &mut pool)
            .unwrap();
        assert_eq!(io.sent, vec![a1, UPLINK]);
        assert!(engine.tx_queue(UPLINK).is_empty() && engine.tx_queue(a1).is_empty());
    }

    #[test]
    fn a_port_that_cannot_send_keeps_four_batches_and_drops_the_oldest_rest() {
        let (mut engine, mut pool, a1) = host1();
        let mut io = FakeIo::new(engine.dir.port_count());
        io.stalled = Some(UPLINK);
        let frame = udp(A1, A2, IP_A1, IP_A2, 7, 100);
        io.inbox[a1].extend((0..40).map(|_| frame.clone()));
        let mut driver = Driver::new(4);
        let mut processed = 0;
        for ms in 0..40 {
            let now = Instant::from_nanos(ms * 1_000_000);
            processed += driver
                .iterate(now, &mut engine, &mut io, &mut pool)
                .unwrap()
                .processed;
            assert!(engine.tx_queue(UPLINK).len() <= 4 * TX_QUEUE_BATCHES);
        }
        assert_eq!(processed, 40, "every frame forwarded");
        let kept = engine.tx_queue(UPLINK).len();
        assert_eq!(kept, 4 * TX_QUEUE_BATCHES);
        assert_eq!(
            engine.counters.drops.get(DropReason::TxQueueFull),
            40 - kept as u64
        );
    }
}
