//! The primary's side: the listening socket, one thread per secondary, and the table of
//! queue owners.
#![deny(unsafe_code)]

use super::protocol::{self, MemInfo, MemKind, Msg, PortInfo, Refusal, MAX_RECORD, NEXT_FREE};
use super::{check_prefix, io_err, read_record, MpError, Read, MAX_SECONDARIES, SOCKET_NAME};
use crate::sys::seqpacket::{BindError, SeqConn, SeqListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a waiting thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// How long a send to one secondary may block (its socket buffer full: it stopped reading).
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a new connection may take to say hello before it is cut off (so that idle
/// connections cannot hold every slot).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Events kept for [`Primary::events`] at most; past that new ones are counted and dropped
/// ([`Primary::dropped_events`]), so a peer that loops cannot grow the primary's memory.
const EVENT_BACKLOG: usize = 4096;

/// Where a primary listens.
#[derive(Debug, Clone)]
pub struct MpConfig {
    /// The file prefix (`--file-prefix`).
    pub file_prefix: String,
    /// The runtime directory to use instead of the prefix's (tests).
    pub dir: Option<PathBuf>,
}

impl MpConfig {
    /// The prefix's runtime directory.
    pub fn new(file_prefix: impl Into<String>) -> Self {
        Self {
            file_prefix: file_prefix.into(),
            dir: None,
        }
    }

    /// Listens in `dir` instead.
    #[must_use]
    pub fn with_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }
}

/// Who polls a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Nobody: a secondary may claim it.
    Free,
    /// The primary itself.
    Primary,
    /// A secondary (its pid).
    Secondary(u32),
}

/// Why a queue pair went back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseWhy {
    /// The secondary released it, or said goodbye.
    Asked,
    /// The secondary's connection closed without a goodbye: it exited or was killed, and
    /// may have left the queue mid-burst.
    Exited,
    /// The secondary broke the protocol and was cut off.
    Cut,
    /// The primary is stopping.
    Stopping,
}

/// What happened on the control socket, for the primary's own loop
/// ([`Primary::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpEvent {
    /// A secondary attached.
    Attached {
        /// Its pid.
        pid: u32,
        /// Its program name.
        app: String,
    },
    /// A secondary took a queue pair.
    Claimed {
        /// Its pid.
        pid: u32,
        /// The port.
        port: u16,
        /// The queue pair.
        queue: u16,
    },
    /// A queue pair went back from a secondary.
    Released {
        /// The secondary's pid.
        pid: u32,
        /// The port.
        port: u16,
        /// The queue pair.
        queue: u16,
        /// Why.
        why: ReleaseWhy,
    },
    /// A dead secondary's cached mbufs went back to a shared pool
    /// ([`mempool::MbufPool::reclaim`]). Mbufs it held in queues or in flight are not among
    /// them.
    Reclaimed {
        /// The secondary's pid.
        pid: u32,
        /// The pool.
        pool: String,
        /// Mbufs returned.
        mbufs: u32,
    },
    /// A secondary's connection ended.
    Detached {
        /// Its pid.
        pid: u32,
        /// Whether it said goodbye.
        clean: bool,
    },
}

/// One connection's identity in the table: a process may connect twice, and each
/// connection's queues go back when that connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConnId(u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Primary,
    Secondary(ConnId, u32),
}

struct PortEntry {
    info: PortInfo,
    slots: Vec<Slot>,
    /// The device's command descriptor and its generation ([`Primary::publish_device`]),
    /// sent with every grant of a queue pair of the port.
    device: Option<(Arc<std::os::fd::OwnedFd>, u64)>,
}

#[derive(Default)]
struct Table {
    ports: Vec<PortEntry>,
    memory: Vec<MemInfo>,
}

impl Table {
    fn port(&mut self, port: u16) -> Option<&mut PortEntry> {
        self.ports.iter_mut().find(|p| p.info.id == port)
    }

