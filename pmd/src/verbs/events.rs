//! A context's asynchronous events (`ibv_get_async_event(3)`): fetching and acknowledging
//! them, and what each means for one port.
//!
//! How rdma-core delivers them (facts from rdma-core v44.0 and its man page, restated):
//! * The context's `async_fd` becomes readable when the kernel queued an event. It is
//!   blocking unless the application sets `O_NONBLOCK` on it (`fcntl`), which the man page
//!   gives as the way to poll it; then `ibv_get_async_event` fails with `EAGAIN` when
//!   nothing is queued (it is a plain `read` of the descriptor,
//!   libibverbs/device.c:452–496).
//! * Which member of `element` is valid depends on the type: a CQ for `CQ_ERR`; a QP for
//!   the QP events; an SRQ for the SRQ events; a WQ for `WQ_FATAL`; otherwise the port
//!   number (`device_fatal` carries 0) (libibverbs/device.c:464–491).
//! * Every event fetched must be acknowledged (`ibv_ack_async_event`): destroying a CQ, QP,
//!   SRQ or WQ waits until its events are acknowledged (man page, NOTES). We acknowledge
//!   each one right after copying it out, so a teardown never waits on us.
//! * Every context of a device receives the device's port and fatal events, whichever port
//!   it serves: a provider keeps those of its own port only.
//! * On a hot removal the kernel queues `IBV_EVENT_DEVICE_FATAL` and then closes the event
//!   queue: once drained, reads fail with `EIO` (kernel `ib_uverbs_free_hw_resources`,
//!   `uverbs_async_event_destroy_uobj`, `ib_uverbs_event_read`). A read error other than
//!   `EAGAIN`/`EINTR` is therefore [`PortEvent::DeviceRemoved`].
//! * Link events: kernels whose RDMA core has `ib_dispatch_port_state_event` raise
//!   `PORT_ERR` / `PORT_ACTIVE` on a netdev link change, once per change (it compares with
//!   the last state it reported).
#![allow(unsafe_code)]

use super::objects::Context;
use crate::ethdev::{PortEvent, QueueFault, QueueRef};
use rdma_sys::ibv_event_type as t;
use std::ffi::{c_int, c_void};
use std::io;
use std::os::fd::BorrowedFd;

/// `struct ibv_async_event`, with the event type as a plain integer: rdma-sys declares it as
/// a Rust enum, and a type this build does not know would be an invalid value.
#[repr(C)]
struct RawEvent {
    element: RawElement,
    event_type: u32,
}

#[repr(C)]
union RawElement {
    object: *mut c_void,
    port_num: c_int,
}

const _: () = {
    assert!(std::mem::size_of::<RawEvent>() == std::mem::size_of::<rdma_sys::ibv_async_event>());
    assert!(std::mem::align_of::<RawEvent>() == std::mem::align_of::<rdma_sys::ibv_async_event>());
};

/// What an event is about, as `ibv_get_async_event` fills `element`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// A verbs object (CQ, QP, SRQ or WQ): its address, the pointer the application holds.
    Object(usize),
    /// A port number (port events; 0 for device events).
    Port(u32),
}

/// One asynchronous event, copied out of rdma-core's struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// `enum ibv_event_type` value.
    pub event_type: u32,
    /// What it is about.
    pub element: Element,
}

/// Whether `event_type`'s element is an object (and not a port number), as libibverbs
/// fills the union (libibverbs/device.c:464–491).
fn element_is_object(event_type: u32) -> bool {
    [
        t::IBV_EVENT_CQ_ERR,
        t::IBV_EVENT_QP_FATAL,
        t::IBV_EVENT_QP_REQ_ERR,
        t::IBV_EVENT_QP_ACCESS_ERR,
        t::IBV_EVENT_COMM_EST,
        t::IBV_EVENT_SQ_DRAINED,
        t::IBV_EVENT_PATH_MIG,
        t::IBV_EVENT_PATH_MIG_ERR,
        t::IBV_EVENT_QP_LAST_WQE_REACHED,
        t::IBV_EVENT_SRQ_ERR,
        t::IBV_EVENT_SRQ_LIMIT_REACHED,
        t::IBV_EVENT_WQ_FATAL,
    ]
    .iter()
    .any(|&k| k as u32 == event_type)
}

/// The outcome of one fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// An event (already acknowledged).
    Event(AsyncEvent),
    /// Nothing queued (`EAGAIN`), or a signal interrupted the read.
    Empty,
    /// The channel failed with this errno: the device is gone.
    Failed(i32),
}

/// Makes the context's async-event descriptor non-blocking, so that [`fetch`] never waits.
///
/// # Errors
/// fcntl(2) failed.
pub fn set_nonblocking(ctx: &Context) -> io::Result<()> {
    // SAFETY: the async fd belongs to the open context, which `ctx` keeps open for the whole
    // call; the borrow does not outlive it.
    let fd = unsafe { BorrowedFd::borrow_raw(ctx.async_fd()) };
    crate::sys::event::set_nonblocking(fd)
}

