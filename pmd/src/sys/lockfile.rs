//! An exclusive, advisory lock on a file (`flock(2)`), holding the locker's pid.
//!
//! The lock belongs to the open file: the kernel drops it when the holder closes the file or
//! dies, however it dies (SIGKILL included). A file left behind by a dead holder is therefore
//! simply locked again by the next process; its stale pid is overwritten.
//!
//! A holder that lets go removes the file while it still holds the lock. Someone who opened
//! the old file just before may then lock that unlinked inode, so a lock only counts once the
//! path still names the very inode locked (same device and inode number); otherwise the
//! locker starts over with a fresh open. Two processes can thus never hold "the same" name.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A held lock; dropping it removes the file and releases the lock.
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
}

/// What [`try_lock`] found.
#[derive(Debug)]
pub enum TryLock {
    /// We hold the lock now.
    Acquired(LockFile),
    /// Another open file holds it (another process, or this one through another open).
    Held {
        /// The holder's pid as written in the file; `None` if it has not written one yet.
        pid: Option<u32>,
    },
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(true)` when locked, `Ok(false)` when another open file
/// holds the lock.
pub fn flock_exclusive_nonblocking(file: &File) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) takes a descriptor and flags only; `file` keeps the descriptor
        // open for the duration of the call.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok().filter(|&p| p > 0)
}

/// Whether `path` still names the inode `file` has open.
fn still_named(file: &File, path: &Path) -> io::Result<bool> {
    let open = file.metadata()?;
    Ok(match std::fs::metadata(path) {
        Ok(named) => named.dev() == open.dev() && named.ino() == open.ino(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    })
}

/// Tries to lock `path` (created with mode 0644 if missing) without waiting; on success
/// writes this process's pid into it.
///
/// # Errors
/// The file cannot be opened or written, or `flock` failed for another reason than "held".
pub fn try_lock(path: &Path) -> io::Result<TryLock> {
    // Each retry means a holder let go (and removed the file) between our open and our lock.
    for _ in 0..100 {
        if let Some(r) = try_lock_once(path)? {
            return Ok(r);
        }
    }
    Err(io::Error::other(format!(
        "{}: the lock file keeps being replaced under us",
        path.display()
    )))
}

/// One attempt; `None` when the locked inode is no longer the one `path` names.
fn try_lock_once(path: &Path) -> io::Result<Option<TryLock>> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)?;
    if !flock_exclusive_nonblocking(&file)? {
        // The holder writes its pid right after locking: give it a moment.
        let mut pid = read_pid(&mut file);
        for _ in 0..20 {
            if pid.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
            pid = read_pid(&mut file);
        }
        return Ok(Some(TryLock::Held { pid }));
    }
    if !still_named(&file, path)? {
        return Ok(None);
    }
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(Some(TryLock::Acquired(LockFile {
        file,
        path: path.to_path_buf(),
    })))
}

impl LockFile {
    /// The locked file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Removed while still locked (see the module docs); closing the file then releases
        // the lock.
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                let _ = self.file.set_len(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_open_is_refused_with_the_holders_pid_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("port.lock");
        let TryLock::Acquired(held) = try_lock(&path).unwrap() else {
            panic!("a fresh file must lock");
        };
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
        // flock conflicts between two opens even in one process.
        match try_lock(&path).unwrap() {
            TryLock::Held { pid } => assert_eq!(pid, Some(std::process::id())),
            TryLock::Acquired(_) => panic!("locked twice"),
        }
        drop(held);
        assert!(!path.exists(), "a released lock leaves no file behind");
        assert!(matches!(try_lock(&path).unwrap(), TryLock::Acquired(_)));
    }

    #[test]
    fn a_lock_on_a_removed_file_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone.lock");
        // Someone opened the file, then its holder let go and removed it.
        let old = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!still_named(&old, &path).unwrap());
        std::fs::write(&path, "").unwrap();
        assert!(
            !still_named(&old, &path).unwrap(),
            "a new inode of the same name"
        );
        let TryLock::Acquired(l) = try_lock(&path).unwrap() else {
            panic!("the new file is free");
        };
        assert!(still_named(&l.file, &path).unwrap());
    }

    #[test]
    fn a_stale_file_of_a_dead_holder_is_taken_silently() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.lock");
        std::fs::write(&path, "999999999\n").unwrap();
        let TryLock::Acquired(l) = try_lock(&path).unwrap() else {
            panic!("nobody holds a stale file");
        };
        assert_eq!(l.path(), path);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
    }
}
