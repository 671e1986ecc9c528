//! Several queue sockets of one interface as one port: a worker that owns more than one of
//! the uplink's NIC queues (an AF_XDP socket is bound to exactly one queue, and the XDP
//! program can only redirect a queue's frames to that queue's socket) reads them all through
//! the same [`Port`] the driver already knows.
//!
//! - **Receive** reads the members in turn, up to `max` in all, starting one member further
//!   at every call, so a busy queue cannot starve the others.
//! - **Send** goes out on the first member (queue 0's socket on worker 0): any socket of the
//!   interface reaches the wire.
//! - **Wait**: [`Port::raw_fd`] is an epoll descriptor with every member's descriptor
//!   registered for input (level-triggered). An epoll descriptor is itself readable while a
//!   member is, so the run loop's wait needs no change.
//! - **Counters** are the members' sums.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::waitset::{ctl, epoll_create};
use super::{Backend, Port, PortStats};
use crate::frame::{Frame, FramePool};

/// The ports of several queues of one interface, read as one (see the module doc).
pub struct QueueSet {
    members: Vec<Box<dyn Port>>,
    /// The member the next receive starts at.
    next: usize,
    epoll: OwnedFd,
}

impl QueueSet {
    /// Joins `members` (at least one; the first also sends). Fails when the epoll descriptor
    /// cannot be made; a member without a descriptor is read but not waited on.
    pub fn new(members: Vec<Box<dyn Port>>) -> io::Result<QueueSet> {
        assert!(!members.is_empty(), "a queue set has at least one port");
        let epoll = epoll_create()?;
        for fd in members.iter().filter_map(|m| m.raw_fd()) {
            ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd)?;
        }
        Ok(QueueSet {
            members,
            next: 0,
            epoll,
        })
    }
}

impl Port for QueueSet {
    fn name(&self) -> &str {
        self.members[0].name()
    }

    fn backend(&self) -> Backend {
        self.members[0].backend()
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        let n = self.members.len();
        let start = self.next;
        self.next = (start + 1) % n;
        let mut got = 0;
        for i in 0..n {
            if got >= max {
                break;
            }
            got += self.members[(start + i) % n].recv_batch(pool, out, max - got)?;
        }
        Ok(got)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        self.members[0].send_batch(frames, pool)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.epoll.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        self.members
            .iter()
            .map(|m| m.stats())
            .fold(PortStats::default(), sum)
    }
}

