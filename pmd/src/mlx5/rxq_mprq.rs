//! mlx5 RX queue over a multi-packet (striding) RQ (§4.2, §7.2).
//!
//! Each 32-byte WQE posts one big buffer of `strides` strides of `stride_bytes` (its data
//! segment at bytes 16–31, `byte_count = stride_bytes × strides`). The device writes each
//! packet at a stride boundary, over as many strides as it needs, and reports it with a CQE
//! whose `byte_cnt` packs the filler flag (bit 31), the strides consumed (bits 29:16) and the
//! length (bits 15:0), and whose `wqe_counter` is the stride index. A packet that does not fit
//! the WQE's remaining strides gets a *filler* completion for them and goes to the next WQE. A
//! WQE is done when all its strides are consumed; the RQ doorbell record counts WQEs.
//!
//! Delivery copies each packet out of its strides into a fresh mbuf from the pool (what DPDK
//! does for short packets, `mprq_max_memcpy_len`, and whenever it cannot attach the stride
//! buffer to an mbuf as external memory; our mbufs have no external-buffer mode). So the big
//! buffers never leave the queue: they are [`DeviceBuffers`] the driver allocates once per
//! queue, page-aligned in a pinned region, registered through the provider's `reg_mr` like
//! the mbuf pool's chunks, and each WQE keeps the same buffer forever. The WQEs are written
//! once by [`RxQueue::fill`]; a finished WQE is posted again by moving the record alone.
//!
//! Mbufs are taken from the pool in bulk into a small stash before completions are read; when
//! the pool is empty the burst stops before consuming a completion (the packet stays in its
//! strides, `rx_nombuf` counts the attempt, and if the pool stays empty the device runs out of
//! WQEs and counts its drops: `imissed`). Completions come through the shared `RxCq`
//! (`rx_cq.rs`), so compressed sessions (CSUM_STRIDX minis: stride index and packed
//! `byte_cnt` per packet, the rest from the title, §6.1) decode exactly as on the cyclic
//! queue. Error CQEs (§5.3) with an ordinary syndrome (LOCAL_LENGTH, …) are counted and
//! abandon the rest of the current WQE (the model's policy; what an error consumes on
//! hardware is not documented, §9). The critical syndromes (LOCAL_QP_OP, LOCAL_PROT,
//! WR_FLUSH) mean the WQ is in error: the queue recovers it as the cyclic queue does (the
//! shared `Recovery`: RESET, drain the CQ, RQ record 0, RDY), then starts again at WQE 0,
//! stride 0, with every WQE posted (they still name their buffers). A completion whose
//! strides lie outside its WQE is dropped without reading (`rx_mprq_bad_strides`), a packet
//! longer than an mbuf's data room too (`rx_too_long`): both count as `ierrors`. Filler
//! completions only move the stride count (`rx_mprq_fillers`).
//!
//! The hot path allocates nothing (the stash is made at setup), takes no lock and makes no
//! system call; per completion it reads 64 bytes (or 8 in a session) and copies the packet.
#![deny(unsafe_code)]

use super::provider::{Mprq, RawRq};
use super::rx_cq::{Recovery, RxCompletion, RxCq, RxPolled};
use super::xstats::RxXstats;
use crate::ethdev::{
    finish_rx, kick, Burst, Counters, Kick, PortConfig, QueueOwner, RxBurst, RxOffloads,
};
use crate::hw::mlx5::cqe::MiniCqeFormat;
use crate::hw::mlx5::doorbell::{self, RCV_DBR};
use crate::hw::mlx5::wqe::{MprqByteCnt, MprqWqe, MPRQ_WQE_BYTES};
use crate::sys::barrier::udma_to_device_barrier;
use crate::sys::mem::DeviceBuffers;
use crate::sys::DevMem;
use mempool::lcache::with_cache;
use mempool::{Iova, Mbuf, MbufPool};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Mbufs taken from the pool at once.
const STASH: usize = 32;

/// An mlx5 RX queue over a striding RQ, owned by one core.
pub struct RxQueue {
    cq: RxCq,
    ring: Arc<DevMem>,
    dbrec: Arc<DevMem>,
    rqn: u32,
    bufs: DeviceBuffers,
    geo: Mprq,
    wqe_cnt: u32,
    /// WQEs software is done with (free-running): the device is filling WQE `retired` (or a
    /// later one, when it ran ahead).
    retired: u32,
    /// Strides of WQE `retired` consumed so far.
    consumed: u32,
    /// WQEs retired since the queue was made (for the counter; `retired` restarts at 0 with
    /// a recovery).
    retires: u64,
    /// Mbufs taken from the pool, not yet used: `stash[..stash_n]`.
    stash: Vec<Option<Mbuf>>,
    stash_n: usize,
    pool: Arc<MbufPool>,
    counters: Arc<Counters>,
    xstats: Arc<RxXstats>,
    /// The WQ's error recovery.
    recovery: Recovery,
    _owner: QueueOwner,
    /// Where the device buffers go when the queue drops (see `Parked`).
    parked: Arc<crate::ethdev::Parked>,
    /// The device's work on this thread (a device model's inline engine; `None` on hardware).
    kick: Kick,
    port_id: u16,
    vlan_strip: bool,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mlx5::rxq_mprq::RxQueue(rq {:#x}, {} WQEs of {} x {} bytes)",
            self.rqn,
            self.wqe_cnt,
            self.geo.strides(),
            self.geo.stride_bytes()
        )
    }
}

