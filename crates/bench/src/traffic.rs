//! The offered traffic: a generator of UDP frames on an AF_PACKET socket (sendmmsg with
//! PACKET_QDISC_BYPASS, the fastest sender this kernel has: DESIGN.md 7), at full speed or
//! paced, with a send timestamp in every frame for the latency sink (`sink`), and the sink
//! device's receive counter.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use picnic_switch::frame::{Frame, FramePool};
use picnic_switch::port::{AfPacketOptions, AfPacketPort, Port};
use picnic_wire::overlay::ENCAP_OVERHEAD;

/// Bytes of Ethernet + IPv4 + UDP headers in front of the generator's payload.
const HEADERS: usize = 14 + 20 + 8;
/// Marks a timestamped payload: the next 8 bytes are the send time (CLOCK_REALTIME ns).
const MAGIC: u64 = 0x7069_636e_6963_4253; // "picnicBS"
/// Frames per sendmmsg call of the generator.
const GEN_BATCH: usize = 32;

/// CLOCK_REALTIME in ns: the clock of the kernel's receive timestamps.
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the generator sends: frames of `size` bytes on the wire (FCS included, RFC 2544
/// convention; 4 bytes fewer are written) from `src` to `dst`, cycling over `flows` UDP
/// source ports.
#[derive(Debug, Clone, Copy)]
pub struct Offered {
    /// Frame size on the wire, FCS included (64 to 1518).
    pub size: usize,
    /// Distinct UDP flows (source ports 10000..10000+flows).
    pub flows: u16,
    /// Source MAC and IPv4 address (the tenant VM).
    pub src: ([u8; 6], [u8; 4]),
    /// Destination MAC and IPv4 address (the remote VM).
    pub dst: ([u8; 6], [u8; 4]),
}

impl Offered {
    /// Bytes written per frame (the FCS is the NIC's).
    pub fn written_len(&self) -> usize {
        self.size - 4
    }

    /// One template frame per flow: Ethernet, IPv4 (checksummed), UDP (checksum 0, allowed
    /// on IPv4), zero payload.
    pub fn templates(&self) -> Vec<Vec<u8>> {
        let len = self.written_len();
        (0..self.flows)
            .map(|f| {
                let mut b = vec![0u8; len];
                b[0..6].copy_from_slice(&self.dst.0);
                b[6..12].copy_from_slice(&self.src.0);
                b[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                let ip_len = (len - 14) as u16;
                b[14] = 0x45;
                b[16..18].copy_from_slice(&ip_len.to_be_bytes());
                b[22] = 64;
                b[23] = 17;
                b[26..30].copy_from_slice(&self.src.1);
                b[30..34].copy_from_slice(&self.dst.1);
                let sum = ipv4_checksum(&b[14..34]);
                b[24..26].copy_from_slice(&sum.to_be_bytes());
                b[34..36].copy_from_slice(&(10000 + f).to_be_bytes());
                b[36..38].copy_from_slice(&9u16.to_be_bytes());
                b[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
                b
            })
            .collect()
    }
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Shared between the generator thread and the bench.
#[derive(Default)]
pub struct GenControl {
    /// Frames per second to offer; 0 = as fast as possible.
    pub rate_pps: AtomicU64,
    /// Whether frames carry a send timestamp (for the latency phase).
    pub stamp: AtomicBool,
    /// Set to end the generator.
    pub stop: AtomicBool,
    /// Frames the kernel accepted so far.
    pub sent: AtomicU64,
    /// The generator thread's id (for its CPU time), once running.
    pub tid: AtomicU64,
}

/// The generator loop, run on a thread inside the sender namespace: sends frames on `ifname`
/// until `ctl.stop`, at `ctl.rate_pps` (spinning between batches, never sleeping: sleeps
/// overshoot by 100 us here, DESIGN.md 7).
pub fn generate(ifname: &str, offered: Offered, ctl: Arc<GenControl>) -> Result<()> {
    crate::cpu::register_bench_thread();
    ctl.tid.store(crate::cpu::gettid(), Ordering::Relaxed);
    let opts = AfPacketOptions {
        block_count: 2,
        tx_batch: GEN_BATCH,
        ..Default::default()
    };
    let mut port =
        AfPacketPort::open(ifname, opts).with_context(|| format!("generator on {ifname}"))?;
    let mut pool = FramePool::new(4 * GEN_BATCH);
    let templates = offered.templates();
    let mut out: Vec<Frame> = Vec::with_capacity(GEN_BATCH);
    let mut next_flow = 0usize;
    let mut sent_total = 0u64;
    let mut paced_from = (Instant::now(), 0u64, 0u64); // (start, sent at start, rate)
    while !ctl.stop.load(Ordering::Relaxed) {
        let rate = ctl.rate_pps.load(Ordering::Relaxed);
        if rate != paced_from.2 {
            paced_from = (Instant::now(), sent_total, rate);
        }
        let mut want = GEN_BATCH - out.len();
        if rate > 0 {
            let due =
                (paced_from.0.elapsed().as_nanos() as u64).saturating_mul(rate) / 1_000_000_000;
            let owed = (paced_from.1 + due).saturating_sub(sent_total + out.len() as u64);
            // Small bursts at a paced rate, so the latency phase does not queue behind them.
            want = want.min(owed as usize).min(4);
            if want == 0 && out.is_empty() {
                std::hint::spin_loop();
                continue;
            }
        }
        let stamp = ctl.stamp.load(Ordering::Relaxed);
        for _ in 0..want {
            let Some(mut f) = pool.get() else { break };
            f.fill_from(&templates[next_flow]);
            next_flow = (next_flow + 1) % templates.len();
            if stamp {
                let d = f.data_mut();
                d[HEADERS..HEADERS + 8].copy_from_slice(&MAGIC.to_be_bytes());
                d[HEADERS + 8..HEADERS + 16].copy_from_slice(&realtime_ns().to_be_bytes());
            }
            out.push(f);
        }
        let n = port.send_batch(&mut out, &mut pool)?;
        sent_total += n as u64;
        ctl.sent.store(sent_total, Ordering::Relaxed);
    }
    for f in out.drain(..) {
        pool.put(f);
    }
    Ok(())
}

/// The send timestamp in a generator frame, plain or behind picnic's outer headers.
pub(crate) fn timestamp_of(frame: &[u8]) -> Option<u64> {
    [
        HEADERS,
        HEADERS + ENCAP_OVERHEAD - 20,
        HEADERS + ENCAP_OVERHEAD,
    ]
    .into_iter()
    .find_map(|at| {
        let magic = u64::from_be_bytes(frame.get(at..at + 8)?.try_into().ok()?);
        let sent = u64::from_be_bytes(frame.get(at + 8..at + 16)?.try_into().ok()?);
        (magic == MAGIC).then_some(sent)
    })
}

/// Received packets of `dev` in namespace `ns` (the kernel's link counter: the sink costs
/// nothing beyond the kernel dropping frames not addressed to it).
pub fn rx_packets(ns: &str, dev: &str) -> Result<u64> {
    let out = picnic_netns::ip(ns, &["-j", "-s", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("parsing `ip -j -s link`")?;
    v[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .ok_or_else(|| anyhow!("no rx packet counter for {dev} in {ns}"))
}

/// Pins the calling thread to `cpu` (no-op on a 1-CPU machine).
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    if available_cpus() < 2 {
        return Ok(());
    }
    // SAFETY: the cpu_set_t is zeroed and then only touched through the libc macros.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPUs online. Not `available_parallelism`, which is the calling thread's affinity: once
/// the bench's main thread is pinned, every thread it spawns would see one CPU.
pub fn available_cpus() -> usize {
    // SAFETY: sysconf takes no pointers.
    (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(size: usize, flows: u16) -> Offered {
        Offered {
            size,
            flows,
            src: ([2, 0, 0, 0, 1, 1], [10, 0, 0, 1]),
            dst: ([2, 0, 0, 0, 2, 1], [10, 0, 0, 2]),
        }
    }

    #[test]
    fn templates_are_valid_udp_frames_of_the_offered_size() {
        for (size, flows) in [(64, 1), (1500, 8)] {
            let t = offered(size, flows).templates();
            assert_eq!(t.len(), flows as usize);
            let mut ports = std::collections::HashSet::new();
            for frame in &t {
                assert_eq!(frame.len(), size - 4);
                let s = picnic_wire::classify::classify(frame).expect("parses");
                assert_eq!(s.dst_mac, [2, 0, 0, 0, 2, 1]);
                assert_eq!(ipv4_checksum(&frame[14..34]), 0, "header checksum verifies");
                ports.insert(u16::from_be_bytes([frame[34], frame[35]]));
            }
            assert_eq!(ports.len(), flows as usize, "one source port per flow");
        }
    }

    #[test]
    fn timestamps_are_found_plain_and_tunnelled() {
        let mut f = offered(64, 1).templates().remove(0);
        f[HEADERS..HEADERS + 8].copy_from_slice(&MAGIC.to_be_bytes());
        f[HEADERS + 8..HEADERS + 16].copy_from_slice(&1234u64.to_be_bytes());
        assert_eq!(timestamp_of(&f), Some(1234));
        let mut tunnelled = vec![0u8; ENCAP_OVERHEAD - 20];
        tunnelled.extend_from_slice(&f);
        assert_eq!(timestamp_of(&tunnelled), Some(1234));
        assert_eq!(timestamp_of(&f[..HEADERS + 4]), None);
        assert_eq!(timestamp_of(&[0u8; 200]), None);
    }
}
