//! The multi-process control protocol: one `SOCK_SEQPACKET` record per message, a 4-byte
//! header (magic, version, kind) and a little-endian body of fixed fields and short
//! length-prefixed strings.
//!
//! A secondary is another process, so every record is checked before anything acts on it:
//! the magic, the version, a known kind, every field inside the record, strings that are
//! UTF-8 and within their limits, and no bytes left over. A record that fails is a
//! [`DecodeError`] that names what was wrong; the primary answers it by closing that
//! connection (releasing what it held), and nothing else changes.
#![deny(unsafe_code)]

/// The first two bytes of every record: `PM`.
pub const MAGIC: [u8; 2] = *b"PM";

/// The protocol version this build speaks. A primary refuses a secondary of another
/// version ([`Refusal::Version`]): both sides map the same queue layouts, which only one
/// build of `pmd` agrees on.
pub const VERSION: u8 = 3;

/// The longest record either side sends or reads, in bytes: room for the largest welcome
/// (checked below).
pub const MAX_RECORD: usize = 16 * 1024;

/// A pid the kernel did not give (a peer in another pid namespace): [`Refusal::Taken`] of it
/// names no process.
pub const UNKNOWN_PID: u32 = u32::MAX;

/// The most ports a primary publishes (as DPDK's default `RTE_MAX_ETHPORTS`).
pub const MAX_PORTS: usize = 32;

/// The longest port name or application name, in bytes.
pub const MAX_NAME: usize = 64;

/// The longest shutdown reason, in bytes.
pub const MAX_REASON: usize = 256;

/// The most shared memory areas a primary publishes.
pub const MAX_MEMORY: usize = 16;

/// The longest path of a shared memory file, in bytes.
pub const MAX_PATH: usize = 512;

/// `queue` in a [`Msg::Claim`] that asks for the next free queue of the port.
pub const NEXT_FREE: u16 = u16::MAX;

// The largest welcome: header, port count, every port (id, queues, name), memory count,
// every area (name, path, address, length).
const _: () = assert!(
    4 + 1
        + MAX_PORTS * (2 + 2 + 2 + MAX_NAME)
        + 1
        + MAX_MEMORY * (2 + MAX_NAME + 2 + MAX_PATH + 17)
        <= MAX_RECORD
);

/// One published port, as the primary describes it in [`Msg::Welcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// The port id.
    pub id: u16,
    /// Its queue pairs.
    pub queues: u16,
    /// Its spec or name (e.g. `emu-mana:wire=shm:a`), for messages.
    pub name: String,
}

/// What a shared memory area holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    /// Plain memory: the secondary maps the file at the primary's address.
    Region,
    /// An mbuf pool made with a shared file: the secondary attaches to it
    /// ([`mempool::MbufPool::attach`]) and allocates and frees its mbufs like the primary.
    MbufPool,
}

/// One shared memory area, as the primary describes it in [`Msg::Welcome`]: a file the
/// secondary maps whole at `addr`, where the primary maps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemInfo {
    /// What it holds.
    pub kind: MemKind,
    /// What it holds (e.g. the pool's name), for messages.
    pub name: String,
    /// The file (on a hugetlbfs mount, or tmpfs).
    pub path: String,
    /// Where the primary maps it.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// Why the primary refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The secondary speaks another protocol version (the primary's is given).
    Version(u8),
    /// No published port has that id.
    NoSuchPort,
    /// The port has no queue with that index.
    NoSuchQueue,
    /// The queue is another process's (its pid; 0: the primary's own).
    Taken(u32),
    /// Every queue of the port is taken.
    NoneFree,
    /// A release of a queue this secondary does not hold.
    NotYours,
    /// The primary serves as many secondaries as it takes.
    TooMany,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Version(v) => write!(
                f,
                "the primary speaks protocol version {v}, this process {VERSION}: \
                 run the same build of both"
            ),
            Refusal::NoSuchPort => write!(f, "the primary has no such port"),
            Refusal::NoSuchQueue => write!(f, "the port has no such queue"),
            Refusal::Taken(0) => write!(f, "the primary polls that queue itself"),
            Refusal::Taken(UNKNOWN_PID) => write!(f, "another secondary holds that queue"),
            Refusal::Taken(pid) => write!(f, "process {pid} holds that queue"),
            Refusal::NoneFree => write!(f, "every queue of the port is taken"),
            Refusal::NotYours => write!(f, "this process does not hold that queue"),
            Refusal::TooMany => write!(f, "the primary serves as many secondaries as it takes"),
        }
    }
}

