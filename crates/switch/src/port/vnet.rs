//! What a port does with a VM's transmit offloads (DESIGN.md section 4, "Ports"): frames
//! read with a virtio-net header (TAP `IFF_VNET_HDR`, AF_PACKET `PACKET_VNET_HDR`) are made
//! complete before the engines see them, with the sans-I/O code of
//! [`picnic_wire::offload`]:
//!
//! - a partial checksum (`VIRTIO_NET_HDR_F_NEEDS_CSUM`, what veth/TAP transmit checksum
//!   offload leaves) is completed in place and counted in [`PortStats::rx_csum_partial`];
//! - a TSO/USO super-frame (up to 64 KiB) is copied into the port's one super-frame buffer
//!   and segmented into pool frames of at most the port's `max_frame` bytes, each a frame for
//!   the engines (accounting, WFQ and limiters see segments); counted in
//!   [`PortStats::rx_gso_frames`] and [`PortStats::rx_gso_segments`]. When the pool runs dry,
//!   segmenting pauses (the port reads nothing more) and resumes on the next receive, as any
//!   frame waits in the kernel for a free buffer: memory stays one buffer per port, nothing
//!   is lost;
//! - anything that cannot be completed (unknown GSO type, offsets outside the frame, a UDP
//!   segment over the limit) is dropped and counted in [`PortStats::rx_offload_errors`].
//!
//! Nothing is handed on: frames leave with a zero header (complete, not GSO). Every frame
//! crosses the engines as one MTU-sized frame and most leave encapsulated for the uplink,
//! where the inner checksum has to be complete anyway; handing a partial checksum on to a
//! local VM's port would only save the sum for same-host traffic.

use picnic_wire::offload::{complete_checksum, GsoType, Segmenter, VnetHdr, GSO_MAX_FRAME};

use super::PortStats;
use crate::frame::{Frame, FramePool, DATA_CAP};

/// The header sent before every transmitted frame: complete, not GSO.
pub(super) static TX_HDR: [u8; picnic_wire::offload::VNET_HDR_LEN] = [0; 10];

/// What became of a frame offered to [`VnetRx`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Taken {
    /// Delivered, segmenting started, or dropped and counted: the kernel's copy can go.
    Done,
    /// No pool frame was free: keep the kernel's copy and try again later.
    NoFrame,
}

/// The receive side of a port with a virtio-net header: the buffer one super-frame is read
/// or copied into, and its segmentation in progress.
pub(super) struct VnetRx {
    max_frame: usize,
    buf: Box<[u8]>,
    /// Bytes of the super-frame in `buf` while `pending` segments it.
    len: usize,
    pending: Option<Segmenter>,
}

impl VnetRx {
    /// Segments of at most `max_frame` bytes (clamped to a pool frame's [`DATA_CAP`]).
    pub(super) fn new(max_frame: usize) -> VnetRx {
        VnetRx {
            max_frame: max_frame.min(DATA_CAP),
            buf: vec![0u8; GSO_MAX_FRAME].into_boxed_slice(),
            len: 0,
            pending: None,
        }
    }

    /// Whether a super-frame is still being segmented (then nothing new may be read).
    pub(super) fn busy(&self) -> bool {
        self.pending.is_some()
    }

    /// The super-frame buffer, [`GSO_MAX_FRAME`] bytes, to read a frame too big for a pool
    /// frame into; then call [`VnetRx::take_buffered`]. Only while not [`VnetRx::busy`].
    pub(super) fn buf_mut(&mut self) -> &mut [u8] {
        debug_assert!(!self.busy());
        &mut self.buf
    }

