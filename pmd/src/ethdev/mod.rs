//! The contract between applications and drivers: what every driver implements and every
//! port exposes. It names no driver and no provider.
//!
//! * Slow path: [`PortDriver`], object-safe and called rarely (configure, start, stop, link,
//!   stats). Errors are [`PortError`].
//! * Fast path: [`RxBurst`] / [`TxBurst`], one per queue, owned by one polling core (`Send`,
//!   not `Sync`). The port layer makes one indirect call per burst, as DPDK's
//!   `rte_eth_fp_ops` does; nothing is dispatched per packet.
//! * Plain data: [`Burst`], [`PortConfig`], [`Caps`], [`Link`], [`Stats`], per-queue
//!   [`Counters`].
//! * Events: [`PortEvent`]s behind one pollable descriptor per port ([`events`]).
//! * [`DeviceKick`]: a software device's work for a queue, done on the thread that polls it
//!   ([`kick`]); `None` on hardware.
#![deny(unsafe_code)]

pub mod burst;
pub mod config;
pub mod counters;
pub mod events;
pub mod export;
pub mod kick;
pub mod setup;
pub mod xstat;

pub use burst::Burst;
pub use config::{
    cap_mtu, max_frame_bytes, Caps, Link, PortConfig, QueueStats, RssConfig, RssFields, RxOffloads,
    Stats, TxOffloads, L2_OVERHEAD,
};
pub use counters::Counters;
pub use events::{PortEvent, QueueFault, QueueRef};
pub use export::{ExportConfig, QueueExport};
pub use kick::{DeviceKick, Kick};
pub use setup::SetupError;
pub use xstat::{DeviceDrops, Loss, Xstat};

use crate::net::MacAddr;
use mempool::MbufPool;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Errors of the port slow path. New kinds may come: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// No device matches the spec.
    #[error("{spec}: {why}")]
    NoDevice {
        /// The spec as given.
        spec: String,
        /// What was looked for and what to do.
        why: String,
    },
    /// The port belongs to someone else (on MANA: the kernel netdev is up).
    #[error("{spec}: port is busy: {holder} holds it; {hint}")]
    Busy {
        /// The spec.
        spec: String,
        /// Who holds it (e.g. "netdev eth1").
        holder: String,
        /// What to do about it.
        hint: String,
    },
    /// Another process of ours has the port open (it holds the port's lock file).
    #[error(
        "{spec}: port is in use by {}, which holds {}: stop it first, or pick another port",
        holder_text(*.pid),
        .lock.display()
    )]
    InUse {
        /// The spec.
        spec: String,
        /// The holder's pid, when it has written it.
        pid: Option<u32>,
        /// The lock file.
        lock: std::path::PathBuf,
    },
    /// A configuration value outside what the device can do.
    #[error("{what}: {requested} requested, the port allows {allowed}")]
    BadConfig {
        /// Which setting.
        what: &'static str,
        /// What was asked.
        requested: String,
        /// What is possible.
        allowed: String,
    },
    /// An operation not allowed in the port's state.
    #[error("cannot {op} a port that is {state:?}")]
    State {
        /// The operation.
        op: &'static str,
        /// The port's state.
        state: PortState,
    },
    /// A queue index past the configured count.
    #[error("{dir} queue {queue} does not exist: the port has {count} {dir} queue(s)")]
    NoSuchQueue {
        /// "rx" or "tx".
        dir: &'static str,
        /// Asked for.
        queue: u16,
        /// Configured.
        count: u16,
    },
    /// The handle of this queue was already taken.
    #[error("{dir} queue {queue} was already taken (each queue has one owner)")]
    QueueTaken {
        /// "rx" or "tx".
        dir: &'static str,
        /// The queue.
        queue: u16,
    },
    /// A driver's device setup step failed.
    #[error("{what}: {source}")]
    Setup {
        /// The step.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The link did not come up in time.
    #[error("{spec}: link still down after {waited:?}: {hint}")]
    LinkDown {
        /// The port.
        spec: String,
        /// How long we waited.
        waited: std::time::Duration,
        /// What to check.
        hint: String,
    },
}

