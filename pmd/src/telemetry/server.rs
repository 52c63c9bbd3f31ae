//! The telemetry threads: one accepts clients, one per client (at most
//! [`TelemetryConfig::max_clients`](super::TelemetryConfig::max_clients)) reads its requests
//! and answers them. Commands that need the ports go to the thread that owns them, which
//! answers in [`Telemetry::serve`](super::Telemetry::serve); a client thread waits for that
//! answer a bounded time and answers `null` without it. Nothing here touches a queue.
#![deny(unsafe_code)]

use super::ethdev::PortCommand;
use super::protocol::{self, Data, MAX_CMD_LEN, MAX_REQUEST_LEN};
use super::{Answer, AnswerError};
use crate::sys::seqpacket::{SeqConn, SeqListener};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a waiting thread looks at the stop flag (accept and receive timeouts).
pub(super) const POLL: Duration = Duration::from_millis(100);

/// Requests for the ports' thread that may wait at once; past that a request is answered
/// `null` at once (the ports' thread is behind).
pub(super) const MAIN_QUEUE: usize = 64;

/// A command answered on a client's thread, from state that is safe to share.
pub type Handler = Arc<dyn Fn(Option<&str>) -> Answer + Send + Sync>;

/// How a command is answered.
#[derive(Clone)]
pub(super) enum How {
    /// `/`: the command names.
    List,
    /// `/info`: the greeting's fields.
    Info,
    /// `/help[,CMD]`.
    Help,
    /// On the client's thread.
    Local(Handler),
    /// On the ports' thread, by the port layer.
    Ports(PortCommand),
    /// On the ports' thread, by the app's callback.
    App,
}

/// A registered command.
#[derive(Clone)]
pub(super) struct Entry {
    pub help: String,
    pub how: How,
}

/// What the ports' thread is asked.
pub(super) struct Pending {
    pub cmd: String,
    pub param: Option<String>,
    /// `None`: the app's callback answers.
    pub port_cmd: Option<PortCommand>,
    pub reply: SyncSender<Answer>,
}

/// The settings the threads work with.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub version: String,
    pub pid: u32,
    pub max_output_len: usize,
    pub max_clients: usize,
    pub reply_timeout: Duration,
    pub send_timeout: Duration,
}

/// What the app's handle and the threads share.
pub(super) struct Shared {
    pub settings: Settings,
    pub commands: RwLock<BTreeMap<String, Entry>>,
    pub stop: AtomicBool,
    pub to_main: SyncSender<Pending>,
    /// Commands whose answer had to be cut, each logged once.
    cut: Mutex<BTreeSet<String>>,
}

impl Shared {
    /// The shared state and the receiving end of the ports' queue.
    pub fn new(settings: Settings, commands: BTreeMap<String, Entry>) -> (Self, Receiver<Pending>) {
        let (to_main, from_clients) = mpsc::sync_channel(MAIN_QUEUE);
        (
            Self {
                settings,
                commands: RwLock::new(commands),
                stop: AtomicBool::new(false),
                to_main,
                cut: Mutex::new(BTreeSet::new()),
            },
            from_clients,
        )
    }

