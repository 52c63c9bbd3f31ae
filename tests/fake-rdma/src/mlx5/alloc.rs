//! Queue buffers and doorbell records as libmlx5 v44 gets them (`buf.c`, `dbrec.c`): from
//! a parent domain's allocators (`MLX5_ALLOC_TYPE_CUSTOM`), else from the context's
//! allocators (`mlx5dv_set_context_attr(BUF_ALLOCATORS)`, `MLX5_ALLOC_TYPE_EXTERNAL`),
//! else page-aligned memory of its own (`MLX5_ALLOC_TYPE_ANON`); doorbell records are
//! cache-line slots of 4 KiB pages obtained the same way (a parent domain's allocators give
//! single 8-byte records instead).

use super::{caps, Mlx5Ctx, PAGE, RES_TYPE_DBR};
use crate::ffi::*;
use crate::pd::Pd;
use crate::state::die;
use std::ffi::c_void;
use std::ptr::null_mut;

/// `IBV_ALLOCATOR_USE_DEFAULT` (verbs.h:2049).
const USE_DEFAULT: *mut c_void = usize::MAX as *mut c_void;

/// Where a buffer came from (`enum mlx5_alloc_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    /// The provider's own memory (`posix_memalign`).
    Anon,
    /// The context's allocators.
    External,
    /// A parent domain's allocators, with the resource type it was asked for.
    Custom {
        /// The parent domain.
        pd: *mut Pd,
        /// `MLX5DV_RES_TYPE_*`.
        res: u64,
    },
}

/// A buffer (`struct mlx5_buf`).
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    /// Start.
    pub ptr: *mut c_void,
    /// Length (`buf->length`: what went through `ibv_dontfork_range`).
    pub len: usize,
    /// Origin (how it is given back).
    pub kind: BufKind,
}

/// `align(x, a)`.
pub fn align(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// The parent domain behind `pd` if it has both allocators (`mlx5_is_custom_alloc`, v44
/// buf.c:392–397).
pub fn custom(pd: *mut Pd) -> Option<&'static mut Pd> {
    if pd.is_null() {
        return None;
    }
    // SAFETY: callers pass a live PD or parent domain (checked against the registry).
    let p = unsafe { &mut *pd };
    (p.is_parent() && p.alloc.is_some() && p.free.is_some()).then_some(p)
}

fn anon(size: usize) -> Option<Buf> {
    // mlx5_alloc_buf: posix_memalign(page, align(size, page)), then ibv_dontfork_range on
    // it (a failure frees it) (v44 buf.c:545–565).
    let len = align(size, PAGE);
    let mut p = null_mut();
    // SAFETY: posix_memalign writes `p` on success only.
    if unsafe { libc::posix_memalign(&mut p, PAGE, len) } != 0 {
        return None;
    }
    if crate::fork::dontfork_range(p, len).is_err() {
        // SAFETY: allocated above, not handed out.
        unsafe { libc::free(p) };
        return None;
    }
    Some(Buf {
        ptr: p,
        len,
        kind: BufKind::Anon,
    })
}

/// `mlx5_free_buf` (v44 buf.c:567–571): `ibv_dofork_range`, then `free`.
fn free_anon(b: Buf) {
    crate::fork::dofork_range(b.ptr, b.len);
    // SAFETY: allocated by `anon` (posix_memalign), given back once.
    unsafe { libc::free(b.ptr) };
}

/// `mlx5_alloc_prefered_buf` for the three types the fake models (v44 buf.c:220–333): a
/// parent domain's `alloc(pd, pd_context, size, alignment, type)` (`USE_DEFAULT` → the
/// provider's own memory), else the context's `alloc(size, data)`, else the provider's own.
/// A NULL from an allocator fails, unless `size` is 0. `None` on failure.
pub fn alloc_buf(m: &Mlx5Ctx, pd: *mut Pd, size: usize, alignment: usize, res: u64) -> Option<Buf> {
    if let Some(p) = custom(pd) {
        let f = p.alloc.expect("custom() checked it");
        // SAFETY: the application registered this allocator for this parent domain; it
        // receives the parent domain, as mlx5_alloc_buf_custom passes it (buf.c:255–276).
        let a = unsafe {
            f(
                p as *mut Pd as *mut ibv_pd,
                p.pd_context,
                size,
                alignment,
                res,
            )
        };
        if a == USE_DEFAULT {
            return anon(size);
        }
        if a.is_null() && size != 0 {
            return None;
        }
        return Some(Buf {
            ptr: a,
            len: size,
            kind: BufKind::Custom { pd: p, res },
        });
    }
    if m.extern_set() {
        let f = m.extern_alloc.alloc.expect("extern_set() checked it");
        // SAFETY: the application registered this allocator for this context with its
        // `data` (mlx5_alloc_buf_extern, buf.c:220–242).
        let a = unsafe { f(size, m.extern_alloc.data) };
        if a.is_null() && size != 0 {
            return None;
        }
        // buf.c:227–233: ibv_dontfork_range on it; a failure gives it back.
        if crate::fork::dontfork_range(a, size).is_err() {
            if let Some(free) = m.extern_alloc.free {
                // SAFETY: `a` came from this context's allocator just now.
                unsafe { free(a, m.extern_alloc.data) };
            }
            return None;
        }
        return Some(Buf {
            ptr: a,
            len: size,
            kind: BufKind::External,
        });
    }
    anon(size)
}

