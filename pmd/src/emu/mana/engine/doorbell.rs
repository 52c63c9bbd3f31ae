//! Doorbells as the device model sees them: pages of memory it watches, one page shared by
//! any number of queues (rdma-core maps one page per context and hands it to every queue),
//! and a tail latched per queue from the doorbells that carry that queue's id (§6.1, §6.3).
//!
//! On hardware a doorbell write is an event that reaches the NIC with its queue id. The model
//! only sees memory, so it samples each page at the start of every step: a value it has not
//! seen yet is decoded, and its tail is latched by the queue of that id (the queue then
//! consumes WQEs up to the latched tail). When two queues of a page ring between two samples,
//! the second value overwrites the first, and the first queue's doorbell is missed; because
//! every doorbell carries the queue's absolute producer position, that queue's next doorbell
//! covers everything the missed one announced. A driver that posts and then waits for a
//! completion without ringing again would stall on the model where hardware would not: a
//! deviation of the model, stated here and in the module docs of [`crate::emu::mana`].
//!
//! Monitors close that gap where the model hands out the page itself (the in-process
//! [`crate::emu::mana::Model`]): each queue gets, next to the shared page, a monitor page of
//! its own ([`DoorbellPage::monitor`]) to which the driver's doorbell handle
//! ([`crate::sys::Doorbell`]) copies every write it makes to the shared page, at the same
//! offset. The model then reads the monitors instead of the page: every write reaches it
//! (each writer's last value per kind, which carries the absolute tail), the id in the value
//! still picks the queue among all the queues of the page, as on hardware, and the shared
//! page holds what a real one would. A monitor is the model's bus analyser, not a device
//! register: a driver on hardware writes the page alone.
#![deny(unsafe_code)]

use super::{Engine, EngineError};
use crate::hw::mana::doorbell::{self, DoorbellKind};
use crate::sys::DevMem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The doorbell kinds a page carries for work queues, with their slot in per-page state.
const WATCHED: [(usize, DoorbellKind); 2] = [(0, DoorbellKind::Sq), (1, DoorbellKind::Rq)];

/// A doorbell page: the memory drivers ring doorbells into, and the queues registered on it
/// by every engine that watches it (so that an engine tells a doorbell of a sibling queue,
/// served by another engine, from a doorbell for no queue at all).
#[derive(Debug)]
pub struct DoorbellPage {
    mem: Arc<DevMem>,
    /// `(kind, id)` of every queue on this page, whichever engine serves it.
    queues: Mutex<Vec<(DoorbellKind, u32)>>,
    /// The last doorbell value counted as bad, per watched kind, so that a bad value is
    /// counted once even when several engines watch the page.
    bad: [AtomicU64; 2],
    /// Per-writer copies of the page (see the module docs), each with the last value seen
    /// per watched kind. A page with monitors is read through them only (by one engine).
    monitors: Mutex<Vec<(Arc<DevMem>, [u64; 2])>>,
}

impl DoorbellPage {
    /// Wraps a doorbell page (at least [`doorbell::PAGE_BYTES`] long, 8-byte aligned).
    ///
    /// # Errors
    /// [`EngineError::DoorbellPage`] if the memory is too short or misaligned.
    pub fn new(mem: Arc<DevMem>) -> Result<Arc<Self>, EngineError> {
        if mem.len() < doorbell::PAGE_BYTES || !mem.addr().is_multiple_of(8) {
            return Err(EngineError::DoorbellPage {
                addr: mem.addr(),
                bytes: mem.len(),
            });
        }
        Ok(Arc::new(Self {
            mem,
            queues: Mutex::new(Vec::new()),
            bad: [AtomicU64::new(0), AtomicU64::new(0)],
            monitors: Mutex::new(Vec::new()),
        }))
    }

    /// A new monitor page for one writer of this page (a queue's doorbell handle copies its
    /// writes there); from now on the engine reads the page through its monitors.
    ///
    /// # Errors
    /// The page could not be mapped.
    pub fn monitor(&self) -> std::io::Result<Arc<DevMem>> {
        Ok(self.add_monitor(Arc::new(DevMem::anon(doorbell::PAGE_BYTES)?)))
    }

