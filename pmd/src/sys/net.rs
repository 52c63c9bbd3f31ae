//! Linux system calls the device model's wires need: interface flags and MTU (and the
//! largest MTU, over rtnetlink, for the hardware providers), and a
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

/// rtnetlink numbers (Linux uapi `linux/netlink.h`, `linux/rtnetlink.h`, `linux/if_link.h`).
mod rtnl {
    /// `NETLINK_ROUTE`.
    pub const NETLINK_ROUTE: i32 = 0;
    /// `RTM_NEWLINK`: a link's description (the answer to `RTM_GETLINK`).
    pub const RTM_NEWLINK: u16 = 16;
    /// `RTM_GETLINK`.
    pub const RTM_GETLINK: u16 = 18;
    /// `NLMSG_ERROR`.
    pub const NLMSG_ERROR: u16 = 2;
    /// `NLM_F_REQUEST`.
    pub const NLM_F_REQUEST: u16 = 1;
    /// `IFLA_EXT_MASK` (u32 attribute of a request).
    pub const IFLA_EXT_MASK: u16 = 29;
    /// `RTEXT_FILTER_SKIP_STATS`: leave the counters out of the answer.
    pub const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
    /// `IFLA_MAX_MTU` (u32; since Linux 4.18).
    pub const IFLA_MAX_MTU: u16 = 51;
    /// `struct nlmsghdr`.
    pub const NLMSG_HDR_BYTES: usize = 16;
    /// `struct ifinfomsg`.
    pub const IFINFO_BYTES: usize = 16;
    /// `NLA_TYPE_MASK`: an attribute type without its nested/byte-order flags.
    pub const NLA_TYPE_MASK: u16 = 0x3fff;
}

/// The largest MTU network interface `name` takes (`IFLA_MAX_MTU` of an rtnetlink
/// `RTM_GETLINK`, what `ip -d link show` prints as `maxmtu`), in this process's network
/// namespace; `None` when the kernel reports none (0: no limit, as on `lo`; or a kernel older
/// than 4.18).
///
/// # Errors
/// No such interface, or the netlink request failed (or got no answer within a second).
pub fn if_max_mtu(name: &str) -> io::Result<Option<u32>> {
    let req = ifreq_for(name)?;
    // SAFETY: `ifr_name` is NUL-terminated (ifreq_for checked the length and zeroed the rest).
    let index = unsafe { libc::if_nametoindex(req.ifr_name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let msg = getlink_request(i32::try_from(index).unwrap_or(i32::MAX));
    // SAFETY: plain socket(2) call with constant arguments; the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            rtnl::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let timeout = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: SO_RCVTIMEO reads a `timeval` of the given size from a valid pointer.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::from_ref(&timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // An unconnected netlink socket sends to the kernel (port id 0).
    // SAFETY: `msg` is valid for `msg.len()` bytes for the duration of the call.
    if unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 << 10];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let Ok(n) = usize::try_from(n) else {
        return Err(io::Error::last_os_error());
    };
    parse_max_mtu(&buf[..n])
}

/// `RTM_GETLINK` for interface `index`, without statistics.
fn getlink_request(index: i32) -> Vec<u8> {
    let len = rtnl::NLMSG_HDR_BYTES + rtnl::IFINFO_BYTES + 8;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&rtnl::RTM_GETLINK.to_ne_bytes());
    m.extend_from_slice(&rtnl::NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
                                              // ifinfomsg: family AF_UNSPEC, pad, type, index, flags, change.
    m.extend_from_slice(&[0, 0, 0, 0]);
    m.extend_from_slice(&index.to_ne_bytes());
    m.extend_from_slice(&[0; 8]);
    // IFLA_EXT_MASK attribute.
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&rtnl::IFLA_EXT_MASK.to_ne_bytes());
    m.extend_from_slice(&rtnl::RTEXT_FILTER_SKIP_STATS.to_ne_bytes());
    m
}

