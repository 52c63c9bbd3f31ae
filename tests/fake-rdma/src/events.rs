//! Asynchronous events: the context's `async_fd` becomes readable when the world says that a
//! port's link went down or up, or that the device failed; `ibv_get_async_event` then
//! returns the events in order, `ibv_ack_async_event` accepts them, and `ibv_query_port`
//! reports the port down while its link is.
//!
//! Knobs (files a test writes while the program runs; see RULES.md):
//! * `<ibdev_path>/ports/N/fake_rdma_link`: `down` takes port N's link down; `up`, anything
//!   else, or no file: up.
//! * `<ibdev_path>/fake_rdma_fatal`: `1` makes the device fail (`IBV_EVENT_DEVICE_FATAL`,
//!   once per context); `removed` removes it: `DEVICE_FATAL` (if not raised yet), then the
//!   event channel closes, as on a hot removal: once the queued events are fetched,
//!   `ibv_get_async_event` fails with `EIO` and the descriptor stays readable (the kernel
//!   polls `EPOLLERR` there; `ib_uverbs_event_read`, `ib_uverbs_event_poll`).
//!
//! A watcher thread, started with the first context, reads the knobs every
//! [`WATCH_INTERVAL`] and queues an event on every open context of the device for each
//! change it sees, as the kernel does (every uverbs file of a device receives its port and
//! fatal events; the RDMA core's `ib_dispatch_port_state_event` reports a port only when its
//! state changed). A context starts from the state at its open: no event for a port that
//! was already down.
//!
//! The descriptor is an eventfd in semaphore mode holding one count per queued event, so it
//! is readable exactly while events wait (level-triggered, as the kernel's event file polls
//! `EPOLLIN` while its list is not empty) and honours `O_NONBLOCK` the way the real one does:
//! libibverbs' `ibv_get_async_event` is a `read` of the descriptor, so it blocks until an
//! event arrives, or fails with `EAGAIN` when the application made the descriptor
//! non-blocking (rdma-core v44.0 libibverbs/device.c:452–496, man page
//! ibv_get_async_event(3)).

use crate::ffi::*;
use crate::state::{die, set_errno};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_int;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

/// The link knob, in a port's sysfs directory.
pub const LINK_FILE: &str = "fake_rdma_link";
/// The fatal-error knob, in the device's sysfs directory.
pub const FATAL_FILE: &str = "fake_rdma_fatal";
/// How often the watcher reads the knobs.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// One open context, as the watcher sees it.
struct Watched {
    /// The context's async fd (an eventfd, semaphore mode).
    fd: c_int,
    /// `<root>/class/infiniband/<dev>`.
    ibdev: PathBuf,
    /// Link state last reported, per port (index = port - 1).
    link_up: Vec<bool>,
    /// The fatal event was queued.
    fatal: bool,
    /// The channel is closed (device removed): no new events; reads fail with EIO once
    /// the queue is empty. The eventfd then holds one extra count that is never taken.
    closed: bool,
    /// Events not yet fetched: (`ibv_event_type`, element: the port number, 0 for the device).
    queue: VecDeque<(ibv_event_type, c_int)>,
}

impl Watched {
    fn push(&mut self, event_type: ibv_event_type, element: c_int) {
        if self.closed {
            return;
        }
        self.queue.push_back((event_type, element));
        signal(self.fd);
    }
}

/// Open contexts by the address of their `ibv_context`.
static CONTEXTS: Mutex<BTreeMap<usize, Watched>> = Mutex::new(BTreeMap::new());
static WATCHER: Once = Once::new();

fn contexts() -> MutexGuard<'static, BTreeMap<usize, Watched>> {
    CONTEXTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `<ibdev>/ports/<port>/fake_rdma_link` says up (`down` is the only way down).
pub fn link_up(ibdev: &Path, port: u8) -> bool {
    std::fs::read_to_string(ibdev.join(format!("ports/{port}/{LINK_FILE}")))
        .map_or(true, |s| s.trim() != "down")
}

/// What `<ibdev>/fake_rdma_fatal` says of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// No knob (or another value): working.
    Ok,
    /// `1`: failed.
    Fatal,
    /// `removed`: failed and gone.
    Removed,
}

/// Reads `<ibdev>/fake_rdma_fatal`.
pub fn health(ibdev: &Path) -> Health {
    match std::fs::read_to_string(ibdev.join(FATAL_FILE)) {
        Ok(s) if s.trim() == "1" => Health::Fatal,
        Ok(s) if s.trim() == "removed" => Health::Removed,
        _ => Health::Ok,
    }
}

/// Adds one count to an eventfd.
fn signal(fd: c_int) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to the context's eventfd, open while the context
    // is registered (ibv_close_device unregisters before closing it).
    let _ = unsafe { libc::write(fd, (&raw const one).cast(), 8) };
}

/// The async fd of a new context: an eventfd counting queued events (semaphore mode: each
/// read takes one).
///
/// # Errors
/// The errno of eventfd(2).
pub fn async_fd() -> Result<c_int, c_int> {
    // SAFETY: plain syscall with constant flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(fd)
    }
}

