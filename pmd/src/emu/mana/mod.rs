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
//! link-down fault set or cleared through [`ModelHandle::set_faults`], or the far end of the
//! wire attaching or going away, which the engine thread looks at every
//! [`LINK_POLL`]), and hands out [`PortEvent::LinkUp`] / [`PortEvent::LinkDown`] for each
//! transition, in order.
#![deny(unsafe_code)]

pub mod engine;

pub use crate::emu::thread::EngineMode;
use crate::ethdev::{Loss, Xstat};
pub use engine::{CqSpec, DoorbellPage, Engine, EngineError, Faults, ModelStats, RqSpec, SqSpec};

/// The MANA engine behind its lock (see [`crate::emu::thread::EngineCore`]).
pub type EngineCore = crate::emu::thread::EngineCore<Engine>;
/// The MANA engine on its own thread (see [`crate::emu::thread::EngineThread`]).
pub type EngineThread = crate::emu::thread::EngineThread<Engine>;

use crate::emu::events::LinkEvents;
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

    /// Records the link state `e` shows, queueing an event when it changed. Called with the
    /// engine locked (`e`), so that observers from two threads cannot report out of order.
    fn note_link(&self, e: &Engine) {
        self.events.note(link_up(e));
    }
}

/// A handle on a running model: step it, inject faults, read its counters.
#[derive(Clone)]
pub struct ModelHandle(Arc<Shared>);

impl std::fmt::Debug for ModelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelHandle({})", self.0.lock().wire.describe())
    }
}

impl ModelHandle {
    /// Stops the engine thread from running steps (it keeps sleeping); drive with [`step`].
    /// When this returns no step of the thread is in progress and none starts until
    /// [`resume`] (see [`EngineCore::pause`]).
    ///
    /// [`step`]: ModelHandle::step
    /// [`resume`]: ModelHandle::resume
    pub fn pause(&self) {
        self.0.core.pause();
    }

    /// Lets the engine thread run again.
    pub fn resume(&self) {
        self.0.core.resume();
    }

    /// One engine pass; returns the work done.
    pub fn step(&self) -> usize {
        self.0.core.step()
    }

    /// Steps until a pass does nothing (at most `max` passes); returns the total work.
    pub fn run_until_idle(&self, max: usize) -> usize {
        self.0.core.run_until_idle(max)
    }

    /// Sets the faults. Setting or clearing `link_down` changes the link at once and queues
    /// a [`PortEvent`] when it changed.
    pub fn set_faults(&self, f: Faults) {
        let mut e = self.0.lock();
        e.faults = f;
        self.0.note_link(&e);
    }

    /// Has the faults of `plan` take turns from now on ([`Engine::cycle_faults`]); `None`
    /// stops them. Link phases reach the port's events within [`LINK_POLL`].
    ///
    /// # Errors
    /// A kind of fault the MANA model does not have.
    pub fn cycle_faults(
        &self,
        plan: Option<&crate::emu::faults::FaultPlan>,
    ) -> Result<(), crate::emu::faults::FaultKind> {
        self.0.lock().cycle_faults(plan)
    }

    /// Sets the vPort's RX CQE coalescing (what `cqe-coalesce=1` sets when the model opens;
    /// [`Engine::set_rx_coalesce`]). Faults set later leave it as it is.
    pub fn set_rx_coalesce(&self, on: bool) {
        self.0.lock().set_rx_coalesce(on);
    }

    /// Device-side counters.
    pub fn stats(&self) -> ModelStats {
        self.0.lock().stats
    }

    /// The TX queues the model created (what `manadv_init_obj` handed the driver): ring
    /// memory, ids, doorbell page, so a test can act as the NIC or as the driver.
    pub fn tx_queues(&self) -> Vec<RawTxQueue> {
        lock(&self.0.queues).0.clone()
    }

    /// The RX queues the model created.
    pub fn rx_queues(&self) -> Vec<RawRxQueue> {
        lock(&self.0.queues).1.clone()
    }

    /// The memory keys of the registered memory regions, with their address ranges.
    pub fn memory_regions(&self) -> Vec<(u32, usize, usize)> {
        self.0
            .lock()
            .mrs
            .iter()
            .map(|m| (m.lkey, m.addr, m.len))
            .collect()
    }

