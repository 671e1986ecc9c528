//! Benchmark (issue 31; docs/BENCHMARKS.md "A guest on vhost-user, TAP and a Linux bridge"):
//! one QEMU guest (scripts/guest.sh, format 3) and a container tenant (a veth in a namespace)
//! on one host, the guest reaching the container
//!
//! - on vhost-user served by picnic (`backend = "vhost_user"`),
//! - on a TAP whose host side picnic serves (`backend = "tap"`),
//! - on a TAP in a Linux bridge with the container's veth (no picnic),
//!
//! with the guest's default offloads, and each picnic path again with the virtio-net
//! device's offloads off (`csum=off,host_tso4=off,...`). The same traffic each time: the guest
//! sends `PICNIC_BENCH_MIB` (16) MiB over TCP to the container, then receives as much from
//! it, `PICNIC_BENCH_ROUNDS` (5) times in one boot; the container times each transfer (from
//! its accept to the last byte read, or to the guest's acknowledgement of the last byte
//! sent). Then the container pings the guest 20 times, 50 ms apart. Printed: the median and
//! range of each. `PICNIC_BENCH_ONLY=WORD` runs the cases whose name contains WORD.
//!
//! Ignored (minutes, and the figures are for reading, not asserting); as root:
//!
//! ```sh
//! flock /tmp/picnic-lab.lock cargo test --release -p picnic-switch --test guest_bench -- \
//!   --ignored --nocapture
//! ```
//!
//! What it asserts: every transfer completed and each case's offloads are what it asked for.

mod common;
mod qemu;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::is_root;
use picnic_switch::config::Config;
use picnic_switch::port::PortStats;
use picnic_switch::runner::Switch;
use qemu::{
    diagnostics, guest_image, namespaces, reports, vhost_config, wait_for, Accel, Attach, Boot,
    CONFIG, CTR_IP, GUEST_IP, TAP,
};

/// The container's sink (the guest sends to it); the source is the next port.
const PORT: u16 = 7000;
/// Boot, every round and the pings, TCG included.
const CASE_DEADLINE: Duration = Duration::from_secs(400);
/// The virtio-net device with every offload off (QEMU's properties; the guest's follow).
const OFFLOADS_OFF: &str = ",csum=off,guest_csum=off,host_tso4=off,host_tso6=off,host_ecn=off,\
                            host_ufo=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off";
const PINGS: &str = "20";

/// What carries the guest's frames to the container.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Picnic(Attach),
    Bridge,
}

struct Case {
    name: &'static str,
    path: Path,
    offloads: bool,
}

const CASES: [Case; 5] = [
    Case {
        name: "picnic vhost-user",
        path: Path::Picnic(Attach::VhostUser),
        offloads: true,
    },
    Case {
        name: "picnic TAP",
        path: Path::Picnic(Attach::Tap),
        offloads: true,
    },
    Case {
        name: "Linux bridge TAP",
        path: Path::Bridge,
        offloads: true,
    },
    Case {
        name: "picnic vhost-user, offloads off",
        path: Path::Picnic(Attach::VhostUser),
        offloads: false,
    },
    Case {
        name: "picnic TAP, offloads off",
        path: Path::Picnic(Attach::Tap),
        offloads: false,
    },
];

/// One case's measurements.
#[derive(Default)]
struct Outcome {
    /// Guest to container, Mb/s per round.
    tx: Vec<f64>,
    /// Container to guest, Mb/s per round.
    rx: Vec<f64>,
    /// The container's pings of the guest, ms.
    rtt: Vec<f64>,
    /// The guest's negotiated virtio features (bit string).
    features: String,
    /// picnic's port of the guest.
    port: Option<PortStats>,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Accepts one connection by `deadline`.
fn accept(listener: &TcpListener, deadline: Instant) -> Option<TcpStream> {
    listener.set_nonblocking(true).unwrap();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
                return Some(s);
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return None,
        }
    }
}

fn mbps(bytes: usize, took: Duration) -> f64 {
    bytes as f64 * 8.0 / took.as_secs_f64() / 1e6
}

