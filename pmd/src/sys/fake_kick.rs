//! Kicks of the fake rdma-core's device model: where the loaded libibverbs is the project's
//! fake (tests and CI), its device model can do a queue's work on the thread that polls
//! the queue, as the device-model ports' inline engines do (see `ethdev::kick`), instead of
//! on threads of its own that starve a small machine.
//!
//! The fake exports three unversioned C symbols; real rdma-core has none, so on hardware
//! [`open`] finds nothing and every queue's kick is `None`: no call, no cost.
//!
//! ```c
//! void *fake_rdma_kick_open(struct ibv_context *ctx, int is_rx, uint32_t queue_id);
//! void  fake_rdma_kick(void *handle);        /* the queue's device work, now; never blocks */
//! void  fake_rdma_kick_close(void *handle);
//! ```
//!
//! `PMD_FAKE_KICK=0` leaves them unused (the fake's engines then keep their threads).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr::NonNull;
use std::sync::OnceLock;

type OpenFn = unsafe extern "C" fn(*mut c_void, c_int, u32) -> *mut c_void;
type HandleFn = unsafe extern "C" fn(*mut c_void);

/// The three entry points, all found or none.
#[derive(Clone, Copy)]
struct Entry {
    open: OpenFn,
    kick: HandleFn,
    close: HandleFn,
}

/// Looks `name` up in the process's global symbol scope.
fn lookup(name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the loaded
    // objects' symbol tables.
    NonNull::new(unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) })
}

fn entry() -> Option<Entry> {
    static ENTRY: OnceLock<Option<Entry>> = OnceLock::new();
    *ENTRY.get_or_init(|| {
        if std::env::var_os("PMD_FAKE_KICK").is_some_and(|v| v == "0") {
            return None;
        }
        let open = lookup(c"fake_rdma_kick_open")?;
        let kick = lookup(c"fake_rdma_kick")?;
        let close = lookup(c"fake_rdma_kick_close")?;
        tracing::debug!(target: "pmd::verbs", "the loaded libibverbs is the fake rdma-core: its device model runs on the polling threads");
        // SAFETY: the fake defines these symbols with exactly these C signatures (module
        // docs); a symbol of that name in any other library would be a name clash we do not
        // defend against (no real library exports `fake_rdma_*`).
        unsafe {
            Some(Entry {
                open: std::mem::transmute::<*mut c_void, OpenFn>(open.as_ptr()),
                kick: std::mem::transmute::<*mut c_void, HandleFn>(kick.as_ptr()),
                close: std::mem::transmute::<*mut c_void, HandleFn>(close.as_ptr()),
            })
        }
    })
}

/// One queue's kick through the fake: an open handle, closed on drop.
pub struct Handle {
    handle: NonNull<c_void>,
    entry: Entry,
}

// SAFETY: the handle is an opaque token the fake made for use from any thread (its kick is
// a try-lock on the engine); it is closed exactly once, in `Drop`.
unsafe impl Send for Handle {}
// SAFETY: as above; `kick` takes `&self` and the fake synchronises internally.
unsafe impl Sync for Handle {}

impl Handle {
    /// The queue's device work, now, on this thread (never blocks).
    #[inline]
    pub fn kick(&self) {
        // SAFETY: the handle is open until `Drop`.
        unsafe { (self.entry.kick)(self.handle.as_ptr()) }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fake_kick::Handle({:p})", self.handle)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: opened by `fake_rdma_kick_open`, closed once.
        unsafe { (self.entry.close)(self.handle.as_ptr()) }
    }
}

type MonitorFn = unsafe extern "C" fn(*mut c_void, c_int, u32, *mut u64) -> *mut c_void;

/// A doorbell monitor page for queue `queue_id` (a send queue, or with `is_rx` a receive
/// queue) of the MANA verbs context `ctx`, when the loaded libibverbs is the fake: a copy of
/// the doorbell page that this queue's doorbells are written to as well, which the fake's
/// device model reads, so that it misses none of them while sibling queues (of this process
/// or another) ring the shared page (the fake's `fake_rdma_db_monitor`, its `src/monitor.rs`).
/// Returns the page (one page, mapped by the fake until the context is closed) and its
/// offset in the context's command file, or the fake's errno. `None` on real rdma-core.
///
/// # Safety
/// `ctx` is an open verbs context.
pub unsafe fn db_monitor(
    ctx: *mut c_void,
    is_rx: bool,
    queue_id: u32,
) -> Option<Result<(NonNull<u8>, u64), i32>> {
    static ENTRY: OnceLock<Option<MonitorFn>> = OnceLock::new();
    let f = (*ENTRY.get_or_init(|| {
        let p = lookup(c"fake_rdma_db_monitor")?;
        // SAFETY: the fake defines the symbol with exactly this C signature (its
        // `src/monitor.rs`); no real library exports `fake_rdma_*`.
        Some(unsafe { std::mem::transmute::<*mut c_void, MonitorFn>(p.as_ptr()) })
    }))?;
    let mut offset = 0u64;
    // SAFETY: `ctx` is open (caller); the fake returns NULL for a queue it does not know and
    // writes `offset` otherwise.
    let p = unsafe { f(ctx, c_int::from(is_rx), queue_id, &mut offset) };
    Some(match NonNull::new(p.cast::<u8>()) {
        Some(p) => Ok((p, offset)),
        None => Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)),
    })
}

/// The kick of queue `queue_id` (a send queue, or with `is_rx` a receive queue) of the verbs
/// context `ctx` (a `struct ibv_context *`), when the loaded libibverbs is the fake and
/// knows the queue; `None` otherwise (always, on real rdma-core).
///
/// # Safety
/// `ctx` is an open verbs context.
pub unsafe fn open(ctx: *mut c_void, is_rx: bool, queue_id: u32) -> Option<Handle> {
    let e = entry()?;
    // SAFETY: `ctx` is open (caller); the fake returns NULL for a queue it does not know.
    let h = unsafe { (e.open)(ctx, c_int::from(is_rx), queue_id) };
    let handle = NonNull::new(h)?;
    Some(Handle { handle, entry: e })
}
