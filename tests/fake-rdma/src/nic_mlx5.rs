//! The NIC behind the fake's mlx5 queues: pmd's mlx5 device model ([`Engine`]) plays a
//! ConnectX for the queues an application creates with verbs calls, so that the WQEs it
//! posts and the doorbell records it writes put frames on the port's wire, and frames
//! from the wire land in its posted receive buffers with CQEs.
//!
//! One engine per mlx5 device (one port each, on the port's wire `ports/1/fake_rdma_wire`),
//! whichever contexts create queues on it. It starts (on its own thread, `fakenic-D-1`)
//! with the first queue it serves and stops with the last one, or when the contexts that
//! held them close; a servicing (`events.rs`) takes the queues away at once but keeps the
//! engine and its wire, with no queue, until a queue is created on the device again. It runs
//! inline (its thread stopped) from the first kick handle opened on one of its queues
//! (`crate::kick`).
//!
//! What reaches the engine, and when (the hardware objects' states in `mlx5_ib`):
//! * a raw QP's SQ and its send CQ when the QP goes RTR → RTS (`modify_raw_packet_qp`:
//!   RTR2RTS makes the SQ ready); at RESET the SQ's counter restarts at 0
//!   ([`Engine::sq_to_reset`] / [`Engine::sq_to_rts`], under the engine's lock together with libmlx5's zeroing of the
//!   doorbell record), and again at the next RTS; `ibv_destroy_qp` removes them before the
//!   SQ buffer goes back to the application's allocator;
//! * a WQ's RQ and its CQ when the WQ first goes RDY, with compressed CQEs when the CQ was
//!   created with them ([`Engine::set_rx_compression`]); a later RESET → RDY restarts its
//!   counter ([`Engine::rq_to_reset`] / [`Engine::rq_to_rdy`]); `ibv_destroy_wq` removes them;
//! * the RSS setting (key, merged hash fields, the table's RQs) of the hash QPs that carry
//!   flow rules, and the rules themselves, which decide which frames from the wire reach
//!   the RQs at all ([`crate::mlx5::flow`]): a steering filter sits between the wire and
//!   the engine, and drops what no rule takes (on hardware: the kernel's netdev gets it);
//! * memory regions of the device, whatever the PD, in each of its engines.
//!
//! Doorbells: an SQ starts on the 8-byte write to its BlueFlame register in the UAR page the
//! context mapped (`bf.reg`, either half), which names the WQE; the engine samples the
//! register and checks each write against the SQ record (`dbrec[1]`) and the ring (pmd's
//! `emu::mlx5` engine, `uar.rs`; spec mlx5.md §3.1, §8 item 2). A register may be shared by
//! several QPs of the context (rdma-core's shared registers, or the non-cached UAR under
//! `MLX5_SHUT_UP_BF`): each write goes to the SQ it names. An RQ is served as its record
//! (`dbrec[0]`) says.

use crate::kick::{Live, Runner};
use crate::mlx5::cq::Cq;
use crate::mlx5::flow::{Steering, Tir};
use crate::nic::DeviceDrops;
use crate::verbs::{device_name, Device};
use pmd::emu::mlx5::{CqSpec, Engine, RqSpec, RxHashFields, SqSpec, Steer};
use pmd::emu::thread::EngineCore;
use pmd::emu::wire::{self, Wire};
use pmd::sys::DevMem;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A send queue as the fake created it.
#[derive(Debug, Clone, Copy)]
pub struct SqRing {
    /// The SQ buffer (`wqe_cnt` WQEBBs).
    pub buf: *mut c_void,
    /// WQEBBs.
    pub wqe_cnt: u32,
    /// SQ number.
    pub sqn: u32,
    /// The QP's doorbell record (8 bytes).
    pub dbrec: *mut u32,
    /// Its BlueFlame register (`bf.reg`: two halves of `bf_size` bytes, or 8 bytes of a
    /// doorbell-only register).
    pub bf_reg: *mut c_void,
    /// `bf.size` as `mlx5dv_init_obj` reports it (0: doorbell-only register).
    pub bf_size: u32,
    /// Inline header bytes every SEND WQE must carry.
    pub min_inline: u16,
}

/// A receive queue as the fake created it.
#[derive(Debug, Clone, Copy)]
pub struct RqRing {
    /// The ring.
    pub buf: *mut c_void,
    /// WQEs.
    pub wqe_cnt: u32,
    /// Bytes per WQE.
    pub stride: u32,
    /// RQ number.
    pub rqn: u32,
    /// The WQ's doorbell record (8 bytes; the counter at 0).
    pub dbrec: *mut u32,
    /// Strip C-VLAN tags.
    pub vlan_strip: bool,
}

