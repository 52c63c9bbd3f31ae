//! Port exclusivity with a real Linux netdev playing the kernel's interface of a modelled
//! MANA port: while it is up it holds the port; `busy=takeover` (or the older `takeover=1`)
//! brings it down for the port's lifetime and back up when the port closes. The interfaces are a veth pair this test creates
//! (no addresses, no traffic) and deletes. Needs root and `ip`; skipped otherwise.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Port, PortConfig, PortError};
use pmd::sys::net::{if_flags, set_if_up, IFF_UP};
use std::process::Command;

struct Veth(String);

impl Veth {
    fn create(tag: &str) -> Option<Self> {
        let name = format!("pmdtk{tag}{}", std::process::id() % 100_000);
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
    PortConfig::default().with_ring_sizes(64, 64)
}

#[test]
fn kernel_netdev_holds_the_port_until_taken_over_and_gets_it_back() {
    let Some(veth) = Veth::create("") else {
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

    // Held: the error names the netdev and says what to do: the command, busy=wait and
    // busy=takeover.
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
        msg.contains(&format!("`ip link set {} down`", veth.0))
            && msg.contains("busy=wait")
            && msg.contains("busy=takeover"),
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

    // The exit paths (second signal, panic) empty the process-wide registry; a port whose
    // netdev was given back that way leaves it alone when it closes later.
    set_if_up(&veth.0, true).unwrap();
    let mut port = Port::open(
        0,
        &format!("emu-mana:wire=none,netdev={},busy=takeover", veth.0)
            .parse()
            .unwrap(),
    )
    .unwrap();
    port.configure(&cfg(), &pool).unwrap();
    assert!(!veth.up());
    assert_eq!(
        pmd::takeover::guard::taken_now(),
        std::slice::from_ref(&veth.0)
    );
    assert_eq!(pmd::takeover::restore_all("test"), 1);
    assert!(veth.up(), "restore_all gave it back");
    assert!(pmd::takeover::guard::taken_now().is_empty());
    set_if_up(&veth.0, false).unwrap();
    port.close();
    assert!(!veth.up(), "the port found nothing left to give back");
}

fn skip(test: &str) {
    assert!(
        std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
        "PMD_REQUIRE_PRIVILEGED is set but {test}: cannot create a veth pair here"
    );
    eprintln!("SKIPPED {test}: cannot create a veth pair here (needs root and iproute2)");
}

#[test]
fn busy_wait_waits_for_the_netdev_to_go_down_or_gives_up() {
    let Some(veth) = Veth::create("w") else {
        return skip("busy_wait_waits_for_the_netdev_to_go_down_or_gives_up");
    };
    let pool = MbufPool::new(MbufPoolConfig::new("busy-wait", 512)).unwrap();
    set_if_up(&veth.0, true).unwrap();

    let spec = format!(
        "emu-mana:wire=none,netdev={},busy=wait,busy-timeout=0.2",
        veth.0
    );
    let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
    let t0 = std::time::Instant::now();
    let e = port.configure(&cfg(), &pool).unwrap_err();
    assert!(
        t0.elapsed() >= std::time::Duration::from_millis(200),
        "it waited"
    );
    assert!(matches!(e, PortError::Busy { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("still held after waiting 0.2"), "{msg}");
    assert!(msg.contains("raise busy-timeout"), "{msg}");
    drop(port);

    let spec = format!(
        "emu-mana:wire=none,netdev={},busy=wait,busy-timeout=20",
        veth.0
    );
    let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
    let name = veth.0.clone();
    let freer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        set_if_up(&name, false).unwrap();
    });
    let t0 = std::time::Instant::now();
    port.configure(&cfg(), &pool).unwrap();
    freer.join().unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(300) && waited.as_secs() < 5,
        "configured once the netdev went down: {waited:?}"
    );
    port.close();
    assert!(!veth.up(), "busy=wait never brings the netdev up");
}
