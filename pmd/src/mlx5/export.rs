//! mlx5 queue pairs that another process polls ([`crate::ethdev::export`]): the primary's
//! port creates them with their rings, CQs and doorbell records in shared files, and
//! describes them; the secondary maps those files and builds its own [`RxQueue`] and
//! [`TxQueue`] over them, as DPDK's net/mlx5 secondaries use the queues their primary
//! created (drivers/net/mlx5/mlx5_txq.c `txq_uar_init_secondary`, `mlx5_tx_uar_init_secondary`).
//!
//! Where each part lives:
//! * Rings, CQs and doorbell records: from the context's queue-buffer allocators, which
//!   libmlx5 also asks for the doorbell-record pages (rdma-core v44 providers/mlx5
//!   `dbrec.c:50–85`, `__add_page` through `mlx5_alloc_buf_extern`); with a shared-file
//!   allocator they are in files `DIR/TAG.N`, a record at its offset in its page.
//! * The send doorbell register: rdma-core's is in a UAR page the context mapped from its
//!   command descriptor at `uar_mmap_offset` (`mlx5dv_init_obj` with
//!   `MLX5DV_QP_MASK_UAR_MMAP_OFFSET`); the secondary maps that page from the descriptor the
//!   primary passed, and writes the register at the same offset in the page, as
//!   net/mlx5's secondaries do. A device model's register is in a shared file.
//!
//! What a secondary cannot do: move the queues through RESET for error recovery (the QP
//! and WQ are the primary's verbs objects); an error CQE leaves the queue down, counted and
//! logged, until the primary rebuilds the pair. Striding RQs are not exported (their
//! buffers are registered by the primary's port, not a shared pool).
#![deny(unsafe_code)]

use super::provider::{QueueState, RawCq, RawRq, RawSq, SetupError};
use super::{RxQueue, RxXstats, TxQueue, TxXstats};
use crate::ethdev::export::Area;
use crate::ethdev::{Counters, PortConfig, QueueExport};
use crate::hw::mlx5::{CQE_BYTES, WQEBB_BYTES};
use crate::sys::{DevMem, Mmio};
use mempool::{ChunkKeys, MbufPool};
use std::sync::Arc;

/// The driver name in a description.
const DRIVER: &str = "mlx5";
/// Bytes of a doorbell record (the RQ or SQ counter, or a CQ's `SET_CI` and arm words).
const DBREC_BYTES: usize = 8;
/// Bytes of the UAR doorbell write.
const UAR_WRITE_BYTES: usize = 8;
/// The description value: where the send doorbell register is in the device's command
/// descriptor (the UAR page's `uar_mmap_offset` plus the register's offset in the page).
const TX_UAR_DEVICE: &str = "tx_uar_device_offset";

fn area(role: &str, mem: &DevMem) -> Result<Area, String> {
    crate::ethdev::export::area(role, mem.shared_location(), mem.len())
}

