//! Telemetry: a running app answers questions about itself on a Unix socket that speaks
//! DPDK's telemetry v2 protocol, so DPDK's own `dpdk-telemetry.py` (and any script written
//! against it) works unchanged, as does our `pmd-telemetry`.
//!
//! * The socket: `SOCK_SEQPACKET` at `RUNTIME/dpdk/PREFIX/dpdk_telemetry.v2` ([`socket_path`]),
//!   where RUNTIME is `$RUNTIME_DIRECTORY`, else `/var/run` for root, else
//!   `$XDG_RUNTIME_DIR` or `/tmp`, and PREFIX is the app's file prefix (`--file-prefix`,
//!   default `rte`), exactly as DPDK's EAL names it. A socket file a dead process left is
//!   reclaimed; one a live process serves is refused with that process's pid
//!   ([`TelemetryError::InUse`]): two apps at once need two prefixes, as two DPDK
//!   primaries do.
//! * The protocol ([`protocol`]): a greeting on connect, then one request record
//!   `/command[,param]` and one answer record `{"/command":DATA}` at a time, `null` for an
//!   unknown command or a bad parameter, never longer than `max_output_len` (16 KiB).
//! * Commands: `/`, `/info`, `/help`; DPDK's `/ethdev/list`, `/ethdev/stats`,
//!   `/ethdev/xstats`, `/ethdev/link_status`, `/ethdev/info` with DPDK's shapes and names
//!   ([`ethdev`]); `/pmd/ports`; `/pmd/pool` ([`Telemetry::watch_pool`]); and the app's own
//!   ([`Telemetry::register`], [`Telemetry::register_app`]).
//!
//! Threads: a thread of its own accepts clients, and each client (at most 10, as DPDK; more
//! are accepted and closed at once) gets a thread that reads its requests and writes its
//! answers with a send timeout, so a client that never reads is dropped instead of holding
//! anything up. [`Port`]s belong to the app's main thread (they are not `Sync`): the
//! commands that need them wait, a bounded time, for the app to answer them in
//! [`Telemetry::serve`], which it calls from its main loop. The datapath is never involved:
//! answers read the same single-writer counters the tools print.
//!
//! One call to turn it on, one call in the main loop:
//!
//! ```
//! use pmd::port::{Port, PortConfig};
//! use pmd::telemetry::{Client, Telemetry, TelemetryConfig};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir()?;
//! let mut cfg = TelemetryConfig::new("doc");
//! cfg.dir = Some(dir.path().join("dpdk/doc")); // default: runtime_dir("doc")
//! let telemetry = Telemetry::start(&cfg)?;
//!
//! let pool = mempool::MbufPool::new(mempool::MbufPoolConfig::new("doc-tel", 1024))?;
//! let mut port = Port::open(0, &"null:size=64".parse()?)?;
//! port.configure(&PortConfig::default(), &pool)?;
//! let ports = vec![port];
//! telemetry.watch_pool(&pool)?;
//!
//! // A client (dpdk-telemetry.py, pmd-telemetry, or this one) asks for port 0's counters...
//! let path = telemetry.socket_path().to_path_buf();
//! let asker = std::thread::spawn(move || -> Result<_, pmd::telemetry::ClientError> {
//!     let c = Client::connect(&path)?;
//!     Ok((c.request("/ethdev/stats,0")?, c.request("/pmd/pool")?))
//! });
//! // ...and the app's main loop answers between its other work.
//! while !asker.is_finished() {
//!     telemetry.serve(&ports);
//!     std::thread::sleep(Duration::from_millis(5));
//! }
//! let (stats, pool_use) = asker.join().unwrap()?;
//! assert_eq!(stats["ipackets"], 0);
//! assert_eq!(pool_use["in_use"], pool.in_use());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

pub mod client;
pub mod ethdev;
pub mod protocol;
mod server;

pub use client::{instances, pretty, Client, ClientError, Greeting, Instance, InstanceState};
pub use ethdev::PortCommand;
pub use protocol::{Data, MAX_CMD_LEN, MAX_OUTPUT_LEN};
pub use server::Handler;

use crate::port::Port;
use crate::sys::seqpacket::{BindError, SeqListener};
use mempool::MbufPool;
use server::{Entry, How, Pending, Settings, Shared};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The socket's file name (DPDK's v2 socket).
pub const SOCKET_NAME: &str = "dpdk_telemetry.v2";

