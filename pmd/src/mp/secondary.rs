//! The secondary's side: attach, claim and release queue pairs, and notice the primary
//! stopping.
#![deny(unsafe_code)]

use super::protocol::{MemInfo, MemKind, Msg, PortInfo, Refusal, MAX_RECORD, NEXT_FREE};
use super::{check_prefix, io_err, read_record, socket_path, MpError, Read};
use crate::sys::seqpacket::SeqConn;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the reader thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// How long a request waits for its answer.
const ANSWER: Duration = Duration::from_secs(5);

/// Why the primary is gone, once it is.
#[derive(Default)]
struct Gone {
    flag: AtomicBool,
    reason: Mutex<Option<String>>,
    /// The primary said it destroyed its queues before it went.
    closed: AtomicBool,
}

impl Gone {
    fn set(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        r.get_or_insert(reason);
        self.flag.store(true, Ordering::Release);
    }

    fn reason(&self) -> Option<String> {
        if !self.flag.load(Ordering::Acquire) {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A secondary attached to a primary. Dropping it gives back every queue pair it holds
/// (it says goodbye); a secondary that exits without dropping it (killed) gives them back
/// too, as its connection closes.
pub struct Secondary {
    sock: Arc<SeqConn>,
    ports: Vec<PortInfo>,
    /// The primary's shared memory, mapped where the primary maps it.
    memory: Vec<(MemInfo, mempool::Region)>,
    /// The primary's shared mbuf pools, attached.
    pools: Vec<(MemInfo, Arc<mempool::MbufPool>)>,
    primary_pid: Option<u32>,
    answers: Receiver<(Msg, Option<OwnedFd>)>,
    /// The device descriptors the primary sent with grants, by port.
    devices: Vec<(u16, OwnedFd, u64)>,
    gone: Arc<Gone>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    held: Vec<(u16, u16)>,
}

impl std::fmt::Debug for Secondary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secondary")
            .field("primary_pid", &self.primary_pid)
            .field("ports", &self.ports)
            .field("held", &self.held)
            .finish()
    }
}

impl Secondary {
    /// Attaches to the primary with file prefix `prefix`, as program `app`.
    ///
    /// # Errors
    /// [`MpError::NoPrimary`], [`MpError::PrimaryGone`], [`MpError::Refused`] (another
    /// protocol version, too many secondaries), [`MpError::NoAnswer`],
    /// [`MpError::Protocol`], [`MpError::Io`].
    pub fn attach(prefix: &str, app: &str) -> Result<Self, MpError> {
        check_prefix(prefix)?;
        Self::attach_at(&socket_path(prefix), prefix, app)
    }

