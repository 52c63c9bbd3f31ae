//! MANA RX queue: posts one-SGE receive WQEs ahead of time, polls its CQ by owner bits,
//! delivers mbufs with length, RSS hash, checksum and VLAN results, refills in bulk and rings
//! the RQ doorbell once per burst.
#![deny(unsafe_code)]

use super::cq::{CompletionQueue, GdmaOwner};
use super::{QueueOwner, RawRxQueue, Xstats};
use crate::ethdev::{
    deliver_rx, fix_rx_run, free_one, kick, rx_fields, Burst, Counters, Kick, PortConfig, RxBurst,
    RxOffloads,
};
use crate::hw::mana::cqe::{
    Cqe, CqeType, RxCsum, RxFlagsWord, RxSingle, RX_HEAD_BYTES, RX_PPI_COUNT,
};
use crate::hw::mana::doorbell;
use crate::hw::mana::wqe::{WqeHeader, SHORT_OOB_BYTES, WQE_HEADER_BYTES};
use crate::hw::mana::{BU_BYTES, CQE_BYTES};
use crate::ring::refill::{self, PostRx};
use crate::ring::{OwnerRule, Polled, Slot, WorkQueue};
use crate::sys::barrier::udma_from_device_barrier;
use crate::sys::{DevEntry, Doorbell};
use mempool::{
    ChunkKeys, CksumStatus, MbufPool, OffloadFlags, RxBufs, RxDesc, RxFields, RX_RUN_MAX,
};
use std::sync::Arc;

/// Mbufs allocated per refill step.
const REFILL_BULK: u32 = 32;
/// An RX WQE with one SGE: header, 8-byte OOB (left zero), SGE = 32 bytes, 1 BU (§5).
const RX_WQE_BYTES: usize = BU_BYTES;

/// A MANA RX queue, owned by one core.
pub struct RxQueue {
    wq: WorkQueue,
    cq: CompletionQueue,
    db: Doorbell,
    rq_id: u32,
    /// Posted buffers, in posting order (one per 1-BU WQE).
    bufs: RxBufs,
    pool: Arc<MbufPool>,
    keys: ChunkKeys,
    counters: Arc<Counters>,
    xstats: Arc<Xstats>,
    /// Keeps the RQ, CQ and doorbell mapping alive while this handle exists.
    _owner: QueueOwner,
    /// The device's work on this thread (a device model's inline engine; `None` on hardware).
    kick: Kick,
    port_id: u16,
    data_room: u32,
    vlan_strip: bool,
    /// A CQE whose packets were not all delivered (the caller's burst was full), and the
    /// index of the next packet in it.
    backlog: Option<([u8; CQE_BYTES], usize)>,
    /// Whether the last completion read one at a time was a single-packet RX_OKAY: the
    /// run path is tried only then, so that a queue the kernel set to coalesce (RX_COALESCED_4
    /// CQEs, which the run path does not take) does not scan owners twice per burst.
    singles: bool,
    /// Checksum flags by a CQE's checksum bits.
    csum_flags: Box<[OffloadFlags; 128]>,
    /// Where the posted buffers go when the queue drops (last field: dropped after
    /// `_owner`).
    parked: Arc<crate::ethdev::Parked>,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mana::RxQueue(rq {:#x}, {} posted)",
            self.rq_id,
            self.posted()
        )
    }
}