impl RxQueue {
    /// An RX queue over the striding RQ `raw`, its WQEs posting `bufs` (one buffer per WQE);
    /// call [`RxQueue::fill`] before the first burst.
    ///
    /// # Panics
    /// If `raw` is not a striding RQ of 32-byte WQEs, or `bufs` lacks a registered buffer of
    /// the WQE's size for each WQE.
    pub fn new(
        raw: RawRq,
        bufs: DeviceBuffers,
        cfg: &PortConfig,
        port_id: u16,
        pool: Arc<MbufPool>,
        counters: Arc<Counters>,
        xstats: Arc<RxXstats>,
    ) -> Self {
        let geo = raw.mprq.expect("a striding RQ");
        let wqe_cnt = raw.wqe_cnt;
        assert!(
            wqe_cnt.is_power_of_two()
                && raw.stride as usize == MPRQ_WQE_BYTES
                && raw.buf.len() >= wqe_cnt as usize * MPRQ_WQE_BYTES
                && bufs.pitch as u64 >= geo.wqe_bytes()
                && bufs.mem.len() >= wqe_cnt as usize * bufs.pitch
                && (0..wqe_cnt).all(|i| bufs.keys.key_of(i).is_some()),
            "bad striding rx queue: {raw:?} over {bufs:?}"
        );
        Self {
            cq: RxCq::new(raw.cq, MiniCqeFormat::CsumStridx),
            ring: raw.buf,
            dbrec: raw.dbrec,
            rqn: raw.rqn,
            bufs,
            geo,
            wqe_cnt,
            retired: 0,
            consumed: 0,
            retires: 0,
            stash: (0..STASH).map(|_| None).collect(),
            stash_n: 0,
            pool,
            counters,
            xstats,
            recovery: Recovery::new(raw.state, raw.rqn),
            _owner: raw.owner,
            parked: raw.parked,
            kick: raw.kick,
            port_id,
            vlan_strip: cfg.rx_offloads.contains(RxOffloads::VLAN_STRIP),
        }
    }

    /// Whether a recovery failed and the queue delivers nothing until a retry succeeds.
    pub fn is_down(&self) -> bool {
        self.recovery.is_down()
    }

    /// Recovery of a WQ in error (§5.3): the shared restart (RESET, the CQ drained,
    /// `SET_CI`, the RQ record ← 0, RDY), then the device starts again at WQE 0, stride 0:
    /// every WQE is posted again (each still names its buffer).
    #[cold]
    fn recover(&mut self) {
        if !self
            .recovery
            .restart(&mut self.cq, &self.dbrec, &self.xstats, &self.counters)
        {
            return;
        }
        self.retired = 0;
        self.consumed = 0;
        self.post();
        self.recovery.done(&self.xstats);
    }

    /// The geometry.
    pub fn geometry(&self) -> Mprq {
        self.geo
    }

    /// WQEs in the ring.
    pub fn wqe_cnt(&self) -> u32 {
        self.wqe_cnt
    }

    /// Writes every WQE (each with its own buffer, for good) and posts them all.
    pub fn fill(&mut self) {
        let mut w = [0u8; MPRQ_WQE_BYTES];
        for i in 0..self.wqe_cnt {
            let addr = Iova((self.bufs.mem.addr() + i as usize * self.bufs.pitch) as u64);
            // Every buffer has a key (checked in `new`).
            let lkey = self.bufs.keys.key_of(i).unwrap_or_default();
            if let Some(mut v) = MprqWqe::new_checked(&mut w[..]) {
                v.write(addr, lkey, self.geo.wqe_bytes() as u32);
            }
            self.ring.write(i as usize * MPRQ_WQE_BYTES, &w);
        }
        self.post();
    }

    /// Writes the RQ record: every WQE not yet retired is posted (§4.2).
    fn post(&self) {
        // The WQEs (or, for a retired WQE, our last reads of its strides) before the record.
        udma_to_device_barrier();
        self.dbrec.store_u32(
            RCV_DBR,
            u32::from_ne_bytes(doorbell::rq_record(self.retired.wrapping_add(self.wqe_cnt))),
            Ordering::Release,
        );
    }

