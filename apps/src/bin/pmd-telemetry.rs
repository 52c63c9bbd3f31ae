//! pmd-telemetry: asks a running l2fwd or pktgen (or any DPDK app) about itself over DPDK's
//! telemetry socket (`pmd::telemetry`).

use apps::cli::{usage, Failure};
use clap::Parser;
use pmd::telemetry::{
    app_name, instances, pretty, runtime_base, socket_path, Client, ClientError, InstanceState,
};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Ask a running l2fwd, pktgen or DPDK app about itself: its ports' counters, link, set-up,
/// port events, pool and polling cores, over the DPDK telemetry v2 socket of the instance
/// with file prefix PREFIX (`RUNTIME/dpdk/PREFIX/dpdk_telemetry.v2`, as the app's own
/// `--file-prefix`).
///
/// With a COMMAND it prints the answer and exits (status 1 when the answer is null: an
/// unknown command or a bad parameter); without one it reads commands from stdin, one a
/// line, until end of input or `quit`. `/` lists the commands and `/help,COMMAND` says what
/// one takes. Examples: `pmd-telemetry /ethdev/stats,0`, `pmd-telemetry --watch 1
/// /ethdev/stats 1`, `pmd-telemetry --list`.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// File prefix of the instance to ask (its --file-prefix; DPDK's -f).
    #[arg(short = 'f', long, default_value = pmd::telemetry::DEFAULT_PREFIX, value_name = "PREFIX")]
    file_prefix: String,
    /// Instance number: a DPDK secondary process's socket `dpdk_telemetry.v2:N` (0: the
    /// primary's).
    #[arg(short = 'i', long, default_value_t = 0, value_name = "N")]
    instance: u32,
    /// List the telemetry sockets of this machine (prefix, pid, program, version) and exit.
    #[arg(short = 'l', long, conflicts_with_all = ["command", "watch"])]
    list: bool,
    /// Print each answer as compact JSON, one line each, as the instance sent it.
    #[arg(long)]
    json: bool,
    /// Ask COMMAND again every SECONDS until interrupted or the instance goes away.
    #[arg(long, value_name = "SECONDS", requires = "command", value_parser = apps::cli::positive_seconds)]
    watch: Option<f64>,
    /// The command, e.g. `/ethdev/stats,0`; words after the first are its parameters
    /// (`/ethdev/stats 0` is the same). The leading `/` may be left out.
    #[arg(value_name = "COMMAND")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => e.report("pmd-telemetry"),
    }
}

