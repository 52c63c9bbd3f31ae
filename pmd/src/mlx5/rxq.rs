//! mlx5 RX queue over a cyclic RQ (§4.1): one buffer per WQE (the WQE's other scatter
//! entries closed with the invalid key), the RQ doorbell record written once per refill (no
//! MMIO: the device reads the record itself), and the completions (normal CQEs and compressed
//! sessions with HASH minis) read through the shared `RxCq` (`rx_cq.rs`): one WQE per
//! completion, in order.
//!
//! Error CQEs (§5.3) with an ordinary syndrome (LOCAL_LENGTH, …) consume one WQE; its buffer
//! is freed and the error counted. So do completions with data scattered into the CQE
//! (formats 1 and 2), which a raw-packet RQ is not expected to produce (§9 item 10): the
//! queue never reads packets from CQEs. The critical syndromes (LOCAL_QP_OP, LOCAL_PROT,
//! WR_FLUSH) mean the WQ is in error: the queue recovers it through the provider's state
//! machine, as DPDK does (`recover`, shared with the striding queue in `rx_cq.rs`: RESET,
//! drain the CQ, RDY, repost).
#![deny(unsafe_code)]

use super::provider::RawRq;
use super::rx_cq::{
    key_of_run_key, normal_at, run_key, FastPolled, NormalRx, Recovery, RxCompletion, RxCq, RxMeta,
    RxPolled, SessionLeft, RUN_KEYS,
};
use super::xstats::RxXstats;
use crate::ethdev::{
    deliver_rx, fix_rx_run, free_one, kick, rx_fields, Burst, Counters, Kick, PortConfig,
    QueueOwner, RxBurst, RxOffloads,
};
use crate::hw::mlx5::cqe::{self, MiniCqeFormat};
use crate::hw::mlx5::doorbell::{self, RCV_DBR};
use crate::hw::mlx5::wqe::{data_seg_head, DataSeg, INVALID_LKEY, SEG_BYTES};
use crate::hw::mlx5::CQE_BYTES;
use crate::ring::refill::{self, PostRx};
use crate::ring::WorkQueue;
use crate::sys::barrier::udma_to_device_barrier;
use crate::sys::DevMem;
use mempool::{ChunkKeys, Iova, MbufPool, OffloadFlags, RxBufs, RxDesc, RxFields, RX_RUN_MAX};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most mbufs allocated per refill step, and the most a queue waits for before it refills:
/// a quarter of the ring up to this, as DPDK's vector RX (`MLX5_VPMD_RXQ_RPLNSH_THRESH`,
/// net/mlx5 `mlx5_defs.h`).
const REFILL_BULK: u32 = 64;
/// Largest RQ WQE stride we build (16 scatter entries).
const MAX_STRIDE: usize = 256;

/// An mlx5 RX queue, owned by one core.
pub struct RxQueue {
    wq: WorkQueue,
    cq: RxCq,
    dbrec: Arc<DevMem>,
    stride: usize,
    rqn: u32,
    /// The posted buffers, oldest first: one per WQE, in WQE order.
    bufs: RxBufs,
    pool: Arc<MbufPool>,
    keys: ChunkKeys,
    counters: Arc<Counters>,
    xstats: Arc<RxXstats>,
    /// The WQ's error recovery.
    recovery: Recovery,
    _owner: QueueOwner,
    /// Where the posted buffers go when the queue drops (see `Parked`).
    parked: Arc<crate::ethdev::Parked>,
    /// The device's work on this thread (a device model's inline engine; `None` on hardware).
    kick: Kick,
    port_id: u16,
    data_room: u32,
    vlan_strip: bool,
    /// A WQE with an empty first entry and the others closing the scatter list (§4.1).
    template: [u8; MAX_STRIDE],
    /// The offload flags of a delivered packet by [`NormalRx::key`] (what [`rx_fields`]
    /// makes of the CQE's meta, worked out once).
    flags: [OffloadFlags; 16],
    /// The same by [`run_key`], the hash flag left out, with the mask of the CQE's VLAN
    /// info (all ones where a tag was stripped, else 0): for the runs of normal CQEs.
    run_flags: [(OffloadFlags, u16); RUN_KEYS],
    /// Free slots that make a burst refill: a quarter of the ring, at most [`REFILL_BULK`].
    refill_at: u32,
    /// The first word (length and key) every WQE slot of a one-segment ring holds, written
    /// at creation for a pool in one chunk: refills then write only the address, as DPDK's
    /// do.
    primed: Option<u64>,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mlx5::RxQueue(rq {:#x}, {} posted)",
            self.rqn,
            self.bufs.len()
        )
    }
}

impl RxQueue {
    /// An RX queue over `raw` with `cfg.rx_ring_size` buffers; call [`RxQueue::fill`] first.
    ///
    /// # Panics
    /// If the ring size is not a power of two or exceeds the RQ's or the CQ's entries, or the
    /// WQE stride is not 16 to 256 bytes, or `raw` is a striding RQ.
    pub fn new(
        raw: RawRq,
        cfg: &PortConfig,
        port_id: u16,
        pool: Arc<MbufPool>,
        keys: ChunkKeys,
        counters: Arc<Counters>,
        xstats: Arc<RxXstats>,
    ) -> Self {
        let n = u32::from(cfg.rx_ring_size);
        let stride = raw.stride as usize;
        assert!(
            n.is_power_of_two()
                && raw.wqe_cnt >= n
                && raw.cq.cqe_cnt >= n
                && raw.mprq.is_none()
                && stride.is_power_of_two()
                && (SEG_BYTES..=MAX_STRIDE).contains(&stride),
            "bad rx queue: {n} buffers on {raw:?}"
        );
        let data_room = u32::from(pool.data_room());
        // One segment per WQE and one key: every slot gets its first word now.
        let primed = match keys.keys() {
            [key] if stride == SEG_BYTES => {
                let head = data_seg_head(*key, data_room);
                for slot in 0..raw.buf.len() / SEG_BYTES {
                    raw.buf.write_2x64(slot * SEG_BYTES, head, 0);
                }
                Some(head)
            }
            _ => None,
        };
        Self {
            wq: WorkQueue::new(raw.buf, stride),
            cq: RxCq::new(raw.cq, MiniCqeFormat::Hash),
            dbrec: raw.dbrec,
            stride,
            rqn: raw.rqn,
            bufs: RxBufs::new(&pool, n),
            pool,
            keys,
            counters,
            xstats,
            recovery: Recovery::new(raw.state, raw.rqn),
            _owner: raw.owner,
            parked: raw.parked,
            kick: raw.kick,
            port_id,
            data_room,
            vlan_strip: cfg.rx_offloads.contains(RxOffloads::VLAN_STRIP),
            template: wqe_template(stride),
            flags: flags_table(cfg.rx_offloads.contains(RxOffloads::VLAN_STRIP)),
            run_flags: run_flags_table(&flags_table(
                cfg.rx_offloads.contains(RxOffloads::VLAN_STRIP),
            )),
            primed,
            refill_at: (n / 4).clamp(1, REFILL_BULK),
        }
    }

