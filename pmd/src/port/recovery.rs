//! What a port shares with its queue handles, and how it gets a lost device back.
//!
//! **The control word.** A port and the handles of one configuration share a [`QueueCtl`]:
//! one 64-bit word, bit 0 "running", bits 1.. the generation of the queues. A handle loads
//! it once per burst (a plain load on x86; `Acquire`, so what the port wrote before the
//! word is visible) and compares it with the last word it ran under. Equal: the burst goes
//! straight to the driver. Different: the handle catches up, between bursts, on its own
//! core: a new generation means "your queue was rebuilt; take the new one from the port's
//! slots and drop the old one here". The datapath pays one load and one compare, no
//! read-modify-write, no lock; the lock on the slots is taken once per generation change.
//!
//! **Recovery** (a `mana:`/`mlx5:` port, or one given [`Port::with_recovery`]): on
//! [`PortEvent::DeviceFatal`] or [`PortEvent::DeviceRemoved`] the port
//! 1. stores a new generation with "running" clear: from their next burst the handles
//!    drop their dead queues (the buffers those had posted or had in flight go back to the
//!    pool) and return 0; TX leaves the packets with the caller;
//! 2. keeps the driver's extended counters and drops the driver: the device objects go in
//!    rdma-core's order (each queue object holds what it was created from, so QPs go before
//!    CQs, MRs before the PD, the context last) once the last handle of their generation
//!    has let go, never under a burst;
//! 3. tries to open the device again every [`RETRY_INTERVAL`] (the same spec: the same
//!    MAC, `dev=`, `netdev=` selection), configures it exactly as before (queue counts,
//!    ring sizes, RSS, MTU, promiscuous mode, offloads, the same pool, which is registered
//!    again) with the same per-queue counters, starts it if it was started, puts the new
//!    queues in the slots and stores the next generation with "running" set;
//! 4. gives up after the recover timeout: [`PortState::Failed`], [`PortEvent::RecoveryFailed`],
//!    and [`Port::failure`] says what it waited for and the last error.
//!
//! The recovery runs on whatever thread takes the port's events ([`Port::take_events`],
//! [`wait_events`]); nothing runs on the polling cores but the catch-up.
//!
//! [`Port::with_recovery`]: super::Port::with_recovery
//! [`Port::take_events`]: super::Port::take_events
//! [`Port::failure`]: super::Port::failure
//! [`wait_events`]: super::wait_events
//! [`PortEvent::DeviceFatal`]: crate::ethdev::PortEvent::DeviceFatal
//! [`PortEvent::DeviceRemoved`]: crate::ethdev::PortEvent::DeviceRemoved
//! [`PortEvent::RecoveryFailed`]: crate::ethdev::PortEvent::RecoveryFailed
//! [`PortState::Failed`]: crate::ethdev::PortState::Failed
#![deny(unsafe_code)]

use crate::ethdev::{
    Burst, Caps, Link, PortConfig, PortDriver, PortError, Queues, RxBurst, TxBurst,
};
use crate::ethdev::{QueueSetup, Xstat};
use crate::net::MacAddr;
use mempool::MbufPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a recovering port looks for its device.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(10);

/// A device lost again within this time of a recovery keeps that recovery's deadline: a
/// device that comes back broken, again and again, fails the port at the recover timeout
/// instead of keeping it recovering for ever. (Each loss still reports its own downtime.)
pub const FLAP_WINDOW: Duration = Duration::from_secs(1);

/// Opens the port's device again: for a port opened from a spec, the probe of that spec.
pub type Reopen = Box<dyn FnMut() -> Result<Box<dyn PortDriver>, PortError> + Send>;

/// Bit 0 of the control word.
const RUNNING: u64 = 1;

/// What a handle has seen before its first burst of a running port: a running word of a
/// generation no port reaches (2^63 - 1), so it never equals the port's word.
pub const NEVER: u64 = u64::MAX;

/// Whether the control word `w` says the queues run.
#[inline]
pub(super) fn running(w: u64) -> bool {
    w & RUNNING != 0
}