/// The file prefix when none is given (DPDK's).
pub const DEFAULT_PREFIX: &str = "rte";

/// Clients served at once (DPDK's `MAX_CONNECTIONS`).
pub const MAX_CLIENTS: usize = 10;

/// The folder the runtime directories of every prefix are in, as DPDK's EAL chooses it
/// (lib/eal/unix/eal_filesystem.c: `eal_create_runtime_dir`): `$RUNTIME_DIRECTORY/dpdk`,
/// else `/var/run/dpdk` for root, else `$XDG_RUNTIME_DIR/dpdk` or `/tmp/dpdk` (an empty
/// variable counts as unset, as `dpdk-telemetry.py` takes it).
pub fn runtime_base() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let dir = match var("RUNTIME_DIRECTORY") {
        Some(d) => PathBuf::from(d),
        None if nix::unistd::getuid().is_root() => PathBuf::from("/var/run"),
        None => var("XDG_RUNTIME_DIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from),
    };
    dir.join("dpdk")
}

/// The runtime directory of the app with file prefix `prefix`: `runtime_base()/PREFIX`.
/// The telemetry socket is there, and other control sockets of the app may be.
pub fn runtime_dir(prefix: &str) -> PathBuf {
    runtime_base().join(prefix)
}

/// The telemetry socket of the app with file prefix `prefix`.
pub fn socket_path(prefix: &str) -> PathBuf {
    runtime_dir(prefix).join(SOCKET_NAME)
}

/// Checks a file prefix: it names one directory, so it is not empty, `.` or `..`, and has
/// no `/` or NUL.
///
/// # Errors
/// [`TelemetryError::BadPrefix`].
pub fn check_prefix(prefix: &str) -> Result<(), TelemetryError> {
    if prefix.is_empty() || prefix == "." || prefix == ".." || prefix.contains(['/', '\0']) {
        return Err(TelemetryError::BadPrefix(prefix.to_string()));
    }
    Ok(())
}

/// The program name of process `pid` (the file name of its `argv[0]`), as
/// `dpdk-telemetry.py` finds it.
pub fn app_name(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv0 = cmdline.split(|b| *b == 0).next()?;
    let name = Path::new(std::str::from_utf8(argv0).ok()?).file_name()?;
    Some(name.to_string_lossy().into_owned())
}

/// "pid 1234 (l2fwd)", or what is known of it.
fn owner(pid: Option<u32>) -> String {
    match pid {
        Some(p) => match app_name(p) {
            Some(a) => format!("pid {p} ({a})"),
            None => format!("pid {p}"),
        },
        None => "another process".into(),
    }
}

/// Why telemetry could not start, or a command could not be added.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The file prefix cannot name a directory.
    #[error("file prefix {0:?}: give a name without '/' (it names a directory of its own)")]
    BadPrefix(String),
    /// The runtime directory could not be made.
    #[error("telemetry runtime directory {path}: {source}")]
    RuntimeDir {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A running process serves telemetry at the same path (the same file prefix).
    #[error("telemetry socket {} is served by a running process, {}", .path.display(), owner(*.pid))]
    InUse {
        /// The socket.
        path: PathBuf,
        /// That process, where the kernel says.
        pid: Option<u32>,
    },
    /// The socket could not be made (a path too long for a Unix socket, permissions).
    #[error("telemetry socket {}: {source}", .path.display())]
    Socket {
        /// The socket.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A command name that cannot be registered.
    #[error("telemetry command {0:?}: a name starts with '/', has fewer than {MAX_CMD_LEN} characters, all letters, digits, '_' or '/'")]
    BadCommand(String),
    /// A command registered twice.
    #[error("telemetry command {0} is registered already")]
    Duplicate(String),
    /// No thread could be started.
    #[error("telemetry thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Why a command was answered `null`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The command is not registered (or an app callback does not know it).
    #[error("unknown command")]
    Unknown,
    /// The parameter is missing or malformed.
    #[error("bad parameter {param:?}: {why}")]
    BadParameter {
        /// The parameter as given.
        param: String,
        /// What was expected.
        why: &'static str,
    },
    /// No port has that id.
    #[error("no port {0}")]
    NoSuchPort(u64),
    /// The app could not answer (its own reason).
    #[error("{0}")]
    Failed(String),
    /// The app's main loop did not answer in time (it is not serving, or stopping).
    #[error("no answer from the app's main loop within {0:?}")]
    NoReply(Duration),
    /// Too many requests wait for the app's main loop already.
    #[error("too many requests waiting for the app's main loop")]
    Busy,
}

/// An answer's data, or why there is none (the client gets `null`).
pub type Answer = Result<Data, AnswerError>;

/// How to run telemetry. [`TelemetryConfig::new`] fills in the defaults; change fields after.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// The file prefix (`--file-prefix`): which runtime directory the socket is in.
    pub file_prefix: String,
    /// The runtime directory to use instead of [`runtime_dir`]`(file_prefix)` (tests,
    /// embedding); it is created if missing.
    pub dir: Option<PathBuf>,
    /// The version string of the greeting and `/info`.
    pub version: String,
    /// Clients served at once; more are accepted and closed at once.
    pub max_clients: usize,
    /// How long a request that needs the ports waits for [`Telemetry::serve`] before it is
    /// answered `null`.
    pub reply_timeout: Duration,
    /// How long an answer may wait for a client to make room for it; a client that does
    /// not read is closed after that.
    pub send_timeout: Duration,
}

