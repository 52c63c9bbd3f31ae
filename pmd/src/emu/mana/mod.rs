//! The MANA device model: a software NIC that implements the MANA [`Provider`] contract.
//! It names no port type: a port over it is built by `port::probe`, and tests reach it
//! through [`crate::emu::testing`].
//!
//! It allocates queue memory the way the `manadv_set_context_attr` allocator contract asks
//! (page-aligned, zero-filled, sizes rounded as rdma-core rounds them, §1.3), hands out the
//! same raw queue descriptions `manadv_init_obj` would, and runs an [`Engine`] that plays the
//! hardware's side. The engine runs ([`ModelSpec::engine`], see [`crate::emu::thread`]) on its
//! own thread ([`EngineThread`]: busy-polling with back-off), or inline: each raw queue
//! carries a kick ([`RawTxQueue::kick`]) with which the thread polling the queue does the
//! device's work for it, so the process needs no thread beyond its polling cores; or, for
//! tests, paused and stepped by hand.
//!
//! The model API's default is the thread ([`ModelSpec::new`], the [`crate::emu::testing`]
//! fixtures): the device then works whether or not anyone polls, as tests that act as the
//! driver by hand expect. Ports opened from devargs (`emu-mana:...`, the apps and the demo)
//! default to inline (`engine=inline|thread`, see `port::devargs`).
//!
//! The engine also serves queues whose memory someone else owns: [`Engine::add_sq`],
//! [`Engine::add_rq`] (each with its CQ), [`Engine::add_mr`], [`Engine::set_rss`] and their
//! removals take views of foreign memory ([`DevMem::from_raw`], made by the owner under its
//! own `SAFETY` argument). The fake rdma-core (`tests/fake-rdma`) puts it behind the queues
//! an unchanged application creates with verbs calls.
//!
//! Doorbells: rdma-core maps one doorbell page per context and every queue of the context
//! rings on it, with the queue id in the value (§6.1). The engine handles shared pages
//! ([`DoorbellPage`]): it samples each page once per step and latches the tail of a new
//! value into the queue with that id; a value whose id matches no queue on the page is
//! counted in `bad_doorbells`. Sampled alone, a page deviates from hardware, where each
//! doorbell write is an event: two queues ringing the same page between two samples leave
//! only the second value, so the first queue's doorbell is missed, until that queue rings
//! again (each doorbell carries the absolute tail, so the next one recovers everything); that
//! is how the fake rdma-core's pages work (libmana maps them). [`Model`] gives all the
//! queues of a port one page, as rdma-core gives a context one, and each queue a monitor of
//! its own writes to it ([`DoorbellPage::monitor`], [`crate::sys::Doorbell`]): the engine
//! reads the monitors, so it sees every doorbell while the queues share the page, and a
//! value names its queue by id among all the port's queues, as on hardware.
//!
//! Port events: the model has an eventfd that it signals when its link changes (the
//! link-down fault set or cleared through [`EngineHandle::set_faults`], or the far end of the
//! wire attaching or going away, which the engine thread looks at every
//! [`LINK_POLL`]), and hands out [`PortEvent::LinkUp`] / [`PortEvent::LinkDown`] for each
//! transition, in order.
#![deny(unsafe_code)]

pub mod engine;
mod port;

pub use port::Model;

pub use crate::emu::thread::EngineMode;
use crate::ethdev::{Loss, Xstat};
pub use engine::{CqSpec, DoorbellPage, Engine, EngineError, Faults, ModelStats, RqSpec, SqSpec};

/// The MANA engine behind its lock (see [`crate::emu::thread::EngineCore`]).
pub type EngineCore = crate::emu::thread::EngineCore<Engine>;
/// The MANA engine on its own thread (see [`crate::emu::thread::EngineThread`]).
pub type EngineThread = crate::emu::thread::EngineThread<Engine>;