/// A completion queue as the fake created it.
#[derive(Debug, Clone, Copy)]
pub struct CqRing {
    buf: *mut c_void,
    cqe_cnt: u32,
    cqe_sz: u32,
    dbrec: *mut u32,
    cqn: u32,
}

/// The ring of a CQ.
pub fn cq_ring(c: &Cq) -> CqRing {
    CqRing {
        buf: c.buf.ptr,
        cqe_cnt: c.ncqe,
        cqe_sz: c.cqe_sz,
        dbrec: c.dbrec.ptr,
        cqn: c.cqn,
    }
}

/// A view of memory the application owns.
///
/// # Safety
/// `p..p + len` must stay valid until the queue using it has left its engine (under the
/// engine lock), and nobody may hold Rust references into it meanwhile.
unsafe fn mem(p: *mut c_void, len: usize) -> Arc<DevMem> {
    // SAFETY: forwarded to the caller.
    Arc::new(unsafe { DevMem::from_raw(p.cast(), len) })
}

/// # Safety
/// As [`mem`], for the CQ's ring and record.
unsafe fn cq_spec(c: CqRing, call: &str) -> Result<CqSpec, c_int> {
    if c.cqe_sz != 64 {
        crate::state::die(
            call,
            "128-byte CQEs are not modelled by the device model: create the CQ with 64-byte CQEs",
        );
    }
    Ok(CqSpec {
        // SAFETY: the caller's contract.
        buf: unsafe { mem(c.buf, c.cqe_cnt as usize * 64) },
        cqe_cnt: c.cqe_cnt,
        // SAFETY: as above; a record is 8 bytes.
        dbrec: unsafe { mem(c.dbrec.cast(), 8) },
        cqn: c.cqn,
    })
}

/// The wire as the engine sees it: frames from the far end pass the port's steering rules
/// first; what no rule takes goes elsewhere (the kernel's netdev on hardware).
struct SteeredWire {
    inner: Box<dyn Wire>,
    steering: Arc<Mutex<Steering>>,
    /// Frames no rule of the application took (the kernel's, on hardware: its netdev
    /// receives them; lost to the application either way).
    not_taken: Arc<AtomicU64>,
}

impl Wire for SteeredWire {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.inner.send(frame)
    }

    fn flush(&mut self) {
        self.inner.flush();
    }

    fn holds_arrivals(&self) -> bool {
        self.inner.holds_arrivals()
    }

    fn stats(&self) -> Vec<pmd::ethdev::Xstat> {
        self.inner.stats()
    }

    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            let n = self.inner.recv(buf)?;
            let s = self.steering.lock().unwrap_or_else(|p| p.into_inner());
            if s.accepts(&buf[..n.min(buf.len())]) {
                return Some(n);
            }
            self.not_taken.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn peer_alive(&self) -> bool {
        self.inner.peer_alive()
    }

    fn peer_attached(&self) -> bool {
        self.inner.peer_attached()
    }

    fn describe(&self) -> String {
        format!("{} (steered)", self.inner.describe())
    }
}

/// A memory region the engines may reach.
struct MrRec {
    dev: u32,
    ctx: usize,
    iova: u64,
    addr: usize,
    len: usize,
}

/// One device's port.
#[derive(Default)]
struct PortNic {
    runner: Option<Runner<Engine>>,
    queues: usize,
    steering: Arc<Mutex<Steering>>,
    rss: Vec<Tir>,
    /// Frames its steering gave no queue of the application, over the port's life.
    not_taken: Arc<AtomicU64>,
}

/// Every mlx5 engine of the process and the memory regions they may reach.
#[derive(Default)]
pub struct Mlx5Nics {
    ports: BTreeMap<u32, PortNic>,
    mrs: BTreeMap<u32, MrRec>,
    /// Devices being serviced: their engines keep running (their wires open) with no queue,
    /// until a queue is created on the device again.
    held: BTreeSet<u32>,
    /// What the engines stopped so far dropped where no driver can see it.
    stopped_drops: DeviceDrops,
}

