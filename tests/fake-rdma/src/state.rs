//! The fake's process-wide state: configuration from the environment, the registry of live
//! objects, per-call counters for fault injection, and the JSON-lines call trace.
//!
//! Every exported call runs under one lock ([`call_ptr`], [`call_int`]). The user's queue-buffer allocator is
//! called with the lock held, so an allocator must not call back into verbs (none does).

use crate::ffi::ibv_context;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::c_int;
use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, MutexGuard};

/// Which rdma-core the fake behaves as (`FAKE_RDMA_PROFILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// rdma-core v44.0 (Debian bookworm): the default.
    V44,
    /// rdma-core main at 691953d8d502 (providers/mana after 34 more commits).
    Main,
}

/// One injected failure: the `nth` call (1-based; `None` = every call) of `call` fails with
/// `errno` at the point where rdma-core would have asked the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Exported function name, e.g. `ibv_create_cq`.
    pub call: String,
    /// Which call fails; `None` for all of them.
    pub nth: Option<u64>,
    /// The errno it fails with.
    pub errno: c_int,
}

/// Names of the errno values fault injection accepts (or any number).
const ERRNOS: &[(&str, c_int)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("EIO", libc::EIO),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("ENODEV", libc::ENODEV),
    ("EINVAL", libc::EINVAL),
    ("ENOSPC", libc::ENOSPC),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("ETIMEDOUT", libc::ETIMEDOUT),
];

/// Parses an errno name (`ENOMEM`) or number (`12`).
pub fn parse_errno(s: &str) -> Option<c_int> {
    ERRNOS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s))
        .map(|&(_, e)| e)
        .or_else(|| s.parse().ok().filter(|&e| e > 0))
}

/// Parses `FAKE_RDMA_FAIL`: `CALL[#N]:ERRNO[,CALL[#N]:ERRNO...]`.
///
/// # Errors
/// The entry that does not parse.
pub fn parse_faults(s: &str) -> Result<Vec<Fault>, String> {
    let mut faults = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (target, errno) = item
            .rsplit_once(':')
            .ok_or_else(|| format!("`{item}`: expected CALL[#N]:ERRNO"))?;
        let errno = parse_errno(errno).ok_or_else(|| format!("`{item}`: unknown errno"))?;
        let (call, nth) = match target.split_once('#') {
            Some((c, n)) => (
                c,
                Some(
                    n.parse::<u64>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("`{item}`: #N must be 1 or more"))?,
                ),
            ),
            None => (target, None),
        };
        faults.push(Fault {
            call: call.to_string(),
            nth,
            errno,
        });
    }
    Ok(faults)
}

/// The configuration read from the environment once, at the first call.
#[derive(Debug)]
pub struct Config {
    /// `FAKE_RDMA_PROFILE`.
    pub profile: Profile,
    /// `FAKE_RDMA_FAIL`.
    pub faults: Vec<Fault>,
    /// `SYSFS_PATH` (as libibverbs reads it), default `/sys`.
    pub sysfs: std::path::PathBuf,
    /// `FAKE_RDMA_BUSY_ERRNO`: what a raw QP on a vPort held by the netdev fails with:
    /// `ENODEV` (default: released kernels, where mana_ib_create_qp_raw turns every vPort
    /// error into it) or `EBUSY` (newer kernels, which pass mana_cfg_vport's EBUSY through).
    pub busy_errno: c_int,
}

/// A knob the fake cannot use: the program stops with status 2 at its first verbs call
/// (a usage error, not a crash: no core dump).
fn die_config(msg: &str) -> ! {
    eprintln!("fake-rdma: {msg}");
    std::process::exit(2)
}

impl Config {
    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let profile = match var("FAKE_RDMA_PROFILE").as_deref() {
            None | Some("v44") => Profile::V44,
            Some("main") => Profile::Main,
            Some(o) => die_config(&format!("FAKE_RDMA_PROFILE={o}: use v44 or main")),
        };
        let faults = match var("FAKE_RDMA_FAIL") {
            None => Vec::new(),
            Some(s) => {
                parse_faults(&s).unwrap_or_else(|e| die_config(&format!("FAKE_RDMA_FAIL: {e}")))
            }
        };
        let busy_errno = match var("FAKE_RDMA_BUSY_ERRNO").as_deref() {
            None | Some("ENODEV") => libc::ENODEV,
            Some("EBUSY") => libc::EBUSY,
            Some(o) => die_config(&format!("FAKE_RDMA_BUSY_ERRNO={o}: use ENODEV or EBUSY")),
        };
        Config {
            profile,
            faults,
            busy_errno,
            sysfs: var("SYSFS_PATH").unwrap_or_else(|| "/sys".into()).into(),
        }
    }
}

