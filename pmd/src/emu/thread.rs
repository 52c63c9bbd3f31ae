//! Running a device model's engine on its own thread, whatever the NIC: the engine behind a
//! lock, a thread that busy-polls it while there is work and backs off when idle, and pause /
//! step controls for tests. An engine only has to say how to make one pass ([`Nic::step`]).
//! Used by the models (`emu::mana::Model`, `emu::mlx5::Model`) and by anything that puts an
//! engine behind queues it owns itself (the fake rdma-core).
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What an engine thread runs: a device model's engine, one pass at a time.
pub trait Nic: Send + 'static {
    /// One pass over every queue and the wire; returns the work done (0: idle, the thread
    /// may back off).
    fn step(&mut self) -> usize;
    /// A short description for `Debug` output (the wire, the queue counts).
    fn describe(&self) -> String;
}

/// An engine behind its lock, with the flags its thread obeys. Shared by the thread and
/// every handle on it.
pub struct EngineCore<E: Nic> {
    engine: Mutex<E>,
    stop: AtomicBool,
    paused: AtomicBool,
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

impl<E: Nic> EngineCore<E> {
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

    /// Has the engine thread call `f` with the engine locked about every `every` (when idle,
    /// or every 1024 passes while busy, so the clock is rarely read under load).
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
        let core = Arc::new(EngineCore {
            engine: Mutex::new(engine),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            watch: Mutex::new(None),
        });
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