    /// [`DoorbellPage::monitor`] in memory the caller made (zeroed, at least a page): a
    /// shared file, for a writer in another process.
    pub fn add_monitor(&self, m: Arc<DevMem>) -> Arc<DevMem> {
        self.monitors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((Arc::clone(&m), [0; 2]));
        m
    }

    /// Forgets a monitor (its queue is gone).
    pub fn drop_monitor(&self, m: &Arc<DevMem>) {
        self.monitors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(x, _)| !Arc::ptr_eq(x, m));
    }

    /// The new values of the page's watched slots: through its monitors when it has any
    /// (every writer's last value), else the page's own slots that changed since `last`.
    fn new_values(&self, last: &mut [u64; 2], out: &mut Vec<(usize, DoorbellKind, u64)>) {
        let mut monitors = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        if monitors.is_empty() {
            drop(monitors);
            for (slot, kind) in WATCHED {
                // Acquire: the WQEs the driver wrote before ringing are visible once the
                // queue reads them (the driver's barrier precedes its doorbell store).
                let v = self.mem.load_u64(kind.offset(), Ordering::Acquire);
                if v != last[slot] {
                    last[slot] = v;
                    out.push((slot, kind, v));
                }
            }
            return;
        }
        for (m, seen) in monitors.iter_mut() {
            for (slot, kind) in WATCHED {
                let v = m.load_u64(kind.offset(), Ordering::Acquire);
                if v != seen[slot] {
                    seen[slot] = v;
                    out.push((slot, kind, v));
                }
            }
        }
    }

    fn has_monitors(&self) -> bool {
        !self
            .monitors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The page's memory (what a driver gets as `db_page`).
    pub fn mem(&self) -> &Arc<DevMem> {
        &self.mem
    }

    fn queues(&self) -> MutexGuard<'_, Vec<(DoorbellKind, u32)>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a queue id on the page; `false` if one of that kind and id is there already.
    pub(super) fn register(&self, kind: DoorbellKind, id: u32) -> bool {
        let mut q = self.queues();
        if q.contains(&(kind, id)) {
            return false;
        }
        q.push((kind, id));
        true
    }

    pub(super) fn unregister(&self, kind: DoorbellKind, id: u32) {
        self.queues().retain(|&e| e != (kind, id));
    }

    fn has(&self, kind: DoorbellKind, id: u32) -> bool {
        self.queues().contains(&(kind, id))
    }

    /// Whether `value`, a doorbell for no queue of this page, is counted now (the first
    /// engine to see it counts it).
    fn count_bad(&self, slot: usize, value: u64) -> bool {
        self.bad[slot].swap(value, Ordering::Relaxed) != value
    }
}

/// An engine's view of one page it watches.
pub(crate) struct WatchedPage {
    pub page: Arc<DoorbellPage>,
    /// The last value seen per watched kind (only a new value is decoded).
    last: [u64; 2],
    /// How many of this engine's queues use the page.
    users: usize,
}

impl Engine {
    /// Starts watching `page` for a new queue (or counts one more user of it). A page new to
    /// this engine starts from its current contents: a stale doorbell of a queue that is gone
    /// is not an event.
    pub(super) fn watch(&mut self, page: &Arc<DoorbellPage>) {
        if let Some(w) = self.pages.iter_mut().find(|w| Arc::ptr_eq(&w.page, page)) {
            w.users += 1;
            return;
        }
        let mut last = [0; 2];
        for (slot, kind) in WATCHED {
            last[slot] = page.mem.load_u64(kind.offset(), Ordering::Acquire);
        }
        self.pages.push(WatchedPage {
            page: Arc::clone(page),
            last,
            users: 1,
        });
    }

    /// One queue fewer on `page`; the page is dropped from the watch list with its last user.
    pub(super) fn unwatch(&mut self, page: &Arc<DoorbellPage>) {
        if let Some(i) = self.pages.iter().position(|w| Arc::ptr_eq(&w.page, page)) {
            self.pages[i].users -= 1;
            if self.pages[i].users == 0 {
                self.pages.swap_remove(i);
            }
        }
    }

