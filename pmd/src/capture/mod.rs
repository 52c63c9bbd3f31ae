//! Live packet capture from a running app: the frames its queues receive and send, copied
//! into shared-memory rings that a capture tool (`pmd-dumpcap`) drains into a pcapng file.
//!
//! * [`Tap`]: one per port, shared by the port and its queue handles. With no capture on,
//!   a burst pays one relaxed load of its generation word ([`Mirror::on`]).
//! * [`Session`]: one capture: the sealed memfd of [`ring`]s (one per mirrored queue), the
//!   snap length and the [`bpf`] filter. [`Tap::attach`] turns it on for a port,
//!   [`Tap::detach`] off; a queue handle notices at its next burst, takes (or drops) its
//!   [`ring::RingWriter`], and only then copies frames.
//! * [`Mirror`]: a queue handle's side. RX frames are copied after the driver delivered
//!   them; TX frames are written before the driver takes them and published only for those
//!   it took, so a capture holds what the device was given, not what it refused.
//! * [`server`]: the control socket beside the telemetry socket, where a capture tool asks
//!   for a capture and gets the memfd; a capture ends when the tool says so or its
//!   connection closes (the tool died): nothing is left mirroring.
#![deny(unsafe_code)]

pub mod bpf;
pub mod ring;
pub mod server;

use crate::sys::DevMem;
use mempool::Mbuf;
use ring::{Direction, Layout, Outcome, RingId, RingWriter};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One capture: its rings, snap length and filter.
pub struct Session {
    id: u64,
    mem: DevMem,
    layout: Layout,
    rings: Vec<RingId>,
    /// `None`: every frame is kept (a program whose first instruction returns non-zero).
    filter: Option<bpf::Program>,
    /// Who asked for it (for "already captured by" messages).
    owner_pid: u32,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Session({}, {} rings, pid {})",
            self.id,
            self.rings.len(),
            self.owner_pid
        )
    }
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl Session {
    /// A capture of the queues `rings`, each ring `ring_bytes` long, keeping `snaplen` bytes of
    /// each frame `filter` accepts; for the capture tool of process `owner_pid`. Returns the
    /// session and the file to hand to the tool: a memfd sealed against shrinking and
    /// growing, so the tool can never make the app's stores fault.
    ///
    /// # Errors
    /// Out-of-range sizes, or the memfd could not be made.
    pub fn new(
        rings: Vec<RingId>,
        ring_bytes: u64,
        snaplen: u32,
        filter: bpf::Program,
        owner_pid: u32,
    ) -> Result<(Arc<Self>, File), String> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let layout = Layout::new(rings.len() as u32, ring_bytes, snaplen)?;
        let fd = memfd_create(
            c"pmd-capture",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|e| format!("memfd_create: {e}"))?;
        let file = File::from(fd);
        file.set_len(layout.file_bytes() as u64).map_err(|e| {
            format!(
                "sizing the capture memory ({} bytes): {e}",
                layout.file_bytes()
            )
        })?;
        fcntl(
            &file,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(|e| format!("sealing the capture memory: {e}"))?;
        let mem = DevMem::map_file(&file, layout.file_bytes())
            .map_err(|e| format!("mapping the capture memory: {e}"))?;
        layout.init(&mem, &rings);
        let keeps_all = filter
            .insns()
            .first()
            .is_some_and(|i| i.code == bpf::code::RET | bpf::code::K && i.k != 0);
        let s = Arc::new(Self {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            mem,
            layout,
            rings,
            filter: (!keeps_all).then_some(filter),
            owner_pid,
        });
        Ok((s, file))
    }

    /// The rings, in file order.
    pub fn rings(&self) -> &[RingId] {
        &self.rings
    }

    /// The file's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The process that asked for the capture.
    pub fn owner_pid(&self) -> u32 {
        self.owner_pid
    }

    /// Each ring's counters as its writer published them.
    pub fn counters(&self) -> Vec<(RingId, ring::RingCounters)> {
        (0..self.rings.len())
            .map(|i| {
                let r = ring::RingReader::new(&self.mem, &self.layout, i);
                (self.rings[i], r.counters(&self.mem))
            })
            .collect()
    }
}

/// A port's capture switch, shared by the port and its queue handles.
#[derive(Debug, Default)]
pub struct Tap {
    /// The attached session's id, 0 when none.
    gen: AtomicU64,
    slot: Mutex<Option<Arc<Session>>>,
}

impl Tap {
    /// A switch with no capture on.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Turns `session` on for this port.
    ///
    /// # Errors
    /// The session already capturing the port.
    pub fn attach(&self, session: &Arc<Session>) -> Result<(), Arc<Session>> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*slot {
            return Err(Arc::clone(s));
        }
        *slot = Some(Arc::clone(session));
        self.gen.store(session.id, Ordering::Release);
        Ok(())
    }

    /// Turns `session` off for this port (nothing when another one is on). The queue handles
    /// let go of it at their next burst.
    pub fn detach(&self, session: &Session) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|s| s.id == session.id) {
            *slot = None;
            self.gen.store(0, Ordering::Release);
        }
    }

    fn current(&self, gen: u64) -> Option<Arc<Session>> {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().filter(|s| s.id == gen).cloned()
    }
}

/// Most frames one TX burst mirrors (the rest count as dropped by the capture).
const MAX_TX_MIRROR: usize = 1024;