impl RxQueue {
    /// An RX queue over `raw` with `cfg.rx_ring_size` descriptors, posting mbufs of `pool`
    /// whose chunks `keys` registered; call [`RxQueue::fill`] before the first burst. Public
    /// so a test can run the datapath on queue memory it controls.
    ///
    /// # Panics
    /// If the ring size is not a power of two, or the CQ or RQ is too small for it.
    pub fn new(
        raw: RawRxQueue,
        cfg: &PortConfig,
        port_id: u16,
        pool: Arc<MbufPool>,
        keys: ChunkKeys,
        counters: Arc<Counters>,
        xstats: Arc<Xstats>,
    ) -> Self {
        let n = u32::from(cfg.rx_ring_size);
        assert!(
            n.is_power_of_two() && raw.cq_count >= n && raw.rq.len() >= n as usize * RX_WQE_BYTES
        );
        tracing::debug!(target: "pmd::mana::init", rq_id = raw.rq_id, cq_id = raw.cq_id, nb_desc = n, "rx queue");
        let data_room = u32::from(pool.data_room());
        Self {
            wq: WorkQueue::new(raw.rq, BU_BYTES),
            cq: CompletionQueue::new(raw.cq, raw.cq_count),
            db: Doorbell::new(raw.db_page, raw.db_monitor),
            rq_id: raw.rq_id,
            bufs: RxBufs::new(&pool, n),
            pool,
            keys,
            counters,
            xstats,
            _owner: raw.owner,
            kick: raw.kick,
            port_id,
            data_room,
            vlan_strip: cfg.rx_offloads.contains(RxOffloads::VLAN_STRIP),
            backlog: None,
            singles: true,
            csum_flags: csum_table(),
            parked: raw.parked,
        }
    }