use crate::emu::events::LinkEvents;
pub use crate::emu::handle::EngineHandle;
use crate::emu::thread::{QueueId, QueueKick};
use crate::emu::wire::Wire as _;
use crate::emu::wire::{self, WireSpec};
use crate::ethdev::{Kick, Link, PortEvent, RssConfig};
use crate::hw::mana::wqe::{wqe_bytes, SHORT_OOB_BYTES};
use crate::hw::mana::{CQE_BYTES, MAX_TX_SGES, MIN_QUEUE_BYTES, RSS_TABLE_ENTRIES};
use crate::mana::{Provider, QueueAllocator, QueueOwner, RawRxQueue, RawTxQueue, SetupError};
use crate::net::MacAddr;
use crate::sys::DevMem;
use mempool::{ChunkInfo, Registration};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// Descriptor limit of the model (newer kernels take the adapter's limit; rdma-core v44
/// capped user queues at 256, §1.11).
pub const MODEL_MAX_DESC: u32 = 4096;
/// Queue limit of the model.
pub const MODEL_MAX_QUEUES: u16 = 16;
pub use crate::emu::events::LINK_POLL;

/// Queue memory as the allocator contract sizes it: rounded up to a power of two and to a
/// multiple of 4096 (§1.3).
pub fn queue_bytes(n: usize) -> usize {
    n.next_power_of_two().max(MIN_QUEUE_BYTES)
}

/// What a MANA model port is: its wire and the settings a NIC would have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Where its frames go.
    pub wire: WireSpec,
    /// Its MAC address (default: a locally administered one derived from the port id).
    pub mac: Option<MacAddr>,
    /// Record every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// A Linux interface that plays the port's kernel netdev: while it is up it holds the
    /// port, as on MANA.
    pub netdev: Option<String>,
    /// The vPort offset the model hands out in `RawTxQueue::tx_vp_offset` (default: the port
    /// id mod 256). Values over 255 exercise the long-OOB vPort field (spec §11 item 6).
    pub vp_offset: Option<u16>,
    /// How the engine gets its CPU: its own thread (the default here) or inline on the
    /// threads that poll the queues.
    pub engine: EngineMode,
    /// RX CQE coalescing: up to four packets per RX_COALESCED_4 CQE, as `mana_ib` configures
    /// the vPort for RSS QPs on newer kernels (spec §7.4); off, as on older kernels, by
    /// default. Sets [`Engine::set_rx_coalesce`] when the model opens.
    pub rx_coalesce: bool,
}

impl ModelSpec {
    /// A model on `wire` with every other setting at its default.
    pub fn new(wire: WireSpec) -> Self {
        Self {
            wire,
            mac: None,
            pcap: None,
            netdev: None,
            vp_offset: None,
            engine: EngineMode::Thread,
            rx_coalesce: false,
        }
    }
}

/// Errors opening a model.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The wire (or its capture file) could not be opened.
    #[error("opening the wire: {0}")]
    Wire(#[from] wire::WireError),
}

struct Shared {
    core: Arc<EngineCore>,
    /// Who holds the vPort ("the kernel"), if anyone: queue creation then fails like EBUSY.
    held_by: Mutex<Option<String>>,
    /// The raw queues handed out since the last `destroy_queues`, for tests acting as the NIC.
    /// (Their owners point back here; `destroy_queues` and the model's drop clear the list.)
    queues: Mutex<(Vec<RawTxQueue>, Vec<RawRxQueue>)>,
    /// Port events not yet taken, and the link state they last reported.
    events: LinkEvents,
}

/// The model's link: a cable's (down until the far end is attached, and after it goes), and
/// down while the link-down fault is set. MANA itself reports no carrier state; DPDK
/// presents it as always up, 100G (§1.11).
fn link_up(e: &Engine) -> bool {
    !e.faults.link_down && e.wire.peer_attached()
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.core.lock()
    }

    /// Records the link state `e` shows (and its wire's capture), queueing an event when it
    /// changed. Called with the engine locked (`e`), so that observers from two threads
    /// cannot report out of order.
    fn note_link(&self, e: &Engine) {
        self.events.note(link_up(e));
        self.events.note_capture(e.capture_error());
    }
}

