//! The MANA NIC's side of the queues: consumes SQ WQEs after doorbells, reads frames through
//! memory keys, applies TX offloads, puts frames on the wire; takes frames off the wire into
//! posted RQ buffers; writes CQEs with owner bits. Written from the spec as the device's
//! behaviour (§10 "What a faithful device model must reproduce"), not from the driver's code.
//!
//! This file holds the engine's state and its step loop; the roles live beside it:
//! `tx.rs` (SQ WQEs, TX offloads, TSO, TX CQEs), `rx.rs` (wire to RQ buffers, classification,
//! coalescing, RX CQEs) and `cq.rs` (writing CQEs, slow completions). The L3/L4 arithmetic is
//! NIC-independent and lives in [`crate::net`]; wire faults are a [`FaultyWire`] around the
//! port's wire.
#![deny(unsafe_code)]

mod cq;
mod rx;
mod tx;

use crate::emu::wire::faults::FaultyWire;
use crate::emu::wire::{Wire, MAX_FRAME};
use crate::hw::mana::{CQE_BYTES, RSS_TABLE_ENTRIES};
use crate::sys::DevMem;
use std::sync::Arc;

/// `vendor_err` the model puts in a TX CQE whose SGE is outside registered memory.
pub const VENDOR_ERR_BAD_MKEY: u32 = 0x4d4b; // "MK"
/// `vendor_err` for a WQE whose header or OOB is malformed.
pub const VENDOR_ERR_BAD_WQE: u32 = 0x5751; // "WQ"
/// `vendor_err` for an error injected on purpose.
pub const VENDOR_ERR_INJECTED: u32 = 0x464c; // "FL"

/// Faults on demand; all deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every n-th TX WQE completes with TX_VPORT_DISABLED instead of being sent (0: off).
    pub tx_error_every: u32,
    /// Every n-th frame from the wire is dropped before reaching an RQ (0: off). A wire
    /// fault: the engine forwards it to its [`FaultyWire`].
    pub rx_drop_every: u32,
    /// Every n-th RX frame completes as RX_TRUNCATED (0: off).
    pub rx_error_every: u32,
    /// Link down: frames in both directions are dropped (TX still completes, as on a NIC
    /// whose cable is out). A wire fault: the engine forwards it to its [`FaultyWire`].
    pub link_down: bool,
    /// Completions are held back for this many engine steps (slow completions).
    pub completion_delay_steps: u32,
    /// RX CQE coalescing (newer kernels enable it for RSS QPs): up to four packets per
    /// RX_COALESCED_4 CQE.
    pub rx_coalesce: bool,
}

/// Device-side counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Frames put on the wire.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// TX WQEs completed with an error.
    pub tx_errors: u64,
    /// Frames the wire refused (receiver full).
    pub tx_wire_drops: u64,
    /// Frames delivered into RQ buffers.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames dropped because no RX WQE was posted (the NIC's "discarded, no WQE").
    pub rx_no_wqe: u64,
    /// Frames larger than the posted buffer (RX_TRUNCATED).
    pub rx_truncated: u64,
    /// Frames dropped by faults or link down.
    pub rx_fault_drops: u64,
    /// TX frames over the MTU (completed with TX_MTU_DROP).
    pub tx_mtu_drops: u64,
    /// Doorbells whose queue id did not match the queue.
    pub bad_doorbells: u64,
    /// RX CQEs written (fewer than frames when coalescing).
    pub rx_cqes: u64,
}

pub(crate) struct Sq {
    pub mem: Arc<DevMem>,
    pub id: u32,
    pub cq: usize,
    pub db: Arc<DevMem>,
    pub vp_offset: u16,
    /// Consumer position in bytes (free-running).
    pub consumed: u32,
}

pub(crate) struct Rq {
    pub mem: Arc<DevMem>,
    pub id: u32,
    pub cq: usize,
    pub db: Arc<DevMem>,
    pub consumed: u32,
}

pub(crate) struct Cq {
    pub mem: Arc<DevMem>,
    pub count: u32,
    pub id: u32,
    /// CQEs written since creation.
    pub written: u64,
    /// Completions waiting out `completion_delay_steps`: (due step, body, wq, is_sq).
    pub delayed: std::collections::VecDeque<(u64, [u8; CQE_BYTES], u32, bool)>,
}

pub(crate) struct Mr {
    pub lkey: u32,
    pub addr: usize,
    pub len: usize,
    pub mem: DevMem,
}

/// RSS state (§1.6 step 6): key and the 64-entry table `entry[k] = rq[k mod n]`.
pub(crate) struct Rss {
    pub key: [u8; 40],
    pub table: [u16; RSS_TABLE_ENTRIES],
    pub enabled: bool,
}

