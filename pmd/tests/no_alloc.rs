//! The datapath allocates nothing: a steady-state loop of bursts (buffers taken from the
//! thread's cache, sent, received on the far end of the cable, dropped), through both
//! drivers' TX (WQEs, doorbells, completions reclaimed) and RX (completions parsed, buffers
//! refilled), counted by a global allocator that counts this thread's allocations only.
//! The device models run on threads of their own (`engine=thread`), so what is counted is
//! the application's and the drivers' work, not the model's.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::ethdev::Burst;
use pmd::port::{Port, PortConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// Whether this thread's allocations are counted, and how many there were.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

impl Counting {
    fn count() {
        // `try_with`: an allocation during a thread's teardown is simply not counted.
        let _ = COUNTING.try_with(|on| {
            if on.get() {
                let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
            }
        });
    }
}

// SAFETY: every call forwards to the system allocator unchanged; counting touches only
// const-initialised thread-locals without destructors (no allocation, no re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations this thread made while running `f`.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCS.with(Cell::get)
}

/// A 60-byte frame to `dst`.
fn fill(m: &mut mempool::Mbuf, dst: [u8; 6], seq: u32) {
    let mut f = [0u8; 60];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&f).expect("60 bytes fit");
}

#[test]
fn a_steady_burst_loop_allocates_nothing_on_either_driver() {
    for kind in ["emu-mana", "emu-mlx5"] {
        let pool = MbufPool::new(MbufPoolConfig::new(format!("noalloc-{kind}"), 4096)).unwrap();
        let cfg = PortConfig::default().with_ring_sizes(256, 256);
        let name = format!("noalloc-{kind}-{}", std::process::id());
        let spec = |id: u8| {
            format!("{kind}:wire=loop:{name},engine=thread,mac=02:00:00:00:00:0{id}")
                .parse()
                .unwrap()
        };
        let (_p0, _rx0, mut tx) = Port::open_started(0, &spec(0), &cfg, &pool).unwrap();
        let (_p1, mut rx, _tx1) = Port::open_started(1, &spec(1), &cfg, &pool).unwrap();
        let dst = [2, 0, 0, 0, 0, 1];
        // Made before counting, reused: a burst's storage is the application's.
        let mut out = Burst::with_capacity(32);
        let mut got = Burst::with_capacity(32);
        let mut seq = 0u32;
        // One round: a burst sent (what the TX queue does not take is dropped), a burst
        // received and dropped; returns the frames received.
        let mut round = |out: &mut Burst, got: &mut Burst| -> u64 {
            while out.spare() > 0 {
                let Some(mut m) = mempool::lcache::alloc(&pool) else {
                    break;
                };
                fill(&mut m, dst, seq);
                seq = seq.wrapping_add(1);
                out.push(m).expect("room");
            }
            tx.tx_burst(out);
            out.clear();
            let n = rx.rx_burst(got) as u64;
            got.clear();
            n
        };
        let mut received = 0u64;
        // Warm-up: the thread's cache, the queues' first completions and refills.
        let end = Instant::now() + Duration::from_secs(10);
        while received < 2000 && Instant::now() < end {
            received += round(&mut out, &mut got);
        }
        assert!(received >= 2000, "{kind}: warm-up moved {received} frames");
        let before = received;
        // Counted: rounds until 5,000 more frames came through (bounded in time for a
        // loaded machine; the device model's thread sets the pace).
        let end = Instant::now() + Duration::from_secs(60);
        let n = allocations_in(|| {
            while received - before < 5000 && Instant::now() < end {
                received += round(&mut out, &mut got);
            }
        });
        assert!(
            received - before >= 5000,
            "{kind}: {} frames in the counted loop",
            received - before
        );
        assert_eq!(
            n,
            0,
            "{kind}: {n} allocations in {} frames",
            received - before
        );
    }
    mempool::lcache::flush();
}