fn holder_text(pid: Option<u32>) -> String {
    match pid {
        Some(p) if p == std::process::id() => format!("pid {p} (this process: opened twice)"),
        Some(p) => format!("process pid {p}"),
        None => "another process (pid not written yet)".into(),
    }
}

/// Where a port is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Opened, not configured.
    Opened,
    /// Configured (or stopped): queue handles exist, bursts return 0.
    Configured,
    /// Started: bursts move packets.
    Started,
    /// Its device failed or went away; the port waits for it to come back and rebuilds its
    /// queues (see `port`'s module docs). Bursts return 0.
    Recovering,
    /// Its device did not come back in time: bursts return 0 for good; close the port.
    Failed,
}

/// The receive half of one queue, as a driver implements it. Owned by one polling core.
pub trait RxBurst: Send {
    /// Receives up to `out.spare()` packets into `out` and returns how many arrived; 0 means
    /// nothing is waiting. Never allocates, locks or logs; errors go to the queue's counters.
    fn rx_burst(&mut self, out: &mut Burst) -> usize;
}

/// The transmit half of one queue, as a driver implements it. Owned by one polling core.
pub trait TxBurst: Send {
    /// Hands packets from the front of `pkts` to the device and returns how many it took;
    /// those leave `pkts`, the rest stay, in order. Also reclaims completed packets.
    fn tx_burst(&mut self, pkts: &mut Burst) -> usize;
}

/// The queues a driver builds for one configuration, in queue order.
pub struct Queues {
    /// RX queues, `cfg.rx_queues` of them.
    pub rx: Vec<Box<dyn RxBurst>>,
    /// TX queues, `cfg.tx_queues` of them.
    pub tx: Vec<Box<dyn TxBurst>>,
}

/// What every queue of one configuration shares with the port.
#[derive(Debug)]
pub struct QueueSetup {
    /// The port id mbufs are stamped with.
    pub port_id: u16,
    /// One counter set per RX queue (written by the queue's core, read by the port).
    pub rx_counters: Vec<Arc<Counters>>,
    /// One counter set per TX queue.
    pub tx_counters: Vec<Arc<Counters>>,
}

impl QueueSetup {
    /// The queues of a rebuilt configuration (a port recovering from a device reset) that go
    /// on counting where the previous ones stopped: the same counter sets.
    pub fn continuing(port_id: u16, rx: &[Arc<Counters>], tx: &[Arc<Counters>]) -> Self {
        Self {
            port_id,
            rx_counters: rx.to_vec(),
            tx_counters: tx.to_vec(),
        }
    }

    /// Fresh counters for `rx` RX and `tx` TX queues of port `port_id`.
    pub fn new(port_id: u16, rx: u16, tx: u16) -> Self {
        let fresh = |n: u16| (0..n).map(|_| Arc::new(Counters::default())).collect();
        Self {
            port_id,
            rx_counters: fresh(rx),
            tx_counters: fresh(tx),
        }
    }
}