/// The description of exported pair `queue` of port `port`, whose raw queues are `rx`
/// and `tx`.
///
/// # Errors
/// A ring, CQ or record not in a shared file, a register that is neither in one nor in
/// the device's command descriptor, a striding RQ, or a device that needs the polling
/// thread (a device model running inline).
pub(crate) fn describe(
    (port, queue): (u16, u16),
    (rx, tx): (&RawRq, &RawSq),
    cfg: &PortConfig,
    pool: &MbufPool,
    keys: &ChunkKeys,
    mac: crate::net::MacAddr,
) -> Result<QueueExport, String> {
    if rx.kick.is_some() || tx.kick.is_some() {
        return Err(crate::ethdev::export::NEEDS_ENGINE_THREAD.into());
    }
    if rx.mprq.is_some() {
        return Err(
            "striding RQs are not exported (their buffers are the primary port's): \
                    use mprq=0 on a port with exported queue pairs"
                .into(),
        );
    }
    for (role, rec) in [
        ("tx", &tx.dbrec),
        ("tx cq", &tx.cq.dbrec),
        ("rx", &rx.dbrec),
        ("rx cq", &rx.cq.dbrec),
    ] {
        if rec.shared_location().is_none() {
            return Err(format!(
                "its {role} doorbell record is not in a shared file: libmlx5 places records in \
                 the pages it already has, and a queue of an earlier configuration still holds \
                 one (drop the port's queue handles before configuring it with exports)"
            ));
        }
    }
    let mut areas = vec![
        area("tx_sq", &tx.buf)?,
        area("tx_dbrec", &tx.dbrec)?,
        area("tx_cq", &tx.cq.buf)?,
        area("tx_cq_dbrec", &tx.cq.dbrec)?,
        area("rx_rq", &rx.buf)?,
        area("rx_dbrec", &rx.dbrec)?,
        area("rx_cq", &rx.cq.buf)?,
        area("rx_cq_dbrec", &rx.cq.dbrec)?,
    ];
    let mut values = vec![
        ("tx_wqe_cnt".to_string(), u64::from(tx.wqe_cnt)),
        ("tx_sqn".into(), u64::from(tx.sqn)),
        ("tx_bf_size".into(), u64::from(tx.bf_size)),
        ("tx_min_inline".into(), u64::from(tx.min_inline)),
        ("tx_cqe_cnt".into(), u64::from(tx.cq.cqe_cnt)),
        ("tx_cqn".into(), u64::from(tx.cq.cqn)),
        ("rx_wqe_cnt".into(), u64::from(rx.wqe_cnt)),
        ("rx_stride".into(), u64::from(rx.stride)),
        ("rx_rqn".into(), u64::from(rx.rqn)),
        ("rx_cqe_cnt".into(), u64::from(rx.cq.cqe_cnt)),
        ("rx_cqn".into(), u64::from(rx.cq.cqn)),
        ("rx_cqe_compression".into(), u64::from(rx.cqe_compression)),
        ("mac".into(), crate::ethdev::export::mac_value(mac)),
    ];
    match tx.bf_reg.location() {
        (Some(at), _) => areas.push(crate::ethdev::export::area(
            "tx_uar",
            Some(at),
            tx.bf_reg.len(),
        )?),
        (None, Some(off)) => values.push((TX_UAR_DEVICE.into(), off)),
        (None, None) => {
            return Err(
                "its UAR register is neither in a shared file nor a page of the \
                        device's command descriptor"
                    .into(),
            )
        }
    }
    Ok(QueueExport {
        driver: DRIVER.into(),
        port,
        queue,
        pid: std::process::id(),
        rx_ring_size: cfg.rx_ring_size,
        tx_ring_size: cfg.tx_ring_size,
        rx_offloads: u64::from(cfg.rx_offloads.bits()),
        pool: pool.name().to_string(),
        keys: keys.keys().iter().map(|k| k.0).collect(),
        areas,
        values,
    })
}

/// Maps one of the description's areas, checking its length against `need` bytes and its
/// alignment against `align`.
fn map(e: &QueueExport, role: &str, need: usize, align: usize) -> Result<Arc<DevMem>, String> {
    let a = e.area(role)?;
    if a.len < need || !a.offset.is_multiple_of(align as u64) {
        return Err(format!(
            "{role} of {} bytes at offset {} does not hold {need} bytes aligned to {align}",
            a.len, a.offset
        ));
    }
    DevMem::shared_file_range(&a.path, a.offset, a.len)
        .map(Arc::new)
        .map_err(|err| format!("{role} at {}: {err}", a.path.display()))
}

fn u32_value(e: &QueueExport, name: &str) -> Result<u32, String> {
    u32::try_from(e.value(name)?).map_err(|_| format!("{name} is out of range"))
}

/// A count of ring entries: a power of two from `min` to 2^22 (rdma-core's largest CQ, and
/// more than any WQ).
fn count(e: &QueueExport, name: &str, min: u32) -> Result<u32, String> {
    let n = u32_value(e, name)?;
    if !n.is_power_of_two() || !(min..=1 << 22).contains(&n) {
        return Err(format!("{name} {n}: not a power of two from {min} to 2^22"));
    }
    Ok(n)
}

