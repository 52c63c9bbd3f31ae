//! Linux system calls the device model's wires need: interface flags and MTU, and a
//! process-liveness check (the AF_PACKET rings are in [`super::packet_ring`]). Nothing here is on a driver's datapath.
#![allow(unsafe_code)]

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

/// The MTU of network interface `name` (SIOCGIFMTU), in this process's network namespace.
///
/// # Errors
/// No such interface, or the ioctl failed.
pub fn if_mtu(name: &str) -> io::Result<u32> {
    let mut req = ifreq_for(name)?;
    let sock = ioctl_socket()?;
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name in `req` and writes the MTU into it;
    // `req` is a valid, exclusively borrowed ifreq for the duration of the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds `ifru_mtu`.
    Ok(u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).unwrap_or(0))
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
        assert!(if_mtu("lo").unwrap() >= 1280, "lo carries IPv6");
        assert!(if_mtu("nosuchif0").is_err());
    }
}
