//! The drivers' queues driven by a hostile device: the fuzzer's bytes decide what the
//! "device" writes into the completion queues (any opcode, format, length, WQE counter or
//! index, queue id, owner bits that are right or wrong, compressed sessions of any count),
//! and when the driver polls. The queue memory is this program's, as in the datapath
//! benchmark's device double (`bench/src/bin/datapath`); no frame data is written, so a
//! driver that believed a bad completion hands out a buffer with stale bytes, which is
//! harmless, but one that indexed outside its rings or lost track of a buffer is caught.
//!
//! Invariants for every input: no panic (and, under the fuzzer, no AddressSanitizer report);
//! every delivered mbuf holds at most its pool's data room; after the queue is dropped and
//! every delivered mbuf freed, the pool is whole (no buffer leaked or freed twice: a double
//! free shows as a pool with more free objects than it has, which `MbufPool` refuses with a
//! panic).

use crate::input::Input;
use mempool::{lcache, ChunkKeys, MbufPool, MbufPoolConfig, Registration};
use pmd::ethdev::{Burst, PortConfig, RxBurst, TxBurst};
use pmd::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Descriptors per ring (RX and TX), as small as the drivers allow, so that wrap-around and
/// full rings are reached quickly.
const RING: u16 = 64;
/// The key every chunk of the pool is registered under.
const LKEY: u32 = 0x77;
/// Operations per input at most (keeps one execution short).
const MAX_OPS: usize = 4096;

/// A port configuration with [`RING`]-descriptor rings.
fn config() -> PortConfig {
    PortConfig::default().with_ring_sizes(RING, RING)
}

fn anon(len: usize) -> Arc<DevMem> {
    Arc::new(DevMem::anon(len).expect("queue memory"))
}

/// The pool of target `name`: made once per process and kept (making one per input would
/// cost most of an execution); each run starts and must end with it whole.
fn pool(name: &'static str) -> (Arc<MbufPool>, ChunkKeys) {
    type Pools = Vec<(&'static str, Arc<MbufPool>, ChunkKeys)>;
    static POOLS: Mutex<Pools> = Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p, k)) = pools.iter().find(|(n, _, _)| *n == name) {
        assert_eq!(p.in_use(), 0, "the last run left buffers out");
        return (Arc::clone(p), k.clone());
    }
    let pool = MbufPool::new(MbufPoolConfig::new(name, 512)).expect("mbuf pool");
    let keys = pool
        .register_chunks(|_| Ok(Registration::new(mempool::Lkey(LKEY))))
        .expect("register");
    pools.push((name, Arc::clone(&pool), keys.clone()));
    (pool, keys)
}

/// Polls `q` for up to `n` packets, checks each, and keeps them in `held`.
fn poll<Q: RxBurst>(q: &mut Q, n: usize, room: usize, held: &mut Vec<mempool::Mbuf>) {
    let mut b = Burst::with_capacity(n.max(1));
    let got = q.rx_burst(&mut b);
    assert_eq!(got, b.len());
    for m in b.drain_front(got) {
        // A stripped VLAN tag put back goes into the headroom: 4 bytes more.
        assert!(
            m.len() <= room * usize::from(m.nb_segs()) + 4,
            "a frame of {} bytes in {} buffers of {room}",
            m.len(),
            m.nb_segs()
        );
        held.push(m);
    }
}

/// Sends up to `n` fresh frames of `len` bytes (in one or two segments) through `q`; what
/// the queue does not take is dropped here.
fn send<Q: TxBurst>(q: &mut Q, pool: &Arc<MbufPool>, n: usize, len: usize, segs: bool) {
    let mut b = Burst::with_capacity(n.max(1));
    for _ in 0..n {
        let Some(mut m) = lcache::alloc(pool) else {
            break;
        };
        let head = if segs { len / 2 } else { len };
        if m.extend_from_slice(&vec![0xa5; head]).is_err() {
            break;
        }
        if segs {
            let Some(mut t) = lcache::alloc(pool) else {
                break;
            };
            if t.extend_from_slice(&vec![0x5a; len - head]).is_err() || m.chain(t).is_err() {
                break;
            }
        }
        if b.push(m).is_err() {
            break;
        }
    }
    let took = q.tx_burst(&mut b);
    assert!(took <= n);
}