    /// Takes up to `want` (at least one) mbufs into the empty stash; `false` if the pool has
    /// none.
    fn restock(&mut self, want: usize) -> bool {
        debug_assert_eq!(self.stash_n, 0);
        let pool = &self.pool;
        for k in [want.clamp(1, STASH), 1] {
            let slots = &mut self.stash[..k];
            if with_cache(pool, |cache| pool.alloc_mbufs(cache, slots)) {
                self.stash_n = k;
                return true;
            }
        }
        false
    }

    #[inline]
    fn take_mbuf(&mut self) -> Option<Mbuf> {
        self.stash_n = self.stash_n.checked_sub(1)?;
        self.stash[self.stash_n].take()
    }

    #[inline]
    fn give_back(&mut self, m: Mbuf) {
        self.stash[self.stash_n] = Some(m);
        self.stash_n += 1;
    }

    /// Marks `strides` more strides of the current WQE consumed; retires it when none is left.
    #[inline]
    fn consume(&mut self, strides: u32) {
        self.consumed += strides;
        if self.consumed >= self.geo.strides() {
            self.retire();
        }
    }

    /// Done with the current WQE: the device may fill it again once the record says so.
    #[inline]
    fn retire(&mut self) {
        self.retired = self.retired.wrapping_add(1);
        self.consumed = 0;
        self.retires += 1;
    }

    /// Copies the packet of `c` out of its strides into an mbuf and puts it in `out`; `false`
    /// (and the reason counted) when it cannot.
    #[inline]
    fn deliver(&mut self, c: &RxCompletion, out: &mut Burst, bytes: &mut u64) -> bool {
        let b = MprqByteCnt::from_word(c.byte_cnt);
        let stride_bytes = self.geo.stride_bytes() as usize;
        let len = usize::from(b.len);
        let first = c.stride_idx.map_or(self.consumed, u32::from);
        // The packet must lie inside its WQE's buffer, over the strides the CQE says it took.
        let spans = len.div_ceil(stride_bytes) as u32;
        if len == 0 || spans > u32::from(b.strides) || first + spans > self.geo.strides() {
            RxXstats::bump(&self.xstats.mprq_bad_strides);
            return false;
        }
        let Some(mut m) = self.take_mbuf() else {
            return false;
        };
        let at = (self.retired & (self.wqe_cnt - 1)) as usize * self.bufs.pitch
            + first as usize * stride_bytes;
        match m.append(len) {
            Ok(dst) => self.bufs.mem.read(at, dst),
            Err(_) => {
                RxXstats::bump(&self.xstats.too_long);
                self.give_back(m);
                return false;
            }
        }
        finish_rx(
            &mut m,
            c.meta.fl,
            c.meta.hashed.then_some(c.hash),
            c.meta.vlan,
            self.vlan_strip,
            self.port_id,
        );
        *bytes += len as u64;
        let _ = out.push(m);
        true
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
        let mut fillers = 0u64;
        let retires0 = self.retires;
        let sessions0 = self.cq.sessions;
        while out.spare() > 0 {
            // An mbuf first, so that a completion is never consumed without one.
            if self.stash_n == 0 && !self.restock(out.spare()) {
                self.counters.add_nombuf(1);
                break;
            }
            match self.cq.next() {
                RxPolled::Empty => break,
                RxPolled::Packet(c) => {
                    let b = MprqByteCnt::from_word(c.byte_cnt);
                    if b.filler {
                        fillers += 1;
                    } else if !self.deliver(&c, out, &mut bytes) {
                        errors += 1;
                    }
                    self.consume(u32::from(b.strides));
                }
                RxPolled::Bad { critical, flush } => {
                    self.xstats.bad(critical);
                    if !flush {
                        errors += 1;
                    }
                    if critical {
                        // The WQ is in error (§5.3): recover it in this burst.
                        self.recover();
                        // The CQ is drained (and SET_CI written), or the queue is down.
                        break;
                    }
                    self.retire();
                }
            }
        }
        // Mid-session the consumer index stays at the title until the session is done.
        self.cq.commit();
        let retired = self.retires - retires0;
        if retired != 0 && !self.recovery.is_down() {
            self.post();
        }
        let x = &self.xstats;
        RxXstats::add(&x.compressed_sessions, self.cq.sessions - sessions0);
        RxXstats::add(&x.mprq_fillers, fillers);
        RxXstats::add(&x.mprq_wqes_retired, retired);
        let delivered = out.len() - start;
        self.counters.add(delivered as u64, bytes);
        self.counters.add_errors(errors);
        delivered
    }
}

impl RxBurst for RxQueue {
    #[inline]
    fn rx_burst(&mut self, out: &mut Burst) -> usize {
        RxQueue::rx_burst(self, out)
    }
}