/// The queue generation in the control word `w`.
#[inline]
pub(super) fn generation(w: u64) -> u64 {
    w >> 1
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a port shares with the queue handles of one configuration (see the module docs).
#[derive(Default)]
pub struct QueueCtl {
    /// Bit 0: running; bits 1..: generation. Written under the `slots` lock, after the
    /// slots.
    pub(super) word: AtomicU64,
    /// The newest generation and its queues that their handles have not taken yet. A handle
    /// takes its queue and the generation it belongs to together, under this lock, so it
    /// never labels a queue with a generation it loaded earlier from the word.
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    gen: u64,
    rx: Vec<Option<Box<dyn RxBurst>>>,
    tx: Vec<Option<Box<dyn TxBurst>>>,
}

impl std::fmt::Debug for QueueCtl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.word.load(Ordering::Relaxed);
        write!(f, "QueueCtl(gen {}, running {})", generation(w), running(w))
    }
}

impl QueueCtl {
    /// The control of a new configuration: generation 0, not running.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn word(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// The current generation.
    pub(super) fn gen(&self) -> u64 {
        generation(self.word())
    }

    /// Sets or clears "running", same generation.
    pub(super) fn set_running(&self, on: bool) {
        let s = lock(&self.slots);
        self.word
            .store(s.gen << 1 | u64::from(on), Ordering::Release);
    }

    /// Starts a new generation with no queues (handles drop theirs), not running.
    pub(super) fn retire(&self) {
        self.publish(Vec::new(), Vec::new(), false);
    }

    /// Starts a new generation whose queue `i` is `rx[i]` / `tx[i]` for the handles that
    /// were taken (`None`, or missing, where there is none for the handle: it then holds a
    /// detached queue).
    pub(super) fn publish(
        &self,
        rx: Vec<Option<Box<dyn RxBurst>>>,
        tx: Vec<Option<Box<dyn TxBurst>>>,
        run: bool,
    ) {
        let mut s = lock(&self.slots);
        s.gen += 1;
        // What the previous generation left untaken goes now, on this (control) thread.
        s.rx = rx;
        s.tx = tx;
        // Release: a handle that sees the new generation sees the slots filled (it also
        // takes them under the lock).
        self.word
            .store(s.gen << 1 | u64::from(run), Ordering::Release);
    }

    /// For an RX handle holding a queue of generation `gen` that saw `w`: `None` when `w`
    /// is of that generation; else the newest generation and the handle's queue of it (a
    /// detached one if there is none), taken together.
    pub(super) fn next_rx(&self, w: u64, gen: u64, queue: u16) -> Option<(u64, Box<dyn RxBurst>)> {
        self.next(w, gen, |s| take(&mut s.rx, queue))
    }

    /// As [`QueueCtl::next_rx`], for a TX handle.
    pub(super) fn next_tx(&self, w: u64, gen: u64, queue: u16) -> Option<(u64, Box<dyn TxBurst>)> {
        self.next(w, gen, |s| take(&mut s.tx, queue))
    }

    fn next<T>(&self, w: u64, gen: u64, pick: impl FnOnce(&mut Slots) -> T) -> Option<(u64, T)> {
        if generation(w) == gen {
            return None;
        }
        let mut s = lock(&self.slots);
        if s.gen == gen {
            return None;
        }
        Some((s.gen, pick(&mut s)))
    }
}

/// Queue `queue` of `slots` (a detached one if there is none).
fn take<T: ?Sized>(slots: &mut [Option<Box<T>>], queue: u16) -> Box<T>
where
    Detached: Into<Box<T>>,
{
    slots
        .get_mut(usize::from(queue))
        .and_then(Option::take)
        .unwrap_or_else(|| Detached.into())
}

impl From<Detached> for Box<dyn RxBurst> {
    fn from(d: Detached) -> Self {
        Box::new(d)
    }
}

impl From<Detached> for Box<dyn TxBurst> {
    fn from(d: Detached) -> Self {
        Box::new(d)
    }
}

/// A queue with no device behind it (its port is recovering or gone): every burst is 0.
pub(super) struct Detached;

impl RxBurst for Detached {
    fn rx_burst(&mut self, _out: &mut Burst) -> usize {
        0
    }
}

impl TxBurst for Detached {
    fn tx_burst(&mut self, _pkts: &mut Burst) -> usize {
        0
    }
}

/// The driver of a port whose device is gone: what the port knew of it, link down, no
/// events, no queues.
pub(super) struct Gone {
    pub(super) caps: Caps,
    pub(super) mac: MacAddr,
}

