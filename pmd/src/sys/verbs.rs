//! The `static inline` functions of `<infiniband/verbs.h>` that the PMD calls, compiled by the
//! C compiler from the installed header and exposed here under their real names.
//!
//! Most extended verbs (`ibv_create_wq`, `ibv_alloc_parent_domain`, `ibv_query_device_ex`, …)
//! are not exported by libibverbs: they exist only as inlines in the header and dispatch
//! through the op table of `struct verbs_context`, which libibverbs lays out *below* the
//! `struct ibv_context` an application holds. An inline first checks that the context is an
//! extended one (`abi_compat == __VERBS_ABI_IS_EXTENDED`, that is `(void *)UINTPTR_MAX`), then
//! that the table is long enough (`sz`) and the slot set, and only then calls the op; otherwise
//! it fails with `EOPNOTSUPP` or falls back to an exported legacy call.
//!
//! `rdma-sys` 0.3.0 re-implements these inlines in Rust, and its context check compares
//! `abi_compat` with `u32::MAX` instead of `UINTPTR_MAX`. On every context libibverbs creates
//! on a 64-bit host the check fails, so its `ibv_alloc_parent_domain`, `ibv_create_wq`,
//! `ibv_create_rwq_ind_table`, `ibv_create_cq_ex`, `ibv_create_flow`, RSS `ibv_create_qp_ex`, …
//! return `EOPNOTSUPP` without reaching the provider, and its `ibv_query_device_ex` always
//! takes the legacy path and leaves the extended attributes unwritten. Its ports also drift
//! from the header in smaller ways (no `memset` before the legacy fallbacks, no `wq_context`
//! copy in `ibv_create_wq`). Instead of porting the header a second time, `build.rs` lets
//! bindgen write one C wrapper per inline (`wrap_static_fns`, wrappers named `<fn>__extern`),
//! compiles them with the header into a static library, and the declarations below link to
//! those wrappers. Whatever rdma-core version the build machine has, these are its inlines.
//!
//! Types are `rdma-sys`'s (bindgen generates only the function declarations here, which name
//! `rdma_sys::ibv_context` and friends), and so are the *exported* libibverbs functions
//! (`ibv_open_device`, `ibv_alloc_pd`, `ibv_create_cq`, …): only the inlines are replaced.
//! Both views come from the same installed header, so the structures the wrappers see and the
//! ones Rust builds agree.
//!
//! # Safety
//!
//! Every function here is the C function of the same name, with its contract: each object
//! pointer must point to a live object of the kind named, obtained from libibverbs (or laid
//! out exactly like one) and not yet destroyed, and attribute pointers must point to
//! initialised attribute structs of the header's layout. The functions that dispatch through
//! the context read `struct verbs_context` below the `ibv_context`, so a context must really
//! be embedded in one when its `abi_compat` says it is extended.

/// Declarations bindgen generated for the `<fn>__extern` wrappers, named like the inlines.
#[allow(
    non_snake_case,
    non_camel_case_types,
    non_upper_case_globals,
    unsafe_op_in_unsafe_fn,
    missing_docs,
    dead_code,
    clippy::all
)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/verbs_inline.rs"));
}

/// `ibv_query_device_ex`: the device's extended attributes through the `query_device_ex` op;
/// `EINVAL` for a non-zero `input->comp_mask`; when the op is missing or answers
/// `EOPNOTSUPP`/`ENOSYS`, zeroes `attr` and fills `attr->orig_attr` with the exported
/// `ibv_query_device`. Returns 0 or an errno value.
pub use ffi::ibv_query_device_ex;

/// `ibv_query_port` (the header's macro for `___ibv_query_port`): the port's attributes
/// through the `query_port` op, or zeroed and filled by the exported compat `ibv_query_port`
/// when the op is missing. Returns 0 or an errno value.
pub use ffi::___ibv_query_port as ibv_query_port;

/// `ibv_alloc_parent_domain`: a parent domain through the `alloc_parent_domain` op; NULL
/// with `errno` set on failure (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_alloc_parent_domain;

/// `ibv_create_cq_ex`: an extended CQ through the `create_cq_ex` op; NULL with `errno` set on
/// failure (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_create_cq_ex;

/// `ibv_cq_ex_to_cq`: the `ibv_cq` at the start of an `ibv_cq_ex` (a pointer cast).
pub use ffi::ibv_cq_ex_to_cq;

/// `ibv_create_wq`: a receive work queue through the `create_wq` op, then the header's own
/// initialisation of the new WQ (`wq_context`, `events_completed`, its mutex and condition
/// variable); NULL with `errno` set on failure (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_create_wq;

/// `ibv_modify_wq`: through the `modify_wq` op of the WQ's context. Returns 0 or an errno
/// value (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_modify_wq;

/// `ibv_destroy_wq`: through the `destroy_wq` op of the WQ's context. Returns 0 or an errno
/// value (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_destroy_wq;

/// `ibv_create_rwq_ind_table`: an RSS indirection table through the `create_rwq_ind_table`
/// op; NULL with `errno` set on failure (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_create_rwq_ind_table;

/// `ibv_destroy_rwq_ind_table`: through the `destroy_rwq_ind_table` op of the table's
/// context. Returns 0 or an errno value (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_destroy_rwq_ind_table;

/// `ibv_create_qp_ex`: when `comp_mask` is exactly `IBV_QP_INIT_ATTR_PD`, the exported
/// `ibv_create_qp`; otherwise (an RSS QP, for one) the `create_qp_ex` op. NULL with `errno`
/// set on failure (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_create_qp_ex;

/// `ibv_create_flow`: a steering rule on a QP through the `ibv_create_flow` op of the QP's
/// context; NULL with `errno` set on failure (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_create_flow;

/// `ibv_destroy_flow`: through the `ibv_destroy_flow` op of the flow's context. Returns 0 or
/// an errno value (`EOPNOTSUPP` when the context has no such op).
pub use ffi::ibv_destroy_flow;

#[cfg(test)]
mod tests;