    /// [`attach`](Self::attach) to the socket at `path` (`prefix` only names it in errors).
    ///
    /// # Errors
    /// As [`attach`](Self::attach).
    pub fn attach_at(path: &Path, prefix: &str, app: &str) -> Result<Self, MpError> {
        let sock = SeqConn::connect(path).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => MpError::NoPrimary {
                prefix: prefix.to_string(),
                path: path.to_owned(),
            },
            Some(libc::ECONNREFUSED) => MpError::PrimaryGone {
                prefix: prefix.to_string(),
                path: path.to_owned(),
            },
            _ => io_err("connecting to", path)(e),
        })?;
        sock.set_timeouts(Some(POLL), Some(ANSWER))
            .map_err(io_err("setting timeouts on", path))?;
        let primary_pid = sock.peer_pid();
        // A refusal (too many secondaries) may close the connection before the hello is
        // sent: the answer is read all the same, and says why.
        let sent = sock.send(
            &Msg::Hello {
                app: app.to_string(),
            }
            .encode(),
        );
        let sock = Arc::new(sock);
        let (tx, answers) = mpsc::channel();
        let gone = Arc::new(Gone::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (s, g, st) = (Arc::clone(&sock), Arc::clone(&gone), Arc::clone(&stop));
        let reader = std::thread::Builder::new()
            .name("pmd-mp-sec".into())
            .spawn(move || read_loop(&s, &tx, &g, &st))
            .map_err(io_err("starting the reader thread for", path))?;
        let mut me = Self {
            sock,
            ports: Vec::new(),
            memory: Vec::new(),
            pools: Vec::new(),
            primary_pid,
            answers,
            devices: Vec::new(),
            gone,
            stop,
            reader: Some(reader),
            held: Vec::new(),
        };
        let welcome = match (me.answer("its welcome"), sent) {
            (Ok(m @ Msg::Refused { .. }), _) | (Ok(m), Ok(())) => m,
            (_, Err(e)) => return Err(io_err("sending to", path)(e)),
            (Err(e), Ok(())) => return Err(e),
        };
        match welcome {
            Msg::Welcome { ports, memory } => {
                me.ports = ports;
                for m in memory {
                    match m.kind {
                        MemKind::Region => {
                            let region = map_at(&m)?;
                            me.memory.push((m, region));
                        }
                        MemKind::MbufPool => {
                            let pool = attach_pool(&m)?;
                            me.pools.push((m, pool));
                        }
                    }
                }
            }
            Msg::Refused { port, queue, why } => return Err(MpError::Refused { port, queue, why }),
            other => return Err(MpError::Protocol(format!("expected a welcome: {other:?}"))),
        }
        tracing::info!(
            target: "pmd::mp",
            "attached to the primary at {} (pid {:?}): {} port(s)",
            path.display(),
            primary_pid,
            me.ports.len()
        );
        Ok(me)
    }

    /// The primary's ports.
    pub fn ports(&self) -> &[PortInfo] {
        &self.ports
    }

    /// The primary's shared mbuf pools ([`Primary::share_pool`]), attached in this process.
    ///
    /// [`Primary::share_pool`]: crate::mp::Primary::share_pool
    pub fn pools(&self) -> impl Iterator<Item = &Arc<mempool::MbufPool>> {
        self.pools.iter().map(|(_, p)| p)
    }

    /// The primary's shared mbuf pool called `name`.
    pub fn pool(&self, name: &str) -> Option<&Arc<mempool::MbufPool>> {
        self.pools().find(|p| p.name() == name)
    }

    /// The primary's shared memory areas, each mapped in this process where the primary
    /// maps it.
    pub fn memory(&self) -> impl Iterator<Item = (&MemInfo, &mempool::Region)> {
        self.memory.iter().map(|(m, r)| (m, r))
    }

    /// The primary's pid, where the kernel says.
    pub fn primary_pid(&self) -> Option<u32> {
        self.primary_pid
    }

    /// The queue pairs this secondary holds: (port, queue).
    pub fn held(&self) -> &[(u16, u16)] {
        &self.held
    }

    /// Why the primary is gone (it stopped and said why, or its connection closed), or
    /// `None` while it runs. Cheap (one load) until it is gone: a polling loop may ask
    /// every pass, as it asks its stop flag.
    pub fn primary_gone(&self) -> Option<String> {
        self.gone.reason()
    }

    /// Whether the primary, when it stopped, said it had destroyed its ports' queues first
    /// ([`Primary::shutdown_closed`]): then the buffers this process posted on exported
    /// queue pairs may go back to the pool
    /// ([`AttachedPair::drop_destroyed`](crate::port::attach::AttachedPair::drop_destroyed)).
    /// `false` while it runs, and for a primary that died.
    ///
    /// [`Primary::shutdown_closed`]: crate::mp::Primary::shutdown_closed
    pub fn primary_closed_queues(&self) -> bool {
        self.primary_gone().is_some() && self.gone.closed.load(Ordering::Acquire)
    }