    /// Makes the "kernel" hold the port (queue creation fails as with EBUSY), or frees it.
    pub fn set_held_by(&self, netdev: Option<&str>) {
        *lock(&self.0.held_by) = netdev.map(str::to_string);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The MANA device model as a [`Provider`].
pub struct Model {
    shared: Arc<Shared>,
    /// Runs the engine in thread mode; dropped (stopped and joined) with the model.
    _thread: Option<EngineThread>,
    mode: EngineMode,
    /// The port's doorbell page, shared by all its queues as rdma-core maps one per context
    /// (made with the first queue, kept for the model's life).
    db: Option<Arc<DoorbellPage>>,
    mac: MacAddr,
    next_id: u32,
    next_lkey: u32,
    vp_offset: u16,
    allocator: Option<Arc<dyn QueueAllocator>>,
    /// The Linux interface playing this port's kernel netdev (`netdev=`), if any.
    netdev: Option<String>,
}

/// A doorbell page (one per port, shared by its queues; see the module docs).
fn doorbell_page() -> Result<Arc<DoorbellPage>, SetupError> {
    let mem = DevMem::anon(crate::hw::mana::doorbell::PAGE_BYTES).map_err(|source| {
        SetupError::Verbs {
            call: "mmap",
            object: "doorbell page",
            source,
        }
    })?;
    DoorbellPage::new(Arc::new(mem)).map_err(engine_refused("doorbell page"))
}

/// The engine refused something the model built: a bug of the model, reported as the
/// kernel would report a refusal.
fn engine_refused(object: &'static str) -> impl FnOnce(EngineError) -> SetupError {
    move |e| SetupError::Verbs {
        call: "device model",
        object,
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    }
}

/// The error the kernel gives while its netdev holds the vPort (EBUSY, as newer kernels
/// report it), naming the netdev, its master and what to do.
fn busy(netdev: &str) -> SetupError {
    SetupError::port_busy(Some(netdev), libc::EBUSY)
}

impl Model {
    /// Opens a model: connects its wire (and capture) and starts the engine thread.
    ///
    /// # Errors
    /// The wire or the capture file cannot be opened.
    pub fn open(spec: &ModelSpec, port_id: u16) -> Result<Self, OpenError> {
        let mut w = wire::open(&spec.wire)?;
        if let Some(path) = &spec.pcap {
            w = Box::new(wire::PcapTap::new(w, path)?);
        }
        let mac = spec
            .mac
            .unwrap_or_else(|| crate::emu::default_mac(0x5d, port_id));
        let mut p = Self::with_wire_mode(w, mac, port_id, spec.engine);
        p.netdev = spec.netdev.clone();
        if let Some(v) = spec.vp_offset {
            p.vp_offset = v;
        }
        p.shared.lock().set_rx_coalesce(spec.rx_coalesce);
        Ok(p)
    }

    /// A model on an already opened wire, its engine on its own thread.
    pub fn with_wire(wire: Box<dyn wire::Wire>, mac: MacAddr, port_id: u16) -> Self {
        Self::with_wire_mode(wire, mac, port_id, EngineMode::Thread)
    }

    /// A model on an already opened wire, its engine run as `mode` says.
    pub fn with_wire_mode(
        wire: Box<dyn wire::Wire>,
        mac: MacAddr,
        port_id: u16,
        mode: EngineMode,
    ) -> Self {
        let engine = Engine::new(wire);
        let events = LinkEvents::new(link_up(&engine), port_id);
        let core = crate::emu::thread::EngineCore::new(engine);
        let shared = Arc::new(Shared {
            core: Arc::clone(&core),
            events,
            held_by: Mutex::new(None),
            queues: Mutex::new((Vec::new(), Vec::new())),
        });
        // The engine thread (or the kicks) look at the link (the far end of the wire) every
        // LINK_POLL.
        let weak = Arc::downgrade(&shared);
        core.set_watch(
            LINK_POLL,
            Box::new(move |e: &Engine| {
                if let Some(s) = weak.upgrade() {
                    s.note_link(e);
                }
            }),
        );
        let thread = (mode == EngineMode::Thread).then(|| {
            EngineThread::start(core, &format!("emu-mana-{port_id}"))
                .expect("spawning the model's engine thread")
        });
        Self {
            shared,
            _thread: thread,
            mode,
            mac,
            // Distinct, 24-bit ids per port, so a driver mixing them up is caught.
            next_id: 0x10_0000 + (u32::from(port_id) << 12),
            next_lkey: 0x100 + (u32::from(port_id) << 16),
            vp_offset: port_id % 256,
            allocator: None,
            db: None,
            netdev: None,
        }
    }

    /// A handle to step the model and inject faults.
    pub fn handle(&self) -> ModelHandle {
        ModelHandle(Arc::clone(&self.shared))
    }

    /// What a queue handle holds: the model's shared state (as a QP holds its context).
    fn owner(&self) -> QueueOwner {
        Arc::clone(&self.shared) as QueueOwner
    }

    /// The kick a queue's description carries: the device's work on the polling thread in
    /// inline mode, none with an engine thread.
    fn kick(&self, queue: QueueId) -> Kick {
        (self.mode == EngineMode::Inline)
            .then(|| Arc::new(QueueKick::new(Arc::clone(&self.shared.core), queue)) as _)
    }

    fn id(&mut self) -> u32 {
        self.next_id = (self.next_id + 1) & 0x00ff_ffff;
        self.next_id
    }

    fn check_limits(n: u16, nb_desc: u32) -> Result<(), SetupError> {
        if n > MODEL_MAX_QUEUES {
            return Err(SetupError::Limit {
                what: "queues",
                requested: u32::from(n),
                max: u32::from(MODEL_MAX_QUEUES),
            });
        }
        if nb_desc > MODEL_MAX_DESC {
            return Err(SetupError::Limit {
                what: "descriptors per queue",
                requested: nb_desc,
                max: MODEL_MAX_DESC,
            });
        }
        Ok(())
    }

    fn check_held(&self) -> Result<(), SetupError> {
        if let Some(netdev) = lock(&self.shared.held_by).clone() {
            return Err(busy(&netdev));
        }
        if let Some(netdev) = &self.netdev {
            let flags = crate::sys::net::if_flags(netdev).map_err(|source| SetupError::Verbs {
                call: "SIOCGIFFLAGS",
                object: "the port's netdev",
                source,
            })?;
            if flags & crate::sys::net::IFF_UP != 0 {
                return Err(busy(netdev));
            }
        }
        Ok(())
    }

    /// Queue memory through the application's allocator, checked the way the kernel and the
    /// device need it: page-aligned, large enough, zero-filled (§1.3).
    fn alloc(&self, bytes: usize, object: &'static str) -> Result<Arc<DevMem>, SetupError> {
        let einval = |why: String| SetupError::Verbs {
            call: "ibv_create_cq/qp/wq",
            object,
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
        };
        let Some(a) = &self.allocator else {
            return Err(einval(
                "no queue-buffer allocator set (manadv_set_context_attr must come before creating \
                 raw-path queues; rdma-core v44 fails with EINVAL)"
                    .into(),
            ));
        };
        let mem = a.alloc(bytes).map_err(|source| SetupError::Verbs {
            call: "queue buffer allocator",
            object,
            source,
        })?;
        if !mem.addr().is_multiple_of(4096) || mem.len() < bytes {
            return Err(einval(format!(
                "allocator returned {} bytes at {:#x}: need {bytes} page-aligned bytes",
                mem.len(),
                mem.addr()
            )));
        }
        let mut chunk = [0u8; 4096];
        let mut off = 0;
        while off < bytes {
            let n = chunk.len().min(bytes - off);
            mem.read(off, &mut chunk[..n]);
            if chunk[..n].iter().any(|&b| b != 0) {
                return Err(einval(format!(
                    "allocator returned memory that is not zero-filled (from byte {off}): stale owner bits would read as completions"
                )));
            }
            off += n;
        }
        Ok(mem)
    }

    /// A CQ for a queue of `nb_desc` entries (the engine serves it with its queue).
    /// The port's doorbell page, and a monitor of it for one new queue.
    fn doorbell(&mut self) -> Result<(Arc<DoorbellPage>, Arc<DevMem>), SetupError> {
        let db = match &self.db {
            Some(db) => Arc::clone(db),
            None => Arc::clone(self.db.insert(doorbell_page()?)),
        };
        let monitor = db.monitor().map_err(|source| SetupError::Verbs {
            call: "mmap",
            object: "doorbell monitor page",
            source,
        })?;
        Ok((db, monitor))
    }

    fn new_cq(&mut self, nb_desc: u32) -> Result<CqSpec, SetupError> {
        let mem = self.alloc(queue_bytes(nb_desc as usize * CQE_BYTES), "CQ")?;
        Ok(CqSpec {
            mem,
            count: nb_desc,
            id: self.id(),
        })
    }
}

impl Provider for Model {
    fn set_allocator(&mut self, alloc: Arc<dyn QueueAllocator>) {
        self.allocator = Some(alloc);
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn link(&self) -> Link {
        let e = self.shared.lock();
        // Whoever asks sees the same state the port's events report.
        self.shared.note_link(&e);
        Link {
            up: link_up(&e),
            speed_mbps: 100_000,
            full_duplex: true,
        }
    }

    fn max_queues(&self) -> u16 {
        MODEL_MAX_QUEUES
    }

    fn max_desc(&self) -> u32 {
        MODEL_MAX_DESC
    }

    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError> {
        self.shared.lock().mtu = mtu;
        Ok(())
    }

    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError> {
        let lkey = self.next_lkey;
        self.next_lkey += 1;
        // The model is the DMA device: it must read and write the application's buffers. The
        // one unsafe step of the model, kept to this statement.
        #[allow(unsafe_code)]
        // SAFETY: the view goes into the engine's MR table only, and the registration guard
        // returned below (which mempool drops before unmapping the chunk) removes it; the
        // engine touches the bytes only for posted RX buffers and in-flight TX frames.
        let mem = unsafe { DevMem::for_registered_chunk(chunk) };
        self.shared
            .lock()
            .add_mr(lkey, chunk.addr as u64, mem)
            .map_err(engine_refused("memory region"))?;
        tracing::debug!(target: "pmd::emu", lkey, addr = chunk.addr, len = chunk.len, "memory region registered");
        Ok(Registration::with_guard(
            lkey,
            MrGuard {
                shared: Arc::downgrade(&self.shared),
                lkey,
            },
        ))
    }

    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawTxQueue>, SetupError> {
        Self::check_limits(n, nb_desc)?;
        self.check_held()?;
        let mut out = Vec::new();
        for _ in 0..n {
            let cq = self.new_cq(nb_desc)?;
            // rdma-core sizes the SQ for max_send_wr WQEs of max_send_sge SGEs, computed with
            // the small OOB (§1.3).
            let sq = self.alloc(
                queue_bytes(nb_desc as usize * wqe_bytes(SHORT_OOB_BYTES, MAX_TX_SGES)),
                "SQ",
            )?;
            let (db, monitor) = self.doorbell()?;
            let sq_id = self.id();
            self.shared
                .lock()
                .add_sq(SqSpec {
                    mem: Arc::clone(&sq),
                    id: sq_id,
                    doorbell: Arc::clone(&db),
                    vp_offset: self.vp_offset,
                    cq: cq.clone(),
                })
                .map_err(engine_refused("SQ"))?;
            out.push(RawTxQueue {
                sq,
                sq_id,
                tx_vp_offset: self.vp_offset,
                db_page: Arc::clone(db.mem()),
                db_monitor: Some(monitor),
                cq: cq.mem,
                cq_count: nb_desc,
                cq_id: cq.id,
                owner: self.owner(),
                kick: self.kick(QueueId::Sq(sq_id)),
            });
        }
        lock(&self.shared.queues).0.extend(out.iter().cloned());
        Ok(out)
    }

    fn create_rx_queues(
        &mut self,
        n: u16,
        nb_desc: u32,
        rss: &RssConfig,
    ) -> Result<Vec<RawRxQueue>, SetupError> {
        Self::check_limits(n, nb_desc)?;
        if n == 0 || usize::from(n) > RSS_TABLE_ENTRIES {
            return Err(SetupError::Limit {
                what: "rx queues in the indirection table",
                requested: u32::from(n),
                max: RSS_TABLE_ENTRIES as u32,
            });
        }
        let mut out = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..n {
            let cq = self.new_cq(nb_desc)?;
            let rq = self.alloc(
                queue_bytes(nb_desc as usize * wqe_bytes(SHORT_OOB_BYTES, 1)),
                "RQ",
            )?;
            let (db, monitor) = self.doorbell()?;
            let rq_id = self.id();
            self.shared
                .lock()
                .add_rq(RqSpec {
                    mem: Arc::clone(&rq),
                    id: rq_id,
                    doorbell: Arc::clone(&db),
                    cq: cq.clone(),
                })
                .map_err(engine_refused("RQ"))?;
            ids.push(rq_id);
            out.push(RawRxQueue {
                rq,
                rq_id,
                db_page: Arc::clone(db.mem()),
                db_monitor: Some(monitor),
                cq: cq.mem,
                cq_count: nb_desc,
                cq_id: cq.id,
                owner: self.owner(),
                kick: self.kick(QueueId::Rq(rq_id)),
            });
        }
        lock(&self.shared.queues).1.extend(out.iter().cloned());
        // The indirection table `entry[k] = rq[k mod n]`; the last RQ is the default RX
        // object (§1.6 step 6).
        self.shared
            .lock()
            .set_rss(rss.key, &ids)
            .map_err(engine_refused("RSS indirection table"))?;
        Ok(out)
    }

    fn destroy_queues(&mut self) {
        {
            let mut q = lock(&self.shared.queues);
            if let Some(db) = &self.db {
                let monitors = q.0.iter().filter_map(|t| t.db_monitor.as_ref());
                for m in monitors.chain(q.1.iter().filter_map(|r| r.db_monitor.as_ref())) {
                    db.drop_monitor(m);
                }
            }
            *q = (Vec::new(), Vec::new());
        }
        let mut e = self.shared.lock();
        e.clear_rss();
        let sqs: Vec<u32> = e.sqs.iter().map(|q| q.id).collect();
        let rqs: Vec<u32> = e.rqs.iter().map(|q| q.id).collect();
        for id in sqs {
            let _ = e.remove_sq(id);
        }
        for id in rqs {
            let _ = e.remove_rq(id);
        }
    }

    /// The model's counters (`dev_*`), then its wire's (`wire_*`, see [`wire::Wire::stats`]).
    /// Each with what it says about lost frames: error completions are the driver's
    /// (`ierrors`, `oerrors`) and frames with no WQE its `imissed`; frames dropped after a
    /// normal TX completion, or without any RX completion, only the model can count.
    fn xstats(&self) -> Vec<Xstat> {
        let e = self.shared.lock();
        let s = e.stats;
        let mut v = vec![
            Xstat::new("dev_tx_frames", s.tx_frames, Loss::None),
            Xstat::new("dev_tx_bytes", s.tx_bytes, Loss::None),
            Xstat::new("dev_tx_errors", s.tx_errors, Loss::Counted),
            Xstat::new("dev_tx_wire_drops", s.tx_wire_drops, Loss::Tx),
            Xstat::new("dev_tx_mtu_errors", s.tx_mtu_errors, Loss::Counted),
            Xstat::new("dev_rx_frames", s.rx_frames, Loss::None),
            Xstat::new("dev_rx_bytes", s.rx_bytes, Loss::None),
            Xstat::new("dev_rx_no_wqe", s.rx_no_wqe, Loss::Counted),
            Xstat::new("dev_rx_truncated", s.rx_truncated, Loss::Counted),
            Xstat::new("dev_rx_fault_drops", s.rx_fault_drops, Loss::Rx),
            Xstat::new("dev_rx_destroyed_drops", s.rx_destroyed_drops, Loss::Rx),
            // Fewer than frames with `cqe-coalesce=1`.
            Xstat::new("dev_rx_cqes", s.rx_cqes, Loss::None),
            // One per burst: the driver suppresses all but the last WQE's.
            Xstat::new("dev_tx_cqes", s.tx_cqes, Loss::None),
            Xstat::new("dev_bad_doorbells", s.bad_doorbells, Loss::None),
        ];
        v.extend(e.wire_stats().into_iter().map(|x| x.prefixed("wire_")));
        v
    }

    /// Frames with no RX WQE to go to, and frames the wire lost before the model saw them
    /// ([`wire::RX_DROPS`]: a full receive ring of an afpacket wire).
    fn rx_missed(&self) -> u64 {
        let e = self.shared.lock();
        e.stats.rx_no_wqe + wire::rx_drops(&e.wire_stats())
    }

    fn event_fd(&self) -> Option<RawFd> {
        self.shared.events.fd()
    }

    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        self.shared.events.take(out);
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // The engine thread stops when `_thread` is dropped, after this.
        *lock(&self.shared.queues) = (Vec::new(), Vec::new());
    }
}

/// Deregisters a memory region when the pool drops its registration (before unmapping).
struct MrGuard {
    shared: std::sync::Weak<Shared>,
    lkey: u32,
}

impl Drop for MrGuard {
    fn drop(&mut self) {
        if let Some(s) = self.shared.upgrade() {
            s.lock().remove_mr(self.lkey);
        }
    }
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