/// Starts watching the knobs of the device at `ibdev` (with `nports` ports) for the context
/// `ctx` whose async fd is `fd`.
pub fn register(ctx: usize, fd: c_int, ibdev: &Path, nports: u8) {
    let w = Watched {
        fd,
        ibdev: ibdev.to_path_buf(),
        link_up: (1..=nports).map(|p| link_up(ibdev, p)).collect(),
        fatal: health(ibdev) != Health::Ok,
        closed: false,
        queue: VecDeque::new(),
    };
    contexts().insert(ctx, w);
    WATCHER.call_once(|| {
        // A thread that lives as long as the process: it only reads files and writes
        // eventfds of registered contexts.
        let _ = std::thread::Builder::new()
            .name("fake-rdma-events".into())
            .spawn(|| loop {
                std::thread::sleep(WATCH_INTERVAL);
                watch_once();
            });
    });
}

/// Stops watching for `ctx` (before its fd is closed); events not fetched are dropped, as
/// the kernel drops them with the file.
pub fn unregister(ctx: usize) {
    contexts().remove(&ctx);
}

/// One look at the knobs: queues an event on each context for each change since it last
/// looked. Each device's files are read once per look.
fn watch_once() {
    let mut reg = contexts();
    let mut seen: HashMap<PathBuf, (Vec<bool>, Health)> = HashMap::new();
    for w in reg.values_mut() {
        let nports = u8::try_from(w.link_up.len()).unwrap_or(u8::MAX);
        let (links, dev_fatal) = seen.entry(w.ibdev.clone()).or_insert_with(|| {
            (
                (1..=nports).map(|p| link_up(&w.ibdev, p)).collect(),
                health(&w.ibdev),
            )
        });
        for (i, &up) in links.iter().enumerate() {
            if w.link_up.get(i) == Some(&!up) {
                w.link_up[i] = up;
                // The ib core reports a port's link change as PORT_ACTIVE / PORT_ERR with
                // the port number as element (kernel `ib_dispatch_port_state_event`).
                let t = if up {
                    IBV_EVENT_PORT_ACTIVE
                } else {
                    IBV_EVENT_PORT_ERR
                };
                w.push(t, c_int::try_from(i + 1).unwrap_or(0));
            }
        }
        if *dev_fatal != Health::Ok && !w.fatal {
            w.fatal = true;
            // The uverbs core queues DEVICE_FATAL with element 0 (kernel
            // `ib_uverbs_free_hw_resources` / `uverbs_async_event_destroy_uobj`).
            w.push(IBV_EVENT_DEVICE_FATAL, 0);
        }
        if *dev_fatal == Health::Removed && !w.closed {
            // Then it closes the queue: what is queued is still read, then EIO.
            w.closed = true;
            signal(w.fd);
        }
    }
}

/// `ibv_get_async_event` on `ctx` (whose async fd is `fd`): takes one count from the
/// eventfd (blocking or `EAGAIN`, by the descriptor's flags), then the oldest event.
///
/// # Safety
/// `event` points to a writable `struct ibv_async_event`.
pub unsafe fn get(ctx: usize, fd: c_int, event: *mut ibv_async_event) -> c_int {
    let mut token = 0u64;
    // SAFETY: reads 8 bytes into a local from the context's eventfd; errno is left as read
    // sets it (EAGAIN on an empty non-blocking descriptor), as libibverbs leaves it.
    if unsafe { libc::read(fd, (&raw mut token).cast(), 8) } != 8 {
        return -1;
    }
    let mut reg = contexts();
    let Some(w) = reg.get_mut(&ctx) else {
        die("ibv_get_async_event", "context closed during the call");
    };
    let Some((event_type, element)) = w.queue.pop_front() else {
        if w.closed {
            // The closed channel's count goes back: it stays readable, and fails.
            signal(fd);
            set_errno(libc::EIO);
            return -1;
        }
        die(
            "ibv_get_async_event",
            "the async fd had a count but no event was queued (fake bug)",
        );
    };
    drop(reg);
    // SAFETY: the caller's struct is writable (checked non-NULL by the caller); for port
    // and device events libibverbs sets `element.port_num` (libibverbs/device.c:488–490).
    unsafe {
        (*event).event_type = event_type;
        (*event).element.port_num = element;
    }
    0
}

/// Whether the link knob holds port `port` of the context `ctx` down.
fn port_down(ctx: usize, port: u8) -> bool {
    let reg = contexts();
    reg.get(&ctx)
        .is_some_and(|w| port >= 1 && !link_up(&w.ibdev, port))
}

/// The `query_port` op: the provider's answer, then, while the port's link knob says down, state
/// `IBV_PORT_DOWN` and physical state 3 (disabled), as the kernel's `mana_ib_query_port`
/// reports a port whose netdev has no carrier or is not running.
///
/// # Safety
/// As the op: `attr` points to `len` writable bytes.
pub unsafe extern "C" fn query_port_slot(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: same contract as ours.
    let ret = unsafe { crate::verbs::query_port_slot(context, port_num, attr, len) };
    if ret == 0 && port_down(context as usize, port_num) {
        let state = offset_of!(ibv_port_attr, state);
        let phys = offset_of!(ibv_port_attr, phys_state);
        // SAFETY: each field is written only when it lies inside the caller's `len` bytes;
        // unaligned writes, as the caller's struct may be a shorter compat copy.
        unsafe {
            if state + size_of::<ibv_port_state>() <= len {
                attr.cast::<u8>()
                    .add(state)
                    .cast::<ibv_port_state>()
                    .write_unaligned(IBV_PORT_DOWN);
            }
            if phys < len {
                attr.cast::<u8>().add(phys).write(3);
            }
        }
    }
    ret
}
