//! The run loop's blocking wait kept across waits: an epoll instance whose interest list
//! follows the descriptors the loop asks to wait on (issue 13, "the fast path").
//!
//! [`wait_readable`](super::wait_readable) hands the kernel its descriptor list at every call:
//! `ppoll` polls each descriptor, hooks the thread onto each one's wait queue and unhooks it
//! again, every time (a non-blocking `ppoll` of 4 AF_PACKET sockets costs 375 ns on the lab
//! machine against 80 ns for `epoll_wait`). A [`WaitSet`] registers each descriptor once and
//! changes the registration only when the list changes: a port added or removed by a live
//! change, a port held back (its engine queue has no room, its tenant is throttled or past its
//! read share) leaving the list and coming back.
//!
//! - **Same semantics as `ppoll`**: registrations are level-triggered, for input; errors and
//!   hang-ups are reported as by `ppoll` (the next receive surfaces them). A descriptor not
//!   in the list does not wake the wait, so a held port's frames still do not wake the loop.
//! - **Timeouts below a millisecond**: `epoll_wait` and `epoll_pwait` take milliseconds, and
//!   the loop's deadlines need microseconds (engines' timers, an inline engine's pace), so the
//!   wait is `epoll_pwait2` (a `timespec`, Linux 5.11), called through `syscall(2)` so the
//!   binary does not need a C library that wraps it. On a kernel without it (ENOSYS) the set
//!   waits with `ppoll` on the epoll descriptor alone, which is readable while a registered
//!   descriptor is: the timeout keeps its precision and the per-call set-up is one
//!   descriptor's.
//! - **Descriptor numbers are reused**: the kernel drops a registration when its file is
//!   closed, and a new file may get the same number. The owner calls [`WaitSet::reset`]
//!   whenever a descriptor it waited on may have been closed (a live change of ports, a new
//!   shared engine); the next wait then builds a fresh epoll instance.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Events taken from the kernel per wait: the loop only needs to know that one is ready (it
/// reads every port it waited on anyway), so a few suffice.
const EVENTS: usize = 8;

/// A blocking wait on a set of descriptors, kept across waits (see the module doc).
#[derive(Default)]
pub struct WaitSet {
    /// The epoll instance; None until the first wait and after a reset.
    epoll: Option<OwnedFd>,
    /// The list the last wait was asked for, as given: a wait asking for the same list (the
    /// common case) changes nothing.
    asked: Vec<RawFd>,
    /// The registered descriptors, sorted, without duplicates.
    registered: Vec<RawFd>,
    /// Scratch for the next registered list.
    next: Vec<RawFd>,
    /// Whether the kernel lacks `epoll_pwait2` (found at the first wait that tried it).
    no_pwait2: bool,
}

impl WaitSet {
    /// An empty set; the epoll instance is made at the first wait.
    pub fn new() -> WaitSet {
        WaitSet::default()
    }

    /// Forgets every registration: the next wait registers its list in a new epoll instance.
    /// Call it when a descriptor waited on may have been closed, since its number may now
    /// name another file.
    pub fn reset(&mut self) {
        self.epoll = None;
        self.asked.clear();
        self.registered.clear();
    }

    /// The descriptors registered now, sorted.
    #[cfg(test)]
    fn registered(&self) -> &[RawFd] {
        &self.registered
    }

    /// Blocks until one of `fds` is readable (or reports an error or hang-up) or `timeout`
    /// passes, like [`super::wait_readable`]. Returns whether a descriptor is ready;
    /// `Ok(false)` on timeout or when a signal interrupted the wait.
    pub fn wait(&mut self, fds: &[RawFd], timeout: Duration) -> io::Result<bool> {
        if self.epoll.is_none() {
            self.epoll = Some(epoll_create()?);
            self.asked.clear();
            self.registered.clear();
        }
        let epoll = self.epoll.as_ref().expect("made above").as_raw_fd();
        if fds != self.asked.as_slice() {
            self.update(epoll, fds)?;
        }
        let ts = super::timespec(timeout);
        let ret = if self.no_pwait2 {
            poll_one(epoll, &ts)
        } else {
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
            // SAFETY: `events` has room for EVENTS entries and `ts` is a valid timespec; a
            // null signal mask leaves the mask unchanged (its size is then not read).
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    epoll,
                    events.as_mut_ptr(),
                    EVENTS as libc::c_int,
                    &ts as *const libc::timespec,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if ret < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                self.no_pwait2 = true;
                poll_one(epoll, &ts)
            } else {
                ret as libc::c_int
            }
        };
        super::wait_outcome(ret)
    }

    /// Registers what `fds` has and the set lacks, removes what the set has and `fds` lacks.
    fn update(&mut self, epoll: RawFd, fds: &[RawFd]) -> io::Result<()> {
        self.next.clear();
        self.next.extend_from_slice(fds);
        self.next.sort_unstable();
        self.next.dedup();
        if let Err(e) = sync(epoll, &self.registered, &self.next) {
            // Half updated: the next wait starts again afresh.
            self.reset();
            return Err(e);
        }
        std::mem::swap(&mut self.registered, &mut self.next);
        self.asked.clear();
        self.asked.extend_from_slice(fds);
        Ok(())
    }
}

