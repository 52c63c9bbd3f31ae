//! libibverbs' fork support (`libibverbs/memory.c`): `ibv_fork_init`,
//! `ibv_is_fork_initialized`, and the `ibv_dontfork_range` / `ibv_dofork_range` pair that
//! every registration (`ibv_reg_mr*` / `ibv_dereg_mr`) and every libmlx5 buffer of its own or
//! from the context's allocators goes through.
//!
//! The world's kernel copies pinned pages on fork (5.13 and later, `RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK`
//! set), so `ibv_is_fork_initialized` says `IBV_FORK_UNNEEDED` in both profiles. What
//! differs is `ibv_fork_init`:
//! * v44 (memory.c:125–176) ignores the kernel: 0 when already initialised; `EINVAL` once a
//!   range went through `ibv_dontfork_range` / `ibv_dofork_range` before it (`too_late`,
//!   set at l. 715–733); otherwise it initialises, and from then on each range is marked
//!   `MADV_DONTFORK` while at least one registration or buffer covers it (page-granular
//!   use counts, `ibv_madvise_range`, l. 621–713), and `MADV_DOFORK` again when the last goes.
//! * main (memory.c:125–179, rdma-core 5a11b68ca, v51) returns 0 at once when the kernel
//!   copies on fork (l. 137–138), before the `too_late` check: nothing is ever marked.
//!
//! State is process-wide, as libibverbs' statics are. `RDMAV_HUGEPAGES_SAFE` (ranges aligned
//! to the mapping's page size read from `/proc/self/smaps`) is not modelled: ranges are
//! aligned to the base page size.

use crate::ffi::{ibv_fork_status, IBV_FORK_UNNEEDED};
use crate::state::Profile;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// libibverbs' fork bookkeeping (`mm_root`, `too_late`, the range tree of memory.c).
struct Fork {
    /// `mm_root != NULL`: `ibv_fork_init` succeeded.
    initialized: bool,
    /// A range went through `ibv_dontfork_range` / `ibv_dofork_range` before any
    /// `ibv_fork_init` (memory.c:715–733).
    too_late: bool,
    /// Page-aligned `[start, end)` of every range marked since `ibv_fork_init`, once per
    /// `ibv_dontfork_range` (a page is `MADV_DONTFORK` while any range covers it: the
    /// tree's `refcnt`).
    ranges: Vec<(usize, usize)>,
}

static FORK: Mutex<Fork> = Mutex::new(Fork {
    initialized: false,
    too_late: false,
    ranges: Vec::new(),
});

fn fork() -> std::sync::MutexGuard<'static, Fork> {
    FORK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `ibv_fork_init` (v44 memory.c:125–176; main l. 125–179): 0 or an errno value.
pub fn fork_init(profile: Profile) -> c_int {
    let mut f = fork();
    if f.initialized {
        return 0; // l. 134–135
    }
    if profile == Profile::Main {
        // main l. 137–138: ibv_is_fork_initialized() == IBV_FORK_UNNEEDED (the world's
        // kernel copies on fork) → 0, nothing initialised.
        return 0;
    }
    if f.too_late {
        return libc::EINVAL; // v44 l. 137–138
    }
    // l. 140–175: the kernel supports MADV_DONTFORK (the probe madvise succeeds).
    f.initialized = true;
    0
}

/// `ibv_is_fork_initialized` (v44 memory.c:178–184): the kernel copies on fork
/// (`get_copy_on_fork`, ibdev_nl.c:243–257) → `IBV_FORK_UNNEEDED`, whatever `ibv_fork_init` did.
pub fn status() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

