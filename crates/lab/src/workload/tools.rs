//! External tools: iperf3, sockperf and memcached, run in the VM namespaces. Their servers
//! run for the whole run; their clients measure.

use super::pacing::{nth_send_time, request_count, sleep_until};
use super::rpc::ProbeBook;
use super::{
    is_timeout, new_histogram, Endpoints, ReceiverSide, SenderSide, Window, BIN_MS, MAX_LATENCY_NS,
};
use anyhow::{anyhow, bail, Context, Result};
use picnic_netns as netns;
use picnic_scenario::{self as scenario, Protocol, Workload};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Runs a tool's server in namespace `ns` from before the run starts until a second after
/// its deadline; the client side measures.
pub(super) fn tool_server(
    ns: &str,
    tool: &str,
    args: &[&str],
    wait_t0: impl FnOnce() -> Result<Window>,
) -> Result<ReceiverSide> {
    let mut child = netns::exec_in(ns, tool)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| {
            format!(
                "starting the {tool} server (Debian package {})",
                netns::debian_package(tool)
            )
        })?;
    std::thread::sleep(Duration::from_millis(300));
    let window = wait_t0();
    if let Ok(w) = &window {
        sleep_until(w.deadline() + Duration::from_secs(1));
    }
    let _ = child.kill();
    let _ = child.wait();
    window.map(|_| ReceiverSide::default())
}

/// iperf3 client with `flows` streams; its JSON report gives bytes received and a 100 ms
/// interval series (spread evenly over the 10 ms bins).
pub(super) fn iperf3_client(ep: &Endpoints, flows: u32, w: Window) -> Result<SenderSide> {
    sleep_until(w.start);
    let secs = (w.stop - w.start).as_secs_f64().max(0.1);
    let out = netns::exec_in(&ep.from_ns, "iperf3")
        .args([
            "-c",
            &ep.to.ip().to_string(),
            "-p",
            &ep.to.port().to_string(),
            "-t",
            &format!("{secs:.1}"),
            "-P",
            &flows.to_string(),
            "-i",
            "0.1",
            "-J",
        ])
        .output()
        .context("running iperf3 (Debian package iperf3)")?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow!(
            "iperf3 output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(err) = json.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {err}");
    }
    let bytes = json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    let mut series = vec![0u64; w.bins];
    let offset = (w.start - w.t0).as_millis() as u64;
    for iv in json["intervals"].as_array().into_iter().flatten() {
        let start_ms = (iv["sum"]["start"].as_f64().unwrap_or(0.0) * 1000.0) as u64 + offset;
        let end_ms = (iv["sum"]["end"].as_f64().unwrap_or(0.0) * 1000.0) as u64 + offset;
        let b = iv["sum"]["bytes"].as_u64().unwrap_or(0);
        let (first, last) = ((start_ms / BIN_MS) as usize, (end_ms / BIN_MS) as usize);
        let n = (last.saturating_sub(first)).max(1) as u64;
        for bin in series.iter_mut().skip(first).take(n as usize) {
            *bin += b / n;
        }
    }
    Ok(SenderSide {
        sent: 0,
        received: Some(ReceiverSide {
            received: 0,
            bytes,
            series,
            done_at: None,
        }),
        latency: None,
    })
}

/// sockperf ping-pong client. sockperf runs whole seconds and leaves its start out of the
/// measurement (a 400 ms warm-up and its start-up, about 0.85 s in all here); its full log
/// holds every measured round trip, which all go into the histogram, binned by send time
/// counted back from the end of its run. Loss = 1 - received / sent over its measured
/// period.
pub(super) fn sockperf_client(ep: &Endpoints, wl: &Workload, w: Window) -> Result<SenderSide> {
    sleep_until(w.start);
    let secs = (w.stop - w.start).as_secs().max(1);
    let rate = wl.rate_pps.unwrap_or(scenario::DEFAULT_RPC_RATE);
    let log = std::env::temp_dir().join(format!(
        "picnic-sockperf-{}-{}.csv",
        std::process::id(),
        ep.to.port()
    ));
    let mut cmd = netns::exec_in(&ep.from_ns, "sockperf");
    cmd.args([
        "ping-pong".to_string(),
        "-i".to_string(),
        ep.to.ip().to_string(),
        "-p".to_string(),
        ep.to.port().to_string(),
        format!("--mps={rate}"),
        "-t".to_string(),
        secs.to_string(),
        format!("--msg-size={}", wl.size()),
        "--full-rtt".to_string(),
        "--full-log".to_string(),
        log.display().to_string(),
    ]);
    if wl.protocol.unwrap_or_default() == Protocol::Tcp {
        cmd.arg("--tcp");
    }
    let out = cmd
        .output()
        .context("running sockperf (Debian package sockperf)")?;
    let full_log = std::fs::read_to_string(&log);
    let _ = std::fs::remove_file(&log);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "sockperf failed: {}{}",
            stdout.lines().last().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (sent, received) = sockperf_counts(&stdout)?;
    let round_trips = sockperf_round_trips(&full_log.context("reading sockperf's full log")?)?;
    let mut hist = new_histogram()?;
    let mut series = vec![0u64; w.bins];
    let run_end = w.start + Duration::from_secs(secs);
    let last_tx = round_trips.last().map_or(0.0, |&(tx, _)| tx);
    for &(tx, rtt_us) in &round_trips {
        let _ = hist.record(((rtt_us * 1e3) as u64).clamp(1, MAX_LATENCY_NS));
        let at = run_end
            .checked_sub(Duration::from_secs_f64((last_tx - tx).max(0.0)))
            .unwrap_or(w.start);
        if let Some(b) = series.get_mut(w.bin(at)) {
            *b += wl.size() as u64;
        }
    }
    Ok(SenderSide {
        sent,
        received: Some(ReceiverSide {
            received,
            bytes: received * wl.size() as u64,
            series,
            done_at: None,
        }),
        latency: Some(hist),
    })
}

