//! The NIC behind the fake's MANA queues: pmd's device model ([`Engine`]) plays the hardware
//! for the queues an application creates with verbs calls, so that WQEs it posts and
//! doorbells it rings put frames on the port's wire, and frames from the wire land in its
//! posted buffers with CQEs, as on a MANA VF.
//!
//! One engine per vPort, i.e. per (device, IB port): a vPort is one NIC port with one wire
//! (`ports/N/fake_rdma_wire` of the world), whichever contexts create queues on it, so two
//! contexts on one port share an engine instead of opening the wire twice. The engine starts
//! (on its own thread, `fakenic-D-P`) when the first queue of the vPort is created and stops
//! when the last one goes, or when the contexts that held them are closed; except when the
//! device is serviced (`events.rs`): its contexts' queues leave at once, and the engine
//! keeps running with none, its wire open (the port stays when the VF goes), dropping what
//! arrives, until a queue is created on the device again. The engine runs inline (the
//! application's polling threads drive it, its thread stopped) from the first kick handle
//! opened on one of its queues (`crate::kick`).
//!
//! What reaches the engine, and when (the hardware objects `mana_ib` creates):
//! * a send QP adds its SQ and send CQ when it is created (`mana_ib_create_qp_raw` creates
//!   both on the NIC); `ibv_destroy_qp` removes them before the send buffer goes back to
//!   the application's allocator;
//! * an RSS QP adds the RQ and CQ of each WQ of its indirection table, then sets the
//!   Toeplitz key, the table (the WQs in order) and the default RX object (`mana_ib_create_qp_rss`
//!   creates the WQ objects and configures the vPort's steering only then: a WQ alone is
//!   pinned memory, and its id and its CQ's id are unknown until this point, v44); its
//!   destruction removes them, before any WQ or CQ memory can be freed (`EBUSY` until then);
//! * memory regions of the device, whatever the PD, are registered in each of its engines
//!   (the model does not check that a WQE's key belongs to the queue's PD).
//!
//! Every doorbell of a context is rung on its one page ([`DoorbellPage`], shared by its
//! queues on every vPort). The MTU is 1500, the kernel netdev's default on MANA.
//!
//! Two differences from hardware, both of the memory-watching kind: the engine may miss a
//! doorbell that a sibling queue overwrote before it looked, until that queue rings again
//! (see `pmd::emu::mana`); and registered memory must stay mapped until `ibv_dereg_mr`
//! (hardware keeps its pinned pages alive instead: a program that frees registered memory
//! and still has buffers of it posted would make the engine write into freed memory).

use crate::kick::{Live, Runner};
use crate::verbs::{device_name, Device};
use pmd::emu::mana::{CqSpec, DoorbellPage, Engine, RqSpec, SqSpec};
use pmd::emu::thread::EngineCore;
use pmd::emu::wire;
use pmd::sys::DevMem;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The vPort MTU the engines enforce (the kernel netdev's default MTU on MANA).
pub const MTU: u16 = 1500;
/// Bytes of a doorbell page (`mana_alloc_context` maps one page).
const DB_PAGE_BYTES: usize = 4096;

/// A queue ring as the fake created it: the application's buffer and the queue id.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    /// Start of the buffer (from the application's allocator, page-aligned).
    pub buf: *mut c_void,
    /// Its length (what `manadv_init_obj` reports).
    pub len: usize,
    /// The queue id (the id its doorbells carry).
    pub id: u32,
}

/// A completion queue as the fake created it.
#[derive(Debug, Clone, Copy)]
pub struct CqRing {
    /// The ring.
    pub ring: Ring,
    /// Entries (`manadv_cq.count`).
    pub count: u32,
}

/// A memory region the engines may reach.
struct MrRec {
    dev: u32,
    ctx: usize,
    iova: u64,
    addr: usize,
    len: usize,
}

/// The engine of one vPort and how many queues it serves.
struct PortNic {
    runner: Runner<Engine>,
    queues: usize,
}

