//! The AF_XDP port's memory shared with the kernel: the UMEM mapping and the four
//! single-producer single-consumer rings (fill, RX, TX, completion) of
//! Documentation/networking/af_xdp.rst.

use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

/// A memory mapping unmapped on drop.
pub(super) struct Mapping {
    pub(super) addr: *mut u8,
    pub(super) len: usize,
}

impl Mapping {
    /// mmap(2) of `len` bytes; `fd` None for anonymous memory.
    pub(super) fn new(len: usize, fd: Option<RawFd>, offset: libc::off_t) -> io::Result<Mapping> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY: a fresh mapping chosen by the kernel; nothing else refers to it.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr: addr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly this mapping; nothing refers to it afterwards.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// One single-producer single-consumer ring shared with the kernel: a producer index, a
/// consumer index and `size` descriptors of type `T` (`xdp_desc` for RX/TX, `u64` chunk
/// addresses for fill/completion). We are the producer of fill and TX and the consumer of RX
/// and completion.
pub(super) struct Ring<T> {
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    /// The ring's flags word: `XDP_RING_NEED_WAKEUP` (bound with `XDP_USE_NEED_WAKEUP`).
    flags: *const AtomicU32,
    descs: *mut T,
    pub(super) size: u32,
    /// Our copy of the index we own (the producer's for fill/TX, the consumer's for RX and
    /// completion), published with a release store.
    local: u32,
    /// Last seen value of the index the kernel owns.
    remote: u32,
}

impl<T: Copy> Ring<T> {
    /// Maps the ring at page offset `pgoff` of socket `fd`, laid out as `off` says.
    pub(super) fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * size_of::<T>();
        let map = Mapping::new(len, Some(fd), pgoff)?;
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the mapping; the
        // indices are 4-byte aligned u32s only accessed atomically (by us and the kernel).
        let (producer, consumer, flags, descs) = unsafe {
            (
                map.addr.add(off.producer as usize) as *const AtomicU32,
                map.addr.add(off.consumer as usize) as *const AtomicU32,
                map.addr.add(off.flags as usize) as *const AtomicU32,
                map.addr.add(off.desc as usize) as *mut T,
            )
        };
        // A fresh ring: both indices are 0.
        Ok(Ring {
            _map: map,
            producer,
            consumer,
            flags,
            descs,
            size,
            local: 0,
            remote: 0,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.consumer }
    }

    /// Whether the kernel asks to be woken to go on with this ring (`XDP_RING_NEED_WAKEUP`:
    /// a system call on the socket; af_xdp.rst, "XDP_USE_NEED_WAKEUP bind flag").
    pub(super) fn needs_wakeup(&self) -> bool {
        // The full fence orders our last index store before this load, against the driver
        // setting the flag and then reading our index (a missed flag would stall the ring).
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: points into the live mapping (see `map`).
        let flags = unsafe { &*self.flags }.load(Ordering::Relaxed);
        flags & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Descriptor slot of index `i`.
    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: the masked index is below `size`, so the slot is inside the mapping.
        unsafe { self.descs.add((i & (self.size - 1)) as usize) }
    }

    // Producer side (fill, TX): `local` is the producer index, `remote` the consumer's.

    /// Free slots, refreshing the kernel's consumer index when fewer than `want` are known.
    pub(super) fn free(&mut self, want: u32) -> u32 {
        let known = self.size - self.local.wrapping_sub(self.remote);
        if known >= want {
            return known;
        }
        // Acquire: the kernel's reads of the slots it consumed happen before we reuse them.
        self.remote = self.consumer().load(Ordering::Acquire);
        self.size - self.local.wrapping_sub(self.remote)
    }

    /// Writes the next descriptor (the caller checked `free`).
    pub(super) fn push(&mut self, value: T) {
        // SAFETY: the slot is free (not yet published), so the kernel does not read it.
        unsafe { ptr::write_volatile(self.slot(self.local), value) };
        self.local = self.local.wrapping_add(1);
    }

    /// Publishes the pushed descriptors to the kernel.
    pub(super) fn submit(&self) {
        // Release: our descriptor writes happen before the kernel sees the new index.
        self.producer().store(self.local, Ordering::Release);
    }

    /// Descriptors the kernel has not consumed yet (producer side).
    pub(super) fn in_flight(&self) -> u32 {
        self.local
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    // Consumer side (RX, completion): `local` is the consumer index, `remote` the producer's.

    /// Descriptors ready to be read, refreshing the kernel's producer index.
    pub(super) fn ready(&mut self) -> u32 {
        // Acquire: the kernel's descriptor (and frame data) writes happen before we read them.
        self.remote = self.producer().load(Ordering::Acquire);
        self.remote.wrapping_sub(self.local)
    }

    /// Reads the next ready descriptor (the caller checked `ready`).
    pub(super) fn pop(&mut self) -> T {
        // SAFETY: the slot was published by the kernel and is not reused until we release it.
        let value = unsafe { ptr::read_volatile(self.slot(self.local)) };
        self.local = self.local.wrapping_add(1);
        value
    }

    /// Gives the read descriptors' slots back to the kernel.
    pub(super) fn release(&self) {
        // Release: our reads happen before the kernel may overwrite the slots.
        self.consumer().store(self.local, Ordering::Release);
    }
}

/// The start of `len` bytes at UMEM address `addr`, if they lie inside the UMEM.
pub(super) fn umem_at(umem: &Mapping, addr: u64, len: usize) -> Option<*mut u8> {
    let at = usize::try_from(addr).ok()?;
    (at.checked_add(len)? <= umem.len).then(|| {
        // SAFETY: `at + len` is inside the mapping (checked above).
        unsafe { umem.addr.add(at) }
    })
}
