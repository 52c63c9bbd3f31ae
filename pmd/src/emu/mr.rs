//! Memory regions as a NIC sees them: a table of memory keys, each the device's view of one
//! registered range (`ibv_reg_mr`), and the key-and-range check every DMA goes through.
//! NIC-independent: MANA's memory keys and mlx5's lkeys are the same thing to a device model.
#![deny(unsafe_code)]

use crate::sys::DevMem;
use mempool::{Iova, Lkey};
use std::sync::Arc;

/// One registered region.
#[derive(Debug)]
pub struct Mr {
    /// Its key (MANA `mem_key`, mlx5 `lkey`).
    pub lkey: u32,
    /// The device address of the region's first byte (its IOVA; the virtual address unless
    /// registered with another).
    pub addr: usize,
    /// Its length in bytes.
    pub len: usize,
    /// The device's view of the bytes.
    pub mem: Arc<DevMem>,
}

/// A key registered twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory key {lkey:#x} is already registered")]
pub struct DuplicateKey {
    /// The key.
    pub lkey: u32,
}

/// The memory regions of one device (a protection domain's worth).
#[derive(Debug, Default)]
pub struct MrTable {
    mrs: Vec<Mr>,
    /// The region the last lookup found: consecutive DMAs mostly hit the same region (an
    /// mbuf pool registers a few large chunks), so it is tried first.
    last: std::cell::Cell<usize>,
}

impl MrTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `mem` under `lkey`: device addresses `iova..iova + mem.len()` reach it.
    ///
    /// # Errors
    /// The key is registered already.
    pub fn add(&mut self, lkey: u32, iova: u64, mem: Arc<DevMem>) -> Result<(), DuplicateKey> {
        if self.mrs.iter().any(|m| m.lkey == lkey) {
            return Err(DuplicateKey { lkey });
        }
        self.mrs.push(Mr {
            lkey,
            addr: iova as usize,
            len: mem.len(),
            mem,
        });
        Ok(())
    }

    /// Deregisters `lkey`; `false` if it was not registered. When this returns the table
    /// holds no view of that memory.
    pub fn remove(&mut self, lkey: u32) -> bool {
        let before = self.mrs.len();
        self.mrs.retain(|m| m.lkey != lkey);
        self.last.set(0);
        self.mrs.len() != before
    }

    /// The regions, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &Mr> {
        self.mrs.iter()
    }

    /// How many regions are registered.
    pub fn len(&self) -> usize {
        self.mrs.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.mrs.is_empty()
    }

    /// The region of `key` and the offset of `addr` in it, if `len` bytes from there fit.
    #[inline]
    pub fn find(&self, addr: Iova, key: Lkey, len: usize) -> Option<(&Mr, usize)> {
        let (addr, key) = (addr.0, key.0);
        let mr = match self.mrs.get(self.last.get()) {
            Some(m) if m.lkey == key => m,
            _ => {
                let i = self.mrs.iter().position(|m| m.lkey == key)?;
                self.last.set(i);
                &self.mrs[i]
            }
        };
        let addr = usize::try_from(addr).ok()?;
        let off = addr.checked_sub(mr.addr)?;
        (off.checked_add(len)? <= mr.len).then_some((mr, off))
    }

    /// Reads `out.len()` bytes at `addr` through `key` (a DMA read); `false`, with nothing
    /// read, if the range is not inside the key's region.
    #[inline]
    pub fn read(&self, addr: Iova, key: Lkey, out: &mut [u8]) -> bool {
        match self.find(addr, key, out.len()) {
            Some((mr, off)) => {
                mr.mem.read(off, out);
                true
            }
            None => false,
        }
    }

    /// Writes `data` at `addr` through `key` (a DMA write); `false`, with nothing written, if
    /// the range is not inside the key's region.
    #[inline]
    pub fn write(&self, addr: Iova, key: Lkey, data: &[u8]) -> bool {
        match self.find(addr, key, data.len()) {
            Some((mr, off)) => {
                mr.mem.write(off, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reaches_exactly_its_range() {
        let mut t = MrTable::new();
        let mem = Arc::new(DevMem::anon(4096).unwrap());
        t.add(7, 0x10_0000, mem).unwrap();
        assert_eq!(
            t.add(7, 0, Arc::new(DevMem::anon(4096).unwrap())),
            Err(DuplicateKey { lkey: 7 })
        );
        assert!(t.write(Iova(0x10_0000 + 4090), Lkey(7), &[1, 2, 3, 4, 5, 6]));
        assert!(!t.write(Iova(0x10_0000 + 4091), Lkey(7), &[1, 2, 3, 4, 5, 6]));
        assert!(!t.write(Iova(0x10_0000 - 1), Lkey(7), &[1]));
        assert!(!t.write(Iova(0x10_0000), Lkey(8), &[1]));
        let mut out = [0u8; 6];
        assert!(t.read(Iova(0x10_0000 + 4090), Lkey(7), &mut out));
        assert_eq!(out, [1, 2, 3, 4, 5, 6]);
        assert!(t.remove(7));
        assert!(!t.remove(7));
        assert!(!t.read(Iova(0x10_0000), Lkey(7), &mut out));
    }
}
