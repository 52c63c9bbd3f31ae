//! Linux system calls the device model's wires need: AF_PACKET sockets and a process-liveness
//! check. Nothing here is on a driver's datapath.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Whether process `pid` exists (it may belong to another user).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 performs only the existence and permission check; it has no
    // memory-safety preconditions.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Sends signal `sig` (e.g. `libc::SIGINT`) to process `pid`: for tools and tests that stop a
/// child the way a user would, without depending on a `kill` program being installed.
///
/// # Errors
/// The OS error (no such process, not permitted, invalid signal).
pub fn send_signal(pid: u32, sig: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is a single positive process id
    // (never 0 or negative, which would address process groups).
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The signal numbers [`send_signal`] takes.
pub use libc::{SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM};

/// `IFF_UP`: the interface is administratively up.
pub const IFF_UP: u32 = libc::IFF_UP as u32;
/// `IFF_RUNNING`: the interface is operationally up (it has carrier; RFC 2863 "up").
pub const IFF_RUNNING: u32 = libc::IFF_RUNNING as u32;

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not an interface name"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call with constant arguments; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The interface flags of network interface `name` (SIOCGIFFLAGS), in this process's network
/// namespace.
///
/// # Errors
/// No such interface, or the ioctl failed.
pub fn if_flags(name: &str) -> io::Result<u32> {
    let mut req = ifreq_for(name)?;
    let sock = ioctl_socket()?;
    // SAFETY: SIOCGIFFLAGS reads the NUL-terminated name in `req` and writes the flags into it;
    // `req` is a valid, exclusively borrowed ifreq for the duration of the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful SIOCGIFFLAGS the union holds `ifru_flags`.
    Ok(u32::from(unsafe { req.ifr_ifru.ifru_flags } as u16))
}

/// Brings interface `name` administratively up or down (SIOCSIFFLAGS; needs CAP_NET_ADMIN).
///
/// # Errors
/// No such interface, not permitted, or the driver refused (on MANA, `up` fails with EBUSY
/// while a raw-packet QP holds the port).
pub fn set_if_up(name: &str, up: bool) -> io::Result<()> {
    let flags = if_flags(name)?;
    let new = if up { flags | IFF_UP } else { flags & !IFF_UP };
    if new == flags {
        return Ok(());
    }
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_flags = new as u16 as libc::c_short;
    let sock = ioctl_socket()?;
    // SAFETY: SIOCSIFFLAGS reads the name and flags from `req`, a valid ifreq for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's id.
pub fn pid() -> u32 {
    std::process::id()
}

/// A non-blocking AF_PACKET raw socket bound to one interface, receiving every EtherType and
/// ignoring the frames it sends itself.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifname: String,
}

impl PacketSocket {
    /// Opens a socket on `ifname` (needs CAP_NET_RAW).
    ///
    /// # Errors
    /// The interface does not exist, or socket/bind failed (typically EPERM without root).
    pub fn open(ifname: &str) -> io::Result<Self> {
        let cname = CString::new(ifname).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL byte")
        })?;
        // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface named '{ifname}'"),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2) call with constant arguments; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        // SAFETY: `one` outlives the call and its size is passed correctly. Failure (kernels
        // before 4.20) is tolerated: `recv` also filters outgoing frames.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_IGNORE_OUTGOING,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and its exact size is passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            ifname: ifname.to_string(),
        })
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Sends one frame. `Ok(false)` when the socket buffer is full (the frame is dropped).
    ///
    /// # Errors
    /// Any other send error (e.g. the interface went away).
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        // SAFETY: `frame` is a valid readable buffer of `frame.len()` bytes for the call.
        let r = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => Ok(false),
            _ => Err(e),
        }
    }

    /// Receives one frame into `buf` without blocking; `Ok(None)` when nothing is waiting.
    /// Frames this host sent on the interface are skipped. Longer frames are cut to `buf`.
    ///
    /// # Errors
    /// A receive error other than "would block".
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` is writable for `buf.len()` bytes; `from`/`from_len` are valid
            // out-parameters of the sizes given.
            let r = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(None),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(r as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness() {
        assert!(process_alive(pid()));
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
    }

    #[test]
    fn loopback_flags_and_bad_names() {
        assert_ne!(if_flags("lo").unwrap() & IFF_UP, 0);
        assert!(if_flags("nosuchif0").is_err());
        assert!(if_flags("").is_err());
        assert!(if_flags("a-name-longer-than-ifnamsiz").is_err());
    }

    #[test]
    fn missing_interface_is_a_clear_error() {
        let e = PacketSocket::open("nosuchif0").unwrap_err();
        assert!(
            e.to_string()
                .contains("no network interface named 'nosuchif0'"),
            "{e}"
        );
    }
}