fn run(args: &Args) -> Result<ExitCode, Failure> {
    if args.list {
        list(args.json);
        return Ok(ExitCode::SUCCESS);
    }
    pmd::telemetry::check_prefix(&args.file_prefix)
        .map_err(|e| usage(format!("--file-prefix: {e}")))?;
    let mut path = socket_path(&args.file_prefix);
    if args.instance > 0 {
        path = PathBuf::from(format!("{}:{}", path.display(), args.instance));
    }
    let client = connect(&path, &args.file_prefix)?;
    if args.command.is_empty() {
        return interactive(&client, args.json);
    }
    let request = request_text(&args.command);
    match args.watch {
        Some(s) => watch(&client, &request, Duration::from_secs_f64(s), args.json),
        None => {
            let raw = client.request_raw(&request).map_err(|e| e.to_string())?;
            Ok(if show(&request, &raw, args.json) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// `["/ethdev/stats", "0"]` -> `/ethdev/stats,0`; a missing leading `/` added.
fn request_text(words: &[String]) -> String {
    let joined = words.join(",");
    if joined.starts_with('/') {
        joined
    } else {
        format!("/{joined}")
    }
}

/// Connects, or says what is wrong and what is running instead.
fn connect(path: &Path, prefix: &str) -> Result<Client, Failure> {
    Client::connect(path).map_err(|e| {
        let msg = match &e {
            ClientError::NoSocket { .. } => format!(
                "no instance with file prefix {prefix:?} (no socket at {}); {}",
                path.display(),
                running_summary()
            ),
            ClientError::Refused { .. } => format!(
                "{}: nothing listens there: the process that made it is gone (a new one \
                 with this prefix takes it over); {}",
                path.display(),
                running_summary()
            ),
            ClientError::Closed { .. } => format!(
                "{}: the instance closed the connection at once: it serves as many \
                 telemetry clients as it takes; try again when one of them is done",
                path.display()
            ),
            _ => e.to_string(),
        };
        Failure::Runtime(msg)
    })
}

/// "running: prefix "a" (pid 1, l2fwd), ..." or that none is.
fn running_summary() -> String {
    let live: Vec<String> = instances(&runtime_base())
        .into_iter()
        .filter_map(|i| match i.state {
            InstanceState::Live { greeting, app } => Some(format!(
                "--file-prefix {} (pid {}{})",
                i.prefix,
                greeting.pid,
                app.map(|a| format!(", {a}")).unwrap_or_default()
            )),
            InstanceState::Busy { pid } => Some(format!(
                "--file-prefix {} (pid {}, busy)",
                i.prefix,
                pid.map_or("?".into(), |p| p.to_string())
            )),
            InstanceState::Stale => None,
        })
        .collect();
    if live.is_empty() {
        format!(
            "no instance is running (none under {})",
            runtime_base().display()
        )
    } else {
        format!("running: {}", live.join(", "))
    }
}

/// `--list`.
fn list(json: bool) {
    let base = runtime_base();
    let found = instances(&base);
    if json {
        let v: Vec<serde_json::Value> = found
            .iter()
            .map(|i| {
                let (state, pid, app, version) = match &i.state {
                    InstanceState::Live { greeting, app } => (
                        "live",
                        Some(greeting.pid),
                        app.clone(),
                        Some(greeting.version.clone()),
                    ),
                    InstanceState::Busy { pid } => ("busy", *pid, pid.and_then(app_name), None),
                    InstanceState::Stale => ("stale", None, None, None),
                };
                serde_json::json!({"prefix": i.prefix, "socket": i.path, "state": state,
                    "pid": pid, "app": app, "version": version})
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return;
    }
    if found.is_empty() {
        println!("no telemetry sockets under {}", base.display());
        return;
    }
    let rows: Vec<[String; 5]> = found
        .iter()
        .map(|i| {
            let (pid, app, version) = match &i.state {
                InstanceState::Live { greeting, app } => (
                    greeting.pid.to_string(),
                    app.clone().unwrap_or_else(|| "?".into()),
                    greeting.version.clone(),
                ),
                InstanceState::Busy { pid } => (
                    pid.map_or("?".into(), |p| p.to_string()),
                    pid.and_then(app_name).unwrap_or_else(|| "?".into()),
                    "(busy: all client slots taken)".into(),
                ),
                InstanceState::Stale => ("-".into(), "-".into(), "(stale: nobody listens)".into()),
            };
            [
                i.prefix.clone(),
                pid,
                app,
                version,
                i.path.display().to_string(),
            ]
        })
        .collect();
    print_table(&["PREFIX", "PID", "APP", "VERSION", "SOCKET"], &rows);
}

fn print_table<const N: usize>(head: &[&str; N], rows: &[[String; N]]) {
    let mut width = head.map(str::len);
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == N {
                s += c;
            } else {
                s += &format!("{c:<w$}  ");
            }
        }
        println!("{}", s.trim_end());
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// Prints one answer; false when it is null (unknown command or bad parameter).
fn show(request: &str, raw: &str, json: bool) -> bool {
    let v: serde_json::Value = serde_json::from_str(raw).unwrap_or_default();
    let (cmd, data) = match v.as_object().and_then(|o| o.iter().next()) {
        Some((k, d)) => (k.clone(), d.clone()),
        None => (String::new(), serde_json::Value::Null),
    };
    if json {
        println!("{raw}");
    } else if data.is_null() {
        eprintln!(
            "pmd-telemetry: {request}: null: an unknown command or a bad parameter (`/` lists \
             the commands, `/help,COMMAND` says what one takes)"
        );
    } else if cmd == "/ethdev/stats" {
        print_stats(&data);
    } else if cmd == "/ethdev/xstats" {
        print_xstats(&data);
    } else {
        println!("{}", pretty(raw));
    }
    !data.is_null()
}

/// `/ethdev/stats` as a table: the port's counters, then each queue with a count.
fn print_stats(d: &serde_json::Value) {
    use pmd::telemetry::ethdev::{QUEUE_STATS as QUEUES, STATS as BASIC};
    for k in BASIC {
        println!("{k:<10} {:>20}", d[k]);
    }
    let q = |k: &str, i: usize| d[k].get(i).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let n = QUEUES
        .iter()
        .map(|k| d[*k].as_array().map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    let busy: Vec<usize> = (0..n)
        .filter(|&i| i == 0 || QUEUES.iter().any(|k| q(k, i) != 0))
        .collect();
    if n == 0 {
        return;
    }
    print!("{:<6}", "queue");
    for k in QUEUES {
        print!(" {k:>14}");
    }
    println!();
    for i in busy {
        print!("{i:<6}");
        for k in QUEUES {
            print!(" {:>14}", q(k, i));
        }
        println!();
    }
}

/// `/ethdev/xstats` as name and value, one a line.
fn print_xstats(d: &serde_json::Value) {
    let Some(m) = d.as_object() else {
        println!("{d}");
        return;
    };
    let w = m.keys().map(String::len).max().unwrap_or(0);
    for (k, v) in m {
        println!("{k:<w$} {v:>20}");
    }
}

/// `--watch`: the same request every `every`, until the instance goes away.
fn watch(client: &Client, request: &str, every: Duration, json: bool) -> Result<ExitCode, Failure> {
    let tty = std::io::stdout().is_terminal() && !json;
    let t0 = Instant::now();
    let mut next = Instant::now();
    loop {
        let raw = match client.request_raw(request) {
            Ok(r) => r,
            Err(ClientError::Closed { .. }) => {
                eprintln!("pmd-telemetry: the instance went away");
                return Ok(ExitCode::SUCCESS);
            }
            Err(e) => return Err(e.to_string().into()),
        };
        if tty {
            // Clear the screen, then the answer under a heading.
            print!("\x1b[H\x1b[2J");
        }
        if !json {
            println!(
                "{request} every {} s, pid {} ({:.1} s)",
                every.as_secs_f64(),
                client.greeting().pid,
                t0.elapsed().as_secs_f64()
            );
        }
        show(request, &raw, json);
        let _ = std::io::stdout().flush();
        next += every;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// Commands from stdin, one a line, until end of input or `quit`.
fn interactive(client: &Client, json: bool) -> Result<ExitCode, Failure> {
    let tty = std::io::stdin().is_terminal();
    let g = client.greeting();
    if tty {
        eprintln!(
            "connected to {} (pid {}{}, {}); `/` lists the commands, `quit` leaves",
            client.path().display(),
            g.pid,
            app_name(g.pid)
                .map(|a| format!(", {a}"))
                .unwrap_or_default(),
            g.version
        );
    }
    let prompt = || {
        if tty {
            print!("--> ");
            let _ = std::io::stdout().flush();
        }
    };
    prompt();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("reading stdin: {e}"))?;
        let line = line.trim();
        if line == "quit" || line == "exit" {
            break;
        }
        if !line.is_empty() {
            let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            let request = request_text(&words);
            match client.request_raw(&request) {
                Ok(raw) => {
                    show(&request, &raw, json);
                }
                Err(e @ ClientError::Closed { .. }) => return Err(e.to_string().into()),
                Err(e) => eprintln!("pmd-telemetry: {e}"),
            }
        }
        prompt();
    }
    Ok(ExitCode::SUCCESS)
}