/// Makes `epoll`'s interest list go from `old` to `new` (both sorted, without duplicates).
fn sync(epoll: RawFd, old: &[RawFd], new: &[RawFd]) -> io::Result<()> {
    let (mut i, mut j) = (0, 0);
    loop {
        match (old.get(i), new.get(j)) {
            (None, None) => return Ok(()),
            (Some(&o), Some(&n)) if o == n => {
                i += 1;
                j += 1;
            }
            (Some(&o), n) if n.map_or(true, |&n| o < n) => {
                // The file may be closed already (its registration went with it), or its
                // number taken by a file never registered: nothing left to remove.
                if let Err(e) = ctl(epoll, libc::EPOLL_CTL_DEL, o) {
                    if !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EBADF)) {
                        return Err(e);
                    }
                }
                i += 1;
            }
            (_, Some(&n)) => {
                if let Err(e) = ctl(epoll, libc::EPOLL_CTL_ADD, n) {
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("epoll_ctl(ADD, fd {n}): {e}"),
                        ));
                    }
                }
                j += 1;
            }
            (Some(_), None) => unreachable!("an entry of old alone is removed above"),
        }
    }
}

/// A new epoll instance (close-on-exec). [`super::QueueSet`] makes its own with it too.
pub(super) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; a non-negative return is a new descriptor.
    let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// One epoll_ctl call for input, level-triggered.
pub(super) fn ctl(epoll: RawFd, op: libc::c_int, fd: RawFd) -> io::Result<()> {
    let mut event = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: `event` is a live epoll_event (ignored by DEL); the descriptors are integers
    // the kernel checks.
    if unsafe { libc::epoll_ctl(epoll, op, fd, &mut event) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `ppoll` on the epoll descriptor alone: the fallback without `epoll_pwait2`.
fn poll_one(epoll: RawFd, ts: &libc::timespec) -> libc::c_int {
    let mut p = libc::pollfd {
        fd: epoll,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd and a valid timespec; a null signal mask leaves it unchanged.
    unsafe { libc::ppoll(&mut p, 1, ts, std::ptr::null()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eventfd() -> OwnedFd {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn signal(fd: &OwnedFd) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        assert_eq!(n, 8);
    }

    fn drain(fd: &OwnedFd) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a u64 we own.
        unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Level-triggered like ppoll: readable until drained; a descriptor left out of the list
    /// (a held port) does not wake the wait, and wakes it again once back in.
    #[test]
    fn a_wait_set_wakes_only_on_the_descriptors_asked_for_while_they_are_readable() {
        let (a, b) = (eventfd(), eventfd());
        let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
        let mut set = WaitSet::new();
        let zero = Duration::ZERO;
        assert!(!set.wait(&[fa, fb], zero).unwrap());
        signal(&b);
        assert!(set.wait(&[fa, fb], zero).unwrap());
        assert!(set.wait(&[fa, fb], zero).unwrap(), "still readable");
        // b held back: its frames must not wake the loop.
        assert!(!set.wait(&[fa], Duration::from_millis(2)).unwrap());
        assert_eq!(set.registered(), &[fa]);
        assert!(
            set.wait(&[fb, fa], zero).unwrap(),
            "back in, in another order"
        );
        drain(&b);
        assert!(!set.wait(&[fa, fb], zero).unwrap());
        signal(&a);
        assert!(
            set.wait(&[fa, fa, fb], zero).unwrap(),
            "duplicates are one entry"
        );
        assert_eq!(set.registered().len(), 2);
        assert!(!set.wait(&[], zero).unwrap());
        assert!(set.registered().is_empty());
    }

    /// A wait blocks until its timeout with sub-millisecond precision, or until a descriptor
    /// becomes readable from another thread.
    #[test]
    fn a_wait_set_honours_sub_millisecond_timeouts_and_wakes_on_a_write() {
        let a = eventfd();
        let fa = a.as_raw_fd();
        let mut set = WaitSet::new();
        let start = std::time::Instant::now();
        for _ in 0..10 {
            assert!(!set.wait(&[fa], Duration::from_micros(200)).unwrap());
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(2) && took < Duration::from_millis(10),
            "ten 200 us waits took {took:?} (a millisecond timeout would take >= 10 ms)"
        );
        let writer = a.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            signal(&writer);
        });
        let start = std::time::Instant::now();
        assert!(set.wait(&[fa], Duration::from_secs(5)).unwrap());
        assert!(start.elapsed() < Duration::from_secs(2));
        t.join().unwrap();
    }

    /// A descriptor closed and its number reused by another file: after a reset the new file
    /// is registered (without it the set would believe the number registered already).
    #[test]
    fn after_a_reset_a_reused_descriptor_number_is_registered_again() {
        let a = eventfd();
        let fa = a.as_raw_fd();
        let mut set = WaitSet::new();
        assert!(!set.wait(&[fa], Duration::ZERO).unwrap());
        // Number `fa` now names another file (atomically, whatever other threads open).
        let b = eventfd();
        // SAFETY: both are open descriptors; `a` keeps owning number `fa`.
        assert_eq!(unsafe { libc::dup2(b.as_raw_fd(), fa) }, fa);
        signal(&b);
        assert!(
            !set.wait(&[fa], Duration::ZERO).unwrap(),
            "the closed file's registration went with it"
        );
        set.reset();
        assert!(set.wait(&[fa], Duration::ZERO).unwrap());
    }

    /// Without epoll_pwait2 the set waits on its epoll descriptor with ppoll: same answers.
    #[test]
    fn the_ppoll_fallback_answers_like_epoll_pwait2() {
        let a = eventfd();
        let fa = a.as_raw_fd();
        let mut set = WaitSet::new();
        set.no_pwait2 = true;
        assert!(!set.wait(&[fa], Duration::from_micros(100)).unwrap());
        signal(&a);
        assert!(set.wait(&[fa], Duration::ZERO).unwrap());
        assert!(!set.wait(&[], Duration::ZERO).unwrap());
    }
}
