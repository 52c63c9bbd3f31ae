//! The hardware control path over rdma-core (feature `verbs`): owned handles for the verbs
//! objects a raw-packet port needs, and the providers built on them.
//!
//! * [`objects`]: RAII handles for context, PD, parent domain, MR, CQ, WQ, indirection table
//!   and QP. Each handle holds its parents (a QP its CQ and domain, a domain its context), so
//!   objects are destroyed in the order rdma-core requires (QP, indirection table, WQ, CQ, MR,
//!   parent domain, PD, context) however the handles are dropped, also half-way through a
//!   failed bring-up. Every failure is a [`VerbsError`] naming the call, the object, the errno
//!   and what to do.
//! * [`manadv`]: the MANA direct-verbs calls: queue-buffer allocators backed by our memory
//!   (`manadv_set_context_attr`) and the raw queue descriptions (`manadv_init_obj`).
//! * [`mana`]: the MANA provider (`mana:` ports), implementing [`crate::mana::Provider`].
//! * [`mlx5dv`]: the mlx5 direct-verbs calls: the same allocators
//!   (`mlx5dv_set_context_attr`), `mlx5dv_query_device`, compressed CQs (`mlx5dv_create_cq`)
//!   and the raw queue descriptions (`mlx5dv_init_obj`).
//! * [`mlx5`]: the mlx5 provider (`mlx5:` ports), implementing [`crate::mlx5::Provider`].
//! * [`events`]: the context's asynchronous events (`ibv_get_async_event`), fetched,
//!   acknowledged and mapped to [`crate::ethdev::PortEvent`]s for one port.
//!
//! The unsafe FFI lives in `objects`, `alloc`, `manadv`, `mlx5dv` and `events` only; the
//! providers are safe code.

mod alloc;
pub mod events;
pub mod mana;
pub mod manadv;
pub mod mlx5;
pub mod mlx5dv;
pub mod objects;

pub use objects::{Context, Cq, Domain, Flow, FlowMatch, IndTable, Mr, ParentDomain, Pd, Qp, Wq};

use std::io;

/// A verbs call failed.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed on {object}: {source}; {hint}")]
pub struct VerbsError {
    /// The rdma-core call.
    pub call: &'static str,
    /// What it was creating or acting on (e.g. "tx queue 0 QP on mana_0 port 1").
    pub object: String,
    /// The errno.
    #[source]
    pub source: io::Error,
    /// A sentence a user can act on.
    pub hint: String,
}

impl VerbsError {
    /// The error of `call` on `object` with `errno`, with the usual advice for that errno.
    pub fn new(call: &'static str, object: impl Into<String>, errno: i32) -> Self {
        Self {
            call,
            object: object.into(),
            source: io::Error::from_raw_os_error(errno),
            hint: hint(call, errno).to_string(),
        }
    }

    /// The errno value.
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(0)
    }
}

/// What a user can do about `errno` from `call`.
fn hint(call: &str, errno: i32) -> &'static str {
    match errno {
        libc::EPERM | libc::EACCES if call.contains("qp") || call.contains("wq") => {
            "raw-packet queues need CAP_NET_RAW: run as root, or grant the binary \
             cap_net_raw,cap_ipc_lock (setcap cap_net_raw,cap_ipc_lock+ep BINARY)"
        }
        libc::EPERM | libc::EACCES => {
            "permission denied on /dev/infiniband/uverbs*: run as root or add the user to \
             the group owning the device"
        }
        libc::ENOMEM if call.contains("reg_mr") => {
            "pinning memory failed: raise the locked-memory limit (ulimit -l unlimited, or \
             LimitMEMLOCK=infinity for a service) or register less memory"
        }
        libc::ENOMEM => "out of memory (or of device resources): use fewer or smaller queues",
        libc::EINVAL => {
            "the device refused the attributes: check queue sizes against what pmd-devices \
             reports, and that rdma-core and the kernel's mana_ib are recent (rdma-core v44+)"
        }
        libc::EOPNOTSUPP | libc::ENOSYS => {
            "this rdma-core or kernel does not support the call: install rdma-core v44 or \
             newer and load mana_ib"
        }
        libc::ENODEV | libc::ENXIO => {
            "the device went away or is held by another user: check pmd-devices and dmesg"
        }
        libc::EBUSY => "the object is in use: another process or the kernel holds it",
        libc::EAGAIN => "the device is out of resources for now: retry, or use fewer queues",
        _ => "see dmesg for the kernel's reason",
    }
}

/// The MTU of the kernel netdev `name` (under [`crate::devices::sysfs_root`]), if readable.
/// On both MANA and mlx5 the device drops frames larger than the netdev's MTU.
pub(crate) fn netdev_mtu(name: &str) -> Option<u32> {
    let path = crate::devices::sysfs_root()
        .join("class/net")
        .join(name)
        .join("mtu");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
}