impl TelemetryConfig {
    /// The defaults, for file prefix `file_prefix`: version `pmd <crate version>`,
    /// [`MAX_CLIENTS`] clients, 1 s to wait for the main loop, 1 s to wait for a client.
    pub fn new(file_prefix: impl Into<String>) -> Self {
        Self {
            file_prefix: file_prefix.into(),
            dir: None,
            version: format!("pmd {}", env!("CARGO_PKG_VERSION")),
            max_clients: MAX_CLIENTS,
            reply_timeout: Duration::from_secs(1),
            send_timeout: Duration::from_secs(1),
        }
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

/// A running telemetry server. Dropping it stops the threads and removes the socket.
pub struct Telemetry {
    shared: Arc<Shared>,
    from_clients: Mutex<Receiver<Pending>>,
    listener: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Telemetry({})", self.path.display())
    }
}

/// Requests [`Telemetry::serve`] answers per call at most (more wait for the next).
const SERVE_BATCH: usize = 32;

impl Telemetry {
    /// Creates the runtime directory (mode 0700, as DPDK's EAL does), binds the socket and
    /// starts the threads.
    ///
    /// # Errors
    /// [`TelemetryError::InUse`] when a live process serves the same socket (another file
    /// prefix is needed); [`TelemetryError::BadPrefix`], [`TelemetryError::RuntimeDir`],
    /// [`TelemetryError::Socket`], [`TelemetryError::Thread`].
    pub fn start(cfg: &TelemetryConfig) -> Result<Self, TelemetryError> {
        use std::os::unix::fs::DirBuilderExt;
        check_prefix(&cfg.file_prefix)?;
        let dir = cfg
            .dir
            .clone()
            .unwrap_or_else(|| runtime_dir(&cfg.file_prefix));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| TelemetryError::RuntimeDir {
                path: dir.clone(),
                source,
            })?;
        let path = dir.join(SOCKET_NAME);
        // A small backlog: clients are taken at once by the listening thread.
        let listener = SeqListener::bind(&path, 4).map_err(|e| match e {
            BindError::Live { path, pid } => TelemetryError::InUse { path, pid },
            BindError::Io { path, err } => TelemetryError::Socket { path, source: err },
        })?;
        let mut commands = BTreeMap::new();
        for (name, help, how) in [
            (
                "/",
                "The commands this app answers. No parameter.",
                How::List,
            ),
            (
                "/info",
                "The server's version, pid and max_output_len. No parameter.",
                How::Info,
            ),
            (
                "/help",
                "The help text of a command. Parameter: the command, e.g. /ethdev/stats.",
                How::Help,
            ),
        ] {
            commands.insert(
                name.to_string(),
                Entry {
                    help: help.to_string(),
                    how,
                },
            );
        }
        for (pc, name, help) in PortCommand::ALL {
            commands.insert(
                name.to_string(),
                Entry {
                    help: help.to_string(),
                    how: How::Ports(pc),
                },
            );
        }
        let settings = Settings {
            version: cfg.version.clone(),
            pid: std::process::id(),
            max_output_len: MAX_OUTPUT_LEN,
            max_clients: cfg.max_clients,
            reply_timeout: cfg.reply_timeout,
            send_timeout: cfg.send_timeout,
        };
        let (shared, from_clients) = Shared::new(settings, commands);
        let shared = Arc::new(shared);
        let s = Arc::clone(&shared);
        let listener = std::thread::Builder::new()
            .name("telemetry".into())
            .spawn(move || server::listen(listener, s))
            .map_err(TelemetryError::Thread)?;
        tracing::info!(target: "pmd::telemetry", path = %path.display(), "telemetry socket listening");
        Ok(Self {
            shared,
            from_clients: Mutex::new(from_clients),
            listener: Some(listener),
            path,
        })
    }