/// One message, either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Secondary → primary, first: who it is.
    Hello {
        /// Its program name, for the primary's messages.
        app: String,
    },
    /// Secondary → primary: take a queue pair of a port ([`NEXT_FREE`]: the next free one).
    Claim {
        /// The port id.
        port: u16,
        /// The queue pair, or [`NEXT_FREE`].
        queue: u16,
    },
    /// Secondary → primary: give a queue pair back.
    Release {
        /// The port id.
        port: u16,
        /// The queue pair.
        queue: u16,
    },
    /// Secondary → primary: it is leaving; everything it holds goes back.
    Bye,
    /// Primary → secondary, the answer to `Hello`: its ports and shared memory.
    Welcome {
        /// The published ports.
        ports: Vec<PortInfo>,
        /// The shared memory areas.
        memory: Vec<MemInfo>,
    },
    /// Primary → secondary: the queue pair is the secondary's until it releases it or exits.
    Granted {
        /// The port id.
        port: u16,
        /// The queue pair.
        queue: u16,
        /// The generation of the port's device descriptor, which comes with the record
        /// (`SCM_RIGHTS`); 0: the port published none, and no descriptor comes.
        device_gen: u64,
    },
    /// Primary → secondary: the queue pair went back.
    Released {
        /// The port id.
        port: u16,
        /// The queue pair.
        queue: u16,
    },
    /// Primary → secondary: a request was refused.
    Refused {
        /// The port id the request named.
        port: u16,
        /// The queue it named.
        queue: u16,
        /// Why.
        why: Refusal,
    },
    /// Primary → secondary: the primary is stopping; the secondary stops polling its queues
    /// now (they go with the primary's ports).
    Shutdown {
        /// What the primary says, e.g. `SIGINT`.
        reason: String,
        /// The primary has destroyed its ports' queues (the exported ones too): what a
        /// secondary posted on them may go back to the pool.
        closed: bool,
    },
}

