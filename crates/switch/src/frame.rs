//! Packet buffers: a fixed-capacity [`Frame`] with headroom for in-place encapsulation, and a
//! preallocated [`FramePool`] so the dataplane never allocates per packet and its memory stays
//! bounded under flood (DESIGN.md section 4, "cheap before expensive").

use std::fmt;

use picnic_core::{Duration, Instant};

/// Total bytes of one frame buffer (headroom included).
pub const FRAME_CAP: usize = 2048;
/// Bytes reserved in front of received data so outer headers (Geneve: Ethernet + IP + UDP +
/// Geneve + options) can be prepended without copying the packet.
pub const HEADROOM: usize = 128;
/// The most packet bytes a frame holds when its data starts after the full headroom: received
/// frames longer than this are counted as oversize and dropped by the ports.
pub const DATA_CAP: usize = FRAME_CAP - HEADROOM;

/// An owned packet buffer of [`FRAME_CAP`] bytes; the packet is `buf[start..start + len]`.
///
/// Moving a `Frame` moves a pointer and two integers; the bytes never move. Frames come from a
/// [`FramePool`] and go back to it when sent or dropped.
pub struct Frame {
    buf: Box<[u8; FRAME_CAP]>,
    start: usize,
    len: usize,
    /// How long the frame waited in its port's receive ring before the switch read it, ns,
    /// where the port knows (0 otherwise).
    ring_wait_ns: u32,
}

impl Frame {
    /// Allocates one empty frame (only [`FramePool::new`] does, once).
    fn new() -> Frame {
        Frame {
            buf: Box::new([0u8; FRAME_CAP]),
            start: HEADROOM,
            len: 0,
            ring_wait_ns: 0,
        }
    }