    /// A frame received whole into pool frame `frame`, after virtio-net header `hdr`.
    pub(super) fn take_frame(
        &mut self,
        hdr: &[u8],
        mut frame: Frame,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        stats: &mut PortStats,
    ) {
        let h = match VnetHdr::parse(hdr) {
            Ok(h) => h,
            Err(_) => {
                stats.rx_offload_errors += 1;
                pool.put(frame);
                return;
            }
        };
        if h.gso != GsoType::None {
            self.buf[..frame.len()].copy_from_slice(frame.data());
            let len = frame.len();
            pool.put(frame);
            self.start(&h, len, stats);
            return;
        }
        if h.needs_csum {
            if complete_checksum(frame.data_mut(), h.csum_start, h.csum_offset).is_err() {
                stats.rx_offload_errors += 1;
                pool.put(frame);
                return;
            }
            stats.rx_csum_partial += 1;
        }
        stats.rx_frames += 1;
        stats.rx_bytes += frame.len() as u64;
        out.push(frame);
    }

    /// A frame the kernel handed over whole in `bytes` (a receive ring slot), after
    /// virtio-net header `hdr`.
    pub(super) fn take_slice(
        &mut self,
        hdr: &[u8],
        bytes: &[u8],
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        stats: &mut PortStats,
    ) -> Taken {
        let gso = VnetHdr::parse(hdr).map(|h| h.gso != GsoType::None);
        if gso == Ok(true) && bytes.len() <= self.buf.len() {
            self.buf[..bytes.len()].copy_from_slice(bytes);
            return self.take_buffered(hdr, bytes.len(), pool, out, stats);
        }
        if bytes.len() > DATA_CAP {
            stats.rx_oversize += 1;
            return Taken::Done;
        }
        let Some(mut frame) = pool.get() else {
            return Taken::NoFrame;
        };
        frame.fill_from(bytes);
        self.take_frame(hdr, frame, pool, out, stats);
        Taken::Done
    }

    /// A frame of `len` bytes read into [`VnetRx::buf_mut`], after virtio-net header `hdr`.
    pub(super) fn take_buffered(
        &mut self,
        hdr: &[u8],
        len: usize,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        stats: &mut PortStats,
    ) -> Taken {
        let Ok(h) = VnetHdr::parse(hdr) else {
            stats.rx_offload_errors += 1;
            return Taken::Done;
        };
        let len = len.min(self.buf.len());
        if h.gso != GsoType::None {
            self.start(&h, len, stats);
            return Taken::Done;
        }
        if len > DATA_CAP {
            stats.rx_oversize += 1;
            return Taken::Done;
        }
        let Some(mut frame) = pool.get() else {
            stats.rx_dropped += 1;
            return Taken::Done;
        };
        frame.fill_from(&self.buf[..len]);
        self.take_frame(hdr, frame, pool, out, stats);
        Taken::Done
    }

    /// Plans the segments of the super-frame in `buf[..len]`.
    fn start(&mut self, h: &VnetHdr, len: usize, stats: &mut PortStats) {
        match Segmenter::new(&self.buf[..len], h, self.max_frame) {
            Ok(s) => {
                stats.rx_gso_frames += 1;
                self.len = len;
                self.pending = Some(s);
            }
            Err(_) => stats.rx_offload_errors += 1,
        }
    }

    /// Moves up to `max` segments of the super-frame in progress into `out`, as frames
    /// from `pool`; stops early when the pool is empty. Returns how many.
    pub(super) fn drain(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
        stats: &mut PortStats,
    ) -> usize {
        let mut n = 0;
        while n < max {
            let Some(seg) = self.pending.as_mut() else {
                break;
            };
            if seg.remaining() == 0 {
                self.pending = None;
                break;
            }
            let Some(mut frame) = pool.get() else {
                break;
            };
            match seg.next_into(&self.buf[..self.len], frame.buf_for_rx()) {
                Ok(Some(len)) => {
                    frame.set_len(len);
                    stats.rx_gso_segments += 1;
                    stats.rx_frames += 1;
                    stats.rx_bytes += len as u64;
                    out.push(frame);
                    n += 1;
                }
                // Planned for this buffer and at most a pool frame long: cannot fail; were
                // it to, the rest of the super-frame is dropped.
                Ok(None) | Err(_) => {
                    pool.put(frame);
                    self.pending = None;
                }
            }
        }
        if self.pending.as_ref().is_some_and(|s| s.remaining() == 0) {
            self.pending = None;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use picnic_wire::etherparse::PacketBuilder;

    fn tcp_super(payload: usize) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64)
            .tcp(1, 2, 100, 1000)
            .write(&mut out, &vec![7u8; payload])
            .unwrap();
        out
    }

