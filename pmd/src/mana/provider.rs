//! The MANA provider contract: what the datapath needs from below (rdma-core on hardware,
//! the device model otherwise), and the raw queues it hands back, as `manadv_init_obj`
//! describes them. Names no provider implementation.
#![deny(unsafe_code)]

use crate::ethdev::{Kick, Link, PortEvent, RssConfig};
use crate::net::MacAddr;
use crate::sys::DevMem;
use mempool::{ChunkInfo, Registration};
use std::os::fd::RawFd;
use std::sync::Arc;

pub use crate::ethdev::QueueOwner;

/// A TX queue as `manadv_init_obj(QP | CQ)` describes it.
#[derive(Clone)]
pub struct RawTxQueue {
    /// SQ ring memory (`manadv_qp.sq_buf`, `sq_size` bytes).
    pub sq: Arc<DevMem>,
    /// Hardware SQ id (`manadv_qp.sq_id`).
    pub sq_id: u32,
    /// vPort offset for every TX OOB (`manadv_qp.tx_vp_offset`).
    pub tx_vp_offset: u16,
    /// The doorbell page (`manadv_qp.db_page`).
    pub db_page: Arc<DevMem>,
    /// A device model's monitor of this queue's doorbell writes ([`crate::sys::Doorbell`]);
    /// `None` on hardware.
    pub db_monitor: Option<Arc<DevMem>>,
    /// CQ ring memory (`manadv_cq.buf`).
    pub cq: Arc<DevMem>,
    /// CQEs in the ring (`manadv_cq.count`).
    pub cq_count: u32,
    /// Hardware CQ id (`manadv_cq.cq_id`).
    pub cq_id: u32,
    /// What keeps the queue's objects alive while the handle exists.
    pub owner: QueueOwner,
    /// Where the queue leaves the frames still in flight when dropped, freed once the device
    /// objects that can read them are gone (see [`Parked`](crate::ethdev::Parked)).
    pub parked: Arc<crate::ethdev::Parked>,
    /// The device's work for this queue on the polling thread (a device model's inline
    /// engine); `None` on hardware. See [`crate::ethdev::kick`].
    pub kick: Kick,
}

impl std::fmt::Debug for RawTxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTxQueue")
            .field("sq", &self.sq)
            .field("sq_id", &self.sq_id)
            .field("tx_vp_offset", &self.tx_vp_offset)
            .field("cq", &self.cq)
            .field("cq_count", &self.cq_count)
            .field("cq_id", &self.cq_id)
            .finish_non_exhaustive()
    }
}

/// An RX queue as `manadv_init_obj(RWQ | CQ)` describes it.
#[derive(Clone)]
pub struct RawRxQueue {
    /// RQ ring memory (`manadv_rwq.buf`, `size` bytes).
    pub rq: Arc<DevMem>,
    /// Hardware RQ id (`manadv_rwq.wq_id`).
    pub rq_id: u32,
    /// The doorbell page (`manadv_rwq.db_page`).
    pub db_page: Arc<DevMem>,
    /// A device model's monitor of this queue's doorbell writes; `None` on hardware.
    pub db_monitor: Option<Arc<DevMem>>,
    /// CQ ring memory.
    pub cq: Arc<DevMem>,
    /// CQEs in the ring.
    pub cq_count: u32,
    /// Hardware CQ id.
    pub cq_id: u32,
    /// What keeps the queue's objects alive while the handle exists.
    pub owner: QueueOwner,
    /// Where the queue leaves its posted buffers when dropped, freed once the device objects
    /// that can write into them are gone (see [`Parked`](crate::ethdev::Parked)).
    pub parked: Arc<crate::ethdev::Parked>,
    /// The device's work for this queue on the polling thread; `None` on hardware.
    pub kick: Kick,
}

impl std::fmt::Debug for RawRxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRxQueue")
            .field("rq", &self.rq)
            .field("rq_id", &self.rq_id)
            .field("cq", &self.cq)
            .field("cq_count", &self.cq_count)
            .field("cq_id", &self.cq_id)
            .finish_non_exhaustive()
    }
}

