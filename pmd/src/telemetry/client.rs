//! The client side: connect to a running app's telemetry socket (ours or a DPDK app's),
//! send requests, read answers; list the instances running on this machine.
#![deny(unsafe_code)]

use super::protocol::MAX_OUTPUT_LEN;
use super::{app_name, SOCKET_NAME};
use crate::sys::seqpacket::SeqConn;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a client waits for the greeting and for each answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server says as a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// The server's version string (`pmd 0.1.0`, `DPDK 24.11.1`).
    pub version: String,
    /// The server's process id.
    pub pid: u32,
    /// The longest answer it sends, in bytes.
    pub max_output_len: usize,
}

impl Greeting {
    fn parse(text: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        Some(Self {
            version: v["version"].as_str()?.to_string(),
            pid: u32::try_from(v["pid"].as_u64()?).ok()?,
            max_output_len: usize::try_from(v["max_output_len"].as_u64()?).ok()?,
        })
    }
}

/// Why a client could not talk to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing at the path.
    #[error("no telemetry socket at {path}")]
    NoSocket {
        /// The socket path.
        path: PathBuf,
    },
    /// A socket file nobody listens on: left by a process that is gone.
    #[error("{path}: connection refused (a socket file left by a process that is gone)")]
    Refused {
        /// The socket path.
        path: PathBuf,
    },
    /// The server closed the connection (it already has as many clients as it takes, or it
    /// is stopping).
    #[error("{path}: the server closed the connection (too many clients, or it is stopping)")]
    Closed {
        /// The socket path.
        path: PathBuf,
    },
    /// No answer in time.
    #[error("{path}: no answer within {} s", ANSWER_TIMEOUT.as_secs())]
    Timeout {
        /// The socket path.
        path: PathBuf,
    },
    /// Something that is not a telemetry answer.
    #[error("{path}: not a telemetry answer: {text:?}")]
    BadAnswer {
        /// The socket path.
        path: PathBuf,
        /// What came.
        text: String,
    },
    /// Any other socket error.
    #[error("{path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A connection to a telemetry server.
#[derive(Debug)]
pub struct Client {
    conn: SeqConn,
    path: PathBuf,
    greeting: Greeting,
}

impl Client {
    /// Connects to the socket at `path` and reads the greeting.
    ///
    /// # Errors
    /// [`ClientError::NoSocket`], [`ClientError::Refused`] (a stale file),
    /// [`ClientError::Closed`] (the server takes no more clients), or what the greeting lacks.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let conn = SeqConn::connect(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ClientError::NoSocket {
                path: path.to_owned(),
            },
            io::ErrorKind::ConnectionRefused => ClientError::Refused {
                path: path.to_owned(),
            },
            _ => ClientError::Io {
                path: path.to_owned(),
                source: e,
            },
        })?;
        conn.set_timeouts(Some(ANSWER_TIMEOUT), Some(ANSWER_TIMEOUT))
            .map_err(|source| ClientError::Io {
                path: path.to_owned(),
                source,
            })?;
        let mut c = Self {
            conn,
            path: path.to_owned(),
            greeting: Greeting {
                version: String::new(),
                pid: 0,
                max_output_len: MAX_OUTPUT_LEN,
            },
        };
        let text = c.recv_raw(1024)?;
        c.greeting = Greeting::parse(&text).ok_or_else(|| ClientError::BadAnswer {
            path: path.to_owned(),
            text,
        })?;
        Ok(c)
    }

    /// The greeting the server sent.
    pub fn greeting(&self) -> &Greeting {
        &self.greeting
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The process id of the server, as the kernel tells it.
    pub fn peer_pid(&self) -> Option<u32> {
        self.conn.peer_pid()
    }

    /// Sends `request` (`/ethdev/stats,0`) and returns the answer record as it came
    /// (`{"/ethdev/stats":{..}}`), compact JSON.
    ///
    /// # Errors
    /// The socket's errors, [`ClientError::Closed`], [`ClientError::Timeout`].
    pub fn request_raw(&self, request: &str) -> Result<String, ClientError> {
        self.send_raw(request.as_bytes())?;
        self.recv_raw(self.greeting.max_output_len.max(1024))
    }

    /// Sends `request` and returns the answer's data: the value under the command's name,
    /// `null` for an unknown command or a bad parameter.
    ///
    /// # Errors
    /// As [`Client::request_raw`], and [`ClientError::BadAnswer`] for a record that is not
    /// one JSON object with one entry.
    pub fn request(&self, request: &str) -> Result<serde_json::Value, ClientError> {
        let text = self.request_raw(request)?;
        let bad = |text: String| ClientError::BadAnswer {
            path: self.path.clone(),
            text,
        };
        let v: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(_) => return Err(bad(text)),
        };
        match v {
            serde_json::Value::Object(m) if m.len() == 1 => {
                Ok(m.into_iter().next().map(|(_, v)| v).unwrap_or_default())
            }
            _ => Err(bad(text)),
        }
    }

    /// The server's commands (`/`).
    ///
    /// # Errors
    /// As [`Client::request`].
    pub fn commands(&self) -> Result<Vec<String>, ClientError> {
        Ok(self
            .request("/")?
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Sends one record of any bytes.
    ///
    /// # Errors
    /// The socket's error.
    pub fn send_raw(&self, bytes: &[u8]) -> Result<(), ClientError> {
        self.conn.send(bytes).map_err(|e| self.io(e))
    }

    /// Reads one record of at most `max` bytes, as text.
    ///
    /// # Errors
    /// [`ClientError::Closed`] when the server closed the connection, [`ClientError::Timeout`].
    pub fn recv_raw(&self, max: usize) -> Result<String, ClientError> {
        let mut buf = vec![0u8; max];
        match self.conn.recv(&mut buf) {
            Ok((0, _)) => Err(ClientError::Closed {
                path: self.path.clone(),
            }),
            Ok((n, _)) => Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => Err(self.io(e)),
        }
    }

    fn io(&self, e: io::Error) -> ClientError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout {
                path: self.path.clone(),
            },
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => ClientError::Closed {
                path: self.path.clone(),
            },
            _ => ClientError::Io {
                path: self.path.clone(),
                source: e,
            },
        }
    }
}