    /// Receive buffers posted to the device and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.bufs.len()
    }

    /// Posts buffers on every free descriptor; `Err(missing)` if the pool ran dry.
    ///
    /// # Errors
    /// How many buffers could not be posted.
    pub fn fill(&mut self) -> Result<(), u32> {
        let want = self.bufs.free();
        let missing = self.refill(want);
        // A software device latches this doorbell now, as `tx_burst` has it do after ringing:
        // the queues of a context share one doorbell page, and the next queue's fill would
        // overwrite it before the device sampled it (the fake rdma-core's model samples).
        kick::run(&self.kick);
        if missing == 0 {
            Ok(())
        } else {
            Err(missing)
        }
    }

    /// Delivers a run of single-packet RX_OKAY CQEs (the common completion) from the consumer
    /// on, read in place: their owners checked with one read barrier for the run, their
    /// headers written by [`RxBufs::pop_run`] straight into `out`. Stops before the first
    /// CQE of any other kind, which [`RxQueue::rx_burst`]'s loop then takes. Returns the
    /// packets delivered and those freed for a length over the buffer.
    #[inline]
    fn deliver_run(&mut self, out: &mut Burst, bytes: &mut u64) -> (u64, u64) {
        let max = (out.spare() as u32).min(self.bufs.len()).min(RX_RUN_MAX);
        if max == 0 || self.backlog.is_some() || !self.singles {
            return (0, 0);
        }
        let (head, count) = (self.cq.head(), self.cq.count());
        let mut owned = 0;
        while owned < max {
            let pos = head.wrapping_add(owned);
            match GdmaOwner::check(self.cq.mem(), self.cq.offset_of(pos), pos, count) {
                Slot::New => owned += 1,
                Slot::Empty | Slot::Overflow => break,
            }
        }
        if owned == 0 {
            return (0, 0);
        }
        // The owner fields were read first; no body may be read before them.
        udma_from_device_barrier();
        let (view, m) = self.cq.run_view(owned);
        let single = |e: DevEntry<'_, CQE_BYTES>| {
            const W: [usize; 5] = RxSingle::WORDS;
            RxSingle::from_words(
                e.u32_at::<{ W[0] }>(),
                e.u32_at::<{ W[1] }>(),
                e.u32_at::<{ W[2] }>(),
                e.u32_at::<{ W[3] }>(),
                e.u32_at::<{ W[4] }>(),
            )
        };
        let n = view
            .entries::<CQE_BYTES>()
            .take(m as usize)
            .take_while(|e| single(*e).is_some())
            .count() as u32;
        if n == 0 {
            return (0, 0);
        }
        let start = out.len();
        let mut cqes = view.entries::<CQE_BYTES>();
        let mut tagged = false;
        let (csum, strip, port) = (&self.csum_flags, self.vlan_strip, self.port_id);
        let run = self.bufs.pop_run(n, port, out.vec_mut(), |_| {
            let p = single(cqes.next().expect("a CQE of the run")).expect("counted single");
            let fl = csum[csum_index(p.flags.csum_bits())];
            let hash = (p.flags.hash_type() != 0).then_some(p.hash);
            let (f, reinsert) = rx_fields(fl, hash, p.flags.vlan(), strip, port);
            tagged |= reinsert;
            RxDesc {
                len: u32::from(p.len),
                ol_flags: f.ol_flags,
                rss_hash: f.rss_hash,
                vlan_tci: f.vlan_tci,
            }
        });
        *bytes += run.bytes;
        let mut freed = 0;
        if run.too_long > 0 || tagged {
            let room = self.bufs.room();
            freed = fix_rx_run(
                out,
                start,
                n as usize,
                |k| {
                    let p = single(view.entry(k)).expect("counted single");
                    let tag = p.flags.vlan().filter(|_| !strip);
                    (u32::from(p.len) > room, tag)
                },
                bytes,
            );
        }
        self.cq.consume(n);
        self.wq.complete(n);
        (u64::from(n) - freed, freed)
    }

    /// Posts up to `n` new buffers, rings the doorbell once if any were posted, and returns
    /// how many could not be posted for lack of mbufs.
    fn refill(&mut self, n: u32) -> u32 {
        let (left, posted) = refill::refill(self, n, REFILL_BULK);
        if posted {
            // One doorbell per refill, with the absolute producer position (§6.3).
            self.db.ring(
                doorbell::RQ_OFFSET,
                doorbell::rq(self.rq_id, self.wq.head_bytes()),
            );
        }
        left
    }

    /// Writes the 1-BU WQEs (header, zero OOB, one SGE, §5) of the `n` buffers from position
    /// `from` of `bufs` straight into the RQ at its producer position, 16 bytes per store,
    /// and advances it. Returns how many were written: fewer when a buffer is in no
    /// registered chunk.
    #[inline]
    fn post_wqes(&mut self, from: u32, n: u32) -> u32 {
        let mem = self.wq.mem();
        let mask = mem.len() - 1;
        let start = self.wq.head_bytes() as usize;
        let mut hdr = [0u8; WQE_HEADER_BYTES];
        if let Some(mut h) = WqeHeader::new_checked(&mut hdr[..]) {
            h.init(SHORT_OOB_BYTES, 1);
        }
        let hdr = u64::from_le_bytes(hdr);
        let size = u64::from(self.data_room) << 32;
        let single = match self.keys.keys() {
            [key] => Some(*key),
            _ => None,
        };
        let mut k = 0;
        // The run's WQEs, when they do not reach the end of the ring and the pool has one key
        // (the usual case): stored through a window checked once.
        if let (Some(w), Some(key)) = (mem.window(start & mask, n as usize * RX_WQE_BYTES), single)
        {
            let sge_hi = (u64::from(key.0) | size).to_le();
            while k < n {
                let at = k as usize * RX_WQE_BYTES;
                w.write_2x64(at, hdr.to_le(), 0);
                w.write_2x64(
                    at + WQE_HEADER_BYTES + SHORT_OOB_BYTES,
                    (self.bufs.data_addr(from.wrapping_add(k)) as u64).to_le(),
                    sge_hi,
                );
                k += 1;
            }
        }
        while k < n {
            let pos = from.wrapping_add(k);
            let Some(key) = single.or_else(|| self.keys.key_of(self.bufs.index_at(pos))) else {
                break;
            };
            let off = (start + k as usize * RX_WQE_BYTES) & mask;
            // Header and the (zero) OOB, then the SGE: address, key, size (little-endian).
            mem.write_2x64(off, hdr.to_le(), 0);
            mem.write_2x64(
                off + WQE_HEADER_BYTES + SHORT_OOB_BYTES,
                (self.bufs.data_addr(pos) as u64).to_le(),
                (u64::from(key.0) | size).to_le(),
            );
            k += 1;
        }
        self.wq.advance(k);
        k
    }

    /// See [`crate::ethdev::RxBurst::rx_burst`].
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Burst) -> usize {
        // A software device takes arrived frames into the posted buffers now.
        kick::run(&self.kick);
        let mut delivered = 0usize;
        let mut bytes = 0u64;
        let mut errors = 0u64;
        let mut coalesced = 0u64;
        let (d, freed) = self.deliver_run(out, &mut bytes);
        delivered += d as usize;
        errors += freed;
        'cqes: while out.spare() > 0 {
            // The completion is read once, straight into this buffer (the common case);
            // one left over from the last burst is copied in.
            let (cqe, first) = match self.backlog.take() {
                Some(left) => left,
                None => match self.cq.poll() {
                    Polled::Entry(off) => {
                        // The common completion, one packet: its first 32 bytes say all.
                        let mut head = [0u8; RX_HEAD_BYTES];
                        self.cq.read(off, &mut head);
                        let single = RxSingle::parse(&head);
                        self.singles = single.is_some();
                        if let Some(p) = single {
                            match self.deliver_single(p, out, &mut bytes) {
                                Some(true) => delivered += 1,
                                Some(false) => errors += 1,
                                None => break,
                            }
                            continue;
                        }
                        let mut cqe = [0u8; CQE_BYTES];
                        self.cq.read(off, &mut cqe);
                        (cqe, 0)
                    }
                    Polled::Empty => break,
                    Polled::Overflow => {
                        Xstats::bump(&self.xstats.cq_overflows);
                        break;
                    }
                },
            };
            let Some(c) = Cqe::new_checked(&cqe[..]) else {
                break;
            };
            match c.cqe_type() {
                t @ (CqeType::RxOkay | CqeType::RxCoalesced4) => {
                    // Counted once, when first read (not again for a backlogged rest).
                    coalesced += u64::from(t == CqeType::RxCoalesced4 && first == 0);
                    // What the CQE says of all its packets; the hash is per packet.
                    let (mut fields, reinsert) = self.fields_of(&c);
                    let hashed = fields.ol_flags.contains(OffloadFlags::RX_RSS_HASH);
                    let tag = reinsert.then_some(fields.vlan_tci);
                    for k in first..RX_PPI_COUNT {
                        let len = c.rx_pkt_len(k);
                        if len == 0 {
                            break;
                        }
                        if out.spare() == 0 {
                            self.backlog = Some((cqe, k));
                            break 'cqes;
                        }
                        if hashed {
                            fields.rss_hash = c.rx_pkt_hash(k);
                        }
                        let Some(r) = self.bufs.pop_received(u32::from(len), &fields) else {
                            break;
                        };
                        self.wq.complete(1);
                        match deliver_rx(r, tag, out, &self.pool) {
                            Some(len) => {
                                bytes += u64::from(len);
                                delivered += 1;
                            }
                            None => errors += 1,
                        }
                    }
                }
                t => {
                    crate::dp_trace!(rq = self.rq_id, cqe = ?t, "rx error completion\n{}", crate::hw::hexdump(&cqe));
                    errors += 1;
                    Xstats::bump(&self.xstats.rx_cqe_errors);
                    if t == CqeType::RxTruncated {
                        Xstats::bump(&self.xstats.rx_cqe_truncated);
                    }
                    if let Some(m) = self.bufs.pop() {
                        self.wq.complete(1);
                        free_one(&self.pool, m);
                    }
                }
            }
        }
        self.counters.add(delivered as u64, bytes);
        self.counters.add_errors(errors);
        if coalesced > 0 {
            Xstats::add(&self.xstats.rx_coalesced_cqes, coalesced);
        }
        let want = self.bufs.free();
        if want >= REFILL_BULK || (want > 0 && self.posted() < REFILL_BULK) {
            let missing = self.refill(want);
            if missing > 0 {
                self.counters.add_nombuf(u64::from(missing));
            }
        }
        delivered
    }

    /// What the completion says of its packets (the hash flag with a zero hash: the hash is
    /// per packet), and whether a stripped tag goes back into the frame.
    #[inline]
    fn fields_of(&self, c: &Cqe<&[u8]>) -> (RxFields, bool) {
        self.fields_of_flags(RxFlagsWord(c.rx_flags_dword()))
    }

    /// [`RxQueue::fields_of`] from the CQE's flags dword.
    #[inline]
    fn fields_of_flags(&self, w: RxFlagsWord) -> (RxFields, bool) {
        let fl = self.csum_flags[csum_index(w.csum_bits())];
        // The hash type is read as a bit mask (Linux's reading; §11 item 2): any type means
        // the hash is valid.
        let hash = (w.hash_type() != 0).then_some(0);
        rx_fields(fl, hash, w.vlan(), self.vlan_strip, self.port_id)
    }

    /// Delivers the packet of a single-packet RX_OKAY CQE into `out` (or frees and counts it
    /// when its length does not fit). `false` when no buffer is posted.
    #[inline]
    fn deliver_single(&mut self, p: RxSingle, out: &mut Burst, bytes: &mut u64) -> Option<bool> {
        let (mut fields, reinsert) = self.fields_of_flags(p.flags);
        if fields.ol_flags.contains(OffloadFlags::RX_RSS_HASH) {
            fields.rss_hash = p.hash;
        }
        let r = self.bufs.pop_received(u32::from(p.len), &fields)?;
        self.wq.complete(1);
        let tag = reinsert.then_some(fields.vlan_tci);
        let len = deliver_rx(r, tag, out, &self.pool);
        *bytes += u64::from(len.unwrap_or(0));
        Some(len.is_some())
    }
}