/// The guest's transfers to the container: Mb/s from accept to the last of `bytes` read.
fn sink(listener: TcpListener, rounds: usize, bytes: usize, deadline: Instant) -> Vec<f64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut out = Vec::new();
    for _ in 0..rounds {
        let Some(mut s) = accept(&listener, deadline) else {
            break;
        };
        let started = Instant::now();
        let mut got = 0;
        while got < bytes {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        if got < bytes {
            break;
        }
        out.push(mbps(bytes, started.elapsed()));
    }
    out
}

/// Segments sent and not yet acknowledged by the peer (`tcpi_unacked`).
fn unacked(s: &TcpStream) -> u32 {
    // SAFETY: TCP_INFO fills at most `len` bytes of a zeroed plain-data struct.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let ret = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        if ret == 0 {
            info.tcpi_unacked
        } else {
            u32::MAX
        }
    }
}

/// The container's transfers to the guest: Mb/s from accept until the guest acknowledged
/// the last of `bytes` (its kernel has them, whenever its nc reads them).
fn source(listener: TcpListener, rounds: usize, bytes: usize, deadline: Instant) -> Vec<f64> {
    let chunk = vec![0u8; 256 << 10];
    let mut out = Vec::new();
    for _ in 0..rounds {
        let Some(mut s) = accept(&listener, deadline) else {
            break;
        };
        let started = Instant::now();
        let mut sent = 0;
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            if s.write_all(&chunk[..n]).is_err() {
                break;
            }
            sent += n;
        }
        let _ = s.shutdown(Shutdown::Write);
        let until = Instant::now() + Duration::from_secs(60);
        while unacked(&s) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
        }
        if sent < bytes || unacked(&s) > 0 {
            break;
        }
        out.push(mbps(bytes, started.elapsed()));
    }
    out
}

/// The container's pings of the guest, ms each.
fn ping(ctr: &common::Netns) -> Vec<f64> {
    let out = Command::new("ip")
        .args([
            "netns", "exec", &ctr.name, "ping", "-c", PINGS, "-i", "0.05",
        ])
        .args(["-W", "1", GUEST_IP])
        .output()
        .expect("run ping in the container");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("time=")?.parse().ok())
        .collect()
}

/// Runs one case: the guest boots, sends and receives `rounds` times `mib` MiB, is pinged.
fn run_case(
    case: &Case,
    image: (&std::path::Path, &std::path::Path),
    accel: &mut Accel,
    (mib, rounds): (usize, usize),
) -> Result<Outcome, String> {
    let attach = match case.path {
        Path::Picnic(attach) => attach,
        Path::Bridge => Attach::Tap,
    };
    let (host, ctr) = namespaces(attach);
    if case.path == Path::Bridge {
        host.ip("link add pngbr type bridge");
        host.ip("link set pngbr up");
        host.ip(&format!("link set {TAP} master pngbr"));
        host.ip("link set pngv0 master pngbr");
    }
    let tmp = std::env::temp_dir().join(format!("picnic-guest-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let serial = tmp.join("serial.log");
    let socket = tmp.join("guest.sock");
    let config = match attach {
        Attach::Tap => CONFIG.to_string(),
        Attach::VhostUser => vhost_config(CONFIG),
    }
    .replace("@SOCKET@", &socket.to_string_lossy());
    let (l_sink, l_source) = ctr.enter(|| {
        let bind = |port| TcpListener::bind(SocketAddrV4::new(CTR_IP, port)).expect("bind");
        (bind(PORT), bind(PORT + 1))
    });
    let append = format!(
        "picnic.ip={GUEST_IP}/24 picnic.bench={CTR_IP}:{PORT}:{mib}:{rounds} picnic.hold=4"
    );
    let boot = Boot {
        image,
        serial: &serial,
        attach,
        socket: &socket,
        append: &append,
        device: if case.offloads { "" } else { OFFLOADS_OFF },
        queues: 1,
        reconnect: false,
    };
    let bytes = mib << 20;
    let mut outcome = Outcome::default();
    let deadline = Instant::now() + CASE_DEADLINE;
    let finished = host.enter(|| {
        // picnic attaches to a TAP QEMU holds; QEMU connects to a socket picnic listens on.
        let mut qemu = (attach == Attach::Tap).then(|| accel.launch(&host, &boot));
        let switch = matches!(case.path, Path::Picnic(_)).then(|| {
            let mut switch = Switch::open(Config::parse(&config).unwrap()).expect("picnic opens");
            let (stop, shared) = (switch.stop_flag(), switch.shared());
            (stop, shared, std::thread::spawn(move || switch.run()))
        });
        let mut qemu = qemu.take().unwrap_or_else(|| accel.launch(&host, &boot));
        let finished = std::thread::scope(|s| {
            let tx = s.spawn(|| sink(l_sink, rounds, bytes, deadline));
            let rx = s.spawn(|| source(l_source, rounds, bytes, deadline));
            let left = deadline.saturating_duration_since(Instant::now());
            let benched = wait_for(&mut qemu, &serial, "PICNIC-BENCH done", left);
            if benched {
                outcome.rtt = ping(&ctr);
            }
            outcome.tx = tx.join().unwrap();
            outcome.rx = rx.join().unwrap();
            benched && wait_for(&mut qemu, &serial, "PICNIC-DONE", Duration::from_secs(30))
        });
        drop(qemu);
        if let Some((stop, shared, dataplane)) = switch {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            dataplane.join().unwrap().expect("the switch ran");
            let published = shared.latest().expect("a snapshot");
            outcome.port = published
                .ports
                .iter()
                .find(|p| p.name == TAP || p.name == "pngvu0")
                .map(|p| p.stats);
        }
        finished
    });
    let out = diagnostics(&serial);
    let _ = std::fs::remove_dir_all(&tmp);
    println!("{}:\n{}", case.name, reports(&out));
    if !finished || outcome.tx.len() < rounds || outcome.rx.len() < rounds {
        return Err(format!(
            "{}: the guest did not finish its {rounds} rounds (sent {}, received {}):\n{out}",
            case.name,
            outcome.tx.len(),
            outcome.rx.len()
        ));
    }
    outcome.features = out
        .lines()
        .find_map(|l| Some(l.split("features=").nth(1)?.trim().to_string()))
        .unwrap_or_default();
    Ok(outcome)
}

/// Median, minimum and maximum.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, f64::NAN, f64::NAN),
        n => (v[n / 2], v[0], v[n - 1]),
    }
}