/// `IFLA_MAX_MTU` from the answer to [`getlink_request`] (netlink is in host byte order).
fn parse_max_mtu(msg: &[u8]) -> io::Result<Option<u32>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed rtnetlink answer");
    let u16_at = |at: usize| {
        msg.get(at..at + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        msg.get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let len = u32_at(0).ok_or_else(bad)? as usize;
    let kind = u16_at(4).ok_or_else(bad)?;
    if len > msg.len() || len < rtnl::NLMSG_HDR_BYTES {
        return Err(bad());
    }
    if kind == rtnl::NLMSG_ERROR {
        // struct nlmsgerr: a negative errno first.
        let errno = u32_at(rtnl::NLMSG_HDR_BYTES).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    if kind != rtnl::RTM_NEWLINK {
        return Err(bad());
    }
    let mut at = rtnl::NLMSG_HDR_BYTES + rtnl::IFINFO_BYTES;
    while at + 4 <= len {
        let (alen, atype) = (
            usize::from(u16_at(at).ok_or_else(bad)?),
            u16_at(at + 2).ok_or_else(bad)?,
        );
        if alen < 4 || at + alen > len {
            return Err(bad());
        }
        if atype & rtnl::NLA_TYPE_MASK == rtnl::IFLA_MAX_MTU && alen >= 8 {
            return Ok(u32_at(at + 4).filter(|&v| v > 0));
        }
        at += alen.next_multiple_of(4);
    }
    Ok(None)
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

    /// The kernel answers for the loopback interface (no maximum, or one at least its MTU)
    /// and refuses an unknown name.
    #[test]
    fn max_mtu_of_loopback_and_of_no_interface() {
        if let Some(max) = if_max_mtu("lo").unwrap() {
            assert!(max >= if_mtu("lo").unwrap(), "lo: maxmtu {max}");
        }
        assert!(if_max_mtu("nosuchif0").is_err());
        assert!(if_max_mtu("").is_err());
    }

    /// An answer carrying IFLA_MAX_MTU among other attributes, an error answer, and garbage.
    #[test]
    fn max_mtu_answers_parse() {
        let mut m = getlink_request(7);
        m[4..6].copy_from_slice(&rtnl::RTM_NEWLINK.to_ne_bytes());
        // IFLA_MTU (4) = 1500, then IFLA_MAX_MTU = 9000.
        for (t, v) in [(4u16, 1500u32), (rtnl::IFLA_MAX_MTU, 9000)] {
            m.extend_from_slice(&8u16.to_ne_bytes());
            m.extend_from_slice(&t.to_ne_bytes());
            m.extend_from_slice(&v.to_ne_bytes());
        }
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(parse_max_mtu(&m).unwrap(), Some(9000));
        // Without the attribute: no maximum known.
        let mut short = m[..m.len() - 8].to_vec();
        let len = short.len() as u32;
        short[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(parse_max_mtu(&short).unwrap(), None);
        // An error answer: -ENODEV.
        let mut e = vec![0u8; 36];
        e[..4].copy_from_slice(&36u32.to_ne_bytes());
        e[4..6].copy_from_slice(&rtnl::NLMSG_ERROR.to_ne_bytes());
        e[16..20].copy_from_slice(&(-libc::ENODEV).to_ne_bytes());
        assert_eq!(
            parse_max_mtu(&e).unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
        assert!(parse_max_mtu(&[1, 2, 3]).is_err());
        assert!(parse_max_mtu(&m[..20]).is_err(), "length beyond the bytes");
    }

    /// A veth's maximum, where this process may create one (root): veth reports
    /// ETH_MAX_MTU, 65535.
    #[test]
    fn max_mtu_of_a_veth() {
        let name = format!("pmdmx{}", std::process::id() % 100_000);
        let ok = std::process::Command::new("ip")
            .args(["link", "add", &name, "type", "veth", "peer", "name"])
            .arg(format!("{name}p"))
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED max_mtu_of_a_veth: cannot create a veth pair here");
            return;
        }
        let max = if_max_mtu(&name);
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &name])
            .status();
        // None only on kernels before 4.18, which do not report it.
        let max = max.unwrap();
        assert!(max.is_none_or(|m| m == 65535), "veth maxmtu {max:?}");
    }
}