/// The index into [`csum_table`] of a CQE's checksum bits ([`Cqe::rx_csum_bits`]).
#[inline]
fn csum_index(bits: u8) -> usize {
    usize::from(bits & 0x7f)
}

/// The checksum flags for each of the 128 combinations of a CQE's checksum bits, worked out
/// once by [`csum_flags`].
fn csum_table() -> Box<[OffloadFlags; 128]> {
    let mut t = Box::new([OffloadFlags::empty(); 128]);
    for (i, f) in t.iter_mut().enumerate() {
        *f = csum_flags(&RxCsum::from_bits(i as u8));
    }
    t
}

/// The checksum flags for the checksum results `cs` (§7.6).
fn csum_flags(cs: &RxCsum) -> OffloadFlags {
    {
        let mut fl = OffloadFlags::empty();
        if cs.outer_ip_bad {
            fl.insert(OffloadFlags::RX_OUTER_IP_CKSUM_BAD);
        }
        fl.set_rx_ip_cksum(if cs.ip_bad {
            CksumStatus::Bad
        } else if cs.ip_ok {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        fl.set_rx_l4_cksum(if cs.tcp_bad || cs.udp_bad {
            CksumStatus::Bad
        } else if cs.tcp_ok || cs.udp_ok {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        fl
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
    /// Every pool chunk was registered at configure time; a buffer outside them would be
    /// posted with a key the device rejects: counted (an error, not a pool shortage).
    fn count_unkeyed(&mut self) {
        Xstats::bump(&self.xstats.rx_no_mkey);
        self.counters.add_errors(1);
    }
}

impl RxBurst for RxQueue {
    #[inline]
    fn rx_burst(&mut self, out: &mut Burst) -> usize {
        RxQueue::rx_burst(self, out)
    }
}

impl Drop for RxQueue {
    /// Completions the device wrote that no burst took (the queue is going away: its port
    /// closes, or a dead device's queues are dropped before they are rebuilt) are frames the
    /// application never got: a completion's packets are counted as missed, an error
    /// completion as the error a burst would have counted ([`Cqe::rx_frames`]), so that none
    /// is lost uncounted.
    fn drop(&mut self) {
        // (missed, errors) of one completion, from packet `first` on.
        let frames_in = |cqe: &[u8; CQE_BYTES], first: usize| {
            Cqe::new_checked(&cqe[..]).map_or((0, 0), |c| {
                let n = c.rx_frames(first);
                match c.cqe_type() {
                    CqeType::RxOkay | CqeType::RxCoalesced4 => (n, 0),
                    _ => (0, n),
                }
            })
        };
        let (mut missed, mut errors) = self
            .backlog
            .take()
            .map_or((0, 0), |(cqe, first)| frames_in(&cqe, first));
        // At most a ring's worth: a device that keeps writing cannot hold the drop.
        for _ in 0..self.cq.count() {
            let Polled::Entry(off) = self.cq.poll() else {
                break;
            };
            let mut cqe = [0u8; CQE_BYTES];
            self.cq.read(off, &mut cqe);
            let (m, e) = frames_in(&cqe, 0);
            missed += m;
            errors += e;
        }
        self.counters.add_missed(missed);
        self.counters.add_errors(errors);
        // The device may still write into the posted buffers until the port's RX objects are
        // destroyed: they wait there (see `Parked`), not in the pool.
        let posted = std::mem::replace(&mut self.bufs, RxBufs::new(&self.pool, 1));
        self.parked.park(posted);
    }
}

#[cfg(test)]
mod csum_table_tests {
    use super::*;

    /// The table gives, for every combination of a CQE's checksum bits (outer good/bad, IP,
    /// TCP, UDP good/bad), the flags the direct reading of the CQE gives.
    #[test]
    fn the_table_agrees_with_the_cqe_for_every_combination() {
        let t = csum_table();
        let bits = [13u32, 14, 25, 26, 27, 28, 29, 30];
        for combo in 0u32..1 << bits.len() {
            let mut cqe = [0u8; CQE_BYTES];
            let dw = bits
                .iter()
                .enumerate()
                .filter(|(i, _)| combo & (1 << i) != 0)
                .fold(0u32, |a, (_, b)| a | (1 << b));
            cqe[4..8].copy_from_slice(&dw.to_le_bytes());
            let c = Cqe::new_checked(&cqe[..]).unwrap();
            assert_eq!(
                t[csum_index(c.rx_csum_bits())],
                csum_flags(&c.rx_csum()),
                "bits {dw:#x}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethdev::rare_run;
    use crate::hw::mana::cqe::owner_for;
    use crate::mana::RawRxQueue;
    use crate::sys::DevMem;
    use mempool::{MbufPoolConfig, Registration};
    use proptest::prelude::*;
    use std::sync::atomic::Ordering;

    const N: u32 = 64;

    fn queue(pool: &Arc<MbufPool>) -> (RxQueue, Arc<DevMem>) {
        let keys = pool
            .register_chunks(|_| Ok(Registration::new(mempool::Lkey(0x77))))
            .unwrap();
        let cq = Arc::new(DevMem::anon(N as usize * CQE_BYTES).unwrap());
        let raw = RawRxQueue {
            rq: Arc::new(DevMem::anon(4096).unwrap()),
            rq_id: 0x1234,
            db_page: Arc::new(DevMem::anon(4096).unwrap()),
            db_monitor: None,
            cq: Arc::clone(&cq),
            cq_count: N,
            cq_id: 0x4321,
            owner: Arc::new(()),
            parked: crate::ethdev::Parked::new(),
            kick: None,
        };
        let cfg = PortConfig {
            rx_ring_size: N as u16,
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
        (q, cq)
    }

    /// One run of single-packet CQEs with the rare cases inside it, on a port that keeps VLAN
    /// tags: a length over the buffer (freed and counted as an error, its bytes not counted)
    /// and stripped tags (put back into the frame). The others arrive in order with their
    /// hashes, the byte count is what was delivered, and the pool ends whole.
    #[test]
    fn a_run_with_a_too_long_packet_and_stripped_tags_keeps_order_and_counts() {
        let pool = MbufPool::new(MbufPoolConfig::new("mana-rx-run", 512)).unwrap();
        let (mut q, cq) = queue(&pool);
        let room = u32::from(pool.data_room());
        for (i, &(len, tagged)) in rare_run::PLAN.iter().enumerate() {
            let len = len.unwrap_or(room + 1);
            let mut b = [0u8; CQE_BYTES];
            b[0] = u8::from(CqeType::RxOkay);
            // Hashed (type bits 16..24), a tag 0x123 where stripped.
            let flags = (1u32 << 16) | if tagged { (1 << 12) | 0x123 } else { 0 };
            b[4..8].copy_from_slice(&flags.to_le_bytes());
            b[8..12].copy_from_slice(&len.to_le_bytes());
            b[16..20].copy_from_slice(&(100 + i as u32).to_le_bytes());
            let slot = i * CQE_BYTES;
            cq.write(slot, &b[..60]);
            let owner = u32::from(owner_for(i as u64, N));
            cq.store_u32(slot + 60, 0x1234 | (owner << 29), Ordering::Release);
        }
        let mut out = Burst::with_capacity(32);
        assert_eq!(q.rx_burst(&mut out), 4);
        rare_run::check(&out, q.counters.snapshot());
        drop(out);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever the device writes into completions (any type, any lengths, any flags),
        /// the RX path neither panics nor loses a buffer, and never consumes more descriptors
        /// than were posted.
        #[test]
        fn arbitrary_completions_never_panic_or_leak(
            cqes in proptest::collection::vec((any::<u8>(), any::<[u8; 56]>(), proptest::collection::vec(0u16..3000, 4)), 1..200),
            bursts in proptest::collection::vec(1usize..40, 1..50),
        ) {
            let pool = MbufPool::new(MbufPoolConfig::new("rxfuzz", 1024)).unwrap();
            let (mut q, cq) = queue(&pool);
            let mut written = 0u64;
            let mut delivered = Vec::new();
            let mut bi = 0;
            for (t, body, lens) in &cqes {
                // The device never runs more than a ring ahead of the consumer.
                if written >= u64::from(N) + u64::from(q.cq.head() - N) {
                    let mut b = Burst::with_capacity(bursts[bi % bursts.len()]);
                    bi += 1;
                    q.rx_burst(&mut b);
                    delivered.extend(b.drain_front(b.len()));
                    continue;
                }
                let mut bytes = [0u8; CQE_BYTES];
                bytes[4..60].copy_from_slice(body);
                bytes[0] = t % 8; // types 0..7: valid and invalid ones
                for (k, l) in lens.iter().enumerate() {
                    bytes[8 + 12 * k..10 + 12 * k].copy_from_slice(&l.to_le_bytes());
                }
                let slot = (written % u64::from(N)) as usize * CQE_BYTES;
                cq.write(slot, &bytes[..60]);
                let owner = u32::from(owner_for(written, N));
                cq.store_u32(slot + 60, 0x1234 | (owner << 29), Ordering::Release);
                written += 1;
                let mut b = Burst::with_capacity(bursts[bi % bursts.len()]);
                bi += 1;
                q.rx_burst(&mut b);
                prop_assert!(q.posted() <= N);
                for m in b.iter() {
                    // A re-inserted VLAN tag (strip off) may add 4 bytes of headroom.
                    prop_assert!(m.len() <= usize::from(pool.data_room()) + 4 && !m.is_empty());
                }
                delivered.extend(b.drain_front(b.len()));
            }
            drop(delivered);
            drop(q);
            mempool::lcache::flush();
            prop_assert_eq!(pool.in_use(), 0);
        }
    }

    /// Completions no burst took when the queue goes away are frames the application never
    /// got: the queue's counters say so, coalesced ones counted per packet (missed), an error
    /// completion as the error a burst would have counted (its frame is lost all the same).
    #[test]
    fn completions_left_at_drop_are_counted() {
        let pool = MbufPool::new(MbufPoolConfig::new("rx-left", 1024)).unwrap();
        let (mut q, cq) = queue(&pool);
        let counters = Arc::clone(&q.counters);
        // RX_OKAY (one 60-byte packet), RX_COALESCED_4 with three packets, one more RX_OKAY
        // that a one-packet burst leaves behind after taking the first, then an RX_TRUNCATED.
        let rx_truncated = u8::from(CqeType::RxTruncated);
        let bodies: [(u8, &[u16]); 4] = [
            (1, &[60]),
            (2, &[60, 60, 60]),
            (1, &[60]),
            (rx_truncated, &[]),
        ];
        for (n, (t, lens)) in bodies.iter().enumerate() {
            let mut bytes = [0u8; CQE_BYTES];
            bytes[0] = *t;
            for (k, l) in lens.iter().enumerate() {
                bytes[8 + 12 * k..10 + 12 * k].copy_from_slice(&l.to_le_bytes());
            }
            let slot = n * CQE_BYTES;
            cq.write(slot, &bytes[..60]);
            let owner = u32::from(owner_for(n as u64, N));
            cq.store_u32(slot + 60, 0x1234 | (owner << 29), Ordering::Release);
        }
        let mut b = Burst::with_capacity(2);
        assert_eq!(
            q.rx_burst(&mut b),
            2,
            "the first CQE and one of the coalesced three"
        );
        drop(b);
        drop(q);
        let s = counters.snapshot();
        assert_eq!(s.missed, 3, "two coalesced packets and the third CQE");
        assert_eq!(s.errors, 1, "the RX_TRUNCATED completion's frame");
        mempool::lcache::flush();
        assert_eq!(pool.in_use(), 0);
    }
}
