//! Unix `SOCK_SEQPACKET` sockets for the control sockets of a running app (telemetry,
//! capture): a listener at a path that reclaims the file of a dead process and refuses a
//! live one, message-at-a-time connections with timeouts, the peer's pid, and passing a
//! file descriptor (`SCM_RIGHTS`).
#![allow(unsafe_code)]

use nix::sys::socket::{
    self, sockopt, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a listener could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A live process listens at the path.
    #[error("{path} is in use by a running process{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Live {
        /// The path.
        path: PathBuf,
        /// The process, where the kernel says.
        pid: Option<u32>,
    },
    /// Anything else.
    #[error("{path}: {err}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        err: io::Error,
    },
}

fn seqpacket() -> io::Result<OwnedFd> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}

/// A listening socket; its file is removed on drop.
#[derive(Debug)]
pub struct SeqListener {
    fd: OwnedFd,
    path: PathBuf,
}

impl SeqListener {
    /// Listens at `path`. A socket file left by a process that is gone is removed first; one
    /// a live process listens on is refused with that process's pid.
    ///
    /// # Errors
    /// [`BindError::Live`], or the socket calls' errors.
    pub fn bind(path: &Path, backlog: i32) -> Result<Self, BindError> {
        let io_err = |err: io::Error| BindError::Io {
            path: path.to_owned(),
            err,
        };
        let addr = UnixAddr::new(path).map_err(|e| io_err(e.into()))?;
        let fd = seqpacket().map_err(io_err)?;
        if let Err(e) = socket::bind(fd.as_raw_fd(), &addr) {
            if e != nix::errno::Errno::EADDRINUSE {
                return Err(io_err(e.into()));
            }
            // Someone's file: live if something accepts on it.
            if let Ok(c) = SeqConn::connect(path) {
                return Err(BindError::Live {
                    path: path.to_owned(),
                    pid: c.peer_pid(),
                });
            }
            std::fs::remove_file(path).map_err(io_err)?;
            socket::bind(fd.as_raw_fd(), &addr).map_err(|e| io_err(e.into()))?;
        }
        let backlog = Backlog::new(backlog).map_err(|e| io_err(e.into()))?;
        socket::listen(&fd, backlog).map_err(|e| io_err(e.into()))?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for a connection.
    ///
    /// # Errors
    /// poll(2) or accept(2) failed.
    pub fn accept_timeout(&self, timeout: Duration) -> io::Result<Option<SeqConn>> {
        if !crate::sys::event::poll_readable(&[self.fd.as_raw_fd()], timeout)?[0] {
            return Ok(None);
        }
        match socket::accept4(&self.fd, SockFlag::SOCK_CLOEXEC) {
            Ok(fd) => Ok(Some(SeqConn { fd })),
            Err(
                nix::errno::Errno::EAGAIN
                | nix::errno::Errno::ECONNABORTED
                | nix::errno::Errno::EINTR,
            ) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for SeqListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One connection: each `send` is one message, each `recv` reads one.
#[derive(Debug)]
pub struct SeqConn {
    fd: OwnedFd,
}

impl SeqConn {
    /// Connects to the socket at `path`.
    ///
    /// # Errors
    /// connect(2)'s error (`ENOENT`: nothing there; `ECONNREFUSED`: a file nobody listens on).
    pub fn connect(path: &Path) -> io::Result<Self> {
        let addr = UnixAddr::new(path)?;
        let fd = seqpacket()?;
        socket::connect(fd.as_raw_fd(), &addr)?;
        Ok(Self { fd })
    }

    /// The peer's process id.
    pub fn peer_pid(&self) -> Option<u32> {
        socket::getsockopt(&self.fd, sockopt::PeerCredentials)
            .ok()
            .map(|c| c.pid() as u32)
    }

    /// Sets how long a `recv` waits (`None`: forever) and how long a `send` may block.
    ///
    /// # Errors
    /// setsockopt(2) failed.
    pub fn set_timeouts(&self, recv: Option<Duration>, send: Option<Duration>) -> io::Result<()> {
        let tv = |d: Option<Duration>| {
            let d = d.unwrap_or(Duration::ZERO);
            nix::sys::time::TimeVal::new(d.as_secs() as _, d.subsec_micros() as _)
        };
        socket::setsockopt(&self.fd, sockopt::ReceiveTimeout, &tv(recv))?;
        socket::setsockopt(&self.fd, sockopt::SendTimeout, &tv(send))?;
        Ok(())
    }

    /// Shuts the connection down both ways: the peer reads the end of it at once, even
    /// while another handle to this socket stays open.
    pub fn shutdown(&self) {
        // ENOTCONN (the peer went first) leaves nothing to do.
        let _ = socket::shutdown(self.fd.as_raw_fd(), socket::Shutdown::Both);
    }

    /// Sends one message.
    ///
    /// # Errors
    /// send(2)'s error (`EAGAIN` after the send timeout, `EPIPE` when the peer is gone).
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        socket::send(self.fd.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL)?;
        Ok(())
    }

    /// Sends one message with a file descriptor.
    ///
    /// # Errors
    /// sendmsg(2)'s error.
    pub fn send_with_fd(&self, msg: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        let fds = [fd.as_raw_fd()];
        socket::sendmsg::<()>(
            self.fd.as_raw_fd(),
            &[io::IoSlice::new(msg)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        Ok(())
    }

    /// Reads one message into `buf`: its length (0: the peer closed), and whether it was
    /// longer than `buf` (the rest is lost).
    ///
    /// # Errors
    /// recv(2)'s error (`EAGAIN` / `WouldBlock` after the receive timeout).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, bool)> {
        let (n, _, trunc) = self.recv_inner(buf, false)?;
        Ok((n, trunc))
    }

    /// Reads one message and the descriptor sent with it, if any.
    ///
    /// # Errors
    /// recvmsg(2)'s error.
    pub fn recv_with_fd(&self, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
        let (n, fd, _) = self.recv_inner(buf, true)?;
        Ok((n, fd))
    }

    fn recv_inner(
        &self,
        buf: &mut [u8],
        want_fd: bool,
    ) -> io::Result<(usize, Option<OwnedFd>, bool)> {
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let mut iov = [io::IoSliceMut::new(buf)];
        let msg = socket::recvmsg::<()>(
            self.fd.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut first = None;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    // SAFETY: the kernel installed this descriptor for us with the message;
                    // nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    if want_fd && first.is_none() {
                        first = Some(owned);
                    } // else dropped: closed, never leaked.
                }
            }
        }
        let trunc = msg.flags.contains(MsgFlags::MSG_TRUNC);
        Ok((msg.bytes, first, trunc))
    }
}

impl AsFd for SeqConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_socket_is_refused_with_its_pid_and_a_stale_one_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = SeqListener::bind(&path, 4).unwrap();
        match SeqListener::bind(&path, 4) {
            Err(BindError::Live { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        // A file left behind by a listener that is gone: reclaimed.
        std::mem::forget(l);
        let l2 = SeqListener::bind(&path, 4);
        // The forgotten listener still listens in this process: still live.
        assert!(matches!(l2, Err(BindError::Live { .. })));
        let stale = dir.path().join("stale");
        {
            let fd = seqpacket().unwrap();
            socket::bind(fd.as_raw_fd(), &UnixAddr::new(&stale).unwrap()).unwrap();
        } // closed without unlinking: what a killed process leaves
        assert!(stale.exists());
        SeqListener::bind(&stale, 4).unwrap();
    }

    #[test]
    fn messages_and_a_descriptor_cross() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = SeqListener::bind(&path, 4).unwrap();
        let c = SeqConn::connect(&path).unwrap();
        let s = l.accept_timeout(Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!(s.peer_pid(), Some(std::process::id()));
        let f = tempfile::tempfile().unwrap();
        s.send_with_fd(b"hello", f.as_fd()).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = c.recv_with_fd(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert!(fd.is_some());
        c.send(&[7u8; 40]).unwrap();
        let mut small = [0u8; 8];
        assert_eq!(s.recv(&mut small).unwrap(), (8, true));
        s.set_timeouts(Some(Duration::from_millis(20)), None)
            .unwrap();
        assert_eq!(
            s.recv(&mut small).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(c);
        assert_eq!(s.recv(&mut small).unwrap().0, 0);
    }
}
