//! What the tools share for telemetry (see `pmd::telemetry`): the options
//! (`--file-prefix`, `--no-telemetry`), starting it, and the answers only a tool can give
//! (its port events, the frames its ports' devices dropped).
#![deny(unsafe_code)]

use crate::cli::{usage, Failure};
use crate::common::{loss_counters, EventWatch};
use pmd::capture::server::CaptureServer;
use pmd::port::Port;
use pmd::telemetry::{
    Answer, AnswerError, Data, Telemetry, TelemetryConfig, TelemetryError, DEFAULT_PREFIX,
};

/// The telemetry options of a tool.
#[derive(clap::Args, Debug, Clone)]
pub struct TelemetryArgs {
    /// File prefix, as DPDK's EAL option: names the runtime directory
    /// (`$RUNTIME_DIRECTORY`, /var/run for root, else `$XDG_RUNTIME_DIR` or /tmp, then
    /// `/dpdk/PREFIX`) that holds the telemetry socket `dpdk_telemetry.v2`. Two tools that
    /// run at once need two prefixes.
    #[arg(long, default_value = DEFAULT_PREFIX, value_name = "PREFIX")]
    pub file_prefix: String,
    /// Run without the telemetry socket (`pmd-telemetry` and `dpdk-telemetry.py` then
    /// cannot see this process).
    #[arg(long)]
    pub no_telemetry: bool,
}

/// The commands every tool adds, answered from its main loop by [`serve`].
const APP_COMMANDS: [(&str, &str); 2] = [
    (
        "/pmd/events",
        "The port events seen so far with their times (seconds since start), oldest first. \
         Parameter (optional): how many of the latest to give (default and most 256).",
    ),
    (
        "/pmd/drops",
        "Per port, the frames its device dropped (tx, rx) and every counter of a lost frame \
         that is not zero, by name. No parameter.",
    ),
];

/// Most events `/pmd/events` gives (the latest).
const MAX_EVENTS: usize = 256;

/// Starts telemetry for `tool` unless `--no-telemetry`, with the tool's own commands
/// (`/pmd/events`, `/pmd/drops`; the tool adds `/pmd/lcores` and `/pmd/pool`).
///
/// # Errors
/// A usage error for a bad prefix; a runtime error when the socket cannot be made, such as
/// when a running process serves the same prefix (naming its pid and what to do).
pub fn start(tool: &str, args: &TelemetryArgs) -> Result<Option<Telemetry>, Failure> {
    if args.no_telemetry {
        return Ok(None);
    }
    let t = Telemetry::start(&TelemetryConfig::new(&args.file_prefix)).map_err(|e| match e {
        TelemetryError::BadPrefix(_) => usage(format!("--file-prefix: {e}")),
        TelemetryError::InUse { .. } => Failure::Runtime(format!(
            "{e}: give this {tool} another --file-prefix (as two DPDK processes need), or \
             run it with --no-telemetry"
        )),
        e => Failure::Runtime(format!(
            "{e} (--no-telemetry runs without the telemetry socket)"
        )),
    })?;
    for (cmd, help) in APP_COMMANDS {
        t.register_app(cmd, help).map_err(|e| e.to_string())?;
    }
    Ok(Some(t))
}

/// Answers the telemetry requests that wait for the tool's main loop (port commands,
/// `/pmd/events`, `/pmd/drops`); call it on every turn of that loop. Does nothing without
/// telemetry.
pub fn serve(t: Option<&Telemetry>, ports: &[Port], events: &EventWatch) {
    if let Some(t) = t {
        t.serve_with(ports, |cmd, param| app_answer(cmd, param, ports, events));
    }
}

fn app_answer(cmd: &str, param: Option<&str>, ports: &[Port], events: &EventWatch) -> Answer {
    match cmd {
        "/pmd/events" => {
            let n = match param {
                None => MAX_EVENTS,
                Some(p) => p
                    .parse::<usize>()
                    .map_err(|_| AnswerError::BadParameter {
                        param: p.to_string(),
                        why: "how many events (a number)",
                    })?
                    .min(MAX_EVENTS),
            };
            let all = match events.json() {
                serde_json::Value::Array(a) => a,
                _ => Vec::new(),
            };
            let skip = all.len().saturating_sub(n);
            Ok(Data::Array(
                all.into_iter().skip(skip).map(Data::from).collect(),
            ))
        }
        "/pmd/drops" => Ok(Data::Array(
            ports
                .iter()
                .map(|p| {
                    let s = p.stats();
                    let d = s.device_drops;
                    let counters: Vec<(String, Data)> = loss_counters(&s)
                        .into_iter()
                        .map(|(n, v)| (n, Data::Uint(v)))
                        .collect();
                    Data::dict()
                        .with("port", p.id())
                        .with("tx", d.tx)
                        .with("rx", d.rx)
                        .with("counters", Data::Dict(counters))
                })
                .collect(),
        )),
        _ => Err(AnswerError::Unknown),
    }
}

/// Starts the live-capture socket (`pmd_capture.v1`, beside the telemetry socket) for
/// `pmd-dumpcap`, offering `ports` (configured, with their queues), unless `--no-telemetry`;
/// `telemetry` then answers `/pmd/capture` (what is being captured).
///
/// # Errors
/// A runtime error when the socket cannot be made (another live process serves the prefix).
pub fn capture(
    tool: &str,
    args: &TelemetryArgs,
    telemetry: Option<&Telemetry>,
    ports: &[Port],
) -> Result<Option<CaptureServer>, Failure> {
    if args.no_telemetry {
        return Ok(None);
    }
    let dir = pmd::telemetry::runtime_dir(&args.file_prefix);
    let server = CaptureServer::start(&dir, ports.iter().map(Port::capture_target).collect())
        .map_err(|e| {
            Failure::Runtime(format!(
                "capture socket: {e}: give this {tool} another --file-prefix, or run it with --no-telemetry"
            ))
        })?;
    if let Some(t) = telemetry {
        let captures = server.captures();
        t.register("/pmd/capture", CAPTURE_HELP, move |_| {
            Ok(Data::from(captures.json()))
        })
        .map_err(|e| e.to_string())?;
    }
    Ok(Some(server))
}

const CAPTURE_HELP: &str = "The pmd-dumpcap captures running now: the tool's pid, ports, \
    directions (rx, tx), filter, start (Unix seconds), and per port the frames seen, filtered \
    out and dropped for want of room in the rings. No parameter.";