    /// Port `port`'s device descriptor and its generation, which the primary sent with the
    /// last grant of one of its queue pairs
    /// ([`Primary::publish_device`](super::Primary::publish_device)): what
    /// `pmd::port::attach::AttachedPair::open` maps a `mana:` port's doorbell page from.
    /// `None` for a port whose primary published none (a device-model port).
    pub fn device(&self, port: u16) -> Option<crate::sys::DeviceFd<'_>> {
        self.devices
            .iter()
            .find(|(p, _, _)| *p == port)
            .map(|(_, fd, generation)| crate::sys::DeviceFd {
                fd: fd.as_fd(),
                generation: *generation,
            })
    }

    /// Asks the primary again for port `port`'s device descriptor (claiming again a queue
    /// pair of the port this secondary holds, which grants it unchanged with the current
    /// descriptor): after the primary's port was recovered onto a new device context, whose
    /// doorbell page the old descriptor does not map. Returns the descriptor now held.
    ///
    /// # Errors
    /// [`MpError::Refused`] with [`Refusal::NotYours`] when this secondary holds no queue
    /// pair of the port; as [`claim`](Self::claim) otherwise.
    pub fn refresh_device(
        &mut self,
        port: u16,
    ) -> Result<Option<crate::sys::DeviceFd<'_>>, MpError> {
        let Some(&(_, q)) = self.held.iter().find(|(p, _)| *p == port) else {
            return Err(MpError::Refused {
                port,
                queue: NEXT_FREE,
                why: Refusal::NotYours,
            });
        };
        self.claim(port, Some(q))?;
        Ok(self.device(port))
    }

    /// Takes queue pair `queue` of `port` (`None`: the next free one) and returns its index.
    ///
    /// # Errors
    /// [`MpError::Refused`] (no such port or queue, taken, none free),
    /// [`MpError::Stopped`], [`MpError::NoAnswer`], [`MpError::Protocol`].
    pub fn claim(&mut self, port: u16, queue: Option<u16>) -> Result<u16, MpError> {
        let asked = queue.unwrap_or(NEXT_FREE);
        self.request(&Msg::Claim { port, queue: asked })?;
        let (msg, device) = self.answer_with_fd("the claim")?;
        match msg {
            Msg::Granted {
                port: p,
                queue: q,
                device_gen,
            } if p == port && (asked == NEXT_FREE || q == asked) => {
                if !self.held.contains(&(port, q)) {
                    self.held.push((port, q));
                }
                self.devices.retain(|(d, _, _)| *d != port);
                match (device_gen, device) {
                    (0, _) => {}
                    (g, Some(fd)) => self.devices.push((port, fd, g)),
                    (_, None) => {
                        return Err(MpError::Device {
                            port,
                            why: "the primary sent it with the grant, but it did not arrive \
                                  (is this process at its open-file limit? ulimit -n)"
                                .into(),
                        })
                    }
                }
                Ok(q)
            }
            Msg::Refused { why, .. } => Err(MpError::Refused {
                port,
                queue: asked,
                why,
            }),
            other => Err(MpError::Protocol(format!(
                "expected the answer to a claim of port {port}: {other:?}"
            ))),
        }
    }

    /// Gives queue pair `queue` of `port` back.
    ///
    /// # Errors
    /// As [`claim`](Self::claim) (`Refused` with `NotYours` for a queue not held).
    pub fn release(&mut self, port: u16, queue: u16) -> Result<(), MpError> {
        self.request(&Msg::Release { port, queue })?;
        match self.answer("the release")? {
            Msg::Released { port: p, queue: q } if (p, q) == (port, queue) => {
                self.held.retain(|h| *h != (port, queue));
                Ok(())
            }
            Msg::Refused { why, .. } => Err(MpError::Refused { port, queue, why }),
            other => Err(MpError::Protocol(format!(
                "expected the answer to a release of port {port} queue {queue}: {other:?}"
            ))),
        }
    }

    fn request(&self, msg: &Msg) -> Result<(), MpError> {
        if let Some(r) = self.primary_gone() {
            return Err(MpError::Stopped(r));
        }
        self.sock
            .send(&msg.encode())
            .map_err(|e| MpError::Stopped(format!("the connection to the primary failed: {e}")))
    }

    fn answer(&self, what: &'static str) -> Result<Msg, MpError> {
        self.answer_with_fd(what).map(|(m, _)| m)
    }

    fn answer_with_fd(&self, what: &'static str) -> Result<(Msg, Option<OwnedFd>), MpError> {
        match self.answers.recv_timeout(ANSWER) {
            Ok(a) => Ok(a),
            Err(RecvTimeoutError::Timeout) => {
                // A late answer would be taken for the next request's: the connection is
                // done with.
                self.gone.set(format!(
                    "the primary did not answer {what} within {ANSWER:?}"
                ));
                Err(MpError::NoAnswer(what, ANSWER))
            }
            Err(RecvTimeoutError::Disconnected) => Err(MpError::Stopped(
                self.primary_gone()
                    .unwrap_or_else(|| "the connection closed".into()),
            )),
        }
    }
}