/// The driver side of a port's slow path. Object-safe; called rarely, never from a polling
/// core's burst loop.
pub trait PortDriver: Send {
    /// What the device can do.
    fn caps(&self) -> Caps;
    /// The port's MAC address.
    fn mac(&self) -> MacAddr;
    /// Link state.
    fn link(&self) -> Link;
    /// Builds the queues for `cfg` (already checked against [`PortDriver::caps`]).
    ///
    /// # Errors
    /// Device set-up failures, as [`PortError`].
    fn configure(
        &mut self,
        cfg: &PortConfig,
        pool: &Arc<MbufPool>,
        q: &QueueSetup,
    ) -> Result<Queues, PortError>;
    /// Starts the datapath.
    ///
    /// # Errors
    /// The device refused.
    fn start(&mut self) -> Result<(), PortError> {
        Ok(())
    }
    /// Stops the datapath.
    fn stop(&mut self) {}
    /// Driver- and device-specific counters, each with what it says about lost frames.
    fn xstats(&self) -> Vec<Xstat> {
        Vec::new()
    }
    /// Frames the device dropped for lack of posted RX buffers.
    fn imissed(&self) -> u64 {
        0
    }
    /// A descriptor that becomes readable when [`PortDriver::take_events`] has something
    /// (level-triggered, non-blocking; see [`events`]). `None`: the driver reports no events.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }
    /// Appends the events that happened since the last call, oldest first, and clears the
    /// descriptor. Cheap when there are none (no allocation); never blocks.
    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        let _ = out;
    }
    /// The queue pairs the last [`PortDriver::configure`] exported ([`PortConfig::export`]),
    /// described for the process that will poll them. A driver that cannot export returns
    /// none (and the port refuses the configuration).
    fn exports(&self) -> Vec<QueueExport> {
        Vec::new()
    }
    /// The device's command descriptor, which a process polling an exported queue pair
    /// needs to map the doorbell page (a MANA context's `cmd_fd`; `pmd::mp` passes it with
    /// `SCM_RIGHTS`, as DPDK's net/mana primaries do). `None`: the exported rings need no
    /// descriptor (the device model's doorbell pages are in the shared files).
    fn device_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// An exported queue's place in the primary's queue list: never handed out (the port refuses
/// to), and a burst on it does nothing.
#[derive(Debug, Default)]
pub struct Exported;

impl RxBurst for Exported {
    fn rx_burst(&mut self, _out: &mut Burst) -> usize {
        0
    }
}

impl TxBurst for Exported {
    fn tx_burst(&mut self, _pkts: &mut Burst) -> usize {
        0
    }
}

/// The pool a driver registered with its device, and the keys of its chunks: registration
/// happens once per pool (at the first configure with it), whatever the driver.
#[derive(Debug, Default)]
pub struct PoolRegistration(Option<(std::sync::Arc<MbufPool>, mempool::ChunkKeys)>);

impl PoolRegistration {
    /// The keys of `pool`'s chunks, registering each chunk with `reg` the first time.
    ///
    /// # Errors
    /// [`PortError::Setup`] naming the registration that failed.
    pub fn keys_for<E>(
        &mut self,
        pool: &std::sync::Arc<MbufPool>,
        mut reg: impl FnMut(&mempool::ChunkInfo) -> Result<mempool::Registration, E>,
    ) -> Result<mempool::ChunkKeys, PortError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        if let Some((p, keys)) = &self.0 {
            if std::sync::Arc::ptr_eq(p, pool) {
                return Ok(keys.clone());
            }
        }
        let keys = pool
            .register_chunks(|chunk| reg(chunk).map_err(|e| Box::new(e) as mempool::BoxError))
            .map_err(|e| PortError::Setup {
                what: "registering the mbuf pool for DMA".into(),
                source: Box::new(e),
            })?;
        self.0 = Some((std::sync::Arc::clone(pool), keys.clone()));
        Ok(keys)
    }
}

/// The error of an RX queue that could not post all `ring` buffers at configure time
/// (`missing` of them) from `pool`.
pub fn rx_fill_error(pool: &MbufPool, ring: u16, missing: u32) -> PortError {
    PortError::BadConfig {
        what: "mbuf pool size",
        requested: pool.capacity().to_string(),
        allowed: format!("enough free mbufs to post {ring} rx buffers ({missing} missing)"),
    }
}

/// Finishes a received mbuf the way every driver does, from what its completion said: the
/// checksum flags `fl` the driver decoded, the RSS hash when the device hashed the packet, a
/// stripped VLAN tag (kept as metadata when the port strips, put back into the frame
/// otherwise), and the port.
#[inline]
pub fn finish_rx(
    m: &mut mempool::Mbuf,
    fl: mempool::OffloadFlags,
    hash: Option<u32>,
    vlan: Option<u16>,
    vlan_strip: bool,
    port: u16,
) {
    let (f, reinsert) = rx_fields(fl, hash, vlan, vlan_strip, port);
    if hash.is_some() {
        m.set_rss_hash(f.rss_hash);
    }
    if vlan.is_some() {
        m.set_vlan_tci(f.vlan_tci);
    }
    if reinsert {
        reinsert_vlan(m, f.vlan_tci);
    }
    m.set_ol_flags(f.ol_flags);
    m.set_port(port);
}

