//! Giving taken-over netdevs back on the ways out of a process that skip destructors.
//!
//! * Stop signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT), once [`guard_signals`] or
//!   [`on_stop_signal`] ran (`pmd::lcore::StopFlag::on_signals` calls the latter; apps do it
//!   before they open their first port). The signals are read by a thread (signal-hook's
//!   self-pipe), so the work below runs in ordinary code, not in a signal handler. The first
//!   signal sets every registered stop flag: the app stops, closes its ports (giving their
//!   netdevs back, removing their cable files) and prints its report. A second signal never
//!   skips that cleanup: it asks the app to hurry ([`hurry_requested`]: drains are cut
//!   short) and starts a watchdog that, if the process is still alive [`HURRY_GRACE`] later
//!   (a loop that does not check its flag), gives back everything in the registry
//!   ([`super::restore_all`]) and ends the process the way the signal's default action
//!   would. A third signal, or the first when no stop flag is registered, does that at once.
//!   So no stop signal ever skips the netdev restore.
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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

/// The signals that stop a process of ours (and, the second time, give the port back and
/// end it).
pub const STOP_SIGNALS: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

/// Stop flags to set on the first stop signal.
static FLAGS: Mutex<Vec<Arc<AtomicBool>>> = Mutex::new(Vec::new());
/// Whether the signal thread runs.
static GUARDED: Mutex<bool> = Mutex::new(false);
/// Stop signals received so far.
static SIGNALS_SEEN: AtomicUsize = AtomicUsize::new(0);

/// How long after a second stop signal a process that has not finished its cleanup is ended
/// (netdevs given back first).
pub const HURRY_GRACE: Duration = Duration::from_secs(10);

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
    SIGNALS_SEEN.load(Ordering::SeqCst) > 0
}

/// Whether a second stop signal has arrived: the app should finish its cleanup without
/// waiting for in-flight frames (drains, child processes).
pub fn hurry_requested() -> bool {
    SIGNALS_SEEN.load(Ordering::SeqCst) > 1
}

/// What a stop signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Set the stop flags; the app closes its ports.
    Stop,
    /// Set the stop flags again, ask the app to hurry, and end the process after
    /// [`HURRY_GRACE`] if it is still running then.
    Hurry,
    /// Give every netdev back, then end the process.
    RestoreAndExit,
}

/// What the `n`-th stop signal (1-based) does.
fn decide(n: usize, have_flags: bool) -> Action {
    match (n, have_flags) {
        (_, false) => Action::RestoreAndExit,
        (1, true) => Action::Stop,
        (2, true) => Action::Hurry,
        _ => Action::RestoreAndExit,
    }
}

fn restore_and_exit(sig: i32, why: &str) -> ! {
    super::guard::restore_all(why);
    signal_hook::low_level::emulate_default_handler(sig).ok();
    // The default action of every stop signal ends the process; should it not have:
    std::process::exit(128 + sig);
}

fn on_signal(sig: i32) {
    let name = signal_name(sig);
    let n = SIGNALS_SEEN.fetch_add(1, Ordering::SeqCst) + 1;
    let flags = lock(&FLAGS);
    match decide(n, !flags.is_empty()) {
        Action::Stop => {
            for f in flags.iter() {
                f.store(true, Ordering::SeqCst);
            }
            drop(flags);
            if !super::guard::taken_now().is_empty() {
                tracing::info!(target: "pmd::port", "{name}: stopping; the netdevs taken over come back when the ports close (a second signal gives them back and exits at once)");
            }
        }
        Action::Hurry => {
            for f in flags.iter() {
                f.store(true, Ordering::SeqCst);
            }
            drop(flags);
            tracing::warn!(target: "pmd::port", "second stop signal ({name}): finishing the cleanup without draining; a third signal, or {} s without finishing, ends the process at once (netdevs given back first)", HURRY_GRACE.as_secs());
            let late = format!("signal {name}, cleanup not finished");
            let spawned = std::thread::Builder::new()
                .name("pmd-hurry".into())
                .spawn(move || {
                    std::thread::sleep(HURRY_GRACE);
                    restore_and_exit(sig, &late);
                });
            if spawned.is_err() {
                restore_and_exit(sig, &format!("signal {name}"));
            }
        }
        Action::RestoreAndExit => {
            drop(flags);
            restore_and_exit(sig, &format!("signal {name}"));
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
    fn first_signal_stops_second_hurries_third_restores() {
        assert_eq!(decide(1, true), Action::Stop);
        assert_eq!(decide(2, true), Action::Hurry);
        assert_eq!(decide(3, true), Action::RestoreAndExit);
        assert_eq!(decide(9, true), Action::RestoreAndExit);
        // Nobody to tell: behave like the default action, after giving the port back.
        assert_eq!(decide(1, false), Action::RestoreAndExit);
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