    /// Latches the doorbell of SQ `i` alone (an inline kick of that queue): its page's SQ
    /// slot, when the value there is this queue's; else (a sibling rang last, or nothing was
    /// rung yet) the whole [`scan_doorbells`](Self::scan_doorbells).
    pub(super) fn latch_sq(&mut self, i: usize) {
        let q = &self.sqs[i];
        if q.db.has_monitors() {
            return self.scan_doorbells();
        }
        let v =
            q.db.mem
                .load_u64(DoorbellKind::Sq.offset(), Ordering::Acquire);
        let d = doorbell::decode(DoorbellKind::Sq, v);
        if d.id == q.id {
            self.sqs[i].tail = d.index;
        } else {
            self.scan_doorbells();
        }
    }

    /// Latches the doorbells of every RQ (an inline kick of the receive side), each from its
    /// page's RQ slot; falls back to the whole scan as [`latch_sq`](Self::latch_sq) does.
    pub(super) fn latch_rqs(&mut self) {
        for i in 0..self.rqs.len() {
            let q = &self.rqs[i];
            if q.db.has_monitors() {
                return self.scan_doorbells();
            }
            let v =
                q.db.mem
                    .load_u64(DoorbellKind::Rq.offset(), Ordering::Acquire);
            let d = doorbell::decode(DoorbellKind::Rq, v);
            if d.id == q.id {
                self.rqs[i].tail = d.index;
            } else {
                return self.scan_doorbells();
            }
        }
    }

    /// Samples every watched page and latches new doorbells into their queues' tails.
    pub(super) fn scan_doorbells(&mut self) {
        let mut values = std::mem::take(&mut self.db_values);
        for p in 0..self.pages.len() {
            values.clear();
            let w = &mut self.pages[p];
            w.page.new_values(&mut w.last, &mut values);
            for &(slot, kind, v) in &values {
                let d = doorbell::decode(kind, v);
                let page = &self.pages[p].page;
                let mine = match kind {
                    DoorbellKind::Sq => self
                        .sqs
                        .iter_mut()
                        .find(|q| q.id == d.id && Arc::ptr_eq(&q.db, page))
                        .map(|q| &mut q.tail),
                    _ => self
                        .rqs
                        .iter_mut()
                        .find(|q| q.id == d.id && Arc::ptr_eq(&q.db, page))
                        .map(|q| &mut q.tail),
                };
                match mine {
                    Some(tail) => *tail = d.index,
                    // A sibling queue of the page, served by another engine: not ours.
                    None if page.has(kind, d.id) => {}
                    None => {
                        if page.count_bad(slot, v) {
                            self.stats.bad_doorbells += 1;
                            tracing::debug!(target: "pmd::emu", ?kind, id = d.id, value = v, "doorbell for no queue of its page");
                        }
                    }
                }
            }
        }
        self.db_values = values;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::mana::engine::{CqSpec, RqSpec, SqSpec};
    use crate::emu::wire::{Loopback, NoWire, Wire};
    use crate::hw::mana::wqe::{Sge, TxOob, TxOobFields, WqeHeader, SHORT_OOB_BYTES};
    use crate::ring::write_wrapped;

    const LKEY: u32 = 0x77;
    /// A 1-SGE WQE with the short OOB: header, OOB, SGE.
    const WQE: usize = 32;

    struct Queue {
        mem: Arc<DevMem>,
        id: u32,
        cq_id: u32,
        pos: u32,
    }

    fn ring(bytes: usize) -> Arc<DevMem> {
        Arc::new(DevMem::anon(bytes).unwrap())
    }

    fn cq(id: u32) -> CqSpec {
        CqSpec {
            mem: ring(4096),
            count: 64,
            id,
        }
    }

    /// Frame memory: the test's view, and the engine's view of the same pages.
    fn buffers(file: &tempfile::NamedTempFile) -> (DevMem, DevMem) {
        let mine = DevMem::shared_file(file.path(), 8192, true).unwrap();
        let nic = DevMem::shared_file(file.path(), 8192, false).unwrap();
        (mine, nic)
    }

    fn sq(e: &mut Engine, page: &Arc<DoorbellPage>, id: u32) -> Queue {
        let q = Queue {
            mem: ring(4096),
            id,
            cq_id: id + 0x100,
            pos: 0,
        };
        e.add_sq(SqSpec {
            mem: Arc::clone(&q.mem),
            id,
            doorbell: Arc::clone(page),
            vp_offset: 0,
            cq: cq(q.cq_id),
        })
        .unwrap();
        q
    }

    /// Writes a TX WQE for `len` bytes at `iova` and returns the new tail (not rung).
    fn post_tx(q: &mut Queue, iova: usize, len: u32) -> u32 {
        let mut w = [0u8; WQE];
        WqeHeader::new_checked(&mut w[..8])
            .unwrap()
            .init(SHORT_OOB_BYTES, 1);
        TxOob::new_checked(&mut w[8..16])
            .unwrap()
            .write(&TxOobFields {
                vcq_num: q.cq_id,
                sq_id: q.id,
                ..Default::default()
            });
        Sge::new_checked(&mut w[16..32]).unwrap().set(
            mempool::Iova(iova as u64),
            mempool::Lkey(LKEY),
            len,
        );
        write_wrapped(&q.mem, q.pos, &w);
        q.pos += WQE as u32;
        q.pos
    }

    fn recv_all(peer: &mut Loopback) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Some(n) = peer.recv(&mut buf) {
            got.push(buf[0]);
            assert_eq!(n, 60);
        }
        got
    }