/// The mlx5 model's counters of frames its driver never sees dropped (an error CQE tells the
/// driver of the others).
fn hidden_drops(e: &Engine) -> [(&'static str, u64); 7] {
    let s = e.stats();
    [
        ("tx_stranded", crate::nic::stranded(&e.wire_stats())),
        ("rx_no_wqe", s.rx_no_wqe),
        ("rx_fault_drops", s.rx_fault_drops),
        ("rx_unsteered_drops", s.rx_unsteered_drops),
        ("rx_cq_full", s.rx_cq_full),
        ("tx_wire_drops", s.tx_wire_drops),
        ("tx_mtu_drops", s.tx_mtu_drops),
    ]
}

impl std::fmt::Debug for Mlx5Nics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Mlx5Nics({} engines, {} MRs)",
            self.running(),
            self.mrs.len()
        )
    }
}

impl Mlx5Nics {
    /// The running engine of `dev`, started (wire opened, the device's memory regions and
    /// RSS setting given) if it is not.
    fn engine(&mut self, dev: &Device, call: &str) -> Result<&mut PortNic, c_int> {
        // A queue again after a servicing: the engine that kept the wire serves it.
        self.held.remove(&dev.index);
        let port = self.ports.entry(dev.index).or_default();
        if port.runner.is_none() {
            let spec = &dev.view.ports[0].wire;
            let w = wire::open(spec).map_err(|e| {
                eprintln!(
                    "fake-rdma: {call}: {} port 1: the device model cannot open its wire {spec}: {e}",
                    device_name(dev)
                );
                libc::EIO
            })?;
            let mut e = Engine::new(Box::new(SteeredWire {
                inner: w,
                steering: Arc::clone(&port.steering),
                not_taken: Arc::clone(&port.not_taken),
            }));
            e.set_mtu(crate::nic::MTU);
            if let Some(plan) = dev.view.ports[0].fault_plan(pmd::emu::faults::MLX5_KINDS) {
                let _ = e.cycle_faults(Some(&plan));
            }
            for (&lkey, m) in self.mrs.iter().filter(|(_, m)| m.dev == dev.index) {
                // SAFETY: as in `add_mr`.
                let mem = unsafe { DevMem::from_raw(m.addr as *mut u8, m.len) };
                let _ = e.add_mr(lkey, m.iova, Arc::new(mem));
            }
            let runner = Runner::spawn(e, format!("fakenic-{}-1", dev.index)).map_err(|e| {
                eprintln!("fake-rdma: {call}: starting the device model's thread: {e}");
                libc::ENOMEM
            })?;
            port.runner = Some(runner);
            port.rss = Vec::new();
        }
        // An inline engine kept through a servicing: its queues' kicks drive it again.
        if let Some(r) = &mut port.runner {
            r.set_queueless(false);
        }
        Ok(port)
    }

    /// Device `dev` is being serviced: its engine keeps running with no queue (the port's
    /// wire stays), dropping what arrives, until a queue is created on the device again.
    pub fn hold(&mut self, dev: u32) {
        self.held.insert(dev);
    }

    fn stop_if_idle(&mut self, dev: u32) {
        let held = self.held.contains(&dev);
        if let Some(p) = self.ports.get_mut(&dev) {
            if p.queues == 0 {
                if held {
                    // Kept with no queue: an inline engine needs a thread meanwhile.
                    if let Some(r) = &mut p.runner {
                        r.set_queueless(true);
                    }
                } else {
                    // Dropping the runner stops and joins its thread, then drops the
                    // engine and its wire (kick handles keep an empty core).
                    if let Some(r) = p.runner.take() {
                        let counts = hidden_drops(&r.core().lock());
                        drop(r);
                        self.stopped_drops.add(&counts);
                    }
                    p.rss = Vec::new();
                }
            }
        }
    }

    /// What every engine of the process, stopped or running, dropped unseen by its driver.
    pub fn device_drops(&self) -> DeviceDrops {
        let mut d = self.stopped_drops.clone();
        for p in self.ports.values() {
            if let Some(r) = &p.runner {
                d.add(&hidden_drops(&r.core().lock()));
            }
            d.add(&[("rx_not_steered", p.not_taken.load(Ordering::Relaxed))]);
        }
        d
    }

    /// The engine of `dev`, switched to inline (see `crate::kick`), for a kick handle;
    /// `None` if it does not run.
    pub fn go_inline(&mut self, dev: u32) -> Option<Arc<EngineCore<Live<Engine>>>> {
        Some(self.ports.get_mut(&dev)?.runner.as_mut()?.go_inline())
    }

