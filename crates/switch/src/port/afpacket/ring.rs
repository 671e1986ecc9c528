//! The AF_PACKET port's receive ring, mmapped from the socket and walked in place: TPACKET_V2
//! slots handed over one frame at a time, TPACKET_V3 blocks handed over whole, and the
//! whole-frame copies of super-frames too long for a V2 slot (`TP_STATUS_COPY`).

use std::mem::{size_of, MaybeUninit};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use picnic_wire::offload::VNET_HDR_LEN;

use super::{AfPacketPort, RING_FRAME_SIZE};
use crate::frame::{Frame, FramePool};
use crate::port::sys::{get_opt, ifindex, TP_STATUS_COPY};
use crate::port::vnet::{Taken, VnetRx};
use crate::port::{Port, PortStats};

/// Offset of the sockaddr_ll that follows each tpacket3_hdr in the ring (TPACKET_ALIGN).
const SLL_OFFSET: usize = (size_of::<libc::tpacket3_hdr>() + libc::TPACKET_ALIGNMENT - 1)
    & !(libc::TPACKET_ALIGNMENT - 1);

/// Ring waits longer than this are taken for timestamps from another clock.
const MAX_RING_WAIT_NS: u64 = 1_000_000_000;

/// CLOCK_REALTIME now, ns (the clock of the kernel's ring timestamps).
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl AfPacketPort {
    /// [`Port::reuse`]: the socket must still be bound to the interface its name has now and
    /// hold no error (an interface that goes away leaves `ENETDOWN`). Then the frames waiting
    /// in the ring (and any whole-frame copy on the socket) are read and discarded, at most
    /// twice what the ring holds (frames arriving meanwhile are the new VM's, as on a socket
    /// just opened), and the counters start again.
    pub(super) fn reset_for_reuse(&mut self, max_frame: usize) -> bool {
        if ifindex(&self.name).ok() != Some(self.ifindex) {
            return false;
        }
        match get_opt::<libc::c_int>(self.fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) => {}
            _ => return false,
        }
        const BATCH: usize = 64;
        let mut pool = FramePool::new(BATCH);
        let mut out = Vec::with_capacity(BATCH);
        // A ring's worth of the smallest frames (a V3 block packs them).
        let mut budget = 2 * self.block_size * self.block_count / 64;
        while budget > 0 {
            let n = Port::recv_batch(self, &mut pool, &mut out, BATCH).unwrap_or(0);
            for f in out.drain(..) {
                pool.put(f);
            }
            if n == 0 && !self.vnet.busy() {
                break;
            }
            budget = budget.saturating_sub(n.max(1));
        }
        self.vnet = VnetRx::new(max_frame);
        self.stats = PortStats::default();
        // Reading PACKET_STATISTICS resets the kernel's counters.
        let _ = Port::stats(self);
        self.kernel_drops.set(0);
        true
    }

    /// Start of ring block `i`.
    fn block(&self, i: usize) -> *mut u8 {
        // SAFETY: i < block_count, so the offset stays inside the mapping.
        unsafe { self.ring.add(i * self.block_size) }
    }

    /// The ownership word of ring block `i`, shared with the kernel.
    fn block_status(&self, i: usize) -> &AtomicU32 {
        let offset = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
            + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status);
        // SAFETY: the word lies inside block `i` of the mapping, is 4-byte aligned (blocks are
        // page aligned) and is only accessed atomically, by us and by the kernel.
        unsafe { AtomicU32::from_ptr(self.block(i).add(offset).cast()) }
    }

    /// Gives the current block back to the kernel and moves to the next one.
    fn release_block(&mut self) {
        // Release: our reads of the block happen before the kernel may overwrite it.
        self.block_status(self.cur_block)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.cur_block = (self.cur_block + 1) % self.block_count;
        self.block_open = false;
        self.pkts_left = 0;
    }

    /// TPACKET_V2 receive: walk the fixed slots while the kernel has handed them over.
    pub(super) fn recv_v2(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> usize {
        let slots = self.block_size * self.block_count / RING_FRAME_SIZE;
        let mut n = 0;
        // The kernel stamps each slot (CLOCK_REALTIME) when it fills it: how long a frame
        // waited in the ring is part of its latency through the switch.
        let read_at = realtime_ns();
        loop {
            n += self.vnet.drain(pool, out, max - n, &mut self.stats);
            if n >= max || self.vnet.busy() {
                break;
            }
            // SAFETY: cur_block < slots, so the slot lies inside the mapping.
            let slot = unsafe { self.ring.add(self.cur_block * RING_FRAME_SIZE) };
            // SAFETY: tp_status is the slot's first, 4-byte aligned word, shared with the kernel
            // and only accessed atomically.
            let status = unsafe { AtomicU32::from_ptr(slot.cast()) };
            // Acquire: the kernel's writes of the slot happen before we read them.
            let st = status.load(Ordering::Acquire);
            if st & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the slot is ours (TP_STATUS_USER) and starts with its header, followed by
            // the sockaddr_ll at TPACKET2_HDRLEN - sizeof(sockaddr_ll).
            let (hdr, pkttype) = unsafe {
                let hdr = ptr::read(slot as *const libc::tpacket2_hdr);
                let sll_at = libc::TPACKET2_HDRLEN - size_of::<libc::sockaddr_ll>();
                let sll = ptr::read(slot.add(sll_at) as *const libc::sockaddr_ll);
                (hdr, sll.sll_pkttype)
            };
            let data_at = hdr.tp_mac as usize;
            let snaplen = hdr.tp_snaplen as usize;
            let ours = pkttype != libc::PACKET_OUTGOING;
            let before = out.len();
            let mut taken = Taken::Done;
            if st & TP_STATUS_COPY != 0 {
                // Too big for the slot: the whole frame waits on the socket, in slot order.
                self.recv_copy(ours, pool, out);
            } else if data_at < VNET_HDR_LEN || data_at + snaplen > RING_FRAME_SIZE {
                self.stats.rx_oversize += 1;
            } else if ours {
                if snaplen < hdr.tp_len as usize {
                    self.stats.rx_oversize += 1;
                } else {
                    // SAFETY: the header and `data_at..data_at + snaplen` are inside the slot
                    // (checked above), which is ours until handed back below.
                    let (vh, bytes) = unsafe {
                        (
                            std::slice::from_raw_parts(
                                slot.add(data_at - VNET_HDR_LEN),
                                VNET_HDR_LEN,
                            ),
                            std::slice::from_raw_parts(slot.add(data_at), snaplen),
                        )
                    };
                    taken = self.vnet.take_slice(vh, bytes, pool, out, &mut self.stats);
                }
            }
            if taken == Taken::NoFrame {
                break;
            }
            let stamped = hdr.tp_sec as u64 * 1_000_000_000 + hdr.tp_nsec as u64;
            let wait = read_at.saturating_sub(stamped);
            // A timestamp from another clock (a delivery time left on the skb) is no wait.
            if stamped > 0 && wait < MAX_RING_WAIT_NS {
                for f in &mut out[before..] {
                    f.set_ring_wait(wait);
                }
            }
            n += out.len() - before;
            self.stats.rx_taken += 1;
            // Release: our reads of the slot happen before the kernel may overwrite it.
            status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.cur_block = (self.cur_block + 1) % slots;
        }
        n
    }

    /// Reads the whole-frame copy the kernel queued for a `TP_STATUS_COPY` slot into the
    /// super-frame buffer and takes it (or discards it when `ours` is false).
    fn recv_copy(&mut self, ours: bool, pool: &mut FramePool, out: &mut Vec<Frame>) {
        let mut vh = [0u8; VNET_HDR_LEN];
        let buf = self.vnet.buf_mut();
        let mut iov = [
            libc::iovec {
                iov_base: vh.as_mut_ptr().cast(),
                iov_len: VNET_HDR_LEN,
            },
            libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            },
        ];
        // SAFETY: msghdr is a plain C struct for which all-zero bytes are a valid value.
        let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        // SAFETY: `msg` points at two live, exclusively borrowed buffers of the lengths said.
        let ret = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if !ours {
            return;
        }
        if ret < VNET_HDR_LEN as isize {
            // The copy was not there (cannot happen while the socket receives nothing else).
            self.stats.rx_dropped += 1;
        } else if msg.msg_flags & libc::MSG_TRUNC != 0 {
            self.stats.rx_oversize += 1;
        } else {
            let len = ret as usize - VNET_HDR_LEN;
            self.vnet
                .take_buffered(&vh, len, pool, out, &mut self.stats);
        }
    }

    /// TPACKET_V3 receive: walk the frames of each block the kernel has handed over, in place.
    pub(super) fn recv_v3(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> usize {
        let mut n = 0;
        loop {
            n += self.vnet.drain(pool, out, max - n, &mut self.stats);
            if n >= max || self.vnet.busy() {
                break;
            }
            if !self.block_open {
                // Acquire: the kernel's writes of the block happen before we read them.
                let status = self.block_status(self.cur_block).load(Ordering::Acquire);
                if status & libc::TP_STATUS_USER == 0 {
                    break;
                }
                let desc = self.block(self.cur_block) as *const libc::tpacket_block_desc;
                // SAFETY: the block is ours (TP_STATUS_USER) and starts with its descriptor.
                let bh = unsafe { ptr::read(ptr::addr_of!((*desc).hdr.bh1)) };
                self.block_open = true;
                self.pkts_left = bh.num_pkts;
                self.pkt_offset = bh.offset_to_first_pkt as usize;
                if self.pkts_left == 0 {
                    self.release_block();
                }
                continue;
            }
            let block = self.block(self.cur_block);
            // Defensive bounds check on what the kernel wrote, so a bad offset can never make
            // us read outside the block.
            if self.pkt_offset + SLL_OFFSET + size_of::<libc::sockaddr_ll>() > self.block_size {
                self.stats.rx_dropped += u64::from(self.pkts_left);
                self.stats.rx_taken += u64::from(self.pkts_left);
                self.release_block();
                continue;
            }
            // SAFETY: in bounds (checked above) and the block is ours; the headers are at
            // TPACKET_ALIGNMENT-aligned offsets, enough for their fields.
            let (hdr, pkttype) = unsafe {
                let at = block.add(self.pkt_offset);
                let hdr = ptr::read(at as *const libc::tpacket3_hdr);
                let sll = ptr::read(at.add(SLL_OFFSET) as *const libc::sockaddr_ll);
                (hdr, sll.sll_pkttype)
            };
            let data_at = self.pkt_offset + hdr.tp_mac as usize;
            let snaplen = hdr.tp_snaplen as usize;
            if data_at + snaplen > self.block_size {
                self.stats.rx_dropped += u64::from(self.pkts_left);
                self.stats.rx_taken += u64::from(self.pkts_left);
                self.release_block();
                continue;
            }
            if pkttype != libc::PACKET_OUTGOING {
                if snaplen < hdr.tp_len as usize || (hdr.tp_mac as usize) < VNET_HDR_LEN {
                    self.stats.rx_oversize += 1;
                } else {
                    // SAFETY: `data_at..data_at + snaplen` is inside the block (checked above)
                    // and the virtio-net header right before it, after the frame's own header.
                    let (vh, bytes) = unsafe {
                        (
                            std::slice::from_raw_parts(
                                block.add(data_at - VNET_HDR_LEN),
                                VNET_HDR_LEN,
                            ),
                            std::slice::from_raw_parts(block.add(data_at), snaplen),
                        )
                    };
                    let before = out.len();
                    if self.vnet.take_slice(vh, bytes, pool, out, &mut self.stats) == Taken::NoFrame
                    {
                        break;
                    }
                    n += out.len() - before;
                }
            }
            self.stats.rx_taken += 1;
            self.pkts_left -= 1;
            self.pkt_offset += hdr.tp_next_offset as usize;
            if self.pkts_left == 0 {
                self.release_block();
            }
        }
        n
    }
}
