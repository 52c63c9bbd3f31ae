//! Port events from the MANA device model: one pollable descriptor per port that becomes
//! readable on a link transition (the link-down fault, the far end of the cable attaching or
//! going away), and `take_events` that hands the transitions out in order and clears it.

use pmd::emu::mana::{Faults, ModelHandle};
use pmd::emu::testing;
use pmd::emu::wire::{Loopback, Wire};
use pmd::port::{probe, wait_events, Port, PortEvent};
use pmd::sys::event::poll_readable;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// A MANA port over a device model on `wire`, and the model's handle.
fn model_port(id: u16, wire: &str) -> (Port, ModelHandle) {
    let (model, handle) = testing::mana(wire, id).unwrap();
    let port = probe::mana(
        id,
        format!("model {id} on {wire}"),
        Box::new(model),
        pmd::mana::Options::default(),
    );
    (port, handle)
}

fn readable(fd: RawFd, within: Duration) -> bool {
    poll_readable(&[fd], within).unwrap()[0]
}

/// Polls `port`'s descriptor until it is readable (at most 2 s) and takes the events.
fn next_events(port: &mut Port) -> Vec<PortEvent> {
    let fd = port.event_fd().expect("a model port has an event fd");
    assert!(
        readable(fd, Duration::from_secs(2)),
        "no event within 2 s (link up: {})",
        port.link().up
    );
    port.take_events()
}

#[test]
fn the_link_down_fault_is_reported_down_then_up_through_the_fd() {
    let (mut port, h) = model_port(0, "none");
    let fd = port.event_fd().expect("a model port has an event fd");
    assert!(port.link().up, "a wire-less model is attached");
    assert!(!readable(fd, Duration::ZERO), "nothing happened yet");
    assert!(port.take_events().is_empty());

    h.set_faults(Faults {
        link_down: true,
        ..Faults::default()
    });
    assert_eq!(next_events(&mut port), [PortEvent::LinkDown]);
    assert!(!port.link().up);
    assert!(!readable(fd, Duration::ZERO), "take_events clears the fd");

    // Setting the same state again is no transition.
    h.set_faults(Faults {
        link_down: true,
        rx_drop_every: 3,
        ..Faults::default()
    });
    assert!(!readable(fd, Duration::from_millis(50)));

    h.set_faults(Faults::default());
    assert_eq!(next_events(&mut port), [PortEvent::LinkUp]);
    assert!(port.link().up);
}

#[test]
fn a_flap_before_the_app_looks_is_delivered_in_order() {
    let (mut port, h) = model_port(0, "none");
    let down = Faults {
        link_down: true,
        ..Faults::default()
    };
    h.set_faults(down.clone());
    h.set_faults(Faults::default());
    h.set_faults(down);
    assert_eq!(
        next_events(&mut port),
        [PortEvent::LinkDown, PortEvent::LinkUp, PortEvent::LinkDown]
    );
    let fd = port.event_fd().unwrap();
    assert!(!readable(fd, Duration::ZERO), "level-triggered: drained");
}

#[test]
fn the_far_end_of_the_cable_attaching_and_going_is_seen_by_the_engine_thread() {
    let name = format!("port-events-{}", std::process::id());
    let (mut port, _h) = model_port(0, &format!("loop:{name}"));
    assert!(!port.link().up, "down until the far end is attached");
    let fd = port.event_fd().unwrap();
    assert!(!readable(fd, Duration::from_millis(30)));

    let far = Loopback::open(&name).unwrap();
    assert!(far.peer_attached());
    let t0 = Instant::now();
    assert_eq!(next_events(&mut port), [PortEvent::LinkUp]);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());

    drop(far);
    assert_eq!(next_events(&mut port), [PortEvent::LinkDown]);
}

#[test]
fn wait_events_watches_several_ports_and_sleeps_when_quiet() {
    let (a, ha) = model_port(0, "none");
    let (b, _hb) = model_port(1, "none");
    let mut ports = vec![a, b];
    let t0 = Instant::now();
    assert!(wait_events(&mut ports, Duration::from_millis(40))
        .unwrap()
        .is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(35), "it waited");

    ha.set_faults(Faults {
        link_down: true,
        ..Faults::default()
    });
    let got = wait_events(&mut ports, Duration::from_secs(2)).unwrap();
    assert_eq!(got, [(0, PortEvent::LinkDown)]);

    // A null port has no descriptor: wait_events just sleeps over it.
    let mut nulls = vec![Port::open(0, &"null".parse().unwrap()).unwrap()];
    assert_eq!(nulls[0].event_fd(), None);
    assert!(wait_events(&mut nulls, Duration::from_millis(1))
        .unwrap()
        .is_empty());
}

/// Both models report their link as events: the far end of the cable attaching, then the
/// link faults of `faults=link` taking turns with clean periods, down and up in order.
#[test]
fn both_models_report_link_changes_and_the_link_fault_cycle() {
    for kind in ["emu-mana", "emu-mlx5"] {
        let name = format!("port-events-cycle-{kind}-{}", std::process::id());
        let spec = format!("{kind}:wire=loop:{name},engine=thread,faults=link,fault-period=0.05");
        let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
        assert!(
            !port.link().up,
            "{kind}: down until the far end is attached"
        );
        let far = Loopback::open(&name).unwrap();
        let mut seen = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        // Attached (up), then at least two whole fault phases (down, up).
        while seen.len() < 5 && Instant::now() < end {
            seen.extend(next_events(&mut port));
        }
        assert!(seen.len() >= 5, "{kind}: {seen:?}");
        for (i, e) in seen.iter().enumerate() {
            let want = if i % 2 == 0 {
                PortEvent::LinkUp
            } else {
                PortEvent::LinkDown
            };
            assert_eq!(*e, want, "{kind}: event {i} of {seen:?}");
        }
        drop(far);
    }
}
