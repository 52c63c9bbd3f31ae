//! A device model's link events: an eventfd readable while events wait, and the events
//! themselves ([`PortEvent::LinkUp`] / [`PortEvent::LinkDown`]), one per change of the link
//! the model shows, in order. Both models report through it what a NIC reports through
//! rdma-core's asynchronous events (`IBV_EVENT_PORT_ACTIVE` / `IBV_EVENT_PORT_ERR`): the far
//! end of the cable attaching or going away, a link-down fault set or cleared. A capture on
//! the model's wire that stops recording is reported the same way, once
//! ([`PortEvent::CaptureFailed`]).
#![deny(unsafe_code)]

use crate::ethdev::PortEvent;
use crate::sys::event::EventFd;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How often a model's engine looks at the wire's link state (the far end attaching or
/// going away) and at its link-down fault.
pub const LINK_POLL: Duration = Duration::from_millis(10);

struct State {
    up: bool,
    capture_failed: bool,
    pending: Vec<PortEvent>,
}

/// The link state a model last reported, its events not yet taken, and the descriptor that
/// says some wait.
pub struct LinkEvents {
    state: Mutex<State>,
    /// Readable while events wait (`None` if no eventfd could be had: no events).
    efd: Option<EventFd>,
}

impl std::fmt::Debug for LinkEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        write!(f, "LinkEvents(up {}, {} pending)", s.up, s.pending.len())
    }
}

impl LinkEvents {
    /// Events of port `port_id`, whose link is `up` now (no event for it).
    pub fn new(up: bool, port_id: u16) -> Self {
        let efd = EventFd::new()
            .inspect_err(|e| {
                tracing::warn!(target: "pmd::emu", port = port_id, "no eventfd for port events ({e}): the port reports none");
            })
            .ok();
        Self {
            state: Mutex::new(State {
                up,
                capture_failed: false,
                pending: Vec::new(),
            }),
            efd,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the link is `up`, queueing an event (and signalling the descriptor) when
    /// it changed. Callers hold the engine's lock, so that two threads cannot report out of
    /// order.
    pub fn note(&self, up: bool) {
        let mut s = self.lock();
        if s.up != up {
            s.up = up;
            s.pending.push(if up {
                PortEvent::LinkUp
            } else {
                PortEvent::LinkDown
            });
            if let Some(fd) = &self.efd {
                fd.signal();
            }
        }
    }

    /// Records the state of the wire's capture (`Wire::capture_error`): the first failure
    /// queues [`PortEvent::CaptureFailed`] (and signals the descriptor); later looks add none.
    pub fn note_capture(&self, error: Option<i32>) {
        let Some(errno) = error else { return };
        let mut s = self.lock();
        if !s.capture_failed {
            s.capture_failed = true;
            s.pending.push(PortEvent::CaptureFailed { errno });
            if let Some(fd) = &self.efd {
                fd.signal();
            }
        }
    }

    /// The descriptor readable while events wait.
    pub fn fd(&self) -> Option<RawFd> {
        self.efd.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Moves the waiting events to `out`, oldest first.
    pub fn take(&self, out: &mut Vec<PortEvent>) {
        let mut s = self.lock();
        if let Some(fd) = &self.efd {
            fd.clear();
        }
        out.append(&mut s.pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_capture_is_reported_once() {
        let ev = LinkEvents::new(true, 0);
        let mut out = Vec::new();
        ev.note_capture(None);
        ev.take(&mut out);
        assert!(out.is_empty());
        ev.note_capture(Some(libc::ENOSPC));
        ev.note_capture(Some(libc::ENOSPC));
        ev.take(&mut out);
        assert_eq!(
            out,
            [PortEvent::CaptureFailed {
                errno: libc::ENOSPC
            }]
        );
        ev.note_capture(Some(libc::EIO));
        ev.take(&mut out);
        assert_eq!(out.len(), 1, "reported once");
    }

    #[test]
    fn one_event_per_change_in_order() {
        let ev = LinkEvents::new(true, 0);
        let mut out = Vec::new();
        ev.note(true);
        ev.take(&mut out);
        assert!(out.is_empty());
        ev.note(false);
        ev.note(false);
        ev.note(true);
        ev.note(false);
        let fd = ev.fd().expect("an eventfd");
        assert_eq!(
            crate::sys::event::poll_readable(&[fd], std::time::Duration::ZERO).unwrap(),
            [true]
        );
        ev.take(&mut out);
        assert_eq!(
            out,
            [PortEvent::LinkDown, PortEvent::LinkUp, PortEvent::LinkDown]
        );
        assert_eq!(
            crate::sys::event::poll_readable(&[fd], std::time::Duration::ZERO).unwrap(),
            [false]
        );
    }
}
