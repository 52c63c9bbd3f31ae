//! [`AfPacket`]: an existing Linux interface as the far end of the cable.
#![deny(unsafe_code)]

use super::{Wire, WireError};
use crate::sys::net::{if_flags, PacketSocket, IFF_RUNNING, IFF_UP};

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

/// Whether interface flags say the link is up: administratively up (`IFF_UP`) and with
/// carrier, i.e. operationally up (`IFF_RUNNING`; a veth has it only while its peer is up).
fn carrier(flags: u32) -> bool {
    flags & (IFF_UP | IFF_RUNNING) == IFF_UP | IFF_RUNNING
}

impl Wire for AfPacket {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.sock.send(frame).unwrap_or(false)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.sock.recv(buf).ok().flatten()
    }
    /// The interface is up and running (`IFF_UP` and `IFF_RUNNING`, read with SIOCGIFFLAGS in
    /// this process's network namespace); false if it has gone away.
    fn peer_attached(&self) -> bool {
        if_flags(self.sock.ifname()).is_ok_and(carrier)
    }
    fn describe(&self) -> String {
        format!("afpacket:{}", self.sock.ifname())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carrier_needs_up_and_running() {
        assert!(carrier(IFF_UP | IFF_RUNNING));
        assert!(carrier(IFF_UP | IFF_RUNNING | 0x1000));
        assert!(
            !carrier(IFF_UP),
            "up without carrier (a veth whose peer is down)"
        );
        assert!(!carrier(IFF_RUNNING));
        assert!(!carrier(0));
    }

    #[test]
    fn the_loopback_interface_is_attached() {
        // Opening the socket needs CAP_NET_RAW.
        match AfPacket::open("lo") {
            Ok(w) => assert!(w.peer_attached(), "lo is up and running"),
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}
