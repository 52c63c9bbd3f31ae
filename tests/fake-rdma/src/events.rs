//! Asynchronous events: the context's `async_fd` becomes readable when the world says that a
//! port's link went down or up, or that the device failed; `ibv_get_async_event` then
//! returns the events in order, `ibv_ack_async_event` accepts them, and `ibv_query_port`
//! reports the port down while its link is. And a host servicing: the device is reset,
//! its contexts disassociated, and it leaves the tree for a while.
//!
//! Knobs (files a test writes while the program runs; see RULES.md):
//! * `<ibdev_path>/ports/N/fake_rdma_link`: `down` takes port N's link down; `up`, anything
//!   else, or no file: up.
//! * `<ibdev_path>/fake_rdma_fatal`: `1` makes the device fail (`IBV_EVENT_DEVICE_FATAL`,
//!   once per context); `removed` removes it: `DEVICE_FATAL` (if not raised yet), then the
//!   event channel closes, as on a hot removal: once the queued events are fetched,
//!   `ibv_get_async_event` fails with `EIO` and the descriptor stays readable (the kernel
//!   polls `EPOLLERR` there; `ib_uverbs_event_read`, `ib_uverbs_event_poll`).
//! * `<ibdev_path>/fake_rdma_fatal`: `service SECONDS` (a decimal: `service 2`,
//!   `service 0.5`) services the device, as Azure's host servicing does to a VF (the PCI
//!   function is removed and added back, and the kernel unregisters the RDMA device and
//!   registers it again, `ib_uverbs_remove_one` then `ib_uverbs_add_one`):
//!   - every context of the device open now is disassociated ([`crate::verbs::disassociate`],
//!     kernel `ib_uverbs_free_hw_resources`): its hardware objects are destroyed (the device
//!     model stops serving its queues at once, its engine and wire stay up, frames that
//!     arrive are dropped for want of a posted WQE), commands on it and its objects fail with
//!     `EIO`, destroys succeed and give the buffers back; then it gets `DEVICE_FATAL`
//!     (element 0) and its event channel closes as on `removed`
//!     (`uverbs_async_event_destroy_uobj`, `ib_uverbs_free_event_queue`);
//!   - the device's directories leave the tree (`class/infiniband/<dev>` and its
//!     `class/infiniband_verbs/uverbsN` move to `<root>/fake_rdma_serviced/`), so neither
//!     `ibv_get_device_list` nor pmd's discovery lists it and `ibv_open_device` on its old
//!     `ibv_device` fails with `ENOENT` (the kernel removed `/dev/infiniband/uverbsN`);
//!   - SECONDS later they come back as they were (name, ports, MACs, wires, netdevs), the
//!     knob gone (healthy) and [`world::GENERATION_FILE`] one higher: a new registration,
//!     listed under a new `ibv_device`; contexts opened from then on work, and a later
//!     `service` works again. A port whose world says `netdev_up_after_reset=1` gets its
//!     (real) netdev brought up then, as `hv_netvsc` opens a returning VF
//!     (`__netvsc_vf_setup`).
//!
//!   A servicing needs a process on the fake that has looked at the device list (its
//!   watcher does the work); a process that exits during a servicing it started puts the
//!   device back at once. Several processes on one tree: the one whose watcher moves the
//!   directory runs the servicing; the others see the directory go (or its generation
//!   change) and disassociate their contexts too, and any of them brings it back.
//!
//! A watcher thread, started with the first look at the device list, reads the knobs every
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
use crate::world::{self, GENERATION_FILE, SERVICED_DIR};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_int;
use std::fs;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// The device's generation at the open ([`world::GENERATION_FILE`]).
    generation: u64,
    /// The device was serviced: the context is disassociated (no events but the fatal one).
    gone: bool,
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
/// The tree's root (`SYSFS_PATH`), set when the watcher starts.
static ROOT: OnceLock<PathBuf> = OnceLock::new();
/// Devices whose servicing this process started and that are still out of the tree.
static HIDDEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn contexts() -> MutexGuard<'static, BTreeMap<usize, Watched>> {
    CONTEXTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `<ibdev>/ports/<port>/fake_rdma_link` says up (`down` is the only way down).
pub fn link_up(ibdev: &Path, port: u8) -> bool {
    std::fs::read_to_string(ibdev.join(format!("ports/{port}/{LINK_FILE}")))
        .map_or(true, |s| s.trim() != "down")
}

