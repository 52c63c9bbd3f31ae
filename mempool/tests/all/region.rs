//! Regions on hugepages and on the 4 KiB fallback. Every test passes on machines with and
//! without hugepages: the expectation is computed from what sysfs says is free, and the page
//! size the kernel actually used is read back from /proc/self/smaps.

use std::path::Path;

use mempool::region::hugepages_free;
use mempool::{Error, PagePolicy, PageSize, Region, RegionOptions};

/// KernelPageSize of the mapping that starts at `addr`, from /proc/self/smaps.
fn kernel_page_size(addr: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut in_mapping = false;
    for line in smaps.lines() {
        // A mapping starts with "start-end perms ..."; its fields follow as "Name: value".
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) {
                // The mapping that holds `addr` (the kernel merges adjacent anonymous
                // mappings of the same kind, as it does under AddressSanitizer's).
                in_mapping = (start..end).contains(&addr);
                continue;
            }
        }
        if in_mapping {
            if let Some(rest) = line.strip_prefix("KernelPageSize:") {
                let kb: usize = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kb * 1024);
            }
        }
    }
    None
}

fn assert_zeroed_and_writable(r: &Region) {
    for off in (0..r.len()).step_by(4096) {
        // SAFETY: `off` is inside the mapping, which lives as long as `r`; nothing else uses it.
        unsafe {
            assert_eq!(r.as_ptr().add(off).read(), 0, "byte {off} not zero");
            r.as_ptr().add(off).write(0xa5);
            assert_eq!(r.as_ptr().add(off).read(), 0xa5);
        }
    }
}

#[test]
fn auto_policy_uses_2m_hugepages_when_free_else_falls_back() {
    let free_before = hugepages_free(PageSize::Huge2M).unwrap_or(0);
    let r = Region::new(3 << 20, &RegionOptions::default()).unwrap();
    let expected = if free_before >= 2 {
        PageSize::Huge2M
    } else {
        PageSize::Normal4K
    };
    // Another test may have taken pages in between; only a 4 KiB result with many free
    // pages, or a hugepage result with none, would be wrong.
    if free_before >= 16 {
        assert_eq!(r.page_size(), PageSize::Huge2M);
    } else if free_before == 0 {
        assert_eq!(r.page_size(), PageSize::Normal4K);
    } else {
        eprintln!(
            "only {free_before} free hugepages: got {:?}, expected {expected:?}",
            r.page_size()
        );
    }
    assert_eq!(r.len() % r.page_size().bytes(), 0);
    assert!(r.len() >= 3 << 20);
    assert_eq!(
        kernel_page_size(r.addr()),
        Some(r.page_size().bytes()),
        "smaps disagrees"
    );
    assert_zeroed_and_writable(&r);
}

#[test]
fn normal_policy_reports_normal4k_even_where_hugepages_exist() {
    let r = Region::new(1 << 20, &RegionOptions::with_policy(PagePolicy::Normal)).unwrap();
    assert_eq!(r.page_size(), PageSize::Normal4K);
    assert_eq!(kernel_page_size(r.addr()), Some(4096));
    if can_lock_without_limit() {
        assert!(
            r.is_locked(),
            "mlock failed although this process may lock any amount"
        );
    }
    assert_zeroed_and_writable(&r);
}

/// Whether mlock cannot hit RLIMIT_MEMLOCK here: the limit is unlimited, or the process has
/// CAP_IPC_LOCK (bit 14 of the effective capabilities). Otherwise other tests running in
/// parallel may have used the allowance, and a failed mlock is only a warning.
fn can_lock_without_limit() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_ipc_lock = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0);
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let unlimited = limits
        .lines()
        .any(|l| l.starts_with("Max locked memory") && l.contains("unlimited"));
    cap_ipc_lock || unlimited
}