/// The engine: every queue, memory region and the wire of one modelled port.
pub struct Engine {
    pub(crate) sqs: Vec<Sq>,
    pub(crate) rqs: Vec<Rq>,
    pub(crate) cqs: Vec<Cq>,
    pub(crate) mrs: Vec<Mr>,
    pub(crate) rss: Rss,
    /// The port's wire, wrapped so that the wire-level [`Faults`] apply to it.
    pub(crate) wire: FaultyWire,
    pub(crate) faults: Faults,
    pub(crate) stats: ModelStats,
    /// The MTU the driver set (`Provider::set_mtu`): larger TX frames complete with
    /// TX_MTU_DROP.
    pub(crate) mtu: u16,
    frame: Vec<u8>,
    seg: Vec<u8>,
    coalescing: Option<rx::Coalescing>,
    steps: u64,
    tx_seen: u64,
    rx_seen: u64,
}

/// Largest packet a TSO WQE may describe (the IPv4 total length limit plus headers).
pub const LSO_MAX_BYTES: usize = 65536 + 256;

/// Frames or WQEs handled per queue per step, so one busy queue cannot starve the others.
const BUDGET: usize = 64;

impl Engine {
    pub(crate) fn new(wire: Box<dyn Wire>) -> Self {
        Self {
            sqs: Vec::new(),
            rqs: Vec::new(),
            cqs: Vec::new(),
            mrs: Vec::new(),
            rss: Rss {
                key: [0; 40],
                table: [0; RSS_TABLE_ENTRIES],
                enabled: false,
            },
            wire: FaultyWire::new(wire),
            faults: Faults::default(),
            stats: ModelStats::default(),
            frame: vec![0; LSO_MAX_BYTES + 4],
            seg: Vec::with_capacity(MAX_FRAME + 4),
            coalescing: None,
            mtu: 1500,
            steps: 0,
            tx_seen: 0,
            rx_seen: 0,
        }
    }

    /// One pass over every queue and the wire; returns the work done (WQEs + frames + CQEs).
    pub fn step(&mut self) -> usize {
        self.steps += 1;
        self.forward_wire_faults();
        let mut work = 0;
        for i in 0..self.sqs.len() {
            work += self.process_sq(i);
        }
        work += self.process_wire();
        work += self.release_delayed();
        work
    }

    /// Hands the wire-level fields of [`Faults`] to the wire's knobs. `faults` is set from
    /// outside between steps, so each step starts by forwarding it.
    fn forward_wire_faults(&self) {
        let knobs = self.wire.faults();
        knobs.set_rx_drop_every(self.faults.rx_drop_every);
        knobs.set_link_down(self.faults.link_down);
    }

    /// Reads `out.len()` bytes at `addr` through memory key `key`; `false` if that range is
    /// not inside the key's region.
    fn mr_read(&self, addr: u64, key: u32, out: &mut [u8]) -> bool {
        match self.find_mr(addr, key, out.len()) {
            Some((mr, off)) => {
                mr.mem.read(off, out);
                true
            }
            None => false,
        }
    }

    /// The region of `key` and the offset of `addr` in it, if `len` bytes from there fit.
    fn find_mr(&self, addr: u64, key: u32, len: usize) -> Option<(&Mr, usize)> {
        let mr = self.mrs.iter().find(|m| m.lkey == key)?;
        let addr = usize::try_from(addr).ok()?;
        let off = addr.checked_sub(mr.addr)?;
        (off.checked_add(len)? <= mr.len).then_some((mr, off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::wire::Loopback;

    /// The wire-level faults set through [`Faults`] reach the wrapped wire at the next step,
    /// and the engine counts and budgets dropped frames like any other arrival.
    #[test]
    fn wire_faults_are_forwarded_counted_and_budgeted() {
        let mut e = Engine::new(Box::new(Loopback::open("t-engine-faults").unwrap()));
        let mut peer = Loopback::open("t-engine-faults").unwrap();
        e.faults = Faults {
            rx_drop_every: 3,
            ..Faults::default()
        };
        for _ in 0..7 {
            assert!(peer.send(&[0u8; 60]));
        }
        assert_eq!(e.step(), 7);
        // No RQ: what the faults let through finds no WQE.
        assert_eq!((e.stats.rx_fault_drops, e.stats.rx_no_wqe), (2, 5));

        e.faults = Faults {
            link_down: true,
            ..Faults::default()
        };
        for _ in 0..100 {
            assert!(peer.send(&[0u8; 60]));
        }
        assert_eq!(e.step(), BUDGET);
        assert_eq!(e.step(), 100 - BUDGET);
        assert_eq!(e.step(), 0);
        assert_eq!((e.stats.rx_fault_drops, e.stats.rx_no_wqe), (102, 5));
        assert!(e.wire.faults().link_down());

        e.faults = Faults::default();
        assert!(peer.send(&[0u8; 60]));
        assert_eq!(e.step(), 1);
        assert_eq!((e.stats.rx_fault_drops, e.stats.rx_no_wqe), (102, 6));
    }
}
