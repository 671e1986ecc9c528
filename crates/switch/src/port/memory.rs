//! An in-process port: the switch side is a [`MemoryPort`], the outside is a
//! [`MemoryPortHandle`] that injects frames as bytes and collects what the switch sent. Both
//! directions are bounded queues; the handle is `Clone + Send + Sync`, so a test thread or the
//! simulator can drive a switch running on another thread (smoltcp's `phy::Loopback` idea,
//! DESIGN.md section 2).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Backend, Port, PortStats};
use crate::frame::{Frame, FramePool, DATA_CAP};

/// The switch side of an in-memory port. Its [`Port::raw_fd`] is an eventfd that is readable
/// while injected frames are pending, so a run loop can block on it like on a real port.
#[derive(Debug)]
pub struct MemoryPort {
    name: String,
    shared: Arc<Shared>,
    stats: PortStats,
}

/// The outside of an in-memory port: what a test or simulated host holds.
#[derive(Debug, Clone)]
pub struct MemoryPortHandle {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    queues: Mutex<Queues>,
    /// Maximum length of each queue.
    capacity: usize,
    /// An eventfd that is readable while `to_switch` is non-empty, so the switch can block on
    /// a memory port like on a real one; `None` if the eventfd could not be created.
    ready: Option<OwnedFd>,
}

#[derive(Debug, Default)]
struct Queues {
    /// Injected by the handle, not yet received by the switch.
    to_switch: VecDeque<Vec<u8>>,
    /// Sent by the switch, not yet collected by the handle.
    from_switch: VecDeque<Vec<u8>>,
    /// Byte buffers of received frames, reused by `inject` so a steady flow does not allocate.
    spare: Vec<Vec<u8>>,
    /// Whether the eventfd currently holds a count.
    signalled: bool,
    rx_dropped: u64,
    rx_oversize: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic while holding the lock cannot leave the queues half-updated in a way that
        // matters to a test, so a poisoned lock is used as it is.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self, q: &mut Queues) {
        if let (Some(fd), false) = (&self.ready, q.signalled) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
            let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            q.signalled = true;
        }
    }

    fn clear_signal(&self, q: &mut Queues) {
        if let (Some(fd), true) = (&self.ready, q.signalled) {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from an eventfd we own (non-blocking).
            let _ = unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            q.signalled = false;
        }
    }
}

impl MemoryPort {
    /// Queue length of each direction for [`MemoryPort::new`].
    pub const DEFAULT_QUEUE_CAP: usize = 1024;

    /// A port named `name` with queues of [`MemoryPort::DEFAULT_QUEUE_CAP`] frames each way.
    pub fn new(name: &str) -> (MemoryPort, MemoryPortHandle) {
        MemoryPort::with_capacity(name, Self::DEFAULT_QUEUE_CAP)
    }

    /// A port whose two queues each hold at most `capacity` frames.
    pub fn with_capacity(name: &str, capacity: usize) -> (MemoryPort, MemoryPortHandle) {
        // SAFETY: eventfd(2) takes no pointers; a non-negative return is a new descriptor that
        // we own from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        // SAFETY: `fd`, when valid, is the fresh descriptor just created and owned by nobody
        // else. Without one the port still works; it just cannot be waited on.
        let ready = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues::default()),
            capacity,
            ready,
        });
        let port = MemoryPort {
            name: name.to_owned(),
            shared: Arc::clone(&shared),
            stats: PortStats::default(),
        };
        (port, MemoryPortHandle { shared })
    }
}

impl Port for MemoryPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::Memory
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        let mut q = self.shared.lock();
        let mut n = 0;
        while n < max && !q.to_switch.is_empty() {
            let Some(mut frame) = pool.get() else { break };
            let bytes = q.to_switch.pop_front().expect("checked non-empty");
            // Cannot fail: `inject` refused anything longer than DATA_CAP.
            frame.fill_from(&bytes);
            q.spare.push(bytes);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += frame.len() as u64;
            out.push(frame);
            n += 1;
        }
        if q.to_switch.is_empty() {
            self.shared.clear_signal(&mut q);
        }
        Ok(n)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        let mut q = self.shared.lock();
        let room = self.shared.capacity.saturating_sub(q.from_switch.len());
        let n = room.min(frames.len());
        for frame in frames.drain(..n) {
            let mut bytes = q.spare.pop().unwrap_or_default();
            bytes.clear();
            bytes.extend_from_slice(frame.data());
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += frame.len() as u64;
            q.from_switch.push_back(bytes);
            pool.put(frame);
        }
        Ok(n)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        self.shared.ready.as_ref().map(|fd| fd.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        let q = self.shared.lock();
        PortStats {
            rx_dropped: q.rx_dropped,
            rx_oversize: q.rx_oversize,
            ..self.stats
        }
    }
}