/// What a queue handle holds while a capture of its queue is on.
struct Active {
    session: Arc<Session>,
    w: RingWriter,
    /// A chained frame, made contiguous for the filter.
    scratch: Vec<u8>,
    /// TX: the write position after each frame of the burst and what became of it.
    pending: Vec<(u64, Outcome)>,
    /// TX: the position before the burst.
    start: u64,
}

/// A queue handle's side of capture (see the module docs).
pub struct Mirror {
    tap: Arc<Tap>,
    /// The session id this handle last acted on (0: none).
    gen: u64,
    id: RingId,
    active: Option<Active>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mirror({:?}, gen {})", self.id, self.gen)
    }
}

impl Mirror {
    /// The mirror of queue `queue` of the port whose switch is `tap`, for frames going `dir`.
    pub fn new(tap: Arc<Tap>, port: u16, queue: u16, dir: Direction) -> Self {
        Self {
            tap,
            gen: 0,
            id: RingId { port, queue, dir },
            active: None,
        }
    }

    /// Whether the burst must call the mirror: a capture is on, or one just ended. One
    /// relaxed load.
    #[inline(always)]
    pub fn on(&self) -> bool {
        (self.tap.gen.load(Ordering::Relaxed) | self.gen) != 0
    }

    /// Catches up with the switch: takes this queue's ring of a new session, or lets go.
    fn refresh(&mut self) {
        let g = self.tap.gen.load(Ordering::Acquire);
        if g == self.gen {
            return;
        }
        self.gen = g;
        self.active = None;
        if g == 0 {
            return;
        }
        let Some(session) = self.tap.current(g) else {
            return;
        };
        let Some(ring) = session.rings.iter().position(|r| *r == self.id) else {
            return;
        };
        let w = RingWriter::new(&session.mem, &session.layout, ring);
        let snap = session.layout.snaplen as usize;
        let tx = self.id.dir == Direction::Tx;
        self.active = Some(Active {
            session,
            w,
            scratch: Vec::with_capacity(snap),
            pending: Vec::with_capacity(if tx { MAX_TX_MIRROR } else { 0 }),
            start: 0,
        });
    }

    /// Mirrors frames the driver just delivered.
    #[cold]
    #[inline(never)]
    pub fn rx(&mut self, frames: &[Mbuf]) {
        self.refresh();
        let Some(a) = &mut self.active else { return };
        let ts = now_ns();
        let (mut filtered, mut dropped) = (0, 0);
        for m in frames {
            match a.offer(m, ts) {
                Outcome::Written => {}
                Outcome::Filtered => filtered += 1,
                Outcome::Dropped => dropped += 1,
            }
        }
        let mem = &a.session.mem;
        a.w.publish(mem);
        a.w.count(mem, frames.len() as u64, filtered, dropped);
    }

    /// Writes (unpublished) the frames about to be sent; [`Self::tx_after`] publishes those
    /// the driver took.
    #[cold]
    #[inline(never)]
    pub fn tx_before(&mut self, frames: &[Mbuf]) {
        self.refresh();
        let Some(a) = &mut self.active else { return };
        let ts = now_ns();
        a.pending.clear();
        a.start = a.w.position();
        for m in frames.iter().take(MAX_TX_MIRROR) {
            let o = a.offer(m, ts);
            a.pending.push((a.w.position(), o));
        }
    }

    /// Publishes the first `sent` frames [`Self::tx_before`] wrote, forgets the others.
    #[cold]
    #[inline(never)]
    pub fn tx_after(&mut self, sent: usize) {
        let Some(a) = &mut self.active else { return };
        let mem = &a.session.mem;
        let kept = sent.min(a.pending.len());
        let end = if kept == 0 {
            a.start
        } else {
            a.pending[kept - 1].0
        };
        a.w.publish_to(mem, end);
        let (mut filtered, mut dropped) = (0, (sent - kept) as u64);
        for (_, o) in &a.pending[..kept] {
            match o {
                Outcome::Written => {}
                Outcome::Filtered => filtered += 1,
                Outcome::Dropped => dropped += 1,
            }
        }
        a.pending.clear();
        a.w.count(mem, sent as u64, filtered, dropped);
    }
}

impl Active {
    /// Filters one frame and writes what the filter keeps.
    fn offer(&mut self, m: &Mbuf, ts: u64) -> Outcome {
        let wire = m.pkt_len();
        let snap = self.w.caplen(wire) as usize;
        let mem = &self.session.mem;
        if m.nb_segs() <= 1 {
            let d = m.data();
            let keep = self
                .session
                .filter
                .as_ref()
                .map_or(u32::MAX, |f| f.run(d, wire));
            if keep == 0 {
                return Outcome::Filtered;
            }
            let n = snap.min(keep as usize).min(d.len());
            return self.w.write(mem, &[&d[..n]], wire, ts);
        }
        self.scratch.clear();
        for seg in m.segments() {
            let room = snap - self.scratch.len();
            if room == 0 {
                break;
            }
            self.scratch.extend_from_slice(&seg[..seg.len().min(room)]);
        }
        let keep = self
            .session
            .filter
            .as_ref()
            .map_or(u32::MAX, |f| f.run(&self.scratch, wire));
        if keep == 0 {
            return Outcome::Filtered;
        }
        let n = self.scratch.len().min(keep as usize);
        self.w.write(mem, &[&self.scratch[..n]], wire, ts)
    }
}

/// Nanoseconds since the Unix epoch (a pcapng timestamp).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
