//! Inline engines: the application's polling threads do the device model's work, as the
//! device-model ports (`emu-mana:`, `emu-mlx5:`) do with `engine=inline`, instead of one
//! thread per engine that busy-polls beside them (on a small machine those threads starve,
//! and the port loses frames).
//!
//! A fake-only mechanism: real rdma-core has no such symbols (hardware needs no CPU), so a
//! program looks them up with `dlsym(RTLD_DEFAULT, ...)` and uses them only when present.
//! Three unversioned exports:
//!
//! ```c
//! void *fake_rdma_kick_open(struct ibv_context *ctx, int is_rx, uint32_t queue_id);
//! void fake_rdma_kick(void *handle);
//! void fake_rdma_kick_close(void *handle);
//! ```
//!
//! * `fake_rdma_kick_open` finds the queue among `ctx`'s objects — MANA: the send QP whose
//!   `sq_id` (`manadv_init_obj`) is `queue_id` for TX, a WQ of an RSS QP's table whose
//!   `wq_id` is `queue_id` for RX; mlx5: the raw-packet QP whose `qp_num` is `queue_id` (its
//!   SQ number) once its SQ is served (RTS) for TX, the WQ whose `wq_num` is `queue_id` (its
//!   RQ number) once it was RDY for RX — and returns a handle on the engine that serves it,
//!   or NULL (`errno = ENOENT`) when there is none (an unknown id, a queue the device does
//!   not serve yet, a disassociated or unknown context). From the first handle on, that
//!   engine runs inline: its thread is stopped and joined, and it stays inline for the
//!   rest of its life (queues created on it later included).
//! * `fake_rdma_kick` does the device's pending work for the handle's queue on the calling
//!   thread ([`EngineCore::kick`]: a try-lock; never blocks; a few nanoseconds when idle).
//!   It takes no lock of the fake: the handle holds the engine itself.
//! * `fake_rdma_kick_close` releases a handle. A handle stays valid until then whatever
//!   happens to its queue, context or engine: a kick after the queue went does nothing
//!   (an RQ kick does the port's receive work, as the engine's thread would, dropping
//!   frames no posted WQE takes), and once the fake has stopped the engine (its last queue
//!   gone) a kick finds no engine ([`Live`]) and the wire is closed as before.
//!
//! Handles count among the live objects (kind `kick`), with no context: the exit report
//! names those a program did not close. The calls are not traced (`FAKE_RDMA_TRACE`
//! records rdma-core's calls, and these are none).
//!
//! One case keeps a thread: an inline engine kept through a servicing (its device's
//! contexts disassociated, no queue left, the wire open) has no queue anybody polls, so a
//! thread steps it ([`Runner::set_queueless`]) and drops what arrives, as the threaded
//! engine does, until a queue is created on it again.

use crate::state::{lock, Kind};
use pmd::emu::thread::{EngineCore, EngineThread, Nic, QueueId, QueueKick};
use pmd::ethdev::DeviceKick;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// An engine while the fake runs it: `None` once the fake has stopped it (its last queue
/// gone). Kick handles may keep the [`EngineCore`] alive longer; the engine inside, with its
/// wire, goes when the fake says, as with a thread.
pub struct Live<E>(Option<E>);

impl<E> std::ops::Deref for Live<E> {
    type Target = E;
    fn deref(&self) -> &E {
        self.0
            .as_ref()
            .expect("the fake touches an engine only while it runs")
    }
}

impl<E> std::ops::DerefMut for Live<E> {
    fn deref_mut(&mut self) -> &mut E {
        self.0
            .as_mut()
            .expect("the fake touches an engine only while it runs")
    }
}

impl<E: Nic> Nic for Live<E> {
    fn step(&mut self) -> usize {
        self.0.as_mut().map_or(0, Nic::step)
    }

    fn describe(&self) -> String {
        self.0
            .as_ref()
            .map_or_else(|| "stopped".to_string(), Nic::describe)
    }

    fn kick(&mut self, queue: QueueId) -> usize {
        self.0.as_mut().map_or(0, |e| e.kick(queue))
    }
}

/// A thread that steps a queueless inline engine (see the module docs).
struct Stepper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Stepper {
    fn start<E: Nic>(core: Arc<EngineCore<Live<E>>>, name: &str) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if core.step() == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Stepper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How one engine of the fake gets its CPU: its own thread (`fakenic-D-P`) until the first
/// kick handle is opened on it, the application's polling threads from then on.
pub struct Runner<E: Nic> {
    core: Arc<EngineCore<Live<E>>>,
    name: String,
    thread: Option<EngineThread<Live<E>>>,
    stepper: Option<Stepper>,
    inline: bool,
}

impl<E: Nic> Runner<E> {
    /// Starts `engine` on a thread named `name`.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn(engine: E, name: String) -> std::io::Result<Self> {
        let core = EngineCore::new(Live(Some(engine)));
        let thread = EngineThread::start(Arc::clone(&core), &name)?;
        Ok(Self {
            core,
            name,
            thread: Some(thread),
            stepper: None,
            inline: false,
        })
    }

