//! MANA queue pairs that another process polls ([`crate::ethdev::export`]): the primary's
//! port creates them, in shared files, and describes them; the secondary maps those files
//! and builds its own [`RxQueue`] and [`TxQueue`] over them, as DPDK's net/mana secondaries
//! poll the queues their primary created (drivers/net/mana/mp.c). The device serves them
//! through their memory alone. On the device model (its engine thread, in the primary)
//! rings, doorbell page and doorbell monitors are all in the files; over rdma-core the rings
//! are (the port's queue allocator is a shared-file one) and the doorbell page is page 0 of
//! the context's command descriptor, which the secondary gets from the primary
//! (`SCM_RIGHTS`) and maps, as net/mana's secondaries do.
#![deny(unsafe_code)]

use super::provider::{RawRxQueue, RawTxQueue};
use super::{RxQueue, TxQueue, Xstats};
use crate::ethdev::export::Area;
use crate::ethdev::{Counters, PortConfig, QueueExport};
use crate::hw::mana::{BU_BYTES, CQE_BYTES};
use crate::sys::DevMem;
use mempool::{ChunkKeys, MbufPool};
use std::sync::Arc;

/// The driver name in a description.
const DRIVER: &str = "mana";

fn area(role: &str, mem: &DevMem) -> Result<Area, String> {
    crate::ethdev::export::area(role, mem.shared_location(), mem.len())
}

/// The description of exported pair `queue` of port `port` (`at`), whose raw queues are
/// `rx` and `tx`.
///
/// # Errors
/// A ring that is not in a shared file, or a device that needs the polling thread (a device
/// model running inline).
pub(crate) fn describe(
    (port, queue): (u16, u16),
    (rx, tx): (&RawRxQueue, &RawTxQueue),
    cfg: &PortConfig,
    pool: &MbufPool,
    keys: &ChunkKeys,
    mac: crate::net::MacAddr,
) -> Result<QueueExport, String> {
    if rx.kick.is_some() || tx.kick.is_some() {
        return Err(crate::ethdev::export::NEEDS_ENGINE_THREAD.into());
    }
    let mut areas = vec![
        area("tx_sq", &tx.sq)?,
        area("tx_cq", &tx.cq)?,
        area("rx_rq", &rx.rq)?,
        area("rx_cq", &rx.cq)?,
    ];
    // The doorbell page: the device model's is in a shared file; rdma-core's is page 0 of
    // the context's command descriptor (`mana_alloc_context` maps it from there), which
    // the other process receives from the primary and maps itself, as DPDK net/mana's
    // secondaries do (drivers/net/mana/mana.c, `mana_map_doorbell_secondary`).
    let mut db_device = false;
    for (role, db) in [("tx_db", &tx.db_page), ("rx_db", &rx.db_page)] {
        if db.shared_path().is_some() {
            areas.push(area(role, db)?);
        } else {
            db_device = true;
        }
    }
    // Doorbell monitors (device models only): in shared files, or pages of the device's
    // command descriptor (the fake rdma-core's, at these offsets).
    let mut monitor_offsets = Vec::new();
    for (role, m) in [
        ("tx_db_monitor", &tx.db_monitor),
        ("rx_db_monitor", &rx.db_monitor),
    ] {
        let Some(m) = m else { continue };
        match m.device_offset() {
            Some(off) => monitor_offsets.push((format!("{role}_offset"), off)),
            None => areas.push(area(role, m)?),
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
        values: vec![
            ("tx_sq_id".into(), u64::from(tx.sq_id)),
            ("tx_cq_id".into(), u64::from(tx.cq_id)),
            ("tx_cq_count".into(), u64::from(tx.cq_count)),
            ("tx_vp_offset".into(), u64::from(tx.tx_vp_offset)),
            ("rx_rq_id".into(), u64::from(rx.rq_id)),
            ("rx_cq_id".into(), u64::from(rx.cq_id)),
            ("rx_cq_count".into(), u64::from(rx.cq_count)),
            ("mac".into(), crate::ethdev::export::mac_value(mac)),
        ]
        .into_iter()
        .chain(db_device.then(|| (DB_DEVICE.to_string(), 1)))
        .chain(monitor_offsets)
        .collect(),
    })
}

/// The description value that says the doorbell page is page 0 of the device's command
/// descriptor (not a file of the description).
const DB_DEVICE: &str = "db_device";

/// Maps one of the description's files.
fn map(e: &QueueExport, role: &str) -> Result<Arc<DevMem>, String> {
    let a = e.area(role)?;
    DevMem::shared_file_range(&a.path, a.offset, a.len)
        .map(Arc::new)
        .map_err(|err| format!("{role} at {}: {err}", a.path.display()))
}

fn map_opt(e: &QueueExport, role: &str) -> Result<Option<Arc<DevMem>>, String> {
    match e.area(role) {
        Ok(_) => map(e, role).map(Some),
        Err(_) => Ok(None),
    }
}

fn u32_value(e: &QueueExport, name: &str) -> Result<u32, String> {
    u32::try_from(e.value(name)?).map_err(|_| format!("{name} is out of range"))
}

/// A work queue's ring: a power of two of whole units, as `WorkQueue::new` needs.
fn check_wq(role: &str, mem: &DevMem, need: usize) -> Result<(), String> {
    let len = mem.len();
    if !len.is_power_of_two() || !(BU_BYTES..=1 << 31).contains(&len) || len < need {
        return Err(format!(
            "{role} of {len} bytes is not a ring of at least {need} bytes"
        ));
    }
    Ok(())
}