pub use crate::ethdev::SetupError;

/// The constructors of the busy error live with the driver whose ports the kernel can hold
/// (port exclusivity, [`crate::takeover`]).
impl SetupError {
    /// The error for a port whose raw-packet QP creation failed with `errno` (EBUSY or
    /// ENODEV, see [`crate::takeover::is_port_busy_errno`]) because `netdev` (the port's
    /// kernel interface, when the provider knows it) holds the vPort. Names the netdev, its
    /// master (read from `<sysfs>/class/net/<netdev>/master` under
    /// [`crate::devices::sysfs_root`]), the command that frees the port and the `busy=`
    /// policies. For providers:
    ///
    /// ```
    /// use pmd::mana::SetupError;
    /// let e = SetupError::port_busy(Some("eth9"), libc::ENODEV);
    /// assert!(matches!(e, SetupError::PortBusy { .. }));
    /// assert!(e.to_string().contains("kernel netdev eth9"));
    /// ```
    pub fn port_busy(netdev: Option<&str>, errno: i32) -> Self {
        let holder = netdev.map(crate::takeover::Holder::find);
        Self::PortBusy {
            netdev: netdev.map(str::to_string),
            master: holder.as_ref().and_then(|h| h.master.clone()),
            errno,
            holder: holder.as_ref().map_or_else(
                || "another user (the port's kernel netdev, or another process)".to_string(),
                crate::takeover::Holder::describe,
            ),
            hint: crate::takeover::busy::hint(holder.as_ref(), errno),
        }
    }

    /// A port whose kernel netdev `netdev` is down, yet raw-packet QP creation is refused
    /// with `errno`: the vPort is configured by another process's queues (mana_cfg_vport
    /// refuses a second user of a vPort, drivers/net/ethernet/microsoft/mana/mana_en.c), not
    /// by the kernel. Nothing to bring down: the hint says to stop that process or wait.
    ///
    /// ```
    /// use pmd::mana::SetupError;
    /// let e = SetupError::port_busy_elsewhere("eth9", libc::ENODEV);
    /// assert!(e.to_string().starts_with("another process"));
    /// ```
    pub fn port_busy_elsewhere(netdev: &str, errno: i32) -> Self {
        Self::PortBusy {
            netdev: None,
            master: None,
            errno,
            holder: format!(
                "another process (the port's kernel netdev {netdev} is down, so not the kernel)"
            ),
            hint: crate::takeover::busy::hint_elsewhere(errno),
        }
    }

    /// Classifies a failed raw-packet QP creation (`call`, e.g. `ibv_create_qp_ex`, for
    /// `object`, e.g. "tx queue 0"): EBUSY and ENODEV become [`SetupError::port_busy`], any
    /// other error [`SetupError::Verbs`].
    pub fn raw_qp(
        call: &'static str,
        object: &'static str,
        netdev: Option<&str>,
        source: std::io::Error,
    ) -> Self {
        match source.raw_os_error() {
            Some(errno) if crate::takeover::is_port_busy_errno(errno) => {
                Self::port_busy(netdev, errno)
            }
            _ => Self::Verbs {
                call,
                object,
                source,
            },
        }
    }
}

pub use crate::sys::mem::{PageAllocator, QueueAllocator, SharedFileAllocator};

