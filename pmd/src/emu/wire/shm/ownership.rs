//! Who holds an end (the pid slots, their closing and attaching bits), and the files a
//! process makes and removes on the way (temporary names, a removal on drop).
#![deny(unsafe_code)]

use super::*;

/// Bit 63 of a pid slot: the process in the low bits is removing the file (it was the last
/// end out). A newcomer that sees it while that process lives steps back and starts over.
pub(super) const CLOSING: u64 = 1 << 63;

/// Bit 62 of a pid slot: the process in the low bits is taking the end and discarding what
/// waits for it; its peer sees the link up only once the plain pid is stored, so that no
/// frame sent after the link came up is taken for a stale one.
pub(super) const ATTACHING: u64 = 1 << 62;

/// Who holds an end, from its pid slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    /// Nobody (0).
    Free,
    /// A live process.
    Live,
    /// A live process that is removing the file.
    Closing,
    /// A live process that is taking the end (not attached yet).
    Attaching,
    /// A process that is gone (or a slot that holds no pid of this machine).
    Dead,
}

pub(super) fn holder(slot: u64) -> Holder {
    let alive = |p: u64| u32::try_from(p).is_ok_and(process_alive);
    if slot == 0 {
        Holder::Free
    } else if slot & CLOSING != 0 {
        if alive(slot & !CLOSING) {
            Holder::Closing
        } else {
            Holder::Dead
        }
    } else if slot & ATTACHING != 0 {
        if alive(slot & !ATTACHING) {
            Holder::Attaching
        } else {
            Holder::Dead
        }
    } else if alive(slot) {
        Holder::Live
    } else {
        Holder::Dead
    }
}

/// The file's identity (device, inode), to tell whether a name still refers to the file we
/// mapped.
pub(super) fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// Where a new file is built before it is linked in under its name, complete: in the same
/// directory, named after the wire, this process and the attempt
/// (`.pmd-wire-NAME.PID.N.tmp`), so that two threads of one process building the same wire
/// never share a temporary file.
pub(super) fn temp_path(path: &Path, pid: u32) -> PathBuf {
    static ATTEMPT: AtomicU64 = AtomicU64::new(0);
    let n = ATTEMPT.fetch_add(1, Ordering::Relaxed);
    let file = path
        .file_name()
        .map_or_else(|| "pmd-wire".into(), |f| f.to_string_lossy().into_owned());
    path.with_file_name(format!(".{file}.{pid}.{n}.tmp"))
}

/// Removes the temporary files of `path` (see [`temp_path`]) left by processes that died
/// while building one.
pub(super) fn sweep_temps(path: &Path) {
    let (Some(dir), Some(file)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!(".{}.", file.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = n
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
            .and_then(|r| r.split('.').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the temporary name of a wire file when dropped, whether the file was linked in
/// under its real name (which keeps it) or the attempt failed half-way (which frees it): a
/// half-built wire file never outlives the attempt that built it.
pub(super) struct RemoveOnDrop(pub(super) Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
