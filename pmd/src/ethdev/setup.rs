//! The error of a provider's control path, one for every driver ([`SetupError`]), and what
//! it becomes at the port ([`SetupError::into_port_error`]).
#![deny(unsafe_code)]

use super::PortError;

/// Errors of a provider's control path (opening a port, creating its queues), the same for
/// every driver: MANA's and mlx5's providers, hardware and device models. The MANA provider
/// builds [`SetupError::PortBusy`] with `SetupError::port_busy` / `SetupError::raw_qp`
/// (in [`crate::mana`]), which fill in the master, the holder and the hint.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Raw-packet QP creation failed with EBUSY / ENODEV: someone else holds the vPort.
    #[error("{holder} holds the port")]
    PortBusy {
        /// The kernel netdev that holds the port, when known (what a take-over brings down).
        netdev: Option<String>,
        /// The netdev's master (the `hv_netvsc` interface on Azure), when it has one.
        master: Option<String>,
        /// What QP creation returned (EBUSY or ENODEV).
        errno: i32,
        /// Who, e.g. "kernel netdev enP7s1 (master eth1)".
        holder: String,
        /// What to do: the exact command, and the `busy=` policies.
        hint: String,
    },
    /// Queue sizes or counts outside the device's limits.
    #[error("{what}: {requested} requested, device maximum is {max}")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Asked.
        requested: u32,
        /// Allowed.
        max: u32,
    },
    /// No port matches what the user named (the message lists what there is).
    #[error("{0}")]
    NoPort(String),
    /// The device cannot do what was asked (e.g. a striding RQ on a device without the
    /// capability); the error says what and why.
    #[error("{what} is not supported: {why}")]
    Unsupported {
        /// What was asked.
        what: &'static str,
        /// Why not, and what to do instead.
        why: String,
    },
    /// A device call failed; the error names the call, the object, errno and what to do.
    #[error("{0}")]
    Device(Box<dyn std::error::Error + Send + Sync>),
    /// A verbs call (or its model equivalent) failed.
    #[error("{call} failed while creating {object}: {source}")]
    Verbs {
        /// The call.
        call: &'static str,
        /// The object.
        object: &'static str,
        /// errno.
        #[source]
        source: std::io::Error,
    },
}

impl SetupError {
    /// The port's error for this failure while doing `what` (e.g. "creating tx queues"): a
    /// busy port stays a busy port ([`PortError::Busy`], with its holder and hint), anything
    /// else is a setup error with this one as its source.
    pub fn into_port_error(self, what: &str) -> PortError {
        match self {
            SetupError::PortBusy { holder, hint, .. } => PortError::Busy {
                spec: what.to_string(),
                holder,
                hint,
            },
            other => PortError::Setup {
                what: what.to_string(),
                source: Box::new(other),
            },
        }
    }
}