/// `mlx5_free_actual_buf` (v44 buf.c:335–365): back where it came from; the context's
/// `free` is called with the *current* `data`. The provider's own and the context
/// allocators' buffers go through `ibv_dofork_range` first (buf.c:214–218, 567–571).
pub fn free_buf(m: &Mlx5Ctx, b: Buf, call: &str) {
    match b.kind {
        BufKind::Anon => free_anon(b),
        BufKind::External => {
            // mlx5_free_buf_extern (buf.c:214–218): ibv_dofork_range, then the free.
            crate::fork::dofork_range(b.ptr, b.len);
            let Some(f) = m.extern_alloc.free else {
                die(
                    call,
                    "the context's free callback was reset to NULL: real libmlx5 would call it (mlx5_free_buf_extern) and crash",
                );
            };
            // SAFETY: `b.ptr` came from this context's allocator.
            unsafe { f(b.ptr, m.extern_alloc.data) };
        }
        BufKind::Custom { pd, res } => {
            // SAFETY: a parent domain that allocated a live object's buffer outlives it
            // (EBUSY on its dealloc while used); its callbacks were set at creation.
            let p = unsafe { &mut *pd };
            if let Some(f) = p.free {
                // SAFETY: the application's callback, with its own pointer back.
                unsafe { f(pd.cast(), p.pd_context, b.ptr, res) };
            }
        }
    }
}

/// A doorbell record (`__be32 *`), and whether it came from a parent domain
/// (`custom_db`).
#[derive(Debug, Clone, Copy)]
pub struct Dbrec {
    /// Its address (8 bytes: two big-endian words).
    pub ptr: *mut u32,
    /// From a parent domain's allocator (given back there).
    pub custom: Option<*mut Pd>,
}

/// `mlx5_alloc_dbrec` (v44 dbrec.c:87–140): a parent domain's `alloc(pd, ctx, 8, 8, DBR)`
/// (`USE_DEFAULT` → a page slot); else the first page with a free slot (a new page from
/// the context's allocators, or the provider's own, when none has one), the lowest free
/// cache-line slot. `None` on failure (errno untouched, as there).
pub fn alloc_dbrec(m: &mut Mlx5Ctx, pd: *mut Pd) -> Option<Dbrec> {
    if let Some(p) = custom(pd) {
        let f = p.alloc.expect("custom() checked it");
        // SAFETY: the application's allocator for this parent domain.
        let a = unsafe {
            f(
                p as *mut Pd as *mut ibv_pd,
                p.pd_context,
                8,
                8,
                RES_TYPE_DBR,
            )
        };
        if a != USE_DEFAULT {
            if a.is_null() {
                return None;
            }
            return Some(Dbrec {
                ptr: a.cast(),
                custom: Some(p),
            });
        }
    }
    let i = match m.dbr_available.front() {
        Some(&i) => i,
        None => {
            // __add_page (dbrec.c:50–85): one page, from the context's allocators when
            // set (mlx5_alloc_buf_extern), else posix_memalign(page, page).
            let buf = if m.extern_set() {
                alloc_buf(m, null_mut(), PAGE, PAGE, 0)?
            } else {
                anon(PAGE)?
            };
            m.dbr_pages.push(super::DbrPage {
                buf,
                use_cnt: 0,
                free: u64::MAX,
            });
            let i = m.dbr_pages.len() - 1;
            m.dbr_available.push_front(i);
            i
        }
    };
    let per_page = (PAGE / caps::CACHE_LINE) as u32;
    let page = &mut m.dbr_pages[i];
    page.use_cnt += 1;
    if page.use_cnt == per_page {
        m.dbr_available.retain(|&k| k != i);
    }
    let j = page.free.trailing_zeros();
    page.free &= !(1u64 << j);
    let ptr = page
        .buf
        .ptr
        .cast::<u8>()
        .wrapping_add(j as usize * caps::CACHE_LINE);
    Some(Dbrec {
        ptr: ptr.cast(),
        custom: None,
    })
}

/// `mlx5_free_db` (v44 dbrec.c:142–185): a parent domain's record goes back to its `free`;
/// a page slot is released, and the page itself (to the allocator it came from) when its
/// last slot goes. The page is found by the record's address rounded down to a page: a
/// page the allocator did not align is a crash in real libmlx5.
pub fn free_dbrec(m: &mut Mlx5Ctx, db: Dbrec, call: &str) {
    if let Some(pd) = db.custom {
        // SAFETY: as in `free_buf`.
        let p = unsafe { &mut *pd };
        if let Some(f) = p.free {
            // SAFETY: the application's callback, with its own pointer back.
            unsafe { f(pd.cast(), p.pd_context, db.ptr.cast(), RES_TYPE_DBR) };
        }
        return;
    }
    let base = db.ptr as usize & !(PAGE - 1);
    let Some(i) = m.dbr_pages.iter().position(|p| p.buf.ptr as usize == base) else {
        die(
            call,
            "the doorbell-record page the allocator returned is not page-aligned: real libmlx5 looks its page up by the record's address rounded down to 4 KiB, finds none and misbehaves (dbrec.c:162–166)",
        );
    };
    let per_page = (PAGE / caps::CACHE_LINE) as u32;
    let page = &mut m.dbr_pages[i];
    let j = (db.ptr as usize - base) / caps::CACHE_LINE;
    page.free |= 1u64 << j;
    if page.use_cnt == per_page {
        m.dbr_available.push_front(i);
    }
    let page = &mut m.dbr_pages[i];
    page.use_cnt -= 1;
    if page.use_cnt == 0 {
        let buf = page.buf;
        // The page leaves the map; indices above it shift down.
        m.dbr_pages.remove(i);
        m.dbr_available.retain(|&k| k != i);
        for k in m.dbr_available.iter_mut() {
            if *k > i {
                *k -= 1;
            }
        }
        if buf.kind == BufKind::External {
            free_buf(m, buf, call);
        } else {
            free_anon(buf);
        }
    }
}
