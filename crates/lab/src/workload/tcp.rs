//! Bulk TCP: `flows` connections writing as fast as they can (or a fixed transfer), and the
//! sink that counts what they deliver.

use super::pacing::sleep_until;
use super::{is_timeout, Endpoints, ReceiverSide, SenderSide, Window, POLL};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Accepts one connection on `listener`, or `None` if none arrives before `deadline`.
pub(super) fn accept_until(listener: &TcpListener, deadline: Instant) -> Result<Option<TcpStream>> {
    listener.set_nonblocking(true)?;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)?;
                return Ok(Some(conn));
            }
            Err(e) if is_timeout(&e) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e).context("accepting"),
        }
    }
    Ok(None)
}

/// TCP sink: accepts up to `flows` connections and counts what they deliver: until the
/// stop time, or with `expected` (a transfer) all bytes until the deadline, noting when
/// the `expected`-th byte arrived.
pub(super) fn tcp_sink(
    listener: &TcpListener,
    flows: u32,
    expected: Option<u64>,
    w: Window,
) -> Result<ReceiverSide> {
    let mut readers = Vec::new();
    for _ in 0..flows {
        let Some(mut conn) = accept_until(listener, w.deadline())? else {
            break;
        };
        conn.set_read_timeout(Some(POLL))?;
        readers.push(std::thread::spawn(move || -> ReceiverSide {
            let mut out = ReceiverSide {
                series: vec![0; w.bins],
                ..Default::default()
            };
            let mut buf = vec![0u8; 1 << 16];
            while Instant::now() < w.deadline() {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(len) => {
                        let now = Instant::now();
                        if now <= w.stop || expected.is_some() {
                            out.bytes += len as u64;
                            out.done_at = Some(now);
                        }
                        if let Some(b) = out.series.get_mut(w.bin(now)) {
                            *b += len as u64;
                        }
                    }
                    Err(e) if is_timeout(&e) => {}
                    Err(_) => break,
                }
            }
            out
        }));
    }
    let mut total = ReceiverSide {
        series: vec![0; w.bins],
        ..Default::default()
    };
    for r in readers {
        let part = r.join().map_err(|_| anyhow!("TCP reader panicked"))?;
        total.bytes += part.bytes;
        total.done_at = total.done_at.max(part.done_at);
        for (t, p) in total.series.iter_mut().zip(&part.series) {
            *t += p;
        }
    }
    if expected.is_none_or(|e| total.bytes < e) {
        total.done_at = None;
    }
    Ok(total)
}

/// Bulk TCP client: `flows` connections writing as fast as they can until the stop time,
/// or each exactly `bytes` (a transfer) and then closing.
pub(super) fn tcp_bulk(
    ep: &Endpoints,
    flows: u32,
    bytes: Option<u64>,
    w: Window,
) -> Result<SenderSide> {
    sleep_until(w.start);
    let mut writers = Vec::new();
    let mut unconnected = 0;
    for _ in 0..flows {
        let Some(mut conn) = connect_until(ep, w.stop)? else {
            unconnected += 1;
            continue;
        };
        conn.set_write_timeout(Some(POLL))?;
        writers.push(std::thread::spawn(move || {
            let buf = vec![0x5au8; 1 << 16];
            let mut left = bytes.unwrap_or(u64::MAX);
            while left > 0 && Instant::now() < w.stop {
                let chunk = &buf[..buf.len().min(left.try_into().unwrap_or(usize::MAX))];
                match conn.write(chunk) {
                    Ok(n) => left -= n as u64,
                    Err(e) if is_timeout(&e) => {}
                    Err(_) => break,
                }
            }
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }));
    }
    if writers.is_empty() {
        bail!(
            "no bulk TCP flow to {} connected before the workload stopped",
            ep.to
        );
    }
    if unconnected > 0 {
        eprintln!(
            "[lab] bulk TCP to {}: {unconnected} of {flows} flows did not connect before the \
             workload stopped (their SYNs were dropped: the tenant's own limits, or loss)",
            ep.to
        );
    }
    for wr in writers {
        wr.join().map_err(|_| anyhow!("TCP writer panicked"))?;
    }
    Ok(SenderSide::default())
}

/// Connects a bulk flow, trying again until `stop`: a tenant throttled for its own CPU or
/// packet budget has its SYNs dropped like any frame, and the kernel's SYN back-off (1 s,
/// 3 s, ...) can outlast one attempt. `None` if no attempt connected before `stop`.
fn connect_until(ep: &Endpoints, stop: Instant) -> Result<Option<TcpStream>> {
    loop {
        let left = stop.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        match TcpStream::connect_timeout(&ep.to.into(), left.min(Duration::from_secs(2))) {
            Ok(conn) => return Ok(Some(conn)),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e).context("connecting a bulk TCP flow"),
        }
    }
}