/// A CQ of `count` entries (a power of two, at least `ring`) in `mem`.
fn check_cq(role: &str, mem: &DevMem, count: u32, ring: u16) -> Result<(), String> {
    if !count.is_power_of_two() || count < u32::from(ring) || mem.len() < count as usize * CQE_BYTES
    {
        return Err(format!(
            "{role} of {count} entries in {} bytes does not serve a ring of {ring}",
            mem.len()
        ));
    }
    Ok(())
}

/// A doorbell page (and monitor): at least the page the device watches.
fn check_db(role: &str, mem: &DevMem) -> Result<(), String> {
    let page = crate::hw::mana::doorbell::PAGE_BYTES;
    if mem.len() < page || !mem.addr().is_multiple_of(8) {
        return Err(format!(
            "{role} of {} bytes is not a doorbell page",
            mem.len()
        ));
    }
    Ok(())
}

/// The queues of an exported pair, built in this process over the primary's rings: the RX
/// queue posted full from `pool` (the primary's shared pool), the TX queue empty. Counters
/// are this process's.
///
/// What the queues leave behind when dropped (posted buffers, frames in flight) goes to
/// `parked`: the device, in the primary, may still write into or read them until the
/// primary destroys the queues, so the caller frees them only once it knows that happened.
///
/// `claim` runs once everything is checked and mapped, just before the first write into the
/// rings (the RX queue's posting): an error there leaves the rings untouched.
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
    let (keys, rx_offloads) = e.check_common(DRIVER, pool, super::MIN_DESC)?;

    let (sq, tx_cq) = (map(e, "tx_sq")?, map(e, "tx_cq")?);
    let (rq, rx_cq) = (map(e, "rx_rq")?, map(e, "rx_cq")?);
    let page_bytes = crate::hw::mana::doorbell::PAGE_BYTES;
    let device_page = |what: &str, offset: u64| -> Result<Arc<DevMem>, String> {
        let fd = device.ok_or(
            "its doorbell page is the device's: pass the primary's device descriptor \
             (pmd::mp::Secondary::device, which the primary publishes with \
             Primary::publish_device)",
        )?;
        // Page 0 is the doorbell page (all a uverbs file maps for MANA, `mana_ib_mmap`);
        // a page past it exists only in the fake's command file, and only within its length:
        // a mapping past the end would fault at the first doorbell.
        if !offset.is_multiple_of(page_bytes as u64) {
            return Err(format!(
                "{what} at offset {offset}: not a page of the device"
            ));
        }
        DevMem::map_device_range(fd, offset, page_bytes, true, what).map(Arc::new)
    };
    let (tx_db, rx_db) = if e.value(DB_DEVICE).is_ok() {
        let page = device_page("the doorbell page", 0)?;
        (Arc::clone(&page), page)
    } else {
        (map(e, "tx_db")?, map(e, "rx_db")?)
    };
    let monitor = |role: &str| -> Result<Option<Arc<DevMem>>, String> {
        match e.value(&format!("{role}_offset")) {
            Ok(off) => device_page(role, off).map(Some),
            Err(_) => map_opt(e, role),
        }
    };
    let (tx_mon, rx_mon) = (monitor("tx_db_monitor")?, monitor("rx_db_monitor")?);
    let (tx_cq_count, rx_cq_count) = (u32_value(e, "tx_cq_count")?, u32_value(e, "rx_cq_count")?);
    check_wq("tx_sq", &sq, BU_BYTES)?;
    check_wq("rx_rq", &rq, usize::from(e.rx_ring_size) * BU_BYTES)?;
    check_cq("tx_cq", &tx_cq, tx_cq_count, e.tx_ring_size)?;
    check_cq("rx_cq", &rx_cq, rx_cq_count, e.rx_ring_size)?;
    for (role, m) in [("tx_db", Some(&tx_db)), ("rx_db", Some(&rx_db))]
        .into_iter()
        .chain([
            ("tx_db_monitor", tx_mon.as_ref()),
            ("rx_db_monitor", rx_mon.as_ref()),
        ])
    {
        if let Some(m) = m {
            check_db(role, m)?;
        }
    }
    let vp = u16::try_from(e.value("tx_vp_offset")?).map_err(|_| "tx_vp_offset out of range")?;

    let owner: crate::ethdev::QueueOwner = Arc::new(());
    let raw_tx = RawTxQueue {
        sq,
        sq_id: u32_value(e, "tx_sq_id")?,
        tx_vp_offset: vp,
        db_page: tx_db,
        db_monitor: tx_mon,
        cq: tx_cq,
        cq_count: tx_cq_count,
        cq_id: u32_value(e, "tx_cq_id")?,
        owner: Arc::clone(&owner),
        parked: Arc::clone(&parked),
        kick: None,
    };
    let raw_rx = RawRxQueue {
        rq,
        rq_id: u32_value(e, "rx_rq_id")?,
        db_page: rx_db,
        db_monitor: rx_mon,
        cq: rx_cq,
        cq_count: rx_cq_count,
        cq_id: u32_value(e, "rx_cq_id")?,
        owner,
        parked,
        kick: None,
    };
    let cfg = PortConfig {
        rx_ring_size: e.rx_ring_size,
        tx_ring_size: e.tx_ring_size,
        rx_offloads,
        ..PortConfig::default()
    };
    let mut rx = RxQueue::new(
        raw_rx,
        &cfg,
        e.port,
        Arc::clone(pool),
        keys.clone(),
        rx_counters,
        Arc::new(Xstats::default()),
    );
    claim()?;
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
        Arc::new(Xstats::default()),
    );
    Ok((rx, tx))
}