    fn tso(gso_size: u16) -> [u8; 10] {
        VnetHdr {
            needs_csum: true,
            gso: GsoType::TcpV4,
            gso_size,
            csum_start: 34,
            csum_offset: 16,
            ..VnetHdr::NONE
        }
        .to_bytes()
    }

    /// Bounded memory: with 3 free frames a 10-segment super-frame pauses after 3 and
    /// resumes as frames come back; nothing is lost or read meanwhile.
    #[test]
    fn segmenting_pauses_when_the_pool_is_empty_and_resumes() {
        let mut pool = FramePool::new(3);
        let mut rx = VnetRx::new(1514);
        let mut stats = PortStats::default();
        let mut out = Vec::new();
        let frame = tcp_super(10 * 1000);
        let taken = rx.take_slice(&tso(1000), &frame, &mut pool, &mut out, &mut stats);
        assert_eq!(taken, Taken::Done);
        assert!(out.is_empty() && rx.busy());
        assert_eq!(rx.drain(&mut pool, &mut out, 64, &mut stats), 3);
        assert!(rx.busy(), "paused, not dropped");
        let mut seen = 3;
        while rx.busy() {
            for f in out.drain(..) {
                pool.put(f);
            }
            seen += rx.drain(&mut pool, &mut out, 2, &mut stats);
        }
        assert_eq!(seen, 10);
        assert_eq!((stats.rx_gso_frames, stats.rx_gso_segments), (1, 10));
        assert_eq!(stats.rx_frames, 10);
        assert_eq!(stats.rx_offload_errors, 0);
    }

    #[test]
    fn partial_checksum_is_completed_and_bad_headers_are_dropped() {
        let mut pool = FramePool::new(4);
        let mut rx = VnetRx::new(1514);
        let mut stats = PortStats::default();
        let mut out = Vec::new();
        let good = tcp_super(100);
        let mut partial = good.clone();
        // Whether the result is right is picnic_wire::offload's test; here, that it runs.
        partial[50..52].copy_from_slice(&[0, 0]);
        let needs_csum = VnetHdr {
            needs_csum: true,
            csum_start: 34,
            csum_offset: 16,
            ..VnetHdr::NONE
        };
        rx.take_slice(
            &needs_csum.to_bytes(),
            &partial,
            &mut pool,
            &mut out,
            &mut stats,
        );
        assert_eq!(stats.rx_csum_partial, 1);
        assert_eq!(out.len(), 1);
        let outside = VnetHdr {
            csum_offset: 500,
            ..needs_csum
        };
        rx.take_slice(&outside.to_bytes(), &good, &mut pool, &mut out, &mut stats);
        let mut ufo = [0u8; 10];
        ufo[1] = 3;
        rx.take_slice(&ufo, &good, &mut pool, &mut out, &mut stats);
        assert_eq!(stats.rx_offload_errors, 2);
        assert_eq!(out.len(), 1);
        assert_eq!(pool.available(), 3, "dropped frames went back to the pool");
        // A complete frame passes untouched.
        rx.take_slice(&TX_HDR, &good, &mut pool, &mut out, &mut stats);
        assert_eq!(out[1].data(), &good[..]);
    }

    #[test]
    fn oversize_frames_without_gso_are_counted() {
        let mut pool = FramePool::new(1);
        let mut rx = VnetRx::new(1514);
        let mut stats = PortStats::default();
        let mut out = Vec::new();
        let big = vec![0u8; DATA_CAP + 1];
        rx.take_slice(&TX_HDR, &big, &mut pool, &mut out, &mut stats);
        rx.buf_mut()[..big.len()].copy_from_slice(&big);
        rx.take_buffered(&TX_HDR, big.len(), &mut pool, &mut out, &mut stats);
        assert_eq!(stats.rx_oversize, 2);
        assert!(out.is_empty());
    }
}