/// What [`finish_rx`] would write, as the fields a received buffer's header is written with
/// in one pass (`mempool::RxBufs::pop_received`), and whether the tag must then go back into
/// the frame ([`deliver_rx`] does it).
#[inline]
pub fn rx_fields(
    mut fl: mempool::OffloadFlags,
    hash: Option<u32>,
    vlan: Option<u16>,
    vlan_strip: bool,
    port: u16,
) -> (mempool::RxFields, bool) {
    use mempool::OffloadFlags;
    let mut f = mempool::RxFields {
        port,
        ..Default::default()
    };
    if let Some(h) = hash {
        fl.insert(OffloadFlags::RX_RSS_HASH);
        f.rss_hash = h;
    }
    let mut reinsert = false;
    if let Some(tci) = vlan {
        fl.insert(OffloadFlags::RX_VLAN);
        f.vlan_tci = tci;
        if vlan_strip {
            fl.insert(OffloadFlags::RX_VLAN_STRIPPED);
        } else {
            reinsert = true;
        }
    }
    f.ol_flags = fl;
    (f, reinsert)
}

/// Puts a stripped 802.1Q tag back into the frame (the device stripped it, the port did not
/// ask for VLAN stripping).
fn reinsert_vlan(m: &mut mempool::Mbuf, vid: u16) {
    if m.len() < 12 {
        return;
    }
    if m.prepend(4).is_ok() {
        let d = m.data_mut();
        d.copy_within(4..16, 0);
        d[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        d[14..16].copy_from_slice(&vid.to_be_bytes());
    }
}

/// The end of an RX delivery (`mempool::RxBufs::pop_received`'s result): a packet goes into
/// `out` (its stripped tag put back into the frame first when `reinsert` names one); a buffer
/// whose length did not fit is freed. The delivered packet's length, or `None` when it was
/// freed (the caller counts that, as an error of its kind).
#[inline]
pub fn deliver_rx(
    r: Result<mempool::Mbuf, mempool::Mbuf>,
    reinsert: Option<u16>,
    out: &mut Burst,
    pool: &std::sync::Arc<MbufPool>,
) -> Option<u32> {
    match r {
        Ok(mut m) => {
            if let Some(tci) = reinsert {
                reinsert_vlan(&mut m, tci);
            }
            let len = m.pkt_len();
            let _ = out.push(m);
            Some(len)
        }
        Err(m) => {
            free_one(pool, m);
            None
        }
    }
}

/// The rare cases of a run of `n` packets a driver appended to `out` from position `start`
/// with `mempool::RxBufs::pop_run`: `what(k)` says of the `k`-th whether its length exceeded
/// the data room (it is taken out and freed, and its length, cut to the room, taken off
/// `bytes`) and which stripped tag to put back into its frame (the tag's bytes added to
/// `bytes`). Returns how many were freed (the caller counts them, as an error of its kind).
#[cold]
#[inline(never)]
pub fn fix_rx_run(
    out: &mut Burst,
    start: usize,
    n: usize,
    mut what: impl FnMut(usize) -> (bool, Option<u16>),
    bytes: &mut u64,
) -> u64 {
    let mut freed = 0u64;
    let mut k = 0usize;
    // Order kept: the packets after one taken out move up.
    out.vec_mut().retain_mut(|m| {
        let i = k;
        k += 1;
        if i < start || i >= start + n {
            return true;
        }
        match what(i - start) {
            (true, _) => {
                // (Freed by its drop, through this core's cache.)
                *bytes -= u64::from(m.pkt_len());
                freed += 1;
                false
            }
            (false, Some(tci)) => {
                let before = m.pkt_len();
                reinsert_vlan(m, tci);
                *bytes += u64::from(m.pkt_len() - before);
                true
            }
            (false, None) => true,
        }
    });
    freed
}

/// The drivers' tests of a run with its rare cases: the packets of `PLAN` (length, VLAN tag
/// 0x0123 stripped; the second longer than any buffer) with hashes 100 + their index, received
/// on a port that keeps tags, must come out as the four that fit, in order, their tags put
/// back, and be counted as 4 packets of their bytes and 1 error.
#[cfg(test)]
pub(crate) mod rare_run {
    /// (length, VLAN stripped); `None` for the length over the buffer.
    pub const PLAN: [(Option<u32>, bool); 5] = [
        (Some(60), false),
        (None, false),
        (Some(61), true),
        (Some(62), false),
        (Some(63), true),
    ];

    /// Checks what the queue delivered (`out`) and counted (`st`).
    pub fn check(out: &super::Burst, st: super::QueueStats) {
        let got: Vec<(usize, u32, bool)> = out
            .iter()
            .map(|m| {
                (
                    m.len(),
                    m.rss_hash(),
                    m.data()[12..16] == [0x81, 0, 0x01, 0x23],
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (60, 100, false),
                (65, 102, true),
                (62, 103, false),
                (67, 104, true)
            ]
        );
        assert_eq!((st.packets, st.bytes, st.errors), (4, 60 + 65 + 62 + 67, 1));
    }
}

/// Frees `m` through this core's cache (the error paths of the datapaths).
pub fn free_one(pool: &std::sync::Arc<MbufPool>, m: mempool::Mbuf) {
    mempool::lcache::with_cache(pool, |cache| m.free_to(cache));
}

/// What keeps one queue's device objects alive (on hardware: QP or WQ, CQ, the context and
/// its doorbell mapping; on a model: the model's queue record). A queue handle holds it, so
/// a burst still in flight after `stop`, `configure` or `close` never touches a destroyed
/// queue or an unmapped doorbell page; the objects go when the last handle drops.
pub type QueueOwner = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// Where a queue leaves its buffers when it is dropped (an RX queue those it posted, a TX
/// queue its frames in flight), until the device can no longer write into or read them.
///
/// TX: a queue's SQ objects are shared by its handle and the provider in the same way, and
/// the device may still read a frame in flight until they are destroyed.
///
/// A queue handle may go before its device objects: the RX objects of a port (its RSS QP,
/// indirection table and WQs on MANA; its hashing QPs, rules and WQs on mlx5; a model's RQ
/// records) are shared by all its queues and the provider, and live until the last of them
/// goes. Until then the device may still write a received frame into any buffer a WQE names.
/// Freeing the buffers with the handle would hand them to the next allocation while the NIC
/// can still DMA into them. So a dropped queue parks them here; the provider keeps its own
/// handle on the same `Parked` in the object whose drop destroys the device objects, after
/// them, and the buffers go back to their pool when the last handle drops: once no device
/// object can name them.
#[derive(Default)]
pub struct Parked(std::sync::Mutex<Vec<Box<dyn Send>>>);

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Parked({} sets)", self.sets())
    }
}