    /// Buffers posted and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.bufs.len()
    }

    /// Posts buffers on every free descriptor.
    ///
    /// # Errors
    /// How many buffers could not be posted for lack of mbufs.
    pub fn fill(&mut self) -> Result<(), u32> {
        match self.refill(self.bufs.free()) {
            0 => Ok(()),
            missing => Err(missing),
        }
    }

    /// The RQ record ← the WQEs posted, after a barrier that makes them visible first.
    fn write_record(&self) {
        udma_to_device_barrier();
        self.dbrec.store_u32(
            RCV_DBR,
            u32::from_ne_bytes(doorbell::rq_record(self.wq.head())),
            Ordering::Release,
        );
    }

    /// Posts up to `n` buffers and writes the RQ record once; returns how many were missing.
    fn refill(&mut self, n: u32) -> u32 {
        let (left, posted) = refill::refill(self, n, REFILL_BULK);
        if posted {
            self.write_record();
        }
        left
    }

    /// Writes the WQEs of the `n` buffers from position `from` of `bufs` at the RQ's producer
    /// position, straight into the ring (one 16-byte data segment each; a longer stride's
    /// closing entries with it), and advances it. Returns how many were written: fewer when a
    /// buffer is in no registered chunk.
    #[inline]
    fn post_wqes(&mut self, from: u32, n: u32) -> u32 {
        // The usual case: a primed ring (one segment per WQE, its first word written at
        // creation) of a pool still in one chunk, and a run that does not reach the end of
        // the ring: only the addresses, through a window checked once.
        let mem = self.wq.mem();
        let at = self.wq.head_bytes() as usize & (mem.len() - 1);
        if let (Some(_), 1, Some(w)) = (
            self.primed,
            self.keys.keys().len(),
            mem.window(at, n as usize * SEG_BYTES),
        ) {
            self.bufs.for_each_data_addr(from, n, |i, addr| {
                w.write_u64(i * SEG_BYTES + 8, (addr as u64).to_be());
            });
            self.wq.advance(n);
            return n;
        }
        self.post_wqes_each(from, n)
    }

    /// [`RxQueue::post_wqes`] one WQE at a time: across the end of the ring, with the key of
    /// each buffer's chunk, or a stride longer than one segment.
    #[cold]
    #[inline(never)]
    fn post_wqes_each(&mut self, from: u32, n: u32) -> u32 {
        let mem = self.wq.mem();
        let mask = mem.len() - 1;
        let start = self.wq.head_bytes() as usize;
        let wide = self.stride > SEG_BYTES;
        // A pool in one chunk has one key: the segment's first word (length and key) is then
        // the same for every buffer.
        let single = match self.keys.keys() {
            [key] => Some(data_seg_head(*key, self.data_room)),
            _ => None,
        };
        let mut k = 0;
        while k < n {
            let pos = from.wrapping_add(k);
            let head = match single {
                Some(h) => h,
                None => match self.keys.key_of(self.bufs.index_at(pos)) {
                    Some(key) => data_seg_head(key, self.data_room),
                    None => break,
                },
            };
            let addr = (self.bufs.data_addr(pos) as u64).to_be();
            let off = (start + k as usize * self.stride) & mask;
            mem.write_2x64(off, head, addr);
            if wide {
                mem.write(off + SEG_BYTES, &self.template[SEG_BYTES..self.stride]);
            }
            k += 1;
        }
        self.wq.advance(k);
        k
    }

    /// Whether a recovery failed and the queue delivers nothing until a retry succeeds.
    pub fn is_down(&self) -> bool {
        self.recovery.is_down()
    }

    /// Recovery of a WQ in error (§5.3, as DPDK does it): `Recovery::restart` (RESET, the CQ
    /// drained, `SET_CI`, the RQ record ← 0, RDY), then every buffer the queue holds is
    /// posted again from WQE 0, the rest of the ring refilled, and the RQ record written.
    #[cold]
    fn recover(&mut self) {
        if !self
            .recovery
            .restart(&mut self.cq, &self.dbrec, &self.xstats, &self.counters)
        {
            return;
        }
        self.wq.restart();
        // Every buffer again, oldest first, from WQE 0: they keep their order.
        let (from, n) = (self.bufs.popped(), self.bufs.len());
        let done = self.post_wqes(from, n);
        debug_assert_eq!(done, n, "every buffer held was keyed when first posted");
        self.write_record();
        let missing = self.refill(self.bufs.free());
        if missing > 0 {
            self.counters.add_nombuf(u64::from(missing));
        }
        self.recovery.done(&self.xstats);
    }

    /// Takes the oldest posted buffer as the packet completion `c` describes and puts it in
    /// `out` (or frees it and counts an error when the length does not fit the buffer).
    /// `false` when no buffer is posted.
    #[inline]
    fn deliver(&mut self, c: &RxCompletion, out: &mut Burst, bytes: &mut u64) -> bool {
        let (fields, reinsert) = rx_fields(
            c.meta.fl,
            c.meta.hashed.then_some(c.hash),
            c.meta.vlan,
            self.vlan_strip,
            self.port_id,
        );
        let Some(r) = self.bufs.pop_received(c.byte_cnt, &fields) else {
            return false;
        };
        self.wq.complete(1);
        let tag = reinsert.then_some(fields.vlan_tci);
        match deliver_rx(r, tag, out, &self.pool) {
            Some(len) => *bytes += u64::from(len),
            None => {
                RxXstats::bump(&self.xstats.too_long);
                self.counters.add_errors(1);
            }
        }
        true
    }

    /// [`RxQueue::deliver`] for a normal CQE read in place: its flags from the queue's table.
    #[inline]
    fn deliver_normal(&mut self, c: &NormalRx, out: &mut Burst, bytes: &mut u64) -> bool {
        let fields = RxFields {
            ol_flags: self.flags[usize::from(c.key & 15)],
            rss_hash: if c.key & 4 != 0 { c.hash } else { 0 },
            vlan_tci: if c.key & 8 != 0 { c.vlan } else { 0 },
            port: self.port_id,
        };
        let Some(r) = self.bufs.pop_received(c.byte_cnt, &fields) else {
            return false;
        };
        self.wq.complete(1);
        let tag = (c.key & 8 != 0 && !self.vlan_strip).then_some(c.vlan);
        match deliver_rx(r, tag, out, &self.pool) {
            Some(len) => *bytes += u64::from(len),
            None => {
                RxXstats::bump(&self.xstats.too_long);
                self.counters.add_errors(1);
            }
        }
        true
    }

    /// Delivers runs of normal packet CQEs (the common case) read in place, each run's
    /// owners checked with one read barrier, and runs of the minis of a compressed session
    /// being handed out; their headers written by [`RxBufs::pop_run`] straight into `out`.
    /// Stops at the first CQE of any other kind (or none), which [`RxQueue::rx_burst`]'s
    /// general loop then takes. Returns the errors counted.
    #[inline]
    fn deliver_runs(&mut self, out: &mut Burst, bytes: &mut u64) -> u64 {
        let mut too_long = 0u64;
        loop {
            let max = (out.spare() as u32).min(self.bufs.len()).min(RX_RUN_MAX);
            if max == 0 {
                break;
            }
            if let Some(s) = self.cq.session_left() {
                too_long += self.deliver_minis(s, max, out, bytes);
                continue;
            }
            let (view, n, to_end) = self.cq.normal_run(max);
            if n == 0 {
                break;
            }
            let flags = &self.run_flags;
            let start = out.len();
            let mut dwords = 0u32;
            let mut cqes = view.entries::<CQE_BYTES>();
            let run = self.bufs.pop_run(n, self.port_id, out.vec_mut(), |_| {
                // Completions come in WQE order, one per WQE (§4.1); the run's `n` CQEs are
                // in the view. Each normal CQE's fields, read in place (§5.1).
                let e = cqes.next().expect("a CQE of the run");
                let w = e.u32_at::<{ cqe::HDS_IP_EXT }>();
                dwords |= w;
                let (fl, tci_mask) = flags[run_key(w)];
                let hashed = e.u8_at::<{ cqe::RX_HASH_TYPE }>() != 0;
                let [_, _, v0, v1] = w.to_le_bytes();
                RxDesc {
                    len: u32::from_be(e.u32_at::<{ cqe::BYTE_CNT }>()),
                    ol_flags: if hashed {
                        fl | OffloadFlags::RX_RSS_HASH
                    } else {
                        fl
                    },
                    rss_hash: if hashed {
                        u32::from_be(e.u32_at::<{ cqe::RX_HASH_RES }>())
                    } else {
                        0
                    },
                    vlan_tci: u16::from_be_bytes([v0, v1]) & tci_mask,
                }
            });
            *bytes += run.bytes;
            // A tag the device stripped though the port keeps tags, or a length over the
            // buffer: rare, taken apart.
            if run.too_long > 0 || (run_key(dwords) & 0x80 != 0 && !self.vlan_strip) {
                let (room, strip) = (self.bufs.room(), self.vlan_strip);
                too_long += fix_rx_run(
                    out,
                    start,
                    n as usize,
                    |k| {
                        let c = normal_at(view.entry(k));
                        (
                            c.byte_cnt > room,
                            (c.key & 8 != 0 && !strip).then_some(c.vlan),
                        )
                    },
                    bytes,
                );
            }
            self.cq.consume(n);
            self.wq.complete(n);
            if !to_end {
                break;
            }
        }
        if too_long > 0 {
            RxXstats::add(&self.xstats.too_long, too_long);
        }
        too_long
    }

    /// Delivers up to `max` (at least 1) of the minis left in the session `s` (§6.2): each
    /// mini's length and hash, the title's flags and tag for all. Returns the packets freed
    /// for a length over the buffer.
    #[inline]
    fn deliver_minis(&mut self, s: SessionLeft, max: u32, out: &mut Burst, bytes: &mut u64) -> u64 {
        let k = s.left.min(max);
        let meta = s.meta;
        let (f, reinsert) = rx_fields(
            meta.fl,
            meta.hashed.then_some(0),
            meta.vlan,
            self.vlan_strip,
            self.port_id,
        );
        let cq = &self.cq;
        let start = out.len();
        let run = self.bufs.pop_run(k, self.port_id, out.vec_mut(), |j| {
            // Completions come in WQE order, one per WQE (§4.1): a HASH mini's hash and
            // length.
            let (hash, len) = cq.mini(s.t, s.next + j as u32);
            RxDesc {
                len,
                ol_flags: f.ol_flags,
                rss_hash: if meta.hashed { hash } else { 0 },
                vlan_tci: f.vlan_tci,
            }
        });
        *bytes += run.bytes;
        let mut freed = 0;
        if run.too_long > 0 || reinsert {
            let room = self.bufs.room();
            freed = fix_rx_run(
                out,
                start,
                k as usize,
                |j| {
                    let (_, len) = cq.mini(s.t, s.next + j as u32);
                    (len > room, reinsert.then_some(f.vlan_tci))
                },
                bytes,
            );
        }
        self.cq.session_took(k);
        self.wq.complete(k);
        freed
    }

    /// See [`crate::ethdev::RxBurst::rx_burst`].
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Burst) -> usize {
        if self.recovery.is_down() {
            if self.recovery.retry_due() {
                self.recover();
            }
            return 0;
        }
        // A software device takes arrived frames into the posted buffers now.
        kick::run(&self.kick);
        let start = out.len();
        let mut bytes = 0u64;
        let mut errors = 0u64;
        let sessions0 = self.cq.sessions;
        loop {
            // Runs of normal CQEs and of a session's minis; then one completion of any other
            // kind (a session's title, an error), or none.
            errors += self.deliver_runs(out, &mut bytes);
            if out.spare() == 0 {
                break;
            }
            let polled = match self.cq.next_normal() {
                FastPolled::Normal(c) => {
                    // Completions come in WQE order, one per WQE (§4.1).
                    if !self.deliver_normal(&c, out, &mut bytes) {
                        break;
                    }
                    continue;
                }
                FastPolled::Other(p) => p,
            };
            match polled {
                RxPolled::Empty => break,
                RxPolled::Packet(c) => {
                    // Completions come in WQE order, one per WQE (§4.1).
                    if !self.deliver(&c, out, &mut bytes) {
                        break;
                    }
                }
                RxPolled::Bad { critical, flush } => {
                    self.xstats.bad(critical);
                    if critical {
                        // The WQ is in error (§5.3). A flush carries no frame; the error CQE
                        // consumed a WQE whose buffer the recovery posts again.
                        if !flush {
                            errors += 1;
                        }
                        self.recover();
                        // The CQ is drained (and SET_CI written), or the queue is down.
                        break;
                    }
                    errors += 1;
                    if let Some(m) = self.bufs.pop() {
                        self.wq.complete(1);
                        free_one(&self.pool, m);
                    }
                }
            }
        }
        // Mid-session the consumer index stays at the title until the session is done.
        self.cq.commit();
        RxXstats::add(
            &self.xstats.compressed_sessions,
            self.cq.sessions - sessions0,
        );
        let delivered = out.len() - start;
        self.counters.add(delivered as u64, bytes);
        self.counters.add_errors(errors);
        let want = self.bufs.free();
        // A queue that is down posts nothing until a recovery succeeds (which posts all).
        let low = want > 0 && self.posted() < self.refill_at;
        if !self.recovery.is_down() && (want >= self.refill_at || low) {
            let missing = self.refill(want);
            if missing > 0 {
                self.counters.add_nombuf(u64::from(missing));
            }
        }
        delivered
    }
}

