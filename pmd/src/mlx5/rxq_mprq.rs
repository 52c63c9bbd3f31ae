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
//! WQEs and counts its drops: `imissed`). Completions come through the shared [`RxCq`], so
//! compressed sessions (CSUM_STRIDX minis: stride index and packed `byte_cnt` per packet, the
//! rest from the title, §6.1) decode exactly as on the cyclic queue. Error CQEs (§5.3) are
//! counted and abandon the rest of the current WQE (the model's policy; the strides an error
//! consumes on hardware are not documented, §9).
#![deny(unsafe_code)]

use super::provider::{Mprq, RawRq};
use super::rx_cq::{RxCompletion, RxCq, RxPolled};
use super::rxq::RxXstats;
use crate::ethdev::{finish_rx, Burst, Counters, PortConfig, QueueOwner, RxBurst, RxOffloads};
use crate::hw::mlx5::cqe::MiniCqeFormat;
use crate::hw::mlx5::doorbell::{self, RCV_DBR};
use crate::hw::mlx5::wqe::{MprqByteCnt, MprqWqe, MPRQ_WQE_BYTES};
use crate::sys::barrier::udma_to_device_barrier;
use crate::sys::mem::DeviceBuffers;
use crate::sys::DevMem;
use mempool::lcache::with_cache;
use mempool::{Mbuf, MbufPool};
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
    /// Mbufs taken from the pool, not yet used: `stash[..stash_n]`.
    stash: Vec<Option<Mbuf>>,
    stash_n: usize,
    pool: Arc<MbufPool>,
    counters: Arc<Counters>,
    xstats: Arc<RxXstats>,
    _owner: QueueOwner,
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
            stash: (0..STASH).map(|_| None).collect(),
            stash_n: 0,
            pool,
            counters,
            xstats,
            _owner: raw.owner,
            port_id,
            vlan_strip: cfg.rx_offloads.contains(RxOffloads::VLAN_STRIP),
        }
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
            let addr = (self.bufs.mem.addr() + i as usize * self.bufs.pitch) as u64;
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
        let start = out.len();
        let mut bytes = 0u64;
        let mut errors = 0u64;
        let mut fillers = 0u64;
        let retired0 = self.retired;
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
                RxPolled::Bad { critical } => {
                    errors += 1;
                    self.xstats.bad(critical);
                    self.retire();
                }
            }
        }
        // Mid-session the consumer index stays at the title until the session is done.
        self.cq.commit();
        let retired = self.retired.wrapping_sub(retired0);
        if retired != 0 {
            self.post();
        }
        let x = &self.xstats;
        RxXstats::add(&x.compressed_sessions, self.cq.sessions - sessions0);
        RxXstats::add(&x.mprq_fillers, fillers);
        RxXstats::add(&x.mprq_wqes_retired, u64::from(retired));
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
    fn drop(&mut self) {
        let stash = &mut self.stash;
        with_cache(&self.pool, |cache| {
            stash
                .iter_mut()
                .filter_map(Option::take)
                .for_each(|m| m.free_to(cache))
        });
    }
}