    /// The socket's path.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    fn add(&self, cmd: &str, help: &str, how: How) -> Result<(), TelemetryError> {
        if !protocol::valid_command(cmd) {
            return Err(TelemetryError::BadCommand(cmd.to_string()));
        }
        let mut commands = self
            .shared
            .commands
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if commands.contains_key(cmd) {
            return Err(TelemetryError::Duplicate(cmd.to_string()));
        }
        commands.insert(
            cmd.to_string(),
            Entry {
                help: help.to_string(),
                how,
            },
        );
        Ok(())
    }

    /// Adds `cmd`, answered by `handler` on the client's thread with the request's
    /// parameter: for state that is safe to share (an `Arc` of counters, a pool).
    ///
    /// # Errors
    /// [`TelemetryError::BadCommand`], [`TelemetryError::Duplicate`].
    pub fn register<F>(&self, cmd: &str, help: &str, handler: F) -> Result<(), TelemetryError>
    where
        F: Fn(Option<&str>) -> Answer + Send + Sync + 'static,
    {
        self.add(cmd, help, How::Local(Arc::new(handler)))
    }

    /// Adds `cmd`, answered on the app's main thread by the callback given to
    /// [`Telemetry::serve_with`]: for state only that thread holds (its event log).
    ///
    /// # Errors
    /// [`TelemetryError::BadCommand`], [`TelemetryError::Duplicate`].
    pub fn register_app(&self, cmd: &str, help: &str) -> Result<(), TelemetryError> {
        self.add(cmd, help, How::App)
    }

    /// Adds `/pmd/pool`: the pool's name, capacity, buffers in use (out of the pool,
    /// per-core caches included), available and in per-core caches. The pool is watched,
    /// not kept alive.
    ///
    /// # Errors
    /// [`TelemetryError::Duplicate`] when a pool is watched already.
    pub fn watch_pool(&self, pool: &Arc<MbufPool>) -> Result<(), TelemetryError> {
        let weak = Arc::downgrade(pool);
        self.register(
            "/pmd/pool",
            "The mbuf pool: capacity, in_use, available, cached (in per-core caches). \
             No parameter.",
            move |_| {
                let p = weak
                    .upgrade()
                    .ok_or_else(|| AnswerError::Failed("the pool is gone".into()))?;
                Ok(Data::dict()
                    .with("name", p.name())
                    .with("capacity", p.capacity())
                    .with("in_use", p.in_use())
                    .with("available", p.available())
                    .with("cached", p.cached()))
            },
        )
    }

    /// Answers the requests that wait for the ports (`/ethdev/...`, `/pmd/ports`); call it
    /// from the loop of the thread that owns `ports`, every few milliseconds. Never blocks.
    /// Returns how many it answered. Commands added with [`Telemetry::register_app`] are
    /// answered `null`: use [`Telemetry::serve_with`] for those.
    pub fn serve(&self, ports: &[Port]) -> usize {
        self.serve_with(ports, |_, _| Err(AnswerError::Unknown))
    }

    /// [`Telemetry::serve`], with `app(cmd, param)` answering the commands added with
    /// [`Telemetry::register_app`].
    pub fn serve_with(
        &self,
        ports: &[Port],
        mut app: impl FnMut(&str, Option<&str>) -> Answer,
    ) -> usize {
        let rx = self
            .from_clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut n = 0;
        while n < SERVE_BATCH {
            let Ok(p) = rx.try_recv() else { break };
            let answer = match p.port_cmd {
                Some(pc) => pc.answer(ports, p.param.as_deref()),
                None => app(&p.cmd, p.param.as_deref()),
            };
            // The client's thread may have given up waiting: nothing to do then.
            let _ = p.reply.try_send(answer);
            n += 1;
        }
        n
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Requests waiting for the main loop are answered `null` at once (their reply
        // channels close with the queue), and new ones too: no client thread waits for a
        // `serve` that will not come.
        let (_, closed) = std::sync::mpsc::sync_channel(0);
        drop(std::mem::replace(
            self.from_clients
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
            closed,
        ));
        if let Some(h) = self.listener.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests;
