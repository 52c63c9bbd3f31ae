//! Event descriptors for the slow path: an eventfd(2) a device model signals when it has
//! port events, and poll(2) over several descriptors. Nothing here is on a datapath.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking eventfd: readable while it is signalled, until [`EventFd::clear`]
/// (level-triggered, like the verbs async-event descriptor it stands in for).
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new, unsignalled eventfd (`EFD_NONBLOCK | EFD_CLOEXEC`).
    ///
    /// # Errors
    /// eventfd(2) failed (descriptor limit).
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd(2) takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd(2), is open and owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (adds 1 to the counter).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our own open eventfd. It can fail only when
        // the counter would overflow (EAGAIN), in which case it is readable anyway.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Makes the descriptor unreadable again (reads the counter back to 0).
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a local from our own non-blocking eventfd; EAGAIN when
        // it was not signalled, which is what we want too.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// An epoll(7) set, itself a descriptor that is readable while one of its members is
/// (level-triggered): what a port hands out as its one event descriptor, whatever sits
/// behind it over the port's life (a device's, a timer's).
#[derive(Debug)]
pub struct EpollSet(OwnedFd);

impl EpollSet {
    /// An empty set (`EPOLL_CLOEXEC`).
    ///
    /// # Errors
    /// epoll_create1(2) failed (descriptor limit).
    pub fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1(2) takes a flag and returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1(2), is open and owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: our own epoll descriptor; `ev` is a valid event the kernel copies (and
        // ignores for EPOLL_CTL_DEL); `fd` is the caller's descriptor, which epoll only
        // refers to (a closed one leaves the set by itself).
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &raw mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for readability (level-triggered).
    ///
    /// # Errors
    /// epoll_ctl(2) failed (`fd` not open, or already in the set).
    pub fn add(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd)
    }

    /// Stops watching `fd` (before it is closed, or when it is no longer the port's).
    ///
    /// # Errors
    /// epoll_ctl(2) failed (`fd` not in the set).
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd)
    }
}

impl AsRawFd for EpollSet {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A non-blocking timerfd(2) on the monotonic clock: readable each time its period has
/// passed, until [`TimerFd::clear`].
#[derive(Debug)]
pub struct TimerFd(OwnedFd);

impl TimerFd {
    /// A new, disarmed timer (`TFD_NONBLOCK | TFD_CLOEXEC`).
    ///
    /// # Errors
    /// timerfd_create(2) failed (descriptor limit).
    pub fn new() -> io::Result<Self> {
        // SAFETY: timerfd_create(2) takes a clock id and flags and returns a new descriptor
        // or -1.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by timerfd_create(2), is open and owned by nobody
        // else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Fires every `every` from now on (`Duration::ZERO`: disarmed).
    ///
    /// # Errors
    /// timerfd_settime(2) failed.
    pub fn arm(&self, every: Duration) -> io::Result<()> {
        let ts = libc::timespec {
            tv_sec: every.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(every.subsec_nanos()),
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        // SAFETY: our own timer descriptor; `spec` is a valid itimerspec read by the call;
        // the old value is not asked for (NULL).
        let r = unsafe {
            libc::timerfd_settime(self.0.as_raw_fd(), 0, &raw const spec, std::ptr::null_mut())
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Makes the descriptor unreadable until the next expiry (reads the expiry count).
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a local from our own non-blocking timerfd; EAGAIN when
        // it has not expired, which is what we want too.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits up to `timeout` until one of `fds` is readable or in error (`POLLIN`, `POLLERR`,
/// `POLLHUP`), and says which are. With no descriptors it just sleeps for `timeout`. A
/// signal cuts the wait short and reports nothing ready.
///
/// # Errors
/// poll(2) failed for another reason than a signal (e.g. a descriptor that is not open:
/// `POLLNVAL` is reported as `EBADF`).
pub fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let n = libc::nfds_t::try_from(pfds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `pfds` holds `n` initialised pollfd entries and lives across the call; with
    // n == 0 the pointer is not read.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), n, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(vec![false; fds.len()])
        } else {
            Err(e)
        };
    }
    if pfds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
        .collect())
}

/// Makes `fd` non-blocking (`O_NONBLOCK`), keeping its other status flags.
///
/// # Errors
/// fcntl(2) failed (`EBADF` for a descriptor that is not open).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL reads the status flags of an open descriptor (borrowed for the call).
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with the flags just read plus O_NONBLOCK, on the same open descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_is_readable_while_signalled() {
        let e = EventFd::new().unwrap();
        let fd = e.as_raw_fd();
        assert_eq!(poll_readable(&[fd], Duration::ZERO).unwrap(), [false]);
        e.signal();
        e.signal();
        assert_eq!(poll_readable(&[fd], Duration::ZERO).unwrap(), [true]);
        assert_eq!(
            poll_readable(&[fd], Duration::ZERO).unwrap(),
            [true],
            "level"
        );
        e.clear();
        assert_eq!(poll_readable(&[fd], Duration::ZERO).unwrap(), [false]);
        e.clear();
        assert_eq!(
            poll_readable(&[], Duration::from_millis(1)).unwrap(),
            Vec::<bool>::new()
        );
    }

    #[test]
    fn nonblocking_flag_is_added() {
        let e = EventFd::new().unwrap();
        set_nonblocking(e.as_fd()).unwrap();
        // SAFETY: F_GETFL on our open descriptor.
        let fl = unsafe { libc::fcntl(e.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(fl & libc::O_NONBLOCK, 0);
    }
}