    /// Gives `conn` queue `queue` of `port` (or the next free one): the queue and whether it
    /// is new to it (a queue it holds already is granted again, unchanged).
    fn claim(
        &mut self,
        conn: ConnId,
        pid: u32,
        port: u16,
        queue: u16,
    ) -> Result<(u16, bool), Refusal> {
        let p = self.port(port).ok_or(Refusal::NoSuchPort)?;
        let q = if queue == NEXT_FREE {
            p.slots
                .iter()
                .position(|s| *s == Slot::Free)
                .ok_or(Refusal::NoneFree)?
        } else {
            usize::from(queue)
        };
        match p.slots.get(q).ok_or(Refusal::NoSuchQueue)? {
            Slot::Free => {
                p.slots[q] = Slot::Secondary(conn, pid);
                Ok((q as u16, true))
            }
            Slot::Secondary(c, _) if *c == conn => Ok((q as u16, false)),
            Slot::Primary => Err(Refusal::Taken(0)),
            Slot::Secondary(_, holder) => Err(Refusal::Taken(*holder)),
        }
    }

    fn release(&mut self, conn: ConnId, port: u16, queue: u16) -> Result<(), Refusal> {
        let p = self.port(port).ok_or(Refusal::NoSuchPort)?;
        let slot = p
            .slots
            .get_mut(usize::from(queue))
            .ok_or(Refusal::NoSuchQueue)?;
        match *slot {
            Slot::Secondary(c, _) if c == conn => {
                *slot = Slot::Free;
                Ok(())
            }
            _ => Err(Refusal::NotYours),
        }
    }

    /// Frees every queue of `conn`: (port, queue) pairs.
    fn release_all(&mut self, conn: ConnId) -> Vec<(u16, u16)> {
        let mut freed = Vec::new();
        for p in &mut self.ports {
            for (q, s) in p.slots.iter_mut().enumerate() {
                if matches!(s, Slot::Secondary(c, _) if *c == conn) {
                    *s = Slot::Free;
                    freed.push((p.info.id, q as u16));
                }
            }
        }
        freed
    }
}

struct Conn {
    sock: Arc<SeqConn>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// The accept loop stops.
    closing: AtomicBool,
    /// The connections stop (set after each was told why).
    stop: AtomicBool,
    table: Mutex<Table>,
    events: SyncSender<MpEvent>,
    dropped_events: AtomicU64,
    /// Shared pools, whose caches a dead secondary leaves behind.
    pools: Mutex<Vec<Arc<mempool::MbufPool>>>,
    conns: Mutex<Vec<Conn>>,
    next_conn: AtomicU64,
}