impl PortDriver for Gone {
    fn caps(&self) -> Caps {
        self.caps.clone()
    }
    fn mac(&self) -> MacAddr {
        self.mac
    }
    fn link(&self) -> Link {
        Link {
            up: false,
            speed_mbps: 0,
            full_duplex: false,
        }
    }
    fn configure(
        &mut self,
        _cfg: &PortConfig,
        _pool: &Arc<MbufPool>,
        _q: &QueueSetup,
    ) -> Result<Queues, PortError> {
        Err(PortError::Setup {
            what: "configure".into(),
            source: "the port's device is gone (recovering or failed)".into(),
        })
    }
    fn start(&mut self) -> Result<(), PortError> {
        Err(PortError::Setup {
            what: "start".into(),
            source: "the port's device is gone (recovering or failed)".into(),
        })
    }
}

/// A recovery in progress.
pub(super) struct Recovery {
    /// When the device was lost.
    pub(super) since: Instant,
    /// When to give up.
    pub(super) deadline: Instant,
    /// When to look for the device next.
    pub(super) next_try: Instant,
    /// Attempts so far.
    pub(super) attempts: u32,
    /// Why the last attempt failed.
    pub(super) last_error: Option<String>,
    /// Whether the port was started when the device was lost (it is started again).
    pub(super) was_started: bool,
}

/// The last recovery that completed: when, and its deadline.
#[derive(Debug, Clone, Copy)]
pub(super) struct Completed {
    pub(super) at: Instant,
    pub(super) deadline: Instant,
}

impl Recovery {
    /// A recovery starting now, with the deadline of `last` if that completed within
    /// [`FLAP_WINDOW`].
    pub(super) fn new(timeout: Duration, was_started: bool, last: Option<Completed>) -> Self {
        let now = Instant::now();
        let deadline = match last {
            Some(c) if now.duration_since(c.at) < FLAP_WINDOW => c.deadline,
            _ => now + timeout,
        };
        Self {
            since: now,
            deadline,
            next_try: now + RETRY_INTERVAL,
            attempts: 0,
            last_error: None,
            was_started,
        }
    }
}

/// Adds `add` into `base` by name (counters summed across device generations).
pub(super) fn sum_into(base: &mut Vec<Xstat>, add: Vec<Xstat>) {
    crate::ethdev::xstat::sum_into(base, add);
}

/// `a` with `b` added by name, keeping `b`'s order first (the live driver's names), then
/// the names only earlier generations had.
pub(super) fn summed(base: &[Xstat], live: Vec<Xstat>) -> Vec<Xstat> {
    let mut out = live;
    crate::ethdev::xstat::sum_into(&mut out, base.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_word_packs_running_and_generation() {
        let c = QueueCtl::new();
        assert_eq!((c.gen(), running(c.word())), (0, false));
        c.set_running(true);
        assert_eq!((c.gen(), running(c.word())), (0, true));
        c.retire();
        assert_eq!((c.gen(), running(c.word())), (1, false));
        c.publish(vec![None], vec![None], true);
        assert_eq!((c.gen(), running(c.word())), (2, true));
        // A handle of generation 0 gets a queue (a detached one: the slot was empty), with
        // the generation it belongs to.
        let mut b = Burst::with_capacity(4);
        let (g, mut q) = c.next_rx(c.word(), 0, 0).expect("newer generation");
        assert_eq!(g, 2);
        assert_eq!(q.rx_burst(&mut b), 0);
        assert!(c.next_rx(c.word(), 2, 0).is_none());
        // One that loaded the word of generation 1 before the publish still gets the
        // newest queue, labelled 2, not 1.
        let w1 = 1 << 1;
        assert_eq!(c.next_rx(w1, 0, 0).map(|(g, _)| g), Some(2));
    }

    #[test]
    fn counters_are_summed_by_name() {
        use crate::ethdev::Loss;
        let x = |n: &str, v| Xstat::new(n, v, Loss::Rx);
        let mut base = vec![x("a", 1)];
        sum_into(&mut base, vec![x("a", 2), x("b", 5)]);
        assert_eq!(base, vec![x("a", 3), x("b", 5)]);
        let s = summed(&base, vec![x("b", 1), x("c", 7)]);
        assert_eq!(s, vec![x("b", 6), x("c", 7), x("a", 3)]);
    }
}