/// A record that is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its header or a field.
    #[error("record ends inside {0}")]
    Short(&'static str),
    /// Longer than [`MAX_RECORD`].
    #[error("record of {0} bytes (at most {MAX_RECORD})")]
    TooLong(usize),
    /// Not `PM`.
    #[error("bad magic {0:02x?}")]
    Magic([u8; 2]),
    /// Another protocol version.
    #[error("protocol version {0} (this process speaks {VERSION})")]
    Version(u8),
    /// An unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// A string over its limit or not UTF-8.
    #[error("bad {0}")]
    Text(&'static str),
    /// A field out of range.
    #[error("bad {0}")]
    Field(&'static str),
    /// Bytes after the message.
    #[error("{0} bytes after the message")]
    Trailing(usize),
}

const K_HELLO: u8 = 1;
const K_CLAIM: u8 = 2;
const K_RELEASE: u8 = 3;
const K_BYE: u8 = 4;
const K_WELCOME: u8 = 16;
const K_GRANTED: u8 = 17;
const K_RELEASED: u8 = 18;
const K_REFUSED: u8 = 19;
const K_SHUTDOWN: u8 = 20;

const R_VERSION: u8 = 1;
const R_NO_PORT: u8 = 2;
const R_NO_QUEUE: u8 = 3;
const R_TAKEN: u8 = 4;
const R_NONE_FREE: u8 = 5;
const R_NOT_YOURS: u8 = 6;
const R_TOO_MANY: u8 = 7;

/// The version byte of a record, if it has a header with the right magic: a primary
/// answers a secondary of another version with [`Refusal::Version`] before closing.
pub fn record_version(rec: &[u8]) -> Option<u8> {
    (rec.len() >= 4 && rec[..2] == MAGIC).then(|| rec[2])
}

fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    // Control characters would be refused by the reader: shown as `?`. Over the limit: cut
    // at a character boundary rather than fail to send.
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let s = clean.as_str();
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

impl Msg {
    /// The record for this message. Strings over their limits are cut at a character
    /// boundary; more than [`MAX_PORTS`] ports are cut to that many.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        let pq = |out: &mut Vec<u8>, kind: u8, port: u16, queue: u16| {
            out.push(kind);
            out.extend_from_slice(&port.to_le_bytes());
            out.extend_from_slice(&queue.to_le_bytes());
        };
        match self {
            Msg::Hello { app } => {
                out.push(K_HELLO);
                put_str(&mut out, app, MAX_NAME);
            }
            Msg::Claim { port, queue } => pq(&mut out, K_CLAIM, *port, *queue),
            Msg::Release { port, queue } => pq(&mut out, K_RELEASE, *port, *queue),
            Msg::Bye => out.push(K_BYE),
            Msg::Welcome { ports, memory } => {
                out.push(K_WELCOME);
                let ports = &ports[..ports.len().min(MAX_PORTS)];
                out.push(ports.len() as u8);
                for p in ports {
                    out.extend_from_slice(&p.id.to_le_bytes());
                    out.extend_from_slice(&p.queues.to_le_bytes());
                    put_str(&mut out, &p.name, MAX_NAME);
                }
                let memory = &memory[..memory.len().min(MAX_MEMORY)];
                out.push(memory.len() as u8);
                for m in memory {
                    put_str(&mut out, &m.name, MAX_NAME);
                    put_str(&mut out, &m.path, MAX_PATH);
                    out.extend_from_slice(&m.addr.to_le_bytes());
                    out.extend_from_slice(&m.len.to_le_bytes());
                    out.push(match m.kind {
                        MemKind::Region => 0,
                        MemKind::MbufPool => 1,
                    });
                }
            }
            Msg::Granted {
                port,
                queue,
                device_gen,
            } => {
                pq(&mut out, K_GRANTED, *port, *queue);
                out.extend_from_slice(&device_gen.to_le_bytes());
            }
            Msg::Released { port, queue } => pq(&mut out, K_RELEASED, *port, *queue),
            Msg::Refused { port, queue, why } => {
                pq(&mut out, K_REFUSED, *port, *queue);
                let (code, arg) = match why {
                    Refusal::Version(v) => (R_VERSION, u32::from(*v)),
                    Refusal::NoSuchPort => (R_NO_PORT, 0),
                    Refusal::NoSuchQueue => (R_NO_QUEUE, 0),
                    Refusal::Taken(pid) => (R_TAKEN, *pid),
                    Refusal::NoneFree => (R_NONE_FREE, 0),
                    Refusal::NotYours => (R_NOT_YOURS, 0),
                    Refusal::TooMany => (R_TOO_MANY, 0),
                };
                out.push(code);
                out.extend_from_slice(&arg.to_le_bytes());
            }
            Msg::Shutdown { reason, closed } => {
                out.push(K_SHUTDOWN);
                put_str(&mut out, reason, MAX_REASON);
                out.push(u8::from(*closed));
            }
        }
        out
    }

    /// Reads one record.
    ///
    /// # Errors
    /// [`DecodeError`]: what in the record is wrong.
    pub fn decode(rec: &[u8]) -> Result<Msg, DecodeError> {
        if rec.len() > MAX_RECORD {
            return Err(DecodeError::TooLong(rec.len()));
        }
        let mut r = Reader { rec, at: 0 };
        let magic = [r.u8("header")?, r.u8("header")?];
        if magic != MAGIC {
            return Err(DecodeError::Magic(magic));
        }
        let version = r.u8("header")?;
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let msg = match r.u8("header")? {
            K_HELLO => Msg::Hello {
                app: r.str("application name", MAX_NAME)?,
            },
            K_CLAIM => {
                let (port, queue) = r.port_queue()?;
                Msg::Claim { port, queue }
            }
            K_RELEASE => {
                let (port, queue) = r.port_queue()?;
                if queue == NEXT_FREE {
                    return Err(DecodeError::Field("queue"));
                }
                Msg::Release { port, queue }
            }
            K_BYE => Msg::Bye,
            K_WELCOME => {
                let n = usize::from(r.u8("port count")?);
                if n > MAX_PORTS {
                    return Err(DecodeError::Field("port count"));
                }
                let mut ports: Vec<PortInfo> = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = r.u16("port id")?;
                    let queues = r.u16("queue count")?;
                    if queues == 0 || queues == NEXT_FREE {
                        return Err(DecodeError::Field("queue count"));
                    }
                    if ports.iter().any(|p| p.id == id) {
                        return Err(DecodeError::Field("port id (twice)"));
                    }
                    let name = r.str("port name", MAX_NAME)?;
                    ports.push(PortInfo { id, queues, name });
                }
                let n = usize::from(r.u8("memory count")?);
                if n > MAX_MEMORY {
                    return Err(DecodeError::Field("memory count"));
                }
                let mut memory = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.str("memory name", MAX_NAME)?;
                    let path = r.str("memory path", MAX_PATH)?;
                    let addr = r.u64("memory address")?;
                    let len = r.u64("memory length")?;
                    let kind = match r.u8("memory kind")? {
                        0 => MemKind::Region,
                        1 => MemKind::MbufPool,
                        _ => return Err(DecodeError::Field("memory kind")),
                    };
                    if path.is_empty() || !path.starts_with('/') {
                        return Err(DecodeError::Text("memory path"));
                    }
                    if len == 0 || addr == 0 || addr.checked_add(len).is_none() {
                        return Err(DecodeError::Field("memory range"));
                    }
                    memory.push(MemInfo {
                        kind,
                        name,
                        path,
                        addr,
                        len,
                    });
                }
                Msg::Welcome { ports, memory }
            }
            K_GRANTED => {
                let (port, queue) = r.port_queue()?;
                if queue == NEXT_FREE {
                    return Err(DecodeError::Field("queue"));
                }
                let device_gen = r.u64("device generation")?;
                Msg::Granted {
                    port,
                    queue,
                    device_gen,
                }
            }
            K_RELEASED => {
                let (port, queue) = r.port_queue()?;
                if queue == NEXT_FREE {
                    return Err(DecodeError::Field("queue"));
                }
                Msg::Released { port, queue }
            }
            K_REFUSED => {
                let (port, queue) = r.port_queue()?;
                let code = r.u8("refusal")?;
                let arg = r.u32("refusal")?;
                let why = match code {
                    R_VERSION => Refusal::Version(
                        u8::try_from(arg).map_err(|_| DecodeError::Field("refusal"))?,
                    ),
                    R_TAKEN => Refusal::Taken(arg),
                    _ if arg != 0 => return Err(DecodeError::Field("refusal")),
                    R_NO_PORT => Refusal::NoSuchPort,
                    R_NO_QUEUE => Refusal::NoSuchQueue,
                    R_NONE_FREE => Refusal::NoneFree,
                    R_NOT_YOURS => Refusal::NotYours,
                    R_TOO_MANY => Refusal::TooMany,
                    _ => return Err(DecodeError::Field("refusal")),
                };
                Msg::Refused { port, queue, why }
            }
            K_SHUTDOWN => Msg::Shutdown {
                reason: r.str("reason", MAX_REASON)?,
                closed: match r.u8("closed")? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Field("closed")),
                },
            },
            k => return Err(DecodeError::Kind(k)),
        };
        match rec.len() - r.at {
            0 => Ok(msg),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

struct Reader<'a> {
    rec: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.rec.len());
        let end = end.ok_or(DecodeError::Short(what))?;
        let s = &self.rec[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn port_queue(&mut self) -> Result<(u16, u16), DecodeError> {
        Ok((self.u16("port")?, self.u16("queue")?))
    }

    fn str(&mut self, what: &'static str, max: usize) -> Result<String, DecodeError> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(DecodeError::Text(what));
        }
        let b = self.take(n, what)?;
        let s = std::str::from_utf8(b).map_err(|_| DecodeError::Text(what))?;
        if s.contains(|c: char| c.is_control()) {
            return Err(DecodeError::Text(what));
        }
        Ok(s.to_owned())
    }
}
