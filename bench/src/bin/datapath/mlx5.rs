//! The mlx5 half: `pmd::mlx5` queues over queue memory this program owns, in the geometry of
//! DPDK's queues for 256 descriptors: SQ 256 WQEBBs, TX CQ 32 entries, RQ 256 WQEs of one
//! 16-byte data segment, RX CQ 256 entries; every CQ starts with op_own 0xf1 (opcode INVALID,
//! owner 1) and byte 62 0xff in each entry, as DPDK's DevX code leaves them. The device double
//! (for `m5tx` and `m5rx` the same logic as `bench/datapath/c/mlx5_dpdk.c`):
//!
//! * TX: after each burst, a requester CQE (opcode REQ, WQE counter and opcode of the WQE, SQ
//!   number) for every WQE whose control segment asks for one (CE = 2, spec §2.2). `m5tx`:
//!   `min_inline` 0, so the driver sends eMPW WQEs (§2.7); `m5tx-send`: `min_inline` 18
//!   (ConnectX-4), one SEND WQE per packet with the inline header (§1.9, §2.6).
//! * RX, cyclic RQ: before each burst, for every WQE the RQ doorbell record covers, the frame
//!   copied to the segment's address and a responder CQE (RESP_SEND, byte_cnt 60, hash
//!   0x9e3779b9 over IPv4+UDP, L3/L4 checksums OK, IPv4/UDP header types, WQE counter; §5.1).
//!   `m5rx-cqz`: the same completions as compressed sessions of 64 (basic layout, HASH minis,
//!   §6.1-6.2: mini arrays at t+1 and t+8k, then the title, packet 0's CQE with format 3 and
//!   byte_cnt = 64), on a CQ of 512 (doubled for compression, as DPDK sizes it, §1.4).
//! * RX, striding RQ (`m5rx-mprq`, §4.2): 4 WQEs of 64 strides of 2048 bytes (DPDK's
//!   default geometry for 256 descriptors); one packet per stride, a CQE with the packed
//!   byte_cnt (strides, length), the stride index and the WQE counter. `m5rx-mprq-cqz`:
//!   sessions of 64 with CSUM_STRIDX minis (stride index, packed byte_cnt).
//!
//! CQEs: bytes 0..59 first, then dword 60..63 (WQE counter, signature, op_own with the lap's
//! owner bit) with a release store. A session's mini arrays are written whole before its
//! title. The double checks that it never writes past the driver's `SET_CI` + the CQ size.

use super::{anon, dma_frame, time_rx, time_tx, Plan, Stats, BURST, FRAME, LKEY, RING, RX_HASH};
use mempool::{ChunkKeys, MbufPool, Registration};
use pmd::ethdev::PortConfig;
use pmd::mlx5::{rxq_mprq, Mprq, QueueState, RawCq, RawRq, RawSq, RxQueue, SetupError, TxQueue};
use pmd::sys::mem::DeviceBuffers;
use pmd::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const RX_CQ_N: u32 = 256;
/// RX CQ entries with compression on: doubled (§1.4).
const RX_CQ_N_COMPRESSED: u32 = 512;
const TX_CQ_N: u32 = 32;
const SQN: u32 = 0x1234;
const RQN: u32 = 0x1235;
const CQE: usize = 64;
/// Completions per compressed session (`cqe_comp_caps.max_num` of the device model, §1.2).
const SESSION: usize = 64;
/// op_own: RESP_SEND (2) in bits 7:4, format in bits 3:2 (3: a compressed session's title).
const OP_RESP_SEND: u8 = 0x20;
const FORMAT_COMPRESSED: u8 = 0x0c;

/// Queue state changes (only error recovery asks for them; never here).
struct NoState;

impl QueueState for NoState {
    fn reset(&self) -> Result<(), SetupError> {
        Ok(())
    }
    fn ready(&self) -> Result<(), SetupError> {
        Ok(())
    }
}

