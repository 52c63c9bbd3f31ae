//! Doorbell monitors: a per-queue copy of the doorbell page that the fake's MANA device
//! model reads, so that no doorbell is lost when the queues of one context ring the shared
//! page from several threads or processes.
//!
//! Why: every queue of a MANA context rings the context's one doorbell page (libmana's
//! `manadv_init_obj` hands all of them the same `db_page`). Hardware takes each doorbell
//! write as an event; the model can only sample the page, so a value a sibling queue
//! overwrote before the model looked is missed until that queue rings again (see
//! `pmd::emu::mana`). Inline engines (`crate::kick`) close that gap by kicking after each
//! first fill; an engine on its own thread (a port whose queue pairs another process polls,
//! which the primary's polling threads cannot kick for) cannot, and an RQ whose first
//! doorbell is missed never receives. The device model's own ports solve this with a
//! monitor per queue, which the driver's doorbell writes too (`pmd::sys::Doorbell`); this
//! export gives queues over the fake the same, in a place another process can map: the
//! context's command file, whose page 0 is the doorbell page.
//!
//! A fake-only mechanism, like the kick handles: real rdma-core has no such symbol, so a
//! program looks it up with `dlsym(RTLD_DEFAULT, ...)` and uses it only when present; on
//! hardware the driver rings the page alone.
//!
//! ```c
//! /* A monitor page for a queue of `ctx` (a send QP's sq_id, or with is_rx a WQ's wq_id,
//!  * as manadv_init_obj reports them); its offset in the command file in *offset. NULL
//!  * with errno ENOENT for a queue the device does not serve, EINVAL for an mlx5 context
//!  * (its doorbell records are per queue already). */
//! void *fake_rdma_db_monitor(struct ibv_context *ctx, int is_rx, uint32_t queue_id,
//!                            uint64_t *offset);
//! ```
//!
//! From the first monitor on, the model reads the context's doorbells through the monitors
//! only: a program asks for one for every queue of the context, before it first rings. The
//! model reads a monitor while its queue is on the device (until `ibv_destroy_qp` of the
//! send QP or of the RSS QP that holds the WQ, or a disassociation); the page stays mapped,
//! and its slot taken, until the context is closed, so that a late write of the program's
//! lands nowhere harmful. Not traced, as the kick calls.

use crate::state::{lock, Kind};
use std::ffi::{c_int, c_void};

/// See the module docs. Unversioned; a program finds it with `dlsym(RTLD_DEFAULT, ...)`.
///
/// # Safety
/// `ctx` is NULL or any pointer (only registered contexts are read); `offset` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn fake_rdma_db_monitor(
    ctx: *mut crate::ffi::ibv_context,
    is_rx: c_int,
    queue_id: u32,
    offset: *mut u64,
) -> *mut c_void {
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    let c = ctx as usize;
    let r = if st.kind_of(c) != Some(Kind::Context) || st.dead.contains(&c) {
        Err(libc::ENOENT)
    } else {
        let cx = crate::verbs::ctx_of(st, ctx, "fake_rdma_db_monitor");
        match cx.family {
            crate::world::Family::Mana => {
                let cmd_fd = cx.vctx.context.cmd_fd;
                let rx = is_rx != 0;
                match crate::mana::kick_target(st, c, rx, queue_id) {
                    Some(_) => st.nics.monitor(c, cmd_fd, rx, queue_id),
                    None => Err(libc::ENOENT),
                }
            }
            crate::world::Family::Mlx5 { .. } => Err(libc::EINVAL),
        }
    };
    match r {
        Ok((m, off)) => {
            if !offset.is_null() {
                // SAFETY: the caller's contract: writable when not NULL.
                unsafe { *offset = off };
            }
            m.as_ptr().cast()
        }
        Err(e) => {
            drop(g);
            crate::state::set_errno(e);
            std::ptr::null_mut()
        }
    }
}