    /// A QP's SQ and send CQ, served from now on.
    ///
    /// # Safety
    /// The SQ buffer, record and BlueFlame register stay valid until
    /// [`Mlx5Nics::remove_sq`], the CQ's ring and record until the CQ is destroyed (after the
    /// QP).
    ///
    /// # Errors
    /// `EIO` if the wire cannot be opened. A queue the model cannot serve (a CQ shared by
    /// two queues) stops the program: that is the fake's limit, not a kernel answer.
    pub unsafe fn add_sq(
        &mut self,
        dev: &Device,
        sq: SqRing,
        cq: CqRing,
        call: &str,
    ) -> Result<(), c_int> {
        // SAFETY: the caller's contract.
        let cq = unsafe { cq_spec(cq, call) }?;
        let spec = SqSpec {
            // SAFETY: the caller's contract.
            buf: unsafe { mem(sq.buf, sq.wqe_cnt as usize * 64) },
            wqe_cnt: sq.wqe_cnt,
            sqn: sq.sqn,
            // SAFETY: as above; the record is 8 bytes.
            dbrec: unsafe { mem(sq.dbrec.cast(), 8) },
            // SAFETY: as above; a BlueFlame register is two halves, a doorbell-only one the
            // 8 bytes of the write.
            uar: unsafe {
                mem(
                    sq.bf_reg,
                    if sq.bf_size > 0 {
                        2 * sq.bf_size as usize
                    } else {
                        8
                    },
                )
            },
            bf_size: sq.bf_size,
            min_inline: sq.min_inline,
            cq,
        };
        let port = self.engine(dev, call)?;
        let r = port
            .runner
            .as_ref()
            .expect("started")
            .core()
            .lock()
            .add_sq(spec);
        match r {
            Ok(()) => {
                port.queues += 1;
                Ok(())
            }
            // The kernel took the queue; the model cannot serve it (a CQ shared by two
            // queues, which the model does not do): not a result hardware would give.
            Err(e) => crate::state::die(
                call,
                &format!(
                    "the device model cannot serve this send queue ({e}): not modelled by the fake"
                ),
            ),
        }
    }

    /// SQ `sqn` to RESET (its counter restarts at 0: the QP went to RESET), or back to RTS
    /// (`to_reset` false: the QP went RTR→RTS again); with `zero`, the QP's doorbell record
    /// is zeroed under the same lock (libmlx5's part of the RESET).
    pub fn sq_state(&mut self, dev: u32, sqn: u32, to_reset: bool, zero: Option<*mut u32>) {
        let Some(t) = self.ports.get(&dev).and_then(|p| p.runner.as_ref()) else {
            return;
        };
        let mut e = t.core().lock();
        let _ = if to_reset {
            e.sq_to_reset(sqn)
        } else {
            e.sq_to_rts(sqn)
        };
        if let Some(db) = zero {
            // SAFETY: the QP's record (8 bytes), live while the QP is.
            unsafe {
                db.write_volatile(0);
                db.add(1).write_volatile(0);
            }
        }
    }

    /// Removes SQ `sqn` (under the engine lock), stopping the engine with its last queue.
    pub fn remove_sq(&mut self, dev: u32, sqn: u32) {
        if let Some(p) = self.ports.get_mut(&dev) {
            if let Some(t) = &p.runner {
                if t.core().lock().remove_sq(sqn).is_ok() {
                    p.queues -= 1;
                }
            }
        }
        self.stop_if_idle(dev);
    }

    /// A WQ's RQ and its CQ, served from now on, with compressed sessions of at most
    /// `compression` completions when set.
    ///
    /// # Safety
    /// The ring and record stay valid until [`Mlx5Nics::remove_rq`], the CQ's until the CQ
    /// is destroyed (after the WQ).
    ///
    /// # Errors
    /// As [`Mlx5Nics::add_sq`].
    pub unsafe fn add_rq(
        &mut self,
        dev: &Device,
        rq: RqRing,
        cq: CqRing,
        compression: Option<u32>,
        call: &str,
    ) -> Result<(), c_int> {
        // SAFETY: the caller's contract.
        let cq = unsafe { cq_spec(cq, call) }?;
        let spec = RqSpec {
            // SAFETY: the caller's contract.
            buf: unsafe { mem(rq.buf, rq.wqe_cnt as usize * rq.stride as usize) },
            wqe_cnt: rq.wqe_cnt,
            stride: rq.stride,
            rqn: rq.rqn,
            // SAFETY: as above; the record is 8 bytes.
            dbrec: unsafe { mem(rq.dbrec.cast(), 8) },
            vlan_strip: rq.vlan_strip,
            cq,
        };
        let port = self.engine(dev, call)?;
        let r = {
            let mut e = port.runner.as_ref().expect("started").core().lock();
            e.add_rq(spec)
                .and_then(|()| e.set_rx_compression(rq.rqn, compression))
        };
        match r {
            Ok(()) => {
                port.queues += 1;
                Ok(())
            }
            Err(e) => crate::state::die(
                call,
                &format!("the device model cannot serve this receive queue ({e}): not modelled by the fake"),
            ),
        }
    }