/// Messages sent and received in sockperf's measured period, from its summary line
/// `[Valid Duration] RunTime=0.549 sec; SentMessages=550; ReceivedMessages=550`.
fn sockperf_counts(stdout: &str) -> Result<(u64, u64)> {
    let line = stdout
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .ok_or_else(|| anyhow!("sockperf printed no [Valid Duration] summary"))?;
    let field = |name: &str| -> Result<u64> {
        line.split(';')
            .find_map(|part| part.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("sockperf summary without {name}: {line}"))
    };
    Ok((field("SentMessages=")?, field("ReceivedMessages=")?))
}

/// (send time in s, round trip in us) of every row of sockperf's `--full-log`, whose rows
/// read `packet, txTime(sec), rxTime(sec), rtt(usec)` between separator lines.
fn sockperf_round_trips(log: &str) -> Result<Vec<(f64, f64)>> {
    let mut rows = Vec::new();
    for line in log.lines() {
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        if cols.len() != 4 || cols[0].parse::<u64>().is_err() {
            continue; // header, summary and separator lines
        }
        let tx = cols[1].parse::<f64>();
        let rtt = cols[3].parse::<f64>();
        match (tx, rtt) {
            (Ok(tx), Ok(rtt)) if rtt >= 0.0 => rows.push((tx, rtt)),
            _ => bail!("sockperf full log: unreadable row `{line}`"),
        }
    }
    Ok(rows)
}

/// memcached client: stores one `size`-byte value, then `get`s it at `rate` over one TCP
/// connection with one request outstanding (a late answer counts as lost; ticks missed
/// while waiting are skipped, as in the TCP RPC probe).
pub(super) fn memcached_client(
    ep: &Endpoints,
    size: usize,
    rate: u64,
    timeout: Duration,
    w: Window,
) -> Result<SenderSide> {
    let mut conn = TcpStream::connect_timeout(&ep.to.into(), Duration::from_secs(2))
        .context("connecting to memcached")?;
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut set = format!("set picnic 0 0 {size}\r\n").into_bytes();
    set.extend(std::iter::repeat_n(b'x', size));
    set.extend_from_slice(b"\r\n");
    conn.write_all(&set)
        .context("storing the value in memcached")?;
    let mut reply = [0u8; 8];
    conn.read_exact(&mut reply)
        .context("memcached did not answer the set")?;
    if &reply != b"STORED\r\n" {
        bail!(
            "memcached answered the set with `{}`",
            String::from_utf8_lossy(&reply).trim()
        );
    }
    // VALUE picnic 0 SIZE\r\n DATA \r\n END\r\n
    let answer_len = format!("VALUE picnic 0 {size}\r\n").len() + size + 2 + 5;
    let count = request_count(rate, &w);
    let mut book = ProbeBook::new(count, w.bins, timeout)?;
    let mut rx = vec![0u8; answer_len];
    let mut sent = 0u64;
    let mut n = 0u64;
    sleep_until(w.start);
    loop {
        let due = nth_send_time(w.start, n, rate);
        if due >= w.stop || n as usize >= count {
            break;
        }
        sleep_until(due);
        let sent_at = Instant::now();
        conn.write_all(b"get picnic\r\n")
            .context("memcached client sending")?;
        sent += 1;
        let give_up = sent_at + timeout;
        let mut filled = 0;
        while filled < answer_len && Instant::now() < give_up {
            conn.set_read_timeout(Some(
                (give_up - Instant::now()).max(Duration::from_micros(100)),
            ))?;
            match conn.read(&mut rx[filled..]) {
                Ok(0) => bail!("memcached closed the connection"),
                Ok(len) => filled += len,
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e).context("memcached client receiving"),
            }
        }
        if filled < answer_len {
            // Timed out: the rest of this answer would be read as the next one's.
            bail!("memcached did not answer within {timeout:?}; the connection is out of step");
        }
        if !rx.ends_with(b"END\r\n") {
            bail!(
                "memcached answered `{}`",
                String::from_utf8_lossy(&rx).trim()
            );
        }
        let now = Instant::now();
        book.on_answer(&w, n, (now - sent_at).as_nanos() as u64, now, answer_len);
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
    fn sockperf_output_is_read() {
        let stdout = "sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=1001; ReceivedMessages=1001\n\
                      sockperf: [Valid Duration] RunTime=0.549 sec; SentMessages=550; ReceivedMessages=548\n";
        assert_eq!(sockperf_counts(stdout).unwrap(), (550, 548));
        assert!(sockperf_counts("sockperf: error").is_err());
        let log = "sockperf: ---> <MIN> observation =   10.776\n\
                   ------------------------------\n\
                   packet, txTime(sec), rxTime(sec), rtt(usec)\n\
                   0, 2.401662625, 2.401721663, 59.038\n\
                   1, 2.402662628, 2.402723149, 60.521\n\
                   ------------------------------\n";
        assert_eq!(
            sockperf_round_trips(log).unwrap(),
            vec![(2.401662625, 59.038), (2.402662628, 60.521)]
        );
        assert!(sockperf_round_trips("7, x, y, z\n").is_err());
    }
}
