//! The MANA half: `pmd::mana::TxQueue` / `RxQueue` over queue memory this program owns, in
//! the geometry rdma-core gives DPDK for 256 descriptors (spec §1.7): SQ 64 KiB, RQ 8 KiB,
//! CQs of 256 entries, a 4096-byte doorbell page. The device double (the same logic as
//! `bench/datapath/c/mana_dpdk.c`):
//!
//! * TX: after each burst, reads the SQ doorbell, walks every WQE posted since its last step
//!   and, for each WQE whose suppress bit (TX OOB dword 0 bit 7) is clear, writes a TX_OKAY
//!   CQE (§7.1-7.3, §7.5; owner bits §7.2), body first, then the info dword, as the device
//!   does (§8.2). DPDK suppresses every WQE of a burst but the last; we ask for every one.
//! * RX: before each burst, reads the RQ doorbell and, for every WQE posted and not yet
//!   filled, copies the frame to the SGE's address and writes an RX_OKAY CQE (length 60,
//!   hash, IP and UDP checksums good); coalescing: one RX_COALESCED_4 CQE per four WQEs. The
//!   RQ is kept full, so every burst finds 32 packets.

use super::{anon, dma_frame, time_rx, time_tx, Plan, Stats, RING, RX_HASH};
use mempool::{ChunkKeys, MbufPool};
use pmd::ethdev::PortConfig;
use pmd::mana::{RawRxQueue, RawTxQueue, RxQueue, TxQueue};
use pmd::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SQ_BYTES: usize = 256 * 256;
const RQ_BYTES: usize = 256 * 32;
const CQ_COUNT: u32 = 256;
const CQE: usize = 64;
/// Doorbell page offsets of the SQ and RQ doorbells.
const DB_SQ: usize = 0x000;
const DB_RQ: usize = 0x400;
const SQ_ID: u32 = 0x0001_2345;
const TX_CQ_ID: u32 = 0x0000_0101;
const RQ_ID: u32 = 0x0001_2346;
const RX_CQ_ID: u32 = 0x0000_0102;

/// Writes CQEs as the device does: slot n mod count, owner (n / count + 1) mod 8, the 60
/// body bytes first, then the info dword (WQ id, is_sq, owner) with a release store.
struct CqWriter {
    mem: Arc<DevMem>,
    count: u32,
    n: u64,
}

impl CqWriter {
    fn push(&mut self, body: &[u8; 60], wq: u32, is_sq: bool) {
        let slot = (self.n % u64::from(self.count)) as usize * CQE;
        self.mem.write(slot, body);
        let owner = ((self.n / u64::from(self.count) + 1) % 8) as u32;
        let info = (wq & 0x00ff_ffff) | (u32::from(is_sq) << 24) | (owner << 29);
        self.mem.store_u32(slot + 60, info, Ordering::Release);
        self.n += 1;
    }
}

struct TxDev {
    sq: Arc<DevMem>,
    db: Arc<DevMem>,
    cq: CqWriter,
    /// Device consumer position in bytes (free-running).
    pos: u32,
    wqes: u64,
}

impl TxDev {
    fn step(&mut self) {
        let prod = (self.db.load_u64(DB_SQ, Ordering::Acquire) >> 32) as u32;
        while self.pos != prod {
            let off = self.pos as usize & (SQ_BYTES - 1);
            let d1 = self.sq.load_u32(off + 4, Ordering::Relaxed);
            let nsge = (d1 & 0xff).max(1);
            let oob = ((d1 >> 8) & 7) * 4;
            let bytes = (8 + oob + 16 * nsge).div_ceil(32) * 32;
            let oob0 = self.sq.load_u32(off + 8, Ordering::Relaxed);
            if oob0 & (1 << 7) == 0 {
                let mut body = [0u8; 60];
                // TX_OKAY (32), client type 1; the WQE offset [31:5].
                body[0..4].copy_from_slice(&(32u32 | (1 << 6)).to_le_bytes());
                body[8..12].copy_from_slice(&(off as u32 & !31).to_le_bytes());
                self.cq.push(&body, SQ_ID, true);
            }
            self.pos = self.pos.wrapping_add(bytes);
            self.wqes += 1;
        }
    }
}

struct RxDev {
    rq: Arc<DevMem>,
    db: Arc<DevMem>,
    cq: CqWriter,
    pos: u32,
    coalesce: bool,
    hash_type: u32,
    filled: u64,
}

