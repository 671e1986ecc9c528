//! The latency sink: one-way delay of every timestamped frame reaching the sink device, read
//! from a TPACKET_V3 ring with the kernel's receive time of each frame.
//!
//! It must cost next to nothing, or it measures itself: the first version read one frame per
//! `recvmsg` (SO_TIMESTAMPNS), a full CPU at 200 kpps, and the scheduler put it on the device's
//! CPU (the generator spins on the other): at 50% load the device under test waited for the
//! CPU 40-60% of the time (`/proc/<tid>/schedstat` run delay) and frames queued for
//! milliseconds in its receive ring. Now a classic BPF filter truncates every frame to
//! [`SNAP`] bytes (enough for picnic's outer headers and the timestamp), the kernel packs them
//! into ring blocks, and the thread (pinned to the generator's CPU) wakes once per block. The
//! arrival time is the ring header's `tp_sec`/`tp_nsec`: the kernel's receive time of the
//! frame on the sink's veth, independent of when this thread reads it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use hdrhistogram::Histogram;
use picnic_switch::port::wait_readable;

use crate::traffic::timestamp_of;

/// Bytes of each frame the ring keeps (Geneve outer headers + inner headers + timestamp fit).
pub const SNAP: u32 = 192;
const BLOCK_SIZE: usize = 64 << 10;
const BLOCK_COUNT: usize = 256;
/// A block that is not full is handed over after this long.
const BLOCK_TIMEOUT_MS: u32 = 1;

/// Reads frames on `ifname` until `stop` and records the one-way delay (ns) of every frame
/// that carries the generator's timestamp, tunnelled or not, while `recording` is set.
pub fn latency_sink(
    ifname: &str,
    recording: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Result<Histogram<u64>> {
    crate::cpu::register_bench_thread();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)
        .map_err(|e| anyhow!("histogram: {e}"))?;
    let ring = Ring::open(ifname)?;
    let mut cur = 0;
    while !stop.load(Ordering::Relaxed) {
        if !ring.take_block(cur, |data, arrived| {
            if let Some(sent) = timestamp_of(data) {
                if recording.load(Ordering::Relaxed) {
                    let _ = hist.record(arrived.saturating_sub(sent).max(1));
                }
            }
        }) {
            wait_readable(&[ring.fd.as_raw_fd()], Duration::from_millis(5))?;
            continue;
        }
        cur = (cur + 1) % BLOCK_COUNT;
    }
    Ok(hist)
}

/// An AF_PACKET socket with a TPACKET_V3 receive ring, bound to one interface.
struct Ring {
    fd: OwnedFd,
    map: *mut u8,
}

impl Ring {
    fn open(ifname: &str) -> Result<Ring> {
        let name = std::ffi::CString::new(ifname)?;
        // SAFETY: plain syscalls with valid arguments; the fd is owned right after creation,
        // the mapping is checked and unmapped in Drop.
        unsafe {
            let raw = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            );
            if raw < 0 {
                bail!("socket(AF_PACKET): {}", std::io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(raw);
            let index = libc::if_nametoindex(name.as_ptr());
            if index == 0 {
                bail!("interface {ifname} not found");
            }
            // `ret #SNAP`: the kernel copies at most SNAP bytes of each frame into the ring.
            let mut filter = [libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k: SNAP,
            }];
            let prog = libc::sock_fprog {
                len: 1,
                filter: filter.as_mut_ptr(),
            };
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)?;
            let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
            let req = libc::tpacket_req3 {
                tp_block_size: BLOCK_SIZE as u32,
                tp_block_nr: BLOCK_COUNT as u32,
                tp_frame_size: 2048,
                tp_frame_nr: (BLOCK_SIZE / 2048 * BLOCK_COUNT) as u32,
                tp_retire_blk_tov: BLOCK_TIMEOUT_MS,
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
            let map = libc::mmap(
                ptr::null_mut(),
                BLOCK_SIZE * BLOCK_COUNT,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                raw,
                0,
            );
            if map == libc::MAP_FAILED {
                bail!("mmap of the sink ring: {}", std::io::Error::last_os_error());
            }
            let ring = Ring {
                fd,
                map: map.cast(),
            };
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            sll.sll_ifindex = index as i32;
            if libc::bind(
                raw,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            ) != 0
            {
                bail!("bind to {ifname}: {}", std::io::Error::last_os_error());
            }
            Ok(ring)
        }
    }

    /// If block `i` has been handed over, calls `each(frame bytes, arrival ns)` for its frames,
    /// gives it back and returns true.
    fn take_block(&self, i: usize, mut each: impl FnMut(&[u8], u64)) -> bool {
        // SAFETY: block `i` lies inside the mapping; its status word is 4-byte aligned (blocks
        // are page aligned) and shared with the kernel, so only accessed atomically.
        let block = unsafe { self.map.add(i * BLOCK_SIZE) };
        let status_at = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
            + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status);
        // SAFETY: see above.
        let status = unsafe { AtomicU32::from_ptr(block.add(status_at).cast()) };
        if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return false;
        }
        // SAFETY: the block is ours (TP_STATUS_USER) and starts with its descriptor.
        let bh = unsafe {
            ptr::read(ptr::addr_of!(
                (*(block as *const libc::tpacket_block_desc)).hdr.bh1
            ))
        };
        let mut at = bh.offset_to_first_pkt as usize;
        for _ in 0..bh.num_pkts {
            if at + std::mem::size_of::<libc::tpacket3_hdr>() > BLOCK_SIZE {
                break;
            }
            // SAFETY: in bounds (checked), TPACKET_ALIGNMENT-aligned, and the block is ours.
            let hdr = unsafe { ptr::read(block.add(at) as *const libc::tpacket3_hdr) };
            let data = at + hdr.tp_mac as usize;
            if data + hdr.tp_snaplen as usize <= BLOCK_SIZE {
                // SAFETY: in bounds (checked) of the block, which is ours until released.
                let bytes =
                    unsafe { std::slice::from_raw_parts(block.add(data), hdr.tp_snaplen as usize) };
                each(
                    bytes,
                    u64::from(hdr.tp_sec) * 1_000_000_000 + u64::from(hdr.tp_nsec),
                );
            }
            if hdr.tp_next_offset == 0 {
                break;
            }
            at += hdr.tp_next_offset as usize;
        }
        // Release: our reads of the block happen before the kernel may overwrite it.
        status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
        true
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`.
        unsafe { libc::munmap(self.map.cast(), BLOCK_SIZE * BLOCK_COUNT) };
    }
}

fn setsockopt<T>(fd: i32, level: i32, name: i32, value: &T) -> Result<()> {
    // SAFETY: `value` is a live T and the length passed is its size.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        bail!(
            "setsockopt({level}, {name}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