/// What a registered object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ibv_context` (the address is the `struct ibv_context` the caller holds).
    Context,
    /// A protection domain.
    Pd,
    /// A parent domain (user-space only).
    ParentDomain,
    /// A memory region.
    Mr,
    /// A completion queue.
    Cq,
    /// A receive work queue.
    Wq,
    /// A receive indirection table.
    IndTable,
    /// A queue pair.
    Qp,
    /// A flow steering rule.
    Flow,
    /// A kick handle (`fake_rdma_kick_open`, the fake's own; registered with no context).
    Kick,
}

impl Kind {
    /// The name used in messages and the trace.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Context => "context",
            Kind::Pd => "pd",
            Kind::ParentDomain => "parent_domain",
            Kind::Mr => "mr",
            Kind::Cq => "cq",
            Kind::Wq => "wq",
            Kind::IndTable => "rwq_ind_table",
            Kind::Qp => "qp",
            Kind::Flow => "flow",
            Kind::Kick => "kick",
        }
    }
}

/// A registered object: its kind and the context it belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Its kind.
    pub kind: Kind,
    /// Address of its context's `ibv_context` (0 for a kick handle, which outlives it).
    pub ctx: usize,
}

/// The process-wide state.
pub struct State {
    /// Configuration.
    pub cfg: Config,
    /// Live objects by the address of their public verbs struct.
    pub objects: BTreeMap<usize, Entry>,
    /// Calls seen so far, by name (for `#N` faults).
    calls: HashMap<&'static str, u64>,
    /// The next kernel object id / key.
    next_id: u32,
    trace: Option<File>,
    seq: u64,
    /// Every device the list ever held (addresses of boxed devices, which live as long as
    /// the process: a program may keep an `ibv_device` of a device that went away).
    pub devices: Vec<usize>,
    /// The devices the last look at the tree found (`ibv_get_device_list`); `None` before
    /// the first look.
    pub listed: Option<Vec<usize>>,
    /// Contexts disassociated from their device by a servicing (`events.rs`): the kernel
    /// destroyed their objects; commands fail with `EIO`, destroys succeed.
    pub dead: BTreeSet<usize>,
    /// The device model behind the MANA queues: one engine per vPort.
    pub nics: crate::nic::Nics,
    /// The device model behind the mlx5 queues: one engine per device (one port each).
    pub mlx5_nics: crate::nic_mlx5::Mlx5Nics,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The lock over the state, created from the environment on first use.
pub fn lock() -> MutexGuard<'static, Option<State>> {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        let trace = std::env::var("FAKE_RDMA_TRACE")
            .ok()
            .filter(|p| !p.is_empty())
            .map(|p| {
                File::options()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .unwrap_or_else(|e| die_config(&format!("FAKE_RDMA_TRACE={p}: {e}")))
            });
        *g = Some(State {
            cfg: Config::from_env(),
            objects: BTreeMap::new(),
            calls: HashMap::new(),
            next_id: 1,
            trace,
            seq: 0,
            devices: Vec::new(),
            listed: None,
            dead: BTreeSet::new(),
            nics: Default::default(),
            mlx5_nics: Default::default(),
        });
    }
    g
}

impl State {
    /// A fresh kernel id (queue ids, keys, handles).
    pub fn next_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Where rdma-core asks the kernel on behalf of context `ctx`: `EIO` once the context was
    /// disassociated from its device (kernel `ib_uverbs_remove_one` → `ib_uverbs_free_hw_resources`:
    /// a new object's `alloc_uobj` gets `EIO` from `ib_uverbs_get_ucontext_file`, a command on
    /// an object gets it from `rdma_lookup_get_uobject`, every mode but DESTROY; destroys take
    /// [`State::disassociated`] instead), else the injected failure of `call`, if any.
    ///
    /// # Errors
    /// `EIO`, or the injected errno.
    pub fn kernel(&mut self, ctx: *mut ibv_context, call: &'static str) -> Result<(), c_int> {
        if self.disassociated(ctx) {
            return Err(libc::EIO);
        }
        self.fault(call)
    }