/// The largest MTU of the kernel netdev `name` (its `maxmtu`, over rtnetlink), where the
/// devices are the system's own (sysfs at [`crate::devices::DEFAULT_SYSFS_ROOT`]: a sysfs
/// tree elsewhere describes devices whose netdevs the kernel may not have); `None` when the
/// kernel does not say.
pub(crate) fn netdev_max_mtu(name: &str) -> Option<u32> {
    if crate::devices::sysfs_root() != std::path::Path::new(crate::devices::DEFAULT_SYSFS_ROOT) {
        return None;
    }
    crate::sys::net::if_max_mtu(name).ok().flatten()
}

/// The errno of an int-returning verbs call: rdma-core returns the errno itself (positive),
/// `-1` with `errno` set, or (some v44 destroy paths) a negative errno.
pub(crate) fn ret_errno(ret: i32) -> i32 {
    match ret {
        -1 => io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
        r if r < 0 => -r,
        r => r,
    }
}

/// Makes memory registration fork-safe for the whole process (`ibv_fork_init`), once; later
/// calls return the first answer. Must come before the first registration. Returns what
/// rdma-core says of the process afterwards: enabled, or unneeded (the kernel copies pinned
/// pages on fork, 5.13 and later).
///
/// # Errors
/// `ibv_fork_init` failed (for instance `EINVAL` after memory was already registered).
pub fn fork_init() -> Result<ForkSafety, VerbsError> {
    static DONE: std::sync::OnceLock<Result<ForkSafety, i32>> = std::sync::OnceLock::new();
    let r = DONE.get_or_init(|| {
        let ret = objects::fork_init();
        if ret != 0 {
            return Err(ret_errno(ret));
        }
        let s = match objects::fork_status() {
            rdma_sys::IBV_FORK_UNNEEDED => ForkSafety::Unneeded,
            rdma_sys::IBV_FORK_ENABLED => ForkSafety::Enabled,
            _ => ForkSafety::Disabled,
        };
        tracing::info!(target: "pmd::verbs", status = ?s, "ibv_fork_init: memory registration is fork-safe");
        Ok(s)
    });
    r.map_err(|e| VerbsError::new("ibv_fork_init", "the process", e))
}

/// What rdma-core says of fork safety (`ibv_is_fork_initialized`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkSafety {
    /// Registered memory is marked so that a child does not share it.
    Enabled,
    /// The kernel copies pinned pages on fork: nothing to do.
    Unneeded,
    /// Not fork-safe.
    Disabled,
}

/// What the installed rdma-core offers for sharing a port between processes (a primary that
/// opens the device and secondaries that attach to its objects), looked up at run time:
/// `(symbol, present)` for `ibv_import_device` (a secondary rebuilds the context from the
/// primary's command fd, passed over a Unix socket with `SCM_RIGHTS`; then `ibv_import_pd` and
/// `ibv_import_mr` attach the PD and the registrations; rdma-core 31, `IBVERBS_1.10`; MANA's
/// provider has no `import_context`, so on MANA the call fails with `EOPNOTSUPP` even where
/// the symbol is there), and mlx5's object export (rdma-core 63, `MLX5_1.27`:
/// `_mlx5dv_get_export_sizes`, behind the inline `mlx5dv_get_export_sizes`, and the
/// export/import pairs of VAR, DEVX object and DEVX umem). Reported by `pmd-devices`; no
/// datapath uses them: secondaries import nothing (MANA's map the doorbell page from the
/// primary's command fd, mlx5's the UAR pages; see `pmd::mp`), and the datapath has no DEVX
/// object or VAR to export.
pub fn multi_process_support() -> Vec<(&'static str, bool)> {
    [
        (c"ibv_import_device", "ibv_import_device"),
        (c"ibv_import_pd", "ibv_import_pd"),
        (c"ibv_import_mr", "ibv_import_mr"),
        (c"_mlx5dv_get_export_sizes", "mlx5dv_get_export_sizes"),
        (c"mlx5dv_var_export", "mlx5dv_var_export"),
        (c"mlx5dv_var_import", "mlx5dv_var_import"),
        (c"mlx5dv_devx_obj_export", "mlx5dv_devx_obj_export"),
        (c"mlx5dv_devx_obj_import", "mlx5dv_devx_obj_import"),
        (c"mlx5dv_devx_umem_export", "mlx5dv_devx_umem_export"),
        (c"mlx5dv_devx_umem_import", "mlx5dv_devx_umem_import"),
    ]
    .into_iter()
    .map(|(c, n)| (n, objects::has_symbol(c)))
    .collect()
}