/// `ibverbs_init` at the first `ibv_get_device_list` (v44 init.c:666–671, device.c:68–72):
/// `RDMAV_FORK_SAFE` or `IBV_FORK_SAFE` set to anything but `0` (`check_env`,
/// util/util.c:50–55) calls `ibv_fork_init`; a failure is only a warning.
pub fn init_from_env(profile: Profile) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| v != "0");
    if (set("RDMAV_FORK_SAFE") || set("IBV_FORK_SAFE")) && fork_init(profile) != 0 {
        eprintln!("libibverbs: Warning: fork()-safety requested but init failed");
    }
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// `[start, end)` of `base..base + size` widened to pages (memory.c:638–640).
fn pages(base: *mut c_void, size: usize) -> (usize, usize) {
    let ps = page();
    let start = base as usize & !(ps - 1);
    let end = (base as usize + size).div_ceil(ps) * ps;
    (start, end)
}

/// The parts of `[start, end)` no range of `ranges` covers.
fn uncovered(ranges: &[(usize, usize)], start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut covered: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|&&(s, e)| s < end && e > start)
        .map(|&(s, e)| (s.max(start), e.min(end)))
        .collect();
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut at = start;
    for (s, e) in covered {
        if s > at {
            out.push((at, s));
        }
        at = at.max(e);
    }
    if at < end {
        out.push((at, end));
    }
    out
}

fn madvise(start: usize, end: usize, advice: c_int) -> Result<(), c_int> {
    // SAFETY: madvise only changes the flags of the caller's own mappings (or fails with
    // ENOMEM/EINVAL); DONTFORK/DOFORK never touch the contents.
    if unsafe { libc::madvise(start as *mut c_void, end - start, advice) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    }
}

/// `ibv_dontfork_range` (v44 memory.c:715–723): before `ibv_fork_init`, only `too_late`;
/// after it, the pages not yet marked get `MADV_DONTFORK` (l. 652–680). A failed `madvise`
/// is rolled back and fails the call with its errno (l. 681–692; the caller, e.g.
/// `ibv_reg_mr`, returns NULL, verbs.c:320–321).
pub fn dontfork_range(base: *mut c_void, size: usize) -> Result<(), c_int> {
    let mut f = fork();
    if !f.initialized {
        f.too_late = true;
        return Ok(());
    }
    if size == 0 || base.is_null() {
        return Ok(()); // l. 630–631
    }
    let (start, end) = pages(base, size);
    let mut done = Vec::new();
    for (s, e) in uncovered(&f.ranges, start, end) {
        if let Err(err) = madvise(s, e, libc::MADV_DONTFORK) {
            for (s, e) in done {
                let _ = madvise(s, e, libc::MADV_DOFORK);
            }
            return Err(err);
        }
        done.push((s, e));
    }
    f.ranges.push((start, end));
    Ok(())
}

/// `ibv_dofork_range` (v44 memory.c:725–733): before `ibv_fork_init`, only `too_late`;
/// after it, the range's use ends and the pages no other range covers get `MADV_DOFORK`
/// (failures ignored, `do_madvise` l. 599–619).
pub fn dofork_range(base: *mut c_void, size: usize) {
    let mut f = fork();
    if !f.initialized {
        f.too_late = true;
        return;
    }
    if size == 0 || base.is_null() {
        return;
    }
    let (start, end) = pages(base, size);
    let Some(i) = f.ranges.iter().position(|&r| r == (start, end)) else {
        return;
    };
    f.ranges.swap_remove(i);
    for (s, e) in uncovered(&f.ranges, start, end) {
        let _ = madvise(s, e, libc::MADV_DOFORK);
    }
}

#[cfg(test)]
mod tests {
    use super::uncovered;

    #[test]
    fn uncovered_leaves_the_gaps_between_ranges() {
        assert_eq!(uncovered(&[], 0, 10), vec![(0, 10)]);
        assert_eq!(
            uncovered(&[(2, 4), (6, 8)], 0, 10),
            vec![(0, 2), (4, 6), (8, 10)]
        );
        assert_eq!(uncovered(&[(0, 5), (3, 10)], 0, 10), vec![]);
        assert_eq!(uncovered(&[(20, 30)], 0, 10), vec![(0, 10)]);
    }
}