/// Fetches one event from `ctx` (`ibv_get_async_event`) and acknowledges it
/// (`ibv_ack_async_event`). Call only after [`set_nonblocking`] succeeded: on a blocking
/// descriptor this waits for an event.
pub fn fetch(ctx: &Context) -> Fetched {
    let mut ev = RawEvent {
        element: RawElement {
            object: std::ptr::null_mut(),
        },
        event_type: 0,
    };
    // SAFETY: the context is open while `ctx` exists; `ev` has the layout of
    // `struct ibv_async_event` (asserted above) and is written, never read, by the call.
    // No Rust reference to rdma-sys's struct (whose enum field could be invalid) is made.
    let ret = unsafe {
        rdma_sys::ibv_get_async_event(
            ctx.as_ptr(),
            (&raw mut ev).cast::<rdma_sys::ibv_async_event>(),
        )
    };
    if ret != 0 {
        let e = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        return match e {
            libc::EAGAIN | libc::EINTR => Fetched::Empty,
            e => Fetched::Failed(e),
        };
    }
    let element = if element_is_object(ev.event_type) {
        // SAFETY: for these types libibverbs stored an object pointer in the union.
        Element::Object(unsafe { ev.element.object } as usize)
    } else {
        // SAFETY: for every other type libibverbs stored the port number (an int).
        Element::Port(u32::try_from(unsafe { ev.element.port_num }).unwrap_or(0))
    };
    // SAFETY: `ev` is the event just returned by `ibv_get_async_event` on this context, not
    // acknowledged before; the objects it may name are alive (the provider holds them).
    unsafe { rdma_sys::ibv_ack_async_event((&raw mut ev).cast::<rdma_sys::ibv_async_event>()) };
    Fetched::Event(AsyncEvent {
        event_type: ev.event_type,
        element,
    })
}

/// Most events one [`drain`] fetches; the rest wait for the next call (the descriptor stays
/// readable).
const EVENTS_PER_CALL: usize = 1024;

/// Fetches, acknowledges and maps the events queued on `ctx` for port `port` of the
/// provider named `name` into `out`, while `*live` (cleared, with a `DeviceRemoved` event,
/// when the channel fails: the device is gone). `queue_of` names the queue of an object
/// address. Shared by the MANA and mlx5 providers.
pub fn drain(
    ctx: &Context,
    port: u32,
    name: &str,
    live: &mut bool,
    queue_of: impl Fn(usize) -> Option<QueueRef>,
    out: &mut Vec<PortEvent>,
) {
    if !*live {
        return;
    }
    for _ in 0..EVENTS_PER_CALL {
        match fetch(ctx) {
            Fetched::Empty => return,
            Fetched::Event(ev) => {
                let mapped = map_event(ev, port, &queue_of);
                tracing::debug!(target: "pmd::verbs", port = %name, event = %type_name(ev.event_type), element = ?ev.element, mapped = ?mapped, "async event");
                out.extend(mapped);
            }
            Fetched::Failed(errno) => {
                tracing::warn!(target: "pmd::verbs", port = %name, "async event channel failed: {}; the device is gone", std::io::Error::from_raw_os_error(errno));
                *live = false;
                out.push(PortEvent::DeviceRemoved);
                return;
            }
        }
    }
}

/// What `ev` means for port `port`: `None` for events of other ports and for those that
/// are no failure (communication established, SQ drained, path migration, LID/GID/P_Key
/// changes, SRQ events: we create no SRQ). `queue_of` names the queue of an object address.
pub fn map_event(
    ev: AsyncEvent,
    port: u32,
    queue_of: impl Fn(usize) -> Option<QueueRef>,
) -> Option<PortEvent> {
    let k = ev.event_type;
    let is = |x: t| x as u32 == k;
    if is(t::IBV_EVENT_DEVICE_FATAL) {
        return Some(PortEvent::DeviceFatal);
    }
    if is(t::IBV_EVENT_PORT_ACTIVE) || is(t::IBV_EVENT_PORT_ERR) {
        return (ev.element == Element::Port(port)).then_some(if is(t::IBV_EVENT_PORT_ACTIVE) {
            PortEvent::LinkUp
        } else {
            PortEvent::LinkDown
        });
    }
    let what = if is(t::IBV_EVENT_CQ_ERR) {
        QueueFault::CqError
    } else if is(t::IBV_EVENT_QP_FATAL) {
        QueueFault::QpFatal
    } else if is(t::IBV_EVENT_QP_REQ_ERR) {
        QueueFault::QpRequestError
    } else if is(t::IBV_EVENT_QP_ACCESS_ERR) {
        QueueFault::QpAccessError
    } else if is(t::IBV_EVENT_WQ_FATAL) {
        QueueFault::WqFatal
    } else {
        return None;
    };
    let queue = match ev.element {
        Element::Object(a) => queue_of(a).unwrap_or(QueueRef::Raw(a as u64)),
        Element::Port(p) => QueueRef::Raw(u64::from(p)),
    };
    Some(PortEvent::QueueError { queue, what })
}