/// What `<ibdev>/fake_rdma_fatal` says of the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Health {
    /// No knob (or another value): working.
    Ok,
    /// `1`: failed.
    Fatal,
    /// `removed`: failed and gone.
    Removed,
    /// `service SECONDS`: to be serviced, out of the tree for that long.
    Service(Duration),
}

/// Reads `<ibdev>/fake_rdma_fatal`.
pub fn health(ibdev: &Path) -> Health {
    fs::read_to_string(ibdev.join(FATAL_FILE)).map_or(Health::Ok, |s| parse_health(&s))
}

/// The knob's text as a [`Health`]; anything it does not name is [`Health::Ok`].
pub fn parse_health(s: &str) -> Health {
    let words: Vec<&str> = s.split_whitespace().collect();
    match words[..] {
        ["1"] => Health::Fatal,
        ["removed"] => Health::Removed,
        ["service", secs] => secs
            .parse::<f64>()
            .ok()
            .filter(|t| t.is_finite() && (0.0..=86_400.0).contains(t))
            .map_or(Health::Ok, |t| Health::Service(Duration::from_secs_f64(t))),
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
        fatal: matches!(health(ibdev), Health::Fatal | Health::Removed),
        generation: world::generation(ibdev),
        gone: false,
        closed: false,
        queue: VecDeque::new(),
    };
    contexts().insert(ctx, w);
}