/// What the MANA datapath needs from below: rdma-core on hardware, the device model otherwise.
/// The calls mirror the bring-up checklist of the spec (§1.13).
pub trait Provider: Send {
    /// Sets the queue-buffer allocator (`manadv_set_context_attr`); must come before any
    /// queue is created.
    fn set_allocator(&mut self, alloc: Arc<dyn QueueAllocator>);
    /// The port's MAC address.
    fn mac(&self) -> MacAddr;
    /// Link state.
    fn link(&self) -> Link;
    /// Most queues of each kind.
    fn max_queues(&self) -> u16;
    /// Most descriptors per queue.
    fn max_desc(&self) -> u32;
    /// The largest MTU the device takes, where the provider can tell (on hardware: the
    /// kernel netdev's `maxmtu`, e.g. 1500 on a host without jumbo frames); the port's MTU
    /// range is the driver's, capped by it.
    fn max_mtu(&self) -> Option<u16> {
        None
    }
    /// Sets the port's MTU (on MANA through the kernel netdev, `SIOCSIFMTU`, spec §1.1);
    /// the device drops larger TX frames with TX_MTU_DROP completions.
    ///
    /// # Errors
    /// The device (or the netdev) refused the value.
    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError>;
    /// Makes later registrations fork-safe (`ibv_fork_init`); called before the first
    /// [`Provider::reg_mr`] when the port's configuration asks. A device model has nothing
    /// to do.
    ///
    /// # Errors
    /// The device layer could not be made fork-safe.
    fn fork_safe(&mut self) -> Result<(), SetupError> {
        Ok(())
    }
    /// Registers one pool chunk for DMA (`ibv_reg_mr`) and returns its key; the registration
    /// lasts until the returned guard drops.
    ///
    /// # Errors
    /// The registration failed.
    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError>;
    /// Creates `n` TX queues of `nb_desc` WQEs each (CQ + raw-packet QP per queue).
    ///
    /// # Errors
    /// [`SetupError::PortBusy`] when the vPort is held; limits; verbs failures.
    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawTxQueue>, SetupError>;
    /// Creates `n` RX queues of `nb_desc` WQEs each, spread by RSS.
    ///
    /// # Errors
    /// As `create_tx_queues`.
    fn create_rx_queues(
        &mut self,
        n: u16,
        nb_desc: u32,
        rss: &RssConfig,
    ) -> Result<Vec<RawRxQueue>, SetupError>;
    /// Destroys all queues (teardown order of §1.10). Objects a queue handle still holds
    /// ([`QueueOwner`]) go when the handle drops.
    fn destroy_queues(&mut self);
    /// Device-side counters, each with what it says about lost frames.
    fn xstats(&self) -> Vec<crate::ethdev::Xstat> {
        Vec::new()
    }
    /// Frames the device dropped because no receive WQE was posted.
    fn rx_missed(&self) -> u64 {
        0
    }
    /// The port's event descriptor (on hardware the context's async-event fd, made
    /// non-blocking); see [`crate::ethdev::PortDriver::event_fd`]. `None`: no events.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }
    /// The device's command descriptor, where another process maps the doorbell page of the
    /// port's queues (rdma-core: the context's `cmd_fd`, whose page 0 is its doorbell page);
    /// `None` where the doorbell page is ordinary memory (the device model). See
    /// [`crate::ethdev::PortDriver::device_fd`].
    fn device_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Appends the port's events since the last call and clears the descriptor; never
    /// blocks. See [`crate::ethdev::PortDriver::take_events`].
    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        let _ = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_qp_errors_enodev_and_ebusy_mean_port_busy() {
        for errno in [libc::ENODEV, libc::EBUSY] {
            let e = SetupError::raw_qp(
                "ibv_create_qp_ex",
                "tx queue",
                Some("nosuchif9"),
                std::io::Error::from_raw_os_error(errno),
            );
            let SetupError::PortBusy {
                netdev,
                master,
                errno: got,
                holder,
                hint,
            } = e
            else {
                panic!("errno {errno} must mean busy");
            };
            assert_eq!(
                (netdev.as_deref(), master, got),
                (Some("nosuchif9"), None, errno)
            );
            assert_eq!(holder, "kernel netdev nosuchif9");
            assert!(hint.contains("`ip link set nosuchif9 down`"), "{hint}");
            assert!(
                hint.contains("busy=wait") && hint.contains("busy=takeover"),
                "{hint}"
            );
        }
        let other = SetupError::raw_qp(
            "ibv_create_qp_ex",
            "tx queue",
            None,
            std::io::Error::from_raw_os_error(libc::EINVAL),
        );
        assert!(matches!(other, SetupError::Verbs { .. }), "{other}");
        let unknown = SetupError::port_busy(None, libc::ENODEV).to_string();
        assert!(unknown.contains("another user"), "{unknown}");
    }
}
