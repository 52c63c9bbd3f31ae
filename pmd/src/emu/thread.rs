//! Running a device model's engine, whatever the NIC. An engine only has to say how to make
//! one pass ([`Nic::step`]) and, for the inline mode, how to do one queue's work
//! ([`Nic::kick`]). The engine sits behind a lock ([`EngineCore`]) and runs in one of three
//! ways ([`EngineMode`]):
//!
//! * **thread**: its own thread ([`EngineThread`]) busy-polls it while there is work and backs
//!   off when idle. The device works whether or not anyone polls its queues, like a NIC;
//!   costs a CPU while traffic flows.
//! * **inline**: no thread. A provider hands each raw queue a [`QueueKick`] (an
//!   [`ethdev::DeviceKick`](crate::ethdev::DeviceKick)) and the thread that polls the queue
//!   does the device's work for it: after a TX doorbell, before an RX poll
//!   ([`EngineCore::kick`]). A process then needs no thread beyond its polling cores.
//! * **stepped** (tests): either of the above [paused](EngineCore::pause), driven one pass at
//!   a time with [`EngineCore::step`].
//!
//! Used by the models (`emu::mana::Model`, `emu::mlx5::Model`) and by anything that puts an
//! engine behind queues it owns itself (the fake rdma-core: threaded, until the verbs
//! provider asks it for kick handles through its own symbols, see `sys::fake_kick`; then
//! inline).
#![deny(unsafe_code)]

use crate::ethdev::DeviceKick;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a device model's engine gets its CPU (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineMode {
    /// Its own thread.
    #[default]
    Thread,
    /// The threads that poll its queues, through their kicks.
    Inline,
}

impl EngineMode {
    /// The forms [`EngineMode`] parses from, for error messages.
    pub const EXPECTED: &'static str = "inline or thread";
    /// The environment variable that sets the engine of device-model ports whose devargs do
    /// not say (`engine=`).
    pub const ENV: &'static str = "PMD_EMU_ENGINE";

    /// The mode `PMD_EMU_ENGINE` names, else `default`. An unknown value is ignored with a
    /// warning.
    pub fn from_env_or(default: EngineMode) -> EngineMode {
        match std::env::var(Self::ENV) {
            Ok(v) => v.parse().unwrap_or_else(|_| {
                tracing::warn!(target: "pmd::emu", "{}={v:?}: expected {}; using {default}", Self::ENV, Self::EXPECTED);
                default
            }),
            Err(_) => default,
        }
    }
}

impl std::str::FromStr for EngineMode {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "thread" => Ok(Self::Thread),
            "inline" => Ok(Self::Inline),
            _ => Err(()),
        }
    }
}

impl std::fmt::Display for EngineMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Thread => "thread",
            Self::Inline => "inline",
        })
    }
}

/// A queue of an engine, as a kick names it: by its id (the id its doorbells carry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueId {
    /// A send queue.
    Sq(u32),
    /// A receive queue.
    Rq(u32),
}

/// What an engine thread or an inline kick runs: a device model's engine.
pub trait Nic: Send + 'static {
    /// One pass over every queue and the wire; returns the work done (0: idle, the thread
    /// may back off).
    fn step(&mut self) -> usize;
    /// A short description for `Debug` output (the wire, the queue counts).
    fn describe(&self) -> String;
    /// The device's work for one queue, done on the thread that polls it (inline mode): for
    /// a send queue, every WQE its doorbell announced; for a receive queue, frames from the
    /// wire into the posted buffers. Returns the work done. The default makes a whole pass.
    fn kick(&mut self, queue: QueueId) -> usize {
        let _ = queue;
        self.step()
    }
}

/// An engine behind its lock, with the flags its thread obeys. Shared by the thread and
/// every handle on it.
pub struct EngineCore<E: Nic> {
    engine: Mutex<E>,
    stop: AtomicBool,
    paused: AtomicBool,
    /// Kicks so far (written under the engine lock only): the link watch runs every
    /// [`KICKS_PER_WATCH`] of them.
    kicks: AtomicU32,
    /// When an inline kick last ran the watch.
    kick_watched: Mutex<Instant>,
    /// Called by the thread with the engine locked, about every `.0` (see [`set_watch`]).
    ///
    /// [`set_watch`]: EngineCore::set_watch
    watch: Mutex<Option<(Duration, Watch<E>)>>,
}

