//! What the apps' integration tests share: running the tools and reading their JSON.
// Each test crate uses what it needs of this module.
#![allow(dead_code)]

use std::process::{Child, Command, Output};
use std::time::Duration;

/// The tool `name` (`l2fwd`, `pktgen` or `pmd-telemetry`) of this build, logging errors
/// only, with a runtime directory of its own (its telemetry socket meets no other tool's).
pub fn bin(name: &str) -> Command {
    let path = match name {
        "l2fwd" => env!("CARGO_BIN_EXE_l2fwd"),
        "pktgen" => env!("CARGO_BIN_EXE_pktgen"),
        "pmd-telemetry" => env!("CARGO_BIN_EXE_pmd-telemetry"),
        _ => unreachable!("no tool {name}"),
    };
    let mut c = Command::new(path);
    c.env("PMD_LOG", "error");
    integration_tests::own_runtime_dir(&mut c);
    c
}

/// The last JSON document (a line starting with `{`) in a tool's output.
pub fn json(out: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(out);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in: {text}"));
    serde_json::from_str(line).unwrap()
}

/// The JSON report of a tool that ran to the end: fails the test, with the tool's stderr, if
/// it exited with an error.
pub fn succeeded(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "the tool exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out.stdout)
}

/// Starts `c` with stdout and stderr piped; stderr is read line by line on a thread and
/// handed over as it comes.
pub fn spawn_with_lines(
    mut c: Command,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

/// A tool running in the background: killed and reaped if the test ends without stopping it
/// (an assertion failed), so that no process outlives its test and loads the machine.
pub struct Bg(pub Option<Child>);

impl Bg {
    /// The running process.
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Stops `bg` with SIGINT (as a user pressing Ctrl-C) and returns its output; fails the test
/// if it is still running 20 s later.
pub fn stop(mut bg: Bg) -> Output {
    pmd::sys::net::send_signal(bg.child().id(), pmd::sys::net::SIGINT).unwrap();
    assert!(
        integration_tests::eventually(Duration::from_secs(20), || bg
            .child()
            .try_wait()
            .unwrap()
            .is_some()),
        "the tool did not stop on SIGINT"
    );
    bg.0.take().expect("running").wait_with_output().unwrap()
}