/// What a telemetry socket found on this machine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceState {
    /// A server answered.
    Live {
        /// Its greeting.
        greeting: Greeting,
        /// Its program name (`/proc/PID/cmdline`).
        app: Option<String>,
    },
    /// A server is there but took no new client (it has as many as it takes).
    Busy {
        /// Its process id, as the kernel tells it.
        pid: Option<u32>,
    },
    /// A file nobody listens on.
    Stale,
}

/// A telemetry socket under the runtime directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its file prefix (the directory it is in).
    pub prefix: String,
    /// The socket.
    pub path: PathBuf,
    /// Whether something serves it.
    pub state: InstanceState,
}

/// Every telemetry socket under `base` (the runtime directory's `dpdk` folder:
/// [`runtime_base`](super::runtime_base)): `BASE/PREFIX/dpdk_telemetry.v2` and DPDK's
/// secondary instances `dpdk_telemetry.v2:N`, sorted, each tried once.
pub fn instances(base: &Path) -> Vec<Instance> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let Ok(dirs) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    for d in dirs.filter_map(Result::ok) {
        let Ok(files) = std::fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.filter_map(Result::ok) {
            if f.file_name().to_string_lossy().starts_with(SOCKET_NAME) {
                found.push((d.file_name().to_string_lossy().into_owned(), f.path()));
            }
        }
    }
    found.sort();
    found
        .into_iter()
        .map(|(prefix, path)| {
            let state = match Client::connect(&path) {
                Ok(c) => InstanceState::Live {
                    app: app_name(c.greeting.pid),
                    greeting: c.greeting,
                },
                // Nobody accepts on it.
                Err(
                    ClientError::Refused { .. }
                    | ClientError::NoSocket { .. }
                    | ClientError::Io { .. },
                ) => InstanceState::Stale,
                // Something accepted and then closed, or says nothing.
                Err(_) => InstanceState::Busy {
                    pid: SeqConn::connect(&path).ok().and_then(|c| c.peer_pid()),
                },
            };
            Instance {
                prefix,
                path,
                state,
            }
        })
        .collect()
}

/// Compact JSON `text` indented for a person, two spaces a level, keys in the order they
/// came (a `serde_json` value would sort them). Text that is not JSON comes back as it is,
/// near enough: the indentation only follows brackets and commas outside strings.
pub fn pretty(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let (mut in_str, mut escaped) = (false, false);
    let mut chars = text.trim().chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                // An empty container stays on one line.
                if matches!(chars.peek(), Some('}' | ']')) {
                    out.push(chars.next().unwrap_or(c));
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_keeps_the_order_and_the_strings() {
        let text = r#"{"b":1,"a":[1,2],"s":"x,{y}:\"z\"","e":{},"f":[]}"#;
        let p = pretty(text);
        assert_eq!(
            p,
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ],\n  \"s\": \"x,{y}:\\\"z\\\"\",\n  \"e\": {},\n  \"f\": []\n}"
        );
        let a: serde_json::Value = serde_json::from_str(text).unwrap();
        let b: serde_json::Value = serde_json::from_str(&p).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn greetings_parse() {
        assert_eq!(
            Greeting::parse(r#"{"version":"DPDK 24.11.1","pid":7,"max_output_len":16384}"#),
            Some(Greeting {
                version: "DPDK 24.11.1".into(),
                pid: 7,
                max_output_len: 16384
            })
        );
        assert_eq!(Greeting::parse(r#"{"version":"x"}"#), None);
    }
}