impl Drop for Secondary {
    fn drop(&mut self) {
        if self.primary_gone().is_none() {
            let _ = self.sock.send(&Msg::Bye.encode());
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// Attaches to one of the primary's shared mbuf pools.
fn attach_pool(m: &MemInfo) -> Result<Arc<mempool::MbufPool>, MpError> {
    let pool = mempool::MbufPool::attach(Path::new(&m.path), &mempool::RegionOptions::default())
        .map_err(|e| MpError::Memory {
            name: m.name.clone(),
            why: e.to_string(),
        })?;
    let addr = pool.mempool().region().addr() as u64;
    if addr != m.addr || pool.name() != m.name {
        return Err(MpError::Memory {
            name: m.name.clone(),
            why: format!(
                "{} holds pool '{}' at {addr:#x}, the primary announced '{}' at {:#x}",
                m.path,
                pool.name(),
                m.name,
                m.addr
            ),
        });
    }
    Ok(pool)
}

/// Maps one shared area where the primary maps it.
fn map_at(m: &MemInfo) -> Result<mempool::Region, MpError> {
    let addr = usize::try_from(m.addr).map_err(|_| MpError::Memory {
        name: m.name.clone(),
        why: format!("address {:#x} does not fit this process", m.addr),
    })?;
    let region = mempool::Region::attach_shared_at(
        Path::new(&m.path),
        addr,
        &mempool::RegionOptions::default(),
    )
    .map_err(|e| MpError::Memory {
        name: m.name.clone(),
        why: e.to_string(),
    })?;
    if region.len() as u64 != m.len {
        return Err(MpError::Memory {
            name: m.name.clone(),
            why: format!(
                "{} holds {} bytes, the primary maps {}",
                m.path,
                region.len(),
                m.len
            ),
        });
    }
    Ok(region)
}

fn read_loop(
    sock: &SeqConn,
    answers: &mpsc::Sender<(Msg, Option<OwnedFd>)>,
    gone: &Gone,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; MAX_RECORD + 1];
    while !stop.load(Ordering::SeqCst) {
        let (n, fd) = match read_record(sock, &mut buf) {
            Read::Record(n, fd) => (n, fd),
            Read::Closed => {
                gone.set("the primary's connection closed (it exited or was killed)".into());
                return;
            }
            Read::TooLong => {
                gone.set(format!("protocol error: a record over {MAX_RECORD} bytes"));
                return;
            }
            Read::Again => continue,
            Read::Failed(e) => {
                gone.set(format!("the connection to the primary failed: {e}"));
                return;
            }
        };
        match Msg::decode(&buf[..n]) {
            Ok(Msg::Shutdown { reason, closed }) => {
                gone.closed.store(closed, Ordering::Release);
                gone.set(reason);
                return;
            }
            Ok(m @ (Msg::Hello { .. } | Msg::Claim { .. } | Msg::Release { .. } | Msg::Bye)) => {
                gone.set(format!(
                    "protocol error: a secondary's message from the primary: {m:?}"
                ));
                return;
            }
            Ok(m) => {
                // Only a grant carries a descriptor (its port's device); any other is closed.
                let fd = fd.filter(|_| matches!(m, Msg::Granted { .. }));
                if answers.send((m, fd)).is_err() {
                    return;
                }
            }
            Err(e) => {
                gone.set(format!("protocol error: {e}"));
                return;
            }
        }
    }
}
