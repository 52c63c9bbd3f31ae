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
use std::time::Duration;

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
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`): its queues are gone. A port that
    /// recovers (`mana:`, `mlx5:`) follows it with [`PortEvent::Recovering`]; any other must
    /// be closed and opened again.
    DeviceFatal,
    /// The device was removed: its event channel reports an error instead of events. The
    /// port's descriptor no longer watches it (a recovering port's wakes its waiter while it
    /// looks for the device).
    DeviceRemoved,
    /// The port lost its device (after [`PortEvent::DeviceFatal`] or
    /// [`PortEvent::DeviceRemoved`]) and waits for it to come back: bursts return 0 (TX
    /// leaves the packets with the caller) until [`PortEvent::Recovered`].
    Recovering,
    /// The device came back and every queue was rebuilt with the port's configuration:
    /// bursts move packets again. `downtime` is from the failure to the port running again.
    Recovered {
        /// How long the port could not carry traffic.
        downtime: Duration,
    },
    /// The device did not come back within the port's recover timeout (or could not be
    /// brought up again): the port is failed for good. `Port::failure` says what was waited
    /// for and the last error.
    RecoveryFailed,
    /// A queue the device put in error.
    QueueError {
        /// Which queue.
        queue: QueueRef,
        /// What happened.
        what: QueueFault,
    },
    /// The port's capture (a device model's `pcap=FILE`) stopped recording: a write failed
    /// (`errno`, e.g. `ENOSPC` for a full disk; 0 if the write failed without one). The file
    /// ends at the last whole record before it; traffic goes on, and the frames the file
    /// lacks are counted (`wire_pcap_unrecorded`). Reported once.
    CaptureFailed {
        /// The OS error of the write that failed (0: none).
        errno: i32,
    },
}

impl PortEvent {
    /// A short machine-readable name: `link_up`, `link_down`, `device_fatal`,
    /// `device_removed`, `recovering`, `recovered`, `recovery_failed`, `queue_error`,
    /// `capture_failed`.
    pub fn name(&self) -> &'static str {
        match self {
            PortEvent::LinkUp => "link_up",
            PortEvent::LinkDown => "link_down",
            PortEvent::DeviceFatal => "device_fatal",
            PortEvent::DeviceRemoved => "device_removed",
            PortEvent::Recovering => "recovering",
            PortEvent::Recovered { .. } => "recovered",
            PortEvent::RecoveryFailed => "recovery_failed",
            PortEvent::QueueError { .. } => "queue_error",
            PortEvent::CaptureFailed { .. } => "capture_failed",
        }
    }

    /// Whether the device is lost (fatal error, removal, or a recovery that failed). A port
    /// that recovers by itself says [`PortEvent::Recovering`] right after the first two;
    /// only [`PortEvent::RecoveryFailed`] ends it for good.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            PortEvent::DeviceFatal | PortEvent::DeviceRemoved | PortEvent::RecoveryFailed
        )
    }
}

impl fmt::Display for PortEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortEvent::LinkUp => f.write_str("link up"),
            PortEvent::LinkDown => f.write_str("link down"),
            PortEvent::DeviceFatal => f.write_str("device fatal error"),
            PortEvent::DeviceRemoved => f.write_str("device removed"),
            PortEvent::Recovering => f.write_str("recovering: waiting for the device to come back"),
            PortEvent::Recovered { downtime } => {
                write!(f, "recovered after {:.3} s", downtime.as_secs_f64())
            }
            PortEvent::RecoveryFailed => {
                f.write_str("recovery failed: the device did not come back")
            }
            PortEvent::QueueError { queue, what } => write!(f, "{queue}: {what}"),
            PortEvent::CaptureFailed { errno } => {
                let why = if *errno > 0 {
                    std::io::Error::from_raw_os_error(*errno).to_string()
                } else {
                    "write error".to_string()
                };
                write!(
                    f,
                    "writing the pcap capture failed ({why}): the file ends at the last whole \
                     record before it; the frames it lacks are counted as wire_pcap_unrecorded"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed capture says why, with the OS error's text, and where the missing frames
    /// are counted.
    #[test]
    fn a_failed_capture_names_the_os_error() {
        let e = PortEvent::CaptureFailed {
            errno: libc::ENOSPC,
        };
        assert_eq!(e.name(), "capture_failed");
        assert!(!e.is_fatal());
        let m = e.to_string();
        assert!(
            m.contains("(No space left on device") && m.contains("wire_pcap_unrecorded"),
            "{m}"
        );
        let m = PortEvent::CaptureFailed { errno: 0 }.to_string();
        assert!(m.contains("(write error)"), "{m}");
    }

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
        assert!(PortEvent::RecoveryFailed.is_fatal() && !PortEvent::Recovering.is_fatal());
        let r = PortEvent::Recovered {
            downtime: Duration::from_millis(2500),
        };
        assert_eq!(
            (r.name(), r.to_string()),
            ("recovered", "recovered after 2.500 s".into())
        );
    }
}
