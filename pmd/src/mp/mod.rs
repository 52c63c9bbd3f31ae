//! Multi-process: a primary process that owns the ports publishes them on a control socket,
//! and secondary processes attach to it and take queue pairs, as DPDK's multi-process model
//! does (`--proc-type primary|secondary`, one `--file-prefix` per primary).
//!
//! This module is the control plane, and only that so far:
//! - [`Primary`] listens at `mp_socket` in the runtime directory of its file prefix (DPDK's
//!   EAL keeps its `mp_socket` there too), publishes ports ([`Primary::publish`]) and keeps
//!   the one owner of every queue pair: itself, one secondary, or nobody. A queue is polled by
//!   one process; a second claim is refused naming the holder.
//! - [`Secondary`] connects, learns the ports, claims queue pairs (a given one or the next
//!   free) and gives them back. A secondary that exits, cleanly or killed, gives back
//!   everything it held: the primary sees its connection close, and reports it
//!   ([`MpEvent::Released`] with [`ReleaseWhy::Exited`]) so that it can take the queues back.
//! - [`Primary::share_memory`] shares file-backed memory (a pool's hugetlbfs file); a
//!   secondary maps it when it attaches, at the primary's address, or is refused with that
//!   address and what holds it in the secondary.
//! - The primary stopping tells every secondary ([`Secondary::primary_gone`]); a secondary
//!   finds the same when the primary is killed (its connection closes).
//! - A second primary on a prefix whose primary runs is refused with that process's pid; a
//!   secondary whose primary is not running, or is gone, is refused saying which.
//!
//! - [`Primary::share_pool`] shares an mbuf pool made with a shared file; a secondary
//!   attaches to it ([`Secondary::pool`]).
//! - [`Primary::publish_device`] publishes a port's device descriptor (a `mana:` port's
//!   verbs command fd, `pmd::port::Port::device`); it goes to a secondary with each grant
//!   of a queue pair of the port (`SCM_RIGHTS`, [`Secondary::device`]), and the
//!   secondary maps the port's doorbell page from it, as DPDK net/mana's secondaries do.
//!
//! The datapath of a secondary is `pmd::port::attach::AttachedPair` (queue pairs the
//! primary exported). Not built: mlx5 ports, `ibv_import_device` / `ibv_import_pd` /
//! `ibv_import_mr` (MANA has no import). See `pmd/README.md` ("Multi-process").
//!
//! ```
//! use pmd::mp::{MpConfig, Owner, Primary, Secondary};
//! # fn main() -> Result<(), pmd::mp::MpError> {
//! # let dir = tempfile::tempdir().unwrap();
//! // The primary (`MpConfig::new("fwd")` alone uses the prefix's runtime directory).
//! let primary = Primary::start(&MpConfig::new("fwd").with_dir(dir.path()))?;
//! primary.publish(0, "emu-mana:wire=shm:a", 4, &[0]); // it polls queue 0 itself
//!
//! // A secondary, normally another process: `Secondary::attach("fwd", "worker")`.
//! let mut worker = Secondary::attach_at(primary.socket_path(), "fwd", "worker")?;
//! assert_eq!(worker.claim(0, None)?, 1); // the next free queue pair
//! assert_eq!(primary.owners(0).unwrap()[1], Owner::Secondary(std::process::id()));
//! # Ok(()) }
//! ```
//!
//! Every record a peer sends is checked ([`protocol`]); a bad one closes that connection and
//! costs nothing else. Nothing here is on a datapath: the threads only read the socket and
//! the table, under a lock.
#![deny(unsafe_code)]

mod primary;
pub mod protocol;
mod secondary;
#[cfg(test)]
mod tests;

pub use primary::{MpConfig, MpEvent, Owner, Primary, ReleaseWhy};
pub use protocol::{MemInfo, MemKind, PortInfo, Refusal};
pub use secondary::Secondary;

use std::path::{Path, PathBuf};

/// The control socket's file name in the runtime directory (DPDK's EAL names its own
/// multi-process socket the same).
pub const SOCKET_NAME: &str = "mp_socket";

/// The most secondaries a primary serves at once.
pub const MAX_SECONDARIES: usize = 64;