    /// An engine on a loopback cable `name`, a doorbell page with two SQs (0x1001, 0x1002) on
    /// it, and registered frame memory where frame k starts with byte k at offset 64 * k.
    struct Shared {
        e: Engine,
        peer: Loopback,
        page: Arc<DoorbellPage>,
        mine: DevMem,
        base: usize,
        a: Queue,
        b: Queue,
        _file: tempfile::NamedTempFile,
    }

    fn shared(name: &str) -> Shared {
        let mut e = Engine::new(Box::new(Loopback::open(name).unwrap()));
        let peer = Loopback::open(name).unwrap();
        let page = DoorbellPage::new(ring(doorbell::PAGE_BYTES)).unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        let (mine, nic) = buffers(&file);
        let base = mine.addr();
        e.add_mr(LKEY, base as u64, nic).unwrap();
        for k in 0..8u8 {
            mine.fill(64 * usize::from(k), 60, k);
        }
        let a = sq(&mut e, &page, 0x1001);
        let b = sq(&mut e, &page, 0x1002);
        Shared {
            e,
            peer,
            page,
            mine,
            base,
            a,
            b,
            _file: file,
        }
    }

    /// The same page with a monitor per queue (the in-process model's doorbells): the page
    /// holds what a real one would, and the overwrite that loses A's doorbell to a sampling
    /// engine is seen, since each queue's handle also writes its own monitor; an id names its
    /// queue among the page's whichever handle wrote it, and an id of no queue is bad.
    #[test]
    fn monitors_show_every_doorbell_of_a_shared_page() {
        let Shared {
            mut e,
            mut peer,
            page,
            mine: _,
            base,
            mut a,
            mut b,
            _file,
        } = shared("t-monitor-db");
        let da = crate::sys::Doorbell::new(Arc::clone(page.mem()), Some(page.monitor().unwrap()));
        let db = crate::sys::Doorbell::new(Arc::clone(page.mem()), Some(page.monitor().unwrap()));
        let ring_sq = |d: &crate::sys::Doorbell, id, tail| {
            d.ring(doorbell::SQ_OFFSET, doorbell::sq(id, tail));
        };

        // A rings, B rings over it on the shared page before the engine looks: both send.
        let t = post_tx(&mut a, base, 60);
        ring_sq(&da, a.id, t);
        let t = post_tx(&mut b, base + 64, 60);
        ring_sq(&db, b.id, t);
        assert_eq!(
            page.mem().load_u64(doorbell::SQ_OFFSET, Ordering::Relaxed),
            doorbell::sq(b.id, t),
            "the page holds the last write"
        );
        e.step();
        assert_eq!(recv_all(&mut peer), [0, 1]);

        // B's handle ringing A's id rings A (the value names the queue, as on hardware).
        let t = post_tx(&mut a, base + 128, 60);
        ring_sq(&db, a.id, t);
        e.step();
        assert_eq!(recv_all(&mut peer), [2]);

        // An id of no queue of the page is bad, once.
        ring_sq(&da, 0x0bad, 32);
        e.step();
        e.step();
        assert_eq!((e.stats.tx_frames, e.stats.bad_doorbells), (3, 1));
    }

