//! The receive side of an mlx5 CQ, shared by the cyclic ([`super::rxq`]) and the striding
//! ([`super::rxq_mprq`]) RX queue: it turns the CQ into a sequence of completions, one per
//! received packet (or striding-RQ filler), whether the device wrote a normal CQE (§5.1) or a
//! compressed session of the basic layout (§6.2).
//!
//! A session's title gives the count (`byte_cnt`) and the fields its packets share; mini CQE
//! `i` sits in the array at slot `t + 1` (`i < 8`) or `t + 8k` (array `k`). Each mini gives the
//! packet's `byte_cnt` and, by the CQ's mini format, its RSS hash (HASH, cyclic RQs) or its
//! stride index (CSUM_STRIDX, striding RQs; the hash then is the title's). Mid-session the
//! consumer index (and `SET_CI`) stays at the title; once the last mini is handed out, the
//! session's slots after the title are poisoned (opcode INVALID) so that no later lap reads a
//! stale array or hole as a completion, and the consumer jumps to `t + n`.
#![deny(unsafe_code)]

use super::cq::CompletionQueue;
use super::provider::SetupError;
use super::provider::{QueueState, RawCq};
use super::txq::RECOVERY_RETRY_BURSTS;
use super::xstats::RxXstats;
use crate::ethdev::Counters;
use crate::hw::mlx5::cqe::{
    self, csum_ok, hdr_type, mini_slot, op_own, Cqe, CqeFormat, CqeOpcode, MiniCqe, MiniCqeFormat,
    Syndrome, OP_OWN,
};
use crate::hw::mlx5::doorbell::{self, CQ_SET_CI, RCV_DBR};
use crate::hw::mlx5::{CQE_BYTES, MINI_CQE_BYTES};
use crate::ring::Polled;
use crate::sys::barrier::udma_from_device_barrier;
use crate::sys::{DevEntry, DevMem, DevView};
use mempool::{CksumStatus, OffloadFlags};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a CQE says of its packets beyond length, hash and stride (a session's title: of all
/// of them).
#[derive(Debug, Clone, Copy)]
pub(super) struct RxMeta {
    /// Checksum flags.
    pub fl: OffloadFlags,
    /// Whether the device hashed the packets.
    pub hashed: bool,
    /// A stripped VLAN tag.
    pub vlan: Option<u16>,
}

impl RxMeta {
    pub(super) fn of(c: &Cqe<&[u8]>) -> Self {
        let mut fl = OffloadFlags::empty();
        let ok = c.hds_ip_ext();
        // The device reports good checksums only; a clear bit means "not checked" (§5.1).
        fl.set_rx_ip_cksum(if ok & csum_ok::L3 != 0 {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        fl.set_rx_l4_cksum(if ok & csum_ok::L4 != 0 {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        Self {
            fl,
            hashed: c.rx_hash_type() != 0,
            vlan: c.vlan(),
        }
    }
}

/// One packet's completion (from a normal CQE or a mini).
#[derive(Debug, Clone, Copy)]
pub(super) struct RxCompletion {
    /// `byte_cnt`: the length (cyclic RQ), or the packed filler / strides / length word
    /// (striding RQ, §4.2).
    pub byte_cnt: u32,
    /// The RSS hash result (meaningful when `meta.hashed`).
    pub hash: u32,
    /// The stride index where the packet starts (striding RQ), when the completion carries
    /// it: a normal CQE's `wqe_counter`, a CSUM_STRIDX mini's stride index; `None` for HASH
    /// minis.
    pub stride_idx: Option<u16>,
    /// The rest.
    pub meta: RxMeta,
}

/// A normal RESP_SEND CQE (the common completion of a cyclic RQ), read in place: the few
/// fields a delivery needs, and a key into the queue's flag table ([`RxMeta::flags_key`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct NormalRx {
    /// The packet's length.
    pub byte_cnt: u32,
    /// The RSS hash (meaningful when the key says hashed).
    pub hash: u32,
    /// Bit 0 L3 checksum good, bit 1 L4 good, bit 2 hashed, bit 3 a VLAN tag was stripped.
    pub key: u8,
    /// The stripped tag (meaningful when the key says so).
    pub vlan: u16,
}

/// The normal packet CQE `e` (an entry of a [`RxCq::normal_run`]), read in place.
#[inline]
pub(super) fn normal_at(e: DevEntry<'_, CQE_BYTES>) -> NormalRx {
    // hds_ip_ext, l4_l3_hdr_type and vlan_info are one dword (§5.1).
    let [hds, l4l3, v0, v1] = e.u32_at::<{ cqe::HDS_IP_EXT }>().to_le_bytes();
    NormalRx {
        byte_cnt: u32::from_be(e.u32_at::<{ cqe::BYTE_CNT }>()),
        hash: u32::from_be(e.u32_at::<{ cqe::RX_HASH_RES }>()),
        key: RxMeta::flags_key(hds, e.u8_at::<{ cqe::RX_HASH_TYPE }>(), l4l3),
        vlan: u16::from_be_bytes([v0, v1]),
    }
}

/// The index into a queue's run table ([`RUN_KEYS`] entries) of a normal CQE's
/// `hds_ip_ext` dword (byte 28 on, read in memory order): bit 0 L3 checksum good, bit 1 L4
/// good, bit 7 a VLAN tag was stripped (`hds_ip_ext` bits 1 and 2, `l4_l3_hdr_type` bit 0,
/// §5.1), in two instructions; whether the device hashed is read apart.
#[inline]
pub(super) fn run_key(w: u32) -> usize {
    const _: () = assert!(csum_ok::L3 == 1 << 1 && csum_ok::L4 == 1 << 2);
    const _: () = assert!(hdr_type::CVLAN == 1);
    ((w >> 1) & 0x83) as usize
}

/// Entries of a run table: every [`run_key`].
pub(super) const RUN_KEYS: usize = 0x84;

/// The [`NormalRx::key`] (hash bit clear) a [`run_key`] stands for.
pub(super) fn key_of_run_key(k: usize) -> u8 {
    (k & 3) as u8 | (((k >> 7) & 1) << 3) as u8
}

/// What [`RxCq::next_normal`] found.
#[derive(Debug, Clone, Copy)]
pub(super) enum FastPolled {
    /// A normal packet CQE.
    Normal(NormalRx),
    /// Anything else, decoded by [`RxCq::next`]'s rules.
    Other(RxPolled),
}

impl RxMeta {
    /// The flags-table key of a CQE's checksum bits, hash type and VLAN bit (see
    /// [`NormalRx::key`]).
    #[inline]
    pub fn flags_key(hds_ip_ext: u8, hash_type: u8, l4_l3_hdr_type: u8) -> u8 {
        u8::from(hds_ip_ext & csum_ok::L3 != 0)
            | (u8::from(hds_ip_ext & csum_ok::L4 != 0) << 1)
            | (u8::from(hash_type != 0) << 2)
            | (u8::from(l4_l3_hdr_type & hdr_type::CVLAN != 0) << 3)
    }

    /// The meta a key stands for (its VLAN tag aside: `vlan` is `Some(0)` when present).
    pub fn of_key(key: u8) -> Self {
        let mut fl = OffloadFlags::empty();
        fl.set_rx_ip_cksum(if key & 1 != 0 {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        fl.set_rx_l4_cksum(if key & 2 != 0 {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        Self {
            fl,
            hashed: key & 4 != 0,
            vlan: (key & 8 != 0).then_some(0),
        }
    }
}

/// What [`RxCq::next`] found.
#[derive(Debug, Clone, Copy)]
pub(super) enum RxPolled {
    /// Nothing new.
    Empty,
    /// A packet's (or filler's) completion.
    Packet(RxCompletion),
    /// An error CQE (§5.3), or a format a raw-packet RQ does not produce (data scattered into
    /// the CQE, §9 item 10): the queue drops what the completion stands for.
    Bad {
        /// A responder error with a syndrome that means the WQ is in error (LOCAL_QP_OP,
        /// LOCAL_PROT, WR_FLUSH, §5.3): the queue recovers it.
        critical: bool,
        /// A flush (WR_FLUSH): a posted buffer given back unused, no frame lost.
        flush: bool,
    },
}

/// What a recovery's drain of the CQ consumed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Drained {
    /// Flush CQEs: posted buffers the device gave back unused.
    pub flushed: u64,
    /// Other completions (a session's count of them): frames dropped.
    pub dropped: u64,
}

/// The rest of a compressed session being handed out ([`RxCq::session_left`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct SessionLeft {
    /// The title's position (free-running).
    pub t: u32,
    /// The next mini to hand out.
    pub next: u32,
    /// Minis left (at least 1).
    pub left: u32,
    /// What the title says of every packet.
    pub meta: RxMeta,
}

/// A compressed session being handed out.
#[derive(Debug)]
struct Session {
    /// What the title says of every packet.
    meta: RxMeta,
    /// The title's hash (CSUM_STRIDX minis carry none).
    hash: u32,
    /// The title's position (free-running).
    t: u32,
    /// Completions in the session.
    n: u32,
    /// The next mini to hand out.
    next: u32,
}

/// The receive CQ of one RX queue.
#[derive(Debug)]
pub(super) struct RxCq {
    cq: CompletionQueue,
    dbrec: Arc<DevMem>,
    /// The mini format of the CQ's compressed sessions.
    mini: MiniCqeFormat,
    session: Option<Session>,
    /// The `SET_CI` value last written.
    written: u32,
    /// Compressed sessions started.
    pub sessions: u64,
}

impl RxCq {
    /// The CQ `raw`, whose compressed sessions (if any) carry `mini` minis.
    pub fn new(raw: RawCq, mini: MiniCqeFormat) -> Self {
        Self {
            cq: CompletionQueue::new(raw.buf, raw.cqe_cnt),
            dbrec: raw.dbrec,
            mini,
            session: None,
            written: 0,
            sessions: 0,
        }
    }

    /// The consumer index `SET_CI` should hold: the title while a session is being handed
    /// out, else the next entry.
    pub fn ci(&self) -> u32 {
        match &self.session {
            Some(s) => s.t,
            None => self.cq.head(),
        }
    }

    /// The next completion, consumed; a normal packet CQE read in place, without building
    /// its meta (the queue looks its flags up by [`NormalRx::key`]).
    #[inline]
    pub fn next_normal(&mut self) -> FastPolled {
        if self.session.is_some() {
            return FastPolled::Other(self.next());
        }
        let off = match self.cq.poll() {
            Polled::Entry(off) => off,
            Polled::Empty | Polled::Overflow => return FastPolled::Other(RxPolled::Empty),
        };
        let mut b = [0u8; CQE_BYTES];
        self.cq.read(off, &mut b);
        let c = Cqe::new_checked(&b[..]).expect("64 bytes");
        if c.op_own() & 0xfc == (u8::from(CqeOpcode::RespSend) << 4) {
            return FastPolled::Normal(NormalRx {
                byte_cnt: c.byte_cnt(),
                hash: c.rx_hash_res(),
                key: RxMeta::flags_key(c.hds_ip_ext(), c.rx_hash_type(), c.l4_l3_hdr_type()),
                vlan: c.vlan_info(),
            });
        }
        FastPolled::Other(self.decode(&b))
    }

    /// The run of normal packet CQEs from the consumer on (none mid-session), at most `max`
    /// and not past the end of the ring: a view of the run's slots, how many are normal
    /// packet CQEs owned by software (checked in place, one read barrier for all), and
    /// whether the run went on to the end of the view (so the next run may start at once,
    /// at the wrap). Read them with [`normal_at`], then [`RxCq::consume`] them.
    #[inline]
    pub fn normal_run(&self, max: u32) -> (DevView<'_>, u32, bool) {
        let (view, m) = self
            .cq
            .run_view(if self.session.is_some() { 0 } else { max });
        // opcode RESP_SEND, format normal, owner bit = the lap parity (§5.2); `se` (bit 1)
        // does not matter.
        let want = op_own(
            CqeOpcode::RespSend.into(),
            CqeFormat::Normal.into(),
            self.cq.head() & self.cq.count() != 0,
        );
        let mut n = 0;
        for e in view.entries::<CQE_BYTES>() {
            if e.load_u8_relaxed::<OP_OWN>() & 0xfd != want {
                break;
            }
            n += 1;
        }
        if n > 0 {
            // The owner fields were read first; no body may be read before them.
            udma_from_device_barrier();
        }
        (view, n, n == m && m > 0)
    }

    /// The session being handed out, if any: what a run of its minis needs.
    #[inline]
    pub fn session_left(&self) -> Option<SessionLeft> {
        self.session.as_ref().map(|s| SessionLeft {
            t: s.t,
            next: s.next,
            left: s.n - s.next,
            meta: s.meta,
        })
    }

    /// Mini `i` of the session whose title is at `t` (one not yet handed out, §6.2), read in
    /// place: its first word (HASH minis: the hash) and its length.
    #[inline]
    pub fn mini(&self, t: u32, i: u32) -> (u32, u32) {
        let (slot, e) = mini_slot(t, i);
        let mut b = [0u8; MINI_CQE_BYTES];
        self.cq
            .mem()
            .read(self.cq.offset_of(slot) + e * MINI_CQE_BYTES, &mut b);
        let [w0, w1, w2, w3, l0, l1, l2, l3] = b;
        (
            u32::from_be_bytes([w0, w1, w2, w3]),
            u32::from_be_bytes([l0, l1, l2, l3]),
        )
    }

    /// Marks `k` more minis of the session handed out; after its last, the session ends (its
    /// slots poisoned, the consumer moved past it).
    ///
    /// # Panics
    /// If no session is being handed out or fewer than `k` minis are left.
    #[inline]
    pub fn session_took(&mut self, k: u32) {
        let s = self.session.as_mut().expect("a session being handed out");
        assert!(
            k <= s.n - s.next,
            "{k} minis taken of {} left",
            s.n - s.next
        );
        s.next += k;
        if s.next == s.n {
            let (t, n) = (s.t, s.n);
            self.end_session(t, n);
            self.session = None;
        }
    }

    /// Consumes `n` CQEs of a [`RxCq::normal_run`].
    #[inline]
    pub fn consume(&mut self, n: u32) {
        self.cq.consume(n);
    }

    /// The next completion, consumed.
    #[inline]
    pub fn next(&mut self) -> RxPolled {
        if self.session.is_some() {
            if let Some(p) = self.session_next() {
                return p;
            }
        }
        let off = match self.cq.poll() {
            Polled::Entry(off) => off,
            Polled::Empty | Polled::Overflow => return RxPolled::Empty,
        };
        let mut b = [0u8; CQE_BYTES];
        self.cq.read(off, &mut b);
        self.decode(&b)
    }

    /// What the CQE `b`, just consumed, says.
    #[inline]
    fn decode(&mut self, b: &[u8; CQE_BYTES]) -> RxPolled {
        let c = Cqe::new_checked(&b[..]).expect("64 bytes");
        match (c.opcode(), c.format()) {
            (CqeOpcode::RespSend, CqeFormat::Normal) => RxPolled::Packet(RxCompletion {
                byte_cnt: c.byte_cnt(),
                hash: c.rx_hash_res(),
                stride_idx: Some(c.wqe_counter()),
                meta: RxMeta::of(&c),
            }),
            // A session covers `n` consecutive slots of the CQ (§6.2): a title that claims
            // more than the CQ holds is a broken device's (below: critical, the queue
            // recovers), never a count to loop over.
            (CqeOpcode::RespSend, CqeFormat::Compressed)
                if (1..=self.cq.count()).contains(&c.byte_cnt()) =>
            {
                self.sessions += 1;
                self.session = Some(Session {
                    meta: RxMeta::of(&c),
                    hash: c.rx_hash_res(),
                    t: self.cq.head().wrapping_sub(1),
                    n: c.byte_cnt(),
                    next: 0,
                });
                self.session_next().unwrap_or(RxPolled::Empty)
            }
            (op, _) => {
                crate::dp_trace!(opcode = ?op, "rx error completion\n{}", crate::hw::hexdump(b));
                let syndrome = c.syndrome();
                RxPolled::Bad {
                    critical: (op == CqeOpcode::RespErr
                        && matches!(
                            syndrome,
                            Syndrome::LocalQpOp | Syndrome::LocalProt | Syndrome::WrFlush
                        ))
                        || (op == CqeOpcode::RespSend && c.format() == CqeFormat::Compressed),
                    flush: op == CqeOpcode::RespErr && syndrome == Syndrome::WrFlush,
                }
            }
        }
    }

    /// Poisons the slots of the compressed session whose title is at `t` (`n` completions)
    /// after the title, and moves the consumer past them (§6.2).
    fn end_session(&mut self, t: u32, n: u32) {
        for k in 1..n {
            let off = self.cq.offset_of(t.wrapping_add(k));
            self.cq
                .mem()
                .write(off + CQE_BYTES - 1, &[op_own(15, 0, false)]);
        }
        self.cq.skip(n.saturating_sub(1));
    }

    /// For a recovery, with the WQ in RESET (the device writes no more completions for it):
    /// consumes every completion up to an empty slot, compressed sessions included (their
    /// slots poisoned), counting flushes apart from dropped frames, then writes `SET_CI`
    /// (the CQ itself is not reset, §5.3).
    #[cold]
    pub fn drain(&mut self) -> Drained {
        let mut d = Drained::default();
        // An error CQE is never inside a session, but a session cut short is dropped whole.
        if let Some(s) = self.session.take() {
            d.dropped += u64::from(s.n - s.next);
            self.end_session(s.t, s.n);
        }
        while let Polled::Entry(off) = self.cq.poll() {
            let mut b = [0u8; CQE_BYTES];
            self.cq.read(off, &mut b);
            let c = Cqe::new_checked(&b[..]).expect("64 bytes");
            match (c.opcode(), c.format(), c.syndrome()) {
                (CqeOpcode::RespSend, CqeFormat::Compressed, _) => {
                    // Within the CQ, whatever the title says (see `decode`).
                    let n = c.byte_cnt().clamp(1, self.cq.count());
                    self.end_session(self.cq.head().wrapping_sub(1), n);
                    d.dropped += u64::from(n);
                }
                (CqeOpcode::RespErr, _, Syndrome::WrFlush) => d.flushed += 1,
                _ => d.dropped += 1,
            }
        }
        self.commit();
        d
    }

    /// The next mini of the current session, if any; ends the session (its slots poisoned,
    /// the consumer moved past it) when that was its last.
    #[inline]
    fn session_next(&mut self) -> Option<RxPolled> {
        let s = self.session.as_mut()?;
        let (t, n, i, meta, title_hash) = (s.t, s.n, s.next, s.meta, s.hash);
        s.next += 1;
        let (slot, e) = mini_slot(t, i);
        let mut b = [0u8; MINI_CQE_BYTES];
        // (The slots are poisoned below once the last mini is read.)
        self.cq
            .mem()
            .read(self.cq.offset_of(slot) + e * MINI_CQE_BYTES, &mut b);
        let mini = MiniCqe::new_checked(&b[..]).expect("8 bytes");
        let (hash, stride_idx) = match self.mini {
            MiniCqeFormat::Hash => (mini.rx_hash_result(), None),
            _ => (title_hash, Some(mini.stride_idx())),
        };
        if i + 1 >= n {
            // Poison the session's slots after the title, then move past them (§6.2).
            self.end_session(t, n);
            self.session = None;
        }
        Some(RxPolled::Packet(RxCompletion {
            byte_cnt: mini.byte_cnt(),
            hash,
            stride_idx,
            meta,
        }))
    }

    /// Writes `SET_CI` (§5.4) if the consumer index moved since the last write.
    ///
    /// Mid-session it names the title: the device may not reuse the session's slots before
    /// the whole session is consumed.
    #[inline]
    pub fn commit(&mut self) {
        let ci = self.ci();
        if ci != self.written {
            self.dbrec.store_u32(
                CQ_SET_CI,
                u32::from_ne_bytes(doorbell::cq_set_ci(ci)),
                Ordering::Release,
            );
            self.written = ci;
        }
    }
}

/// The error recovery of an RX queue's WQ (§5.3, as DPDK does it), shared by both queue
/// kinds: the WQ's state machine, and whether the queue is down after a failed state change.
///
/// The queue's `recover` runs, on its polling core, in the burst that finds a critical error
/// CQE: [`Recovery::restart`] (RESET, the CQ drained and counted, `SET_CI`, the RQ record
/// ← 0, RDY), then the queue posts its WQEs again from WQE 0 and calls [`Recovery::done`].
/// If a state change fails the queue is down: counted, logged once, it delivers nothing and
/// tries again every [`RECOVERY_RETRY_BURSTS`] bursts; the steps are safe to repeat.
pub(super) struct Recovery {
    state: Arc<dyn QueueState>,
    rqn: u32,
    /// A recovery failed: the queue delivers nothing and tries again in `retry_in` bursts.
    down: bool,
    retry_in: u32,
    /// A failed recovery was logged (once per queue).
    warned: bool,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery")
            .field("rqn", &self.rqn)
            .field("down", &self.down)
            .field("retry_in", &self.retry_in)
            .finish_non_exhaustive()
    }
}

impl Recovery {
    /// The recovery of WQ `rqn` through `state`.
    pub fn new(state: Arc<dyn QueueState>, rqn: u32) -> Self {
        Self {
            state,
            rqn,
            down: false,
            retry_in: 0,
            warned: false,
        }
    }

    /// Whether a recovery failed and the queue delivers nothing until a retry succeeds.
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// Recovery steps 1–4: the WQ to RESET (the device stops using it), every completion
    /// consumed (flushes counted in `rx_flushed`, anything else a frame dropped:
    /// `rx_recovery_drops` and errors; the buffers stay with the queue), `SET_CI` ← the
    /// CQ's consumer, the RQ record ← 0 (the device's counter after RESET, §4.1), the WQ to
    /// RDY. `false` when a state change failed: the queue is then down.
    #[cold]
    pub fn restart(
        &mut self,
        cq: &mut RxCq,
        dbrec: &DevMem,
        xstats: &RxXstats,
        counters: &Counters,
    ) -> bool {
        if let Err(e) = self.state.reset() {
            self.failed("RESET", &e, xstats);
            return false;
        }
        let d = cq.drain();
        RxXstats::add(&xstats.flushed, d.flushed);
        RxXstats::add(&xstats.recovery_drops, d.dropped);
        counters.add_errors(d.dropped);
        dbrec.store_u32(
            RCV_DBR,
            u32::from_ne_bytes(doorbell::rq_record(0)),
            Ordering::Release,
        );
        if let Err(e) = self.state.ready() {
            self.failed("RDY", &e, xstats);
            return false;
        }
        true
    }

    /// The queue posted its WQEs again: it is up.
    pub fn done(&mut self, xstats: &RxXstats) {
        self.down = false;
        RxXstats::bump(&xstats.recoveries);
    }

    /// A burst on a queue that is down: whether the next recovery attempt is due now.
    #[cold]
    pub fn retry_due(&mut self) -> bool {
        self.retry_in = self.retry_in.saturating_sub(1);
        self.retry_in == 0
    }

    #[cold]
    fn failed(&mut self, to: &'static str, e: &SetupError, xstats: &RxXstats) {
        RxXstats::bump(&xstats.recovery_failures);
        self.down = true;
        self.retry_in = RECOVERY_RETRY_BURSTS;
        if !self.warned {
            self.warned = true;
            tracing::warn!(target: "pmd::mlx5::driver", rq = self.rqn, to, error = %e,
                "rx queue recovery failed: the queue delivers nothing and tries again every {RECOVERY_RETRY_BURSTS} bursts");
        }
    }
}