impl Shared {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn event(&self, e: MpEvent) {
        // The receiver lives as long as the Primary; a send after it is gone is moot.
        if let Err(TrySendError::Full(_)) = self.events.try_send(e) {
            self.dropped_events.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A running primary's control socket. Dropping it tells every secondary to stop (with
/// the reason given to [`Primary::shutdown`], else "the primary exited"), closes the
/// connections and removes the socket file.
pub struct Primary {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    events: Receiver<MpEvent>,
    path: PathBuf,
    reason: String,
    /// Whether the secondaries are told the ports' queues are destroyed.
    closed: bool,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary").field("path", &self.path).finish()
    }
}

impl Primary {
    /// Creates the runtime directory (mode 0700) and listens at its `mp_socket`.
    ///
    /// # Errors
    /// [`MpError::PrimaryRunning`] when a live primary listens there;
    /// [`MpError::BadPrefix`]; [`MpError::Io`].
    pub fn start(cfg: &MpConfig) -> Result<Self, MpError> {
        use std::os::unix::fs::DirBuilderExt;
        check_prefix(&cfg.file_prefix)?;
        let dir = cfg
            .dir
            .clone()
            .unwrap_or_else(|| crate::telemetry::runtime_dir(&cfg.file_prefix));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("creating the runtime directory", &dir))?;
        let path = dir.join(SOCKET_NAME);
        let listener = SeqListener::bind(&path, 8).map_err(|e| match e {
            BindError::Live { pid, .. } => MpError::PrimaryRunning {
                prefix: cfg.file_prefix.clone(),
                pid,
            },
            BindError::Io { path, err } => MpError::Io {
                what: "listening at",
                path,
                source: err,
            },
        })?;
        let (tx, rx) = mpsc::sync_channel(EVENT_BACKLOG);
        let shared = Arc::new(Shared {
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            table: Mutex::new(Table::default()),
            events: tx,
            dropped_events: AtomicU64::new(0),
            pools: Mutex::new(Vec::new()),
            conns: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(1),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("pmd-mp".into())
            .spawn(move || accept_loop(&listener, &s))
            .map_err(io_err("starting the control thread for", &path))?;
        tracing::info!(target: "pmd::mp", "primary listening at {}", path.display());
        Ok(Self {
            shared,
            accept: Some(accept),
            events: rx,
            path,
            reason: "the primary exited".into(),
            closed: false,
        })
    }

    /// The socket's path.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Publishes a port with `queues` queue pairs, of which the primary polls `kept` itself;
    /// the others are free for secondaries. Publishing a port again replaces it (its
    /// secondaries' claims included: call it before secondaries attach).
    ///
    /// # Panics
    /// `queues` is 0 or [`NEXT_FREE`], a kept queue is out of range, or more than
    /// [`protocol::MAX_PORTS`] ports are published: the caller's bugs.
    pub fn publish(&self, id: u16, name: &str, queues: u16, kept: &[u16]) {
        assert!(queues > 0 && queues != NEXT_FREE, "queue count {queues}");
        let mut slots = vec![Slot::Free; usize::from(queues)];
        for &q in kept {
            slots[usize::from(q)] = Slot::Primary;
        }
        let entry = PortEntry {
            info: PortInfo {
                id,
                queues,
                name: name.to_string(),
            },
            slots,
            device: None,
        };
        let mut t = self.shared.table();
        match t.ports.iter_mut().find(|p| p.info.id == id) {
            Some(p) => *p = entry,
            None => {
                assert!(t.ports.len() < protocol::MAX_PORTS, "too many ports");
                t.ports.push(entry);
            }
        }
    }

    /// Publishes port `id`'s device descriptor (`pmd::port::Port::device`) and its
    /// generation (`Port::device_generation`, which the port's export descriptions name):
    /// it goes to each secondary with the grant of a queue pair of the port (`SCM_RIGHTS`),
    /// as DPDK net/mana's primaries pass their verbs command fd, and the secondary maps the
    /// port's doorbell page from it (`Secondary::device`). Call it after
    /// [`Primary::publish`] (which forgets it) and again after the port opened a new device
    /// context (a recovery, a new generation): later grants carry the new one.
    ///
    /// # Errors
    /// [`MpError::Device`]: the port is not published, generation 0 (it means "none"), or
    /// the descriptor could not be duplicated.
    pub fn publish_device(
        &self,
        id: u16,
        fd: std::os::fd::BorrowedFd<'_>,
        generation: u64,
    ) -> Result<(), MpError> {
        if generation == 0 {
            return Err(MpError::Device {
                port: id,
                why: "generation 0 means no descriptor".into(),
            });
        }
        let dup = fd.try_clone_to_owned().map_err(|e| MpError::Device {
            port: id,
            why: format!("dup: {e}"),
        })?;
        let mut t = self.shared.table();
        let p = t.port(id).ok_or_else(|| MpError::Device {
            port: id,
            why: "the port is not published".into(),
        })?;
        p.device = Some((Arc::new(dup), generation));
        Ok(())
    }

    /// Shares `region` (memory backed by a shared file: [`mempool::RegionOptions::shared_file`])
    /// under `name`: a secondary maps it at the same address when it attaches, or is refused
    /// with the address when that range is taken in it. Share before secondaries attach.
    ///
    /// # Errors
    /// [`MpError::Memory`]: the region has no shared file, its path is too long, or
    /// [`protocol::MAX_MEMORY`] areas are shared already.
    pub fn share_memory(&self, name: &str, region: &mempool::Region) -> Result<(), MpError> {
        self.share(name, region, MemKind::Region)
    }

    fn share(&self, name: &str, region: &mempool::Region, kind: MemKind) -> Result<(), MpError> {
        let refuse = |why: String| MpError::Memory {
            name: name.to_string(),
            why,
        };
        let path = region
            .shared_path()
            .ok_or_else(|| refuse("it is private to this process (no shared file)".into()))?;
        let path = path
            .to_str()
            .filter(|p| p.len() <= protocol::MAX_PATH && p.starts_with('/'))
            .ok_or_else(|| {
                refuse(format!(
                    "its file {} is not an absolute UTF-8 path of at most {} bytes",
                    path.display(),
                    protocol::MAX_PATH
                ))
            })?;
        let mut t = self.shared.table();
        if t.memory.len() >= protocol::MAX_MEMORY {
            return Err(refuse(format!(
                "{} areas are shared already",
                protocol::MAX_MEMORY
            )));
        }
        t.memory.push(MemInfo {
            kind,
            name: name.to_string(),
            path: path.to_string(),
            addr: region.addr() as u64,
            len: region.len() as u64,
        });
        Ok(())
    }

    /// Shares an mbuf pool made with a shared file ([`mempool::MbufPoolConfig::shared_file`]):
    /// a secondary attaches to it when it attaches here ([`Secondary::pool`]), at the same
    /// address, and allocates and frees its mbufs as this process does. When a secondary
    /// dies, the mbufs in its caches come back to the pool ([`MpEvent::Reclaimed`]). Share
    /// before secondaries attach.
    ///
    /// # Errors
    /// [`MpError::Memory`]: the pool is private to this process, its file's path is too
    /// long, or [`protocol::MAX_MEMORY`] areas are shared already.
    ///
    /// [`Secondary::pool`]: crate::mp::Secondary::pool
    pub fn share_pool(&self, pool: &Arc<mempool::MbufPool>) -> Result<(), MpError> {
        if !pool.is_shared() {
            return Err(MpError::Memory {
                name: pool.name().to_string(),
                why: "it is private to this process: create it with \
                      MbufPoolConfig::shared_file(PATH)"
                    .into(),
            });
        }
        self.share(pool.name(), pool.mempool().region(), MemKind::MbufPool)?;
        self.shared
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(pool));
        Ok(())
    }

