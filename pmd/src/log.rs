//! Logging set-up: `tracing` with a filter taken from the `PMD_LOG` environment variable.
//!
//! `PMD_LOG` uses `tracing-subscriber`'s `EnvFilter` syntax, with targets following DPDK's
//! log-topic scheme: `PMD_LOG=info`, `PMD_LOG=pmd::mana=debug,mempool=warn`. Logs go to
//! stderr so that stdout stays clean for reports and `--json`.
#![deny(unsafe_code)]

/// The environment variable that holds the log filter.
pub const ENV: &str = "PMD_LOG";

/// Installs the global subscriber: `PMD_LOG` if set and valid, otherwise `default_filter`.
///
/// Calling it more than once (or after another subscriber was set) does nothing.
/// An invalid `PMD_LOG` is reported on stderr and `default_filter` is used instead.
pub fn init(default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var(ENV) {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!("{ENV}={v:?} is not a valid log filter ({e}); using {default_filter:?}");
            EnvFilter::new(default_filter)
        }),
        _ => EnvFilter::new(default_filter),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        // Colours only for a terminal: logs piped to a file or a script stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
