//! Giving taken-over netdevs back on the ways out of a process that skip destructors.
//!
//! * Stop signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT), once [`guard_signals`] or
//!   [`on_stop_signal`] ran (`pmd::lcore::StopFlag::on_signals` calls the latter; apps do it
//!   before they open their first port). The signals are read by a thread (signal-hook's
//!   self-pipe), so the work below runs in ordinary code, not in a signal handler. The first
//!   signal sets every registered stop flag: the app stops, closes its ports, and the ports
//!   give their netdevs back. A second signal, or the first when no stop flag is registered,
//!   gives back everything in the registry ([`super::restore_all`]) and only then ends the
//!   process the way the signal's default action would. So a second Ctrl-C never skips the
//!   restore.
//! * A panic: the workspace builds release binaries with `panic = "abort"`, so no destructor
//!   runs. [`install_panic_hook`] (installed by the first take-over, and by
//!   [`guard_signals`]) runs the previous hook (the message), then gives everything back
//!   before the abort. With `panic = "unwind"` the hook leaves the netdevs alone: unwinding
//!   drops the ports, and a panic caught on another thread must not pull the netdev up under
//!   a port that is still running.
//!
//! SIGKILL cannot be caught; a killed process leaves its netdevs down (the take-over warning
//! in the log says how to bring them up by hand).
#![deny(unsafe_code)]

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

/// The signals that stop a process of ours (and, the second time, give the port back and
/// end it).
pub const STOP_SIGNALS: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

/// Stop flags to set on the first stop signal.
static FLAGS: Mutex<Vec<Arc<AtomicBool>>> = Mutex::new(Vec::new());
/// Whether the signal thread runs.
static GUARDED: Mutex<bool> = Mutex::new(false);
/// Whether a stop signal has arrived.
static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The name of a stop signal, for logs.
pub fn signal_name(sig: i32) -> String {
    match sig {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        SIGHUP => "SIGHUP".into(),
        SIGQUIT => "SIGQUIT".into(),
        n => format!("signal {n}"),
    }
}

/// Starts the signal thread for [`STOP_SIGNALS`] (once; later calls do nothing) and the
/// panic hook. Until a stop flag is registered with [`on_stop_signal`], a stop signal gives
/// the netdevs back and ends the process as its default action would.
///
/// # Errors
/// The handlers or the thread could not be set up.
pub fn guard_signals() -> io::Result<()> {
    let mut guarded = lock(&GUARDED);
    if *guarded {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new(STOP_SIGNALS)?;
    std::thread::Builder::new()
        .name("pmd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(sig);
            }
        })?;
    install_panic_hook();
    *guarded = true;
    Ok(())
}

/// As [`guard_signals`], and sets `flag` on the first stop signal.
///
/// # Errors
/// As [`guard_signals`].
pub fn on_stop_signal(flag: Arc<AtomicBool>) -> io::Result<()> {
    guard_signals()?;
    lock(&FLAGS).push(flag);
    Ok(())
}

/// Whether the stop signals are guarded ([`guard_signals`] ran).
pub fn signals_guarded() -> bool {
    *lock(&GUARDED)
}

/// Whether a stop signal has arrived: long waits (`busy=wait`) give up when it has.
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(Ordering::SeqCst)
}

/// What a stop signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Set the stop flags; the app closes its ports.
    Stop,
    /// Give every netdev back, then end the process.
    RestoreAndExit,
}

fn decide(already_requested: bool, have_flags: bool) -> Action {
    if !already_requested && have_flags {
        Action::Stop
    } else {
        Action::RestoreAndExit
    }
}

fn on_signal(sig: i32) {
    let name = signal_name(sig);
    let already = STOP_REQUESTED.swap(true, Ordering::SeqCst);
    let flags = lock(&FLAGS);
    match decide(already, !flags.is_empty()) {
        Action::Stop => {
            for f in flags.iter() {
                f.store(true, Ordering::SeqCst);
            }
            drop(flags);
            if !super::guard::taken_now().is_empty() {
                tracing::info!(target: "pmd::port", "{name}: stopping; the netdevs taken over come back when the ports close (a second signal gives them back and exits at once)");
            }
        }
        Action::RestoreAndExit => {
            drop(flags);
            super::guard::restore_all(&format!("signal {name}"));
            signal_hook::low_level::emulate_default_handler(sig).ok();
            // The default action of every stop signal ends the process; should it not have:
            std::process::exit(128 + sig);
        }
    }
}

/// Installs (once) a panic hook that runs the hook installed before it, then, in builds whose
/// panics abort, gives every taken-over netdev back (waiting at most 200 ms for the registry,
/// in case the panicking thread holds it).
pub fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if cfg!(panic = "abort") {
                restore_on_panic();
            }
        }));
    });
}

/// What the panic hook does before an abort.
fn restore_on_panic() -> Option<usize> {
    super::guard::try_restore_all("panic", Duration::from_millis(200))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_signal_stops_second_restores() {
        assert_eq!(decide(false, true), Action::Stop);
        assert_eq!(decide(true, true), Action::RestoreAndExit);
        // Nobody to tell: behave like the default action, after giving the port back.
        assert_eq!(decide(false, false), Action::RestoreAndExit);
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(SIGINT), "SIGINT");
        assert_eq!(signal_name(SIGQUIT), "SIGQUIT");
        assert_eq!(signal_name(SIGHUP), "SIGHUP");
        assert_eq!(signal_name(SIGTERM), "SIGTERM");
    }

    #[test]
    fn panic_path_with_nothing_taken_restores_nothing() {
        assert_eq!(restore_on_panic(), Some(0));
    }
}