    /// RQ `rqn` to RESET (its counter restarts at 0, an RQ in error leaves it) or back to
    /// RDY (`to_reset` false).
    pub fn rq_state(&mut self, dev: u32, rqn: u32, to_reset: bool) {
        if let Some(t) = self.ports.get(&dev).and_then(|p| p.runner.as_ref()) {
            let mut e = t.core().lock();
            let _ = if to_reset {
                e.rq_to_reset(rqn)
            } else {
                e.rq_to_rdy(rqn)
            };
        }
    }

    /// Removes RQ `rqn` (under the engine lock), stopping the engine with its last queue.
    pub fn remove_rq(&mut self, dev: u32, rqn: u32) {
        if let Some(p) = self.ports.get_mut(&dev) {
            if let Some(t) = &p.runner {
                if t.core().lock().remove_rq(rqn).is_ok() {
                    p.queues -= 1;
                }
            }
        }
        self.stop_if_idle(dev);
    }

    /// The port's steering rules and their hashing QPs' TIRs (key, hash fields, table by RQ
    /// number; `Steering::tirs` names each rule's): the filter takes the rules at once; the
    /// engine gets the TIRs and picks a frame's by the rule it matches (or loses them all:
    /// empty).
    pub fn set_steering(&mut self, dev: u32, s: Steering, rss: Vec<Tir>) {
        let port = self.ports.entry(dev).or_default();
        let steering = Arc::clone(&port.steering);
        // The TIRs first, so a frame the new rules admit finds them.
        if let Some(t) = &port.runner {
            if port.rss != rss {
                let mut e = t.core().lock();
                if rss.is_empty() {
                    e.clear_rss();
                } else {
                    let tirs = rss
                        .iter()
                        .map(|(key, fields, table)| {
                            (
                                *key,
                                RxHashFields::from_bits_truncate(*fields),
                                table.clone(),
                            )
                        })
                        .collect();
                    let steer: Steer = Arc::new(move |frame: &[u8]| {
                        steering
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .tir_of(frame)
                    });
                    if let Err(err) = e.set_tirs(tirs, steer) {
                        eprintln!("fake-rdma: the device model refuses the RSS setting: {err}");
                    }
                }
                drop(e);
                port.rss = rss;
            }
        }
        *port.steering.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// A memory region of `dev`, registered by context `ctx`: `addr..addr + len` reached
    /// through WQE addresses `iova..` under `lkey`, in the device's engine (now and when it
    /// starts).
    pub fn add_mr(&mut self, dev: u32, ctx: usize, lkey: u32, iova: u64, addr: usize, len: usize) {
        if let Some(t) = self.ports.get(&dev).and_then(|p| p.runner.as_ref()) {
            // SAFETY: `ibv_reg_mr` checked that the range is mapped; the application keeps
            // it mapped until `ibv_dereg_mr` (the verbs contract), which removes this view
            // from the engine under its lock first (`remove_mr`).
            let mem = unsafe { DevMem::from_raw(addr as *mut u8, len) };
            let _ = t.core().lock().add_mr(lkey, iova, Arc::new(mem));
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

    /// Deregisters `lkey` from its engine (under its lock) and forgets it.
    pub fn remove_mr(&mut self, lkey: u32) {
        if let Some(m) = self.mrs.remove(&lkey) {
            if let Some(t) = self.ports.get(&m.dev).and_then(|p| p.runner.as_ref()) {
                t.core().lock().remove_mr(lkey);
            }
        }
    }

    /// Context `ctx` is being closed: its memory regions leave the engines. Its queues must
    /// have been removed already.
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
    }

    /// Running engines (for the tests' "nothing left" checks).
    pub fn running(&self) -> usize {
        self.ports.values().filter(|p| p.runner.is_some()).count()
    }

    /// Engines that a thread of the fake runs (not inline).
    pub fn threads(&self) -> usize {
        self.ports
            .values()
            .filter(|p| p.runner.as_ref().is_some_and(Runner::has_thread))
            .count()
    }
}