impl RxDev {
    fn step(&mut self) {
        let prod = (self.db.load_u64(DB_RQ, Ordering::Acquire) >> 32) as u32;
        let group: u32 = if self.coalesce { 4 } else { 1 };
        while prod.wrapping_sub(self.pos) / 32 >= group {
            let mut body = [0u8; 60];
            // RX_OKAY (1) or RX_COALESCED_4 (2), client type 1.
            let ty: u32 = if self.coalesce { 2 } else { 1 };
            body[0..4].copy_from_slice(&(ty | (1 << 6)).to_le_bytes());
            // Hash type [24:16], IP checksum OK [25], UDP checksum OK [29].
            let flags = (self.hash_type << 16) | (1 << 25) | (1 << 29);
            body[4..8].copy_from_slice(&flags.to_le_bytes());
            for k in 0..group as usize {
                let off = self.pos as usize & (RQ_BYTES - 1);
                let addr = self.rq.load_u64(off + 16, Ordering::Relaxed);
                // SAFETY: the WQE's SGE names an mbuf data buffer of this program's pool that
                // the driver posted and reads only after this CQE tells it to.
                unsafe { dma_frame(addr) };
                let p = 8 + 12 * k;
                body[p..p + 4].copy_from_slice(&60u32.to_le_bytes());
                body[p + 8..p + 12].copy_from_slice(&RX_HASH.to_le_bytes());
                self.pos = self.pos.wrapping_add(32);
            }
            self.cq.push(&body, RQ_ID, false);
            self.filled += u64::from(group);
        }
    }
}

/// MANA TX: WQE build, SQ doorbell, completions of earlier bursts.
pub(crate) fn run_tx(pool: &Arc<MbufPool>, keys: &ChunkKeys, plan: Plan) -> Stats {
    let (sq, cq, db) = (anon(SQ_BYTES), anon(CQ_COUNT as usize * CQE), anon(4096));
    let raw = RawTxQueue {
        sq: Arc::clone(&sq),
        sq_id: SQ_ID,
        tx_vp_offset: 0,
        db_page: Arc::clone(&db),
        db_monitor: None,
        cq: Arc::clone(&cq),
        cq_count: CQ_COUNT,
        cq_id: TX_CQ_ID,
        owner: Arc::new(()),
        parked: pmd::ethdev::Parked::new(),
        kick: None,
    };
    let mut q = TxQueue::new(
        raw,
        RING,
        Arc::clone(pool),
        keys.clone(),
        Arc::default(),
        Arc::default(),
    );
    let mut dev = TxDev {
        sq,
        db,
        cq: CqWriter {
            mem: cq,
            count: CQ_COUNT,
            n: 0,
        },
        pos: 0,
        wqes: 0,
    };
    let stats = time_tx(&mut q, pool, plan, || dev.step());
    assert_eq!(dev.wqes, u64::from(plan.total()) * super::BURST as u64);
    eprintln!(
        "INFO side=ours path=mana_tx wqes={} cqes={} bursts={}",
        dev.wqes,
        dev.cq.n,
        plan.total()
    );
    stats
}

/// MANA RX: CQ poll, delivery, refill, RQ doorbell.
pub(crate) fn run_rx(
    pool: &Arc<MbufPool>,
    keys: &ChunkKeys,
    plan: Plan,
    coalesce: bool,
    hash_type: u32,
) -> Stats {
    let (rq, cq, db) = (anon(RQ_BYTES), anon(CQ_COUNT as usize * CQE), anon(4096));
    let raw = RawRxQueue {
        rq: Arc::clone(&rq),
        rq_id: RQ_ID,
        db_page: Arc::clone(&db),
        db_monitor: None,
        cq: Arc::clone(&cq),
        cq_count: CQ_COUNT,
        cq_id: RX_CQ_ID,
        owner: Arc::new(()),
        parked: pmd::ethdev::Parked::new(),
        kick: None,
    };
    let cfg = PortConfig::default().with_ring_sizes(RING, RING);
    let mut q = RxQueue::new(
        raw,
        &cfg,
        0,
        Arc::clone(pool),
        keys.clone(),
        Arc::default(),
        Arc::default(),
    );
    q.fill().expect("initial fill");
    let mut dev = RxDev {
        rq,
        db,
        cq: CqWriter {
            mem: cq,
            count: CQ_COUNT,
            n: 0,
        },
        pos: 0,
        coalesce,
        hash_type,
        filled: 0,
    };
    let stats = time_rx(&mut q, pool, plan, hash_type != 0, || dev.step());
    assert!(dev.filled >= u64::from(plan.total()) * super::BURST as u64);
    eprintln!(
        "INFO side=ours path={} filled={} cqes={} bursts={}",
        if coalesce {
            "mana_rx_coalesced4"
        } else {
            "mana_rx"
        },
        dev.filled,
        dev.cq.n,
        plan.total()
    );
    stats
}