    /// Two SQs and an RQ on one doorbell page: each queue takes only doorbells with its id;
    /// a doorbell overwritten by a sibling before the engine looked is recovered by the next
    /// one (absolute tails); an id of no queue on the page counts as bad once; an id of a
    /// queue served by another engine on the same page does not.
    #[test]
    fn queues_sharing_a_doorbell_page_latch_their_own_tails() {
        let Shared {
            mut e,
            mut peer,
            page,
            mine,
            base,
            mut a,
            mut b,
            _file,
        } = shared("t-shared-db");
        let db = page.mem();
        let sq_db =
            |q: &Queue, tail| db.ring_doorbell(doorbell::SQ_OFFSET, doorbell::sq(q.id, tail));

        let t = post_tx(&mut a, base, 60);
        sq_db(&a, t);
        e.step();
        let t = post_tx(&mut b, base + 64, 60);
        sq_db(&b, t);
        e.step();
        assert_eq!(recv_all(&mut peer), [0, 1], "both queues transmit");

        // A rings, B rings over it before the engine samples the page: A's is missed...
        let t = post_tx(&mut a, base + 128, 60);
        sq_db(&a, t);
        let t = post_tx(&mut b, base + 192, 60);
        sq_db(&b, t);
        e.step();
        assert_eq!(recv_all(&mut peer), [3]);
        // ...until A's next doorbell, whose absolute tail covers both of A's WQEs.
        let t = post_tx(&mut a, base + 256, 60);
        sq_db(&a, t);
        e.step();
        assert_eq!(recv_all(&mut peer), [2, 4]);
        assert_eq!((e.stats.tx_frames, e.stats.bad_doorbells), (5, 0));

        // An RQ on the same page (at its own offset) receives.
        let rq = ring(4096);
        e.add_rq(RqSpec {
            mem: Arc::clone(&rq),
            id: 0x1003,
            doorbell: Arc::clone(&page),
            cq: cq(0x1103),
        })
        .unwrap();
        e.set_rss([0x6d; 40], &[0x1003]).unwrap();
        let mut w = [0u8; WQE];
        WqeHeader::new_checked(&mut w[..8])
            .unwrap()
            .init(SHORT_OOB_BYTES, 1);
        Sge::new_checked(&mut w[16..32]).unwrap().set(
            mempool::Iova((base + 4096) as u64),
            mempool::Lkey(LKEY),
            2048,
        );
        write_wrapped(&rq, 0, &w);
        db.ring_doorbell(doorbell::RQ_OFFSET, doorbell::rq(0x1003, WQE as u32));
        assert!(peer.send(&[0x5a; 60]));
        peer.flush();
        e.step();
        let mut got = [0u8; 60];
        mine.read(4096, &mut got);
        assert_eq!((e.stats.rx_frames, got), (1, [0x5a; 60]));

        // A doorbell for no queue of the page is bad, counted once however long it stays.
        db.ring_doorbell(doorbell::SQ_OFFSET, doorbell::sq(0x0bad, 32));
        e.step();
        e.step();
        assert_eq!(e.stats.bad_doorbells, 1);

        // A sibling queue on the same page served by another engine is not bad for this one.
        let mut other = Engine::new(Box::new(NoWire));
        let c = sq(&mut other, &page, 0x2001);
        sq_db(&c, 0);
        e.step();
        other.step();
        assert_eq!((e.stats.bad_doorbells, other.stats.bad_doorbells), (1, 0));

        // Removed queues release the page; their ids become foreign.
        e.remove_sq(a.id).unwrap();
        sq_db(&a, 0);
        e.step();
        other.step();
        assert_eq!(e.stats.bad_doorbells + other.stats.bad_doorbells, 2);
        assert_eq!(
            e.remove_sq(a.id),
            Err(EngineError::NoSuchQueue {
                kind: "SQ",
                id: a.id
            })
        );
    }
}