/// Whether page `pgoff` of an mlx5 uverbs file is one a UAR can be mapped from (kernel
/// `mlx5_ib_mmap`): a legacy UAR page (command `MLX5_IB_MMAP_WC_PAGE` 0,
/// `MLX5_IB_MMAP_REGULAR_PAGE` 1 or `MLX5_IB_MMAP_NC_PAGE` 3 in bits 8–15, below the entry
/// range), or an mmap entry (pages `MLX5_IB_MMAP_OFFSET_START << 16` (9) up to
/// `MLX5_IB_MMAP_OFFSET_END` (255) `<< 16`, where dynamic UARs are; the kernel maps only
/// the entries of this context). Other commands (the core clock, contiguous pages) are
/// refused before anything is mapped: a description is another process's word.
fn is_uar_page(pgoff: u64) -> bool {
    const ENTRIES: std::ops::Range<u64> = (9 << 16)..(256 << 16);
    ENTRIES.contains(&pgoff) || (pgoff < 9 << 16 && matches!((pgoff >> 8) & 0xff, 0 | 1 | 3))
}

/// The state machine of a queue this process polls but another created: its QP and WQ are
/// the primary's verbs objects (or its device model's), so a RESET for error recovery
/// cannot be done here. The queue stays down, counted, until the primary rebuilds the pair.
#[derive(Debug)]
struct PrimarysQueue;

impl QueueState for PrimarysQueue {
    fn reset(&self) -> Result<(), SetupError> {
        Err(SetupError::Unsupported {
            what: "error recovery of an exported queue in the process polling it",
            why: "the queue's QP and WQ belong to the primary process; its port must rebuild \
                  the pair (Port::rebuild_queues)"
                .into(),
        })
    }
    fn ready(&self) -> Result<(), SetupError> {
        self.reset()
    }
}