/// A handle on a running model: step it, inject faults, read its counters (the handle both
/// models share, [`EngineHandle`], through `Deref`), and what only the MANA model has: the
/// raw queues it handed out, its memory regions, a kernel netdev that holds the port.
#[derive(Clone)]
pub struct ModelHandle {
    engine: EngineHandle<Engine>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ModelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelHandle({})", self.shared.lock().wire.describe())
    }
}

impl std::ops::Deref for ModelHandle {
    type Target = EngineHandle<Engine>;
    fn deref(&self) -> &EngineHandle<Engine> {
        &self.engine
    }
}

impl ModelHandle {
    fn new(shared: &Arc<Shared>) -> Self {
        Self {
            engine: EngineHandle::new(Arc::clone(&shared.core)),
            shared: Arc::clone(shared),
        }
    }

    /// Sets the vPort's RX CQE coalescing (what `cqe-coalesce=1` sets when the model opens;
    /// [`Engine::set_rx_coalesce`]). Faults set later leave it as it is.
    pub fn set_rx_coalesce(&self, on: bool) {
        self.engine().set_rx_coalesce(on);
    }

    /// The TX queues the model created (what `manadv_init_obj` handed the driver): ring
    /// memory, ids, doorbell page, so a test can act as the NIC or as the driver.
    pub fn tx_queues(&self) -> Vec<RawTxQueue> {
        lock(&self.shared.queues).0.clone()
    }

    /// The RX queues the model created.
    pub fn rx_queues(&self) -> Vec<RawRxQueue> {
        lock(&self.shared.queues).1.clone()
    }

    /// The memory keys of the registered memory regions, with their address ranges.
    pub fn memory_regions(&self) -> Vec<(u32, usize, usize)> {
        self.engine()
            .mrs
            .iter()
            .map(|m| (m.lkey, m.addr, m.len))
            .collect()
    }

    /// Makes the "kernel" hold the port (queue creation fails as with EBUSY), or frees it.
    pub fn set_held_by(&self, netdev: Option<&str>) {
        *lock(&self.shared.held_by) = netdev.map(str::to_string);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mana::PageAllocator;

    /// An allocator that hands out memory full of stale bytes.
    struct Dirty;

    impl QueueAllocator for Dirty {
        fn alloc(&self, size: usize) -> std::io::Result<Arc<DevMem>> {
            let m = DevMem::anon(size)?;
            m.fill(0, size, 0xff);
            Ok(Arc::new(m))
        }
    }

    #[test]
    fn queue_memory_follows_the_allocator_contract() {
        let mut p = Model::with_wire(Box::new(wire::NoWire), MacAddr::default(), 0);
        let e = p.create_tx_queues(1, 64).unwrap_err().to_string();
        assert!(
            e.contains("manadv_set_context_attr must come before"),
            "{e}"
        );
        p.set_allocator(Arc::new(Dirty));
        let e = p.create_tx_queues(1, 64).unwrap_err().to_string();
        assert!(e.contains("not zero-filled"), "{e}");
        p.set_allocator(Arc::new(PageAllocator));
        let q = &p.create_tx_queues(1, 64).unwrap()[0];
        // rdma-core's sizes (§1.3): SQ = 64 WQEs x roundup32(16*30 + 16) = 512 B -> 32 KiB;
        // CQ = 64 x 64 B = 4 KiB; both page-aligned.
        assert_eq!((q.sq.len(), q.cq.len(), q.cq_count), (32768, 4096, 64));
        assert_eq!(q.sq.addr() % 4096, 0);
        let r = &p.create_rx_queues(1, 256, &RssConfig::default()).unwrap()[0];
        // RQ = 256 x 32 B = 8 KiB; CQ = 256 x 64 B = 16 KiB.
        assert_eq!((r.rq.len(), r.cq.len()), (8192, 16384));
        assert_ne!(q.sq_id, r.rq_id);
        assert!(q.sq_id < 1 << 24 && r.cq_id < 1 << 24);
    }
}
