//! Test helper: sends frames on a Linux interface, as a peer in another network namespace
//! would (`ip netns exec NS wire_send IFACE HEX...`), then exits. Each argument after the
//! interface is one whole frame in hex, tags and all; they go out in order, unchanged,
//! through an afpacket wire's transmit ring. Prints how many it sent.
//! Usage: wire_send IFACE HEXFRAME...

use pmd::emu::wire::{AfPacket, Wire};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, ifname, frames @ ..] = &args[..] else {
        eprintln!("usage: wire_send IFACE HEXFRAME...");
        std::process::exit(2);
    };
    let mut wire = AfPacket::open(ifname).unwrap_or_else(|e| {
        eprintln!("wire_send: {e}");
        std::process::exit(1);
    });
    for (i, hex) in frames.iter().enumerate() {
        let frame: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|k| u8::from_str_radix(&hex[k..k + 2], 16).expect("hex frame"))
            .collect();
        if !wire.send(&frame) {
            eprintln!("wire_send: frame {i} refused: {:?}", wire.stats());
            std::process::exit(1);
        }
    }
    wire.flush();
    let failed: u64 = wire
        .stats()
        .iter()
        .filter(|x| x.name == "tx_kick_errors")
        .map(|x| x.value)
        .sum();
    if failed > 0 {
        eprintln!("wire_send: the kernel refused to send: {:?}", wire.stats());
        std::process::exit(1);
    }
    println!("sent {}", frames.len());
}