impl PostRx for RxQueue {
    #[inline]
    fn bufs_and_pool(&mut self) -> (&mut RxBufs, &Arc<MbufPool>) {
        (&mut self.bufs, &self.pool)
    }
    #[inline]
    fn post_wqes(&mut self, from: u32, n: u32) -> u32 {
        RxQueue::post_wqes(self, from, n)
    }
    /// A buffer in no registered chunk.
    fn count_unkeyed(&mut self) {
        RxXstats::bump(&self.xstats.no_mkey);
        self.counters.add_errors(1);
    }
}

impl RxBurst for RxQueue {
    #[inline]
    fn rx_burst(&mut self, out: &mut Burst) -> usize {
        RxQueue::rx_burst(self, out)
    }
}

/// [`RxQueue::run_flags`] from the flags by [`NormalRx::key`].
fn run_flags_table(flags: &[OffloadFlags; 16]) -> [(OffloadFlags, u16); RUN_KEYS] {
    std::array::from_fn(|k| {
        let key = key_of_run_key(k);
        (
            flags[usize::from(key)],
            if key & 8 != 0 { u16::MAX } else { 0 },
        )
    })
}

/// The offload flags by [`NormalRx::key`]: what [`rx_fields`] gives for each key's meta.
fn flags_table(vlan_strip: bool) -> [OffloadFlags; 16] {
    let mut t = [OffloadFlags::empty(); 16];
    for (k, f) in t.iter_mut().enumerate() {
        let m = RxMeta::of_key(k as u8);
        *f = rx_fields(m.fl, m.hashed.then_some(0), m.vlan, vlan_strip, 0)
            .0
            .ol_flags;
    }
    t
}