/// The control socket of the primary with file prefix `prefix`.
pub fn socket_path(prefix: &str) -> PathBuf {
    crate::telemetry::runtime_dir(prefix).join(SOCKET_NAME)
}

/// Which role a process plays (`--proc-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcType {
    /// Owns the ports (the default).
    #[default]
    Primary,
    /// Attaches to a running primary.
    Secondary,
}

impl std::str::FromStr for ProcType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "primary" => Ok(ProcType::Primary),
            "secondary" => Ok(ProcType::Secondary),
            _ => Err(format!(
                "unknown process type '{s}' (expected primary or secondary)"
            )),
        }
    }
}

/// What went wrong attaching, publishing or claiming.
#[derive(Debug, thiserror::Error)]
pub enum MpError {
    /// A file prefix that cannot name a directory.
    #[error("bad file prefix '{0}': it names one directory (no '/', not empty, '.' or '..')")]
    BadPrefix(String),
    /// Another primary runs with this prefix.
    #[error(
        "a primary process already runs with file prefix '{prefix}'{}: \
         use another --file-prefix, or start this one as a secondary",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    PrimaryRunning {
        /// The prefix.
        prefix: String,
        /// That process, where the kernel says.
        pid: Option<u32>,
    },
    /// Nothing listens at the prefix's socket and no file is there.
    #[error(
        "no primary process runs with file prefix '{prefix}' (nothing at {}): \
         start the primary first, with --proc-type primary --file-prefix {prefix}",
        path.display()
    )]
    NoPrimary {
        /// The prefix.
        prefix: String,
        /// The socket it looked for.
        path: PathBuf,
    },
    /// The socket file is there but nobody listens: its primary died.
    #[error(
        "the primary process of file prefix '{prefix}' is gone ({} is left from it): \
         start the primary again",
        path.display()
    )]
    PrimaryGone {
        /// The prefix.
        prefix: String,
        /// The socket file.
        path: PathBuf,
    },
    /// The primary stopped (or was killed) while this secondary was attached.
    #[error("the primary stopped: {0}")]
    Stopped(String),
    /// The primary refused a request.
    #[error("port {port} queue {}: {why}", if *queue == protocol::NEXT_FREE { "(next free)".to_string() } else { queue.to_string() })]
    Refused {
        /// The port the request named.
        port: u16,
        /// The queue it named.
        queue: u16,
        /// Why.
        why: Refusal,
    },
    /// Shared memory that cannot be shared (primary) or mapped (secondary).
    #[error("shared memory '{name}': {why}")]
    Memory {
        /// Its name.
        name: String,
        /// Why.
        why: String,
    },
    /// A port's device descriptor that cannot be published.
    #[error("port {port}'s device descriptor: {why}")]
    Device {
        /// The port.
        port: u16,
        /// Why.
        why: String,
    },
    /// The peer sent a record that is not a valid message, or not the one expected.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// No answer within the time allowed.
    #[error("the primary did not answer {0} within {1:?}")]
    NoAnswer(&'static str, std::time::Duration),
    /// A socket or file call failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What one read of a connection gave.
enum Read {
    /// A record of this many bytes, and the descriptor that came with it.
    Record(usize, Option<std::os::fd::OwnedFd>),
    /// The peer closed the connection.
    Closed,
    /// A record longer than [`protocol::MAX_RECORD`].
    TooLong,
    /// Nothing within the receive timeout (or a signal): look at the stop flag, read again.
    Again,
    /// The connection failed.
    Failed(std::io::Error),
}

/// Reads one record into `buf` (which has room for one byte over the longest record), and
/// the descriptor sent with it (any other is closed).
fn read_record(sock: &crate::sys::seqpacket::SeqConn, buf: &mut [u8]) -> Read {
    match sock.recv_with_fd(buf) {
        Ok((0, _)) => Read::Closed,
        Ok((n, _)) if n > protocol::MAX_RECORD => Read::TooLong,
        Ok((n, fd)) => Read::Record(n, fd),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            Read::Again
        }
        Err(e) => Read::Failed(e),
    }
}

fn check_prefix(prefix: &str) -> Result<(), MpError> {
    crate::telemetry::check_prefix(prefix).map_err(|_| MpError::BadPrefix(prefix.to_string()))
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> MpError + 'a {
    move |source| MpError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}