impl MemoryPortHandle {
    /// Offers a frame to the switch. Returns false, counting it in the port's stats, if the
    /// queue is full (`rx_dropped`) or the frame is longer than [`DATA_CAP`] (`rx_oversize`).
    pub fn inject(&self, bytes: &[u8]) -> bool {
        let mut q = self.shared.lock();
        if bytes.len() > DATA_CAP {
            q.rx_oversize += 1;
            return false;
        }
        if q.to_switch.len() >= self.shared.capacity {
            q.rx_dropped += 1;
            return false;
        }
        let mut buf = q.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        q.to_switch.push_back(buf);
        self.shared.signal(&mut q);
        true
    }

    /// Takes the oldest frame the switch sent, if any.
    pub fn pop_sent(&self) -> Option<Vec<u8>> {
        self.shared.lock().from_switch.pop_front()
    }

    /// Frames injected but not yet received by the switch.
    pub fn pending_to_switch(&self) -> usize {
        self.shared.lock().to_switch.len()
    }

    /// Frames sent by the switch but not yet taken with [`MemoryPortHandle::pop_sent`].
    pub fn pending_from_switch(&self) -> usize {
        self.shared.lock().from_switch.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::wait_readable;
    use std::time::Duration;

    #[test]
    fn frames_round_trip_in_order() {
        let (mut port, handle) = MemoryPort::new("m0");
        let mut pool = FramePool::new(8);
        assert!(handle.inject(b"first"));
        assert!(handle.inject(b"second"));
        let mut got = Vec::new();
        assert_eq!(port.recv_batch(&mut pool, &mut got, 16).unwrap(), 2);
        assert_eq!(got[0].data(), b"first");
        assert_eq!(got[1].data(), b"second");
        assert_eq!(port.recv_batch(&mut pool, &mut got, 16).unwrap(), 0);
        assert_eq!(port.send_batch(&mut got, &mut pool).unwrap(), 2);
        assert!(got.is_empty());
        assert_eq!(pool.available(), 8, "sent frames went back to the pool");
        assert_eq!(handle.pop_sent().as_deref(), Some(&b"first"[..]));
        assert_eq!(handle.pop_sent().as_deref(), Some(&b"second"[..]));
        assert_eq!(handle.pop_sent(), None);
        let s = port.stats();
        assert_eq!(
            (s.rx_frames, s.rx_bytes, s.tx_frames, s.tx_bytes),
            (2, 11, 2, 11)
        );
    }

    #[test]
    fn queues_are_bounded_both_ways() {
        let (mut port, handle) = MemoryPort::with_capacity("m1", 2);
        let mut pool = FramePool::new(8);
        assert!(handle.inject(b"a") && handle.inject(b"b"));
        assert!(!handle.inject(b"c"), "rx queue full");
        assert!(!handle.inject(&[0; DATA_CAP + 1]), "oversize");
        let s = port.stats();
        assert_eq!((s.rx_dropped, s.rx_oversize), (1, 1));

        // max limits one batch; the rest stays pending.
        let mut got = Vec::new();
        assert_eq!(port.recv_batch(&mut pool, &mut got, 1).unwrap(), 1);
        assert_eq!(handle.pending_to_switch(), 1);
        port.recv_batch(&mut pool, &mut got, 8).unwrap();

        // Three frames to send, room for two: the third stays with the caller.
        got.push(pool.get().unwrap());
        assert_eq!(port.send_batch(&mut got, &mut pool).unwrap(), 2);
        assert_eq!(got.len(), 1);
        assert_eq!(port.send_batch(&mut got, &mut pool).unwrap(), 0);
        handle.pop_sent();
        assert_eq!(port.send_batch(&mut got, &mut pool).unwrap(), 1);
        assert_eq!(handle.pending_from_switch(), 2);
    }

    #[test]
    fn exhausted_pool_leaves_frames_pending() {
        let (mut port, handle) = MemoryPort::new("m2");
        let mut pool = FramePool::new(1);
        handle.inject(b"x");
        handle.inject(b"y");
        let mut got = Vec::new();
        assert_eq!(port.recv_batch(&mut pool, &mut got, 8).unwrap(), 1);
        assert_eq!(handle.pending_to_switch(), 1);
        pool.put(got.pop().unwrap());
        assert_eq!(port.recv_batch(&mut pool, &mut got, 8).unwrap(), 1);
        assert_eq!(got[0].data(), b"y");
    }

    #[test]
    fn descriptor_is_readable_exactly_while_frames_are_pending() {
        let (mut port, handle) = MemoryPort::new("m3");
        let fd = port.raw_fd().expect("eventfd");
        let mut pool = FramePool::new(4);
        let mut got = Vec::new();
        assert!(!wait_readable(&[fd], Duration::ZERO).unwrap());
        // Injected from another thread, as the simulator or a test driver does.
        std::thread::spawn(move || assert!(handle.inject(b"from another thread")))
            .join()
            .unwrap();
        assert!(wait_readable(&[fd], Duration::ZERO).unwrap());
        port.recv_batch(&mut pool, &mut got, 8).unwrap();
        assert_eq!(got[0].data(), b"from another thread");
        assert!(!wait_readable(&[fd], Duration::ZERO).unwrap());
    }
}