/// What the engine thread calls now and then with the engine locked (the model's link
/// watch: the far end of its wire attaching or going away).
pub type Watch<E> = Box<dyn FnMut(&E) + Send>;

impl<E: Nic> std::fmt::Debug for EngineCore<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EngineCore({})", self.lock().describe())
    }
}

/// An inline engine looks at the clock (for its link watch) once per this many kicks: a
/// clock read costs about as much as an idle kick, so this is a few percent of the idle
/// kicks' time, and a polling core that sleeps between idle polls (the tools' back-off)
/// still looks about every millisecond.
const KICKS_PER_WATCH: u32 = 64;

impl<E: Nic> EngineCore<E> {
    /// An engine with no thread: drive it with [`kick`](Self::kick) (inline mode) or
    /// [`step`](Self::step).
    pub fn new(engine: E) -> Arc<Self> {
        Arc::new(Self {
            engine: Mutex::new(engine),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            kicks: AtomicU32::new(0),
            kick_watched: Mutex::new(Instant::now()),
            watch: Mutex::new(None),
        })
    }

    /// The device's work for `queue`, on the calling thread (an inline engine, see the module
    /// docs); returns the work done.
    ///
    /// Never blocks: when another thread holds the engine (a kick of another queue on another
    /// core, or a slow-path call: counters, queue set-up), or the engine is paused, it does
    /// nothing and returns 0, and the queue's next burst kicks again. The lock is therefore
    /// uncontended by design on the datapath: the cores that poll one port's queues take
    /// turns, and nobody waits. About every `KICKS_PER_WATCH` kicks it also runs the link
    /// watch (see [`set_watch`](Self::set_watch)) when its period is due.
    pub fn kick(&self, queue: QueueId) -> usize {
        let mut e = match self.engine.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return 0,
        };
        if self.paused.load(Ordering::Relaxed) {
            return 0;
        }
        let work = e.kick(queue);
        // Written under the engine lock only: a plain load and store.
        let k = self.kicks.load(Ordering::Relaxed).wrapping_add(1);
        self.kicks.store(k, Ordering::Relaxed);
        if k.is_multiple_of(KICKS_PER_WATCH) {
            self.watch_from_kick(&e);
        }
        work
    }

    /// Runs the watch if its period is due; never waits for a lock (the thread's loop takes
    /// the watch lock before the engine lock, a kick holds the engine lock already).
    #[cold]
    fn watch_from_kick(&self, e: &E) {
        let (Ok(mut w), Ok(mut last)) = (self.watch.try_lock(), self.kick_watched.try_lock())
        else {
            return;
        };
        if let Some((every, f)) = w.as_mut() {
            if last.elapsed() >= *every {
                *last = Instant::now();
                f(e);
            }
        }
    }

    /// The engine, locked: add or remove queues and memory regions, read counters. While
    /// the guard lives the engine thread runs no step, so a queue removed under it is never
    /// touched again once the guard is dropped.
    pub fn lock(&self) -> MutexGuard<'_, E> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the engine thread from running steps (it keeps sleeping); drive with [`step`].
    /// When this returns no step of the thread is in progress and none starts until
    /// [`resume`]: the thread reads the flag under the engine lock.
    ///
    /// [`step`]: EngineCore::step
    /// [`resume`]: EngineCore::resume
    pub fn pause(&self) {
        let _engine = self.lock();
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Lets the engine thread run again.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// One engine pass; returns the work done.
    pub fn step(&self) -> usize {
        self.lock().step()
    }

    /// Steps until a pass does nothing (at most `max` passes); returns the total work.
    pub fn run_until_idle(&self, max: usize) -> usize {
        let mut total = 0;
        for _ in 0..max {
            let w = self.step();
            if w == 0 {
                break;
            }
            total += w;
        }
        total
    }

    /// Changes the engine with `f`, then runs the watch at once (taking the watch lock
    /// first, as the thread's loop does), so that what `f` changed that the watch reports (a
    /// link-down fault) is reported now, not at the next look.
    pub fn update(&self, f: impl FnOnce(&mut E)) {
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        let mut e = self.lock();
        f(&mut e);
        if let Some((_, watch)) = w.as_mut() {
            watch(&e);
        }
    }

    /// Has the engine thread call `f` with the engine locked about every `every` (when idle,
    /// or every 1024 passes while busy, so the clock is rarely read under load); an inline
    /// engine's kicks do the same, every `KICKS_PER_WATCH` kicks.
    pub fn set_watch(&self, every: Duration, f: Watch<E>) {
        *self.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some((every, f));
    }

    /// The thread's loop: busy-polls while there is work, backs off (spin, yield, then
    /// sleeps growing to 200 µs) when idle so it can share a small machine.
    fn run(&self) {
        let mut idle = 0u32;
        let mut passes = 0u32;
        let mut watched = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            passes = passes.wrapping_add(1);
            if idle >= 128 || passes.is_multiple_of(1024) {
                let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((every, f)) = w.as_mut() {
                    if watched.elapsed() >= *every {
                        watched = Instant::now();
                        f(&self.lock());
                    }
                }
            }
            let work = {
                // Read under the lock, so `pause()` (which sets it under the lock) is never
                // followed by a step of this thread.
                let mut e = self.lock();
                if self.paused.load(Ordering::Relaxed) {
                    0
                } else {
                    e.step()
                }
            };
            if work > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < 64 {
                std::hint::spin_loop();
            } else if idle < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(u64::from((idle - 127).min(200))));
            }
        }
    }
}

