//! The eventfd that wakes the run loop when the API's thread sent it a change, or when the
//! port keeper opened a change's ports ([`super::command`], [`super::keeper`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The eventfd that wakes the loop, and whether it was written since the loop last drained
/// it (so that the loop reads it only then, not on every wait).
pub(super) struct CommandWake {
    pub(super) fd: OwnedFd,
    pub(super) pending: AtomicBool,
}

impl CommandWake {
    /// Makes the loop's wait return.
    pub(super) fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 we own to an eventfd we hold open.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // Set after the write: the loop drains only what was written before it saw this.
        self.pending.store(true, Ordering::Release);
    }
}

/// An eventfd for [`CommandSender`] (non-blocking, so that the loop drains it without waiting).
pub(super) fn command_eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success the descriptor is ours.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
