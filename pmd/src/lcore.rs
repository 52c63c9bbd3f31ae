//! Logical cores: pin worker threads to CPU cores, run one closure per core, keep the calling
//! thread as the main core (statistics, control), and stop everything on SIGINT, SIGTERM,
//! SIGHUP or SIGQUIT.
//!
//! ```
//! use pmd::lcore::{CoreList, StopFlag, launch};
//! let cores: CoreList = "0".parse().unwrap();
//! let stop = StopFlag::new();
//! let loops = launch(&cores, &stop, |lcore| {
//!     let mut n = 0u64;
//!     while !lcore.stop.is_set() && n < 1000 { n += 1; }
//!     n
//! }, |stop| stop.set()).unwrap();
//! assert_eq!(loops.len(), 1);
//! ```
#![deny(unsafe_code)]

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Errors of the lcore runtime.
#[derive(Debug, thiserror::Error)]
pub enum LcoreError {
    /// A core list that does not parse.
    #[error("bad core list '{0}': expected comma-separated cores and ranges, e.g. 0-3,6")]
    BadList(String),
    /// A core that this machine (or this process's CPU affinity) does not have.
    #[error("core {core} does not exist here: the usable cores are {available}")]
    NoSuchCore {
        /// The missing core.
        core: usize,
        /// The cores this process may run on.
        available: String,
    },
    /// The OS refused to pin a thread.
    #[error("could not pin a thread to core {0}")]
    PinFailed(usize),
    /// The signal handlers could not be installed.
    #[error("could not install SIGINT/SIGTERM/SIGHUP/SIGQUIT handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// A worker panicked (only with `panic = "unwind"`; release builds abort instead).
    #[error("the worker on core {0} panicked")]
    WorkerPanicked(usize),
}

/// A list of CPU cores, in the order given, without duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreList(Vec<usize>);

impl CoreList {
    /// The cores.
    pub fn cores(&self) -> &[usize] {
        &self.0
    }

    /// Checks every core against the cores this process may run on.
    ///
    /// # Errors
    /// [`LcoreError::NoSuchCore`] for the first core that is not available.
    pub fn validate(&self) -> Result<(), LcoreError> {
        let avail = available_cores();
        for &c in &self.0 {
            if !avail.contains(&c) {
                return Err(LcoreError::NoSuchCore {
                    core: c,
                    available: format_ranges(&avail),
                });
            }
        }
        Ok(())
    }
}

impl FromStr for CoreList {
    type Err = LcoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || LcoreError::BadList(s.to_string());
        let mut cores = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                ),
                None => {
                    let c: usize = part.parse().map_err(|_| bad())?;
                    (c, c)
                }
            };
            if lo > hi || hi > 4095 {
                return Err(bad());
            }
            for c in lo..=hi {
                if cores.contains(&c) {
                    return Err(bad());
                }
                cores.push(c);
            }
        }
        Ok(CoreList(cores))
    }
}

impl fmt::Display for CoreList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_ranges(&self.0))
    }
}