/// A kick that does the device's work for one queue of an engine on the polling thread: what
/// an inline engine's provider puts into a raw queue description.
pub struct QueueKick<E: Nic> {
    core: Arc<EngineCore<E>>,
    queue: QueueId,
}

impl<E: Nic> QueueKick<E> {
    /// The kick of `queue` of `core`'s engine.
    pub fn new(core: Arc<EngineCore<E>>, queue: QueueId) -> Self {
        Self { core, queue }
    }
}

impl<E: Nic> DeviceKick for QueueKick<E> {
    #[inline]
    fn kick(&self) {
        self.core.kick(self.queue);
    }
}

/// An engine running on its own thread. Dropping it stops and joins the thread; the
/// engine (and every queue and memory view in it) lives on while an [`EngineCore`] handle
/// does.
///
/// ```
/// use pmd::emu::mana::{Engine, EngineThread};
/// use pmd::emu::wire::NoWire;
/// let nic = EngineThread::spawn(Engine::new(Box::new(NoWire)), "doc-nic")?;
/// nic.core().lock().set_mtu(9000);
/// assert_eq!(nic.core().lock().queue_counts(), (0, 0));
/// drop(nic); // the thread is joined here
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct EngineThread<E: Nic> {
    core: Arc<EngineCore<E>>,
    thread: Option<JoinHandle<()>>,
}

impl<E: Nic> std::fmt::Debug for EngineThread<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineThread")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl<E: Nic> EngineThread<E> {
    /// Starts a thread named `name` (Linux keeps its first 15 bytes) that runs `engine`.
    /// When this returns the thread runs, under its name.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn(engine: E, name: &str) -> std::io::Result<Self> {
        Self::start(EngineCore::new(engine), name)
    }

    /// Starts a thread named `name` that runs the engine of `core`.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(core: Arc<EngineCore<E>>, name: &str) -> std::io::Result<Self> {
        let t = Arc::clone(&core);
        let (started, running) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                // std names the thread before it runs this closure.
                let _ = started.send(());
                t.run()
            })?;
        // Only a thread that died before its first statement fails to answer.
        let _ = running.recv();
        Ok(Self {
            core,
            thread: Some(thread),
        })
    }

    /// The engine and its controls.
    pub fn core(&self) -> &Arc<EngineCore<E>> {
        &self.core
    }
}

impl<E: Nic> Drop for EngineThread<E> {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