#[test]
#[ignore = "a benchmark (minutes, root, QEMU): --ignored --nocapture"]
fn root_bench_a_guest_on_vhost_user_tap_and_a_linux_bridge() {
    if !is_root() {
        return;
    }
    let (kernel, initrd) = match guest_image(3) {
        Ok(image) => image,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let (mib, rounds) = (
        env_or("PICNIC_BENCH_MIB", 16),
        env_or("PICNIC_BENCH_ROUNDS", 5),
    );
    let only = std::env::var("PICNIC_BENCH_ONLY").unwrap_or_default();
    let mut accel = Accel::new();
    let mut table = vec![format!(
        "| path | offloads | guest to container Mb/s | container to guest Mb/s | RTT ms |\n\
         |---|---|---|---|---|"
    )];
    for case in CASES.iter().filter(|c| c.name.contains(&only)) {
        let outcome = run_case(case, (&kernel, &initrd), &mut accel, (mib, rounds))
            .unwrap_or_else(|e| panic!("{e}"));
        // CSUM (bit 0) and HOST_TSO4 (bit 11) negotiated exactly when asked for.
        let bit = |i: usize| outcome.features.as_bytes().get(i) == Some(&b'1');
        assert_eq!(
            (bit(0), bit(11)),
            (case.offloads, case.offloads),
            "{}: features {}",
            case.name,
            outcome.features
        );
        if let Some(port) = &outcome.port {
            println!("{} port: {port:?}", case.name);
            assert_eq!(port.rx_offload_errors + port.ring_errors, 0, "{port:?}");
        }
        let cell = |v: &[f64], digits: usize| {
            let (med, lo, hi) = spread(v);
            format!("{med:.digits$} ({lo:.digits$}-{hi:.digits$})")
        };
        table.push(format!(
            "| {} | {} | {} | {} | {} |",
            case.name.split(',').next().unwrap_or(case.name),
            if case.offloads { "on" } else { "off" },
            cell(&outcome.tx, 0),
            cell(&outcome.rx, 0),
            cell(&outcome.rtt, 2),
        ));
    }
    println!(
        "\nguest on {}, {rounds} rounds of {mib} MiB each way, {PINGS} pings: median \
         (min-max)\n{}",
        accel.name(),
        table.join("\n")
    );
}
