//! Port events as the tools watch them: what happened, when, and what the tool does about it.
#![deny(unsafe_code)]

use pmd::port::{wait_events, Port, PortEvent, PortState};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// One port event as a tool saw it.
#[derive(Debug, Clone)]
pub struct SeenEvent {
    /// Seconds since the tool started watching.
    pub t_s: f64,
    /// Port index (as given on the command line).
    pub port: usize,
    /// What happened.
    pub event: PortEvent,
}

/// The ports' events, watched from a tool's main (statistics) loop, never from a polling
/// core: [`EventWatch::wait`] takes the place of the loop's sleep, logs every event on
/// stderr (`TOOL: port N (SPEC): EVENT`) and keeps them for the final report.
#[derive(Debug)]
pub struct EventWatch {
    tool: &'static str,
    names: Vec<String>,
    t0: Instant,
    seen: Vec<SeenEvent>,
    poll_failed: bool,
    capture_failed: Option<String>,
}

impl EventWatch {
    /// Watches `ports` for `tool` (the log prefix), timing events from `t0`.
    pub fn new(tool: &'static str, ports: &[Port], t0: Instant) -> Self {
        Self {
            tool,
            names: ports.iter().map(|p| p.name().to_string()).collect(),
            t0,
            seen: Vec::new(),
            poll_failed: false,
            capture_failed: None,
        }
    }

    /// Waits up to `timeout` for events on `ports`, logs and records them. Returns the
    /// message of the first one that ends a port for good, after which the tool should stop:
    /// a device that failed or went away on a port that does not recover, or a recovery
    /// that failed ([`PortEvent::RecoveryFailed`], with [`Port::failure`]'s reason). A port
    /// that recovers by itself ([`PortState::Recovering`] after the loss) is only logged,
    /// like link changes.
    pub fn wait(&mut self, ports: &mut [Port], timeout: Duration) -> Option<String> {
        let got = if self.poll_failed {
            // Without poll, still drive the recoveries (each looks for its device when due).
            std::thread::sleep(timeout.min(pmd::port::recovery::RETRY_INTERVAL));
            let mut got = Vec::new();
            for (i, p) in ports.iter_mut().enumerate() {
                if p.state() == PortState::Recovering {
                    got.extend(p.take_events().into_iter().map(|e| (i, e)));
                }
            }
            got
        } else {
            wait_events(ports, timeout).unwrap_or_else(|e| {
                eprintln!(
                    "{}: warning: watching port events failed ({e}); events are no longer reported",
                    self.tool
                );
                self.poll_failed = true;
                Vec::new()
            })
        };
        let mut fatal = None;
        for (port, event) in got {
            let mut what = format!("port {port} ({}): {event}", self.names[port]);
            if event == PortEvent::RecoveryFailed {
                if let Some(why) = ports[port].failure() {
                    what = format!("port {port}: recovery failed: {why}");
                }
            }
            eprintln!("{}: {what}", self.tool);
            let recovering = matches!(
                ports[port].state(),
                PortState::Recovering | PortState::Started | PortState::Configured
            ) && ports[port].recovers();
            let ends = match event {
                PortEvent::RecoveryFailed => true,
                e => e.is_fatal() && !recovering,
            };
            if ends && fatal.is_none() {
                fatal = Some(format!("{what}: stopping"));
            }
            if matches!(event, PortEvent::CaptureFailed { .. }) && self.capture_failed.is_none() {
                self.capture_failed = Some(format!("{what}: stopping"));
            }
            self.seen.push(SeenEvent {
                t_s: self.t0.elapsed().as_secs_f64(),
                port,
                event,
            });
        }
        fatal
    }

    /// Why a port's capture (`pcap=FILE`) stopped recording ([`PortEvent::CaptureFailed`]),
    /// as a message for the tool to stop with, once one did: a capture with frames missing is
    /// not the capture that was asked for, whatever the tool does about lost ports.
    pub fn capture_failure(&self) -> Option<&str> {
        self.capture_failed.as_deref()
    }

    /// The events seen so far, oldest first.
    pub fn seen(&self) -> &[SeenEvent] {
        &self.seen
    }

    /// The events as a JSON array for `--json` reports:
    /// `[{"t_s": .., "port": N, "event": "link_down", "message": "link down"}, ..]`.
    pub fn json(&self) -> Value {
        Value::Array(
            self.seen
                .iter()
                .map(|e| {
                    let mut v = json!({
                        "t_s": e.t_s,
                        "port": e.port,
                        "event": e.event.name(),
                        "message": e.event.to_string(),
                    });
                    if let PortEvent::Recovered { downtime } = e.event {
                        v["downtime_s"] = downtime.as_secs_f64().into();
                    }
                    v
                })
                .collect(),
        )
    }
}
