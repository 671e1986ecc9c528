//! The RPC latency probe: fixed-size requests carrying a sequence number and send time, at
//! a fixed rate, echoed by a server over UDP or TCP; latencies go into an HDR histogram.

use super::pacing::{nth_send_time, request_count, sleep_until};
use super::tcp::accept_until;
use super::{
    is_timeout, new_histogram, Endpoints, ReceiverSide, SenderSide, Window, MAX_LATENCY_NS, POLL,
};
use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// Request header: sequence number and send time (ns since the run's epoch).
fn encode_request(buf: &mut [u8], seq: u64, sent_ns: u64) {
    buf[..8].copy_from_slice(&seq.to_be_bytes());
    buf[8..16].copy_from_slice(&sent_ns.to_be_bytes());
}

/// The (sequence number, send time) of a request frame, or `None` if it is too short.
fn decode_request(buf: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_be_bytes(buf.get(..8)?.try_into().ok()?);
    let sent = u64::from_be_bytes(buf.get(8..16)?.try_into().ok()?);
    Some((seq, sent))
}

/// Collects responses of a probe: latency per request, answered once and in time.
pub(super) struct ProbeBook {
    answered: Vec<bool>,
    pub(super) hist: Histogram<u64>,
    pub(super) received: ReceiverSide,
    timeout_ns: u64,
}

impl ProbeBook {
    pub(super) fn new(requests: usize, bins: usize, timeout: Duration) -> Result<ProbeBook> {
        Ok(ProbeBook {
            answered: vec![false; requests],
            hist: new_histogram()?,
            received: ReceiverSide {
                series: vec![0; bins],
                ..Default::default()
            },
            timeout_ns: timeout.as_nanos() as u64,
        })
    }

    fn on_response(&mut self, w: &Window, frame: &[u8], now: Instant) {
        let Some((seq, sent_ns)) = decode_request(frame) else {
            return;
        };
        let now_ns = now.saturating_duration_since(w.t0).as_nanos() as u64;
        self.on_answer(w, seq, now_ns.saturating_sub(sent_ns), now, frame.len());
    }

    /// Request `seq` was answered after `latency_ns` with `bytes` bytes, at `now`.
    pub(super) fn on_answer(
        &mut self,
        w: &Window,
        seq: u64,
        latency_ns: u64,
        now: Instant,
        bytes: usize,
    ) {
        let Some(done) = self.answered.get_mut(seq as usize) else {
            return;
        };
        if *done || latency_ns > self.timeout_ns {
            return; // duplicate, or too late: the request counts as lost
        }
        *done = true;
        let _ = self.hist.record(latency_ns.clamp(1, MAX_LATENCY_NS));
        self.received.received += 1;
        self.received.bytes += bytes as u64;
        if let Some(b) = self.received.series.get_mut(w.bin(now)) {
            *b += bytes as u64;
        }
    }
}

/// UDP RPC server: echoes every datagram to its sender.
pub(super) fn udp_echo(sock: &UdpSocket, w: Window) -> Result<ReceiverSide> {
    let mut buf = vec![0u8; 65536];
    while Instant::now() < w.deadline() {
        match sock.recv_from(&mut buf) {
            Ok((len, peer)) => {
                let _ = sock.send_to(&buf[..len], peer);
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("RPC server receiving"),
        }
    }
    Ok(ReceiverSide::default())
}

/// UDP RPC client: requests at a fixed rate from one thread, responses on another.
pub(super) fn rpc_udp(
    ep: &Endpoints,
    size: usize,
    rate: u64,
    timeout: Duration,
    w: Window,
) -> Result<SenderSide> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(ep.to).context("connecting the RPC socket")?;
    sock.set_read_timeout(Some(POLL))?;
    let rx_sock = sock.try_clone()?;
    let count = request_count(rate, &w);
    let mut book = ProbeBook::new(count, w.bins, timeout)?;
    let rx_deadline = w.stop + timeout;
    let receiver = std::thread::spawn(move || -> Result<ProbeBook> {
        let mut buf = vec![0u8; 65536];
        while Instant::now() < rx_deadline {
            match rx_sock.recv(&mut buf) {
                Ok(len) => book.on_response(&w, &buf[..len], Instant::now()),
                Err(e) if is_timeout(&e) => {}
                // ECONNREFUSED from an ICMP error: the request is lost, keep going.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e).context("RPC client receiving"),
            }
        }
        Ok(book)
    });
    let mut buf = vec![0u8; size];
    let mut sent = 0u64;
    for n in 0..count as u64 {
        let due = nth_send_time(w.start, n, rate);
        if due >= w.stop {
            break;
        }
        sleep_until(due);
        let now_ns = Instant::now().saturating_duration_since(w.t0).as_nanos() as u64;
        encode_request(&mut buf, n, now_ns);
        if sock.send(&buf).is_ok() {
            sent += 1;
        }
    }
    let book = receiver
        .join()
        .map_err(|_| anyhow!("RPC receiver panicked"))??;
    Ok(SenderSide {
        sent,
        received: Some(book.received),
        latency: Some(book.hist),
    })
}