    /// Whether context `ctx` was disassociated from its device (a servicing): its hardware
    /// objects are gone, and the kernel lets destroy commands through without touching
    /// them (kernel `rdma_lookup_get_uobject` exempts `UVERBS_LOOKUP_DESTROY` from its
    /// `EIO`; `uverbs_destroy_uobject` skips an object already destroyed), so a destroy
    /// succeeds and libibverbs' provider frees its user-space part.
    pub fn disassociated(&self, ctx: *mut ibv_context) -> bool {
        self.dead.contains(&(ctx as usize))
    }

    /// An injected failure point with no context (the device open) or in user space: fails
    /// with the injected errno if a fault for `call` matches this call.
    ///
    /// # Errors
    /// The injected errno.
    pub fn fault(&mut self, call: &'static str) -> Result<(), c_int> {
        let n = self.calls.entry(call).or_insert(0);
        *n += 1;
        let n = *n;
        match self
            .cfg
            .faults
            .iter()
            .find(|f| f.call == call && f.nth.unwrap_or(n) == n)
        {
            Some(f) => Err(f.errno),
            None => Ok(()),
        }
    }

    /// Registers a live object.
    pub fn register(&mut self, addr: usize, kind: Kind, ctx: usize) {
        self.objects.insert(addr, Entry { kind, ctx });
    }

    /// Removes a live object.
    pub fn unregister(&mut self, addr: usize) {
        self.objects.remove(&addr);
    }

    /// The kind of a live object, if `addr` is one.
    pub fn kind_of(&self, addr: usize) -> Option<Kind> {
        self.objects.get(&addr).map(|e| e.kind)
    }

    /// Live objects by kind, for the trace and the hook.
    pub fn live_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for e in self.objects.values() {
            *m.entry(e.kind.name()).or_insert(0) += 1;
        }
        m
    }

    fn trace(&mut self, call: &str, args: Value, ret: Value, errno: c_int) {
        self.seq += 1;
        let seq = self.seq;
        if let Some(f) = &mut self.trace {
            let line = json!({"seq": seq, "call": call, "args": args, "ret": ret, "errno": errno});
            // A trace that cannot be written is not worth failing the program for.
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// An address as the trace shows it.
pub fn addr<T>(p: *const T) -> Value {
    Value::String(format!("{:#x}", p as usize))
}

/// Prints why the program is stopped (a call that would crash real rdma-core, or undefined
/// behaviour the fake caught) and aborts.
pub fn die(call: &str, msg: &str) -> ! {
    eprintln!("fake-rdma: {call}: {msg}");
    std::process::abort()
}

/// Runs a call that returns an object: `Ok(p)` is returned, `Err(e)` returns NULL with
/// `errno = e`. The call is traced.
pub fn call_ptr<T>(
    name: &'static str,
    args: Value,
    f: impl FnOnce(&mut State) -> Result<*mut T, c_int>,
) -> *mut T {
    crate::guard::check_once();
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    let r = f(st);
    let (p, e) = match r {
        Ok(p) => (p, 0),
        Err(e) => (std::ptr::null_mut(), e),
    };
    st.trace(name, args, addr(p), e);
    drop(g);
    if e != 0 {
        set_errno(e);
    }
    p
}

/// Runs a call that returns an `int` the rdma-core way (0, or an errno value as the result;
/// a few calls return other values, passed through as `Ok`). `errno` is also set on error,
/// as the providers leave it.
pub fn call_int(
    name: &'static str,
    args: Value,
    f: impl FnOnce(&mut State) -> Result<c_int, c_int>,
) -> c_int {
    crate::guard::check_once();
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    let (ret, e) = match f(st) {
        Ok(v) => (v, 0),
        Err(e) => (e, e),
    };
    st.trace(name, args, json!(ret), e);
    drop(g);
    if e != 0 {
        set_errno(e);
    }
    ret
}