/// The queues of an exported pair, built in this process over the primary's rings: the RX
/// queue posted full from `pool` (the primary's shared pool), the TX queue empty. Counters
/// are this process's. `device` is the primary's command descriptor, from which an
/// rdma-core pair's UAR page is mapped.
///
/// What the queues leave behind when dropped (posted buffers, frames in flight) goes to
/// `parked`: the device, served from the primary, may still write into or read them until
/// the primary destroys the queues, so the caller frees them only once it knows that
/// happened. `claim` runs once everything is checked and mapped, just before the first
/// write into the rings: an error there leaves the rings untouched.
///
/// # Errors
/// What is wrong with the description (another driver's, a pool other than `pool`, a
/// missing or short file, sizes the rings cannot have), `claim`'s error, or the pool ran dry
/// while posting.
pub fn import(
    e: &QueueExport,
    device: Option<std::os::fd::BorrowedFd<'_>>,
    pool: &Arc<MbufPool>,
    rx_counters: Arc<Counters>,
    tx_counters: Arc<Counters>,
    parked: Arc<crate::ethdev::Parked>,
    claim: impl FnOnce() -> Result<(), String>,
) -> Result<(RxQueue, TxQueue), String> {
    let (keys, rx_offloads) = e.check_common(DRIVER, pool, super::driver::MIN_DESC)?;

    let (rx_ring, tx_ring) = (u32::from(e.rx_ring_size), u32::from(e.tx_ring_size));
    let tx_wqe_cnt = count(e, "tx_wqe_cnt", tx_ring)?;
    let tx_cqe_cnt = count(e, "tx_cqe_cnt", 1)?;
    let rx_wqe_cnt = count(e, "rx_wqe_cnt", rx_ring)?;
    let rx_cqe_cnt = count(e, "rx_cqe_cnt", rx_ring)?;
    let stride = u32_value(e, "rx_stride")?;
    if !stride.is_power_of_two() || !(16..=256).contains(&stride) {
        return Err(format!(
            "rx_stride {stride}: not a power of two from 16 to 256"
        ));
    }
    let bf_size = u32_value(e, "tx_bf_size")?;
    // 0 (ConnectX-5 and later) or the L2 header (ConnectX-4), spec §1.9.
    let min_inline = u16::try_from(e.value("tx_min_inline")?)
        .ok()
        .filter(|&n| n == 0 || n == 18)
        .ok_or("tx_min_inline is neither 0 nor 18")?;
    let rx_cqe_compression = match e.value("rx_cqe_compression")? {
        0 => false,
        1 => true,
        v => return Err(format!("rx_cqe_compression {v}")),
    };

    // A ring is a power of two of bytes: exactly what the entries need.
    let sq = map(e, "tx_sq", tx_wqe_cnt as usize * WQEBB_BYTES, 4096)?;
    let tx_cq = map(e, "tx_cq", tx_cqe_cnt as usize * CQE_BYTES, 4096)?;
    let rq = map(e, "rx_rq", rx_wqe_cnt as usize * stride as usize, 4096)?;
    let rx_cq = map(e, "rx_cq", rx_cqe_cnt as usize * CQE_BYTES, 4096)?;
    let exact = |role: &str, m: Arc<DevMem>, n: usize| -> Result<Arc<DevMem>, String> {
        if m.len() == n {
            return Ok(m);
        }
        DevMem::within(&m, 0, n)
            .map(Arc::new)
            .ok_or_else(|| format!("{role} shorter than {n} bytes"))
    };
    let sq = exact("tx_sq", sq, tx_wqe_cnt as usize * WQEBB_BYTES)?;
    let rq = exact("rx_rq", rq, rx_wqe_cnt as usize * stride as usize)?;
    let dbrec = |role: &str| map(e, role, DBREC_BYTES, DBREC_BYTES);
    let (tx_dbrec, tx_cq_dbrec) = (dbrec("tx_dbrec")?, dbrec("tx_cq_dbrec")?);
    let (rx_dbrec, rx_cq_dbrec) = (dbrec("rx_dbrec")?, dbrec("rx_cq_dbrec")?);
    let uar = match e.value(TX_UAR_DEVICE) {
        Ok(off) => {
            let fd = device.ok_or(
                "its doorbell register is in the device's UAR page: pass the primary's device \
                 descriptor (pmd::mp::Secondary::device, which the primary publishes with \
                 Primary::publish_device)",
            )?;
            if !off.is_multiple_of(UAR_WRITE_BYTES as u64) {
                return Err(format!("the UAR register at offset {off} is not aligned"));
            }
            if !is_uar_page(off / crate::sys::page_size() as u64) {
                return Err(format!(
                    "the UAR register at offset {off}: not a UAR page of the device (a \
                     regular, write-combining or non-cached UAR, or an mmap entry)"
                ));
            }
            Arc::new(DevMem::map_device_range(
                fd,
                off,
                UAR_WRITE_BYTES,
                false,
                "the UAR register",
            )?)
        }
        Err(_) => map(e, "tx_uar", UAR_WRITE_BYTES, UAR_WRITE_BYTES)?,
    };

    let owner: crate::ethdev::QueueOwner = Arc::new(());
    let state: Arc<dyn QueueState> = Arc::new(PrimarysQueue);
    let raw_tx = RawSq {
        buf: sq,
        wqe_cnt: tx_wqe_cnt,
        sqn: u32_value(e, "tx_sqn")?,
        dbrec: tx_dbrec,
        bf_reg: Mmio::new(uar),
        bf_size,
        min_inline,
        cq: RawCq {
            buf: tx_cq,
            cqe_cnt: tx_cqe_cnt,
            dbrec: tx_cq_dbrec,
            cqn: u32_value(e, "tx_cqn")?,
        },
        owner: Arc::clone(&owner),
        parked: Arc::clone(&parked),
        state: Arc::clone(&state),
        kick: None,
    };
    let raw_rx = RawRq {
        buf: rq,
        wqe_cnt: rx_wqe_cnt,
        stride,
        rqn: u32_value(e, "rx_rqn")?,
        dbrec: rx_dbrec,
        cq: RawCq {
            buf: rx_cq,
            cqe_cnt: rx_cqe_cnt,
            dbrec: rx_cq_dbrec,
            cqn: u32_value(e, "rx_cqn")?,
        },
        mprq: None,
        cqe_compression: rx_cqe_compression,
        owner,
        parked,
        state,
        kick: None,
    };
    let cfg = PortConfig {
        rx_ring_size: e.rx_ring_size,
        tx_ring_size: e.tx_ring_size,
        rx_offloads,
        ..PortConfig::default()
    };
    // The RX queue writes its ring as it is made.
    claim()?;
    let mut rx = RxQueue::new(
        raw_rx,
        &cfg,
        e.port,
        Arc::clone(pool),
        keys.clone(),
        rx_counters,
        Arc::new(RxXstats::default()),
    );
    rx.fill().map_err(|missing| {
        format!(
            "pool '{}' ran dry posting the rx ring: {missing} of {} buffers missing",
            pool.name(),
            e.rx_ring_size
        )
    })?;
    let tx = TxQueue::new(
        raw_tx,
        e.tx_ring_size,
        Arc::clone(pool),
        keys,
        tx_counters,
        Arc::new(TxXstats::default()),
    );
    Ok((rx, tx))
}