/// TCP RPC server: echoes fixed-size frames on one connection.
pub(super) fn tcp_echo(listener: &TcpListener, size: usize, w: Window) -> Result<ReceiverSide> {
    let Some(mut conn) = accept_until(listener, w.deadline())? else {
        return Ok(ReceiverSide::default());
    };
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(POLL))?;
    let mut buf = vec![0u8; size];
    let mut filled = 0;
    while Instant::now() < w.deadline() {
        match conn.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(len) => {
                filled += len;
                if filled == size {
                    conn.write_all(&buf)?;
                    filled = 0;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("RPC server reading"),
        }
    }
    Ok(ReceiverSide::default())
}

/// TCP RPC client: one outstanding request; a request not answered within the timeout
/// counts as lost and its late response is skipped. Ticks missed while waiting are skipped,
/// not sent in a burst.
pub(super) fn rpc_tcp(
    ep: &Endpoints,
    size: usize,
    rate: u64,
    timeout: Duration,
    w: Window,
) -> Result<SenderSide> {
    let mut conn = TcpStream::connect_timeout(&ep.to.into(), Duration::from_secs(2))
        .context("connecting the RPC client")?;
    conn.set_nodelay(true)?;
    let count = request_count(rate, &w);
    let mut book = ProbeBook::new(count, w.bins, timeout)?;
    let mut req = vec![0u8; size];
    let mut rx = vec![0u8; size];
    let mut filled = 0;
    let mut sent = 0u64;
    let mut n = 0u64;
    loop {
        let due = nth_send_time(w.start, n, rate);
        if due >= w.stop || n as usize >= count {
            break;
        }
        sleep_until(due);
        let sent_at = Instant::now();
        encode_request(
            &mut req,
            n,
            sent_at.saturating_duration_since(w.t0).as_nanos() as u64,
        );
        conn.write_all(&req).context("RPC client sending")?;
        sent += 1;
        let give_up = sent_at + timeout;
        // Read frames until this request's response arrives or the timeout passes.
        'wait: while Instant::now() < give_up {
            conn.set_read_timeout(Some(
                (give_up - Instant::now()).max(Duration::from_micros(100)),
            ))?;
            match conn.read(&mut rx[filled..]) {
                Ok(0) => bail!("RPC server closed the connection"),
                Ok(len) => {
                    filled += len;
                    if filled == size {
                        filled = 0;
                        book.on_response(&w, &rx, Instant::now());
                        if decode_request(&rx).map(|(s, _)| s) == Some(n) {
                            break 'wait;
                        }
                    }
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e).context("RPC client receiving"),
            }
        }
        n += 1;
        while nth_send_time(w.start, n, rate) < Instant::now() {
            n += 1;
        }
    }
    Ok(SenderSide {
        sent,
        received: Some(book.received),
        latency: Some(book.hist),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_counts_late_and_duplicate_responses_as_lost() {
        let t0 = Instant::now();
        let w = Window {
            t0,
            start: t0,
            stop: t0 + Duration::from_secs(1),
            bins: 200,
        };
        let mut book = ProbeBook::new(3, w.bins, Duration::from_millis(10)).unwrap();
        let mut frame = [0u8; 16];
        encode_request(&mut frame, 0, 0);
        book.on_response(&w, &frame, t0 + Duration::from_micros(50));
        book.on_response(&w, &frame, t0 + Duration::from_micros(60));
        encode_request(&mut frame, 1, 0);
        book.on_response(&w, &frame, t0 + Duration::from_millis(20));
        encode_request(&mut frame, 7, 0);
        book.on_response(&w, &frame, t0 + Duration::from_micros(50));
        assert_eq!(book.received.received, 1);
        assert_eq!(book.hist.len(), 1);
        assert!((49_000..=51_000).contains(&book.hist.value_at_quantile(0.5)));
    }

    #[test]
    fn requests_encode_and_decode() {
        let mut frame = [0u8; 20];
        encode_request(&mut frame, 0x0102, 0x0A0B0C);
        assert_eq!(
            frame[..16],
            [0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0x0A, 0x0B, 0x0C]
        );
        assert_eq!(decode_request(&frame), Some((0x0102, 0x0A0B0C)));
        assert_eq!(decode_request(&frame[..15]), None);
    }
}