    /// The engine and its controls (lock it to reach the engine).
    pub fn core(&self) -> &Arc<EngineCore<Live<E>>> {
        &self.core
    }

    /// Switches the engine to inline (its thread stopped and joined, for good) and returns
    /// what a kick handle holds.
    pub fn go_inline(&mut self) -> Arc<EngineCore<Live<E>>> {
        self.inline = true;
        self.thread = None;
        self.stepper = None;
        Arc::clone(&self.core)
    }

    /// The engine is kept with no queue (a servicing) or gets queues again: an inline
    /// engine is stepped by a thread of its own meanwhile (nobody polls a queue of it).
    pub fn set_queueless(&mut self, queueless: bool) {
        if !self.inline {
            return;
        }
        if !queueless {
            self.stepper = None;
        } else if self.stepper.is_none() {
            match Stepper::start(Arc::clone(&self.core), &self.name) {
                Ok(s) => self.stepper = Some(s),
                Err(e) => eprintln!(
                    "fake-rdma: {}: no thread for the queueless engine ({e}): frames wait on its wire",
                    self.name
                ),
            }
        }
    }

    /// Whether a thread of the fake runs the engine now.
    pub fn has_thread(&self) -> bool {
        self.thread.is_some() || self.stepper.is_some()
    }
}

impl<E: Nic> Drop for Runner<E> {
    fn drop(&mut self) {
        // The threads first (joined: no step in progress), then the engine and its wire,
        // even while kick handles still hold the core.
        self.thread = None;
        self.stepper = None;
        self.core.lock().0 = None;
    }
}

/// What a handle points to.
enum Handle {
    Mana(QueueKick<Live<pmd::emu::mana::Engine>>),
    Mlx5(QueueKick<Live<pmd::emu::mlx5::Engine>>),
}

/// See the module docs. Unversioned; a program finds it with `dlsym(RTLD_DEFAULT, ...)`.
///
/// # Safety
/// `ctx` is NULL or any pointer (only registered contexts are read).
#[no_mangle]
pub unsafe extern "C" fn fake_rdma_kick_open(
    ctx: *mut crate::ffi::ibv_context,
    is_rx: c_int,
    queue_id: u32,
) -> *mut c_void {
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    let c = ctx as usize;
    let h = if st.kind_of(c) != Some(Kind::Context) || st.dead.contains(&c) {
        None
    } else {
        let rx = is_rx != 0;
        match crate::verbs::ctx_of(st, ctx, "fake_rdma_kick_open").family {
            crate::world::Family::Mana => {
                crate::mana::kick_target(st, c, rx, queue_id).and_then(|(dev, port, q)| {
                    let core = st.nics.go_inline(dev, port)?;
                    Some(Handle::Mana(QueueKick::new(core, q)))
                })
            }
            crate::world::Family::Mlx5 { .. } => crate::mlx5::kick_target(st, c, rx, queue_id)
                .and_then(|(dev, q)| {
                    let core = st.mlx5_nics.go_inline(dev)?;
                    Some(Handle::Mlx5(QueueKick::new(core, q)))
                }),
        }
    };
    match h {
        Some(h) => {
            let p = Box::into_raw(Box::new(h));
            // No context: a handle outlives its context (closing the context leaves it).
            st.register(p as usize, Kind::Kick, 0);
            p.cast()
        }
        None => {
            drop(g);
            crate::state::set_errno(libc::ENOENT);
            std::ptr::null_mut()
        }
    }
}

/// See the module docs: the hot call, no lock of the fake.
///
/// # Safety
/// `handle` is NULL (nothing happens) or a handle from [`fake_rdma_kick_open`] not yet
/// closed; it is not checked (that would take the fake's lock).
#[no_mangle]
pub unsafe extern "C" fn fake_rdma_kick(handle: *mut c_void) {
    if handle.is_null() {
        return;
    }
    // SAFETY: the caller's contract: a live handle, a `Box<Handle>` freed only by
    // `fake_rdma_kick_close`, which the caller does not run concurrently with a kick of it.
    match unsafe { &*handle.cast::<Handle>() } {
        Handle::Mana(k) => k.kick(),
        Handle::Mlx5(k) => k.kick(),
    }
}

/// See the module docs. A NULL handle is ignored; anything else that is not an open
/// handle stops the program (a double close).
///
/// # Safety
/// `handle` is NULL or any pointer (only registered handles are freed); no kick of it may
/// run concurrently.
#[no_mangle]
pub unsafe extern "C" fn fake_rdma_kick_close(handle: *mut c_void) {
    if handle.is_null() {
        return;
    }
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    if st.kind_of(handle as usize) != Some(Kind::Kick) {
        crate::state::die(
            "fake_rdma_kick_close",
            &format!("{:#x} is not an open kick handle", handle as usize),
        );
    }
    st.unregister(handle as usize);
    // SAFETY: registered by `fake_rdma_kick_open` as a `Box<Handle>`, unregistered above:
    // freed once. Dropping it may drop the last hold on a stopped engine's core.
    drop(unsafe { Box::from_raw(handle.cast::<Handle>()) });
}