/// A WQE of `stride` bytes with an empty first entry and the others closing the scatter list
/// (§4.1).
fn wqe_template(stride: usize) -> [u8; MAX_STRIDE] {
    let mut wqe = [0u8; MAX_STRIDE];
    for at in (SEG_BYTES..stride).step_by(SEG_BYTES) {
        if let Some(mut d) = DataSeg::new_checked(&mut wqe[at..at + SEG_BYTES]) {
            d.set(Iova(0), INVALID_LKEY, 0);
        }
    }
    wqe
}

impl Drop for RxQueue {
    /// Completions the device wrote that no burst took (the queue is going away: its port
    /// closes, or a dead device's queues are dropped before they are rebuilt) are frames the
    /// application never got: counted as missed, so that none is lost uncounted.
    fn drop(&mut self) {
        let d = self.cq.drain();
        self.counters.add_missed(d.dropped);
        // The device may still write into the posted buffers until the WQ is destroyed (the
        // port's indirection tables hold it): they wait there (see `Parked`), not in the
        // pool.
        let posted = std::mem::replace(&mut self.bufs, RxBufs::new(&self.pool, 1));
        self.parked.park(posted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethdev::rare_run;
    use crate::hw::mlx5::cqe::{csum_ok, hash_type, mini_slot, Cqe, CqeFields, Syndrome};
    use crate::hw::mlx5::CQE_BYTES;
    use crate::mlx5::provider::testing::TestState;
    use crate::mlx5::txq::RECOVERY_RETRY_BURSTS;
    use crate::mlx5::RawCq;
    use mempool::Lkey;
    use mempool::OffloadFlags;
    use mempool::{Mbuf, MbufPoolConfig, Registration};

    const N: u32 = 64;
    const CQN: u32 = 64;

    /// The device's side, by hand: reads posted WQEs, writes CQEs with the lap's owner bit.
    struct Nic {
        rq: Arc<DevMem>,
        cq: Arc<DevMem>,
        dbrec: Arc<DevMem>,
        cq_dbrec: Arc<DevMem>,
        /// CQ producer (free-running).
        pi: u32,
        /// RQ consumer (free-running).
        rq_ci: u32,
    }

    fn queue(pool: &Arc<MbufPool>) -> (RxQueue, Nic) {
        queue_with(pool, Arc::default())
    }

    fn queue_with(pool: &Arc<MbufPool>, state: Arc<TestState>) -> (RxQueue, Nic) {
        queue_cfg(pool, state, RxOffloads::VLAN_STRIP)
    }

    fn queue_cfg(
        pool: &Arc<MbufPool>,
        state: Arc<TestState>,
        rx_offloads: RxOffloads,
    ) -> (RxQueue, Nic) {
        let keys = pool
            .register_chunks(|_| Ok(Registration::new(mempool::Lkey(0x55))))
            .unwrap();
        let rq = Arc::new(DevMem::anon(N as usize * 32).unwrap());
        let cq = Arc::new(DevMem::anon(CQN as usize * CQE_BYTES).unwrap());
        for i in 0..CQN as usize {
            cq.write(i * CQE_BYTES + 63, &[0xf0]);
        }
        let dbrec = Arc::new(DevMem::anon(4096).unwrap());
        let cq_dbrec = Arc::new(DevMem::anon(4096).unwrap());
        let raw = RawRq {
            buf: Arc::clone(&rq),
            wqe_cnt: N,
            stride: 32,
            rqn: 0x99,
            dbrec: Arc::clone(&dbrec),
            cq: RawCq {
                buf: Arc::clone(&cq),
                cqe_cnt: CQN,
                dbrec: Arc::clone(&cq_dbrec),
                cqn: 3,
            },
            mprq: None,
            cqe_compression: true,
            owner: Arc::new(()),
            parked: crate::ethdev::Parked::new(),
            state,
            kick: None,
        };
        let cfg = PortConfig {
            rx_ring_size: N as u16,
            rx_offloads,
            ..Default::default()
        };
        let mut q = RxQueue::new(
            raw,
            &cfg,
            0,
            Arc::clone(pool),
            keys,
            Arc::default(),
            Arc::default(),
        );
        q.fill().unwrap();
        (
            q,
            Nic {
                rq,
                cq,
                dbrec,
                cq_dbrec,
                pi: 0,
                rq_ci: 0,
            },
        )
    }

    impl Nic {
        fn posted(&self) -> u32 {
            u32::from_be_bytes(
                self.dbrec
                    .load_u32(RCV_DBR, Ordering::Acquire)
                    .to_ne_bytes(),
            )
        }
        /// Takes the next WQE: its buffer (address, length, key), second entry's key.
        fn take_wqe(&mut self) -> (u64, u32, Lkey, Lkey) {
            assert!(self.posted().wrapping_sub(self.rq_ci) > 0, "no WQE posted");
            let mut w = [0u8; 32];
            self.rq.read((self.rq_ci % N) as usize * 32, &mut w);
            self.rq_ci += 1;
            let d = DataSeg::new_checked(&w[..16]).unwrap();
            let d2 = DataSeg::new_checked(&w[16..]).unwrap();
            (d.addr().0, d.byte_count(), d.lkey(), d2.lkey())
        }
        fn slot(&self, pos: u32) -> usize {
            (pos % CQN) as usize * CQE_BYTES
        }
        fn write_cqe(&mut self, f: CqeFields) {
            let mut b = [0u8; 64];
            Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
                owner: (self.pi / CQN) & 1 == 1,
                ..f
            });
            // Body first, op_own last.
            self.cq.write(self.slot(self.pi), &b[..63]);
            self.cq.write(self.slot(self.pi) + 63, &b[63..]);
            self.pi += 1;
        }
        /// One packet of `len` bytes with `fill`, a normal CQE.
        fn rx(&mut self, len: u32, fill: u8, f: CqeFields) {
            let (addr, room, key, key2) = self.take_wqe();
            assert_eq!((key, key2), (Lkey(0x55), INVALID_LKEY));
            assert!(room >= len);
            // The device writes the frame into the posted buffer.
            let buf = buffer_view(addr, len as usize);
            buf.fill(0, len as usize, fill);
            self.write_cqe(CqeFields {
                opcode: 2,
                byte_cnt: len,
                wqe_counter: (self.rq_ci - 1) as u16,
                ..f
            });
        }
        /// A compressed session of `n` packets (lengths 60 + i, hashes i + 1), basic layout:
        /// the title, mini arrays at t+1 and t+8k, holes left as they are.
        fn rx_session(&mut self, n: u32) {
            self.rx_session_with(n, CqeFields::default(), |i| 60 + i);
        }
        /// [`Nic::rx_session`] with the title's other fields from `title` and mini `i`'s
        /// length `len(i)` (a length over the buffer is written only into the mini).
        fn rx_session_with(&mut self, n: u32, title: CqeFields, len: impl Fn(u32) -> u32) {
            let t = self.pi;
            for i in 0..n {
                let (addr, room, _, _) = self.take_wqe();
                let l = len(i).min(room) as usize;
                buffer_view(addr, l).fill(0, l, i as u8);
            }
            for i in 0..n {
                let (slot, e) = mini_slot(t, i);
                let mut m = [0u8; 8];
                m[..4].copy_from_slice(&(i + 1).to_be_bytes());
                m[4..].copy_from_slice(&len(i).to_be_bytes());
                self.cq.write(self.slot(slot) + e * 8, &m);
            }
            // The title last (it makes the session visible).
            let mut b = [0u8; 64];
            Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
                opcode: 2,
                format: 3,
                owner: (t / CQN) & 1 == 1,
                rx_hash_type: hash_type::IPV4 | hash_type::UDP,
                hds_ip_ext: csum_ok::L3 | csum_ok::L4,
                byte_cnt: n,
                ..title
            });
            self.cq.write(self.slot(t), &b[..63]);
            self.cq.write(self.slot(t) + 63, &b[63..]);
            self.pi = t + n;
        }
    }

    /// A view of a posted buffer (pool memory the test owns through the pool).
    fn buffer_view(addr: u64, len: usize) -> DevMem {
        #[allow(unsafe_code)]
        // SAFETY: `addr..addr+len` lies in a posted mbuf of the test's pool, mapped for the
        // test's life; only this test thread writes it, before handing it to the queue.
        unsafe {
            DevMem::from_raw(addr as *mut u8, len)
        }
    }

    fn drain(q: &mut RxQueue, want: usize) -> Vec<Mbuf> {
        let mut got = Vec::new();
        for _ in 0..64 {
            let mut b = Burst::with_capacity(7);
            q.rx_burst(&mut b);
            got.extend(b.drain_front(b.len()));
            if got.len() >= want {
                break;
            }
        }
        got
    }

    #[test]
    fn normal_cqes_over_many_laps_deliver_every_packet_with_its_fields() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-normal", 512)).unwrap();
        let (mut q, mut nic) = queue(&pool);
        assert_eq!(nic.posted(), N);
        for k in 0..(CQN * 5) {
            nic.rx(
                60 + k % 40,
                k as u8,
                CqeFields {
                    rx_hash_res: k,
                    rx_hash_type: hash_type::IPV4,
                    hds_ip_ext: csum_ok::L3,
                    l4_l3_hdr_type: if k % 3 == 0 { 1 } else { 0 },
                    vlan_info: 7,
                    ..Default::default()
                },
            );
            let got = drain(&mut q, 1);
            assert_eq!(got.len(), 1, "packet {k}");
            let m = &got[0];
            assert_eq!(m.len() as u32, 60 + k % 40);
            assert!(m.data().iter().all(|&b| b == k as u8));
            assert_eq!(m.rss_hash(), k);
            assert_eq!(m.ol_flags().contains(OffloadFlags::RX_VLAN), k % 3 == 0);
            drop(got);
        }
        let ci = u32::from_be_bytes(nic.cq_dbrec.load_u32(0, Ordering::Acquire).to_ne_bytes());
        assert_eq!(ci, CQN * 5);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// One run of normal CQEs with the rare cases inside it, on a port that keeps VLAN tags:
    /// a length over the buffer (freed, counted as an error and `rx_too_long`, its bytes not
    /// counted) and tags the device stripped (put back into the frame). The others arrive in
    /// order with their fields, the byte count is what was delivered, the pool ends whole.
    #[test]
    fn a_run_with_a_too_long_packet_and_stripped_tags_keeps_order_and_counts() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-run", 512)).unwrap();
        let (mut q, mut nic) = queue_cfg(&pool, Arc::default(), RxOffloads::empty());
        let room = q.bufs.room();
        for (i, &(len, tagged)) in rare_run::PLAN.iter().enumerate() {
            let len = len.unwrap_or(room + 1);
            let f = CqeFields {
                rx_hash_res: 100 + i as u32,
                rx_hash_type: hash_type::IPV4,
                l4_l3_hdr_type: u8::from(tagged),
                vlan_info: 0x0123,
                ..Default::default()
            };
            if len > room {
                let _ = nic.take_wqe();
                nic.write_cqe(CqeFields {
                    opcode: 2,
                    byte_cnt: len,
                    ..f
                });
            } else {
                nic.rx(len, i as u8, f);
            }
        }
        let mut b = Burst::with_capacity(32);
        assert_eq!(q.rx_burst(&mut b), 4);
        rare_run::check(&b, q.counters.snapshot());
        assert_eq!(xstat(&q, "rx_too_long"), 1);
        drop(b);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// A compressed session on a port that keeps VLAN tags, whose title says the device
    /// stripped one, with a mini longer than the buffer: every other packet arrives in order
    /// with its tag put back and its mini's hash, the long one is freed and counted, the
    /// title's slot and the minis are consumed once.
    #[test]
    fn a_session_with_a_stripped_tag_and_a_too_long_mini() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-zip-tag", 512)).unwrap();
        let (mut q, mut nic) = queue_cfg(&pool, Arc::default(), RxOffloads::empty());
        let room = q.bufs.room();
        let title = CqeFields {
            l4_l3_hdr_type: 1,
            vlan_info: 0x0456,
            ..Default::default()
        };
        nic.rx_session_with(12, title, |i| if i == 5 { room + 9 } else { 60 + i });
        // Bursts of 7: the session's minis come over two bursts.
        let got = drain(&mut q, 11);
        let seen: Vec<(usize, u32, bool)> = got
            .iter()
            .map(|m| {
                (
                    m.len(),
                    m.rss_hash(),
                    m.data()[12..16] == [0x81, 0, 0x04, 0x56],
                )
            })
            .collect();
        let want: Vec<(usize, u32, bool)> = (0..12u32)
            .filter(|&i| i != 5)
            .map(|i| (64 + i as usize, i + 1, true))
            .collect();
        assert_eq!(seen, want);
        assert_eq!(xstat(&q, "rx_too_long"), 1);
        let st = q.counters.snapshot();
        assert_eq!(
            (st.packets, st.bytes, st.errors),
            (11, want.iter().map(|w| w.0 as u64).sum(), 1)
        );
        // A normal packet after it is the next completion.
        nic.rx(70, 0xee, CqeFields::default());
        let next = drain(&mut q, 1);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].len(), 70);
        drop((got, next, q));
        assert_eq!(pool.in_use(), 0);
    }

    /// Every session length from 2 to 32 (the queue keeps at least 32 buffers posted), back
    /// to back so that sessions straddle the CQ's end over several laps: every packet arrives once, in order, with its mini's length
    /// and hash; the consumer index skips whole sessions; nothing is read twice on a later
    /// lap (the slots were poisoned).
    #[test]
    fn compressed_sessions_of_every_length_decompress_across_the_wrap() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-zip", 512)).unwrap();
        let (mut q, mut nic) = queue(&pool);
        let mut sessions = 0;
        for round in 0..4 {
            for n in 2..=32u32 {
                nic.rx_session(n);
                let got = drain(&mut q, n as usize);
                assert_eq!(got.len(), n as usize, "round {round} session {n}");
                for (i, m) in got.iter().enumerate() {
                    assert_eq!(m.len(), 60 + i, "round {round} session {n} packet {i}");
                    assert!(m.data().iter().all(|&b| b == i as u8));
                    assert_eq!(m.rss_hash(), i as u32 + 1);
                }
                sessions += 1;
                // Nothing more.
                let mut b = Burst::with_capacity(8);
                assert_eq!(
                    q.rx_burst(&mut b),
                    0,
                    "round {round} session {n}: a stale slot"
                );
            }
        }
        let ci = u32::from_be_bytes(nic.cq_dbrec.load_u32(0, Ordering::Acquire).to_ne_bytes());
        assert_eq!(ci, nic.pi);
        assert_eq!(
            q.xstats.compressed_sessions.load(Ordering::Relaxed),
            sessions
        );
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn an_error_cqe_consumes_one_buffer_and_is_counted() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-err", 256)).unwrap();
        let (mut q, mut nic) = queue(&pool);
        nic.take_wqe();
        nic.write_cqe(CqeFields {
            opcode: 14,
            syndrome: 0x01,
            ..Default::default()
        });
        nic.rx(64, 9, CqeFields::default());
        let got = drain(&mut q, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), 64);
        assert_eq!(q.xstats.cqe_errors.load(Ordering::Relaxed), 1);
        assert_eq!(q.xstats.critical_errors.load(Ordering::Relaxed), 0);
        drop(got);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    impl Nic {
        /// The device fails the next WQE with RESP_ERR `syndrome`.
        fn fail(&mut self, syndrome: Syndrome) {
            self.take_wqe();
            self.write_cqe(CqeFields {
                opcode: 14,
                syndrome: u8::from(syndrome),
                wqe_counter: (self.rq_ci - 1) as u16,
                ..Default::default()
            });
        }
        /// The device, in error, flushes every WQE still posted; returns how many.
        fn flush_all(&mut self) -> u32 {
            let mut n = 0;
            while self.posted().wrapping_sub(self.rq_ci) > 0 {
                self.fail(Syndrome::WrFlush);
                n += 1;
            }
            n
        }
        fn cq_ci(&self, _q: &RxQueue) -> u32 {
            u32::from_be_bytes(self.cq_dbrec.load_u32(0, Ordering::Acquire).to_ne_bytes())
        }
        /// The buffer addresses of WQEs `0..n`, each checked for the pool's key and a closed
        /// scatter list.
        fn wqe_addrs(&self, n: u32) -> Vec<u64> {
            (0..n)
                .map(|i| {
                    let mut w = [0u8; 32];
                    self.rq.read((i % N) as usize * 32, &mut w);
                    let d = DataSeg::new_checked(&w[..16]).unwrap();
                    let d2 = DataSeg::new_checked(&w[16..]).unwrap();
                    assert_eq!((d.lkey(), d2.lkey()), (Lkey(0x55), INVALID_LKEY), "WQE {i}");
                    d.addr().0
                })
                .collect()
        }
    }

    fn xstat(q: &RxQueue, name: &str) -> u64 {
        q.xstats
            .list()
            .into_iter()
            .find(|x| x.name == name)
            .unwrap()
            .value
    }

    /// Over rounds that lap the CQ: 3 packets, then a LOCAL_PROT error and the flushes of
    /// every other posted WQE. The burst returns the 3 packets, moves the WQ RESET → RDY,
    /// consumes every CQE (SET_CI = the device's producer), and posts every buffer again
    /// from WQE 0 (the RQ record back at the ring size, 64 distinct buffers). Then packets
    /// flow again from the device's counter 0.
    #[test]
    fn a_critical_error_resets_the_wq_drains_the_cq_and_reposts_every_buffer() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-recover", 512)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, Arc::clone(&state));
        let mut flushed = 0u64;
        for round in 0..6u64 {
            for k in 0..3 {
                nic.rx(60 + k, k as u8 + 1, CqeFields::default());
            }
            nic.fail(Syndrome::LocalProt);
            flushed += u64::from(nic.flush_all());
            let mut b = Burst::with_capacity(32);
            assert_eq!(
                q.rx_burst(&mut b),
                3,
                "round {round}: the packets before the error"
            );
            for (k, m) in b.as_slice().iter().enumerate() {
                assert_eq!(m.len(), 60 + k);
                assert!(m.data().iter().all(|&x| x == k as u8 + 1));
            }
            drop(b);
            assert_eq!(state.resets.load(Ordering::Relaxed), round + 1);
            assert_eq!(state.readies.load(Ordering::Relaxed), round + 1);
            assert_eq!(nic.cq_ci(&q), nic.pi, "round {round}: every CQE consumed");
            assert_eq!(
                nic.posted(),
                N,
                "round {round}: the whole ring posted again"
            );
            let mut addrs = nic.wqe_addrs(N);
            addrs.sort_unstable();
            addrs.dedup();
            assert_eq!(addrs.len(), N as usize);
            // The device's consumer restarted at 0 with the RESET.
            nic.rq_ci = 0;
        }
        assert_eq!(xstat(&q, "rx_critical_errors"), 6);
        assert_eq!(xstat(&q, "rx_flushed"), flushed);
        assert_eq!(xstat(&q, "rx_recovery_drops"), 0);
        assert_eq!(xstat(&q, "rx_recoveries"), 6);
        let c = q.counters.snapshot();
        assert_eq!((c.packets, c.errors), (18, 6));
        // Normal traffic again, two more laps of the CQ.
        for k in 0..(2 * CQN) {
            nic.rx(64, k as u8, CqeFields::default());
            let got = drain(&mut q, 1);
            assert_eq!(got.len(), 1, "packet {k}");
            assert!(got[0].data().iter().all(|&x| x == k as u8));
        }
        let mut b = Burst::with_capacity(8);
        assert_eq!(q.rx_burst(&mut b), 0);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// Compressed sessions around an error: a session of 10 delivered across two bursts,
    /// then the error, then a session the drain must consume whole (4 frames dropped, its
    /// slots poisoned), then flushes. No later lap reads a stale mini or title.
    #[test]
    fn recovery_consumes_compressed_sessions_and_leaves_no_stale_slot() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-recover-zip", 512)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, Arc::clone(&state));
        for round in 0..4u32 {
            nic.rx_session(10);
            nic.fail(Syndrome::LocalProt);
            nic.rx_session(4);
            nic.flush_all();
            let got = drain(&mut q, 10);
            assert_eq!(got.len(), 10, "round {round}");
            for (i, m) in got.iter().enumerate() {
                assert_eq!(m.len(), 60 + i);
            }
            assert_eq!(state.resets.load(Ordering::Relaxed), u64::from(round) + 1);
            assert_eq!(nic.cq_ci(&q), nic.pi);
            assert_eq!(xstat(&q, "rx_recovery_drops"), 4 * (u64::from(round) + 1));
            nic.rq_ci = 0;
            // A lap of single packets: each read exactly once.
            for k in 0..CQN {
                nic.rx(70, k as u8, CqeFields::default());
                let got = drain(&mut q, 1);
                assert_eq!(got.len(), 1, "round {round} packet {k}");
                assert_eq!(got[0].len(), 70);
            }
            let mut b = Burst::with_capacity(8);
            assert_eq!(q.rx_burst(&mut b), 0, "round {round}: a stale slot");
        }
        let c = q.counters.snapshot();
        assert_eq!(
            c.errors,
            4 + 4 * 4,
            "the error CQEs and the dropped session frames"
        );
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// A RESET that fails: counted, the queue delivers nothing and posts nothing, a retry
    /// every RECOVERY_RETRY_BURSTS bursts; when one succeeds the queue works again.
    #[test]
    fn a_failing_wq_reset_leaves_the_queue_down_until_a_retry_works() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-rx-downq", 512)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, Arc::clone(&state));
        nic.rx(64, 1, CqeFields::default());
        nic.fail(Syndrome::LocalQpOp);
        state.fail.store(1, Ordering::Relaxed);
        let mut b = Burst::with_capacity(8);
        assert_eq!(q.rx_burst(&mut b), 1);
        drop(b);
        assert!(q.is_down());
        assert_eq!(xstat(&q, "rx_recovery_failures"), 1);
        nic.flush_all();
        let posted = nic.posted();
        for _ in 1..RECOVERY_RETRY_BURSTS {
            let mut b = Burst::with_capacity(8);
            assert_eq!(q.rx_burst(&mut b), 0);
        }
        assert_eq!(nic.posted(), posted, "nothing posted while down");
        assert_eq!(state.resets.load(Ordering::Relaxed), 0);
        let mut b = Burst::with_capacity(8);
        assert_eq!(q.rx_burst(&mut b), 0);
        assert!(!q.is_down());
        assert_eq!(state.resets.load(Ordering::Relaxed), 1);
        assert_eq!(nic.cq_ci(&q), nic.pi);
        assert_eq!(nic.posted(), N);
        nic.rq_ci = 0;
        nic.rx(80, 7, CqeFields::default());
        let got = drain(&mut q, 1);
        assert_eq!(got[0].len(), 80);
        drop(got);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }
}

