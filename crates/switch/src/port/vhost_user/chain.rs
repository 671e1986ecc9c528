//! Copying frames between descriptor chains in the guest's memory and the switch's buffers,
//! every address checked by `vm-memory` (a bad one is an error, never followed).

use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestMemoryMmap};

/// Why a descriptor chain could not be used.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ChainError {
    /// Shorter than the header, or a buffer outside the guest's memory.
    Bad,
    /// Longer than the largest super-frame (transmit) or too short for the frame (receive).
    Size,
}

/// Copies the device-readable bytes of `chain` into `hdr` and then `body`; the bytes must fit
/// exactly (the caller sized `body` from the chain).
pub(super) fn gather(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    hdr: &mut [u8],
    body: &mut [u8],
) -> Result<(), ChainError> {
    let (mut in_hdr, mut in_body) = (0, 0);
    for desc in chain.readable() {
        let (mut addr, mut left) = (desc.addr(), desc.len() as usize);
        while left > 0 {
            let dst = if in_hdr < hdr.len() {
                let n = left.min(hdr.len() - in_hdr);
                in_hdr += n;
                &mut hdr[in_hdr - n..in_hdr]
            } else {
                let n = left.min(body.len() - in_body);
                if n == 0 {
                    return Err(ChainError::Size);
                }
                in_body += n;
                &mut body[in_body - n..in_body]
            };
            mem.read_slice(dst, addr).map_err(|_| ChainError::Bad)?;
            left -= dst.len();
            addr = addr.checked_add(dst.len() as u64).ok_or(ChainError::Bad)?;
        }
    }
    Ok(())
}

/// Writes `hdr` and then `frame` into the device-writable buffers of `chain`; returns the
/// bytes written.
pub(super) fn scatter(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    hdr: &[u8],
    frame: &[u8],
) -> Result<u32, ChainError> {
    let room: u64 = chain.clone().writable().map(|d| u64::from(d.len())).sum();
    let total = hdr.len() + frame.len();
    if room < total as u64 {
        return Err(ChainError::Size);
    }
    let mut done = 0;
    for desc in chain.writable() {
        let mut addr = desc.addr();
        let mut left = (desc.len() as usize).min(total - done);
        while left > 0 {
            let src = if done < hdr.len() {
                &hdr[done..hdr.len().min(done + left)]
            } else {
                let from = done - hdr.len();
                &frame[from..from + left.min(frame.len() - from)]
            };
            mem.write_slice(src, addr).map_err(|_| ChainError::Bad)?;
            done += src.len();
            left -= src.len();
            addr = addr.checked_add(src.len() as u64).ok_or(ChainError::Bad)?;
        }
        if done == total {
            break;
        }
    }
    Ok(total as u32)
}