    /// Who polls each queue pair of `port` (`None`: not published).
    pub fn owners(&self, port: u16) -> Option<Vec<Owner>> {
        let mut t = self.shared.table();
        let p = t.port(port)?;
        Some(
            p.slots
                .iter()
                .map(|s| match s {
                    Slot::Free => Owner::Free,
                    Slot::Primary => Owner::Primary,
                    Slot::Secondary(_, pid) => Owner::Secondary(*pid),
                })
                .collect(),
        )
    }

    /// The secondaries attached now (pids, in the order they came).
    pub fn secondaries(&self) -> Vec<u32> {
        let conns = self
            .shared
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        conns
            .iter()
            .filter(|c| c.thread.as_ref().is_some_and(|t| !t.is_finished()))
            .filter_map(|c| c.sock.peer_pid())
            .collect()
    }

    /// What happened since the last call (never blocks).
    pub fn events(&self) -> Vec<MpEvent> {
        self.events.try_iter().collect()
    }

    /// Events dropped because 4096 were waiting unread (the backlog a peer cannot grow).
    pub fn dropped_events(&self) -> u64 {
        self.shared.dropped_events.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for the next event.
    pub fn next_event(&self, timeout: Duration) -> Option<MpEvent> {
        self.events.recv_timeout(timeout).ok()
    }

    /// Sets what the secondaries are told when this primary stops, then stops it.
    pub fn shutdown(mut self, reason: &str) {
        self.reason = reason.to_string();
    }

    /// [`Primary::shutdown`], for a primary that has destroyed its ports' queues first
    /// (dropped its ports): the secondaries learn that the buffers they posted on exported
    /// queue pairs can go back to the pool
    /// ([`Secondary::primary_closed_queues`](crate::mp::Secondary::primary_closed_queues)).
    pub fn shutdown_closed(mut self, reason: &str) {
        self.reason = reason.to_string();
        self.closed = true;
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // No new secondary; then each one is told why before its connection ends.
        self.shared.closing.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let conns = std::mem::take(
            &mut *self
                .shared
                .conns
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let bye = Msg::Shutdown {
            closed: self.closed,
            reason: self.reason.clone(),
        }
        .encode();
        for c in &conns {
            let _ = c.sock.send(&bye);
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        for mut c in conns {
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
        }
        // The listener removed its file when the accept thread dropped it.
    }
}

fn accept_loop(listener: &SeqListener, shared: &Arc<Shared>) {
    while !shared.closing.load(Ordering::SeqCst) {
        let conn = match listener.accept_timeout(POLL) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(target: "pmd::mp", "accept: {e}");
                std::thread::sleep(POLL);
                continue;
            }
        };
        let mut conns = shared.conns.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget connections whose threads ended.
        conns.retain_mut(|c| match &c.thread {
            Some(t) if t.is_finished() => {
                if let Some(t) = c.thread.take() {
                    let _ = t.join();
                }
                false
            }
            _ => true,
        });
        if conns.len() >= MAX_SECONDARIES {
            let _ = conn.send(
                &Msg::Refused {
                    port: 0,
                    queue: 0,
                    why: Refusal::TooMany,
                }
                .encode(),
            );
            continue;
        }
        if conn.set_timeouts(Some(POLL), Some(SEND_TIMEOUT)).is_err() {
            continue;
        }
        let id = ConnId(shared.next_conn.fetch_add(1, Ordering::Relaxed));
        let sock = Arc::new(conn);
        let (s, k) = (Arc::clone(shared), Arc::clone(&sock));
        let thread = std::thread::Builder::new()
            .name("pmd-mp-conn".into())
            .spawn(move || serve(&s, &k, id));
        match thread {
            Ok(t) => conns.push(Conn {
                sock,
                thread: Some(t),
            }),
            Err(e) => tracing::warn!(target: "pmd::mp", "no thread for a secondary: {e}"),
        }
    }
}

/// What ended a connection.
enum End {
    Bye,
    Closed,
    Cut(String),
    Stop,
}

fn serve(shared: &Shared, sock: &SeqConn, id: ConnId) {
    let pid = sock
        .peer_pid()
        .filter(|&p| p != 0)
        .unwrap_or(protocol::UNKNOWN_PID);
    let end = converse(shared, sock, id, pid);
    // The accept loop keeps a handle until it prunes this connection: shut the socket now
    // so the secondary reads its end at once.
    sock.shutdown();
    let why = match &end {
        End::Bye => ReleaseWhy::Asked,
        End::Stop => ReleaseWhy::Stopping,
        // A secondary that goes because this primary is stopping (it told it so) is not
        // one that died.
        End::Closed if shared.closing.load(Ordering::SeqCst) => ReleaseWhy::Stopping,
        End::Closed => ReleaseWhy::Exited,
        End::Cut(e) => {
            tracing::warn!(target: "pmd::mp", "secondary pid {pid} cut off: {e}");
            ReleaseWhy::Cut
        }
    };
    for (port, queue) in shared.table().release_all(id) {
        if !matches!(why, ReleaseWhy::Asked | ReleaseWhy::Stopping) {
            tracing::warn!(
                target: "pmd::mp",
                "secondary pid {pid} left port {port} queue {queue} without releasing it"
            );
        }
        shared.event(MpEvent::Released {
            pid,
            port,
            queue,
            why,
        });
    }
    if matches!(end, End::Closed | End::Bye) && !shared.closing.load(Ordering::SeqCst) {
        reclaim_caches(shared, pid, matches!(end, End::Closed));
    }
    shared.event(MpEvent::Detached {
        pid,
        clean: matches!(end, End::Bye),
    });
}

/// How long a secondary whose connection closed may take to be gone (its connection closes
/// while it exits, a moment before the kernel marks it dead).
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Returns the cached mbufs a secondary left in the shared pools, once it is dead: a
/// secondary that is killed, aborts or ends with `_exit` leaves its caches' mbufs in their
/// slots (one that exits normally flushes them). A live process keeps its
/// caches (it may have closed only its connection), and so does one that still runs after
/// [`EXIT_GRACE`]; `unexpected` (no goodbye) makes that a warning.
fn reclaim_caches(shared: &Shared, pid: u32, unexpected: bool) {
    let pools = shared
        .pools
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for pool in pools {
        if !pool.mempool().cache_owners().contains(&pid) {
            continue;
        }
        let since = std::time::Instant::now();
        loop {
            match pool.mempool().reclaim_if_gone(pid) {
                // It flushed its caches on the way out.
                Ok(Some(0)) => break,
                Ok(Some(mbufs)) => {
                    tracing::info!(
                        target: "pmd::mp",
                        "secondary pid {pid} died: {mbufs} mbufs of its caches back to pool '{}'",
                        pool.name()
                    );
                    shared.event(MpEvent::Reclaimed {
                        pid,
                        pool: pool.name().to_string(),
                        mbufs,
                    });
                    break;
                }
                Ok(None) if since.elapsed() < EXIT_GRACE => std::thread::sleep(POLL / 10),
                Ok(None) if !unexpected => {
                    tracing::debug!(
                        target: "pmd::mp",
                        "secondary pid {pid} detached and still runs: its cached mbufs of pool \
                         '{}' stay with it",
                        pool.name()
                    );
                    break;
                }
                _ => {
                    tracing::warn!(
                        target: "pmd::mp",
                        "secondary pid {pid} closed its connection but still runs: its cached \
                         mbufs of pool '{}' stay with it",
                        pool.name()
                    );
                    break;
                }
            }
        }
    }
}

fn converse(shared: &Shared, sock: &SeqConn, id: ConnId, pid: u32) -> End {
    let mut buf = vec![0u8; MAX_RECORD + 1];
    let mut hello = false;
    let since = std::time::Instant::now();
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return End::Stop;
        }
        if !hello && since.elapsed() > HELLO_TIMEOUT {
            return End::Cut(format!("no hello within {HELLO_TIMEOUT:?}"));
        }
        let n = match read_record(sock, &mut buf) {
            // A descriptor a secondary sends is closed: the primary takes none.
            Read::Record(n, _) => n,
            Read::Closed | Read::Failed(_) => return End::Closed,
            Read::TooLong => return End::Cut(format!("a record over {MAX_RECORD} bytes")),
            Read::Again => continue,
        };
        let rec = &buf[..n];
        let msg = match Msg::decode(rec) {
            Ok(m) => m,
            Err(e) => {
                if let Some(v) = protocol::record_version(rec).filter(|&v| v != protocol::VERSION) {
                    let _ = sock.send(
                        &Msg::Refused {
                            port: 0,
                            queue: 0,
                            why: Refusal::Version(protocol::VERSION),
                        }
                        .encode(),
                    );
                    return End::Cut(format!("protocol version {v}"));
                }
                return End::Cut(e.to_string());
            }
        };
        let reply = match msg {
            Msg::Hello { app } if !hello => {
                hello = true;
                shared.event(MpEvent::Attached {
                    pid,
                    app: app.clone(),
                });
                tracing::info!(target: "pmd::mp", "secondary {app} (pid {pid}) attached");
                let t = shared.table();
                let ports = t.ports.iter().map(|p| p.info.clone()).collect();
                Msg::Welcome {
                    ports,
                    memory: t.memory.clone(),
                }
            }
            _ if !hello => return End::Cut("a request before its hello".into()),
            Msg::Hello { .. } => return End::Cut("a second hello".into()),
            Msg::Claim { port, queue } => {
                let granted = {
                    let mut t = shared.table();
                    t.claim(id, pid, port, queue).map(|(q, new)| {
                        let device = t.port(port).and_then(|p| p.device.clone());
                        (q, new, device)
                    })
                };
                match granted {
                    Ok((q, new, device)) => {
                        if new {
                            shared.event(MpEvent::Claimed {
                                pid,
                                port,
                                queue: q,
                            });
                        }
                        let reply = Msg::Granted {
                            port,
                            queue: q,
                            device_gen: device.as_ref().map_or(0, |d| d.1),
                        }
                        .encode();
                        let sent = match &device {
                            Some((fd, _)) => {
                                use std::os::fd::AsFd;
                                sock.send_with_fd(&reply, fd.as_fd())
                            }
                            None => sock.send(&reply),
                        };
                        if sent.is_err() {
                            return End::Closed;
                        }
                        continue;
                    }
                    Err(why) => Msg::Refused { port, queue, why },
                }
            }
            Msg::Release { port, queue } => match shared.table().release(id, port, queue) {
                Ok(()) => {
                    shared.event(MpEvent::Released {
                        pid,
                        port,
                        queue,
                        why: ReleaseWhy::Asked,
                    });
                    Msg::Released { port, queue }
                }
                Err(why) => Msg::Refused { port, queue, why },
            },
            Msg::Bye => return End::Bye,
            other => return End::Cut(format!("a primary's message from a secondary: {other:?}")),
        };
        if sock.send(&reply.encode()).is_err() {
            return End::Closed;
        }
    }
}
