//! What the apps' integration tests share: running the tools and reading their JSON.
// Each test crate uses what it needs of this module.
#![allow(dead_code)]

use std::process::Command;

/// The tool `name` (`l2fwd` or `pktgen`) of this build, logging errors only.
pub fn bin(name: &str) -> Command {
    let path = match name {
        "l2fwd" => env!("CARGO_BIN_EXE_l2fwd"),
        "pktgen" => env!("CARGO_BIN_EXE_pktgen"),
        _ => unreachable!("no tool {name}"),
    };
    let mut c = Command::new(path);
    c.env("PMD_LOG", "error");
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