fn format_ranges(cores: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The cores this process may run on, ascending.
pub fn available_cores() -> Vec<usize> {
    let mut v: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    v.sort_unstable();
    v
}

/// A shared stop request, set by the main core, by a worker, or by a stop signal.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag on SIGINT, SIGTERM, SIGHUP or SIGQUIT. A second signal still lets the
    /// app clean up, only faster ([`crate::takeover::exit::hurry_requested`]); a third, or a
    /// cleanup that takes longer than [`crate::takeover::exit::HURRY_GRACE`] after the
    /// second, ends the process at once, but only after every netdev taken over is given back
    /// ([`crate::takeover::exit`]); a stop signal also ends a `busy=wait`.
    /// Call it before opening the first port, so no moment leaves a taken-over netdev
    /// unguarded.
    ///
    /// # Errors
    /// [`LcoreError::Signals`] if a handler cannot be installed.
    pub fn on_signals(&self) -> Result<(), LcoreError> {
        crate::takeover::exit::on_stop_signal(Arc::clone(&self.0)).map_err(LcoreError::Signals)
    }

    /// Whether a stop was requested. A relaxed load: cheap enough for every loop iteration.
    #[inline]
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Requests a stop.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a worker closure gets: who it is and when to stop.
#[derive(Debug, Clone)]
pub struct Lcore {
    /// 0-based index in the core list.
    pub index: usize,
    /// The CPU core this thread is pinned to.
    pub core: usize,
    /// Poll this and return when it is set.
    pub stop: StopFlag,
}

/// Runs `worker` on one thread per core of `cores`, each pinned to its core, and `main` on the
/// calling thread (the main core: statistics, control). When `main` returns, the stop flag is
/// set and the workers are joined; their results come back in core-list order.
///
/// # Errors
/// [`LcoreError::NoSuchCore`] before anything starts if a core does not exist;
/// [`LcoreError::PinFailed`] if pinning fails (all workers are stopped and joined first).
pub fn launch<R, W, M>(
    cores: &CoreList,
    stop: &StopFlag,
    worker: W,
    main: M,
) -> Result<Vec<R>, LcoreError>
where
    R: Send,
    W: Fn(Lcore) -> R + Sync,
    M: FnOnce(&StopFlag),
{
    let unit = vec![(); cores.cores().len()];
    launch_each(cores, stop, unit, |lcore, ()| worker(lcore), main)
}

/// As [`launch`], handing each worker its own state (queue handles, buffers): `per_core[i]`
/// moves to the thread of core `i`. Nothing is shared unless the state shares it.
///
/// # Errors
/// As [`launch`].
///
/// # Panics
/// If `per_core` does not have one element per core.
pub fn launch_each<S, R, W, M>(
    cores: &CoreList,
    stop: &StopFlag,
    per_core: Vec<S>,
    worker: W,
    main: M,
) -> Result<Vec<R>, LcoreError>
where
    S: Send,
    R: Send,
    W: Fn(Lcore, S) -> R + Sync,
    M: FnOnce(&StopFlag),
{
    assert_eq!(per_core.len(), cores.cores().len(), "one state per core");
    cores.validate()?;
    let pin_failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let handles: Vec<_> = cores
            .cores()
            .iter()
            .zip(per_core)
            .enumerate()
            .map(|(index, (&core, state))| {
                let lcore = Lcore {
                    index,
                    core,
                    stop: stop.clone(),
                };
                let worker = &worker;
                let pin_failed = &pin_failed;
                std::thread::Builder::new()
                    .name(format!("lcore-{core}"))
                    .spawn_scoped(scope, move || {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                            pin_failed.store(true, Ordering::Relaxed);
                            lcore.stop.set();
                            return Err(LcoreError::PinFailed(core));
                        }
                        tracing::debug!(target: "pmd::lcore", core, index, "worker started");
                        Ok(worker(lcore, state))
                    })
                    .expect("spawning a thread")
            })
            .collect();
        if !pin_failed.load(Ordering::Relaxed) {
            main(stop);
        }
        stop.set();
        cores
            .cores()
            .iter()
            .zip(handles)
            .map(|(&core, h)| {
                h.join()
                    .map_err(|_| LcoreError::WorkerPanicked(core))
                    .and_then(|r| r)
            })
            .collect::<Result<Vec<R>, LcoreError>>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn parses_lists_and_ranges() {
        assert_eq!("0".parse::<CoreList>().unwrap().cores(), [0]);
        assert_eq!("0-2,5".parse::<CoreList>().unwrap().cores(), [0, 1, 2, 5]);
        assert_eq!(" 3 , 1 ".parse::<CoreList>().unwrap().cores(), [3, 1]);
        assert_eq!(
            "0-2,5,6".parse::<CoreList>().unwrap().to_string(),
            "0-2,5-6"
        );
        for bad in ["", "a", "1-", "3-1", "0,0", "0-2,1", "99999"] {
            let e = bad.parse::<CoreList>().unwrap_err();
            assert!(e.to_string().contains("bad core list"), "{bad}: {e}");
        }
    }

    #[test]
    fn refuses_a_core_that_does_not_exist() {
        let cores: CoreList = "4000".parse().unwrap();
        let e = launch(&cores, &StopFlag::new(), |_| (), |_| ()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("core 4000 does not exist") && msg.contains("usable cores are 0"),
            "{msg}"
        );
    }

    #[test]
    fn workers_run_pinned_until_main_returns() {
        let avail = available_cores();
        let list: CoreList = format_ranges(&avail).parse().unwrap();
        let started = AtomicU64::new(0);
        let stop = StopFlag::new();
        let res = launch(
            &list,
            &stop,
            |lc| {
                started.fetch_add(1, Ordering::SeqCst);
                let mut spins = 0u64;
                while !lc.stop.is_set() {
                    spins += 1;
                    std::hint::spin_loop();
                }
                (
                    lc.index,
                    lc.core,
                    core_affinity::get_core_ids().map(|v| v.len()),
                    spins,
                )
            },
            |stop| {
                while started.load(Ordering::SeqCst) < avail.len() as u64 {
                    std::thread::yield_now();
                }
                assert!(!stop.is_set());
            },
        )
        .unwrap();
        assert_eq!(res.len(), avail.len());
        for (i, (index, core, ids, _)) in res.into_iter().enumerate() {
            assert_eq!((index, core), (i, avail[i]));
            // A pinned thread sees exactly one core in its affinity mask.
            assert_eq!(ids, Some(1));
        }
        assert!(stop.is_set());
    }

    #[test]
    fn a_worker_can_stop_everyone() {
        let list: CoreList = available_cores()[0].to_string().parse().unwrap();
        let stop = StopFlag::new();
        let r = launch(
            &list,
            &stop,
            |lc| lc.stop.set(),
            |stop| {
                while !stop.is_set() {
                    std::thread::yield_now();
                }
            },
        );
        assert!(r.is_ok());
    }

    #[test]
    fn each_worker_gets_its_own_state() {
        let list: CoreList = available_cores()[0].to_string().parse().unwrap();
        let r = launch_each(
            &list,
            &StopFlag::new(),
            vec![String::from("mine")],
            |lc, s| format!("{s}@{}", lc.core),
            |_| (),
        )
        .unwrap();
        assert_eq!(r, [format!("mine@{}", available_cores()[0])]);
    }

    #[test]
    fn sigterm_sets_the_flag() {
        let stop = StopFlag::new();
        stop.on_signals().unwrap();
        signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
        let t0 = std::time::Instant::now();
        while !stop.is_set() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::yield_now();
        }
        assert!(stop.is_set());
    }
}