impl Parked {
    /// A new, empty parking place to share between a provider and its queues.
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::default()
    }

    /// Keeps `bufs` until the last handle on this drops (a queue's drop path; takes a lock).
    pub fn park(&self, bufs: impl Send + 'static) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Box::new(bufs));
    }

    /// How many sets of buffers are parked.
    pub fn sets(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

/// Whether the environment asks for fork-safe memory registration, as libibverbs reads it
/// (rdma-core `util/util.c` `check_env`, called from `libibverbs/init.c`): `RDMAV_FORK_SAFE`
/// or `IBV_FORK_SAFE` set to anything but `0`.
pub fn fork_safe_from_env() -> bool {
    fork_safe_from(|k| std::env::var_os(k))
}

fn fork_safe_from(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    ["RDMAV_FORK_SAFE", "IBV_FORK_SAFE"]
        .iter()
        .any(|k| get(k).is_some_and(|v| v != "0"))
}

/// Checks `cfg` against `caps` and the pool (its size, and its data room against the MTU).
///
/// # Errors
/// [`PortError::BadConfig`] naming the first setting out of range.
pub fn check_config(cfg: &PortConfig, caps: &Caps, pool: &MbufPool) -> Result<(), PortError> {
    let range = |what, v: u16, lo: u16, hi: u16| {
        if v < lo || v > hi {
            Err(PortError::BadConfig {
                what,
                requested: v.to_string(),
                allowed: format!("{lo}..={hi}"),
            })
        } else {
            Ok(())
        }
    };
    range("rx queues", cfg.rx_queues, 1, caps.max_rx_queues)?;
    range("tx queues", cfg.tx_queues, 1, caps.max_tx_queues)?;
    range(
        "rx ring size",
        cfg.rx_ring_size,
        caps.min_ring_size,
        caps.max_ring_size,
    )?;
    range(
        "tx ring size",
        cfg.tx_ring_size,
        caps.min_ring_size,
        caps.max_ring_size,
    )?;
    range("mtu", cfg.mtu, caps.mtu_range.0, caps.mtu_range.1)?;
    // Every frame lands in one RX buffer (no scattered receive): the data room must hold the
    // longest frame of the MTU, or the device would cut or drop every long frame.
    let room = u32::from(pool.data_room());
    if max_frame_bytes(cfg.mtu) > room {
        return Err(PortError::BadConfig {
            what: "mtu",
            requested: cfg.mtu.to_string(),
            allowed: format!(
                "at most {} with the mbuf pool's {room}-byte data room (frames of up to MTU + \
                 {L2_OVERHEAD} bytes are received into one buffer): build the pool with a data \
                 room of at least {} bytes (MbufPoolConfig::data_room; the tools: --mtu)",
                room.saturating_sub(u32::from(L2_OVERHEAD)),
                max_frame_bytes(cfg.mtu)
            ),
        });
    }
    if caps.ring_size_pow2 {
        for (what, v) in [
            ("rx ring size", cfg.rx_ring_size),
            ("tx ring size", cfg.tx_ring_size),
        ] {
            if !v.is_power_of_two() {
                return Err(PortError::BadConfig {
                    what,
                    requested: v.to_string(),
                    allowed: "a power of two".into(),
                });
            }
        }
    }
    if cfg.promiscuous && !caps.promiscuous {
        return Err(PortError::BadConfig {
            what: "promiscuous mode",
            requested: "on".into(),
            allowed: "only frames for the port's own MAC, broadcast and multicast (the device \
                      has no promiscuous mode)"
                .into(),
        });
    }
    if !caps.rx_offloads.contains(cfg.rx_offloads) {
        return Err(PortError::BadConfig {
            what: "rx offloads",
            requested: format!("{:?}", cfg.rx_offloads),
            allowed: format!("{:?}", caps.rx_offloads),
        });
    }
    if !caps.tx_offloads.contains(cfg.tx_offloads) {
        return Err(PortError::BadConfig {
            what: "tx offloads",
            requested: format!("{:?}", cfg.tx_offloads),
            allowed: format!("{:?}", caps.tx_offloads),
        });
    }
    // Every RX descriptor holds a buffer; the pool must be able to fill all rings and leave
    // room for packets in flight.
    let need = u32::from(cfg.rx_queues) * u32::from(cfg.rx_ring_size);
    if pool.capacity() < need {
        return Err(PortError::BadConfig {
            what: "mbuf pool size",
            requested: pool.capacity().to_string(),
            allowed: format!(
                "at least {need} mbufs to fill {} rx ring(s) of {}",
                cfg.rx_queues, cfg.rx_ring_size
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod fork_env_tests {
    use super::fork_safe_from;

    #[test]
    fn zero_means_unset_as_in_libibverbs() {
        let with = |k: &'static str, v: &'static str| {
            fork_safe_from(move |name| (name == k).then(|| v.into()))
        };
        assert!(with("RDMAV_FORK_SAFE", "1"));
        assert!(with("IBV_FORK_SAFE", ""));
        assert!(!with("RDMAV_FORK_SAFE", "0"));
        assert!(!with("IBV_FORK_SAFE", "0"));
        assert!(!fork_safe_from(|_| None));
    }
}