/// An RX program: the device writes a completion (`write`, half the time), the driver
/// polls, or the application frees what it holds; a last poll at the end. Returns what the
/// application still holds.
fn rx_program<Q: RxBurst>(
    input: &mut Input<'_>,
    q: &mut Q,
    room: usize,
    mut write: impl FnMut(&mut Input<'_>),
) -> Vec<mempool::Mbuf> {
    let mut held = Vec::new();
    for _ in 0..MAX_OPS {
        if input.done() {
            break;
        }
        match input.u8() % 4 {
            0 | 1 => write(input),
            2 => poll(q, usize::from(input.u8() % 64) + 1, room, &mut held),
            _ => held.clear(),
        }
    }
    poll(q, 64, room, &mut held);
    held
}

/// A TX program: a burst of fresh frames, a completion the device writes (`write`, half the
/// time), or an empty burst that only reaps.
fn tx_program<Q: TxBurst>(
    input: &mut Input<'_>,
    q: &mut Q,
    pool: &Arc<MbufPool>,
    mut write: impl FnMut(&mut Input<'_>),
) {
    for _ in 0..MAX_OPS {
        if input.done() {
            break;
        }
        match input.u8() % 4 {
            0 => {
                let n = usize::from(input.u8() % 64);
                let len = 14 + usize::from(input.u16() % 1500);
                let segs = input.u8() & 1 != 0;
                send(q, pool, n, len, segs);
            }
            1 | 2 => write(input),
            _ => send(q, pool, 0, 60, false),
        }
    }
}

/// Ends a run: every held mbuf back, the queue gone, the pool whole.
fn finish<Q>(q: Q, held: Vec<mempool::Mbuf>, pool: &Arc<MbufPool>) {
    drop(held);
    drop(q);
    assert_eq!(pool.in_use(), 0, "buffers lost by the queue");
}

// ---------------------------------------------------------------------------------------
// MANA

mod mana {
    use super::*;
    use pmd::hw::mana::cqe::owner_for;
    use pmd::mana::{RawRxQueue, RawTxQueue};

    pub const CQE: usize = 64;
    pub const RQ_ID: u32 = 0x1234;
    pub const SQ_ID: u32 = 0x2345;

    /// A MANA CQ as the device writes it (§7.2): slot n mod count, the 60 body bytes, then
    /// the info dword (WQ id, is_sq, owner) with a release store.
    pub struct Cq {
        pub mem: Arc<DevMem>,
        pub n: u64,
    }

    impl Cq {
        /// Writes the next CQE from the input: the body, the WQ id (ours or another), and
        /// the owner bits (right for this slot, or any).
        pub fn write(&mut self, input: &mut Input<'_>, wq: u32, is_sq: bool) {
            let count = u32::from(RING);
            let slot = (self.n % u64::from(count)) as usize * CQE;
            let mut body: [u8; 60] = input.array();
            // The CQE type (dword 0 bits 0..5, §7.1): mostly the known ones.
            if input.u8() & 1 == 0 {
                const KNOWN: [u8; 9] = [0, 1, 2, 3, 4, 32, 33, 34, 35];
                body[0] = (body[0] & !0x3f) | KNOWN[usize::from(input.u8()) % KNOWN.len()];
            }
            let how = input.u8();
            let id = if how & 1 == 0 {
                wq
            } else {
                input.u32() & 0x00ff_ffff
            };
            let owner = if how & 2 == 0 {
                u32::from(owner_for(self.n, count))
            } else {
                u32::from(input.u8() & 7)
            };
            self.mem.write(slot, &body);
            let info = id | (u32::from(is_sq) << 24) | (owner << 29);
            self.mem.store_u32(slot + 60, info, Ordering::Release);
            self.n += 1;
        }
    }

    pub fn rx_queue(pool: &Arc<MbufPool>, keys: ChunkKeys) -> (pmd::mana::RxQueue, Cq) {
        let cq = anon(usize::from(RING) * CQE);
        let raw = RawRxQueue {
            rq: anon(usize::from(RING) * 32),
            rq_id: RQ_ID,
            db_page: anon(4096),
            db_monitor: None,
            cq: Arc::clone(&cq),
            cq_count: u32::from(RING),
            cq_id: 0x4321,
            owner: Arc::new(()),
            parked: pmd::ethdev::Parked::new(),
            kick: None,
        };
        let cfg = config();
        let mut q = pmd::mana::RxQueue::new(
            raw,
            &cfg,
            0,
            Arc::clone(pool),
            keys,
            Arc::default(),
            Arc::default(),
        );
        q.fill().expect("initial fill");
        (q, Cq { mem: cq, n: 0 })
    }

    pub fn tx_queue(pool: &Arc<MbufPool>, keys: ChunkKeys) -> (pmd::mana::TxQueue, Cq) {
        let cq = anon(usize::from(RING) * CQE);
        let raw = RawTxQueue {
            sq: anon(usize::from(RING) * 256),
            sq_id: SQ_ID,
            tx_vp_offset: 0,
            db_page: anon(4096),
            db_monitor: None,
            cq: Arc::clone(&cq),
            cq_count: u32::from(RING),
            cq_id: 0x5432,
            owner: Arc::new(()),
            parked: pmd::ethdev::Parked::new(),
            kick: None,
        };
        let q = pmd::mana::TxQueue::new(
            raw,
            RING,
            Arc::clone(pool),
            keys,
            Arc::default(),
            Arc::default(),
        );
        (q, Cq { mem: cq, n: 0 })
    }
}

/// MANA RX: CQEs of any type (RX_OKAY, coalesced, truncated, errors, unknown), with any
/// lengths, counts, hash and checksum bits, for our RQ or another, with right or wrong owner
/// bits, interleaved with polls of any size.
pub fn mana_rx(data: &[u8]) {
    let mut input = Input::new(data);
    let (pool, keys) = pool("fuzz-mana-rx");
    let room = usize::from(pool.data_room());
    let (mut q, mut cq) = mana::rx_queue(&pool, keys);
    let held = rx_program(&mut input, &mut q, room, |i| {
        cq.write(i, mana::RQ_ID, false)
    });
    finish(q, held, &pool);
}

/// MANA TX: bursts of one- and two-segment frames, and TX CQEs of any type for our SQ or
/// another, with any WQE offsets and owner bits, and empty bursts that only reap.
pub fn mana_tx(data: &[u8]) {
    let mut input = Input::new(data);
    let (pool, keys) = pool("fuzz-mana-tx");
    let (mut q, mut cq) = mana::tx_queue(&pool, keys);
    tx_program(&mut input, &mut q, &pool, |i| {
        cq.write(i, mana::SQ_ID, true)
    });
    finish(q, Vec::new(), &pool);
}

// ---------------------------------------------------------------------------------------
// mlx5

mod mlx5 {
    use super::*;
    use pmd::mlx5::{QueueState, RawCq, RawRq, RawSq, SetupError};

    pub const CQE: usize = 64;
    pub const RQN: u32 = 0x77;
    pub const SQN: u32 = 0x88;

    /// Queue state changes for error recovery: always done (the device comes back).
    struct Always;

    impl QueueState for Always {
        fn reset(&self) -> Result<(), SetupError> {
            Ok(())
        }
        fn ready(&self) -> Result<(), SetupError> {
            Ok(())
        }
    }

    /// An mlx5 CQ as the device writes it: slot n mod count, 64 bytes, the last dword
    /// (WQE counter, signature, op_own) stored last with release.
    pub struct Cq {
        pub mem: Arc<DevMem>,
        pub count: u32,
        pub n: u64,
    }

    impl Cq {
        fn new(count: u32) -> (Self, RawCq) {
            let mem = anon(count as usize * CQE);
            // As created: opcode INVALID, owner 1 (§5.2).
            for i in 0..count as usize {
                mem.write(i * CQE + 62, &[0xff, 0xf1]);
            }
            let raw = RawCq {
                buf: Arc::clone(&mem),
                cqe_cnt: count,
                dbrec: anon(4096),
                cqn: 9,
            };
            (Self { mem, count, n: 0 }, raw)
        }

        /// Writes the next CQE from the input: any 60 first bytes, a WQE counter, an opcode
        /// (mostly the ones the driver knows), a format (normal, compressed, any), and the
        /// owner bit right for this slot or any.
        pub fn write(&mut self, input: &mut Input<'_>, qpn: u32) {
            let slot = (self.n % u64::from(self.count)) as usize * CQE;
            let mut body: [u8; 60] = input.array();
            let how = input.u8();
            if how & 1 == 0 {
                // The QP number (bytes 56..60, 24 bits): ours.
                body[56..60].copy_from_slice(&qpn.to_be_bytes());
            }
            let counter = input.u16();
            let opcode = match input.u8() % 8 {
                0 => 0,  // REQ
                1 => 2,  // RESP_SEND
                2 => 13, // REQ_ERR
                3 => 14, // RESP_ERR
                _ => input.u8() & 0x0f,
            };
            let format = if how & 2 == 0 { 0 } else { input.u8() & 3 };
            let owner = if how & 4 == 0 {
                self.n & u64::from(self.count) != 0
            } else {
                input.u8() & 1 != 0
            };
            let op_own = (opcode << 4) | (format << 2) | u8::from(owner);
            self.mem.write(slot, &body);
            let c = counter.to_be_bytes();
            let last = u32::from_ne_bytes([c[0], c[1], input.u8(), op_own]);
            self.mem.store_u32(slot + 60, last, Ordering::Release);
            self.n += 1;
        }
    }

    pub fn rx_queue(
        pool: &Arc<MbufPool>,
        keys: ChunkKeys,
        compressed: bool,
    ) -> (pmd::mlx5::RxQueue, Cq) {
        let n = if compressed {
            u32::from(RING) * 2
        } else {
            u32::from(RING)
        };
        let (cq, raw_cq) = Cq::new(n);
        let raw = RawRq {
            buf: anon(usize::from(RING) * 16),
            wqe_cnt: u32::from(RING),
            stride: 16,
            rqn: RQN,
            dbrec: anon(4096),
            cq: raw_cq,
            mprq: None,
            cqe_compression: compressed,
            owner: Arc::new(()),
            parked: pmd::ethdev::Parked::new(),
            state: Arc::new(Always),
            kick: None,
        };
        let cfg = config();
        let mut q = pmd::mlx5::RxQueue::new(
            raw,
            &cfg,
            0,
            Arc::clone(pool),
            keys,
            Arc::default(),
            Arc::default(),
        );
        q.fill().expect("initial fill");
        (q, cq)
    }

    /// A striding RQ of 4 WQEs in the default geometry (64 strides of 2 KiB), its stride
    /// buffers registered under [`LKEY`].
    pub fn mprq_queue(
        pool: &Arc<MbufPool>,
        compressed: bool,
    ) -> (pmd::mlx5::rxq_mprq::RxQueue, Cq) {
        use pmd::mlx5::Mprq;
        const WQES: u32 = 4;
        const WQE_BYTES: usize = 32;
        let geo = Mprq::DEFAULT;
        let (cq, raw_cq) = Cq::new(if compressed { 128 } else { 64 });
        let bufs =
            pmd::sys::mem::DeviceBuffers::new("fuzz-mprq", WQES, geo.wqe_bytes() as usize, |_| {
                Ok(Registration::new(mempool::Lkey(LKEY)))
            })
            .expect("stride buffers");
        let raw = RawRq {
            buf: anon(WQES as usize * WQE_BYTES),
            wqe_cnt: WQES,
            stride: WQE_BYTES as u32,
            rqn: RQN,
            dbrec: anon(4096),
            cq: raw_cq,
            mprq: Some(geo),
            cqe_compression: compressed,
            owner: Arc::new(()),
            parked: pmd::ethdev::Parked::new(),
            state: Arc::new(Always),
            kick: None,
        };
        let cfg = config();
        let mut q = pmd::mlx5::rxq_mprq::RxQueue::new(
            raw,
            bufs,
            &cfg,
            0,
            Arc::clone(pool),
            Arc::default(),
            Arc::default(),
        );
        q.fill();
        (q, cq)
    }

    pub fn tx_queue(
        pool: &Arc<MbufPool>,
        keys: ChunkKeys,
        min_inline: u16,
    ) -> (pmd::mlx5::TxQueue, Cq) {
        let (cq, raw_cq) = Cq::new(u32::from(RING));
        let raw = RawSq {
            buf: anon(usize::from(RING) * 64),
            wqe_cnt: u32::from(RING),
            sqn: SQN,
            dbrec: anon(4096),
            bf_reg: pmd::sys::Mmio::new(anon(4096)),
            bf_size: 256,
            min_inline,
            cq: raw_cq,
            owner: Arc::new(()),
            parked: pmd::ethdev::Parked::new(),
            state: Arc::new(Always),
            kick: None,
        };
        let q = pmd::mlx5::TxQueue::new(
            raw,
            RING,
            Arc::clone(pool),
            keys,
            Arc::default(),
            Arc::default(),
        );
        (q, cq)
    }
}

/// mlx5 RX on a cyclic RQ, with or without CQE compression (the first byte): CQEs of any
/// opcode and format (compressed sessions with any count and mini arrays included), any WQE
/// counters, lengths and flags, right or wrong owner bits, interleaved with polls.
pub fn mlx5_rx(data: &[u8]) {
    let mut input = Input::new(data);
    let compressed = input.u8() & 1 != 0;
    let (pool, keys) = pool("fuzz-mlx5-rx");
    let room = usize::from(pool.data_room());
    let (mut q, mut cq) = mlx5::rx_queue(&pool, keys, compressed);
    let held = rx_program(&mut input, &mut q, room, |i| cq.write(i, mlx5::RQN));
    finish(q, held, &pool);
}

/// mlx5 RX on a striding (multi-packet) RQ, with or without CQE compression (the first
/// byte): CQEs of any opcode and format with any stride counts, stride indices, filler bits
/// and lengths in `byte_cnt`, any WQE ids and counters, right or wrong owner bits.
pub fn mlx5_mprq(data: &[u8]) {
    let mut input = Input::new(data);
    let compressed = input.u8() & 1 != 0;
    let (pool, _) = pool("fuzz-mlx5-mprq");
    let room = usize::from(pool.data_room());
    let (mut q, mut cq) = mlx5::mprq_queue(&pool, compressed);
    let held = rx_program(&mut input, &mut q, room, |i| cq.write(i, mlx5::RQN));
    finish(q, held, &pool);
}

/// mlx5 TX (eMPW, or SEND WQEs with an inline header when the first byte asks): bursts of
/// one- and two-segment frames, requester CQEs and errors for any WQE counter, any owner
/// bits, and empty bursts that only reap.
pub fn mlx5_tx(data: &[u8]) {
    let mut input = Input::new(data);
    let min_inline = if input.u8() & 1 != 0 { 18 } else { 0 };
    let (pool, keys) = pool("fuzz-mlx5-tx");
    let (mut q, mut cq) = mlx5::tx_queue(&pool, keys, min_inline);
    tx_program(&mut input, &mut q, &pool, |i| cq.write(i, mlx5::SQN));
    finish(q, Vec::new(), &pool);
}