/// A CQ as created: every entry op_own 0xf1 (opcode INVALID, owner 1), byte 62 0xff.
fn new_cq(n: u32) -> Arc<DevMem> {
    let cq = anon(n as usize * CQE);
    for i in 0..n as usize {
        cq.write(i * CQE + 62, &[0xff, 0xf1]);
    }
    cq
}

/// A big-endian doorbell record's low 16 bits (the counters the device uses, §4.1).
fn be_record(mem: &DevMem, off: usize) -> u16 {
    u32::from_be_bytes(mem.load_u32(off, Ordering::Acquire).to_ne_bytes()) as u16
}

/// The mini format of a compressed session (§6.1).
#[derive(Debug, Clone, Copy)]
enum Mini {
    /// RSS hash, byte_cnt (cyclic RQs).
    Hash,
    /// Checksum (0 here), stride index, packed byte_cnt (striding RQs).
    CsumStridx,
}

struct CqWriter {
    mem: Arc<DevMem>,
    /// The CQ's doorbell record (`SET_CI` at byte 0).
    dbrec: Arc<DevMem>,
    count: u32,
    /// Producer counter (free-running).
    n: u64,
    sessions: u64,
}

impl CqWriter {
    fn new(mem: Arc<DevMem>, dbrec: Arc<DevMem>, count: u32) -> Self {
        Self {
            mem,
            dbrec,
            count,
            n: 0,
            sessions: 0,
        }
    }

    /// Checks that `k` more entries fit between the driver's `SET_CI` and the ring's end.
    fn check_room(&self, k: usize) {
        let ci = u32::from_be_bytes(self.dbrec.load_u32(0, Ordering::Acquire).to_ne_bytes());
        let ahead = (self.n as u32).wrapping_sub(ci) & 0x00ff_ffff;
        assert!(
            ahead as usize + k <= self.count as usize,
            "CQ overrun: SET_CI {ci}, producer {}, {k} more",
            self.n
        );
    }

    fn slot(&self, at: u64) -> usize {
        (at % u64::from(self.count)) as usize * CQE
    }

    /// Writes `body` at producer counter `at` with the owner bit of its lap: bytes 0..59, then
    /// dword 60..63 with a release store.
    fn write_at(&self, at: u64, body: &[u8; 64]) {
        let off = self.slot(at);
        self.mem.write(off, &body[..60]);
        let own = ((at / u64::from(self.count)) & 1) as u8;
        let last = [body[60], body[61], body[62], body[63] | own];
        self.mem
            .store_u32(off + 60, u32::from_ne_bytes(last), Ordering::Release);
    }

    fn push(&mut self, body: &[u8; 64]) {
        self.check_room(1);
        self.write_at(self.n, body);
        self.n += 1;
    }

    /// `bodies` (at least 2) as one compressed session of the basic layout (§6.2): mini array
    /// `k` (8 minis, the whole 64-byte slot) at `t + 1` or `t + 8k`, then the title at `t`:
    /// packet 0's CQE with format 3 and byte_cnt = the count. Holes are not written.
    fn push_session(&mut self, bodies: &[[u8; 64]], mini: Mini) {
        let n = bodies.len();
        debug_assert!(n >= 2);
        self.check_room(n);
        let t = self.n;
        for (k, group) in bodies.chunks(8).enumerate() {
            let mut arr = [0u8; 64];
            for (e, b) in group.iter().enumerate() {
                let m = &mut arr[e * 8..e * 8 + 8];
                match mini {
                    Mini::Hash => m[..4].copy_from_slice(&b[12..16]),
                    // Checksum 0, then the stride index (the CQE's wqe_counter).
                    Mini::CsumStridx => m[2..4].copy_from_slice(&b[60..62]),
                }
                m[4..8].copy_from_slice(&b[44..48]);
            }
            let slot = if k == 0 { t + 1 } else { t + 8 * k as u64 };
            self.mem.write(self.slot(slot), &arr);
        }
        let mut title = bodies[0];
        title[44..48].copy_from_slice(&(n as u32).to_be_bytes());
        title[63] |= FORMAT_COMPRESSED;
        self.write_at(t, &title);
        self.n = t + n as u64;
        self.sessions += 1;
    }
}

