//! The null port (DPDK's `net_null`): no device. RX hands out freshly allocated mbufs of the
//! configured frame size; TX frees what it is given. It measures the framework's own overhead:
//! queue dispatch, mempool traffic and counters, with no NIC in the way.
#![deny(unsafe_code)]

use crate::ethdev::{
    Burst, Caps, Counters, Link, PortConfig, PortDriver, PortError, QueueSetup, Queues, RxBurst,
    RxOffloads, TxBurst, TxOffloads,
};
use crate::net::MacAddr;
use mempool::lcache::with_cache;
use mempool::{Mbuf, MbufPool};
use std::sync::Arc;

/// Most packets one null RX burst produces (the size of its scratch array).
pub const MAX_BURST: usize = 512;

/// The null port's driver.
#[derive(Debug)]
pub struct Driver {
    size: u16,
    mac: MacAddr,
}

impl Driver {
    /// A null device handing out `size`-byte frames, with `mac` (or a default per port).
    pub fn new(size: u16, mac: Option<MacAddr>, port_id: u16) -> Self {
        // Locally administered default: 02:00:00:00:ff:<port>.
        let mac = mac.unwrap_or(MacAddr([0x02, 0, 0, 0, 0xff, port_id as u8]));
        Self { size, mac }
    }
}

impl PortDriver for Driver {
    fn caps(&self) -> Caps {
        Caps {
            max_rx_queues: 64,
            max_tx_queues: 64,
            min_ring_size: 1,
            max_ring_size: 32768,
            ring_size_pow2: false,
            rx_offloads: RxOffloads::empty(),
            tx_offloads: TxOffloads::all(),
            max_burst: MAX_BURST as u16,
            mtu_range: (68, 9600),
            promiscuous: true,
        }
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn link(&self) -> Link {
        Link {
            up: true,
            speed_mbps: 0,
            full_duplex: true,
        }
    }

    fn configure(
        &mut self,
        cfg: &PortConfig,
        pool: &Arc<MbufPool>,
        q: &QueueSetup,
    ) -> Result<Queues, PortError> {
        if usize::from(self.size) > usize::from(pool.data_room()) {
            return Err(PortError::BadConfig {
                what: "null frame size",
                requested: self.size.to_string(),
                allowed: format!("at most the pool's data room of {} bytes", pool.data_room()),
            });
        }
        let rx = (0..cfg.rx_queues)
            .map(|i| {
                Box::new(RxQueue {
                    pool: Arc::clone(pool),
                    size: self.size,
                    port: q.port_id,
                    scratch: (0..MAX_BURST).map(|_| None).collect(),
                    counters: Arc::clone(&q.rx_counters[usize::from(i)]),
                }) as Box<dyn RxBurst>
            })
            .collect();
        let tx = (0..cfg.tx_queues)
            .map(|i| {
                Box::new(TxQueue {
                    pool: Arc::clone(pool),
                    counters: Arc::clone(&q.tx_counters[usize::from(i)]),
                }) as Box<dyn TxBurst>
            })
            .collect();
        Ok(Queues { rx, tx })
    }
}

/// A null RX queue.
pub struct RxQueue {
    pool: Arc<MbufPool>,
    size: u16,
    port: u16,
    scratch: Vec<Option<Mbuf>>,
    counters: Arc<Counters>,
}

impl RxBurst for RxQueue {
    #[inline]
    fn rx_burst(&mut self, out: &mut Burst) -> usize {
        let n = out.spare().min(MAX_BURST);
        let slots = &mut self.scratch[..n];
        let pool = &self.pool;
        if !with_cache(pool, |cache| pool.alloc_mbufs(cache, slots)) {
            self.counters.add_nombuf(1);
            return 0;
        }
        let size = usize::from(self.size);
        for slot in slots.iter_mut() {
            if let Some(mut m) = slot.take() {
                // The pool's data room was checked at configure time, so this cannot fail.
                let _ = m.set_data_len(size);
                m.set_port(self.port);
                let _ = out.push(m);
            }
        }
        self.counters.add(n as u64, (n * size) as u64);
        n
    }
}

/// A null TX queue.
pub struct TxQueue {
    pool: Arc<MbufPool>,
    counters: Arc<Counters>,
}

impl TxBurst for TxQueue {
    #[inline]
    fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        let n = pkts.len();
        let bytes: u64 = pkts.iter().map(|m| u64::from(m.pkt_len())).sum();
        with_cache(&self.pool, |cache| pkts.free_all(cache));
        self.counters.add(n as u64, bytes);
        n
    }
}
