//! DMA and MMIO barriers, per architecture, with the meaning rdma-core gives them in
//! `util/udma_barrier.h` (the reference for every provider), so a driver reads like its C
//! counterpart and runs correctly on x86-64 and aarch64 (Azure's Cobalt VMs have MANA).
//!
//! | barrier | x86-64 | aarch64 | use |
//! |---|---|---|---|
//! | [`udma_to_device_barrier`] | compiler barrier | `dmb oshst` | queue writes, then the doorbell |
//! | [`udma_from_device_barrier`] | `lfence` | `dmb oshld` | owner/valid bit, then the entry |
//! | [`mmio_flush_writes`] | `sfence` | `dsb st` | after a store to write-combining MMIO |
//!
//! Other architectures fall back to the equivalent C11 fences (rdma-core refuses to build
//! there; we keep the crate portable for the device model).
#![allow(unsafe_code)]

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use std::arch::asm;

/// Makes every store to queue memory visible to the device before a following MMIO store
/// (the doorbell) that makes the device read it.
#[inline(always)]
pub fn udma_to_device_barrier() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an empty asm block with a memory clobber: a compiler barrier only (x86 keeps
    // stores in order, so rdma-core needs no instruction here); no registers, no memory.
    unsafe {
        asm!("", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshst` orders earlier stores before later ones for the outer-shareable
    // domain (devices and other cores); it touches no registers or memory.
    unsafe {
        asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

/// Makes the reads that follow see everything the device wrote before the owner (valid) bit
/// that was just observed.
#[inline(always)]
pub fn udma_from_device_barrier() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` serialises loads; it touches no registers or memory.
    unsafe {
        asm!("lfence", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshld` orders earlier loads before later loads and stores for the
    // outer-shareable domain; it touches no registers or memory.
    unsafe {
        asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
}

/// Flushes write-combining buffers after an MMIO store, so the doorbell leaves the CPU now
/// and two doorbells are never merged into one.
#[inline(always)]
pub fn mmio_flush_writes() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` orders and drains earlier stores (including write-combining ones); it
    // touches no registers or memory.
    unsafe {
        asm!("sfence", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dsb st` completes earlier stores before continuing; no registers or memory.
    unsafe {
        asm!("dsb st", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Device side (the model): orders a completion's body before its owner dword (spec §10 item
/// 12). The model is another CPU thread, so a C11 release fence is the right tool.
#[inline]
pub fn fence_before_owner_write() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

/// Hints that the cache line at `p` will be read soon. A hint only: it never faults, whatever
/// `p` is, and does nothing on architectures without one.
#[inline(always)]
pub fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` only hints the cache; it does not fault on any address and
    // touches no registers or memory.
    unsafe {
        asm!("prefetcht0 byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `prfm` is a hint: no fault on any address, no registers or memory touched.
    unsafe {
        asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// Hints that the cache line at `p` will be written soon: fetched in the exclusive state, so
/// the store that follows does not wait for another core to give the line up. A hint only
/// (`prefetchw` executes as a no-op on x86-64 CPUs that lack it).
#[inline(always)]
pub fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetchw` only hints the cache; it does not fault on any address and
    // touches no registers or memory.
    unsafe {
        asm!("prefetchw byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `prfm` is a hint: no fault on any address, no registers or memory touched.
    unsafe {
        asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
