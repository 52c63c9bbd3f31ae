//! Port events: what happens to a port outside the datapath (link up/down, a device that
//! failed or went away, a queue the device put in error), delivered on the slow path.
//!
//! The model is rdma-core's asynchronous events (`ibv_get_async_event(3)`): one file
//! descriptor per port that becomes readable when something happened; the application
//! watches it with poll(2)/epoll(7) beside its other descriptors, then fetches the events
//! ([`crate::ethdev::PortDriver::take_events`]). The descriptor is level-triggered (readable
//! while events wait) and non-blocking; fetching drains it.
#![deny(unsafe_code)]

use std::fmt;

/// Which queue an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueueRef {
    /// RX queue `n` (its completion or work queue).
    Rx(u16),
    /// TX queue `n` (its completion queue or send queue).
    Tx(u16),
    /// What all RX queues share (on MANA the RSS QP that spreads frames over them).
    RxAll,
    /// A device object the driver could not attribute to a queue: its raw handle.
    Raw(u64),
}

impl fmt::Display for QueueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueRef::Rx(q) => write!(f, "rx queue {q}"),
            QueueRef::Tx(q) => write!(f, "tx queue {q}"),
            QueueRef::RxAll => f.write_str("rx queues (RSS)"),
            QueueRef::Raw(h) => write!(f, "device object {h:#x}"),
        }
    }
}

/// What went wrong with a queue (the verbs affiliated error events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueueFault {
    /// The completion queue is in error, usually overrun (`IBV_EVENT_CQ_ERR`).
    CqError,
    /// The queue pair went to the error state (`IBV_EVENT_QP_FATAL`).
    QpFatal,
    /// A work request the device could not execute (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError,
    /// A local access violation (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError,
    /// The receive work queue went to the error state (`IBV_EVENT_WQ_FATAL`).
    WqFatal,
}

impl fmt::Display for QueueFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueFault::CqError => "completion queue error (overrun)",
            QueueFault::QpFatal => "queue pair in error state",
            QueueFault::QpRequestError => "invalid work request",
            QueueFault::QpAccessError => "local access violation",
            QueueFault::WqFatal => "receive work queue in error state",
        })
    }
}

/// Something that happened to a port, outside the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortEvent {
    /// The link came up (`IBV_EVENT_PORT_ACTIVE` for this port; on the device model, the
    /// far end attached or the link-down fault cleared).
    LinkUp,
    /// The link went down (`IBV_EVENT_PORT_ERR` for this port). Bursts keep working; frames
    /// are lost until the link is back.
    LinkDown,
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`): its queues are gone; the port must be
    /// closed and opened again.
    DeviceFatal,
    /// The device was removed: its event channel reports an error instead of events. After
    /// this the port has no event descriptor any more.
    DeviceRemoved,
    /// A queue the device put in error.
    QueueError {
        /// Which queue.
        queue: QueueRef,
        /// What happened.
        what: QueueFault,
    },
}

impl PortEvent {
    /// A short machine-readable name: `link_up`, `link_down`, `device_fatal`,
    /// `device_removed`, `queue_error`.
    pub fn name(&self) -> &'static str {
        match self {
            PortEvent::LinkUp => "link_up",
            PortEvent::LinkDown => "link_down",
            PortEvent::DeviceFatal => "device_fatal",
            PortEvent::DeviceRemoved => "device_removed",
            PortEvent::QueueError { .. } => "queue_error",
        }
    }

    /// Whether the port cannot carry traffic any more (fatal error or removal): an
    /// application stops using it.
    pub fn is_fatal(&self) -> bool {
        matches!(self, PortEvent::DeviceFatal | PortEvent::DeviceRemoved)
    }
}

impl fmt::Display for PortEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortEvent::LinkUp => f.write_str("link up"),
            PortEvent::LinkDown => f.write_str("link down"),
            PortEvent::DeviceFatal => f.write_str("device fatal error"),
            PortEvent::DeviceRemoved => f.write_str("device removed"),
            PortEvent::QueueError { queue, what } => write!(f, "{queue}: {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_messages_say_what_happened() {
        let e = PortEvent::QueueError {
            queue: QueueRef::Tx(3),
            what: QueueFault::QpFatal,
        };
        assert_eq!(e.name(), "queue_error");
        assert_eq!(e.to_string(), "tx queue 3: queue pair in error state");
        assert_eq!(PortEvent::LinkDown.to_string(), "link down");
        assert!(PortEvent::DeviceRemoved.is_fatal() && PortEvent::DeviceFatal.is_fatal());
        assert!(!PortEvent::LinkDown.is_fatal() && !e.is_fatal());
    }
}
