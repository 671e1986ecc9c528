//! UDP flood and sink, batched with sendmmsg/recvmmsg.

use super::pacing::{nth_send_time, sleep_until};
use super::{is_timeout, Endpoints, ReceiverSide, SenderSide, Window};
use anyhow::{Context, Result};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Datagrams per sendmmsg/recvmmsg call.
const BATCH: usize = 32;

/// Preallocated buffers and headers for sendmmsg/recvmmsg on a connected UDP socket, so a
/// flood costs one syscall per [`BATCH`] datagrams and no allocation.
struct MmsgBatch {
    bufs: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers only point into the batch's own heap buffers.
unsafe impl Send for MmsgBatch {}

impl MmsgBatch {
    /// `BATCH` buffers of `len` bytes; the headers point into them (the heap buffers never
    /// move or resize, so the pointers stay valid when the struct moves).
    fn new(len: usize) -> MmsgBatch {
        let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; len]).collect();
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let hdrs = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: an all-zero msghdr is valid (no name, no control data).
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        MmsgBatch { bufs, iovs, hdrs }
    }

    /// Sends the first `n` buffers; returns how many left.
    fn send(&mut self, sock: &UdpSocket, n: usize) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // SAFETY: hdrs[..n] point at live iovecs and buffers owned by self.
        let rc = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n.min(BATCH) as u32,
                0,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// Receives up to [`BATCH`] datagrams (blocking for the first, up to the socket's read
    /// timeout); returns their lengths through `lens`.
    fn recv(&mut self, sock: &UdpSocket, lens: &mut [usize; BATCH]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        for (h, iov) in self.hdrs.iter_mut().zip(&self.iovs) {
            h.msg_len = 0;
            h.msg_hdr.msg_iov = iov as *const libc::iovec as *mut libc::iovec;
        }
        // SAFETY: as in send; the kernel writes at most iov_len bytes per buffer.
        let rc = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for (len, h) in lens.iter_mut().zip(&self.hdrs).take(rc as usize) {
            *len = h.msg_len as usize;
        }
        Ok(rc as usize)
    }
}

/// UDP flood: datagrams of `size` bytes carrying a sequence number, sent in sendmmsg
/// batches, paced at `rate` (the batch is what is due by the clock, spinning between) or
/// unlimited, optionally gated ON/OFF.
pub(super) fn udp_flood(
    ep: &Endpoints,
    size: usize,
    rate: Option<u64>,
    on_off: Option<(Duration, Duration)>,
    w: Window,
) -> Result<SenderSide> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(ep.to).context("connecting the flood socket")?;
    let mut batch = MmsgBatch::new(size);
    let mut sent = 0u64;
    // Paced mode counts packets from the start of the current ON phase (the whole window
    // without ON/OFF), so an OFF phase is not made up for with a burst when ON resumes.
    let mut phase_start = w.start;
    let mut scheduled = 0u64;
    sleep_until(w.start);
    loop {
        let now = Instant::now();
        if now >= w.stop {
            break;
        }
        let mut on_end = w.stop;
        if let Some((on, off)) = on_off {
            // EyeQ 2.2's bursty neighbour: ON at full rate, then silent.
            let period = on + off;
            while now >= phase_start + period {
                phase_start += period;
                scheduled = 0;
            }
            on_end = (phase_start + on).min(w.stop);
            if now >= on_end {
                sleep_until((phase_start + period).min(w.stop));
                continue;
            }
        }
        let n = match rate {
            None => BATCH,
            Some(rate) => {
                let due = nth_send_time(phase_start, scheduled, rate);
                if due >= on_end {
                    sleep_until(on_end);
                    continue;
                }
                if due > now {
                    sleep_until(due);
                }
                let elapsed = Instant::now()
                    .saturating_duration_since(phase_start)
                    .as_nanos();
                let due_total = (elapsed * rate as u128 / 1_000_000_000) as u64 + 1;
                (due_total.saturating_sub(scheduled) as usize).clamp(1, BATCH)
            }
        };
        for (i, buf) in batch.bufs.iter_mut().take(n).enumerate() {
            buf[..8].copy_from_slice(&(sent + i as u64).to_be_bytes());
        }
        match batch.send(&sock, n) {
            Ok(k) => {
                sent += k as u64;
                scheduled += n as u64;
            }
            // A full queue (ENOBUFS) or an ICMP error: nothing left; try again.
            Err(_) => std::thread::yield_now(),
        }
    }
    Ok(SenderSide {
        sent,
        ..Default::default()
    })
}

/// UDP sink: counts datagrams and bytes per bin, with recvmmsg batches.
pub(super) fn udp_sink(sock: &UdpSocket, w: Window) -> Result<ReceiverSide> {
    let mut out = ReceiverSide {
        series: vec![0; w.bins],
        ..Default::default()
    };
    let mut batch = MmsgBatch::new(65536);
    let mut lens = [0usize; BATCH];
    while Instant::now() < w.deadline() {
        match batch.recv(sock, &mut lens) {
            Ok(k) => {
                let now = Instant::now();
                let bytes: usize = lens[..k].iter().sum();
                out.received += k as u64;
                out.bytes += bytes as u64;
                if let Some(b) = out.series.get_mut(w.bin(now)) {
                    *b += bytes as u64;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("receiving"),
        }
    }
    Ok(out)
}