/// Every engine of the process, the memory regions they may reach, and the contexts'
/// doorbell pages as the engines see them.
#[derive(Default)]
pub struct Nics {
    engines: BTreeMap<(u32, u32), PortNic>,
    mrs: BTreeMap<u32, MrRec>,
    pages: BTreeMap<usize, Arc<DoorbellPage>>,
    /// Doorbell monitors (`crate::monitor`) by (context, is RX, queue id): the page of the
    /// context's command file each one is, and its slot there.
    monitors: BTreeMap<(usize, bool, u32), (Arc<DevMem>, u32)>,
    /// Monitors whose queue left the device (destroyed, or its context disassociated), by
    /// context: no engine reads them, but they stay mapped, and their slots taken, until the
    /// context is closed. The program may still write to one until its user-space queue
    /// goes (after a disassociation, until it destroys the queue), and a slot reused sooner
    /// would let a late write of the old queue land in a new queue's monitor.
    retired: BTreeMap<usize, Vec<(Arc<DevMem>, u32)>>,
    /// Devices being serviced: their engines keep running (their wires open) with no queue,
    /// until a queue is created on the device again.
    held: BTreeSet<u32>,
    /// What the engines stopped so far dropped where no driver can see it.
    stopped_drops: DeviceDrops,
}

/// Frames the device models dropped where a driver over verbs cannot see it (no buffer
/// posted, a link fault, the wire refusing a frame, no queue to steer to): on hardware the
/// NIC's own counters, which pmd does not read. Reported at exit, so that a soak run can
/// account for every frame; by counter name, summed over every engine of the process.
#[derive(Debug, Default, Clone)]
pub struct DeviceDrops(pub BTreeMap<&'static str, u64>);

impl DeviceDrops {
    /// Adds `counts` (name, frames).
    pub fn add(&mut self, counts: &[(&'static str, u64)]) {
        for &(n, v) in counts {
            *self.0.entry(n).or_default() += v;
        }
    }
}

/// Frames an engine's wire holds that no far end will read (its far end went away).
pub fn stranded(wire_stats: &[pmd::ethdev::Xstat]) -> u64 {
    wire_stats
        .iter()
        .find(|x| x.name == pmd::emu::wire::TX_STRANDED)
        .map_or(0, |x| x.value)
}

/// The MANA model's counters of frames its driver never sees dropped, and its wire's
/// stranded frames.
fn hidden_drops(e: &Engine) -> [(&'static str, u64); 5] {
    let s = e.stats();
    [
        ("tx_stranded", stranded(&e.wire_stats())),
        ("rx_no_wqe", s.rx_no_wqe),
        ("rx_fault_drops", s.rx_fault_drops),
        ("rx_destroyed_drops", s.rx_destroyed_drops),
        ("tx_wire_drops", s.tx_wire_drops),
    ]
}

impl std::fmt::Debug for Nics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Nics({} engines, {} MRs, {} doorbell pages)",
            self.engines.len(),
            self.mrs.len(),
            self.pages.len()
        )
    }
}

/// A view of queue memory for the engine.
///
/// # Safety
/// `r.buf..r.buf + r.len` must stay valid until the queue has been removed from its engine
/// (under the engine lock), and nothing may hold Rust references into it meanwhile.
unsafe fn ring_mem(r: Ring) -> Arc<DevMem> {
    // SAFETY: forwarded to the caller.
    Arc::new(unsafe { DevMem::from_raw(r.buf.cast(), r.len) })
}

fn cq_spec(c: CqRing) -> CqSpec {
    CqSpec {
        // SAFETY: a CQ's buffer is freed by `ibv_destroy_cq`, which refuses (EBUSY) while
        // the QP or WQ it serves exists; the engine gets it with that queue, and the queue's
        // removal (QP destruction) comes first. The application reads it through raw
        // pointers (C, or pmd's `DevMem`), never through Rust references.
        mem: unsafe { ring_mem(c.ring) },
        count: c.count,
        id: c.ring.id,
    }
}

impl Nics {
    /// The doorbell page of context `ctx` (mapped at `db`), shared by all its queues.
    fn page(&mut self, ctx: usize, db: *mut c_void) -> Arc<DoorbellPage> {
        let p = self.pages.entry(ctx).or_insert_with(|| {
            // SAFETY: `db` is the context's doorbell page, one page mapped read/write by
            // `ibv_open_device`; `ibv_close_device` unmaps it only after `close_context`
            // dropped this record and every queue of the context left its engine (the
            // engines drop a page with its last queue). The application only stores to it.
            let mem = unsafe { DevMem::from_raw(db.cast(), DB_PAGE_BYTES) };
            DoorbellPage::new(Arc::new(mem)).expect("a mapped page is page-aligned and 4 KiB")
        });
        Arc::clone(p)
    }

    /// The engine of `port` on `dev`, started (wire opened, the device's memory regions
    /// registered) if it is not running.
    fn engine(&mut self, dev: &Device, port: u32, call: &str) -> Result<&mut PortNic, c_int> {
        let key = (dev.index, port);
        // A queue again after a servicing: the engine that kept the wire serves it, and
        // stops with the last queue as usual.
        self.held.remove(&dev.index);
        if !self.engines.contains_key(&key) {
            let spec = &dev.view.ports[port as usize - 1].wire;
            let w = wire::open(spec).map_err(|e| {
                eprintln!(
                    "fake-rdma: {call}: {} port {port}: the device model cannot open its wire {spec}: {e}",
                    device_name(dev)
                );
                libc::EIO
            })?;
            let mut e = Engine::new(w);
            e.set_mtu(MTU);
            let view = &dev.view.ports[port as usize - 1];
            if let Some(plan) = view.fault_plan(pmd::emu::faults::MANA_KINDS) {
                let _ = e.cycle_faults(Some(&plan));
            }
            for (&lkey, m) in self.mrs.iter().filter(|(_, m)| m.dev == dev.index) {
                // SAFETY: as in `add_mr`: the application keeps registered memory mapped until
                // `ibv_dereg_mr`, which removes the view from every engine first.
                let mem = unsafe { DevMem::from_raw(m.addr as *mut u8, m.len) };
                let _ = e.add_mr(lkey, m.iova, mem);
            }
            let runner =
                Runner::spawn(e, format!("fakenic-{}-{port}", dev.index)).map_err(|e| {
                    eprintln!("fake-rdma: {call}: starting the device model's thread: {e}");
                    libc::ENOMEM
                })?;
            self.engines.insert(key, PortNic { runner, queues: 0 });
        }
        let nic = self.engines.get_mut(&key).expect("inserted above");
        // An inline engine kept through a servicing: its queues' kicks drive it again.
        nic.runner.set_queueless(false);
        Ok(nic)
    }

    /// What every engine of the process, stopped or running, dropped unseen by its driver.
    pub fn device_drops(&self) -> DeviceDrops {
        let mut d = self.stopped_drops.clone();
        for n in self.engines.values() {
            d.add(&hidden_drops(&n.runner.core().lock()));
        }
        d
    }

    /// Device `dev` is being serviced: its engines keep running with no queue (the vPort's
    /// wire stays, as the port does when a VF goes away), dropping what arrives, until a
    /// queue is created on the device again.
    pub fn hold(&mut self, dev: u32) {
        self.held.insert(dev);
    }

    /// Stops the engine of `key` if it serves no queue any more (and its device is not
    /// held by a servicing).
    fn stop_if_idle(&mut self, key: (u32, u32)) {
        if self.held.contains(&key.0) {
            if let Some(n) = self.engines.get_mut(&key).filter(|n| n.queues == 0) {
                // Kept with no queue: an inline engine needs a thread meanwhile.
                n.runner.set_queueless(true);
            }
            return;
        }
        if self.engines.get(&key).is_some_and(|n| n.queues == 0) {
            // Dropping the runner stops and joins its thread (its step, if any, is over),
            // then drops the engine and its wire (kick handles keep an empty core).
            if let Some(n) = self.engines.remove(&key) {
                let counts = hidden_drops(&n.runner.core().lock());
                drop(n);
                self.stopped_drops.add(&counts);
            }
        }
    }

    /// The engine of `port` on `dev`, switched to inline (see `crate::kick`), for a kick
    /// handle; `None` if it does not run.
    pub fn go_inline(&mut self, dev: u32, port: u32) -> Option<Arc<EngineCore<Live<Engine>>>> {
        Some(self.engines.get_mut(&(dev, port))?.runner.go_inline())
    }

    /// A send QP's SQ and send CQ, on `port` of `dev`, rung on `ctx`'s doorbell page `db`.
    ///
    /// # Safety
    /// `sq.buf` and `cq.ring.buf` are the QP's send buffer and its send CQ's buffer, valid
    /// until [`Nics::remove_tx`] (the send buffer) and until the CQ is destroyed, which
    /// cannot happen before the QP.
    ///
    /// # Errors
    /// `EIO` if the wire cannot be opened, `EINVAL` if the engine refuses the rings.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn add_tx(
        &mut self,
        dev: &Device,
        port: u32,
        ctx: usize,
        db: *mut c_void,
        sq: Ring,
        vp_offset: u16,
        cq: CqRing,
        call: &str,
    ) -> Result<(), c_int> {
        let doorbell = self.page(ctx, db);
        let key = (dev.index, port);
        let nic = self.engine(dev, port, call)?;
        let spec = SqSpec {
            // SAFETY: the caller's contract: the send buffer lives until `remove_tx`.
            mem: unsafe { ring_mem(sq) },
            id: sq.id,
            doorbell,
            vp_offset,
            cq: cq_spec(cq),
        };
        let r = nic.runner.core().lock().add_sq(spec);
        match r {
            Ok(()) => {
                nic.queues += 1;
                Ok(())
            }
            Err(e) => {
                eprintln!("fake-rdma: {call}: the device model refuses the send queue: {e}");
                self.stop_if_idle(key);
                Err(libc::EINVAL)
            }
        }
    }

    /// Removes a send QP's SQ and CQ from its engine (under the engine lock: once this
    /// returns the engine never touches them again), stopping the engine with its last queue.
    pub fn remove_tx(&mut self, dev: u32, port: u32, sq_id: u32) {
        self.drop_monitors(false, &[sq_id]);
        let key = (dev, port);
        if let Some(nic) = self.engines.get_mut(&key) {
            if nic.runner.core().lock().remove_sq(sq_id).is_ok() {
                nic.queues -= 1;
            }
        }
        self.stop_if_idle(key);
    }

    /// An RSS QP's receive queues (each WQ's RQ and CQ, in table order) and its steering:
    /// Toeplitz `key`, the table, the default RX object.
    ///
    /// # Safety
    /// Every WQ and CQ buffer stays valid until [`Nics::remove_rss`]: WQs and CQs cannot be
    /// destroyed while the RSS QP exists.
    ///
    /// # Errors
    /// As [`Nics::add_tx`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn add_rss(
        &mut self,
        dev: &Device,
        port: u32,
        ctx: usize,
        db: *mut c_void,
        rqs: &[(Ring, CqRing)],
        rss_key: [u8; 40],
        call: &str,
    ) -> Result<(), c_int> {
        let doorbell = self.page(ctx, db);
        let key = (dev.index, port);
        let nic = self.engine(dev, port, call)?;
        let mut e = nic.runner.core().lock();
        let mut added = Vec::new();
        let mut r = Ok(());
        for &(rq, cq) in rqs {
            let spec = RqSpec {
                // SAFETY: the caller's contract: the WQ buffer lives until `remove_rss`.
                mem: unsafe { ring_mem(rq) },
                id: rq.id,
                doorbell: Arc::clone(&doorbell),
                cq: cq_spec(cq),
            };
            r = e.add_rq(spec);
            if r.is_err() {
                break;
            }
            added.push(rq.id);
        }
        let ids: Vec<u32> = rqs.iter().map(|(rq, _)| rq.id).collect();
        r = r.and_then(|()| e.set_rss(rss_key, &ids));
        if r.is_ok() {
            // MANA_CONFIG_VPORT_RX's cqe_coalescing_enable: a newer kernel sets it for every
            // RSS QP (spec mana.md §7.4).
            e.set_rx_coalesce(dev.view.ports[port as usize - 1].coalesce);
        }
        match r {
            Ok(()) => {
                nic.queues += added.len();
                Ok(())
            }
            Err(err) => {
                for id in added {
                    let _ = e.remove_rq(id);
                }
                drop(e);
                eprintln!("fake-rdma: {call}: the device model refuses the receive queues: {err}");
                self.stop_if_idle(key);
                Err(libc::EINVAL)
            }
        }
    }

    /// Removes an RSS QP's receive queues from their engine (under its lock), stopping the
    /// engine with its last queue. Table entries that named them find no WQE from then on.
    pub fn remove_rss(&mut self, dev: u32, port: u32, rq_ids: &[u32]) {
        self.drop_monitors(true, rq_ids);
        let key = (dev, port);
        if let Some(nic) = self.engines.get_mut(&key) {
            let mut e = nic.runner.core().lock();
            for &id in rq_ids {
                if e.remove_rq(id).is_ok() {
                    nic.queues -= 1;
                }
            }
        }
        self.stop_if_idle(key);
    }

    /// A memory region of `dev`, registered by context `ctx`: `addr..addr + len` reached
    /// through WQE addresses `iova..` under `lkey`, in every engine of the device (now and
    /// when one starts).
    pub fn add_mr(&mut self, dev: u32, ctx: usize, lkey: u32, iova: u64, addr: usize, len: usize) {
        for (_, nic) in self.engines.iter().filter(|((d, _), _)| *d == dev) {
            // SAFETY: `ibv_reg_mr` checked that the range is mapped; the application keeps it
            // mapped until `ibv_dereg_mr` (the verbs contract; see the module docs), which
            // removes this view from every engine under its lock first (`remove_mr`). The
            // engine touches it only for buffers the application posted.
            let mem = unsafe { DevMem::from_raw(addr as *mut u8, len) };
            let _ = nic.runner.core().lock().add_mr(lkey, iova, mem);
        }
        self.mrs.insert(
            lkey,
            MrRec {
                dev,
                ctx,
                iova,
                addr,
                len,
            },
        );
    }

    /// Deregisters `lkey` from every engine (under their locks) and forgets it.
    pub fn remove_mr(&mut self, lkey: u32) {
        if let Some(m) = self.mrs.remove(&lkey) {
            for (_, nic) in self.engines.iter().filter(|((d, _), _)| *d == m.dev) {
                nic.runner.core().lock().remove_mr(lkey);
            }
        }
    }

    /// Context `ctx` is being closed: its memory regions leave the engines and its doorbell
    /// page is forgotten. Its queues must have been removed already.
    pub fn close_context(&mut self, ctx: usize) {
        let keys: Vec<u32> = self
            .mrs
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            self.remove_mr(k);
        }
        self.pages.remove(&ctx);
        self.monitors.retain(|&(c, _, _), _| c != ctx);
        // The program's views of them went with its queues, before the context closes.
        self.retired.remove(&ctx);
    }

    /// A doorbell monitor for queue `id` (RX or TX) of context `ctx`, whose command file is
    /// `cmd_fd`: page `slot + 1` of that file, which the engine reads for the queue's
    /// doorbells from now on (see `crate::monitor`). The same one again for a queue that has
    /// one. Returns the page and its offset in the file.
    ///
    /// # Errors
    /// `ENOENT`: no queue of the context is on an engine; the file could not grow or be
    /// mapped (its errno).
    pub fn monitor(
        &mut self,
        ctx: usize,
        cmd_fd: c_int,
        is_rx: bool,
        id: u32,
    ) -> Result<(Arc<DevMem>, u64), c_int> {
        let page_bytes = DB_PAGE_BYTES as u64;
        if let Some((m, slot)) = self.monitors.get(&(ctx, is_rx, id)) {
            return Ok((Arc::clone(m), (u64::from(*slot) + 1) * page_bytes));
        }
        let page = self.pages.get(&ctx).ok_or(libc::ENOENT)?;
        let used: BTreeSet<u32> = self
            .monitors
            .iter()
            .filter(|(&(c, _, _), _)| c == ctx)
            .map(|(_, &(_, s))| s)
            .chain(
                self.retired
                    .get(&ctx)
                    .into_iter()
                    .flatten()
                    .map(|&(_, s)| s),
            )
            .collect();
        let slot = (0..).find(|s| !used.contains(s)).unwrap_or(0);
        let offset = (u64::from(slot) + 1) * page_bytes;
        let errno = || {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        // SAFETY: fstat/ftruncate on the context's own command file, open while it is.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(cmd_fd, &mut st) != 0 {
                return Err(errno());
            }
            let need = offset + page_bytes;
            if (st.st_size as u64) < need && libc::ftruncate(cmd_fd, need as libc::off_t) != 0 {
                return Err(errno());
            }
        }
        // SAFETY: the command file is open while the context is (`close_context` drops the
        // monitors before `ibv_close_device` closes it); the mapping is ours.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(cmd_fd) };
        let mem = DevMem::map_fd(fd, offset, DB_PAGE_BYTES)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let m = page.add_monitor(Arc::new(mem));
        self.monitors
            .insert((ctx, is_rx, id), (Arc::clone(&m), slot));
        Ok((m, offset))
    }

    /// Stops reading the monitors of queues `ids` (they left the device) and keeps them
    /// mapped until their context closes (`retired`): queue ids are unique in the process,
    /// whichever context.
    fn drop_monitors(&mut self, is_rx: bool, ids: &[u32]) {
        let gone: Vec<(usize, bool, u32)> = self
            .monitors
            .keys()
            .filter(|&&(_, rx, id)| rx == is_rx && ids.contains(&id))
            .copied()
            .collect();
        for k in gone {
            if let Some((m, slot)) = self.monitors.remove(&k) {
                if let Some(p) = self.pages.get(&k.0) {
                    p.drop_monitor(&m);
                }
                self.retired.entry(k.0).or_default().push((m, slot));
            }
        }
    }

    /// Running engines (for the tests' "nothing left" checks).
    pub fn running(&self) -> usize {
        self.engines.len()
    }

    /// Engines that a thread of the fake runs (not inline).
    pub fn threads(&self) -> usize {
        self.engines
            .values()
            .filter(|n| n.runner.has_thread())
            .count()
    }
}