#[cfg(test)]
mod flags_table_tests {
    use super::*;
    use crate::hw::mlx5::cqe::{hdr_type, Cqe, CqeFields};
    use crate::hw::mlx5::CQE_BYTES;

    /// For every combination of checksum bits, hash type and VLAN bit, with and without
    /// VLAN stripping, the table gives the flags the full decoding (`RxMeta::of`, then
    /// `rx_fields`) gives.
    #[test]
    fn the_table_agrees_with_the_full_decoding() {
        for strip in [false, true] {
            let t = flags_table(strip);
            for bits in 0u8..64 {
                let f = CqeFields {
                    opcode: 2,
                    hds_ip_ext: bits & 7,
                    rx_hash_type: if bits & 8 != 0 { 0x3c } else { 0 },
                    l4_l3_hdr_type: if bits & 16 != 0 { hdr_type::CVLAN } else { 0 }
                        | if bits & 32 != 0 { hdr_type::L3_IPV4 } else { 0 },
                    vlan_info: 100,
                    rx_hash_res: 7,
                    byte_cnt: 60,
                    ..Default::default()
                };
                let mut b = [0u8; CQE_BYTES];
                Cqe::new_checked(&mut b[..]).unwrap().write(&f);
                let c = Cqe::new_checked(&b[..]).unwrap();
                let m = RxMeta::of(&c);
                let want = rx_fields(m.fl, m.hashed.then_some(7), m.vlan, strip, 0)
                    .0
                    .ol_flags;
                let key = RxMeta::flags_key(c.hds_ip_ext(), c.rx_hash_type(), c.l4_l3_hdr_type());
                assert_eq!(t[usize::from(key)], want, "bits {bits:#x} strip {strip}");
            }
        }
    }
}