    /// The packet bytes.
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The packet bytes, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }

    /// The packet bytes followed by the free room after them, for in-place work that grows
    /// the packet at its end (sealing adds a header and a tag); then call [`Frame::set_len`].
    pub fn data_and_tail_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..]
    }

    /// Length of the packet in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes free in front of the packet for [`Frame::prepend`].
    pub fn headroom(&self) -> usize {
        self.start
    }

    /// Sets the packet length, counted from the current start (after the headroom for a frame
    /// filled through [`Frame::buf_for_rx`]). Bytes between the old and new length keep
    /// whatever the buffer held.
    ///
    /// # Panics
    /// If `n` exceeds the room after the start (`FRAME_CAP - headroom()`): a caller bug, since
    /// every length it sets comes from a write into that room.
    pub fn set_len(&mut self, n: usize) {
        assert!(
            n <= FRAME_CAP - self.start,
            "Frame::set_len({n}) beyond capacity {}",
            FRAME_CAP - self.start
        );
        self.len = n;
    }

    /// Grows the packet by `n` bytes at the front, using headroom, and returns the new front
    /// bytes to be filled with an outer header; `None` (frame unchanged) if the headroom is
    /// smaller than `n`.
    pub fn prepend(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.start {
            return None;
        }
        self.start -= n;
        self.len += n;
        Some(&mut self.buf[self.start..self.start + n])
    }

    /// Removes `n` bytes from the front (decapsulation), giving them back as headroom. Returns
    /// false (frame unchanged) if the packet is shorter than `n`.
    pub fn strip_front(&mut self, n: usize) -> bool {
        if n > self.len {
            return false;
        }
        self.start += n;
        self.len -= n;
        true
    }

    /// Empties the frame and restores the full headroom.
    pub fn reset(&mut self) {
        self.start = HEADROOM;
        self.len = 0;
        self.ring_wait_ns = 0;
    }

    /// Notes that the frame waited `ns` in its port's receive ring (at most ~4 s is kept).
    pub fn set_ring_wait(&mut self, ns: u64) {
        self.ring_wait_ns = ns.min(u32::MAX as u64) as u32;
    }

    /// When the frame entered the switch, given that it was read at `now`: its port's ring
    /// is part of the switch (its wait there counts in the latency through the switch).
    pub fn entered(&self, now: Instant) -> Instant {
        now - Duration::from_nanos(self.ring_wait_ns as u64)
    }

    /// Resets the frame and returns the whole writable region after the headroom
    /// ([`DATA_CAP`] bytes) to receive a packet into; then call [`Frame::set_len`].
    pub fn buf_for_rx(&mut self) -> &mut [u8] {
        self.reset();
        &mut self.buf[HEADROOM..]
    }

    /// Resets the frame and copies `bytes` in after the headroom. Returns false (frame left
    /// empty) if `bytes` is longer than [`DATA_CAP`].
    pub fn fill_from(&mut self, bytes: &[u8]) -> bool {
        self.reset();
        if bytes.len() > DATA_CAP {
            return false;
        }
        self.buf[HEADROOM..HEADROOM + bytes.len()].copy_from_slice(bytes);
        self.len = bytes.len();
        true
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("headroom", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

/// A free list of frames allocated once at construction; [`FramePool::get`] returns `None`
/// when all are in use, so a flood is dropped (and counted by the caller) instead of growing
/// memory.
pub struct FramePool {
    free: Vec<Frame>,
    capacity: usize,
}

impl FramePool {
    /// Allocates `capacity` frames (`capacity * FRAME_CAP` bytes); nothing is allocated after.
    pub fn new(capacity: usize) -> FramePool {
        FramePool {
            free: (0..capacity).map(|_| Frame::new()).collect(),
            capacity,
        }
    }

    /// Allocates `frames` frames and takes back up to `limit` (at least `frames`): a worker's
    /// share of the switch's frames, which may hold frames other workers handed over until it
    /// repays them.
    pub fn with_limit(frames: usize, limit: usize) -> FramePool {
        let mut pool = FramePool::new(frames);
        pool.capacity = limit.max(frames);
        pool.free.reserve(pool.capacity - frames);
        pool
    }

    /// Takes a free, empty frame (full headroom, length 0); `None` when the pool is exhausted.
    pub fn get(&mut self) -> Option<Frame> {
        self.free.pop()
    }

    /// Returns a frame to the pool (it is reset). A frame beyond the pool's capacity (one that
    /// came from another pool) is freed instead, so the free list never reallocates.
    pub fn put(&mut self, mut frame: Frame) {
        if self.free.len() < self.capacity {
            frame.reset();
            self.free.push(frame);
        }
    }

    /// Allocates `additional` more frames into the free list and raises the capacity by as
    /// much. For owners whose bound is a budget reached on demand (the simulator, whose
    /// memory then follows the frames actually in use); the dataplane never calls it.
    pub fn grow(&mut self, additional: usize) {
        self.free.reserve(additional);
        self.free.extend((0..additional).map(|_| Frame::new()));
        self.capacity += additional;
    }

    /// Number of free frames.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Number of frames the pool was built with.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl fmt::Debug for FramePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FramePool")
            .field("available", &self.free.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepend_uses_headroom_and_keeps_payload_in_place() {
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        assert!(f.fill_from(b"payload"));
        let outer = f.prepend(4).expect("headroom");
        outer.copy_from_slice(b"HDR:");
        assert_eq!(f.data(), b"HDR:payload");
        assert_eq!(f.headroom(), HEADROOM - 4);
        assert!(
            f.prepend(HEADROOM).is_none(),
            "more than the remaining headroom"
        );
        assert_eq!(f.data(), b"HDR:payload", "a failed prepend changes nothing");
        assert!(
            f.prepend(HEADROOM - 4).is_some(),
            "exactly the remaining headroom"
        );
        assert_eq!(f.headroom(), 0);
        assert_eq!(f.len(), HEADROOM + 7);
    }

    #[test]
    fn strip_front_decapsulates_and_refuses_too_much() {
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        f.fill_from(b"OUTERinner");
        assert!(f.strip_front(5));
        assert_eq!(f.data(), b"inner");
        assert_eq!(f.headroom(), HEADROOM + 5);
        assert!(!f.strip_front(6));
        assert_eq!(f.data(), b"inner");
        assert!(f.strip_front(5));
        assert!(f.is_empty());
    }

    #[test]
    fn reset_and_rx_buffer_restore_full_headroom() {
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        f.fill_from(&[7; 100]);
        f.prepend(20).unwrap();
        f.reset();
        assert_eq!((f.headroom(), f.len()), (HEADROOM, 0));
        let rx = f.buf_for_rx();
        assert_eq!(rx.len(), DATA_CAP);
        rx[..3].copy_from_slice(b"abc");
        f.set_len(3);
        assert_eq!(f.data(), b"abc");
        f.set_len(DATA_CAP);
        assert_eq!(f.data_mut().len(), DATA_CAP);
    }

    #[test]
    fn a_frame_entered_the_switch_when_it_entered_its_ring_until_reset() {
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        let now = Instant::from_nanos(1_000_000);
        assert_eq!(f.entered(now), now);
        f.set_ring_wait(250_000);
        assert_eq!(f.entered(now), Instant::from_nanos(750_000));
        f.set_ring_wait(5_000_000);
        assert_eq!(
            f.entered(now),
            Instant::ZERO,
            "never before the clock's zero"
        );
        pool.put(f);
        let f = pool.get().unwrap();
        assert_eq!(f.entered(now), now, "a recycled frame has waited nowhere");
    }

    #[test]
    fn fill_from_rejects_oversize() {
        let mut pool = FramePool::new(1);
        let mut f = pool.get().unwrap();
        assert!(f.fill_from(&[1; DATA_CAP]));
        assert!(!f.fill_from(&[1; DATA_CAP + 1]));
        assert!(f.is_empty());
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_past_capacity_is_a_bug() {
        let mut pool = FramePool::new(1);
        pool.get().unwrap().set_len(DATA_CAP + 1);
    }

    #[test]
    fn grow_adds_free_frames_and_capacity() {
        let mut pool = FramePool::new(1);
        let held = pool.get().unwrap();
        assert!(pool.get().is_none());
        pool.grow(2);
        assert_eq!((pool.available(), pool.capacity()), (2, 3));
        pool.put(held);
        assert_eq!(pool.available(), 3);
    }

    #[test]
    fn pool_exhausts_and_never_grows() {
        let mut pool = FramePool::new(3);
        let taken: Vec<Frame> = (0..3).map(|_| pool.get().unwrap()).collect();
        assert_eq!(pool.available(), 0);
        assert!(pool.get().is_none());
        let buffers: Vec<*const u8> = taken.iter().map(|f| f.buf.as_ptr()).collect();
        for f in taken {
            pool.put(f);
        }
        // A frame from elsewhere is freed, not added: the pool never holds more than capacity.
        let mut other = FramePool::new(1);
        pool.put(other.get().unwrap());
        assert_eq!((pool.available(), pool.capacity()), (3, 3));
        // The same three buffers come back, reset; no new ones were made.
        let mut again: Vec<*const u8> = Vec::new();
        while let Some(f) = pool.get() {
            assert_eq!((f.headroom(), f.len()), (HEADROOM, 0));
            again.push(f.buf.as_ptr());
        }
        again.sort();
        let mut buffers = buffers;
        buffers.sort();
        assert_eq!(again, buffers);
    }
}