    /// The answer record to one request record.
    pub fn answer(&self, text: &str) -> String {
        let req = protocol::parse(text);
        let data = match req {
            Some(r) if r.cmd.len() < MAX_CMD_LEN => match self.run(r.cmd, r.param) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::debug!(target: "pmd::telemetry", cmd = r.cmd, "null answer: {e}");
                    None
                }
            },
            _ => None,
        };
        let cmd = req.map(|r| r.cmd);
        let (out, skipped) = protocol::render(cmd, data.as_ref(), self.settings.max_output_len);
        if skipped > 0 {
            let name = cmd.unwrap_or("none").to_string();
            let first = self
                .cut
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.clone());
            if first {
                tracing::warn!(
                    target: "pmd::telemetry",
                    "the answer to {name} is longer than max_output_len ({} bytes): {skipped} \
                     entries left out (logged once per command)",
                    self.settings.max_output_len
                );
            }
        }
        out
    }

    fn run(&self, cmd: &str, param: Option<&str>) -> Answer {
        let how = {
            let commands = self.commands.read().unwrap_or_else(PoisonError::into_inner);
            match commands.get(cmd) {
                Some(e) => e.how.clone(),
                None => return Err(AnswerError::Unknown),
            }
        };
        match how {
            How::List => {
                let commands = self.commands.read().unwrap_or_else(PoisonError::into_inner);
                Ok(Data::Array(
                    commands.keys().map(|k| Data::Str(k.clone())).collect(),
                ))
            }
            How::Info => {
                let s = &self.settings;
                Ok(Data::dict()
                    .with("version", s.version.as_str())
                    .with("pid", i64::from(s.pid))
                    .with("max_output_len", s.max_output_len))
            }
            How::Help => self.help(cmd, param),
            How::Local(f) => f(param),
            How::Ports(pc) => self.ask_main(cmd, param, Some(pc)),
            How::App => self.ask_main(cmd, param, None),
        }
    }

    /// `/help`: its own help text without a parameter, `{CMD: help}` for a command
    /// (telemetry.c: `command_help`).
    fn help(&self, cmd: &str, param: Option<&str>) -> Answer {
        let commands = self.commands.read().unwrap_or_else(PoisonError::into_inner);
        let lookup = param.unwrap_or(cmd);
        let entry = commands
            .get(lookup)
            .ok_or_else(|| AnswerError::BadParameter {
                param: lookup.to_string(),
                why: "no such command",
            })?;
        Ok(match param {
            None => Data::Str(entry.help.clone()),
            Some(p) => Data::dict().with(p, entry.help.as_str()),
        })
    }

    /// Asks the ports' thread and waits for its answer.
    fn ask_main(&self, cmd: &str, param: Option<&str>, port_cmd: Option<PortCommand>) -> Answer {
        let (reply, answer) = mpsc::sync_channel(1);
        let pending = Pending {
            cmd: cmd.to_string(),
            param: param.map(str::to_string),
            port_cmd,
            reply,
        };
        match self.to_main.try_send(pending) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(AnswerError::Busy),
            Err(TrySendError::Disconnected(_)) => return Err(AnswerError::NoReply(Duration::ZERO)),
        }
        answer
            .recv_timeout(self.settings.reply_timeout)
            .unwrap_or(Err(AnswerError::NoReply(self.settings.reply_timeout)))
    }
}

/// Accepts clients until the stop flag is set; then waits for the client threads.
pub(super) fn listen(listener: SeqListener, shared: Arc<Shared>) {
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    let mut failures = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let conn = match listener.accept_timeout(POLL) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                // EMFILE and the like: say so now and then, and keep listening.
                if failures.is_power_of_two() {
                    tracing::warn!(target: "pmd::telemetry", "accepting a telemetry client: {e}");
                }
                failures = failures.wrapping_add(1);
                std::thread::sleep(POLL);
                continue;
            }
        };
        clients.retain(|h| !h.is_finished());
        if clients.len() >= shared.settings.max_clients {
            // As DPDK does past MAX_CONNECTIONS: accepted and closed at once.
            tracing::debug!(target: "pmd::telemetry", "{} clients already: closing a new one", clients.len());
            drop(conn);
            continue;
        }
        let s = Arc::clone(&shared);
        match std::thread::Builder::new()
            .name("telemetry-client".into())
            .spawn(move || serve_client(&conn, &s))
        {
            Ok(h) => clients.push(h),
            Err(e) => {
                tracing::warn!(target: "pmd::telemetry", "no thread for a telemetry client: {e}")
            }
        }
    }
    for h in clients {
        let _ = h.join();
    }
    // The listener's file goes with it (SeqListener's drop).
    drop(listener);
}

/// One client: the greeting, then one answer per request, until it closes, the server
/// stops, or it does not take an answer within the send timeout (it does not read).
fn serve_client(conn: &SeqConn, shared: &Shared) {
    let s = &shared.settings;
    if let Err(e) = conn.set_timeouts(Some(POLL), Some(s.send_timeout)) {
        tracing::debug!(target: "pmd::telemetry", "client socket timeouts: {e}");
        return;
    }
    if conn
        .send(protocol::greeting(&s.version, s.pid, s.max_output_len).as_bytes())
        .is_err()
    {
        return;
    }
    let mut buf = vec![0u8; MAX_REQUEST_LEN];
    while !shared.stop.load(Ordering::Acquire) {
        match conn.recv(&mut buf) {
            // The client closed (or sent an empty record, which DPDK takes the same way).
            Ok((0, _)) => return,
            Ok((n, _)) => {
                let answer = shared.answer(&String::from_utf8_lossy(&buf[..n]));
                if let Err(e) = conn.send(answer.as_bytes()) {
                    tracing::debug!(target: "pmd::telemetry", "closing a client that does not take its answers: {e}");
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                tracing::debug!(target: "pmd::telemetry", "client read: {e}");
                return;
            }
        }
    }
}
