//! Sharing a context with another process (rdma-core 31+, `IBVERBS_1.10`):
//! `ibv_import_device`, `ibv_import_pd`, `ibv_import_mr` and their `unimport`s.
//!
//! MANA: the provider has no `import_context`, `import_pd` or `import_mr` (v44
//! providers/mana/mana.c, `mana_ctx_ops`, and the device ops), so libibverbs answers
//! `ibv_import_device` with `EOPNOTSUPP` once it found the device (v44
//! libibverbs/device.c:370–425, 404–407), and the PD/MR imports reach the dummy ops
//! (libibverbs/dummy_ops.c:298–310: NULL, `EOPNOTSUPP`; the `unimport`s do nothing,
//! 482–492). A MANA secondary does not import: it maps the doorbell page from the command
//! descriptor it was passed (see `ibv_open_device`) and uses the primary's objects.
//!
//! mlx5 has all three (`mlx5_import_context`, `mlx5_import_pd`, `mlx5_import_mr`), which
//! ask the kernel for objects of the ucontext behind the descriptor, whichever process made
//! them. The fake's objects live in each process's memory, so it does not model them: the
//! calls fail with `EOPNOTSUPP` and say so on stderr. A deliberate deviation, written here
//! so that nobody takes it for rdma-core's behaviour.
//!
//! `ibv_import_device` checks its descriptor first, as libibverbs does: `fstat` must say a
//! character device whose number is a listed device's (`EINVAL` otherwise, `ENODEV` for no
//! such device). The fake's command descriptors are memfds (see `ibv_open_device`), so the
//! fake recognises its own by name (`/memfd:fake-rdma-uverbs:DEV`) in their place.

use crate::ffi::*;
use crate::state::{addr, call_ptr, Kind};
use crate::verbs::{ctx_of, rescan, Device};
use crate::world::Family;
use serde_json::json;
use std::ffi::c_int;

/// The device whose command file `fd` is, by the memfd's name; `EINVAL` for a descriptor
/// that is not one (libibverbs: not a character device).
fn device_of_cmd_fd(fd: c_int) -> Result<String, c_int> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| libc::EINVAL)?;
    let link = link.to_string_lossy();
    match link
        .strip_prefix("/memfd:")
        .and_then(|n| n.strip_prefix(crate::verbs::UVERBS_MEMFD))
    {
        Some(name) => Ok(name.trim_end_matches(" (deleted)").to_string()),
        // Another character device (`/dev/null`): no listed device has its number.
        None if std::fs::metadata(format!("/proc/self/fd/{fd}")).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_char_device()
        }) =>
        {
            Err(libc::ENODEV)
        }
        None => Err(libc::EINVAL),
    }
}

/// Says once per call name that the fake does not model an mlx5 import.
fn not_modelled(call: &str) -> c_int {
    eprintln!(
        "fake-rdma: {call}: importing mlx5 objects from another process's context is not \
         modelled (the fake keeps its objects per process): EOPNOTSUPP"
    );
    libc::EOPNOTSUPP
}

export!("IBVERBS_1.10" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    call_ptr("ibv_import_device", json!({"cmd_fd": cmd_fd}), |st| {
        let name = device_of_cmd_fd(cmd_fd)?;
        let found = rescan(st).into_iter().find_map(|d| {
            // SAFETY: `rescan` lists leaked `Device` boxes, never freed.
            let d = unsafe { &*(d as *const Device) };
            (d.view.name == name).then_some(d)
        });
        let Some(dev) = found else {
            return Err(libc::ENODEV);
        };
        match dev.view.family {
            // No `import_context` in providers/mana (v44 device.c:404–407).
            Family::Mana => Err(libc::EOPNOTSUPP),
            Family::Mlx5 { .. } => Err(not_modelled("ibv_import_device")),
        }
    })
});

export!("IBVERBS_1.10" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    call_ptr("ibv_import_pd", json!({"context": addr(context), "pd_handle": pd_handle}), |st| {
        match ctx_of(st, context, "ibv_import_pd").family {
            // The dummy op (dummy_ops.c:305–310).
            Family::Mana => Err(libc::EOPNOTSUPP),
            Family::Mlx5 { .. } => Err(not_modelled("ibv_import_pd")),
        }
    })
});

export!("IBVERBS_1.10" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    call_ptr("ibv_import_mr", json!({"pd": addr(pd), "mr_handle": mr_handle}), |st| {
        let ctx = crate::objects::ctx_of_obj(st, pd, &[Kind::Pd, Kind::ParentDomain], "ibv_import_mr");
        match ctx.family {
            // The dummy op (dummy_ops.c:298–303).
            Family::Mana => Err(libc::EOPNOTSUPP),
            Family::Mlx5 { .. } => Err(not_modelled("ibv_import_mr")),
        }
    })
});

export!("IBVERBS_1.10" fn ibv_unimport_pd(pd: *mut ibv_pd) -> () {
    // MANA: the dummy op does nothing (dummy_ops.c:490–492). No PD of the fake was
    // imported (the imports above fail), so there is nothing to undo on mlx5 either; a
    // pointer that is no PD of the fake stops the program, as it would crash libibverbs.
    let g = crate::state::lock();
    let st = g.as_ref().expect("state initialised by lock()");
    let _ = crate::objects::ctx_of_obj(st, pd, &[Kind::Pd, Kind::ParentDomain], "ibv_unimport_pd");
});

export!("IBVERBS_1.10" fn ibv_unimport_mr(mr: *mut ibv_mr) -> () {
    // As `ibv_unimport_pd` (dummy_ops.c:486–488).
    let g = crate::state::lock();
    let st = g.as_ref().expect("state initialised by lock()");
    let _ = crate::objects::ctx_of_obj(st, mr, &[Kind::Mr], "ibv_unimport_mr");
});