#[test]
fn require_2m_maps_hugepages_or_explains_how_to_get_them() {
    let free = hugepages_free(PageSize::Huge2M).unwrap_or(0);
    match Region::new(
        2 << 20,
        &RegionOptions::with_policy(PagePolicy::Require(PageSize::Huge2M)),
    ) {
        Ok(r) => {
            assert_eq!(r.page_size(), PageSize::Huge2M);
            assert_eq!(kernel_page_size(r.addr()), Some(2 << 20));
        }
        Err(e @ Error::HugepagesUnavailable { .. }) => {
            assert!(free < 4, "{free} free hugepages but: {e}");
            let msg = e.to_string();
            assert!(msg.contains("hugepages-2048kB/nr_hugepages"), "{msg}");
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn require_1g_maps_a_gigantic_page_or_explains_how_to_get_one() {
    let free = hugepages_free(PageSize::Huge1G).unwrap_or(0);
    let opts = RegionOptions::with_policy(PagePolicy::Require(PageSize::Huge1G));
    match Region::new(4096, &opts) {
        Ok(r) => {
            assert_eq!(r.page_size(), PageSize::Huge1G);
            assert_eq!(r.len(), 1 << 30, "rounded up to one 1 GiB page");
            assert_eq!(kernel_page_size(r.addr()), Some(1 << 30));
            // SAFETY: both offsets are inside the mapping, alive until the end of the test.
            unsafe {
                assert_eq!(r.as_ptr().read(), 0);
                assert_eq!(r.as_ptr().add((1 << 30) - 1).read(), 0);
            }
        }
        Err(e @ Error::HugepagesUnavailable { .. }) => {
            assert_eq!(free, 0, "{free} free 1 GiB pages but: {e}");
            assert!(
                e.to_string().contains("hugepages-1048576kB/nr_hugepages"),
                "{e}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn shared_region_on_hugetlbfs_is_seen_by_a_second_mapping() {
    let dir = Path::new("/dev/hugepages");
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines().any(|l| {
                l.split_whitespace().nth(1) == Some("/dev/hugepages") && l.contains("hugetlbfs")
            })
        })
        .unwrap_or(false);
    if !mounted || hugepages_free(PageSize::Huge2M).unwrap_or(0) < 4 {
        eprintln!(
            "skipping: no hugetlbfs mount with free 2 MiB pages at {}",
            dir.display()
        );
        return;
    }
    let path = dir.join(format!("mempool-test-{}", std::process::id()));
    let opts = RegionOptions::default().shared_file(&path);
    let r = Region::new(1 << 20, &opts).unwrap();
    assert_eq!(r.page_size(), PageSize::Huge2M);
    assert_eq!(r.len(), 2 << 20);
    let other = Region::attach_shared(&path, &RegionOptions::default()).unwrap();
    assert_eq!(other.page_size(), PageSize::Huge2M);
    // SAFETY: offset 12345 is inside both mappings of the same file, alive until the end.
    unsafe {
        r.as_ptr().add(12345).write(0x42);
        assert_eq!(other.as_ptr().add(12345).read(), 0x42);
    }
    drop(other);
    drop(r);
    assert!(!path.exists(), "the creator removes its hugetlbfs file");
}

#[test]
fn require_hugepages_with_a_tmpfs_file_is_refused() {
    let path = std::env::temp_dir().join(format!("mempool-tmpfs-{}", std::process::id()));
    let opts = RegionOptions::with_policy(PagePolicy::Require(PageSize::Huge2M)).shared_file(&path);
    // /tmp may be tmpfs or a disk filesystem: either way it is not hugetlbfs.
    let err = Region::new(4096, &opts).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SharedFilePageSize {
                actual: PageSize::Normal4K,
                required: PageSize::Huge2M,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("mount -t hugetlbfs"), "{err}");
    assert!(!path.exists(), "a refused shared file is removed again");
}

/// Another process's shared memory mapped at the address that process uses (what a
/// secondary does with the primary's pool): refused, naming what is there, while this
/// process uses the range; mapped there once it is free, the same bytes both ways.
#[test]
fn a_shared_region_maps_at_a_given_address_or_says_what_is_there() {
    let dir = if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm").to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("mempool-at-{}", std::process::id()));
    let owner = Region::new(
        64 << 10,
        &RegionOptions::with_policy(PagePolicy::Normal).shared_file(&path),
    )
    .unwrap();
    // The owner's own mapping is in the way in this process.
    let err = Region::attach_shared_at(&path, owner.addr(), &RegionOptions::default()).unwrap_err();
    match &err {
        Error::AddressTaken { addr, len, .. } => {
            assert_eq!((*addr, *len), (owner.addr(), owner.len()));
        }
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&format!("{:#x}", owner.addr())), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");

    // A range reserved here (what another process's address would be), taken, then free.
    let len = owner.len();
    // SAFETY: a fresh PROT_NONE reservation, chosen by the kernel; nothing else uses it.
    let hole = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(hole, libc::MAP_FAILED);
    let at = hole as usize;
    let err = Region::attach_shared_at(&path, at, &RegionOptions::default()).unwrap_err();
    assert!(
        matches!(err, Error::AddressTaken { addr, .. } if addr == at),
        "{err}"
    );
    assert!(err.to_string().contains("---p"), "names the mapping: {err}");
    // SAFETY: the reservation made above, unused.
    unsafe { libc::munmap(hole, len) };
    let other = Region::attach_shared_at(&path, at, &RegionOptions::default()).unwrap();
    assert_eq!((other.addr(), other.len()), (at, len));
    // SAFETY: offsets inside both mappings of the same file, alive until the end.
    unsafe {
        owner.as_ptr().add(777).write(0x5a);
        assert_eq!(other.as_ptr().add(777).read(), 0x5a);
        other.as_ptr().add(len - 1).write(0xa5);
        assert_eq!(owner.as_ptr().add(len - 1).read(), 0xa5);
    }
    drop(other);
    // The attached mapping is gone with its region: the address is free again.
    let again = Region::attach_shared_at(&path, at, &RegionOptions::default()).unwrap();
    assert_eq!(again.addr(), at);
    drop(again);
    drop(owner);
    assert!(
        !path.exists(),
        "the owner removes its file; attaching never does"
    );
}
