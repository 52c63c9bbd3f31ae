//! A device-model port on an afpacket wire follows its interface's link: down while the
//! interface is down, and the tools say so rather than send into it with no word.
//! Needs root (a network namespace); skips cleanly otherwise.

use integration_tests::{Netns, IF};

fn pktgen(ns: &Netns, timeout: &str) -> std::process::Output {
    let spec = format!("emu-mana:wire=afpacket:{IF}");
    ns.exec(std::path::Path::new(env!("CARGO_BIN_EXE_pktgen")))
        .args(["--port", &spec, "--lcores", "0", "--count", "10"])
        .args(["--rate", "1000", "--drain-timeout", "0.5"])
        .args(["--link-timeout", timeout])
        .env("PMD_LOG", "error")
        .output()
        .unwrap()
}

#[test]
fn pktgen_on_a_down_interface_says_so_and_fails_then_sends_once_it_is_up() {
    let Some(ns) = Netns::create("lk") else {
        return;
    };
    assert!(ns.all(false), "the interface starts down");
    let out = pktgen(&ns, "0.3");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "pktgen: warning: port 0 (emu-mana:wire=afpacket:{IF}): link down; waiting up to 0.3 s for it (--link-timeout)"
        )),
        "{err}"
    );
    assert!(err.contains("raise --link-timeout"), "{err}");

    ns.set(true);
    // A veth netdev has carrier only while its peer is up too (a dummy one has no peer).
    let _ = ns.ip(&["link", "set", "pmd0peer", "up"]);
    let out = pktgen(&ns, "30");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("link down"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sent 10 "), "{text}");
}
