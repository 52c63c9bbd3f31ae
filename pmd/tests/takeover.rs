//! Port exclusivity with a real Linux netdev playing the kernel's interface of a modelled
//! MANA port: while it is up it holds the port; `takeover=1` brings it down for the port's
//! lifetime and back up when the port closes. The interfaces are a veth pair this test creates
//! (no addresses, no traffic) and deletes. Needs root and `ip`; skipped otherwise.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Port, PortConfig, PortError};
use pmd::sys::net::{if_flags, set_if_up, IFF_UP};
use std::process::Command;

struct Veth(String);

impl Veth {
    fn create() -> Option<Self> {
        let name = format!("pmdtk{}", std::process::id() % 100_000);
        let ok = Command::new("ip")
            .args([
                "link",
                "add",
                &name,
                "type",
                "veth",
                "peer",
                "name",
                &format!("{name}p"),
            ])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Veth(name))
    }
    fn up(&self) -> bool {
        if_flags(&self.0).unwrap() & IFF_UP != 0
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

fn cfg() -> PortConfig {
    PortConfig {
        rx_ring_size: 64,
        tx_ring_size: 64,
        ..Default::default()
    }
}

#[test]
fn kernel_netdev_holds_the_port_until_taken_over_and_gets_it_back() {
    let Some(veth) = Veth::create() else {
        // Where the machine allows it, CI sets PMD_REQUIRE_PRIVILEGED: a skip would hide a failure.
        assert!(
            std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
            "PMD_REQUIRE_PRIVILEGED is set but kernel_netdev_holds_the_port_until_taken_over_and_gets_it_back: cannot create a veth pair here (needs root and iproute2)"
        );
        eprintln!("SKIPPED kernel_netdev_holds_the_port_until_taken_over_and_gets_it_back: cannot create a veth pair here (needs root and iproute2)");
        return;
    };
    let pool = MbufPool::new(MbufPoolConfig::new("takeover", 512)).unwrap();
    set_if_up(&veth.0, true).unwrap();
    assert!(veth.up());

    // Held: the error names the netdev and says what to do, including takeover=1.
    let mut port = Port::open(
        0,
        &format!("emu-mana:wire=none,netdev={}", veth.0)
            .parse()
            .unwrap(),
    )
    .unwrap();
    let e = port.configure(&cfg(), &pool).unwrap_err();
    assert!(matches!(e, PortError::Busy { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("kernel netdev {} holds it", veth.0)),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("ip link set {} down", veth.0)) && msg.contains("takeover=1"),
        "{msg}"
    );
    assert!(veth.up(), "without takeover nothing is touched");
    drop(port);

    // Taken over: down while the port lives, up again when it closes.
    let mut port = Port::open(
        0,
        &format!("emu-mana:wire=none,netdev={},takeover=1", veth.0)
            .parse()
            .unwrap(),
    )
    .unwrap();
    port.configure(&cfg(), &pool).unwrap();
    assert!(!veth.up(), "the port took the netdev down");
    port.start().unwrap();
    port.close();
    assert!(veth.up(), "closing the port gave it back");

    // A netdev that is already down does not hold the port and is left down.
    set_if_up(&veth.0, false).unwrap();
    let mut port = Port::open(
        0,
        &format!("emu-mana:wire=none,netdev={},takeover=1", veth.0)
            .parse()
            .unwrap(),
    )
    .unwrap();
    port.configure(&cfg(), &pool).unwrap();
    drop(port);
    assert!(!veth.up(), "we only bring back what we took down");
}