/// Counters of two ports added up (every field named, so a new counter is not forgotten).
fn sum(a: PortStats, b: PortStats) -> PortStats {
    let PortStats {
        rx_frames,
        rx_bytes,
        rx_dropped,
        rx_oversize,
        rx_csum_partial,
        rx_gso_frames,
        rx_gso_segments,
        rx_offload_errors,
        rx_taken,
        tx_frames,
        tx_bytes,
        tx_errors,
        ring_errors,
        kernel_wakeups,
    } = b;
    PortStats {
        rx_frames: a.rx_frames + rx_frames,
        rx_bytes: a.rx_bytes + rx_bytes,
        rx_dropped: a.rx_dropped + rx_dropped,
        rx_oversize: a.rx_oversize + rx_oversize,
        rx_csum_partial: a.rx_csum_partial + rx_csum_partial,
        rx_gso_frames: a.rx_gso_frames + rx_gso_frames,
        rx_gso_segments: a.rx_gso_segments + rx_gso_segments,
        rx_offload_errors: a.rx_offload_errors + rx_offload_errors,
        rx_taken: a.rx_taken + rx_taken,
        tx_frames: a.tx_frames + tx_frames,
        tx_bytes: a.tx_bytes + tx_bytes,
        tx_errors: a.tx_errors + tx_errors,
        ring_errors: a.ring_errors + ring_errors,
        kernel_wakeups: a.kernel_wakeups + kernel_wakeups,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::port::{wait_readable, MemoryPort, MemoryPortHandle};

    /// Three in-memory queues joined as one, with their handles.
    fn three() -> (QueueSet, Vec<MemoryPortHandle>) {
        let (ports, handles): (Vec<Box<dyn Port>>, Vec<_>) = (0..3)
            .map(|_| {
                let (p, h) = MemoryPort::new("up0");
                (Box::new(p) as Box<dyn Port>, h)
            })
            .unzip();
        (QueueSet::new(ports).unwrap(), handles)
    }

    /// Queue `q`'s frame number `i`: one byte each after a 14-byte header.
    fn frame(q: u8, i: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f.extend([q, i]);
        f
    }

    /// Which queue each frame received came from.
    fn queues_of(frames: &[Frame]) -> Vec<u8> {
        frames.iter().map(|f| f.data()[14]).collect()
    }

    #[test]
    fn receive_reads_every_queue_starting_one_further_each_call() {
        let (mut set, h) = three();
        let mut pool = FramePool::new(64);
        for (q, h) in h.iter().enumerate() {
            for i in 0..4 {
                assert!(h.inject(&frame(q as u8, i)));
            }
        }
        let mut out = Vec::new();
        // Queue 0 first, then 1: at most 6 in all.
        assert_eq!(set.recv_batch(&mut pool, &mut out, 6).unwrap(), 6);
        assert_eq!(queues_of(&out), [0, 0, 0, 0, 1, 1]);
        out.drain(..).for_each(|f| pool.put(f));
        // The next call starts at queue 1, the one after at queue 2.
        assert_eq!(set.recv_batch(&mut pool, &mut out, 3).unwrap(), 3);
        assert_eq!(queues_of(&out), [1, 1, 2]);
        out.drain(..).for_each(|f| pool.put(f));
        assert_eq!(set.recv_batch(&mut pool, &mut out, 64).unwrap(), 3);
        assert_eq!(queues_of(&out), [2, 2, 2]);
        out.drain(..).for_each(|f| pool.put(f));
        assert_eq!(set.recv_batch(&mut pool, &mut out, 64).unwrap(), 0);
        let stats = set.stats();
        assert_eq!((stats.rx_frames, stats.rx_bytes), (12, 12 * 16));
    }

    /// A queue that always has a batch waiting does not keep the others from being read:
    /// each call with room for one batch starts at another queue.
    #[test]
    fn a_busy_queue_does_not_starve_the_others() {
        let (mut set, h) = three();
        let mut pool = FramePool::new(64);
        let mut read = [0usize; 3];
        for _ in 0..30 {
            while h[0].pending_to_switch() < 8 {
                assert!(h[0].inject(&frame(0, 0)));
            }
            assert!(h[1].inject(&frame(1, 0)));
            assert!(h[2].inject(&frame(2, 0)));
            let mut out = Vec::new();
            set.recv_batch(&mut pool, &mut out, 8).unwrap();
            for q in queues_of(&out) {
                read[q as usize] += 1;
            }
            out.drain(..).for_each(|f| pool.put(f));
        }
        assert!(read[1] >= 20 && read[2] >= 20, "{read:?}");
    }

    /// The set's descriptor is readable while any queue has a frame, and sends go out on the
    /// first queue.
    #[test]
    fn the_set_wakes_for_any_queue_and_sends_on_the_first() {
        let (mut set, h) = three();
        let fd = set.raw_fd().unwrap();
        let mut pool = FramePool::new(8);
        assert!(!wait_readable(&[fd], Duration::ZERO).unwrap());
        assert!(h[2].inject(&frame(2, 0)));
        assert!(wait_readable(&[fd], Duration::from_millis(100)).unwrap());
        let mut out = Vec::new();
        assert_eq!(set.recv_batch(&mut pool, &mut out, 8).unwrap(), 1);
        assert!(!wait_readable(&[fd], Duration::ZERO).unwrap(), "drained");
        set.send_batch(&mut out, &mut pool).unwrap();
        assert!(h[0].pop_sent().is_some());
        assert!(h[1].pop_sent().is_none() && h[2].pop_sent().is_none());
        assert_eq!(set.stats().tx_frames, 1);
    }
}