/// A responder CQE of a 60-byte IPv4/UDP packet (§5.1) with `byte_cnt` and `wqe_counter`.
fn rx_cqe(byte_cnt: u32, wqe_counter: u16) -> [u8; 64] {
    let mut body = [0u8; 64];
    body[12..16].copy_from_slice(&RX_HASH.to_be_bytes());
    body[16] = 0x84; // hash over IPv4 + UDP
    body[28] = 0x07; // L2, L3, L4 OK
    body[29] = 0x28; // IPv4, UDP
    body[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    body[60..62].copy_from_slice(&wqe_counter.to_be_bytes());
    body[63] = OP_RESP_SEND; // format 0
    body
}

// ------------------------------------------------------------------------------------------
// TX

struct TxDev {
    sq: Arc<DevMem>,
    dbrec: Arc<DevMem>,
    cq: CqWriter,
    /// Device consumer, WQEBBs.
    pos: u16,
    wqes: u64,
}

impl TxDev {
    fn step(&mut self) {
        let prod = be_record(&self.dbrec, 4);
        while self.pos != prod {
            let off = (usize::from(self.pos) & (RING as usize - 1)) * 64;
            let mut w = [0u8; 12];
            self.sq.read(off, &mut w);
            let op = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
            let ds = u32::from_be_bytes([w[4], w[5], w[6], w[7]]) & 0x3f;
            if (w[11] >> 2) & 3 == 2 {
                let mut body = [0u8; 64];
                body[56] = op as u8;
                body[57..60].copy_from_slice(&SQN.to_be_bytes()[1..]);
                body[60] = (op >> 16) as u8;
                body[61] = (op >> 8) as u8;
                body[63] = 0x00; // REQ, format 0
                self.cq.push(&body);
            }
            self.pos = self.pos.wrapping_add(ds.div_ceil(4) as u16);
            self.wqes += 1;
        }
    }
}

/// mlx5 TX with `min_inline` 0 (eMPW) or 18 (SEND WQEs with the inline header).
pub(crate) fn run_tx(pool: &Arc<MbufPool>, keys: &ChunkKeys, plan: Plan, min_inline: u16) -> Stats {
    let (sq, dbrec, bf) = (anon(RING as usize * 64), anon(4096), anon(4096));
    let (cq, cq_dbrec) = (new_cq(TX_CQ_N), anon(4096));
    let raw = RawSq {
        buf: Arc::clone(&sq),
        wqe_cnt: u32::from(RING),
        sqn: SQN,
        dbrec: Arc::clone(&dbrec),
        bf_reg: pmd::sys::Mmio::new(bf),
        bf_size: 256,
        min_inline,
        cq: RawCq {
            buf: Arc::clone(&cq),
            cqe_cnt: TX_CQ_N,
            dbrec: Arc::clone(&cq_dbrec),
            cqn: 6,
        },
        owner: Arc::new(()),
        parked: pmd::ethdev::Parked::new(),
        state: Arc::new(NoState),
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
        dbrec,
        cq: CqWriter::new(cq, cq_dbrec, TX_CQ_N),
        pos: 0,
        wqes: 0,
    };
    let stats = time_tx(&mut q, pool, plan, || dev.step());
    assert!(dev.cq.n > 0, "no completion requested");
    eprintln!(
        "INFO side=ours path=mlx5_tx_{} wqes={} cqes={} bursts={}",
        if min_inline == 0 { "empw" } else { "send" },
        dev.wqes,
        dev.cq.n,
        plan.total()
    );
    stats
}

// ------------------------------------------------------------------------------------------
// RX, cyclic RQ

struct RxDev {
    rq: Arc<DevMem>,
    dbrec: Arc<DevMem>,
    cq: CqWriter,
    /// Completions per session (1: no compression).
    unit: usize,
    pos: u16,
    filled: u64,
}

impl RxDev {
    /// Fills every posted WQE (with compression: in whole sessions; the rest waits for the
    /// next step).
    fn step(&mut self) {
        let prod = be_record(&self.dbrec, 0);
        let mut bodies = [[0u8; 64]; SESSION];
        while usize::from(prod.wrapping_sub(self.pos)) >= self.unit {
            for b in bodies.iter_mut().take(self.unit) {
                let off = (usize::from(self.pos) & (RING as usize - 1)) * 16;
                let mut w = [0u8; 16];
                self.rq.read(off, &mut w);
                let addr = u64::from_be_bytes(w[8..16].try_into().expect("8 bytes"));
                // SAFETY: the data segment names an mbuf data buffer of this program's pool
                // that the driver posted and reads only after the completion tells it to.
                unsafe { dma_frame(addr) };
                *b = rx_cqe(FRAME.len() as u32, self.pos);
                self.pos = self.pos.wrapping_add(1);
            }
            if self.unit == 1 {
                self.cq.push(&bodies[0]);
            } else {
                self.cq.push_session(&bodies[..self.unit], Mini::Hash);
            }
            self.filled += self.unit as u64;
        }
    }
}

/// mlx5 RX on a cyclic RQ, with one CQE per packet or compressed sessions.
pub(crate) fn run_rx(
    pool: &Arc<MbufPool>,
    keys: &ChunkKeys,
    plan: Plan,
    compressed: bool,
) -> Stats {
    let cq_n = if compressed {
        RX_CQ_N_COMPRESSED
    } else {
        RX_CQ_N
    };
    let (rq, dbrec) = (anon(RING as usize * 16), anon(4096));
    let (cq, cq_dbrec) = (new_cq(cq_n), anon(4096));
    let raw = RawRq {
        buf: Arc::clone(&rq),
        wqe_cnt: u32::from(RING),
        stride: 16,
        rqn: RQN,
        dbrec: Arc::clone(&dbrec),
        cq: RawCq {
            buf: Arc::clone(&cq),
            cqe_cnt: cq_n,
            dbrec: Arc::clone(&cq_dbrec),
            cqn: 7,
        },
        mprq: None,
        cqe_compression: compressed,
        owner: Arc::new(()),
        parked: pmd::ethdev::Parked::new(),
        state: Arc::new(NoState),
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
        dbrec,
        cq: CqWriter::new(cq, cq_dbrec, cq_n),
        unit: if compressed { SESSION } else { 1 },
        pos: 0,
        filled: 0,
    };
    let stats = time_rx(&mut q, pool, plan, true, || dev.step());
    assert!(dev.filled >= u64::from(plan.total()) * BURST as u64);
    eprintln!(
        "INFO side=ours path=mlx5_rx{} filled={} cqes={} sessions={} bursts={}",
        if compressed { "_cqz" } else { "" },
        dev.filled,
        dev.cq.n,
        dev.cq.sessions,
        plan.total()
    );
    stats
}

// ------------------------------------------------------------------------------------------
// RX, striding RQ

/// WQEs of the striding RQ: 256 packets of one stride each, as DPDK divides 256 descriptors.
const MPRQ_WQES: u32 = 4;
const MPRQ_WQE_BYTES: usize = 32;

struct MprqDev {
    ring: Arc<DevMem>,
    dbrec: Arc<DevMem>,
    /// The stride buffers as the device sees them.
    bufs: Arc<DevMem>,
    geo: Mprq,
    cq: CqWriter,
    /// Packets per session (1: no compression).
    unit: usize,
    /// The WQE being filled (free-running) and its next free stride.
    wqe: u16,
    stride: u32,
    filled: u64,
}

impl MprqDev {
    /// Packets that fit the posted strides (one stride per packet).
    fn room(&self) -> usize {
        let posted = be_record(&self.dbrec, 0);
        (usize::from(posted.wrapping_sub(self.wqe)) * self.geo.strides() as usize)
            .saturating_sub(self.stride as usize)
    }

    /// One packet into the next stride: the frame, and its CQE (§4.2: `byte_cnt` = strides in
    /// bits 29:16, length in bits 15:0; `wqe_counter` = stride index; `wqe_id` = WQE counter).
    fn place(&mut self) -> [u8; 64] {
        let off = (u32::from(self.wqe) % MPRQ_WQES) as usize * MPRQ_WQE_BYTES;
        let mut w = [0u8; MPRQ_WQE_BYTES];
        self.ring.read(off, &mut w);
        let addr = u64::from_be_bytes(w[24..32].try_into().expect("8 bytes")) as usize;
        let at = addr - self.bufs.addr() + self.stride as usize * self.geo.stride_bytes() as usize;
        self.bufs.write(at, &FRAME);
        let byte_cnt = (1 << 16) | FRAME.len() as u32;
        let mut body = rx_cqe(byte_cnt, self.stride as u16);
        body[2..4].copy_from_slice(&self.wqe.to_be_bytes());
        self.stride += 1;
        if self.stride == self.geo.strides() {
            self.wqe = self.wqe.wrapping_add(1);
            self.stride = 0;
        }
        body
    }

    fn step(&mut self) {
        let mut bodies = [[0u8; 64]; SESSION];
        while self.room() >= self.unit {
            for b in bodies.iter_mut().take(self.unit) {
                *b = self.place();
            }
            if self.unit == 1 {
                self.cq.push(&bodies[0]);
            } else {
                self.cq.push_session(&bodies[..self.unit], Mini::CsumStridx);
            }
            self.filled += self.unit as u64;
        }
    }
}

/// mlx5 RX on a striding RQ (64 strides of 2048 bytes per WQE), with one CQE per packet or
/// compressed sessions.
pub(crate) fn run_rx_mprq(pool: &Arc<MbufPool>, plan: Plan, compressed: bool) -> Stats {
    let geo = Mprq::DEFAULT;
    let cq_n = if compressed {
        RX_CQ_N_COMPRESSED
    } else {
        RX_CQ_N
    };
    let (ring, dbrec) = (anon(MPRQ_WQES as usize * MPRQ_WQE_BYTES), anon(4096));
    let (cq, cq_dbrec) = (new_cq(cq_n), anon(4096));
    let bufs = DeviceBuffers::new("datapath-mprq", MPRQ_WQES, geo.wqe_bytes() as usize, |_| {
        Ok(Registration::new(mempool::Lkey(LKEY)))
    })
    .expect("stride buffers");
    let view = Arc::clone(&bufs.mem);
    let raw = RawRq {
        buf: Arc::clone(&ring),
        wqe_cnt: MPRQ_WQES,
        stride: MPRQ_WQE_BYTES as u32,
        rqn: RQN,
        dbrec: Arc::clone(&dbrec),
        cq: RawCq {
            buf: Arc::clone(&cq),
            cqe_cnt: cq_n,
            dbrec: Arc::clone(&cq_dbrec),
            cqn: 8,
        },
        mprq: Some(geo),
        cqe_compression: compressed,
        owner: Arc::new(()),
        parked: pmd::ethdev::Parked::new(),
        state: Arc::new(NoState),
        kick: None,
    };
    let cfg = PortConfig::default().with_ring_sizes(RING, RING);
    let mut q = rxq_mprq::RxQueue::new(
        raw,
        bufs,
        &cfg,
        0,
        Arc::clone(pool),
        Arc::default(),
        Arc::default(),
    );
    q.fill();
    let mut dev = MprqDev {
        ring,
        dbrec,
        bufs: view,
        geo,
        cq: CqWriter::new(cq, cq_dbrec, cq_n),
        unit: if compressed { SESSION } else { 1 },
        wqe: 0,
        stride: 0,
        filled: 0,
    };
    let stats = time_rx(&mut q, pool, plan, true, || dev.step());
    assert!(dev.filled >= u64::from(plan.total()) * BURST as u64);
    eprintln!(
        "INFO side=ours path=mlx5_rx_mprq{} filled={} cqes={} sessions={} bursts={}",
        if compressed { "_cqz" } else { "" },
        dev.filled,
        dev.cq.n,
        dev.cq.sessions,
        plan.total()
    );
    stats
}
