//! The device model: the NIC's side of the very same queue memory, doorbells and completions
//! the drivers use on hardware, plus the wires its frames travel on. A provider: it
//! implements a driver's provider trait ([`mana::Model`] implements `mana::Provider`) and
//! names no port type. [`mlx5::Model`] serves the raw queues of the mlx5 driver.
//!
//! What every NIC model shares lives here: [`mr`] (the memory-key table every DMA goes
//! through), [`thread`] (how an engine gets a CPU, generic over [`thread::Nic`]: its own
//! thread, or inline on the threads that poll its queues, see [`EngineMode`]) and [`wire`].
#![deny(unsafe_code)]

pub mod events;
pub mod faults;
pub mod handle;
pub mod mana;
pub mod mlx5;
pub mod mr;
pub mod testing;
pub mod thread;
pub mod wire;

pub use thread::EngineMode;

use crate::net::MacAddr;

/// The MAC address of a model port opened without `mac=`: locally administered
/// (`02:15:xx`), `family` telling the models apart (`0x5d` MANA, `0x6d` mlx5), then this
/// process's id and the port number, so two processes (pktgen and l2fwd on one cable) never
/// share a MAC: `02:15:<family>:<pid hi>:<pid lo ^ port hi>:<port lo>`.
pub fn default_mac(family: u8, port_id: u16) -> MacAddr {
    let pid = std::process::id();
    MacAddr([
        0x02,
        0x15,
        family,
        (pid >> 8) as u8,
        (pid as u8) ^ (port_id >> 8) as u8,
        port_id as u8,
    ])
}

#[cfg(test)]
mod tests {
    use super::default_mac;

    #[test]
    fn default_macs_carry_the_process_and_the_port() {
        let pid = std::process::id();
        let m = default_mac(0x5d, 3).0;
        assert_eq!(&m[..3], &[0x02, 0x15, 0x5d]);
        assert_eq!((m[3], m[4], m[5]), ((pid >> 8) as u8, pid as u8, 3));
        assert_eq!(m[0] & 1, 0, "unicast");
        assert_ne!(default_mac(0x5d, 0), default_mac(0x5d, 1));
        assert_ne!(default_mac(0x5d, 0), default_mac(0x6d, 0));
        assert_ne!(
            default_mac(0x5d, 1),
            default_mac(0x5d, 257),
            "port ids above 255"
        );
    }
}