/// Starts the watcher of the tree at `root` (once per process; at the first look at the
/// device list).
pub fn start(root: &Path) {
    let _ = ROOT.set(root.to_path_buf());
    WATCHER.call_once(|| {
        // A thread that lives as long as the process: it reads and moves files of the tree
        // and writes eventfds of registered contexts; it takes the fake's state lock only
        // to disassociate contexts (the state lock before the context registry, as the
        // verbs calls take them).
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

/// One look at the knobs: services the devices whose knob asks for it, disassociates the
/// contexts of serviced devices, queues an event on each context for each change since it
/// last looked, and brings back the devices whose servicing is over. Each device's files
/// are read once per look.
fn watch_once() {
    let Some(root) = ROOT.get() else {
        return;
    };
    let asked = asked_services(root);
    let stale = contexts().values().any(|w| !w.gone && serviced(w));
    if !asked.is_empty() || stale {
        service(root, &asked);
    }
    let mut reg = contexts();
    let mut seen: HashMap<PathBuf, (Vec<bool>, Health)> = HashMap::new();
    for w in reg.values_mut() {
        if w.gone {
            continue;
        }
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
        if matches!(dev_fatal, Health::Fatal | Health::Removed) && !w.fatal {
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
    drop(reg);
    restore(root, None);
}

/// Whether the device of `w` was serviced since the context opened: its directory is out
/// of the tree, or came back as a new registration.
fn serviced(w: &Watched) -> bool {
    !w.ibdev.is_dir() || world::generation(&w.ibdev) != w.generation
}

/// How long a `removed` device stays out of the tree: for good, as far as a program can
/// tell (it comes back when the process that removed it exits, so the tree stays whole).
const REMOVED_FOR: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The devices of the tree whose knob says `service SECONDS` (or `removed`).
fn asked_services(root: &Path) -> Vec<(String, Duration)> {
    let Ok(entries) = fs::read_dir(root.join("class/infiniband")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| match health(&e.path()) {
            Health::Service(d) => Some((e.file_name().to_string_lossy().into_owned(), d)),
            // A hot removal is a servicing that never ends: the kernel unregisters the
            // device (`ib_unregister_device` → `ib_uverbs_remove_one`, which disassociates
            // every context as above) and it is gone from the tree.
            Health::Removed => Some((e.file_name().to_string_lossy().into_owned(), REMOVED_FOR)),
            _ => None,
        })
        .collect()
}

/// Starts the servicings `asked` for, then disassociates every context of a serviced
/// device, in the uverbs core's order: commands blocked and the hardware objects destroyed
/// first, then `DEVICE_FATAL` queued on the file and its event queue closed (kernel
/// `ib_uverbs_free_hw_resources`: `uverbs_disassociate_api_pre`, then
/// `uverbs_destroy_ufile_hw`, whose destruction of the async event file queues the event,
/// `uverbs_async_event_destroy_uobj`, and closes the queue).
fn service(root: &Path, asked: &[(String, Duration)]) {
    let mut g = crate::state::lock();
    let st = g.as_mut().expect("state initialised by lock()");
    for (name, d) in asked {
        hide(root, name, *d);
    }
    let victims: Vec<usize> = contexts()
        .iter()
        .filter(|(_, w)| !w.gone && serviced(w))
        .map(|(&c, _)| c)
        .collect();
    for &c in &victims {
        crate::verbs::disassociate(st, c);
    }
    let mut reg = contexts();
    for c in victims {
        if let Some(w) = reg.get_mut(&c) {
            w.gone = true;
            if !w.fatal {
                w.fatal = true;
                w.push(IBV_EVENT_DEVICE_FATAL, 0);
            }
            if !w.closed {
                w.closed = true;
                signal(w.fd);
            }
        }
    }
}

/// Milliseconds since the epoch (the servicing's deadline, shared by the processes of one
/// tree).
fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Takes device `name` out of the tree for `d`: its directory and its uverbs directory
/// move to `<root>/fake_rdma_serviced/`, the knob is removed, the generation rises, and
/// `<name>.until` says when it comes back (with the uverbs number). The first move is the
/// claim: when several processes saw the knob, one of them moves the directory.
fn hide(root: &Path, name: &str, d: Duration) {
    let parked = root.join(SERVICED_DIR);
    let _ = fs::create_dir_all(&parked);
    let dev_dir = parked.join(name);
    let uverbs = world::uverbs_of(root, name);
    if fs::rename(root.join("class/infiniband").join(name), &dev_dir).is_err() {
        return;
    }
    // It comes back healthy, as a new registration.
    let _ = fs::remove_file(dev_dir.join(FATAL_FILE));
    let generation = world::generation(&dev_dir) + 1;
    let _ = fs::write(dev_dir.join(GENERATION_FILE), format!("{generation}\n"));
    if let Some(n) = uverbs {
        let _ = fs::rename(
            root.join(format!("class/infiniband_verbs/uverbs{n}")),
            parked.join(format!("uverbs{n}")),
        );
    }
    let until = now_ms() + d.as_millis();
    let note = format!(
        "{until} {}\n",
        uverbs.map_or_else(|| "-".to_string(), |n| n.to_string())
    );
    // Written aside and renamed, so a watcher never reads half a note.
    let tmp = parked.join(format!("{name}.note"));
    if fs::write(&tmp, note).is_ok() {
        let _ = fs::rename(&tmp, parked.join(format!("{name}.until")));
    }
    HIDDEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(name.to_string());
}

/// Brings back the serviced devices whose time is up (or, with `only`, those named there,
/// whatever their time): the uverbs directory first, then the device's, so that whoever
/// sees the device finds its uverbs device too. Renaming the note away is the claim: of the
/// processes that look, one brings the device back.
fn restore(root: &Path, only: Option<&[String]>) {
    let parked = root.join(SERVICED_DIR);
    let Ok(entries) = fs::read_dir(&parked) else {
        return;
    };
    let now = now_ms();
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(".until") else {
            continue;
        };
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        let mut words = text.split_whitespace();
        let until: u128 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let uverbs: Option<u32> = words.next().and_then(|w| w.parse().ok());
        let due = match only {
            Some(names) => names.iter().any(|n| n == name),
            None => until <= now,
        };
        if !due {
            continue;
        }
        let claim = parked.join(format!("{name}.claimed-{}", std::process::id()));
        if fs::rename(e.path(), &claim).is_err() {
            continue;
        }
        if let Some(n) = uverbs {
            let _ = fs::rename(
                parked.join(format!("uverbs{n}")),
                root.join(format!("class/infiniband_verbs/uverbs{n}")),
            );
        }
        let dir = root.join("class/infiniband").join(name);
        let _ = fs::rename(parked.join(name), &dir);
        let _ = fs::remove_file(&claim);
        // A VF that joins a running synthetic NIC is opened by hv_netvsc (kernel
        // `__netvsc_vf_setup`: dev_open of the VF when the master is running): the ports
        // whose world says netdev_up_after_reset=1 get their netdev up again.
        for flags in world::netdevs_up_after_reset(&dir) {
            if let Err(e) = world::set_netdev_up(&flags) {
                eprintln!(
                    "fake-rdma: {name}: back from its servicing, but bringing up the netdev of {} failed: {e}",
                    flags.display()
                );
            }
        }
        HIDDEN
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|n| n != name);
    }
}

/// At exit: the devices whose servicing this process started and that are still out of
/// the tree come back now (no watcher of this process will bring them back later).
pub fn restore_at_exit() {
    let Some(root) = ROOT.get() else {
        return;
    };
    let names = HIDDEN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if !names.is_empty() {
        restore(root, Some(&names));
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