/// A readable name of an event type, for logs (`IBV_EVENT_PORT_ERR`, or the number).
pub fn type_name(event_type: u32) -> String {
    const NAMES: [&str; 20] = [
        "CQ_ERR",
        "QP_FATAL",
        "QP_REQ_ERR",
        "QP_ACCESS_ERR",
        "COMM_EST",
        "SQ_DRAINED",
        "PATH_MIG",
        "PATH_MIG_ERR",
        "DEVICE_FATAL",
        "PORT_ACTIVE",
        "PORT_ERR",
        "LID_CHANGE",
        "PKEY_CHANGE",
        "SM_CHANGE",
        "SRQ_ERR",
        "SRQ_LIMIT_REACHED",
        "QP_LAST_WQE_REACHED",
        "CLIENT_REREGISTER",
        "GID_CHANGE",
        "WQ_FATAL",
    ];
    NAMES.get(event_type as usize).map_or_else(
        || format!("event type {event_type}"),
        |n| format!("IBV_EVENT_{n}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(k: t, element: Element) -> AsyncEvent {
        AsyncEvent {
            event_type: k as u32,
            element,
        }
    }

    fn none(_: usize) -> Option<QueueRef> {
        None
    }

    #[test]
    fn port_events_count_for_our_port_only() {
        let up = ev(t::IBV_EVENT_PORT_ACTIVE, Element::Port(2));
        let down = ev(t::IBV_EVENT_PORT_ERR, Element::Port(2));
        assert_eq!(map_event(up, 2, none), Some(PortEvent::LinkUp));
        assert_eq!(map_event(down, 2, none), Some(PortEvent::LinkDown));
        assert_eq!(map_event(up, 1, none), None);
        assert_eq!(map_event(down, 1, none), None);
    }

    #[test]
    fn device_fatal_counts_for_every_port() {
        let f = ev(t::IBV_EVENT_DEVICE_FATAL, Element::Port(0));
        assert_eq!(map_event(f, 1, none), Some(PortEvent::DeviceFatal));
        assert_eq!(map_event(f, 2, none), Some(PortEvent::DeviceFatal));
    }

    #[test]
    fn queue_errors_name_the_queue_or_the_raw_object() {
        let queue_of = |a: usize| match a {
            0x1000 => Some(QueueRef::Tx(0)),
            0x2000 => Some(QueueRef::Rx(1)),
            0x3000 => Some(QueueRef::RxAll),
            _ => None,
        };
        let cases = [
            (
                t::IBV_EVENT_QP_FATAL,
                0x1000,
                QueueRef::Tx(0),
                QueueFault::QpFatal,
            ),
            (
                t::IBV_EVENT_CQ_ERR,
                0x2000,
                QueueRef::Rx(1),
                QueueFault::CqError,
            ),
            (
                t::IBV_EVENT_WQ_FATAL,
                0x2000,
                QueueRef::Rx(1),
                QueueFault::WqFatal,
            ),
            (
                t::IBV_EVENT_QP_REQ_ERR,
                0x3000,
                QueueRef::RxAll,
                QueueFault::QpRequestError,
            ),
            (
                t::IBV_EVENT_QP_ACCESS_ERR,
                0x4000,
                QueueRef::Raw(0x4000),
                QueueFault::QpAccessError,
            ),
        ];
        for (k, a, queue, what) in cases {
            assert_eq!(
                map_event(ev(k, Element::Object(a)), 1, queue_of),
                Some(PortEvent::QueueError { queue, what }),
                "{}",
                type_name(k as u32)
            );
        }
    }

    #[test]
    fn informational_and_unknown_events_are_dropped() {
        for k in [
            t::IBV_EVENT_COMM_EST,
            t::IBV_EVENT_SQ_DRAINED,
            t::IBV_EVENT_QP_LAST_WQE_REACHED,
            t::IBV_EVENT_SRQ_LIMIT_REACHED,
        ] {
            assert_eq!(map_event(ev(k, Element::Object(0x10)), 1, none), None);
        }
        for k in [
            t::IBV_EVENT_GID_CHANGE,
            t::IBV_EVENT_LID_CHANGE,
            t::IBV_EVENT_SM_CHANGE,
        ] {
            assert_eq!(map_event(ev(k, Element::Port(1)), 1, none), None);
        }
        let future = AsyncEvent {
            event_type: 77,
            element: Element::Port(1),
        };
        assert_eq!(map_event(future, 1, none), None);
        assert_eq!(type_name(77), "event type 77");
        assert_eq!(type_name(10), "IBV_EVENT_PORT_ERR");
    }

    #[test]
    fn the_union_holds_objects_for_object_events_only() {
        assert!(element_is_object(t::IBV_EVENT_CQ_ERR as u32));
        assert!(element_is_object(t::IBV_EVENT_WQ_FATAL as u32));
        assert!(!element_is_object(t::IBV_EVENT_PORT_ERR as u32));
        assert!(!element_is_object(t::IBV_EVENT_DEVICE_FATAL as u32));
        assert!(!element_is_object(99));
    }
}