impl Drop for RxQueue {
    /// Frees the stash; completions the device wrote that no burst took are frames the
    /// application never got: counted as missed (see the cyclic queue's drop).
    fn drop(&mut self) {
        let d = self.cq.drain();
        self.counters.add_missed(d.dropped);
        // The device may still write into the strides until the WQ is destroyed: the
        // buffers' memory and registration stay mapped until then (see `Parked`).
        self.parked
            .park((Arc::clone(&self.bufs.mem), self.bufs.keys.clone()));
        let stash = &mut self.stash;
        with_cache(&self.pool, |cache| {
            stash
                .iter_mut()
                .filter_map(Option::take)
                .for_each(|m| m.free_to(cache))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::mlx5::cqe::{hash_type, mini_slot, Cqe, CqeFields, CqeOpcode, MiniCqe};
    use crate::hw::mlx5::doorbell::CQ_SET_CI;
    use crate::hw::mlx5::CQE_BYTES;
    use crate::mlx5::provider::testing::TestState;
    use crate::mlx5::RawCq;
    use mempool::{MbufPoolConfig, Registration};

    const LKEY: u32 = 0x66;

    /// The device's side, by hand, as §4.2 and §6.2 describe it: reads posted WQEs, places
    /// packets at stride boundaries, writes fillers, CQEs and CSUM_STRIDX sessions.
    struct Nic {
        ring: Arc<DevMem>,
        dbrec: Arc<DevMem>,
        cq: Arc<DevMem>,
        cq_dbrec: Arc<DevMem>,
        cqn: u32,
        /// The stride buffers, as the test sees them.
        bufs: Arc<DevMem>,
        geo: Mprq,
        wqe_cnt: u32,
        /// CQ producer (free-running).
        pi: u32,
        /// WQE counter and the next free stride in it.
        wqe: u32,
        stride: u32,
        /// Fillers and sessions written.
        fillers: u64,
        sessions: u64,
    }

    fn queue(pool: &Arc<MbufPool>, geo: Mprq, wqe_cnt: u32, cqn: u32) -> (RxQueue, Nic) {
        queue_with(pool, geo, wqe_cnt, cqn, Arc::default())
    }

    fn queue_with(
        pool: &Arc<MbufPool>,
        geo: Mprq,
        wqe_cnt: u32,
        cqn: u32,
        state: Arc<TestState>,
    ) -> (RxQueue, Nic) {
        let ring = Arc::new(DevMem::anon(wqe_cnt as usize * MPRQ_WQE_BYTES).unwrap());
        let cq = Arc::new(DevMem::anon(cqn as usize * CQE_BYTES).unwrap());
        for i in 0..cqn as usize {
            cq.write(i * CQE_BYTES + 63, &[0xf0]);
        }
        let dbrec = Arc::new(DevMem::anon(64).unwrap());
        let cq_dbrec = Arc::new(DevMem::anon(64).unwrap());
        let bufs = DeviceBuffers::new("mprq-test", wqe_cnt, geo.wqe_bytes() as usize, |_| {
            Ok(Registration::new(mempool::Lkey(LKEY)))
        })
        .unwrap();
        let view = Arc::clone(&bufs.mem);
        let raw = RawRq {
            buf: Arc::clone(&ring),
            wqe_cnt,
            stride: MPRQ_WQE_BYTES as u32,
            rqn: 0x98,
            dbrec: Arc::clone(&dbrec),
            cq: RawCq {
                buf: Arc::clone(&cq),
                cqe_cnt: cqn,
                dbrec: Arc::clone(&cq_dbrec),
                cqn: 4,
            },
            mprq: Some(geo),
            cqe_compression: true,
            owner: Arc::new(()),
            parked: crate::ethdev::Parked::new(),
            state,
            kick: None,
        };
        let cfg = PortConfig::default();
        let mut q = RxQueue::new(
            raw,
            bufs,
            &cfg,
            3,
            Arc::clone(pool),
            Arc::default(),
            Arc::default(),
        );
        q.fill();
        let nic = Nic {
            ring,
            dbrec,
            cq,
            cq_dbrec,
            cqn,
            bufs: view,
            geo,
            wqe_cnt,
            pi: 0,
            wqe: 0,
            stride: 0,
            fillers: 0,
            sessions: 0,
        };
        (q, nic)
    }

    /// The bytes of packet `seq` of `len` bytes.
    fn payload(seq: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seq as usize * 7 + i * 13 + (i >> 8)) as u8)
            .collect()
    }

    fn be(mem: &DevMem, off: usize) -> u32 {
        u32::from_be_bytes(mem.load_u32(off, Ordering::Acquire).to_ne_bytes())
    }

    impl Nic {
        fn posted(&self) -> u32 {
            be(&self.dbrec, RCV_DBR)
        }
        fn set_ci(&self) -> u32 {
            be(&self.cq_dbrec, CQ_SET_CI)
        }
        fn slot(&self, pos: u32) -> usize {
            (pos % self.cqn) as usize * CQE_BYTES
        }
        /// Writes `f` at the producer with the lap's owner bit, body first.
        fn write_cqe(&mut self, f: &CqeFields) {
            assert!(
                self.pi.wrapping_sub(self.set_ci()) < self.cqn,
                "CQ overrun: SET_CI {} producer {}",
                self.set_ci(),
                self.pi
            );
            let mut b = [0u8; 64];
            Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
                owner: (self.pi / self.cqn) & 1 == 1,
                ..*f
            });
            self.cq.write(self.slot(self.pi), &b[..63]);
            self.cq.write(self.slot(self.pi) + 63, &b[63..]);
            self.pi += 1;
        }
        /// Places a packet of `bytes` (a filler first when it does not fit the strides left)
        /// and returns (the filler's CQE, the packet's CQE).
        fn place(&mut self, bytes: &[u8], hash: u32) -> (Option<CqeFields>, CqeFields) {
            let (strides, sb) = (self.geo.strides(), self.geo.stride_bytes() as usize);
            let need = bytes.len().div_ceil(sb) as u32;
            assert!(need <= strides);
            let mut filler = None;
            if self.stride + need > strides {
                filler = Some(CqeFields {
                    opcode: 2,
                    byte_cnt: MprqByteCnt {
                        filler: true,
                        strides: (strides - self.stride) as u16,
                        len: 0,
                    }
                    .word(),
                    wqe_counter: self.stride as u16,
                    wqe_id: self.wqe as u16,
                    ..Default::default()
                });
                self.fillers += 1;
                self.wqe += 1;
                self.stride = 0;
            }
            assert!(self.posted().wrapping_sub(self.wqe) > 0, "no WQE posted");
            let mut w = [0u8; MPRQ_WQE_BYTES];
            self.ring
                .read((self.wqe % self.wqe_cnt) as usize * MPRQ_WQE_BYTES, &mut w);
            let v = MprqWqe::new_checked(&w[..]).unwrap();
            let d = v.dseg();
            assert_eq!(&w[..16], &[0u8; 16]);
            assert_eq!(
                (d.lkey(), u64::from(d.byte_count())),
                (mempool::Lkey(LKEY), self.geo.wqe_bytes())
            );
            let at = d.addr().0 as usize + self.stride as usize * sb - self.bufs.addr();
            self.bufs.write(at, bytes);
            let f = CqeFields {
                opcode: 2,
                rx_hash_res: hash,
                rx_hash_type: hash_type::IPV4,
                byte_cnt: MprqByteCnt {
                    filler: false,
                    strides: need as u16,
                    len: bytes.len() as u16,
                }
                .word(),
                wqe_counter: self.stride as u16,
                wqe_id: self.wqe as u16,
                ..Default::default()
            };
            self.stride += need;
            if self.stride == strides {
                self.wqe += 1;
                self.stride = 0;
            }
            (filler, f)
        }
        /// One packet, normal CQEs.
        fn rx(&mut self, bytes: &[u8], hash: u32) {
            let (filler, f) = self.place(bytes, hash);
            if let Some(x) = filler {
                self.write_cqe(&x);
            }
            self.write_cqe(&f);
        }
        /// Completions `fs` as one basic-layout session with CSUM_STRIDX minis (a normal CQE
        /// when alone): arrays at t+1 and t+8k, then the title (packet 0's CQE, format 3,
        /// byte_cnt = n).
        fn session(&mut self, fs: &[CqeFields]) {
            match fs.len() {
                0 => {}
                1 => self.write_cqe(&fs[0]),
                n => {
                    let t = self.pi;
                    assert!(
                        t.wrapping_sub(self.set_ci()) + n as u32 <= self.cqn,
                        "overrun"
                    );
                    for (i, f) in fs.iter().enumerate() {
                        let (slot, e) = mini_slot(t, i as u32);
                        let mut m = [0u8; 8];
                        m[..4].copy_from_slice(
                            &MiniCqe::<&[u8]>::stridx_word(0xbeef, f.wqe_counter).to_be_bytes(),
                        );
                        m[4..].copy_from_slice(&f.byte_cnt.to_be_bytes());
                        self.cq.write(self.slot(slot) + e * 8, &m);
                    }
                    let mut b = [0u8; 64];
                    Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
                        format: 3,
                        byte_cnt: n as u32,
                        owner: (t / self.cqn) & 1 == 1,
                        ..fs[0]
                    });
                    self.cq.write(self.slot(t), &b[..63]);
                    self.cq.write(self.slot(t) + 63, &b[63..]);
                    self.pi = t + n as u32;
                    self.sessions += 1;
                }
            }
        }
    }

    fn drain(q: &mut RxQueue, want: usize) -> Vec<Mbuf> {
        let mut got = Vec::new();
        for _ in 0..want + 8 {
            let mut b = Burst::with_capacity(7);
            q.rx_burst(&mut b);
            got.extend(b.drain_front(b.len()));
            if got.len() >= want {
                break;
            }
        }
        got
    }

    fn small() -> Mprq {
        // 8 strides of 64 bytes: a WQE of 512 bytes.
        Mprq {
            log_stride_bytes: 6,
            log_strides: 3,
        }
    }

    /// Sizes around the stride size and across several strides, up to a whole WQE, over many
    /// laps of the RQ and the CQ: every packet arrives once, in order, byte for byte, with its
    /// hash; every filler is counted; the record always posts every WQE not yet consumed.
    #[test]
    fn packets_around_the_stride_size_arrive_byte_exact_over_many_laps() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-laps", 256)).unwrap();
        let (mut q, mut nic) = queue(&pool, small(), 4, 64);
        assert_eq!(nic.posted(), 4);
        let sizes = [
            60usize, 63, 64, 65, 127, 128, 129, 191, 192, 193, 300, 448, 449, 511, 512,
        ];
        for seq in 0..3000u32 {
            let len = sizes[seq as usize % sizes.len()];
            let want = payload(seq, len);
            nic.rx(&want, seq ^ 0x5a5a);
            let got = drain(&mut q, 1);
            assert_eq!(got.len(), 1, "packet {seq}");
            assert_eq!(got[0].data(), &want[..], "packet {seq} of {len} bytes");
            assert_eq!(got[0].rss_hash(), seq ^ 0x5a5a);
            assert_eq!(got[0].port(), 3);
            // Everything the device finished is posted again; the current WQE is not.
            assert_eq!(nic.posted(), nic.wqe + 4, "packet {seq}");
        }
        assert!(
            nic.wqe > 4 * 50 && nic.pi > 64 * 20,
            "laps: {} WQEs",
            nic.wqe
        );
        assert_eq!(nic.set_ci(), nic.pi);
        let x = &q.xstats;
        assert!(nic.fillers > 100);
        assert_eq!(x.mprq_fillers.load(Ordering::Relaxed), nic.fillers);
        assert_eq!(
            x.mprq_wqes_retired.load(Ordering::Relaxed),
            u64::from(nic.wqe)
        );
        assert_eq!(q.counters.snapshot().packets, 3000);
        assert_eq!(q.counters.snapshot().errors, 0);
        drop(q);
        assert_eq!(pool.available(), pool.capacity());
    }

    /// A packet that does not fit the strides left gets a filler for them and lands at
    /// stride 0 of the next WQE; the WQE the filler closed is posted again.
    #[test]
    fn a_filler_closes_the_wqe_and_the_packet_lands_in_the_next() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-filler", 64)).unwrap();
        let (mut q, mut nic) = queue(&pool, small(), 4, 64);
        let a = payload(1, 400); // strides 0..7 of WQE 0
        let b = payload(2, 100); // needs 2, 1 left: filler, then WQE 1 strides 0..2
        nic.rx(&a, 0);
        nic.rx(&b, 0);
        assert_eq!((nic.fillers, nic.wqe, nic.stride), (1, 1, 2));
        let got = drain(&mut q, 2);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].data(), &a[..]);
        assert_eq!(got[1].data(), &b[..]);
        // The second packet came from WQE 1's buffer (buffers start on pages).
        let mut raw = vec![0u8; 100];
        nic.bufs.read(DeviceBuffers::ALIGN, &mut raw);
        assert_eq!(raw, b);
        assert_eq!(q.xstats.mprq_fillers.load(Ordering::Relaxed), 1);
        assert_eq!(nic.posted(), 5);
        drop(got);
        drop(q);
        assert_eq!(pool.available(), pool.capacity());
    }

    /// Sessions of every length from 2 to 32 with CSUM_STRIDX minis, back to back over
    /// several laps of the CQ (they straddle its end): first packets of one stride (sessions
    /// never broken), then of 1 to 6 strides, where fillers end sessions early. Every packet
    /// arrives once, in order, with the title's hash; `SET_CI` stays at a title until its
    /// session is done; nothing is read twice on a later lap (the slots were poisoned).
    #[test]
    fn compressed_sessions_of_every_length_with_stride_minis_across_the_cq_wrap() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-zip", 512)).unwrap();
        // 64 strides of 64 bytes; 4 WQEs; a CQ of 2 x 4 x 64 entries.
        let geo = Mprq {
            log_stride_bytes: 6,
            log_strides: 6,
        };
        let (mut q, mut nic) = queue(&pool, geo, 4, 512);
        let mut seq = 0u32;
        for phase in 0..2 {
            for round in 0..3 {
                for n in 2..=32u32 {
                    let mut run = Vec::new();
                    let mut want = Vec::new();
                    let hash = n * 100 + round;
                    for i in 0..n {
                        let len = if phase == 0 {
                            40 + (i as usize % 25)
                        } else {
                            60 + (i as usize * 53 + round as usize * 31) % 320
                        };
                        let bytes = payload(seq, len);
                        seq += 1;
                        let (filler, f) = nic.place(&bytes, hash);
                        if let Some(x) = filler {
                            nic.session(&run);
                            run.clear();
                            nic.write_cqe(&x);
                        }
                        run.push(f);
                        want.push(bytes);
                    }
                    nic.session(&run);
                    let got = drain(&mut q, want.len());
                    assert_eq!(got.len(), want.len(), "phase {phase} round {round} n {n}");
                    for (i, (m, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(m.data(), &w[..], "phase {phase} round {round} n {n} #{i}");
                        assert_eq!(m.rss_hash(), hash);
                    }
                    let mut b = Burst::with_capacity(8);
                    assert_eq!(q.rx_burst(&mut b), 0, "a stale slot after session {n}");
                    assert_eq!(nic.set_ci(), nic.pi);
                }
            }
        }
        assert!(nic.pi > 3 * 512, "the CQ wrapped {} times", nic.pi / 512);
        assert!(nic.fillers > 0);
        let x = &q.xstats;
        assert_eq!(x.compressed_sessions.load(Ordering::Relaxed), nic.sessions);
        assert_eq!(x.mprq_fillers.load(Ordering::Relaxed), nic.fillers);
        assert_eq!(q.counters.snapshot().packets, u64::from(seq));
        drop(q);
        assert_eq!(pool.available(), pool.capacity());
    }

    /// Mid-session, `SET_CI` names the title: the device may not reuse the session's slots
    /// before the whole session is consumed.
    #[test]
    fn set_ci_stays_at_the_title_until_the_session_is_consumed() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-setci", 64)).unwrap();
        let (mut q, mut nic) = queue(&pool, small(), 4, 64);
        nic.rx(&payload(0, 60), 1); // a normal CQE at 0
        let fs: Vec<_> = (1..=10).map(|s| nic.place(&payload(s, 64), 1).1).collect();
        nic.session(&fs); // title at 1, 10 completions
        let mut b = Burst::with_capacity(4);
        assert_eq!(q.rx_burst(&mut b), 4);
        assert_eq!(nic.set_ci(), 1, "the title's slot");
        let mut b = Burst::with_capacity(16);
        assert_eq!(q.rx_burst(&mut b), 7);
        assert_eq!(nic.set_ci(), 11);
        // Slots 2..11 were poisoned; the title keeps its owner bit.
        for s in 2..11 {
            let mut x = [0u8];
            nic.cq.read(nic.slot(s) + 63, &mut x);
            assert_eq!(x[0] >> 4, 15, "slot {s}");
        }
    }

    /// With the pool empty the burst stops before consuming a completion and counts it; the
    /// packet is delivered once mbufs come back.
    #[test]
    fn an_empty_pool_stops_the_burst_without_losing_the_packet() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-nombuf", 16)).unwrap();
        let (mut q, mut nic) = queue(&pool, small(), 4, 64);
        let held: Vec<Mbuf> = (0..16)
            .map(|_| mempool::lcache::alloc(&pool).unwrap())
            .collect();
        let want = payload(9, 200);
        nic.rx(&want, 0);
        let mut b = Burst::with_capacity(8);
        assert_eq!(q.rx_burst(&mut b), 0);
        assert_eq!(q.counters.snapshot().nombuf, 1);
        drop(held);
        let got = drain(&mut q, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data(), &want[..]);
        drop(got);
        drop(q);
        assert_eq!(pool.available(), pool.capacity());
    }

    /// An error CQE is counted and abandons the rest of its WQE; the next packet is read from
    /// the next WQE.
    #[test]
    fn an_error_cqe_gives_up_the_rest_of_the_wqe() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-err", 64)).unwrap();
        let (mut q, mut nic) = queue(&pool, small(), 4, 64);
        let a = payload(1, 100);
        nic.rx(&a, 0);
        nic.write_cqe(&CqeFields {
            opcode: u8::from(CqeOpcode::RespErr),
            syndrome: 0x01,
            byte_cnt: MprqByteCnt {
                filler: false,
                strides: 6,
                len: 0,
            }
            .word(),
            wqe_counter: 2,
            ..Default::default()
        });
        (nic.wqe, nic.stride) = (1, 0);
        let b = payload(2, 300);
        nic.rx(&b, 0);
        let got = drain(&mut q, 2);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].data(), got[1].data()), (&a[..], &b[..]));
        assert_eq!(q.xstats.cqe_errors.load(Ordering::Relaxed), 1);
        assert_eq!(q.counters.snapshot().errors, 1);
        assert_eq!(nic.posted(), 5);
    }

    /// A completion naming strides outside its WQE is dropped and counted, not read.
    #[test]
    fn a_completion_past_the_wqe_end_is_dropped_and_counted() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-bad", 64)).unwrap();
        let (mut q, mut nic) = queue(&pool, small(), 4, 64);
        nic.write_cqe(&CqeFields {
            opcode: 2,
            byte_cnt: MprqByteCnt {
                filler: false,
                strides: 2,
                len: 100,
            }
            .word(),
            wqe_counter: 7, // strides 7 and 8 of an 8-stride WQE
            ..Default::default()
        });
        let mut b = Burst::with_capacity(8);
        assert_eq!(q.rx_burst(&mut b), 0);
        assert_eq!(q.xstats.mprq_bad_strides.load(Ordering::Relaxed), 1);
        assert_eq!(q.counters.snapshot().errors, 1);
        drop(q);
        assert_eq!(pool.available(), pool.capacity());
    }

    /// A critical error (LOCAL_PROT) puts the WQ through RESET and RDY in the burst that
    /// finds it: the flushes after it are drained and counted, the record goes to 0 and then
    /// posts every WQE again, and the next packet is read from WQE 0, stride 0. A refused
    /// state change leaves the queue down until a retry works.
    /// Found by the `mlx5_mprq` fuzz target: a compressed title whose count (its `byte_cnt`)
    /// claimed billions of completions kept one `rx_burst` looping over "filler" minis for
    /// minutes (and the recovery's drain would have poisoned as many slots). A session
    /// covers consecutive slots of the CQ, so a title claiming more than the CQ holds is a
    /// broken device's: a critical error, and the queue recovers, in one burst.
    #[test]
    fn a_session_longer_than_the_cq_is_a_critical_error_not_a_loop() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-huge-session", 64)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, small(), 4, 64, Arc::clone(&state));
        nic.write_cqe(&CqeFields {
            opcode: 2,
            format: 3,
            byte_cnt: u32::MAX,
            ..Default::default()
        });
        let mut b = Burst::with_capacity(8);
        assert_eq!(q.rx_burst(&mut b), 0);
        assert_eq!(q.xstats.critical_errors.load(Ordering::Relaxed), 1);
        assert_eq!(state.resets.load(Ordering::Relaxed), 1);
        assert_eq!(state.readies.load(Ordering::Relaxed), 1);
        assert_eq!(
            nic.set_ci(),
            nic.pi,
            "the CQ consumed up to the device's position"
        );
    }

    #[test]
    fn a_critical_error_recovers_the_wq_and_starts_again_at_wqe_0() {
        let pool = MbufPool::new(MbufPoolConfig::new("mprq-recover", 64)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, small(), 4, 64, Arc::clone(&state));
        let a = payload(1, 100);
        nic.rx(&a, 0); // WQE 0, strides 0..2
                       // WQE 0 fails from stride 2 on; the device flushes WQEs 1..4.
        let err = |strides: u16, stride: u16, syndrome: u8| CqeFields {
            opcode: u8::from(CqeOpcode::RespErr),
            syndrome,
            byte_cnt: MprqByteCnt {
                filler: false,
                strides,
                len: 0,
            }
            .word(),
            wqe_counter: stride,
            ..Default::default()
        };
        nic.write_cqe(&err(6, 2, 0x04));
        for _ in 1..4 {
            nic.write_cqe(&err(8, 0, 0x05));
        }
        state.fail.store(1, Ordering::Relaxed);
        let got = drain(&mut q, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data(), &a[..]);
        // RESET refused: down, nothing drained yet.
        assert!(q.is_down());
        assert_eq!(q.xstats.recovery_failures.load(Ordering::Relaxed), 1);
        let mut b = Burst::with_capacity(8);
        for _ in 0..crate::mlx5::txq::RECOVERY_RETRY_BURSTS {
            assert_eq!(q.rx_burst(&mut b), 0);
        }
        assert!(!q.is_down(), "the retry worked");
        assert_eq!(state.resets.load(Ordering::Relaxed), 1);
        assert_eq!(state.readies.load(Ordering::Relaxed), 1);
        let x = &q.xstats;
        assert_eq!(x.critical_errors.load(Ordering::Relaxed), 1);
        assert_eq!(x.flushed.load(Ordering::Relaxed), 3);
        assert_eq!(x.recoveries.load(Ordering::Relaxed), 1);
        assert_eq!(nic.set_ci(), nic.pi);
        assert_eq!(nic.posted(), 4, "every WQE posted again from 0");
        // The device restarts at WQE 0, stride 0.
        (nic.wqe, nic.stride) = (0, 0);
        let c = payload(3, 200);
        nic.rx(&c, 0);
        let got2 = drain(&mut q, 1);
        assert_eq!(got2.len(), 1);
        assert_eq!(got2[0].data(), &c[..]);
        assert_eq!(q.counters.snapshot().errors, 1);
        drop((got, got2));
        drop(q);
        assert_eq!(pool.available(), pool.capacity());
    }
}
