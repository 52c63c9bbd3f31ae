//! The MANA device model as a [`Provider`]: the queues, memory regions, RSS and events a
//! port asks for, made in the model's engine (as the mlx5 model's `port.rs`).
#![deny(unsafe_code)]

use super::*;

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
    /// The RX queues' parked buffers, kept until the engine no longer serves their RQs
    /// (`destroy_queues`, or the engine stopped: last field, after `_thread`).
    rx_parked: Option<Arc<crate::ethdev::Parked>>,
    /// The same for the TX queues' frames in flight.
    tx_parked: Option<Arc<crate::ethdev::Parked>>,
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
            rx_parked: None,
            tx_parked: None,
        }
    }

    /// A handle to step the model and inject faults.
    pub fn handle(&self) -> ModelHandle {
        ModelHandle::new(&self.shared)
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
    /// The port's doorbell page (one per port, shared by its queues; see the module docs),
    /// and a monitor of it for one new queue. Both come from the queue allocator: in shared
    /// files when the driver exports queues to another process, which must ring them.
    fn doorbell(&mut self) -> Result<(Arc<DoorbellPage>, Arc<DevMem>), SetupError> {
        let page = crate::hw::mana::doorbell::PAGE_BYTES;
        let db = match &self.db {
            Some(db) => Arc::clone(db),
            None => {
                let mem = self.alloc(page, "doorbell page")?;
                let db = DoorbellPage::new(mem).map_err(engine_refused("doorbell page"))?;
                Arc::clone(self.db.insert(db))
            }
        };
        let monitor = db.add_monitor(self.alloc(page, "doorbell monitor page")?);
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
        // The next queue makes a doorbell page from the new allocator (queues made before
        // keep the page they hold).
        self.db = None;
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
            mempool::Lkey(lkey),
            self.handle().mr_guard(lkey),
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
                parked: Arc::clone(
                    self.tx_parked
                        .get_or_insert_with(crate::ethdev::Parked::new),
                ),
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
        let parked = crate::ethdev::Parked::new();
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
                parked: Arc::clone(&parked),
                kick: self.kick(QueueId::Rq(rq_id)),
            });
        }
        self.rx_parked = Some(parked);
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
        // The engine serves none of their queues now: the buffers they left may go.
        self.rx_parked = None;
        self.tx_parked = None;
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
        // Reading the wire's counters wrote out what a capture buffered: a failure there is
        // reported now, not at the next look.
        self.shared.events.note_capture(e.capture_error());
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
