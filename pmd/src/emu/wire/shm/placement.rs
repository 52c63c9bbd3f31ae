//! Where a wire's file lives: hugetlbfs when it can take it, else `/dev/shm`, both looked
//! in by both ends.
#![deny(unsafe_code)]

use super::*;

/// Where normal shared memory is: the fallback of a hugetlbfs directory.
pub(super) const DEV_SHM: &str = "/dev/shm";
/// Where hugetlbfs is usually mounted.
pub(super) const DEV_HUGEPAGES: &str = "/dev/hugepages";

/// Whether `dir` lies on a hugetlbfs mount (the longest mount point of /proc/mounts that
/// contains it is one).
pub(super) fn on_hugetlbfs(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return false;
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let at = Path::new(f.nth(1)?);
            Some((at, f.next()?))
        })
        .filter(|(at, _)| dir.starts_with(at))
        .max_by_key(|(at, _)| at.as_os_str().len())
        .is_some_and(|(_, fs)| fs == "hugetlbfs")
}

/// Whether `/dev/hugepages` is a hugetlbfs mount with room for a wire and headroom (2 MiB
/// pages: fewer TLB misses per frame) and `PMD_NO_HUGEPAGES` is not set.
pub(super) fn hugepages_usable() -> bool {
    if std::env::var_os("PMD_NO_HUGEPAGES").is_some() || !on_hugetlbfs(Path::new(DEV_HUGEPAGES)) {
        return false;
    }
    let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(0);
    free >= shm_file_bytes(SHM_RING_BYTES) / (2 << 20) + 128
}

/// One place a wire file may be: where a peer looks for it, and whether a new one may be
/// made there.
#[derive(Debug, Clone)]
pub(super) struct Place {
    pub(super) path: PathBuf,
    pub(super) create: bool,
}

/// The places of wire `name`'s file, in order. Both ends look in all of them, so they meet
/// whichever one the first end could use:
///
/// * `PMD_SHM_DIR=DIR`: `DIR`; when `DIR` is on hugetlbfs, `/dev/shm` after it (the fallback
///   when its huge pages cannot be had). A directory that is not on hugetlbfs has no
///   fallback: the user chose it, an error says what is wrong with it.
/// * otherwise `/dev/hugepages` (new files only when [`hugepages_usable`]), then `/dev/shm`.
pub(super) fn places(name: &str) -> Vec<Place> {
    let file = format!("pmd-wire-{name}");
    let mut out = Vec::new();
    if let Some(d) = std::env::var_os("PMD_SHM_DIR") {
        let d = PathBuf::from(d);
        let fallback = on_hugetlbfs(&d) && d != Path::new(DEV_SHM);
        out.push(Place {
            path: d.join(&file),
            create: true,
        });
        if fallback {
            out.push(Place {
                path: Path::new(DEV_SHM).join(&file),
                create: true,
            });
        }
    } else {
        out.push(Place {
            path: Path::new(DEV_HUGEPAGES).join(&file),
            create: hugepages_usable(),
        });
        out.push(Place {
            path: Path::new(DEV_SHM).join(&file),
            create: true,
        });
    }
    out
}

/// Directory where a new shared-memory wire file goes first: `PMD_SHM_DIR` if set; else
/// `/dev/hugepages` when it is a hugetlbfs mount with room for a wire and headroom; else
/// `/dev/shm`. (When the file cannot be made on hugepages after all, it goes to `/dev/shm`:
/// see [`Shm::open`].)
pub fn shm_dir() -> PathBuf {
    let p = places("x");
    let first = p.iter().find(|p| p.create).unwrap_or(&p[0]);
    first
        .path
        .parent()
        .map_or_else(|| PathBuf::from(DEV_SHM), Path::to_path_buf)
}

/// Path of the file behind shared-memory wire `name`: an existing one (the other end's),
/// wherever [`Shm::open`] looks; else where a new one would go first.
pub fn shm_path(name: &str) -> PathBuf {
    let p = places(name);
    if let Some(found) = p.iter().find(|p| p.path.exists()) {
        return found.path.clone();
    }
    p.iter().find(|p| p.create).unwrap_or(&p[0]).path.clone()
}
