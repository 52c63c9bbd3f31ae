//! [`AfPacket`]: an existing Linux interface as the far end of the cable.
#![deny(unsafe_code)]

use super::{Wire, WireError};
use crate::sys::net::PacketSocket;

/// A Linux interface as the far end.
#[derive(Debug)]
pub struct AfPacket {
    sock: PacketSocket,
}

impl AfPacket {
    /// Attaches to `ifname`.
    ///
    /// # Errors
    /// [`WireError::AfPacket`] when the interface is missing or the socket is not allowed.
    pub fn open(ifname: &str) -> Result<Self, WireError> {
        let sock = PacketSocket::open(ifname).map_err(|source| WireError::AfPacket {
            ifname: ifname.into(),
            source,
        })?;
        Ok(Self { sock })
    }
}

impl Wire for AfPacket {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.sock.send(frame).unwrap_or(false)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.sock.recv(buf).ok().flatten()
    }
    fn describe(&self) -> String {
        format!("afpacket:{}", self.sock.ifname())
    }
}
